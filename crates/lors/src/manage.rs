//! Operations on an existing exNode: augment (more replicas, copied depot to
//! depot), trim (drop mappings, optionally releasing their allocations),
//! refresh (extend leases), modify (strip capabilities for sharing), route
//! (augment onto target depots, then trim the rest), and probing for stat.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use lors_exnode::{ExNode, Mapping};
use lors_ibp::proto::Reliability;
use lors_ibp::{Capability, Connection, ProbeInfo};

use crate::error::{Cause, Error, Result};
use crate::pool::Pool;
use crate::progress::{Event, NoProgress, Progress};

/// Blocks of an exNode: each distinct logical range with the indices of the
/// mappings (replicas) that hold it.
pub fn blocks(x: &ExNode) -> BTreeMap<(u64, u64), Vec<usize>> {
    let mut b: BTreeMap<(u64, u64), Vec<usize>> = BTreeMap::new();
    for (i, m) in x.mappings.iter().enumerate() {
        b.entry((m.exnode_offset, m.logical_length))
            .or_default()
            .push(i);
    }
    b
}

/// The exNode metadata item recording how many replicas of each block the
/// file keeps: set by upload, kept by writes through xio and the mount.
pub const COPIES_META: &str = "lors_copies";

/// How many replicas of each block the file keeps: its recorded policy
/// ([`COPIES_META`]), else — an exNode from before it was recorded, or from
/// another tool — the most any of its blocks has on distinct depots. `None`
/// for an exNode with neither.
pub fn copies_policy(x: &ExNode) -> Option<usize> {
    if let Some(lors_exnode::model::Value::Integer(n)) = x.meta(COPIES_META) {
        return usize::try_from(*n).ok().filter(|&n| n >= 1);
    }
    (blocks(x).values())
        .map(|idx| {
            let on: HashSet<String> = idx.iter().filter_map(|&i| x.mappings[i].depot()).collect();
            on.len()
        })
        .max()
        .filter(|&n| n >= 1)
}

/// How many replicas [`replicate`] makes of each block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicas {
    /// This many more (augment).
    More(usize),
    /// Enough that this many are on the given depots, counting those
    /// already there (route).
    OnTargets(usize),
}

/// Adds `copies` replicas of every block on `depots`, each on a depot that
/// does not hold that block yet, copied depot-to-depot from an existing
/// replica. New mappings are appended; the input exNode is not changed.
pub async fn augment(
    x: &ExNode,
    depots: &[String],
    copies: usize,
    opts: &CopyOptions,
    pool: &Arc<Pool>,
    progress: &dyn Progress,
) -> Result<ExNode> {
    let want = Replicas::More(copies);
    replicate(x, depots, want, opts, pool, progress).await
}

/// How [`replicate`] makes its copies.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// Lease of the new allocations.
    pub duration: Duration,
    /// Hard or soft storage.
    pub reliability: Reliability,
    /// Turns `true` when the copying should stop (an interrupt): copies in
    /// flight finish, none is begun, the replicas made are released and
    /// the run ends with [`Error::Interrupted`].
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
}

