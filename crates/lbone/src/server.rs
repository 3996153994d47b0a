//! The L-Bone server: the HTTP/JSON API and dashboard, the legacy 512-byte
//! protocol, and the sweeper that marks silent depots offline and drops them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use axum::body::Bytes;
use axum::http::HeaderMap;
use lors_http::peers::{Peers, Slot, place_for};

use crate::budget::{self, Budget, NoRoom, Room};
use crate::forecast::client_net;
use crate::legacy::{self, LegacyRequest};
use crate::metrics::{Metrics, Registered};
use crate::model::{
    Departure, DepotRecord, DepotView, RateReports, Recorded, Registration, Removed, Welcome,
};
use crate::rank::{self, Query};
use crate::store::{Change, Store};

type Response = axum::response::Response;

mod http;
pub use http::{ApiError, router};

/// Why the directory could not read or keep what it was asked for.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Indexing the listing on a blocking thread failed.
    #[error("indexing the directory: {0}")]
    Indexing(tokio::task::JoinError),
}

/// How long a listing read from the store serves queries before it is read
/// again (registrations and departures refresh it at once).
const LISTING_FRESH: Duration = Duration::from_secs(1);

/// The dashboard's history: one sample a minute.
const SAMPLE_STEP: i64 = 60;

/// Announced changes waiting to be read; past that, a full read.
const CHANGES_QUEUED: usize = 16_384;

/// How long announced changes are gathered before they are read.
const FOLLOW_BATCH: Duration = Duration::from_millis(20);

/// Listings ranked and encoded at once: each holds a copy of the directory.
const LISTING_WORKERS: usize = 2;

/// Response bytes being sent at once, across all connections, a body
/// shared by many answers counted once. Eight addresses each holding a
/// listing of 10,000 depots (5 MiB) leave more than half of it; the L-Bone
/// stays within its memory bound under 96 concurrent listings of 10,000
/// depots (`bench/hostile.py`, lbone-list).
const BODY_BUDGET: usize = 64 << 20;

/// One client address's answers hold at most this part of the body budget
/// (or one body larger than that).
const BODY_SHARES: usize = 16;

/// How long a made history answer serves before it is made again (a new
/// sample makes it again at once).
const HISTORY_FRESH: Duration = Duration::from_secs(10);

/// A listing's question: the client's network and the query as asked.
type Question = (String, String);

/// A listing given, and when.
type Answered = (Instant, Bytes, Arc<budget::Reserved>);

/// Listings kept for [`LISTING_FRESH`] to answer the same question again,
/// at most so many and so many bytes (distinct questions are not to fill
/// memory with answers nobody will ask for again).
const MAX_ANSWERS: usize = 256;
const ANSWERS_BYTES: usize = 16 << 20;

/// Rate-report requests one client network may make per minute.
const RATE_POSTS_PER_MINUTE: u32 = 60;

/// The dashboard page (self-contained: no external scripts, fonts or tiles).
const DASHBOARD: &str = include_str!("dashboard.html");

/// Server settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Registration token (compared in constant time).
    pub token: String,
    /// Heartbeat interval suggested to depots.
    pub heartbeat: Duration,
    /// A depot silent this long is offline.
    pub offline_after: Duration,
    /// A depot silent this long is dropped.
    pub drop_after: Duration,
    /// How often the sweeper runs.
    pub sweep_every: Duration,
    /// Per-request read/write timeout.
    pub io_timeout: Duration,
    /// Most connections served at once.
    pub max_connections: usize,
    /// Most connections one client address may hold at once.
    pub max_connections_per_client: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            token: String::new(),
            heartbeat: Duration::from_secs(30),
            offline_after: Duration::from_secs(90),
            drop_after: Duration::from_secs(86_400),
            sweep_every: Duration::from_secs(60),
            io_timeout: Duration::from_secs(10),
            max_connections: 256,
            max_connections_per_client: 32,
        }
    }
}

