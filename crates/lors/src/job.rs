//! Jobs: a transfer from its first check to what it leaves behind. Whether
//! an unfinished job is resumed, recorded in `OUT.partial` or released, and
//! how its exNode is saved, is decided here once; the command line and
//! Python only map their options onto a job and say (or raise) what it
//! returns, so the same interrupted job leaves the same state from either.
//!
//! ```no_run
//! # async fn f(pool: std::sync::Arc<lors::Pool>, opts: lors::upload::UploadOptions) {
//! use lors::job::upload::{Source, Upload};
//! let job = Upload { opts, out: Some("run42.xnd".into()), force: false, slots: None };
//! let source = Source::open("run42.dat".as_ref()).unwrap();
//! let ready = job.prepare(&source, &pool).await.unwrap();
//! match job.run(ready, source, pool, std::sync::Arc::new(lors::NoProgress), None).await {
//!     Ok(done) => println!("{} bytes", done.exnode.logical_size()),
//!     Err(failed) => eprintln!("{failed}; {}", failed.left().map(|l| l.to_string()).unwrap_or_default()),
//! }
//! # }
//! ```

use std::path::{Path, PathBuf};

use lors_exnode::ExNode;

use crate::leftover::{self, LeftoverError};
use crate::xnd::XndError;
use crate::{Error, Pool};

pub mod edit;
pub mod upload;

/// How long a job that changes an exNode waits for another lors command
/// (a keeper's cycle, a second route) to let go of it.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a job was refused before anything was stored.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The output exists and replacing it was not asked for.
    #[error("{} already exists and may hold the only capabilities to its data", .0.display())]
    Exists(PathBuf),
    /// The output cannot be written (a missing or read-only directory).
    #[error("cannot write the exNode; nothing was uploaded")]
    Output(#[source] XndError),
    /// The record beside the output is of another upload.
    #[error(transparent)]
    Foreign(LeftoverError),
    /// Reading the input, a record or the exNode being replaced failed.
    #[error(transparent)]
    Lors(#[from] Error),
}

/// Refuses, before anything is stored, an output that would overwrite an
/// existing file (unless `force`) or that cannot be written.
pub fn check_output(out: &Path, force: bool) -> Result<(), Refused> {
    if !force && std::fs::symlink_metadata(out).is_ok() {
        return Err(Refused::Exists(out.to_owned()));
    }
    crate::commit::check_output(out).map_err(Refused::Output)
}

/// What an unfinished job left on the depots, and where it is named.
#[derive(Debug, Default)]
pub struct Left {
    /// Allocations it made and released (blocks in flight, copies).
    pub released: usize,
    /// Whole blocks named in [`Left::record`], for a rerun to resume from.
    pub blocks: usize,
    /// Allocations not released (their depots could not be reached).
    pub stranded: usize,
    /// Where the blocks and stranded allocations are named (`OUT.partial`).
    pub record: Option<PathBuf>,
    /// Why they could not be named: they hold space until their lease ends.
    pub unrecorded: Option<String>,
    /// Whether running the same job again resumes from the record.
    pub resumable: bool,
    /// The depots the record names, for `lors trim --depot …`.
    pub depots: Vec<String>,
}

impl Left {
    /// Whether nothing is left on the depots.
    pub fn is_nothing(&self) -> bool {
        self.blocks == 0 && self.stranded == 0
    }

    /// The `lors trim` arguments that free what the record names.
    pub fn trim_args(&self) -> Option<String> {
        let record = self.record.as_ref()?;
        Some(leftover::trim_args_for(&self.depots, record))
    }
}

impl std::fmt::Display for Left {
    /// One clause for a user: what is left and where it is named (then
    /// how to resume or free it, then [`Left::released_clause`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_nothing() {
            return write!(f, "nothing is left on the depots");
        }
        let what = match (self.blocks, self.stranded) {
            (b, 0) => format!("{b} stored blocks"),
            (0, s) => format!("{s} allocations on unreachable depots"),
            (b, s) => format!("{b} stored blocks and {s} allocations that could not be released"),
        };
        match (&self.record, &self.unrecorded) {
            (Some(r), _) => write!(f, "{what} are named in {}", r.display()),
            (None, Some(why)) => write!(
                f,
                "{what} could not be recorded ({why}): they expire with their lease"
            ),
            (None, None) => write!(f, "{what} expire with their lease"),
        }
    }
}

