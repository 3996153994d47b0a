//! The IBP server: accepts connections, bounds them, and hands each to a
//! per-connection task (`conn`). Shutdown: stop accepting, let idle
//! connections close, wait for in-flight commands (bounded).

mod clients;
mod conn;
mod copy;
mod fail;
mod transfer;

use lors_ibp::units::unix_now;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lors_ibp::proto::{Reply, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::config::Config;
use crate::metrics::{Metrics, Refused};
use crate::store::{Store, StoreError};
use clients::{ClientLimits, ClientSlot, Clients, Wait, acquire, permits_in};

/// Size of one transfer buffer; `buffer_memory` is counted in these.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Why a depot could not start.
#[derive(Debug, thiserror::Error)]
pub enum DepotError {
    /// Configuration problem; the message says what to fix.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Opening the storage failed.
    #[error("cannot open storage: {0}")]
    Store(#[from] StoreError),
    /// Binding a socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// OS error.
        source: std::io::Error,
    },
}

/// Idle connections kept per depot SENDs go to: as many as a client at
/// distance keeps copies in flight to it.
const MAX_IDLE_OUT: usize = 128;

/// Idle connections kept to all depots together, so a depot that copied
/// to many others holds no more descriptors than this for it.
const MAX_IDLE_OUT_TOTAL: usize = 512;

/// A running depot's shared state.
pub struct Depot {
    /// Configuration.
    pub(crate) cfg: Config,
    /// Storage engine.
    pub(crate) store: Arc<Store>,
    /// Counters.
    pub(crate) metrics: Metrics,
    /// Transfer-buffer budget, in [`CHUNK_BYTES`] units.
    pub(crate) buffers: Arc<Semaphore>,
    /// Per-client connection, data-phase and buffer limits.
    pub(crate) clients: Arc<Clients>,
    /// Host and port written into capabilities (set when serving starts).
    advertise: OnceLock<(String, u16)>,
    /// The address we are bound to.
    bound: OnceLock<SocketAddr>,
    started: Instant,
    /// Commands served.
    pub(crate) commands: std::sync::atomic::AtomicU64,
    /// Idle connections to other depots, left by SENDs to them: the next
    /// SEND there skips the connect and TCP's slow start, a round trip or
    /// more each — most of a small block's copy between continents.
    pub(crate) outgoing: lors_ibp::IdleConnections,
}

/// The sockets a depot serves on.
pub struct Listeners {
    /// IBP.
    pub ibp: TcpListener,
    /// Prometheus metrics, if configured.
    pub metrics: Option<TcpListener>,
}

impl Depot {
    /// Validates the configuration and opens the storage.
    pub async fn open(cfg: Config) -> Result<Arc<Depot>, DepotError> {
        cfg.validate().map_err(DepotError::Config)?;
        let store_cfg = cfg.clone();
        let store = tokio::task::spawn_blocking(move || Store::open(&store_cfg))
            .await
            .map_err(|e| StoreError::Write(std::io::Error::other(e.to_string())))??;
        let permits = u32::try_from(cfg.buffer_memory.0 / CHUNK_BYTES as u64)
            .unwrap_or(u32::MAX)
            .max(4);
        let clients = Clients::new(ClientLimits {
            connections: cfg.max_connections_per_client,
            transfers: cfg.max_transfers_per_client,
            buffer_permits: permits_in(cfg.buffer_per_client()).min(permits),
        });
        Ok(Arc::new(Depot {
            clients,
            cfg,
            store: Arc::new(store),
            metrics: Metrics::default(),
            buffers: Arc::new(Semaphore::new(permits as usize)),
            advertise: OnceLock::new(),
            bound: OnceLock::new(),
            started: Instant::now(),
            commands: Default::default(),
            outgoing: lors_ibp::IdleConnections::new(MAX_IDLE_OUT, MAX_IDLE_OUT_TOTAL),
        }))
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Each resource's space and allocations now.
    pub fn status(&self) -> Vec<crate::store::ResourceStatus> {
        self.store.status()
    }

    /// Bytes sent in LOAD replies so far (what clients read).
    pub fn bytes_sent(&self) -> u64 {
        self.metrics.bytes_out.get()
    }

    /// Connections being served now.
    pub fn open_connections(&self) -> i64 {
        self.metrics.connections_open.get()
    }

    /// The storage engine itself, for checks of its own bookkeeping
    /// (tests, `fsck`-like tools); serving goes through [`run`].
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Binds the configured addresses.
    pub async fn bind(&self) -> Result<Listeners, DepotError> {
        let addr = self.cfg.listen;
        let ibp = TcpListener::bind(addr)
            .await
            .map_err(|source| DepotError::Bind { addr, source })?;
        let metrics = match self.cfg.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| DepotError::Bind { addr, source })?,
            ),
            None => None,
        };
        self.note_bound(
            ibp.local_addr()
                .map_err(|source| DepotError::Bind { addr, source })?,
        );
        Ok(Listeners { ibp, metrics })
    }

    /// Records the bound address and derives the advertised one (first call
    /// wins; `bind` and `run` both call it).
    fn note_bound(&self, bound: SocketAddr) {
        let _ = self.bound.set(bound);
        let adv = match &self.cfg.advertise {
            Some(a) => match lors_ibp::caps::split_host_port(a) {
                Some((h, p)) => (h.to_owned(), p),
                None => (a.clone(), bound.port()),
            },
            None => (default_advertise(bound), bound.port()),
        };
        let _ = self.advertise.set(adv);
    }

    /// Host and port clients should use, as written into capabilities.
    pub fn advertised(&self) -> (String, u16) {
        self.advertise
            .get()
            .cloned()
            .unwrap_or_else(|| (self.cfg.listen.ip().to_string(), self.cfg.listen.port()))
    }

    /// Whether `host:port` names this depot (for SEND to ourselves).
    pub(crate) fn is_self(&self, host: &str, port: u16) -> bool {
        let (ahost, aport) = self.advertised();
        if port == aport && host.eq_ignore_ascii_case(&ahost) {
            return true;
        }
        match (self.bound.get(), host.parse::<std::net::IpAddr>()) {
            (Some(b), Ok(ip)) if b.port() == port => {
                ip == b.ip() || (b.ip().is_unspecified() && ip.is_loopback())
            }
            _ => false,
        }
    }

    /// Reserves transfer-buffer budget for `bytes` (capped at what one
    /// client may hold, so a large request waits rather than deadlocks): first
    /// from the client's share, then from the depot's. Waits at most the
    /// depot's `io_timeout` in all. Call it only once the client's bytes are
    /// there to move, so an idle data phase holds no budget.
    pub(crate) async fn budget(&self, slot: &ClientSlot, bytes: u64) -> Result<Budget, Wait> {
        let limit = self.cfg.io_timeout.0;
        let n = permits_in(bytes).min(self.clients.limits().buffer_permits);
        let both = async {
            let client = acquire(&slot.buffers, n, limit).await?;
            let depot = acquire(&self.buffers, n, limit).await?;
            Ok(Budget {
                _client: client,
                _depot: depot,
            })
        };
        tokio::time::timeout(limit, both)
            .await
            .unwrap_or(Err(Wait::TimedOut))
    }

    /// Seconds since start.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Transfer-buffer budget one data phase holds: its client's share and the