/// Copies blocks depot-to-depot onto `depots` as `want` says, each new
/// replica on a depot that does not hold that block yet; `progress` counts
/// the bytes copied per pair of depots (`SOURCE → TARGET`). Blocks are
/// copied several at a time as [`crate::burst`] pairs them, every source
/// and every target depot busy at once with its share (a hung depot's
/// copy is never the only one in flight, so the others' pace shows it up:
/// [`crate::stall`]); a target that cannot be reached or stops answering
/// (stalled while the others answer) is skipped from then on. New mappings
/// are appended in block order; the input exNode is not changed. An
/// erasure-coded file's blocks (parity too) are copied once each, never
/// two of a stripe onto one depot (`want` must be `OnTargets(1)`). When it
/// fails, the replicas it made are released (each release bounded by
/// [`crate::stall::RELEASE_WAIT`]).
pub async fn replicate(
    x: &ExNode,
    depots: &[String],
    want: Replicas,
    opts: &CopyOptions,
    pool: &Arc<Pool>,
    progress: &dyn Progress,
) -> Result<ExNode> {
    let (duration, reliability) = (opts.duration, opts.reliability);
    if depots.is_empty() {
        return Err(Error::NoDepots);
    }
    let mut load: Vec<(String, usize)> = Vec::new();
    for d in depots {
        if !load.iter().any(|(e, _)| e == d) {
            load.push((d.clone(), 0));
        }
    }
    let (plan, stripes) = plan(x, depots, want)?;
    progress.start(Some(plan.iter().map(|b| b.range.1 * b.copies as u64).sum()));
    let holders: Vec<Vec<String>> = (plan.iter())
        .map(|b| {
            let mut on: Vec<String> = (b.idx.iter())
                .filter_map(|&i| x.allocation(i))
                .filter(|m| m.read.is_some())
                .filter_map(Mapping::depot)
                .collect();
            on.dedup();
            on
        })
        .collect();
    let sources: HashSet<&String> = holders.iter().flatten().collect();
    // The client's round trips to the depots stand for theirs to each
    // other, which it cannot measure.
    let ends: Vec<String> = sources
        .iter()
        .map(|s| (*s).clone())
        .chain(depots.iter().cloned())
        .collect();
    let rtt = (pool
        .round_trips(&ends, crate::pool::MEASURE_WAIT)
        .await
        .into_iter()
        .max())
    .unwrap_or_default();
    let in_flight = crate::burst::in_flight_at(sources.len(), load.len(), rtt);
    let run = Replication {
        x,
        pool,
        progress,
        duration,
        reliability,
        watch: {
            let w = crate::stall::Watcher::new(pool.config().io_timeout, pool.config());
            w.know(depots);
            w
        },
        state: std::sync::Mutex::new(RepState {
            load,
            dead: HashSet::new(),
            stripes,
            made: Vec::new(),
            failure: None,
        }),
        links: std::sync::Mutex::new(crate::burst::Links::new(&holders)),
        blocks: std::sync::Mutex::new(plan.into_iter().map(Some).collect()),
        stop: opts.stop.clone(),
    };
    let workers = (0..in_flight).map(|_| run.worker()).collect();
    join_all(workers).await;
    let stopped = run.stopped();
    let st = run.state.into_inner().unwrap_or_else(|e| e.into_inner());
    let made = st.made;
    // A route told to stop keeps the copies it completed, named in the
    // exNode it returns: a rerun counts them on the targets and copies
    // only what is missing.
    if stopped && st.failure.is_none() && matches!(want, Replicas::OnTargets(_)) && !made.is_empty()
    {
        return Err(Error::Interrupted {
            stored: Box::new(with_copies(x, made)),
            released: 0,
            stranded: ExNode::default(),
        });
    }
    if stopped || st.failure.is_some() {
        // The replicas made so far are in no exNode the caller keeps:
        // free them rather than leave them to their lease.
        let all: Vec<Mapping> = made.into_iter().map(|(_, m)| m).collect();
        let total = all.len();
        let kept = pool.release_all(all).await;
        if stopped {
            return Err(Error::stopped(total, kept));
        }
        return Err(st.failure.expect("checked above"));
    }
    Ok(with_copies(x, made))
}

/// `x` with the copies `made` (each with its block's place) appended.
fn with_copies(x: &ExNode, mut made: Vec<(usize, Mapping)>) -> ExNode {
    made.sort_by_key(|(order, _)| *order);
    let mut out = x.clone();
    for (order, m) in made {
        match order >= x.mappings.len() {
            // A parity block's copy stays in the parity list.
            true => out.parity.push(m),
            false => out.mappings.push(m),
        }
    }
    out.parity.sort_by_key(Mapping::shard);
    out
}

/// The depots holding a block of each stripe of an erasure-coded file.
type Stripes = HashMap<u64, HashSet<String>>;

/// What [`replicate`] copies: each block (each block of each stripe, for
/// an erasure-coded file) with the copies `want` still asks of it; and
/// for a coded file, the depots holding a block of each stripe.
fn plan(x: &ExNode, depots: &[String], want: Replicas) -> Result<(Vec<Block>, Stripes)> {
    let copies = |holders: &HashSet<String>| match want {
        Replicas::More(n) => n,
        Replicas::OnTargets(n) => {
            n.saturating_sub(holders.iter().filter(|d| depots.contains(*d)).count())
        }
    };
    let Some(e) = lors_exnode::erasure::Erasure::of(x)? else {
        let plan = (blocks(x).into_iter())
            .map(|(range, idx)| {
                let holders: HashSet<String> =
                    idx.iter().filter_map(|&i| x.mappings[i].depot()).collect();
                let copies = copies(&holders);
                Block {
                    order: 0,
                    range,
                    idx,
                    holders,
                    copies,
                    stripe: None,
                }
            })
            .enumerate()
            .map(|(order, b)| Block { order, ..b })
            .filter(|b| b.copies > 0)
            .collect();
        return Ok((plan, Stripes::new()));
    };
    // A coded file keeps each block once, never two of a stripe on one
    // depot: more copies of its blocks would not add what its parity does.
    if want != Replicas::OnTargets(1) {
        return Err(Error::Erasure(lors_exnode::erasure::ErasureError::Record(
            "an erasure-coded file keeps one copy of each block: it is moved (route, one copy per block) or repaired (augment --repair), not given more copies".into(),
        )));
    }
    let data = x.mappings.len();
    let mut shards: BTreeMap<(u64, usize), Vec<usize>> = BTreeMap::new();
    let mut stripes = Stripes::new();
    for (at, m) in x.allocations().enumerate() {
        if let Some((s, i)) = e.shard_of(m, at >= data) {
            shards.entry((s, i)).or_default().push(at);
            let held = stripes.entry(s).or_default();
            held.extend(m.depot());
        }
    }
    let plan = (shards.into_iter())
        .filter_map(|((s, _), idx)| {
            let holders: HashSet<String> = (idx.iter())
                .filter_map(|&i| x.allocation(i)?.depot())
                .collect();
            let first = x.allocation(idx[0])?;
            Some(Block {
                // Parity copies are ordered after every data block.
                order: idx[0],
                range: (first.exnode_offset, first.logical_length),
                copies: copies(&holders),
                idx,
                holders,
                stripe: Some(s),
            })
        })
        .filter(|b| b.copies > 0)
        .collect();
    Ok((plan, stripes))
}

