//! Replacing an exNode without ever destroying the file it names: the new
//! exNode is saved durably *before* anything that only the old one named is
//! released, and what is to be released is written down first, so a crash
//! or a kill at any point leaves either the old exNode or the new one with
//! every allocation it names alive, and nothing live that no file names.
//!
//! A run that changes an exNode (`lors route`, `trim --decrement`,
//! `augment`, `augment --repair`, a keeper's turn) is a [`Session`]: it
//! holds the exNode's [`Lock`], first [`settle`]s what an earlier run left,
//! and writes every allocation it makes into a [`Journal`] the moment the
//! depot grants it. An xio writer (the mount, the Python package) keeps a
//! journal of its own ([`Journal::private`]) and takes the lock for each
//! save. A replacement then goes:
//!
//! 1. [`check_output`]: the output path can be written (its directory
//!    exists and takes a new file; it is not a device) — before any depot
//!    is touched;
//! 2. the allocations to free are added to `OUT.partial`, each marked with
//!    the digest of the exNode whose save frees them
//!    ([`leftover::to_free`], [`digest`]);
//! 3. the new exNode is saved (temporary file, fsync, rename, fsync of the
//!    directory);
//! 4. they are released; those released leave the record, and those a
//!    depot did not release stay in it for a later [`settle`] (or
//!    `lors trim --decrement` of the record) to free.
//!
//! A run killed between 2 and 3 leaves the old exNode naming allocations
//! the record lists, marked for a save that never happened: [`settle`]
//! frees an allocation only once the file beside the record is the exNode
//! its mark names, and never one that file names.
//!
//! ```no_run
//! # async fn f(pool: std::sync::Arc<lors::Pool>, new: lors_exnode::ExNode,
//! #            old: Vec<lors_exnode::Mapping>) -> lors::Result<()> {
//! let out = std::path::Path::new("run42.xnd");
//! lors::commit::check_output(out)?;
//! let done = lors::commit::save_then_release(out, &new, old, &pool).await?;
//! assert!(done.kept.is_empty(), "a depot did not free some: recorded");
//! # Ok(()) }
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lors_exnode::{ExNode, Mapping};

use crate::error::{Error, Result};
use crate::leftover;
use crate::pool::Pool;
use crate::xnd::{self, XndError};

/// What names one allocation, whatever else a mapping of it says.
pub fn key(m: &Mapping) -> Option<String> {
    (m.manage.as_ref().or(m.read.as_ref())).map(|c| c.to_url())
}

/// The allocations `x` names.
pub fn named(x: &ExNode) -> HashSet<String> {
    x.allocations().filter_map(key).collect()
}

/// Mapping metadata: this exNode names the allocation without holding a
/// reference on it (another copy of the file does), so nothing it does
/// releases it — dropped from this exNode, it is left to the others.
pub const BORROWED_META: &str = "lors_borrowed";

/// Whether `m` is named without a reference ([`BORROWED_META`]).
pub fn is_borrowed(m: &Mapping) -> bool {
    m.metadata.iter().any(|d| d.name == BORROWED_META)
}

