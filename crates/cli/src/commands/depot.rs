//! `lors depot`: run an IBP storage depot.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use lors_depot::Depot;
use lors_depot::config::{
    ByteSize, Config, ResourceConfig, Span, SyncPolicy, parse_duration, parse_size,
};

use crate::UsageError;

/// Run an IBP storage depot.
///
/// With no config file, `--data DIR` is enough: one resource (RID 1) in DIR,
/// 10 GiB, 30-day maximum duration, STATUS password `ibp`. Flags override the
/// config file. When ready the depot prints `lors depot: serving IBP on
/// HOST:PORT` and `lors depot: ready` on stdout (scripts can wait for them;
/// `--listen 127.0.0.1:0` picks a free port).
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  Zero-config depot on a free loopback port:
    lors depot --listen 127.0.0.1:0 --data /tmp/depot

  A public depot with 500 GiB, 7-day leases and metrics:
    lors depot --listen 0.0.0.0:6714 --advertise depot1.example.org \\
               --data /srv/ibp --size 500G --max-duration 7d --metrics-listen 127.0.0.1:9714

  From a config file (see examples/depot.toml):
    lors depot --config /etc/lors/depot.toml

  Registered with an L-Bone, so clients find it:
    lors depot --data /srv/ibp --advertise depot1.example.org \
               --lbone http://lbone.example.org:8767 --lbone-token-file /etc/lors/lbone-token \
               --city Knoxville --state TN --country US --lat 35.96 --lon -83.92")]
pub struct Args {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// IBP listen address [default: 0.0.0.0:6714].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Data directory: one resource (RID 1) stored here, when the config
    /// file defines no resources.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Size of the --data resource, e.g. 100G [default: 10G].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    size: Option<u64>,
    /// Longest allocation lifetime for the --data resource, e.g. 30d [default: 30d].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    max_duration: Option<std::time::Duration>,
    /// HOST or HOST:PORT written into capabilities [default: the listen IP, or the
    /// host name when listening on all interfaces].
    #[arg(long, value_name = "HOST[:PORT]")]
    advertise: Option<String>,
    /// Serve Prometheus metrics on this address (GET /metrics).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// STATUS password [default: ibp].
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "LORS_DEPOT_PASSWORD",
        hide_env_values = true
    )]
    password: Option<String>,
    /// Most simultaneous connections [default: 1024].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Most simultaneous connections from one client address [default: 64].
    #[arg(long, value_name = "N")]
    max_connections_per_client: Option<usize>,
    /// Refuse what the reference (ACCRE) depot refuses where this one is
    /// lenient (MANAGE CHNG to max size 0 or a smaller size: -20), to test
    /// clients against the strictest behaviour.
    #[arg(long)]
    strict: bool,
    /// Refuse the alias commands (ALIAS_ALLOCATE, ALIAS_MANAGE) as a LoRS
    /// 0.82-era depot does, to test clients against one.
    #[arg(long)]
    no_aliases: bool,
    /// fsync policy: `always` (before every acknowledgement) or `never`.
    #[arg(long, value_name = "POLICY", value_parser = parse_sync)]
    sync: Option<SyncPolicy>,
    #[command(flatten)]
    lbone: LboneArgs,
}

/// Registration with an L-Bone.
#[derive(clap::Args)]
#[command(next_help_heading = "L-Bone registration")]
pub struct LboneArgs {
    /// Register with this L-Bone (https://HOST:PORT, or http:// on this
    /// machine) and heartbeat. Repeat it (or give a comma list) for the
    /// instances of one directory: the heartbeat goes to one and moves on to
    /// the next when it fails.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    lbone: Vec<String>,
    /// Verify the L-Bone's certificate against the CAs in this PEM file
    /// instead of the system's [env: LORS_CA_FILE].
    #[arg(long, value_name = "PEM")]
    lbone_ca_file: Option<PathBuf>,
    /// Send the registration token over plain http:// to another machine
    /// (anyone on the path can read it and register depots).
    #[arg(long)]
    insecure: bool,
    /// The L-Bone's registration token.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "LORS_LBONE_TOKEN",
        hide_env_values = true
    )]
    lbone_token: Option<String>,
    /// Read the registration token from this file (first line), so it
    /// appears in no process listing.
    #[arg(long, value_name = "PATH", conflicts_with = "lbone_token")]
    lbone_token_file: Option<PathBuf>,
    /// Heartbeat interval.
    #[arg(long, value_name = "DURATION", value_parser = super::duration_arg, default_value = "30s")]
    heartbeat: std::time::Duration,
    /// City, for location hints and the map.
    #[arg(long)]
    city: Option<String>,
    /// State or region.
    #[arg(long)]
    state: Option<String>,
    /// Country code.
    #[arg(long)]
    country: Option<String>,
    /// Postal code.
    #[arg(long)]
    zip: Option<String>,
    /// Nearest airport code.
    #[arg(long)]
    airport: Option<String>,
    /// Latitude, degrees north.
    #[arg(long, allow_hyphen_values = true)]
    lat: Option<f64>,
    /// Longitude, degrees east.
    #[arg(long, allow_hyphen_values = true)]
    lon: Option<f64>,
    /// A free-form tag (repeatable).
    #[arg(long = "tag")]
    tags: Vec<String>,
}

