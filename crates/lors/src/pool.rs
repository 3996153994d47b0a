//! Reused connections per depot. A connection goes back to the pool only if
//! its last command left it in step (`Connection::is_healthy`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use lors_exnode::Mapping;
use lors_ibp::proto::{AllocType, Lease, Reliability};
use lors_ibp::{CapSet, Capability, ClientConfig, Connection, Result};

/// Idle connections kept per depot: as many as a transfer at distance
/// keeps busy ([`crate::download::MAX_AUTO_CONNECTIONS`]), so each block
/// or piece after the first goes over a connection past TCP's slow start
/// rather than a new one a round trip away.
const MAX_IDLE_PER_DEPOT: usize = 128;

/// Idle connections kept to all depots together.
const MAX_IDLE: usize = 1024;

/// The lease an allocation made under a journal starts with, until it is
/// written down ([`Pool::allocate`]).
pub const PROVISIONAL_LEASE: Duration = Duration::from_secs(60);

/// A depot whose connection is set up faster than this is near: the
/// request that makes a provisional lease full costs it next to nothing.
pub const NEAR: Duration = Duration::from_millis(20);

/// Which allocations made under a journal start with [`PROVISIONAL_LEASE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provisional {
    /// Every one: an exNode edit's copies wait on depot-to-depot SENDs,
    /// beside which one more round trip per allocation does not show.
    Always,
    /// Those on a depot nearer than [`NEAR`]. An upload makes an
    /// allocation per block, and at distance a second request per block
    /// is a round trip each block waits for (an upload 188 ms away, 94
    /// blocks in flight: 0.78 of the link with it, 0.81 without); there an
    /// allocation is asked for with its full lease, and one granted in the
    /// instant of a kill stays, empty, until that lease ends. (An augment
    /// at the same distance showed no difference: its copies' SENDs, not
    /// their allocations, set its pace.)
    WhereNear,
}

/// How long a command waits for its depots to answer a connect before it
/// starts, when it sizes its concurrency by their round trips
/// ([`Pool::round_trips`]): a depot slower than that is taken as near (it
/// is still used, it only buys no concurrency).
pub const MEASURE_WAIT: Duration = Duration::from_secs(1);

/// A pool of idle depot connections.
pub struct Pool {
    cfg: ClientConfig,
    idle: lors_ibp::IdleConnections,
    /// `--bwlimit`: every byte of data moved through this pool pays here.
    limit: Option<crate::rate::Limiter>,
    /// The pace of the uploads run through this pool: an xio file's
    /// flushes, each an upload of its own, judge a hung depot by what the
    /// earlier ones timed.
    watch: std::sync::OnceLock<Arc<crate::stall::Watcher>>,
    /// Where every allocation made through this pool is written down the
    /// moment it is granted ([`crate::commit::Session`]).
    journal: std::sync::OnceLock<Arc<crate::commit::Journal>>,
    /// The quickest connect to each depot so far: its round trip, as far
    /// as a client can tell without asking the kernel (a TCP handshake is
    /// one).
    rtts: Mutex<HashMap<String, Duration>>,
}

impl Pool {
    /// An empty pool whose connections use `cfg`.
    pub fn new(cfg: ClientConfig) -> Self {
        Pool {
            cfg,
            idle: lors_ibp::IdleConnections::new(MAX_IDLE_PER_DEPOT, MAX_IDLE),
            limit: None,
            watch: std::sync::OnceLock::new(),
            journal: std::sync::OnceLock::new(),
            rtts: Mutex::new(HashMap::new()),
        }
    }

    /// The round trip to `addr`, from the quickest connection made to it
    /// so far; `None` before the first.
    pub fn rtt(&self, addr: &str) -> Option<Duration> {
        let rtts = self.rtts.lock().unwrap_or_else(|e| e.into_inner());
        rtts.get(addr).copied()
    }

