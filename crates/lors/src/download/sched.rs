//! The download scheduler, sans I/O: which connection fetches which piece
//! from which replica, and what happens when a fetch fails, stalls or loses
//! a race. It owns no sockets, tasks or clocks — callers pass the time in
//! and carry out its decisions — so the same scheduler drives downloads,
//! and tests drive it with a fake clock and fake depots.
//!
//! Depots are indices; each keeps the pending pieces it can serve in
//! groups keyed by the *other* depots that can serve them too. Picking looks
//! at the first piece of each group, not at every pending piece: the work of
//! a pick grows with the number of replica layouts and of pieces in flight,
//! not with the size of the file.
//!
//! ```
//! use std::time::Instant;
//! use lors::download::sched::{Config, Pick, Sched};
//! use lors::plan::Segment;
//!
//! // Two pieces, each held by mapping 0 (on depot 0) and mapping 1 (depot 1).
//! let plan = (0..2)
//!     .map(|i| Segment { offset: i * 100, len: 100, sources: vec![0, 1] })
//!     .collect();
//! let now = Instant::now();
//! let depots = vec!["a:6714".to_string(), "b:6714".to_string()];
//! let mut s = Sched::new(Config::default(), depots, vec![0, 1], plan, now);
//! let Pick::Fetch { piece, mapping } = s.pick(0, 0, false, now) else { panic!() };
//! assert!(s.claim(piece, mapping, now)); // the bytes arrived
//! let Pick::Fetch { piece, mapping } = s.pick(1, 0, false, now) else { panic!() };
//! assert!(s.claim(piece, mapping, now));
//! assert!(s.finished());
//! ```

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::tune::Tune;
use crate::error::Cause;
use crate::plan::Segment;

/// A piece of the plan, by index. Pieces cut at the end game get new
/// indices after the planned ones.
pub type PieceId = usize;
/// A depot, by index into the names given to [`Sched::new`].
pub type DepotId = usize;

/// Rebuilds reading their row themselves (its pieces not on their way
/// from the depots) at once: each reads k blocks on links the depots keep
/// busy.
const HEAVY_REBUILDS: usize = super::AUTO_CONNECTIONS;

/// A depot with this many pieces still queued may have them rebuilt by an
/// idle depot's parity (see `Sched::ready_pick`).
const STEAL_BACKLOG: usize = 2;

/// Queue order of the pieces whose rows a rebuild waits for: before every
/// other (see `Sched::touch_rows_of`), in file order among themselves.
const ROWS_FIRST: i64 = i64::MIN / 2;

/// Pending pieces of one replica layout a rebuilder weighs when it picks
/// the piece whose row is most on its way (bounds the work of a pick).
const ROW_SCAN: usize = 64;

/// Busy replies (`-66`) one piece takes before its replica counts as failed.
pub const BUSY_MAX: u32 = 100;

/// How long a depot that cuts reads off (a connection reset or closed
/// mid-reply, a connect refused) is asked again for the pieces no other
/// replica holds, counted from the first such cut since it last
/// delivered: a depot restarting comes back within it.
pub const CUT_GRACE: Duration = Duration::from_secs(15);

/// The pause before asking a depot that cut a read off again.
pub const CUT_PAUSE: Duration = Duration::from_millis(500);

/// Pieces are not cut below this at the end of a download.
pub const TAIL_PIECE_MIN: u64 = 256 << 10;

/// ... nor below this when a depot's distance earned it more connections
/// (see [`super::RTT_PER_CONNECTION`]): each of them then moves a few window's worth per
/// round trip, and a 256 KiB piece would keep the last ones busy for
/// seconds while the others sit idle.
pub const TAIL_PIECE_MIN_FAR: u64 = 64 << 10;

/// Bytes every depot is credited with before it delivers, in the drain
/// estimate: a few pieces' worth, so the first deliveries do not swing it.
const DRAIN_PRIOR: f64 = (16u64 << 20) as f64;

/// A piece running this many times longer than pieces of its size have
/// taken so far is a straggler: an idle connection of a depot still busy
/// with other pieces may fetch it again. Its own connection has likely
/// fallen behind the others sharing the link (a TCP flow that lost the race
/// for the link's queue, or sits in retransmission backoff), and waiting
/// for it can cost a download a third of its time at the end.
const STRAGGLER_FACTOR: f64 = 2.0;
/// ... and it has been running at least this long, so a short wobble on a
/// fast path is not fetched twice.
const STRAGGLER_MIN: Duration = Duration::from_secs(1);
/// Pieces timed before the typical fetch time is trusted.
const STRAGGLER_SAMPLES: u32 = 4;

/// Ordered output: data kept in flight ahead of the writer, as time at the
/// rate measured so far. Pieces in flight share the links, so the piece the
/// writer waits for arrives later the more run beside it: sixteen 2 MiB
/// pieces on a 20 Mbit/s link deliver the first byte in order after 13 s;
/// two of them after under 2 s. The writer trails the bytes received by
/// about half of what is in flight, and a player's start-up buffer must
/// cover that: 2 s on a 20 Mbit/s link is ~5 MB, half of it more than a
/// 2 MiB buffer, and a 15 Mbit/s player ran dry in its first seconds in a
/// quarter of the runs (docs/bench/2026-11-24-xio-stream.md), with 1 s in
/// none of the same runs. Still far longer than a wide-area round trip, so
/// a path stays full.
pub const STREAM_HORIZON: Duration = Duration::from_secs(1);
/// ... and at least this much, before any rate is known.
pub const STREAM_MIN_AHEAD: u64 = 2 << 20;

/// What a rebuilder's pick by row readiness decided.
enum Ready {
    /// Fetch this piece through this mapping (a hedge if running).
    Take(PieceId, usize, bool),
    /// Nothing cheap to take now.
    Wait,
    /// Not this rule's to decide: the general pick goes on.
    Other,
}

/// How the scheduler hands out work.
#[derive(Debug, Clone)]
pub struct Config {
    /// Connections per depot; 0 = [`super::AUTO_CONNECTIONS`], halved for a
    /// depot each time it says it is busy.
    pub conns_per_depot: usize,
    /// Downloads sharing the depots (see
    /// [`super::DownloadOptions::beside`]): the connections distance adds
    /// are divided by it.
    pub beside: usize,
    /// Fetches in flight across all depots; 0 = no cap.
    pub threads: usize,
    /// Fetch the oldest straggler again from another replica when idle.
    pub hedge: bool,
    /// Ordered output: pieces are handed out in file order, at most this
    /// many ahead of the first one not yet written. `None`: any order.
    pub window: Option<usize>,
    /// The last pieces may be cut in two so connections finish together.
    pub split_tail: bool,
    /// A depot that delivers nothing for this long while others deliver is
    /// stalled — or sooner, once pieces have been timed, as
    /// [`crate::stall`] says for its oldest piece. Zero never stalls a
    /// depot.
    pub stall: Duration,
    /// Depots read only when a piece has no other replica left.
    pub last_resort: Vec<DepotId>,
    /// Last-resort depots that rebuild pieces (an erasure-coded file's
    /// parity): they also hedge a straggler of another depot, so a slow
    /// depot's pieces are rebuilt rather than waited for.
    pub rebuilders: Vec<DepotId>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            conns_per_depot: 0,
            beside: 0,
            threads: 0,
            hedge: true,
            window: None,
            split_tail: true,
            stall: Duration::from_secs(30),
            last_resort: Vec::new(),
            rebuilders: Vec::new(),
        }
    }
}

/// What a connection should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Fetch `piece` through `mapping`, then report [`Sched::claim`],
    /// [`Sched::failed`] or [`Sched::busy`].
    Fetch {
        /// The piece.
        piece: PieceId,
        /// The exNode mapping (replica) to read it from.
        mapping: usize,
    },
    /// Nothing for this connection now; ask again after the next change.
    Wait,
    /// Nothing for this connection ever again.
    Exit,
}

