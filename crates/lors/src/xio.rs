//! xio: an exNode as a file ordinary programs read and write ("IBP Deployment Tests and Integration with DiDaS Project" §6–§7).
//!
//! [`File`] implements [`Read`], [`Write`] and [`Seek`] over the blocks an
//! exNode names, on the same engine as `lors upload` and `lors download`:
//!
//! * **Writes** land in a buffer ([`DEFAULT_BUFFER`], 10 MiB as in "IBP Deployment Tests and Integration with DiDaS Project")
//!   that is stored, when full, by [`crate::upload`] — placement, copies
//!   and retries as the tool does them — while the next one fills: the
//!   exNode grows by a block per buffer, not by a mapping per `write` call
//!   ("IBP Deployment Tests and Integration with DiDaS Project" §7 saw ~400 bytes of exNode per call). Overwrites add new
//!   mappings that supersede the old ranges; an old allocation no mapping
//!   still uses is released once the exNode that no longer names it is
//!   saved, so a crash never leaves an exNode naming freed data.
//! * **Reads** go through a cache of the pieces the engine fetched, kept
//!   in the buffers they were read into. A read that continues where the
//!   last one ended starts a read-ahead: one [`crate::download`] of the
//!   rest of the file into a bounded pipe, so the scheduler keeps blocks in
//!   flight from the best replicas while the program reads 4 KiB at a time.
//!   A read elsewhere fetches just its 1 MiB.
//! * [`File::sync_all`] stores what is buffered and writes the `.xnd`
//!   atomically; dropping a `File` does the same (use [`File::close`] to
//!   see its error).
//!
//! The calls block: use them from plain threads (or `spawn_blocking`), not
//! from inside async code. Transfers run on a runtime of their own
//! ([`runtime`]).
//!
//! ```no_run
//! use std::io::{Read, Write};
//! let mut f = lors::xio::OpenOptions::new()
//!     .write(true)
//!     .create(true)
//!     .truncate(true)
//!     .depots(vec!["depot1.example.org:6714".into()])
//!     .open("lors:///frames.xnd?copies=2")?;
//! for frame in 0..100u32 {
//!     f.write_all(&frame.to_le_bytes())?; // tiny writes, one block stored
//! }
//! f.close()?;
//! let mut back = Vec::new();
//! lors::xio::File::open("frames.xnd")?.read_to_end(&mut back)?;
//! assert_eq!(back.len(), 400);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::{self, ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use lors_exnode::{ExNode, Mapping, Metadata as Meta};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::download::{
    Buffers, Data, DownloadOptions, Output, Piece, STREAM_PIECE, Stats, download,
};
use crate::settings::{Env, Layer, Settings};
use crate::upload::{UploadOptions, Uploaded, upload};
use crate::uri::ExnodeRef;
use crate::xnd::{self, XndError};
use crate::{Error, NoProgress, Pool};
use lors_ibp::spliced::Spliced;

/// Bytes a writer collects before storing them ("IBP Deployment Tests and Integration with DiDaS Project" §7: 10 MB).
pub const DEFAULT_BUFFER: usize = 10 << 20;
/// Bytes of file data a reader keeps cached.
pub const DEFAULT_CACHE: u64 = 64 << 20;
/// Bytes a sequential reader's read-ahead may hold beyond what the
/// download's own window holds.
pub const DEFAULT_READAHEAD: usize = 32 << 20;
/// What a read away from the read-ahead fetches, from the start of its
/// aligned stretch.
const FETCH: u64 = 1 << 20;
/// The most a sequential read-ahead plans at once (64K pieces of 256 KiB); a reader
/// that reaches its end starts the next. The rest of a file whose exNode
/// claims terabytes is not planned for a read of its first megabyte.
const STREAM_SPAN: u64 = 16 << 30;
/// Buffers being stored at once by one writer: memory is at most this many
/// buffers plus the one filling.
const MAX_INFLIGHT: usize = 4;
const EBADF: i32 = libc::EBADF;

/// The runtime xio's transfers run on, started on first use.
pub fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("lors-xio")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the xio runtime: {e}"))
    })
}

/// How to open a [`File`], as [`std::fs::OpenOptions`] (and `open(2)`'s
/// `O_RDONLY`, `O_WRONLY`, `O_RDWR`, `O_CREAT`, `O_TRUNC`, `O_APPEND`,
/// `O_EXCL`).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    create: bool,
    create_new: bool,
    truncate: bool,
    buffer: usize,
    cache: u64,
    readahead: usize,
    spliced: bool,
    settings: Option<Settings>,
    depots: Vec<String>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// Nothing set: say at least `read`, `write` or `append`.
    pub fn new() -> Self {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            create: false,
            create_new: false,
            truncate: false,
            buffer: DEFAULT_BUFFER,
            cache: DEFAULT_CACHE,
            readahead: DEFAULT_READAHEAD,
            spliced: false,
            settings: None,
            depots: Vec::new(),
        }
    }
    /// Open for reading.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    /// Open for writing.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    /// Every write goes to the end (`O_APPEND`).
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }
    /// Create the exNode if it does not exist (`O_CREAT`).
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    /// Create the exNode, failing if it exists (`O_CREAT|O_EXCL`).
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Empty an existing file (`O_TRUNC`): its allocations are released
    /// once the empty exNode is saved.
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    /// Write buffer size: the most a write turns into one store (and so
    /// the data in each new set of blocks). At least 64 KiB.
    pub fn buffer(&mut self, bytes: usize) -> &mut Self {
        self.buffer = bytes.max(64 << 10);
        self
    }
    /// Read cache size in bytes (at least 4 MiB are kept).
    pub fn cache(&mut self, bytes: u64) -> &mut Self {
        self.cache = bytes;
        self
    }
    /// How far a sequential reader's read-ahead may run past the program.
    pub fn readahead(&mut self, bytes: usize) -> &mut Self {
        self.readahead = bytes.max(FETCH as usize);
        self
    }

    /// Keep what the read-ahead fetches in kernel pipes rather than in
    /// memory ([`lors_ibp::spliced`]), for a server that hands the bytes on
    /// to the kernel: [`Reads::splice_to`] then moves them without a copy
    /// through user space. Plain reads copy them out of the pipes. Off by
    /// default; costs two descriptors per cached piece.
    pub fn spliced(&mut self, on: bool) -> &mut Self {
        self.spliced = on;
        self
    }

    /// Settings to use, instead of resolving them from the `lors://` URI,
    /// the environment and `~/.xndrc` as the tools do.
    pub fn settings(&mut self, s: Settings) -> &mut Self {
        self.settings = Some(s);
        self
    }
    /// Depots (`host:port`) new blocks go to, instead of asking the
    /// L-Bone or `~/.xndrc` (as `--depot` does for the tools).
    pub fn depots(&mut self, depots: Vec<String>) -> &mut Self {
        self.depots = depots;
        self
    }

    /// Opens `target`: a path of an `.xnd` file or a `lors://` URI.
    pub fn open(&self, target: &str) -> io::Result<File> {
        let r = ExnodeRef::parse(target).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
        self.open_ref(&r)
    }

    /// Opens the exNode `r` names.
    pub fn open_ref(&self, r: &ExnodeRef) -> io::Result<File> {
        let writable = self.write || self.append;
        if !self.read && !writable {
            return Err(invalid("open for reading, writing or both"));
        }
        if (self.create || self.create_new || self.truncate) && !writable {
            return Err(invalid("creating or truncating needs write access"));
        }
        let settings = match &self.settings {
            Some(s) => s.clone(),
            None => {
                let rc = crate::xndrc::load(None).map_err(invalid)?;
                Settings::resolve(Layer::default(), Some(r), &Env::process(), rc)
                    .map_err(|e| invalid(e.to_string()))?
            }
        };
        let path = r.path.clone();
        let loaded = match xnd::load(&path) {
            Ok(x) => Some(x),
            Err(XndError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(xnd_error(e)),
        };
        let created = loaded.is_none();
        let disk = stamp(&path);
        let mut x = match loaded {
            Some(_) if self.create_new => {
                return Err(io::Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{} already exists", path.display()),
                ));
            }
            Some(x) => x,
            None if writable && (self.create || self.create_new) => new_exnode(&path),
            None => {
                return Err(io::Error::new(
                    ErrorKind::NotFound,
                    format!("{}: no such exNode", path.display()),
                ));
            }
        };
        if writable {
            if let Some(m) = x.mappings.iter().find(|m| m.write.is_none()) {
                return Err(io::Error::new(
                    ErrorKind::ReadOnlyFilesystem,
                    format!(
                        "{}: read-only exNode (the mapping at byte {} has no write capability)",
                        path.display(),
                        m.exnode_offset
                    ),
                ));
            }
            if !created {
                // Permission problems now, not at the first save.
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            }
        }
        // Writes keep the file's redundancy: its recorded policy, else what
        // its blocks have; a new file takes the settings' and records it.
        let copies = (crate::manage::copies_policy(&x))
            .or(settings.copies)
            .unwrap_or(1);
        if writable && crate::manage::copies_policy(&x).is_none() {
            let n = i64::try_from(copies).unwrap_or(i64::MAX);
            x.set_meta(lors_exnode::Metadata::integer(
                crate::manage::COPIES_META,
                n,
            ));
        }
        let truncated = writable && self.truncate && !x.mappings.is_empty();
        let to_release = if truncated {
            std::mem::take(&mut x.mappings)
        } else {
            Vec::new()
        };
        let pool = Arc::new(Pool::new(settings.client()));
        let size = x.logical_size();
        let mut f = File {
            path,
            x,
            size,
            pos: 0,
            readable: self.read,
            writable,
            append: self.append,
            settings,
            copies,
            times_set: false,
            pool,
            depots: (!self.depots.is_empty()).then(|| self.depots.clone()),
            dirty: created || truncated,
            modified: (created || truncated).then(SystemTime::now),
            buf: Vec::new(),
            buf_off: 0,
            buf_cap: self.buffer,
            inflight: VecDeque::new(),
            broken: None,
            unsaved: Vec::new(),
            to_release,
            reader: Shared::new(self.cache, self.readahead, self.spliced),
            last_resort: None,
            lbone: None,
            closed: false,
            disk,
        };
        if f.dirty {
            // open(2) with O_CREAT or O_TRUNC changes the file at once.
            f.sync_all()?;
        }
        Ok(f)
    }
}

