//! More replicas of an exNode's blocks, copied depot to depot: augment,
//! and the copies route makes on its targets.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use lors_exnode::{ExNode, Mapping};
use lors_ibp::proto::Reliability;

use crate::error::{Cause, Error, Result};
use crate::pool::Pool;
use crate::progress::{Event, Progress};

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
        let plan = (x.blocks().into_iter())
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
