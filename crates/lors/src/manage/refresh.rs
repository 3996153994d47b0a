//! Leases extended.

use std::time::Duration;

use lors_exnode::ExNode;
use lors_ibp::{Capability, Connection};

use super::by_depot;
use crate::error::Cause;
use crate::pool::Pool;
use crate::progress::Progress;

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
