//! Changes to an allocation's bytes, as transactions.
//!
//! A [`Writer`] is an allocation's turn to change data: data phases run one
//! at a time per allocation, and the digest checks of reads wait for them.
//! From a writer come the data phases:
//!
//! * [`Planned`], then [`Incoming`] — bytes received into a byte array
//!   (STORE, WRITE): checked first, with no I/O, so a refused request costs
//!   nothing, then started (the data file created, a staging file opened);
//! * [`QueueIn`] and [`QueueOut`] — a queue's STORE and its consuming LOAD;
//! * [`Writer::append_copy`] — a SEND to an allocation on this depot.
//!
//! Each ends in `commit`, which moves the committed extent (the header, then
//! the digests, durable per the sync policy) so readers see the new bytes,
//! or is dropped, which rolls back: a reader never sees a byte of a data
//! phase that did not finish, and a cut-short WRITE leaves the old bytes.
//! The caller (the connection) only moves bytes between the socket and
//! [`Incoming::target`].

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use lors_ibp::proto::AllocType;
use tokio::sync::OwnedMutexGuard;

use super::datafile::{self, Extent, HEADER_BYTES};
use super::{Alloc, Result, StoreError, Window};
use crate::store::digests::{self, Verified};

/// Distinct names for staging files (opened with `create_new`, never shared).
static STAGE_SEQ: AtomicU64 = AtomicU64::new(0);

/// An allocation's turn to change its data; see the [module docs](self).
pub struct Writer {
    alloc: Arc<Alloc>,
    _turn: OwnedMutexGuard<()>,
}

impl Alloc {
    /// Waits for this allocation's turn to change data (or to check digests
    /// against data no data phase is changing).
    pub async fn writer(self: &Arc<Self>) -> Writer {
        let turn = self.writer.clone().lock_owned().await;
        Writer {
            alloc: self.clone(),
            _turn: turn,
        }
    }

    /// The turn, now, for tests that hold no other.
    #[cfg(test)]
    pub(super) fn writer_now(self: &Arc<Self>) -> Writer {
        let turn = self.writer.clone().try_lock_owned().expect("writer free");
        Writer {
            alloc: self.clone(),
            _turn: turn,
        }
    }
}

impl Writer {
    /// The allocation.
    pub fn alloc(&self) -> &Arc<Alloc> {
        &self.alloc
    }

    /// The committed extent: stable while this writer lives.
    pub fn extent(&self) -> Extent {
        self.alloc.extent()
    }

    /// STORE into a byte array: `length` bytes after the committed ones,
    /// within `window` (which must start at the allocation's start: an alias
    /// elsewhere cannot append). No I/O.
    pub fn append(self, length: u64, window: Window) -> Result<Planned> {
        if self.alloc.atype != AllocType::ByteArray {
            return Err(StoreError::InvalidCmd);
        }
        let start = self.extent().len;
        let end = start.checked_add(length).ok_or(StoreError::NoSpace)?;
        if !window.at_start() || end > self.alloc.max_size().min(window.end()) {
            return Err(StoreError::NoSpace);
        }
        Ok(Planned {
            w: self,
            offset: start,
            length,
        })
    }

    /// WRITE into a byte array: `length` bytes at allocation offset `offset`.
    /// Bytes past the committed length stream into the data file beyond what
    /// readers see; bytes over committed ones go to an unlinked staging file
    /// and are copied into place at commit. No I/O.
    pub fn write(self, offset: u64, length: u64) -> Result<Planned> {
        if self.alloc.atype != AllocType::ByteArray {
            return Err(StoreError::InvalidCmd);
        }
        let end = offset.checked_add(length).ok_or(StoreError::NoSpace)?;
        if end > self.alloc.max_size() {
            return Err(StoreError::NoSpace);
        }
        Ok(Planned {
            w: self,
            offset,
            length,
        })
    }

