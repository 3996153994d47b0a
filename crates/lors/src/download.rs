//! Download: the adaptive block scheduler of "Video IBPster" (the LoCI
//! iGrid 2002 paper) §3.
//!
//! The range is planned into pieces ([`crate::plan`]). Each depot gets
//! `conns_per_depot` workers (`fetch`), or as many as its round trip
//! earns (auto-tuning, the default, in `tune`); each asks the
//! scheduler ([`sched`], sans I/O) for the next piece its depot holds, so
//! faster depots take more. A failed read marks that replica bad for the
//! piece and puts the piece back. When nothing is pending, an idle worker
//! fetches the oldest piece in flight again from another replica
//! (progress-driven redundancy); the first copy to arrive wins. Output
//! (`output`) goes to a file with positional writes (resumable through a
//! sidecar record), or to a writer in order through a bounded reorder window.
//!
//! Memory is bounded by [`DownloadOptions::memory`], not by the file: pieces
//! that pass through memory (encoded ones, verified an e2e block at a time,
//! or whole where their layout needs it; every piece of a stream) each hold a memory slot from fetch until written.
//! A depot that delivers nothing for [`DownloadOptions::stall`] while others
//! deliver is *stalled*: its pieces move to other replicas and it is read only
//! as a last resort until it delivers again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lors_exnode::ExNode;
use lors_exnode::functions::Codec;
use tokio::io::AsyncWrite;
use tokio::sync::{Notify, Semaphore, mpsc};

use crate::error::{Error, Result};
use crate::plan::{check_geometry, check_holes, plan};
use crate::pool::Pool;
use crate::progress::{self, Progress};

mod fetch;
pub(crate) mod output;
mod rebuild;
pub mod sched;
mod tune;

pub use output::{Buffers, Data, Frozen, Piece, partial_path, record_path};
use output::{Held, OutFile, Sink};
use sched::{Event, Sched};
pub use tune::{
    AUTO_CONNECTIONS, BUSY_SETTLE, MAX_AUTO_CONNECTIONS, RTT_PER_CONNECTION, connections_for,
};

/// Largest piece of a stream (ordered output): see [`sched::STREAM_HORIZON`].
pub const STREAM_PIECE: u64 = 256 << 10;

/// ... when a depot is far enough to earn more connections than
/// [`AUTO_CONNECTIONS`]: a connection whose TCP is not tuned moves about
/// 32 KiB per round trip, so a 256 KiB piece 188 ms away takes nine round
/// trips (1.7 s), and the few seconds of data a stream keeps in flight
/// deliver below a 15 Mbit/s video's rate; a 64 KiB piece takes three.
pub const STREAM_PIECE_FAR: u64 = 64 << 10;

/// A stream from more depots than this is cut for the near ones without
/// connecting to each first.
const STREAM_MEASURED_DEPOTS: usize = 64;

/// The largest piece of a stream from `x`'s depots: [`STREAM_PIECE_FAR`]
/// if any is far (their round trips measured by connecting, the
/// connections kept for the first pieces), else [`STREAM_PIECE`].
async fn stream_piece(x: &ExNode, pool: &Arc<Pool>) -> u64 {
    let addrs = crate::leftover::depots(x);
    if addrs.len() > STREAM_MEASURED_DEPOTS {
        return STREAM_PIECE;
    }
    let rtts = pool.round_trips(&addrs, crate::pool::MEASURE_WAIT).await;
    match rtts
        .into_iter()
        .any(|r| connections_for(r) > AUTO_CONNECTIONS)
    {
        true => STREAM_PIECE_FAR,
        false => STREAM_PIECE,
    }
}

/// Download settings.
#[derive(Debug, Clone)]
pub struct DownloadOptions {
    /// First logical byte.
    pub offset: u64,
    /// Bytes to fetch; `None` = to the end of the file.
    pub length: Option<u64>,
    /// Largest segment fetched in one LOAD.
    pub block_size: u64,
    /// Parallel connections per depot; 0 = [`AUTO_CONNECTIONS`] plus one
    /// per [`RTT_PER_CONNECTION`] of a depot's round trip (at most
    /// [`MAX_AUTO_CONNECTIONS`]), halved once per wave of busy replies.
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
    /// A stream's start-up buffer: nothing is written until this many
    /// bytes from the start are fetched (or as many as the window and the
    /// memory let it hold), so a player reading at a constant rate starts
    /// with a margin against the network's hiccups. 0: write at once.
    pub start_buffer: u64,
    /// Downloads running beside this one from the same depots (a batch
    /// of files, `lors download -j`): the connections a depot's distance
    /// adds are shared among them, so together they open about as many as
    /// one download would (each keeps [`AUTO_CONNECTIONS`]). 0 or 1: alone.
    pub beside: usize,
}