/// depot's, released together.
pub(crate) struct Budget {
    _client: tokio::sync::OwnedSemaphorePermit,
    _depot: tokio::sync::OwnedSemaphorePermit,
}

fn default_advertise(bound: SocketAddr) -> String {
    if !bound.ip().is_unspecified() {
        return bound.ip().to_string();
    }
    rustix::system::uname()
        .nodename()
        .to_str()
        .ok()
        .filter(|s| !s.is_empty())
        .map_or_else(|| "localhost".to_owned(), str::to_owned)
}

pub use lors_ibp::raise_open_file_limit;

/// How long a connection admitted by evicting an idle one waits for the
/// place that one hands over.
const EVICT_WAIT: Duration = Duration::from_secs(2);

/// The reference depot's busy reply (`-66 1.0`: retry in a second), sent
/// to a connection the depot has no room for.
async fn refuse_busy(mut sock: tokio::net::TcpStream) {
    let busy = Reply::Fail {
        code: StatusCode::OUT_OF_SOCKETS,
        retry_after: Some(Duration::from_secs(1)),
    };
    let line = busy.encode();
    let _ = tokio::time::timeout(Duration::from_secs(2), sock.write_all(line.as_bytes())).await;
}

/// Serves IBP on `listeners` until `shutdown` turns true.
pub async fn run(
    listeners: Listeners,
    depot: Arc<Depot>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    depot.note_bound(listeners.ibp.local_addr()?);

    if let Some(m) = listeners.metrics {
        let d = depot.clone();
        let render = move || d.metrics.render(&d.store.status());
        tokio::spawn(lors_http::metrics::serve_metrics(
            m,
            render,
            shutdown.clone(),
        ));
    }
    tokio::spawn(expiry_worker(depot.clone(), shutdown.clone()));

    let max = depot.cfg.max_connections;
    let conns = Arc::new(Semaphore::new(max));
    loop {
        let (sock, peer) = tokio::select! {
            r = listeners.ibp.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    if crate::store::out_of_descriptors(&e) {
                        tracing::error!(
                            error = %e,
                            "out of file descriptors: new connections wait; raise `ulimit -n` or lower max_connections"
                        );
                    } else {
                        tracing::warn!(error = %e, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        depot.metrics.connections_total.inc();
        let Some(slot) = depot.clients.admit(peer.ip()) else {
            // This address already holds its share: busy for it alone.
            depot.metrics.refused(Refused::PerClient);
            tracing::debug!(%peer, "per-client connection limit reached");
            tokio::spawn(refuse_busy(sock));
            continue;
        };
        let place = match conns.clone().try_acquire_owned() {
            Ok(p) => Ok(p),
            // At the cap: an idle connection makes room and hands over its
            // place, else the reference depot's busy reply.
            Err(_) => match depot.clients.evict_idle() {
                Some(handed) => Err(handed),
                None => {
                    depot.metrics.refused(Refused::Busy);
                    tokio::spawn(refuse_busy(sock));
                    continue;
                }
            },
        };
        let _ = sock.set_nodelay(true);
        let depot = depot.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let place = match place {
                Ok(p) => p,
                Err(handed) => match tokio::time::timeout(EVICT_WAIT, handed).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        depot.metrics.refused(Refused::Busy);
                        drop(slot);
                        refuse_busy(sock).await;
                        return;
                    }
                },
            };
            depot.metrics.connections_open.inc();
            conn::serve(depot.clone(), sock, peer, slot, place, shutdown).await;
            depot.metrics.connections_open.dec();
        });
    }
    // Drain: connections see the shutdown signal between commands.
    let drain = conns.acquire_many(u32::try_from(max).unwrap_or(u32::MAX));
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("shutdown: some connections still busy after 10s");
    }
    Ok(())
}

/// Deletes expired allocations, at most once per `reap_interval`, and
/// brings resources out of their disk-full state.
async fn expiry_worker(depot: Arc<Depot>, mut shutdown: watch::Receiver<bool>) {
    let every = depot.cfg.reap_interval.0.max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        // A resource whose disk filled comes back by itself once there is
        // room again, whether or not anyone allocates meanwhile.
        let store = depot.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.maintain()).await;
        if depot.store.next_expiry().is_none_or(|t| t > unix_now()) {
            continue;
        }
        let store = depot.store.clone();
        if let Ok(n) = tokio::task::spawn_blocking(move || store.reap_expired(unix_now())).await
            && n > 0
        {
            tracing::info!(count = n, "deleted expired allocations");
            depot.metrics.expired.inc_by(n as u64);
        }
    }
}
