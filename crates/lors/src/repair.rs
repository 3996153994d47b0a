//! Repair of an erasure-coded file: the blocks of each stripe that are
//! lost (their depot does not answer, their allocation is gone) or
//! corrupt are made again from `k` good ones and stored on depots that
//! hold no block of that stripe, restoring its full margin.
//!
//! Per stripe with a block missing: `k` blocks are read whole (data first,
//! each checked — its e2e checksums, its recorded BLAKE3 — a bad one is
//! replaced by the next), the data shards recovered, the parity encoded
//! again, and every missing block stored anew. A block whose allocation is
//! gone is dropped from the exNode; one on a depot that does not answer is
//! kept (if the depot comes back, its allocation is still named: it is an
//! extra copy of its block, and `lors trim --depot` frees it). A stripe
//! that cannot be repaired (too few blocks left, no depot to take a block)
//! is reported and the others go on; an interrupt releases every block
//! stored.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use lors_exnode::erasure::{Erasure, Margin};
use lors_exnode::functions::{Codec, stored_digest};
use lors_exnode::{ExNode, Mapping};
use lors_ibp::Capability;
use tokio::sync::Semaphore;

use crate::error::{Cause, Error, Result};
use crate::manage::{CopyOptions, Probe};
use crate::pool::Pool;
use crate::progress::Progress;
use crate::stall::Kind;

/// Stripes repaired at once: each holds its blocks in memory.
const PARALLEL_STRIPES: usize = 2;

/// What a repair did.
#[derive(Debug)]
pub struct Repaired {
    /// The exNode with the new blocks (and without those whose allocation
    /// is gone).
    pub exnode: ExNode,
    /// Stripes that had blocks made again.
    pub stripes: usize,
    /// Blocks made again.
    pub blocks: usize,
    /// Allocations dropped from the exNode: gone from their depots, or
    /// corrupt ones replaced (in [`Repaired::to_free`]).
    pub dropped: usize,
    /// Corrupt blocks replaced, out of [`Repaired::exnode`]: to release
    /// once it is saved ([`crate::commit::save_then_release`]), never
    /// before.
    pub to_free: Vec<Mapping>,
    /// Stripes with fewer than `k` blocks left: not repairable (their
    /// bytes are lost unless a depot comes back).
    pub lost: Vec<(u64, std::ops::Range<u64>)>,
    /// Stripes whose repair failed or fell short, and why (the blocks
    /// made for them are in the exNode all the same); `None` for a repair
    /// task that ended without saying which stripe (a panic: a bug).
    pub failed: Vec<(Option<u64>, String)>,
}