    /// SEND to an allocation on this depot: `length` bytes of `src` from
    /// data offset `src_offset`, appended as [`Writer::append`] would, copied
    /// inside the kernel and committed — or rolled back. `src` is `None`
    /// when the source never had a byte written. Blocking.
    pub fn append_copy(
        self,
        src: Option<&File>,
        src_offset: u64,
        length: u64,
        window: Window,
    ) -> Result<()> {
        let inc = self.append(length, window)?.start()?;
        if length > 0 {
            let src = src.ok_or(StoreError::Corrupt)?;
            let at = HEADER_BYTES + inc.offset;
            datafile::copy_range(src, HEADER_BYTES + src_offset, &inc.file, at, length)
                .map_err(StoreError::Write)?;
        }
        inc.commit()
    }

    /// STORE into a FIFO or circular queue of `length` bytes: a FIFO refuses
    /// what does not fit, a circular queue drops its oldest bytes at commit.
    /// No I/O.
    pub fn enqueue(self, length: u64) -> Result<QueueIn> {
        if !self.alloc.is_queue() {
            return Err(StoreError::InvalidCmd);
        }
        let ext = self.extent();
        let cap = self.alloc.max_size();
        let fits = match self.alloc.atype {
            AllocType::Fifo => ext.len.checked_add(length).is_some_and(|e| e <= cap),
            _ => length <= cap,
        };
        if !fits || usize::try_from(length).is_err() {
            return Err(StoreError::NoSpace);
        }
        Ok(QueueIn {
            w: self,
            length,
            stage: None,
        })
    }

    /// LOAD from a queue: the oldest `length` bytes (`offset` must be 0),
    /// consumed only when the returned transaction commits. Blocking.
    pub fn dequeue(self, offset: u64, length: u64) -> Result<QueueOut> {
        if !self.alloc.is_queue() {
            return Err(StoreError::InvalidCmd);
        }
        if offset != 0 {
            return Err(StoreError::Invalid("a queue is read from its head"));
        }
        let (file, ext) = self.alloc.snapshot()?;
        if length > ext.len || usize::try_from(length).is_err() {
            return Err(StoreError::NoSpace);
        }
        Ok(QueueOut {
            w: self,
            file,
            ext,
            length,
            bytes: Vec::new(),
        })
    }

    /// Checks `[offset, offset+length)` against the stored digests (nothing
    /// to do without digests). Blocking.
    pub fn verify(&self, offset: u64, length: u64) -> Result<()> {
        let a = &self.alloc;
        let Some(d) = a.digests()? else {
            return Ok(());
        };
        let (Some(file), ext) = a.snapshot()? else {
            return Ok(());
        };
        match d
            .verify(&file, offset, length, ext.len)
            .map_err(StoreError::Read)?
        {
            Verified::Good => Ok(()),
            Verified::Bad(k) => {
                tracing::error!(rid = %a.res.rid(), id = a.id, block = k, "stored bytes fail their digest");
                Err(StoreError::ChksumMismatch(k))
            }
        }
    }

    /// GET_CHKSUM's head: the algorithm and block size, and the number of
    /// blocks (each of `cs.kind`'s digest length). Blocking.
    pub fn chksums(&self) -> Result<(lors_ibp::proto::chksum::NetChksum, u64)> {
        let a = &self.alloc;
        let cs = a.disk_chksum.ok_or(StoreError::NoChksum)?;
        let d = a.digests()?.ok_or(StoreError::NoChksum)?;
        Ok((cs, d.blocks(a.extent().len)))
    }

    /// The stored digests of `blocks` (binary, in order), for GET_CHKSUM to
    /// send a run at a time: at most [`digests::RUN_BLOCKS`] are read.
    /// Blocking.
    pub fn chksum_run(&self, blocks: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let a = &self.alloc;
        let d = a.digests()?.ok_or(StoreError::NoChksum)?;
        let end = blocks
            .end
            .min(blocks.start.saturating_add(digests::RUN_BLOCKS));
        d.range(a.extent().len, blocks.start..end)
            .map_err(StoreError::Read)
    }

