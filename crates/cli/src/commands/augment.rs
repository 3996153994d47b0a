//! `lors augment`: add replicas, copied depot to depot.

use lors::uri::ExnodeRef;

use crate::report::{ReportOpts, Reporter, Unit};

/// Add replicas of every block on other depots (copied depot to depot);
/// with --repair, remake the lost blocks of an erasure-coded file.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors augment --depot d4:6714 -c 1 -o run42-3copies.xnd run42.xnd
  lors augment --depot d4:6714 --depot d5:6714 -c 2 run42.xnd     # in place
  LBONE_SERVER=lbone.example.org:8767 lors augment -c 1 -l \"city= Tokyo\" run42.xnd
  lors augment --repair --depot d10:6714,d11:6714,d12:6714 run42.xnd   # --ec file")]
pub struct Args {
    #[command(flatten)]
    bwlimit: super::Bwlimit,
    /// The exNode.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…")]
    exnode: ExnodeRef,
    #[command(flatten)]
    targets: super::Targets,
    /// New replicas per block, each on a depot that does not hold it yet.
    #[arg(short, long, default_value_t = 1, conflicts_with = "repair")]
    copies: usize,
    /// For an erasure-coded file (`lors upload --ec`): remake every block
    /// that is lost (its depot does not answer, its allocation is gone)
    /// or corrupt, from k good blocks of its stripe, each on a depot that
    /// holds no block of that stripe; the stripes get their full margin
    /// back (see `lors stat`). Reads and checks every block (see
    /// --lost-only).
    #[arg(long)]
    repair: bool,
    /// With --repair: read only the stripes with a block lost (k blocks
    /// each), not every block; quicker after a depot loss, but corrupt
    /// blocks of whole stripes go unnoticed.
    #[arg(long, requires = "repair")]
    lost_only: bool,
    #[command(flatten)]
    lease: super::LeaseOpts,
    #[command(flatten)]
    net: super::NetOpts,
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
    lors::plan::check_exnode(&x)?;
    let progress = Reporter::new("augment", Unit::Bytes, &a.report, false);
    let rt = super::runtime(super::Threads::Many)?;
    if a.repair {
        return repair(&a, &s, &x, &rt, progress);
    }
    if x.is_erasure_coded() {
        return Err(crate::exit::UsageError(
            "the file is erasure-coded (lors upload --ec): its redundancy is its parity, not copies; lors augment --repair remakes lost blocks, and more redundancy takes a stronger code (upload it again with --ec K+M, more parity)".into(),
        )
        .into());
    }
    // From an L-Bone, the best depots that hold none of the file yet.
    let found = a.targets.find(&rt, &x, &s, a.copies, true)?;
    let (stop, signal) = super::stop_on_signal(&rt);
    let opts = lors::manage::CopyOptions {
        duration: s.duration,
        reliability: s.reliability,
        stop: Some(stop),
    };
    let out = a.output.clone().map_or(a.exnode.path.clone(), |o| o.path);
    let pool = std::sync::Arc::new(a.bwlimit.pool(s.client()));
    // Before any depot is touched: a typo in -o costs nothing.
    let edit = super::begin(&rt, (&a.exnode.path, x), &out, &pool)?;
    let x = edit.exnode();
    let y = rt.block_on(async {
        lors::manage::augment(x, &found.depots, a.copies, &opts, &pool, progress.as_ref()).await
    });
    progress.finish();
    let before = x.mappings.len();
    // A failed save leaves the copies named nowhere: the edit's end frees
    // them (its journal lists them).
    let r = crate::left::copies_outcome("augment", y, &out, &signal).and_then(|mut y| {
        super::save(&rt, &edit, &mut y, Vec::new(), &pool)?;
        Ok(y)
    });
    let y = super::end(&rt, edit, &pool, r)?;
    let added = y.mappings.len() - before;
    if progress.is_json() {
        progress.done(&Summary {
            added,
            exnode: &out.display().to_string(),
        });
    } else if !a.report.quiet {
        eprintln!("lors: added {added} mappings -> {}", out.display());
    }
    Ok(())
}

