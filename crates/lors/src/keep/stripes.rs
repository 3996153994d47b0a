//! A keeper cycle over an erasure-coded file: leases as for any file (the
//! parity blocks' too); healing by repair — each stripe with a block lost
//! or corrupt gets it made again ([`crate::repair`]) — instead of copies.

use std::sync::Arc;

use lors_exnode::ExNode;
use lors_exnode::erasure::Erasure;

use super::{Kept, Policy, StripeShort, Unhealed};
use crate::error::{Cause, Error, Result};
use crate::manage::Probe;
use crate::pool::Pool;
use crate::progress::NoProgress;

/// What the cycle found before it acts: the probes of every allocation,
/// and what the scrub read and found corrupt.
pub(super) struct Seen {
    pub probes: Vec<Probe>,
    pub corrupt: Vec<(usize, String)>,
    pub scrubbed: u64,
    /// Leases extended, before the scrub.
    pub refreshed: usize,
    /// Leases not extended, with why.
    pub not_refreshed: Vec<(usize, Cause)>,
}

/// One cycle (see [`super::cycle`]) over the erasure-coded `x`.
pub(super) async fn cycle(
    x: &ExNode,
    e: Erasure,
    seen: Seen,
    places: &super::Places<'_>,
    policy: &Policy,
    pool: &Arc<Pool>,
) -> Result<Kept> {
    let (refreshed, not_refreshed) = (seen.refreshed, seen.not_refreshed);
    // A corrupt block is made again like a lost one.
    let mut probes = seen.probes;
    for (i, why) in &seen.corrupt {
        probes[*i] = Probe::Failed(format!("corrupt: {why}"));
    }
    let margins = e.margins(x, |i| probes[i].is_live());
    let whole = margins.iter().all(|m| m.missing.is_empty());
    let mut kept = Kept {
        exnode: x.clone(),
        changed: false,
        copies: 1,
        refreshed,
        not_refreshed,
        healed: 0,
        trimmed: 0,
        lost: (margins.iter())
            .filter(|m| m.margin < 0)
            .map(|m| m.bytes.clone())
            .collect(),
        short: Vec::new(),
        heal_error: None,
        scrubbed: seen.scrubbed,
        corrupt: seen.corrupt,
        dropped_corrupt: Vec::new(),
        stale: Vec::new(),
        stripes: Some((e.scheme, Vec::new())),
    };
    if whole {
        return Ok(kept);
    }
    let (depots, unplaced) = places.or_none().await;
    match crate::repair::repair(x, &probes, false, depots, &policy.copy, pool, &NoProgress).await {
        Ok(r) => {
            kept.short = (r.failed.iter())
                .filter_map(|(s, _)| *s)
                .map(|s| e.stripe(s))
                .collect();
            // Without depots, why there are none is the error that matters.
            let unhealed = |why: String| match &unplaced {
                Some(u) => Unhealed::NoDepots(u.clone()),
                None => Unhealed::Failed(Cause::local(why)),
            };
            kept.heal_error = (r.failed.first()).map(|(s, why)| {
                unhealed(match s {
                    Some(s) => format!("stripe {s}: {why}"),
                    None => why.clone(),
                })
            });
            // Each stripe still short, with its own margin and reason.
            // (A block made this cycle is live; one the input had, as probed.)
            let after = &r.exnode;
            let present = |i: usize| {
                let m = after.allocation(i);
                let old = m.and_then(|m| x.allocations().position(|o| o.read == m.read));
                old.is_none_or(|o| probes[o].is_live())
            };
            let now = e.margins(after, present);
            if let Some((_, list)) = kept.stripes.as_mut() {
                for (s, why) in r.failed.iter().filter_map(|(s, w)| Some((s.as_ref()?, w))) {
                    let margin = now.iter().find(|m| m.stripe == *s).map_or(-1, |m| m.margin);
                    list.push(StripeShort {
                        stripe: *s,
                        bytes: e.stripe(*s),
                        margin,
                        why: unhealed(why.clone()),
                    });
                }
            }
            kept.healed = r.blocks;
            kept.trimmed = r.dropped;
            kept.changed = r.blocks > 0 || r.dropped > 0;
            kept.exnode = r.exnode;
            // Blocks on depots silent past the grace that the repair
            // replaced: freed when their depot answers again.
            let named = crate::commit::named(&kept.exnode);
            kept.stale = (x.allocations().enumerate())
                .filter(|(i, _)| matches!(probes[*i], Probe::Unreachable(_) | Probe::NoAnswer(_)))
                .filter(|(_, m)| crate::commit::key(m).is_some_and(|k| !named.contains(&k)))
                .map(|(_, m)| m.clone())
                .collect();
            // Corrupt blocks whose stripe was made whole again: dropped,
            // for the caller to free once the new exNode is written.
            let data = x.mappings.len();
            let fixed: Vec<lors_exnode::Mapping> = (kept.corrupt.iter())
                .filter_map(|(i, _)| {
                    let m = x.allocation(*i)?;
                    let (s, _) = e.shard_of(m, *i >= data)?;
                    (!r.failed.iter().any(|(f, _)| *f == Some(s))).then(|| m.clone())
                })
                .collect();
            if !fixed.is_empty() {
                drop_from(&mut kept.exnode, &fixed);
                kept.changed = true;
                kept.trimmed += fixed.len();
                kept.dropped_corrupt = fixed;
            }
            kept.dropped_corrupt.extend(r.to_free);
        }
        Err(err @ Error::Interrupted { .. }) => return Err(err),
        Err(err) => kept.heal_error = Some(Unhealed::Failed(Cause::from(&err))),
    }
    Ok(kept)
}

/// `x` without the allocations in `gone` (by read capability).
fn drop_from(x: &mut ExNode, gone: &[lors_exnode::Mapping]) {
    let keep = |m: &lors_exnode::Mapping| !gone.iter().any(|g| g.read == m.read);
    x.mappings.retain(keep);
    x.parity.retain(keep);
}
