//! Upload: input → blocks → allocations on depots → exNode.
//!
//! Placement is "least busy first": each block goes to the usable depot with
//! the fewest transfers in flight, so faster depots, finishing sooner, take
//! more blocks. A depot that fails is skipped for the rest of the upload and
//! the block retried elsewhere. Copies after the first are made by the depot
//! holding the block (SEND), not re-sent by us; if that fails we store the
//! copy from memory.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lors_exnode::Function;
use lors_exnode::erasure::Scheme;
use lors_exnode::functions::{Codec, E2eError, stored_digest};
use lors_exnode::{ExNode, Mapping, Metadata};
use lors_ibp::CapSet;
use lors_ibp::proto::Reliability;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::Semaphore;

use crate::error::{Cause, Error, Result};
use crate::pool::Pool;
use crate::progress::{Event, Progress};
use crate::stall::{Kind, Watcher};

mod distance;
mod e2e;
mod sparse;
mod stripes;

pub use distance::Slots;
pub use e2e::E2e;

/// Upload settings.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// Depots (`host:port`) to use.
    pub depots: Vec<String>,
    /// Block (allocation) size in bytes.
    pub block_size: u64,
    /// Replicas of each block, on distinct depots.
    pub copies: usize,
    /// Blocks in flight at once.
    pub threads: usize,
    /// Allocation lifetime.
    pub duration: Duration,
    /// Hard or soft storage.
    pub reliability: Reliability,
    /// File name recorded in the exNode.
    pub filename: String,
    /// End-to-end functions applied to every block (`None`: bytes as they are).
    pub e2e: Option<Codec>,
    /// Erasure-code the file instead of copying it: stripes of `k` data
    /// blocks and `m` parity blocks, each on a depot of its own (`copies`
    /// is then not used). See [`lors_exnode::erasure`].
    pub erasure: Option<Scheme>,
    /// A regular file's holes (`SEEK_HOLE`) of a MiB or more are recorded
    /// in the exNode, not stored ([`lors_exnode::Hole`]); not with
    /// `erasure`. Off, every byte is stored, as the LoRS 0.82 tools need
    /// to read the file.
    pub sparse: bool,
    /// `threads` was not chosen by hand: depots far away raise it, one
    /// block in flight per [`crate::download::RTT_PER_CONNECTION`] of
    /// their round trips (up to [`crate::download::MAX_AUTO_CONNECTIONS`]),
    /// measured by a connect to each before the first block.
    pub auto_threads: bool,
    /// `block_size` was not chosen by hand: when distance raises
    /// `threads`, a file too small to give each four blocks is cut into
    /// smaller ones (not below 256 KiB), and blocks held in memory (a
    /// stream, end-to-end functions) shrink to keep within the memory
    /// eight default blocks take.
    pub auto_block_size: bool,
}

impl Default for UploadOptions {
    /// No depots yet; 10 MiB blocks, 3 copies, 8 threads (both fitted to
    /// the depots' distance), a day's hard lease, sparse files kept
    /// sparse, no end-to-end functions: what `lors upload` does when
    /// nothing is set.
    fn default() -> Self {
        UploadOptions {
            depots: Vec::new(),
            block_size: 10 << 20,
            copies: 3,
            threads: 8,
            duration: Duration::from_secs(86_400),
            reliability: Reliability::Hard,
            filename: String::new(),
            e2e: None,
            erasure: None,
            sparse: true,
            auto_threads: true,
            auto_block_size: true,
        }
    }
}

impl UploadOptions {
    /// The options settings `s` give an upload of `filename` onto `depots`
    /// (block size 10 MiB, 3 copies and 8 threads where nothing set them,
    /// the threads and block size fitted to the depots' distance).
    pub fn from_settings(
        s: &crate::settings::Settings,
        depots: Vec<String>,
        filename: String,
        e2e: Option<Codec>,
    ) -> UploadOptions {
        let d = UploadOptions::default();
        UploadOptions {
            depots,
            block_size: s.block_size.unwrap_or(d.block_size),
            copies: s.copies.unwrap_or(d.copies),
            threads: s.threads.unwrap_or(d.threads),
            duration: s.duration,
            reliability: s.reliability,
            filename,
            e2e,
            erasure: s.erasure,
            auto_threads: s.threads.is_none(),
            auto_block_size: s.block_size.is_none(),
            ..d
        }
    }

    /// What the upload asks of the depots it is to find: how many distinct
    /// ones (a copy, or a block of a stripe, each on a depot of its own) and
    /// room for one allocation (a block with its e2e overhead).
    pub fn need(&self) -> (usize, u64) {
        let spread = self.erasure.map_or(self.copies, |e| e.blocks());
        let bs = self.block_size;
        (spread, bs + bs / 64 + (64 << 10))
    }
}