/// The flags of `lors download` that tune how it reads, as a command
/// takes them (`#[command(flatten)]` with the `clap` feature); with the
/// settings resolved, [`Tuning::options`] makes the [`DownloadOptions`].
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct Tuning {
    /// First byte to fetch.
    #[cfg_attr(feature = "clap", arg(short = 'O', long, value_parser = lors_ibp::units::parse_size, default_value = "0"))]
    pub offset: u64,
    /// Bytes to fetch [default: to the end].
    #[cfg_attr(feature = "clap", arg(short = 'L', long, value_parser = lors_ibp::units::parse_size))]
    pub length: Option<u64>,
    /// Connections per depot [default: 8, and one more per 2 ms of a
    /// depot's round trip up to 128 (untuned TCP moves one window per round
    /// trip per connection); halved for a depot once per wave of busy
    /// replies]
    #[cfg_attr(feature = "clap", arg(short = 'a', long = "connections", value_parser = clap::value_parser!(u16).range(1..=256)))]
    pub connections: Option<u16>,
    /// Most data fetched ahead of the writer when streaming in order
    /// (-o -), in blocks of -b: a slow reader's cushion. Within it a stream
    /// keeps about 1 s of data in flight at the rate it measures, in pieces
    /// of 256 KiB (64 KiB from far depots), so the bytes the writer needs
    /// next are not slowed by many others.
    #[cfg_attr(
        feature = "clap",
        arg(long = "prebuffer", value_name = "BLOCKS", default_value_t = 16)
    )]
    pub prebuffer: usize,
    /// When streaming (-o -), hold the first SIZE bytes until they are all
    /// fetched, as a player's start-up buffer: a reader at a constant rate
    /// then rides out the network's dips [default: write at once].
    #[cfg_attr(feature = "clap", arg(long = "start-buffer", value_name = "SIZE", value_parser = lors_ibp::units::parse_size, default_value = "0"))]
    pub start_buffer: u64,
    /// Most fetched data held in memory at once, whatever the file size
    /// (encoded blocks while they are verified, stream pieces until
    /// written). More lets more encoded blocks be fetched at once.
    #[cfg_attr(feature = "clap", arg(long, value_name = "SIZE", value_parser = lors_ibp::units::parse_nonzero_size, default_value = "96M"))]
    pub memory: u64,
    /// Move a depot's pieces to other replicas once it has sent nothing for
    /// this long while others deliver (`0` = wait for the timeout, -T).
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", value_parser = lors_ibp::units::parse_duration, default_value = "30s"))]
    pub stall: Duration,
    /// Start over, discarding what an interrupted download left in OUT.lors-part.
    #[cfg_attr(feature = "clap", arg(long))]
    pub restart: bool,
    /// Never fetch a slow block twice from another replica.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_redundancy: bool,
}