/// Takes a reference (MANAGE INCR of the read count) on every allocation
/// of `x` that `which` selects, for `x` to hold as its own: freeing one
/// copy of a file then leaves the others their data. An allocation whose
/// depot does not grant one (unreachable, no manage capability) is marked
/// borrowed in `x` ([`BORROWED_META`]), and one that does loses the mark.
/// The number marked borrowed.
pub async fn take_references(
    x: &mut ExNode,
    which: impl Fn(&Mapping) -> bool,
    pool: &Arc<Pool>,
) -> usize {
    let mut caps = std::collections::HashMap::new();
    for m in x.allocations().filter(|m| which(m)) {
        if let (Some(k), Some(c)) = (key(m), m.manage.as_ref()) {
            caps.entry(k).or_insert_with(|| c.clone());
        }
    }
    let depots = caps.values().map(|c| c.address());
    let limit = Arc::new(tokio::sync::Semaphore::new(
        pool.ops_in_flight(depots).await,
    ));
    let mut set = tokio::task::JoinSet::new();
    for (k, cap) in caps {
        let (pool, limit) = (pool.clone(), limit.clone());
        set.spawn(async move {
            let _slot = limit.acquire_owned().await;
            let took = tokio::time::timeout(crate::stall::RELEASE_WAIT, pool.reference(&cap)).await;
            (k, matches!(took, Ok(Ok(()))))
        });
    }
    let mut held = HashSet::new();
    while let Some(done) = set.join_next().await {
        if let Ok((k, true)) = done {
            held.insert(k);
        }
    }
    let mut borrowed = 0;
    for m in x.mappings.iter_mut().chain(x.parity.iter_mut()) {
        if !which(m) {
            continue;
        }
        m.metadata.retain(|d| d.name != BORROWED_META);
        if !key(m).is_some_and(|k| held.contains(&k)) {
            m.metadata
                .push(lors_exnode::model::Metadata::integer(BORROWED_META, 1));
            borrowed += 1;
        }
    }
    borrowed
}

/// A copy of an exNode made outside lors (see [`xnd::outside_copy`]) at
/// `path` becomes a file of its own: beside its original, it takes a
/// reference on every allocation it names; with the original gone, it
/// holds the original's. Then it is saved again (as itself). Called with `path`'s lock held, before anything changes it.
/// How many allocations it could not take a reference on (left borrowed),
/// or `None` when it is no such copy.
pub async fn adopt(path: &Path, pool: &Arc<Pool>) -> Result<Option<usize>> {
    // Nothing there, or not an exNode (what `upload --force` replaces
    // need not be one): no copy.
    let Ok(mut x) = xnd::load(path) else {
        return Ok(None);
    };
    let borrowed = match xnd::outside_copy(path, &x) {
        None => return Ok(None),
        // The one name left: the original's references are its own.
        Some(xnd::Copied::OriginalGone) => 0,
        Some(xnd::Copied::BesideOriginal) => take_references(&mut x, |_| true, pool).await,
    };
    xnd::save(path, &x)?;
    tracing::info!(path = %path.display(), borrowed, "a copy made outside lors took its own references");
    Ok(Some(borrowed))
}

/// `new`, about to be saved as a file beside the exNode `input` (whose
/// file stays), takes its own reference on each allocation `input` also
/// names. How many it could not take ([`take_references`]).
pub async fn share_with(input: &ExNode, new: &mut ExNode, pool: &Arc<Pool>) -> usize {
    let theirs = named(input);
    take_references(new, |m| key(m).is_some_and(|k| theirs.contains(&k)), pool).await
}

