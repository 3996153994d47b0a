//! `lors depot --lbone`: joining L-Bones, the heartbeat, and leaving.

use std::path::PathBuf;
use std::sync::Arc;

use lors_depot::Depot;
use lors_lbone::client::BaseUrl;

use crate::exit::UsageError;

/// Registration with an L-Bone.
#[derive(clap::Args)]
#[command(next_help_heading = "L-Bone registration")]
pub struct LboneArgs {
    /// Register with this L-Bone (https://HOST:PORT, or http:// on this
    /// machine) and heartbeat. Repeat it (or give a comma list) for the
    /// instances of one directory: the heartbeat goes to one and moves on to
    /// the next when it fails.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    pub(super) lbone: Vec<String>,
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
    #[arg(long, value_name = "DURATION", value_parser = crate::commands::duration_arg, default_value = "30s")]
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
            return crate::commands::read_token_file(path);
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
) -> (
    Result<(), lors_lbone::client::Error>,
    tokio::task::JoinHandle<()>,
) {
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

/// An L-Bone joined: its heartbeat, where it goes, with which token.
pub(super) struct Joined {
    task: tokio::task::JoinHandle<()>,
    bases: Vec<BaseUrl>,
    token: String,
}

/// Registers with the L-Bones `args` names (refusing to send the token in
/// clear over a network unless told to) and keeps the heartbeat going.
pub(super) async fn join(
    args: &LboneArgs,
    depot: &std::sync::Arc<Depot>,
    rx: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Joined> {
    // HOST:PORT as the clients take it: the HTTP API there.
    let bases = args
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
    let urls = args.lbone.join(", ");
    if let Some(ca) = &args.lbone_ca_file {
        lors_http::client::trust(ca).map_err(|e| UsageError(format!("--lbone-ca-file: {e}")))?;
    }
    // The token is the key to the directory: never in clear over a
    // network unless asked for.
    for b in bases.iter().filter(|b| !b.tls && !b.is_loopback()) {
        if !args.insecure {
            return Err(UsageError(format!(
                "--lbone {b}: the registration token would cross the network in clear; use https:// (lors lbone --tls-cert/--tls-key), or --insecure on a network you trust"
            ))
            .into());
        }
        eprintln!("lors depot: warning: the L-Bone token goes to {b} in clear (--insecure)");
    }
    let token = args.token()?;
    let loc = args.location();
    registration(depot, &loc)
        .validate()
        .map_err(|e| UsageError(format!("L-Bone registration: {e}")))?;
    let (first, task) = join_lbone(
        depot,
        bases.clone(),
        token.clone(),
        loc,
        args.heartbeat,
        rx.clone(),
    )
    .await;
    match first {
        Ok(()) => println!("lors depot: registered with L-Bone {urls}"),
        // A wrong token never comes right by itself: stop, and
        // say what to fix.
        Err(e) if e.is_token_refused() => {
            task.abort();
            return Err(UsageError(format!(
                "{} at {urls}: check --lbone-token, --lbone-token-file or LORS_LBONE_TOKEN (the L-Bone's is in its data directory, file `token`)",
                lors_lbone::client::Error::TokenRefused
            ))
            .into());
        }
        // Serving matters more than being listed: keep trying,
        // and say so every minute while it fails.
        Err(e) => eprintln!("lors depot: L-Bone registration failed (will retry): {e}"),
    }
    Ok(Joined { task, bases, token })
}

/// Ends the heartbeat and leaves the directory now rather than be listed
/// until the missed heartbeats tell: clients would be sent here.
pub(super) async fn leave(j: Joined, depot: &Depot) {
    let _ = j.task.await;
    let (host, port) = depot.advertised();
    let me = lors_lbone::model::Departure { host, port };
    let wait = std::time::Duration::from_secs(5);
    let leaving = lors_lbone::client::Announcement::Leaving(&me);
    match lors_lbone::client::register_first(&j.bases, 0, &j.token, &leaving, wait).await {
        Ok(_) => println!("lors depot: deregistered from the L-Bone"),
        Err(e) => eprintln!("lors depot: could not deregister from the L-Bone: {e}"),
    }
}