impl Tuning {
    /// The options of a download of pieces of at most `block_size` bytes
    /// with at most `threads` fetches in flight (0: no cap), reading the
    /// `last_resort` depots only when nothing else is left.
    pub fn options(
        &self,
        block_size: u64,
        threads: usize,
        last_resort: HashSet<String>,
    ) -> DownloadOptions {
        DownloadOptions {
            offset: self.offset,
            length: self.length,
            block_size,
            conns_per_depot: self.connections.map_or(0, usize::from),
            hedge: !self.no_redundancy,
            resume: !self.restart,
            window: self.prebuffer.max(1),
            threads,
            last_resort,
            memory: self.memory,
            stall: self.stall,
            start_buffer: self.start_buffer,
            beside: 0,
        }
    }
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
            start_buffer: 0,
            beside: 0,
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
    /// In order, as a stream, but each piece handed over whole in the
    /// buffer it was read into: for a reader that keeps what it reads
    /// (xio's cache), which a writer would make copy every byte. The pieces
    /// are of any length up to [`STREAM_PIECE`] (an encoded mapping's may
    /// be longer); together they are the range, in order.
    Pieces {
        /// Where the pieces go.
        tx: mpsc::Sender<Piece>,
        /// Where the download takes its buffers from: give the pieces'
        /// buffers back here once done with them, and the next pieces reuse
        /// them instead of fresh, zeroed memory.
        buffers: Arc<Buffers>,
        /// Keep raw pieces in kernel pipes ([`Data::Spliced`]) rather than
        /// in buffers, where pipes can be had (otherwise, and for encoded
        /// mappings, in memory).
        spliced: bool,
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

/// What the workers share under one lock: the scheduler and the outcome.
struct Scheduled {
    sched: Sched,
    /// Local failures (the output cannot be written): stop at once.
    fatal: Option<Error>,
    /// Pieces claimed but not yet handed to the output.
    writing: usize,
    /// Connections a depot's distance added, for the supervisor to start.
    grown: Vec<(sched::DepotId, std::ops::Range<usize>)>,
}

struct Ctx {
    x: ExNode,
    /// How an erasure-coded file's data blocks are rebuilt (its virtual
    /// mappings follow the real ones in `x`).
    rebuild: Option<rebuild::Rebuild>,
    /// The output file, when the output is one: a rebuild reads the
    /// stripe-mates already in it from there.
    out: Option<Arc<OutFile>>,
    state: Mutex<Scheduled>,
    /// Told of every change a waiting worker or the supervisor may act on.
    wake: Notify,
    /// Told when a fetch starts: a depot that had nothing in flight may now
    /// stall, and only the supervisor times that. A permit is kept while it
    /// is busy, so a start between its check and its wait is not missed.
    started: Notify,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
    base: u64,
    stream: bool,
    /// The `threads` cap, when set.
    slots: Option<Arc<Semaphore>>,
    /// Memory slots, each the largest piece that passes through memory;
    /// `None` when no piece does (raw mappings spliced into a file).
    mem: Option<Arc<Semaphore>>,
    /// Each depot's share of the memory slots: all but one when there are
    /// several depots and slots, so a hung depot leaves room for the
    /// others. Empty when there is no such limit.
    mem_share: Vec<Arc<Semaphore>>,
    /// Bytes in memory per piece of each mapping (0: spliced into the file).
    mem_need: Vec<u64>,
    bufs: Arc<Buffers>,
    /// Raw pieces go into pipes (see [`Output::Pieces`]); cleared when no
    /// pipe can be had, and they go to memory from then on.
    spliced: std::sync::atomic::AtomicBool,
    /// Reads a rebuild asks of a depot's own connections, by depot.
    urgent: Mutex<HashMap<String, Reads>>,
}

/// A read a rebuild asks of the download's own connections to a depot,
/// before their next piece: they are established and have their share of
/// the link, where a new connection ramping up beside them gets a small
/// part of it (on a shaped link, a rebuild's parity read took 5 s for
/// 2 MiB that the depot's connections move in 1.4).
struct Urgent {
    cap: lors_ibp::Capability,
    offset: u64,
    len: u64,
    /// [`QUEUED`], then taken by a connection or withdrawn by the asker.
    state: Arc<std::sync::atomic::AtomicU8>,
    tx: tokio::sync::oneshot::Sender<lors_ibp::Result<Vec<u8>>>,
}

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// A read asked of a depot's connections waits this long for one to be
/// free (they take turns every fraction of a piece's time), then is read
/// over a connection of its own: a connection waiting for memory, or
/// fetching from a depot that stopped answering, does not hold it up.
const URGENT_WAIT: Duration = Duration::from_secs(1);

/// A depot's connections and the reads asked of them.
#[derive(Default)]
struct Reads {
    live: usize,
    queue: VecDeque<Urgent>,
    /// Reads its connections are making.
    reading: usize,
}

impl Ctx {
    /// Has a connection of depot `name` read `len` bytes at `offset` of
    /// `cap` before its next piece, if the download has connections there
    /// that still fetch; else reads them over the pool. Dropping the
    /// future withdraws the read.
    fn read_urgent(
        &self,
        name: &str,
        cap: &lors_ibp::Capability,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = lors_ibp::Result<Vec<u8>>> + Send + use<> {
        use std::sync::atomic::{AtomicU8, Ordering};
        let pool = self.pool.clone();
        let cap = cap.clone();
        let serves = self.lock().sched.serves(name);
        let queued = {
            let mut q = self.urgent.lock().unwrap_or_else(|e| e.into_inner());
            q.get_mut(name).filter(|r| serves && r.live > 0).map(|r| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let state = Arc::new(AtomicU8::new(QUEUED));
                r.queue.push_back(Urgent {
                    cap: cap.clone(),
                    offset,
                    len,
                    state: state.clone(),
                    tx,
                });
                (rx, state)
            })
        };
        self.wake.notify_waiters();
        async move {
            let Some((mut rx, state)) = queued else {
                return paid_load(&pool, &cap, offset, len).await;
            };
            tokio::select! {
                r = &mut rx => return match r {
                    Ok(r) => r,
                    Err(_) => paid_load(&pool, &cap, offset, len).await,
                },
                () = tokio::time::sleep(URGENT_WAIT) => {}
            }
            let withdrawn =
                state.compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire);
            // Withdrawn, the read stays queued until a connection skips it:
            // waiting for its answer then would wait for connections that
            // may all be waiting for what this read is part of.
            if withdrawn.is_err()
                && let Ok(r) = rx.await
            {
                return r;
            }
            paid_load(&pool, &cap, offset, len).await
        }
    }

    /// Reads asked of depot `name`'s connections, waiting or being made:
    /// load the scheduler does not see.
    fn urgent_load(&self, name: &str) -> usize {
        let q = self.urgent.lock().unwrap_or_else(|e| e.into_inner());
        q.get(name).map_or(0, |r| r.queue.len() + r.reading)
    }

    /// Makes the next read asked of depot `name`'s connections that its
    /// asker still waits for, if any; whether there was one.
    async fn serve_urgent(&self, name: &str) -> bool {
        use std::sync::atomic::Ordering;
        let next = {
            let mut q = self.urgent.lock().unwrap_or_else(|e| e.into_inner());
            let Some(reads) = q.get_mut(name) else {
                return false;
            };
            let mut next = None;
            while let Some(u) = reads.queue.pop_front() {
                let took =
                    (u.state).compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire);
                if took.is_ok() && !u.tx.is_closed() {
                    reads.reading += 1;
                    next = Some(u);
                    break;
                }
            }
            next
        };
        let Some(u) = next else { return false };
        let r = paid_load(&self.pool, &u.cap, u.offset, u.len).await;
        let _ = u.tx.send(r);
        let mut q = self.urgent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reads) = q.get_mut(name) {
            reads.reading -= 1;
        }
        true
    }

    /// A connection of depot `name` starts (`true`) or ends: when the last
    /// one ends, the reads asked of them go back to their askers.
    fn connection(&self, name: &str, starts: bool) {
        let mut q = self.urgent.lock().unwrap_or_else(|e| e.into_inner());
        let r = q.entry(name.to_owned()).or_default();
        if starts {
            r.live += 1;
            return;
        }
        r.live = r.live.saturating_sub(1);
        if r.live == 0 {
            r.queue.clear();
        }
    }
}

