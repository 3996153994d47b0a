//! Where a download's bytes go: a file written in place with a resume
//! record beside it, or a stream written in order; and the buffers pieces
//! pass through on their way.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};
use lors_exnode::ExNode;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::error::{Error, Result};

/// A file several connections receive into at once, taking turns at its
/// gate (see [`lors_ibp::zerocopy::recv_shared`] for why).
pub(super) struct SharedFile {
    file: File,
    gate: Mutex<()>,
}

impl SharedFile {
    fn new(file: File) -> Self {
        SharedFile {
            file,
            gate: Mutex::new(()),
        }
    }

    /// The file written.
    pub(super) fn file(&self) -> &File {
        &self.file
    }

    /// The file and its gate, as a receive into it takes them.
    pub(super) fn shared(&self) -> (&File, &Mutex<()>) {
        (&self.file, &self.gate)
    }
}

/// The output file and its resume record.
pub(super) struct OutFile {
    /// The output file, which every connection splices raw pieces into.
    pub(super) file: SharedFile,
    record: Mutex<File>,
    /// The pieces in the file, as the record lists them.
    written: Mutex<HashSet<(u64, u64)>>,
    /// Where the file starts in the exNode.
    start: u64,
    path: PathBuf,
}

/// `PATH` + `ext`.
fn beside(path: &Path, ext: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

/// Where a download to `path` writes until it is complete and verified.
pub fn partial_path(path: &Path) -> PathBuf {
    beside(path, ".lors-part")
}

/// The record of the pieces a download to `path` has finished.
pub fn record_path(path: &Path) -> PathBuf {
    beside(path, ".lors-resume")
}

/// Names the exNode's data (ranges and read capabilities) in the resume
/// record, so a partial file is only ever resumed from the same exNode.
fn fingerprint(x: &ExNode) -> u64 {
    // FNV-1a: stable across runs and builds, unlike `DefaultHasher`.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for m in &x.mappings {
        let cap = m.read.as_ref().map(|c| c.to_url()).unwrap_or_default();
        let line = format!(
            "{} {} {} {cap}\n",
            m.exnode_offset, m.logical_length, m.alloc_offset
        );
        for b in line.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Longest resume record read: a line per piece.
const MAX_RECORD_BYTES: u64 = 64 << 20;

/// Pieces an earlier run finished, from its resume record: none unless
/// the record is this download's (`header`) and carries the MAC that
/// only this user's key makes over it and the partial file `part` it
/// describes ([`resume_mac`]).
fn resumed(record: &File, header: &str, part: &File) -> HashSet<(u64, u64)> {
    use std::io::Read as _;
    let mut text = String::new();
    if record
        .take(MAX_RECORD_BYTES)
        .read_to_string(&mut text)
        .is_err()
    {
        return HashSet::new();
    }
    let mut lines = text.lines();
    if lines.next() != Some(header) {
        return HashSet::new();
    }
    let Some(want) = resume_mac(header, part) else {
        return HashSet::new();
    };
    let Some(mac) = lines.next().and_then(|l| l.strip_prefix("mac ")) else {
        return HashSet::new();
    };
    if !lors_ibp::caps::ct_eq(mac.as_bytes(), want.as_bytes()) {
        return HashSet::new();
    }
    lines
        .filter_map(|l| {
            let (a, b) = l.split_once(' ')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

/// The MAC that makes a resume record unforgeable: BLAKE3 keyed with
/// this user's resume key ([`resume_key`]) over the record's header and
/// the identity of the partial file (device, inode, owner). Anyone can
/// compute a header from the exNode; without the key nobody else can
/// make a record a download trusts, and a partial file swapped in under
/// the name (another inode) or owned by someone else is not resumed.
/// `None` when there is no key to be had: then nothing is resumed.
fn resume_mac(header: &str, part: &File) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let m = part.metadata().ok()?;
    if !m.is_file() || m.uid() != rustix::process::geteuid().as_raw() {
        return None;
    }
    let key = resume_key()?;
    let msg = format!("{header}\n{} {} {}", m.dev(), m.ino(), m.uid());
    Some(
        blake3::keyed_hash(&key, msg.as_bytes())
            .to_hex()
            .to_string(),
    )
}

/// This user's resume key: 32 random bytes in
/// `$XDG_STATE_HOME/lors/resume.key` (else `~/.local/state/lors/`), made
/// on first use, private to the user.
fn resume_key() -> Option<[u8; 32]> {
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let dir = match std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("lors"),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".local/state/lors"),
    };
    let path = dir.join("resume.key");
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
    };
    let mut key = [0u8; 32];
    if let Ok(mut f) = open() {
        f.read_exact(&mut key).ok()?;
        return Some(key);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .ok()?;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut r| r.read_exact(&mut key))
        .ok()?;
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()));
    match made {
        Ok(()) => Some(key),
        // Made by a download running beside this one: theirs.
        Err(_) => {
            let mut f = open().ok()?;
            f.read_exact(&mut key).ok()?;
            Some(key)
        }
    }
}

