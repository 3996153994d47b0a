//! `lors mount`: a directory of exNodes as a directory of files (FUSE).
//!
//! Each `NAME.xnd` in the exNode directory appears as `NAME` in the mount,
//! with the file's logical size; reading it reads the blocks through
//! [`lors::xio`] (read-ahead for sequential readers, a cache for the
//! rest), so `cat`, `cp`, `dd`, `cmp`, `tar` or a media player read it
//! unchanged. Creating a file stores what is written on depots and writes
//! `NAME.xnd`; `rm` releases the allocations and removes the `.xnd`;
//! `mv` renames it. The exNode directory is flat: no subdirectories.
//!
//! Errors reach programs as `errno`: `EIO` when no replica of a block can
//! be read, `ENOSPC` when no depot takes new data, `EROFS` when an exNode
//! holds no write capability.
//!
//! ```no_run
//! let mut o = lors::xio::OpenOptions::new();
//! o.depots(vec!["depot1.example.org:6714".into()]);
//! lors_fuse::run(
//!     std::path::Path::new("exnodes"),
//!     std::path::Path::new("/mnt/lors"),
//!     &lors_fuse::Options { open: o, ..Default::default() },
//!     |m| eprintln!("mounted on {}", m.display()),
//! )?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, SessionACL, WriteFlags,
};
use lors::xio::{self, OpenOptions};

mod splice;

/// How long the kernel may keep an attribute or name without asking again.
const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;
const SUFFIX: &str = ".xnd";
/// The longest name a file on the mount takes, as `statvfs` says: 255
/// bytes less what the files beside an exNode add to its name (the
/// longest, a writer's journal being made, `.NAME.xnd.journal.PID.N.new`,
/// adds 46). Past it, `ENAMETOOLONG` up front rather than `EIO` at close.
pub const NAME_MAX: usize = 255 - 46;

/// `ENAMETOOLONG` for a name the mount cannot hold.
fn check_name(name: &OsStr) -> io::Result<()> {
    if name.len() > NAME_MAX {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    Ok(())
}

/// Mount settings.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// How files are opened: settings, depots, write buffer, cache.
    pub open: OpenOptions,
    /// Let other users reach the mount (`allow_other`; for non-root users
    /// `/etc/fuse.conf` must allow it).
    pub allow_other: bool,
    /// Answer reads from memory with `writev(2)` instead of splicing the
    /// read-ahead's pipes into `/dev/fuse`: slower, one more copy of every
    /// byte; for comparison, or a kernel that refuses spliced replies. (A
    /// process without `CAP_SYS_ADMIN` or `CAP_SYS_RESOURCE` copies anyway:
    /// see [`lors_ibp::spliced::unlimited`].)
    pub copy_reads: bool,
    /// Permission bits of files that record none (exNodes written by
    /// `lors upload`, `augment`, `route`, or copied in): without it they
    /// show the `.xnd` file's own, owner-only, as it holds keys. Files
    /// created or `chmod`ed through a mount or libxio keep the mode they
    /// were given.
    pub file_mode: Option<u32>,
    /// The owner every file and the root show, instead of the exNode
    /// directory's: with [`Options::allow_other`], how a server running
    /// as another user (nginx's `www-data`) reads owner-only files.
    pub uid: Option<u32>,
    /// The group every file and the root show.
    pub gid: Option<u32>,
}

