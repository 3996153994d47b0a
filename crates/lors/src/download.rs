//! Download: the adaptive block scheduler of DESIGN.md / seed 001 §3.
//!
//! The range is planned into segments ([`crate::plan`]). Each depot gets
//! `conns_per_depot` workers, or as many as its measured throughput earns
//! (auto-tuning, the default); a worker takes the first pending segment its
//! depot holds, so faster depots take more. A failed read marks that replica
//! bad for the segment and puts the segment back. When nothing is pending, an
//! idle worker fetches the oldest in-flight segment again from another replica
//! (progress-driven redundancy); the first copy to arrive wins. Output goes to
//! a file with positional writes (resumable through a sidecar record), or to a
//! writer in order through a bounded reorder window.
//!
//! Memory is bounded by [`DownloadOptions::memory`], not by the file: pieces
//! that pass through memory (encoded mappings, which are verified whole, and
//! every piece of a stream) each hold a memory slot from fetch until written.
//! A depot that delivers nothing for [`DownloadOptions::stall`] while others
//! deliver is *stalled*: its pieces move to other replicas and it is read only
//! as a last resort until it delivers again.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lors_exnode::ExNode;
use lors_exnode::functions::{Codec, MAX_ENCODED_MAPPING};
use lors_ibp::zerocopy::SharedFile;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

use crate::error::{Error, Result};
use crate::plan::{check_geometry, plan};
use crate::pool::Pool;
use crate::progress::Progress;

/// Download settings.
#[derive(Debug, Clone)]
pub struct DownloadOptions {
    /// First logical byte.
    pub offset: u64,
    /// Bytes to fetch; `None` = to the end of the file.
    pub length: Option<u64>,
    /// Largest segment fetched in one LOAD.
    pub block_size: u64,
    /// Parallel connections per depot; 0 = tuned per depot from measured
    /// throughput (see [`AUTO_START`], [`AUTO_MAX`]).
    pub conns_per_depot: usize,
    /// Fetch stragglers again from another replica when idle.
    pub hedge: bool,
    /// Continue an interrupted download to a file from its `PATH.lors-part`
    /// and `PATH.lors-resume` record, when they are from the same exNode and
    /// range; otherwise start over.
    pub resume: bool,
    /// Segments an ordered (stream) output may run ahead of the writer
    /// (`lors_download -q`).
    pub window: usize,
    /// Fetches in flight across all depots; 0 = no cap beyond
    /// `conns_per_depot` per depot (`lors_download -t`).
    pub threads: usize,
    /// Depots to read only when no other replica of a piece is left (those
    /// the L-Bone does not list as online), as `host:port`.
    pub last_resort: HashSet<String>,
    /// Most bytes of fetched data held in memory at once (encoded pieces
    /// while they are decoded, stream pieces until written), whatever the
    /// file size. The piece the writer waits for may exceed it by itself.
    pub memory: u64,
    /// A depot that delivers nothing for this long while others deliver is
    /// stalled: its pieces move to other replicas. Zero never gives up on a
    /// depot before the network timeout.
    pub stall: Duration,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            offset: 0,
            length: None,
            // Small enough that the last pieces in flight end close together
            // (2 MiB is 0.17 s at 100 Mbit/s), large enough that a request
            // per piece costs nothing measurable on loopback.
            block_size: 2 << 20,
            conns_per_depot: 0,
            hedge: true,
            resume: false,
            window: 16,
            threads: 0,
            last_resort: HashSet::new(),
            // Four 10 MiB encoded blocks (stored and decoded copies) at once,
            // or 48 stream pieces of the default 2 MiB: enough to keep two
            // cores decoding, and the whole process under 128 MiB.
            memory: 96 << 20,
            stall: Duration::from_secs(30),
        }
    }
}

/// Connections per depot an auto-tuned download starts with.
pub const AUTO_START: usize = 4;
/// Most connections per depot the tuner will open.
pub const AUTO_MAX: usize = 8;
/// A tuner step must gain this much throughput to be followed by another.
const AUTO_GAIN: f64 = 1.10;
/// A tuner step that leaves less than this share of the throughput is undone.
const AUTO_LOSS: f64 = 0.90;

/// Per-depot connection tuning: hill-climbing on measured throughput. The
/// depot starts at [`AUTO_START`] connections; after each measurement window
/// (skipping the one right after a step, while the new connections start)
/// it doubles them while the last step raised its rate by at least
/// [`AUTO_GAIN`]; otherwise it stays, or, if the step clearly lowered the
/// rate (below [`AUTO_LOSS`] of it), goes back to the count before it and
/// stays there.
///
/// Why these numbers: on a fast local path each added connection takes
/// receive work off the others (eight beat four by 10–20 % on loopback, and
/// two were slower still), while on the network lab's shaped links one to
/// eight connections per depot move the same bytes to within 1–3 %. So the
/// tuner starts at four and keeps eight unless eight measure clearly slower.
/// Going back only on a clear loss matters: a 250 ms window on a shared
/// machine is too noisy to resolve a 10 % difference either way, and a wrong
/// step back costs the rest of the transfer.
struct Tune {
    level: usize,
    growing: bool,
    /// The window after a step is not judged: the new connections are
    /// still connecting and in TCP slow start.
    settling: bool,
    /// The level before the last step, and its rate in bytes/s.
    prev: Option<(usize, f64)>,
    window_start: Instant,
    window_bytes: u64,
    window_segs: u32,
}

impl Tune {
    fn new() -> Self {
        Tune {
            level: AUTO_START,
            growing: true,
            settling: false,
            prev: None,
            window_start: Instant::now(),
            window_bytes: 0,
            window_segs: 0,
        }
    }

