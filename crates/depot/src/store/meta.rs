//! Allocation metadata in an embedded transactional database (redb), one per
//! resource, so a resource directory is self-contained and can move disks.
//!
//! Records change on ALLOCATE, MANAGE and deletion — never on STORE/WRITE,
//! whose committed length lives in the data file header.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lors_ibp::proto::chksum::{ChksumType, NetChksum};
use lors_ibp::proto::{AllocType, Reliability};
use redb::{Database, ReadableTable, TableDefinition};

const ALLOCS: TableDefinition<u64, &[u8]> = TableDefinition::new("allocs");
const ALIASES: TableDefinition<u64, &[u8]> = TableDefinition::new("aliases");
const RECORD_VERSION: u8 = 1;
const RECORD_BYTES: usize = 132;
/// Version 2 adds disk checksums (type in byte 3, block size after the
/// keys); records without them stay version 1, readable by older depots.
const RECORD_VERSION_CHKSUM: u8 = 2;
const RECORD_BYTES_CHKSUM: usize = 140;
const ALIAS_VERSION: u8 = 1;
const ALIAS_BYTES: usize = 148;

/// What is persisted per allocation. Keys are stored as BLAKE3 hashes only, so
/// a copied metadata file does not hand out capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocRecord {
    /// Allocation type.
    pub atype: AllocType,
    /// Soft or hard.
    pub reliability: Reliability,
    /// Maximum size in bytes.
    pub max_size: u64,
    /// Expiry, Unix seconds.
    pub expires_at: u64,
    /// Creation, Unix seconds.
    pub created_at: u64,
    /// Read reference count.
    pub read_refs: u32,
    /// Write reference count.
    pub write_refs: u32,
    /// BLAKE3 of the read, write and manage keys.
    pub key_hashes: [[u8; 32]; 3],
    /// Per-block digests kept on disk (ALLOCATE_CHKSUM), if any.
    pub disk_chksum: Option<NetChksum>,
}

impl AllocRecord {
    /// Fixed little-endian layout, version byte first.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; RECORD_BYTES];
        b[0] = RECORD_VERSION;
        if let Some(cs) = &self.disk_chksum {
            b[0] = RECORD_VERSION_CHKSUM;
            b[3] = u8::try_from(cs.kind.number()).expect("checksum types are 1..=4");
            b.extend_from_slice(&cs.block_size.to_le_bytes());
        }
        b[1] = u8::try_from(self.atype.number()).expect("type numbers are 1..=4");
        b[2] = u8::try_from(self.reliability.number()).expect("reliability is 1 or 2");
        b[4..12].copy_from_slice(&self.max_size.to_le_bytes());
        b[12..20].copy_from_slice(&self.expires_at.to_le_bytes());
        b[20..28].copy_from_slice(&self.created_at.to_le_bytes());
        b[28..32].copy_from_slice(&self.read_refs.to_le_bytes());
        b[32..36].copy_from_slice(&self.write_refs.to_le_bytes());
        put_hashes(&mut b, 36, &self.key_hashes);
        b
    }

    /// Decodes a record; `None` for an unknown version or damaged bytes.
    pub fn decode(b: &[u8]) -> Option<AllocRecord> {
        let disk_chksum = match (b.first(), b.len()) {
            (Some(&RECORD_VERSION), RECORD_BYTES) => None,
            (Some(&RECORD_VERSION_CHKSUM), RECORD_BYTES_CHKSUM) => Some(NetChksum {
                kind: ChksumType::from_number(i64::from(b[3]))?,
                block_size: u64_at(b, RECORD_BYTES),
            }),
            _ => return None,
        };
        Some(AllocRecord {
            atype: AllocType::from_number(i64::from(b[1]))?,
            reliability: Reliability::from_number(i64::from(b[2]))?,
            max_size: u64_at(b, 4),
            expires_at: u64_at(b, 12),
            created_at: u64_at(b, 20),
            read_refs: u32_at(b, 28),
            write_refs: u32_at(b, 32),
            key_hashes: get_hashes(b, 36),
            disk_chksum,
        })
    }
}