/// Repairs `x` (see the module documentation), storing new blocks on
/// `depots`; `probes` are of its allocations ([`crate::manage::probe_all`]).
/// With `check_all`, every live block of every stripe is read and checked
/// (the whole file and its parity are read), so corrupt blocks are made
/// again too; without, only stripes with a block lost are read, `k` blocks
/// each. `progress` counts the bytes stored.
pub async fn repair(
    x: &ExNode,
    probes: &[Probe],
    check_all: bool,
    depots: &[String],
    opts: &CopyOptions,
    pool: &Arc<Pool>,
    progress: &dyn Progress,
) -> Result<Repaired> {
    let Some(e) = Erasure::of(x)? else {
        return Err(Error::NotErasureCoded);
    };
    let live = |i: usize| probes.get(i).is_some_and(Probe::is_live);
    let margins = e.margins(x, live);
    // A stripe with fewer than k blocks left cannot be rebuilt.
    let lost: Vec<(u64, std::ops::Range<u64>)> = (margins.iter())
        .filter(|m| m.margin < 0)
        .map(|m| (m.stripe, m.bytes.clone()))
        .collect();
    let todo: Vec<Margin> = (margins.into_iter())
        .filter(|m| (check_all || !m.missing.is_empty()) && m.margin >= 0)
        .collect();
    let shared = Arc::new(Job {
        x: x.clone(),
        e,
        live: (0..x.allocations().count()).map(live).collect(),
        gone: (0..x.allocations().count())
            .map(|i| gone(probes, i))
            .collect(),
        depots: depots.to_vec(),
        load: Mutex::new(HashMap::new()),
        bad: Mutex::new(HashSet::new()),
        made: Mutex::new(Vec::new()),
        corrupt: Mutex::new(Vec::new()),
        opts: opts.clone(),
        pool: pool.clone(),
        check_all,
    });
    let total: u64 = (todo.iter())
        .map(|m| m.missing.len() as u64 * e.block_size)
        .sum();
    progress.start(Some(total));
    let slots = Arc::new(Semaphore::new(PARALLEL_STRIPES));
    let mut tasks = tokio::task::JoinSet::new();
    for m in &todo {
        let (job, m, slots) = (shared.clone(), m.clone(), slots.clone());
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await;
            let mut made = Vec::new();
            let r = job.stripe(&m, &mut made).await;
            (m.stripe, made, r)
        });
    }
    let mut new = Vec::new();
    let mut failed = Vec::new();
    let mut interrupted = false;
    let stopped = async {
        match opts.stop.clone() {
            Some(mut s) => {
                let _ = s.wait_for(|&v| v).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stopped);
    loop {
        let next = tokio::select! {
            d = tasks.join_next() => d,
            () = &mut stopped, if !interrupted => {
                tasks.abort_all();
                interrupted = true;
                continue;
            }
        };
        let Some(done) = next else { break };
        match done {
            Ok((s, made, r)) => {
                progress.advance("", made.iter().map(|m| m.alloc_length).sum());
                new.extend(made);
                if let Err(err) = r {
                    failed.push((Some(s), err.to_string()));
                }
            }
            Err(j) if j.is_cancelled() => {}
            Err(j) => failed.push((None, j.to_string())),
        }
    }
    if interrupted {
        let made = std::mem::take(&mut *shared.made.lock().unwrap_or_else(|e| e.into_inner()));
        let total = made.len();
        let kept = pool.release_all(made).await;
        return Err(Error::stopped(total, kept));
    }
    failed.sort_by_key(|(s, _)| s.map_or(u64::MAX, |s| s));
    let mut r = shared.result(new);
    (r.lost, r.failed) = (lost, failed);
    shared.drop_corrupt(&mut r);
    Ok(r)
}

/// Whether allocation `i`'s probe says it no longer exists.
fn gone(probes: &[Probe], i: usize) -> bool {
    matches!(probes.get(i), Some(Probe::Gone | Probe::Refused(_)))
}

/// One repair's shared state.
struct Job {
    x: ExNode,
    e: Erasure,
    live: Vec<bool>,
    /// Allocations that no longer exist (expired, freed, refused).
    gone: Vec<bool>,
    depots: Vec<String>,
    /// Blocks placed per depot: the next goes to the least loaded.
    load: Mutex<HashMap<String, usize>>,
    /// Depots that failed a store: not used again.
    bad: Mutex<HashSet<String>>,
    /// Every allocation made: what a failure releases.
    made: Mutex<Vec<Mapping>>,
    /// Allocations found corrupt (their stripes repaired): dropped.
    corrupt: Mutex<Vec<usize>>,
    opts: CopyOptions,
    pool: Arc<Pool>,
    /// Read and check every block, not just `k` of each stripe with one
    /// lost: corrupt blocks are found (and made again) too.
    check_all: bool,
}

/// A block of a stripe: its allocation number and mapping.
struct Member<'a> {
    at: usize,
    index: usize,
    m: &'a Mapping,
}