/// Mounts `dir` on `mountpoint` and serves it until unmounted (`umount`,
/// `fusermount3 -u`) or until SIGINT/SIGTERM, which unmount it. `ready` is
/// called once the mount is in place. Files still open are stored and
/// their exNodes written before this returns.
pub fn run(
    dir: &Path,
    mountpoint: &Path,
    opts: &Options,
    ready: impl FnOnce(&Path),
) -> io::Result<()> {
    let meta = std::fs::metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory of exNodes", dir.display()),
        ));
    }
    // Pieces kept in pipes cost two descriptors each.
    lors_ibp::raise_open_file_limit();
    let dev = Arc::new(OnceLock::new());
    let fs = Fs {
        dir: dir.to_path_buf(),
        open: opts.open.clone(),
        file_mode: opts.file_mode.map(|m| m & 0o7777),
        owner: (opts.uid, opts.gid),
        dev: dev.clone(),
        names: Mutex::new(Names::default()),
        handles: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(1),
    };
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(format!("lors:{}", dir.display())),
        MountOption::Subtype("lors".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if opts.allow_other {
        cfg.acl = SessionACL::All;
    }
    // Requests proceed together: the kernel's read-ahead for one file comes
    // as several at once, and a read-only file's reads do not wait for each
    // other (writable files serialize on their handle).
    cfg.n_threads = Some(4);
    // Pipes enough for the read-ahead only with privilege: an unprivileged
    // user's pipes are held to 64 MiB of slots, and past it a spliced
    // mount read slower than one that copies.
    let splice = !opts.copy_reads && lors_ibp::spliced::unlimited();
    if !opts.copy_reads && !splice {
        tracing::info!("READ replies copied: this process's pipe memory is limited");
    }
    if splice {
        // A spliced reply must fit one pipe, which without privilege holds
        // 1 MiB in 256 slots, and a received page may take two slots.
        cfg.mount_options.push(MountOption::CUSTOM(format!(
            "max_read={}",
            splice::MAX_READ
        )));
    }
    let session = fuser::Session::new(fs, mountpoint, &cfg)?;
    if splice {
        // The same open device (not a clone of the connection): replies
        // written to it reach the requests fuser's threads read from it.
        match session.as_fd().try_clone_to_owned() {
            Ok(fd) => {
                let _ = dev.set(fd);
            }
            Err(e) => tracing::debug!(error = %e, "READ replies copied: no device descriptor"),
        }
    }
    let session = session.spawn()?;
    if let Err(e) = raise_readahead(mountpoint, KERNEL_READAHEAD_KB) {
        tracing::debug!("kernel read-ahead left at its default: {e}");
    }
    ready(mountpoint);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let joiner = std::thread::spawn(move || {
        let r = session.join();
        let _ = tx.send(());
        r
    });
    let signalled = xio::runtime().block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = rx => Ok::<bool, io::Error>(false),
            _ = term.recv() => Ok(true),
            _ = int.recv() => Ok(true),
        }
    })?;
    if signalled {
        // Lazily: programs with files open keep them until they close.
        rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH).map_err(|e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("unmounting {}: {e}", mountpoint.display()),
            )
        })?;
    }
    joiner
        .join()
        .map_err(|_| io::Error::other("the FUSE session panicked"))?
}

/// How far ahead the kernel reads a file of the mount, in KiB. The kernel
/// gives a FUSE mount 128 KiB whatever the server asks at init: small
/// requests, so a reader of small blocks waits on each round trip through
/// the server (on the bench's loopback 4 KiB reads ran at 0.58 of a bulk
/// download; 1 MiB or 4 MiB of read-ahead did better, alike within the
/// noise). Kept at 1 MiB: 4 MiB gained nothing on loopback, and while a
/// read held the file until its bytes had crossed the link, a 15 Mbit/s
/// player on 20 Mbit/s links stalled in every run with it. Now that reads
/// wait only for their own bytes, 4 MiB and 1 MiB alike stall about one
/// run in three or fewer, as the feeds that bypass the kernel do.
pub const KERNEL_READAHEAD_KB: u32 = 1024;

/// Sets the kernel read-ahead of the file system mounted on `mountpoint`
/// (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`). Needs root; without it
/// the mount works with the kernel's default and this returns the error.
///
/// ```no_run
/// lors_fuse::raise_readahead(std::path::Path::new("/mnt/lors"), 4096)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn raise_readahead(mountpoint: &Path, kb: u32) -> io::Result<()> {
    let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(mountpoint)?);
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    std::fs::write(&knob, kb.to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("{knob}: {e}")))
}

#[derive(Default)]
struct Names {
    by_name: HashMap<OsString, u64>,
    by_ino: HashMap<u64, OsString>,
    next: u64,
}

impl Names {
    fn ino(&mut self, name: &OsStr) -> u64 {
        if let Some(&i) = self.by_name.get(name) {
            return i;
        }
        self.next = self.next.max(ROOT) + 1;
        self.by_name.insert(name.to_owned(), self.next);
        self.by_ino.insert(self.next, name.to_owned());
        self.next
    }
}

struct Handle {
    ino: u64,
    writable: bool,
    file: Mutex<xio::File>,
    /// A read-only handle's reads, which need not take `file`: the kernel
    /// sends a file's read-ahead requests on several threads at once, and
    /// one waiting on the network must not hold back those whose bytes are
    /// in.
    reads: Option<xio::Reads>,
}