/// One block of a [`replicate`] run.
struct Block {
    /// Its place among the file's blocks: new mappings are appended in it.
    order: usize,
    range: (u64, u64),
    /// Its replicas in the exNode.
    idx: Vec<usize>,
    /// Depots holding it.
    holders: HashSet<String>,
    /// Copies still to make.
    copies: usize,
    /// The stripe of an erasure-coded file's block: no two of its blocks
    /// on one depot.
    stripe: Option<u64>,
}

struct RepState {
    /// Copies placed (or being placed) per target depot, in the order the
    /// depots were given (a directory's ranking): ties go to the first.
    load: Vec<(String, usize)>,
    /// Targets given up on: unreachable, or stalled.
    dead: HashSet<String>,
    /// An erasure-coded file's stripes: the depots holding (or taking) a
    /// block of each.
    stripes: HashMap<u64, HashSet<String>>,
    made: Vec<(usize, Mapping)>,
    failure: Option<Error>,
}

/// A [`replicate`] run, shared by its workers.
struct Replication<'a> {
    x: &'a ExNode,
    pool: &'a Arc<Pool>,
    progress: &'a dyn Progress,
    duration: Duration,
    reliability: Reliability,
    watch: crate::stall::Watcher,
    state: std::sync::Mutex<RepState>,
    /// Which block goes next, from which source, to which target.
    links: std::sync::Mutex<crate::burst::Links>,
    /// The blocks to copy, each taken out when its turn comes.
    blocks: std::sync::Mutex<Vec<Option<Block>>>,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Replication<'_> {
    fn lock(&self) -> std::sync::MutexGuard<'_, RepState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stopped(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| *s.borrow())
    }

    fn links(&self) -> std::sync::MutexGuard<'_, crate::burst::Links> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies blocks as [`crate::burst::Links`] hands them out until none
    /// is left, a block fails or the run is told to stop (the copy in
    /// flight finishes first).
    async fn worker(&self) {
        loop {
            if self.lock().failure.is_some() || self.stopped() {
                return;
            }
            let Some((i, src)) = self.links().next_copy() else {
                return;
            };
            let taken = self.blocks.lock().unwrap_or_else(|e| e.into_inner())[i].take();
            let Some(mut b) = taken else {
                self.links().sent(&src);
                continue;
            };
            let mut failed = None;
            while b.copies > 0 && !self.stopped() {
                if let Err(e) = self.copy_once(&mut b, &src).await {
                    failed = Some(e);
                    break;
                }
                b.copies -= 1;
            }
            self.links().sent(&src);
            if let Some(e) = failed {
                self.lock().failure.get_or_insert(e);
                return;
            }
        }
    }

    /// One more replica of block `b`, on the live target that does not
    /// hold it receiving the fewest (then holding the fewest), from its
    /// replica on `src` first, else any other.
    async fn copy_once(&self, b: &mut Block, src: &str) -> Result<()> {
        let (offset, len) = b.range;
        let mut sources: Vec<&Mapping> = (b.idx.iter().filter_map(|&i| self.x.allocation(i)))
            .filter(|m| m.read.is_some())
            .collect();
        sources.sort_by_key(|m| m.depot().as_deref() != Some(src));
        if sources.is_empty() {
            return Err(Error::Unreadable {
                offset,
                end: offset + len,
                last: "no replica has a read capability".into(),
            });
        }
        let mut last = Cause::local(match b.stripe {
            None => "no depot left that does not already hold this block",
            Some(_) => "no depot left that holds no block of this stripe: give more depots",
        });
        let mut tried: HashSet<String> = HashSet::new();
        loop {
            let target = {
                let mut st = self.lock();
                let st = &mut *st;
                let stripe = b.stripe.and_then(|s| st.stripes.get_mut(&s));
                let mut fit: Vec<(usize, &(String, usize))> = (st.load.iter())
                    .enumerate()
                    .filter(|(_, (d, _))| {
                        !b.holders.contains(d)
                            && !st.dead.contains(d)
                            && !tried.contains(d)
                            && !stripe.as_ref().is_some_and(|h| h.contains(d))
                    })
                    .collect();
                fit.sort_by_key(|(_, (_, n))| *n);
                let chosen = self
                    .links()
                    .target(fit.iter().map(|(_, (d, _))| d.as_str()));
                let t =
                    chosen.and_then(|c| fit.iter().find(|(_, (d, _))| *d == c).map(|(i, _)| *i));
                t.map(|i| {
                    st.load[i].1 += 1;
                    if let Some(h) = stripe {
                        h.insert(st.load[i].0.clone());
                    }
                    st.load[i].0.clone()
                })
            };
            let Some(t) = target else {
                return Err(Error::Store { offset, last });
            };
            tried.insert(t.clone());
            let copied = self.copy_to(&t, b, &sources).await;
            self.links().received(&t);
            match copied {
                Ok((m, from)) => {
                    b.holders.insert(t.clone());
                    let pair = format!("{} → {t}", from.unwrap_or_default());
                    self.progress.advance(&pair, len);
                    self.lock().made.push((b.order, m));
                    return Ok(());
                }
                Err((e, target_down)) => {
                    let mut st = self.lock();
                    if let Some(l) = st.load.iter_mut().find(|(d, _)| *d == t) {
                        l.1 -= 1;
                    }
                    if let Some(h) = b.stripe.and_then(|s| st.stripes.get_mut(&s)) {
                        h.remove(&t);
                    }
                    last = Cause::from(&e);
                    if target_down && st.dead.insert(t.clone()) {
                        drop(st);
                        self.progress.event(&Event::Failover {
                            depot: t.clone(),
                            why: last.text.clone(),
                        });
                    } else {
                        drop(st);
                        self.progress.event(&Event::Retry {
                            depot: t.clone(),
                            why: format!("copy of the block at byte {offset} failed: {e}"),
                        });
                    }
                }
            }
        }
    }

    /// Allocates on `t` and has each source in turn SEND the block there.
    /// On failure: the last error, and whether `t` itself is down
    /// (unreachable, or stalled on ALLOCATE).
    async fn copy_to(
        &self,
        t: &str,
        b: &Block,
        sources: &[&Mapping],
    ) -> std::result::Result<(Mapping, Option<String>), (lors_ibp::Error, bool)> {
        use crate::stall::Kind;
        let size = sources[0].alloc_length.max(1);
        let alloc = (self.pool).allocate(t, self.reliability, self.duration, size);
        let caps = (self.watch.run(&[t], Kind::Op, alloc).await).map_err(|e| {
            let down = e.status().is_none() && e.is_retryable();
            (e, down)
        })?;
        let mut last = None;
        for src in sources {
            let cap = src.read.as_ref().expect("filtered");
            let send = (self.pool).send(cap, &caps.write, src.alloc_offset, src.alloc_length);
            match self
                .watch
                .run(&[&cap.address(), t], Kind::Bytes(b.range.1), send)
                .await
            {
                Ok(_) => {
                    let m = Mapping {
                        alloc_offset: 0,
                        read: Some(caps.read),
                        write: Some(caps.write),
                        manage: Some(caps.manage),
                        ..(*src).clone()
                    };
                    return Ok((m, src.depot()));
                }
                Err(e) => last = Some(e),
            }
        }
        // No exNode will name it: free it now (bounded: a depot that did
        // not answer the copy may not answer this either).
        let _ =
            tokio::time::timeout(crate::stall::RELEASE_WAIT, self.pool.release(&caps.manage)).await;
        Err((last.expect("at least one source"), false))
    }
}