/// Fails unless an exNode can be saved at `path`: its directory exists
/// and a new file can be made in it (one is made and removed), and the
/// path, if it exists, is a regular file. Called before any depot is
/// touched, so a typo in `-o` or a read-only directory costs nothing.
pub fn check_output(path: &Path) -> std::result::Result<(), XndError> {
    let fail = |source| XndError::Write {
        path: path.to_owned(),
        source,
    };
    if let Ok(m) = std::fs::metadata(path)
        && !m.is_file()
    {
        return Err(fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file: an exNode is saved by replacing the file, which this would destroy",
        )));
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Unique within the process too: the jobs of a batch (or a program's
    // threads) check outputs in one directory at once.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!(".lors-probe{}.{n}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(fail)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// What [`save_then_release`] did.
#[derive(Debug, Default)]
pub struct Committed {
    /// Allocations released.
    pub freed: usize,
    /// Allocations a depot did not release (unreachable, refused, no
    /// manage capability), each with why: still named in
    /// [`Committed::record`].
    pub kept: Vec<(Mapping, String)>,
    /// The record naming [`Committed::kept`], when any are.
    pub record: Option<PathBuf>,
}

impl Committed {
    /// Each allocation a depot did not release, as the index it had among
    /// `dropped` (the removed mappings, each with its index in the old
    /// exNode) and why, with where it is recorded: for the user's message.
    pub fn not_released(&self, dropped: &[(usize, Mapping)]) -> Vec<(usize, String)> {
        (self.kept.iter())
            .map(|(m, why)| {
                let i = (dropped.iter())
                    .find(|(_, d)| key(d) == key(m))
                    .map_or(0, |(i, _)| *i);
                let at = (self.record.as_ref()).map_or(String::new(), |r| {
                    format!(" (named in {} to free later)", r.display())
                });
                (i, format!("{why}{at}"))
            })
            .collect()
    }
}

/// Saves `new` at `out`, then releases those of `old` that `new` does not
/// name, in the order the module documents. An error from the save leaves
/// everything as it was (nothing is released, the record is restored).
pub async fn save_then_release(
    out: &Path,
    new: &ExNode,
    old: Vec<Mapping>,
    pool: &Arc<Pool>,
) -> Result<Committed> {
    let keep = named(new);
    let mut seen = HashSet::new();
    let free: Vec<Mapping> = (old.into_iter())
        .filter(|m| key(m).is_some_and(|k| !keep.contains(&k) && seen.insert(k)))
        .collect();
    let record = leftover::record_path(out);
    if !free.is_empty() {
        leftover::to_free(&record, &free, &digest(new))?;
    }
    if let Err(e) = xnd::save(out, new) {
        // Still named by the old exNode: out of the record again.
        let _ = leftover::drop_from(&record, &keys(&free));
        return Err(e.into());
    }
    if free.is_empty() {
        return Ok(Committed::default());
    }
    let total = free.len();
    let kept = pool.release_all_why(free.clone()).await;
    let unreleased: HashSet<String> = kept.iter().filter_map(|(m, _)| key(m)).collect();
    leftover::drop_from(&record, &freed(&free, &unreleased)).map_err(Error::from)?;
    Ok(Committed {
        freed: total - kept.len(),
        record: (!kept.is_empty()).then_some(record),
        kept,
    })
}

/// Removes the exNode at `path` as `rm` removes a file: what it names is
/// released — those allocations another exNode also names lose only this
/// file's reference — and the file goes. Taken under its [`Lock`] (waiting
/// up to `wait`); a copy made outside lors takes its references first.
/// The exNode is saved empty before anything is released, so a kill
/// mid-way leaves a file naming nothing and the record of what is left,
/// never one naming freed allocations. The number of allocations released.
///
/// # Errors
/// [`Error::NotReleased`] when a depot did not release one: the emptied
/// exNode stays with its record, and removing it again finishes.
pub async fn remove(path: &Path, pool: &Arc<Pool>, wait: std::time::Duration) -> Result<usize> {
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| Error::io(format!("cannot remove {}", path.display()), e))?;
    if !meta.is_file() {
        return Err(Error::io(
            "not a regular file (a directory, link or device): name the exNode files",
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        ));
    }
    let session = Session::begin(path, pool, wait).await?;
    let r = async {
        let x = xnd::load(path)?;
        let empty = ExNode {
            metadata: x.metadata.clone(),
            ..Default::default()
        };
        // Those without a manage capability (a read-only copy's) were
        // never this file's to free.
        let all: Vec<Mapping> = (x.allocations())
            .filter(|m| m.manage.is_some())
            .cloned()
            .collect();
        let done = save_then_release(path, &empty, all, pool).await?;
        let record = leftover::record_path(path);
        if let Some((_, why)) = done.kept.first() {
            return Err(Error::NotReleased {
                count: done.kept.len(),
                why: why.clone(),
                record,
            });
        }
        // A second remove after one a dead depot stopped: what the first
        // could not free is still in the record (the settle above tried
        // again). The exNode stays while its record names live data, or
        // nothing would ever free it.
        let pending = leftover::pending_frees(&record)?;
        if !pending.is_empty() {
            return Err(Error::NotReleased {
                count: pending.len(),
                why: "a depot has not released them yet (tried again now)".into(),
                record,
            });
        }
        Ok(done.freed)
    }
    .await;
    let ended = session.end(pool).await;
    let freed = r?;
    ended?;
    std::fs::remove_file(path).map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
    Ok(freed)
}