/// LOAD of `len` bytes at `offset` of `cap`, paid under `--bwlimit` first
/// as a piece's fetch is.
async fn paid_load(
    pool: &Pool,
    cap: &lors_ibp::Capability,
    offset: u64,
    len: u64,
) -> lors_ibp::Result<Vec<u8>> {
    pool.throttle(len).await;
    pool.load(cap, offset, len).await
}

/// Counts a connection of a depot live while it is held
/// ([`Ctx::connection`]).
struct Live<'a> {
    ctx: &'a Ctx,
    name: &'a str,
}

impl<'a> Live<'a> {
    fn new(ctx: &'a Ctx, name: &'a str) -> Self {
        ctx.connection(name, true);
        Live { ctx, name }
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.ctx.connection(self.name, false);
    }
}

impl Ctx {
    fn lock(&self) -> std::sync::MutexGuard<'_, Scheduled> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the shared state, then tells the user what the
    /// scheduler noticed and wakes everyone waiting for a change.
    fn update<R>(&self, f: impl FnOnce(&mut Scheduled) -> R) -> R {
        let mut g = self.lock();
        let r = f(&mut g);
        self.report(g);
        self.wake.notify_waiters();
        r
    }

    /// Releases the lock and tells the user what the scheduler noticed;
    /// whether it noticed anything.
    fn report(&self, mut g: std::sync::MutexGuard<'_, Scheduled>) -> bool {
        let events: Vec<progress::Event> = (g.sched.take_events().into_iter())
            .map(|e| user_event(&g.sched, e))
            .collect();
        drop(g);
        for e in &events {
            self.progress.event(e);
        }
        !events.is_empty()
    }

    /// The output failed: stop everything, keeping the first error.
    fn fatal(&self, e: Error) {
        self.update(|g| {
            g.fatal.get_or_insert(e);
        });
    }

    /// Everything is in the output (or cannot be): fetches still running
    /// are hedged twins or stragglers nobody needs.
    fn settled(&self) -> bool {
        let g = self.lock();
        // A stream cannot go past bytes no replica serves: its window would
        // wait for them for ever. It ends when the writer reaches them
        // (what comes before is still fetched and written, so the error
        // names the first gap).
        let gap = self.stream && g.sched.stuck();
        g.fatal.is_some() || gap || (g.sched.finished() && g.writing == 0)
    }
}