    /// Connects to each of `addrs` whose round trip is not known yet (the
    /// connection kept for the next command), waiting at most `wait`
    /// (usually [`MEASURE_WAIT`]);
    /// returns the round trips known then. A depot that does not answer
    /// in time is left to the first command to meet: its connect is cut
    /// off here.
    pub async fn round_trips(self: &Arc<Self>, addrs: &[String], wait: Duration) -> Vec<Duration> {
        let mut connects = tokio::task::JoinSet::new();
        for a in addrs.iter().filter(|a| self.rtt(a).is_none()) {
            let (pool, a) = (self.clone(), a.clone());
            connects.spawn(async move {
                if let Ok(c) = pool.get(&a).await {
                    pool.put(c);
                }
            });
        }
        let _ = tokio::time::timeout(wait, connects.join_all()).await;
        addrs.iter().filter_map(|a| self.rtt(a)).collect()
    }

    /// How many small commands (INCR, DECR) to have in flight to the
    /// depots `addrs`: 16, and more for far ones (one per
    /// [`crate::download::RTT_PER_CONNECTION`] of their round trips, up to
    /// [`crate::download::MAX_AUTO_CONNECTIONS`]), so releasing a few
    /// hundred blocks 188 ms away takes a few round trips, not 25.
    pub async fn ops_in_flight(self: &Arc<Self>, addrs: impl IntoIterator<Item = String>) -> usize {
        let mut addrs: Vec<String> = addrs.into_iter().collect();
        addrs.sort();
        addrs.dedup();
        let rtts = self.round_trips(&addrs, MEASURE_WAIT).await;
        let far =
            (rtts.into_iter().map(crate::download::connections_for)).fold(0, usize::saturating_add);
        far.clamp(16, crate::download::MAX_AUTO_CONNECTIONS)
    }

    /// The watcher of the uploads through this pool (see [`crate::stall`]).
    pub fn watcher(&self) -> Arc<crate::stall::Watcher> {
        (self
            .watch
            .get_or_init(|| Arc::new(crate::stall::Watcher::new(self.cfg.io_timeout, &self.cfg))))
        .clone()
    }

    /// Holds the data this pool moves (STOREs, SENDs it asks for, and the
    /// LOADs a download pays for through [`Pool::throttle`]) to
    /// `bytes_per_sec` in all.
    pub fn with_limit(mut self, bytes_per_sec: Option<u64>) -> Self {
        self.limit = bytes_per_sec.map(crate::rate::Limiter::new);
        self
    }

    /// Waits until `n` bytes of data may move under the limit, if any.
    pub async fn throttle(&self, n: u64) {
        if let Some(l) = &self.limit {
            l.take(n).await;
        }
    }

    /// The client settings.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// An idle connection to `addr` the depot has not closed, or a new one.
    pub async fn get(&self, addr: &str) -> Result<Connection> {
        if let Some(c) = self.idle.take(addr) {
            return Ok(c);
        }
        let t0 = Instant::now();
        let c = Connection::connect(addr, &self.cfg).await?;
        let took = t0.elapsed();
        let mut rtts = self.rtts.lock().unwrap_or_else(|e| e.into_inner());
        let best = rtts.entry(addr.to_owned()).or_insert(took);
        *best = (*best).min(took);
        Ok(c)
    }

    /// Returns a connection for reuse (dropped if it is not healthy).
    pub fn put(&self, c: Connection) {
        self.idle.keep(c);
    }

    /// ALLOCATE a byte array of `size` bytes on `addr` (depot chooses the
    /// resource) over a pooled connection.
    ///
    /// With a journal ([`Pool::set_journal`]) the allocation is written
    /// down as soon as its capabilities arrive. A depot names an
    /// allocation only in its reply, so one granted in the instant the
    /// client is killed, before it reads the reply, is named nowhere:
    /// such an allocation is asked for with a short lease
    /// ([`PROVISIONAL_LEASE`]) and given its full one only once it is in
    /// the journal, so what no journal can name ends within a minute.
    pub async fn allocate(
        &self,
        addr: &str,
        reliability: Reliability,
        duration: Duration,
        size: u64,
    ) -> Result<CapSet> {
        let journal = self.journal.get().map(|j| (&**j, Provisional::Always));
        (self.allocate_into(addr, reliability, duration, size, journal)).await
    }