/// What is persisted per alias (LStore's proxy allocation): another set of
/// keys for a window of a master allocation, with its own counts and lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasRecord {
    /// The allocation it is an alias of.
    pub master: u64,
    /// Window start.
    pub offset: u64,
    /// Window length; 0 = to the end of the master.
    pub length: u64,
    /// Expiry, Unix seconds.
    pub expires_at: u64,
    /// Creation, Unix seconds.
    pub created_at: u64,
    /// Read reference count.
    pub read_refs: u32,
    /// Write reference count.
    pub write_refs: u32,
    /// BLAKE3 of the read, write and manage keys.
    pub key_hashes: [[u8; 32]; 3],
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn put_hashes(b: &mut [u8], at: usize, hashes: &[[u8; 32]; 3]) {
    for (i, h) in hashes.iter().enumerate() {
        b[at + 32 * i..at + 32 * (i + 1)].copy_from_slice(h);
    }
}

fn get_hashes(b: &[u8], at: usize) -> [[u8; 32]; 3] {
    let mut hashes = [[0u8; 32]; 3];
    for (i, h) in hashes.iter_mut().enumerate() {
        h.copy_from_slice(&b[at + 32 * i..at + 32 * (i + 1)]);
    }
    hashes
}

impl AliasRecord {
    /// Fixed little-endian layout, version byte first.
    pub fn encode(&self) -> [u8; ALIAS_BYTES] {
        let mut b = [0u8; ALIAS_BYTES];
        b[0] = ALIAS_VERSION;
        for (i, v) in [
            self.master,
            self.offset,
            self.length,
            self.expires_at,
            self.created_at,
        ]
        .iter()
        .enumerate()
        {
            b[4 + 8 * i..12 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b[44..48].copy_from_slice(&self.read_refs.to_le_bytes());
        b[48..52].copy_from_slice(&self.write_refs.to_le_bytes());
        put_hashes(&mut b, 52, &self.key_hashes);
        b
    }

    /// Decodes a record; `None` for an unknown version or damaged bytes.
    pub fn decode(b: &[u8]) -> Option<AliasRecord> {
        if b.len() != ALIAS_BYTES || b[0] != ALIAS_VERSION {
            return None;
        }
        Some(AliasRecord {
            master: u64_at(b, 4),
            offset: u64_at(b, 12),
            length: u64_at(b, 20),
            expires_at: u64_at(b, 28),
            created_at: u64_at(b, 36),
            read_refs: u32_at(b, 44),
            write_refs: u32_at(b, 48),
            key_hashes: get_hashes(b, 52),
        })
    }
}

/// A metadata-database error (boxed: redb's error type is large).
pub type MetaError = Box<redb::Error>;

/// Records that decoded, and ids of records that did not.
pub type Loaded<R = AllocRecord> = (Vec<(u64, R)>, Vec<u64>);

fn db<T, E: Into<redb::Error>>(r: Result<T, E>) -> Result<T, MetaError> {
    r.map_err(|e| Box::new(e.into()))
}

/// One resource's metadata database, and the disk space kept for it.
///
/// redb refuses every write after one failed ("previous I/O error") until
/// the database is opened again, so a full disk met once would wedge the
/// resource for good. Here a failed write closes the database, frees the
/// resource's reserve (a file of real blocks held for exactly this), opens
/// it again and retries once; if that fails too, what the reopened
/// database holds decides the answer. Reads go to the open database.
pub struct MetaDb {
    path: PathBuf,
    db: Mutex<Option<Database>>,
    /// The database is closed (a failed write, then a failed open).
    closed: AtomicBool,
    reserve: Reserve,
    /// Commits to fail before they are tried, as a full disk would.
    #[cfg(test)]
    pub(crate) fail_commits: std::sync::atomic::AtomicUsize,
}

/// Disk space held back for metadata: a file of real blocks beside the
/// database, released when a metadata write meets a full disk, made again
/// once the file system has room.
struct Reserve {
    path: PathBuf,
    bytes: u64,
    /// The file is gone (released, or it could not be made).
    spent: AtomicBool,
    /// When it was last tried to be made again.
    tried: Mutex<Option<Instant>>,
}

/// How often a spent reserve is tried to be made again.
const RESERVE_RETRY: Duration = Duration::from_millis(200);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reserve {
    /// Makes the reserve file if it is missing and the file system has
    /// room for it and as much again; whether it is in place.
    fn restore(&self) -> bool {
        if !self.spent.load(Relaxed) {
            return true;
        }
        {
            let mut t = lock(&self.tried);
            if t.is_some_and(|t| t.elapsed() < RESERVE_RETRY) {
                return false;
            }
            *t = Some(Instant::now());
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let room = rustix::fs::statvfs(dir)
            .map(|v| v.f_bavail.saturating_mul(v.f_frsize))
            .unwrap_or(0);
        if room < self.bytes.saturating_mul(2) {
            return false;
        }
        match make_reserve(&self.path, self.bytes) {
            Ok(()) => {
                self.spent.store(false, Relaxed);
                tracing::info!(path = %self.path.display(), "disk space returned: metadata reserve made again; new allocations accepted");
                true
            }
            Err(e) => {
                let _ = std::fs::remove_file(&self.path);
                tracing::debug!(path = %self.path.display(), error = %e, "metadata reserve not made yet");
                false
            }
        }
    }

    /// Frees the reserve's blocks for the metadata write that needs them.
    fn release(&self) {
        if std::fs::remove_file(&self.path).is_ok() {
            tracing::warn!(
                path = %self.path.display(),
                "metadata write failed (disk full?): reserve released; new allocations refused until space returns"
            );
        }
        self.spent.store(true, Relaxed);
    }
}

/// Writes `bytes` of real blocks to `path` (fallocate, or zeros where the
/// file system has none), synced.
fn make_reserve(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("new");
    let mut f = std::fs::File::create(&tmp)?;
    if rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, bytes).is_err() {
        let zeros = vec![0u8; 1 << 16];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            f.write_all(&zeros[..n])?;
            left -= n as u64;
        }
    }
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// The reserve for a file system of `total` bytes: a sixty-fourth of it,
/// within 1 to 16 MiB.
pub fn reserve_for(total: u64) -> u64 {
    (total / 64).clamp(1 << 20, 16 << 20)
}

impl MetaDb {
    /// Opens or creates `path`, and the reserve of `reserve` bytes beside it
    /// (`<path>.reserve`; not made when the disk has no room for it, and then
    /// reported by [`MetaDb::degraded`]).
    pub fn open(path: &Path, reserve: u64) -> Result<MetaDb, MetaError> {
        let db = open_db(path)?;
        let reserve = Reserve {
            path: path.with_extension("reserve"),
            bytes: reserve,
            spent: AtomicBool::new(true),
            tried: Mutex::new(None),
        };
        let have = std::fs::metadata(&reserve.path)
            .is_ok_and(|m| m.len() == reserve.bytes && m.blocks() * 512 >= reserve.bytes);
        if have {
            reserve.spent.store(false, Relaxed);
        } else {
            reserve.restore();
        }
        Ok(MetaDb {
            path: path.to_owned(),
            db: Mutex::new(Some(db)),
            closed: AtomicBool::new(false),
            reserve,
            #[cfg(test)]
            fail_commits: Default::default(),
        })
    }

    /// Whether the resource must take no new allocation: its reserve is
    /// spent, or its database could not be opened again. Never blocks.
    pub fn degraded(&self) -> bool {
        self.reserve.spent.load(Relaxed) || self.closed.load(Relaxed)
    }

    /// Out of [`MetaDb::degraded`] if the disk has room again: the reserve
    /// made again (tried at most every 200 ms), the database opened.
    /// Blocking; whether the resource is whole.
    pub fn recover(&self) -> bool {
        if self.closed.load(Relaxed) {
            let mut g = lock(&self.db);
            if g.is_none()
                && let Ok(d) = open_db(&self.path)
            {
                *g = Some(d);
            }
            self.closed.store(g.is_none(), Relaxed);
        }
        self.reserve.restore() && !self.closed.load(Relaxed)
    }

    /// Every allocation record; undecodable ones are returned apart so the
    /// caller can log them.
    pub fn load_all(&self) -> Result<Loaded, MetaError> {
        self.load(ALLOCS, AllocRecord::decode)
    }

    /// Every alias record, as [`MetaDb::load_all`].
    pub fn load_aliases(&self) -> Result<Loaded<AliasRecord>, MetaError> {
        self.load(ALIASES, AliasRecord::decode)
    }

    fn load<R>(
        &self,
        table: TableDefinition<u64, &[u8]>,
        decode: fn(&[u8]) -> Option<R>,
    ) -> Result<Loaded<R>, MetaError> {
        let g = lock(&self.db);
        let Some(d) = g.as_ref() else {
            return Err(closed());
        };
        let txn = db(d.begin_read())?;
        let table = db(txn.open_table(table))?;
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for item in db(table.iter())? {
            let (k, v) = db(item)?;
            match decode(v.value()) {
                Some(r) => good.push((k.value(), r)),
                None => bad.push(k.value()),
            }
        }
        Ok((good, bad))
    }

    /// Writes `puts` and removes `deletes` in one durable transaction.
    /// `Ok` only when the change is durable, `Err` only when it is not.
    pub fn apply(&self, puts: &[(u64, AllocRecord)], deletes: &[u64]) -> Result<(), MetaError> {
        let puts: Vec<(u64, Vec<u8>)> = puts.iter().map(|(id, r)| (*id, r.encode())).collect();
        self.write(ALLOCS, &puts, deletes)
    }

    /// [`MetaDb::apply`] for alias records.
    pub fn apply_aliases(
        &self,
        puts: &[(u64, AliasRecord)],
        deletes: &[u64],
    ) -> Result<(), MetaError> {
        let puts: Vec<(u64, Vec<u8>)> = puts
            .iter()
            .map(|(id, r)| (*id, r.encode().to_vec()))
            .collect();
        self.write(ALIASES, &puts, deletes)
    }

    fn write(
        &self,
        table: Table,
        puts: &[(u64, Vec<u8>)],
        deletes: &[u64],
    ) -> Result<(), MetaError> {
        let mut g = lock(&self.db);
        let mut err = closed();
        for attempt in 0..2 {
            if g.is_none() {
                match open_db(&self.path) {
                    Ok(d) => *g = Some(d),
                    Err(e) => {
                        err = e;
                        continue;
                    }
                }
            }
            let d = g.as_ref().expect("opened above");
            #[cfg(test)]
            if self
                .fail_commits
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                *g = None;
                err = Box::new(redb::Error::Io(std::io::ErrorKind::StorageFull.into()));
                continue;
            }
            match commit(d, table, puts, deletes) {
                Ok(()) => {
                    self.closed.store(false, Relaxed);
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), attempt, error = %e, "metadata write failed; reopening the database");
                    // Closed, so the next open starts clean of redb's
                    // "previous I/O error" state.
                    *g = None;
                    if attempt == 0 {
                        self.reserve.release();
                    }
                    err = e;
                }
            }
        }
        // A commit can fail after it became durable (its last sync): the
        // database as it opens now is the truth the reply must tell.
        let mut landed = false;
        if let Ok(d) = open_db(&self.path) {
            landed = holds(&d, table, puts, deletes).unwrap_or(false);
            *g = Some(d);
        }
        self.closed.store(g.is_none(), Relaxed);
        if landed { Ok(()) } else { Err(err) }
    }
}

