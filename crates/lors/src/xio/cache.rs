//! The read side: a cache of the pieces the engine fetched, kept in the
//! buffers they arrived in, and the read-ahead streams that fill it
//! ([`super::readahead`] decides what a read that misses starts).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::{self, ErrorKind};
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::BytesMut;
use lors_exnode::ExNode;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::errno::lors_error;
use super::readahead::{Miss, Running, Step, decide};
use super::{FETCH, runtime};
use crate::download::{
    Buffers, Data, DownloadOptions, Frozen, Output, Piece, STREAM_PIECE, Stats, download,
};
use crate::{NoProgress, Pool};

/// The reads of a file opened read-only, for many threads at once (the
/// FUSE mount's threads read a file so): each waits only for its own
/// bytes, so a read waiting on the network holds back none whose bytes are
/// cached or arrive sooner. From [`File::reads`](super::File::reads); clones share the cache
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
    pub(super) shared: Arc<Cache>,
    pub(super) size: u64,
}

impl Reads {
    /// As [`super::File::read_with`]: up to `len` bytes at `offset` (fewer only at
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
    /// ([`OpenOptions::spliced`](super::OpenOptions::spliced)) go by reference, others are copied.
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
pub(super) struct Source {
    pub(super) x: ExNode,
    pub(super) pool: Arc<Pool>,
    pub(super) last_resort: HashSet<String>,
    /// The first byte a writer holds buffered or is storing: no read-ahead
    /// reaches it (those bytes are in no mapping yet; a read of them
    /// stores them first).
    pub(super) stored_below: u64,
}

/// The read cache and the read-ahead of an open file, for the threads
/// reading it. Nobody holds the lock while waiting on the network: the
/// thread that needs the read-ahead's next piece takes its receiver out,
/// waits, puts the piece in the cache and gives the receiver back; others
/// needing bytes the read-ahead is bringing wait for `arrived`, others
/// still read what is cached.
pub(super) struct Cache {
    state: Mutex<CacheState>,
    /// A piece came in, or a stream failed or changed hands.
    pub(super) arrived: Condvar,
}

impl Cache {
    pub(super) fn new(cache: u64, readahead: usize, spliced: bool) -> Arc<Cache> {
        Arc::new(Cache {
            state: Mutex::new(CacheState::new(cache, readahead, spliced)),
            arrived: Condvar::new(),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands the `n` bytes at `off` (all within the file) to `f`: in place
    /// when they lie in one piece.
    pub(super) fn read_with<R>(
        &self,
        off: u64,
        n: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        if n == 0 {
            return Ok(f(&[]));
        }
        let (at, p) = self.piece(off, n)?;
        let within = (off - at) as usize;
        if let Data::Mem(p) = &p
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
        if st.scratch.len() < CacheState::SCRATCH && buf.len() <= CacheState::SCRATCH_MAX {
            st.scratch.push(buf);
        }
        r
    }

    /// Fills `out` with the bytes at `off` (all within the file).
    pub(super) fn read_into(&self, mut off: u64, mut out: &mut [u8]) -> io::Result<()> {
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
                Data::Spliced(h) => h.tee_to(within, k, to)?,
                Data::Mem(b) => lors_ibp::spliced::write_to(to, &b[within..within + k])?,
            }
            off += k as u64;
            n -= k;
        }
        Ok(())
    }

    /// The piece holding byte `off` and where it starts, with the (up to)
    /// `want` bytes from `off` in it counted as read: from the cache, the
    /// read-ahead or the depots.
    fn piece(&self, off: u64, want: usize) -> io::Result<(u64, Frozen)> {
        let mut st = self.lock();
        // A sparse file's hole is zeros from here, not from a depot.
        if let Some(z) = (st.source.as_ref()).and_then(|s| hole_zeros(&s.x, off, want)) {
            st.last_end = off + z.len() as u64;
            return Ok((off, z));
        }
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
            let miss = Miss {
                off,
                size: src.x.logical_size().min(src.stored_below),
                sequential,
                readahead: st.readahead as u64,
                running: st.stream.as_ref().map(|s| Running {
                    next: s.next,
                    end: s.end,
                    free: s.rx.is_some(),
                }),
            };
            let (id, mut rx) = match decide(&miss) {
                Step::Eof => {
                    return Err(io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "the exNode ends early",
                    ));
                }
                Step::Next => {
                    let s = st.stream.as_mut().expect("a running read-ahead");
                    (s.id, s.rx.take().expect("a free read-ahead"))
                }
                Step::Wait => {
                    // Another reader is taking the read-ahead's next piece:
                    // it says when one arrives. (Looked at again now and
                    // then all the same: a missed wake-up costs a second,
                    // not a hang.)
                    waited = st.stream.as_ref().map(|s| s.id);
                    st = (self.arrived.wait_timeout(st, Duration::from_secs(1)))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    continue;
                }
                Step::Side { start, len } => {
                    let side = st.fetch(&src, start, len);
                    let epoch = st.epoch;
                    drop(st);
                    return self.side(epoch, side, off, want);
                }
                Step::Start { start, len } => {
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
                && took < 2 * CacheState::SLAB
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
                done.extend(s.tail.take().map(|(at, t)| (at, Data::Mem(t.freeze()))));
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
    fn fail(&self, mut st: MutexGuard<'_, CacheState>, id: u64, e: Option<io::Error>) -> io::Error {
        let mut s = st.stream.take();
        // What arrived before is good.
        if let Some((at, t)) = s.as_mut().and_then(|s| s.tail.take()) {
            st.put(at, Data::Mem(t.freeze()));
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
    ) -> io::Result<(u64, Frozen)> {
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
            let p = piece.into_data().freeze();
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
pub(super) fn clip(size: u64, off: u64, len: usize) -> usize {
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
pub(super) struct CacheState {
    /// Pieces of the file as the read-ahead delivered them, by first byte,
    /// with the bytes read from each.
    pieces: BTreeMap<u64, (Frozen, usize)>,
    /// First bytes of the pieces not yet read whole, least recently used
    /// first.
    order: VecDeque<u64>,
    /// First bytes of the pieces read whole, oldest first: kept
    /// [`CacheState::BEHIND`] deep for a look back, then their buffers go back
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
    /// See [`Cache::read_with`].
    scratch: Vec<Vec<u8>>,
    /// What to fetch from; `None` once the file changed, until the next
    /// read.
    pub(super) source: Option<Arc<Source>>,
    /// The last stream to fail and why, for the readers that waited on it.
    failed: Option<(u64, io::Error)>,
    /// Streams started, to tell them apart.
    streams: u64,
    /// Times the file changed: a piece fetched before is not cached.
    epoch: u64,
    /// The read-ahead keeps raw pieces in pipes ([`OpenOptions::spliced`]).
    spliced: bool,
}

impl CacheState {
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

    fn new(cache: u64, readahead: usize, spliced: bool) -> CacheState {
        CacheState {
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
    fn take(&mut self, off: u64, want: usize) -> Option<(u64, Frozen)> {
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
            self.put(at, Data::Mem(t.freeze()));
        }
    }

    /// The cached piece holding byte `off` and where it starts.
    fn find(&self, off: u64) -> Option<(u64, &Frozen)> {
        let (&at, (p, _)) = self.pieces.range(..=off).next_back()?;
        (off < at + p.len() as u64).then_some((at, p))
    }

    /// As [`CacheState::find`], marking the piece used.
    fn get(&mut self, off: u64) -> Option<(u64, Frozen)> {
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

    fn put(&mut self, at: u64, p: Frozen) {
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
    fn recycle(&self, p: Frozen) {
        if let Data::Mem(p) = p
            && let Ok(b) = p.try_into_mut()
        {
            self.buffers.give(b);
        }
    }

    /// The file changed: nothing read before is current.
    pub(super) fn invalidate(&mut self) {
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
    fn add(&mut self, p: Data) -> Vec<(u64, Frozen)> {
        let at = self.next;
        self.next += p.len() as u64;
        let p = match p {
            Data::Mem(p) => p,
            held @ Data::Spliced(_) => {
                let tail = self.tail.take().map(|(at, t)| (at, Data::Mem(t.freeze())));
                return tail.into_iter().chain([(at, held.freeze())]).collect();
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
            .map(|(at, t)| (at, Data::Mem(t.freeze())))
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

/// Zeros for up to `want` bytes at `off` when a hole of `x` holds it (as
/// many as the hole has from there, at most a static megabyte's worth).
fn hole_zeros(x: &lors_exnode::ExNode, off: u64, want: usize) -> Option<Frozen> {
    use crate::download::output::ZEROS;
    let h = x.hole_at(off)?;
    let k = usize::try_from(h.end() - off)
        .unwrap_or(usize::MAX)
        .min(want)
        .min(ZEROS.len());
    Some(Data::Mem(bytes::Bytes::from_static(&ZEROS[..k])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xio::{DEFAULT_CACHE, DEFAULT_READAHEAD};

    const P: usize = 256 << 10;

    fn piece(fill: u8) -> Frozen {
        Data::Mem(bytes::Bytes::from(vec![fill; P]))
    }

    fn bytes(c: &Frozen) -> Vec<u8> {
        let mut v = vec![0u8; c.len()];
        c.copy_to(0, &mut v).unwrap();
        v
    }

    /// Pieces read out of order (FUSE's read-ahead requests arrive so) stay
    /// until every byte of them was read, however far later reads ran.
    #[test]
    fn a_piece_stays_until_read_whole_in_any_order() {
        let mut r = CacheState::new(DEFAULT_CACHE, DEFAULT_READAHEAD, false);
        let n = 2 * (CacheState::BEHIND as usize / P) + 4;
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
        let behind = CacheState::BEHIND / P as u64;
        let want: Vec<u64> = std::iter::once(0)
            .chain(n as u64 - behind..n as u64)
            .collect();
        assert_eq!(kept, want);
        assert_eq!(r.bytes, (1 + behind) * P as u64);
        // Its other half read, it goes behind too, and the oldest goes.
        r.consumed(0, P / 2);
        assert!(r.find(0).is_some(), "just read: kept for a look back");
        assert_eq!(r.passed_bytes, CacheState::BEHIND);
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
        let mut r = CacheState::new(DEFAULT_CACHE, DEFAULT_READAHEAD, false);
        r.stream = Some(s);
        r.settle_tail(5 * P as u64 + 7);
        assert!(r.stream.as_ref().unwrap().tail.is_none());
        let (at, p) = r.get(5 * P as u64).expect("in the cache");
        assert_eq!((at, p.len(), bytes(&p)[P]), (4 * P as u64, 2 * P, 5));
    }

    /// The cache's capacity drops what was read whole before what was not.
    #[test]
    fn a_full_cache_drops_read_pieces_first() {
        let mut r = CacheState::new(0, DEFAULT_READAHEAD, false); // the floor: 4 MiB
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