/// Opens an existing `path` for resuming, never through a link.
fn open_existing(path: &Path, write: bool, append: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(write && !append)
        .append(append)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Makes `path` anew: whatever is at the name (a file, a planted link)
/// is removed, never followed, and the file is created exclusively.
fn create_fresh(path: &Path, append: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(!append)
        .append(append)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

impl OutFile {
    /// Opens `PATH.lors-part` for the range `start..start+len` of `x`. With
    /// `resume`, a partial file and record from the same exNode, range and
    /// piece size, made by this user ([`resume_mac`]), are kept, and the
    /// pieces the record lists are returned. Otherwise both are made anew;
    /// neither is ever opened through a symbolic link.
    pub(super) fn open(
        path: PathBuf,
        x: &ExNode,
        start: u64,
        len: u64,
        piece_size: u64,
        resume: bool,
    ) -> Result<(OutFile, HashSet<(u64, u64)>)> {
        let header = format!(
            "lors-partial v3 {start} {len} {piece_size} {:016x}",
            fingerprint(x)
        );
        let part = partial_path(&path);
        let record_path = record_path(&path);
        let kept = match resume {
            true => open_existing(&part, true, false)
                .and_then(|p| Ok((p, open_existing(&record_path, false, true)?)))
                .ok()
                .map(|(p, r)| {
                    let done = resumed(&r, &header, &p);
                    (p, r, done)
                })
                .filter(|(_, _, done)| !done.is_empty()),
            false => None,
        };
        // The data goes to PATH.lors-part, renamed to PATH once complete:
        // a file under the final name is always whole.
        let (file, mut record, done) = match kept {
            Some(k) => k,
            None => {
                let file = create_fresh(&part, false)
                    .map_err(|e| Error::io(format!("opening {}", part.display()), e))?;
                let record = create_fresh(&record_path, true)
                    .map_err(|e| Error::io(format!("opening {}", record_path.display()), e))?;
                (file, record, HashSet::new())
            }
        };
        file.set_len(len)
            .map_err(|e| Error::io(format!("sizing {}", part.display()), e))?;
        if done.is_empty() {
            // Without a key there is no MAC, and the next run starts over.
            let mac = resume_mac(&header, &file).unwrap_or_default();
            writeln!(record, "{header}\nmac {mac}")
                .map_err(|e| Error::io("writing the resume record", e))?;
        }
        let out = OutFile {
            file: SharedFile::new(file),
            record: Mutex::new(record),
            written: Mutex::new(done.clone()),
            start,
            path,
        };
        Ok((out, done))
    }

    /// Writes a piece fetched into memory at `pos` and records it.
    pub(super) fn write_piece(&self, pos: u64, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.write_parts(pos, [(data, 0)])?;
        self.record(offset, data.len() as u64)
    }

    /// Writes each `(bytes, at)` at `pos + at`, through the gate raw
    /// pieces are spliced through: writers of one file queue in the kernel
    /// anyway (the inode lock), and there a waiter spins on the CPU the
    /// others' checksums need.
    pub(super) fn write_parts<'a>(
        &self,
        pos: u64,
        parts: impl IntoIterator<Item = (&'a [u8], u64)>,
    ) -> std::io::Result<()> {
        let (file, gate) = self.file.shared();
        let _one_at_a_time = gate.lock().unwrap_or_else(|e| e.into_inner());
        for (data, at) in parts {
            file.write_all_at(data, pos + at)?;
        }
        Ok(())
    }

    /// Notes a piece as done. The record follows the data: a piece listed
    /// there is in the file.
    pub(super) fn record(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let mut r = self.record.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(r, "{offset} {len}")?;
        drop(r);
        (self.written.lock().unwrap_or_else(|e| e.into_inner())).insert((offset, len));
        Ok(())
    }

    /// Piece `offset..offset+len` of the exNode read back, if it is in the
    /// file (recorded as a piece whole).
    pub(super) fn read_back(&self, offset: u64, len: u64) -> Option<std::io::Result<Vec<u8>>> {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if !written.contains(&(offset, len)) {
            return None;
        }
        drop(written);
        let mut buf = vec![0; usize::try_from(len).ok()?];
        let pos = offset.checked_sub(self.start)?;
        Some(self.file.file().read_exact_at(&mut buf, pos).map(|()| buf))
    }

    /// Every piece is in: flush, move the file to its final name and drop
    /// the record.
    pub(super) fn finish(&self) -> Result<()> {
        let path = &self.path;
        let part = partial_path(path);
        self.file
            .file()
            .sync_all()
            .map_err(|e| Error::io(format!("flushing {}", part.display()), e))?;
        std::fs::rename(&part, path).map_err(|e| {
            let what = format!(
                "renaming the complete {} to {}",
                part.display(),
                path.display()
            );
            Error::io(what, e)
        })?;
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
        let _ = std::fs::remove_file(record_path(path));
        Ok(())
    }
}

/// Buffers of pieces that pass through memory, kept for the next pieces. A
/// download reuses the same few instead of asking the allocator for a fresh
/// 10 MiB block per piece, which glibc spreads over per-thread arenas and
/// does not give back: that alone doubled the peak RSS. A reader of
/// [`super::Output::Pieces`] gives the buffers it is done with back here.
///
/// [`Buffers::slabs`] cuts pieces one after another out of large
/// allocations instead, so pieces taken in a row lie side by side in
/// memory and their reader can join them again without a copy
/// ([`BytesMut::try_unsplit`]): xio answers a read that spans pieces from
/// one slice.
///
/// ```
/// use bytes::BytesMut;
/// let pool = lors::download::Buffers::new(8);
/// pool.give(BytesMut::zeroed(256 << 10)); // reused by the next piece read
/// ```
#[derive(Debug)]
pub struct Buffers {
    free: Mutex<Free>,
    keep: usize,
    /// Size of the regions pieces are cut from; 0: a buffer per piece.
    slab: usize,
}

#[derive(Debug, Default)]
struct Free {
    spare: Vec<BytesMut>,
    /// What is left of the region the next piece is cut from (slabs).
    cut: BytesMut,
}

impl Free {
    /// A spare buffer with room for `len` bytes, else a new one of `new`
    /// (at least `len`) bytes; never one too small grown, which would copy
    /// what it held.
    fn spare_for(&mut self, len: usize, new: usize) -> BytesMut {
        match self.spare.iter().position(|b| b.capacity() >= len) {
            Some(p) => self.spare.swap_remove(p),
            None => BytesMut::with_capacity(len.max(new)),
        }
    }
}

impl Buffers {
    /// A pool that keeps up to `keep` free buffers.
    pub fn new(keep: usize) -> Self {
        Self::slabs(keep, 0)
    }

    /// A pool that cuts pieces in a row from regions of `slab` bytes (or
    /// of the piece's size, when larger), keeping up to `keep` whole
    /// regions given back.
    pub fn slabs(keep: usize, slab: usize) -> Self {
        Buffers {
            free: Mutex::new(Free::default()),
            keep,
            slab,
        }
    }

    /// An empty buffer with room for `len` bytes, reused when one is free.
    /// The bytes are read into its room (`Connection::load_buf`): no pass
    /// over the memory before they land.
    pub(crate) fn take(&self, len: u64) -> BytesMut {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if self.slab > 0 {
            if free.cut.capacity() < len {
                // The rest of this region is too short for the piece (and
                // stays with the pieces already cut from it).
                free.cut = free.spare_for(len, self.slab);
            }
            let rest = free.cut.split_off(len);
            return std::mem::replace(&mut free.cut, rest);
        }
        free.spare_for(len, len)
    }

    /// Keeps `b`'s memory for later pieces, up to `keep` buffers. With
    /// slabs, the last piece of a slab given back brings back the whole
    /// slab; the others are only dropped.
    pub fn give(&self, mut b: BytesMut) {
        b.clear();
        if self.slab > 0 {
            // The whole slab, if `b` is the last piece of it (empty, so
            // nothing is copied); otherwise nothing.
            let whole = Vec::from(b);
            if whole.capacity() < self.slab {
                return;
            }
            b = BytesMut::from(Bytes::from(whole));
        }
        if b.capacity() == 0 {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.spare.len() < self.keep {
            free.spare.push(b);
        }
    }
}

/// Zeros to hand out for a sparse file's holes (written from, or shared
/// as a static buffer by the xio cache).
pub(crate) static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// A fetched stream piece on its way to the writer, with the memory slot it
/// holds until written.
pub(super) type Held = (usize, Data, Option<OwnedSemaphorePermit>);

/// A piece's bytes: in memory, or kept in kernel pipes
/// ([`super::Output::Pieces`] with `spliced`), which a FUSE mount hands on
/// to the kernel without copying them through memory first. As delivered
/// (the default parameters: a pool buffer, pipes owned), or
/// [`frozen`](Data::freeze) to be shared by many readers (a cache's
/// pieces).
#[derive(Debug, Clone)]
pub enum Data<M = BytesMut, P = lors_ibp::spliced::Spliced> {
    /// In memory (a buffer of the download's pool, as delivered).
    Mem(M),
    /// In pipes ([`lors_ibp::spliced`]).
    Spliced(P),
}

/// [`Data`] frozen: shared, read any number of times.
pub type Frozen = Data<Bytes, std::sync::Arc<lors_ibp::spliced::Spliced>>;

impl<M: AsRef<[u8]>, P: std::borrow::Borrow<lors_ibp::spliced::Spliced>> Data<M, P> {
    /// How many bytes.
    pub fn len(&self) -> usize {
        match self {
            Data::Mem(b) => b.as_ref().len(),
            Data::Spliced(h) => h.borrow().len(),
        }
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Frozen {
    /// Copies the bytes from `from` into `out`.
    ///
    /// # Errors
    /// A pipe could not be read.
    pub fn copy_to(&self, from: usize, out: &mut [u8]) -> std::io::Result<()> {
        match self {
            Data::Mem(b) => {
                out.copy_from_slice(&b[from..from + out.len()]);
                Ok(())
            }
            Data::Spliced(h) => h.copy_to(from, out),
        }
    }
}

impl Data {
    /// The bytes made shareable: a buffer frozen, pipes put behind an `Arc`.
    pub fn freeze(self) -> Frozen {
        match self {
            Data::Mem(b) => Data::Mem(b.freeze()),
            Data::Spliced(h) => Data::Spliced(std::sync::Arc::new(h)),
        }
    }

    /// The bytes in memory: spliced ones are copied out.
    ///
    /// # Errors
    /// A pipe could not be read.
    pub fn into_mem(self) -> std::io::Result<BytesMut> {
        match self {
            Data::Mem(b) => Ok(b),
            Data::Spliced(h) => h.to_vec().map(|v| BytesMut::from(Bytes::from(v))),
        }
    }
}

/// A piece of an [`super::Output::Pieces`] download, in order. Its bytes
/// count against the download's [`super::DownloadOptions::memory`] until
/// [`Piece::into_data`] takes them: a reader that falls behind holds the
/// download back instead of letting it fill memory.
#[derive(Debug)]
pub struct Piece {
    data: Data,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Piece {
    /// How many bytes.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The bytes, no longer counted against the download's memory.
    pub fn into_data(self) -> Data {
        self.data
    }
}

/// Where a stream's pieces go, in order.
pub(super) enum Sink {
    /// Written out; each buffer goes back to the pool.
    Writer(Box<dyn AsyncWrite + Unpin + Send>),
    /// Handed over whole.
    Pieces(mpsc::Sender<Piece>),
}

impl Sink {
    async fn put(
        &mut self,
        data: Data,
        slot: Option<OwnedSemaphorePermit>,
        bufs: &Buffers,
    ) -> std::io::Result<()> {
        match self {
            Sink::Writer(w) => {
                // (Only pieces handed over whole are ever spliced.)
                let data = data.into_mem()?;
                w.write_all(&data).await?;
                bufs.give(data);
                Ok(())
            }
            Sink::Pieces(tx) => (tx.send(Piece { data, _slot: slot }).await).map_err(|_| gone()),
        }
    }

    /// `n` zeros: a hole of a sparse file, read from no depot.
    async fn zeros(&mut self, mut n: u64) -> std::io::Result<()> {
        while n > 0 {
            let k = match self {
                Sink::Writer(w) => {
                    let k = n.min(ZEROS.len() as u64) as usize;
                    w.write_all(&ZEROS[..k]).await?;
                    k
                }
                Sink::Pieces(tx) => {
                    let k = n.min(super::STREAM_PIECE) as usize;
                    let data = Data::Mem(BytesMut::zeroed(k));
                    tx.send(Piece { data, _slot: None })
                        .await
                        .map_err(|_| gone())?;
                    k
                }
            };
            n -= k as u64;
        }
        Ok(())
    }
}

fn gone() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the reader is gone")
}

/// Writes pieces arriving in any order to `w` in order, holding the early
/// ones. `written(next)` is told each time the first unwritten piece moves;
/// `failed` gets a write error once (the reader went away, the disk is full)
/// and the writer stops. `zeros[i]` zeros go out before piece `i`, and
/// `zeros[n]` after the last of `n` (a sparse file's holes; no holes, no
/// entries).
pub(super) async fn write_in_order(
    mut w: Sink,
    mut rx: mpsc::Receiver<Held>,
    bufs: &Buffers,
    hold: Hold,
    zeros: &[u64],
    written: impl Fn(usize),
    failed: impl Fn(std::io::Error),
) {
    let mut held: BTreeMap<usize, (Data, Option<OwnedSemaphorePermit>)> = BTreeMap::new();
    let mut next = 0usize;
    let mut started = hold.bytes == 0;
    loop {
        let more = rx.recv().await;
        let closed = more.is_none();
        if let Some((i, data, mem)) = more {
            held.insert(i, (data, mem));
        }
        if !started {
            let (mut bytes, mut n) = (0u64, 0usize);
            while let Some((d, _)) = held.get(&(next + n)) {
                bytes += d.len() as u64;
                n += 1;
            }
            if bytes < hold.bytes && n < hold.pieces && !closed {
                continue;
            }
            started = true;
        }
        while let Some((d, mem)) = held.remove(&next) {
            let gap = zeros.get(next).copied().unwrap_or(0);
            if let Err(e) = w.zeros(gap).await {
                return failed(e);
            }
            if let Err(e) = w.put(d, mem, bufs).await {
                return failed(e);
            }
            next += 1;
            written(next);
        }
        if closed {
            // The holes after the last piece, once every piece is out.
            if held.is_empty()
                && next + 1 == zeros.len()
                && let Err(e) = w.zeros(zeros[next]).await
            {
                return failed(e);
            }
            break;
        }
    }
    if let Sink::Writer(w) = &mut w
        && let Err(e) = w.flush().await
    {
        failed(e);
    }
}

/// What a stream holds back before its first write: `bytes` in order from
/// the start, or `pieces` (what the window and memory let it fetch ahead,
/// so holding never waits on itself), whichever comes first.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hold {
    pub bytes: u64,
    pub pieces: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;

    fn filled(v: u8, n: usize) -> Data {
        Data::Mem(BytesMut::from(&vec![v; n][..]))
    }

    /// Runs `write_in_order` into `sink`, holding `hold_bytes` first.
    fn spawn_writer(
        sink: Sink,
        rx: mpsc::Receiver<Held>,
        hold_bytes: u64,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let hold = Hold {
                bytes: hold_bytes,
                pieces: 8,
            };
            let fail = |e| panic!("{e}");
            write_in_order(sink, rx, &Buffers::new(0), hold, &[], |_| {}, fail).await
        })
    }

    /// Nothing reaches the stream until the start-up buffer is complete in
    /// order; then everything does, in order.
    #[tokio::test]
    async fn a_stream_holds_its_start_buffer_then_writes_in_order() {
        let (w, mut r) = tokio::io::duplex(1 << 20);
        let (tx, rx) = mpsc::channel::<Held>(8);
        let writer = spawn_writer(Sink::Writer(Box::new(w)), rx, 3000);
        let mut got = vec![0u8; 4000];
        // Pieces 1 and 2 (2000 bytes) but not piece 0: nothing in order yet.
        tx.send((1, filled(1, 1000), None)).await.unwrap();
        tx.send((2, filled(2, 1000), None)).await.unwrap();
        let early = tokio::time::timeout(std::time::Duration::from_millis(100), r.read(&mut got));
        assert!(early.await.is_err(), "wrote before the start buffer");
        // Piece 0: 3000 bytes in order, the start buffer is full.
        tx.send((0, filled(0, 1000), None)).await.unwrap();
        r.read_exact(&mut got[..3000]).await.unwrap();
        // Afterwards each piece goes out as it comes.
        tx.send((3, filled(3, 1000), None)).await.unwrap();
        r.read_exact(&mut got[3000..]).await.unwrap();
        drop(tx);
        writer.await.unwrap();
        let want: Vec<u8> = (0..4u8).flat_map(|i| vec![i; 1000]).collect();
        assert_eq!(got, want);
    }

    /// Slab pieces taken in a row lie side by side and join again without
    /// a copy; the last piece of a slab given back brings back the whole
    /// slab, and the next pieces are cut from that same memory.
    #[test]
    fn slab_pieces_join_again_and_a_whole_slab_comes_back() {
        let pool = Buffers::slabs(2, 1 << 20);
        let mut pieces: Vec<BytesMut> = (0..5u8)
            .map(|i| {
                let mut b = pool.take(256 << 10);
                assert_eq!((b.len(), b.capacity()), (0, 256 << 10), "empty, with room");
                b.resize(256 << 10, i);
                b
            })
            .collect();
        let fifth = pieces.pop().expect("five");
        let first_at = pieces[0].as_ptr();
        let mut run = pieces.remove(0);
        for p in pieces {
            run.try_unsplit(p).expect("adjacent pieces of one slab");
        }
        assert_eq!(run.as_ptr(), first_at, "joined in place");
        let want: Vec<u8> = (0..4u8).flat_map(|i| vec![i; 256 << 10]).collect();
        assert_eq!(run, want);
        // The fifth piece came from a new slab: it does not join.
        let mut two = run.split_off(512 << 10);
        two.try_unsplit(fifth).expect_err("another slab");
        // Given back while other pieces of its slab live: only dropped.
        let shared = run.freeze();
        pool.give(two);
        assert!(pool.free.lock().unwrap().spare.is_empty());
        // The last piece of the slab given back: the whole slab returns.
        pool.give(shared.try_into_mut().expect("the last piece of its slab"));
        assert_eq!(pool.free.lock().unwrap().spare.len(), 1);
        // (The second slab's rest is too short for this piece.)
        let again = pool.take(900 << 10);
        assert_eq!(again.as_ptr(), first_at, "cut from the slab given back");
    }

    /// Pieces handed over whole arrive in order, and each keeps its memory
    /// slot until the reader takes its bytes.
    #[tokio::test]
    async fn pieces_arrive_in_order_holding_their_memory_until_taken() {
        let (tx, rx) = mpsc::channel::<Held>(8);
        let (out, mut pieces) = mpsc::channel::<Piece>(8);
        let mem = Arc::new(tokio::sync::Semaphore::new(3));
        let writer = spawn_writer(Sink::Pieces(out), rx, 0);
        for i in [2usize, 0, 1] {
            let slot = mem.clone().try_acquire_owned().unwrap();
            tx.send((i, filled(i as u8, 100), Some(slot)))
                .await
                .unwrap();
        }
        drop(tx);
        writer.await.unwrap();
        assert_eq!(mem.available_permits(), 0, "slots held by untaken pieces");
        for i in 0..3u8 {
            let p = pieces.recv().await.expect("a piece");
            assert_eq!(p.into_data().into_mem().unwrap(), vec![i; 100]);
            assert_eq!(mem.available_permits(), usize::from(i) + 1);
        }
        assert!(pieces.recv().await.is_none());
    }
}
