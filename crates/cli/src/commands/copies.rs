//! `lors cp` and `lors rm`: exNodes copied and removed as files are, with
//! the references on the depots that keep every copy's data its own.
//!
//! Each exNode holds one reference (IBP's read count) on every allocation
//! it names, and a lors command frees only by dropping its file's
//! reference (MANAGE DECR): the depot frees an allocation when no
//! reference is left. `lors cp` takes the new file's references; a copy
//! made with `cp`, `rsync` or `tar` takes them the first time a lors
//! command or the mount changes it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use lors::Pool;
use lors::uri::ExnodeRef;

use crate::exit::UsageError;

/// Copy an exNode: the copy takes its own reference on every allocation,
/// so trimming, routing, overwriting or removing either file leaves the
/// other whole.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors cp run42.xnd backup/run42.xnd      # a second file naming the same blocks
  lors cp run42.xnd backup/               # into a directory, under the same name
  lors rm run42.xnd                       # later: backup/run42.xnd still downloads

A copy made with cp or rsync takes its references the first time a lors
command or the mount changes it; until then, removing the original frees
what the copy names. Use lors cp.")]
pub struct CpArgs {
    /// The exNode to copy.
    #[arg(value_parser = super::exnode_arg, value_name = "SRC.xnd|lors://…")]
    source: ExnodeRef,
    /// The new file, or a directory to put it in.
    #[arg(value_name = "DST.xnd|DIR")]
    target: PathBuf,
    #[command(flatten)]
    net: super::NetOpts,
}

pub fn cp(a: CpArgs) -> anyhow::Result<()> {
    let s = super::settings(&a.net, Default::default(), Some(&a.source))?;
    let x = lors::xnd::load(&a.source.path)?;
    let target = match a.target.is_dir() {
        true => {
            let name = (a.source.path.file_name())
                .ok_or_else(|| UsageError(format!("{}: names no file", a.source.path.display())))?;
            a.target.join(name)
        }
        false => a.target.clone(),
    };
    if std::fs::symlink_metadata(&target).is_ok() {
        return Err(UsageError(format!(
            "{} exists: remove it first (`lors rm` frees what it names), or copy to another name",
            target.display()
        ))
        .into());
    }
    let rt = super::runtime(super::Threads::One)?;
    let pool = Arc::new(Pool::new(s.client()));
    let borrowed = (rt.block_on(lors::job::copy_file(x, &target, &pool))).with_context(|| {
        format!(
            "copying {} to {}",
            a.source.path.display(),
            target.display()
        )
    })?;
    if borrowed > 0 {
        eprintln!(
            "lors: {borrowed} allocations could not take a reference for {} (their depots did not answer): until `lors keep` or another copy takes one, freeing {} frees them",
            target.display(),
            a.source.path.display()
        );
    }
    Ok(())
}

/// Remove exNodes and free what they name: each file's reference on its
/// allocations is dropped (MANAGE DECR), so an allocation another copy
/// still names stays; the file goes once every one is released.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors rm run42.xnd                       # free its blocks (those no other copy names) and remove it
  lors rm data/*.xnd

A depot that does not answer keeps the file, emptied, beside a record of
what is left to free (FILE.partial): the same command again finishes it.")]
pub struct RmArgs {
    /// The exNodes.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…", required = true)]
    exnodes: Vec<ExnodeRef>,
    #[command(flatten)]
    net: super::NetOpts,
    /// Say nothing but errors.
    #[arg(short, long)]
    quiet: bool,
}

pub fn rm(a: RmArgs) -> anyhow::Result<()> {
    let rt = super::runtime(super::Threads::One)?;
    let mut failed = 0;
    for r in &a.exnodes {
        let s = super::settings(&a.net, Default::default(), Some(r))?;
        let pool = Arc::new(Pool::new(s.client()));
        match remove(&rt, &r.path, &pool) {
            Ok(freed) if !a.quiet => eprintln!(
                "lors: removed {} ({freed} allocations released)",
                r.path.display()
            ),
            Ok(_) => {}
            Err(e) => {
                failed += 1;
                eprintln!("lors: {}: {e:#}", r.path.display());
            }
        }
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} exNodes not removed",
        a.exnodes.len()
    );
    Ok(())
}

/// Removes one exNode: its references dropped, then the file. The number
/// of allocations released.
fn remove(rt: &tokio::runtime::Runtime, path: &Path, pool: &Arc<Pool>) -> anyhow::Result<usize> {
    Ok(rt.block_on(lors::commit::remove(path, pool, super::LOCK_WAIT))?)
}