/// A scheduler event as the user (or a script) is told of it.
fn user_event(s: &Sched, e: Event) -> progress::Event {
    match e {
        Event::Unreachable { depot, why } => progress::Event::Failover {
            depot: s.name(depot).to_owned(),
            why,
        },
        Event::ReadFailed { depot, why } => progress::Event::Retry {
            depot: s.name(depot).to_owned(),
            why,
        },
        Event::Cut { depot, why } => progress::Event::Again {
            depot: s.name(depot).to_owned(),
            why,
        },
        Event::Stalled { depot, silent, .. } => progress::Event::Stalled {
            depot: s.name(depot).to_owned(),
            silent,
        },
        Event::Recovered { depot } => progress::Event::Recovered {
            depot: s.name(depot).to_owned(),
        },
        Event::Slow { depot } => progress::Event::Retry {
            depot: s.name(depot).to_owned(),
            why:
                "slower than rebuilding its blocks from parity: its pieces are rebuilt from here on"
                    .into(),
        },
    }
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
    let original = x;
    // Erasure-coded: each data block also rebuilt from parity, last resort.
    let (extended, mut rebuild) = rebuild::Rebuild::extend(x)?.unzip();
    let x = extended.as_ref().unwrap_or(x);
    check_geometry(&x.mappings)?;
    check_holes(&x.holes)?;
    let size = x.logical_size();
    let start = opts.offset.min(size);
    let len = opts.length.unwrap_or(size - start).min(size - start);
    let stream_piece = match out {
        Output::Stream { .. } | Output::Pieces { .. } => Some(stream_piece(original, &pool).await),
        _ => None,
    };
    let Layout {
        codecs,
        whole,
        piece,
        window,
        planned,
        names,
        depot_of,
    } = layout(x, opts, start, len, stream_piece, rebuild.as_ref())?;
    let Opened {
        file_out,
        stream,
        shared_bufs,
        spliced,
    } = open_output(out, original, start, len, opts)?;
    let mem_need = memory_per_piece(x, &codecs, whole, piece, stream.is_some());
    let largest = (planned.iter().flat_map(|s| s.sources.iter()))
        .map(|&m| mem_need[m])
        .max()
        .unwrap_or(0);
    let cfg = sched::Config {
        window: stream.is_some().then_some(window),
        // Halves of an encoded piece would each read its edge block.
        split_tail: stream.is_none() && codecs.iter().all(Option::is_none),
        ..sched_config(opts, &names)
    };
    let zeros = stream
        .as_ref()
        .map_or_else(Vec::new, |_| holes_around(&planned, start, len));
    let (sched, resumed_bytes) = scheduler(
        cfg,
        (names, depot_of, planned),
        x,
        rebuild.as_mut(),
        file_out.as_ref(),
        t0,
    );
    let holes: u64 = x.holes_in(start, start + len).map(|h| h.length).sum();
    progress.start(Some(len - holes - resumed_bytes));
    let slots = usize::try_from(opts.memory / largest.max(1))
        .unwrap_or(usize::MAX)
        .clamp(1, Semaphore::MAX_PERMITS);
    // A stored and a decoded buffer per slot, and the writer's piece.
    let keep = if largest > 0 {
        2 * slots.min(64) + 2
    } else {
        0
    };
    let depots = sched.depots();
    let ctx = Arc::new(Ctx {
        x: x.clone(),
        rebuild,
        out: file_out.as_ref().map(|f| f.0.clone()),
        state: Mutex::new(Scheduled {
            sched,
            fatal: None,
            writing: 0,
            grown: Vec::new(),
        }),
        wake: Notify::new(),
        started: Notify::new(),
        pool,
        progress,
        base: start,
        stream: stream.is_some(),
        slots: (opts.threads > 0).then(|| Arc::new(Semaphore::new(opts.threads))),
        mem: (largest > 0).then(|| Arc::new(Semaphore::new(slots))),
        mem_share: if largest > 0 && slots > 1 && depots > 1 {
            (0..depots)
                .map(|_| Arc::new(Semaphore::new(slots - 1)))
                .collect()
        } else {
            Vec::new()
        },
        mem_need,
        bufs: shared_bufs.unwrap_or_else(|| Arc::new(Buffers::new(keep))),
        spliced: spliced.into(),
        urgent: Mutex::new(HashMap::new()),
    });
    let hold = output::Hold {
        bytes: opts.start_buffer,
        pieces: window.min(slots),
    };
    let (tx, writer) = match stream {
        Some((w, name)) => {
            let (tx, writer) = spawn_writer(&ctx, (w, name), window, hold, zeros);
            (Some(tx), Some(writer))
        }
        None => (None, None),
    };
    let mut workers = spawn_workers(&ctx, opts, &tx);
    supervise(&ctx, &mut workers, tx).await;
    if let Some(w) = writer {
        // Its error, if any, is already the fatal one (with its context).
        w.await
            .map_err(|e| Error::io("output writer", std::io::Error::other(e.to_string())))?;
    }
    outcome(&ctx, file_out.as_ref().map(|f| &f.0), resumed_bytes, t0)
}

