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

mod attrs;
mod cache;
mod errno;
mod options;
mod ranges;
mod readahead;
mod write;

pub use attrs::{Metadata, set_attributes, stat};
pub use cache::Reads;
pub use errno::{errno, lors_error};
pub use options::OpenOptions;
pub use write::MAX_FILE_SIZE;

use std::collections::{HashSet, VecDeque};
use std::io::{self, ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use lors_exnode::{ExNode, Mapping};
use tokio::runtime::Runtime;

use attrs::{Stamp, metadata_of, set_attrs, stamp};
use cache::{Cache, Source, clip};
use errno::{invalid, xnd_error};
use write::Flush;

use crate::Pool;
use crate::settings::Settings;
use crate::xnd;

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

/// How long a save waits for another lors command to let go of the
/// exNode ([`crate::commit::Lock`]).
pub(crate) const SAVE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An exNode opened as a file. See the [module docs](self).
pub struct File {
    path: PathBuf,
    x: ExNode,
    /// Times were set explicitly ([`File::set_attributes`]) after the last
    /// write: they, not the write's time, are saved.
    times_set: bool,
    /// Replicas every block written gets: the file's policy
    /// ([`lors_exnode::ExNode::copies_policy`]). A write that cannot have them
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
    reader: Arc<Cache>,
    last_resort: Option<HashSet<String>>,
    /// The settings' L-Bone, once resolved (`Some(None)`: none named).
    lbone: Option<Option<lors_lbone::client::Directory>>,
    /// `close` ran: nothing left for the drop to do.
    closed: bool,
    /// The `.xnd` as this handle last read or wrote it: another writer's
    /// save in between is a conflict, not something to overwrite.
    disk: Option<Stamp>,
    /// Saved only by `close`, whole ([`OpenOptions::all_or_nothing`]).
    all_or_nothing: bool,
    /// End-to-end functions of new blocks ([`OpenOptions::e2e`]).
    e2e: Option<lors_exnode::functions::Codec>,
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

    /// Renames the `.xnd` to `to` (replacing a file there, as `rename(2)`
    /// does) and this writer's journal with it: later saves go to `to`.
    /// Nothing is stored or saved; what is buffered stays buffered.
    pub fn rename(&mut self, to: &Path) -> io::Result<()> {
        let _lock = crate::commit::Lock::take(&self.path, SAVE_WAIT)
            .map_err(|e| io::Error::new(io::ErrorKind::ResourceBusy, e.to_string()))?;
        std::fs::rename(&self.path, to)?;
        if let Some(j) = self.pool.journal() {
            j.follow(to, true)?;
        }
        self.path = to.to_path_buf();
        Ok(())
    }

    /// The `.xnd` and its journal were moved to `to` by their directory's
    /// rename: later saves go there.
    pub fn moved(&mut self, to: PathBuf) {
        if let Some(j) = self.pool.journal() {
            let _ = j.follow(&to, false);
        }
        self.path = to;
    }

    /// The exNode as it stands (what is still buffered is not in it).
    pub fn exnode(&self) -> &ExNode {
        &self.x
    }

    /// `lseek(2)` with `SEEK_DATA` (`data`) or `SEEK_HOLE` from `offset`:
    /// the first byte at or after it that holds data, or that lies in a
    /// hole (a sparse file's recorded holes; the end of the file counts as
    /// one). The position does not move. Bytes written and not yet stored
    /// are stored first, so a hole they fill is not reported.
    ///
    /// # Errors
    /// `ENXIO` at or past the end (and, for data, in a hole that reaches
    /// the end), as `lseek(2)` says it.
    pub fn seek_sparse(&mut self, offset: u64, data: bool) -> io::Result<u64> {
        if self.writable {
            self.drain()?;
        }
        let enxio = || io::Error::from_raw_os_error(libc::ENXIO);
        if offset >= self.size {
            return Err(enxio());
        }
        let next_hole = || {
            let i = self.x.holes.partition_point(|h| h.end() <= offset);
            self.x
                .holes
                .get(i)
                .map_or(self.size, |h| h.offset.max(offset))
        };
        match (data, self.x.hole_at(offset)) {
            (true, None) => Ok(offset),
            (true, Some(h)) if h.end() < self.size => Ok(h.end()),
            (true, Some(_)) => Err(enxio()),
            (false, _) => Ok(next_hole().min(self.size)),
        }
    }

    /// The length and the modification time as [`File::metadata`] has
    /// them, without reading the `.xnd`'s own metadata from disk: cheap
    /// enough to ask after every write. `None`: the time recorded in the
    /// exNode (or the `.xnd`'s) stands.
    pub fn size_and_modified(&self) -> (u64, Option<SystemTime>) {
        (self.size, self.modified)
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
    /// nothing names any more. A file opened
    /// [`all_or_nothing`](OpenOptions::all_or_nothing) only stores: its
    /// exNode is saved by [`File::close`].
    pub fn sync_all(&mut self) -> io::Result<()> {
        if self.all_or_nothing {
            return if self.writable { self.drain() } else { Ok(()) };
        }
        self.save()
    }

    /// [`File::sync_all`]'s store and save, for every kind of file.
    fn save(&mut self) -> io::Result<()> {
        self.drain()?;
        if !self.dirty && self.to_release.is_empty() {
            return Ok(());
        }
        // One writer at a time saves (a keeper, a route, another handle):
        // the check for another's save and ours are one step.
        let _lock = crate::commit::Lock::take(&self.path, SAVE_WAIT)
            .map_err(|e| io::Error::new(io::ErrorKind::ResourceBusy, e.to_string()))?;
        let mut old = std::mem::take(&mut self.to_release);
        let pool = self.pool.clone();
        if self.dirty {
            if stamp(&self.path) != self.disk {
                return Err(self.conflict());
            }
            self.adopt(&mut old);
            // The data's modification time goes with it, unless a program
            // set one after writing.
            if let (Some(t), false) = (self.modified, self.times_set) {
                set_attrs(&mut self.x, Some(t), None, None);
            }
            // Saved before anything it no longer names is released; what
            // is to be released is recorded first (crate::commit).
            let x = self.x.clone();
            let path = self.path.clone();
            let done = runtime()
                .block_on(crate::commit::save_then_release(&path, &x, old, &pool))
                .map_err(|e| match e {
                    crate::Error::Xnd(e) => xnd_error(e),
                    e => io::Error::other(e.to_string()),
                })?;
            self.disk = stamp(&self.path);
            self.dirty = false;
            self.unsaved.clear();
            // Nothing is in flight (drained above): all it lists is named.
            if let Some(j) = pool.journal() {
                j.reset();
            }
            if !done.kept.is_empty() {
                tracing::warn!(
                    count = done.kept.len(),
                    "superseded allocations could not be released; named in the record beside the exNode"
                );
            }
        } else {
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

    /// The `.xnd` is a copy made outside lors (`cp`, `rsync`): what it
    /// named holds no reference of its own. Those it still names take one
    /// now; those this handle superseded are not this file's to release.
    fn adopt(&mut self, old: &mut Vec<lors_exnode::Mapping>) {
        let Ok(disk) = xnd::load(&self.path) else {
            return;
        };
        if xnd::outside_copy(&self.path, &disk) != Some(xnd::Copied::BesideOriginal) {
            return;
        }
        let theirs = crate::commit::named(&disk);
        let ours =
            |m: &lors_exnode::Mapping| crate::commit::key(m).is_some_and(|k| theirs.contains(&k));
        old.retain(|m| !ours(m));
        let pool = self.pool.clone();
        runtime().block_on(crate::commit::take_references(&mut self.x, ours, &pool));
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

    /// Closes without saving: what was written since the last save is
    /// freed on its depots and the saved exNode stays as it was (for a file
    /// opened [`all_or_nothing`](OpenOptions::all_or_nothing), the exNode
    /// as it was before the open). A read-only file just closes.
    pub fn discard(mut self) -> io::Result<()> {
        self.closed = true;
        if !self.writable {
            return Ok(());
        }
        self.buf.clear();
        match self.abandon() {
            0 => Ok(()),
            n => Err(io::Error::other(format!(
                "{}: {n} allocations of the discarded writes could not be released; the record beside the exNode names them for the next command on it",
                self.path.display()
            ))),
        }
    }

    /// Saves if anything changed; if a store failed, releases what was
    /// stored since the last save (the saved exNode stays as it was).
    fn finish(&mut self) -> io::Result<()> {
        if !self.writable || self.closed {
            return Ok(());
        }
        match self.save() {
            Ok(()) => {
                // All it made is in the saved exNode, or released.
                if let Some(j) = self.pool.journal() {
                    j.done();
                }
                Ok(())
            }
            Err(e) => {
                self.abandon();
                Err(e)
            }
        }
    }

    /// Frees what was stored since the last save, once the stores still
    /// running have finished; the number a depot did not release (left in
    /// the journal for the next command on the exNode to settle).
    fn abandon(&mut self) -> usize {
        let mut orphans = std::mem::take(&mut self.unsaved);
        while let Some(f) = self.inflight.pop_front() {
            if let Ok(Ok(up)) = runtime().block_on(f.task) {
                orphans.extend(up.exnode.mappings);
            }
        }
        // Superseded allocations belong to the saved exNode: not ours to free.
        self.to_release.clear();
        self.dirty = false;
        let pool = self.pool.clone();
        let kept = runtime().block_on(pool.release_all(orphans));
        if let (true, Some(j)) = (kept.is_empty(), self.pool.journal()) {
            j.done();
        }
        kept.len()
    }

    /// The file's data changed now (a write, a truncation).
    fn touch(&mut self) {
        self.modified = Some(SystemTime::now());
        self.times_set = false;
        self.changed();
    }

    /// The exNode changed but not the data it holds: stored blocks of
    /// earlier writes landed. The modification time stays that of the
    /// writes, or the one a program set since (`cp -p`, `tar -x`).
    fn changed(&mut self) {
        self.dirty = true;
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
        // A read reaching past the first byte not yet stored stores first:
        // the reader's plan covers only stored bytes and holes, so those
        // bytes, and any after them, are in the exNode before it looks.
        if self.first_pending().is_some_and(|p| p < off + n as u64) {
            self.drain()?;
        }
        self.prepare();
        Ok(())
    }

    /// The first byte buffered or being stored.
    fn first_pending(&self) -> Option<u64> {
        let buf = (!self.buf.is_empty()).then_some(self.buf_off);
        (self.inflight.iter().map(|f| f.off)).chain(buf).min()
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
        let stored_below = self.first_pending().unwrap_or(u64::MAX);
        self.reader.lock().source = Some(Arc::new(Source {
            x: self.x.clone(),
            pool: self.pool.clone(),
            last_resort,
            stored_below,
        }));
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

/// Dropping saves as [`File::close`] does, except for a file opened
/// [`all_or_nothing`](OpenOptions::all_or_nothing), which is discarded
/// ([`File::discard`]): only a `close` saves it.
impl Drop for File {
    fn drop(&mut self) {
        if self.all_or_nothing && self.writable && !self.closed {
            self.closed = true;
            let n = self.abandon();
            tracing::warn!(
                file = %self.path.display(),
                unreleased = n,
                "an all-or-nothing file dropped without close: its writes are discarded"
            );
            return;
        }
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