    /// VALIDATE_CHKSUM: how many blocks fail their digest (0 without
    /// digests); with `correct`, their digests are replaced. Blocking.
    pub fn validate(&self, correct: bool) -> Result<u64> {
        let a = &self.alloc;
        let Some(d) = a.digests()? else {
            return Ok(0);
        };
        let (Some(file), ext) = a.snapshot()? else {
            return Ok(0);
        };
        d.validate(&file, ext.len, correct, a.sync)
            .map_err(StoreError::Read)
    }
}

/// A checked STORE or WRITE into a byte array, not begun yet.
pub struct Planned {
    w: Writer,
    offset: u64,
    length: u64,
}

impl Planned {
    /// Begins the data phase: the data file is created on first use, and
    /// bytes over committed ones get an unlinked staging file. Blocking.
    pub fn start(self) -> Result<Incoming> {
        let file = self.w.alloc.file_for_write()?;
        let stage = if self.offset < self.w.extent().len {
            Some(Arc::new(self.stage_file()?))
        } else {
            None
        };
        Ok(Incoming {
            w: self.w,
            file,
            stage,
            offset: self.offset,
            length: self.length,
            done: false,
        })
    }

    /// A scratch file, unlinked at once: it is gone even after a crash.
    fn stage_file(&self) -> Result<File> {
        stage_file(&self.w.alloc)
    }
}

/// A scratch file on `a`'s resource, unlinked at once: it is gone even
/// after a crash.
fn stage_file(a: &Alloc) -> Result<File> {
    let path = a.res.temp_path(STAGE_SEQ.fetch_add(1, Relaxed));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(StoreError::Write)?;
    let _ = std::fs::remove_file(&path);
    Ok(f)
}

/// Bytes being received into a byte array: write them to
/// [`Incoming::target`], then [`commit`](Incoming::commit). Dropped
/// uncommitted, the data file is cut back to its committed length.
pub struct Incoming {
    w: Writer,
    file: Arc<File>,
    /// Where bytes over committed ones wait until commit.
    stage: Option<Arc<File>>,
    offset: u64,
    length: u64,
    done: bool,
}

impl Incoming {
    /// The file and position the received bytes go to.
    pub fn target(&self) -> (&Arc<File>, u64) {
        match &self.stage {
            Some(s) => (s, 0),
            None => (&self.file, HEADER_BYTES + self.offset),
        }
    }

    /// How many bytes are expected.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether no bytes are expected.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Makes the received bytes visible: copied into place if staged, the
    /// digests brought up to date, the committed length moved. On failure
    /// nothing a reader sees has changed. Blocking.
    pub fn commit(mut self) -> Result<()> {
        if self.length == 0 {
            // No bytes, no change: a zero-length WRITE past the end must
            // not move the committed length over bytes the file never got
            // (through an alias it would cut the owner's data at restart).
            self.done = true;
            return Ok(());
        }
        let end = self.offset + self.length;
        if let Some(s) = &self.stage {
            datafile::copy_range(s, 0, &self.file, HEADER_BYTES + self.offset, self.length)
                .map_err(StoreError::Write)?;
        }
        self.w.alloc.commit_written(&self.file, self.offset, end)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if !self.done {
            self.w.alloc.rollback(&self.file);
        }
    }
}

/// A queue's STORE, checked: [`start`](QueueIn::start) it, receive the
/// bytes into [`QueueIn::stage`], then [`commit`](QueueIn::commit) them
/// into the ring, so a data phase cut short leaves the queue as it was.
pub struct QueueIn {
    w: Writer,
    length: u64,
    stage: Option<Arc<File>>,
}