/// The keys of `free` a depot released: all but the `unreleased`.
fn freed(free: &[Mapping], unreleased: &HashSet<String>) -> HashSet<String> {
    (free.iter().filter_map(key))
        .filter(|k| !unreleased.contains(k))
        .collect()
}

fn keys(ms: &[Mapping]) -> HashSet<String> {
    ms.iter().filter_map(key).collect()
}

/// Finishes what an earlier run on `out` left: the allocations its
/// journal lists that neither `out` nor `OUT.partial` names are released
/// (a run killed mid-copy), and those the record marks to free once `out`
/// no longer names them are released if it does not and dropped from the
/// record if it does (the run died before its save: they are the old
/// exNode's, and alive). What a depot does not release stays in the
/// record, marked to free. The journal is removed. The number released.
/// Run under the exNode's [`Lock`].
pub async fn settle(out: &Path, pool: &Arc<Pool>) -> Result<usize> {
    let record = leftover::record_path(out);
    let journal = journal_path(out);
    let pending = leftover::pending_frees(&record)?;
    let mut journaled = read_journal(&journal)?;
    // Writers gone without finishing (their lock is free): theirs too.
    let dead = dead_journals(out);
    for (p, _) in &dead {
        journaled.extend(read_journal(p)?);
    }
    if pending.is_empty() && journaled.is_empty() {
        let _ = std::fs::remove_file(&journal);
        for (p, _) in &dead {
            let _ = std::fs::remove_file(p);
        }
        return Ok(0);
    }
    let (saved, still) = match std::fs::symlink_metadata(out) {
        Ok(_) => {
            let bytes = xnd::read_regular(out, xnd::MAX_XND_BYTES)?;
            let x = lors_exnode::xml::parse(&bytes).map_err(|source| XndError::Parse {
                path: out.to_owned(),
                source,
            })?;
            (digest(&x), named(&x))
        }
        Err(_) => (String::new(), HashSet::new()),
    };
    let recorded = match std::fs::symlink_metadata(&record) {
        Ok(_) => named(&xnd::load(&record)?),
        Err(_) => HashSet::new(),
    };
    // Marked to free once a save that then happened, or orphans: freed.
    // Marked for a save that never happened: the old exNode (this one, or
    // the input of a run with -o) still names them; out of the record.
    let (mut free, mut alive) = (Vec::new(), Vec::new());
    for (m, when) in pending {
        let named_now = key(&m).is_none_or(|k| still.contains(&k));
        match !named_now && (when == saved || when == leftover::ORPHAN) {
            true => free.push(m),
            false => alive.push(m),
        }
    }
    leftover::drop_from(&record, &keys(&alive))?;
    let orphans: Vec<Mapping> = (journaled.into_iter())
        .filter(|m| key(m).is_some_and(|k| !still.contains(&k) && !recorded.contains(&k)))
        .collect();
    free.extend(orphans.iter().cloned());
    let kept = pool.release_all(free.clone()).await;
    let unreleased = keys(&kept);
    // Journaled orphans a depot did not free: into the record, to free.
    let stuck: Vec<Mapping> = (orphans.into_iter())
        .filter(|m| key(m).is_some_and(|k| unreleased.contains(&k)))
        .collect();
    if !stuck.is_empty() {
        leftover::to_free(&record, &stuck, leftover::ORPHAN)?;
    }
    let freed = freed(&free, &unreleased);
    leftover::drop_from(&record, &freed)?;
    // Everything they listed is now named, freed or recorded.
    let _ = std::fs::remove_file(&journal);
    for (p, _) in &dead {
        let _ = std::fs::remove_file(p);
    }
    Ok(freed.len())
}

/// The private journals ([`Journal::private`]) beside `out` whose writer
/// is gone, each with its lock, now held here.
fn dead_journals(out: &Path) -> Vec<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut prefix = journal_path(out)
        .file_name()
        .unwrap_or_default()
        .to_os_string();
    prefix.push(".");
    let prefix = prefix.to_string_lossy().into_owned();
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    (entries.filter_map(std::result::Result::ok))
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(e.path())
                .ok()?;
            let free = rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive);
            free.ok().map(|()| (e.path(), f))
        })
        .collect()
}

