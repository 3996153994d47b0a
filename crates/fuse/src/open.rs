//! Open files: one state per file, shared by every descriptor on it, as a
//! local file system's inode is.
//!
//! A file open only for reading has a read-only [`xio::File`] whose reads
//! need no lock; the first descriptor that writes (or a truncation)
//! turns it into a writable one, which every descriptor then reads and
//! writes through, so each sees the others' writes and `stat` agrees with
//! `read`. Renamed or unlinked while open, the state moves with its
//! `.xnd`; the last close saves it, or frees an unlinked file's blocks.

use std::io;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use lors::xio;

use crate::lock;

/// The file every descriptor on one inode reads and writes through.
pub(crate) struct Shared {
    /// Reached through [`Shared::file`], which keeps `seen` current.
    file: Mutex<xio::File>,
    /// The file's metadata as last read, with the length and time every
    /// call since left: `stat` answers from it while a write or a store
    /// holds the file (a hung depot must not freeze `ls -l`).
    seen: Mutex<Option<xio::Metadata>>,
    /// `chmod`, `utimensat` and `truncate` applied to it: its last close
    /// saves again when one came in while it saved.
    changes: AtomicU64,
    /// Saved for the last time: a change that finds it closed goes to the
    /// `.xnd` instead.
    closed: AtomicBool,
    pub(crate) writable: bool,
    /// A read-only file's reads, which need not take `file`: the kernel
    /// sends a file's read-ahead requests on several threads at once, and
    /// one waiting on the network must not hold back those whose bytes are
    /// in.
    pub(crate) reads: Option<xio::Reads>,
    /// `file`'s `.xnd`, kept apart: asked for under the mount's inode
    /// table, where waiting for `file` (a store on a hung depot) would
    /// hold up every other file.
    path: Mutex<PathBuf>,
}

impl Shared {
    pub(crate) fn new(file: xio::File, writable: bool) -> io::Result<Shared> {
        let mut file = file;
        let reads = if writable { None } else { Some(file.reads()?) };
        Ok(Shared {
            path: Mutex::new(file.path().to_path_buf()),
            seen: Mutex::new(file.metadata().ok()),
            changes: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            file: Mutex::new(file),
            writable,
            reads,
        })
    }

    /// The file, held until the guard drops; then what it became is what
    /// [`Shared::metadata`] answers while it is held again.
    pub(crate) fn file(&self) -> FileGuard<'_> {
        FileGuard {
            file: lock(&self.file),
            seen: &self.seen,
        }
    }

    /// The file's metadata now, or, while something holds the file (a
    /// write waiting on a store), as the last call that let go left it.
    pub(crate) fn metadata(&self) -> io::Result<xio::Metadata> {
        let fresh = |f: &xio::File| {
            let m = f.metadata()?;
            *lock(&self.seen) = Some(m.clone());
            Ok(m)
        };
        let busy = match self.file.try_lock() {
            Ok(f) => return fresh(&f),
            Err(TryLockError::Poisoned(e)) => return fresh(&e.into_inner()),
            Err(TryLockError::WouldBlock) => lock(&self.seen).clone(),
        };
        match busy {
            Some(m) => Ok(m),
            None => self.file().metadata(),
        }
    }

    /// [`xio::File::set_attributes`], and what `stat` answers while the
    /// file is held (a mode or a time only this says) made current; false
    /// if the file was saved for the last time (the caller sets them on
    /// the `.xnd`).
    pub(crate) fn set_attributes(
        &self,
        modified: Option<std::time::SystemTime>,
        accessed: Option<std::time::SystemTime>,
        mode: Option<u32>,
    ) -> bool {
        let mut f = self.file();
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        f.set_attributes(modified, accessed, mode);
        if let Ok(m) = f.metadata() {
            *lock(&self.seen) = Some(m);
        }
        self.changes.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// [`xio::File::set_len`]; `Ok(false)` if the file was saved for the
    /// last time (the caller truncates the `.xnd`'s file).
    pub(crate) fn set_len(&self, len: u64) -> io::Result<bool> {
        let mut f = self.file();
        if self.closed.load(Ordering::SeqCst) {
            return Ok(false);
        }
        f.set_len(len)?;
        self.changes.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }

    /// How many changes [`Shared::set_attributes`] and [`Shared::set_len`]
    /// made.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// The file as it will be saved: its state ends here.
    pub(crate) fn into_file(self) -> xio::File {
        self.file.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// The `.xnd` this state saves to.
    pub(crate) fn path(&self) -> PathBuf {
        lock(&self.path).clone()
    }

    /// The `.xnd` moved to `to` with its directory.
    pub(crate) fn moved(&self, to: PathBuf) {
        self.file().moved(to.clone());
        *lock(&self.path) = to;
    }

    /// Reads `size` bytes at `offset` into `answer`.
    pub(crate) fn read_with(
        &self,
        offset: u64,
        size: usize,
        answer: impl FnOnce(&[u8]),
    ) -> io::Result<()> {
        match &self.reads {
            Some(r) => r.read_with(offset, size, answer),
            None => self.file().read_with(offset, size, answer),
        }
    }

    /// Moves the `.xnd` to `to` (replacing what is there) and saves there
    /// from now on.
    pub(crate) fn rename(&self, to: &Path) -> io::Result<()> {
        let mut f = self.file();
        if self.writable {
            f.rename(to)?;
        } else {
            std::fs::rename(f.path(), to)?;
            f.moved(to.to_path_buf());
        }
        *lock(&self.path) = to.to_path_buf();
        Ok(())
    }
}

/// [`Shared::file`]'s hold on the file.
pub(crate) struct FileGuard<'a> {
    file: MutexGuard<'a, xio::File>,
    seen: &'a Mutex<Option<xio::Metadata>>,
}