impl QueueIn {
    /// Begins the data phase: an unlinked staging file for the bytes, so a
    /// queue STORE holds no memory while its client sends. Blocking.
    pub fn start(mut self) -> Result<QueueIn> {
        self.stage = Some(Arc::new(stage_file(&self.w.alloc)?));
        Ok(self)
    }

    /// Where the received bytes go (from offset 0). Panics before
    /// [`start`](QueueIn::start).
    pub fn stage(&self) -> &Arc<File> {
        self.stage.as_ref().expect("QueueIn::start was called")
    }

    /// Writes the staged bytes at the queue's tail, dropping the oldest
    /// bytes of a full circular queue first (committed before they are
    /// overwritten, so a crash never exposes half-overwritten bytes).
    /// Blocking.
    pub fn commit(self) -> Result<()> {
        let stage = self
            .stage
            .clone()
            .ok_or(StoreError::Invalid("data phase not started"))?;
        let mut at = 0u64;
        self.commit_with(|ring, capacity, tail| {
            let mut buf = vec![0u8; usize::try_from(self.length.min(1 << 20)).unwrap_or(1 << 20)];
            while at < self.length {
                let n = usize::try_from((self.length - at).min(buf.len() as u64))
                    .expect("at most the buffer");
                stage
                    .read_exact_at(&mut buf[..n], at)
                    .map_err(StoreError::Read)?;
                datafile::ring_write(ring, capacity, (tail + at) % capacity, &buf[..n])
                    .map_err(StoreError::Write)?;
                at += n as u64;
            }
            Ok(())
        })
    }

    /// Writes `data`, the whole STORE, at the queue's tail, as
    /// [`commit`](QueueIn::commit) does with staged bytes. Blocking.
    #[cfg(test)]
    fn commit_bytes(self, data: &[u8]) -> Result<()> {
        if data.len() as u64 != self.length {
            return Err(StoreError::Invalid("not the length the STORE announced"));
        }
        self.commit_with(|ring, capacity, tail| {
            datafile::ring_write(ring, capacity, tail, data).map_err(StoreError::Write)
        })
    }

    fn commit_with(&self, write: impl FnOnce(&File, u64, u64) -> Result<()>) -> Result<()> {
        let a = &self.w.alloc;
        let length = self.length;
        let file = a.file_for_write()?;
        let ext = a.extent();
        let capacity = ext.capacity;
        // `enqueue` checked a FIFO has room, on this same turn.
        let overflow = (ext.len + length).saturating_sub(capacity);
        let head = (ext.head + overflow) % capacity;
        let len = ext.len + length - overflow;
        let tail = (head + len - length) % capacity;
        if overflow > 0 {
            let kept = Extent {
                head,
                len: ext.len - overflow,
                capacity,
            };
            a.commit(&file, kept)?;
        }
        write(&file, capacity, tail)?;
        a.commit(
            &file,
            Extent {
                head,
                len,
                capacity,
            },
        )
    }
}

/// A queue's consuming LOAD under way: [`read`](QueueOut::read) the bytes,
/// send them, then [`commit`](QueueOut::commit) their consumption. Dropped
/// uncommitted (the reader never got them), the queue keeps them.
pub struct QueueOut {
    w: Writer,
    file: Option<Arc<File>>,
    ext: Extent,
    length: u64,
    bytes: Vec<u8>,
}

impl QueueOut {
    /// Reads the bytes from the ring. Blocking.
    pub fn read(&mut self) -> Result<()> {
        let n = usize::try_from(self.length).map_err(|_| StoreError::NoSpace)?;
        self.bytes = vec![0u8; n];
        if let Some(f) = &self.file {
            datafile::ring_read(f, self.ext.capacity, self.ext.head, &mut self.bytes)
                .map_err(StoreError::Read)?;
        }
        Ok(())
    }