    /// Counts a delivered segment; closes the window once it holds enough
    /// segments and time to mean something.
    fn delivered(&mut self, len: u64) {
        self.window_bytes += len;
        self.window_segs += 1;
        let took = self.window_start.elapsed();
        if !self.growing || self.window_segs < 4 || took < Duration::from_millis(250) {
            return;
        }
        self.step(self.window_bytes as f64 / took.as_secs_f64());
        self.window_start = Instant::now();
        self.window_bytes = 0;
        self.window_segs = 0;
    }

    /// One hill-climbing step on the rate of the window just closed.
    fn step(&mut self, rate: f64) {
        if !self.growing {
            return;
        }
        if self.settling {
            self.settling = false;
            return;
        }
        match self.prev {
            // The step clearly cost throughput: undo it.
            Some((level, p)) if rate < p * AUTO_LOSS => {
                self.level = level;
                self.growing = false;
            }
            // No clear gain: stop here. Going back as well would often
            // undo a real but small gain hidden in one window's noise.
            Some((_, p)) if rate < p * AUTO_GAIN => self.growing = false,
            _ if self.level >= AUTO_MAX => self.growing = false,
            _ => {
                self.prev = Some((self.level, rate));
                self.level = (self.level * 2).min(AUTO_MAX);
                self.settling = true;
            }
        }
    }
}

/// Where the bytes go.
pub enum Output {
    /// A file, written with positional writes into `PATH.lors-part` and
    /// renamed to `PATH` when complete; resumable.
    File(PathBuf),
    /// A stream (stdout, a pipe), written in order; `name` (`standard
    /// output`, a path) is what its errors name.
    Stream {
        /// Where the bytes go.
        writer: Box<dyn AsyncWrite + Unpin + Send>,
        /// What to call it in errors.
        name: String,
    },
}

/// What happened.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Bytes delivered to the output.
    pub bytes: u64,
    /// Bytes skipped because a resumed download already had them.
    pub resumed_bytes: u64,
    /// Reads that failed and were retried elsewhere.
    pub retries: u64,
    /// Segments fetched twice to beat a straggler.
    pub hedged: u64,
    /// Bytes read per depot (`host:port`, bytes).
    pub per_depot: Vec<(String, u64)>,
    /// Wall time.
    pub elapsed: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Pending,
    Running,
    Done,
}

struct Seg {
    offset: u64,
    len: u64,
    sources: Vec<usize>,
    failed: HashSet<usize>,
    running_on: Vec<usize>,
    started: Instant,
    st: St,
    /// Busy replies for this piece so far.
    busy: u32,
}

struct Sched {
    segs: Vec<Seg>,
    pending: VecDeque<usize>,
    done: usize,
    /// Stream output: index of the first segment not yet written.
    written: usize,
    /// Local failures (the output cannot be written): stop at once.
    fatal: Option<Error>,
    /// Segments no replica could serve; the rest is still fetched so a
    /// resumed download has less to do.
    lost: Vec<(u64, u64, String)>,
    stats: Stats,
    depot_bytes: BTreeMap<String, u64>,
    /// Depots we could not connect to: their replicas are skipped.
    dead: HashSet<String>,
    /// Segments claimed but not yet handed to the output.
    writing: usize,
    /// Per-depot connection tuning, when the connection count is automatic.
    tune: BTreeMap<String, Tune>,
    /// When each depot last delivered a piece.
    delivered: BTreeMap<String, Instant>,
    /// Depots that stopped delivering while others delivered: read only as
    /// a last resort until they deliver again.
    stalled: HashSet<String>,
}

struct Ctx {
    x: ExNode,
    sched: Mutex<Sched>,
    wake: Notify,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
    opts: DownloadOptions,
    base: u64,
    stream: bool,
    /// Each mapping's depot (`host:port`), computed once.
    names: Vec<String>,
    /// The `threads` cap, when set.
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Pieces may be cut smaller at the end (file output of raw mappings).
    split_tail: bool,
    /// Depots holding any piece of the range.
    depots: Vec<String>,
    /// Memory slots, each the largest piece that passes through memory;
    /// `None` when no piece does (raw mappings spliced into a file).
    mem: Option<Arc<Semaphore>>,
    /// Bytes in memory per piece of each mapping (0: spliced into the file).
    mem_need: Vec<u64>,
    /// When the download started: a depot's clock for stalls until it
    /// first delivers.
    t0: Instant,
    bufs: Arc<Buffers>,
}

enum Pick {
    Fetch(usize, usize),
    Wait,
    Exit,
}

impl Ctx {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connections open (or allowed) across the depots still alive.
    fn live_connections(&self, g: &Sched) -> usize {
        let n: usize = self
            .depots
            .iter()
            .filter(|d| !g.dead.contains(*d))
            .map(|d| g.tune.get(d).map_or(self.opts.conns_per_depot, |t| t.level))
            .sum();
        if self.opts.threads > 0 {
            n.min(self.opts.threads)
        } else {
            n
        }
    }

    fn depot_name(&self, m: usize) -> &str {
        &self.names[m]
    }

    fn depot(&self, m: usize) -> String {
        self.names[m].clone()
    }

    fn usable(&self, s: &Seg, depot: &str) -> Option<usize> {
        s.sources.iter().copied().find(|m| {
            !s.failed.contains(m) && !s.running_on.contains(m) && self.depot_name(*m) == depot
        })
    }

    /// Whether `depot` is read only when a piece has no other replica left.
    fn is_last_resort(&self, g: &Sched, depot: &str) -> bool {
        self.opts.last_resort.contains(depot) || g.stalled.contains(depot)
    }