struct Depots {
    addrs: Vec<String>,
    busy: Vec<usize>,
    dead: Vec<bool>,
}

impl Depots {
    /// A live depot not in `avoid`, marked busy: the least busy; or, with
    /// `slack`, the first from `salt` on that is within `slack` transfers
    /// of the least busy (an erasure-coded stripe's blocks keep their
    /// rotation, so each depot holds its share of data blocks, while a
    /// depot that falls behind is still passed over).
    fn pick(&mut self, avoid: &HashSet<usize>, salt: usize, slack: usize) -> Option<usize> {
        let n = self.addrs.len();
        let usable = || {
            (0..n)
                .map(move |k| (k + salt) % n)
                .filter(|i| !self.dead[*i] && !avoid.contains(i))
        };
        let least = usable().map(|i| self.busy[i]).min()?;
        let best = usable().find(|&i| self.busy[i] <= least + slack)?;
        self.busy[best] += 1;
        Some(best)
    }
    fn release(&mut self, i: usize) {
        self.busy[i] = self.busy[i].saturating_sub(1);
    }
}

/// A block's stored bytes: in memory (read from a stream, or encoded), or a
/// range of the input file, sent from the file with `sendfile(2)`.
enum Data {
    Mem(Vec<u8>),
    Range(Arc<std::fs::File>, u64, u64),
}

impl Data {
    fn len(&self) -> u64 {
        match self {
            Data::Mem(b) => b.len() as u64,
            Data::Range(_, _, len) => *len,
        }
    }
}

/// What to put on a depot: the first copy (stored from memory) or a further
/// one (copied from a depot that holds the block).
enum Job<'a> {
    Store,
    CopyFrom(&'a CapSet),
}

struct Uploader {
    opts: UploadOptions,
    pool: Arc<Pool>,
    depots: Mutex<Depots>,
    progress: Arc<dyn Progress>,
    /// Every allocation made and not released: what a failed upload frees.
    made: Arc<Mutex<Vec<Mapping>>>,
    /// ALLOCATEs sent and not yet answered. Each runs to its reply even when
    /// the block that asked is cut off (an interrupt, a stall), so that what
    /// the depot allocates reaches the ledger rather than being left there
    /// unnamed; the upload waits (bounded) for them before it settles.
    allocating: Arc<tokio::sync::watch::Sender<Vec<String>>>,
    /// How long depot commands take here: what a hung depot is told apart by.
    watch: Arc<Watcher>,
    /// Where its allocations are written down ([`Control::journal`]).
    journal: Option<Arc<crate::commit::Journal>>,
    /// Copies stored so far (a block waiting on busy depots waits on while
    /// this moves).
    stored: std::sync::atomic::AtomicU64,
}

impl Uploader {
    fn lock(&self) -> std::sync::MutexGuard<'_, Depots> {
        self.depots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn made(&self) -> std::sync::MutexGuard<'_, Vec<Mapping>> {
        self.made.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Releases an allocation of ours; it stays in the ledger if that fails
    /// (or takes the stall time: the final sweep tries again, bounded).
    async fn release(&self, caps: &CapSet) {
        let addr = caps.manage.address();
        if (self
            .watch
            .run(&[&addr], Kind::Op, self.pool.release(&caps.manage))
            .await)
            .is_ok()
        {
            self.made()
                .retain(|m| m.manage.as_ref() != Some(&caps.manage));
        }
    }

    /// Allocates for the block at `offset` on `addr` and notes it in the ledger.
    async fn allocate(
        &self,
        addr: &str,
        offset: u64,
        len: u64,
        data: &Data,
    ) -> lors_ibp::Result<CapSet> {
        let (pool, made, count, journal) = (
            self.pool.clone(),
            self.made.clone(),
            self.allocating.clone(),
            self.journal.clone(),
        );
        let (rel, dur, size, at) = (
            self.opts.reliability,
            self.opts.duration,
            data.len(),
            addr.to_owned(),
        );
        count.send_modify(|v| v.push(at.clone()));
        let alloc = tokio::spawn(async move {
            let noted = (journal.as_deref()).map(|j| (j, crate::pool::Provisional::WhereNear));
            let r = pool.allocate_into(&at, rel, dur, size, noted).await;
            if let Ok(caps) = &r {
                let m = mapping(offset, len, size, &None, caps.clone());
                made.lock().unwrap_or_else(|e| e.into_inner()).push(m);
            }
            count.send_modify(|v| {
                if let Some(i) = v.iter().position(|a| *a == at) {
                    v.swap_remove(i);
                }
            });
            r
        });
        let answer = async {
            alloc.await.unwrap_or_else(|e| {
                Err(lors_ibp::Error::Local {
                    during: "allocating",
                    source: std::io::Error::other(e.to_string()),
                })
            })
        };
        self.watch.run(&[addr], Kind::Op, answer).await
    }

