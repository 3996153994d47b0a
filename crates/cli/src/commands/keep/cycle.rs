//! One cycle of `lors keep` over every exNode ([`lors::keep::Keeper`]),
//! and what it says.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use lors::keep::{Found, Keeper, Outcome, Scrub, Totals};
use lors::manage::Lease;
use lors::settings::Settings;
use lors_exnode::ExNode;

use super::{Args, files, say};

/// New replicas go where `--depot` or the L-Bone says, beside the blocks'
/// holders.
struct Targets<'a>(&'a crate::commands::Targets);

impl lors::keep::Targets for Targets<'_> {
    fn depots_for<'a>(
        &'a self,
        x: &'a ExNode,
        s: &'a Settings,
        copies: usize,
    ) -> Pin<Box<dyn Future<Output = Found> + Send + 'a>> {
        Box::pin(async move {
            (self.0.query(x, s, copies, true).await)
                .map(|found| found.depots)
                .map_err(|e| format!("{e:#}"))
        })
    }
}

/// One cycle over every exNode, each file said as it is done: the
/// totals (a stopped cycle's so far, its last line not said).
pub(super) fn one_cycle(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    lease: Lease,
    margin: Duration,
    stop: &tokio::sync::watch::Receiver<bool>,
    scrub: &mut Scrub,
) -> anyhow::Result<Totals> {
    let json = a.report.json;
    let all = files::of_cycle(a, scrub)?;
    let targets = Targets(&a.targets);
    let keeper = Keeper {
        copies: a.copies.map(|c| c as usize),
        lease,
        margin,
        grace: a.grace,
        file_deadline: a.file_deadline(),
        stop: stop.clone(),
        targets: &targets,
    };
    let said = |path: &std::path::Path, o: &Outcome, t: &Totals| -> anyhow::Result<()> {
        let name = path.display().to_string();
        match o {
            Outcome::Kept(k) => say::kept(&name, k, json, a.report.quiet),
            Outcome::Busy(holder) => say::busy(&name, *holder, json),
            Outcome::Failed(e) => say::failed(t, &name, e, json),
        }
    };
    let cycle = rt.block_on(keeper.cycle(&all, scrub, said))?;
    if cycle.finished {
        say::cycle_done(&cycle.totals, json, a.report.quiet)?;
    }
    Ok(cycle.totals)
}
