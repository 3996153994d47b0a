//! `lors depot`: run an IBP storage depot.

mod lbone;
mod status;

pub use lbone::{LboneArgs, join_lbone};

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use lors_depot::Depot;
use lors_depot::config::{
    ByteSize, Config, ResourceConfig, Span, SyncPolicy, parse_duration, parse_size,
};

use crate::exit::UsageError;

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

  What a running depot's resources hold:
    lors depot --status depot1.example.org

  Registered with an L-Bone, so clients find it:
    lors depot --data /srv/ibp --advertise depot1.example.org \
               --lbone https://lbone.example.org:8767 --lbone-token-file /etc/lors/lbone-token \
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
    /// Most simultaneous connections from one client address [default: 160].
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
    /// Do not serve: ask the running depot at `HOST[:PORT]` what each of its
    /// resources holds (size, used, free, longest lease) and exit.
    #[arg(long, value_name = "HOST[:PORT]", value_parser = super::depot_arg)]
    status: Option<String>,
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
    if let Some(addr) = &args.status {
        let password = args.password.as_deref().unwrap_or("ibp");
        return status::show(addr, password);
    }
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
            Some(lbone::join(&args.lbone, &depot, rx.clone()).await?)
        };
        println!("lors depot: ready");
        tracing::info!(%addr, "depot ready");
        wait_for_signal().await;
        tracing::info!("shutting down");
        let _ = tx.send(true);
        server.await.context("depot task")??;
        if let Some(h) = heartbeat {
            lbone::leave(h, &depot).await;
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
