//! The mount's state: inode numbers, open files, and how each request
//! changes the exNode directory.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use fuser::{FileAttr, FileType, INodeNo};
use lors::xio::{self, OpenOptions};

use crate::open::{Inode, Shared};
use crate::tree::{self, Nodes};
use crate::{check_name, enoent, lock};

/// A directory's entries as `readdir` gives them: inode, kind, name.
pub(crate) type Listing = Vec<(u64, FileType, OsString)>;

/// A descriptor: which inode, and whether it may write.
pub(crate) struct Handle {
    pub(crate) ino: u64,
    pub(crate) writable: bool,
}

pub(crate) struct Fs {
    pub(crate) dir: PathBuf,
    pub(crate) open: OpenOptions,
    /// [`crate::Options::file_mode`].
    pub(crate) file_mode: Option<u32>,
    /// [`crate::Options::uid`] and [`crate::Options::gid`].
    pub(crate) owner: (Option<u32>, Option<u32>),
    /// Files and directories made through the mount belong to the user
    /// who made them ([`crate::Options::allow_other`] as root).
    pub(crate) chown_created: bool,
    /// The FUSE device, once mounted, for spliced READ replies
    /// ([`crate::splice`]); never set with [`crate::Options::copy_reads`].
    pub(crate) dev: Arc<OnceLock<OwnedFd>>,
    pub(crate) nodes: Mutex<Nodes>,
    /// Inodes with descriptors open on them. Taken before `nodes` when
    /// both are.
    pub(crate) inodes: Mutex<HashMap<u64, Inode>>,
    pub(crate) handles: Arc<Mutex<HashMap<u64, Handle>>>,
    /// Directory listings, made at `opendir`: a large directory is read
    /// once, not again for every reply's worth of entries.
    pub(crate) listings: Mutex<HashMap<u64, Arc<Listing>>>,
    pub(crate) next_fh: AtomicU64,
    /// When the directories changed through the mount last changed (an
    /// entry made, removed or renamed, or a time set): what they show,
    /// whatever the files kept beside exNodes (a journal, a lock) do to
    /// the real directory's time after; put back on the real directory
    /// once those are done ([`Fs::settle`]), so it also outlives the mount.
    pub(crate) dir_times: Mutex<HashMap<PathBuf, SystemTime>>,
    /// Open states whose last close is saving them, by inode: `stat`
    /// reads them and an open waits for them, rather than the `.xnd` from
    /// before a change that came in during the close.
    pub(crate) closing: Mutex<HashMap<u64, Arc<Shared>>>,
}

impl Fs {
    /// The path of `ino` on the mount (relative to the exNode directory).
    pub(crate) fn path(&self, ino: u64) -> io::Result<PathBuf> {
        (lock(&self.nodes).path(ino))
            .map(Path::to_path_buf)
            .ok_or_else(enoent)
    }