    /// What connection `conn` (0-based) of `depot` should do next. Without a
    /// memory slot (`head_only`), only the piece the stream writer waits for
    /// may be fetched: it always can, so held pieces never wait on it.
    fn pick(&self, depot: &str, conn: usize, head_only: bool) -> Pick {
        let mut g = self.lock();
        if g.fatal.is_some() || g.done + g.lost.len() == g.segs.len() || g.dead.contains(depot) {
            return Pick::Exit;
        }
        if g.tune.get(depot).is_some_and(|t| conn >= t.level) {
            return Pick::Wait; // a connection the tuner has not opened (yet)
        }
        let limit = if head_only {
            g.written + 1
        } else if self.stream {
            g.written + self.opts.window
        } else {
            usize::MAX
        };
        let mut could_later = false;
        let last_resort = self.is_last_resort(&g, depot);
        let candidates: Vec<usize> = (0..g.pending.len())
            .filter(|&p| {
                let i = g.pending[p];
                let s = &g.segs[i];
                // A last-resort depot leaves pieces to the others while they can.
                if last_resort
                    && s.sources.iter().any(|m| {
                        let d = self.depot(*m);
                        !s.failed.contains(m)
                            && !g.dead.contains(&d)
                            && !self.is_last_resort(&g, &d)
                    })
                {
                    if self.usable(s, depot).is_some() {
                        could_later = true;
                    }
                    return false;
                }
                match self.usable(s, depot) {
                    Some(_) if i < limit => true,
                    Some(_) => {
                        could_later = true;
                        false
                    }
                    None => false,
                }
            })
            .collect();
        let pos = if self.stream {
            candidates.first().copied() // in order: the writer waits for the earliest
        } else {
            self.balanced(&g, depot, &candidates)
        };
        if let Some(p) = pos {
            let i = g.pending.remove(p).expect("position is in range");
            if self.split_tail && g.pending.len() < self.live_connections(&g) {
                split_half(&mut g, i, p);
            }
            let m = self.usable(&g.segs[i], depot).expect("checked above");
            let s = &mut g.segs[i];
            s.st = St::Running;
            s.started = Instant::now();
            s.running_on.push(m);
            return Pick::Fetch(i, m);
        }
        // Nothing pending here: help with the oldest straggler, once — but
        // only with this depot's link idle, or the copy would slow the piece
        // it is already sending.
        let idle_here = !g.segs.iter().any(|s| {
            s.st == St::Running && s.running_on.iter().any(|&m| self.depot_name(m) == depot)
        });
        let mut best: Option<(usize, usize, Instant)> = None;
        for (i, s) in g.segs.iter().enumerate() {
            if s.st != St::Running || i >= limit {
                continue;
            }
            if let Some(m) = self.usable(s, depot) {
                could_later = true;
                if self.opts.hedge
                    && idle_here
                    && s.running_on.len() == 1
                    && best.is_none_or(|b| s.started < b.2)
                {
                    best = Some((i, m, s.started));
                }
            }
        }
        if let Some((i, m, _)) = best {
            g.segs[i].running_on.push(m);
            g.stats.hedged += 1;
            return Pick::Fetch(i, m);
        }
        if could_later
            || g.pending
                .iter()
                .any(|&i| self.usable(&g.segs[i], depot).is_some())
        {
            Pick::Wait
        } else {
            Pick::Exit
        }
    }

    /// Among the pending positions `candidates` (all servable by `depot`),
    /// the piece whose other holders have the most pending work of their
    /// own: each depot takes what the others are least likely to get to,
    /// so no depot is left at the end with nothing it holds while others
    /// still queue. Ties go to the earliest piece.
    fn balanced(&self, g: &Sched, depot: &str, candidates: &[usize]) -> Option<usize> {
        if candidates.len() <= 1 {
            return candidates.first().copied();
        }
        let mut load: BTreeMap<&str, usize> = BTreeMap::new();
        for &i in &g.pending {
            let s = &g.segs[i];
            for &m in &s.sources {
                if !s.failed.contains(&m) {
                    *load.entry(self.depot_name(m)).or_default() += 1;
                }
            }
        }
        candidates.iter().copied().max_by_key(|&p| {
            let s = &g.segs[g.pending[p]];
            let others = s
                .sources
                .iter()
                .map(|&m| self.depot_name(m))
                .filter(|d| *d != depot && !g.dead.contains(*d))
                .map(|d| load.get(d).copied().unwrap_or(0))
                .min()
                .unwrap_or(usize::MAX);
            (others, std::cmp::Reverse(p))
        })
    }

    /// A read failed (or returned corrupted bytes): that replica is bad for
    /// this segment. A depot we cannot connect to is dead for the whole
    /// download: every segment it holds moves on to other replicas at once.
    fn failed(&self, i: usize, m: usize, err: &str, unreachable: bool) {
        let depot = self.depot(m);
        let mut g = self.lock();
        g.stats.retries += 1;
        let newly_dead = unreachable && g.dead.insert(depot.clone());
        let victims: Vec<(usize, usize)> = if unreachable {
            g.segs
                .iter()
                .enumerate()
                .flat_map(|(si, s)| {
                    s.sources
                        .iter()
                        .filter(|&&x| self.depot(x) == depot)
                        .map(move |&x| (si, x))
                })
                .collect()
        } else {
            vec![(i, m)]
        };
        for (si, x) in victims {
            let s = &mut g.segs[si];
            if !s.failed.insert(x) && si != i {
                continue;
            }
            if si == i {
                s.running_on.retain(|&r| r != x);
            }
            if s.st == St::Running && s.running_on.is_empty() {
                s.st = St::Pending;
                g.pending.push_front(si);
            }
            let s = &g.segs[si];
            if s.st == St::Pending && s.sources.iter().all(|y| s.failed.contains(y)) {
                let lost = (s.offset, s.offset + s.len, err.to_owned());
                g.segs[si].st = St::Done; // settled: nobody will fetch it
                g.pending.retain(|&p| p != si);
                g.lost.push(lost);
            }
        }
        drop(g);
        if newly_dead {
            self.progress.note(&format!(
                "depot {depot} is unreachable ({err}); reading its blocks from other replicas"
            ));
        } else if !unreachable {
            self.progress.note(&format!(
                "read from {depot} failed ({err}); trying another replica"
            ));
        }
        self.wake.notify_waiters();
    }