impl LboneArgs {
    fn location(&self) -> lors_lbone::model::Location {
        lors_lbone::model::Location {
            city: self.city.clone(),
            state: self.state.clone(),
            country: self.country.clone(),
            zip: self.zip.clone(),
            airport: self.airport.clone(),
            latitude: self.lat,
            longitude: self.lon,
            tags: self.tags.clone(),
        }
    }
}

impl LboneArgs {
    /// The registration token: flag or `LORS_LBONE_TOKEN`, or the first
    /// line of `--lbone-token-file`.
    fn token(&self) -> anyhow::Result<String> {
        if let Some(path) = &self.lbone_token_file {
            return super::read_token_file(path);
        }
        self.lbone_token.clone().ok_or_else(|| {
            UsageError(
                "--lbone needs a token: --lbone-token-file PATH, LORS_LBONE_TOKEN or --lbone-token"
                    .into(),
            )
            .into()
        })
    }
}

/// Registers `depot` with the first of the L-Bones at `bases` that takes
/// it, then heartbeats every `every` until `stop`. Returns the first
/// registration's outcome (callers decide whether it is fatal) and the
/// heartbeat task.
pub async fn join_lbone(
    depot: &Arc<Depot>,
    bases: Vec<lors_lbone::client::BaseUrl>,
    token: String,
    loc: lors_lbone::model::Location,
    every: std::time::Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (Result<(), String>, tokio::task::JoinHandle<()>) {
    let reg = registration(depot, &loc);
    let first = lors_lbone::client::register_first(
        &bases,
        0,
        &token,
        &lors_lbone::client::Announcement::Here(&reg),
        std::time::Duration::from_secs(10),
    )
    .await
    .map(drop);
    let d = depot.clone();
    let task = tokio::spawn(lors_lbone::client::heartbeat(
        bases,
        token,
        move || registration(&d, &loc),
        every,
        stop,
    ));
    (first, task)
}

/// What a depot tells the L-Bone now.
pub fn registration(
    depot: &Depot,
    location: &lors_lbone::model::Location,
) -> lors_lbone::model::Registration {
    use lors_depot::config::TypeName;
    let (host, port) = depot.advertised();
    let resources = depot
        .status()
        .into_iter()
        .map(|r| {
            let types = depot
                .config()
                .resources
                .iter()
                .find(|c| c.rid == r.rid)
                .map(|c| {
                    c.types
                        .iter()
                        .map(|t| match t {
                            TypeName::ByteArray => "byte_array",
                            TypeName::Fifo => "fifo",
                            TypeName::Circular => "circular",
                        })
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            lors_lbone::model::Resource {
                hard_free: r.hard_free(),
                soft_free: r.soft_total.saturating_sub(r.usage.soft).min(r.free()),
                hard_total: r.hard_total,
                soft_total: r.soft_total,
                max_duration: r.max_duration,
                types,
                rid: r.rid,
            }
        })
        .collect();
    lors_lbone::model::Registration {
        host,
        port,
        resources,
        location: location.clone(),
        version: format!("lors {}", env!("CARGO_PKG_VERSION")),
    }
}

fn parse_sync(s: &str) -> Result<SyncPolicy, String> {
    match s {
        "always" => Ok(SyncPolicy::Always),
        "never" => Ok(SyncPolicy::Never),
        _ => Err("use `always` or `never`".into()),
    }
}

/// Builds the effective configuration: file, then flags.
pub fn config(args: &Args) -> anyhow::Result<Config> {
    let mut cfg = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config file {}", path.display()))?;
            Config::from_toml(&text)
                .map_err(|e| UsageError(format!("config file {}: {e}", path.display())))?
        }
        None => Config::default(),
    };
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if let Some(a) = &args.advertise {
        cfg.advertise = Some(a.clone());
    }
    if let Some(m) = args.metrics_listen {
        cfg.metrics_listen = Some(m);
    }
    if let Some(p) = &args.password {
        cfg.password = p.clone();
    }
    if let Some(n) = args.max_connections_per_client {
        cfg.max_connections_per_client = n;
    }
    if let Some(n) = args.max_connections {
        cfg.max_connections = n;
    }
    if let Some(s) = args.sync {
        cfg.sync = s;
    }
    if args.strict {
        cfg.strict = true;
    }
    if args.no_aliases {
        cfg.aliases = false;
    }
    if let Some(dir) = &args.data {
        if !cfg.resources.is_empty() {
            return Err(UsageError(
                "--data conflicts with the [[resource]] sections of the config file; use one or the other".into(),
            )
            .into());
        }
        let mut r = ResourceConfig::new("1", dir.clone());
        if let Some(s) = args.size {
            r.size = ByteSize(s);
        }
        if let Some(d) = args.max_duration {
            r.max_duration = Span(d);
        }
        cfg.resources.push(r);
    } else if args.size.is_some() || args.max_duration.is_some() {
        return Err(UsageError("--size and --max-duration apply to --data; set them per [[resource]] in the config file".into()).into());
    }
    cfg.validate().map_err(UsageError)?;
    Ok(cfg)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let cfg = config(&args)?;
    let nofile = lors_depot::server::raise_open_file_limit();
    tracing::info!(limit = ?nofile, "open-file limit");
    let rt = super::runtime(super::Threads::Many)?;
    rt.block_on(async move {
        let depot = Depot::open(cfg).await.context("opening the depot")?;
        let listeners = depot.bind().await?;
        let addr = listeners.ibp.local_addr()?;
        let metrics = listeners
            .metrics
            .as_ref()
            .map(|m| m.local_addr())
            .transpose()?;
        let (tx, rx) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(lors_depot::server::run(
            listeners,
            depot.clone(),
            rx.clone(),
        ));
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "lors depot: serving IBP on {addr}")?;
            if let Some(m) = metrics {
                writeln!(out, "lors depot: metrics on http://{m}/metrics")?;
            }
            for r in depot.status() {
                writeln!(
                    out,
                    "lors depot: resource {} — {} bytes, {} allocations",
                    r.rid, r.total, r.usage.count
                )?;
            }
            out.flush()?;
        }
        let heartbeat = if args.lbone.lbone.is_empty() {
            None
        } else {
            // HOST:PORT as the clients take it: the HTTP API there.
            let bases = args
                .lbone
                .lbone
                .iter()
                .map(|url| {
                    let url = if url.contains("://") {
                        url.clone()
                    } else {
                        format!("http://{url}")
                    };
                    lors_lbone::client::BaseUrl::parse(&url).map_err(UsageError)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let urls = args.lbone.lbone.join(", ");
            if let Some(ca) = &args.lbone.lbone_ca_file {
                lors_http::client::trust(ca)
                    .map_err(|e| UsageError(format!("--lbone-ca-file: {e}")))?;
            }
            // The token is the key to the directory: never in clear over a
            // network unless asked for.
            for b in bases.iter().filter(|b| !b.tls && !b.is_loopback()) {
                if !args.lbone.insecure {
                    return Err(UsageError(format!(
                        "--lbone {b}: the registration token would cross the network in clear; use https:// (lors lbone --tls-cert/--tls-key), or --insecure on a network you trust"
                    ))
                    .into());
                }
                eprintln!("lors depot: warning: the L-Bone token goes to {b} in clear (--insecure)");
            }
            let token = args.lbone.token()?;
            let loc = args.lbone.location();
            registration(&depot, &loc)
                .validate()
                .map_err(|e| UsageError(format!("L-Bone registration: {e}")))?;
            let (first, task) = join_lbone(
                &depot,
                bases.clone(),
                token.clone(),
                loc,
                args.lbone.heartbeat,
                rx.clone(),
            )
            .await;
            match first {
                Ok(()) => println!("lors depot: registered with L-Bone {urls}"),
                // A wrong token never comes right by itself: stop, and
                // say what to fix.
                Err(e) if e == lors_lbone::client::TOKEN_REFUSED => {
                    task.abort();
                    return Err(UsageError(format!(
                        "{e} at {urls}: check --lbone-token, --lbone-token-file or LORS_LBONE_TOKEN (the L-Bone's is in its data directory, file `token`)"
                    ))
                    .into());
                }
                // Serving matters more than being listed: keep trying,
                // and say so every minute while it fails.
                Err(e) => eprintln!("lors depot: L-Bone registration failed (will retry): {e}"),
            }
            Some((task, bases, token))
        };
        println!("lors depot: ready");
        tracing::info!(%addr, "depot ready");
        wait_for_signal().await;
        tracing::info!("shutting down");
        let _ = tx.send(true);
        server.await.context("depot task")??;
        if let Some((h, bases, token)) = heartbeat {
            let _ = h.await;
            // Leave the directory now rather than be listed until the
            // missed heartbeats tell: clients would be sent here.
            let (host, port) = depot.advertised();
            let me = lors_lbone::model::Departure { host, port };
            let wait = std::time::Duration::from_secs(5);
            let leaving = lors_lbone::client::Announcement::Leaving(&me);
            match lors_lbone::client::register_first(&bases, 0, &token, &leaving, wait).await {
                Ok(_) => println!("lors depot: deregistered from the L-Bone"),
                Err(e) => eprintln!("lors depot: could not deregister from the L-Bone: {e}"),
            }
        }
        Ok(())
    })
}

pub(crate) async fn wait_for_signal() {
    wait_for_signal_status().await;
}

/// Waits for SIGINT or SIGTERM; the exit status a shell shows for it
/// (130, 143).
pub(crate) async fn wait_for_signal_status() -> u8 {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => 130,
        _ = async {
            match term.as_mut() {
                Some(t) => { t.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => 143,
    }
}