/// A running directory.
pub struct LBone {
    store: Store,
    cfg: Config,
    token_hash: blake3::Hash,
    /// Depots this instance has logged as offline, to log each transition once.
    offline: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The directory, in memory: registrations through this instance go
    /// to the store and here; those through others arrive by
    /// [`Store::watch`] and a full read at each sweep. Queries never read
    /// the store.
    directory: Arc<std::sync::RwLock<HashMap<String, DepotRecord>>>,
    /// The directory indexed for ranking, shared by every query until it
    /// is [`LISTING_FRESH`] old or a depot comes or goes.
    listing: Fresh<Listing>,
    /// Turns to rank and encode a listing.
    workers: Semaphore,
    /// Listings answered within [`LISTING_FRESH`], by client network and
    /// query: the same question asked many times at once is encoded once.
    answers: std::sync::Mutex<HashMap<Question, Answered>>,
    /// Whether `largest` was measured (a listing of every depot made).
    measured: std::sync::atomic::AtomicBool,
    /// Bytes of the last listing of every depot: the most any listing
    /// takes, reserved from the body budget before one is made.
    largest: std::sync::atomic::AtomicUsize,
    /// Response bytes in flight.
    budget: Arc<Budget>,
    /// The last history answer: its sample time, when it was made, its
    /// body and reservation.
    history: std::sync::Mutex<Option<(i64, Answered)>>,
    /// Bytes of the last history answer.
    history_bytes: std::sync::atomic::AtomicUsize,
    /// Bytes of the last `/metrics` text.
    metrics_bytes: std::sync::atomic::AtomicUsize,
    /// Rate-report requests per client network in the current minute.
    reporters: std::sync::Mutex<(Instant, HashMap<String, u32>)>,
    /// Forecasts (bytes/s by depot address) per client network, read as
    /// the listing is: every query from a network would otherwise read
    /// them again.
    forecasts: std::sync::Mutex<HashMap<String, Arc<Fresh<Forecasts>>>>,
    /// What `/metrics` shows.
    metrics: Metrics,
    /// Rates reported to this instance since the last sample: their sum
    /// (bytes/s) and count.
    reported: std::sync::Mutex<(f64, u64)>,
}

/// The directory as read from the store, indexed for ranking.
struct Listing {
    depots: Vec<DepotRecord>,
    index: rank::Index,
}

/// Forecast bytes/s by depot address, for one client network.
type Forecasts = HashMap<String, f64>;

/// A value read from the store and shared until it is [`LISTING_FRESH`]
/// old. Then one caller reads it again while the others go on with the old
/// one: a read (a whole directory of 10,000 depots) never holds up every
/// query at once. Cleared, everyone waits for the read, so a change shows
/// at once.
struct Fresh<T> {
    slot: std::sync::Mutex<Option<(Instant, Arc<T>)>>,
    /// Held by the one caller reading.
    reading: tokio::sync::Mutex<()>,
    /// Bumped by [`Fresh::clear`]: a value read across a bump may miss the
    /// change and is not kept.
    generation: std::sync::atomic::AtomicU64,
}