/// Runs `futs` together on this task; their outputs in order.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}

/// Which mappings to act on.
#[derive(Debug, Clone)]
pub enum Selection {
    /// By index in the exNode.
    Indices(Vec<usize>),
    /// Every mapping on one of these depots (`host:port`).
    Depots(Vec<String>),
    /// Every mapping not on one of these depots.
    NotOn(Vec<String>),
}

impl Selection {
    /// Whether mapping `i` is selected.
    pub fn contains(&self, i: usize, m: &Mapping) -> bool {
        let d = m.depot().unwrap_or_default();
        match self {
            Selection::Indices(v) => v.contains(&i),
            Selection::Depots(v) => v.contains(&d),
            Selection::NotOn(v) => !v.contains(&d),
        }
    }
}

/// Result of a trim.
#[derive(Debug)]
pub struct Trimmed {
    /// The exNode without the selected mappings.
    pub exnode: ExNode,
    /// How many mappings were removed.
    pub removed: usize,
    /// The removed allocations, each with its index in the input: what a
    /// `--decrement` releases once the trimmed exNode is saved
    /// ([`crate::commit::save_then_release`]), never before.
    pub dropped: Vec<(usize, Mapping)>,
}

/// Removes the selected allocations (mappings, and parity blocks numbered
/// after them) from a copy of `x`; nothing on a depot changes. Unless
/// `allow_holes`, refuses to remove the last replica of any block — or,
/// for an erasure-coded file, to leave any stripe with fewer blocks than
/// it needs to be read. Releasing what was removed is the caller's, after
/// the result is saved: [`crate::commit`].
///
/// ```
/// use lors::manage::{Selection, trim};
/// use lors_exnode::{ExNode, Mapping};
/// let m = Mapping { logical_length: 10, ..Mapping::default() };
/// let x = ExNode { mappings: vec![m.clone(), m], ..ExNode::default() };
/// let t = trim(&x, &Selection::Indices(vec![1]), false)?;
/// assert_eq!((t.exnode.mappings.len(), t.dropped[0].0), (1, 1));
/// assert!(trim(&t.exnode, &Selection::Indices(vec![0]), false).is_err()); // the last copy
/// # Ok::<(), lors::Error>(())
/// ```
pub fn trim(x: &ExNode, sel: &Selection, allow_holes: bool) -> Result<Trimmed> {
    let erasure = lors_exnode::erasure::Erasure::of(x)?;
    if let (Some(e), false) = (&erasure, allow_holes) {
        // A data block's last copy may go while its stripe can rebuild it.
        let kept = |i: usize| x.allocation(i).is_some_and(|m| !sel.contains(i, m));
        if let Some(m) = e.margins(x, kept).into_iter().find(|m| m.margin < 0) {
            return Err(Error::StripeBelowNeed {
                stripe: m.stripe,
                bytes: m.bytes,
                left: m.blocks,
                need: e.scheme.data,
            });
        }
    }
    if !allow_holes && erasure.is_none() {
        for ((offset, len), idx) in blocks(x) {
            if idx.iter().all(|&i| sel.contains(i, &x.mappings[i])) {
                return Err(Error::LastReplica {
                    offset,
                    end: offset + len,
                });
            }
        }
    }
    let mut keep = ExNode {
        holes: x.holes.clone(),
        parity: Vec::new(),
        metadata: x.metadata.clone(),
        mappings: Vec::new(),
    };
    let mut dropped = Vec::new();
    let mut parity = Vec::new();
    for (i, m) in x.allocations().enumerate() {
        if sel.contains(i, m) {
            dropped.push((i, m.clone()));
            continue;
        }
        match i < x.mappings.len() {
            true => keep.mappings.push(m.clone()),
            false => parity.push((i, m.clone())),
        }
    }
    keep.parity = parity.iter().map(|(_, m)| m.clone()).collect();
    if erasure.is_some() && lors_exnode::erasure::Erasure::of(&keep).is_err() {
        // Holes allowed and whole stripes gone: the record no longer
        // describes what is left, and parity cannot rebuild a stripe with
        // nothing left of it. The file becomes its remaining data blocks;
        // the parity goes with the rest.
        lors_exnode::erasure::Erasure::forget(&mut keep);
        keep.parity.clear();
        dropped.extend(parity);
        dropped.sort_by_key(|(i, _)| *i);
    }
    Ok(Trimmed {
        exnode: keep,
        removed: dropped.len(),
        dropped,
    })
}