impl Left {
    /// `; the N allocations made were released`, when any were.
    pub fn released_clause(&self) -> String {
        match self.released {
            0 => String::new(),
            n => format!("; the {n} allocations made were released"),
        }
    }
}

/// Names `stored` and `stranded` in the record beside `out`, with the
/// upload's `identity` when it may be resumed from: what is left, said.
pub(crate) fn record(
    out: &Path,
    stored: &ExNode,
    stranded: &ExNode,
    identity: Option<&str>,
    released: usize,
) -> Left {
    let blocks = stored.mappings.iter().map(|m| m.exnode_offset);
    let blocks = blocks.collect::<std::collections::BTreeSet<_>>().len();
    let mut left = Left {
        released,
        blocks,
        stranded: stranded.allocations().count(),
        ..Left::default()
    };
    if left.is_nothing() {
        return left;
    }
    let path = leftover::record_path(out);
    let identity = identity.filter(|_| blocks > 0);
    match leftover::keep(&path, stored, stranded, identity) {
        Ok(()) => {
            left.resumable = identity.is_some();
            left.depots = crate::xnd::load(&path)
                .map(|x| x.depots())
                .unwrap_or_default();
            left.record = Some(path);
        }
        Err(e) => left.unrecorded = Some(crate::error::chain(&e)),
    }
    left
}

/// Names in the record beside `out` the allocations `stranded` that a copy
/// job (augment, route, repair, dissemination) could not release, beside
/// the `released` it did: what is left, said.
pub fn unreleased(out: &Path, stranded: &ExNode, released: usize) -> Left {
    record(out, &ExNode::default(), stranded, None, released)
}

/// Saves `x`, made from the exNode `from` (if any), at `out`; when the
/// save fails, what `x` names and `from` does not — allocations this job
/// made, which nothing else names — is released before the error returns.
pub async fn save_new(
    out: &Path,
    x: &ExNode,
    from: Option<&ExNode>,
    pool: &std::sync::Arc<Pool>,
) -> Result<(), Error> {
    let Err(e) = crate::xnd::save(out, x) else {
        return Ok(());
    };
    let theirs = from.map(crate::commit::named).unwrap_or_default();
    let made = (x.allocations())
        .filter(|m| crate::commit::key(m).is_some_and(|k| !theirs.contains(&k)))
        .filter(|m| !crate::commit::is_borrowed(m));
    pool.release_all(made.cloned().collect()).await;
    Err(e.into())
}

/// Copies the exNode `x` to the new file `target` (as `cp` would, but
/// with references of its own on what it names, so removing either file
/// leaves the other its data). The number of allocations that could not
/// take a reference (their depots did not answer): removing the original
/// frees them until one is taken.
pub async fn copy_file(
    mut x: ExNode,
    target: &Path,
    pool: &std::sync::Arc<Pool>,
) -> Result<usize, Error> {
    crate::commit::check_output(target)?;
    let borrowed = crate::commit::take_references(&mut x, |_| true, pool).await;
    // The references taken are x's own; the borrowed ones are the original's.
    save_new(target, &x, None, pool).await?;
    Ok(borrowed)
}

/// Releases `stored` and `stranded` (a job with nowhere to record them):
/// what is left, said.
pub(crate) async fn release(
    pool: &std::sync::Arc<Pool>,
    stored: &ExNode,
    stranded: &ExNode,
    released: usize,
) -> Left {
    let all: Vec<_> = (stored.allocations().chain(stranded.allocations()))
        .cloned()
        .collect();
    let kept = pool.release_all(all.clone()).await.len();
    Left {
        released: released + all.len() - kept,
        stranded: kept,
        ..Left::default()
    }
}