struct Fs {
    dir: PathBuf,
    open: OpenOptions,
    /// [`Options::file_mode`].
    file_mode: Option<u32>,
    /// [`Options::uid`] and [`Options::gid`].
    owner: (Option<u32>, Option<u32>),
    /// The FUSE device, once mounted, for spliced READ replies
    /// ([`splice`]); never set with [`Options::copy_reads`].
    dev: Arc<OnceLock<OwnedFd>>,
    names: Mutex<Names>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno(e: &io::Error) -> Errno {
    tracing::debug!(error = %e, "lors mount");
    Errno::from_i32(xio::errno(e))
}

impl Fs {
    fn xnd(&self, name: &OsStr) -> PathBuf {
        let mut n = name.to_owned();
        n.push(SUFFIX);
        self.dir.join(n)
    }

    fn name(&self, ino: u64) -> io::Result<OsString> {
        lock(&self.names)
            .by_ino
            .get(&ino)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn handle(&self, fh: FileHandle) -> io::Result<Arc<Handle>> {
        lock(&self.handles)
            .get(&fh.0)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    fn target(&self, name: &OsStr) -> io::Result<String> {
        self.xnd(name)
            .to_str()
            .map(str::to_owned)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "file names must be UTF-8"))
    }

    /// The attributes of `ino`: an open writer's view if there is one (it
    /// knows what is still buffered), else the saved exNode's.
    fn attr(&self, ino: u64) -> io::Result<FileAttr> {
        if ino == ROOT {
            let m = std::fs::metadata(&self.dir)?;
            return Ok(FileAttr {
                ino: INodeNo(ROOT),
                size: 0,
                blocks: 0,
                atime: m.accessed().unwrap_or(SystemTime::UNIX_EPOCH),
                mtime: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                ctime: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                crtime: SystemTime::UNIX_EPOCH,
                kind: FileType::Directory,
                perm: (m.mode() & 0o7777) as u16,
                nlink: 2,
                uid: self.owner.0.unwrap_or(m.uid()),
                gid: self.owner.1.unwrap_or(m.gid()),
                rdev: 0,
                blksize: 4096,
                flags: 0,
            });
        }
        let name = self.name(ino)?;
        let m = match self.writer(ino) {
            Some(h) => lock(&h.file).metadata()?,
            None => xio::stat(&self.target(&name)?).inspect_err(|e| {
                // A malformed exNode: named, with why, where the user looks.
                if e.kind() == io::ErrorKind::InvalidData {
                    tracing::warn!(file = %self.xnd(&name).display(), error = %e, "unreadable exNode");
                }
            })?,
        };
        let fsm = std::fs::metadata(self.xnd(&name))?;
        let mut perm = match (m.mode_recorded, self.file_mode) {
            (false, Some(mode)) => mode,
            _ => m.permissions,
        };
        if m.readonly {
            perm &= !0o222;
        }
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: m.len,
            blocks: m.len.div_ceil(512),
            atime: m.accessed,
            mtime: m.modified,
            ctime: m.modified,
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

    /// The open writer of `ino`, if any. Every writing handle of a file
    /// shares it, so two writers never save exNodes that forget each
    /// other's blocks (and strand them on the depots).
    fn writer(&self, ino: u64) -> Option<Arc<Handle>> {
        (lock(&self.handles).values())
            .find(|h| h.ino == ino && h.writable)
            .cloned()
    }

    fn open_file(&self, ino: u64, flags: i32, create: bool) -> io::Result<(u64, Arc<Handle>)> {
        let name = self.name(ino)?;
        let acc = flags & libc::O_ACCMODE;
        let writable = acc != libc::O_RDONLY;
        let mut create = create;
        if create && !writable {
            // `O_CREAT|O_RDONLY` (`flock FILE`, `touch` by some shells):
            // the empty file is made, then opened for reading.
            let mut o = self.open.clone();
            o.write(true)
                .create(true)
                .create_new(flags & libc::O_EXCL != 0);
            o.open(&self.target(&name)?)?.close()?;
            create = false;
        }
        let trunc = writable && (flags & libc::O_TRUNC != 0 || create);
        let shared = if writable { self.writer(ino) } else { None };
        let h = match shared {
            Some(h) => {
                if trunc {
                    lock(&h.file).set_len(0)?;
                }
                h
            }
            None => {
                let mut o = self.open.clone();
                // A writer reads too: later handles share it, some may read.
                // A reader's read-ahead keeps what it fetches in pipes when
                // replies are spliced.
                o.spliced(!writable && self.dev.get().is_some())
                    .read(true)
                    .write(writable)
                    .append(flags & libc::O_APPEND != 0)
                    .truncate(trunc)
                    .create(create)
                    .create_new(create && flags & libc::O_EXCL != 0);
                let mut file = o.open(&self.target(&name)?)?;
                let reads = if writable { None } else { Some(file.reads()?) };
                Arc::new(Handle {
                    ino,
                    writable,
                    file: Mutex::new(file),
                    reads,
                })
            }
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, h.clone());
        Ok((fh, h))
    }

    /// Frees what the exNode `name` holds on depots and removes the
    /// `.xnd`, as `lors rm` does: an erasure-coded file's blocks, parity too,
    /// are freed as a plain one's; those another exNode also names (a
    /// copy) lose only this file's reference; a read-only copy frees
    /// nothing.
    fn remove(&self, name: &OsStr) -> io::Result<()> {
        self.open.remove(&self.target(name)?)
    }

    fn lookup_name(&self, parent: INodeNo, name: &OsStr) -> io::Result<FileAttr> {
        if parent.0 != ROOT {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        check_name(name)?;
        if !self.xnd(name).is_file() {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let ino = lock(&self.names).ino(name);
        self.attr(ino)
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
        let open: Vec<Arc<Handle>> = lock(&self.handles).drain().map(|(_, h)| h).collect();
        for h in open {
            if let Err(e) = lock(&h.file).sync_all() {
                tracing::warn!(error = %e, "storing an open file at unmount");
            }
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Space is the depots', not a disk's: no block counts. The name
        // limit is what the mount can really hold.
        reply.statfs(0, 0, 0, 0, 0, 512, NAME_MAX as u32, 0);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_name(parent, name) {
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
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        atime: Option<fuser::TimeOrNow>,
        mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The size changes the exNode; times and modes are recorded in it
        // (the `.xnd` file itself stays owner-only: it holds keys), so
        // `touch`, `chmod`, `tar` and `rsync -a` find them after a remount.
        let when = |t: fuser::TimeOrNow| match t {
            fuser::TimeOrNow::SpecificTime(t) => t,
            fuser::TimeOrNow::Now => SystemTime::now(),
        };
        let (mtime, atime) = (mtime.map(when), atime.map(when));
        let r = (|| {
            if ino.0 == ROOT {
                // The exNode directory's own times and mode.
                set_dir_attrs(&self.dir, mtime, atime, mode)?;
                return self.attr(ino.0);
            }
            if mtime.is_some() || atime.is_some() || mode.is_some() {
                match self.writer(ino.0) {
                    // Saved with the open file, after its data.
                    Some(h) => lock(&h.file).set_attributes(mtime, atime, mode),
                    None => {
                        let name = self.name(ino.0)?;
                        xio::set_attributes(&self.target(&name)?, mtime, atime, mode)?;
                    }
                }
            }
            if let Some(n) = size {
                let open = fh.and_then(|f| self.handle(f).ok()).filter(|h| h.writable);
                match open.or_else(|| self.writer(ino.0)) {
                    Some(h) => lock(&h.file).set_len(n)?,
                    None => {
                        let name = self.name(ino.0)?;
                        let mut o = self.open.clone();
                        o.write(true);
                        let mut f = o.open(&self.target(&name)?)?;
                        f.set_len(n)?;
                        f.close()?;
                    }
                }
            }
            self.attr(ino.0)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        match self.remove(name) {
            Ok(()) => {
                let mut n = lock(&self.names);
                if let Some(i) = n.by_name.remove(name) {
                    n.by_ino.remove(&i);
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        // One directory of exNodes: a tree would need a layout of its own.
        tracing::warn!(
            dir = %name.to_string_lossy(),
            "mkdir refused (ENOTSUP): a lors mount serves one flat directory of exNodes"
        );
        reply.error(Errno::from_i32(libc::ENOTSUP));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        if parent.0 != ROOT || newparent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        let r = (|| {
            check_name(newname)?;
            if self.xnd(newname).is_file() {
                // Replaced: its data goes, as rename(2) drops the old file.
                self.remove(newname)?;
            }
            std::fs::rename(self.xnd(name), self.xnd(newname))
        })();
        match r {
            Ok(()) => {
                let mut n = lock(&self.names);
                if let Some(i) = n.by_name.remove(newname) {
                    n.by_ino.remove(&i);
                }
                if let Some(i) = n.by_name.remove(name) {
                    n.by_name.insert(newname.to_owned(), i);
                    n.by_ino.insert(i, newname.to_owned());
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(ino.0, flags.0, false) {
            Ok((fh, _)) => reply.opened(FileHandle(fh), FopenFlags::empty()),
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
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        if name.as_bytes().contains(&b'/') {
            return reply.error(Errno::EINVAL);
        }
        if let Err(e) = check_name(name) {
            return reply.error(errno(&e));
        }
        let ino = lock(&self.names).ino(name);
        let r = self.open_file(ino, flags, true).and_then(|(fh, h)| {
            // The mode the program asked for (0644 from `cp`, 0664 under
            // umask 002), saved with the file; not the `.xnd`'s own.
            let mode = Some(mode & !umask & 0o7777);
            if h.writable {
                lock(&h.file).set_attributes(None, None, mode);
            } else {
                xio::set_attributes(&self.target(name)?, None, None, mode)?;
            }
            Ok((fh, self.attr(ino)?))
        });
        match r {
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
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(errno(&e)),
        };
        if let (Some(reads), Some(dev)) = (&h.reads, self.dev.get()) {
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
        let r = match &h.reads {
            Some(reads) => reads.read_with(offset, size as usize, answer),
            None => lock(&h.file).read_with(offset, size as usize, answer),
        };
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
        let r = self.handle(fh).and_then(|h| {
            let mut f = lock(&h.file);
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
        let r = self.handle(fh).and_then(|h| {
            let mut f = lock(&h.file);
            f.seek(SeekFrom::Start(offset))?;
            f.write_all(data)
        });
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Every close(2): store and save now, so close reports a failure.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        let r = self.handle(fh).and_then(|h| {
            if h.writable {
                lock(&h.file).sync_all()
            } else {
                Ok(())
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.handle(fh).and_then(|h| lock(&h.file).sync_all()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
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
        let h = lock(&self.handles).remove(&fh.0);
        if let Some(h) = h
            && let Err(e) = lock(&h.file).sync_all()
        {
            tracing::warn!(error = %e, "closing a file in the mount");
        }
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        let mut names: Vec<OsString> = listing
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                let n = e.file_name();
                let b = n.as_bytes();
                (b.len() > SUFFIX.len() && b.ends_with(SUFFIX.as_bytes()))
                    .then(|| OsStr::from_bytes(&b[..b.len() - SUFFIX.len()]).to_owned())
            })
            .collect();
        names.sort();
        let mut entries = vec![
            (ROOT, FileType::Directory, OsString::from(".")),
            (ROOT, FileType::Directory, OsString::from("..")),
        ];
        {
            let mut n = lock(&self.names);
            for name in names {
                let i = n.ino(&name);
                entries.push((i, FileType::RegularFile, name));
            }
        }
        for (k, (i, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(i), (k + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }
}

/// Sets a directory's times and mode, as `utimensat` and `chmod` would;
/// `None` keeps one.
fn set_dir_attrs(
    dir: &Path,
    mtime: Option<SystemTime>,
    atime: Option<SystemTime>,
    mode: Option<u32>,
) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(m) = mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(m & 0o7777))?;
    }
    let mut times = std::fs::FileTimes::new();
    if let Some(t) = mtime {
        times = times.set_modified(t);
    }
    if let Some(t) = atime {
        times = times.set_accessed(t);
    }
    if mtime.is_some() || atime.is_some() {
        std::fs::File::open(dir)?.set_times(times)?;
    }
    Ok(())
}

/// The uid of `user`: a number, or a name in `/etc/passwd` (users known
/// only to LDAP or another NSS source: give the number, `id -u USER`).
///
/// ```no_run
/// let www = lors_fuse::uid_of("www-data")?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn uid_of(user: &str) -> io::Result<u32> {
    lookup(user, "user", Path::new("/etc/passwd"))
}

/// The gid of `group`: a number, or a name in `/etc/group`.
pub fn gid_of(group: &str) -> io::Result<u32> {
    lookup(group, "group", Path::new("/etc/group"))
}

/// `name`'s number in a `name:password:number:…` file.
fn lookup(name: &str, what: &str, file: &Path) -> io::Result<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Ok(n);
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    (text.lines())
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&name))
        .and_then(|f| f.get(2)?.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no {what} named {name} in {} (give its number instead)",
                    file.display()
                ),
            )
        })
}
