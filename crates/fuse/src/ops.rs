//! The kernel's requests, answered from [`Fs`].

use std::ffi::OsStr;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::AsFd as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};
use lors::xio;

use crate::fs::Fs;
use crate::tree::{self, ROOT};
use crate::{NAME_MAX, TTL, enoent, errno, lock, set_dir_attrs, splice};

fn err(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

impl Fs {
    /// Stores what the file of descriptor `fh` holds unstored and saves its
    /// exNode (`close`, `fsync`).
    fn store(&self, fh: u64) -> io::Result<()> {
        let s = self.state_of(fh)?;
        if s.writable {
            s.file().sync_all()?;
            self.settle(&s.path());
        }
        Ok(())
    }

    fn lookup_path(&self, parent: INodeNo, name: &OsStr) -> io::Result<fuser::FileAttr> {
        let path = self.child(parent, name).map_err(|e| {
            // The mount's own hidden names are simply not there.
            if e.raw_os_error() == Some(libc::EPERM) {
                enoent()
            } else {
                e
            }
        })?;
        if tree::kind(&self.dir, &path).is_none() {
            return Err(enoent());
        }
        let ino = lock(&self.nodes).ino(&path);
        self.attr(ino)
    }

    /// `chmod`, `utimensat`, `truncate` and their `f` forms.
    fn set_attr(
        &self,
        ino: u64,
        mode: Option<u32>,
        owner: (Option<u32>, Option<u32>),
        size: Option<u64>,
        mtime: Option<SystemTime>,
        atime: Option<SystemTime>,
    ) -> io::Result<fuser::FileAttr> {
        let open = self.shared_or_closing(ino);
        let path = match &open {
            Some(s) => s.path(),
            None => {
                let p = self.path(ino)?;
                match tree::kind(&self.dir, &p) {
                    Some(FileType::Directory) => self.dir.join(p),
                    Some(_) => self.xnd(&p),
                    None => return Err(enoent()),
                }
            }
        };
        if owner.0.is_some() || owner.1.is_some() {
            std::os::unix::fs::lchown(&path, owner.0, owner.1)?;
        }
        if path.is_dir() {
            set_dir_attrs(&path, mtime, atime, mode)?;
            if let Some(t) = mtime {
                self.set_dir_time(&path, t);
            }
            return self.attr(ino);
        }
        let mut changed = None;
        if let Some(n) = size {
            if n > xio::MAX_FILE_SIZE {
                return Err(err(libc::EFBIG));
            }
            // Through the open state, made writable if it was not: every
            // descriptor sees the new size.
            // A truncation by name of a file being closed waits for that
            // close: it would otherwise open the `.xnd` from before it.
            if self.shared(ino).is_none() {
                self.closed_ino(ino);
            }
            let state = self.writable_state(ino)?;
            match state {
                Some(s) if s.set_len(n)? => changed = Some(s),
                _ => {
                    let mut o = self.open.clone();
                    o.write(true);
                    let mut f = o.open(&crate::fs::utf8(&path)?)?;
                    f.set_len(n)?;
                    f.close()?;
                }
            }
        }
        // Times and modes are recorded in the exNode (the `.xnd` file
        // itself stays owner-only: it holds keys), so `touch`, `chmod`,
        // `tar` and `rsync -a` find them after a remount.
        if mtime.is_some() || atime.is_some() || mode.is_some() {
            match self.shared_or_closing(ino) {
                // Saved with the open file, after its data: a time set
                // before close (`tar x`) is the one kept.
                Some(s) if s.writable && s.set_attributes(mtime, atime, mode) => changed = Some(s),
                other => {
                    xio::set_attributes(&crate::fs::utf8(&path)?, mtime, atime, mode)?;
                    if let Some(s) = other.filter(|s| !s.writable) {
                        // What readers holding it see, too.
                        s.set_attributes(mtime, atime, mode);
                    }
                }
            }
        }
        self.settle(&path);
        self.attr_after(ino, changed)
    }

    fn make_dir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
    ) -> io::Result<fuser::FileAttr> {
        use std::os::unix::fs::DirBuilderExt as _;
        let path = self.child(parent, name)?;
        if tree::kind(&self.dir, &path).is_some() {
            return Err(err(libc::EEXIST));
        }
        let real = self.dir.join(&path);
        std::fs::DirBuilder::new().mode(mode).create(&real)?;
        // The umask applied, not the mount process's own.
        std::fs::set_permissions(&real, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        self.give(&real, req.uid(), req.gid());
        self.changed(&real);
        let ino = lock(&self.nodes).ino(&path);
        self.attr(ino)
    }

    fn remove_dir(&self, parent: INodeNo, name: &OsStr) -> io::Result<()> {
        let path = self.child(parent, name)?;
        if tree::kind(&self.dir, &path) != Some(FileType::Directory) {
            return Err(err(libc::ENOTDIR));
        }
        std::fs::remove_dir(self.dir.join(&path))?;
        lock(&self.nodes).forget(&path);
        self.changed(&self.dir.join(&path));
        Ok(())
    }

    fn rename_any(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
    ) -> io::Result<()> {
        let from = self.child(parent, name)?;
        let to = self.child(newparent, newname)?;
        if flags & libc::RENAME_EXCHANGE != 0 {
            return Err(err(libc::EINVAL));
        }
        let (kf, kt) = (tree::kind(&self.dir, &from), tree::kind(&self.dir, &to));
        if kt.is_some() && flags & libc::RENAME_NOREPLACE != 0 {
            return Err(err(libc::EEXIST));
        }
        match (kf, kt) {
            (None, _) => Err(enoent()),
            (Some(FileType::Directory), Some(FileType::RegularFile)) => Err(err(libc::ENOTDIR)),
            (Some(FileType::RegularFile), Some(FileType::Directory)) => Err(err(libc::EISDIR)),
            (Some(FileType::Directory), _) => {
                if to.starts_with(&from) {
                    // Into itself.
                    return Err(err(libc::EINVAL));
                }
                self.rename_dir(&from, &to)
            }
            (Some(_), _) => self.rename_file(&from, &to),
        }
    }

    fn create_file(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> io::Result<(u64, fuser::FileAttr)> {
        let path = self.child(parent, name)?;
        if tree::kind(&self.dir, &path) == Some(FileType::Directory) {
            return Err(err(libc::EISDIR));
        }
        let ino = lock(&self.nodes).ino(&path);
        let existed = self.xnd(&path).is_file();
        let fh = self.open_file(ino, flags, true)?;
        let r = (|| {
            if !existed {
                // The mode the program asked for (0640, or 0664 under
                // umask 002), saved with the file; not the `.xnd`'s own.
                let mode = Some(mode & 0o7777);
                let s = self.state_of(fh)?;
                if s.writable {
                    s.set_attributes(None, None, mode);
                    s.file().sync_all()?;
                } else {
                    xio::set_attributes(&self.target(&path)?, None, None, mode)?;
                    s.set_attributes(None, None, mode);
                }
                self.give(&self.xnd(&path), req.uid(), req.gid());
                self.changed(&self.xnd(&path));
                self.settle(&self.xnd(&path));
            }
            self.attr(ino)
        })();
        match r {
            Ok(a) => Ok((fh, a)),
            Err(e) => {
                self.close(fh);
                Err(e)
            }
        }
    }

    fn list_dir(&self, ino: u64) -> io::Result<crate::fs::Listing> {
        let path = self.path(ino)?;
        if tree::kind(&self.dir, &path) != Some(FileType::Directory) {
            return Err(err(libc::ENOTDIR));
        }
        let listing = tree::list(&self.dir, &path)?;
        let mut nodes = lock(&self.nodes);
        let up = path.parent().map_or(ROOT, |p| nodes.ino(p));
        let mut entries = Vec::with_capacity(listing.len() + 2);
        entries.push((ino, FileType::Directory, ".".into()));
        entries.push((up, FileType::Directory, "..".into()));
        for (name, kind) in listing {
            let i = nodes.ino(&path.join(&name));
            entries.push((i, kind, name));
        }
        Ok(entries)
    }
}

/// Answers a request that returns nothing but success or an errno.
fn empty(r: io::Result<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn when(t: fuser::TimeOrNow) -> SystemTime {
    match t {
        fuser::TimeOrNow::SpecificTime(t) => t,
        fuser::TimeOrNow::Now => SystemTime::now(),
    }
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Large requests: fewer round trips through the kernel.
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn destroy(&mut self) {
        let fhs: Vec<u64> = lock(&self.handles).keys().copied().collect();
        for fh in fhs {
            self.close(fh);
        }
        self.settle_all();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Space is the depots', not a disk's: no block counts. The name
        // limit is what the mount can really hold.
        reply.statfs(0, 0, 0, 0, 0, 512, NAME_MAX as u32, 0);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_path(parent, name) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let (mtime, atime) = (mtime.map(when), atime.map(when));
        match self.set_attr(ino.0, mode, (uid, gid), size, mtime, atime) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            self.child(parent, name).and_then(|p| self.unlink(&p)),
            reply,
        )
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.make_dir(req, parent, name, mode & !umask & 0o7777) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.remove_dir(parent, name), reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        empty(
            self.rename_any(parent, name, newparent, newname, flags.bits()),
            reply,
        )
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(ino.0, flags.0, false) {
            Ok(fh) => {
                // A writer's journal was made beside the exNode.
                if let Ok(s) = self.state_of(fh) {
                    self.settle(&s.path());
                }
                reply.opened(FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => {
                // The program sees EROFS alone; the mount's log says why
                // (no write capability, or an erasure-coded file).
                if e.kind() == io::ErrorKind::ReadOnlyFilesystem {
                    tracing::warn!(error = %e, "opened for writing: refused");
                }
                reply.error(errno(&e))
            }
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.create_file(req, parent, name, mode & !umask, flags) {
            Ok((fh, a)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = match self.state_of(fh.0) {
            Ok(s) => s,
            Err(e) => return reply.error(errno(&e)),
        };
        if let (Some(reads), Some(dev)) = (&s.reads, self.dev.get()) {
            match splice::read(dev.as_fd(), reads, req.unique().0, offset, size) {
                // Answered on the device: the reply object is not needed,
                // and dropped it would answer again with an error. (Each
                // holds a count on the device's Arc, which then stays
                // open until the process exits.)
                splice::Outcome::Answered => return std::mem::forget(reply),
                splice::Outcome::Failed(e) => return reply.error(errno(&e)),
                splice::Outcome::Fallback => {}
            }
        }
        // A short reply is end of file to the kernel: read_with gives all
        // `size` bytes unless the file ends, from the cache without a copy
        // when they lie in one piece.
        let mut reply = Some(reply);
        let answer = |b: &[u8]| {
            if let Some(r) = reply.take() {
                r.data(b);
            }
        };
        let r = s.read_with(offset, size as usize, answer);
        if let (Err(e), Some(r)) = (r, reply.take()) {
            r.error(errno(&e));
        }
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (the kernel answers the other whences
    /// itself): a sparse file's holes, so `cp`, `tar --sparse` and the
    /// like copy it sparse without reading its zeros.
    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let (Ok(offset), true) = (
            u64::try_from(offset),
            whence == libc::SEEK_DATA || whence == libc::SEEK_HOLE,
        ) else {
            return reply.error(Errno::EINVAL);
        };
        let r = self.state_of(fh.0).and_then(|s| {
            let mut f = s.file();
            f.seek_sparse(offset, whence == libc::SEEK_DATA)
        });
        match r.map(i64::try_from) {
            Ok(Ok(n)) => reply.offset(n),
            Ok(Err(_)) => reply.error(Errno::EOVERFLOW),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel gives the offset, an appending descriptor's too (the
        // file's end as this mount last told it).
        let r = self.state_of(fh.0).and_then(|s| {
            if !s.writable {
                return Err(err(libc::EBADF));
            }
            let mut f = s.file();
            f.seek(SeekFrom::Start(offset))?;
            f.write_all(data)
        });
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Every close(2) of a descriptor that writes: store and save now, so
    /// close reports a failure.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A descriptor that only reads stores nothing of another's.
        let r = self.handle_ino(fh.0);
        empty(
            r.and_then(|(_, w)| if w { self.store(fh.0) } else { Ok(()) }),
            reply,
        )
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.store(fh.0), reply)
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.close(fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let is_dir =
            (self.path(ino.0)).map(|p| tree::kind(&self.dir, &p) == Some(FileType::Directory));
        match is_dir {
            Ok(true) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                reply.opened(FileHandle(fh), FopenFlags::empty())
            }
            Ok(false) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Listed once from the start (and again after `rewinddir`, so what
        // changed since shows, as on a local disk); later replies of a
        // large directory come from that listing.
        if offset == 0 {
            match self.list_dir(ino.0) {
                Ok(e) => {
                    lock(&self.listings).insert(fh.0, Arc::new(e));
                }
                Err(e) => return reply.error(errno(&e)),
            }
        }
        let Some(entries) = lock(&self.listings).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        for (k, (i, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*i), (k + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.listings).remove(&fh.0);
        reply.ok();
    }
}