impl Deref for FileGuard<'_> {
    type Target = xio::File;
    fn deref(&self) -> &xio::File {
        &self.file
    }
}

impl DerefMut for FileGuard<'_> {
    fn deref_mut(&mut self) -> &mut xio::File {
        &mut self.file
    }
}

impl Drop for FileGuard<'_> {
    fn drop(&mut self) {
        let (len, modified) = self.file.size_and_modified();
        if let Some(m) = lock(self.seen).as_mut() {
            m.len = len;
            if let Some(t) = modified {
                m.modified = t;
            }
        }
    }
}

/// An inode with descriptors open on it.
pub(crate) struct Inode {
    pub(crate) shared: Arc<Shared>,
    /// Descriptors open on it.
    pub(crate) holders: usize,
    /// Unlinked while open: its `.xnd` lies under a hidden name until the
    /// last holder closes it, and then its blocks are freed.
    pub(crate) unlinked: bool,
}

/// The last holder of an inode closed it: its state is saved (and its
/// writer's journal done with), or, unlinked, its blocks freed.
pub(crate) fn last_close(node: Inode, open: &xio::OpenOptions) {
    let path = node.shared.path();
    // A read still answering may hold the state a moment longer: saved
    // now, and the file closes when that read lets go of it.
    let closed = match Arc::try_unwrap(node.shared) {
        Ok(s) => s.into_file().close(),
        Err(s) => {
            // Another call holds it a moment longer: saved, and marked so
            // that a change it brings goes to the `.xnd`, not to a state
            // nobody will save.
            let mut f = s.file();
            let r = if s.writable { f.sync_all() } else { Ok(()) };
            s.closed.store(true, Ordering::SeqCst);
            r
        }
    };
    if let Err(e) = closed {
        tracing::warn!(file = %path.display(), error = %e, "closing a file in the mount");
    }
    if node.unlinked {
        // What the hidden exNode names, written up to the close, is freed
        // now, as a local file system frees an unlinked file's blocks.
        let r = path
            .to_str()
            .ok_or_else(|| io::Error::other("not UTF-8"))
            .and_then(|p| open.remove(p));
        if let Err(e) = r {
            tracing::warn!(file = %path.display(), error = %e, "freeing a file unlinked while open; `lors rm` it to finish");
        }
    }
}

/// The hidden name a file unlinked while open (or replaced by a rename)
/// is kept under in the exNode directory `dir`.
pub(crate) fn hidden_name(dir: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(
        "{}{}.{n}{}",
        crate::tree::UNLINKED,
        std::process::id(),
        crate::tree::SUFFIX
    ))
}

/// Frees what files unlinked while open by a mount no longer running
/// (killed before their last close) left under hidden names in `dir`.
pub(crate) fn free_left_unlinked(dir: &Path, open: &xio::OpenOptions) {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    for e in listing.flatten() {
        let n = e.file_name();
        let Some(rest) = n.as_bytes().strip_prefix(crate::tree::UNLINKED.as_bytes()) else {
            continue;
        };
        if !n.as_bytes().ends_with(crate::tree::SUFFIX.as_bytes()) {
            continue;
        }
        let pid = std::str::from_utf8(rest)
            .ok()
            .and_then(|r| r.split('.').next()?.parse::<u32>().ok());
        // A live mount's (the pid running) are its own to free.
        if pid.is_none_or(|p| Path::new(&format!("/proc/{p}")).exists()) {
            continue;
        }
        let p = e.path();
        match p.to_str().map(|s| open.remove(s)) {
            Some(Ok(())) => {
                tracing::info!(file = %p.display(), "freed a file a stopped mount had unlinked while open")
            }
            Some(Err(e)) => {
                tracing::warn!(file = %p.display(), error = %e, "could not free a file a stopped mount had unlinked while open")
            }
            None => {}
        }
    }
}
