//! An upload from its input to a saved exNode: resumed from the record an
//! interrupted run of it left, the exNode saved before what it replaces is
//! released, and whatever does not finish recorded or released — never
//! left on the depots unnamed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lors_exnode::{ExNode, Mapping};
use tokio::io::AsyncRead;

use super::{Left, Refused};
use crate::commit::{self, Committed, Session};
use crate::leftover::{self, LeftoverError};
use crate::upload::{Control, UploadOptions, upload_file_with, upload_with};
use crate::{Error, Pool, Progress, xnd};

/// What is uploaded.
pub enum Source {
    /// A regular file: sent block by block from the file, and an
    /// interrupted upload of it can be resumed.
    File(std::fs::File),
    /// A stream (a pipe, a device, standard input), its size when known.
    Stream(Box<dyn AsyncRead + Unpin + Send + Sync>, Option<u64>),
}

impl Source {
    /// The file at `path`: a regular file, else read as a stream.
    pub fn open(path: &Path) -> Result<Source, Error> {
        let f = std::fs::File::open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let meta =
            (f.metadata()).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Ok(match meta.is_file() {
            true => Source::File(f),
            false => {
                let size = Some(meta.len()).filter(|&n| n > 0);
                Source::Stream(Box::new(tokio::fs::File::from_std(f)), size)
            }
        })
    }
}

/// An upload job.
pub struct Upload {
    /// How the blocks are made and placed.
    pub opts: UploadOptions,
    /// Where the exNode is saved; with none it is only returned, and what
    /// an unfinished run made is released (there is nowhere to record it).
    pub out: Option<PathBuf>,
    /// Replace an exNode at `out`: once the new one is saved, what only
    /// the old one named is released.
    pub force: bool,
    /// Blocks in flight shared with the other uploads of a batch
    /// ([`crate::upload::Slots`]); `None`: its own.
    pub slots: Option<crate::upload::Slots>,
}

/// An upload checked and ready to run ([`Upload::prepare`]).
pub struct Ready {
    identity: Option<String>,
    done: Vec<Mapping>,
    replaced: Option<Replaced>,
    /// The output's lock and journal (`OUT.journal`), held for the run.
    session: Option<Session>,
}

/// The exNode `--force` replaces: the allocations it names (a copy made
/// with `cp` having taken references of its own first).
struct Replaced {
    old: Vec<Mapping>,
}

impl Ready {
    /// Blocks an interrupted run of this upload stored, not sent again.
    pub fn resumed_blocks(&self) -> usize {
        let offsets = self.done.iter().map(|m| m.exnode_offset);
        offsets.collect::<std::collections::BTreeSet<_>>().len()
    }
}

/// A finished upload.
#[derive(Debug)]
pub struct Done {
    /// The exNode, as saved.
    pub exnode: ExNode,
    /// Blocks an earlier, interrupted run stored (not sent again).
    pub resumed: usize,
    /// What replacing the old exNode released.
    pub replaced: Option<Committed>,
    /// Allocations of failed attempts (or of the interrupted run resumed)
    /// that no depot released: named in the record for a later `lors trim`.
    pub unreleased: Option<Left>,
}

/// An upload that did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    /// Stopped from outside (SIGINT, Ctrl-C).
    #[error("upload interrupted")]
    Interrupted(Left),
    /// A depot, the input or the network failed.
    #[error("{cause}")]
    Failed {
        /// Why.
        cause: Error,
        /// What the upload left.
        left: Left,
    },
    /// Everything was stored but the exNode could not be saved.
    #[error("the upload finished but its exNode could not be saved")]
    NotSaved {
        /// Why.
        #[source]
        cause: Error,
        /// What the upload left.
        left: Left,
    },
    /// The exNode is saved; releasing what the one it replaced named
    /// failed (those allocations are named in the record).
    #[error("the exNode is saved; releasing what the exNode it replaced named failed")]
    NotReleased {
        /// Why.
        #[source]
        cause: Error,
    },
}

impl Failed {
    /// What the upload left on the depots, when it left anything to say.
    pub fn left(&self) -> Option<&Left> {
        match self {
            Failed::Interrupted(l)
            | Failed::Failed { left: l, .. }
            | Failed::NotSaved { left: l, .. } => Some(l),
            Failed::NotReleased { .. } => None,
        }
    }

    /// The error behind it ([`Failed::Interrupted`] has none).
    pub fn cause(&self) -> Option<&Error> {
        match self {
            Failed::Interrupted(_) => None,
            Failed::Failed { cause, .. }
            | Failed::NotSaved { cause, .. }
            | Failed::NotReleased { cause } => Some(cause),
        }
    }
}

