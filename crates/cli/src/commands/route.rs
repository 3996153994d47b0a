//! `lors route`: move a file onto other depots.

use lors::manage::{Replicas, Selection};
use lors::uri::ExnodeRef;

use crate::exit::UsageError;
use crate::report::{ReportOpts, Reporter, Unit};

/// Move a file: copy its blocks onto the target depots (depot to depot,
/// every source and target depot busy at once, the client only steering),
/// then remove and release the replicas elsewhere. Interrupted, it keeps
/// the copies it made: run it again to copy the rest.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors route --depot d7:6714 --depot d8:6714 -c 2 run42.xnd
  lors route -H lbone.example.org:8767 -l \"city= Brno\" run42.xnd   # onto the depot nearest Brno
  lors route --depot b1,b2,b3,b4 run42.xnd      # site A to site B: each A depot sends to a B depot")]
pub struct Args {
    #[command(flatten)]
    bwlimit: super::Bwlimit,
    /// The exNode.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…")]
    exnode: ExnodeRef,
    #[command(flatten)]
    targets: super::Targets,
    /// Replicas per block on the targets [default: as many as the file
    /// keeps now, else `copies=`, `LORS_COPIES` or `COPIES`, else 1].
    #[arg(short, long)]
    copies: Option<usize>,
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

pub fn run(mut a: Args) -> anyhow::Result<()> {
    let flags = a.lease.layer(a.targets.layer());
    let s = super::settings(&a.net, flags, Some(&a.exnode))?;
    let x = lors::xnd::load(&a.exnode.path)?;
    let coded = lors_exnode::erasure::Erasure::of(&x)?;
    // A move keeps the file as safe as it was: its copy count unless -c
    // says otherwise.
    let copies = match (a.copies, &coded) {
        (Some(0), _) => {
            return Err(UsageError("-c 0: a route keeps at least one copy".into()).into());
        }
        (Some(n), _) => n,
        (None, Some(_)) => 1,
        (None, None) => x.copies_policy().or(s.copies).unwrap_or(1),
    };
    // A coded file moves block by block, each stripe onto as many depots.
    let spread = match coded {
        Some(_) if copies != 1 => {
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
    a.copies = Some(copies);
    let want = spread.map_or(copies, |e| e.blocks());
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
    if spread.is_none() && targets.len() < copies {
        return Err(UsageError(format!(
            "the file keeps {copies} copies of each block, on distinct depots, and {} target depots were given: give more, or say -c {}",
            targets.len(),
            targets.len().max(1)
        ))
        .into());
    }
    let out = a.output.clone().map_or(a.exnode.path.clone(), |o| o.path);
    let pool = std::sync::Arc::new(a.bwlimit.pool(s.client()));
    // Before any depot is touched: a typo in -o costs nothing.
    let edit = super::begin(&rt, (&a.exnode.path, x), &out, &pool)?;
    let r = route(&a, &s, &rt, &edit, &targets, &pool, &progress);
    super::end(&rt, edit, &pool, r)
}

/// The route itself, under the output's lock: copies, the new exNode
/// saved, the old replicas released.
#[allow(clippy::too_many_arguments)]
fn route(
    a: &Args,
    s: &lors::settings::Settings,
    rt: &tokio::runtime::Runtime,
    edit: &lors::job::edit::Edit,
    targets: &[String],
    pool: &std::sync::Arc<lors::Pool>,
    progress: &std::sync::Arc<Reporter>,
) -> anyhow::Result<()> {
    let (x, out) = (edit.exnode(), edit.out());
    let (stop, signal) = super::stop_on_signal(rt);
    let opts = lors::manage::CopyOptions {
        duration: s.duration,
        reliability: s.reliability,
        stop: Some(stop),
    };
    let y = rt.block_on(async {
        let want = Replicas::OnTargets(a.copies.unwrap_or(1));
        lors::manage::replicate(x, targets, want, &opts, pool, progress.as_ref()).await
    });
    progress.finish();
    // Interrupted with copies made: they are kept, named beside the old
    // ones, for a rerun to finish.
    if let Err(lors::Error::Interrupted { stored, .. }) = &y
        && stored.allocations().count() > x.allocations().count()
    {
        crate::report::clear();
        let mut stored = stored.clone();
        super::save(rt, edit, &mut stored, Vec::new(), pool)?;
        let n = stored.allocations().count() - x.allocations().count();
        eprintln!(
            "lors: route interrupted: the {n} copies made so far are kept in {} beside the old ones; run the same `lors route` on it again to copy the rest",
            out.display()
        );
        return Err(crate::commands::interrupted(&signal));
    }
    let y = crate::left::copies_outcome("route", y, out, &signal)?;
    let mut t = lors::manage::trim(&y, &Selection::NotOn(targets.to_vec()), false)?;
    if lors_exnode::erasure::Erasure::of(&t.exnode)?.is_none() {
        // What the file keeps from now on, for writes and the keeper.
        let n = i64::try_from(a.copies.unwrap_or(1)).unwrap_or(i64::MAX);
        let policy = lors_exnode::model::Metadata::integer(lors_exnode::model::COPIES_META, n);
        t.exnode.set_meta(policy);
    }
    // The new exNode is saved before anything only the old one named is
    // released: a failure or a kill in between leaves the old file or the
    // new one whole, and what is to be freed recorded in OUT.partial.
    let old = match a.keep_old {
        true => Vec::new(),
        false => t.dropped.iter().map(|(_, m)| m.clone()).collect(),
    };
    if edit.new_file() && !a.keep_old {
        super::input_keeps(&a.exnode.path);
    }
    let done = match super::save(rt, edit, &mut t.exnode, old, pool) {
        Ok(saved) => saved.committed,
        Err(e) => {
            // Nothing was released; the copies made are named nowhere, and
            // the end of the session frees them (its journal lists them).
            return Err(e.context(format!(
                "route: the new exNode could not be saved; {} is unchanged, every old replica kept and the new copies released",
                a.exnode.path.display(),
            )));
        }
    };
    // Old mappings keep their place at the front of the augmented exNode,
    // so they are named by the numbers `lors ls` showed for the input.
    let numbering = x.numbering();
    for (i, why) in done.not_released(&t.dropped) {
        let n = numbering.number(i);
        eprintln!("lors: old mapping {n} was not released: {why}");
    }
    let pairs: Vec<Pair> = (progress.tallies().into_iter())
        .filter_map(|(name, bytes)| {
            let (from, to) = name.split_once(" → ")?;
            Some(Pair {
                from: from.to_owned(),
                to: to.to_owned(),
                bytes,
            })
        })
        .collect();
    if progress.is_json() {
        progress.done(&Summary {
            depots: targets,
            removed: t.removed,
            not_released: done.kept.len(),
            exnode: &out.display().to_string(),
            pairs,
        });
    } else if !a.report.quiet {
        let senders: std::collections::BTreeSet<&str> =
            pairs.iter().map(|p| p.from.as_str()).collect();
        eprintln!(
            "lors: routed onto {} depots ({} depot pairs, from {} depots); {} old mappings removed -> {}",
            targets.len(),
            pairs.len(),
            senders.len(),
            t.removed,
            out.display()
        );
    }
    Ok(())
}

/// `--json`: where a route put the file, and what each depot sent which.
#[derive(serde::Serialize)]
struct Summary<'a> {
    depots: &'a [String],
    removed: usize,
    not_released: usize,
    exnode: &'a str,
    pairs: Vec<Pair>,
}

/// Bytes one depot sent another.
#[derive(serde::Serialize)]
struct Pair {
    from: String,
    to: String,
    bytes: u64,
}
