//! The depot's storage engine: resources, allocations, the key index, space
//! accounting, soft revocation and expiry. No sockets here; the server drives
//! it from `spawn_blocking` for anything that touches the disk.
//!
//! Lock order: an allocation's `info` before its `data` and before the
//! store's `state`; none is held across an `.await`. The per-allocation `writer` (async) serializes
//! data phases and is taken before either.

pub mod alias;
pub mod datafile;
pub mod digests;
pub mod meta;
pub mod txn;

use lors_ibp::units::unix_now;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use lors_ibp::ProbeInfo;
use lors_ibp::caps::{CapKind, Key};
use lors_ibp::proto::chksum::NetChksum;
use lors_ibp::proto::{AllocType, KeyToken, Reliability, StatusCode};

use crate::config::{Config, ResourceConfig, SyncPolicy, TypeName};
pub use alias::{AliasProbe, Window};
use datafile::Extent;
use digests::{Digests, MAX_DISK_CHKSUM_BLOCK};
use meta::{AliasRecord, AllocRecord, MetaDb};
pub use txn::{Incoming, Planned, QueueIn, QueueOut, Writer};

/// Store failures, each mapped to the IBP status a client sees.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No live allocation has this key (wrong kind, deleted or expired).
    #[error("capability not found")]
    NotFound,
    /// No resource has this id.
    #[error("no such resource")]
    InvalidRid,
    /// Not enough space in the allocation or on the resource.
    #[error("would exceed the size limit or free space")]
    NoSpace,
    /// Against the depot's policy (allocation size, duration change).
    #[error("against depot policy: {0}")]
    Policy(&'static str),
    /// Duration longer than the resource allows.
    #[error("duration longer than the resource maximum")]
    LongDuration,
    /// A parameter out of range.
    #[error("invalid parameter: {0}")]
    Invalid(&'static str),
    /// Type not offered, or the operation does not apply to this type.
    #[error("allocation type not supported here")]
    TypeNotSupported,
    /// The command does not apply to this allocation.
    #[error("operation not allowed on this allocation")]
    InvalidCmd,
    /// Would destroy stored data.
    #[error("would damage stored data")]
    WouldDamage,
    /// Reading the disk failed.
    #[error("disk read failed: {0}")]
    Read(io::Error),
    /// Writing the disk failed (full disk, I/O error).
    #[error("disk write failed: {0}")]
    Write(io::Error),
    /// The metadata database failed.
    #[error("metadata database: {0}")]
    Meta(Box<redb::Error>),
    /// The allocation's data file is damaged.
    #[error("allocation data is damaged")]
    Corrupt,
    /// An alias command named a master manage key that is not its master's.
    #[error("not the manage key of the alias's allocation")]
    WrongMaster,
    /// A disk checksum block size the depot does not keep.
    #[error(
        "checksum block size above {MAX_DISK_CHKSUM_BLOCK} bytes, or so small that the digests \
         would exceed a sixteenth of the allocation"
    )]
    ChksumBlockSize,
    /// Stored bytes no longer match their disk digest (block number).
    #[error("block {0} does not match its stored digest")]
    ChksumMismatch(u64),
    /// The allocation keeps no disk digests.
    #[error("the allocation keeps no checksums")]
    NoChksum,
}

impl From<meta::MetaError> for StoreError {
    fn from(e: meta::MetaError) -> Self {
        StoreError::Meta(e)
    }
}

impl StoreError {
    /// The wire status for this failure.
    pub fn status(&self) -> StatusCode {
        match self {
            StoreError::NotFound => StatusCode::CAP_NOT_FOUND,
            StoreError::InvalidRid => StatusCode::INVALID_RID,
            StoreError::NoSpace => StatusCode::WOULD_EXCEED_LIMIT,
            StoreError::Policy(_) => StatusCode::WOULD_EXCEED_POLICY,
            StoreError::LongDuration => StatusCode::LONG_DURATION,
            StoreError::Invalid(_) => StatusCode::INVALID_PARAMETER,
            StoreError::TypeNotSupported => StatusCode::TYPE_NOT_SUPPORTED,
            StoreError::InvalidCmd => StatusCode::INVALID_CMD,
            StoreError::WouldDamage => StatusCode::WOULD_DAMAGE_DATA,
            StoreError::Read(e) | StoreError::Write(e) if out_of_descriptors(e) => {
                StatusCode::RSRC_UNAVAIL
            }
            StoreError::Read(_) | StoreError::Corrupt => StatusCode::FILE_READ,
            StoreError::Write(_) => StatusCode::FILE_WRITE,
            StoreError::Meta(_) => StatusCode::INTERNAL,
            StoreError::WrongMaster => StatusCode::INVALID_MANAGE_CAP,
            StoreError::ChksumBlockSize => StatusCode::CHKSUM_BLOCKSIZE,
            StoreError::ChksumMismatch(_) | StoreError::NoChksum => StatusCode::CHKSUM,
        }
    }
}

/// EMFILE or ENFILE: the process or the system is out of file descriptors,
/// which is not a disk failure.
pub fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// Result alias for the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks is a bug already reported by
    // the panic itself; the data under it is still consistent enough to serve.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key_hash(key: &Key) -> [u8; 32] {
    *blake3::hash(key.expose().as_bytes()).as_bytes()
}

/// One storage resource.
pub struct Resource {
    /// Position in the depot's resource list.
    pub idx: usize,
    /// Its configuration (rid, limits).
    pub cfg: ResourceConfig,
    db: MetaDb,
    data_dir: PathBuf,
    tmp_dir: PathBuf,
    /// Data phases (STORE, WRITE, LOAD, copies) on its allocations now:
    /// new allocations go where the disk is least busy, so a depot's
    /// throughput grows with its disks.
    active: std::sync::atomic::AtomicUsize,
    /// Bytes its data files hold (headers, and byte arrays' committed
    /// lengths): what of the space promised to allocations is on disk
    /// already, the rest must still fit in the file system's free space.
    stored: std::sync::atomic::AtomicU64,
    /// The file system its data lives on (`st_dev`): resources on one share
    /// its free space.
    dev: u64,
    /// Disk space kept free beyond every promise, for metadata.
    headroom: u64,
}

/// A data phase on a resource, counted while it lives.
pub struct Busy(Arc<Resource>);

impl std::fmt::Debug for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Busy").field(&self.0.rid()).finish()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0
            .active
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Resource {
    /// Resource id.
    pub fn rid(&self) -> &str {
        &self.cfg.rid
    }

    /// Counts a data phase on this resource until the guard is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.active
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Busy(self.clone())
    }

    /// Data phases on this resource now.
    pub fn active(&self) -> usize {
        self.active.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes the file system under the resource can still take, as an
    /// unprivileged writer sees it; `None` when it cannot tell.
    fn disk_free(&self) -> Option<u64> {
        let v = rustix::fs::statvfs(&self.data_dir).ok()?;
        Some(v.f_bavail.saturating_mul(v.f_frsize))
    }

    /// Bytes on disk in its data files.
    fn stored(&self) -> u64 {
        self.stored.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a data file's bytes in (`grow`) or out.
    fn count_stored(&self, bytes: u64, grow: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let f = |v: u64| {
            Some(if grow {
                v.saturating_add(bytes)
            } else {
                v.saturating_sub(bytes)
            })
        };
        let _ = self.stored.fetch_update(Relaxed, Relaxed, f);
    }
    fn hard_limit(&self) -> u64 {
        self.cfg.hard_size.map_or(self.cfg.size.0, |s| s.0)
    }
    fn soft_limit(&self) -> u64 {
        self.cfg.soft_size.map_or(self.cfg.size.0, |s| s.0)
    }
    /// The largest allocation of type `t` the depot's policy allows.
    fn alloc_limit(&self, t: AllocType) -> u64 {
        if t == AllocType::ByteArray {
            self.cfg.max_alloc_size.map_or(self.cfg.size.0, |s| s.0)
        } else {
            self.cfg.max_queue_size.0
        }
    }
    fn offers(&self, t: AllocType) -> bool {
        let name = match t {
            AllocType::ByteArray => TypeName::ByteArray,
            AllocType::Fifo => TypeName::Fifo,
            AllocType::Circular => TypeName::Circular,
            AllocType::Buffer => return false,
        };
        self.cfg.types.contains(&name)
    }
    fn data_path(&self, id: u64) -> PathBuf {
        self.data_dir
            .join(format!("{:02x}", id & 0xff))
            .join(format!("{id:016x}"))
    }
    /// A scratch path for staging an overlapping WRITE.
    pub fn temp_path(&self, tag: u64) -> PathBuf {
        self.tmp_dir.join(format!("stage-{tag:016x}"))
    }
}

/// Space in use on one resource (sum of allocation max sizes).
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Hard bytes.
    pub hard: u64,
    /// Soft bytes.
    pub soft: u64,
    /// Number of allocations.
    pub count: u64,
}