    /// The bytes [`read`](QueueOut::read) got.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Records the bytes as consumed. Blocking.
    pub fn commit(self) -> Result<()> {
        let Some(f) = &self.file else {
            return Ok(()); // nothing was ever stored, so 0 bytes were read
        };
        let ext = self.ext;
        let next = Extent {
            head: (ext.head + self.length) % ext.capacity,
            len: ext.len - self.length,
            ..ext
        };
        self.w.alloc.commit(f, next)
    }
}

#[cfg(test)]
mod tests {
    //! The data phases against a real store on a temporary disk, without a
    //! socket: what a reader sees after each commit, and after each
    //! transaction dropped half-way (a client gone, a checksum mismatch).
    use std::os::unix::fs::FileExt;

    use lors_ibp::proto::Reliability;
    use lors_ibp::proto::chksum::{ChksumType, NetChksum};

    use super::*;
    use crate::config::{ByteSize, Config, ResourceConfig, SyncPolicy};
    use crate::store::{AllocRequest, Lease, Store};

    struct Fixture {
        _dir: tempfile::TempDir,
        store: Store,
    }

    fn store() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        let mut r = ResourceConfig::new("1", dir.path().to_path_buf());
        r.size = ByteSize(1 << 20);
        cfg.resources = vec![r];
        cfg.sync = SyncPolicy::Never;
        let store = Store::open(&cfg).unwrap();
        Fixture { _dir: dir, store }
    }

    impl Fixture {
        fn alloc(&self, atype: AllocType, size: u64, cs: Option<NetChksum>) -> Arc<Alloc> {
            let req = AllocRequest {
                rid: None,
                reliability: Reliability::Hard,
                atype,
                lease: Lease::Secs(3600),
                size,
                disk_chksum: cs,
            };
            let new = self.store.allocate(&req).unwrap();
            let token = lors_ibp::proto::KeyToken {
                rid: None,
                key: new.keys[2].clone(),
            };
            self.store.lookup(&token, None).unwrap()
        }
    }

    /// Receives `data` into an incoming data phase, as the socket would.
    /// An append of `len` bytes to `a`, started.
    fn appending(a: &Arc<Alloc>, len: u64) -> Incoming {
        a.writer_now()
            .append(len, Window::WHOLE)
            .unwrap()
            .start()
            .unwrap()
    }

    fn receive(inc: &Incoming, data: &[u8]) {
        let (f, pos) = inc.target();
        f.write_all_at(data, pos).unwrap();
    }

    /// What a reader sees: the committed bytes of a byte array.
    fn seen(a: &Arc<Alloc>) -> Vec<u8> {
        let (f, ext) = a.snapshot().unwrap();
        let mut buf = vec![0u8; usize::try_from(ext.len).unwrap()];
        if let Some(f) = f {
            f.read_exact_at(&mut buf, HEADER_BYTES).unwrap();
        }
        buf
    }

    fn file_len(a: &Arc<Alloc>) -> u64 {
        a.snapshot().unwrap().0.unwrap().metadata().unwrap().len()
    }

    #[test]
    fn appends_show_at_commit_and_vanish_when_dropped() {
        let fx = store();
        let a = fx.alloc(AllocType::ByteArray, 100, None);
        let inc = appending(&a, 5);
        receive(&inc, b"hello");
        assert_eq!(seen(&a), b"", "nothing visible before commit");
        inc.commit().unwrap();
        assert_eq!(seen(&a), b"hello");

        // A client that disappears half-way: the tail is cut off again.
        let inc = appending(&a, 50);
        receive(&inc, b"partial bytes");
        drop(inc);
        assert_eq!(seen(&a), b"hello");
        assert_eq!(file_len(&a), HEADER_BYTES + 5, "uncommitted tail removed");

        // Beyond the allocation, or through a window that does not start at
        // 0, nothing is even begun.
        let full = a.writer_now().append(96, Window::WHOLE);
        assert!(matches!(full, Err(StoreError::NoSpace)));
        let elsewhere = Window {
            offset: 10,
            length: 10,
        };
        assert!(matches!(
            a.writer_now().append(1, elsewhere),
            Err(StoreError::NoSpace)
        ));
        let short = Window {
            offset: 0,
            length: 6,
        };
        assert!(matches!(
            a.writer_now().append(2, short),
            Err(StoreError::NoSpace)
        ));
        let inc = a.writer_now().append(1, short).unwrap().start().unwrap();
        receive(&inc, b"!");
        inc.commit().unwrap();
        assert_eq!(seen(&a), b"hello!");
    }

    #[test]
    fn an_overwrite_cut_short_leaves_the_old_bytes() {
        let fx = store();
        let a = fx.alloc(AllocType::ByteArray, 100, None);
        let inc = a.writer_now().write(0, 10).unwrap().start().unwrap();
        receive(&inc, b"0123456789");
        inc.commit().unwrap();

        // Over committed bytes and past them: staged, so dropping it leaves
        // every old byte and no new one.
        let inc = a.writer_now().write(5, 10).unwrap().start().unwrap();
        receive(&inc, b"abcdefghij");
        drop(inc);
        assert_eq!(seen(&a), b"0123456789");
        assert_eq!(file_len(&a), HEADER_BYTES + 10);

        let inc = a.writer_now().write(5, 10).unwrap().start().unwrap();
        receive(&inc, b"abcdefghij");
        inc.commit().unwrap();
        assert_eq!(seen(&a), b"01234abcdefghij");

        // A write past the end leaves a hole of zeros, as on the reference
        // depot; beyond the max size it is refused.
        let inc = a.writer_now().write(20, 2).unwrap().start().unwrap();
        receive(&inc, b"zz");
        inc.commit().unwrap();
        assert_eq!(&seen(&a)[15..], b"\0\0\0\0\0zz");
        assert!(matches!(
            a.writer_now().write(99, 2),
            Err(StoreError::NoSpace)
        ));
        assert!(matches!(
            a.writer_now().write(u64::MAX, 2),
            Err(StoreError::NoSpace)
        ));
    }

    #[test]
    fn digests_follow_commits_and_catch_damage() {
        let fx = store();
        let cs = NetChksum {
            kind: ChksumType::Sha256,
            block_size: 4,
        };
        let a = fx.alloc(AllocType::ByteArray, 100, Some(cs));
        let inc = appending(&a, 10);
        receive(&inc, b"0123456789");
        inc.commit().unwrap();
        let w = a.writer_now();
        w.verify(0, 10).unwrap();
        let (_, blocks) = w.chksums().unwrap();
        let digests = w.chksum_run(0..blocks).unwrap();
        assert_eq!((blocks, digests.len()), (3, 3 * 32));
        drop(w);

        // An overwrite dropped half-way leaves the digests matching the
        // old bytes.
        let inc = a.writer_now().write(2, 4).unwrap().start().unwrap();
        receive(&inc, b"XXXX");
        drop(inc);
        a.writer_now().verify(0, 10).unwrap();

        // Bytes changed behind the depot's back are caught.
        let (f, _) = a.snapshot().unwrap();
        f.unwrap().write_all_at(b"!", HEADER_BYTES + 5).unwrap();
        let w = a.writer_now();
        assert!(matches!(w.verify(4, 4), Err(StoreError::ChksumMismatch(1))));
        w.verify(0, 4).unwrap();
        assert_eq!(w.validate(true).unwrap(), 1);
        w.verify(0, 10).unwrap();
    }

    #[test]
    fn a_circular_queue_drops_its_oldest_bytes_and_a_fifo_refuses() {
        let fx = store();
        let ring = fx.alloc(AllocType::Circular, 8, None);
        for chunk in [&b"abcde"[..], b"fghij"] {
            let q = ring.writer_now().enqueue(chunk.len() as u64).unwrap();
            q.commit_bytes(chunk).unwrap();
        }
        assert_eq!(ring.extent().len, 8);
        let mut out = ring.writer_now().dequeue(0, 8).unwrap();
        out.read().unwrap();
        assert_eq!(out.bytes(), b"cdefghij");
        // Not consumed until committed: a reader that vanished gets them
        // again.
        drop(out);
        let mut out = ring.writer_now().dequeue(0, 3).unwrap();
        out.read().unwrap();
        assert_eq!(out.bytes(), b"cde");
        out.commit().unwrap();
        let mut out = ring.writer_now().dequeue(0, 5).unwrap();
        out.read().unwrap();
        assert_eq!(out.bytes(), b"fghij");
        drop(out);
        assert!(matches!(
            ring.writer_now().dequeue(1, 1),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            ring.writer_now().enqueue(9),
            Err(StoreError::NoSpace)
        ));

        let fifo = fx.alloc(AllocType::Fifo, 8, None);
        fifo.writer_now()
            .enqueue(6)
            .unwrap()
            .commit_bytes(b"123456")
            .unwrap();
        assert!(matches!(
            fifo.writer_now().enqueue(3),
            Err(StoreError::NoSpace)
        ));
        // The bytes must be the ones announced.
        let q = fifo.writer_now().enqueue(2).unwrap();
        assert!(matches!(q.commit_bytes(b"1"), Err(StoreError::Invalid(_))));
        assert_eq!(fifo.extent().len, 6);
        // Byte-array operations do not apply to queues, nor queue ones to
        // byte arrays.
        assert!(matches!(
            fifo.writer_now().write(0, 1),
            Err(StoreError::InvalidCmd)
        ));
        let bytes = fx.alloc(AllocType::ByteArray, 8, None);
        assert!(matches!(
            bytes.writer_now().enqueue(1),
            Err(StoreError::InvalidCmd)
        ));
    }

    #[test]
    fn a_copy_appends_whole_or_not_at_all() {
        let fx = store();
        let src = fx.alloc(AllocType::ByteArray, 100, None);
        let inc = appending(&src, 6);
        receive(&inc, b"source");
        inc.commit().unwrap();
        let dst = fx.alloc(AllocType::ByteArray, 10, None);
        let (file, _) = src.snapshot().unwrap();
        let w = dst.writer_now();
        w.append_copy(file.as_deref(), 1, 4, Window::WHOLE).unwrap();
        assert_eq!(seen(&dst), b"ourc");
        // Into itself, from its own bytes.
        let (own, _) = dst.snapshot().unwrap();
        dst.writer_now()
            .append_copy(own.as_deref(), 0, 4, Window::WHOLE)
            .unwrap();
        assert_eq!(seen(&dst), b"ourcourc");
        // Too long for what is left: refused, nothing appended.
        let e = dst
            .writer_now()
            .append_copy(file.as_deref(), 0, 6, Window::WHOLE)
            .unwrap_err();
        assert!(matches!(e, StoreError::NoSpace));
        // A source that never had a byte written cannot give any.
        let e = dst
            .writer_now()
            .append_copy(None, 0, 1, Window::WHOLE)
            .unwrap_err();
        assert!(matches!(e, StoreError::Corrupt));
        assert_eq!(seen(&dst), b"ourcourc");
        assert_eq!(file_len(&dst), HEADER_BYTES + 8);
    }

    #[tokio::test]
    async fn one_writer_at_a_time() {
        let fx = store();
        let a = fx.alloc(AllocType::ByteArray, 100, None);
        let first = a.writer().await;
        let a2 = a.clone();
        let second = tokio::spawn(async move {
            let w = a2.writer().await;
            w.extent().len
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "the second writer waits its turn");
        let inc = first.append(3, Window::WHOLE).unwrap().start().unwrap();
        receive(&inc, b"abc");
        inc.commit().unwrap();
        assert_eq!(second.await.unwrap(), 3, "and sees the first one's bytes");
    }
}