    /// [`Pool::allocate`], written down in `journal` (with none, in this
    /// pool's own, if it has one), its lease provisional as that says.
    pub async fn allocate_into(
        &self,
        addr: &str,
        reliability: Reliability,
        duration: Duration,
        size: u64,
        journal: Option<(&crate::commit::Journal, Provisional)>,
    ) -> Result<CapSet> {
        let journal = match journal {
            Some(j) => Some(j),
            None => self.journal.get().map(|j| (&**j, Provisional::Always)),
        };
        let mut c = self.get(addr).await?;
        let provisional = journal.is_some_and(|(_, when)| match when {
            Provisional::Always => true,
            Provisional::WhereNear => self.rtt(addr).is_some_and(|t| t < NEAR),
        }) && duration > PROVISIONAL_LEASE;
        let lease = match provisional {
            true => Lease::Secs(PROVISIONAL_LEASE.as_secs()),
            false => Lease::Secs(duration.as_secs()),
        };
        let caps = c
            .allocate("0", reliability, AllocType::ByteArray, lease, size.max(1))
            .await?;
        let Some((j, _)) = journal else {
            self.put(c);
            return Ok(caps);
        };
        if let Err(e) = j.append(size.max(1), &caps) {
            // Not written down, so not kept: a kill now would strand it.
            let _ = c.decr(&caps.manage, lors_ibp::caps::CapKind::Read).await;
            return Err(lors_ibp::Error::Local {
                during: "writing the journal of allocations (is its disk full?)",
                source: e,
            });
        }
        if provisional {
            // Written down: now it may live as long as it was meant to.
            let full = Some(duration.as_secs());
            let made = c.change(&caps.manage, size.max(1), full, Some(reliability));
            if let Err(e) = made.await {
                let _ = c.decr(&caps.manage, lors_ibp::caps::CapKind::Read).await;
                return Err(e);
            }
        }
        self.put(c);
        Ok(caps)
    }

    /// Writes every allocation made through this pool from now on into
    /// `journal` (a pool has one at most; a second is ignored).
    pub fn set_journal(&self, journal: Arc<crate::commit::Journal>) {
        let _ = self.journal.set(journal);
    }

    /// The journal this pool writes its allocations into, if any.
    pub fn journal(&self) -> Option<&Arc<crate::commit::Journal>> {
        self.journal.get()
    }

    /// LOAD `len` bytes of `cap` from `offset` over a pooled connection.
    pub async fn load(&self, cap: &Capability, offset: u64, len: u64) -> Result<Vec<u8>> {
        // A size from an exNode: asked of the allocator, never assumed (a
        // claim it cannot meet is an error, not an abort).
        let mut buf: Vec<u8> = Vec::new();
        usize::try_from(len)
            .ok()
            .and_then(|n| buf.try_reserve_exact(n).ok())
            .ok_or_else(|| lors_ibp::Error::Local {
                during: "LOAD into memory",
                source: std::io::Error::new(
                    std::io::ErrorKind::OutOfMemory,
                    format!("{len} bytes cannot be held in memory"),
                ),
            })?;
        let mut c = self.get(&cap.address()).await?;
        c.load_buf(cap, offset, len, &mut buf).await?;
        self.put(c);
        Ok(buf)
    }

    /// STORE `data` into `cap` over a pooled connection.
    pub async fn store(&self, cap: &Capability, data: &[u8]) -> Result<u64> {
        self.throttle(data.len() as u64).await;
        let mut c = self.get(&cap.address()).await?;
        let n = c.store(cap, data).await?;
        self.put(c);
        Ok(n)
    }

    /// STORE `len` bytes of `file` from byte `pos` (sent with `sendfile(2)`)
    /// over a pooled connection.
    pub async fn store_file(
        &self,
        cap: &Capability,
        file: &std::fs::File,
        pos: u64,
        len: u64,
    ) -> Result<u64> {
        self.throttle(len).await;
        let mut c = self.get(&cap.address()).await?;
        let n = c.store_from_file(cap, file, pos, len).await?;
        self.put(c);
        Ok(n)
    }

    /// Takes one more reference on the allocation `manage` controls (INCR
    /// of its read count): a second exNode naming it holds its own, and a
    /// release by either leaves the other its data.
    pub async fn reference(&self, manage: &Capability) -> Result<()> {
        let mut c = self.get(&manage.address()).await?;
        c.incr(manage, lors_ibp::CapKind::Read).await?;
        self.put(c);
        Ok(())
    }

