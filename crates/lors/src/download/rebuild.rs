//! Data blocks of an erasure-coded file rebuilt from the rest of their
//! stripe: a last-resort source the scheduler turns to when a block's own
//! depot fails, stalls or serves corrupt bytes.
//!
//! Each data block gets a second, virtual mapping on a depot named
//! [`SOURCE`], listed as a last resort: while the block's own depot
//! answers, nothing changes (no parity read, no decode). A piece the
//! scheduler gives to it is rebuilt from the same 64-byte-aligned window
//! of `k` other blocks of its stripe: data blocks first, then parity; once
//! a block is late one more is asked for, the first `k` to arrive are
//! used and the rest cancelled; a block that fails is replaced by the
//! next. The rebuilt bytes are the block's stored bytes, so its own e2e
//! checksums verify them; when they fail, the parity used is left out and
//! the piece rebuilt again.
//!
//! The other data blocks' bytes are the download's own: a rebuild reads
//! each once for both. Pieces of theirs still waiting are taken with the
//! rebuilt one and delivered from its reads (the scheduler's rows); those
//! their own depots are fetching or have fetched into an output file are
//! read back from it, once written, for a block stored as is. So with one
//! depot lost or slow, the depots send about the file once: its blocks'
//! share comes from parity instead — read from the depots with the least
//! left to send, by the download's own connections there between their
//! pieces (a connection opened beside them gets a fraction of the link).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use lors_exnode::erasure::{Erasure, window};
use lors_exnode::{ExNode, Mapping};

use super::Ctx;
use super::fetch::Fail;
use crate::error::Cause;

/// A rebuild asks for one more block than it needs once one it asked for
/// is late, never sooner than this.
const HEDGE_MIN: Duration = Duration::from_secs(1);

/// ... and once it takes this many times what reads of its size take.
const LATE: u32 = 4;

/// The name of the virtual depot rebuilt pieces come from.
pub const SOURCE: &str = "parity";

/// One block of a stripe that can help rebuild another.
#[derive(Debug, Clone)]
struct Member {
    index: usize,
    mapping: Mapping,
}

/// How the data blocks of an exNode are rebuilt.
pub(super) struct Rebuild {
    erasure: Erasure,
    /// The first virtual mapping: virtual mapping `first + j` rebuilds
    /// `shards[j]`.
    first: usize,
    /// (stripe, index) of each virtual mapping.
    shards: Vec<(u64, usize)>,
    /// Each stripe's blocks and its shard length.
    stripes: BTreeMap<u64, (Vec<Member>, u64)>,
    /// (stripe, index) of every data block a virtual mapping stands for.
    wanted: HashSet<(u64, usize)>,
    cache: Cache,
    /// Where the download puts the data blocks' pieces in an output file,
    /// by stripe and stored range within the block (see [`Rebuild::rows`]).
    places: std::collections::HashMap<(u64, u64, u64), Vec<Place>>,
}

impl Rebuild {
    /// For an erasure-coded `x`: `x` with a virtual mapping per data block
    /// that parity can rebuild, appended to its mappings, and how to
    /// rebuild them. `None` for any other exNode.
    pub(super) fn extend(x: &ExNode) -> crate::error::Result<Option<(ExNode, Rebuild)>> {
        let Some(erasure) = Erasure::of(x)? else {
            return Ok(None);
        };
        let k = erasure.scheme.data;
        let mut stripes: BTreeMap<u64, (Vec<Member>, u64)> = BTreeMap::new();
        // Parity whose record is inconsistent is left out: it could only
        // rebuild wrong bytes (which the checksums would refuse anyway).
        for p in &x.parity {
            let Some((s, index)) = p.shard() else {
                continue;
            };
            let fits = (k..erasure.scheme.blocks()).contains(&index)
                && s < erasure.stripes()
                && p.read.is_some()
                && p.alloc_length > 0
                && p.alloc_length % 2 == 0;
            if !fits {
                continue;
            }
            let entry = stripes.entry(s).or_insert((Vec::new(), p.alloc_length));
            if entry.1 == p.alloc_length {
                entry.0.push(Member {
                    index,
                    mapping: p.clone(),
                });
            }
        }
        for m in &x.mappings {
            let Some((s, index)) = erasure.shard_of(m, false) else {
                continue;
            };
            let Some((members, len)) = stripes.get_mut(&s) else {
                continue;
            };
            if m.read.is_some() && m.alloc_length <= *len {
                members.push(Member {
                    index,
                    mapping: m.clone(),
                });
            }
        }
        // A virtual mapping for every data block its stripe's parity can
        // rebuild: those with a mapping, and those whose every copy was
        // trimmed when the file's layout says how they were stored.
        let mut y = x.clone();
        let first = y.mappings.len();
        let mut shards = Vec::new();
        for (&s, (members, len)) in &stripes {
            for index in 0..k {
                let Some(mut r) = erasure.data_record(x, s, index) else {
                    continue;
                };
                // A block without a read capability of its own (left out
                // of a share, its depot down) is rebuilt all the same: a
                // virtual mapping is read from the rebuilder, never through
                // the capability it carries, which the planner wants.
                if r.read.is_none() {
                    r.read = members.first().and_then(|m| m.mapping.read.clone());
                }
                if r.read.is_some() && r.alloc_length <= *len {
                    shards.push((s, index));
                    y.mappings.push(r);
                }
            }
        }
        Ok(Some((
            y,
            Rebuild {
                erasure,
                first,
                wanted: shards.iter().copied().collect(),
                shards,
                stripes,
                cache: Cache::default(),
                places: Default::default(),
            },
        )))
    }