/// Rebuilds in flight per connection a depot gets.
const REBUILDS_PER_CONNECTION: usize = 2;

/// The workers: a depot's connections each, and the rebuilder's
/// rebuilds.
fn spawn_workers(
    ctx: &Arc<Ctx>,
    opts: &DownloadOptions,
    tx: &Option<mpsc::Sender<Held>>,
) -> tokio::task::JoinSet<()> {
    let mut workers = tokio::task::JoinSet::new();
    let per_depot = match opts.conns_per_depot {
        0 => AUTO_CONNECTIONS,
        n => n,
    };
    let depots = ctx.lock().sched.depots();
    for d in 0..depots {
        // A rebuild mostly waits — for its row to arrive from the other
        // depots, for a parity read among their fetches — so the
        // rebuilder keeps more of them going (more, in the network lab,
        // only added flows on links already full).
        let n = match ctx.lock().sched.name(d) == rebuild::SOURCE {
            true => REBUILDS_PER_CONNECTION * per_depot,
            false => per_depot,
        };
        for conn in 0..n {
            workers.spawn(fetch::worker(ctx.clone(), d, conn, tx.clone()));
        }
    }
    workers
}

/// The scheduler's settings from `opts`, for depots `names` (the parity
/// source of an erasure-coded file a last resort that rebuilds).
fn sched_config(opts: &DownloadOptions, names: &[String]) -> sched::Config {
    let depots = |f: &dyn Fn(&String) -> bool| (0..names.len()).filter(|&d| f(&names[d])).collect();
    sched::Config {
        conns_per_depot: opts.conns_per_depot,
        beside: opts.beside,
        threads: opts.threads,
        hedge: opts.hedge,
        stall: opts.stall,
        last_resort: depots(&|n| opts.last_resort.contains(n) || n == rebuild::SOURCE),
        rebuilders: depots(&|n| n == rebuild::SOURCE),
        ..sched::Config::default()
    }
}

/// Pieces by (offset, length).
type Pieces = std::collections::HashSet<(u64, u64)>;

/// The output, opened: a file (with the pieces a resumed download has
/// already), or a stream of pieces in order (its sink and its name), with
/// the buffers and whether pieces stay in pipes.
struct Opened {
    /// The file, and the pieces (offset, length) a resumed one has.
    file_out: Option<(Arc<OutFile>, Pieces)>,
    stream: Option<(Sink, String)>,
    shared_bufs: Option<Arc<Buffers>>,
    spliced: bool,
}

fn open_output(
    out: Output,
    x: &ExNode,
    start: u64,
    len: u64,
    opts: &DownloadOptions,
) -> Result<Opened> {
    let mut o = Opened {
        file_out: None,
        stream: None,
        shared_bufs: None,
        spliced: false,
    };
    match out {
        Output::File(path) => {
            let (f, done) = OutFile::open(path, x, start, len, opts.block_size, opts.resume)?;
            o.file_out = Some((Arc::new(f), done));
        }
        Output::Stream { writer, name } => o.stream = Some((Sink::Writer(writer), name)),
        Output::Pieces {
            tx,
            buffers,
            spliced,
        } => {
            let name = "the reader of the pieces".to_owned();
            o.stream = Some((Sink::Pieces(tx), name));
            o.shared_bufs = Some(buffers);
            o.spliced = spliced;
        }
    }
    Ok(o)
}

/// What a piece of each mapping holds in memory: an encoded mapping the
/// stored and decoded bytes of the blocks it is read in (a piece not on
/// their edges takes one block more); a raw one its piece, unless spliced.
fn memory_per_piece(
    x: &ExNode,
    codecs: &[Option<Codec>],
    whole: bool,
    piece: u64,
    stream: bool,
) -> Vec<u64> {
    (x.mappings.iter().zip(codecs))
        .map(|(m, c)| match (&m.function, c, stream) {
            (Some(_), Some(c), _) if !whole => {
                let blocks =
                    (piece.div_ceil(c.e2e_blocksize()) + 1).saturating_mul(c.e2e_blocksize());
                let stored = blocks.saturating_add(m.alloc_length.saturating_sub(m.logical_length));
                stored.min(m.alloc_length) + blocks.min(m.logical_length)
            }
            (Some(_), _, _) => m.alloc_length.saturating_add(m.logical_length),
            (None, _, true) => m.logical_length.min(piece),
            (None, _, false) => 0,
        })
        .collect()
}