/// How to extend leases.
#[derive(Debug, Clone, Copy)]
pub enum Lease {
    /// Add this much to each allocation's remaining time.
    By(Duration),
    /// Expire this long from now.
    To(Duration),
    /// As long as each depot allows.
    Max,
}

/// Extends the lease of every allocation (parity blocks too, numbered
/// after the mappings) that has a manage capability, the depots in
/// parallel; `progress` counts allocations done. Returns per-allocation
/// outcomes in exNode order: new seconds left, or the error.
pub async fn refresh(
    x: &ExNode,
    lease: Lease,
    pool: &Pool,
    progress: &dyn Progress,
) -> Vec<(usize, std::result::Result<i64, Cause>)> {
    let mut out = Vec::new();
    let mut jobs = Vec::new();
    for (i, m) in x.allocations().enumerate() {
        match &m.manage {
            None => out.push((i, Err("no manage capability".into()))),
            Some(cap) => jobs.push((i, cap.clone())),
        }
    }
    progress.start(Some(jobs.len() as u64));
    let done = by_depot(jobs, pool, progress, move |mut c, _, cap| async move {
        let r = extend(&mut c, &cap, lease).await;
        (c, r)
    })
    .await;
    out.extend(
        done.into_iter()
            .map(|(i, r)| (i, r.map_err(|e| Cause::from(&e)))),
    );
    out.sort_unstable_by_key(|&(i, _)| i);
    out
}

