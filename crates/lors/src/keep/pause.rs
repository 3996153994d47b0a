//! A depot that does not answer for a moment is not a lost one: its
//! replicas count as there for a grace period, measured from the first
//! cycle that found it silent (recorded on each of its mappings), before
//! the keeper makes their blocks again elsewhere. A mapping whose depot
//! answers again loses the mark.

use lors_exnode::model::{Metadata, Value};
use lors_exnode::{ExNode, Mapping};

use crate::manage::Probe;

/// Mapping metadata: when (Unix seconds) a keeper first found the
/// mapping's depot not answering, since when it has not answered.
pub const SILENT_SINCE_META: &str = "lors_silent_since";

/// Whether `p` says the depot did not answer (rather than answering that
/// the allocation is gone or refused).
fn silent(p: &Probe) -> bool {
    matches!(p, Probe::Unreachable(_) | Probe::NoAnswer(_))
}

fn since(m: &Mapping) -> Option<u64> {
    m.metadata
        .iter()
        .find_map(|d| match (&d.name[..], &d.value) {
            (SILENT_SINCE_META, Value::Integer(t)) => u64::try_from(*t).ok(),
            _ => None,
        })
}

/// `x` with each allocation's mark brought up to date by `probes` at
/// `now` (set on one that went silent, dropped from one that answers),
/// and whether any mark changed; and the probes with each replica still
/// within `grace` of going silent counted as there.
pub(super) fn apply(
    x: &ExNode,
    probes: Vec<Probe>,
    grace: std::time::Duration,
    now: u64,
) -> (ExNode, bool, Vec<Probe>) {
    let mut y = x.clone();
    let mut changed = false;
    let mut out = probes;
    let allocations = y.mappings.iter_mut().chain(y.parity.iter_mut());
    for (i, m) in allocations.enumerate() {
        let Some(p) = out.get(i) else { continue };
        if !silent(p) {
            let before = m.metadata.len();
            m.metadata.retain(|d| d.name != SILENT_SINCE_META);
            changed |= m.metadata.len() != before;
            continue;
        }
        let t = match since(m) {
            Some(t) => t,
            None => {
                let t = i64::try_from(now).unwrap_or(i64::MAX);
                m.metadata.push(Metadata::integer(SILENT_SINCE_META, t));
                changed = true;
                now
            }
        };
        if now.saturating_sub(t) < grace.as_secs() {
            out[i] = Probe::Live(lors_ibp::ProbeInfo {
                read_refs: 1,
                write_refs: 0,
                size: m.alloc_offset.saturating_add(m.alloc_length),
                max_size: m.alloc_offset.saturating_add(m.alloc_length),
                // (Not refreshed on this account: refreshes read the real
                // probes.)
                seconds_left: i64::MAX,
                reliability: 2,
                alloc_type: 1,
            });
        }
    }
    (y, changed, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x_of(n: usize) -> ExNode {
        let mut x = ExNode::default();
        for i in 0..n {
            let m = Mapping {
                exnode_offset: i as u64 * 10,
                logical_length: 10,
                alloc_length: 10,
                ..Mapping::default()
            };
            x.mappings.push(m);
        }
        x
    }

    #[test]
    fn a_silent_depot_counts_as_there_until_the_grace_ends() {
        let x = x_of(2);
        let grace = std::time::Duration::from_secs(600);
        let probes = vec![Probe::Unreachable("down".into()), Probe::Gone];
        let (y, changed, p) = apply(&x, probes.clone(), grace, 1000);
        assert!(changed && p[0].is_live() && !p[1].is_live());
        assert_eq!(since(&y.mappings[0]), Some(1000));
        // Still silent 5 minutes on: still there, the mark as it was.
        let (z, changed, p) = apply(&y, probes.clone(), grace, 1300);
        assert!(!changed && p[0].is_live());
        // Past the grace: silent, for the keeper to heal around.
        let (_, _, p) = apply(&z, probes.clone(), grace, 1600);
        assert!(!p[0].is_live());
        // Answering again: the mark goes.
        let (back, changed, _) = apply(&z, vec![Probe::Gone, Probe::Gone], grace, 1700);
        assert!(changed && since(&back.mappings[0]).is_none());
        // No grace: silent is silent at once.
        let (_, _, p) = apply(&x, probes, std::time::Duration::ZERO, 1000);
        assert!(!p[0].is_live());
    }
}