    /// The depot holding replica `m` said it is busy: the piece goes back to
    /// the queue without blaming the replica, and an auto-tuned depot gets
    /// fewer connections. Once a piece has met [`BUSY_MAX`] busy replies, the
    /// replica that gave the last counts as failed for it. Returns whether
    /// the caller should pause before asking again.
    fn busy(&self, i: usize, m: usize, why: &str) -> bool {
        let depot = self.depot(m);
        let mut g = self.lock();
        g.stats.retries += 1;
        if let Some(t) = g.tune.get_mut(&depot) {
            t.level = (t.level / 2).max(1);
            t.growing = false;
        }
        let s = &mut g.segs[i];
        s.busy += 1;
        if s.busy > BUSY_MAX {
            drop(g);
            self.failed(i, m, why, false);
            return false;
        }
        s.running_on.retain(|&r| r != m);
        if s.st == St::Running && s.running_on.is_empty() {
            s.st = St::Pending;
            g.pending.push_front(i);
        }
        drop(g);
        self.wake.notify_waiters();
        true
    }

    /// Everything is in the output (or cannot be): fetches still running are
    /// hedged twins or stragglers nobody needs.
    fn settled(&self) -> bool {
        let g = self.lock();
        g.fatal.is_some() || (g.done + g.lost.len() == g.segs.len() && g.writing == 0)
    }

    /// Marks as stalled every depot that has delivered nothing for
    /// `opts.stall` while another delivered, and moves its pieces that have
    /// another live replica back to the queue for the other depots.
    fn check_stalls(&self) {
        let stall = self.opts.stall;
        if stall.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut g = self.lock();
        // The oldest piece in flight on each depot, in one pass.
        let mut oldest_on: std::collections::HashMap<&str, Instant> =
            std::collections::HashMap::new();
        for s in g.segs.iter().filter(|s| s.st == St::Running) {
            for &m in &s.running_on {
                let t = oldest_on.entry(self.depot_name(m)).or_insert(s.started);
                *t = (*t).min(s.started);
            }
        }
        let mut woke = false;
        for depot in &self.depots {
            if g.dead.contains(depot) || g.stalled.contains(depot) {
                continue;
            }
            let Some(&oldest) = oldest_on.get(depot.as_str()) else {
                continue;
            };
            let on_depot = |s: &Seg| {
                s.st == St::Running && s.running_on.iter().any(|&m| self.depot_name(m) == depot)
            };
            let since = g
                .delivered
                .get(depot)
                .copied()
                .unwrap_or(self.t0)
                .max(oldest);
            let others_flow = g.delivered.iter().any(|(d, &t)| d != depot && t > since);
            if now.duration_since(since) < stall || !others_flow {
                continue;
            }
            g.stalled.insert(depot.clone());
            let mut moved = 0;
            for i in 0..g.segs.len() {
                let s = &g.segs[i];
                let only_here =
                    on_depot(s) && s.running_on.iter().all(|&m| self.depot_name(m) == depot);
                let elsewhere = s.sources.iter().any(|&m| {
                    let d = self.depot_name(m);
                    !s.failed.contains(&m)
                        && d != depot
                        && !g.dead.contains(d)
                        && !g.stalled.contains(d)
                });
                if only_here && elsewhere {
                    g.segs[i].st = St::Pending;
                    g.pending.push_front(i);
                    moved += 1;
                }
            }
            woke |= moved > 0;
            self.progress.note(&format!(
                "depot {depot} has sent nothing for {}s while others deliver; \
                 reading its {moved} pieces in flight from other replicas",
                now.duration_since(since).as_secs()
            ));
        }
        drop(g);
        // Workers wait for queued pieces; wake them only when there are new ones.
        if woke {
            self.wake.notify_waiters();
        }
    }

    /// Claims a fetched segment; false if another replica already won.
    fn claim(&self, i: usize, m: usize, depot: &str) -> bool {
        let mut g = self.lock();
        g.delivered.insert(depot.to_owned(), Instant::now());
        if g.stalled.remove(depot) {
            self.progress
                .note(&format!("depot {depot} delivers again after its stall"));
        }
        let s = &mut g.segs[i];
        s.running_on.retain(|&x| x != m);
        let was = s.st;
        if was == St::Done {
            return false;
        }
        s.st = St::Done;
        let len = s.len;
        if was == St::Pending {
            // Moved off a stalled depot, which then delivered it after all.
            g.pending.retain(|&p| p != i);
        }
        g.done += 1;
        g.writing += 1;
        g.stats.bytes += len;
        if let Some(t) = g.tune.get_mut(depot) {
            let before = t.level;
            t.delivered(len);
            if t.level != before {
                tracing::debug!(depot, from = before, to = t.level, "connections re-tuned");
            }
        }
        *g.depot_bytes.entry(depot.to_owned()).or_default() += len;
        true
    }
}