/// Mutable allocation attributes.
#[derive(Debug, Clone)]
struct AllocInfo {
    /// Persisted fields.
    rec: AllocRecord,
    /// Set once deleted; later commits are no-ops.
    deleted: bool,
}

/// The bytes a data file in state `d` holds on disk: its header, and a byte
/// array's committed length. A queue's ring is counted as promised until
/// the allocation goes (its bytes come and go).
fn on_disk(d: &DataState) -> u64 {
    match (d.exists, d.extent.capacity) {
        (false, _) => 0,
        (true, 0) => datafile::HEADER_BYTES.saturating_add(d.extent.len),
        (true, _) => datafile::HEADER_BYTES,
    }
}

/// Data-file state.
#[derive(Debug, Default)]
struct DataState {
    /// Whether the data file exists (it is created on the first write).
    exists: bool,
    /// The file while some request (or the [`OpenFiles`] cache) has it open.
    open: Weak<File>,
    /// Committed extent.
    extent: Extent,
}

/// The data files kept open after use, at most `cap`, oldest closed first.
/// An allocation's file is opened on demand and closed once neither a
/// request nor this cache holds it: descriptors stay bounded by the cache
/// and the requests in flight however many allocations the depot holds
/// (one open file per allocation ran a depot out of descriptors at a few
/// hundred, and a restart with 20,000 wedged it).
pub struct OpenFiles {
    cap: usize,
    kept: Mutex<VecDeque<Arc<File>>>,
}

impl OpenFiles {
    /// A cache of up to `cap` open files.
    pub fn new(cap: usize) -> Self {
        OpenFiles {
            cap,
            kept: Mutex::new(VecDeque::new()),
        }
    }

    /// A size for a process allowed `nofile` descriptors: a quarter of
    /// them, leaving the rest to connections, the database and requests.
    pub fn for_limit(nofile: u64) -> usize {
        usize::try_from(nofile / 4)
            .unwrap_or(usize::MAX)
            .clamp(8, 4096)
    }

    fn keep(&self, f: &Arc<File>) {
        let mut k = lock(&self.kept);
        k.push_back(f.clone());
        if k.len() > self.cap {
            k.pop_front();
        }
    }

    fn forget(&self, f: &Arc<File>) {
        lock(&self.kept).retain(|k| !Arc::ptr_eq(k, f));
    }
}

/// One allocation.
pub struct Alloc {
    /// Allocation id (also the typekey in its capabilities).
    pub id: u64,
    /// Its resource.
    pub res: Arc<Resource>,
    /// Type (fixed at creation).
    pub atype: AllocType,
    /// Attributes.
    info: Mutex<AllocInfo>,
    /// Data file and committed extent.
    data: Mutex<DataState>,
    /// Whose turn it is to change data ([`Writer`]): data phases (STORE,
    /// WRITE, queue LOADs that consume) and the digest checks of LOADs from
    /// checksummed allocations.
    writer: Arc<tokio::sync::Mutex<()>>,
    /// Per-block digests kept on disk (ALLOCATE_CHKSUM byte arrays).
    pub disk_chksum: Option<NetChksum>,
    sync: bool,
    files: Arc<OpenFiles>,
}

impl Alloc {
    fn type_num(&self) -> u32 {
        u32::try_from(self.atype.number()).expect("type numbers are small")
    }

    /// Maximum size now.
    pub fn max_size(&self) -> u64 {
        lock(&self.info).rec.max_size
    }

    /// Whether this is a queue type.
    pub fn is_queue(&self) -> bool {
        matches!(self.atype, AllocType::Fifo | AllocType::Circular)
    }

    /// The committed extent.
    pub fn extent(&self) -> Extent {
        lock(&self.data).extent
    }

    /// The committed extent and the data file, opened if it is not (`None`
    /// when no byte was ever written). Blocking when it opens the file.
    pub fn snapshot(&self) -> Result<(Option<Arc<File>>, Extent)> {
        let mut d = lock(&self.data);
        let file = if d.exists {
            Some(self.open_file(&mut d)?)
        } else {
            None
        };
        Ok((file, d.extent))
    }

    /// Removes the data file of a deleted allocation, closing the cache's
    /// descriptor too: an unlinked file keeps its disk space while open.
    fn remove_data(&self) {
        let open = {
            let mut d = lock(&self.data);
            self.res.count_stored(on_disk(&d), false);
            d.exists = false;
            d.open.upgrade()
        };
        if let Some(f) = open {
            self.files.forget(&f);
        }
        let path = self.res.data_path(self.id);
        if self.disk_chksum.is_some() {
            let _ = std::fs::remove_file(digests::path_for(&path));
        }
        let _ = std::fs::remove_file(path);
    }

    /// The allocation's digests, to read, if it keeps them: a fresh
    /// allocation, whose first write has not committed, has an empty set
    /// (its file is made by that commit, never by a reader). Blocking.
    fn digests(&self) -> Result<Option<Digests>> {
        let Some(cs) = self.disk_chksum else {
            return Ok(None);
        };
        Digests::open_existing(&self.res.data_path(self.id), cs)
            .map(|d| Some(d.unwrap_or_else(|| Digests::empty(cs))))
            .map_err(StoreError::Read)
    }

    /// The digests to bring up to date at a commit, created if need be —
    /// under the info lock, as deletion is, so a commit that raced a DECR
    /// to zero or an expiry leaves no digest file behind (`None`: the
    /// allocation is gone, or keeps no digests). Blocking.
    fn digests_for_commit(&self) -> Result<Option<Digests>> {
        let Some(cs) = self.disk_chksum else {
            return Ok(None);
        };
        let info = lock(&self.info);
        if info.deleted {
            return Ok(None);
        }
        let d = Digests::open(&self.res.data_path(self.id), cs).map_err(StoreError::Write)?;
        drop(info);
        Ok(Some(d))
    }

    /// The open data file, reopened if nothing holds it open.
    fn open_file(&self, d: &mut DataState) -> Result<Arc<File>> {
        if let Some(f) = d.open.upgrade() {
            return Ok(f);
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.res.data_path(self.id))
            .map(Arc::new)
            .map_err(StoreError::Read)?;
        d.open = Arc::downgrade(&f);
        self.files.keep(&f);
        Ok(f)
    }

    /// The data file, created on first use (lazy allocation, as the reference
    /// depot does by default). Blocking.
    fn file_for_write(&self) -> Result<Arc<File>> {
        // Under the info lock, as deletion is: a data phase that raced a
        // DECR or expiry must not create a file nobody will remove.
        let info = lock(&self.info);
        if info.deleted {
            return Err(StoreError::NotFound);
        }
        let mut d = lock(&self.data);
        if d.exists {
            return self.open_file(&mut d);
        }
        let capacity = if self.is_queue() {
            info.rec.max_size
        } else {
            0
        };
        let f = datafile::create(
            &self.res.data_path(self.id),
            self.type_num(),
            capacity,
            self.sync,
        )
        .map_err(StoreError::Write)?;
        let f = Arc::new(f);
        d.exists = true;
        d.open = Arc::downgrade(&f);
        self.files.keep(&f);
        d.extent = Extent {
            head: 0,
            len: 0,
            capacity,
        };
        self.res.count_stored(on_disk(&d), true);
        Ok(f)
    }

    /// Makes `extent` the committed state (header write, fsync per policy).
    /// Blocking; call on the writer's turn.
    fn commit(&self, file: &File, extent: Extent) -> Result<()> {
        if lock(&self.info).deleted {
            return Ok(());
        }
        datafile::commit(file, self.type_num(), extent, self.sync).map_err(StoreError::Write)?;
        let mut d = lock(&self.data);
        let before = on_disk(&d);
        d.extent = extent;
        let after = on_disk(&d);
        self.res
            .count_stored(before.abs_diff(after), after > before);
        Ok(())
    }