/// The BLAKE3 (hex) of `x` as [`xnd::save`] writes it, but for the file
/// it records being saved as ([`xnd::IDENTITY_META`], known only once
/// saved): what a record names the save that frees its allocations by.
pub fn digest(x: &ExNode) -> String {
    let mut x = x.clone();
    x.metadata.retain(|m| m.name != xnd::IDENTITY_META);
    blake3::hash(lors_exnode::xml::write(&x).as_bytes())
        .to_hex()
        .to_string()
}

/// Where the journal of a run that changes `out` goes: `OUT.journal`.
pub fn journal_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".journal");
    PathBuf::from(p)
}

/// Where the lock of `out` goes: `OUT.lock`.
pub fn lock_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Longest journal read back: a line per allocation, ~700 bytes each;
/// a million allocations is far beyond any one run.
const MAX_JOURNAL_BYTES: u64 = 1 << 30;

/// Every allocation a run makes, written down the moment the depot
/// grants it (one `write(2)` of a line, before its data is sent), so a
/// run killed with -9 leaves nothing on a depot that no file names: the
/// next run on the same exNode ([`Session::begin`]) frees what the journal
/// lists and neither the exNode nor its record names. Kept in the page
/// cache, not fsynced: it outlives a killed process, and what a power cut
/// takes from it expires with its lease.
#[derive(Debug)]
pub struct Journal {
    file: std::sync::Mutex<std::fs::File>,
    /// A writer's own journal ([`Journal::private`]): its path, removed
    /// when the writer is done with it, and the `.PID.N` that follows
    /// `OUT.journal` in it.
    own: Option<std::sync::Mutex<(PathBuf, String)>>,
}

impl Journal {
    /// A journal of one writer's own beside `out` (an xio file open for
    /// writing, which holds no [`Lock`] between its saves):
    /// `OUT.journal.PID.N`, made exclusively and `flock`ed for as long as
    /// it is open. [`settle`] takes up only those whose writer is gone
    /// (their lock is free), never a live one's.
    pub fn private(out: &Path) -> std::io::Result<Journal> {
        use std::os::unix::fs::OpenOptionsExt as _;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!(".{}.{n}", std::process::id());
        let mut p = journal_path(out).into_os_string();
        p.push(&tag);
        let path = PathBuf::from(p);
        // Made and locked under another name, then renamed: a settle never
        // sees it unlocked.
        let mut fresh = path.clone().into_os_string();
        fresh.push(".new");
        let fresh = out.with_file_name(format!(
            ".{}",
            Path::new(&fresh)
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
        ));
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&fresh)?;
        let locked = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(std::io::Error::from)
            .and_then(|()| std::fs::rename(&fresh, &path));
        if let Err(e) = locked {
            let _ = std::fs::remove_file(&fresh);
            return Err(e);
        }
        Ok(Journal {
            file: std::sync::Mutex::new(file),
            own: Some(std::sync::Mutex::new((path, tag))),
        })
    }

    /// The exNode of this writer's own journal is now `out`: the journal's
    /// name follows it, so the next command on `out` finds it. With
    /// `rename`, the journal is moved on disk; without, it moved already
    /// (the directory holding both was renamed).
    pub fn follow(&self, out: &Path, rename: bool) -> std::io::Result<()> {
        let Some(own) = &self.own else {
            return Ok(());
        };
        let mut own = own.lock().unwrap_or_else(|e| e.into_inner());
        let mut to = journal_path(out).into_os_string();
        to.push(&own.1);
        let to = PathBuf::from(to);
        if rename {
            std::fs::rename(&own.0, &to)?;
        }
        own.0 = to;
        Ok(())
    }

    /// Everything listed so far is named by the saved exNode or released:
    /// the journal starts over (a writer that stays open for days keeps
    /// it short).
    pub fn reset(&self) {
        let f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.set_len(0);
    }

    /// Done with a writer's own journal: everything it lists is named by
    /// the saved exNode or released. Removed.
    pub fn done(&self) {
        if let Some(own) = &self.own {
            let own = own.lock().unwrap_or_else(|e| e.into_inner());
            let _ = std::fs::remove_file(&own.0);
        }
    }

    /// Opens (appending) the journal at `path`; never through a link.
    fn open(path: &Path) -> std::io::Result<Journal> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Journal {
            file: std::sync::Mutex::new(file),
            own: None,
        })
    }

    /// Writes a line no reader takes for an allocation.
    fn note(&self, line: &str) -> std::io::Result<()> {
        use std::io::Write as _;
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(f, "{line}")
    }

    /// Writes down an allocation of `size` bytes.
    pub fn append(&self, size: u64, caps: &lors_ibp::CapSet) -> std::io::Result<()> {
        use std::io::Write as _;
        let line = format!(
            "{size} {} {} {}\n",
            caps.read.to_url(),
            caps.write.to_url(),
            caps.manage.to_url()
        );
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(line.as_bytes())
    }
}