impl Upload {
    /// Checks the output, reads what an interrupted run of this same
    /// upload recorded (refusing a record of another upload, which names
    /// allocations nothing else does) and takes the lock of the exNode
    /// `force` replaces.
    pub async fn prepare(&self, source: &Source, pool: &Arc<Pool>) -> Result<Ready, Refused> {
        let identity = match source {
            Source::File(f) => {
                let m = f
                    .metadata()
                    .map_err(|e| Error::io("reading the input", e))?;
                Some(leftover::identity(&m, &self.opts))
            }
            Source::Stream(..) => None,
        };
        let Some(out) = &self.out else {
            return Ok(Ready {
                identity,
                done: Vec::new(),
                replaced: None,
                session: None,
            });
        };
        super::check_output(out, self.force)?;
        // Under the output's lock, what a run killed with -9 left is freed
        // first, and this one's allocations are written down as made.
        let session = Session::open(out, pool, super::LOCK_WAIT).await?;
        let done = match &identity {
            Some(id) => {
                leftover::resumable(&leftover::record_path(out), id).map_err(|e| match e {
                    e @ LeftoverError::Foreign { .. } => Refused::Foreign(e),
                    LeftoverError::Read(e) => Refused::Lors(e.into()),
                })?
            }
            None => Vec::new(),
        };
        let replaced = match self.force {
            true => replacing(out),
            false => None,
        };
        Ok(Ready {
            identity,
            done,
            replaced,
            session: Some(session),
        })
    }

