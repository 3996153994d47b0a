//! `lors trim`: remove mappings.

use lors::uri::ExnodeRef;

use lors::Pool;
use lors::manage::Selection;

use crate::UsageError;
use crate::report::{ReportOpts, Reporter, Unit};

/// Remove mappings by index or depot; with --decrement also release their allocations.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors trim --depot d2:6714 --decrement run42.xnd   # drop and free everything on d2
  lors trim -m 0,3 -o smaller.xnd run42.xnd          # drop mappings 0 and 3 (see lors ls)")]
pub struct Args {
    /// The exNode.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…")]
    exnode: ExnodeRef,
    /// Mapping numbers to remove, as `lors ls` and `lors_ls` show them.
    #[arg(
        short = 'm',
        long = "mappings",
        value_delimiter = ',',
        conflicts_with = "depots"
    )]
    mappings: Vec<usize>,
    /// Remove every mapping on this depot (repeatable).
    #[arg(
        long = "depot",
        value_name = "HOST[:PORT]",
        value_delimiter = ',',
        value_parser = super::depot_arg
    )]
    depots: Vec<String>,
    /// Also release the allocations (DECR their read count so the depot frees them now).
    #[arg(long = "decrement")]
    decrement: bool,
    /// Allow removing the last replica of a block (the file gets holes).
    #[arg(long)]
    allow_holes: bool,
    #[command(flatten)]
    net: super::NetOpts,
    #[command(flatten)]
    report: ReportOpts,
    /// Write the result here [default: replace the input].
    #[arg(short, long, value_name = "NEW.xnd", value_parser = super::exnode_arg)]
    output: Option<ExnodeRef>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let s = super::settings(&a.net, Default::default(), Some(&a.exnode))?;
    let x = lors::xnd::load(&a.exnode.path)?;
    let numbering = x.numbering();
    let sel = match (a.mappings.is_empty(), a.depots.is_empty()) {
        (false, _) => Selection::Indices(
            a.mappings
                .iter()
                .map(|&n| {
                    numbering.index(n).ok_or_else(|| {
                        UsageError(format!(
                            "there is no mapping {n}: {} has {} (numbered 0 to {}, see lors ls)",
                            a.exnode.path.display(),
                            x.allocations().count(),
                            x.allocations().count().saturating_sub(1)
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        (true, false) => Selection::Depots(a.depots.clone()),
        (true, true) => {
            return Err(UsageError(
                "say what to remove: -m INDEX[,INDEX] or --depot HOST:PORT".into(),
            )
            .into());
        }
    };
    let rt = super::runtime(super::Threads::One)?;
    let progress = Reporter::new("trim", Unit::Allocations, &a.report, false);
    let t = rt.block_on(lors::manage::trim(
        &x,
        &sel,
        a.decrement,
        a.allow_holes,
        &Pool::new(s.client()),
        progress.as_ref(),
    ))?;
    progress.finish();
    let out = a.output.map_or(a.exnode.path, |o| o.path);
    lors::xnd::save(&out, &t.exnode)?;
    for (i, e) in &t.release_errors {
        let n = numbering.number(*i);
        eprintln!("lors: mapping {n}: removed, but its allocation was not released: {e}");
    }
    if progress.is_json() {
        progress.done(&Summary {
            removed: t.removed,
            not_released: t.release_errors.len(),
            exnode: &out.display().to_string(),
        });
    } else if !a.report.quiet {
        eprintln!("lors: removed {} mappings -> {}", t.removed, out.display());
    }
    Ok(())
}

/// `--json`: what a trim removed.
#[derive(serde::Serialize)]
struct Summary<'a> {
    removed: usize,
    not_released: usize,
    exnode: &'a str,
}
