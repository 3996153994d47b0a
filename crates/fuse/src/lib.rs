//! `lors mount`: a directory of exNodes as a directory of files (FUSE).
//!
//! Each `NAME.xnd` in the exNode directory appears as `NAME` in the mount,
//! with the file's logical size; reading it reads the blocks through
//! [`lors::xio`] (read-ahead for sequential readers, a cache for the
//! rest), so `cat`, `cp`, `dd`, `cmp`, `tar` or a media player read it
//! unchanged. Creating a file stores what is written on depots and writes
//! `NAME.xnd`; `rm` releases the allocations and removes the `.xnd`;
//! `mv` renames it. Subdirectories of the exNode directory are
//! directories of the mount (`mkdir`, `rmdir`, `mv` of a tree).
//!
//! Within one mount, files behave as on a local disk: every descriptor
//! on a file shares one open state (each sees the others' writes), and a
//! file renamed or unlinked while open stays whole for those holding it:
//! renamed, it saves under its new name; unlinked, its blocks are freed
//! when the last holder closes it.
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

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd as _;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{Config, Errno, MountOption, SessionACL};
use lors::xio::{self, OpenOptions};

mod fs;
mod open;
mod ops;
mod splice;
mod tree;

/// How long the kernel may keep an attribute or name without asking again.
const TTL: Duration = Duration::from_secs(1);
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
    open::free_left_unlinked(dir, &opts.open);
    let dev = Arc::new(OnceLock::new());
    let handles = Arc::new(Mutex::default());
    let fs = fs::Fs {
        dir: dir.to_path_buf(),
        open: opts.open.clone(),
        file_mode: opts.file_mode.map(|m| m & 0o7777),
        owner: (opts.uid, opts.gid),
        chown_created: opts.allow_other && rustix::process::geteuid().is_root(),
        dev: dev.clone(),
        nodes: Mutex::default(),
        inodes: Mutex::default(),
        handles: handles.clone(),
        listings: Mutex::default(),
        dir_times: Mutex::default(),
        closing: Mutex::default(),
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
        let open = lock(&handles).len();
        if open > 0 {
            // Else the process seems to ignore the signal.
            tracing::warn!(
                "{} is unmounted; {open} file(s) still open there are served until they close",
                mountpoint.display()
            );
        }
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

fn errno(e: &io::Error) -> Errno {
    tracing::debug!(error = %e, "lors mount");
    Errno::from_i32(xio::errno(e))
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