    /// The error for pieces `lost`: the stripes they are in.
    pub(super) fn lost(
        &self,
        lost: impl Iterator<Item = Range<u64>>,
        last: Cause,
    ) -> crate::error::Error {
        let per = self.erasure.stripe_len().unwrap_or(u64::MAX).max(1);
        let mut stripes: Vec<u64> = lost
            .flat_map(|r| r.start / per..=(r.end.max(r.start + 1) - 1) / per)
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        crate::error::Error::StripesLost {
            scheme: self.erasure.scheme,
            stripes: stripes
                .into_iter()
                .map(|s| (s, self.erasure.stripe(s)))
                .collect(),
            last,
        }
    }

    /// Data blocks per stripe.
    pub(super) fn data_blocks(&self) -> usize {
        self.erasure.scheme.data
    }

    /// The rows of pieces `planned` (see
    /// [`super::sched::Sched::set_rows`]): pieces of one stripe's data
    /// blocks at the same place, stored alike (`stored` says where a piece
    /// of a mapping is stored), by index.
    pub(super) fn rows(
        &mut self,
        x: &ExNode,
        planned: &[crate::plan::Segment],
        stored: impl Fn(&Mapping, u64, u64) -> Option<Range<u64>>,
    ) -> Vec<Vec<usize>> {
        let mut rows: std::collections::HashMap<(u64, u64, u64, u64), Vec<usize>> =
            Default::default();
        for (p, seg) in planned.iter().enumerate() {
            let Some(&m) = seg.sources.iter().find(|&&m| self.is_virtual(m)) else {
                continue;
            };
            let Some(w) = stored(&x.mappings[m], seg.offset, seg.len) else {
                continue;
            };
            let (s, index) = self.shards[m - self.first];
            rows.entry((s, seg.len, w.start, w.end))
                .or_default()
                .push(p);
            self.places
                .entry((s, w.start, w.end))
                .or_default()
                .push(Place {
                    index,
                    piece: p,
                    offset: seg.offset,
                    len: seg.len,
                });
        }
        rows.into_values().filter(|r| r.len() > 1).collect()
    }

    /// The index in its stripe of the data block virtual mapping `m`
    /// stands for.
    pub(super) fn index_of(&self, m: usize) -> usize {
        self.shards[m - self.first].1
    }

    /// Whether mapping `m` is a virtual one.
    pub(super) fn is_virtual(&self, m: usize) -> bool {
        m >= self.first
    }