/// `--json`: what an augment added.
#[derive(serde::Serialize)]
struct Summary<'a> {
    added: usize,
    exnode: &'a str,
}

/// `--repair`: the lost blocks of an erasure-coded file made again.
fn repair(
    a: &Args,
    s: &lors::settings::Settings,
    x: &lors_exnode::ExNode,
    rt: &tokio::runtime::Runtime,
    progress: std::sync::Arc<Reporter>,
) -> anyhow::Result<()> {
    let e = lors_exnode::erasure::Erasure::of(x)?.ok_or(lors::Error::NotErasureCoded)?;
    let probes = super::probe_all(x, s)?;
    // Any depot can take a block of a stripe it holds none of.
    let found = a.targets.find(rt, x, s, e.scheme.blocks(), false)?;
    let (stop, signal) = super::stop_on_signal(rt);
    let opts = lors::manage::CopyOptions {
        duration: s.duration,
        reliability: s.reliability,
        stop: Some(stop),
    };
    let out = a.output.as_ref().map_or(&a.exnode.path, |o| &o.path);
    let pool = std::sync::Arc::new(a.bwlimit.pool(s.client()));
    let edit = super::begin(rt, (&a.exnode.path, x.clone()), out, &pool)?;
    let r = (|| {
        let x = edit.exnode();
        let r = rt.block_on(async {
            let check_all = !a.lost_only;
            lors::repair::repair(
                x,
                &probes,
                check_all,
                &found.depots,
                &opts,
                &pool,
                progress.as_ref(),
            )
            .await
        });
        progress.finish();
        let mut r = crate::left::copies_outcome("repair", r, out, &signal)?;
        // Saved before the corrupt blocks it replaced are freed (the
        // input's, unless the result is a new file beside it).
        let free = r.to_free.clone();
        let done = super::save(rt, &edit, &mut r.exnode, free, &pool)?.committed;
        if let Some(rec) = &done.record {
            eprintln!(
                "lors: {} corrupt blocks replaced but not released: named in {} to free later",
                done.kept.len(),
                rec.display()
            );
        }
        Ok(r)
    })();
    let r = super::end(rt, edit, &pool, r)?;
    if progress.is_json() {
        progress.done(&RepairSummary {
            stripes: r.stripes,
            blocks: r.blocks,
            dropped: r.dropped,
            exnode: &out.display().to_string(),
        });
    } else if !a.report.quiet {
        eprintln!(
            "lors: repaired {} stripes: {} blocks made again{} -> {}",
            r.stripes,
            r.blocks,
            if r.dropped > 0 {
                format!(", {} gone allocations dropped", r.dropped)
            } else {
                String::new()
            },
            out.display()
        );
    }
    for (stripe, why) in &r.failed {
        match stripe {
            Some(s) => eprintln!("lors: stripe {s} not repaired: {why}"),
            None => eprintln!("lors: a stripe's repair ended without a result: {why}"),
        }
    }
    if let Some((first, bytes)) = r.lost.first() {
        anyhow::bail!(
            "{} stripes have fewer than the {} blocks needed to rebuild them (first: stripe {first}, bytes {}..{}): their bytes are lost unless a depot comes back",
            r.lost.len(),
            e.scheme.data,
            bytes.start,
            bytes.end
        );
    }
    if !r.failed.is_empty() {
        anyhow::bail!(
            "{} stripes could not be repaired (above); run it again with more depots",
            r.failed.len()
        );
    }
    Ok(())
}

/// `--json`: what a repair did.
#[derive(serde::Serialize)]
struct RepairSummary<'a> {
    stripes: usize,
    blocks: usize,
    dropped: usize,
    exnode: &'a str,
}