async fn worker(
    ctx: Arc<Ctx>,
    depot: String,
    conn: usize,
    tx: Option<mpsc::Sender<Held>>,
    out: Option<Arc<OutFile>>,
) {
    loop {
        // Taken before picking, so a worker waiting for a slot holds no segment.
        let slot = match &ctx.slots {
            Some(s) => Some(s.clone().acquire_owned().await),
            None => None,
        };
        // A file output frees its memory slots by itself: wait for one. A
        // stream's are freed by the writer, which may be waiting for a
        // piece only a worker without a slot can fetch.
        let mut mem = match &ctx.mem {
            Some(s) if ctx.stream => s.clone().try_acquire_owned().ok(),
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        let head_only = ctx.stream && ctx.mem.is_some() && mem.is_none();
        let (i, m) = match ctx.pick(&depot, conn, head_only) {
            Pick::Exit => return,
            Pick::Wait => {
                drop((slot, mem));
                let notified = ctx.wake.notified();
                let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
                continue;
            }
            Pick::Fetch(i, m) => (i, m),
        };
        if ctx.mem_need[m] == 0 {
            mem = None;
        }
        let (offset, len) = {
            let g = ctx.lock();
            (g.segs[i].offset, g.segs[i].len)
        };
        let map = &ctx.x.mappings[m];
        let cap = map.read.as_ref().expect("planned mappings are readable");
        let fetched = async {
            match Codec::from_mapping(map) {
                Err(e) => Err(Fail::Remote(e.to_string(), false)),
                Ok(None) => {
                    let at = map.alloc_offset + (offset - map.exnode_offset);
                    let mut c = ctx.pool.get(&depot).await.map_err(ibp_err)?;
                    if let Some(f) = &out {
                        // Raw bytes to a file: straight from the socket into
                        // place. A hedged twin writes the same bytes to the
                        // same place, so the race is harmless.
                        c.load_to_file(cap, at, len, &f.file, offset - ctx.base)
                            .await
                            .map_err(ibp_err)?;
                        ctx.pool.put(c);
                        return Ok(Got::Written);
                    }
                    let mut buf = ctx.bufs.take(len);
                    c.load(cap, at, &mut buf).await.map_err(ibp_err)?;
                    ctx.pool.put(c);
                    Ok(Got::Mem(buf))
                }
                Ok(Some(_)) if map.alloc_length > MAX_ENCODED_MAPPING => Err(Fail::Remote(
                    format!(
                        "encoded mapping of {} bytes is larger than the {} bytes decoded in memory",
                        map.alloc_length, MAX_ENCODED_MAPPING
                    ),
                    false,
                )),
                Ok(Some(codec)) => {
                    // Encoded mappings are fetched and verified whole, then cut.
                    let mut stored = ctx.bufs.take(map.alloc_length);
                    let mut c = ctx.pool.get(&depot).await.map_err(ibp_err)?;
                    c.load(cap, map.alloc_offset, &mut stored)
                        .await
                        .map_err(ibp_err)?;
                    ctx.pool.put(c);
                    let m = map.clone();
                    let bufs = ctx.bufs.clone();
                    let plain = tokio::task::spawn_blocking(move || {
                        let mut plain = bufs.take(0);
                        let r = codec.decode_mapping_into(&m, &stored, &mut plain);
                        bufs.give(stored);
                        r.map(|()| plain)
                    })
                    .await
                    .map_err(|e| (e.to_string(), false))?
                    .map_err(|e| (format!("{e} (from {depot})"), false))?;
                    let from = usize::try_from(offset - map.exnode_offset).unwrap_or(usize::MAX);
                    let to = from.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
                    if from == 0 && to == plain.len() {
                        return Ok(Got::Mem(plain)); // the usual case: no copy
                    }
                    let piece = plain.get(from..to).map(<[u8]>::to_vec);
                    ctx.bufs.give(plain);
                    piece
                        .map(Got::Mem)
                        .ok_or(Fail::Remote("mapping shorter than recorded".into(), false))
                }
            }
        }
        .await;
        let got = match fetched {
            Ok(g) => g,
            Err(Fail::Local(e)) => {
                ctx.lock().fatal.get_or_insert(e);
                ctx.wake.notify_waiters();
                return;
            }
            Err(Fail::Remote(why, unreachable)) => {
                ctx.failed(i, m, &why, unreachable);
                continue;
            }
            Err(Fail::Busy(why)) => {
                drop((slot, mem));
                if ctx.busy(i, m, &why) {
                    // Give the depot room: others' pieces, and a pause that
                    // differs per connection so they do not return together.
                    let ms = 100 + 50 * (conn as u64 % 8);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                continue;
            }
        };
        if !ctx.claim(i, m, &depot) {
            continue; // a hedged copy arrived first
        }
        ctx.progress.advance(len);
        if let Some(f) = &out {
            let pos = offset - ctx.base;
            let r = match got {
                // One short line appended to the record: a hop to a
                // blocking thread for it would cost more than the write.
                Got::Written => f.record(offset, len),
                Got::Mem(buf) => {
                    let f = f.clone();
                    let bufs = ctx.bufs.clone();
                    tokio::task::spawn_blocking(move || {
                        let r = f.write_segment(pos, offset, &buf);
                        bufs.give(buf);
                        r
                    })
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))
                    .and_then(|r| r)
                }
            };
            if let Err(e) = r {
                ctx.lock()
                    .fatal
                    .get_or_insert(Error::io("writing the output file", e));
            }
        } else if let (Some(tx), Got::Mem(buf)) = (&tx, got) {
            if tx.send((i, buf, mem)).await.is_err() {
                ctx.lock().writing -= 1;
                return;
            }
        }
        ctx.lock().writing -= 1;
        ctx.wake.notify_waiters();
    }
}

/// Busy replies (`-66`) one piece takes before its replica counts as failed.
const BUSY_MAX: u32 = 100;

/// Pieces are not cut below this at the end of a download.
const TAIL_PIECE_MIN: u64 = 256 << 10;