    /// What each resource of the depot at `addr` holds (IBP STATUS, as any
    /// client may ask it; `password` is the depot's, empty for none).
    pub async fn depot_status(
        &self,
        addr: &str,
        password: &str,
    ) -> Result<Vec<lors_ibp::proto::StatusBody>> {
        let mut c = self.get(addr).await?;
        let mut rows = Vec::new();
        for rid in c.resources().await? {
            rows.push(c.status(&rid, password).await?);
        }
        self.put(c);
        Ok(rows)
    }

    /// Drops our reference to the allocation `manage` controls (DECR of its
    /// read count): the depot frees it now, rather than at the end of its
    /// lease, when no other reference is left.
    pub async fn release(&self, manage: &Capability) -> Result<()> {
        let mut c = self.get(&manage.address()).await?;
        c.decr(manage, lors_ibp::CapKind::Read).await?;
        self.put(c);
        Ok(())
    }

    /// Releases the allocations of `mappings`, a few at a time; returns the
    /// mappings whose allocation could not be released (no manage
    /// capability, or the depot refused or could not be reached). A
    /// release waits at most [`crate::stall::RELEASE_WAIT`]; a depot that
    /// does not answer one in that time is not asked again, so a hung
    /// depot costs seconds, not the network timeout per allocation.
    pub async fn release_all(self: &Arc<Self>, mappings: Vec<Mapping>) -> Vec<Mapping> {
        (self.release_all_why(mappings).await)
            .into_iter()
            .map(|(m, _)| m)
            .collect()
    }

    /// [`Pool::release_all`], with why each one kept was not released.
    pub async fn release_all_why(
        self: &Arc<Self>,
        mappings: Vec<Mapping>,
    ) -> Vec<(Mapping, String)> {
        let depots = (mappings.iter()).filter_map(|m| Some(m.manage.as_ref()?.address()));
        let limit = Arc::new(tokio::sync::Semaphore::new(
            self.ops_in_flight(depots).await,
        ));
        let hung = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let mut set = tokio::task::JoinSet::new();
        for m in mappings {
            let (pool, limit, hung) = (self.clone(), limit.clone(), hung.clone());
            set.spawn(async move {
                let _slot = limit.acquire_owned().await;
                // Another copy of the file holds its reference: as good as
                // released for this one.
                if crate::commit::is_borrowed(&m) {
                    return (m, None);
                }
                let Some(cap) = &m.manage else {
                    return (m, Some("no manage capability".to_string()));
                };
                let addr = cap.address();
                // Hung here or, as the uploads through this pool found it,
                // before: left to its lease at once.
                let hung_before = pool.watch.get().is_some_and(|w| w.is_hung(&addr));
                if hung_before
                    || hung
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&addr)
                {
                    let why = format!("depot {addr} did not answer an earlier request in time");
                    return (m, Some(why));
                }
                let why = match tokio::time::timeout(crate::stall::RELEASE_WAIT, pool.release(cap))
                    .await
                {
                    // Gone already (a run before this one freed it,
                    // or its lease ended): as good as released.
                    Ok(Err(e))
                        if e.status() == Some(lors_ibp::proto::StatusCode::CAP_NOT_FOUND) =>
                    {
                        None
                    }
                    Ok(Err(e)) => Some(e.to_string()),
                    Ok(Ok(())) => None,
                    Err(_) => {
                        let why = format!(
                            "depot {addr} did not answer within {}s",
                            crate::stall::RELEASE_WAIT.as_secs()
                        );
                        hung.lock().unwrap_or_else(|e| e.into_inner()).insert(addr);
                        Some(why)
                    }
                };
                (m, why)
            });
        }
        let mut kept = Vec::new();
        while let Some(done) = set.join_next().await {
            match done {
                Ok((_, None)) => {}
                Ok((m, Some(why))) => kept.push((m, why)),
                Err(e) => tracing::warn!(error = %e, "releasing an allocation"),
            }
        }
        kept.sort_by_key(|(m, _)| m.exnode_offset);
        kept
    }

    /// Has the depot holding `src` copy `[offset, offset+len)` to `dest` (SEND).
    pub async fn send(
        &self,
        src: &Capability,
        dest: &Capability,
        offset: u64,
        len: u64,
    ) -> Result<u64> {
        self.throttle(len).await;
        let mut c = self.get(&src.address()).await?;
        let n = c.send(src, dest, offset, len).await?;
        self.put(c);
        Ok(n)
    }
}