    /// Waits, at most [`crate::stall::RELEASE_WAIT`], for ALLOCATEs still
    /// out to be answered, so their allocations are in the ledger — but
    /// not for those to depots given up on (hung: they would not answer).
    async fn settle(&self) {
        let mut rx = self.allocating.subscribe();
        let settled = |v: &Vec<String>| {
            let d = self.lock();
            v.iter()
                .all(|a| (d.addrs.iter().position(|x| x == a)).is_some_and(|i| d.dead[i]))
        };
        let _ = tokio::time::timeout(crate::stall::RELEASE_WAIT, rx.wait_for(settled)).await;
    }

    /// After a failure: releases everything the upload allocated. Returns
    /// `cause`, wrapped with what was released and what could not be (the
    /// depot is down or unreachable), named in an exNode.
    async fn abandon(&self, cause: Error) -> Error {
        self.settle().await;
        let made = std::mem::take(&mut *self.made());
        if made.is_empty() {
            return cause;
        }
        let total = made.len();
        let x = self.unreleased(self.pool.release_all(made).await);
        Error::Abandoned {
            cause: Box::new(cause),
            released: total - x.mappings.len(),
            stranded: x,
        }
    }

    /// After an interrupt: the blocks stored whole (`results`), and the
    /// allocations of blocks cut off, released within a bounded wait or
    /// named as stranded.
    async fn interrupted(&self, mut results: Vec<(usize, Vec<Mapping>)>) -> Error {
        self.settle().await;
        results.sort_by_key(|(i, _)| *i);
        let mut stored = ExNode::of_file(&self.opts.filename);
        stored.mappings = results.into_iter().flat_map(|(_, m)| m).collect();
        let used: HashSet<&lors_ibp::Capability> = (stored.mappings.iter())
            .filter_map(|m| m.manage.as_ref())
            .collect();
        let cut: Vec<Mapping> = std::mem::take(&mut *self.made())
            .into_iter()
            .filter(|m| m.manage.as_ref().is_some_and(|c| !used.contains(c)))
            .collect();
        let total = cut.len();
        let kept = self.pool.release_all(cut).await;
        Error::Interrupted {
            released: total - kept.len(),
            stranded: self.unreleased(kept),
            stored: Box::new(stored),
        }
    }

    /// An exNode naming allocations the upload could not release.
    fn unreleased(&self, mappings: Vec<Mapping>) -> ExNode {
        let mut x = ExNode::of_file(&self.opts.filename);
        x.set_meta(Metadata::string(
            "lors_unreleased",
            "allocations an upload could not release; free them with lors trim --decrement",
        ));
        x.mappings = mappings;
        x
    }

    fn fail(&self, i: usize, err: &lors_ibp::Error) {
        let mut d = self.lock();
        d.release(i);
        // A depot that is full or refuses us is skipped from now on; so is one
        // we cannot reach.
        if !d.dead[i] {
            d.dead[i] = true;
            let addr = d.addrs[i].clone();
            drop(d);
            self.progress.event(&Event::Failover {
                depot: addr,
                why: err.to_string(),
            });
        }
    }

    async fn store(&self, cap: &lors_ibp::Capability, data: &Data) -> lors_ibp::Result<u64> {
        let sent = async {
            match data {
                Data::Mem(b) => self.pool.store(cap, b).await,
                Data::Range(f, pos, len) => self.pool.store_file(cap, f, *pos, *len).await,
            }
        };
        self.watch
            .run(&[&cap.address()], Kind::Bytes(data.len()), sent)
            .await
    }

    /// Stores `data` into a fresh allocation on `addr`, released again if
    /// the STORE fails — unless the depot stopped answering: it would not
    /// answer the DECR either, and the ledger keeps it for the final sweep.
    async fn store_new(
        &self,
        addr: &str,
        (offset, len): (u64, u64),
        data: &Data,
    ) -> lors_ibp::Result<CapSet> {
        let caps = self.allocate(addr, offset, len, data).await?;
        if let Err(e) = self.store(&caps.write, data).await {
            if !matches!(e, lors_ibp::Error::Timeout { .. }) {
                self.release(&caps).await;
            }
            return Err(e);
        }
        Ok(caps)
    }