/// End game: with fewer pieces left than connections, the piece being taken
/// is cut in two and its second half goes back at position `p` of the queue.
/// Otherwise the connections that finish first sit idle while the last ones
/// each send a whole piece, at their share of their depot's link; cutting
/// shrinks that tail to a fraction of a piece.
fn split_half(g: &mut Sched, i: usize, p: usize) {
    let s = &g.segs[i];
    // Halves on 64 KiB boundaries keep writes page-aligned.
    let half = (s.len / 2) & !((64 << 10) - 1);
    if half < TAIL_PIECE_MIN || s.len - half < TAIL_PIECE_MIN {
        return;
    }
    let rest = Seg {
        offset: s.offset + half,
        len: s.len - half,
        sources: s.sources.clone(),
        failed: s.failed.clone(),
        running_on: Vec::new(),
        started: Instant::now(),
        st: St::Pending,
        busy: 0,
    };
    g.segs[i].len = half;
    g.segs.push(rest);
    let j = g.segs.len() - 1;
    g.pending.insert(p, j);
}

/// Buffers of pieces that pass through memory, kept for the next pieces. A
/// download reuses the same few instead of asking the allocator for a fresh
/// 10 MiB block per piece, which glibc spreads over per-thread arenas and
/// does not give back: that alone doubled the peak RSS.
struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl Buffers {
    /// A buffer of `len` bytes, reused when one is free. Its contents are
    /// whatever the last piece left: every caller overwrites all of it (a
    /// LOAD fills it or fails and drops it), so it is not zeroed again.
    fn take(&self, len: u64) -> Vec<u8> {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let mut b = match free.iter().position(|b| b.capacity() >= len) {
            Some(p) => free.swap_remove(p),
            None => free.pop().unwrap_or_default(),
        };
        drop(free);
        b.truncate(len);
        b.resize(len, 0);
        b
    }

    /// Keeps `b` for a later [`Buffers::take`], up to `keep` buffers.
    fn give(&self, b: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.keep {
            free.push(b);
        }
    }
}

/// A fetched stream piece on its way to the writer, with the memory slot it
/// holds until written.
type Held = (usize, Vec<u8>, Option<OwnedSemaphorePermit>);

/// A fetched segment: in memory, or already written into the output file.
enum Got {
    Mem(Vec<u8>),
    Written,
}

/// Why a fetch failed.
enum Fail {
    /// This replica (or its depot, when the flag says it is unreachable).
    Remote(String, bool),
    /// The depot is busy: ask again later.
    Busy(String),
    /// Our own output: no replica can help.
    Local(Error),
}

impl From<(String, bool)> for Fail {
    fn from((why, unreachable): (String, bool)) -> Self {
        Fail::Remote(why, unreachable)
    }
}

fn ibp_err(e: lors_ibp::Error) -> Fail {
    match e {
        lors_ibp::Error::Local { during, source } => Fail::Local(Error::io(during, source)),
        e if e.is_busy() => Fail::Busy(e.to_string()),
        e => {
            let unreachable = e.is_unreachable();
            Fail::Remote(e.to_string(), unreachable)
        }
    }
}

/// The output file and its resume record.
struct OutFile {
    /// The output file, which every connection splices raw pieces into.
    file: SharedFile,
    record: Mutex<File>,
}

impl OutFile {
    fn write_segment(&self, pos: u64, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.file.file().write_all_at(data, pos)?;
        self.record(offset, data.len() as u64)
    }

    /// Notes a segment as done. The record follows the data: a segment listed
    /// there is in the file.
    fn record(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let mut r = self.record.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(r, "{offset} {len}")
    }
}