    /// Stores the input and saves the exNode; stopped when `stop` turns
    /// `true`. Whatever way it ends, the depots hold only what the saved
    /// exNode or the record beside it names (or, without an output, what
    /// could not be released).
    pub async fn run(
        &self,
        mut ready: Ready,
        source: Source,
        pool: Arc<Pool>,
        progress: Arc<dyn Progress>,
        stop: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> Result<Done, Failed> {
        let session = ready.session.take();
        let control = Control {
            stop,
            done: ready.done.clone(),
            slots: self.slots.clone(),
            journal: session.as_ref().map(|s| s.journal().clone()),
        };
        let (opts, p) = (&self.opts, pool.clone());
        let r = match source {
            Source::File(f) => upload_file_with(f, opts, p, progress, control).await,
            Source::Stream(s, size) => upload_with(s, size, opts, p, progress, control).await,
        };
        let ended = self.end(r, ready, &pool).await;
        if let Some(s) = session {
            // Now the exNode or the record names what is kept: the rest
            // of what the journal lists (allocations released on the way)
            // is gone, and the journal with it. Should this fail, the
            // journal stays for the next command on the exNode to settle.
            let _ = s.end(&pool).await;
        }
        ended
    }

    /// What the upload's end `r` leaves: the exNode saved, or what it
    /// stored recorded (or released).
    async fn end(
        &self,
        r: crate::Result<crate::upload::Uploaded>,
        ready: Ready,
        pool: &Arc<Pool>,
    ) -> Result<Done, Failed> {
        let id = ready.identity.as_deref();
        match r {
            Ok(up) => self.finish(up, ready, pool).await,
            Err(Error::Interrupted {
                stored,
                released,
                stranded,
            }) => Err(Failed::Interrupted(
                self.leave(pool, &stored, &stranded, id, released).await,
            )),
            // A resumed upload that fails keeps what it resumed from named
            // (those allocations are named nowhere else).
            Err(Error::Abandoned {
                cause,
                released,
                stranded,
            }) => {
                let kept = ExNode {
                    mappings: ready.done,
                    ..ExNode::default()
                };
                let left = self.leave(pool, &kept, &stranded, id, released).await;
                Err(Failed::Failed {
                    cause: *cause,
                    left,
                })
            }
            Err(cause) => Err(Failed::Failed {
                cause,
                left: Left::default(),
            }),
        }
    }

    /// Records what a run that did not finish left; released when there is
    /// no output, or its record cannot be written.
    async fn leave(
        &self,
        pool: &Arc<Pool>,
        stored: &ExNode,
        stranded: &ExNode,
        identity: Option<&str>,
        released: usize,
    ) -> Left {
        let Some(out) = &self.out else {
            return super::release(pool, stored, stranded, released).await;
        };
        let left = super::record(out, stored, stranded, identity, released);
        if left.unrecorded.is_none() {
            return left;
        }
        // Nowhere to name them (the record is not a file lors can read or
        // replace): released, so nothing is left that nothing names.
        Left {
            unrecorded: left.unrecorded,
            ..super::release(pool, stored, stranded, released).await
        }
    }

    /// Saves a finished upload's exNode, then releases what the exNode it
    /// replaced named and what the record it resumed from still names.
    async fn finish(
        &self,
        up: crate::upload::Uploaded,
        ready: Ready,
        pool: &Arc<Pool>,
    ) -> Result<Done, Failed> {
        let resumed = ready.resumed_blocks();
        let x = up.exnode;
        let Some(out) = &self.out else {
            let unreleased = match up.unreleased.allocations().next() {
                Some(_) => Some(super::release(pool, &ExNode::default(), &up.unreleased, 0).await),
                None => None,
            };
            return Ok(Done {
                exnode: x,
                resumed,
                replaced: None,
                unreleased,
            });
        };
        // A resumed upload's record is its own: what it replaced is left be.
        let old = ready.replaced.as_ref().filter(|_| resumed == 0);
        let saved = match old {
            Some(r) => (commit::save_then_release(out, &x, r.old.clone(), pool).await).map(Some),
            None => xnd::save(out, &x).map(|()| None).map_err(Error::from),
        };
        let replaced = match saved {
            Ok(c) => c,
            Err(cause) => {
                return Err(self
                    .not_saved(out, cause, &x, &up.unreleased, &ready, pool)
                    .await);
            }
        };
        let record = leftover::record_path(out);
        let mut unreleased = up.unreleased;
        if resumed > 0 {
            // Blocks of the interrupted run this one did not use, and
            // allocations it cut off: named only in the record.
            match leftover::resumed(&record, &x) {
                Ok(rest) => {
                    let kept = pool.release_all(rest.clone()).await;
                    let kept_keys: std::collections::HashSet<_> =
                        kept.iter().filter_map(commit::key).collect();
                    let gone = rest.iter().filter_map(commit::key);
                    let gone = gone.filter(|k| !kept_keys.contains(k)).collect();
                    if let Err(e) = leftover::drop_from(&record, &gone) {
                        return Err(Failed::NotReleased { cause: e.into() });
                    }
                    unreleased.mappings.extend(kept);
                }
                Err(e) => return Err(Failed::NotReleased { cause: e.into() }),
            }
        }
        let unreleased = (unreleased.allocations().next().is_some())
            .then(|| super::record(out, &ExNode::default(), &unreleased, None, 0));
        Ok(Done {
            exnode: x,
            resumed,
            replaced,
            unreleased,
        })
    }

    /// The exNode `x` of a finished upload could not be saved at `out`:
    /// when the save went through after all, only what followed failed;
    /// else its blocks are recorded for the same upload to resume from
    /// (none is sent again), or released when even that cannot be written.
    async fn not_saved(
        &self,
        out: &Path,
        cause: Error,
        x: &ExNode,
        unreleased: &ExNode,
        ready: &Ready,
        pool: &Arc<Pool>,
    ) -> Failed {
        let digest = commit::digest(x);
        if xnd::load(out).is_ok_and(|y| commit::digest(&y) == digest) {
            return Failed::NotReleased { cause };
        }
        // Only a copies upload resumes block by block.
        let id = ready.identity.as_deref().filter(|_| x.parity.is_empty());
        let left = super::record(out, x, unreleased, id, 0);
        if left.record.is_some() {
            return Failed::NotSaved { cause, left };
        }
        // Nothing names the new blocks: free them, but not those the
        // record of the run resumed from still names (a rerun uses them).
        let named: std::collections::HashSet<_> =
            ready.done.iter().filter_map(commit::key).collect();
        let made = (x.allocations().chain(unreleased.allocations()))
            .filter(|m| commit::key(m).is_none_or(|k| !named.contains(&k)));
        let made: Vec<Mapping> = made.cloned().collect();
        let kept = pool.release_all(made.clone()).await.len();
        Failed::NotSaved {
            cause,
            left: Left {
                released: made.len() - kept,
                stranded: kept,
                unrecorded: left.unrecorded,
                ..Left::default()
            },
        }
    }
}

/// The exNode at `out` that `force` replaces, if there is one (read under
/// its lock).
fn replacing(out: &Path) -> Option<Replaced> {
    let old = (xnd::load(out).ok()?.allocations())
        .filter(|m| m.manage.is_some())
        .cloned()
        .collect();
    Some(Replaced { old })
}