    /// One attempt at `job` for the `len` bytes at `offset` on depot `addr`.
    /// An allocation it cannot fill is released.
    async fn attempt(
        &self,
        addr: &str,
        (offset, len): (u64, u64),
        data: &Data,
        job: &Job<'_>,
    ) -> lors_ibp::Result<CapSet> {
        let Job::CopyFrom(src) = job else {
            return self.store_new(addr, (offset, len), data).await;
        };
        let caps = self.allocate(addr, offset, len, data).await?;
        let from = src.read.address();
        let copy = self.pool.send(&src.read, &caps.write, 0, data.len());
        if let Err(e) = self
            .watch
            .run(&[&from, addr], Kind::Bytes(data.len()), copy)
            .await
        {
            // Depot-to-depot failed (the depots cannot reach each other, or
            // the source died or hung). Part or all of the copy may have
            // landed in `caps` all the same, so we send ours into a fresh
            // allocation and release that one.
            self.progress.event(&Event::Retry {
                depot: from,
                why: format!("copy to {addr} failed ({e}); sending it from here"),
            });
            self.release(&caps).await;
            return self.store_new(addr, (offset, len), data).await;
        }
        Ok(caps)
    }

    /// Does `job` on the least-busy usable depot not in `avoid`, moving on to
    /// the next when it fails (a failed depot is skipped from then on).
    async fn on_some_depot(
        &self,
        (offset, len): (u64, u64),
        data: &Data,
        job: Job<'_>,
        avoid: &Mutex<HashSet<usize>>,
        salt: usize,
    ) -> Result<(usize, CapSet)> {
        let avoid = || avoid.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = Cause::local("no usable depot left");
        // Depots that answered busy (-66) for this block: tried again after
        // a pause once every other depot has been tried, a bounded number
        // of times, rather than given up on as failed.
        let mut busy: Vec<usize> = Vec::new();
        let mut pauses = 0u32;
        let mut stored = self.stored.load(std::sync::atomic::Ordering::Relaxed);
        loop {
            // Picked and marked under one lock: the blocks of a stripe,
            // stored at once, each get a depot of their own.
            let picked = {
                let mut avoid = avoid();
                let slack = if self.opts.erasure.is_some() { 2 } else { 0 };
                let picked = self.lock().pick(&avoid, salt, slack);
                if let Some(i) = picked {
                    avoid.insert(i);
                }
                picked
            };
            let Some(i) = picked else {
                // Blocks stored meanwhile: the depots are busy with ours,
                // not refusing us (their per-client caps are below our
                // blocks in flight, which distance can raise to 128).
                let now = self.stored.load(std::sync::atomic::Ordering::Relaxed);
                if std::mem::replace(&mut stored, now) != now {
                    pauses = 0;
                }
                if busy.is_empty() || pauses >= BUSY_PAUSES {
                    return Err(Error::Store { offset, last });
                }
                pauses += 1;
                let ms = 100 + 50 * (salt as u64 % 8);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                for b in busy.drain(..) {
                    avoid().remove(&b);
                }
                continue;
            };
            let addr = self.lock().addrs[i].clone();
            match self.attempt(&addr, (offset, len), data, &job).await {
                Ok(caps) => {
                    self.lock().release(i);
                    self.stored
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok((i, caps));
                }
                // Our own input failed: another depot will not help.
                Err(lors_ibp::Error::Local { during, source }) => {
                    self.lock().release(i);
                    return Err(Error::io(during, source));
                }
                Err(e) if e.is_busy() => {
                    last = Cause::from(&e);
                    last.depot = Some(addr);
                    self.lock().release(i);
                    busy.push(i);
                }
                Err(e) => {
                    last = Cause::from(&e);
                    last.depot = Some(addr);
                    self.fail(i, &e);
                }
            }
        }
    }
}

/// Rounds of pauses a block waits for busy depots, while no other block
/// is stored, before it fails.
const BUSY_PAUSES: u32 = 50;

fn mapping(
    offset: u64,
    len: u64,
    stored: u64,
    e2e: &Option<(u64, Option<Function>, Option<Metadata>)>,
    caps: CapSet,
) -> Mapping {
    Mapping {
        exnode_offset: offset,
        logical_length: len,
        alloc_offset: 0,
        alloc_length: stored,
        e2e_blocksize: e2e.as_ref().map_or(0, |e| e.0),
        function: e2e.as_ref().and_then(|e| e.1.clone()),
        metadata: e2e.iter().filter_map(|e| e.2.clone()).collect(),
        read: Some(caps.read),
        write: Some(caps.write),
        manage: Some(caps.manage),
    }
}

/// A finished upload.
#[derive(Debug)]
pub struct Uploaded {
    /// The file's exNode: each block's copies in the order they were made.
    pub exnode: ExNode,
    /// Allocations the upload made, could not use (their depot failed
    /// during the STORE) and could not release either: not in `exnode`,
    /// they hold space until their lease ends unless recorded and freed
    /// (`lors trim --decrement`). No mappings when every depot answered.
    pub unreleased: ExNode,
}

