//! The per-depot runner: jobs on many depots, each over one connection,
//! a dead or hung depot's jobs failed without waiting for it again.

use std::collections::BTreeMap;

use lors_ibp::{Capability, Connection};

use crate::error::Cause;
use crate::pool::Pool;
use crate::progress::Progress;

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