    /// The stored bytes `want` (within the block) of the data block virtual
    /// mapping `m` stands for, rebuilt from others of its stripe, leaving
    /// out the blocks in `exclude`. Also the blocks used.
    ///
    /// One decode gives every lost block of a stripe's window: those the
    /// reads of the other lost blocks will ask for are kept (a few windows
    /// at most), and reads of one window wait for each other rather than
    /// each reading k blocks.
    ///
    /// The same bytes `want` of the data blocks in `siblings` (read or
    /// rebuilt on the way) come back too, for those it had.
    pub(super) async fn load(
        &self,
        ctx: &Ctx,
        m: usize,
        want: Range<u64>,
        exclude: &HashSet<(usize, String)>,
        siblings: &[usize],
    ) -> Result<Loaded, Fail> {
        let (s, target) = self.shards[m - self.first];
        let w = window(want.clone(), self.stripes[&s].1);
        let cut = |shard: &[u8]| {
            let from = usize::try_from(want.start - w.start).unwrap_or(usize::MAX);
            let to = from + usize::try_from(want.end - want.start).unwrap_or(usize::MAX);
            shard.get(from..to).map(BytesMut::from)
        };
        let short = || Fail::Remote(Cause::local("rebuilt block shorter than asked"), false);
        let slot = exclude
            .is_empty()
            .then(|| self.cache.slot((s, w.start, w.end)));
        let mut held = match &slot {
            Some(slot) => Some(slot.clone().lock_owned().await),
            // Another try, without blocks that rebuilt bad bytes: no cache.
            None => None,
        };
        if let Some(d) = held.as_mut().and_then(|h| h.remove(&target)) {
            let bytes = cut(&d).ok_or_else(short)?;
            return Ok(Loaded::alone(bytes));
        }
        let got = self.gather(ctx, s, target, w.clone(), exclude).await?;
        let mut out = Loaded::alone(BytesMut::new());
        out.used = got.used;
        let mut shard = None;
        for (i, d) in got.rebuilt {
            if i == target {
                shard = Some(d);
            } else if siblings.contains(&i) {
                out.siblings.extend(cut(&d).map(|b| (i, b)));
            } else if let Some(h) = held.as_mut().filter(|_| self.wanted.contains(&(s, i))) {
                h.insert(i, d);
            }
        }
        for (i, d) in got.read {
            if siblings.contains(&i) {
                out.siblings.extend(cut(&d).map(|b| (i, b)));
            }
        }
        let empty = held.map(|h| h.is_empty());
        drop(slot);
        if empty == Some(true) {
            self.cache.forget((s, w.start, w.end));
        }
        out.bytes = cut(&shard.unwrap_or_default()).ok_or_else(short)?;
        Ok(out)
    }