/// What an upload is told from outside: when to stop, and what an earlier,
/// interrupted run of it already stored.
#[derive(Debug, Clone, Default)]
pub struct Control {
    /// Turns `true` when the upload should stop (an interrupt): no block is
    /// begun after that, blocks in flight are cut off and their
    /// allocations released, and the upload ends with
    /// [`Error::Interrupted`] naming the blocks stored whole.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// Mappings of blocks an earlier run stored whole, every copy (the
    /// `stored` of its [`Error::Interrupted`]): those blocks are not sent
    /// again. Only for a regular file with the same block size.
    pub done: Vec<Mapping>,
    /// Blocks in flight shared with the other uploads of a batch: this
    /// upload's blocks take their turns there instead of its own
    /// `threads`, and its block size is fitted to the batch's count. Not
    /// for an erasure-coded upload, whose stripes keep their own.
    pub slots: Option<Slots>,
    /// Where each allocation is written down the moment a depot grants it
    /// (`OUT.journal`, [`crate::commit::Journal`]), so that what a run
    /// killed with -9 left is freed by the next ([`crate::commit::settle`]);
    /// `None`: the pool's own journal, if it has one.
    pub journal: Option<Arc<crate::commit::Journal>>,
}

impl Control {
    fn stopped(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| *s.borrow())
    }

    /// Returns once told to stop; never without a stop signal.
    async fn stopping(&self) {
        match self.stop.clone() {
            Some(mut s) => {
                if s.wait_for(|&v| v).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

/// Uploads everything `input` yields. `size` (when known) is only for progress.
///
/// Blocks are read sequentially; at most `threads` are in memory and in flight.
/// On failure every allocation already made is released (DECR); those on
/// depots that cannot be reached are returned in [`Error::Abandoned`] so the
/// caller can record them. On success, the allocations of failed attempts
/// that could not be released are in [`Uploaded::unreleased`].
pub async fn upload<R: AsyncRead + Unpin>(
    input: R,
    size: Option<u64>,
    opts: &UploadOptions,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
) -> Result<Uploaded> {
    upload_with(input, size, opts, pool, progress, Control::default()).await
}

/// [`upload`], stopped as `control` says (a stream has no earlier run to
/// resume: `control.done` must be empty).
pub async fn upload_with<R: AsyncRead + Unpin>(
    input: R,
    size: Option<u64>,
    opts: &UploadOptions,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
    control: Control,
) -> Result<Uploaded> {
    let control = Control {
        done: Vec::new(),
        ..control
    };
    run(
        (Input::Stream(input), None),
        size,
        opts,
        pool,
        progress,
        control,
    )
    .await
}

/// Uploads a whole regular file. Without end-to-end functions each block is
/// sent from the file with `sendfile(2)`: nothing is read into memory.
pub async fn upload_file(
    file: std::fs::File,
    opts: &UploadOptions,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
) -> Result<Uploaded> {
    upload_file_with(file, opts, pool, progress, Control::default()).await
}

/// [`upload_file`], stopped and resumed as `control` says.
pub async fn upload_file_with(
    file: std::fs::File,
    opts: &UploadOptions,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
    control: Control,
) -> Result<Uploaded> {
    let size = file
        .metadata()
        .map_err(|e| Error::io("reading the input's size", e))?
        .len();
    let layout = match opts.sparse && opts.erasure.is_none() {
        true => {
            sparse::layout(&file, size).map_err(|e| Error::io("finding the input's holes", e))?
        }
        false => None,
    };
    let input = if opts.e2e.is_some() {
        Input::<tokio::io::Empty>::Read(tokio::fs::File::from_std(file))
    } else {
        Input::File(Arc::new(file), size)
    };
    let total = layout.as_ref().map_or(size, sparse::Layout::data_bytes);
    let mut up = run(
        (input, layout.as_ref()),
        Some(total),
        opts,
        pool,
        progress,
        control,
    )
    .await?;
    if let Some(l) = layout {
        up.exnode.holes = l.holes;
    }
    Ok(up)
}

enum Input<R> {
    Stream(R),
    /// A regular file read through memory (for end-to-end functions): its
    /// blocks can be skipped by seeking.
    Read(tokio::fs::File),
    File(Arc<std::fs::File>, u64),
}

impl<R: AsyncRead + Unpin> Input<R> {
    /// The next block of at most `bs` bytes at `offset`; `None` at the end.
    async fn next(&mut self, offset: u64, want: u64) -> Result<Option<Data>> {
        let bs = usize::try_from(want).unwrap_or(usize::MAX);
        match self {
            Input::File(f, size) => {
                let len = size.saturating_sub(offset).min(want);
                Ok((len > 0).then(|| Data::Range(f.clone(), offset, len)))
            }
            Input::Stream(r) => read_block(r, bs).await,
            Input::Read(f) => read_block(f, bs).await,
        }
    }

    /// Skips the block of `len` bytes at `offset` (stored by an earlier
    /// run); false when this input cannot skip.
    async fn skip(&mut self, offset: u64, len: u64) -> Result<bool> {
        use tokio::io::AsyncSeekExt;
        match self {
            Input::File(..) => Ok(true),
            Input::Read(f) => {
                f.seek(std::io::SeekFrom::Start(offset + len))
                    .await
                    .map_err(|e| Error::io("seeking in the input", e))?;
                Ok(true)
            }
            Input::Stream(_) => Ok(false),
        }
    }
}

/// Reads a block of at most `bs` bytes; `None` at the end.
async fn read_block<R: AsyncRead + Unpin>(r: &mut R, bs: usize) -> Result<Option<Data>> {
    let mut buf = vec![0u8; bs];
    let mut got = 0;
    while got < bs {
        let k = r
            .read(&mut buf[got..])
            .await
            .map_err(|e| Error::io("reading input", e))?;
        if k == 0 {
            break;
        }
        got += k;
    }
    buf.truncate(got);
    Ok((got > 0).then_some(Data::Mem(buf)))
}

/// Uploads `input` (only the extents of its sparse layout, if it has one).
async fn run<R: AsyncRead + Unpin>(
    (mut input, layout): (Input<R>, Option<&sparse::Layout>),
    size: Option<u64>,
    opts: &UploadOptions,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
    control: Control,
) -> Result<Uploaded> {
    if let Some(scheme) = opts.erasure {
        return stripes::run(input, size, opts, scheme, pool, progress, control).await;
    }
    let shared = Uploader::new(opts, pool, progress.clone(), &control)?;
    let copies = opts.copies.max(1);
    let (threads, bs) = shared.fit_distance(size, &input, &control).await;
    progress.start(size);
    let bs = usize::try_from(bs).unwrap_or(usize::MAX);
    let slots = match &control.slots {
        Some(s) => s.semaphore(),
        None => Arc::new(Semaphore::new(threads)),
    };
    let mut tasks = tokio::task::JoinSet::new();
    let mut results: Vec<(usize, Vec<Mapping>)> = Vec::new();
    let mut offset = 0u64;
    let mut index = 0usize;
    let mut stop = Stop::default();
    // Blocks an earlier run stored whole, by offset.
    let mut done: std::collections::BTreeMap<u64, Vec<Mapping>> = Default::default();
    for m in &control.done {
        done.entry(m.exnode_offset).or_default().push(m.clone());
    }
    loop {
        let Some(permit) = next_slot(&slots, &control, &mut tasks, &mut results, &mut stop).await
        else {
            break;
        };
        let want = match next_room(layout, &mut input, &mut offset, bs as u64).await {
            Ok(Some(w)) => w,
            Ok(None) => break,
            Err(e) => {
                stop.failure = Some(e);
                break;
            }
        };
        if let Some(stored) = done.remove(&offset) {
            let len = stored[0].logical_length;
            let whole = stored.len() >= copies && len > 0 && len <= want;
            match input.skip(offset, len).await {
                Ok(true) if whole => {
                    progress.advance(&stored[0].depot().unwrap_or_default(), len);
                    results.push((index, stored));
                    offset += len;
                    index += 1;
                    if len < want {
                        break;
                    }
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    stop.failure = Some(e);
                    break;
                }
            }
        }
        let data = match input.next(offset, want).await {
            Ok(Some(data)) => data,
            Ok(None) => break,
            Err(e) => {
                stop.failure = Some(e);
                break;
            }
        };
        let got = data.len();
        let sh = shared.clone();
        let (block_off, salt) = (offset, index);
        tasks.spawn(async move {
            let _permit = permit;
            let out = sh.store_block(block_off, salt, data, copies).await?;
            Ok::<_, Error>((salt, out))
        });
        offset += got;
        index += 1;
        if got < want {
            break;
        }
    }
    // Blocks in flight finish or fail before we decide, never cut off: an
    // allocation they make must reach the ledger for a failure to free it.
    // Unless the upload is told to stop: then they are cut off, and what
    // they allocated is in the ledger (an ALLOCATE whose reply never came
    // is not: the depot frees it at the end of its lease).
    let results = end_blocks(&shared, tasks, &control, stop, results, true).await?;
    shared.finish(results, copies).await
}

/// The blocks in flight settled ([`settle_blocks`], cut off when the
/// upload was told to stop): the blocks stored, or the upload's error —
/// [`Error::Interrupted`] naming the blocks stored when `resumable`, else
/// none of them (all released), or the first failure, everything released.
async fn end_blocks(
    shared: &Uploader,
    mut tasks: tokio::task::JoinSet<Result<(usize, Vec<Mapping>)>>,
    control: &Control,
    mut stop: Stop,
    mut results: Stored,
    resumable: bool,
) -> Result<Stored> {
    if stop.interrupted {
        tasks.abort_all();
    }
    let failure = &mut stop.failure;
    if settle_blocks(tasks, control, stop.interrupted, &mut results, failure).await {
        let kept = if resumable { results } else { Vec::new() };
        return Err(shared.interrupted(kept).await);
    }
    if let Some(e) = stop.failure {
        return Err(shared.abandon(e).await);
    }
    Ok(results)
}

/// The room for the block at `offset`: `bs`, or with a sparse layout up
/// to the end of its extent, `offset` (and the input) moved on to the
/// next extent at the end of one. `None` past the last extent.
async fn next_room<R: AsyncRead + Unpin>(
    layout: Option<&sparse::Layout>,
    input: &mut Input<R>,
    offset: &mut u64,
    bs: u64,
) -> Result<Option<u64>> {
    let Some(l) = layout else {
        return Ok(Some(bs));
    };
    let i = l.extents.partition_point(|e| e.1 <= *offset);
    let Some(&(a, b)) = l.extents.get(i) else {
        return Ok(None);
    };
    if *offset < a {
        *offset = a;
        input.skip(a, 0).await?;
    }
    Ok(Some((b - *offset).min(bs)))
}

/// Why the loop reading an upload's input ended early: told to stop, or
/// the first block that failed.
#[derive(Default)]
struct Stop {
    interrupted: bool,
    failure: Option<Error>,
}

/// Blocks stored so far, with their index.
type Stored = Vec<(usize, Vec<Mapping>)>;

/// Waits for a slot for the next block, pushing the blocks finished
/// meanwhile to `results`: a failure surfaces at once rather than after
/// the whole input is read. `None` (with why in `stop`) ends the loop.
async fn next_slot(
    slots: &Arc<Semaphore>,
    control: &Control,
    tasks: &mut tokio::task::JoinSet<Result<(usize, Vec<Mapping>)>>,
    results: &mut Stored,
    stop: &mut Stop,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let permit = tokio::select! {
        p = slots.clone().acquire_owned() => p.expect("semaphore never closed"),
        () = control.stopping() => {
            stop.interrupted = true;
            return None;
        }
    };
    while let Some(done) = tasks.try_join_next() {
        match joined(done) {
            Ok(r) => results.push(r),
            Err(e) => {
                stop.failure = Some(e);
                return None;
            }
        }
    }
    if control.stopped() {
        stop.interrupted = true;
        return None;
    }
    Some(permit)
}

/// Waits for the blocks in flight, each pushed to `results` or its error
/// kept in `failure` (the first); a stop cuts them off. Whether the upload
/// was stopped.
async fn settle_blocks(
    mut tasks: tokio::task::JoinSet<Result<(usize, Vec<Mapping>)>>,
    control: &Control,
    mut interrupted: bool,
    results: &mut Vec<(usize, Vec<Mapping>)>,
    failure: &mut Option<Error>,
) -> bool {
    loop {
        let next = tokio::select! {
            d = tasks.join_next() => d,
            () = control.stopping(), if !interrupted => {
                interrupted = true;
                tasks.abort_all();
                continue;
            }
        };
        let Some(done) = next else { break };
        match done {
            Err(e) if e.is_cancelled() => {}
            done => match joined(done) {
                Ok(r) => results.push(r),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            },
        }
    }
    interrupted
}

impl Uploader {
    /// The upload's shared state, once its depots are known to be enough.
    fn new(
        opts: &UploadOptions,
        pool: Arc<Pool>,
        progress: Arc<dyn Progress>,
        control: &Control,
    ) -> Result<Arc<Self>> {
        // In the order given (the L-Bone's ranking, the user's `--depot`s,
        // a writer's rotation): it breaks ties between equally busy depots.
        let mut seen = HashSet::new();
        let mut addrs = opts.depots.clone();
        addrs.retain(|a| seen.insert(a.clone()));
        if addrs.is_empty() {
            return Err(Error::NoDepots);
        }
        let copies = opts.copies.max(1);
        if copies > addrs.len() {
            return Err(Error::NotEnoughDepots {
                copies,
                depots: addrs.len(),
            });
        }
        let n = addrs.len();
        let watch = pool.watcher();
        watch.know(&addrs);
        Ok(Arc::new(Uploader {
            opts: opts.clone(),
            pool,
            depots: Mutex::new(Depots {
                addrs,
                busy: vec![0; n],
                dead: vec![false; n],
            }),
            progress,
            made: Arc::new(Mutex::new(Vec::new())),
            allocating: Arc::new(tokio::sync::watch::channel(Vec::new()).0),
            watch,
            journal: control.journal.clone(),
            stored: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// Blocks in flight and the block size, fitted to the depots' distance
    /// where the options leave them to it (see [`distance`]). A resumed
    /// upload keeps the block size of the run it resumes, whose blocks it
    /// finds by their offsets.
    async fn fit_distance<R>(
        &self,
        size: Option<u64>,
        input: &Input<R>,
        control: &Control,
    ) -> (usize, u64) {
        let (mut threads, mut bs) = (self.opts.threads.max(1), self.opts.block_size.max(1));
        let near = threads;
        if let Some(batch) = &control.slots {
            threads = batch.threads();
        } else if !self.opts.auto_threads {
            return (threads, bs);
        } else {
            let addrs = self.lock().addrs.clone();
            let rtts = self
                .pool
                .round_trips(&addrs, crate::pool::MEASURE_WAIT)
                .await;
            threads = distance::threads(threads, &rtts);
        }
        let earlier = control.done.iter().map(|m| m.logical_length).max();
        if let Some(earlier) = earlier.filter(|&l| l > 0 && l <= bs) {
            bs = earlier;
        } else if self.opts.auto_block_size && threads > near {
            let in_memory = !matches!(input, Input::File(..));
            bs = distance::block_size(bs, threads, size, in_memory);
        }
        (threads, bs)
    }

    /// Encodes one block (off the async threads: checksums, compression
    /// and encryption are CPU work) and stores its `copies`: the first
    /// from memory, the others copied from it.
    async fn store_block(
        &self,
        block_off: u64,
        salt: usize,
        data: Data,
        copies: usize,
    ) -> Result<Vec<Mapping>> {
        let len = data.len();
        let (stored, e2e) = match (self.opts.e2e.clone(), data) {
            (Some(codec), Data::Mem(buf)) => {
                let bs = codec.e2e_blocksize();
                let encoding = |e: &dyn std::fmt::Display| {
                    Error::io("encoding a block", std::io::Error::other(e.to_string()))
                };
                let (stored, f, digest) = tokio::task::spawn_blocking(move || {
                    let (stored, f) = codec.encode(&buf)?;
                    let digest = codec.needs_stored_digest().then(|| stored_digest(&stored));
                    Ok::<_, E2eError>((stored, f, digest))
                })
                .await
                .map_err(|e| encoding(&e))?
                .map_err(|e| encoding(&e))?;
                (Data::Mem(stored), Some((bs, f, digest)))
            }
            (_, data) => (data, None),
        };
        let slen = stored.len();
        let avoid = Mutex::new(HashSet::new());
        let range = (block_off, len);
        let first = (self.on_some_depot(range, &stored, Job::Store, &avoid, salt)).await?;
        let mut out = vec![mapping(block_off, len, slen, &e2e, first.1.clone())];
        for _ in 1..copies {
            let job = Job::CopyFrom(&first.1);
            let c = self
                .on_some_depot(range, &stored, job, &avoid, salt)
                .await?;
            out.push(mapping(block_off, len, slen, &e2e, c.1));
        }
        self.progress.advance(&first.1.write.address(), len);
        Ok(out)
    }

    /// The exNode of the blocks stored; the allocations of failed attempts
    /// released now if their depots are back, the rest returned to record.
    async fn finish(&self, results: Vec<(usize, Vec<Mapping>)>, copies: usize) -> Result<Uploaded> {
        let mut x = self.exnode_of(results);
        // The policy writes through xio and the mount keep.
        let n = i64::try_from(copies).unwrap_or(i64::MAX);
        x.set_meta(Metadata::integer(lors_exnode::model::COPIES_META, n));
        self.finished(x).await
    }

    /// The blocks stored (by their index), in order, as an exNode.
    fn exnode_of(&self, mut results: Vec<(usize, Vec<Mapping>)>) -> ExNode {
        results.sort_by_key(|(i, _)| *i);
        let mut x = ExNode::of_file(&self.opts.filename);
        x.mappings = results.into_iter().flat_map(|(_, m)| m).collect();
        x
    }

    /// The upload `x`, with the allocations of failed attempts released
    /// now if their depots are back, the rest returned to record.
    async fn finished(&self, x: ExNode) -> Result<Uploaded> {
        // The ledger still holds allocations of attempts that failed and could
        // not be released then (their depot was down): try again now that the
        // depot may be back; what remains goes to the caller to record.
        let used: HashSet<&lors_ibp::Capability> = (x.mappings.iter().chain(&x.parity))
            .filter_map(|m| m.manage.as_ref())
            .collect();
        self.settle().await;
        let leftover: Vec<Mapping> = std::mem::take(&mut *self.made())
            .into_iter()
            .filter(|m| m.manage.as_ref().is_some_and(|c| !used.contains(c)))
            .collect();
        let unreleased = self.unreleased(if leftover.is_empty() {
            leftover
        } else {
            self.pool.release_all(leftover).await
        });
        Ok(Uploaded {
            exnode: x,
            unreleased,
        })
    }
}

fn joined<T>(r: std::result::Result<Result<T>, tokio::task::JoinError>) -> Result<T> {
    r.map_err(|e| Error::io("upload task", std::io::Error::other(e.to_string())))?
}