/// One allocation's lease extended as `lease` says; the seconds it has left.
async fn extend(
    c: &mut Connection,
    cap: &Capability,
    lease: Lease,
) -> std::result::Result<i64, lors_ibp::Error> {
    // CHNG carries the max size and reliability the allocation has: the
    // reference depot takes max size 0 as "shrink to 0" (-20) rather than
    // "keep", as LoRS's own lors_refresh knows.
    let now = c.probe(cap).await?;
    let secs = match lease {
        Lease::To(d) => d.as_secs(),
        Lease::By(d) => now
            .seconds_left
            .max(0)
            .unsigned_abs()
            .saturating_add(d.as_secs()),
        Lease::Max => {
            let rid = cap.rid.clone().unwrap_or_else(|| "0".into());
            c.status(&rid, "ibp").await?.max_duration
        }
    };
    let rel = lors_ibp::proto::Reliability::from_number(now.reliability);
    c.change(cap, now.max_size, Some(secs.max(1)), rel).await?;
    Ok(c.probe(cap).await?.seconds_left)
}

/// A copy of the exNode without the chosen capabilities, for sharing: strip
/// write and manage to hand out a read-only file.
pub fn modify(x: &ExNode, strip_read: bool, strip_write: bool, strip_manage: bool) -> ExNode {
    let mut y = x.clone();
    for m in y.mappings.iter_mut().chain(&mut y.parity) {
        if strip_read {
            m.read = None;
        }
        if strip_write {
            m.write = None;
        }
        if strip_manage {
            m.manage = None;
        }
    }
    y
}

/// What probing one mapping found.
#[derive(Debug, Clone)]
pub enum Probe {
    /// The allocation is there; what the depot reports of it.
    Live(ProbeInfo),
    /// The depot has no such allocation: its lease ended, or it was freed.
    Gone,
    /// The depot refused the capability (wrong kind or key).
    Refused(String),
    /// The depot could not be reached (connection refused, timed out, dropped).
    Unreachable(String),
    /// The depot stopped answering while the others answered (hung, or a
    /// path that drops everything): given up after the stall time.
    NoAnswer(String),
    /// Anything else: a depot error, a malformed reply, no capability.
    Failed(String),
}

impl Probe {
    pub(crate) fn from_result(r: std::result::Result<ProbeInfo, lors_ibp::Error>) -> Probe {
        use lors_ibp::proto::StatusCode as S;
        match r {
            Ok(p) => Probe::Live(p),
            Err(e) => match e.status() {
                Some(S::CAP_NOT_FOUND) => Probe::Gone,
                Some(c)
                    if (S::CAP_ACCESS_DENIED.code()..=S::CAP_NOT_WRITE.code())
                        .contains(&c.code()) =>
                {
                    Probe::Refused(e.to_string())
                }
                Some(_) => Probe::Failed(e.to_string()),
                None if e.is_retryable() => Probe::Unreachable(e.to_string()),
                None => Probe::Failed(e.to_string()),
            },
        }
    }

    /// The allocation answered.
    pub fn is_live(&self) -> bool {
        matches!(self, Probe::Live(_))
    }

    /// One word for listings: `live`, `expired`, `refused`, `unreachable`,
    /// `no answer`, `failed`.
    pub fn state(&self) -> &'static str {
        match self {
            Probe::Live(_) => "live",
            Probe::Gone => "expired",
            Probe::Refused(_) => "refused",
            Probe::Unreachable(_) => "unreachable",
            Probe::NoAnswer(_) => "no answer",
            Probe::Failed(_) => "failed",
        }
    }

    /// A sentence for a person.
    pub fn reason(&self) -> String {
        match self {
            Probe::Live(_) => "live".into(),
            Probe::Gone => "expired or freed: the depot no longer has this allocation".into(),
            Probe::Refused(e) => format!("capability refused: {e}"),
            Probe::Unreachable(e) => format!("depot unreachable: {e}"),
            Probe::NoAnswer(e) => e.clone(),
            Probe::Failed(e) => e.clone(),
        }
    }
}

