//! Operations on an existing exNode: augment (more replicas, copied depot to
//! depot), trim (drop mappings, optionally releasing their allocations),
//! refresh (extend leases), modify (strip capabilities for sharing), route
//! (augment onto target depots, then trim the rest), and probing for stat.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use lors_exnode::{ExNode, Mapping};
use lors_ibp::caps::CapKind;
use lors_ibp::proto::Reliability;
use lors_ibp::{Capability, Connection, ProbeInfo};

use crate::error::{Error, Result};
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
    duration: Duration,
    reliability: Reliability,
    pool: &Pool,
    progress: &dyn Progress,
) -> Result<ExNode> {
    let want = Replicas::More(copies);
    replicate(x, depots, want, duration, reliability, pool, progress).await
}

/// Copies blocks depot-to-depot onto `depots` as `want` says, each new
/// replica on a depot that does not hold that block yet; `progress` counts
/// the bytes copied. New mappings are appended; the input exNode is not
/// changed. When it fails, the replicas it made are released.
pub async fn replicate(
    x: &ExNode,
    depots: &[String],
    want: Replicas,
    duration: Duration,
    reliability: Reliability,
    pool: &Pool,
    progress: &dyn Progress,
) -> Result<ExNode> {
    if depots.is_empty() {
        return Err(Error::NoDepots);
    }
    let mut out = x.clone();
    let mut load: BTreeMap<String, usize> = depots.iter().map(|d| (d.clone(), 0)).collect();
    // Per block: its replicas, the depots holding it, the copies it needs.
    type Plan = ((u64, u64), Vec<usize>, HashSet<String>, usize);
    let plan: Vec<Plan> = blocks(x)
        .into_iter()
        .map(|(range, idx)| {
            let holders: HashSet<String> =
                idx.iter().filter_map(|&i| x.mappings[i].depot()).collect();
            let copies = match want {
                Replicas::More(n) => n,
                Replicas::OnTargets(n) => {
                    n.saturating_sub(holders.iter().filter(|d| load.contains_key(*d)).count())
                }
            };
            (range, idx, holders, copies)
        })
        .collect();
    progress.start(Some(
        plan.iter().map(|((_, len), _, _, n)| len * *n as u64).sum(),
    ));
    for ((offset, len), idx, mut holders, copies) in plan {
        if copies == 0 {
            continue;
        }
        let sources: Vec<&Mapping> = idx
            .iter()
            .map(|&i| &x.mappings[i])
            .filter(|m| m.read.is_some())
            .collect();
        if sources.is_empty() {
            return Err(Error::Unreadable {
                offset,
                end: offset + len,
                last: "no replica has a read capability".into(),
            });
        }
        for _ in 0..copies {
            let mut last = String::from("no depot left that does not already hold this block");
            let mut done = false;
            // Least-loaded target first; every source tried before giving up.
            let mut targets: Vec<String> = load
                .keys()
                .filter(|d| !holders.contains(*d))
                .cloned()
                .collect();
            targets.sort_by_key(|d| load[d]);
            'targets: for t in targets {
                for src in &sources {
                    let cap = src.read.as_ref().expect("filtered above");
                    let size = src.alloc_length.max(1);
                    let attempt = async {
                        let caps = pool.allocate(&t, reliability, duration, size).await?;
                        if let Err(e) = pool
                            .send(cap, &caps.write, src.alloc_offset, src.alloc_length)
                            .await
                        {
                            // No exNode will name it: free it now.
                            let _ = pool.release(&caps.manage).await;
                            return Err(e);
                        }
                        Ok::<_, lors_ibp::Error>(caps)
                    }
                    .await;
                    match attempt {
                        Ok(caps) => {
                            out.mappings.push(Mapping {
                                alloc_offset: 0,
                                read: Some(caps.read),
                                write: Some(caps.write),
                                manage: Some(caps.manage),
                                ..(*src).clone()
                            });
                            holders.insert(t.clone());
                            *load.get_mut(&t).expect("target is in the map") += 1;
                            progress.advance(&t, len);
                            done = true;
                            break 'targets;
                        }
                        Err(e) => {
                            last = e.to_string();
                            progress.event(&Event::Retry {
                                depot: t.clone(),
                                why: format!("copy of the block at byte {offset} failed: {e}"),
                            });
                        }
                    }
                }
            }
            if !done {
                // The replicas made so far are in no exNode the caller
                // keeps: free them rather than leave them to their lease.
                for m in &out.mappings[x.mappings.len()..] {
                    if let Some(cap) = &m.manage {
                        let _ = pool.release(cap).await;
                    }
                }
                return Err(Error::Store { offset, last });
            }
        }
    }
    Ok(out)
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
    /// Mappings whose release (DECR) failed: `(index, error)`. They are removed
    /// from the exNode all the same; their leases will expire.
    pub release_errors: Vec<(usize, String)>,
}