/// The allocations the journal at `path` lists (none when there is none);
/// lines that do not parse are skipped (a line cut short by a kill).
fn read_journal(path: &Path) -> std::result::Result<Vec<Mapping>, XndError> {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(Vec::new());
    };
    // Only this user's own runs write journals: one planted by anyone else
    // is nobody's word on what to free.
    if meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(XndError::Read {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "a journal owned by another user: not read (remove it if it is not yours)",
            ),
        });
    }
    let bytes = xnd::read_regular(path, MAX_JOURNAL_BYTES)?;
    Ok(parse_journal(&bytes))
}

/// The allocations journal lines list: `SIZE READ WRITE MANAGE`, each a
/// capability URL; any other line (a note, one cut short by a kill,
/// garbage) is skipped.
fn parse_journal(bytes: &[u8]) -> Vec<Mapping> {
    let cap = |s: Option<&str>| lors_ibp::Capability::parse(s?).ok();
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            let size = w.next()?.parse().ok()?;
            let (read, write, manage) = (cap(w.next()), cap(w.next()), cap(w.next()));
            manage.as_ref()?;
            Some(Mapping {
                alloc_length: size,
                read,
                write,
                manage,
                ..Mapping::default()
            })
        })
        .collect()
}

/// One writer at a time per exNode: an exclusive `flock` on `OUT.lock`,
/// which the kernel drops when its holder exits, however it exits (no
/// stale lock to break by hand). The file holds the holder's pid, for the
/// message a second writer gets; it is removed when the lock is let go.
#[derive(Debug)]
pub struct Lock {
    path: PathBuf,
    _file: std::fs::File,
}