/// An exNode opened as a file. See the [module docs](self).
pub struct File {
    path: PathBuf,
    x: ExNode,
    /// Times were set explicitly ([`File::set_attributes`]) after the last
    /// write: they, not the write's time, are saved.
    times_set: bool,
    /// Replicas every block written gets: the file's policy
    /// ([`crate::manage::copies_policy`]). A write that cannot have them
    /// fails rather than store fewer.
    copies: usize,
    /// Logical size, with what is buffered or being stored.
    size: u64,
    pos: u64,
    readable: bool,
    writable: bool,
    append: bool,
    settings: Settings,
    pool: Arc<Pool>,
    /// Where new blocks go; found on the first store when not given.
    depots: Option<Vec<String>>,
    /// `x` differs from the saved exNode.
    dirty: bool,
    modified: Option<SystemTime>,
    buf: Vec<u8>,
    buf_off: u64,
    buf_cap: usize,
    /// Buffers being stored, oldest first: merged in this order, so a
    /// later write over the same bytes wins.
    inflight: VecDeque<Flush>,
    /// A store failed: the data written since the last save is not all on
    /// depots. Reported by every later write and by sync/close.
    broken: Option<String>,
    /// Mappings stored since the last save: released if the file cannot be
    /// saved whole, so nothing stays on depots that no exNode names.
    unsaved: Vec<Mapping>,
    /// Allocations no mapping uses any more: released after the next save.
    to_release: Vec<Mapping>,
    reader: Arc<Shared>,
    last_resort: Option<HashSet<String>>,
    /// The settings' L-Bone, once resolved (`Some(None)`: none named).
    lbone: Option<Option<lors_lbone::client::Directory>>,
    /// `close` ran: nothing left for the drop to do.
    closed: bool,
    /// The `.xnd` as this handle last read or wrote it: another writer's
    /// save in between is a conflict, not something to overwrite.
    disk: Option<Stamp>,
}

/// What tells one version of an `.xnd` file from another: saves replace
/// the file (a new inode) atomically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        ino: m.ino(),
        len: m.len(),
        modified: m.modified().ok(),
    })
}

struct Flush {
    off: u64,
    len: u64,
    task: JoinHandle<crate::Result<Uploaded>>,
}

/// What [`File::metadata`] and [`stat`] report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// Logical size in bytes.
    pub len: u64,
    /// Last data change: the last write through this handle, else the
    /// `.xnd` file's modification time.
    pub modified: SystemTime,
    /// The `.xnd` file's access time.
    pub accessed: SystemTime,
    /// Permission bits (`st_mode & 0o7777`): the `.xnd` file's, without the
    /// write bits when the exNode holds no write capability.
    pub permissions: u32,
    /// No write capability: opening for writing fails with `EROFS`.
    pub readonly: bool,
}

/// The metadata of the exNode at `target` (a path or `lors://` URI),
/// without opening it for transfers.
pub fn stat(target: &str) -> io::Result<Metadata> {
    let r = ExnodeRef::parse(target).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
    let x = xnd::load(&r.path).map_err(xnd_error)?;
    metadata_of(&r.path, &x, x.logical_size(), None)
}

/// exNode metadata for what a file system keeps beside the data: the
/// modification and access times (nanoseconds since the epoch) and the
/// permission bits a program set (`touch`, `chmod`, `tar`, `rsync -a`).
/// The `.xnd` file itself stays owner-only: it holds keys.
const MTIME_META: &str = "lors_mtime_ns";
const ATIME_META: &str = "lors_atime_ns";
const MODE_META: &str = "lors_mode";

fn meta_int(x: &ExNode, name: &str) -> Option<i64> {
    match x.meta(name) {
        Some(lors_exnode::Value::Integer(n)) => Some(*n),
        _ => None,
    }
}

fn time_of(ns: i64) -> Option<SystemTime> {
    let ns = u64::try_from(ns).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_nanos(ns))
}

