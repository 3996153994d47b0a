//! What the depots report of an exNode's allocations.

use lors_exnode::ExNode;
use lors_ibp::ProbeInfo;

use super::{Failure, by_depot};
use crate::pool::Pool;
use crate::progress::NoProgress;

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
