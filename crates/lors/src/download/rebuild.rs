//! Data blocks of an erasure-coded file rebuilt from the rest of their
//! stripe: a last-resort source the scheduler turns to when a block's own
//! depot fails, stalls or serves corrupt bytes.
//!
//! Each data block gets a second, virtual mapping on a depot named
//! [`SOURCE`], listed as a last resort: while the block's own depot
//! answers, nothing changes (no parity read, no decode). A piece the
//! scheduler gives to it is rebuilt from the same 64-byte-aligned window
//! of `k` other blocks of its stripe: data blocks first (their bytes are
//! needed anyway), then parity; one more than needed is asked for, the
//! first `k` to arrive are used and the rest cancelled; a block that
//! fails is replaced by the next. The rebuilt bytes are the block's
//! stored bytes, so its own e2e checksums verify them; when they fail,
//! the parity used is left out and the piece rebuilt again.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use lors_exnode::erasure::{Erasure, window};
use lors_exnode::{ExNode, Mapping};

use super::Ctx;
use super::fetch::Fail;
use crate::error::Cause;

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
        for (&s, (_, len)) in &stripes {
            for index in 0..k {
                let Some(r) = erasure.data_record(x, s, index) else {
                    continue;
                };
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
    pub(super) async fn load(
        &self,
        ctx: &Ctx,
        m: usize,
        want: Range<u64>,
        exclude: &HashSet<(usize, String)>,
    ) -> Result<(BytesMut, Vec<(usize, String)>), Fail> {
        let (s, target) = self.shards[m - self.first];
        let w = window(want.clone(), self.stripes[&s].1);
        let cut = |shard: &[u8]| {
            let from = usize::try_from(want.start - w.start).unwrap_or(usize::MAX);
            let to = from + usize::try_from(want.end - want.start).unwrap_or(usize::MAX);
            (shard.get(from..to).map(BytesMut::from)).ok_or_else(|| {
                Fail::Remote(Cause::local("rebuilt block shorter than asked"), false)
            })
        };
        if !exclude.is_empty() {
            // Another try, without blocks that rebuilt bad bytes: no cache.
            let (got, used) = self.gather(ctx, s, target, w.clone(), exclude).await?;
            let shard = got.into_iter().find(|(i, _)| *i == target).map(|(_, d)| d);
            return Ok((cut(&shard.unwrap_or_default())?, used));
        }
        let slot = self.cache.slot((s, w.start, w.end));
        let mut held = slot.lock().await;
        if let Some(d) = held.remove(&target) {
            return Ok((cut(&d)?, Vec::new()));
        }
        let (got, used) = self.gather(ctx, s, target, w.clone(), exclude).await?;
        let mut shard = None;
        for (i, d) in got {
            if i == target {
                shard = Some(d);
            } else if self.wanted.contains(&(s, i)) {
                held.insert(i, d);
            }
        }
        let empty = held.is_empty();
        drop(held);
        drop(slot);
        if empty {
            self.cache.forget((s, w.start, w.end));
        }
        Ok((cut(&shard.unwrap_or_default())?, used))
    }

    /// The data blocks of stripe `s` not read, window `w` of each decoded
    /// from `k` others (leaving out `exclude`, `target` among them), and
    /// the blocks read.
    async fn gather(
        &self,
        ctx: &Ctx,
        s: u64,
        target: usize,
        w: Range<u64>,
        exclude: &HashSet<(usize, String)>,
    ) -> Result<(Vec<(usize, Vec<u8>)>, Vec<(usize, String)>), Fail> {
        let (members, _) = &self.stripes[&s];
        let k = self.erasure.scheme.data;
        // Data blocks past the end of the file are zeros, not stored.
        let free: Vec<usize> = (0..k)
            .filter(|&i| i != target && self.erasure.block(s, i).is_empty())
            .collect();
        let mut candidates: Vec<&Member> = (members.iter())
            .filter(|b| b.index != target && !free.contains(&b.index))
            .filter(|b| !exclude.contains(&(b.index, key(&b.mapping))))
            .collect();
        candidates.sort_by_key(|b| b.index);
        let need = k - free.len();
        let mut have: Vec<(usize, Vec<u8>)> = free.iter().map(|&i| (i, Vec::new())).collect();
        let mut used = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        let mut next = candidates.iter();
        let (mut running, mut extra) = (0usize, 1usize);
        let mut last = Cause::local(format!(
            "no {need} blocks of stripe {s} left to rebuild block {target} from"
        ));
        let started = Instant::now();
        let mut hedge_at: Option<Instant> = None;
        let got = |have: &Vec<(usize, Vec<u8>)>| have.len() - free.len();
        loop {
            // One more than still needed, while blocks are left to ask.
            while running < need - got(&have) + extra {
                let Some(b) = next.next() else { break };
                if have.iter().any(|(i, _)| *i == b.index) {
                    continue;
                }
                let (b, w) = ((*b).clone(), w.clone());
                let pool = ctx.pool.clone();
                tasks.spawn(async move {
                    let r = read_window(&pool, &b.mapping, w).await;
                    (b, r)
                });
                running += 1;
            }
            if got(&have) >= need {
                break;
            }
            if running == 0 {
                return Err(Fail::Remote(last, false));
            }
            let done = match hedge_at {
                Some(t) => tokio::select! {
                    d = tasks.join_next() => d,
                    () = tokio::time::sleep_until(t.into()) => {
                        // A block is late: ask one more.
                        hedge_at = None;
                        extra += 1;
                        continue;
                    }
                },
                None => tasks.join_next().await,
            };
            let Some(done) = done else { break };
            running -= 1;
            match done {
                Ok((b, Ok(bytes))) => {
                    if !have.iter().any(|(i, _)| *i == b.index) {
                        used.push((b.index, key(&b.mapping)));
                        have.push((b.index, bytes));
                    }
                    let waited = started.elapsed();
                    hedge_at = Some(Instant::now() + (waited * 3).max(Duration::from_millis(250)));
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
        let scheme = self.erasure.scheme;
        let wlen = usize::try_from(w.end - w.start).unwrap_or(usize::MAX);
        let rebuilt = tokio::task::spawn_blocking(move || {
            let refs: Vec<(usize, &[u8])> = have.iter().map(|(i, b)| (*i, b.as_slice())).collect();
            scheme.recover_missing(&refs, wlen)
        })
        .await
        .map_err(|e| Fail::Remote(Cause::local(e.to_string()), false))?
        .map_err(|e| Fail::Remote(Cause::local(format!("rebuilding stripe {s}: {e}")), false))?;
        Ok((rebuilt, used))
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
/// stored bytes) zeros, as the code pads it.
async fn read_window(
    pool: &Arc<crate::pool::Pool>,
    m: &Mapping,
    w: Range<u64>,
) -> Result<Vec<u8>, lors_ibp::Error> {
    let end = w.end.min(m.alloc_length);
    if w.start >= end {
        return Ok(Vec::new());
    }
    let cap = m.read.as_ref().expect("members are readable");
    pool.load(cap, m.alloc_offset + w.start, end - w.start)
        .await
}
