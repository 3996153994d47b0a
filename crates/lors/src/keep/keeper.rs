//! A keeper over many exNode files: one [`cycle`](super::cycle) each,
//! under the file's lock, with the scrub's budget, a deadline per file and
//! the probes of a batch of files taken at once; each file's outcome
//! handed to the caller as it is done.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lors_exnode::ExNode;

use super::{Found, Kept, Places, Policy, Probed, SaveError, Scrub, Totals};
use crate::manage::{CopyOptions, Lease};
use crate::pool::Pool;
use crate::settings::Settings;
use crate::xnd::XndError;

/// Where one exNode's new replicas may go: the caller's depots or its
/// L-Bone query, asked only for a file that needs new replicas.
pub trait Targets: Sync {
    /// Depots for new replicas of `x` (kept with settings `s`, `copies`
    /// each block), best first; or why there are none.
    fn depots_for<'a>(
        &'a self,
        x: &'a ExNode,
        s: &'a Settings,
        copies: usize,
    ) -> Pin<Box<dyn Future<Output = Found> + Send + 'a>>;
}

/// Why one file was not kept this cycle. The others are kept all the same.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It could not be read, or is no exNode.
    #[error(transparent)]
    Xnd(#[from] XndError),
    /// The cycle failed on it (an exNode it cannot keep, say).
    #[error(transparent)]
    Keep(#[from] crate::Error),
    /// Its turn took longer than the keeper gives one file.
    #[error("not done within {}: left to the next cycle", lors_ibp::units::Secs(.0.as_secs()))]
    Deadline(Duration),
    /// What the cycle found could not be written back.
    #[error(transparent)]
    Save(#[from] SaveError),
    /// Kept, but freeing what no exNode names failed afterwards.
    #[error("finishing: freeing what no exNode names")]
    Finishing(#[source] crate::Error),
}

/// One file's outcome in a keeper's cycle.
#[derive(Debug)]
pub enum Outcome {
    /// Kept (changed or not). Its mapping indices (`corrupt`,
    /// `not_refreshed`) are numbered as `lors ls` numbers them.
    Kept(Box<Kept>),
    /// Another lors command holds it (this process id, when known): left
    /// to the next cycle.
    Busy(Option<u32>),
    /// Not kept, and why.
    Failed(FileError),
}

/// What to keep and how: a [`Policy`] for every file, less what each
/// file's own settings say (lease of new replicas, reliability).
pub struct Keeper<'a> {
    /// Live replicas each block keeps; `None`: each exNode's own.
    pub copies: Option<usize>,
    /// What a refresh sets.
    pub lease: Lease,
    /// An allocation with less than this left is refreshed.
    pub margin: Duration,
    /// How long a depot may be silent before its replicas are made again.
    pub grace: Duration,
    /// One file's turn at most: past it, what it began is dropped and the
    /// file waits for the next cycle.
    pub file_deadline: Duration,
    /// Turns true to stop: the file in hand is left as it was.
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// Where new replicas go.
    pub targets: &'a dyn Targets,
}

/// ExNodes probed together: a depot that does not answer costs one stall
/// for the batch, not one per file (the probes stay this fresh).
const PROBE_BATCH: usize = 256;

/// The end of a keeper's cycle.
#[derive(Debug, Default)]
pub struct Cycle {
    /// What it did over every file.
    pub totals: Totals,
    /// False when stopped before the last file.
    pub finished: bool,
}

impl Keeper<'_> {
    /// One cycle over `files` (each with its settings), in order. `each`
    /// hears of every file as it is done, with the totals so far; an error
    /// from it (a closed output, say) ends the cycle.
    pub async fn cycle<E>(
        &self,
        files: &[(PathBuf, Arc<Settings>)],
        scrub: &mut Scrub,
        mut each: impl FnMut(&Path, &Outcome, &Totals) -> Result<(), E>,
    ) -> Result<Cycle, E> {
        let mut totals = Totals::default();
        // New replicas this cycle has put on each depot: the next exNode's
        // go to the least used first, so a cycle that heals many small
        // exNodes (each placing only a copy or two) spreads them instead
        // of giving all to the first depot listed.
        let mut placed: HashMap<String, usize> = HashMap::new();
        let mut probed = Probed::none();
        for (n, (path, s)) in files.iter().enumerate() {
            if *self.stop.borrow() {
                return Ok(Cycle {
                    totals,
                    finished: false,
                });
            }
            let pool = Arc::new(Pool::new(s.client()));
            if n % PROBE_BATCH == 0 {
                probed = probe_batch(&files[n..files.len().min(n + PROBE_BATCH)], &pool).await;
            }
            let first = match n {
                0 if scrub.cursor.file == *path => scrub.cursor.mapping,
                _ => 0,
            };
            let turn = Turn {
                path,
                s,
                pool: &pool,
                first,
                probed: &probed,
            };
            let outcome = match self.one(&turn, scrub, &mut placed).await {
                Ok(Some(o)) => o,
                Ok(None) => {
                    // Stopped in its turn.
                    totals.exnodes += 1;
                    return Ok(Cycle {
                        totals,
                        finished: false,
                    });
                }
                Err(e) => Outcome::Failed(e),
            };
            match &outcome {
                Outcome::Kept(k) => totals.add(k),
                Outcome::Busy(_) => totals.busy += 1,
                Outcome::Failed(_) => {
                    totals.exnodes += 1;
                    totals.failed += 1;
                }
            }
            each(path, &outcome, &totals)?;
        }
        Ok(Cycle {
            totals,
            finished: true,
        })
    }

    /// One file's turn; `None` when stopped in it (nothing changed).
    async fn one(
        &self,
        t: &Turn<'_>,
        scrub: &mut Scrub,
        placed: &mut HashMap<String, usize>,
    ) -> Result<Option<Outcome>, FileError> {
        let (path, pool) = (t.path, t.pool);
        // A file that is no exNode (empty, damaged, hostile) is passed
        // over before anything else: no lock, no depot.
        crate::plan::check_exnode(&crate::xnd::load(path)?)?;
        // One writer per exNode: a file another lors command (a user's
        // route, a second keeper) is changing waits for the next cycle.
        let session = match crate::commit::Session::begin(path, pool, Duration::ZERO).await {
            Ok(s) => Ok(s),
            Err(crate::Error::Busy { holder, .. }) => return Ok(Some(Outcome::Busy(holder))),
            // No lock or journal can be written beside it (a read-only
            // directory): its leases are kept all the same, and nothing
            // new is made that no journal could name.
            Err(e) => Err(format!("{e:#}")),
        };
        let no_place = session.as_ref().err().cloned();
        let kept = self.locked(t, scrub, placed, no_place).await;
        if let Ok(session) = session {
            let ended = session.end(pool).await;
            if kept.is_ok() {
                ended.map_err(FileError::Finishing)?;
            }
        }
        Ok(kept?.map(|k| Outcome::Kept(Box::new(k))))
    }

    /// The cycle of one file whose lock is held (or could not be made:
    /// `no_place` says why, and no new replicas are made).
    async fn locked(
        &self,
        t: &Turn<'_>,
        scrub: &mut Scrub,
        placed: &mut HashMap<String, usize>,
        no_place: Option<String>,
    ) -> Result<Option<Kept>, FileError> {
        let (path, s, pool) = (t.path, t.s, t.pool);
        let before = crate::xnd::read_regular(path, crate::xnd::MAX_XND_BYTES)?;
        let x = lors_exnode::xml::parse(&before).map_err(|source| XndError::Parse {
            path: path.to_owned(),
            source,
        })?;
        let checked = scrub.plan(&x, path, t.first);
        let policy = Policy {
            copies: self.copies,
            lease: self.lease,
            margin: self.margin,
            copy: CopyOptions {
                duration: s.duration,
                reliability: s.reliability,
                stop: Some(self.stop.clone()),
            },
            grace: self.grace,
        };
        let copies = policy.copies.or_else(|| x.copies_policy()).unwrap_or(1);
        // Where new replicas may go: asked for each exNode that needs one
        // (its blocks' holders differ), and only then.
        let used = &*placed;
        let places = match no_place {
            Some(why) => Places::given_none(format!("no new copies: {why}")),
            None => Places::new(|| {
                let x = &x;
                Box::pin(async move {
                    let mut depots = self.targets.depots_for(x, s, copies).await?;
                    // Stable: among depots as used, the directory's
                    // ranking stands.
                    depots.sort_by_key(|d| used.get(d).copied().unwrap_or(0));
                    Ok(depots)
                })
            }),
        };
        // However the depots behave, one file's turn ends: what it began
        // is dropped (copies in flight are freed by the session's end,
        // from its journal) and the file waits for the next cycle.
        let run = super::cycle(&x, &places, &policy, pool, &checked, t.probed);
        let mut k = match tokio::time::timeout(self.file_deadline, run).await {
            Ok(Ok(k)) => k,
            Ok(Err(crate::Error::Interrupted { .. })) => return Ok(None),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(FileError::Deadline(self.file_deadline)),
        };
        let numbering = x.numbering();
        let numbered = (k.corrupt.iter_mut().map(|(i, _)| i))
            .chain(k.not_refreshed.iter_mut().map(|(i, _)| i));
        for i in numbered {
            *i = numbering.number(*i);
        }
        drop(places);
        if k.changed {
            for d in super::save_kept(path, &before, &k, pool).await? {
                *placed.entry(d).or_default() += 1;
            }
        }
        Ok(Some(k))
    }
}

/// One file's turn in a cycle: the file, its settings, and what the
/// cycle shares with it.
struct Turn<'a> {
    path: &'a Path,
    s: &'a Settings,
    pool: &'a Arc<Pool>,
    /// The scrub's first mapping here.
    first: usize,
    probed: &'a Probed,
}

/// The probes of `batch`'s exNodes, taken at once; those that do not load
/// are left to their own turn, which says why.
async fn probe_batch(batch: &[(PathBuf, Arc<Settings>)], pool: &Arc<Pool>) -> Probed {
    let xs: Vec<ExNode> = (batch.iter())
        .filter_map(|(p, _)| crate::xnd::load(p).ok())
        .collect();
    let refs: Vec<&ExNode> = xs.iter().collect();
    Probed::of(&refs, pool).await
}