    /// The data blocks of stripe `s`, window `w` of each: those read as
    /// they were, the others decoded from `k` blocks read (leaving out
    /// `exclude`, `target` among the decoded); and the blocks read.
    ///
    /// A data block stored as is whose piece here the download delivers
    /// to the output file from its own depot is read back from the file
    /// once written, not fetched a second time.
    async fn gather(
        &self,
        ctx: &Ctx,
        s: u64,
        target: usize,
        w: Range<u64>,
        exclude: &HashSet<(usize, String)>,
    ) -> Result<Gathered, Fail> {
        let k = self.erasure.scheme.data;
        // Data blocks past the end of the file are zeros, not stored.
        let free: Vec<usize> = (0..k)
            .filter(|&i| i != target && self.erasure.block(s, i).is_empty())
            .collect();
        let need = k - free.len();
        let (mut waiting, mut network) = self.sources(ctx, s, target, &w, &free, exclude);
        let mut have: Vec<(usize, Vec<u8>)> = free.iter().map(|&i| (i, Vec::new())).collect();
        let mut used = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        let (mut running, mut extra) = (0usize, 0usize);
        let mut last = Cause::local(format!(
            "no {need} blocks of stripe {s} left to rebuild block {target} from"
        ));
        let started = Instant::now();
        // A read is late once it takes several times what the download's
        // own reads of as many bytes take (they share the same links), or
        // before anything is timed, several times what one that arrived
        // took.
        let typical = ctx.lock().sched.typical_fetch(w.end - w.start);
        let late_after = |arrived: Duration| match typical {
            Some(t) => (t * LATE).max(HEDGE_MIN),
            None => (arrived * LATE).max(HEDGE_MIN),
        };
        let mut hedge_at = typical.map(|_| started + late_after(Duration::ZERO));
        let got = |have: &Vec<(usize, Vec<u8>)>| have.len() - free.len();
        loop {
            // Armed before looking, so a piece written meanwhile wakes us.
            let written = ctx.wake.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            for (b, bytes) in self.read_back(ctx, &mut waiting, &mut network).await {
                used.push((b.index, key(&b.mapping)));
                have.push((b.index, bytes));
            }
            // What is still needed, one more once a block is late, while
            // blocks are left to ask.
            while running + waiting.len() < (need - got(&have) + extra) {
                let Some(b) = network.pop_front() else { break };
                let read = read_window(ctx, &b.mapping, w.clone());
                tasks.spawn(async move { (b, read.await) });
                running += 1;
            }
            if got(&have) >= need {
                break;
            }
            if running == 0 && waiting.is_empty() {
                return Err(Fail::Remote(last, false));
            }
            let late = async {
                match hedge_at {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            let done = tokio::select! {
                d = tasks.join_next(), if running > 0 => d,
                () = late => {
                    extra += 1;
                    hedge_at = Some(Instant::now() + late_after(started.elapsed()));
                    continue;
                }
                () = &mut written, if !waiting.is_empty() => continue,
            };
            let Some(done) = done else { break };
            running -= 1;
            match done {
                Ok((b, Ok(bytes))) => {
                    if !have.iter().any(|(i, _)| *i == b.index) {
                        used.push((b.index, key(&b.mapping)));
                        have.push((b.index, bytes));
                    }
                    if typical.is_none() {
                        hedge_at = Some(started + late_after(started.elapsed()));
                    }
                }
                Ok((b, Err(e))) => {
                    last = Cause::local(format!(
                        "block {} of stripe {s} on {}: {}",
                        b.index,
                        b.mapping.depot().unwrap_or_default(),
                        Cause::from(&e)
                    ));
                }
                Err(e) => last = Cause::local(e.to_string()),
            }
        }
        tasks.abort_all();
        if got(&have) < need {
            return Err(Fail::Remote(last, false));
        }
        self.decode(s, &w, have, &free, used).await
    }

    /// The blocks of stripe `s` that can help rebuild `target`'s window
    /// `w`: those to read back from the output once the download has
    /// written them (each with its piece there), and those to read from
    /// their depots, in the order to ask them — those on depots that are
    /// dead, stalled or slow last; data blocks first (their bytes are read
    /// anyway), then parity: from the depots with the fewest pieces left
    /// to send, and among equals starting with a different block for each
    /// window, so rebuilds running together read from different depots.
    fn sources(
        &self,
        ctx: &Ctx,
        s: u64,
        target: usize,
        w: &Range<u64>,
        free: &[usize],
        exclude: &HashSet<(usize, String)>,
    ) -> (Vec<(Member, Place)>, std::collections::VecDeque<Member>) {
        let (members, _) = &self.stripes[&s];
        let k = self.erasure.scheme.data;
        let mut candidates: Vec<&Member> = (members.iter())
            .filter(|b| b.index != target && !free.contains(&b.index))
            .filter(|b| !exclude.contains(&(b.index, key(&b.mapping))))
            .collect();
        let m = self.erasure.scheme.parity.max(1);
        let turn = usize::try_from(s.wrapping_add(w.start / (w.end - w.start).max(1)) % m as u64)
            .unwrap_or(0);
        // Reads other rebuilds asked of a depot are its load too.
        let asked: HashMap<String, usize> = (candidates.iter())
            .filter_map(|b| b.mapping.depot())
            .map(|d| {
                let n = ctx.urgent_load(&d);
                (d, n)
            })
            .collect();
        let g = ctx.lock();
        // Blocks on depots that are dead, stalled or slow last; parity
        // from the depots with the least left to send, in turn among
        // equals.
        let load = |d: String| Some(g.sched.backlog(&d)? + asked.get(&d).copied().unwrap_or(0));
        candidates.sort_by_key(|b| {
            let left = (b.mapping.depot()).map_or(Some(0), load);
            match b.index.checked_sub(k) {
                None => (left.is_none(), 0, b.index),
                Some(j) => (left.is_none(), 1 + left.unwrap_or(0), (j + m - turn) % m),
            }
        });
        let places = (ctx.out.as_ref())
            .and_then(|_| self.places.get(&(s, w.start, w.end)))
            .map_or(&[][..], Vec::as_slice);
        let mut waiting = Vec::new();
        let mut network = std::collections::VecDeque::new();
        for b in candidates {
            let place = (places.iter())
                .find(|pl| pl.index == b.index && b.mapping.function.is_none())
                .filter(|pl| g.sched.coming(pl.piece, (pl.offset, pl.len)));
            match place {
                Some(pl) => waiting.push((b.clone(), *pl)),
                None => network.push_back(b.clone()),
            }
        }
        (waiting, network)
    }

    /// The blocks of `waiting` the output file now holds, read back from
    /// it; those no longer on their way there move to the front of
    /// `network`.
    async fn read_back(
        &self,
        ctx: &Ctx,
        waiting: &mut Vec<(Member, Place)>,
        network: &mut std::collections::VecDeque<Member>,
    ) -> Vec<(Member, Vec<u8>)> {
        let Some(out) = ctx.out.as_ref() else {
            return Vec::new();
        };
        let mut read = Vec::new();
        let mut i = 0;
        while i < waiting.len() {
            let pl = waiting[i].1;
            let f = out.clone();
            let back = tokio::task::spawn_blocking(move || f.read_back(pl.offset, pl.len)).await;
            match back {
                Ok(Some(Ok(bytes))) => read.push((waiting.swap_remove(i).0, bytes)),
                Ok(None) if ctx.lock().sched.coming(pl.piece, (pl.offset, pl.len)) => i += 1,
                _ => network.push_front(waiting.swap_remove(i).0),
            }
        }
        read
    }

    /// Decodes window `w` of the data blocks of stripe `s` missing from
    /// `have` (`free` ones are zeros).
    async fn decode(
        &self,
        s: u64,
        w: &Range<u64>,
        have: Vec<(usize, Vec<u8>)>,
        free: &[usize],
        used: Vec<(usize, String)>,
    ) -> Result<Gathered, Fail> {
        let (scheme, k) = (self.erasure.scheme, self.erasure.scheme.data);
        let wlen = usize::try_from(w.end - w.start).unwrap_or(usize::MAX);
        let (rebuilt, have) = tokio::task::spawn_blocking(move || {
            let refs: Vec<(usize, &[u8])> = have.iter().map(|(i, b)| (*i, b.as_slice())).collect();
            (scheme.recover_missing(&refs, wlen), have)
        })
        .await
        .map_err(|e| Fail::Remote(Cause::local(e.to_string()), false))?;
        let rebuilt = rebuilt.map_err(|e| {
            Fail::Remote(Cause::local(format!("rebuilding stripe {s}: {e}")), false)
        })?;
        let read = (have.into_iter()).filter(|(i, _)| *i < k && !free.contains(i));
        Ok(Gathered {
            rebuilt,
            read: read.collect(),
            used,
        })
    }
}

/// Where the download puts a data block's piece in the output: the piece,
/// and its offset and length in the file.
#[derive(Debug, Clone, Copy)]
struct Place {
    index: usize,
    piece: usize,
    offset: u64,
    len: u64,
}

/// What [`Rebuild::gather`] gives: the data blocks decoded and those read
/// (each its window), and the blocks read.
struct Gathered {
    rebuilt: Vec<(usize, Vec<u8>)>,
    read: Vec<(usize, Vec<u8>)>,
    used: Vec<(usize, String)>,
}

/// What [`Rebuild::load`] gives: the bytes asked for, the blocks read, and
/// the same bytes of the sibling data blocks asked for that it had.
pub(super) struct Loaded {
    pub bytes: BytesMut,
    pub used: Vec<(usize, String)>,
    pub siblings: Vec<(usize, BytesMut)>,
}

impl Loaded {
    fn alone(bytes: BytesMut) -> Loaded {
        Loaded {
            bytes,
            used: Vec::new(),
            siblings: Vec::new(),
        }
    }
}

/// Decoded windows kept for the reads of a stripe's other lost blocks, by
/// (stripe, window start, window end); each behind a lock its readers
/// take in turn, so one decodes and the others find their bytes.
#[derive(Default)]
struct Cache {
    slots: std::sync::Mutex<Vec<(Key, Slot)>>,
}

type Key = (u64, u64, u64);
type Slot = Arc<tokio::sync::Mutex<BTreeMap<usize, Vec<u8>>>>;

/// Windows kept at most (each up to m − 1 decoded blocks of a piece).
const KEPT_WINDOWS: usize = 4;

impl Cache {
    fn slot(&self, key: Key) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = slots.iter().find(|(k, _)| *k == key) {
            return s.clone();
        }
        if slots.len() >= KEPT_WINDOWS {
            slots.remove(0);
        }
        let s = Slot::default();
        slots.push((key, s.clone()));
        s
    }

    fn forget(&self, key: Key) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|(k, s)| *k != key || Arc::strong_count(s) > 1);
    }
}

/// What tells two blocks apart: their read capability.
fn key(m: &Mapping) -> String {
    m.read.as_ref().map(|c| c.to_url()).unwrap_or_default()
}

/// Bytes `w` of block `m`: what it stores there, the rest (past its
/// stored bytes) zeros, as the code pads it; read by the download's own
/// connections to its depot when it has some ([`Ctx::read_urgent`]).
fn read_window(
    ctx: &Ctx,
    m: &Mapping,
    w: Range<u64>,
) -> impl Future<Output = Result<Vec<u8>, lors_ibp::Error>> + Send + use<> {
    let end = w.end.min(m.alloc_length);
    let read = (w.start < end).then(|| {
        let cap = m.read.as_ref().expect("members are readable");
        ctx.read_urgent(&cap.address(), cap, m.alloc_offset + w.start, end - w.start)
    });
    async move {
        match read {
            Some(r) => r.await,
            None => Ok(Vec::new()),
        }
    }
}
