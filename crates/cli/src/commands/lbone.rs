//! `lors lbone`: run the L-Bone depot directory.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use lors_lbone::server::{Config, LBone};
use lors_lbone::store::{PostgresStore, SqliteStore, Store};

use super::duration_arg;
use crate::exit::UsageError;

/// Run the L-Bone: the depot directory, its HTTP/JSON API and dashboard, and
/// the legacy query protocol of the original LoRS tools.
///
/// When ready it prints `lors lbone: dashboard http://ADDR/`, `lors lbone:
/// legacy protocol on ADDR` and `lors lbone: ready` on stdout.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  Zero-config, SQLite in ./lbone, a token generated into ./lbone/token:
    lors lbone --data ./lbone

  Public, with a chosen token, the legacy protocol on 6767:
    lors lbone --data /srv/lbone --listen 0.0.0.0:8767 --legacy-listen 0.0.0.0:6767 --token \"$TOKEN\"

  Instances behind one PostgreSQL database (run it on each host; clients and
  depots take the list: LBONE_SERVER=https://lb1:8767,https://lb2:8767):
    lors lbone --database postgres://lbone@db/lbone --listen 0.0.0.0:8767 --token \"$TOKEN\"

  Over TLS (depots and clients verify it against the system's CAs, or
  --lbone-ca-file / LORS_CA_FILE):
    lors lbone --data /srv/lbone --tls-cert /etc/lors/lbone.crt --tls-key /etc/lors/lbone.key

Depots join with: lors depot … --lbone https://HOST:8767 --lbone-token TOKEN")]
pub struct Args {
    /// Directory for the SQLite database (and the generated token).
    #[arg(long, value_name = "DIR", required_unless_present = "database")]
    data: Option<PathBuf>,
    /// PostgreSQL instead of SQLite: postgres://user@host:port/db.
    #[arg(
        long,
        value_name = "URL",
        env = "LORS_LBONE_DATABASE",
        hide_env_values = true
    )]
    database: Option<String>,
    /// PostgreSQL schema for the tables.
    #[arg(long, value_name = "NAME", default_value = "lbone")]
    schema: String,
    /// HTTP API and dashboard address.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8767")]
    listen: SocketAddr,
    /// Legacy L-Bone protocol address [default: the --listen IP, port 6767].
    #[arg(long, value_name = "ADDR")]
    legacy_listen: Option<SocketAddr>,
    /// Do not serve the legacy protocol.
    #[arg(long, conflicts_with = "legacy_listen")]
    no_legacy: bool,
    /// Token depots must present to register [default: DIR/token, generated
    /// on first start].
    #[arg(
        long,
        value_name = "TOKEN",
        env = "LORS_LBONE_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Read the token from this file (first line) instead.
    #[arg(long, value_name = "PATH", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// Heartbeat interval asked of depots.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, default_value = "30s")]
    heartbeat: Duration,
    /// A depot silent this long is shown offline and sinks in rankings.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, default_value = "90s")]
    offline_after: Duration,
    /// A depot silent this long is dropped from the directory.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, default_value = "1d")]
    drop_after: Duration,
    /// Serve the API and dashboard over TLS with this certificate chain
    /// (PEM, the server's first).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Connections one client address may hold at once (raise it for
    /// clients behind one NAT).
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_client: u32,
}

/// The token from the flag, or DIR/token (created with a fresh random one).
fn token(a: &Args) -> anyhow::Result<String> {
    let given = match &a.token_file {
        Some(path) => Some(super::read_token_file(path)?),
        None => a.token.clone(),
    };
    if let Some(t) = given {
        if t.len() < 8 {
            return Err(UsageError("the token: use at least 8 characters".into()).into());
        }
        return Ok(t);
    }
    let dir = a.data.as_deref().ok_or_else(|| {
        UsageError("with --database, give --token-file, LORS_LBONE_TOKEN or --token".into())
    })?;
    token_file(&dir.join("token"))
}

fn token_file(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Ok(t) = std::fs::read_to_string(path) {
        return Ok(t.trim().to_owned());
    }
    let t = lors_ibp::caps::Key::generate()
        .context("generating a token")?
        .expose()
        .to_owned();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(f, "{t}")?;
    Ok(t)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(d) = &a.data {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let token = token(&a)?;
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(
            lors_http::serve::Tls::from_pem_files(cert, key)
                .map_err(|e| UsageError(format!("--tls-cert/--tls-key: {e}")))?,
        ),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let sqlite = match (&a.database, &a.data) {
        (Some(_), _) => None,
        (None, Some(dir)) => {
            Some(SqliteStore::open(&dir.join("lbone.sqlite")).context("opening the SQLite store")?)
        }
        (None, None) => unreachable!("clap requires --data or --database"),
    };
    let cfg = Config {
        token,
        heartbeat: a.heartbeat,
        offline_after: a.offline_after,
        drop_after: a.drop_after,
        sweep_every: (a.offline_after / 2).clamp(Duration::from_secs(1), Duration::from_secs(60)),
        max_connections_per_client: a.max_connections_per_client as usize,
        ..Config::default()
    };
    let legacy_addr = (!a.no_legacy).then(|| {
        a.legacy_listen
            .unwrap_or_else(|| SocketAddr::new(a.listen.ip(), lors_lbone::LEGACY_PORT))
    });
    let rt = super::runtime(super::Threads::Many)?;
    rt.block_on(async move {
        let http = tokio::net::TcpListener::bind(a.listen)
            .await
            .with_context(|| format!("binding {}", a.listen))?;
        let legacy = match legacy_addr {
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
                format!("binding the legacy protocol to {addr} (choose with --legacy-listen, or --no-legacy)")
            })?),
            None => None,
        };
        let store: Store = match (sqlite, &a.database) {
            (Some(s), _) => s.into(),
            (None, Some(url)) => PostgresStore::open(url, &a.schema)
                .await
                .context("opening the PostgreSQL store")?
                .into(),
            (None, None) => unreachable!("clap requires --data or --database"),
        };
        let lb = LBone::new(store, cfg);
        {
            let mut out = std::io::stdout().lock();
            let at = http.local_addr()?;
            if at.ip().is_unspecified() {
                writeln!(
                    out,
                    "lors lbone: dashboard {scheme}://localhost:{}/ (listening on all interfaces)",
                    at.port()
                )?;
            } else {
                writeln!(out, "lors lbone: dashboard {scheme}://{at}/")?;
            }
            if let Some(l) = &legacy {
                writeln!(out, "lors lbone: legacy protocol on {}", l.local_addr()?)?;
            }
            writeln!(out, "lors lbone: store {}", lb.describe())?;
            if a.token.is_none() && a.token_file.is_none()
                && let Some(d) = &a.data {
                    writeln!(out, "lors lbone: registration token in {}", d.join("token").display())?;
                }
            writeln!(out, "lors lbone: ready")?;
            out.flush()?;
        }
        let (tx, rx) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(lors_lbone::server::run_tls(lb, http, tls, legacy, rx));
        super::depot::wait_for_signal().await;
        let _ = tx.send(true);
        server.await.context("L-Bone task")?;
        Ok(())
    })
}