/// Something a user should hear about, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A depot could not be reached; its replicas are skipped from now on.
    Unreachable {
        /// The depot.
        depot: DepotId,
        /// The error.
        why: String,
    },
    /// One read failed; the piece goes to another replica.
    ReadFailed {
        /// The depot.
        depot: DepotId,
        /// The error.
        why: String,
    },
    /// A read from the only replica of its piece was cut off; the depot
    /// is asked again after a pause ([`Sched::cut`]).
    Cut {
        /// The depot.
        depot: DepotId,
        /// The error.
        why: String,
    },
    /// A depot sent nothing for `silent` while others delivered; `moved`
    /// pieces in flight there went back to the queue for other replicas.
    Stalled {
        /// The depot.
        depot: DepotId,
        /// How long it has been silent.
        silent: Duration,
        /// Pieces moved to other replicas.
        moved: usize,
    },
    /// A stalled depot delivered again.
    Recovered {
        /// The depot.
        depot: DepotId,
    },
    /// A depot lost [`SLOW_AFTER`] races in a row to a depot that rebuilds
    /// pieces (an erasure-coded file's parity) and delivered less than a
    /// [`SLOW_SHARE`]th of what depots typically did: its pieces are
    /// rebuilt from now on rather than waited for.
    Slow {
        /// The depot.
        depot: DepotId,
    },
}

/// Races a depot loses in a row to a rebuilding depot before its pieces go
/// there first: one could be a hiccup; two without a delivery between are
/// a slow link.
pub const SLOW_AFTER: u32 = 2;

/// A depot is slow only when it has also delivered less than the median
/// depot's bytes divided by this.
pub const SLOW_SHARE: u64 = 4;

/// ... and the median depot has delivered this many pieces' worth: before
/// that, a depot may be behind only for having started late.
pub const SLOW_EVIDENCE: u64 = 4;

/// A range no replica could serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// First byte.
    pub offset: u64,
    /// One past the last byte.
    pub end: u64,
    /// The last error.
    pub why: Cause,
}

/// Counters for [`super::Stats`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    /// Bytes claimed.
    pub bytes: u64,
    /// Reads that failed or met a busy depot.
    pub retries: u64,
    /// Pieces fetched a second time to beat a straggler.
    pub hedged: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Pending,
    Running,
    Done,
}

/// An interned set of depots: the other holders of a pending piece.
type KeyId = usize;

/// Ends the key of a piece left to a rebuilder (see [`Sched::set_rows`]):
/// no depot picks from such a group.
const RESERVED: DepotId = DepotId::MAX;

/// A piece in no row.
const NO_ROW: usize = usize::MAX;

struct Piece {
    offset: u64,
    len: u64,
    /// Mappings that hold the whole piece.
    sources: Vec<usize>,
    /// Mappings that failed to deliver it.
    failed: Vec<usize>,
    /// Mappings it is being fetched from now.
    running_on: Vec<usize>,
    started: Instant,
    st: St,
    busy: u32,
    /// Position in the queues: lower goes first.
    order: i64,
    /// The queues it sits in: (depot, group).
    queued: Vec<(DepotId, KeyId)>,
}

#[derive(Default)]
struct Queue {
    groups: HashMap<KeyId, BTreeSet<(i64, PieceId)>>,
    len: usize,
}

struct Depot {
    last_resort: bool,
    dead: bool,
    stalled: bool,
    /// Races lost to a rebuilding depot.
    beaten: u32,
    /// Slower than rebuilding its pieces: they go to the rebuilder.
    slow: bool,
    tune: Option<Tune>,
    delivered: Option<Instant>,
    /// The first read it cut off since it last delivered ([`Sched::cut`]).
    cut_since: Option<Instant>,
    bytes: u64,
    /// Fetches in flight here.
    running: usize,
    /// Pending pieces this depot can serve.
    queue: Queue,
    /// Every piece with a replica here.
    holds: Vec<PieceId>,
}

/// The scheduler state of one download.
pub struct Sched {
    cfg: Config,
    names: Vec<String>,
    depots: Vec<Depot>,
    /// Each mapping's depot.
    depot_of: Vec<DepotId>,
    pieces: Vec<Piece>,
    keys: Vec<Box<[DepotId]>>,
    /// Rows of an erasure-coded file's pieces (see [`Sched::set_rows`]),
    /// each piece's row, and pieces a rebuilder took with the one it
    /// picked, by that one.
    rows: Vec<Box<[PieceId]>>,
    row_of: Vec<usize>,
    /// Rows are left to the rebuilder while one of their pieces waits
    /// for it.
    reserve_rows: bool,
    taken: HashMap<PieceId, Vec<(PieceId, usize)>>,
    key_ids: HashMap<Box<[DepotId]>, KeyId>,
    /// Pieces being fetched, oldest first.
    running: BTreeSet<(Instant, PieceId)>,
    pending: usize,
    done: usize,
    lost: Vec<Lost>,
    /// Ordered output: pieces before this one are written.
    written: usize,
    /// ... and the writer has begun (a start-up buffer holds it back).
    writing: bool,
    /// Order keys of re-queued pieces count down from here, ahead of all.
    front: i64,
    t0: Instant,
    events: Vec<Event>,
    counters: Counters,
    scratch: Vec<DepotId>,
    /// Seconds per byte a fetch has taken, over the pieces delivered by
    /// their only fetch.
    fetch_time: crate::stall::Typical,
    /// Length of the last piece a depot delivered: the unit the evidence
    /// that a depot is slow is counted in.
    claimed_len: u64,
    /// Fetches in flight (piece, mapping) nobody needs any more: their
    /// piece moved off a stalled depot, or a twin delivered it first. Their
    /// connections stop at once (see [`Sched::is_cancelled`]): a fetch
    /// stuck on a hung depot holds a memory slot and a connection until
    /// the network timeout otherwise.
    cancelled: std::collections::HashSet<(PieceId, usize)>,
}

impl Sched {
    /// A scheduler for `plan`, whose sources index `depot_of` (each
    /// mapping's depot, an index into `names`). Every piece starts pending.
    pub fn new(
        cfg: Config,
        names: Vec<String>,
        depot_of: Vec<DepotId>,
        plan: Vec<Segment>,
        now: Instant,
    ) -> Self {
        let depots = (0..names.len())
            .map(|d| Depot {
                last_resort: cfg.last_resort.contains(&d),
                dead: false,
                stalled: false,
                beaten: 0,
                slow: false,
                tune: (cfg.conns_per_depot == 0 && !cfg.rebuilders.contains(&d))
                    .then(|| Tune::new(cfg.beside)),
                delivered: None,
                cut_since: None,
                bytes: 0,
                running: 0,
                queue: Queue::default(),
                holds: Vec::new(),
            })
            .collect();
        let mut s = Sched {
            cfg,
            names,
            depots,
            depot_of,
            pieces: Vec::with_capacity(plan.len()),
            keys: Vec::new(),
            rows: Vec::new(),
            row_of: Vec::new(),
            reserve_rows: false,
            taken: HashMap::new(),
            key_ids: HashMap::new(),
            running: BTreeSet::new(),
            pending: 0,
            done: 0,
            lost: Vec::new(),
            written: 0,
            writing: false,
            front: 0,
            t0: now,
            events: Vec::new(),
            counters: Counters::default(),
            scratch: Vec::new(),
            fetch_time: Default::default(),
            claimed_len: 0,
            cancelled: std::collections::HashSet::new(),
        };
        for seg in plan {
            let p = s.pieces.len();
            s.add(Piece {
                offset: seg.offset,
                len: seg.len,
                sources: seg.sources,
                failed: Vec::new(),
                running_on: Vec::new(),
                started: now,
                st: St::Pending,
                busy: 0,
                order: i64::try_from(p).unwrap_or(i64::MAX),
                queued: Vec::new(),
            });
        }
        s
    }