    /// The path of `name` in the directory `parent`.
    pub(crate) fn child(&self, parent: INodeNo, name: &OsStr) -> io::Result<PathBuf> {
        check_name(name)?;
        let p = self.path(parent.0)?.join(name);
        // The exNode beside it (and its journal, 46 bytes longer) must
        // fit in a path the kernel takes: ENAMETOOLONG now, not EIO later.
        if self.dir.join(&p).as_os_str().len() + 46 >= libc::PATH_MAX as usize {
            return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
        }
        if tree::hidden(&p) {
            // The mount's own names: not for programs to make or reach.
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(p)
    }

    pub(crate) fn xnd(&self, path: &Path) -> PathBuf {
        tree::xnd(&self.dir, path)
    }

    pub(crate) fn target(&self, path: &Path) -> io::Result<String> {
        utf8(&self.xnd(path))
    }

    /// The open state of `ino`, if a descriptor is open on it.
    pub(crate) fn shared(&self, ino: u64) -> Option<Arc<Shared>> {
        lock(&self.inodes).get(&ino).map(|n| n.shared.clone())
    }

    /// Waits while a last close saves the file at `path`: what changes its
    /// `.xnd` (a rename, an unlink, an open from disk) comes after that
    /// save, never before it (which would save to a name it no longer has).
    pub(crate) fn closed(&self, path: &Path) {
        if let Some(ino) = lock(&self.nodes).get(path) {
            self.closed_ino(ino);
        }
    }

    /// [`Fs::closed`] by inode number.
    pub(crate) fn closed_ino(&self, ino: u64) {
        while lock(&self.closing).contains_key(&ino) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// [`Fs::shared`], or the state its last close is still saving: until
    /// that is done, it (not the `.xnd`) says what the file is, and a
    /// change to it is saved by that close.
    pub(crate) fn shared_or_closing(&self, ino: u64) -> Option<Arc<Shared>> {
        self.shared(ino)
            .or_else(|| lock(&self.closing).get(&ino).cloned())
    }

    pub(crate) fn handle_ino(&self, fh: u64) -> io::Result<(u64, bool)> {
        (lock(&self.handles).get(&fh))
            .map(|h| (h.ino, h.writable))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    /// The open state a descriptor reads and writes through.
    pub(crate) fn state_of(&self, fh: u64) -> io::Result<Arc<Shared>> {
        let (ino, _) = self.handle_ino(fh)?;
        self.shared(ino)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    /// The attributes of `ino`: its open state's if it is open (it knows
    /// what is still buffered), else the saved exNode's or directory's.
    pub(crate) fn attr(&self, ino: u64) -> io::Result<FileAttr> {
        self.attr_after(ino, None)
    }

    /// [`Fs::attr`], or, if `ino` closed meanwhile, `changed`'s: the state
    /// a `chmod` or `truncate` just changed, which its last close may not
    /// have saved yet (the `.xnd` still says what it did before).
    pub(crate) fn attr_after(
        &self,
        ino: u64,
        changed: Option<Arc<Shared>>,
    ) -> io::Result<FileAttr> {
        let open = (lock(&self.inodes).get(&ino)).map(|n| (n.shared.clone(), n.unlinked));
        let closing = || self.shared_or_closing(ino).or(changed).map(|s| (s, false));
        if let Some((s, unlinked)) = open.or_else(closing) {
            let (m, path) = (s.metadata()?, s.path());
            let mut a = self.file_attr(ino, &m, &path)?;
            if unlinked {
                a.nlink = 0;
            }
            return Ok(a);
        }
        let path = self.path(ino)?;
        match tree::kind(&self.dir, &path) {
            Some(FileType::Directory) => self.dir_attr(ino, &path),
            Some(_) => {
                let x = self.xnd(&path);
                let m = xio::stat(&utf8(&x)?).inspect_err(|e| {
                    // A malformed exNode: named, with why, where the user looks.
                    if e.kind() == io::ErrorKind::InvalidData {
                        tracing::warn!(file = %x.display(), error = %e, "unreadable exNode");
                    }
                })?;
                self.file_attr(ino, &m, &x)
            }
            None => Err(enoent()),
        }
    }

    /// Entries of the directory holding `at` (a real path) changed now.
    pub(crate) fn changed(&self, at: &Path) {
        if let Some(d) = at.parent() {
            lock(&self.dir_times).insert(d.to_owned(), SystemTime::now());
        }
    }

    /// The real directory `real` shows `t` as its modification time.
    pub(crate) fn set_dir_time(&self, real: &Path, t: SystemTime) {
        lock(&self.dir_times).insert(real.to_owned(), t);
    }

    /// Puts the time the directory holding `at` shows back on the real
    /// directory, after a save or close touched the files beside an
    /// exNode there.
    pub(crate) fn settle(&self, at: &Path) {
        let Some(d) = at.parent() else { return };
        let Some(t) = lock(&self.dir_times).get(d).copied() else {
            return;
        };
        if let Err(e) = set_mtime(d, t) {
            tracing::debug!(dir = %d.display(), error = %e, "directory time not put back");
        }
    }

    /// Every directory's time put back (at unmount).
    pub(crate) fn settle_all(&self) {
        for (d, t) in lock(&self.dir_times).drain() {
            let _ = set_mtime(&d, t);
        }
    }

    fn dir_attr(&self, ino: u64, path: &Path) -> io::Result<FileAttr> {
        let real = self.dir.join(path);
        let m = std::fs::symlink_metadata(&real)?;
        let t = |r: io::Result<SystemTime>| r.unwrap_or(SystemTime::UNIX_EPOCH);
        let shown = lock(&self.dir_times).get(&real).copied();
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: 4096,
            blocks: 8,
            atime: t(m.accessed()),
            mtime: shown.unwrap_or(t(m.modified())),
            ctime: ctime_of(&m),
            crtime: SystemTime::UNIX_EPOCH,
            kind: FileType::Directory,
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: self.owner.0.unwrap_or(m.uid()),
            gid: self.owner.1.unwrap_or(m.gid()),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn file_attr(&self, ino: u64, m: &xio::Metadata, xnd: &Path) -> io::Result<FileAttr> {
        let fsm = std::fs::metadata(xnd)?;
        let mut perm = match (m.mode_recorded, self.file_mode) {
            (false, Some(mode)) => mode,
            _ => m.permissions,
        };
        if m.readonly {
            perm &= !0o222;
        }
        let ctime = ctime_of(&fsm);
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: m.len,
            blocks: m.len.div_ceil(512),
            atime: m.accessed,
            mtime: m.modified,
            ctime: ctime.max(m.modified),
            crtime: SystemTime::UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: perm as u16,
            nlink: 1,
            uid: self.owner.0.unwrap_or(fsm.uid()),
            gid: self.owner.1.unwrap_or(fsm.gid()),
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        })
    }

    /// Makes `path` (an `.xnd` or a directory just made) belong to the
    /// user `uid:gid` who asked for it, when the mount serves others.
    pub(crate) fn give(&self, path: &Path, uid: u32, gid: u32) {
        if !self.chown_created {
            return;
        }
        if let Err(e) = std::os::unix::fs::lchown(path, Some(uid), Some(gid)) {
            tracing::debug!(file = %path.display(), error = %e, "not given to its creator");
        }
    }

    /// Opens `ino` for a new descriptor: shares its open state, making it
    /// writable first if this descriptor writes.
    pub(crate) fn open_file(&self, ino: u64, flags: i32, create: bool) -> io::Result<u64> {
        let acc = flags & libc::O_ACCMODE;
        let writable = acc != libc::O_RDONLY;
        let trunc = writable && flags & libc::O_TRUNC != 0;
        self.closed_ino(ino);
        let mut inodes = lock(&self.inodes);
        let path = match inodes.get(&ino) {
            Some(n) => n.shared.path(),
            None => self.xnd(&self.path(ino)?),
        };
        let target = utf8(&path)?;
        let fresh = |write: bool| -> io::Result<Shared> {
            let mut o = self.open.clone();
            // A reader's read-ahead keeps what it fetches in pipes when
            // replies are spliced.
            o.spliced(!write && self.dev.get().is_some())
                .read(true)
                .write(write)
                .create(create)
                .create_new(create && flags & libc::O_EXCL != 0);
            Shared::new(o.open(&target)?, write)
        };
        let shared = match inodes.get_mut(&ino) {
            Some(n) => {
                if writable && !n.shared.writable {
                    // The first writer of a file open for reading: the
                    // readers read through it from now on.
                    n.shared = Arc::new(fresh(true)?);
                }
                n.holders += 1;
                n.shared.clone()
            }
            None => {
                let shared = if create && !writable {
                    // `O_CREAT|O_RDONLY` (`flock FILE`, `touch` by some
                    // shells): the empty file is made, then read.
                    fresh(true)?.into_file().close()?;
                    let mut o = self.open.clone();
                    o.spliced(self.dev.get().is_some()).read(true);
                    Arc::new(Shared::new(o.open(&target)?, false)?)
                } else {
                    Arc::new(fresh(writable)?)
                };
                let node = Inode {
                    shared: shared.clone(),
                    holders: 1,
                    unlinked: false,
                };
                inodes.insert(ino, node);
                shared
            }
        };
        drop(inodes);
        let fh = self
            .next_fh
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.handles).insert(fh, Handle { ino, writable });
        // `O_TRUNC` outside the inode table: dropping the old blocks frees
        // them on their depots, and a hung one must not hold up the mount.
        if trunc {
            let emptied = shared.file().set_len(0);
            if let Err(e) = emptied {
                self.close(fh);
                return Err(e);
            }
        }
        Ok(fh)
    }

    /// A descriptor closed; the last one on its inode saves (or frees) it.
    pub(crate) fn close(&self, fh: u64) {
        let Some(h) = lock(&self.handles).remove(&fh) else {
            return;
        };
        let mut shared = {
            let mut inodes = lock(&self.inodes);
            let Some(n) = inodes.get_mut(&h.ino) else {
                return;
            };
            n.holders -= 1;
            if n.holders > 0 {
                return;
            }
            n.shared.clone()
        };
        // Saved while still listed: a program that closes and at once
        // opens the file again (the kernel's release comes after close(2)
        // returns) shares this state, never reads the exNode before it is
        // saved; and `stat` after a `chmod` that came in meanwhile reads
        // it, not the `.xnd` before that change is saved (then saved too).
        let last = loop {
            let before = shared.changes();
            if shared.writable {
                let saved = shared.file().sync_all();
                if let Err(e) = saved {
                    tracing::warn!(file = %shared.path().display(), error = %e, "closing a file in the mount");
                }
            }
            let mut inodes = lock(&self.inodes);
            let Some(n) = inodes.get(&h.ino).filter(|n| n.holders == 0) else {
                break None;
            };
            if Arc::ptr_eq(&n.shared, &shared) && shared.changes() == before {
                lock(&self.closing).insert(h.ino, shared.clone());
                break inodes.remove(&h.ino);
            }
            shared = n.shared.clone();
        };
        if let Some(node) = last {
            // Off the closing list however the close ends (a panic too):
            // opens of the file wait on the list.
            let _done = Closed {
                fs: self,
                ino: h.ino,
                shared,
            };
            let path = node.shared.path();
            crate::open::last_close(node, &self.open);
            self.settle(&path);
        }
    }

    /// The open state of `ino` made writable (a truncation through a
    /// descriptor open for reading, or by name while others read).
    pub(crate) fn writable_state(&self, ino: u64) -> io::Result<Option<Arc<Shared>>> {
        let mut inodes = lock(&self.inodes);
        let Some(n) = inodes.get_mut(&ino) else {
            return Ok(None);
        };
        if !n.shared.writable {
            let mut o = self.open.clone();
            o.read(true).write(true);
            let f = o.open(&utf8(&n.shared.path())?)?;
            n.shared = Arc::new(Shared::new(f, true)?);
        }
        Ok(Some(n.shared.clone()))
    }

    /// Removes the file at `path`: an open one's `.xnd` goes under a
    /// hidden name until its last holder closes it; any other's blocks are
    /// freed and its `.xnd` removed, as `lors rm` does (an erasure-coded
    /// file's parity too; blocks a copy also names lose only this file's
    /// reference; a read-only copy frees nothing).
    pub(crate) fn unlink(&self, path: &Path) -> io::Result<()> {
        self.closed(path);
        let mut inodes = lock(&self.inodes);
        let ino = lock(&self.nodes).get(path);
        match ino.and_then(|i| inodes.get_mut(&i)) {
            Some(n) => {
                n.shared.rename(&crate::open::hidden_name(&self.dir))?;
                n.unlinked = true;
            }
            None => {
                drop(inodes);
                self.open.remove(&self.target(path)?)?;
            }
        }
        lock(&self.nodes).forget(path);
        self.changed(&self.dir.join(path));
        Ok(())
    }

    /// Renames the file `from` to `to`. A file replaced is moved aside
    /// first and freed after (or at its last holder's close): the name
    /// never leads to nothing, and nothing is freed that the old name
    /// still needed.
    pub(crate) fn rename_file(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.closed(from);
        self.closed(to);
        let mut inodes = lock(&self.inodes);
        let (src, dst) = {
            let n = lock(&self.nodes);
            (n.get(from), n.get(to))
        };
        let (from_x, to_x) = (self.xnd(from), self.xnd(to));
        let mut aside = None;
        if to_x.is_file() {
            let hidden = crate::open::hidden_name(&self.dir);
            match dst.and_then(|i| inodes.get_mut(&i)) {
                Some(n) => {
                    n.shared.rename(&hidden)?;
                    n.unlinked = true;
                }
                None => {
                    std::fs::rename(&to_x, &hidden)?;
                    aside = Some(hidden);
                }
            }
        }
        let moved = match src.and_then(|i| inodes.get(&i)) {
            Some(n) => n.shared.rename(&to_x),
            None => std::fs::rename(&from_x, &to_x),
        };
        if let Err(e) = moved {
            if let Some(h) = &aside {
                // Put back what was to be replaced.
                let _ = std::fs::rename(h, &to_x);
            }
            return Err(e);
        }
        drop(inodes);
        lock(&self.nodes).rename(from, to);
        self.changed(&self.dir.join(from));
        self.changed(&self.dir.join(to));
        if let Some(h) = aside
            && let Err(e) = self.open.remove(&utf8(&h)?)
        {
            tracing::warn!(file = %h.display(), error = %e, "a file replaced by a rename could not be freed; `lors rm` it to finish");
        }
        Ok(())
    }

    /// Renames the directory `from` to `to` (replacing an empty one);
    /// files open under it save under their new names.
    pub(crate) fn rename_dir(&self, from: &Path, to: &Path) -> io::Result<()> {
        let inodes = lock(&self.inodes);
        let (src, dst) = (self.dir.join(from), self.dir.join(to));
        if self.xnd(to).is_file() && !dst.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        std::fs::rename(&src, &dst)?;
        {
            // What was recorded under the old name is the real time now.
            let mut times = lock(&self.dir_times);
            times.retain(|d, _| !d.starts_with(&src) && !d.starts_with(&dst));
        }
        self.changed(&src);
        self.changed(&dst);
        let mut nodes = lock(&self.nodes);
        nodes.rename(from, to);
        for (ino, n) in inodes.iter() {
            if n.unlinked {
                continue;
            }
            if let Some(p) = nodes.path(*ino).filter(|p| p.starts_with(to)) {
                n.shared.moved(tree::xnd(&self.dir, p));
            }
        }
        Ok(())
    }
}

/// Takes a state off [`Fs::closing`] when dropped.
struct Closed<'a> {
    fs: &'a Fs,
    ino: u64,
    shared: Arc<Shared>,
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        let mut closing = lock(&self.fs.closing);
        if (closing.get(&self.ino)).is_some_and(|c| Arc::ptr_eq(c, &self.shared)) {
            closing.remove(&self.ino);
        }
    }
}

fn set_mtime(dir: &Path, t: SystemTime) -> io::Result<()> {
    std::fs::File::open(dir)?.set_times(std::fs::FileTimes::new().set_modified(t))
}

pub(crate) fn utf8(p: &Path) -> io::Result<String> {
    p.to_str()
        .map(str::to_owned)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "file names must be UTF-8"))
}

/// A file's change time to the nanosecond: programs compare it after
/// changes made within the same second.
fn ctime_of(m: &std::fs::Metadata) -> SystemTime {
    SystemTime::UNIX_EPOCH
        + std::time::Duration::new(m.ctime().max(0) as u64, m.ctime_nsec() as u32)
}
