//! `lors trim`: remove mappings.

use lors::uri::ExnodeRef;

use lors::manage::Selection;
use lors::{Pool, Progress as _};

use crate::exit::UsageError;
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
    // What to remove, checked before anything else (a mapping that is not
    // there, a last replica), with nothing touched.
    let before = lors::xnd::load(&a.exnode.path)?;
    let sel = selection(&a, &before)?;
    lors::manage::trim(&before, &sel, a.allow_holes)?;
    let out = a.output.clone().map_or(a.exnode.path.clone(), |o| o.path);
    let rt = super::runtime(super::Threads::One)?;
    let pool = std::sync::Arc::new(Pool::new(s.client()));
    // Under the lock from before the exNode is read to after it is saved.
    let edit = super::begin(&rt, (&a.exnode.path, before.clone()), &out, &pool)?;
    let r = trim(&a, &rt, &pool, &edit, &before, &sel);
    super::end(&rt, edit, &pool, r)
}

/// What `-m` or `--depot` selects in `x`.
fn selection(a: &Args, x: &lors_exnode::ExNode) -> anyhow::Result<Selection> {
    let numbering = x.numbering();
    Ok(match (a.mappings.is_empty(), a.depots.is_empty()) {
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
    })
}

/// The trim, under the output's lock; `before` is the exNode as `sel`
/// was chosen from.
fn trim(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    pool: &std::sync::Arc<Pool>,
    edit: &lors::job::edit::Edit,
    before: &lors_exnode::ExNode,
    sel: &Selection,
) -> anyhow::Result<()> {
    let (x, out) = (edit.exnode(), edit.out());
    // Mapping numbers name what the user saw: not another version.
    edit.check_as_read(before)?;
    let numbering = x.numbering();
    let mut t = lors::manage::trim(x, sel, a.allow_holes)?;
    let new_file = edit.new_file();
    let progress = Reporter::new("trim", Unit::Allocations, &a.report, false);
    // A record beside an exNode (`OUT.partial`) frees only what that
    // exNode no longer names: a run that died before its save recorded
    // allocations the old exNode still holds.
    let named_beside = lors::job::edit::named_beside(&a.exnode.path)?;
    let mut not_released: Vec<(usize, String)> = Vec::new();
    if a.decrement && !new_file {
        let mut old = Vec::new();
        for (i, m) in &t.dropped {
            match lors::commit::key(m) {
                Some(k) if named_beside.contains(&k) => not_released.push((
                    *i,
                    "the exNode beside this record still names it: not released".into(),
                )),
                _ if m.manage.is_none() => not_released.push((*i, "no manage capability".into())),
                _ => old.push(m.clone()),
            }
        }
        progress.start(Some(old.len() as u64));
        let done = super::save(rt, edit, &mut t.exnode, old, pool)?.committed;
        progress.advance("", done.freed as u64);
        progress.finish();
        not_released.extend(done.not_released(&t.dropped));
    } else {
        progress.start(Some(0));
        super::save(rt, edit, &mut t.exnode, Vec::new(), pool)?;
        progress.finish();
        if a.decrement {
            super::input_keeps(&a.exnode.path);
        }
    }
    not_released.sort_by_key(|(i, _)| *i);
    for (i, e) in &not_released {
        let n = numbering.number(*i);
        eprintln!("lors: mapping {n}: removed, but its allocation was not released: {e}");
    }
    if progress.is_json() {
        progress.done(&Summary {
            removed: t.removed,
            not_released: not_released.len(),
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