    fn add(&mut self, piece: Piece) -> PieceId {
        let p = self.pieces.len();
        if !self.row_of.is_empty() {
            self.row_of.push(NO_ROW);
        }
        for &m in &piece.sources {
            let holds = &mut self.depots[self.depot_of[m]].holds;
            if holds.last() != Some(&p) {
                holds.push(p);
            }
        }
        self.pieces.push(piece);
        self.pending += 1;
        self.enqueue(p);
        p
    }

    /// Marks a piece an earlier run already delivered (resume).
    pub fn skip(&mut self, p: PieceId) {
        if self.pieces[p].st == St::Pending {
            self.unqueue(p);
            self.pieces[p].st = St::Done;
            self.pending -= 1;
            self.done += 1;
        }
    }

    /// Skips every piece whose range `done` holds (a resumed download's
    /// finished pieces); the bytes skipped.
    pub fn skip_done(&mut self, done: &std::collections::HashSet<(u64, u64)>) -> u64 {
        let mut bytes = 0;
        for p in 0..self.len() {
            if done.contains(&self.piece(p)) {
                self.skip(p);
                bytes += self.piece(p).1;
            }
        }
        bytes
    }

    /// The byte range of a piece: (offset, length).
    pub fn piece(&self, p: PieceId) -> (u64, u64) {
        (self.pieces[p].offset, self.pieces[p].len)
    }

    /// Groups pieces into rows: the pieces at one place of the data blocks
    /// of one stripe of an erasure-coded file, stored alike. Rebuilding
    /// one reads the others' bytes there, so a rebuilder that picks a
    /// piece takes the others still pending with it (see
    /// [`Sched::taken_with`]).
    ///
    /// With `reserve`, while a piece no depot but a rebuilder will read
    /// waits, the others of its row are left to that rebuilder: read by
    /// their own depots first, they would be read twice. Without, they
    /// are read where they are, and a rebuild reads them back from the
    /// output (a file, stored as is) rather than fetch them again — every
    /// depot keeps its own link busy.
    pub fn set_rows(&mut self, rows: Vec<Vec<PieceId>>, reserve: bool) {
        self.reserve_rows = reserve;
        self.row_of = vec![NO_ROW; self.pieces.len()];
        for (r, row) in rows.into_iter().enumerate() {
            for &p in &row {
                self.row_of[p] = r;
            }
            self.rows.push(row.into());
        }
        for p in 0..self.pieces.len() {
            self.refresh(p);
        }
    }

    /// The pieces taken with `p` when a rebuilder picked it: each with the
    /// mapping it is counted as fetched through. Report [`Sched::claim`]
    /// or [`Sched::abandon`] for each.
    pub fn taken_with(&mut self, p: PieceId) -> Vec<(PieceId, usize)> {
        self.taken.remove(&p).unwrap_or_default()
    }

    /// How long a depot's fetch of `len` bytes typically takes here, once
    /// enough fetches are timed to say.
    pub fn typical_fetch(&self, len: u64) -> Option<Duration> {
        (self.fetch_time.samples() >= STRAGGLER_SAMPLES)
            .then(|| Duration::from_secs_f64(self.fetch_time.per_unit() * len as f64))
    }

    /// Whether piece `p`, still `range` (offset, length), is delivered or
    /// being fetched by a depot that does not rebuild: its bytes are (or
    /// will be) in the output.
    pub fn coming(&self, p: PieceId, range: (u64, u64)) -> bool {
        let s = &self.pieces[p];
        if (s.offset, s.len) != range {
            return false; // cut at the end game: in the output as two pieces
        }
        match s.st {
            St::Pending => false,
            St::Running => {
                (s.running_on.iter()).any(|&m| !self.cfg.rebuilders.contains(&self.depot_of[m]))
            }
            St::Done => !(self.lost.iter()).any(|l| l.offset == s.offset),
        }
    }

    /// Whether the download has connections to depot `name` that still
    /// fetch (it is known, not dead, stalled or slow).
    pub fn serves(&self, name: &str) -> bool {
        (self.names.iter().position(|n| n == name))
            .is_some_and(|d| !self.depots[d].dead && !self.is_last_resort(d))
    }

    /// Pieces depot `name` has queued or in flight (0 for a name it does
    /// not know); `None` for one that is dead, stalled or slow.
    pub fn backlog(&self, name: &str) -> Option<usize> {
        match self.names.iter().position(|n| n == name) {
            None => Some(0),
            Some(d) if self.depots[d].dead || self.is_last_resort(d) => None,
            Some(d) => Some(self.depots[d].queue.len + self.depots[d].running),
        }
    }

    /// Pieces so far (planned and cut).
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the plan is empty.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Depots, numbered from 0.
    pub fn depots(&self) -> usize {
        self.depots.len()
    }

    /// A depot's name as given to [`Sched::new`].
    pub fn name(&self, d: DepotId) -> &str {
        &self.names[d]
    }

    /// Every piece is delivered or lost.
    pub fn finished(&self) -> bool {
        self.done + self.lost.len() == self.pieces.len()
    }

    /// Ranges no replica could serve, in the order they were given up.
    pub fn lost(&self) -> &[Lost] {
        &self.lost
    }

    /// A piece neither delivered nor lost, if any.
    pub fn unfinished(&self) -> Option<PieceId> {
        self.pieces.iter().position(|p| p.st != St::Done)
    }

    /// Counters so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Bytes delivered per depot that delivered any.
    pub fn per_depot(&self) -> impl Iterator<Item = (&str, u64)> {
        self.depots
            .iter()
            .zip(&self.names)
            .filter(|(d, _)| d.bytes > 0)
            .map(|(d, n)| (n.as_str(), d.bytes))
    }

    /// Connections depot `d` may use now (its budget, or the fixed
    /// count).
    pub fn level(&self, d: DepotId) -> usize {
        self.depots[d]
            .tune
            .as_ref()
            .map_or(self.cfg.conns_per_depot, |t| t.level)
    }

    /// Depot `d`'s connections follow what it does (a download not told
    /// how many), rather than a fixed count.
    pub fn tuned(&self, d: DepotId) -> bool {
        self.depots[d].tune.is_some()
    }

    /// Depot `d` is `rtt` away: the connections its distance adds, once
    /// (see [`super::tune::RTT_PER_CONNECTION`]).
    pub fn at_distance(&mut self, d: DepotId, rtt: Duration) -> Option<std::ops::Range<usize>> {
        let grown = self.depots[d].tune.as_mut()?.at_distance(rtt)?;
        tracing::debug!(depot = %self.names[d], rtt_ms = rtt.as_millis(), to = grown.end, "distant depot: more connections");
        Some(grown)
    }

    /// Depot `d`'s first worker connects ahead (see `fetch::place`): the
    /// others leave its level to it, and wait until it is set.
    pub fn set_connects_ahead(&mut self, d: DepotId, ahead: bool) {
        if let Some(t) = self.depots[d].tune.as_mut() {
            t.ahead = ahead;
        }
    }

