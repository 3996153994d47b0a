//! `lors refresh`: extend leases.

use std::time::Duration;

use lors::Pool;
use lors::manage::Lease;
use lors::uri::ExnodeRef;
use lors_ibp::StatusCode;

use super::duration_arg;
use crate::exit::UsageError;
use crate::report::{ReportOpts, Reporter, Unit};
use lors_ibp::units::Secs;

/// Extend the leases of an exNode's allocations (MANAGE CHNG).
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors refresh --by 2h run42.xnd    # two more hours on every allocation
  lors refresh --to 7d run42.xnd    # expire 7 days from now
  lors refresh --max run42.xnd      # as long as each depot allows")]
pub struct Args {
    /// The exNode.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…")]
    exnode: ExnodeRef,
    /// Extend by this much.
    #[arg(long = "by", value_parser = duration_arg, conflicts_with_all = ["to", "max"])]
    by: Option<Duration>,
    /// Set to expire this long from now.
    #[arg(long = "to", value_parser = duration_arg, conflicts_with = "max")]
    to: Option<Duration>,
    /// To each depot's maximum.
    #[arg(long)]
    max: bool,
    #[command(flatten)]
    net: super::NetOpts,
    #[command(flatten)]
    report: ReportOpts,
    /// With -v, one line per allocation.
    #[arg(from_global)]
    verbose: u8,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let lease = match (a.by, a.to, a.max) {
        (Some(d), _, _) => Lease::By(d),
        (_, Some(d), _) => Lease::To(d),
        (_, _, true) => Lease::Max,
        _ => {
            return Err(UsageError(
                "say how: --by DURATION (extend by), --to DURATION (from now) or --max (maximum)"
                    .into(),
            )
            .into());
        }
    };
    let s = super::settings(&a.net, Default::default(), Some(&a.exnode))?;
    let x = lors::xnd::load(&a.exnode.path)?;
    let rt = super::runtime(super::Threads::One)?;
    let progress = Reporter::new("refresh", Unit::Allocations, &a.report, false);
    let res = rt.block_on(lors::manage::refresh(
        &x,
        lease,
        &Pool::new(s.client()),
        progress.as_ref(),
    ));
    progress.finish();
    let json = progress.is_json();
    let numbering = x.numbering();
    let mut rows: Vec<_> = res
        .iter()
        .map(|(i, r)| (numbering.number(*i), *i, r))
        .collect();
    rows.sort_unstable_by_key(|&(n, ..)| n);
    // Failures are always listed; successes only with -v, else summed up.
    let mut depots = std::collections::BTreeSet::new();
    let mut soonest: Option<(i64, String)> = None;
    let mut failures = Vec::new();
    for (n, i, r) in rows {
        let depot = (x.allocation(i).and_then(|m| m.depot())).unwrap_or_default();
        match r {
            Ok(secs) => {
                if a.verbose > 0 && !json {
                    super::outln!("{n:>3} {depot:<22} expires in {secs} s");
                }
                if soonest.as_ref().is_none_or(|(s, _)| *secs < *s) {
                    soonest = Some((*secs, depot.clone()));
                }
                depots.insert(depot);
            }
            Err(e) => {
                failures.push(Failure {
                    mapping: n,
                    depot,
                    error: &e.text,
                    code: e.code,
                });
            }
        }
    }
    if !json {
        // One line per depot and cause, not per mapping: a lease past a
        // depot's limit is refused for every allocation there alike.
        let mut groups: Vec<(&Failure, Vec<usize>)> = Vec::new();
        for f in &failures {
            let same = |g: &&mut (&Failure, _)| (&g.0.depot, g.0.error) == (&f.depot, f.error);
            match groups.iter_mut().find(same) {
                Some((_, ns)) => ns.push(f.mapping),
                None => groups.push((f, vec![f.mapping])),
            }
        }
        for (f, ns) in groups {
            let (depot, e) = (&f.depot, f.error);
            let which = match ns.as_slice() {
                [n] => format!("mapping {n}"),
                _ => format!(
                    "mappings {}",
                    ns.iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let hint = if f.code == Some(StatusCode::WOULD_EXCEED_POLICY) {
                " (longer than the depot allows: ask for less, or --max for the most it gives)"
            } else {
                ""
            };
            super::outln!("{depot}: {which} not refreshed: {e}{hint}");
        }
    }
    let ok = res.len() - failures.len();
    if json {
        progress.done(&Summary {
            refreshed: ok,
            depots: depots.len(),
            soonest_s: soonest.as_ref().map(|(s, _)| *s),
            failed: &failures,
        });
    } else if let Some((secs, depot)) = &soonest
        && !a.report.quiet
    {
        super::outln!(
            "refreshed {ok} allocation{} on {} depot{}; the soonest expires in {} ({depot})",
            if ok == 1 { "" } else { "s" },
            depots.len(),
            if depots.len() == 1 { "" } else { "s" },
            Secs(u64::try_from(*secs).unwrap_or(0))
        );
    }
    anyhow::ensure!(
        failures.is_empty(),
        "{} of {} allocations were not refreshed",
        failures.len(),
        res.len()
    );
    Ok(())
}

/// `--json`: what a refresh did.
#[derive(serde::Serialize)]
struct Summary<'a> {
    refreshed: usize,
    depots: usize,
    /// Seconds left on the allocation that expires first.
    soonest_s: Option<i64>,
    failed: &'a [Failure<'a>],
}

/// One allocation not refreshed.
#[derive(serde::Serialize)]
struct Failure<'a> {
    mapping: usize,
    depot: String,
    error: &'a str,
    #[serde(skip)]
    code: Option<StatusCode>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn leases_read_as_people_say_them() {
        for (s, want) in [
            (9, "9s"),
            (250, "4m 10s"),
            (3 * 3600 + 300, "3h 5m"),
            (2 * 86_400 + 3 * 3600 + 59, "2d 3h"),
        ] {
            assert_eq!(lors_ibp::units::Secs(s).to_string(), want);
        }
    }
}
