//! `lors refresh`: extend leases.

use std::time::Duration;

use lors::Pool;
use lors::manage::Lease;
use lors::uri::ExnodeRef;
use lors_ibp::ClientConfig;

use super::{duration_arg, read_exnode};
use crate::UsageError;

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
    let x = read_exnode(&a.exnode.path)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let res = rt.block_on(lors::manage::refresh(
        &x,
        lease,
        &Pool::new(ClientConfig::default()),
    ));
    let mut failed = 0;
    let numbering = x.numbering();
    let mut rows: Vec<_> = res
        .iter()
        .map(|(i, r)| (numbering.number(*i), *i, r))
        .collect();
    rows.sort_unstable_by_key(|&(n, ..)| n);
    for (n, i, r) in rows {
        let depot = x.mappings[i].depot().unwrap_or_default();
        match r {
            Ok(secs) => super::outln!("{n:>3} {depot:<22} expires in {secs} s"),
            Err(e) => {
                failed += 1;
                super::outln!("{n:>3} {depot:<22} not refreshed: {e}");
            }
        }
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} allocations were not refreshed",
        res.len()
    );
    Ok(())
}