    /// Commits a byte-array write of `[start, end)`: the committed length
    /// becomes the high-water mark, after the digests (if kept) are brought
    /// up to date. Blocking; call on the writer's turn.
    fn commit_written(&self, file: &File, start: u64, end: u64) -> Result<()> {
        let ext = self.extent();
        let len = ext.len.max(end);
        if let Some(d) = self.digests_for_commit()? {
            d.update(file, (start, end), ext.len, len, self.sync)
                .map_err(StoreError::Write)?;
        }
        self.commit(file, Extent { len, ..ext })
    }

    /// Cuts the file back to the committed extent after a failed data phase.
    fn rollback(&self, file: &File) {
        let e = lock(&self.data).extent;
        if e.capacity == 0 {
            let _ = file.set_len(datafile::HEADER_BYTES + e.len);
        }
    }

    #[cfg(test)]
    fn data_file_for_test(&self) -> Arc<File> {
        self.snapshot().unwrap().0.expect("data file")
    }

    /// Probe result.
    pub fn probe(&self) -> ProbeInfo {
        self.probe_window(Window::WHOLE)
    }

    /// Probe result as seen through `w`: sizes are cut to the window and
    /// counted from its start, as the ACCRE depot reports them to an alias.
    pub fn probe_window(&self, w: Window) -> ProbeInfo {
        let info = lock(&self.info);
        let ext = lock(&self.data).extent;
        let max = info.rec.max_size;
        let wlen = w.end().min(max).saturating_sub(w.offset);
        ProbeInfo {
            read_refs: i64::from(info.rec.read_refs),
            write_refs: i64::from(info.rec.write_refs),
            size: ext.len.saturating_sub(w.offset).min(wlen),
            max_size: wlen,
            seconds_left: i64::try_from(info.rec.expires_at.saturating_sub(unix_now()))
                .unwrap_or(i64::MAX),
            reliability: info.rec.reliability.number(),
            alloc_type: self.atype.number(),
        }
    }
}

/// What the state keeps per allocation, so accounting never needs an
/// allocation's own lock (which would invert the lock order).
struct Entry {
    alloc: Arc<Alloc>,
    reliability: Reliability,
    max_size: u64,
    expires_at: u64,
    key_hashes: [[u8; 32]; 3],
}

#[derive(Default)]
struct State {
    allocs: HashMap<u64, Entry>,
    /// Every key hash, of allocations and aliases (the ids do not collide).
    keys: HashMap<[u8; 32], (u64, CapKind)>,
    expiry: BTreeSet<(u64, u64)>,
    usage: Vec<Usage>,
    aliases: HashMap<u64, AliasRecord>,
    alias_expiry: BTreeSet<(u64, u64)>,
    aliases_of: HashMap<u64, BTreeSet<u64>>,
}

impl State {
    fn insert(&mut self, a: Arc<Alloc>, rec: &AllocRecord) {
        for (kind, h) in CapKind::ALL.iter().zip(rec.key_hashes.iter()) {
            self.keys.insert(*h, (a.id, *kind));
        }
        self.expiry.insert((rec.expires_at, a.id));
        self.usage[a.res.idx].add(rec.reliability, rec.max_size);
        self.allocs.insert(
            a.id,
            Entry {
                alloc: a,
                reliability: rec.reliability,
                max_size: rec.max_size,
                expires_at: rec.expires_at,
                key_hashes: rec.key_hashes,
            },
        );
    }

    /// A fresh id, used by neither an allocation nor an alias.
    fn fresh_id(&self) -> Result<u64> {
        loop {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b)
                .map_err(|e| StoreError::Write(std::io::Error::other(e.to_string())))?;
            let id = u64::from_le_bytes(b);
            if id != 0 && !self.allocs.contains_key(&id) && !self.aliases.contains_key(&id) {
                return Ok(id);
            }
        }
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Alloc>> {
        let e = self.allocs.remove(&id)?;
        for h in &e.key_hashes {
            self.keys.remove(h);
        }
        self.expiry.remove(&(e.expires_at, id));
        self.usage[e.alloc.res.idx].remove(e.reliability, e.max_size);
        Some(e.alloc)
    }
}

/// Generates three keys at once.
fn new_keys() -> Result<[Key; 3]> {
    match [Key::generate(), Key::generate(), Key::generate()] {
        [Ok(r), Ok(w), Ok(m)] => Ok([r, w, m]),
        _ => Err(StoreError::Write(std::io::Error::other(
            "OS random source failed",
        ))),
    }
}

/// What no resource could grant, refused before any is looked at.
fn check_request(req: &AllocRequest) -> Result<()> {
    if req.size == 0 {
        return Err(StoreError::Invalid("size 0"));
    }
    if req.lease == Lease::Secs(0) {
        return Err(StoreError::Invalid("duration"));
    }
    if req.atype == AllocType::Buffer {
        return Err(StoreError::TypeNotSupported);
    }
    if let Some(cs) = &req.disk_chksum {
        // Digests are per block of a byte array (the ACCRE depot serves
        // nothing else); a block is read whole to check it.
        if req.atype != AllocType::ByteArray {
            return Err(StoreError::TypeNotSupported);
        }
        if cs.block_size > MAX_DISK_CHKSUM_BLOCK || !digests::overhead_fits(*cs, req.size) {
            return Err(StoreError::ChksumBlockSize);
        }
    }
    Ok(())
}

/// How long an allocation or alias is leased for: the request's own type.
pub use lors_ibp::proto::Lease;

/// Which reference count INCR/DECR changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefCount {
    /// The read count.
    Read,
    /// The write count.
    Write,
}

/// MANAGE CHNG: what to change; `None` keeps the attribute.
#[derive(Debug, Clone, Copy, Default)]
pub struct Change {
    /// The new maximum size.
    pub max_size: Option<u64>,
    /// The new lease, from now.
    pub lease: Option<Lease>,
    /// The new reliability.
    pub reliability: Option<Reliability>,
}

/// What ALLOCATE asks for.
#[derive(Debug, Clone)]
pub struct AllocRequest {
    /// Resource id; `None` or `"0"` lets the depot choose.
    pub rid: Option<String>,
    /// Soft or hard.
    pub reliability: Reliability,
    /// Type.
    pub atype: AllocType,
    /// How long the allocation lives.
    pub lease: Lease,
    /// Max size in bytes.
    pub size: u64,
    /// Per-block digests to keep on disk (ALLOCATE_CHKSUM), if any.
    pub disk_chksum: Option<NetChksum>,
}

/// A new allocation's identity and keys.
#[derive(Debug)]
pub struct NewAlloc {
    /// Allocation id.
    pub id: u64,
    /// Resource id it landed on.
    pub rid: String,
    /// Read, write, manage keys.
    pub keys: [Key; 3],
    /// Soft allocations revoked to make room.
    pub revoked: usize,
}

/// A per-resource status summary.
#[derive(Debug, Clone)]
pub struct ResourceStatus {
    /// Resource id.
    pub rid: String,
    /// Configured total bytes.
    pub total: u64,
    /// Configured hard cap.
    pub hard_total: u64,
    /// Configured soft cap.
    pub soft_total: u64,
    /// Usage now.
    pub usage: Usage,
    /// Max duration in seconds.
    pub max_duration: u64,
    /// What its file system can still take on top of every promise made
    /// (see [`ResourceStatus::free`]).
    pub disk_room: u64,
    /// It takes no new allocation until its disk has room again (a
    /// metadata write met a full disk).
    pub degraded: bool,
}

impl Usage {
    /// Hard and soft bytes together.
    pub fn used(&self) -> u64 {
        self.hard.saturating_add(self.soft)
    }

    fn class(&mut self, rel: Reliability) -> &mut u64 {
        match rel {
            Reliability::Hard => &mut self.hard,
            Reliability::Soft => &mut self.soft,
        }
    }

    /// Counts an allocation in, with its [`ALLOC_CHARGE`]. Saturating, not
    /// wrapping: records loaded from disk may add up to more than a
    /// resource whose size was since configured smaller.
    fn add(&mut self, rel: Reliability, size: u64) {
        let c = self.class(rel);
        *c = c.saturating_add(charged(size));
        self.count += 1;
    }

    /// Counts an allocation out.
    fn remove(&mut self, rel: Reliability, size: u64) {
        let c = self.class(rel);
        *c = c.saturating_sub(charged(size));
        self.count = self.count.saturating_sub(1);
    }
}

impl ResourceStatus {
    /// Bytes still allocatable of any kind: the resource's own room, or
    /// what its file system can really take if that is less (0 while
    /// degraded).
    pub fn free(&self) -> u64 {
        if self.degraded {
            return 0;
        }
        self.total
            .saturating_sub(self.usage.used())
            .min(self.disk_room)
    }
    /// Bytes still allocatable as hard storage.
    pub fn hard_free(&self) -> u64 {
        self.hard_total
            .saturating_sub(self.usage.hard)
            .min(self.free())
    }
}