impl Job {
    /// The blocks of stripe `s` (allocation numbers of [`ExNode::allocations`]).
    fn members(&self, s: u64) -> Vec<Member<'_>> {
        let data = self.x.mappings.len();
        (self.x.allocations().enumerate())
            .filter_map(|(at, m)| {
                let (st, index) = self.e.shard_of(m, at >= data)?;
                (st == s).then_some(Member { at, index, m })
            })
            .collect()
    }

    /// Repairs one stripe, its new blocks pushed to `made` as they are
    /// stored (a failure part way keeps those).
    async fn stripe(&self, margin: &Margin, made: &mut Vec<Mapping>) -> Result<()> {
        let s = margin.stripe;
        let members = self.members(s);
        let k = self.e.scheme.data;
        let len = (members.iter())
            .filter(|b| b.index >= k)
            .map(|b| b.m.alloc_length)
            .max()
            .unwrap_or_else(|| {
                lors_exnode::erasure::shard_len(
                    members.iter().map(|b| b.m.alloc_length).max().unwrap_or(0),
                )
            });
        let wlen = usize::try_from(len).unwrap_or(usize::MAX);
        // Every live block, data first: read until k are good.
        let mut have: Vec<(usize, Vec<u8>)> = (0..k)
            .filter(|&i| self.e.block(s, i).is_empty())
            .map(|i| (i, Vec::new()))
            .collect();
        let mut missing: BTreeSet<usize> = margin.missing.iter().copied().collect();
        let mut readable: Vec<&Member> = members.iter().filter(|b| self.live[b.at]).collect();
        readable.sort_by_key(|b| b.index);
        let mut last = Cause::local(format!("stripe {s}: fewer than {k} blocks answer"));
        let mut corrupt = Vec::new();
        for b in &readable {
            if have.len() >= k && !self.check_all {
                break;
            }
            if have.iter().any(|(i, _)| *i == b.index) {
                continue;
            }
            match self.read_checked(b.m).await {
                Ok(bytes) => have.push((b.index, bytes)),
                Err(why) => {
                    tracing::info!(stripe = s, block = b.index, %why, "a block failed its check: it is made again");
                    last = why;
                    // Made again unless another copy of it is good.
                    missing.insert(b.index);
                    corrupt.push(b.at);
                }
            }
        }
        for (i, _) in &have {
            missing.remove(i);
        }
        if missing.is_empty() {
            return Ok(());
        }
        if have.len() < k {
            return Err(Error::StripesLost {
                scheme: self.e.scheme,
                stripes: vec![(s, self.e.stripe(s))],
                last,
            });
        }
        let scheme = self.e.scheme;
        let shards = tokio::task::spawn_blocking(move || {
            let refs: Vec<(usize, &[u8])> = have.iter().map(|(i, b)| (*i, b.as_slice())).collect();
            let data = scheme.recover(&refs, wlen)?;
            let drefs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let parity = scheme.encode(&drefs, wlen)?;
            Ok::<_, lors_exnode::erasure::ErasureError>((data, parity))
        })
        .await
        .map_err(|e| Error::io("rebuilding a stripe", std::io::Error::other(e.to_string())))??;
        let (data, parity) = shards;
        // Never two blocks of a stripe on one depot — those it still names
        // on depots that do not answer included (they may come back); a
        // block whose allocation is gone leaves its depot free.
        // A corrupt block is dropped once replaced: its depot may take a
        // block of the stripe, after every other depot.
        let taken: HashSet<String> = (members.iter())
            .filter(|b| !self.gone[b.at] && !corrupt.contains(&b.at))
            .filter_map(|b| b.m.depot())
            .collect();
        let last_resort: HashSet<String> = (members.iter())
            .filter(|b| corrupt.contains(&b.at))
            .filter_map(|b| b.m.depot())
            .collect();
        let taken = Mutex::new((taken, last_resort));
        self.corrupt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(&corrupt);
        for i in missing {
            let (record, bytes) = if i < k {
                let record = self.record(s, i)?;
                let n = usize::try_from(record.alloc_length).unwrap_or(usize::MAX);
                let bytes = data[i].get(..n).ok_or_else(|| {
                    Error::Erasure(lors_exnode::erasure::ErasureError::Shard(format!(
                        "data block {i} of stripe {s} is recorded longer than its stripe's shards"
                    )))
                })?;
                (record, bytes.to_vec())
            } else {
                let mut record = Mapping {
                    exnode_offset: self.e.stripe(s).start,
                    logical_length: len,
                    alloc_length: len,
                    ..Mapping::default()
                };
                record.metadata.extend(Erasure::block_meta(s, i));
                (record, parity[i - k].clone())
            };
            made.push(self.place(record, bytes, &taken).await?);
        }
        Ok(())
    }

    /// What a new data block `i` of stripe `s` records: the mapping of a
    /// lost copy, or one made from a sibling (its length and e2e
    /// functions); the caller gives it fresh capabilities.
    fn record(&self, s: u64, i: usize) -> Result<Mapping> {
        let Some(mut m) = self.e.data_record(&self.x, s, i) else {
            return Err(Error::Erasure(lors_exnode::erasure::ErasureError::Record(
                format!(
                    "data block {i} of stripe {s} has no mapping left to say how it was stored"
                ),
            )));
        };
        m.metadata
            .retain(|d| d.name != lors_exnode::functions::STORED_BLAKE3);
        if m.shard().is_none() {
            m.metadata.extend(Erasure::block_meta(s, i));
        }
        Ok(m)
    }

    /// Stores `bytes` as `record` on the least loaded depot holding no
    /// block of the stripe (`taken`), the next one when a depot fails.
    async fn place(
        &self,
        record: Mapping,
        bytes: Vec<u8>,
        taken: &Mutex<(HashSet<String>, HashSet<String>)>,
    ) -> Result<Mapping> {
        let watch = self.pool.watcher();
        let mut last = Cause::local(
            "no depot left that holds no block of this stripe: give more depots (--depot, or an L-Bone)",
        );
        loop {
            let pick = {
                let mut taken = taken.lock().unwrap_or_else(|e| e.into_inner());
                let bad = self.bad.lock().unwrap_or_else(|e| e.into_inner());
                let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
                let (held, last_resort) = &mut *taken;
                let d = (self.depots.iter())
                    .filter(|d| !held.contains(*d) && !bad.contains(*d))
                    .min_by_key(|d| (last_resort.contains(*d), load.get(*d).copied().unwrap_or(0)))
                    .cloned();
                if let Some(d) = &d {
                    held.insert(d.clone());
                    *load.entry(d.clone()).or_default() += 1;
                }
                d
            };
            let Some(addr) = pick else {
                return Err(Error::Store {
                    offset: record.exnode_offset,
                    last,
                });
            };
            let n = bytes.len() as u64;
            let (rel, dur) = (self.opts.reliability, self.opts.duration);
            let allocated = watch
                .run(&[&addr], Kind::Op, self.pool.allocate(&addr, rel, dur, n))
                .await;
            let caps = match allocated {
                Ok(c) => c,
                Err(e) => {
                    last = Cause::from(&e);
                    self.fail(addr);
                    continue;
                }
            };
            let mut m = record.clone();
            (m.read, m.write, m.manage) = (
                Some(caps.read.clone()),
                Some(caps.write.clone()),
                Some(caps.manage.clone()),
            );
            m.alloc_offset = 0;
            self.made
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(m.clone());
            match watch
                .run(
                    &[&addr],
                    Kind::Bytes(n),
                    self.pool.store(&caps.write, &bytes),
                )
                .await
            {
                Ok(_) => {
                    m.metadata.push(stored_digest(&bytes));
                    return Ok(m);
                }
                Err(e) => {
                    last = Cause::from(&e);
                    self.fail(addr);
                }
            }
        }
    }

    /// Depot `addr` failed a store: no block goes there again.
    fn fail(&self, addr: String) {
        self.bad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(addr);
    }

    /// Block `m` read whole and checked: its e2e checksums and its
    /// recorded BLAKE3, where it has them.
    async fn read_checked(&self, m: &Mapping) -> std::result::Result<Vec<u8>, Cause> {
        let cap: &Capability = m
            .read
            .as_ref()
            .ok_or_else(|| Cause::local("no read capability"))?;
        let addr = cap.address();
        let n = m.alloc_length;
        let read = self.pool.load(cap, m.alloc_offset, n);
        let bytes = self
            .pool
            .watcher()
            .run(&[&addr], Kind::Bytes(n), read)
            .await
            .map_err(|e| Cause::from(&e))?;
        let m2 = m.clone();
        tokio::task::spawn_blocking(move || {
            match Codec::from_mapping(&m2) {
                Ok(Some(c)) => c.decode_mapping(&m2, &bytes).map(|_| ()),
                Ok(None) => Codec::check_stored_digest(&m2, &bytes),
                Err(e) => Err(e),
            }
            .map(|()| bytes)
            .map_err(|e| Cause::local(format!("{e} (from {addr})")))
        })
        .await
        .map_err(|e| Cause::local(e.to_string()))?
    }

    /// Corrupt blocks replaced: out of `r`'s exNode, and into its list
    /// to free once that is saved.
    fn drop_corrupt(&self, r: &mut Repaired) {
        let bad: Vec<Mapping> =
            std::mem::take(&mut *self.corrupt.lock().unwrap_or_else(|e| e.into_inner()))
                .into_iter()
                .filter_map(|i| self.x.allocation(i).cloned())
                .collect();
        let named = |m: &Mapping| !bad.iter().any(|f| f.read == m.read);
        r.exnode.mappings.retain(named);
        r.exnode.parity.retain(named);
        r.dropped += bad.len();
        r.to_free.extend(bad);
    }

    /// The exNode after the repair: the new blocks added, those whose
    /// allocation is gone dropped.
    fn result(&self, new: Vec<Mapping>) -> Repaired {
        let stripes = (new.iter().filter_map(|m| m.shard().map(|(s, _)| s)))
            .collect::<BTreeSet<_>>()
            .len();
        let data = self.x.mappings.len();
        let mut y = ExNode {
            metadata: self.x.metadata.clone(),
            mappings: Vec::new(),
            parity: Vec::new(),
            holes: self.x.holes.clone(),
        };
        let mut dropped = 0;
        for (i, m) in self.x.allocations().enumerate() {
            if self.gone[i] {
                dropped += 1;
                continue;
            }
            match i < data {
                true => y.mappings.push(m.clone()),
                false => y.parity.push(m.clone()),
            }
        }
        let blocks = new.len();
        for m in new {
            let parity = m.shard().is_some_and(|(_, i)| i >= self.e.scheme.data);
            match parity {
                true => y.parity.push(m),
                false => y.mappings.push(m),
            }
        }
        // Data mappings in file order, as uploads write them.
        y.mappings.sort_by_key(|m| m.exnode_offset);
        y.parity.sort_by_key(|m| m.shard());
        Repaired {
            exnode: y,
            stripes,
            blocks,
            dropped,
            to_free: Vec::new(),
            lost: Vec::new(),
            failed: Vec::new(),
        }
    }
}