/// Probes every allocation (manage key, else read key) — the mappings,
/// then the parity blocks ([`ExNode::allocations`]): what the depots
/// report. Depots are probed in parallel, each over one connection; once a
/// depot cannot be reached its other mappings are reported unreachable
/// without waiting for it again.
pub async fn probe_all(x: &ExNode, pool: &Pool) -> Vec<Probe> {
    probe_many(&[x], pool).await.pop().unwrap_or_default()
}

/// [`probe_all`] of several exNodes at once: each depot is asked about
/// all of their allocations over its own connections, and a depot that
/// does not answer costs one timeout for the lot, not one per exNode.
///
/// ```no_run
/// # async fn f(a: lors_exnode::ExNode, b: lors_exnode::ExNode, pool: lors::Pool) {
/// let probes = lors::manage::probe_many(&[&a, &b], &pool).await;
/// assert_eq!(probes[1].len(), b.allocations().count());
/// # }
/// ```
pub async fn probe_many(xs: &[&ExNode], pool: &Pool) -> Vec<Vec<Probe>> {
    // Allocation i of exNode f is job starts[f] + i.
    let mut starts = Vec::with_capacity(xs.len());
    let mut jobs = Vec::new();
    let mut total = 0usize;
    for x in xs {
        starts.push(total);
        for (i, m) in x.allocations().enumerate() {
            if let Some(c) = m.manage.as_ref().or(m.read.as_ref()).or(m.write.as_ref()) {
                jobs.push((total + i, c.clone()));
            }
        }
        total += x.allocations().count();
    }
    let mut out: Vec<Vec<Probe>> = (xs.iter())
        .map(|x| vec![Probe::Failed("no capability".into()); x.allocations().count()])
        .collect();
    for (j, r) in by_depot(jobs, pool, &NoProgress, |mut c, _, cap| async move {
        let r = c.probe(&cap).await;
        (c, r)
    })
    .await
    {
        let f = starts.partition_point(|&s| s <= j) - 1;
        let (x, i) = (xs[f], j - starts[f]);
        out[f][i] = match r {
            Err(Failure::Skipped(why)) => Probe::Unreachable(why),
            Err(Failure::Silent(why)) => Probe::NoAnswer(why),
            Err(Failure::Op(e)) => Probe::from_result(Err(e)),
            Ok(p) => match x
                .allocation(i)
                .map(|m| m.alloc_offset.saturating_add(m.alloc_length))
            {
                // A depot that acknowledged a copy it never made holds
                // less than the mapping reads: not a replica.
                Some(need) if p.size < need => Probe::Failed(format!(
                    "the allocation holds {} bytes, and the mapping needs {need}: its data never arrived",
                    p.size
                )),
                // A share's keys end with its own expiry, whatever the
                // owner's lease says.
                _ => Probe::Live(lors_ibp::ProbeInfo {
                    seconds_left: match crate::share::ends_in(x) {
                        Some(left) => p.seconds_left.min(left),
                        None => p.seconds_left,
                    },
                    ..p
                }),
            },
        };
    }
    out
}

/// Why one job of [`by_depot`] has no result.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The operation failed.
    Op(lors_ibp::Error),
    /// Not tried: the depot could not be reached for an earlier job.
    Skipped(String),
    /// The depot stopped answering while the others answered: given up
    /// after the stall time, not the network timeout.
    Silent(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Op(e) => e.fmt(f),
            Failure::Skipped(why) | Failure::Silent(why) => f.write_str(why),
        }
    }
}

impl From<&Failure> for Cause {
    fn from(f: &Failure) -> Cause {
        match f {
            Failure::Op(e) => Cause::from(e),
            other => Cause::local(other.to_string()),
        }
    }
}

/// One depot's share of a [`by_depot`] run, as the collector sees it.
struct DepotRun {
    addr: String,
    /// Jobs not yet reported.
    left: std::collections::BTreeSet<usize>,
    /// Its last progress (a job done), or the start.
    since: std::time::Instant,
    task: tokio::task::AbortHandle,
}