/// All resources of one depot.
pub struct Store {
    resources: Vec<Arc<Resource>>,
    state: Mutex<State>,
    sync: bool,
    damaged: usize,
    strict: bool,
    /// Most allocations the depot holds at once.
    max_allocations: usize,
    files: Arc<OpenFiles>,
}

impl Store {
    /// Opens (creating as needed) every configured resource and loads its
    /// allocations. Blocking.
    pub fn open(cfg: &Config) -> Result<Store> {
        let sync = cfg.sync == SyncPolicy::Always;
        let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1 << 20);
        let files = Arc::new(OpenFiles::new(OpenFiles::for_limit(nofile)));
        let mut resources = Vec::new();
        let mut damaged = 0;
        let mut state = State {
            usage: vec![Usage::default(); cfg.resources.len()],
            ..State::default()
        };
        for (idx, rc) in cfg.resources.iter().enumerate() {
            let data_dir = rc.path.join("data");
            let tmp_dir = rc.path.join("tmp");
            std::fs::create_dir_all(&data_dir).map_err(StoreError::Write)?;
            // Staged writes left by a crash were never acknowledged.
            let _ = std::fs::remove_dir_all(&tmp_dir);
            std::fs::create_dir_all(&tmp_dir).map_err(StoreError::Write)?;
            let fs = rustix::fs::statvfs(&data_dir).map_err(|e| StoreError::Write(e.into()))?;
            let reserve = meta::reserve_for(fs.f_blocks.saturating_mul(fs.f_frsize));
            let db = MetaDb::open(&rc.path.join("meta.redb"), reserve)?;
            if db.degraded() {
                tracing::warn!(rid = %rc.rid, "the disk has no room for the metadata reserve: no new allocations until it has");
            }
            let dev = rustix::fs::stat(&data_dir)
                .map_err(|e| StoreError::Write(e.into()))?
                .st_dev;
            let res = Arc::new(Resource {
                idx,
                cfg: rc.clone(),
                db,
                data_dir,
                tmp_dir,
                active: Default::default(),
                stored: Default::default(),
                dev,
                headroom: reserve,
            });
            let (records, bad) = res.db.load_all()?;
            let mut reclaim = Vec::new();
            for id in bad {
                tracing::error!(rid = %rc.rid, id, "reclaiming an undecodable allocation record");
                reclaim.push(id);
            }
            for (id, rec) in records {
                let (exists, extent) = match load_data(&res, id, &rec) {
                    Ok(x) => x,
                    Err(why) => {
                        // Damaged from outside the depot: the allocation can
                        // no longer keep its promise. Report it, keep the
                        // bytes for the operator, and give the space back,
                        // so clients see "not found" rather than an
                        // allocation that takes no STORE.
                        let kept = quarantine(&res, id);
                        tracing::error!(
                            rid = %rc.rid, id, error = %why, kept_at = ?kept,
                            "allocation data file is damaged; allocation reclaimed"
                        );
                        reclaim.push(id);
                        damaged += 1;
                        continue;
                    }
                };
                let a = Arc::new(Alloc {
                    id,
                    res: res.clone(),
                    atype: rec.atype,
                    info: Mutex::new(AllocInfo {
                        rec: rec.clone(),
                        deleted: false,
                    }),
                    data: Mutex::new({
                        let d = DataState {
                            exists,
                            open: Weak::new(),
                            extent,
                        };
                        res.count_stored(on_disk(&d), true);
                        d
                    }),
                    writer: Arc::default(),
                    disk_chksum: rec.disk_chksum,
                    sync,
                    files: files.clone(),
                });
                state.insert(a, &rec);
            }
            if !reclaim.is_empty() {
                res.db.apply(&[], &reclaim)?;
            }
            let (aliases, mut stale) = res.db.load_aliases()?;
            for (id, rec) in aliases {
                // An alias outlives its allocation only across a crash
                // between the two deletions.
                let master_here = state
                    .allocs
                    .get(&rec.master)
                    .is_some_and(|e| e.alloc.res.idx == idx);
                if master_here {
                    state.insert_alias(id, rec);
                } else {
                    stale.push(id);
                }
            }
            alias::forget_aliases(&res, &stale);
            remove_orphans(&res, &state.allocs);
            resources.push(res);
        }
        Ok(Store {
            resources,
            state: Mutex::new(state),
            sync,
            damaged,
            strict: cfg.strict,
            max_allocations: cfg.max_allocations,
            files,
        })
    }

    /// Allocations found damaged (and reclaimed) when the store opened.
    pub fn damaged_on_open(&self) -> usize {
        self.damaged
    }

    /// Whether acknowledged data is fsynced.
    pub fn syncs(&self) -> bool {
        self.sync
    }

    /// The resources, in configuration order.
    pub fn resources(&self) -> &[Arc<Resource>] {
        &self.resources
    }

    /// Looks up a resource by id.
    pub fn resource(&self, rid: &str) -> Option<&Arc<Resource>> {
        self.resources.iter().find(|r| r.rid() == rid)
    }

    /// Status of every resource.
    pub fn status(&self) -> Vec<ResourceStatus> {
        let st = lock(&self.state);
        self.resources
            .iter()
            .map(|r| ResourceStatus {
                rid: r.rid().to_owned(),
                total: r.cfg.size.0,
                hard_total: r.hard_limit(),
                soft_total: r.soft_limit(),
                usage: st.usage[r.idx],
                max_duration: r.cfg.max_duration.0.as_secs(),
                disk_room: self.disk_room(&st, r),
                degraded: r.db.degraded(),
            })
            .collect()
    }

    /// Recomputes every resource's usage from its live allocations and
    /// compares it with the running totals the space checks use. `Err` says
    /// where they differ: a bug in the accounting, never a client's doing.
    /// (For tests and fuzzing; it walks every allocation under the lock.)
    pub fn check_accounting(&self) -> Result<(), String> {
        let mut sums = vec![Usage::default(); self.resources.len()];
        let entries: Vec<(Arc<Alloc>, u64, Reliability)> = {
            let st = lock(&self.state);
            st.check_aliases()?;
            for e in st.allocs.values() {
                sums[e.alloc.res.idx].add(e.reliability, e.max_size);
            }
            for (r, (have, want)) in self.resources.iter().zip(st.usage.iter().zip(&sums)) {
                if (have.hard, have.soft, have.count) != (want.hard, want.soft, want.count) {
                    return Err(format!(
                        "resource {}: usage {have:?}, allocations add up to {want:?}",
                        r.rid()
                    ));
                }
            }
            st.allocs
                .values()
                .map(|e| (e.alloc.clone(), e.max_size, e.reliability))
                .collect()
        };
        // Outside the state lock (lock order): each record against its entry.
        for (a, max_size, rel) in entries {
            let rec = lock(&a.info).rec.clone();
            if (rec.max_size, rec.reliability) != (max_size, rel) {
                return Err(format!(
                    "allocation {} accounted as {max_size} bytes ({rel:?}), its record says {} ({:?})",
                    a.id, rec.max_size, rec.reliability
                ));
            }
            let len = a.extent().len;
            if len > max_size {
                return Err(format!(
                    "allocation {} holds {len} bytes, over its max size {max_size}",
                    a.id
                ));
            }
        }
        Ok(())
    }

    /// Number of live allocations.
    pub fn allocation_count(&self) -> usize {
        lock(&self.state).allocs.len()
    }

    /// Finds the live allocation an allocation's own key names. `want` is
    /// the capability kind the command needs; `None` accepts any (PROBE, as
    /// LoCI did). An alias's key is refused with [`StoreError::InvalidCmd`]:
    /// commands that reach through aliases use [`Store::lookup_view`].
    pub fn lookup(&self, token: &KeyToken, want: Option<CapKind>) -> Result<Arc<Alloc>> {
        match self.resolve(token, want)? {
            (a, None) => Ok(a),
            (_, Some(_)) => Err(StoreError::InvalidCmd),
        }
    }

    /// Finds the live allocation a key names, and the window of it the key
    /// reaches: all of it for the allocation's keys, the alias's window for
    /// an alias's keys (whose lease must not have run out either).
    pub fn lookup_view(
        &self,
        token: &KeyToken,
        want: Option<CapKind>,
    ) -> Result<(Arc<Alloc>, Window)> {
        let (a, window) = self.resolve(token, want)?;
        Ok((a, window.unwrap_or(Window::WHOLE)))
    }

    /// The allocation a key reaches, and the window if the key is an alias's.
    fn resolve(
        &self,
        token: &KeyToken,
        want: Option<CapKind>,
    ) -> Result<(Arc<Alloc>, Option<Window>)> {
        if let Some(rid) = &token.rid
            && self.resource(rid).is_none()
        {
            return Err(StoreError::InvalidRid);
        }
        let h = key_hash(&token.key);
        let now = unix_now();
        let st = lock(&self.state);
        let (id, kind) = *st.keys.get(&h).ok_or(StoreError::NotFound)?;
        if want.is_some_and(|w| w != kind) {
            return Err(StoreError::NotFound);
        }
        let (master, window) = match st.aliases.get(&id) {
            Some(al) if al.expires_at <= now => return Err(StoreError::NotFound),
            Some(al) => (
                al.master,
                Some(Window {
                    offset: al.offset,
                    length: al.length,
                }),
            ),
            None => (id, None),
        };
        let a = st
            .allocs
            .get(&master)
            .ok_or(StoreError::NotFound)?
            .alloc
            .clone();
        drop(st);
        if token.rid.as_deref().is_some_and(|r| r != a.res.rid()) {
            return Err(StoreError::NotFound);
        }
        if lock(&a.info).rec.expires_at <= now {
            return Err(StoreError::NotFound);
        }
        Ok((a, window))
    }

    /// ALLOCATE. Blocking (one metadata transaction).
    pub fn allocate(&self, req: &AllocRequest) -> Result<NewAlloc> {
        check_request(req)?;
        self.maintain();
        let now = unix_now();
        let keys = new_keys()?;
        let key_hashes = [key_hash(&keys[0]), key_hash(&keys[1]), key_hash(&keys[2])];

        let mut st = lock(&self.state);
        if st.allocs.len() >= self.max_allocations {
            return Err(StoreError::Policy(
                "the depot holds as many allocations as it is configured for",
            ));
        }
        let Plan { res, revoke, .. } = self.choose(&st, req)?;
        let res = res.clone();
        let dur = match req.lease {
            Lease::Longest => res.cfg.max_duration.0.as_secs(),
            Lease::Secs(n) => n,
        };
        let id = st.fresh_id()?;
        let rec = AllocRecord {
            atype: req.atype,
            reliability: req.reliability,
            max_size: req.size,
            expires_at: now.saturating_add(dur),
            created_at: now,
            read_refs: 1,
            write_refs: 0,
            key_hashes,
            disk_chksum: req.disk_chksum,
        };
        let alloc = Arc::new(Alloc {
            id,
            res: res.clone(),
            atype: req.atype,
            info: Mutex::new(AllocInfo {
                rec: rec.clone(),
                deleted: false,
            }),
            data: Mutex::new(DataState::default()),
            writer: Arc::default(),
            disk_chksum: req.disk_chksum,
            sync: self.sync,
            files: self.files.clone(),
        });
        // Reserve now so concurrent ALLOCATEs see the space as taken; nobody
        // can use the allocation before we reply with its keys. What it
        // revokes goes once the records say so: a failed write changes
        // nothing.
        st.insert(alloc.clone(), &rec);
        drop(st);
        let revoke_ids: Vec<u64> = revoke.iter().map(|a| a.id).collect();
        if let Err(e) = res.db.apply(&[(id, rec.clone())], &revoke_ids) {
            lock(&self.state).remove(id);
            return Err(e.into());
        }
        for a in &revoke {
            lock(&a.info).deleted = true;
        }
        let mut revoked_ids = Vec::new();
        let mut revoked_aliases = Vec::new();
        {
            let mut st = lock(&self.state);
            for a in &revoke {
                if st.remove(a.id).is_some() {
                    revoked_ids.push(a.id);
                    revoked_aliases.extend(st.drop_aliases_of(a.id));
                }
            }
        }
        alias::forget_aliases(&res, &revoked_aliases);
        for a in &revoke {
            tracing::info!(rid = %a.res.rid(), id = a.id, "revoked soft allocation to make room");
            a.remove_data();
        }
        Ok(NewAlloc {
            id,
            rid: res.rid().to_owned(),
            keys,
            revoked: revoked_ids.len(),
        })
    }

    /// What the file system under `r` can still promise: its free space
    /// (`statvfs`) less every byte promised to allocations on it (of every
    /// resource it holds) and not yet written, less the metadata headroom.
    /// `u64::MAX` when the file system cannot tell.
    fn disk_room(&self, st: &State, r: &Resource) -> u64 {
        let Some(free) = r.disk_free() else {
            return u64::MAX;
        };
        let unwritten = (self.resources.iter())
            .filter(|g| g.dev == r.dev)
            .map(|g| st.usage[g.idx].used().saturating_sub(g.stored()))
            .fold(0u64, u64::saturating_add);
        free.saturating_sub(unwritten).saturating_sub(r.headroom)
    }

    /// Takes resources out of their disk-full state where space has
    /// returned (their metadata reserve made again). Blocking.
    pub fn maintain(&self) {
        for r in &self.resources {
            if r.db.degraded() && r.db.recover() {
                tracing::info!(rid = %r.rid(), "resource takes new allocations again");
            }
        }
    }

    /// The resource an ALLOCATE goes to: of those it may use (its RID's, or
    /// all for `0`) that offer its type and lease, have room for it and
    /// whose file system can hold it on top of everything promised (it
    /// may be shared or smaller than configured: `statvfs`), and whose
    /// metadata can be written, the one with the most room — the less of its own and its disk's —
    /// except that of those within two allocations of the most room, the
    /// one with the fewest data phases running goes first: bytes stay
    /// even across the disks, and an idle disk takes the next allocation
    /// before a busy one. Else the most telling reason none fits. A full
    /// resource is never chosen while another has room.
    fn choose<'s>(&'s self, st: &State, req: &AllocRequest) -> Result<Plan<'s>> {
        let candidates: Vec<&Arc<Resource>> = match req.rid.as_deref() {
            None | Some("0") => self.resources.iter().collect(),
            Some(rid) => vec![self.resource(rid).ok_or(StoreError::InvalidRid)?],
        };
        let mut err = StoreError::TypeNotSupported;
        let mut fit: Vec<Plan<'s>> = Vec::new();
        for r in candidates {
            if !r.offers(req.atype) {
                continue;
            }
            let max_dur = r.cfg.max_duration.0.as_secs();
            let dur = match req.lease {
                Lease::Longest => max_dur,
                Lease::Secs(n) => n,
            };
            if dur > max_dur {
                err = StoreError::LongDuration;
                continue;
            }
            if req.size > r.alloc_limit(req.atype) {
                err = StoreError::Policy("allocation larger than the depot allows");
                continue;
            }
            if r.db.degraded() {
                err = StoreError::NoSpace;
                continue;
            }
            let disk = self.disk_room(st, r);
            match plan_space(st, r, req.reliability, req.size) {
                Some((room, revoke)) if charged(req.size) <= disk => {
                    fit.push(Plan {
                        res: r,
                        // Resources on one file system see the same disk
                        // room: their own breaks the tie.
                        room: (room.min(disk - charged(req.size)), room),
                        revoke,
                    });
                }
                _ => err = StoreError::NoSpace,
            }
        }
        let most = fit.iter().map(|p| p.room).max().ok_or(err)?;
        let band = most.0.saturating_sub(req.size.saturating_mul(2));
        let pick = (fit.into_iter())
            .filter(|p| p.room.0 >= band)
            .min_by_key(|p| (p.res.active(), std::cmp::Reverse(p.room)));
        Ok(pick.expect("the resource with the most room is in its own band"))
    }

    /// Persists `a`'s record after `f` changes it; `f` returns whether to keep
    /// the allocation (false = both refcounts hit zero: delete it).
    fn update(
        &self,
        a: &Arc<Alloc>,
        f: impl FnOnce(&mut AllocRecord, &mut State) -> Result<bool>,
    ) -> Result<()> {
        let mut info = lock(&a.info);
        if info.deleted {
            return Err(StoreError::NotFound);
        }
        let old = info.rec.clone();
        let mut rec = old.clone();
        let mut st = lock(&self.state);
        let keep = f(&mut rec, &mut st)?;
        if keep {
            // Re-account with the new attributes.
            st.remove(a.id);
            st.insert(a.clone(), &rec);
            drop(st);
            if let Err(e) = a.res.db.apply(&[(a.id, rec.clone())], &[]) {
                let mut st = lock(&self.state);
                st.remove(a.id);
                st.insert(a.clone(), &old);
                return Err(e.into());
            }
            info.rec = rec;
        } else {
            // The reply tells what is durable: a deletion whose record
            // could not be removed leaves the allocation as it was.
            drop(st);
            a.res.db.apply(&[], &[a.id])?;
            info.deleted = true;
            let aliases = {
                let mut st = lock(&self.state);
                st.remove(a.id);
                st.drop_aliases_of(a.id)
            };
            alias::forget_aliases(&a.res, &aliases);
            a.remove_data();
        }
        Ok(())
    }

    /// MANAGE INCR/DECR; the allocation goes when both counts reach zero.
    /// Blocking.
    pub fn change_refcount(&self, a: &Arc<Alloc>, which: RefCount, up: bool) -> Result<()> {
        self.update(a, |rec, _| {
            Ok(bump_count(
                &mut rec.read_refs,
                &mut rec.write_refs,
                which,
                up,
            ))
        })
    }

    /// MANAGE CHNG, on the allocation's turn to change data (a data phase
    /// in flight was checked against the old max size). Blocking.
    pub fn change(&self, w: &Writer, c: Change) -> Result<()> {
        let a = w.alloc();
        let len = a.extent().len;
        let res = a.res.clone();
        let queue = a.is_queue();
        let strict = self.strict;
        self.update(a, |rec, st| {
            if c.lease == Some(Lease::Secs(0)) {
                return Err(StoreError::Invalid("duration 0"));
            }
            let new_size = c.max_size.unwrap_or(rec.max_size);
            if strict && new_size < rec.max_size {
                return Err(StoreError::WouldDamage);
            }
            let new_rel = c.reliability.unwrap_or(rec.reliability);
            if new_size < len {
                return Err(StoreError::WouldDamage);
            }
            if queue && new_size != rec.max_size {
                return Err(StoreError::InvalidCmd);
            }
            let max_dur = res.cfg.max_duration.0.as_secs();
            match c.lease {
                None => {}
                Some(Lease::Secs(n)) if n > max_dur => {
                    return Err(StoreError::Policy("duration beyond the resource maximum"));
                }
                Some(Lease::Secs(n)) => rec.expires_at = unix_now().saturating_add(n),
                Some(Lease::Longest) => rec.expires_at = unix_now().saturating_add(max_dur),
            }
            check_resize(st, &res, rec, new_size, new_rel)?;
            rec.max_size = new_size;
            rec.reliability = new_rel;
            Ok(true)
        })
    }

    /// MANAGE TRUNCATE: the new max size; data beyond it is cut, on the
    /// allocation's turn to change data. Blocking.
    pub fn truncate(&self, w: &Writer, size: u64) -> Result<()> {
        let a = w.alloc();
        if a.is_queue() {
            return Err(StoreError::InvalidCmd);
        }
        if size == 0 {
            return Err(StoreError::Invalid("size 0"));
        }
        {
            // Growth passes the checks ALLOCATE and CHNG make, under the same
            // lock as the accounting it changes; shrinking always fits.
            let info = lock(&a.info);
            let st = lock(&self.state);
            check_resize(&st, &a.res, &info.rec, size, info.rec.reliability)?;
        }
        let (file, ext) = a.snapshot()?;
        if let Some(f) = &file
            && ext.len > size
        {
            let digests = a.digests_for_commit()?;
            if let Some(d) = &digests {
                // The new last block's digest, before the cut commits.
                d.update(f, (size, size), ext.len, size, self.sync)
                    .map_err(StoreError::Write)?;
            }
            a.commit(f, Extent { len: size, ..ext })?;
            f.set_len(datafile::HEADER_BYTES + size)
                .map_err(StoreError::Write)?;
            if let Some(d) = &digests {
                d.cut(size).map_err(StoreError::Write)?;
            }
        }
        let res = a.res.clone();
        self.update(a, |rec, st| {
            check_resize(st, &res, rec, size, rec.reliability)?;
            rec.max_size = size;
            Ok(true)
        })
    }

    /// Deletes every allocation and alias whose lease has run out. Blocking;
    /// returns how many allocations went.
    pub fn reap_expired(&self, now: u64) -> usize {
        self.reap_aliases(now);
        let expired: Vec<Arc<Alloc>> = {
            let st = lock(&self.state);
            st.expiry
                .range(..=(now, u64::MAX))
                .filter_map(|(_, id)| st.allocs.get(id).map(|e| e.alloc.clone()))
                .collect()
        };
        let mut n = 0;
        for a in expired {
            let res = self.update(&a, |rec, _| {
                // Re-check under the lock: a CHNG may have extended it.
                Ok(rec.expires_at > now)
            });
            match res {
                Ok(()) if lock(&a.info).deleted => n += 1,
                Ok(()) | Err(StoreError::NotFound) => {}
                Err(e) => {
                    tracing::warn!(id = a.id, error = %e, "could not delete expired allocation")
                }
            }
        }
        n
    }

    /// When the next allocation or alias expires, if any.
    pub fn next_expiry(&self) -> Option<u64> {
        let st = lock(&self.state);
        let first = |s: &BTreeSet<(u64, u64)>| s.first().map(|(t, _)| *t);
        match (first(&st.expiry), first(&st.alias_expiry)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// INCR/DECR of the read or write count, saturating; whether either count
/// is still above zero (else the holder goes).
fn bump_count(read: &mut u32, write: &mut u32, which: RefCount, up: bool) -> bool {
    let c = match which {
        RefCount::Read => &mut *read,
        RefCount::Write => &mut *write,
    };
    *c = if up {
        c.saturating_add(1)
    } else {
        c.saturating_sub(1)
    };
    *read > 0 || *write > 0
}

/// Where an ALLOCATE would go: the resource, the room left after it, and the
/// soft allocations it would revoke.
struct Plan<'a> {
    res: &'a Arc<Resource>,
    /// Its room after the allocation: the less of its own and its disk's,
    /// then its own.
    room: (u64, u64),
    revoke: Vec<Arc<Alloc>>,
}

/// What every allocation costs beyond its size, counted against the quota:
/// its data file's header and its records. Without it a client could hold
/// 100,000 one-byte allocations on 100,000 bytes of quota — 23 MiB of
/// metadata, 100 MiB of memory and 400 MiB of headers on disk.
pub const ALLOC_CHARGE: u64 = datafile::HEADER_BYTES;

/// The bytes of quota a `size`-byte allocation takes.
fn charged(size: u64) -> u64 {
    size.saturating_add(ALLOC_CHARGE)
}

/// The room left on `r` after adding `size` bytes of `rel` storage to the
/// usage `u`, or `None` if that breaks the resource's total or its cap for
/// `rel`. Every sum is checked: a size from the wire can be anything up to
/// `u64::MAX`, and a wrapped sum would read as free space.
fn room_after(u: Usage, r: &Resource, rel: Reliability, size: u64) -> Option<u64> {
    let (class, cap) = match rel {
        Reliability::Hard => (u.hard, r.hard_limit()),
        Reliability::Soft => (u.soft, r.soft_limit()),
    };
    let size = size.checked_add(ALLOC_CHARGE)?;
    let used = u.hard.checked_add(u.soft)?.checked_add(size)?;
    let total = r.cfg.size.0;
    (class.checked_add(size)? <= cap && used <= total).then(|| total - used)
}

/// Checks that allocation `rec` on `res` may become `new_size` bytes of
/// `new_rel` storage (CHNG, TRUNCATE): the policy and space checks ALLOCATE
/// makes, against the usage without the allocation's own share. Shrinking
/// with the same reliability always passes.
fn check_resize(
    st: &State,
    res: &Resource,
    rec: &AllocRecord,
    new_size: u64,
    new_rel: Reliability,
) -> Result<()> {
    if new_size <= rec.max_size && new_rel == rec.reliability {
        return Ok(());
    }
    if let Some(cs) = rec.disk_chksum
        && new_size > rec.max_size
        && !digests::overhead_fits(cs, new_size)
    {
        // Growing must not take the digests past their bound either.
        return Err(StoreError::ChksumBlockSize);
    }
    if new_size > rec.max_size && new_size > res.alloc_limit(rec.atype) {
        return Err(StoreError::Policy(
            "allocation larger than the depot allows",
        ));
    }
    let mut others = st.usage[res.idx];
    others.remove(rec.reliability, rec.max_size);
    room_after(others, res, new_rel, new_size)
        .map(|_| ())
        .ok_or(StoreError::NoSpace)
}

/// Decides whether `size` bytes of `rel` storage fit on `r`, possibly by
/// revoking soft allocations (soonest-expiring first) for a hard request.
/// Returns the room left afterwards and what to revoke.
fn plan_space(
    st: &State,
    r: &Arc<Resource>,
    rel: Reliability,
    size: u64,
) -> Option<(u64, Vec<Arc<Alloc>>)> {
    let u = st.usage[r.idx];
    if let Some(room) = room_after(u, r, rel, size) {
        return Some((room, Vec::new()));
    }
    if rel == Reliability::Soft {
        return None;
    }
    // A hard request may revoke soft allocations, if without them it fits.
    let mut left = u;
    let mut revoke = Vec::new();
    room_after(Usage { soft: 0, ..u }, r, rel, size)?;
    for (_, id) in &st.expiry {
        let Some(e) = st.allocs.get(id) else { continue };
        if e.alloc.res.idx != r.idx || e.reliability != Reliability::Soft {
            continue;
        }
        left.soft = left.soft.saturating_sub(charged(e.max_size));
        revoke.push(e.alloc.clone());
        if let Some(room) = room_after(left, r, rel, size) {
            return Some((room, revoke));
        }
    }
    None
}

/// Checks allocation `id`'s data file, if it has one, against its record;
/// whether it has one, and its extent. The file is closed again: a restart
/// with millions of allocations opens one at a time.
fn load_data(res: &Resource, id: u64, rec: &AllocRecord) -> Result<(bool, Extent), String> {
    let (f, e) = match datafile::open(&res.data_path(id)) {
        Ok(datafile::Opened::File {
            file,
            extent,
            type_num,
        }) => {
            if i64::from(type_num) != rec.atype.number() {
                return Err(format!(
                    "data file holds type {type_num}, the record says {}",
                    rec.atype.number()
                ));
            }
            (file, extent)
        }
        Ok(datafile::Opened::Unwritten) => return Ok((false, Extent::default())),
        Err(datafile::DataFileError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
            return Ok((false, Extent::default()));
        }
        Err(e) => return Err(e.to_string()),
    };
    let queue = matches!(rec.atype, AllocType::Fifo | AllocType::Circular);
    // Queue sizes never change after ALLOCATE and byte arrays never hold more
    // than their max size (TRUNCATE cuts the data before the record).
    let fits = if queue {
        e.capacity == rec.max_size
    } else {
        e.capacity == 0 && e.len <= rec.max_size
    };
    if !fits {
        return Err(format!(
            "data file extent {e:?} does not fit the record (type {}, max size {})",
            rec.atype.number(),
            rec.max_size
        ));
    }
    drop(f);
    Ok((true, e))
}

/// Moves a damaged data file aside (`<resource>/damaged/<id>`) for the
/// operator; returns where it went.
fn quarantine(res: &Resource, id: u64) -> Option<PathBuf> {
    let dir = res.data_dir.parent()?.join("damaged");
    std::fs::create_dir_all(&dir).ok()?;
    let to = dir.join(format!("{id:016x}-{}", unix_now()));
    std::fs::rename(res.data_path(id), &to).ok()?;
    Some(to)
}

/// Deletes data files with no metadata record: their allocation was deleted
/// and the crash came before the file went.
fn remove_orphans(res: &Resource, allocs: &HashMap<u64, Entry>) {
    let Ok(dirs) = std::fs::read_dir(&res.data_dir) else {
        return;
    };
    for d in dirs.flatten() {
        let Ok(files) = std::fs::read_dir(d.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name();
            // `<id>` is a data file, `<id>.cks` its digests.
            let stem = name.to_str().map(|n| n.strip_suffix(".cks").unwrap_or(n));
            let Some(id) = stem.and_then(|n| u64::from_str_radix(n, 16).ok()) else {
                continue;
            };
            if !allocs.contains_key(&id) {
                tracing::info!(rid = %res.rid(), id, "removing orphaned data file");
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::Ordering::Relaxed;

    const MIB: u64 = 1 << 20;

    fn config(dir: &std::path::Path) -> Config {
        let mut cfg = Config::default();
        let mut r = ResourceConfig::new("1", dir.to_path_buf());
        r.size = crate::config::ByteSize(100 * MIB);
        cfg.resources = vec![r];
        cfg.sync = SyncPolicy::Never;
        cfg
    }

    fn req(size: u64, reliability: Reliability) -> AllocRequest {
        AllocRequest {
            rid: None,
            reliability,
            atype: AllocType::ByteArray,
            lease: Lease::Secs(3600),
            size,
            disk_chksum: None,
        }
    }

    fn used(s: &Store) -> u64 {
        s.status()[0].usage.used()
    }

    /// Writes `data` at `offset` as a WRITE whose bytes all arrived.
    fn put(a: &Arc<Alloc>, offset: u64, data: &[u8]) -> Result<()> {
        let inc = a.writer_now().write(offset, data.len() as u64)?.start()?;
        let (f, pos) = inc.target();
        f.write_all_at(data, pos).unwrap();
        inc.commit()
    }

    fn alloc(s: &Store, size: u64) -> Arc<Alloc> {
        let id = s.allocate(&req(size, Reliability::Hard)).unwrap().id;
        lock(&s.state).allocs[&id].alloc.clone()
    }

    /// A deletion whose record cannot be removed (the disk is full) is
    /// refused and changes nothing, in memory or on disk; a change whose
    /// first write fails is retried on the database opened again.
    #[test]
    fn a_deletion_that_cannot_be_recorded_leaves_the_allocation_whole() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&config(dir.path())).unwrap();
        let a = alloc(&s, 1000);
        put(&a, 0, b"kept").unwrap();
        let id = a.id;
        a.res.db.fail_commits.store(2, Relaxed);
        let e = s.change_refcount(&a, RefCount::Read, false).unwrap_err();
        assert_eq!(e.status(), StatusCode::INTERNAL);
        assert!(!lock(&a.info).deleted);
        assert_eq!(s.allocation_count(), 1);
        assert_eq!(a.probe().read_refs, 1);
        s.check_accounting().unwrap();
        // One failure only: the retry on the reopened database holds.
        a.res.db.fail_commits.store(1, Relaxed);
        s.change_refcount(&a, RefCount::Write, true).unwrap();
        assert_eq!(a.probe().write_refs, 1);
        drop((a, s));
        let s = Store::open(&config(dir.path())).unwrap();
        let a = lock(&s.state).allocs[&id].alloc.clone();
        assert_eq!((a.probe().read_refs, a.probe().write_refs), (1, 1));
        assert_eq!(a.extent().len, 4);
    }

    /// Four resources of 1 GiB each in `dir`.
    fn four(dir: &std::path::Path) -> Config {
        let mut cfg = config(dir);
        cfg.resources = (1..=4)
            .map(|i| {
                let mut r = ResourceConfig::new(&i.to_string(), dir.join(format!("r{i}")));
                r.size = crate::config::ByteSize(1 << 30);
                r
            })
            .collect();
        cfg
    }

    fn used_by_resource(s: &Store) -> Vec<u64> {
        s.status().iter().map(|r| r.usage.used()).collect()
    }

    #[test]
    fn four_resources_share_a_mixed_workload_within_ten_percent_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&four(dir.path())).unwrap();
        // Sizes from 4 KiB to 8 MiB, a third of them freed again as it goes,
        // hard and soft mixed.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut held = Vec::new();
        for i in 0..600 {
            let size = 4096 + next() % (8 * MIB);
            let rel = if i % 3 == 0 {
                Reliability::Soft
            } else {
                Reliability::Hard
            };
            let id = s.allocate(&req(size, rel)).unwrap().id;
            held.push(lock(&s.state).allocs[&id].alloc.clone());
            if next() % 3 == 0 {
                let a = held.swap_remove((next() % held.len() as u64) as usize);
                s.change_refcount(&a, RefCount::Read, false).unwrap();
            }
        }
        let used = used_by_resource(&s);
        let mean = used.iter().sum::<u64>() as f64 / 4.0;
        for (i, u) in used.iter().enumerate() {
            let off = (*u as f64 - mean).abs() / mean;
            assert!(
                off <= 0.10,
                "resource {} holds {u} bytes, {:.1}% off the mean {mean}: {used:?}",
                i + 1,
                off * 100.0
            );
        }
    }

    #[test]
    fn a_full_resource_never_refuses_what_another_can_hold() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&four(dir.path())).unwrap();
        // Resource 1 filled to its last MiB by allocations asked of it by RID.
        let fill = (1 << 30) - MIB - 2 * ALLOC_CHARGE;
        let to_one = AllocRequest {
            rid: Some("1".into()),
            ..req(fill, Reliability::Hard)
        };
        s.allocate(&to_one).unwrap();
        // Anything larger than its last MiB goes elsewhere, however many.
        for _ in 0..12 {
            let id = s.allocate(&req(200 * MIB, Reliability::Hard)).unwrap().id;
            let rid = lock(&s.state).allocs[&id].alloc.res.rid().to_owned();
            assert_ne!(rid, "1");
        }
        // Only when no resource has room is the answer "no space".
        let e = s.allocate(&req(600 * MIB, Reliability::Hard)).unwrap_err();
        assert_eq!(e.status(), StatusCode::WOULD_EXCEED_LIMIT);
    }

    #[test]
    fn new_allocations_go_to_idle_disks_before_busy_ones() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&four(dir.path())).unwrap();
        let busy: Vec<Busy> = (s.resources()[..3].iter())
            .flat_map(|r| [r.busy(), r.busy()])
            .collect();
        // The idle disk first, as long as it stays within two allocations
        // of the emptiest; then the busy ones take their share.
        let rids: Vec<String> = (0..12)
            .map(|_| {
                let id = s.allocate(&req(MIB, Reliability::Hard)).unwrap().id;
                lock(&s.state).allocs[&id].alloc.res.rid().to_owned()
            })
            .collect();
        assert_eq!(rids[0], "4");
        assert!(rids.iter().filter(|r| *r == "4").count() >= 4, "{rids:?}");
        let used = used_by_resource(&s);
        let (lo, hi) = (used.iter().min().unwrap(), used.iter().max().unwrap());
        assert!(hi - lo <= 3 * MIB, "bytes stay even: {used:?}");
        drop(busy);
        assert!(s.resources().iter().all(|r| r.active() == 0));
    }

    #[test]
    fn allocate_rejects_every_extreme_it_cannot_honour() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&config(dir.path())).unwrap();
        let cases = [
            (0, 3600, StatusCode::INVALID_PARAMETER),
            (u64::MAX, 3600, StatusCode::WOULD_EXCEED_POLICY),
            (u64::MAX - 1, 3600, StatusCode::WOULD_EXCEED_POLICY),
            (100 * MIB + 1, 3600, StatusCode::WOULD_EXCEED_POLICY),
            (1, 0, StatusCode::INVALID_PARAMETER),
            (1, u64::MAX, StatusCode::LONG_DURATION),
        ];
        for (size, secs, want) in cases {
            let r = AllocRequest {
                lease: Lease::Secs(secs),
                ..req(size, Reliability::Hard)
            };
            let got = s.allocate(&r).map(|_| ()).unwrap_err().status();
            assert_eq!(got, want, "size {size} lease {secs}");
        }
        assert_eq!(used(&s), 0);
        // 1 byte, and exactly the whole resource (each allocation charged
        // its overhead), are fine.
        s.allocate(&req(1, Reliability::Hard)).unwrap();
        let rest = 100 * MIB - 1 - 2 * ALLOC_CHARGE;
        assert_eq!(
            s.allocate(&req(rest + 1, Reliability::Hard))
                .unwrap_err()
                .status(),
            StatusCode::WOULD_EXCEED_LIMIT
        );
        s.allocate(&req(rest, Reliability::Soft)).unwrap();
        assert_eq!(used(&s), 100 * MIB);
    }

    #[test]
    fn growth_by_truncate_or_chng_is_checked_and_never_wraps() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&config(dir.path())).unwrap();
        let a = alloc(&s, 1000);
        let b = alloc(&s, 1000);
        let (wa, wb) = (a.writer_now(), b.writer_now());
        let size_to = |n| Change {
            max_size: Some(n),
            ..Change::default()
        };
        for size in [1 << 40, 100 * MIB, u64::MAX - 1, u64::MAX] {
            let e = s.truncate(&wa, size).unwrap_err();
            assert!(
                matches!(e, StoreError::NoSpace | StoreError::Policy(_)),
                "truncate {size}: {e}"
            );
            let e = s.change(&wa, size_to(size)).unwrap_err();
            assert!(
                matches!(e, StoreError::NoSpace | StoreError::Policy(_)),
                "chng {size}: {e}"
            );
            assert_eq!(used(&s), 2000 + 2 * ALLOC_CHARGE, "after {size}");
            assert_eq!(a.max_size(), 1000);
        }
        // Growth that fits is allowed and accounted, to the last byte.
        let most = 100 * MIB - 1000 - 2 * ALLOC_CHARGE;
        s.truncate(&wa, most).unwrap();
        assert_eq!(used(&s), 100 * MIB);
        assert!(s.change(&wb, size_to(1001)).is_err());
        s.change(&wa, size_to(1000)).unwrap();
        s.change(&wb, size_to(most)).unwrap();
        assert_eq!(used(&s), 100 * MIB);
        // Hard to soft at the same size moves the bytes between the classes.
        let soft = Change {
            reliability: Some(Reliability::Soft),
            ..Change::default()
        };
        s.change(&wb, soft).unwrap();
        assert_eq!(s.status()[0].usage.soft, most + ALLOC_CHARGE);
        // Nothing named, nothing changed; a zero lease is refused.
        let left = a.probe().seconds_left;
        s.change(&wa, Change::default()).unwrap();
        assert_eq!((a.max_size(), a.probe().seconds_left), (1000, left));
        let zero = Change {
            lease: Some(Lease::Secs(0)),
            ..Change::default()
        };
        assert!(matches!(s.change(&wa, zero), Err(StoreError::Invalid(_))));
        s.check_accounting().unwrap();
    }

    #[test]
    fn refcounts_saturate_instead_of_wrapping_to_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&config(dir.path())).unwrap();
        let a = alloc(&s, 10);
        s.update(&a, |rec, _| {
            rec.read_refs = u32::MAX - 1;
            Ok(true)
        })
        .unwrap();
        s.change_refcount(&a, RefCount::Read, true).unwrap();
        s.change_refcount(&a, RefCount::Read, true).unwrap();
        assert_eq!(a.probe().read_refs, i64::from(u32::MAX));
        s.change_refcount(&a, RefCount::Read, false).unwrap();
        assert_eq!(a.probe().read_refs, i64::from(u32::MAX - 1));
        // Write count from 0 does not wrap below zero either.
        s.change_refcount(&a, RefCount::Write, false).unwrap();
        assert_eq!(a.probe().write_refs, 0);
        assert_eq!(s.allocation_count(), 1);
    }

    #[test]
    fn expiry_at_the_end_of_time_does_not_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&config(dir.path())).unwrap();
        alloc(&s, 10);
        assert_eq!(s.reap_expired(u64::MAX - 1), 1);
        alloc(&s, 10);
        assert_eq!(s.reap_expired(u64::MAX), 1);
        assert_eq!(used(&s), 0);
    }

    #[test]
    fn a_damaged_allocation_is_reported_and_reclaimed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let (good, bad) = {
            let s = Store::open(&cfg).unwrap();
            let (good, bad) = (alloc(&s, 1000), alloc(&s, 2000));
            for a in [&good, &bad] {
                put(a, 0, b"abc").unwrap();
            }
            bad.data_file_for_test()
                .write_all_at(b"garbage", 0)
                .unwrap();
            (good.id, bad.id)
        };
        let s = Store::open(&cfg).unwrap();
        assert_eq!(s.damaged_on_open(), 1);
        assert_eq!(s.allocation_count(), 1);
        assert_eq!(
            used(&s),
            1000 + ALLOC_CHARGE,
            "the damaged allocation's space came back"
        );
        let st = lock(&s.state);
        assert_eq!(st.allocs[&good].alloc.extent().len, 3);
        assert!(!st.allocs.contains_key(&bad));
        drop(st);
        let kept: Vec<_> = std::fs::read_dir(dir.path().join("damaged"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        assert_eq!(kept.len(), 1);
        assert!(kept[0].starts_with(&format!("{bad:016x}-")), "{kept:?}");
        // And the record is gone for good, not reclaimed again next time.
        drop(s);
        assert_eq!(Store::open(&cfg).unwrap().damaged_on_open(), 0);
    }
}