impl<T> Fresh<T> {
    fn new() -> Self {
        Fresh {
            slot: std::sync::Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn cached(&self) -> Option<(Instant, Arc<T>)> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The value, from `read` when it is missing or old.
    async fn get<F, E>(&self, read: F) -> Result<Arc<T>, E>
    where
        F: std::future::Future<Output = Result<T, E>>,
    {
        use std::sync::atomic::Ordering::SeqCst;
        let had = match self.cached() {
            Some((at, v)) if at.elapsed() < LISTING_FRESH => return Ok(v),
            had => had,
        };
        let _turn = match (self.reading.try_lock(), had) {
            (Ok(turn), _) => turn,
            (Err(_), Some((_, v))) => return Ok(v),
            (Err(_), None) => {
                let turn = self.reading.lock().await;
                if let Some((_, v)) = self.cached() {
                    return Ok(v);
                }
                turn
            }
        };
        let generation = self.generation.load(SeqCst);
        let v = Arc::new(read.await?);
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if self.generation.load(SeqCst) == generation {
            *slot = Some((Instant::now(), v.clone()));
        }
        Ok(v)
    }

    /// Forgets the value: the next caller reads it again, and the others
    /// wait for that read.
    fn clear(&self) {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        *slot = None;
    }

    /// Whether the value was read long ago (or never): a cache entry not
    /// worth its room.
    fn unused(&self) -> bool {
        self.cached()
            .is_none_or(|(at, _)| at.elapsed() > 10 * LISTING_FRESH)
    }
}

/// Unix seconds now, as the store keeps times.
pub fn now() -> i64 {
    i64::try_from(lors_ibp::units::unix_now()).unwrap_or(i64::MAX)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

impl LBone {
    /// A directory over `store`.
    pub fn new(store: impl Into<Store>, cfg: Config) -> Arc<LBone> {
        let store = store.into();
        Arc::new(LBone {
            token_hash: blake3::hash(cfg.token.as_bytes()),
            offline: std::sync::Mutex::new(std::collections::HashSet::new()),
            directory: Arc::new(std::sync::RwLock::new(HashMap::new())),
            listing: Fresh::new(),
            workers: Semaphore::new(LISTING_WORKERS),
            answers: std::sync::Mutex::new(HashMap::new()),
            largest: std::sync::atomic::AtomicUsize::new(budget::UNIT),
            measured: std::sync::atomic::AtomicBool::new(false),
            budget: Budget::new(BODY_BUDGET, BODY_SHARES),
            history: std::sync::Mutex::new(None),
            history_bytes: std::sync::atomic::AtomicUsize::new(budget::UNIT),
            metrics_bytes: std::sync::atomic::AtomicUsize::new(budget::UNIT),
            reporters: std::sync::Mutex::new((Instant::now(), HashMap::new())),
            forecasts: std::sync::Mutex::new(HashMap::new()),
            metrics: Metrics::new(),
            reported: std::sync::Mutex::new((0.0, 0)),
            store,
            cfg,
        })
    }

    /// The store, for logs.
    pub fn describe(&self) -> String {
        self.store.describe()
    }

    fn token_ok(&self, given: Option<&str>) -> bool {
        // Hash first so the comparison takes the same time whatever the
        // length or content of the guess.
        let given = blake3::hash(given.unwrap_or("").as_bytes());
        !self.cfg.token.is_empty()
            && lors_ibp::caps::ct_eq(given.as_bytes(), self.token_hash.as_bytes())
    }

    /// A store call's outcome, its failure counted.
    async fn stored<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, crate::store::StoreError>>,
    ) -> Result<T, ServerError> {
        let r = call.await.map_err(ServerError::Store);
        if r.is_err() {
            self.metrics.store_error();
        }
        r
    }

    /// Every depot, as the directory in memory held them at most
    /// [`LISTING_FRESH`] ago: concurrent queries share one copy.
    async fn depots(&self) -> Result<Arc<Listing>, ServerError> {
        // Copied and indexed on a blocking thread: at 10,000 depots that
        // is milliseconds no query on the async workers should wait behind.
        let dir = self.directory.clone();
        let read = async move {
            tokio::task::spawn_blocking(move || {
                let depots: Vec<DepotRecord> = {
                    let dir = dir.read().unwrap_or_else(|e| e.into_inner());
                    let mut v: Vec<_> = dir.iter().collect();
                    v.sort_unstable_by(|a, b| a.0.cmp(b.0));
                    v.into_iter().map(|(_, d)| d.clone()).collect()
                };
                let index = rank::Index::build(&depots);
                Listing { depots, index }
            })
            .await
            .map_err(ServerError::Indexing)
        };
        self.listing.get(read).await
    }

    fn directory_write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, DepotRecord>> {
        self.directory.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes what the store says of `addrs` (all of them when `None`), as
    /// read from a time `began`: a depot the store has is kept unless
    /// memory holds a newer heartbeat; one it lacks is dropped unless it
    /// registered here since `began` (the read may predate it).
    async fn refresh(&self, addrs: Option<Vec<String>>, began: i64) -> Result<(), ServerError> {
        let (fresh, asked) = match addrs {
            None => (self.stored(self.store.list()).await?, None),
            Some(a) => {
                let asked = a.clone();
                (self.stored(self.store.get(&a)).await?, Some(asked))
            }
        };
        let mut fresh: HashMap<String, DepotRecord> =
            fresh.into_iter().map(|d| (d.reg.addr(), d)).collect();
        let mut changed = false;
        {
            let mut dir = self.directory_write();
            let stale = |d: &DepotRecord| d.last_seen < began;
            let candidates: Vec<String> = match &asked {
                Some(a) => a.clone(),
                None => dir.keys().cloned().collect(),
            };
            for addr in candidates {
                if !fresh.contains_key(&addr) && dir.get(&addr).is_some_and(stale) {
                    dir.remove(&addr);
                    changed = true;
                }
            }
            for (addr, d) in fresh.drain() {
                match dir.get_mut(&addr) {
                    Some(mine) if mine.last_seen > d.last_seen => {}
                    Some(mine) => *mine = d,
                    None => {
                        dir.insert(addr, d);
                        changed = true;
                    }
                }
            }
        }
        if changed {
            self.listing_changed().await;
        }
        Ok(())
    }

    /// Reads the whole directory from the store into memory.
    pub async fn load(&self) -> Result<(), ServerError> {
        self.refresh(None, now()).await
    }

    /// Applies changes other instances announce, a batch at a time, until
    /// `changes` closes.
    async fn follow(&self, mut changes: tokio::sync::mpsc::Receiver<Change>) {
        while let Some(first) = changes.recv().await {
            // Heartbeats come in hundreds a second: a short wait gathers
            // them into one read.
            tokio::time::sleep(FOLLOW_BATCH).await;
            let mut reload = first == Change::Reload;
            let mut addrs = std::collections::HashSet::new();
            if let Change::Depot(a) = first {
                addrs.insert(a);
            }
            while addrs.len() < crate::store::GET_BATCH {
                match changes.try_recv() {
                    Ok(Change::Reload) => reload = true,
                    Ok(Change::Depot(a)) => {
                        addrs.insert(a);
                    }
                    Err(_) => break,
                }
            }
            let began = now();
            let r = if reload {
                self.refresh(None, began).await
            } else {
                self.refresh(Some(addrs.into_iter().collect()), began).await
            };
            if let Err(e) = r {
                tracing::warn!("following other instances' changes: {e}");
            }
        }
    }

    /// Forgets the shared listing and the answers made from it: a depot
    /// came or went.
    async fn listing_changed(&self) {
        self.listing.clear();
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Ranks depots for a client on `peer`'s network.
    pub async fn query(
        &self,
        q: Query,
        peer: std::net::IpAddr,
    ) -> Result<Vec<DepotView>, ServerError> {
        let net = client_net(peer);
        let listing = self.depots().await?;
        let fc = self.forecasts_for(net).await?;
        Ok(rank::rank_indexed(
            &listing.depots,
            Some(&listing.index),
            &q,
            now(),
            secs(self.cfg.offline_after),
            &fc,
        ))
    }

    /// The forecasts for clients on `net`, read from the store at most
    /// [`LISTING_FRESH`] ago.
    async fn forecasts_for(&self, net: String) -> Result<Arc<Forecasts>, ServerError> {
        let entry = {
            let mut map = self.forecasts.lock().unwrap_or_else(|e| e.into_inner());
            if map.len() >= MAX_ANSWERS && !map.contains_key(&net) {
                map.retain(|_, f| !f.unused());
            }
            match map.get(&net) {
                Some(f) => f.clone(),
                None => {
                    let f = Arc::new(Fresh::new());
                    if map.len() < MAX_ANSWERS {
                        map.insert(net.clone(), f.clone());
                    }
                    f
                }
            }
        };
        let read = async move {
            let fc = self.stored(self.store.forecasts(&net)).await?;
            Ok(fc
                .into_iter()
                .filter_map(|(d, f)| Some((d, f.predict()?)))
                .collect())
        };
        entry.get(read).await
    }

    /// `GET /api/v1/depots`: room for the answer is reserved from the body
    /// budget first (as much as the largest listing took, or for a query
    /// of `count` depots that many depots' share of it), then the answer
    /// is taken from those given in the last second to the same question
    /// from the same network, or ranked and encoded on one of a few turns.
    /// However many clients ask at once, few copies of the directory exist.
    async fn listing(
        &self,
        asked: http::DepotsQuery,
        peer: std::net::IpAddr,
    ) -> Result<Response, ApiError> {
        #[derive(serde::Serialize)]
        struct Listing<'a> {
            depots: &'a [DepotView],
            offline_after: i64,
            now: i64,
        }
        let http::DepotsQuery { raw, query: q, all } = asked;
        // Until a listing of every depot has been made, a kilobyte a depot
        // (more than a registration with a full location takes).
        let depots = self.directory_len().max(1);
        let mut largest = self.largest.load(std::sync::atomic::Ordering::Relaxed);
        if !self.measured.load(std::sync::atomic::Ordering::Relaxed) {
            largest = largest.max(depots.saturating_mul(1024));
        }
        let estimate = match q.count {
            0 => largest,
            n => largest.min((largest / depots).saturating_mul(n).saturating_add(4096)),
        };
        let key = (client_net(peer), raw);
        if let Some(hit) = self.answered(&key) {
            return self.again(hit, peer).await;
        }
        let mut room = self.room(estimate, peer).await?;
        let _turn = self.turn().await?;
        // Made by whoever had the turn before.
        if let Some(hit) = self.answered(&key) {
            drop((_turn, room));
            return self.again(hit, peer).await;
        }
        let v = self.query(q, peer).await?;
        // Encoded into room for the listing expected, so the buffer is not
        // grown by doubling past it; the views go before the body is shared.
        let mut body = Vec::with_capacity(estimate);
        let listing = Listing {
            depots: &v,
            offline_after: secs(self.cfg.offline_after),
            now: now(),
        };
        serde_json::to_writer(&mut body, &listing).map_err(|_| ApiError::Encode)?;
        drop(v);
        let body = Bytes::from(body);
        // Every depot's listing is the largest there is; a smaller one may
        // only raise the estimate (the directory grew since).
        let size = body.len().max(budget::UNIT);
        if all {
            self.largest
                .store(size, std::sync::atomic::Ordering::Relaxed);
            self.measured
                .store(true, std::sync::atomic::Ordering::Relaxed);
        } else {
            self.largest
                .fetch_max(size, std::sync::atomic::Ordering::Relaxed);
        }
        // Larger than expected (the directory grew): more room, the turn
        // still held so the next one finds this answer made.
        (self.budget)
            .grow(&mut room, body.len(), self.cfg.io_timeout)
            .await?;
        {
            let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            answers.retain(|_, (at, _, _)| at.elapsed() < LISTING_FRESH);
            let kept: usize = answers.values().map(|(_, b, _)| b.len()).sum();
            if answers.len() < MAX_ANSWERS && kept + body.len() <= ANSWERS_BYTES {
                answers.insert(key, (Instant::now(), body.clone(), room.body()));
            }
        }
        drop(_turn);
        Ok(http::json_held(body, room))
    }

    /// One of the few turns to rank or read on, waited for up to the I/O
    /// timeout.
    async fn turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
        tokio::time::timeout(self.cfg.io_timeout, self.workers.acquire())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(ApiError::Room(NoRoom::Busy))
    }

    /// An answer made already, sent again: its body is reserved, this
    /// answer takes only its address's share.
    async fn again(
        &self,
        (body, reserved): (Bytes, Arc<budget::Reserved>),
        peer: std::net::IpAddr,
    ) -> Result<Response, ApiError> {
        let room = (self.budget)
            .again(&reserved, peer, self.cfg.io_timeout)
            .await?;
        Ok(http::json_held(body, room))
    }

    /// Depots in the directory now.
    fn directory_len(&self) -> usize {
        self.directory
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// A listing given to the same question within [`LISTING_FRESH`], and
    /// its reservation. Older ones go (with their reservations).
    fn answered(&self, key: &Question) -> Option<(Bytes, Arc<budget::Reserved>)> {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers.retain(|_, (at, _, _)| at.elapsed() < LISTING_FRESH);
        answers.get(key).map(|(_, b, r)| (b.clone(), r.clone()))
    }

    /// Room for `bytes` of response in the body budget, for `peer`, waited
    /// for up to the I/O timeout.
    async fn room(&self, bytes: usize, peer: std::net::IpAddr) -> Result<Room, ApiError> {
        Ok(self.budget.room(bytes, peer, self.cfg.io_timeout).await?)
    }

    /// Whether `net` may post another rate report this minute.
    fn may_report(&self, net: &str) -> bool {
        let mut r = self.reporters.lock().unwrap_or_else(|e| e.into_inner());
        if r.0.elapsed() >= Duration::from_secs(60) {
            *r = (Instant::now(), HashMap::new());
        }
        let n = r.1.entry(net.to_owned()).or_insert(0);
        *n += 1;
        *n <= RATE_POSTS_PER_MINUTE
    }

    /// One sweep: note depots that went offline (silent longer than
    /// `offline_after`), drop those silent longer than `drop_after`.
    pub async fn sweep(&self) -> Result<Vec<String>, ServerError> {
        let t = now();
        let cutoff = t - secs(self.cfg.drop_after);
        let offline_cutoff = t - secs(self.cfg.offline_after);
        let gone = self.stored(self.store.drop_silent(cutoff)).await?;
        // Dropped here as in the store (another instance may have dropped
        // them from it first), then the whole directory read again: what
        // the announcements missed is caught up at least once a sweep.
        let dropped = {
            let mut dir = self.directory_write();
            let before = dir.len();
            dir.retain(|_, d| d.last_seen >= cutoff);
            before != dir.len()
        };
        if dropped || !gone.is_empty() {
            self.listing_changed().await;
        }
        self.refresh(None, t).await?;
        // The shared listing, not a read of its own: a sweep of a large
        // directory would otherwise hold the store as long as a listing
        // read does, and the heartbeats wait behind it.
        let listed = self.depots().await?;
        {
            let mut offline = self.offline_lock();
            for d in listed
                .depots
                .iter()
                .filter(|d| d.last_seen < offline_cutoff)
            {
                let addr = d.reg.addr();
                if !offline.contains(&addr) {
                    tracing::info!(depot = %addr, silent_s = t - d.last_seen, "offline: no heartbeat");
                    offline.insert(addr);
                }
            }
            for d in &gone {
                offline.remove(d);
                tracing::info!(depot = %d, "dropped: no heartbeat");
            }
        }
        self.sample(&listed.depots, t, offline_cutoff).await?;
        Ok(gone)
    }

    /// Records the directory's figures for the current minute, and the
    /// rates reported here since the last sample.
    async fn sample(
        &self,
        depots: &[DepotRecord],
        t: i64,
        offline_cutoff: i64,
    ) -> Result<(), ServerError> {
        let mut x = crate::model::Sample {
            t: t - t.rem_euclid(SAMPLE_STEP),
            depots: depots.len() as u64,
            online: 0,
            hard_total: 0,
            hard_free: 0,
            reported_sum: 0.0,
            reports: 0,
        };
        for d in depots.iter().filter(|d| d.last_seen >= offline_cutoff) {
            x.online += 1;
            for r in &d.reg.resources {
                x.hard_total = x.hard_total.saturating_add(r.hard_total);
                x.hard_free = x.hard_free.saturating_add(r.hard_free);
            }
        }
        (x.reported_sum, x.reports) =
            std::mem::take(&mut *self.reported.lock().unwrap_or_else(|e| e.into_inner()));
        let r = self.stored(self.store.add_sample(x)).await;
        if r.is_err() {
            // Counted at the next sample instead.
            let mut back = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            back.0 += x.reported_sum;
            back.1 += x.reports;
        }
        r
    }

    /// `GET /api/v1/history`: the last day's samples, read from the store
    /// at most every [`HISTORY_FRESH`] (and after each new sample) and
    /// shared, its room taken from the body budget once.
    async fn history(&self, peer: std::net::IpAddr) -> Result<Response, ApiError> {
        let t = now();
        let minute = t - t.rem_euclid(SAMPLE_STEP);
        let cached = || {
            (self.history.lock().unwrap_or_else(|e| e.into_inner()))
                .as_ref()
                .filter(|(m, (at, _, _))| *m == minute && at.elapsed() < HISTORY_FRESH)
                .map(|(_, (_, b, r))| (b.clone(), r.clone()))
        };
        if let Some(hit) = cached() {
            return self.again(hit, peer).await;
        }
        // Room as large as the last answer, before the turn: a turn is
        // never held waiting for an address's share.
        use std::sync::atomic::Ordering::Relaxed;
        let mut room = self.room(self.history_bytes.load(Relaxed), peer).await?;
        // One read at a time: the others wait for it, then share it.
        let _turn = self.turn().await?;
        if let Some(hit) = cached() {
            drop((_turn, room));
            return self.again(hit, peer).await;
        }
        let samples = self.stored(self.store.samples(t - 86_400)).await?;
        let history = crate::model::History {
            step: SAMPLE_STEP,
            samples,
        };
        let body = Bytes::from(serde_json::to_vec(&history).map_err(|_| ApiError::Encode)?);
        (self.budget)
            .grow(&mut room, body.len(), self.cfg.io_timeout)
            .await?;
        self.history_bytes.store(body.len(), Relaxed);
        *self.history.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((minute, (Instant::now(), body.clone(), room.body())));
        drop(_turn);
        Ok(http::json_held(body, room))
    }

    /// `GET /metrics`, its room (as large as the last) taken from the body
    /// budget before it is made.
    async fn metrics_page(
        &self,
        peer: std::net::IpAddr,
        headers: &HeaderMap,
    ) -> Result<Response, ApiError> {
        use std::sync::atomic::Ordering::Relaxed;
        let room = self.room(self.metrics_bytes.load(Relaxed), peer).await?;
        let l = self.depots().await?;
        let text = self
            .metrics
            .render(&l.depots, now(), secs(self.cfg.offline_after));
        self.metrics_bytes.store(text.len(), Relaxed);
        let r = lors_http::metrics::exposition(headers, text);
        let (parts, body) = r.into_parts();
        Ok(Response::from_parts(parts, http::held(body, room)))
    }

    fn offline_lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.offline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `POST /api/v1/deregister`.
    async fn deregister(&self, d: Departure) -> Result<Removed, ApiError> {
        let addr = d.addr();
        let known = self.stored(self.store.remove(&addr)).await?;
        self.directory_write().remove(&addr);
        self.listing_changed().await;
        self.offline_lock().remove(&addr);
        self.metrics.registered(Registered::Departure);
        tracing::info!(depot = %addr, known, "deregistered");
        Ok(Removed {
            ok: true,
            removed: known,
        })
    }

    /// `POST /api/v1/register`: a registration or a heartbeat.
    async fn register(&self, reg: Registration) -> Result<Welcome, ApiError> {
        reg.validate()?;
        let addr = reg.addr();
        let t = now();
        let record = DepotRecord {
            reg: reg.clone(),
            first_seen: t,
            last_seen: t,
        };
        let before = self.stored(self.store.upsert(&reg, t)).await?;
        let new_here = {
            let mut dir = self.directory_write();
            match dir.get_mut(&addr) {
                Some(d) => {
                    d.reg = record.reg;
                    d.last_seen = d.last_seen.max(t);
                    false
                }
                None => {
                    dir.insert(addr.clone(), record);
                    true
                }
            }
        };
        if before.is_none() || new_here {
            self.listing_changed().await;
        }
        self.metrics.registered(if before.is_none() {
            Registered::New
        } else {
            Registered::Heartbeat
        });
        let was_offline = self.offline_lock().remove(&addr);
        match before {
            None => tracing::info!(depot = %addr, "registered"),
            Some(_) if was_offline => {
                tracing::info!(depot = %addr, "online again")
            }
            Some(_) => tracing::debug!(depot = %addr, "heartbeat"),
        }
        Ok(Welcome {
            ok: true,
            heartbeat_seconds: self.cfg.heartbeat.as_secs(),
        })
    }

    /// `POST /api/v1/rates`: throughput a client network measured.
    async fn rates(&self, r: RateReports, peer: std::net::IpAddr) -> Result<Recorded, ApiError> {
        if r.rates.len() > 1024 || r.rates.iter().any(|x| x.depot.len() > 300) {
            return Err(ApiError::TooManyRates);
        }
        let net = client_net(peer);
        if !self.may_report(&net) {
            return Err(ApiError::ReportsPerMinute);
        }
        // Only depots the directory lists get a forecast: checked against
        // the directory in memory (keyed by address), then by the store.
        let known: Vec<_> = {
            let dir = self.directory.read().unwrap_or_else(|e| e.into_inner());
            r.rates
                .into_iter()
                .filter(|x| dir.contains_key(&x.depot))
                .collect()
        };
        let t = now();
        let known: Vec<(String, f64)> = known
            .into_iter()
            .map(|x| (x.depot, x.bytes_per_sec))
            .collect();
        let sum = known.iter().map(|(_, b)| b.max(0.0)).sum::<f64>();
        let count = known.len() as u64;
        let n = self.stored(self.store.record_rates(&net, known, t)).await?;
        // The network's next query sees its own reports.
        if let Some(f) = self
            .forecasts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&client_net(peer))
        {
            f.clear();
        }
        let mut r = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        r.0 += sum;
        r.1 += count;
        drop(r);
        Ok(Recorded {
            ok: true,
            recorded: n,
        })
    }

    /// Answers one legacy message.
    pub async fn legacy_reply(
        &self,
        msg: &[u8; legacy::MESSAGE_LEN],
        peer: std::net::IpAddr,
    ) -> Vec<u8> {
        let req = match legacy::parse_request(msg) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(%peer, "legacy query refused: {e}");
                return legacy::encode_error(e.code);
            }
        };
        // The original clients send free text; keep the terms we know.
        let hint = |loc: &str| rank::parse_hint(loc).unwrap_or_default();
        let q = match &req {
            LegacyRequest::Depots {
                count,
                hard_mb,
                soft_mb,
                duration,
                location,
            } => Query {
                count: *count,
                hard: hard_mb.saturating_mul(1 << 20),
                soft: soft_mb.saturating_mul(1 << 20),
                duration: *duration,
                hint: hint(location),
                ..Query::default()
            },
            LegacyRequest::Proximity { location } => Query {
                hint: hint(location),
                ..Query::default()
            },
            LegacyRequest::Count => Query::default(),
        };
        // Ranked on the same few turns as HTTP listings: each ranking holds
        // a copy of the directory.
        let Ok(_turn) = tokio::time::timeout(self.cfg.io_timeout, self.workers.acquire()).await
        else {
            return legacy::encode_error(legacy::INVALID_PARAMS);
        };
        match self.query(q, peer).await {
            Ok(v) if req == LegacyRequest::Count => legacy::encode_count(v.len()),
            Ok(v) => legacy::encode_depots(
                &v.iter()
                    .map(|d| (d.depot.host.clone(), d.depot.port))
                    .collect::<Vec<_>>(),
            ),
            Err(e) => {
                tracing::warn!("legacy query failed: {e}");
                legacy::encode_error(legacy::INVALID_PARAMS)
            }
        }
    }