type Table = TableDefinition<'static, u64, &'static [u8]>;

fn open_db(path: &Path) -> Result<Database, MetaError> {
    let d = db(Database::create(path))?;
    let txn = db_txn(d.begin_write())?;
    db(txn.open_table(ALLOCS))?;
    db(txn.open_table(ALIASES))?;
    db(txn.commit())?;
    Ok(d)
}

fn closed() -> MetaError {
    Box::new(redb::Error::Io(std::io::Error::other(
        "the metadata database is closed after a failed write and could not be opened again",
    )))
}

fn commit(
    d: &Database,
    table: Table,
    puts: &[(u64, Vec<u8>)],
    deletes: &[u64],
) -> Result<(), MetaError> {
    let txn = db_txn(d.begin_write())?;
    {
        let mut t = db(txn.open_table(table))?;
        for (id, bytes) in puts {
            db(t.insert(*id, bytes.as_slice()))?;
        }
        for id in deletes {
            db(t.remove(*id))?;
        }
    }
    db(txn.commit())
}

/// Whether `d` holds what the write would have made it hold.
fn holds(
    d: &Database,
    table: Table,
    puts: &[(u64, Vec<u8>)],
    deletes: &[u64],
) -> Result<bool, MetaError> {
    let txn = db(d.begin_read())?;
    let t = db(txn.open_table(table))?;
    for (id, bytes) in puts {
        if db(t.get(*id))?.is_none_or(|v| v.value() != bytes.as_slice()) {
            return Ok(false);
        }
    }
    for id in deletes {
        if db(t.get(*id))?.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

// begin_write's error type converts through redb::TransactionError.
fn db_txn<T>(r: Result<T, redb::TransactionError>) -> Result<T, MetaError> {
    db(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_persist() {
        let dir = tempfile::tempdir().unwrap();
        let rec = AllocRecord {
            atype: AllocType::Fifo,
            reliability: Reliability::Soft,
            max_size: 12345,
            expires_at: 99,
            created_at: 7,
            read_refs: 1,
            write_refs: 3,
            key_hashes: [[1; 32], [2; 32], [3; 32]],
            disk_chksum: None,
        };
        assert_eq!(rec.encode().len(), RECORD_BYTES);
        assert_eq!(AllocRecord::decode(&rec.encode()), Some(rec.clone()));
        let summed = AllocRecord {
            disk_chksum: Some(NetChksum {
                kind: ChksumType::Sha1,
                block_size: 65536,
            }),
            ..rec.clone()
        };
        assert_eq!(AllocRecord::decode(&summed.encode()), Some(summed));
        {
            let db = MetaDb::open(&dir.path().join("m.redb"), 1 << 20).unwrap();
            db.apply(&[(5, rec.clone()), (6, rec.clone())], &[])
                .unwrap();
            db.apply(&[], &[6]).unwrap();
        }
        let db = MetaDb::open(&dir.path().join("m.redb"), 1 << 20).unwrap();
        let (good, bad) = db.load_all().unwrap();
        assert_eq!(good, vec![(5, rec)]);
        assert!(bad.is_empty());
    }

    #[test]
    fn alias_records_round_trip_apart_from_allocations() {
        let dir = tempfile::tempdir().unwrap();
        let rec = AliasRecord {
            master: 5,
            offset: 1 << 40,
            length: 77,
            expires_at: 99,
            created_at: 7,
            read_refs: 1,
            write_refs: u32::MAX,
            key_hashes: [[4; 32], [5; 32], [6; 32]],
        };
        assert_eq!(AliasRecord::decode(&rec.encode()), Some(rec.clone()));
        assert_eq!(AliasRecord::decode(&rec.encode()[1..]), None);
        {
            let db = MetaDb::open(&dir.path().join("m.redb"), 1 << 20).unwrap();
            db.apply_aliases(&[(9, rec.clone()), (10, rec.clone())], &[])
                .unwrap();
            db.apply_aliases(&[], &[10]).unwrap();
        }
        let db = MetaDb::open(&dir.path().join("m.redb"), 1 << 20).unwrap();
        assert_eq!(db.load_aliases().unwrap().0, vec![(9, rec)]);
        assert!(db.load_all().unwrap().0.is_empty());
    }
}