    /// Whether depot `d`'s first worker connects ahead.
    pub fn connects_ahead(&self, d: DepotId) -> bool {
        self.depots[d].tune.as_ref().is_some_and(|t| t.ahead)
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Ordered output: how many pieces from the first unwritten one may be
    /// fetched — at most the window `w`; past the pieces already fetched in
    /// order (a player reading slower than the link: its buffer), as many
    /// as hold [`STREAM_HORIZON`] of data at the rate delivered so far (at
    /// least [`STREAM_MIN_AHEAD`] bytes, at least one piece). On a fast
    /// path this is the whole window after the first pieces; on a slow
    /// link the piece the writer needs next is not slowed by many others
    /// sharing the link with it. Pieces fetched past the first one missing
    /// still count: were each replaced as it arrived, the missing one would
    /// share the link with a full horizon to the end. Until the writer
    /// begins, pieces fetched in order count too, so a start-up buffer
    /// fills without the pieces after it sharing the link.
    fn ahead(&self, w: usize, now: Instant) -> usize {
        let secs = now
            .saturating_duration_since(self.t0)
            .as_secs_f64()
            .max(1e-3);
        let rate = self.counters.bytes as f64 / secs;
        let budget = (rate * STREAM_HORIZON.as_secs_f64()).max(STREAM_MIN_AHEAD as f64);
        let rest = &self.pieces[self.written.min(self.pieces.len())..];
        let ready = if self.writing {
            rest.iter().take_while(|p| p.st == St::Done).count()
        } else {
            0
        };
        let mut sum = 0.0;
        let mut n = ready;
        for p in &rest[ready..] {
            if n >= w || (n > ready && sum + p.len as f64 > budget) {
                break;
            }
            sum += p.len as f64;
            n += 1;
        }
        n.clamp(1, w.max(1))
    }

    /// Ordered output: whether the next piece to write has no replica
    /// left, so the writer can go no further.
    pub fn stuck(&self) -> bool {
        self.pieces
            .get(self.written)
            .is_some_and(|s| s.st == St::Done && self.lost.iter().any(|l| l.offset == s.offset))
    }

    /// Ordered output: pieces before `next` are written, so the window moves.
    pub fn written(&mut self, next: usize) {
        self.written = next;
        self.writing = true;
    }

    fn is_last_resort(&self, d: DepotId) -> bool {
        self.depots[d].last_resort || self.depots[d].stalled || self.depots[d].slow
    }

    /// A rebuilder delivered `p` before the depots also fetching it: each
    /// lost a race, and one that loses [`SLOW_AFTER`] in a row (delivering
    /// nothing between) is slow.
    fn beat(&mut self, p: PieceId) {
        let twins: Vec<DepotId> = (self.pieces[p].running_on.iter())
            .map(|&m| self.depot_of[m])
            .filter(|e| !self.cfg.rebuilders.contains(e))
            .collect();
        // At the end every depot may lose a race or two, each hedged as it
        // finishes last; a slow one has also delivered far less.
        let typical = self.typical_bytes();
        for e in twins {
            let dep = &mut self.depots[e];
            dep.beaten += 1;
            let behind = dep.bytes.saturating_mul(SLOW_SHARE) < typical;
            if dep.beaten >= SLOW_AFTER && behind && !dep.slow {
                dep.slow = true;
                self.events.push(Event::Slow { depot: e });
                self.touch_rows_of(e);
            }
        }
    }

    /// A replica of `p` on `d` that has not failed and is not being read.
    fn usable(&self, p: PieceId, d: DepotId) -> Option<usize> {
        let s = &self.pieces[p];
        s.sources
            .iter()
            .copied()
            .find(|m| self.depot_of[*m] == d && !s.failed.contains(m) && !s.running_on.contains(m))
    }

    fn key(&mut self, depots: &[DepotId]) -> KeyId {
        if let Some(&k) = self.key_ids.get(depots) {
            return k;
        }
        let k = self.keys.len();
        self.keys.push(depots.into());
        self.key_ids.insert(depots.into(), k);
        k
    }

    /// Puts a pending piece in the queue of every live depot that can serve
    /// it, grouped by the other depots that can.
    fn enqueue(&mut self, p: PieceId) {
        if self.pieces[p].st != St::Pending {
            return;
        }
        let mut holders = std::mem::take(&mut self.scratch);
        holders.clear();
        let s = &self.pieces[p];
        holders.extend(
            s.sources
                .iter()
                .filter(|m| !s.failed.contains(m))
                .map(|&m| self.depot_of[m])
                .filter(|&d| !self.depots[d].dead),
        );
        holders.sort_unstable();
        holders.dedup();
        let order = s.order;
        let reserved = self.reserved(p);
        for i in 0..holders.len() {
            let d = holders[i];
            if self.usable(p, d).is_none() {
                continue;
            }
            let mut others: Vec<DepotId> = holders.iter().copied().filter(|&e| e != d).collect();
            if reserved {
                others.push(RESERVED);
            }
            let k = self.key(&others);
            let q = &mut self.depots[d].queue;
            q.groups.entry(k).or_default().insert((order, p));
            q.len += 1;
            self.pieces[p].queued.push((d, k));
        }
        self.scratch = holders;
    }

    fn unqueue(&mut self, p: PieceId) {
        let order = self.pieces[p].order;
        for (d, k) in std::mem::take(&mut self.pieces[p].queued) {
            let q = &mut self.depots[d].queue;
            if let Some(g) = q.groups.get_mut(&k) {
                if g.remove(&(order, p)) {
                    q.len -= 1;
                }
                if g.is_empty() {
                    q.groups.remove(&k);
                }
            }
        }
    }

    fn refresh(&mut self, p: PieceId) {
        self.unqueue(p);
        self.enqueue(p);
    }

    /// Whether only a rebuilder will read pending piece `q`: every live
    /// depot holding it is a last resort, one of them a rebuilder.
    fn bound(&self, q: PieceId) -> bool {
        let s = &self.pieces[q];
        let mut rebuilt = false;
        for &m in s.sources.iter().filter(|m| !s.failed.contains(m)) {
            let d = self.depot_of[m];
            if self.depots[d].dead {
                continue;
            }
            if self.cfg.rebuilders.contains(&d) {
                rebuilt = true;
            } else if !self.is_last_resort(d) {
                return false;
            }
        }
        s.st == St::Pending && rebuilt
    }

    /// Whether pending piece `p` is left to a rebuilder: another piece of
    /// its row waits for one, and it does not (a piece only a rebuilder
    /// reads is always its to pick, or two slow depots' pieces in one row
    /// would each wait for the other).
    fn reserved(&self, p: PieceId) -> bool {
        let r = self.row(p);
        self.reserve_rows
            && r != NO_ROW
            && !self.bound(p)
            && (self.rows[r].iter()).any(|&q| q != p && self.row_of[q] == r && self.bound(q))
    }

    /// Row of `p`, or [`NO_ROW`].
    fn row(&self, p: PieceId) -> usize {
        self.row_of.get(p).copied().unwrap_or(NO_ROW)
    }

    /// The pending pieces of row `r` queued again: whether they are left
    /// to a rebuilder may have changed.
    fn touch_row(&mut self, r: usize) {
        if r == NO_ROW {
            return;
        }
        for i in 0..self.rows[r].len() {
            let q = self.rows[r][i];
            if self.row_of[q] == r && self.pieces[q].st == St::Pending {
                self.refresh(q);
            }
        }
    }

    /// The rows of the pieces depot `d` holds queued again: it became (or
    /// stopped being) a last resort.
    ///
    /// A depot that became a last resort leaves its pieces to a rebuilder,
    /// which reads their rows back once the other depots deliver them: the
    /// others fetch those rows first (in file order), so rebuilds run
    /// beside their fetches rather than after them, and the rows that need
    /// no rebuild are what is left at the end.
    fn touch_rows_of(&mut self, d: DepotId) {
        if self.rows.is_empty() {
            return;
        }
        let boost = !self.reserve_rows && self.is_last_resort(d);
        for i in 0..self.depots[d].holds.len() {
            let p = self.depots[d].holds[i];
            let r = self.row(p);
            if boost && r != NO_ROW && self.pieces[p].st != St::Done {
                for j in 0..self.rows[r].len() {
                    let q = self.rows[r][j];
                    if q != p && self.row_of[q] == r && self.pieces[q].st == St::Pending {
                        // Out of the queues under its old order.
                        self.unqueue(q);
                        let first = ROWS_FIRST + i64::try_from(q).unwrap_or(0);
                        self.pieces[q].order = self.pieces[q].order.min(first);
                        self.enqueue(q);
                    }
                }
            }
            self.touch_row(r);
        }
    }

    /// Pending piece `p`, out of the queues, is fetched through `m` from
    /// `now`.
    fn run(&mut self, p: PieceId, m: usize, now: Instant) {
        let s = &mut self.pieces[p];
        s.st = St::Running;
        s.started = now;
        s.running_on.push(m);
        self.running.insert((now, p));
        self.depots[self.depot_of[m]].running += 1;
    }

    /// A rebuilder picked `p` through `m`: the other pending pieces of its
    /// row go with it, each through its own mapping on the same rebuilder.
    fn take_row(&mut self, p: PieceId, m: usize, now: Instant) {
        let r = self.row(p);
        if r == NO_ROW {
            return;
        }
        let d = self.depot_of[m];
        let mut with = Vec::new();
        for i in 0..self.rows[r].len() {
            let q = self.rows[r][i];
            if q == p || self.row_of[q] != r || self.pieces[q].st != St::Pending {
                continue;
            }
            let Some(mq) = self.usable(q, d) else {
                continue;
            };
            self.unqueue(q);
            self.pending -= 1;
            self.run(q, mq, now);
            with.push((q, mq));
        }
        if !with.is_empty() {
            self.taken.insert(p, with);
        }
    }

    /// Back to the queue, ahead of the pieces never tried (in file order for
    /// an ordered output, where the writer waits for the earliest).
    fn requeue(&mut self, p: PieceId) {
        let s = &mut self.pieces[p];
        if s.st == St::Running {
            self.running.remove(&(s.started, p));
        }
        s.st = St::Pending;
        self.pending += 1;
        self.unqueue(p);
        self.pieces[p].order = if self.cfg.window.is_some() {
            i64::try_from(p).unwrap_or(i64::MAX)
        } else {
            self.front -= 1;
            self.front
        };
        self.enqueue(p);
        self.touch_row(self.row(p));
    }

    fn stop_running(&mut self, p: PieceId, m: usize) {
        self.cancelled.remove(&(p, m));
        let r = &mut self.pieces[p].running_on;
        if let Some(i) = r.iter().position(|&x| x == m) {
            r.swap_remove(i);
            self.depots[self.depot_of[m]].running -= 1;
        }
    }

    /// Connections open (or allowed) across the depots still alive.
    ///
    /// A depot whose round trip is not measured yet counts as many as the
    /// farthest measured one: the depots of one file are mostly at the same
    /// distance, and pieces cut for connections still to come are cut
    /// before the first ones take them nearly whole.
    fn live_connections(&self) -> usize {
        let alive = || (0..self.depots.len()).filter(|&d| !self.depots[d].dead);
        let far = alive()
            .filter_map(|d| self.depots[d].tune.as_ref().filter(|t| t.placed()))
            .map(|t| t.level)
            .max()
            .unwrap_or(0);
        let n: usize = alive()
            .map(|d| match &self.depots[d].tune {
                Some(t) if !t.placed() => t.level.max(far),
                _ => self.level(d),
            })
            .sum();
        if self.cfg.threads > 0 {
            n.min(self.cfg.threads)
        } else {
            n
        }
    }

    /// What connection `conn` (0-based) of depot `d` should do next. With
    /// `head_only` (an ordered output's connection without a memory slot)
    /// only the piece the writer waits for may be fetched.
    ///
    /// A connection takes, among the pending pieces its depot holds, the
    /// one whose other holders have the most pending work of their own:
    /// each depot takes what the others are least likely to get to, so no
    /// depot is left at the end with nothing it holds while others still
    /// queue. With nothing pending, an idle depot fetches the oldest
    /// straggler again from its own replica (first copy wins).
    pub fn pick(&mut self, d: DepotId, conn: usize, head_only: bool, now: Instant) -> Pick {
        if self.finished() || self.depots[d].dead {
            return Pick::Exit;
        }
        if self.depots[d]
            .tune
            .as_ref()
            .is_some_and(|t| conn >= t.level)
        {
            return Pick::Wait; // closed after the depot said it is busy
        }
        let limit = match self.cfg.window {
            _ if head_only => self.written + 1,
            Some(w) => self.written + self.ahead(w, now),
            None => usize::MAX,
        };
        match self.ready_pick(d, limit) {
            Ready::Take(p, m, hedge) => return self.rebuild_pick(p, m, hedge, now),
            Ready::Wait => return Pick::Wait,
            Ready::Other => {}
        }
        let last_resort = self.is_last_resort(d);
        let ordered = self.cfg.window.is_some();
        let mut could_later = false;
        let mut best: Option<((f64, Reverse<i64>), PieceId)> = None;
        for (&k, group) in &self.depots[d].queue.groups {
            let Some(&(order, p)) = group.first() else {
                continue;
            };
            let others = &self.keys[k];
            if others.last() == Some(&RESERVED) {
                could_later = true; // once its rebuilder has the row, or not
                continue;
            }
            // A last-resort depot leaves pieces to the others while they can;
            // a slow or stalled one to a rebuilder too (a stalled depot's
            // fetch is not timed again: it would wait for the timeout).
            let rebuilt = |e: &DepotId| self.cfg.rebuilders.contains(e) && !self.depots[*e].dead;
            let lagging = self.depots[d].slow || self.depots[d].stalled;
            if last_resort
                && (others.iter().any(|&e| !self.is_last_resort(e))
                    || (lagging && others.iter().any(rebuilt)))
            {
                could_later = true;
                continue;
            }
            if p >= limit {
                could_later = true;
                continue;
            }
            let load = if ordered {
                0.0 // in file order: the writer waits for the earliest
            } else {
                others
                    .iter()
                    .map(|&e| self.drain(e))
                    .min_by(f64::total_cmp)
                    .unwrap_or(f64::INFINITY)
            };
            let rank = (load, Reverse(order));
            if best.is_none_or(|(b, _)| rank.0 > b.0 || (rank.0 == b.0 && rank.1 > b.1)) {
                best = Some((rank, p));
            }
        }
        if let Some((_, p)) = best {
            let m = self.usable(p, d).expect("queued pieces are usable");
            self.unqueue(p);
            self.pending -= 1;
            let live = self.live_connections();
            if self.cfg.split_tail && self.pending < live {
                self.split(p, self.pending + 1, live, now);
            }
            self.run(p, m, now);
            if self.cfg.rebuilders.contains(&d) {
                self.take_row(p, m, now);
            }
            self.touch_row(self.row(p));
            return Pick::Fetch {
                piece: p,
                mapping: m,
            };
        }
        // Nothing pending here: help with the oldest straggler, once — with
        // this depot's link idle, or when the piece runs far longer than
        // pieces of its size do (see [`STRAGGLER_FACTOR`]); otherwise the
        // copy would only slow the pieces this depot is already sending.
        let (hedge, needed) = self.hedge_for(d, limit, last_resort, now);
        could_later |= needed;
        if let Some((p, m)) = hedge {
            self.pieces[p].running_on.push(m);
            self.depots[d].running += 1;
            self.counters.hedged += 1;
            if self.cfg.rebuilders.contains(&d) {
                self.take_row(p, m, now);
            }
            return Pick::Fetch {
                piece: p,
                mapping: m,
            };
        }
        if could_later || self.depots[d].queue.len > 0 {
            Pick::Wait
        } else {
            Pick::Exit
        }
    }

    /// A rebuilder's pick when the stripe-mates of a piece are read back
    /// from the output (rows, not reserved). Among the pieces it may take
    /// — pending ones only a last resort holds, those running on a slow
    /// depot alone — the one whose row the depots have most of on its way:
    /// its rebuild reads little more than parity, and finishes as soon as
    /// the depots deliver that row. A rebuild whose row is not on its way
    /// reads it itself, slowly, on links the depots keep busy: no more than
    /// [`HEAVY_REBUILDS`] of those at once.
    ///
    /// Once a depot has nothing left to fetch, its link would idle while
    /// others still queue: the rebuilder also takes pending pieces of the
    /// depot with the most left whose row is on its way — one parity read
    /// in place of the piece, from a depot with less to do (see
    /// `Rebuild::sources`). Earlier pieces first at equal cost.
    fn ready_pick(&self, d: DepotId, limit: usize) -> Ready {
        if self.reserve_rows || self.rows.is_empty() || !self.cfg.rebuilders.contains(&d) {
            return Ready::Other;
        }
        let idle = (self.depots.iter().enumerate())
            .any(|(e, x)| x.queue.len == 0 && !x.dead && !self.is_last_resort(e));
        // (pieces of its row to read, most left to its depot, offset)
        type Rank = (usize, Reverse<u64>, u64);
        let mut best: Option<(Rank, Ready)> = None;
        let mut consider = |p: PieceId, m: usize, hedge: bool, backlog: f64, this: &Sched| {
            // Drain estimates as integers, to order by.
            let left = Reverse((backlog * 1e9) as u64);
            let rank = (this.row_wanting(p), left, this.pieces[p].offset);
            if best.as_ref().is_none_or(|(b, _)| rank < *b) {
                best = Some((rank, Ready::Take(p, m, hedge)));
            }
        };
        let busy = |e: &DepotId| !self.is_last_resort(*e);
        for (&k, group) in &self.depots[d].queue.groups {
            let others = &self.keys[k];
            let steal = others.iter().any(busy);
            let backlogged = || {
                (others.iter().filter(|e| busy(e)))
                    .all(|&e| self.depots[e].queue.len >= STEAL_BACKLOG)
            };
            if others.last() == Some(&RESERVED) || (steal && !(idle && backlogged())) {
                continue; // as in pick: left to the depots that hold it
            }
            let backlog = others.iter().map(|&e| self.drain(e)).fold(0.0, f64::max);
            for &(_, p) in group.iter().take(ROW_SCAN) {
                if p < limit && !(steal && self.row_wanting(p) > 0) {
                    let m = self.usable(p, d).expect("queued pieces are usable");
                    consider(p, m, false, backlog, self);
                }
            }
        }
        for &(_, p) in self.running.iter().filter(|_| self.cfg.hedge) {
            let on = &self.pieces[p].running_on;
            let on_slow = on.iter().all(|&x| self.depots[self.depot_of[x]].slow);
            if let Some(m) = self
                .usable(p, d)
                .filter(|_| p < limit && on.len() == 1 && on_slow)
            {
                consider(p, m, true, f64::INFINITY, self);
            }
        }
        match best {
            None => Ready::Other,
            Some(((0, ..), take)) => take,
            Some((_, take)) if self.depots[d].running < HEAVY_REBUILDS => take,
            Some(_) => Ready::Wait,
        }
    }

    /// The pieces of `p`'s row not on their way to the output from a
    /// depot: what a rebuild of `p` would read itself.
    fn row_wanting(&self, p: PieceId) -> usize {
        let r = self.row(p);
        if r == NO_ROW {
            return 0;
        }
        (self.rows[r].iter())
            .filter(|&&q| q != p && self.row_of[q] == r)
            .filter(|&&q| !self.coming(q, (self.pieces[q].offset, self.pieces[q].len)))
            .count()
    }

    /// A rebuilder fetches `p` through `m` (a hedge of a running piece, or
    /// a pending one), taking its row with it.
    fn rebuild_pick(&mut self, p: PieceId, m: usize, hedge: bool, now: Instant) -> Pick {
        if hedge {
            self.pieces[p].running_on.push(m);
            self.depots[self.depot_of[m]].running += 1;
            self.counters.hedged += 1;
        } else {
            self.unqueue(p);
            self.pending -= 1;
            self.run(p, m, now);
        }
        self.take_row(p, m, now);
        self.touch_row(self.row(p));
        Pick::Fetch {
            piece: p,
            mapping: m,
        }
    }

    /// A piece in flight elsewhere that depot `d` should fetch again, if
    /// any, and whether `d` may yet be needed for one.
    fn hedge_for(
        &self,
        d: DepotId,
        limit: usize,
        last_resort: bool,
        now: Instant,
    ) -> (Option<(PieceId, usize)>, bool) {
        let idle_here = self.depots[d].running == 0;
        let rebuilds = self.cfg.rebuilders.contains(&d);
        let mut needed = false;
        for &(_, p) in &self.running {
            let Some(m) = self.usable(p, d) else {
                continue;
            };
            // Beyond the window or not, this depot may yet be needed for
            // it: a stall can move it back to the queue.
            needed = true;
            if p >= limit || (last_resort && !rebuilds) {
                continue; // a stalled depot does not hedge
            }
            let on = &self.pieces[p].running_on;
            let straggles = self.straggles_since(p).is_some_and(|t| t <= now);
            // A rebuild reads its pieces from these very depots (and takes
            // seconds, reading k of them): one reading a piece again, idle
            // or seeing it straggle, only doubles that read.
            let rebuilding = (on.iter()).any(|&x| self.cfg.rebuilders.contains(&self.depot_of[x]));
            // A rebuilder hedges a slow depot's pieces, at once, and no
            // others: rebuilding a piece reads k others, a heavy price for
            // a straggler on a link that is merely busy.
            let on_slow = on.iter().all(|&x| self.depots[self.depot_of[x]].slow);
            let worth = if rebuilds {
                on_slow
            } else {
                !rebuilding && (straggles || (idle_here && !last_resort))
            };
            if self.cfg.hedge && on.len() == 1 && worth {
                return (Some((p, m)), true);
            }
        }
        (None, needed)
    }

    /// When running piece `p` becomes a straggler, if the typical fetch
    /// time is known and nobody has fetched it twice yet.
    fn straggles_since(&self, p: PieceId) -> Option<Instant> {
        let s = &self.pieces[p];
        if s.st != St::Running
            || s.running_on.len() != 1
            || self.fetch_time.samples() < STRAGGLER_SAMPLES
        {
            return None;
        }
        let expected = Duration::from_secs_f64(self.fetch_time.per_unit() * s.len as f64);
        Some(s.started + expected.mul_f64(STRAGGLER_FACTOR).max(STRAGGLER_MIN))
    }

    /// How long depot `d` needs for the pieces queued for it, in units
    /// common to all depots: its queue over what it delivered so far (with
    /// a prior, so depots weigh by queue alone until they have delivered).
    fn drain(&self, d: DepotId) -> f64 {
        let depot = &self.depots[d];
        depot.queue.len as f64 / (depot.bytes as f64 + DRAIN_PRIOR)
    }

    /// End game: with fewer pieces left (`left`, this one counted) than
    /// connections (`live`), the piece being taken is cut — in two, or to
    /// its share of what is left when that is less — and the rest goes
    /// back to the front of the queue. Otherwise the connections that
    /// finish first sit idle while the last ones each send a whole piece,
    /// at their share of their depot's link; cutting shrinks that tail to a
    /// fraction of a piece. The share matters far away: a depot whose
    /// distance earned it many connections (see [`super::tune`]), each
    /// slow, would otherwise see its first pieces taken nearly whole.
    fn split(&mut self, p: PieceId, left: usize, live: usize, now: Instant) {
        let s = &self.pieces[p];
        let share = u64::try_from(u128::from(s.len) * left as u128 / live.max(1) as u128)
            .unwrap_or(u64::MAX);
        // Cuts on 64 KiB boundaries keep writes page-aligned.
        let far = self.depots.iter().any(|d| {
            d.tune
                .as_ref()
                .is_some_and(|t| t.level > super::AUTO_CONNECTIONS)
        });
        let floor = if far {
            TAIL_PIECE_MIN_FAR
        } else {
            TAIL_PIECE_MIN
        };
        let half = (s.len / 2).min(share.max(floor)) & !((64 << 10) - 1);
        if half < floor || s.len - half < floor {
            return;
        }
        // A piece of a row stays whole: cut, it would no longer line up
        // with the rest of its row, and the rebuild of one piece would
        // read theirs again rather than deliver them.
        if self.row(p) != NO_ROW {
            return;
        }
        let s = &self.pieces[p];
        self.front -= 1;
        let rest = Piece {
            offset: s.offset + half,
            len: s.len - half,
            sources: s.sources.clone(),
            failed: s.failed.clone(),
            running_on: Vec::new(),
            started: now,
            st: St::Pending,
            busy: 0,
            order: self.front,
            queued: Vec::new(),
        };
        self.pieces[p].len = half;
        self.add(rest);
    }

    /// A read of `p` from mapping `m` failed (or returned corrupted bytes):
    /// that replica is bad for the piece. A depot that cannot be reached
    /// (`unreachable`) is dead for the whole download: every piece it holds
    /// moves on to other replicas at once. A piece with no replica left is
    /// lost.
    pub fn failed(&mut self, p: PieceId, m: usize, why: impl Into<Cause>, unreachable: bool) {
        let d = self.depot_of[m];
        let mut why = why.into();
        if why.depot.is_none() {
            why.depot = Some(self.names[d].clone());
        }
        let why = &why;
        self.counters.retries += 1;
        self.stop_running(p, m);
        let newly_dead = unreachable && !self.depots[d].dead;
        if newly_dead {
            self.depots[d].dead = true;
            self.events.push(Event::Unreachable {
                depot: d,
                why: why.text.clone(),
            });
            for q in std::mem::take(&mut self.depots[d].holds) {
                let on_d: Vec<usize> = (self.pieces[q].sources.iter().copied())
                    .filter(|&x| self.depot_of[x] == d)
                    .collect();
                for x in on_d {
                    self.mark_failed(q, x, why, q == p);
                }
            }
        } else {
            self.mark_failed(p, m, why, true);
            if !unreachable {
                self.events.push(Event::ReadFailed {
                    depot: d,
                    why: why.text.clone(),
                });
            }
        }
    }

    /// The depot of mapping `m` refused a read of `p` as past the end of
    /// the allocation: the mapping holds less than the exNode claims, so it
    /// fails at once for every piece from `p` on, not a read at a time (a
    /// 1 TiB claim on a 1 MiB allocation is one refusal, not a million).
    pub fn ends_early(&mut self, p: PieceId, m: usize, why: impl Into<Cause>) {
        let why = &why.into();
        let from = self.pieces[p].offset;
        self.failed(p, m, why.clone(), false);
        let d = self.depot_of[m];
        let later: Vec<PieceId> = (self.depots[d].holds.iter().copied())
            .filter(|&q| q != p && self.pieces[q].offset >= from)
            .filter(|&q| self.pieces[q].st != St::Done && self.pieces[q].sources.contains(&m))
            .collect();
        for q in later {
            self.mark_failed(q, m, why, false);
        }
    }

    fn mark_failed(&mut self, p: PieceId, m: usize, why: &Cause, this_read: bool) {
        let s = &mut self.pieces[p];
        if s.failed.contains(&m) {
            if !this_read {
                return;
            }
        } else {
            s.failed.push(m);
        }
        if s.st == St::Running && s.running_on.is_empty() {
            self.requeue(p);
        }
        let s = &self.pieces[p];
        if s.st == St::Pending && s.sources.iter().all(|x| s.failed.contains(x)) {
            self.unqueue(p);
            self.pieces[p].st = St::Done; // settled: nobody will fetch it
            self.pending -= 1;
            let s = &self.pieces[p];
            self.lost.push(Lost {
                offset: s.offset,
                end: s.offset + s.len,
                why: why.clone(),
            });
        } else {
            self.refresh(p);
        }
        self.touch_row(self.row(p));
    }

    /// A read of `p` from mapping `m` was cut off by the network: the
    /// connection reset or closed mid-reply, or the depot refused the
    /// connect (`unreachable`). Where another replica can serve the piece
    /// (or it is rebuilt from parity), as [`Sched::failed`]. Where this
    /// replica is its only one, the piece goes back to the queue without
    /// blaming it, for [`CUT_GRACE`] from the depot's first cut since it
    /// last delivered: a depot that restarts, or drops connections over
    /// its per-client cap, serves the next try, and a single-copy file is
    /// not lost to one reset. Returns the pause to make before asking
    /// again; `None` when the read failed for good.
    pub fn cut(
        &mut self,
        p: PieceId,
        m: usize,
        why: impl Into<Cause>,
        unreachable: bool,
        now: Instant,
    ) -> Option<Duration> {
        let d = self.depot_of[m];
        let s = &self.pieces[p];
        let alone = self.row(p) == NO_ROW
            && (s.sources.iter())
                .all(|&x| x == m || s.failed.contains(&x) || self.depots[self.depot_of[x]].dead);
        let since = *self.depots[d].cut_since.get_or_insert(now);
        if !alone || self.depots[d].dead || now.duration_since(since) >= CUT_GRACE {
            self.failed(p, m, why, unreachable);
            return None;
        }
        let mut why = why.into();
        if why.depot.is_none() {
            why.depot = Some(self.names[d].clone());
        }
        self.events.push(Event::Cut {
            depot: d,
            why: why.text,
        });
        self.ask_again(p, m);
        Some(CUT_PAUSE)
    }

    /// The read of `p` from `m` ended without blaming the replica: the
    /// piece goes back to the queue (unless a hedged twin still runs).
    fn ask_again(&mut self, p: PieceId, m: usize) {
        self.counters.retries += 1;
        self.stop_running(p, m);
        let s = &self.pieces[p];
        if s.st == St::Running && s.running_on.is_empty() {
            self.requeue(p);
        } else {
            self.refresh(p);
        }
    }

    /// The depot of mapping `m` said it is busy: the piece goes back to the
    /// queue without blaming the replica, and a depot not given a fixed
    /// count gets fewer connections. Once a piece has met [`BUSY_MAX`] busy
    /// replies, the replica that gave the last counts as failed for it.
    /// Returns whether the caller should pause before asking again.
    pub fn busy(&mut self, p: PieceId, m: usize, why: impl Into<Cause>, now: Instant) -> bool {
        let d = self.depot_of[m];
        if let Some(t) = &mut self.depots[d].tune {
            t.back_off(now);
            tracing::debug!(depot = %self.names[d], to = t.level, "busy depot: fewer connections");
        }
        self.pieces[p].busy += 1;
        if self.pieces[p].busy > BUSY_MAX {
            self.failed(p, m, why, false);
            return false;
        }
        self.ask_again(p, m);
        true
    }

    /// Piece `p` arrived whole from mapping `m`. False if another replica
    /// already delivered it (the caller drops these bytes).
    pub fn claim(&mut self, p: PieceId, m: usize, now: Instant) -> bool {
        let d = self.depot_of[m];
        self.depots[d].delivered = Some(now);
        self.depots[d].cut_since = None;
        // Races lost count in a row: a depot that delivers is not slow.
        if self.pieces[p].st != St::Done {
            self.depots[d].beaten = 0;
        }
        if self.depots[d].stalled {
            self.depots[d].stalled = false;
            self.events.push(Event::Recovered { depot: d });
            self.touch_rows_of(d);
        }
        // Only a piece's sole fetch times the typical fetch: a hedged copy
        // started later than the piece did.
        let sole = self.pieces[p].running_on == [m];
        self.stop_running(p, m);
        let (st, started, len) = (
            self.pieces[p].st,
            self.pieces[p].started,
            self.pieces[p].len,
        );
        match st {
            St::Done => return false,
            St::Running => {
                self.running.remove(&(started, p));
                if self.cfg.rebuilders.contains(&d) {
                    self.beat(p);
                }
                // A rebuilt piece's time is that of a stripe's reads and a
                // decode, not of a depot's read.
                if sole && len > 0 && !self.cfg.rebuilders.contains(&d) {
                    let took = now.saturating_duration_since(started);
                    self.fetch_time.record_per(took, len);
                }
            }
            // Moved off a stalled depot, which then delivered it after all.
            St::Pending => {
                self.unqueue(p);
                self.pending -= 1;
                self.pieces[p].st = St::Done;
                self.touch_row(self.row(p));
            }
        }
        self.pieces[p].st = St::Done;
        for &twin in &self.pieces[p].running_on {
            self.cancelled.insert((p, twin));
        }
        self.done += 1;
        self.counters.bytes += len;
        self.depots[d].bytes += len;
        if !self.cfg.rebuilders.is_empty() && !self.cfg.rebuilders.contains(&d) {
            self.claimed_len = len;
            self.judge_slow(len, now);
        }
        true
    }

    /// Marks slow each depot with fetches in flight that has delivered
    /// less than a [`SLOW_SHARE`]th of the typical depot, once that is at
    /// least [`SLOW_EVIDENCE`] pieces of `len`, and whose oldest piece in
    /// flight straggles ([`STRAGGLER_FACTOR`] times what pieces of its
    /// size take here, and [`STRAGGLER_MIN`]): a link a tenth of the others' speed shows within a
    /// few pieces. Without the straggling, a depot merely unlucky in
    /// which of its pieces finished first — on a busy machine many take
    /// about as long, and a depot's first few arrive together — had its
    /// pieces rebuilt at k reads and a decode each.
    fn judge_slow(&mut self, len: u64, now: Instant) {
        let typical = self.typical_bytes();
        if typical < len.saturating_mul(SLOW_EVIDENCE) {
            return;
        }
        for e in 0..self.depots.len() {
            let dep = &self.depots[e];
            if dep.slow || dep.dead || dep.running == 0 || self.cfg.rebuilders.contains(&e) {
                continue;
            }
            let oldest = (self.running.iter()).find(|&&(_, p)| {
                (self.pieces[p].running_on.iter()).any(|&m| self.depot_of[m] == e)
            });
            let straggles = oldest.is_some_and(|&(since, p)| {
                let expected =
                    Duration::from_secs_f64(self.fetch_time.per_unit() * self.pieces[p].len as f64);
                now.saturating_duration_since(since)
                    >= expected.mul_f64(STRAGGLER_FACTOR).max(STRAGGLER_MIN)
            });
            if straggles && dep.bytes.saturating_mul(SLOW_SHARE) < typical {
                self.depots[e].slow = true;
                self.events.push(Event::Slow { depot: e });
                self.touch_rows_of(e);
            }
        }
    }

    /// Bytes the median live depot (not a rebuilder) has delivered.
    fn typical_bytes(&self) -> u64 {
        let mut delivered: Vec<u64> = (0..self.depots.len())
            .filter(|e| !self.cfg.rebuilders.contains(e) && !self.depots[*e].dead)
            .map(|e| self.depots[e].bytes)
            .collect();
        delivered.sort_unstable();
        delivered.get(delivered.len() / 2).copied().unwrap_or(0)
    }

    /// Marks as stalled every depot that has delivered nothing for the
    /// stall time while another delivered (or sat idle, able to serve one of
    /// its pieces), and moves its pieces in flight
    /// that have another live replica back to the queue; and, with a
    /// rebuilder, marks slow a depot whose piece now straggles far behind
    /// the others' deliveries (see `judge_slow`).
    pub fn check_stalls(&mut self, now: Instant) {
        // A slow depot's piece straggles between deliveries too.
        if !self.cfg.rebuilders.is_empty() && self.claimed_len > 0 {
            self.judge_slow(self.claimed_len, now);
        }
        if self.cfg.stall.is_zero() {
            return;
        }
        for d in 0..self.depots.len() {
            let Some(since) = self.silent_since(d) else {
                continue;
            };
            let others_flow = (self.depots.iter().enumerate())
                .any(|(e, x)| e != d && x.delivered.is_some_and(|t| t > since));
            // Or another depot that could serve one of its pieces sits idle:
            // an ordered output's window can hold nothing but this depot's
            // pieces, and then nobody else delivers to compare with.
            let others_wait = (self.running.iter().map(|&(_, p)| &self.pieces[p]))
                .filter(|s| s.running_on.iter().all(|&m| self.depot_of[m] == d))
                .flat_map(|s| s.sources.iter().filter(|m| !s.failed.contains(m)))
                .map(|&m| self.depot_of[m])
                .any(|e| {
                    let x = &self.depots[e];
                    e != d && !x.dead && !x.stalled && x.running == 0
                });
            if now.saturating_duration_since(since) < self.stall_after(d)
                || !(others_flow || others_wait)
            {
                continue;
            }
            self.depots[d].stalled = true;
            self.touch_rows_of(d);
            let victims: Vec<PieceId> = (self.running.iter().map(|&(_, p)| p))
                .filter(|&p| {
                    let s = &self.pieces[p];
                    let only_here = s.running_on.iter().all(|&m| self.depot_of[m] == d);
                    let elsewhere = s.sources.iter().any(|&m| {
                        let e = self.depot_of[m];
                        e != d
                            && !s.failed.contains(&m)
                            && !self.depots[e].dead
                            && !self.depots[e].stalled
                    });
                    only_here && elsewhere
                })
                .collect();
            let moved = victims.len();
            for p in victims {
                for &m in &self.pieces[p].running_on {
                    self.cancelled.insert((p, m));
                }
                self.requeue(p);
            }
            self.events.push(Event::Stalled {
                depot: d,
                silent: now.saturating_duration_since(since),
                moved,
            });
        }
    }

    /// How long depot `d` may send nothing before it is stalled: the
    /// configured stall, or sooner once the typical fetch time is known
    /// ([`crate::stall::scaled`] for the depot's oldest piece in flight).
    pub fn stall_after(&self, d: DepotId) -> Duration {
        let cap = self.cfg.stall;
        // One timed piece is enough: the floor guards against its noise.
        if !self.fetch_time.known() {
            return cap;
        }
        let oldest = (self.running.iter())
            .find(|&&(_, p)| (self.pieces[p].running_on.iter()).any(|&m| self.depot_of[m] == d));
        match oldest {
            Some(&(_, p)) => {
                crate::stall::scaled(self.fetch_time.per_unit() * self.pieces[p].len as f64, cap)
            }
            None => cap,
        }
    }

    /// Whether the fetch of piece `p` through mapping `m` is no longer
    /// needed; its worker then stops it and reports [`Sched::abandon`].
    pub fn is_cancelled(&self, p: PieceId, m: usize) -> bool {
        self.cancelled.contains(&(p, m))
    }

    /// A cancelled fetch stopped: its connection is free, its replica not
    /// blamed (the piece has moved on or is delivered).
    pub fn abandon(&mut self, p: PieceId, m: usize) {
        self.stop_running(p, m);
        let s = &self.pieces[p];
        if s.st == St::Running && s.running_on.is_empty() {
            self.requeue(p);
        }
    }

    /// Since when a live, unstalled depot with fetches in flight has been
    /// silent: its last delivery, or the start of its oldest fetch if later.
    fn silent_since(&self, d: DepotId) -> Option<Instant> {
        let depot = &self.depots[d];
        // A rebuilder's fetch is k reads and a decode, each read bounded by
        // the client's own timeouts; timed as one depot's read, it would
        // stall, and its reads be thrown away and begun again.
        if depot.dead || depot.stalled || depot.running == 0 || self.cfg.rebuilders.contains(&d) {
            return None;
        }
        // Running is ordered by start: the first on this depot is the oldest.
        let oldest = (self.running.iter())
            .find(|&&(_, p)| {
                let on = &self.pieces[p].running_on;
                on.iter().any(|&m| self.depot_of[m] == d)
            })
            .map(|&(t, _)| t)?;
        Some(depot.delivered.unwrap_or(self.t0).max(oldest))
    }

    /// When [`Sched::check_stalls`] may next find a stall, or a piece in
    /// flight becomes a straggler an idle connection may fetch again,
    /// without anything else happening first; `None` when only a delivery
    /// could change anything. The caller checks stalls and lets idle
    /// connections pick again then.
    pub fn next_check(&self, now: Instant) -> Option<Instant> {
        let stall = (!self.cfg.stall.is_zero()).then(|| {
            (0..self.depots.len())
                .filter_map(|d| self.silent_since(d).map(|t| t + self.stall_after(d)))
        });
        let straggle = self.cfg.hedge.then(|| {
            self.running
                .iter()
                .filter_map(|&(_, p)| self.straggles_since(p))
        });
        (stall.into_iter().flatten())
            .chain(straggle.into_iter().flatten())
            .filter(|&t| t > now)
            .min()
    }
}

#[cfg(test)]
mod tests;