/// Runs `op` on every `(index, capability)` of `jobs` (handed both): the depots in
/// parallel, each over one connection (which `op` hands back), its jobs one
/// after another. Once a
/// depot cannot be reached (connect refused, timed out, connection lost),
/// its remaining jobs fail with that error without waiting for it again.
/// A depot that answers nothing for the stall time ([`crate::stall`], the
/// typical job as the depots answered them) while another depot answers is
/// given up the same way: its jobs fail as [`Failure::Silent`] at once.
/// Each finished job advances `progress` by one on its depot. Results are
/// in no particular order.
pub(crate) async fn by_depot<T, F, Fut>(
    jobs: Vec<(usize, Capability)>,
    pool: &Pool,
    progress: &dyn Progress,
    op: F,
) -> Vec<(usize, std::result::Result<T, Failure>)>
where
    T: Send + 'static,
    F: Fn(Connection, usize, Capability) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = (Connection, std::result::Result<T, lors_ibp::Error>)> + Send,
{
    use std::time::Instant;
    let mut per: BTreeMap<String, Vec<(usize, Capability)>> = BTreeMap::new();
    for (i, c) in jobs {
        per.entry(c.address()).or_default().push((i, c));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut set = tokio::task::JoinSet::new();
    let mut runs = Vec::new();
    let t0 = Instant::now();
    for (d, (addr, caps)) in per.into_iter().enumerate() {
        let (cfg, op, tx) = (pool.config().clone(), op.clone(), tx.clone());
        let left = caps.iter().map(|(i, _)| *i).collect();
        let name = addr.clone();
        let task = set.spawn(async move {
            let mut conn: Option<Connection> = None;
            let mut down: Option<String> = None;
            for (i, cap) in caps {
                let r = match &down {
                    Some(why) => Err(Failure::Skipped(why.clone())),
                    None => {
                        let r = async {
                            let c = match conn.take() {
                                Some(c) => c,
                                None => Connection::connect(&addr, &cfg).await?,
                            };
                            let (c, r) = op(c, i, cap).await;
                            if c.is_healthy() {
                                conn = Some(c);
                            }
                            r
                        }
                        .await;
                        if let Err(e) = &r
                            && e.status().is_none()
                            && e.is_retryable()
                        {
                            down = Some(e.to_string());
                        }
                        r.map_err(Failure::Op)
                    }
                };
                let _ = tx.send((d, i, r));
            }
        });
        runs.push(DepotRun {
            addr: name,
            left,
            since: t0,
            task,
        });
    }
    drop(tx);
    let cap = pool.config().io_timeout;
    let mut typical = crate::stall::Typical::default();
    let mut last_any = t0;
    let mut out = Vec::new();
    loop {
        // The depot silent longest, while another has answered since.
        let next = (runs.iter().enumerate())
            .filter(|(_, r)| !r.left.is_empty() && last_any > r.since)
            .map(|(d, r)| (r.since + typical.stall_after(cap), d))
            .min();
        let got = tokio::select! {
            got = rx.recv() => got,
            () = sleep_until(next.map(|(t, _)| t)) => {
                let d = next.map(|(_, d)| d).unwrap_or_default();
                let r = &mut runs[d];
                r.task.abort();
                let why = format!(
                    "no answer from depot {} for {:.0?} while the other depots answered",
                    r.addr,
                    r.since.elapsed()
                );
                for i in std::mem::take(&mut r.left) {
                    progress.advance(&r.addr, 1);
                    out.push((i, Err(Failure::Silent(why.clone()))));
                }
                continue;
            }
        };
        let Some((d, i, r)) = got else { break };
        let now = Instant::now();
        let run = &mut runs[d];
        if !run.left.remove(&i) {
            continue; // already given up
        }
        typical.record(now - run.since);
        run.since = now;
        last_any = now;
        progress.advance(&run.addr, 1);
        out.push((i, r));
    }
    while let Some(done) = set.join_next().await {
        if let Err(e) = done
            && !e.is_cancelled()
        {
            tracing::warn!(error = %e, "a depot's task ended abnormally");
        }
    }
    out
}

/// Sleeps until `t`, or forever without one.
async fn sleep_until(t: Option<std::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Byte ranges of `[0, logical size)` that no live mapping covers: what a
/// download could not read (a hole is no gap: it is zeros). `live[i]`
/// says whether mapping `i` answered.
pub fn uncovered(x: &ExNode, live: &[bool]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = x
        .mappings
        .iter()
        .zip(live)
        .filter(|(_, l)| **l)
        .map(|(m, _)| (m.exnode_offset, m.logical_end()))
        .chain(x.holes.iter().map(|h| (h.offset, h.end())))
        .collect();
    spans.sort_unstable();
    let mut gaps = Vec::new();
    let mut at = 0u64;
    for (s, e) in spans {
        if s > at {
            gaps.push((at, s));
        }
        at = at.max(e);
    }
    let size = x.logical_size();
    if at < size {
        gaps.push((at, size));
    }
    gaps
}