/// `PATH` + `ext`.
fn beside(path: &Path, ext: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

/// Where a download to `path` writes until it is complete and verified.
pub fn partial_path(path: &Path) -> PathBuf {
    beside(path, ".lors-part")
}

/// The record of the pieces a download to `path` has finished.
pub fn record_path(path: &Path) -> PathBuf {
    beside(path, ".lors-resume")
}

/// Names the exNode's data (ranges and read capabilities) in the resume
/// record, so a partial file is only ever resumed from the same exNode.
fn fingerprint(x: &ExNode) -> u64 {
    // FNV-1a: stable across runs and builds, unlike `DefaultHasher`.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for m in &x.mappings {
        let cap = m.read.as_ref().map(|c| c.to_url()).unwrap_or_default();
        let line = format!(
            "{} {} {} {cap}\n",
            m.exnode_offset, m.logical_length, m.alloc_offset
        );
        for b in line.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Segments an earlier run finished, from its resume record.
fn resumed(record: &Path, header: &str) -> HashSet<(u64, u64)> {
    let Ok(text) = std::fs::read_to_string(record) else {
        return HashSet::new();
    };
    let mut lines = text.lines();
    if lines.next() != Some(header) {
        return HashSet::new();
    }
    lines
        .filter_map(|l| {
            let (a, b) = l.split_once(' ')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

/// Downloads the range `opts` names from the exNode into `out`.
pub async fn download(
    x: &ExNode,
    out: Output,
    opts: &DownloadOptions,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
) -> Result<Stats> {
    let t0 = Instant::now();
    check_geometry(&x.mappings)?;
    let size = x.logical_size();
    let start = opts.offset.min(size);
    let len = opts.length.unwrap_or(size - start).min(size - start);
    // Mappings with functions are verified whole: do not cut them smaller.
    let whole = x.mappings.iter().any(|m| m.function.is_some());
    let planned = plan(
        &x.mappings,
        start,
        len,
        if whole { u64::MAX } else { opts.block_size },
    )?;
    let mut segs: Vec<Seg> = planned
        .into_iter()
        .map(|p| Seg {
            offset: p.offset,
            len: p.len,
            sources: p.sources,
            failed: HashSet::new(),
            running_on: Vec::new(),
            started: Instant::now(),
            st: St::Pending,
            busy: 0,
        })
        .collect();
    let mut stats = Stats::default();
    let (file_out, stream) = match out {
        Output::File(path) => {
            let header = format!(
                "lors-partial v2 {start} {len} {} {:016x}",
                opts.block_size,
                fingerprint(x)
            );
            let part = partial_path(&path);
            let record_path = record_path(&path);
            let done = if opts.resume && part.exists() {
                resumed(&record_path, &header)
            } else {
                HashSet::new()
            };
            // The data goes to PATH.lors-part, renamed to PATH once complete:
            // a file under the final name is always whole.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(done.is_empty())
                .open(&part)
                .map_err(|e| Error::io(format!("opening {}", part.display()), e))?;
            file.set_len(len)
                .map_err(|e| Error::io(format!("sizing {}", part.display()), e))?;
            for s in &mut segs {
                if done.contains(&(s.offset, s.len)) {
                    s.st = St::Done;
                    stats.resumed_bytes += s.len;
                }
            }
            let mut record = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&record_path)
                .map_err(|e| Error::io(format!("opening {}", record_path.display()), e))?;
            if done.is_empty() {
                record
                    .set_len(0)
                    .map_err(|e| Error::io("resetting the resume record", e))?;
                writeln!(record, "{header}")
                    .map_err(|e| Error::io("writing the resume record", e))?;
            }
            (
                Some((
                    Arc::new(OutFile {
                        file: SharedFile::new(file),
                        record: Mutex::new(record),
                    }),
                    path,
                    record_path,
                )),
                None,
            )
        }
        Output::Stream { writer, name } => (None, Some((writer, name))),
    };
    let pending: VecDeque<usize> = (0..segs.len())
        .filter(|&i| segs[i].st == St::Pending)
        .collect();
    let done = segs.len() - pending.len();
    progress.start(Some(len - stats.resumed_bytes));
    let mut depots: Vec<String> = segs
        .iter()
        .flat_map(|s| s.sources.iter())
        .filter_map(|&m| x.mappings[m].read.as_ref().map(|c| c.address()))
        .collect();
    depots.sort();
    depots.dedup();
    // What a piece of each mapping holds in memory: an encoded mapping its
    // stored and decoded bytes; a raw one its piece, unless spliced.
    let mem_need: Vec<u64> = x
        .mappings
        .iter()
        .map(|m| match (&m.function, stream.is_some()) {
            (Some(_), _) => m.alloc_length.saturating_add(m.logical_length),
            (None, true) => m.logical_length.min(opts.block_size),
            (None, false) => 0,
        })
        .collect();
    let largest = segs
        .iter()
        .flat_map(|s| s.sources.iter().map(|&m| mem_need[m]))
        .max()
        .unwrap_or(0);
    let slots = usize::try_from(opts.memory / largest.max(1))
        .unwrap_or(usize::MAX)
        .clamp(1, Semaphore::MAX_PERMITS);
    let mem = (largest > 0).then(|| Arc::new(Semaphore::new(slots)));
    let bufs = Arc::new(Buffers {
        free: Mutex::new(Vec::new()),
        // A stored and a decoded buffer per slot, and the writer's piece.
        keep: if largest > 0 {
            2 * slots.min(64) + 2
        } else {
            0
        },
    });
    let ctx = Arc::new(Ctx {
        x: x.clone(),
        names: x
            .mappings
            .iter()
            .map(|m| m.read.as_ref().map(|c| c.address()).unwrap_or_default())
            .collect(),
        sched: Mutex::new(Sched {
            segs,
            pending,
            done,
            written: 0,
            fatal: None,
            lost: Vec::new(),
            stats,
            depot_bytes: BTreeMap::new(),
            dead: HashSet::new(),
            writing: 0,
            tune: if opts.conns_per_depot == 0 {
                depots.iter().map(|d| (d.clone(), Tune::new())).collect()
            } else {
                BTreeMap::new()
            },
            delivered: BTreeMap::new(),
            stalled: HashSet::new(),
        }),
        wake: Notify::new(),
        pool,
        progress,
        opts: opts.clone(),
        slots: (opts.threads > 0).then(|| Arc::new(tokio::sync::Semaphore::new(opts.threads))),
        base: start,
        stream: stream.is_some(),
        split_tail: stream.is_none() && !whole,
        depots: depots.clone(),
        mem,
        mem_need,
        t0,
        bufs,
    });
    let (tx, writer) = match stream {
        Some((mut w, name)) => {
            let (tx, mut rx) = mpsc::channel::<Held>(opts.window.max(1));
            let c2 = ctx.clone();
            let writer = tokio::spawn(async move {
                let mut held: BTreeMap<usize, (Vec<u8>, Option<OwnedSemaphorePermit>)> =
                    BTreeMap::new();
                let mut next = 0usize;
                // A failed write (reader gone, disk full) is fatal at once:
                // the fetches waiting for the window to move must stop, not
                // wait for a writer that will never write again.
                let fail = |e: std::io::Error| {
                    let kind = e.kind();
                    c2.lock()
                        .fatal
                        .get_or_insert(Error::io(format!("writing {name}"), e));
                    c2.wake.notify_waiters();
                    std::io::Error::from(kind)
                };
                while let Some((i, data, mem)) = rx.recv().await {
                    held.insert(i, (data, mem));
                    while let Some((d, mem)) = held.remove(&next) {
                        w.write_all(&d).await.map_err(fail)?;
                        c2.bufs.give(d);
                        drop(mem);
                        next += 1;
                        c2.lock().written = next;
                        c2.wake.notify_waiters();
                    }
                }
                w.flush().await.map_err(fail)?;
                Ok::<_, std::io::Error>(())
            });
            (Some(tx), Some(writer))
        }
        None => (None, None),
    };
    let mut workers = tokio::task::JoinSet::new();
    let per_depot = match opts.conns_per_depot {
        0 => AUTO_MAX,
        n => n,
    };
    for d in &depots {
        for conn in 0..per_depot {
            workers.spawn(worker(
                ctx.clone(),
                d.clone(),
                conn,
                tx.clone(),
                file_out.as_ref().map(|f| f.0.clone()),
            ));
        }
    }
    drop(tx);
    loop {
        tokio::select! {
            j = workers.join_next() => if j.is_none() { break },
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        ctx.check_stalls();
        if ctx.settled() {
            // Do not wait out a connect or read timeout on a depot whose
            // pieces other replicas already delivered.
            workers.abort_all();
        }
    }
    if let Some(w) = writer {
        // Its error, if any, is already the fatal one (with its context).
        w.await
            .map_err(|e| Error::io("output writer", std::io::Error::other(e.to_string())))?
            .ok();
    }
    let mut g = ctx.lock();
    if let Some(e) = g.fatal.take() {
        return Err(e);
    }
    if let Some((offset, end, last)) = g.lost.iter().min_by_key(|l| l.0).cloned() {
        let n = g.lost.len();
        let last = if n > 1 {
            format!("{last} (and {} more pieces unreadable)", n - 1)
        } else {
            last
        };
        return Err(Error::Unreadable { offset, end, last });
    }
    if g.done < g.segs.len() {
        let s = g
            .segs
            .iter()
            .find(|s| s.st != St::Done)
            .expect("some segment is not done");
        return Err(Error::Unreadable {
            offset: s.offset,
            end: s.offset + s.len,
            last: "every depot holding it failed".into(),
        });
    }
    if let Some((f, path, record_path)) = &file_out {
        let part = partial_path(path);
        f.file
            .file()
            .sync_all()
            .map_err(|e| Error::io(format!("flushing {}", part.display()), e))?;
        std::fs::rename(&part, path).map_err(|e| {
            Error::io(
                format!(
                    "renaming the complete {} to {}",
                    part.display(),
                    path.display()
                ),
                e,
            )
        })?;
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
        let _ = std::fs::remove_file(record_path);
    }
    let mut stats = std::mem::take(&mut g.stats);
    stats.per_depot = g.depot_bytes.iter().map(|(k, v)| (k.clone(), *v)).collect();
    stats.elapsed = t0.elapsed();
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(lens: &[u64]) -> Sched {
        let mut offset = 0;
        let segs = lens
            .iter()
            .map(|&len| {
                let s = Seg {
                    offset,
                    len,
                    sources: vec![0, 1],
                    failed: HashSet::new(),
                    running_on: Vec::new(),
                    started: Instant::now(),
                    st: St::Pending,
                    busy: 0,
                };
                offset += len;
                s
            })
            .collect();
        Sched {
            segs,
            pending: (0..lens.len()).collect(),
            done: 0,
            written: 0,
            fatal: None,
            lost: Vec::new(),
            stats: Stats::default(),
            depot_bytes: BTreeMap::new(),
            dead: HashSet::new(),
            writing: 0,
            tune: BTreeMap::new(),
            delivered: BTreeMap::new(),
            stalled: HashSet::new(),
        }
    }

    /// Levels a tuner passes through for a sequence of window rates.
    fn levels(rates: &[f64]) -> Vec<usize> {
        let mut t = Tune::new();
        rates
            .iter()
            .map(|&r| {
                t.step(r);
                t.level
            })
            .collect()
    }

    #[test]
    fn tuner_climbs_while_steps_pay_stays_on_a_small_gain_and_backs_off_a_loss() {
        assert_eq!(AUTO_START, 4, "the sequences below start at 4");
        // The window right after a step (here 50) is not judged.
        // Every doubling pays: to the top, then no further.
        assert_eq!(levels(&[100.0, 50.0, 150.0, 400.0]), [8, 8, 8, 8]);
        // 4 -> 8 gained or lost 5 %: within the noise, kept.
        assert_eq!(levels(&[100.0, 50.0, 105.0, 300.0]), [8, 8, 8, 8]);
        assert_eq!(levels(&[100.0, 50.0, 95.0, 300.0]), [8, 8, 8, 8]);
        // 4 -> 8 lost 15 %: back to 4 for good.
        assert_eq!(levels(&[100.0, 50.0, 85.0, 400.0]), [8, 8, 4, 4]);
    }

    #[test]
    fn end_game_cuts_cover_the_range_in_aligned_pieces_no_smaller_than_the_floor() {
        let size = (2 << 20) + 12345;
        let mut g = sched(&[size]);
        // Take the first pending piece and cut it, as pick does, until
        // nothing is left to take.
        let mut taken = Vec::new();
        while let Some(i) = g.pending.pop_front() {
            split_half(&mut g, i, 0);
            taken.push((g.segs[i].offset, g.segs[i].len));
        }
        taken.sort_unstable();
        let mut next = 0;
        for &(offset, len) in &taken {
            assert_eq!(offset, next, "pieces must tile the range: {taken:?}");
            assert!(len >= TAIL_PIECE_MIN, "piece below the floor: {taken:?}");
            assert_eq!(offset % (64 << 10), 0, "piece not aligned: {taken:?}");
            next += len;
        }
        assert_eq!(next, size);
        // 1 MiB, 512 KiB, 256 KiB, and 256 KiB + the odd end (too small to cut).
        assert_eq!(taken.len(), 4, "{taken:?}");
        assert_eq!(g.segs.len(), taken.len());
    }
}