    async fn serve_legacy(
        self: Arc<Self>,
        mut s: TcpStream,
        peer: SocketAddr,
        slot: Slot,
        place: Place,
    ) {
        let mut msg = [0u8; legacy::MESSAGE_LEN];
        let read = tokio::select! {
            r = tokio::time::timeout(self.cfg.io_timeout, s.read_exact(&mut msg)) => r,
            () = slot.evicted() => return slot.hand_over(place),
        };
        match read {
            Ok(Ok(_)) => {}
            _ => return, // cut short or too slow: nothing to answer
        }
        slot.served();
        let started = Instant::now();
        let reply = self.legacy_reply(&msg, peer.ip()).await;
        self.metrics.legacy_query(started.elapsed());
        let _ = tokio::time::timeout(self.cfg.io_timeout, s.write_all(&reply)).await;
        let _ = s.shutdown().await;
    }
}

/// A connection's place among the `max_connections`.
type Place = tokio::sync::OwnedSemaphorePermit;

/// How long a connection admitted by closing a waiting one waits for the
/// place that one hands over.
const EVICT_WAIT: Duration = Duration::from_secs(2);

/// Accepts legacy-protocol connections: one 512-byte question each.
async fn legacy_loop(l: TcpListener, lb: Arc<LBone>, mut shutdown: watch::Receiver<bool>) {
    let peers = Peers::new(
        lb.cfg.max_connections_per_client,
        lb.cfg.max_connections_per_client,
    );
    let slots = Arc::new(Semaphore::new(lb.cfg.max_connections.max(1)));
    loop {
        let (s, peer) = tokio::select! {
            r = l.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        // An address past its share is refused; at the overall limit a
        // connection still waiting for its request makes room, else the new
        // one is refused rather than queued without bound.
        let Some(slot) = peers.admit(peer.ip()) else {
            tracing::debug!(%peer, "per-client connection limit reached");
            drop(s);
            continue;
        };
        let place = match slots.clone().try_acquire_owned() {
            Ok(p) => Ok(p),
            Err(_) => match peers.evict_waiting(&slot) {
                Some(handed) => Err(handed),
                None => continue,
            },
        };
        let lb = lb.clone();
        let slots = slots.clone();
        tokio::spawn(async move {
            let place = match place {
                Ok(p) => p,
                Err(handed) => match place_for(handed, slots, EVICT_WAIT).await {
                    Some(p) => p,
                    None => return,
                },
            };
            slot.placed();
            lb.serve_legacy(s, peer, slot, place).await;
        });
    }
}

/// The HTTP limits of `cfg`.
fn limits(cfg: &Config) -> lors_http::serve::Limits {
    lors_http::serve::Limits {
        max_connections: cfg.max_connections,
        per_client: cfg.max_connections_per_client,
        request_timeout: cfg.io_timeout,
        ..lors_http::serve::Limits::default()
    }
}

/// Serves until `shutdown` turns true.
pub async fn run(
    lb: Arc<LBone>,
    http: TcpListener,
    legacy: Option<TcpListener>,
    shutdown: watch::Receiver<bool>,
) {
    run_tls(lb, http, None, legacy, shutdown).await;
}

/// [`run`], the API and dashboard over TLS when `tls` is given.
pub async fn run_tls(
    lb: Arc<LBone>,
    http: TcpListener,
    tls: Option<lors_http::serve::Tls>,
    legacy: Option<TcpListener>,
    shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = lb.load().await {
        tracing::error!("reading the directory from the store: {e}; starting empty");
    }
    let mut tasks = tokio::task::JoinSet::new();
    let (tx, rx) = tokio::sync::mpsc::channel(CHANGES_QUEUED);
    if lb.store.watch(tx) {
        let follower = lb.clone();
        let mut stop = shutdown.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = follower.follow(rx) => {}
                _ = stop.changed() => {}
            }
        });
    }
    tasks.spawn(lors_http::serve::serve_tls(
        http,
        router(lb.clone()),
        limits(&lb.cfg),
        tls,
        shutdown.clone(),
    ));
    if let Some(l) = legacy {
        tasks.spawn(legacy_loop(l, lb.clone(), shutdown.clone()));
    }
    let sweeper = lb.clone();
    let mut stop = shutdown.clone();
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(sweeper.cfg.sweep_every) => {}
                _ = stop.changed() => return,
            }
            if let Err(e) = sweeper.sweep().await {
                tracing::warn!("sweep: {e}");
            }
        }
    });
    while tasks.join_next().await.is_some() {}
}