/// Removes the selected mappings. With `release`, each removed allocation's
/// read reference is dropped first (MANAGE DECR), so the depot frees it now
/// instead of at expiry; the depots are asked in parallel and `progress`
/// counts allocations released. Refuses to remove the last replica of any
/// block unless `allow_holes`.
pub async fn trim(
    x: &ExNode,
    sel: &Selection,
    release: bool,
    allow_holes: bool,
    pool: &Pool,
    progress: &dyn Progress,
) -> Result<Trimmed> {
    if !allow_holes {
        for ((offset, len), idx) in blocks(x) {
            if idx.iter().all(|&i| sel.contains(i, &x.mappings[i])) {
                return Err(Error::Unreadable {
                    offset,
                    end: offset + len,
                    last: "trimming would remove its last replica (pass --allow-holes to do it anyway)".into(),
                });
            }
        }
    }
    let mut keep = ExNode {
        metadata: x.metadata.clone(),
        mappings: Vec::new(),
    };
    let mut removed = 0;
    let mut jobs = Vec::new();
    let mut release_errors = Vec::new();
    for (i, m) in x.mappings.iter().enumerate() {
        if !sel.contains(i, m) {
            keep.mappings.push(m.clone());
            continue;
        }
        removed += 1;
        match (&m.manage, release) {
            (_, false) => {}
            (None, true) => release_errors.push((i, "no manage capability".to_string())),
            (Some(cap), true) => jobs.push((i, cap.clone())),
        }
    }
    progress.start(Some(jobs.len() as u64));
    let done = by_depot(jobs, pool, progress, |mut c, cap| async move {
        let r = c.decr(&cap, CapKind::Read).await;
        (c, r)
    })
    .await;
    release_errors.extend(
        done.into_iter()
            .filter_map(|(i, r)| Some((i, r.err()?.to_string()))),
    );
    release_errors.sort_unstable_by_key(|&(i, _)| i);
    Ok(Trimmed {
        exnode: keep,
        removed,
        release_errors,
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

/// Extends the lease of every mapping that has a manage capability, the
/// depots in parallel; `progress` counts allocations done. Returns
/// per-mapping outcomes in exNode order: new seconds left, or the error.
pub async fn refresh(
    x: &ExNode,
    lease: Lease,
    pool: &Pool,
    progress: &dyn Progress,
) -> Vec<(usize, std::result::Result<i64, String>)> {
    let mut out = Vec::new();
    let mut jobs = Vec::new();
    for (i, m) in x.mappings.iter().enumerate() {
        match &m.manage {
            None => out.push((i, Err("no manage capability".into()))),
            Some(cap) => jobs.push((i, cap.clone())),
        }
    }
    progress.start(Some(jobs.len() as u64));
    let done = by_depot(jobs, pool, progress, move |mut c, cap| async move {
        let r = extend(&mut c, &cap, lease).await;
        (c, r)
    })
    .await;
    out.extend(
        done.into_iter()
            .map(|(i, r)| (i, r.map_err(|e| e.to_string()))),
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
        Lease::To(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Lease::By(d) => now
            .seconds_left
            .saturating_add(i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
        Lease::Max => {
            let rid = cap.rid.clone().unwrap_or_else(|| "0".into());
            let st = c.status(&rid, "ibp").await?;
            i64::try_from(st.get_u64("DR").unwrap_or(0))
                .unwrap_or(i64::MAX)
                .max(1)
        }
    };
    let rel = lors_ibp::proto::Reliability::from_number(now.reliability);
    c.change(cap, now.max_size, secs.max(1), rel).await?;
    Ok(c.probe(cap).await?.seconds_left)
}

/// A copy of the exNode without the chosen capabilities, for sharing: strip
/// write and manage to hand out a read-only file.
pub fn modify(x: &ExNode, strip_read: bool, strip_write: bool, strip_manage: bool) -> ExNode {
    let mut y = x.clone();
    for m in &mut y.mappings {
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
    /// Anything else: a depot error, a malformed reply, no capability.
    Failed(String),
}

impl Probe {
    fn from_result(r: std::result::Result<ProbeInfo, lors_ibp::Error>) -> Probe {
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

    /// One word for listings: `live`, `expired`, `refused`, `unreachable`, `failed`.
    pub fn state(&self) -> &'static str {
        match self {
            Probe::Live(_) => "live",
            Probe::Gone => "expired",
            Probe::Refused(_) => "refused",
            Probe::Unreachable(_) => "unreachable",
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
            Probe::Failed(e) => e.clone(),
        }
    }
}

/// Probes every mapping (manage key, else read key): what the depots report.
/// Depots are probed in parallel, each over one connection; once a depot
/// cannot be reached its other mappings are reported unreachable without
/// waiting for it again.
pub async fn probe_all(x: &ExNode, pool: &Pool) -> Vec<Probe> {
    let jobs = x
        .mappings
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let c = m.manage.as_ref().or(m.read.as_ref()).or(m.write.as_ref())?;
            Some((i, c.clone()))
        })
        .collect();
    let mut out = vec![Probe::Failed("no capability".into()); x.mappings.len()];
    for (i, r) in by_depot(jobs, pool, &NoProgress, |mut c, cap| async move {
        let r = c.probe(&cap).await;
        (c, r)
    })
    .await
    {
        out[i] = match r {
            Err(Failure::Skipped(why)) => Probe::Unreachable(why),
            Err(Failure::Op(e)) => Probe::from_result(Err(e)),
            Ok(p) => Probe::Live(p),
        };
    }
    out
}

/// Why one job of [`by_depot`] has no result.
#[derive(Debug)]
enum Failure {
    /// The operation failed.
    Op(lors_ibp::Error),
    /// Not tried: the depot could not be reached for an earlier job.
    Skipped(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Op(e) => e.fmt(f),
            Failure::Skipped(why) => f.write_str(why),
        }
    }
}

/// Runs `op` on every `(index, capability)` of `jobs`: the depots in
/// parallel, each over one connection (which `op` hands back), its jobs one
/// after another. Once a
/// depot cannot be reached (connect refused, timed out, connection lost),
/// its remaining jobs fail with that error without waiting for it again.
/// Each finished job advances `progress` by one on its depot. Results are
/// in no particular order.
async fn by_depot<T, F, Fut>(
    jobs: Vec<(usize, Capability)>,
    pool: &Pool,
    progress: &dyn Progress,
    op: F,
) -> Vec<(usize, std::result::Result<T, Failure>)>
where
    T: Send + 'static,
    F: Fn(Connection, Capability) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = (Connection, std::result::Result<T, lors_ibp::Error>)> + Send,
{
    let mut per: BTreeMap<String, Vec<(usize, Capability)>> = BTreeMap::new();
    for (i, c) in jobs {
        per.entry(c.address()).or_default().push((i, c));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut set = tokio::task::JoinSet::new();
    for (addr, caps) in per {
        let (cfg, op, tx) = (pool.config().clone(), op.clone(), tx.clone());
        set.spawn(async move {
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
                            let (c, r) = op(c, cap).await;
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
                let _ = tx.send((i, addr.clone(), r));
            }
        });
    }
    drop(tx);
    let mut out = Vec::new();
    while let Some((i, addr, r)) = rx.recv().await {
        progress.advance(&addr, 1);
        out.push((i, r));
    }
    while let Some(done) = set.join_next().await {
        if let Err(e) = done {
            tracing::warn!(error = %e, "a depot's task ended abnormally");
        }
    }
    out
}

/// Byte ranges of `[0, logical size)` that no live mapping covers: what a
/// download could not read. `live[i]` says whether mapping `i` answered.
pub fn uncovered(x: &ExNode, live: &[bool]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = x
        .mappings
        .iter()
        .zip(live)
        .filter(|(_, l)| **l)
        .map(|(m, _)| (m.exnode_offset, m.logical_end()))
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
