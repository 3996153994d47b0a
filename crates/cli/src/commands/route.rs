//! `lors route`: move a file onto other depots.

use lors::manage::{Replicas, Selection};
use lors::uri::ExnodeRef;

use crate::UsageError;
use crate::report::{ReportOpts, Reporter, Unit};

/// Move a file: copy its blocks onto the target depots (depot to depot), then
/// remove and release the replicas elsewhere.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors route --depot d7:6714 --depot d8:6714 -c 2 run42.xnd
  lors route -H lbone.example.org:8767 -l \"city= Brno\" run42.xnd   # onto the depot nearest Brno")]
pub struct Args {
    #[command(flatten)]
    bwlimit: super::Bwlimit,
    /// The exNode.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…")]
    exnode: ExnodeRef,
    #[command(flatten)]
    targets: super::Targets,
    /// Replicas per block on the targets.
    #[arg(short, long, default_value_t = 1)]
    copies: usize,
    #[command(flatten)]
    lease: super::LeaseOpts,
    #[command(flatten)]
    net: super::NetOpts,
    /// Keep the old allocations (only drop them from the exNode).
    #[arg(long)]
    keep_old: bool,
    /// Write the result here [default: replace the input].
    #[arg(short, long, value_name = "NEW.xnd", value_parser = super::exnode_arg)]
    output: Option<ExnodeRef>,
    #[command(flatten)]
    report: ReportOpts,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let flags = a.lease.layer(a.targets.layer());
    let s = super::settings(&a.net, flags, Some(&a.exnode))?;
    let x = lors::xnd::load(&a.exnode.path)?;
    // A coded file moves block by block, each stripe onto as many depots.
    let spread = match lors_exnode::erasure::Erasure::of(&x)? {
        Some(_) if a.copies != 1 => {
            return Err(UsageError(
                "-c: an erasure-coded file keeps one copy of each block; its parity is its redundancy".into(),
            )
            .into());
        }
        Some(e) => Some(e.scheme),
        None => None,
    };
    // Replicas already on a target count toward the copies wanted.
    let progress = Reporter::new("route", Unit::Bytes, &a.report, false);
    let rt = super::runtime(super::Threads::Many)?;
    let want = spread.map_or(a.copies, |e| e.blocks());
    let targets = a.targets.find(&rt, &x, &s, want, false)?.depots;
    if let Some(e) = spread.filter(|e| targets.len() < e.blocks()) {
        return Err(UsageError(format!(
            "the file is erasure-coded {}+{}: its blocks go to at least {} depots (never two of a stripe on one), and {} were given",
            e.data,
            e.parity,
            e.blocks(),
            targets.len()
        ))
        .into());
    }
    let (stop, signal) = super::stop_on_signal(&rt);
    let opts = lors::manage::CopyOptions {
        duration: s.duration,
        reliability: s.reliability,
        stop: Some(stop),
    };
    let out = a.output.clone().map_or(a.exnode.path.clone(), |o| o.path);
    let t = rt.block_on(async {
        let pool = std::sync::Arc::new(a.bwlimit.pool(s.client()));
        let want = Replicas::OnTargets(a.copies);
        let y =
            lors::manage::replicate(&x, &targets, want, &opts, &pool, progress.as_ref()).await?;
        lors::manage::trim(
            &y,
            &Selection::NotOn(targets.clone()),
            !a.keep_old,
            false,
            &pool,
            &lors::NoProgress,
        )
        .await
    });
    progress.finish();
    let t = super::upload::copies_outcome("route", t, &out, &signal)?;
    lors::xnd::save(&out, &t.exnode)?;
    // Old mappings keep their place at the front of the augmented exNode,
    // so they are named by the numbers `lors ls` showed for the input.
    let numbering = x.numbering();
    for (i, e) in &t.release_errors {
        let n = numbering.number(*i);
        eprintln!("lors: old mapping {n} was not released: {e}");
    }
    if progress.is_json() {
        progress.done(&Summary {
            depots: &targets,
            removed: t.removed,
            not_released: t.release_errors.len(),
            exnode: &out.display().to_string(),
        });
    } else if !a.report.quiet {
        eprintln!(
            "lors: routed onto {} depots; {} old mappings removed -> {}",
            targets.len(),
            t.removed,
            out.display()
        );
    }
    Ok(())
}

/// `--json`: where a route put the file.
#[derive(serde::Serialize)]
struct Summary<'a> {
    depots: &'a [String],
    removed: usize,
    not_released: usize,
    exnode: &'a str,
}