fn ns_of(t: SystemTime) -> i64 {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Records in `x` the times and permission bits given (`None` keeps what
/// is there).
fn set_attrs(
    x: &mut ExNode,
    modified: Option<SystemTime>,
    accessed: Option<SystemTime>,
    mode: Option<u32>,
) {
    use lors_exnode::Metadata as M;
    if let Some(t) = modified {
        x.set_meta(M::integer(MTIME_META, ns_of(t)));
    }
    if let Some(t) = accessed {
        x.set_meta(M::integer(ATIME_META, ns_of(t)));
    }
    if let Some(m) = mode {
        x.set_meta(M::integer(MODE_META, i64::from(m & 0o7777)));
    }
}

fn metadata_of(
    path: &Path,
    x: &ExNode,
    len: u64,
    modified: Option<SystemTime>,
) -> io::Result<Metadata> {
    use std::os::unix::fs::PermissionsExt as _;
    let fs = std::fs::metadata(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let readonly = x.mappings.iter().any(|m| m.write.is_none());
    let recorded = |name| meta_int(x, name).and_then(time_of);
    let mut permissions = (meta_int(x, MODE_META))
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(fs.permissions().mode())
        & 0o7777;
    if readonly {
        permissions &= !0o222;
    }
    Ok(Metadata {
        len,
        modified: modified
            .or(recorded(MTIME_META))
            .or(fs.modified().ok())
            .unwrap_or(SystemTime::UNIX_EPOCH),
        accessed: (recorded(ATIME_META))
            .or(fs.accessed().ok())
            .unwrap_or(SystemTime::UNIX_EPOCH),
        permissions,
        readonly,
    })
}

/// Sets the modification and access times and permission bits of the
/// exNode at `target` (`None` keeps one), as `utimensat` and `chmod` do
/// for a file: kept in the exNode, so they survive a remount.
pub fn set_attributes(
    target: &str,
    modified: Option<SystemTime>,
    accessed: Option<SystemTime>,
    mode: Option<u32>,
) -> io::Result<()> {
    let r = ExnodeRef::parse(target).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
    let mut x = xnd::load(&r.path).map_err(xnd_error)?;
    set_attrs(&mut x, modified, accessed, mode);
    xnd::save(&r.path, &x).map_err(xnd_error)
}

impl File {
    /// Opens an exNode (path or `lors://` URI) for reading.
    pub fn open(target: &str) -> io::Result<File> {
        OpenOptions::new().read(true).open(target)
    }

    /// Creates (or empties) an exNode for writing.
    pub fn create(target: &str) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(target)
    }

    /// The `.xnd` file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The exNode as it stands (what is still buffered is not in it).
    pub fn exnode(&self) -> &ExNode {
        &self.x
    }

    /// Size, times and permissions.
    pub fn metadata(&self) -> io::Result<Metadata> {
        metadata_of(&self.path, &self.x, self.size, self.modified)
    }

    /// [`set_attributes`] through this open file: saved with its next
    /// [`File::sync_all`] (or close), after the data written so far, so a
    /// time set after writing (`rsync -a`, `tar -x`) is the one kept.
    pub fn set_attributes(
        &mut self,
        modified: Option<SystemTime>,
        accessed: Option<SystemTime>,
        mode: Option<u32>,
    ) {
        set_attrs(&mut self.x, modified, accessed, mode);
        if modified.is_some() {
            self.modified = modified;
            self.times_set = true;
        }
        self.dirty = true;
    }

    /// Stores everything written and writes the exNode (atomically: the
    /// old `.xnd` or the new one, never a mix), then releases allocations
    /// nothing names any more.
    pub fn sync_all(&mut self) -> io::Result<()> {
        self.drain()?;
        if self.dirty {
            if stamp(&self.path) != self.disk {
                return Err(self.conflict());
            }
            // The data's modification time goes with it, unless a program
            // set one after writing.
            if let (Some(t), false) = (self.modified, self.times_set) {
                set_attrs(&mut self.x, Some(t), None, None);
            }
            xnd::save(&self.path, &self.x).map_err(xnd_error)?;
            self.disk = stamp(&self.path);
            self.dirty = false;
            self.unsaved.clear();
        }
        let old = std::mem::take(&mut self.to_release);
        if !old.is_empty() {
            let pool = self.pool.clone();
            let kept = runtime().block_on(pool.release_all(old));
            if !kept.is_empty() {
                tracing::warn!(
                    count = kept.len(),
                    "superseded allocations could not be released; they expire with their lease"
                );
            }
        }
        Ok(())
    }

    /// Another writer saved the `.xnd` since this handle read or wrote it:
    /// keep theirs, save ours beside it (so no block of ours is left on the
    /// depots unnamed) and carry on there; release nothing (their exNode may
    /// still name what ours superseded).
    fn conflict(&mut self) -> io::Error {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".conflict-{}.xnd", std::process::id()));
        let other = PathBuf::from(name);
        self.to_release.clear();
        match xnd::save(&other, &self.x) {
            Ok(()) => {
                let why = format!(
                    "{} was changed by another writer while open here; this handle's version is saved as {}",
                    self.path.display(),
                    other.display()
                );
                self.path = other;
                self.disk = stamp(&self.path);
                self.dirty = false;
                self.unsaved.clear();
                io::Error::other(why)
            }
            Err(e) => io::Error::other(format!(
                "{} was changed by another writer while open here, and this handle's version could not be saved beside it: {e}",
                self.path.display()
            )),
        }
    }

    /// [`File::sync_all`], then closes, reporting what a drop would only log.
    pub fn close(mut self) -> io::Result<()> {
        let r = self.finish();
        self.closed = true;
        r
    }

    /// Saves if anything changed; if a store failed, releases what was
    /// stored since the last save (the saved exNode stays as it was).
    fn finish(&mut self) -> io::Result<()> {
        if !self.writable || self.closed {
            return Ok(());
        }
        match self.sync_all() {
            Ok(()) => Ok(()),
            Err(e) => {
                let mut orphans = std::mem::take(&mut self.unsaved);
                // Stores still running finish before we free what they made.
                while let Some(f) = self.inflight.pop_front() {
                    if let Ok(Ok(up)) = runtime().block_on(f.task) {
                        orphans.extend(up.exnode.mappings);
                    }
                }
                if !orphans.is_empty() {
                    let pool = self.pool.clone();
                    runtime().block_on(pool.release_all(orphans));
                }
                Err(e)
            }
        }
    }

    /// Changes the logical size (`ftruncate(2)`): shrinking drops mappings
    /// past the end (an encoded block cut in two is stored again up to the
    /// new end); growing appends zeros. The position does not move.
    pub fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.check_writable()?;
        self.drain()?;
        if len > self.size {
            return self.put_zeros(self.size, len - self.size);
        }
        if len == self.size {
            return Ok(());
        }
        // Encoded mappings cannot be cut: keep the bytes below `len` of each
        // one cut through, to store again.
        let mut heads: Vec<(u64, u64)> = (self.x.mappings.iter())
            .filter(|m| m.function.is_some() && m.exnode_offset < len && m.logical_end() > len)
            .map(|m| (m.exnode_offset, len))
            .collect();
        heads.sort();
        heads.dedup();
        let mut saved = Vec::new();
        for &(a, b) in &heads {
            let mut v = vec![0u8; (b - a) as usize];
            self.read_exact_at(a, &mut v)?;
            saved.push((a, v));
        }
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for m in std::mem::take(&mut self.x.mappings) {
            if m.logical_end() <= len {
                kept.push(m);
            } else if m.exnode_offset < len && m.function.is_none() {
                let mut m = m;
                m.logical_length = len - m.exnode_offset;
                kept.push(m);
            } else {
                dropped.push(m);
            }
        }
        self.x.mappings = kept;
        self.retire(dropped);
        self.size = len;
        self.touch();
        for (a, v) in saved {
            self.put(a, &v)?;
        }
        self.drain()
    }

    fn touch(&mut self) {
        self.dirty = true;
        self.modified = Some(SystemTime::now());
        self.times_set = false;
        self.reader.lock().invalidate();
        // Readers waiting for a stream that is gone look again.
        self.reader.arrived.notify_all();
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(EBADF))
        }
    }

    /// Old mappings out of the exNode: their allocations go once the exNode
    /// is saved, unless a remaining mapping still reads them.
    fn retire(&mut self, dropped: Vec<Mapping>) {
        for d in dropped {
            let used = (self.x.mappings.iter()).any(|k| k.read.is_some() && k.read == d.read);
            if !used {
                self.to_release.push(d);
            }
        }
    }

    /// The L-Bone of the settings, resolved once for both the depots new
    /// blocks go to and the read-ahead's last-resort list.
    fn directory(&mut self) -> Option<lors_lbone::client::Directory> {
        let s = &self.settings;
        self.lbone
            .get_or_insert_with(|| runtime().block_on(s.directory()))
            .clone()
    }

    /// Where new blocks go: given, else found as the tools find them.
    fn depots(&mut self) -> io::Result<Vec<String>> {
        if let Some(d) = &self.depots {
            return Ok(d.clone());
        }
        let named = self.directory();
        let s = &self.settings;
        let copies = self.copies;
        let bytes = s.block_size.unwrap_or(DEFAULT_BUFFER as u64);
        let found = runtime()
            .block_on(s.find_depots(&[], named, copies, bytes, Vec::new()))
            .map_err(|e| {
                let e = io::Error::new(
                    ErrorKind::StorageFull,
                    format!("no depots for the {copies} copies of each block this file keeps: {e}"),
                );
                tracing::error!(file = %self.path.display(), "write refused: {e}");
                e
            })?;
        self.depots = Some(found.depots.clone());
        Ok(found.depots)
    }

    /// Starts storing the buffer.
    fn submit(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut data = std::mem::take(&mut self.buf);
        let mut off = self.buf_off;
        self.widen(&mut off, &mut data)?;
        while self.inflight.len() >= MAX_INFLIGHT {
            self.reap()?;
        }
        let depots = self.depots()?;
        let s = &self.settings;
        let opts = UploadOptions {
            depots,
            block_size: self.settings.block_size.unwrap_or(DEFAULT_BUFFER as u64),
            copies: self.copies,
            threads: self.settings.threads.unwrap_or(8),
            duration: s.duration,
            reliability: s.reliability,
            filename: String::new(),
            e2e: None,
        };
        let pool = self.pool.clone();
        let len = data.len() as u64;
        let task = runtime().spawn(async move {
            let r = upload(&data[..], Some(len), &opts, pool, Arc::new(NoProgress)).await;
            drop(data);
            r
        });
        self.inflight.push_back(Flush { off, len, task });
        self.buf = Vec::with_capacity(self.buf_cap);
        Ok(())
    }

    /// Grows `[off, off+len)` over every encoded mapping it cuts through
    /// (a write re-encodes and stores each of those whole), reading the
    /// bytes it adds.
    fn widen(&mut self, off: &mut u64, data: &mut Vec<u8>) -> io::Result<()> {
        loop {
            let end = *off + data.len() as u64;
            let cut = (self.x.mappings.iter())
                .filter(|m| m.function.is_some())
                .filter(|m| m.exnode_offset < end && m.logical_end() > *off)
                .find(|m| m.exnode_offset < *off || m.logical_end() > end)
                .map(|m| (m.exnode_offset, m.logical_end()));
            let Some((a, b)) = cut else { return Ok(()) };
            // Earlier stores may hold those bytes: they must be in `x` first.
            self.reap_all()?;
            if a < *off {
                let mut head = vec![0u8; (*off - a) as usize];
                self.read_exact_at(a, &mut head)?;
                head.append(data);
                *data = head;
                *off = a;
            }
            let end = *off + data.len() as u64;
            if b > end {
                let mut tail = vec![0u8; (b - end) as usize];
                self.read_exact_at(end, &mut tail)?;
                data.extend_from_slice(&tail);
            }
        }
    }

    /// Waits for the oldest store and puts its mappings in the exNode.
    fn reap(&mut self) -> io::Result<()> {
        let Some(f) = self.inflight.pop_front() else {
            return Ok(());
        };
        let done = runtime()
            .block_on(f.task)
            .map_err(|e| io::Error::other(format!("storing: {e}")))
            .and_then(|r| r.map_err(lors_error));
        match done {
            Ok(up) => {
                if !up.unreleased.mappings.is_empty() {
                    tracing::warn!(
                        count = up.unreleased.mappings.len(),
                        "allocations of failed attempts could not be released; they expire with their lease"
                    );
                }
                let mut new = up.exnode.mappings;
                for m in &mut new {
                    m.exnode_offset += f.off;
                }
                self.unsaved.extend(new.iter().cloned());
                self.merge(f.off, f.len, new);
                Ok(())
            }
            Err(e) => {
                // Never fewer copies than the file keeps: the write fails,
                // and says why where a mount's user looks.
                tracing::error!(
                    file = %self.path.display(),
                    copies = self.copies,
                    "write failed: {e}"
                );
                self.broken.get_or_insert_with(|| e.to_string());
                Err(e)
            }
        }
    }

    fn reap_all(&mut self) -> io::Result<()> {
        let mut first = None;
        while !self.inflight.is_empty() {
            if let Err(e) = self.reap() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Stores the buffer and waits for every store.
    fn drain(&mut self) -> io::Result<()> {
        self.check_broken()?;
        self.submit()?;
        self.reap_all()?;
        self.check_broken()
    }

    fn check_broken(&self) -> io::Result<()> {
        match &self.broken {
            Some(why) => Err(io::Error::other(format!(
                "{}: data written since the last sync could not be stored ({why}); the saved exNode is unchanged",
                self.path.display()
            ))),
            None => Ok(()),
        }
    }

    /// New mappings for `[off, off+len)` supersede what was there.
    fn merge(&mut self, off: u64, len: u64, new: Vec<Mapping>) {
        let end = off + len;
        let mut kept = Vec::with_capacity(self.x.mappings.len() + new.len());
        let mut dropped = Vec::new();
        for m in std::mem::take(&mut self.x.mappings) {
            let (ms, me) = (m.exnode_offset, m.logical_end());
            if me <= off || ms >= end {
                kept.push(m);
            } else if ms >= off && me <= end {
                dropped.push(m);
            } else {
                // A raw mapping (`widen` left no encoded one cut): keep
                // the parts outside, over the same allocation.
                if ms < off {
                    let mut l = m.clone();
                    l.logical_length = off - ms;
                    kept.push(l);
                }
                if me > end {
                    let mut r = m;
                    r.alloc_offset += end - ms;
                    r.exnode_offset = end;
                    r.logical_length = me - end;
                    kept.push(r);
                }
            }
        }
        kept.extend(new);
        kept.sort_by_key(|m| m.exnode_offset);
        self.x.mappings = kept;
        self.retire(dropped);
        self.touch();
    }

    /// Fills `out` from `off` (which must be below the size).
    fn read_exact_at(&mut self, off: u64, out: &mut [u8]) -> io::Result<()> {
        let n = self.read_at(off, out)?;
        if n < out.len() {
            return Err(io::Error::new(
                ErrorKind::UnexpectedEof,
                "the exNode ends early",
            ));
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` (fewer only at the end of the
    /// file) and hands them to `f`: in place, without a copy, when they lie
    /// in one piece of the cache (a FUSE reply goes out from there). The
    /// position does not move.
    pub fn read_with<R>(
        &mut self,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        if !self.readable {
            return Err(io::Error::from_raw_os_error(EBADF));
        }
        let n = clip(self.size, offset, len);
        self.ready(offset, n)?;
        self.reader.read_with(offset, n, f)
    }

    /// For a file opened read-only: its reads, for many threads at once.
    /// See [`Reads`].
    pub fn reads(&mut self) -> io::Result<Reads> {
        if !self.readable || self.writable {
            return Err(invalid("shared reads are for a file opened read-only"));
        }
        self.prepare();
        Ok(Reads {
            shared: self.reader.clone(),
            size: self.size,
        })
    }

    /// Reads up to `out.len()` bytes at `off`: all of them unless the file
    /// ends first. (Also for a writer's own use: no access check.)
    fn read_at(&mut self, off: u64, out: &mut [u8]) -> io::Result<usize> {
        let n = clip(self.size, off, out.len());
        if n == 0 {
            return Ok(0);
        }
        self.ready(off, n)?;
        self.reader.read_into(off, &mut out[..n])?;
        Ok(n)
    }

    /// Makes the `n` bytes at `off` readable from the depots: stores them
    /// first if they are still buffered or being stored, and gives the
    /// reader the exNode as it is now.
    fn ready(&mut self, off: u64, n: usize) -> io::Result<()> {
        if self.pending_overlaps(off, off + n as u64) {
            self.drain()?;
        }
        self.prepare();
        Ok(())
    }

    /// Buffered or being-stored bytes in `[a, b)`.
    fn pending_overlaps(&self, a: u64, b: u64) -> bool {
        let hit = |o: u64, l: u64| o < b && o + l > a;
        (!self.buf.is_empty() && hit(self.buf_off, self.buf.len() as u64))
            || self.inflight.iter().any(|f| hit(f.off, f.len))
    }

    /// Tells the reader what to fetch from, once the exNode changed (or
    /// before the first read).
    fn prepare(&mut self) {
        if self.reader.lock().source.is_some() {
            return;
        }
        let last_resort = match &self.last_resort {
            Some(lr) => lr.clone(),
            None => {
                let dir = self.directory();
                let lr = runtime().block_on(crate::directory::last_resort(dir.as_ref(), &self.x));
                self.last_resort.insert(lr).clone()
            }
        };
        self.reader.lock().source = Some(Arc::new(Source {
            x: self.x.clone(),
            pool: self.pool.clone(),
            last_resort,
        }));
    }

    /// Writes at the position (at the end with `append`).
    fn write_here(&mut self, data: &[u8]) -> io::Result<usize> {
        self.check_writable()?;
        self.check_broken()?;
        if self.append {
            self.pos = self.size;
        }
        self.put(self.pos, data)?;
        self.pos += data.len() as u64;
        Ok(data.len())
    }

    /// Buffers `data` for `off`: a buffer that is full, or that `off` does
    /// not continue, is stored first. A hole before `off` is stored as the
    /// zeros POSIX reads there.
    fn put(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        if off > self.size {
            self.put_zeros(self.size, off - self.size)?;
        }
        if !self.buf.is_empty() && off != self.buf_off + self.buf.len() as u64 {
            self.submit()?;
        }
        if self.buf.is_empty() {
            self.buf_off = off;
        }
        let mut rest = data;
        while !rest.is_empty() {
            let k = (self.buf_cap - self.buf.len()).min(rest.len());
            self.buf.extend_from_slice(&rest[..k]);
            rest = &rest[k..];
            if self.buf.len() >= self.buf_cap {
                let next = self.buf_off + self.buf.len() as u64;
                self.submit()?;
                self.buf_off = next;
            }
        }
        self.size = self.size.max(off + data.len() as u64);
        self.dirty = true;
        self.modified = Some(SystemTime::now());
        self.times_set = false;
        Ok(())
    }

    fn put_zeros(&mut self, mut off: u64, mut n: u64) -> io::Result<()> {
        let z = vec![0u8; FETCH as usize];
        while n > 0 {
            let k = n.min(FETCH);
            self.put(off, &z[..k as usize])?;
            off += k;
            n -= k;
        }
        Ok(())
    }
}

/// Reads fill `buf` unless the file ends first, as `read(2)` on a local
/// regular file does (a short count means end of file).
impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.readable {
            return Err(io::Error::from_raw_os_error(EBADF));
        }
        let n = self.read_at(self.pos, buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_here(buf)
    }

    /// Stores what is buffered on the depots (the exNode is written by
    /// [`File::sync_all`] and on close).
    fn flush(&mut self) -> io::Result<()> {
        if self.writable { self.drain() } else { Ok(()) }
    }
}

impl Seek for File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(n) => {
                self.pos = n;
                return Ok(n);
            }
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        let n = base.ok_or_else(|| invalid("seek to a negative or overflowing position"))?;
        self.pos = n;
        Ok(n)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!(file = %self.path.display(), error = %e, "closing an xio file");
        }
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

/// The reads of a file opened read-only, for many threads at once (the
/// FUSE mount's threads read a file so): each waits only for its own
/// bytes, so a read waiting on the network holds back none whose bytes are
/// cached or arrive sooner. From [`File::reads`]; clones share the cache
/// and the read-ahead.
///
/// ```no_run
/// let mut f = lors::xio::File::open("video.xnd")?;
/// let reads = f.reads()?;
/// let other = reads.clone();
/// let t = std::thread::spawn(move || other.read_with(1 << 20, 4096, |b| b.len()));
/// assert_eq!(reads.read_with(0, 4096, |b| b.to_vec())?.len(), 4096);
/// t.join().unwrap()?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone)]
pub struct Reads {
    shared: Arc<Shared>,
    size: u64,
}

impl Reads {
    /// As [`File::read_with`]: up to `len` bytes at `offset` (fewer only at
    /// the end of the file), handed to `f` in place when they lie in one
    /// piece of the cache.
    pub fn read_with<R>(
        &self,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        self.shared
            .read_with(offset, clip(self.size, offset, len), f)
    }

    /// Appends up to `len` bytes at `offset` (fewer only at the end of the
    /// file) to the pipe `to` (its write end, with room for them) and says
    /// how many. Bytes the read-ahead keeps in pipes
    /// ([`OpenOptions::spliced`]) go by reference, others are copied.
    ///
    /// # Errors
    /// As a read, or `WouldBlock` when `to` has no room; `to` may then hold
    /// some of the bytes.
    pub fn splice_to(&self, offset: u64, len: usize, to: BorrowedFd<'_>) -> io::Result<usize> {
        let n = clip(self.size, offset, len);
        self.shared.splice_to(offset, n, to)?;
        Ok(n)
    }

    /// The file's size.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// What the read-ahead fetches from: the exNode as the file last had it.
struct Source {
    x: ExNode,
    pool: Arc<Pool>,
    last_resort: HashSet<String>,
}

/// The read cache and the read-ahead of an open file, for the threads
/// reading it. Nobody holds the lock while waiting on the network: the
/// thread that needs the read-ahead's next piece takes its receiver out,
/// waits, puts the piece in the cache and gives the receiver back; others
/// needing bytes the read-ahead is bringing wait for `arrived`, others
/// still read what is cached.
struct Shared {
    state: Mutex<Reader>,
    /// A piece came in, or a stream failed or changed hands.
    arrived: Condvar,
}

impl Shared {
    fn new(cache: u64, readahead: usize, spliced: bool) -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(Reader::new(cache, readahead, spliced)),
            arrived: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Reader> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands the `n` bytes at `off` (all within the file) to `f`: in place
    /// when they lie in one piece.
    fn read_with<R>(&self, off: u64, n: usize, f: impl FnOnce(&[u8]) -> R) -> io::Result<R> {
        if n == 0 {
            return Ok(f(&[]));
        }
        let (at, p) = self.piece(off, n)?;
        let within = (off - at) as usize;
        if let Chunk::Mem(p) = &p
            && within + n <= p.len()
        {
            return Ok(f(&p[within..within + n]));
        }
        // Across pieces (the kernel's read-ahead requests rarely line up
        // with them): gathered in a buffer kept for the next such read, not
        // zeroed and faulted in anew each time.
        let mut buf = self.lock().scratch.pop().unwrap_or_default();
        if buf.len() < n {
            buf.resize(n, 0);
        }
        let k = n.min(p.len() - within);
        let r = p
            .copy_to(within, &mut buf[..k])
            .and_then(|()| self.read_into(off + k as u64, &mut buf[k..n]))
            .map(|()| f(&buf[..n]));
        drop(p);
        let mut st = self.lock();
        if st.scratch.len() < Reader::SCRATCH && buf.len() <= Reader::SCRATCH_MAX {
            st.scratch.push(buf);
        }
        r
    }

    /// Fills `out` with the bytes at `off` (all within the file).
    fn read_into(&self, mut off: u64, mut out: &mut [u8]) -> io::Result<()> {
        while !out.is_empty() {
            let (at, p) = self.piece(off, out.len())?;
            let within = (off - at) as usize;
            let k = out.len().min(p.len() - within);
            p.copy_to(within, &mut out[..k])?;
            off += k as u64;
            out = &mut out[k..];
        }
        Ok(())
    }

    /// Appends the `n` bytes at `off` (all within the file) to the pipe
    /// `to`: see [`Reads::splice_to`].
    fn splice_to(&self, mut off: u64, mut n: usize, to: BorrowedFd<'_>) -> io::Result<()> {
        while n > 0 {
            let (at, p) = self.piece(off, n)?;
            let within = (off - at) as usize;
            let k = n.min(p.len() - within);
            match &p {
                Chunk::Pipes(h) => h.tee_to(within, k, to)?,
                Chunk::Mem(b) => lors_ibp::spliced::write_to(to, &b[within..within + k])?,
            }
            off += k as u64;
            n -= k;
        }
        Ok(())
    }

    /// The piece holding byte `off` and where it starts, with the (up to)
    /// `want` bytes from `off` in it counted as read: from the cache, the
    /// read-ahead or the depots.
    fn piece(&self, off: u64, want: usize) -> io::Result<(u64, Chunk)> {
        let mut st = self.lock();
        // The stream this read waited for, to hear if it failed.
        let mut waited = None;
        loop {
            st.settle_tail(off);
            if let Some(hit) = st.take(off, want) {
                return Ok(hit);
            }
            if let Some((id, e)) = &st.failed
                && waited == Some(*id)
            {
                return Err(copy(e));
            }
            let src =
                (st.source.clone()).ok_or_else(|| io::Error::other("nothing to read from"))?;
            // Out of order by a little (the kernel's parallel readahead
            // through FUSE) is still sequential: the bytes before were just
            // read.
            let sequential = off == st.last_end || (off > 0 && st.find(off - 1).is_some());
            let ahead = (st.readahead as u64).max(2 * FETCH);
            let end = src.x.logical_size();
            let start = off - off % FETCH;
            let stretch = FETCH.min(end.saturating_sub(start));
            if off >= end {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the exNode ends early",
                ));
            }
            let (id, mut rx) = match st.stream.as_mut() {
                Some(s) if s.next <= off && off < s.end.min(s.next + ahead) => match s.rx.take() {
                    Some(rx) => (s.id, rx),
                    None => {
                        // Another reader is taking the read-ahead's next
                        // piece: it says when one arrives.
                        // (Looked at again now and then all the same: a
                        // missed wake-up costs a second, not a hang.)
                        waited = Some(s.id);
                        st = (self.arrived.wait_timeout(st, Duration::from_secs(1)))
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                        continue;
                    }
                },
                // A look back just behind the read-ahead (the kernel reads
                // a page again now and then), or a read elsewhere while
                // another reader waits on the read-ahead: fetched on the
                // side, and the read-ahead goes on.
                Some(s)
                    if s.rx.is_none() || !sequential && off < s.next && s.next - off <= ahead =>
                {
                    let side = st.fetch(&src, start, stretch);
                    let epoch = st.epoch;
                    drop(st);
                    return self.side(epoch, side, off, want);
                }
                _ => {
                    // Sequential: the rest of the file; random: this
                    // stretch alone.
                    let len = if sequential {
                        end.saturating_sub(start).min(STREAM_SPAN)
                    } else {
                        stretch
                    };
                    st.stream = Some(st.fetch(&src, start, len));
                    continue;
                }
            };
            // The next piece, waited for without the lock.
            drop(st);
            let got = rx.blocking_recv();
            st = self.lock();
            let Some(s) = st.stream.as_mut().filter(|s| s.id == id) else {
                // The file changed meanwhile: look again.
                continue;
            };
            let piece = match got {
                Some(p) => match misfit(s.next, s.end, &p) {
                    None => p,
                    Some(e) => return Err(self.fail(st, id, Some(e))),
                },
                None => return Err(self.fail(st, id, None)),
            };
            let mut done = s.add(piece.into_data());
            // The pieces already waiting join the tail while they lie next
            // to it in memory (cut in a row from one slab), until the run
            // holding `off` is whole: a read across its pieces is then
            // answered in place, not gathered.
            let mut took = 0;
            while s.next < s.end
                && took < 2 * Reader::SLAB
                && !done
                    .iter()
                    .any(|(at, r)| *at <= off && off < at + r.len() as u64)
            {
                let Ok(p) = rx.try_recv() else { break };
                if let Some(e) = misfit(s.next, s.end, &p) {
                    return Err(self.fail(st, id, Some(e)));
                }
                took += p.len();
                done.extend(s.add(p.into_data()));
            }
            if s.next < s.end {
                s.rx = Some(rx);
            } else {
                done.extend(s.tail.take().map(|(at, t)| (at, Chunk::Mem(t.freeze()))));
                st.stream = None;
            }
            for (at, run) in done {
                st.put(at, run);
            }
            self.arrived.notify_all();
        }
    }

    /// Ends the read-ahead `id` with an error (`None`: the download's
    /// own), which every reader waiting for it gets too.
    fn fail(&self, mut st: MutexGuard<'_, Reader>, id: u64, e: Option<io::Error>) -> io::Error {
        let mut s = st.stream.take();
        // What arrived before is good.
        if let Some((at, t)) = s.as_mut().and_then(|s| s.tail.take()) {
            st.put(at, Chunk::Mem(t.freeze()));
        }
        drop(st);
        let e = match (e, s) {
            (Some(e), _) => e,
            (None, Some(mut s)) => runtime().block_on(s.wait()),
            (None, None) => io::Error::other("the read-ahead is gone"),
        };
        self.lock().failed = Some((id, copy(&e)));
        self.arrived.notify_all();
        e
    }

    /// Takes the pieces of `side` into the cache (unless the file changed
    /// since `epoch`) until one holds `off`.
    fn side(
        &self,
        epoch: u64,
        mut side: Stream,
        off: u64,
        want: usize,
    ) -> io::Result<(u64, Chunk)> {
        let mut rx = side.rx.take().expect("a new stream");
        loop {
            let Some(piece) = rx.blocking_recv() else {
                return Err(runtime().block_on(side.wait()));
            };
            let at = side.next;
            if let Some(e) = misfit(at, side.end, &piece) {
                return Err(e);
            }
            side.next += piece.len() as u64;
            let p = Chunk::from(piece.into_data());
            let mut st = self.lock();
            if st.epoch == epoch {
                st.put(at, p.clone());
                self.arrived.notify_all();
            }
            // The pieces come in order from the start of the stretch, at or
            // before `off`: the first to reach past `off` holds it.
            if off < side.next {
                if st.epoch == epoch {
                    st.served(at, p.len(), off, want);
                }
                return Ok((at, p));
            }
        }
    }
}

/// What is wrong with a piece a stream delivered at `at` (of `end`), if
/// anything.
fn misfit(at: u64, end: u64, p: &Piece) -> Option<io::Error> {
    let left = end.saturating_sub(at);
    (p.is_empty() || p.len() as u64 > left).then(|| {
        io::Error::other(format!(
            "the read-ahead delivered {} bytes at {at} with {left} left",
            p.len()
        ))
    })
}

/// How many of `len` bytes at `off` a file of `size` bytes holds.
fn clip(size: u64, off: u64, len: usize) -> usize {
    len.min(size.saturating_sub(off).min(usize::MAX as u64) as usize)
}

/// Another reader's copy of an error.
fn copy(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(n) => io::Error::from_raw_os_error(n),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// The read cache and the read-ahead.
struct Reader {
    /// Pieces of the file as the read-ahead delivered them, by first byte,
    /// with the bytes read from each.
    pieces: BTreeMap<u64, (Chunk, usize)>,
    /// First bytes of the pieces not yet read whole, least recently used
    /// first.
    order: VecDeque<u64>,
    /// First bytes of the pieces read whole, oldest first: kept
    /// [`Reader::BEHIND`] deep for a look back, then their buffers go back
    /// to the read-ahead. A cache filled with what a scan read once would
    /// only make the read-ahead take fresh memory (a page fault and a
    /// zeroed page per 4 KiB) for every piece until it is full.
    passed: VecDeque<u64>,
    passed_bytes: u64,
    /// Bytes in `pieces`, and the most kept.
    bytes: u64,
    capacity: u64,
    stream: Option<Stream>,
    /// Where the last read ended: a read starting here is sequential.
    last_end: u64,
    readahead: usize,
    /// Where the read-ahead takes its buffers from and dropped pieces go
    /// back to.
    buffers: Arc<Buffers>,
    /// See [`Shared::read_with`].
    scratch: Vec<Vec<u8>>,
    /// What to fetch from; `None` once the file changed, until the next
    /// read.
    source: Option<Arc<Source>>,
    /// The last stream to fail and why, for the readers that waited on it.
    failed: Option<(u64, io::Error)>,
    /// Streams started, to tell them apart.
    streams: u64,
    /// Times the file changed: a piece fetched before is not cached.
    epoch: u64,
    /// The read-ahead keeps raw pieces in pipes ([`OpenOptions::spliced`]).
    spliced: bool,
}

impl Reader {
    /// Slabs kept for the read-ahead: what it takes while a reader goes
    /// through a few of them.
    const SPARE: usize = 4;
    /// What the read-ahead's pieces are cut from, in a row: the most a run
    /// of pieces joined again holds. The kernel asks a FUSE mount for up to
    /// 1 MiB at a time, not aligned to pieces; within a 4 MiB run, three
    /// requests in four are answered in place.
    const SLAB: usize = 4 << 20;
    /// Bytes of pieces read whole kept for a look back.
    const BEHIND: u64 = 16 << 20;
    /// Gathering buffers kept: one per reader thread of a FUSE mount, of
    /// up to a FUSE request's size or so (a caller asking for more gets a
    /// buffer of its own).
    const SCRATCH: usize = 4;
    const SCRATCH_MAX: usize = 4 << 20;

    fn new(cache: u64, readahead: usize, spliced: bool) -> Reader {
        Reader {
            pieces: BTreeMap::new(),
            order: VecDeque::new(),
            passed: VecDeque::new(),
            passed_bytes: 0,
            bytes: 0,
            capacity: cache.max(4 * FETCH),
            stream: None,
            last_end: 0,
            readahead,
            buffers: Arc::new(Buffers::slabs(Self::SPARE, Self::SLAB)),
            scratch: Vec::new(),
            source: None,
            failed: None,
            streams: 0,
            epoch: 0,
            spliced,
        }
    }

    /// The cached piece holding byte `off`, with the (up to) `want` bytes
    /// from `off` in it counted as read.
    fn take(&mut self, off: u64, want: usize) -> Option<(u64, Chunk)> {
        let (at, p) = self.get(off)?;
        self.served(at, p.len(), off, want);
        Some((at, p))
    }

    /// The bytes from `off` in the piece of `len` bytes at `at`, up to
    /// `want`, were read.
    fn served(&mut self, at: u64, len: usize, off: u64, want: usize) {
        let k = want.min(len - (off - at) as usize);
        self.consumed(at, k);
        self.last_end = off + k as u64;
    }

    /// Starts downloading `[start, start+len)` of `src` into a bounded
    /// channel of pieces, each handed over in the buffer it was read into.
    fn fetch(&mut self, src: &Arc<Source>, start: u64, len: u64) -> Stream {
        let opts = DownloadOptions {
            offset: start,
            length: Some(len),
            last_resort: src.last_resort.clone(),
            ..DownloadOptions::default()
        };
        let (tx, rx) = mpsc::channel((self.readahead as u64 / STREAM_PIECE).max(1) as usize);
        let buffers = self.buffers.clone();
        let spliced = self.spliced;
        let src = src.clone();
        let task = runtime().spawn(async move {
            let out = Output::Pieces {
                tx,
                buffers,
                spliced,
            };
            download(&src.x, out, &opts, src.pool.clone(), Arc::new(NoProgress)).await
        });
        self.streams += 1;
        Stream {
            id: self.streams,
            next: start,
            end: start + len,
            rx: Some(rx),
            tail: None,
            task: Some(task),
        }
    }

    /// Puts the read-ahead's tail in the cache if it holds byte `off`.
    fn settle_tail(&mut self, off: u64) {
        let Some(s) = self.stream.as_mut() else {
            return;
        };
        if let Some((at, t)) = s
            .tail
            .take_if(|(at, t)| *at <= off && off < *at + t.len() as u64)
        {
            self.put(at, Chunk::Mem(t.freeze()));
        }
    }

    /// The cached piece holding byte `off` and where it starts.
    fn find(&self, off: u64) -> Option<(u64, &Chunk)> {
        let (&at, (p, _)) = self.pieces.range(..=off).next_back()?;
        (off < at + p.len() as u64).then_some((at, p))
    }

    /// As [`Reader::find`], marking the piece used.
    fn get(&mut self, off: u64) -> Option<(u64, Chunk)> {
        let (at, p) = self.find(off)?;
        let p = p.clone();
        if self.order.back() != Some(&at) {
            self.unlink(at, p.len() as u64);
            self.order.push_back(at);
        }
        Some((at, p))
    }

    /// Takes the piece at `at` (of `len` bytes) out of whichever queue
    /// holds it.
    fn unlink(&mut self, at: u64, len: u64) {
        if let Some(i) = self.order.iter().rposition(|&x| x == at) {
            self.order.remove(i);
        } else if let Some(i) = self.passed.iter().position(|&x| x == at) {
            self.passed.remove(i);
            self.passed_bytes -= len;
        }
    }

    fn put(&mut self, at: u64, p: Chunk) {
        self.bytes += p.len() as u64;
        if let Some((old, _)) = self.pieces.insert(at, (p, 0)) {
            self.unlink(at, old.len() as u64);
            self.bytes -= old.len() as u64;
            self.recycle(old);
        }
        self.order.push_back(at);
        while self.bytes > self.capacity {
            if !self.drop_passed() {
                match self.order.pop_front() {
                    Some(old) => self.drop_piece(old),
                    None => break,
                }
            }
        }
    }

    /// `n` bytes of the piece at `at` were read. Once all of them have
    /// been (in any order: the kernel's read-ahead requests through FUSE
    /// arrive out of order by megabytes), it was passed.
    fn consumed(&mut self, at: u64, n: usize) {
        let Some((p, read)) = self.pieces.get_mut(&at) else {
            return;
        };
        *read += n;
        let len = p.len();
        if *read < len {
            return;
        }
        let Some(i) = self.order.iter().rposition(|&x| x == at) else {
            return;
        };
        self.order.remove(i);
        self.passed.push_back(at);
        self.passed_bytes += len as u64;
        while self.passed_bytes > Self::BEHIND && self.drop_passed() {}
    }

    /// Drops the oldest piece read to its end; whether there was one.
    fn drop_passed(&mut self) -> bool {
        let Some(at) = self.passed.pop_front() else {
            return false;
        };
        self.passed_bytes -= self.pieces.get(&at).map_or(0, |(p, _)| p.len() as u64);
        self.drop_piece(at);
        true
    }

    fn drop_piece(&mut self, at: u64) {
        if let Some((p, _)) = self.pieces.remove(&at) {
            self.bytes -= p.len() as u64;
            self.recycle(p);
        }
    }

    /// Gives a dropped piece's buffer back to the read-ahead, unless a
    /// caller still holds it.
    fn recycle(&self, p: Chunk) {
        if let Chunk::Mem(p) = p
            && let Ok(b) = p.try_into_mut()
        {
            self.buffers.give(b);
        }
    }

    /// The file changed: nothing read before is current.
    fn invalidate(&mut self) {
        for (_, (p, _)) in std::mem::take(&mut self.pieces) {
            self.recycle(p);
        }
        self.order.clear();
        self.passed.clear();
        self.passed_bytes = 0;
        self.bytes = 0;
        self.stream = None;
        self.source = None;
        self.epoch += 1;
    }
}

/// A cached piece's bytes.
#[derive(Clone)]
enum Chunk {
    Mem(Bytes),
    /// Held in kernel pipes ([`OpenOptions::spliced`]).
    Pipes(Arc<Spliced>),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Mem(b) => b.len(),
            Chunk::Pipes(h) => h.len(),
        }
    }

    /// Copies the bytes from `from` into `out`.
    fn copy_to(&self, from: usize, out: &mut [u8]) -> io::Result<()> {
        match self {
            Chunk::Mem(b) => {
                out.copy_from_slice(&b[from..from + out.len()]);
                Ok(())
            }
            Chunk::Pipes(h) => h.copy_to(from, out),
        }
    }
}

impl From<Data> for Chunk {
    fn from(d: Data) -> Chunk {
        match d {
            Data::Mem(b) => Chunk::Mem(b.freeze()),
            Data::Spliced(h) => Chunk::Pipes(Arc::new(h)),
        }
    }
}

/// A download running into a pipe, read piece by piece.
struct Stream {
    id: u64,
    /// Where the next piece to arrive starts.
    next: u64,
    /// One past the last byte.
    end: u64,
    /// Taken out by the reader waiting for the next piece.
    rx: Option<mpsc::Receiver<Piece>>,
    /// The last pieces received, joined, and where they start: kept out of
    /// the cache until a reader needs them or the next piece does not lie
    /// right after them in memory, so a whole slab becomes one piece.
    tail: Option<(u64, BytesMut)>,
    task: Option<JoinHandle<crate::Result<Stats>>>,
}

impl Stream {
    /// Takes in `p`, the bytes at `next`, and returns what is ready for
    /// the cache. Bytes in memory join the tail if they lie right after it;
    /// otherwise they start the tail, and the tail before it, whole, is
    /// returned. Bytes in pipes are returned at once, after the tail.
    fn add(&mut self, p: Data) -> Vec<(u64, Chunk)> {
        let at = self.next;
        self.next += p.len() as u64;
        let p = match p {
            Data::Mem(p) => p,
            held @ Data::Spliced(_) => {
                let tail = self.tail.take().map(|(at, t)| (at, Chunk::Mem(t.freeze())));
                return tail.into_iter().chain([(at, Chunk::from(held))]).collect();
            }
        };
        let p = match &mut self.tail {
            Some((_, t)) => match t.try_unsplit(p) {
                Ok(()) => return Vec::new(),
                Err(p) => p,
            },
            None => p,
        };
        (self.tail.replace((at, p)))
            .map(|(at, t)| (at, Chunk::Mem(t.freeze())))
            .into_iter()
            .collect()
    }

    /// Why the download ended before delivering everything.
    async fn wait(&mut self) -> io::Error {
        match self.task.take() {
            Some(t) => match t.await {
                Ok(Err(e)) => lors_error(e),
                Ok(Ok(_)) => io::Error::new(ErrorKind::UnexpectedEof, "the download ended early"),
                Err(e) => io::Error::other(format!("the read-ahead failed: {e}")),
            },
            None => io::Error::other("the read-ahead is gone"),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

fn invalid(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(ErrorKind::InvalidInput, why.to_string())
}

fn new_exnode(path: &Path) -> ExNode {
    let mut x = ExNode::default();
    let name = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    x.set_meta(Meta::string("filename", &name));
    x.set_meta(Meta::double("lorsversion", lors_exnode::xml::LORS_VERSION));
    x
}

fn xnd_error(e: XndError) -> io::Error {
    let kind = match &e {
        XndError::Read { source, .. } | XndError::Write { source, .. } => source.kind(),
        _ => ErrorKind::InvalidData,
    };
    io::Error::new(kind, e)
}

/// A LoRS error as the error a program understands: `ENOSPC` when no depot
/// takes the data, `EIO` (`ErrorKind::Other`) when no replica can be read.
pub fn lors_error(e: Error) -> io::Error {
    io::Error::new(error_kind(&e), e)
}

fn error_kind(e: &Error) -> ErrorKind {
    match e {
        Error::NoDepots | Error::NotEnoughDepots { .. } => ErrorKind::StorageFull,
        Error::Store { last, .. } if last.code.is_some_and(|c| NO_ROOM.contains(&c)) => {
            ErrorKind::StorageFull
        }
        Error::Abandoned { cause, .. } => match error_kind(cause) {
            ErrorKind::StorageFull => ErrorKind::StorageFull,
            _ => ErrorKind::Other,
        },
        Error::Io { source, .. } => source.kind(),
        _ => ErrorKind::Other,
    }
}

/// The IBP statuses that mean a depot has no room: `ENOSPC` when the last
/// depot asked answered one of them.
const NO_ROOM: [lors_ibp::StatusCode; 3] = [
    lors_ibp::StatusCode::WOULD_EXCEED_LIMIT,
    lors_ibp::StatusCode::ALLOC_FAILED,
    lors_ibp::StatusCode::RSRC_UNAVAIL,
];

/// The `errno` value a program should see for `e` (C callers of libxio,
/// FUSE replies): the OS error if there is one, else by kind — `ENOSPC`,
/// `EROFS`, `ENOENT`, … — and `EIO` for the rest.
pub fn errno(e: &io::Error) -> i32 {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    match e.kind() {
        ErrorKind::NotFound => libc::ENOENT,
        ErrorKind::PermissionDenied => libc::EACCES,
        ErrorKind::AlreadyExists => libc::EEXIST,
        ErrorKind::InvalidInput => libc::EINVAL,
        ErrorKind::StorageFull => libc::ENOSPC,
        ErrorKind::ReadOnlyFilesystem => libc::EROFS,
        ErrorKind::Unsupported => libc::EOPNOTSUPP,
        ErrorKind::TimedOut => libc::ETIMEDOUT,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 256 << 10;

    fn piece(fill: u8) -> Chunk {
        Chunk::Mem(Bytes::from(vec![fill; P]))
    }

    fn bytes(c: &Chunk) -> Vec<u8> {
        let mut v = vec![0u8; c.len()];
        c.copy_to(0, &mut v).unwrap();
        v
    }

    /// Pieces read out of order (FUSE's read-ahead requests arrive so) stay
    /// until every byte of them was read, however far later reads ran.
    #[test]
    fn a_piece_stays_until_read_whole_in_any_order() {
        let mut r = Reader::new(DEFAULT_CACHE, DEFAULT_READAHEAD, false);
        let n = 2 * (Reader::BEHIND as usize / P) + 4;
        for i in 0..n {
            r.put((i * P) as u64, piece(i as u8));
        }
        // The second half of piece 0 and all the others are read...
        r.consumed(0, P / 2);
        for i in 1..n {
            r.consumed((i * P) as u64, P);
        }
        // ...so piece 0 is still there, and only the last BEHIND bytes of
        // the pieces read whole.
        let (at, p) = r.get(10).expect("piece 0 is not read whole yet");
        assert_eq!((at, bytes(&p)[0]), (0, 0));
        let kept: Vec<u64> = r.pieces.keys().map(|k| k / P as u64).collect();
        let behind = Reader::BEHIND / P as u64;
        let want: Vec<u64> = std::iter::once(0)
            .chain(n as u64 - behind..n as u64)
            .collect();
        assert_eq!(kept, want);
        assert_eq!(r.bytes, (1 + behind) * P as u64);
        // Its other half read, it goes behind too, and the oldest goes.
        r.consumed(0, P / 2);
        assert!(r.find(0).is_some(), "just read: kept for a look back");
        assert_eq!(r.passed_bytes, Reader::BEHIND);
    }

    /// The read-ahead's pieces, cut in a row from slabs, become one piece
    /// per slab: each joins the tail until one from another slab arrives,
    /// and the tail is complete.
    #[test]
    fn a_stream_joins_the_pieces_of_a_slab_into_one() {
        let pool = Buffers::slabs(1, 1 << 20);
        let mut s = Stream {
            id: 1,
            next: 0,
            end: 8 << 20,
            rx: None,
            tail: None,
            task: None,
        };
        let mut done = Vec::new();
        for i in 0..6u8 {
            let mut b = pool.take(P as u64);
            b.resize(P, i);
            done.extend(s.add(Data::Mem(b)));
        }
        // Four pieces in the first slab: one piece of 1 MiB at 0.
        assert_eq!(done.len(), 1);
        let (at, run) = &done[0];
        let want: Vec<u8> = (0..4u8).flat_map(|i| vec![i; P]).collect();
        assert_eq!((*at, bytes(run)), (0, want));
        // The second slab's two so far wait in the tail.
        let (at, tail) = s.tail.as_ref().expect("a tail");
        assert_eq!(
            (*at, tail.len(), s.next),
            (4 * P as u64, 2 * P, 6 * P as u64)
        );
        // A reader needing them puts them in the cache as they are.
        let mut r = Reader::new(DEFAULT_CACHE, DEFAULT_READAHEAD, false);
        r.stream = Some(s);
        r.settle_tail(5 * P as u64 + 7);
        assert!(r.stream.as_ref().unwrap().tail.is_none());
        let (at, p) = r.get(5 * P as u64).expect("in the cache");
        assert_eq!((at, p.len(), bytes(&p)[P]), (4 * P as u64, 2 * P, 5));
    }

    /// The cache's capacity drops what was read whole before what was not.
    #[test]
    fn a_full_cache_drops_read_pieces_first() {
        let mut r = Reader::new(0, DEFAULT_READAHEAD, false); // the floor: 4 MiB
        let fit = (r.capacity as usize) / P;
        for i in 0..fit {
            r.put((i * P) as u64, piece(1));
        }
        r.consumed(P as u64, P); // piece 1 read whole
        r.get(0); // piece 0 used (not whole)
        r.put((fit * P) as u64, piece(2));
        assert!(
            r.find(P as u64).is_none(),
            "the piece read whole went first"
        );
        assert!(r.find(0).is_some() && r.find((fit * P) as u64).is_some());
        // Then the least recently used: piece 2, not piece 0.
        r.put(((fit + 1) * P) as u64, piece(3));
        assert!(r.find(2 * P as u64).is_none());
        assert!(r.find(0).is_some());
    }
}