/// How a range of an exNode is cut and read: each mapping's codec, whether
/// encoded mappings are read whole, the piece size and stream window, the
/// pieces planned, and the depots (names, and each mapping's index).
struct Layout {
    codecs: Vec<Option<Codec>>,
    whole: bool,
    piece: u64,
    window: usize,
    planned: Vec<crate::plan::Segment>,
    names: Vec<String>,
    depot_of: Vec<usize>,
}

fn layout(
    x: &ExNode,
    opts: &DownloadOptions,
    start: u64,
    len: u64,
    stream_piece: Option<u64>,
    rebuild: Option<&rebuild::Rebuild>,
) -> Result<Layout> {
    // Encoded mappings are read in whole e2e blocks, each verified on its
    // own, where their layout allows (`Codec::slice`); those whose layout
    // does not (compression, a digest of all stored bytes) are read whole,
    // and then nothing is cut smaller than a mapping.
    let codecs: Vec<Option<Codec>> = (x.mappings.iter())
        .map(|m| Codec::from_mapping(m).ok().flatten())
        .collect();
    let whole = (x.mappings.iter().zip(&codecs))
        .any(|(m, c)| m.function.is_some() && !c.as_ref().is_some_and(|c| c.is_sliceable(m)));
    let e2e_block = (codecs.iter().flatten())
        .map(Codec::e2e_blocksize)
        .max()
        .unwrap_or(1)
        .max(1);
    // A stream is cut finer: it keeps only a few seconds' worth in flight
    // (sched::STREAM_HORIZON), and that should still be many connections,
    // or a lossy narrow link is not filled. The window keeps its size in
    // bytes.
    let (piece, window) = match stream_piece {
        Some(sp) if opts.block_size > sp => {
            let k = usize::try_from(opts.block_size / sp).unwrap_or(usize::MAX);
            // Capped: the scheduler walks the window on every pick.
            (sp, opts.window.max(1).saturating_mul(k).min(4096))
        }
        _ => (opts.block_size, opts.window.max(1)),
    };
    // However long the range, no more than MAX_SEGMENTS pieces: larger
    // pieces for very large ranges, a refusal past what that allows.
    // Pieces of whole e2e blocks, so a piece is read with no more blocks
    // than it needs.
    let piece = crate::plan::piece_for(len, piece)?.next_multiple_of(e2e_block);
    let planned = plan(
        &x.mappings,
        &x.holes,
        start,
        len,
        if whole { u64::MAX } else { piece },
    )?;
    // Depots as indices: every mapping's read address, each named once.
    let addrs: Vec<String> = (x.mappings.iter().enumerate())
        .map(|(i, m)| match rebuild {
            Some(r) if r.is_virtual(i) => rebuild::SOURCE.to_owned(),
            _ => m.read.as_ref().map(|c| c.address()).unwrap_or_default(),
        })
        .collect();
    let mut names: Vec<String> = (planned.iter().flat_map(|s| s.sources.iter()))
        .map(|&m| addrs[m].clone())
        .collect();
    names.sort();
    names.dedup();
    let depot_of: Vec<usize> = (addrs.iter())
        .map(|a| names.binary_search(a).unwrap_or(usize::MAX))
        .collect();
    Ok(Layout {
        codecs,
        whole,
        piece,
        window,
        planned,
        names,
        depot_of,
    })
}

/// The scheduler for the pieces `planned` (with the depots' names and each
/// mapping's depot), and the bytes of them a resumed output file has.
fn scheduler(
    cfg: sched::Config,
    (names, depot_of, planned): (Vec<String>, Vec<usize>, Vec<crate::plan::Segment>),
    x: &ExNode,
    rebuild: Option<&mut rebuild::Rebuild>,
    file_out: Option<&(Arc<OutFile>, Pieces)>,
    t0: Instant,
) -> (Sched, u64) {
    // A file's pieces read beside a rebuilt one are written from there; a
    // stream's go through the writer's window, and are read on their own.
    let rows = match (rebuild, file_out) {
        (Some(rb), Some(_)) => rb.rows(x, &planned, fetch::stored_range),
        _ => Vec::new(),
    };
    let mut sched = Sched::new(cfg, names, depot_of, planned, t0);
    if !rows.is_empty() {
        // Blocks stored as is are read back from the output by a rebuild;
        // encoded ones cannot be, and are left to it.
        let raw = x.mappings.iter().all(|m| m.function.is_none());
        sched.set_rows(rows, !raw);
    }
    let resumed = file_out.map_or(0, |(_, done)| sched.skip_done(done));
    (sched, resumed)
}

