//! [`OpenOptions`]: how a [`File`] is opened, as `open(2)`'s flags say.

use std::collections::VecDeque;
use std::io::{self, ErrorKind};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use lors_exnode::ExNode;
use lors_exnode::functions::Codec;

use super::attrs::stamp;
use super::cache::Cache;
use super::errno::{invalid, xnd_error};
use super::{DEFAULT_BUFFER, DEFAULT_CACHE, DEFAULT_READAHEAD, FETCH, File};
use crate::Pool;
use crate::settings::{Env, Layer, Settings};
use crate::uri::ExnodeRef;
use crate::xnd::{self, XndError};

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
    all_or_nothing: bool,
    e2e: Option<Codec>,
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
            all_or_nothing: false,
            e2e: None,
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
    /// to the kernel: [`Reads::splice_to`](super::Reads::splice_to) then moves them without a copy
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

    /// Object semantics instead of `open(2)`'s: the `.xnd` changes only
    /// when [`File::close`] has stored everything written, as an object
    /// store's put replaces an object whole. Opening neither creates nor
    /// empties it; [`File::sync_all`] stores what is buffered without
    /// saving; a handle dropped without `close` (or [`File::discard`]ed)
    /// frees what it stored and leaves the old exNode as it was. What a
    /// truncation or an overwrite supersedes is freed only after the save.
    ///
    /// ```no_run
    /// use std::io::Write;
    /// let mut f = lors::xio::OpenOptions::new()
    ///     .write(true).create(true).truncate(true).all_or_nothing(true)
    ///     .open("table.parquet.xnd")?;
    /// f.write_all(b"...")?;
    /// f.close()?; // the old table until here, the new one from here
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn all_or_nothing(&mut self, on: bool) -> &mut Self {
        self.all_or_nothing = on;
        self
    }

    /// End-to-end functions (checksums, compression, encryption) every
    /// new block is stored with, as `lors upload`'s `-k`/`-z`/`-e` give
    /// them ([`crate::upload::E2e::codec`]). None by default.
    pub fn e2e(&mut self, codec: Option<Codec>) -> &mut Self {
        self.e2e = codec;
        self
    }

    /// Opens `target`: a path of an `.xnd` file or a `lors://` URI.
    pub fn open(&self, target: &str) -> io::Result<File> {
        let r = ExnodeRef::parse(target).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
        self.open_ref(&r)
    }

    /// Removes the exNode at `target` (a path or `lors://` URI) as
    /// `unlink(2)` removes a file, with these options' settings: what it
    /// names is released on its depots (an allocation another exNode also
    /// names loses only this file's reference), erasure-coded or not, then
    /// the `.xnd` goes ([`crate::commit::remove`]).
    ///
    /// ```no_run
    /// lors::xio::OpenOptions::new().remove("runs/old.xnd")?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    /// `ENOENT` when there is no such file; `EIO` when a depot did not
    /// release an allocation (the emptied `.xnd` stays, with the record of
    /// what is left: removing it again finishes).
    pub fn remove(&self, target: &str) -> io::Result<()> {
        let r = ExnodeRef::parse(target).map_err(invalid)?;
        let settings = self.resolved(&r)?;
        let pool = Arc::new(Pool::new(settings.client()));
        super::runtime()
            .block_on(crate::commit::remove(&r.path, &pool, super::SAVE_WAIT))
            .map(drop)
            .map_err(|e| match e {
                crate::Error::Io { what, source } => {
                    io::Error::new(source.kind(), format!("{what}: {source}"))
                }
                crate::Error::Xnd(e) => xnd_error(e),
                e => super::lors_error(e),
            })
    }

    fn resolved(&self, r: &ExnodeRef) -> io::Result<Settings> {
        match &self.settings {
            Some(s) => Ok(s.clone()),
            None => {
                let rc = crate::xndrc::load(None).map_err(invalid)?;
                Settings::resolve(Layer::default(), Some(r), &Env::process(), rc)
                    .map_err(|e| invalid(e.to_string()))
            }
        }
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
        let settings = self.resolved(r)?;
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
            refuse_erasure(&x, &path)?;
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
        let copies = (x.copies_policy()).or(settings.copies).unwrap_or(1);
        if writable && x.copies_policy().is_none() {
            let n = i64::try_from(copies).unwrap_or(i64::MAX);
            x.set_meta(lors_exnode::Metadata::integer(
                lors_exnode::model::COPIES_META,
                n,
            ));
        }
        let truncated = writable && self.truncate && !(x.mappings.is_empty() && x.holes.is_empty());
        let to_release = if truncated {
            x.holes.clear();
            std::mem::take(&mut x.mappings)
        } else {
            Vec::new()
        };
        let pool = pool_for(&path, &settings, writable)?;
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
            reader: Cache::new(self.cache, self.readahead, self.spliced),
            last_resort: None,
            lbone: None,
            closed: false,
            disk,
            all_or_nothing: self.all_or_nothing,
            e2e: self.e2e.clone(),
        };
        if f.dirty && !f.all_or_nothing {
            // open(2) with O_CREAT or O_TRUNC changes the file at once.
            f.sync_all()?;
        }
        Ok(f)
    }
}

fn new_exnode(path: &Path) -> ExNode {
    let name = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    ExNode::of_file(&name)
}

/// A write would change an erasure-coded file's data blocks without their
/// parity: such files open read-only.
fn refuse_erasure(x: &lors_exnode::ExNode, path: &std::path::Path) -> io::Result<()> {
    if !x.is_erasure_coded() {
        return Ok(());
    }
    Err(io::Error::new(
        ErrorKind::ReadOnlyFilesystem,
        format!(
            "{}: erasure-coded exNodes are read-only here (write a new file with lors upload --ec)",
            path.display()
        ),
    ))
}

/// The connections of a file opened at `path`. A writer's write down
/// every block it stores as it is allocated (its own journal): killed
/// before its save, it strands nothing the next command on the exNode
/// does not free.
fn pool_for(path: &Path, settings: &Settings, writable: bool) -> io::Result<Arc<Pool>> {
    let pool = Arc::new(Pool::new(settings.client()));
    if writable {
        let j = crate::commit::Journal::private(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: journal: {e}", path.display())))?;
        pool.set_journal(Arc::new(j));
    }
    Ok(pool)
}
