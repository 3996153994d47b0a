//! A change to an exNode file (augment, route, repair, trim): made under
//! the output's lock and journal from before the exNode is read to after
//! it is saved, saved before anything it no longer names is released, and
//! — written to a new file beside its input — taking references of its own
//! on what it shares with the input, which stays whole.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lors_exnode::{ExNode, Mapping};

use super::Left;
use crate::commit::{self, Committed, Session};
use crate::{Error, Pool, Result, xnd};

/// A change to the exNode read from `input`, to be saved at `out` (the
/// same file, or a new one).
#[derive(Debug)]
pub struct Edit {
    session: Session,
    /// `None` for an exNode only in memory.
    input: Option<PathBuf>,
    out: PathBuf,
    x: ExNode,
}

/// What [`Edit::save`] did.
#[derive(Debug, Default)]
pub struct Saved {
    /// Saved to a new file beside the input: the input keeps what it
    /// names, nothing of it was released.
    pub new_file: bool,
    /// Allocations shared with the input that could not take a reference
    /// of their own (their depots did not answer): removing the input
    /// frees them.
    pub borrowed: usize,
    /// What was released after the save.
    pub committed: Committed,
}

impl Edit {
    /// Starts a change of `x`, read from `input`, to be saved at `out`:
    /// fails before any depot is touched when `out` cannot be written;
    /// takes `out`'s lock (waiting [`super::LOCK_WAIT`]), settles what an
    /// earlier run on it left, and journals the allocations `pool` makes.
    /// Changed in place, the exNode is read again under the lock (another
    /// command may have changed it meanwhile).
    /// With no `input` (an exNode only in memory) `x` is saved at `out`
    /// as it is.
    pub async fn begin(
        input: Option<&Path>,
        x: ExNode,
        out: &Path,
        pool: &Arc<Pool>,
    ) -> Result<Edit> {
        commit::check_output(out)?;
        let session = Session::begin(out, pool, super::LOCK_WAIT).await?;
        let x = match input == Some(out) {
            true => xnd::load(out)?,
            false => x,
        };
        Ok(Edit {
            session,
            input: input.map(Path::to_owned),
            out: out.to_owned(),
            x,
        })
    }

    /// The exNode as it stands under the lock.
    pub fn exnode(&self) -> &ExNode {
        &self.x
    }

    /// Fails with [`Error::Changed`] unless the exNode under the lock is
    /// the one `before` was read as (the same allocations in the same
    /// order): mapping numbers a user chose from `before` must name the
    /// same mappings. A copy made outside lors that took its references
    /// meanwhile still is.
    pub fn check_as_read(&self, before: &ExNode) -> Result<()> {
        let keys = |x: &ExNode| x.allocations().map(commit::key).collect::<Vec<_>>();
        match keys(&self.x) == keys(before) && self.x.mappings.len() == before.mappings.len() {
            true => Ok(()),
            false => Err(Error::Changed {
                path: self.out.clone(),
            }),
        }
    }

    /// Whether the change goes to a new file beside its input.
    pub fn new_file(&self) -> bool {
        self.input.as_ref().is_some_and(|i| *i != self.out)
    }

    /// Where the exNode was read from, if from a file.
    pub fn input(&self) -> Option<&Path> {
        self.input.as_deref()
    }

    /// Where it is saved.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// Saves `y` at the output, then releases `free` (what the input named
    /// and `y` no longer does) — unless `y` goes to a new file, which first
    /// takes references of its own on what it shares with the input.
    pub async fn save(
        &self,
        y: &mut ExNode,
        free: Vec<Mapping>,
        pool: &Arc<Pool>,
    ) -> Result<Saved> {
        let new_file = self.new_file();
        let borrowed = match new_file {
            true => commit::share_with(&self.x, y, pool).await,
            false => 0,
        };
        let committed = match new_file || free.is_empty() {
            true => {
                xnd::save(&self.out, y)?;
                Committed::default()
            }
            false => commit::save_then_release(&self.out, y, free, pool).await?,
        };
        Ok(Saved {
            new_file,
            borrowed,
            committed,
        })
    }

    /// Ends the change: what the journal lists that neither the exNode nor
    /// its record names (copies made and not saved) is freed, and the lock
    /// let go. The number freed.
    pub async fn end(self, pool: &Arc<Pool>) -> Result<usize> {
        self.session.end(pool).await
    }
}

/// When `path` is the record `OUT.partial` of an exNode `OUT`, the
/// allocations `OUT` names (a trim of the record must not free them: a run
/// that died before its save recorded allocations the old exNode holds).
pub fn named_beside(path: &Path) -> std::result::Result<HashSet<String>, Error> {
    let s = path.as_os_str().to_string_lossy();
    let Some(base) = s.strip_suffix(".partial") else {
        return Ok(HashSet::new());
    };
    let base = Path::new(base);
    if std::fs::symlink_metadata(base).is_err() {
        return Ok(HashSet::new());
    }
    Ok(commit::named(&xnd::load(base)?))
}

/// A copy job (augment, route, repair) that did not finish: what its
/// copies left beside the output.
#[derive(Debug, thiserror::Error)]
pub enum Unfinished {
    /// Stopped from outside: the exNode is unchanged, the copies made were
    /// released or (on depots that did not answer) recorded.
    #[error("interrupted: the exNode is unchanged")]
    Interrupted(Left),
    /// Failed, after releasing or recording what it made.
    #[error("{cause}")]
    Failed {
        /// Why.
        cause: Box<Error>,
        /// What it left.
        left: Left,
    },
}

/// The outcome of a copy job writing to `out`: an interrupted or abandoned
/// one has its unreleased copies recorded beside `out` ([`super::unreleased`]).
/// With no `out` (an exNode only in memory) they are only counted: they
/// expire with their lease.
pub fn copies_outcome<T>(r: Result<T>, out: Option<&Path>) -> std::result::Result<T, Unfinished> {
    let left = |stranded: &ExNode, released| match out {
        Some(out) => super::unreleased(out, stranded, released),
        None => Left {
            released,
            stranded: stranded.allocations().count(),
            ..Left::default()
        },
    };
    match r {
        Ok(v) => Ok(v),
        Err(Error::Interrupted {
            released, stranded, ..
        }) => Err(Unfinished::Interrupted(left(&stranded, released))),
        Err(Error::Abandoned {
            cause,
            released,
            stranded,
        }) => Err(Unfinished::Failed {
            cause,
            left: left(&stranded, released),
        }),
        Err(cause) => Err(Unfinished::Failed {
            cause: Box::new(cause),
            left: Left::default(),
        }),
    }
}