impl Lock {
    /// Takes the lock of `out`; with `wait`, waits up to that long for
    /// another holder to let go, else fails at once with
    /// [`Error::Busy`].
    pub fn take(out: &Path, wait: std::time::Duration) -> Result<Lock> {
        use std::io::{Read as _, Seek as _, Write as _};
        use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
        let path = lock_path(out);
        let io = |e| Error::io(format!("locking {}", path.display()), e);
        let t0 = std::time::Instant::now();
        loop {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(io)?;
            match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    if t0.elapsed() >= wait {
                        let mut pid = String::new();
                        let _ = f.read_to_string(&mut pid);
                        return Err(Error::Busy {
                            path: out.to_owned(),
                            holder: pid.trim().parse().ok(),
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    continue;
                }
                Err(e) => return Err(io(e.into())),
            }
            // The holder before us may have removed the file between our
            // open and our lock: a lock on a file no longer at the path
            // locks nothing. Take it again.
            let ours = f.metadata().map_err(io)?;
            match std::fs::symlink_metadata(&path) {
                Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => {}
                _ => continue,
            }
            // The pid is only for a second writer's message: a full disk
            // that cannot take it does not stop the run.
            let _ = f
                .set_len(0)
                .and_then(|()| f.rewind())
                .and_then(|_| writeln!(f, "{}", std::process::id()));
            return Ok(Lock { path, _file: f });
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while still held: the next taker finds the path gone or
        // a new file, never this one unlocked.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A run that changes the exNode at `out`: holds its [`Lock`], finished
/// what an earlier run left ([`settle`]), and writes every allocation it
/// makes through its pool into `OUT.journal` until [`Session::end`].
#[derive(Debug)]
pub struct Session {
    out: PathBuf,
    _lock: Lock,
    journal: Arc<Journal>,
}

impl Session {
    /// Starts a run on `out` with `pool`: the lock (waiting up to `wait`),
    /// then what an earlier run left is settled, then the pool's
    /// allocations are journaled.
    pub async fn begin(out: &Path, pool: &Arc<Pool>, wait: std::time::Duration) -> Result<Session> {
        let s = Session::open(out, pool, wait).await?;
        pool.set_journal(s.journal.clone());
        Ok(s)
    }

    /// [`Session::begin`] for a run whose allocations go through a pool it
    /// shares (a batch's uploads): each allocation is written into
    /// [`Session::journal`] by whoever makes it.
    pub async fn open(out: &Path, pool: &Arc<Pool>, wait: std::time::Duration) -> Result<Session> {
        let lock = {
            let out = out.to_owned();
            tokio::task::spawn_blocking(move || Lock::take(&out, wait))
                .await
                .map_err(|e| Error::io("locking", std::io::Error::other(e.to_string())))??
        };
        settle(out, pool).await?;
        // A copy made with cp or rsync holds no references yet: it takes
        // them before this run frees anything it names.
        adopt(out, pool).await?;
        let path = journal_path(out);
        // A first line now: a disk that cannot take the journal stops the
        // run here, before any depot is asked for anything.
        let j = match Journal::open(&path).and_then(|j| {
            j.note(&format!("# lors pid {}", std::process::id()))
                .map(|()| j)
        }) {
            Ok(j) => j,
            Err(e) => {
                if read_journal(&path).is_ok_and(|listed| listed.is_empty()) {
                    let _ = std::fs::remove_file(&path);
                }
                return Err(Error::io(format!("writing {}", path.display()), e));
            }
        };
        Ok(Session {
            out: out.to_owned(),
            _lock: lock,
            journal: Arc::new(j),
        })
    }

    /// Where this run's allocations are written down.
    pub fn journal(&self) -> &Arc<Journal> {
        &self.journal
    }

    /// Ends the run: what its journal lists that neither the exNode nor
    /// its record names is freed (or recorded), the journal removed, the
    /// lock let go. The number freed.
    pub async fn end(self, pool: &Arc<Pool>) -> Result<usize> {
        settle(&self.out, pool).await
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Ended early by an error: a journal that lists nothing goes; one
        // that lists allocations stays for the next run to settle.
        let j = journal_path(&self.out);
        if read_journal(&j).is_ok_and(|listed| listed.is_empty()) {
            let _ = std::fs::remove_file(&j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_lines_that_are_not_whole_are_skipped() {
        let caps =
            "ibp://h:6714/1#aaaa/7/READ ibp://h:6714/1#bbbb/7/WRITE ibp://h:6714/1#cccc/7/MANAGE";
        let text = format!(
            "# lors pid 1\n42 {caps}\n{}\n\u{0}\u{ff}garbage\n18446744073709551616 {caps}\n7 {caps}",
            &caps[..30]
        );
        let listed = parse_journal(text.as_bytes());
        let sizes: Vec<u64> = listed.iter().map(|m| m.alloc_length).collect();
        assert_eq!(sizes, [42, 7]);
        assert!(listed.iter().all(|m| m.manage.is_some()));
        // Any bytes at all: no panic.
        let mut junk = vec![0u8; 4096];
        for (i, b) in junk.iter_mut().enumerate() {
            *b = (i * 7919 % 251) as u8;
        }
        let _ = parse_journal(&junk);
    }
}