/// Starts the writer of an ordered output: pieces in order to `w`, up to
/// `window` of them queued.
fn spawn_writer(
    ctx: &Arc<Ctx>,
    (w, name): (Sink, String),
    window: usize,
    hold: output::Hold,
    zeros: Vec<u64>,
) -> (mpsc::Sender<Held>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Held>(window);
    let c = ctx.clone();
    let writer = tokio::spawn(async move {
        // A failed write (reader gone, disk full) is fatal at once: the
        // fetches waiting for the window to move must stop, not wait for a
        // writer that will never write again.
        let written = |next| c.update(|g| g.sched.written(next));
        let failed = |e| c.fatal(Error::io(format!("writing {name}"), e));
        output::write_in_order(w, rx, &c.bufs, hold, &zeros, written, failed).await;
    });
    (tx, writer)
}

/// The zeros a stream of `[start, start+len)` writes before each of the
/// pieces `planned` and after the last: the holes between them (none, no
/// entries).
fn holes_around(planned: &[crate::plan::Segment], start: u64, len: u64) -> Vec<u64> {
    let mut at = start;
    let mut zeros: Vec<u64> = (planned.iter())
        .map(|s| {
            let gap = s.offset - at;
            at = s.offset + s.len;
            gap
        })
        .collect();
    zeros.push(start + len - at);
    match zeros.iter().all(|&z| z == 0) {
        true => Vec::new(),
        false => zeros,
    }
}

/// What a finished download comes to: its statistics, or why part of the
/// range could not be read.
fn outcome(
    ctx: &Ctx,
    file_out: Option<&Arc<OutFile>>,
    resumed_bytes: u64,
    t0: Instant,
) -> Result<Stats> {
    let mut g = ctx.lock();
    if let Some(e) = g.fatal.take() {
        return Err(e);
    }
    let s = &g.sched;
    if let (Some(rb), Some(first)) = (&ctx.rebuild, s.lost().iter().min_by_key(|l| l.offset)) {
        return Err(rb.lost(s.lost().iter().map(|l| l.offset..l.end), first.why.clone()));
    }
    if let Some(first) = s.lost().iter().min_by_key(|l| l.offset) {
        let n = s.lost().len();
        let mut last = first.why.clone();
        if n > 1 {
            last.text = format!("{} (and {} more pieces unreadable)", last.text, n - 1);
        }
        let (offset, end) = (first.offset, first.end);
        return Err(Error::Unreadable { offset, end, last });
    }
    if let Some(p) = s.unfinished() {
        let (offset, len) = s.piece(p);
        return Err(Error::Unreadable {
            offset,
            end: offset + len,
            last: "every depot holding it failed".into(),
        });
    }
    if let Some(f) = file_out {
        f.finish()?;
    }
    let c = s.counters();
    Ok(Stats {
        bytes: c.bytes,
        resumed_bytes,
        retries: c.retries,
        hedged: c.hedged,
        per_depot: s.per_depot().map(|(d, b)| (d.to_owned(), b)).collect(),
        elapsed: t0.elapsed(),
    })
}

/// Waits for the workers, checking for stalls when one may have happened,
/// waking idle connections when a piece in flight becomes a straggler they
/// may fetch again, and stopping the stragglers once every piece is
/// settled: a connect or read timeout on a depot whose pieces other
/// replicas delivered is not waited out. It starts the connections a
/// depot's distance adds (see [`tune::RTT_PER_CONNECTION`]).
async fn supervise(
    ctx: &Arc<Ctx>,
    workers: &mut tokio::task::JoinSet<()>,
    tx: Option<mpsc::Sender<Held>>,
) {
    loop {
        let notified = ctx.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next_check = {
            let mut g = ctx.lock();
            let now = Instant::now();
            g.sched.check_stalls(now);
            for (d, conns) in std::mem::take(&mut g.grown) {
                for conn in conns {
                    workers.spawn(fetch::worker(ctx.clone(), d, conn, tx.clone()));
                }
            }
            let next = g.sched.next_check(now);
            // Only a stall moves pieces here: wake the workers for those alone.
            if ctx.report(g) {
                ctx.wake.notify_waiters();
            }
            next
        };
        if ctx.settled() {
            workers.abort_all();
        }
        let timer = async {
            match next_check {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            j = workers.join_next() => if j.is_none() { return },
            () = &mut notified => {}
            () = ctx.started.notified() => {}
            // A piece may have become a straggler: idle connections look again.
            () = timer => ctx.wake.notify_waiters(),
        }
    }
}
