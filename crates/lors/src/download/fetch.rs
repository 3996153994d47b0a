//! The fetch worker: one per depot connection, asking the scheduler for
//! work, reading pieces over IBP and handing them to the output.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use lors_exnode::functions::{Codec, E2eError, MAX_ENCODED_MAPPING, Slice};
use tokio::sync::mpsc;

use super::Ctx;
use super::output::{Buffers, Data, Held, OutFile};
use super::sched::{DepotId, Pick, PieceId};
use crate::error::{Cause, Error};

/// A fetched piece: in memory or pipes, or already written into the output
/// file.
enum Got {
    Data(Data),
    Written,
    /// Stored bytes checked in place: the piece's parts in them, each with
    /// its offset in the piece.
    Checked(BytesMut, Vec<(Range<usize>, u64)>),
}

/// Why a fetch failed.
pub(super) enum Fail {
    /// This replica (or its depot, when the flag says it is unreachable).
    Remote(Cause, bool),
    /// The network cut the read off (reset, closed, connect refused): the
    /// same replica may serve it on the next try.
    Cut(Cause, bool),
    /// This replica's allocation ends before the piece: it holds less than
    /// the exNode claims.
    Short(Cause),
    /// The depot is busy: ask again later.
    Busy(Cause),
    /// Our own output: no replica can help.
    Local(Error),
}

fn ibp_err(e: lors_ibp::Error) -> Fail {
    match e {
        lors_ibp::Error::Local { during, source } => Fail::Local(Error::io(during, source)),
        e if e.is_busy() => Fail::Busy(Cause::from(&e)),
        e if e.status() == Some(lors_ibp::proto::StatusCode::WOULD_EXCEED_LIMIT) => {
            Fail::Short(Cause::from(&e))
        }
        e @ (lors_ibp::Error::Io { .. }
        | lors_ibp::Error::Closed { .. }
        | lors_ibp::Error::Connect { .. }) => {
            let unreachable = e.is_unreachable();
            Fail::Cut(Cause::from(&e), unreachable)
        }
        e => {
            let unreachable = e.is_unreachable();
            Fail::Remote(Cause::from(&e), unreachable)
        }
    }
}

/// The scheduler told that the fetch of `piece` from mapping `m` on
/// connection `conn` failed: the pause to make (holding nothing) before
/// asking again, when one is due; our own output's error, which ends the
/// download.
fn told(
    ctx: &Ctx,
    piece: usize,
    m: usize,
    conn: usize,
    fail: Fail,
) -> Result<Option<Duration>, Error> {
    let now = Instant::now();
    Ok(match fail {
        Fail::Local(e) => return Err(e),
        Fail::Remote(why, unreachable) => {
            ctx.update(|g| g.sched.failed(piece, m, why, unreachable));
            None
        }
        Fail::Cut(why, unreachable) => ctx.update(|g| g.sched.cut(piece, m, why, unreachable, now)),
        Fail::Short(why) => {
            ctx.update(|g| g.sched.ends_early(piece, m, why));
            None
        }
        // Give the depot room: others' pieces, and a pause that differs
        // per connection so they do not return together.
        Fail::Busy(why) => (ctx.update(|g| g.sched.busy(piece, m, why, now)))
            .then(|| Duration::from_millis(100 + 50 * (conn as u64 % 8))),
    })
}

/// Connection `conn` of depot `d`: fetches what the scheduler hands it
/// until told to exit.
pub(super) async fn worker(ctx: Arc<Ctx>, d: DepotId, conn: usize, tx: Option<mpsc::Sender<Held>>) {
    let depot = ctx.lock().sched.name(d).to_owned();
    let out = ctx.out.clone();
    let _live = super::Live::new(&ctx, &depot);
    place(&ctx, d, &depot, conn == 0).await;
    loop {
        if ctx.serve_urgent(&depot).await {
            continue;
        }
        // Taken before picking, so a worker waiting for a slot holds no piece.
        let slot = match &ctx.slots {
            Some(s) => match thread_slot(&ctx, &depot, s).await {
                Some(slot) => Some(slot),
                None => continue,
            },
            None => None,
        };
        let (mut share, mut mem) = memory(&ctx, d).await;
        let head_only = ctx.stream && ctx.mem.is_some() && mem.is_none();
        // Armed before asking, so a change between the answer and the wait
        // still wakes this worker.
        let notified = ctx.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let picked = {
            let mut g = ctx.lock();
            if g.fatal.is_some() {
                return;
            }
            let picked = g.sched.pick(d, conn, head_only, Instant::now());
            let with = match picked {
                Pick::Fetch { piece, .. } => g.sched.taken_with(piece),
                _ => Vec::new(),
            };
            (picked, with)
        };
        let (picked, with) = picked;
        // Held from here, so whatever stops this fetch gives them back.
        let mut taken = Taken::new(&ctx, with);
        let (piece, m) = match picked {
            Pick::Exit => return,
            Pick::Wait => {
                drop((slot, mem, share));
                notified.await;
                continue;
            }
            Pick::Fetch { piece, mapping } => (piece, mapping),
        };
        ctx.started.notify_one();
        if ctx.mem_need[m] == 0 {
            mem = None;
            drop(share.take());
        }
        let (offset, len) = ctx.lock().sched.piece(piece);
        let enc = Encoded::of(&ctx.x.mappings[m], offset, len);
        // `--bwlimit`: paid before the LOAD, for the stored bytes it reads.
        let cost = match &enc {
            Ok(Some(e)) => e.stored.end - e.stored.start,
            _ => len,
        };
        ctx.pool.throttle(cost).await;
        let began = Instant::now();
        let fetched = tokio::select! {
            r = fetch(&ctx, &depot, m, (offset, len), enc, out.as_deref(), &mut taken) => r,
            () = cancelled(&ctx, piece, m) => {
                // Dropped mid-command, its connection is closed, not pooled.
                tracing::debug!(%depot, conn, offset, len, "fetch no longer needed: stopped");
                ctx.update(|g| g.sched.abandon(piece, m));
                continue;
            }
        };
        drop(share);
        // Pieces read beside a rebuilt one are good whatever became of it.
        if let Some(f) = &out {
            taken.deliver(&depot, f).await;
        }
        drop(taken);
        // One line per fetch at -vvv: how long each piece took on which
        // connection is what shows a straggling connection.
        tracing::trace!(%depot, conn, offset, len, ms = began.elapsed().as_millis(), ok = fetched.is_ok(), "fetched");
        let got = match fetched {
            Ok(g) => g,
            Err(fail) => {
                match told(&ctx, piece, m, conn, fail) {
                    Err(e) => return ctx.fatal(e),
                    Ok(Some(pause)) => {
                        drop((slot, mem));
                        tokio::time::sleep(pause).await;
                    }
                    Ok(None) => {}
                }
                continue;
            }
        };
        if !claim(&ctx, piece, m) {
            continue; // a hedged copy arrived first
        }
        ctx.progress.advance(&depot, len);
        if let Some(f) = &out {
            if let Err(e) = to_file(&ctx, f, offset, len, got).await {
                ctx.fatal(Error::io("writing the output file", e));
            }
        } else if let (Some(tx), Got::Data(buf)) = (&tx, got)
            && tx.send((piece, buf, mem)).await.is_err()
        {
            ctx.lock().writing -= 1;
            return;
        }
        ctx.lock().writing -= 1;
        ctx.wake.notify_waiters();
    }
}

/// A `threads` slot for a connection of `depot`; `None` once it served a
/// read a rebuild asked of it while waiting. The rebuild holds a slot of
/// its own for those reads: with every slot taken by rebuilds, the
/// connections they ask would otherwise wait for them, and they for the
/// connections.
async fn thread_slot(
    ctx: &Ctx,
    depot: &str,
    slots: &Arc<tokio::sync::Semaphore>,
) -> Option<Result<tokio::sync::OwnedSemaphorePermit, tokio::sync::AcquireError>> {
    let asked = ctx.wake.notified();
    tokio::pin!(asked);
    asked.as_mut().enable();
    tokio::select! {
        slot = slots.clone().acquire_owned() => Some(slot),
        () = asked => {
            ctx.serve_urgent(depot).await;
            None
        }
    }
}

/// Claims `piece`, fetched through `m`, and counts it as being written at
/// once: the download is not settled while a claimed piece is on its way
/// to the output. False when another fetch delivered it first.
fn claim(ctx: &Ctx, piece: PieceId, m: usize) -> bool {
    ctx.update(|g| {
        let won = g.sched.claim(piece, m, Instant::now());
        g.writing += usize::from(won);
        won
    })
}

/// Pieces of a stripe's other data blocks a rebuilder took with the one it
/// picked ([`super::sched::Sched::set_rows`]): their bytes are read for the
/// rebuild anyway. Those not delivered go back to the scheduler when this
/// is dropped (a fetch cancelled, a block not read or failing its check).
struct Taken<'a> {
    ctx: &'a Ctx,
    /// Each piece and its virtual mapping.
    pieces: Vec<(PieceId, usize)>,
    /// Read and checked, ready to be claimed and written: each piece, its
    /// mapping, offset and length, and its bytes.
    ready: Vec<(PieceId, usize, u64, u64, Got)>,
}

impl<'a> Taken<'a> {
    fn new(ctx: &'a Ctx, pieces: Vec<(PieceId, usize)>) -> Self {
        Taken {
            ctx,
            pieces,
            ready: Vec::new(),
        }
    }

    /// Indices in the stripe of the blocks taken.
    fn indices(&self, rb: &super::rebuild::Rebuild) -> Vec<usize> {
        self.pieces.iter().map(|&(_, m)| rb.index_of(m)).collect()
    }

    /// Checks the bytes read for the blocks taken (by index in the stripe);
    /// those that pass are ready to be delivered.
    async fn open(&mut self, rb: &super::rebuild::Rebuild, got: Vec<(usize, BytesMut)>) {
        for (index, stored) in got {
            let Some(i) = self
                .pieces
                .iter()
                .position(|&(_, m)| rb.index_of(m) == index)
            else {
                continue;
            };
            let (piece, m) = self.pieces.swap_remove(i);
            let (offset, len) = self.ctx.lock().sched.piece(piece);
            let map = self.ctx.x.mappings[m].clone();
            let opened = match Encoded::of(&map, offset, len) {
                Ok(None) => Ok(Got::Data(Data::Mem(stored))),
                Ok(Some(e)) => {
                    let at = offset - map.exnode_offset;
                    let bufs = self.ctx.bufs.clone();
                    let open = move || e.open(&map, stored, at..at + len, true, &bufs);
                    (tokio::task::spawn_blocking(open).await)
                        .unwrap_or(Err(E2eError::Malformed("check stopped")))
                }
                Err(e) => Err(e),
            };
            match opened {
                Ok(got) => self.ready.push((piece, m, offset, len, got)),
                // Its own depot reads it, and finds what is wrong.
                Err(_) => self.pieces.push((piece, m)),
            }
        }
    }

    /// Claims and writes the pieces ready.
    async fn deliver(&mut self, depot: &str, f: &Arc<OutFile>) {
        let ctx = self.ctx;
        for (piece, m, offset, len, got) in std::mem::take(&mut self.ready) {
            if !claim(ctx, piece, m) {
                continue;
            }
            ctx.progress.advance(depot, len);
            if let Err(e) = to_file(ctx, f, offset, len, got).await {
                ctx.fatal(Error::io("writing the output file", e));
            }
            ctx.lock().writing -= 1;
            ctx.wake.notify_waiters();
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let back: Vec<(PieceId, usize)> = (self.pieces.iter().copied())
            .chain(self.ready.iter().map(|r| (r.0, r.1)))
            .collect();
        if !back.is_empty() {
            self.ctx.update(|g| {
                for (p, m) in back {
                    g.sched.abandon(p, m);
                }
            });
        }
    }
}

/// A memory slot for a piece, and depot `d`'s share of the slots it is
/// taken from. A file output frees its memory slots by itself: wait for
/// one. A stream's are freed by the writer, which may be waiting for a
/// piece only a worker without a slot can fetch. A depot's share is taken
/// first: a hung depot's fetches then cannot hold every slot, and the
/// others' deliveries time the pieces its stall is judged by.
async fn memory(
    ctx: &Ctx,
    d: DepotId,
) -> (
    Option<tokio::sync::OwnedSemaphorePermit>,
    Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let share = match ctx.mem_share.get(d) {
        Some(s) if ctx.stream => s.clone().try_acquire_owned().ok(),
        Some(s) => s.clone().acquire_owned().await.ok(),
        None => None,
    };
    let mem = match &ctx.mem {
        _ if share.is_none() && !ctx.mem_share.is_empty() => None,
        Some(s) if ctx.stream => s.clone().try_acquire_owned().ok(),
        Some(s) => s.clone().acquire_owned().await.ok(),
        None => None,
    };
    (share, mem)
}

/// Puts a piece fetched for a file output in place, and records it done.
async fn to_file(
    ctx: &Ctx,
    f: &Arc<OutFile>,
    offset: u64,
    len: u64,
    got: Got,
) -> std::io::Result<()> {
    let pos = offset - ctx.base;
    let joined = |e: tokio::task::JoinError| std::io::Error::other(e.to_string());
    match got {
        // One short line appended to the record: a hop to a blocking
        // thread for it would cost more than the write.
        Got::Written => f.record(offset, len),
        Got::Checked(stored, parts) => {
            let (f, bufs) = (f.clone(), ctx.bufs.clone());
            tokio::task::spawn_blocking(move || {
                let r = f.write_parts(pos, parts.iter().map(|(r, at)| (&stored[r.clone()], *at)));
                bufs.give(stored);
                r.and_then(|()| f.record(offset, len))
            })
            .await
            .map_err(joined)?
        }
        Got::Data(data) => {
            let (f, bufs) = (f.clone(), ctx.bufs.clone());
            tokio::task::spawn_blocking(move || {
                // (A file output never splices into pipes.)
                let buf = data.into_mem()?;
                let r = f.write_piece(pos, offset, &buf);
                bufs.give(buf);
                r
            })
            .await
            .map_err(joined)?
        }
    }
}

/// Returns once the scheduler no longer needs the fetch of `piece` through
/// mapping `m` (moved off a stalled depot, or delivered by a twin).
async fn cancelled(ctx: &Ctx, piece: usize, m: usize) {
    loop {
        let notified = ctx.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if ctx.lock().sched.is_cancelled(piece, m) {
            return;
        }
        notified.await;
    }
}

/// Before depot `d`'s first piece: its round trip (a connection made now
/// serves that piece), and the connections its distance earns, so the
/// pieces are cut for all of them from the start rather than taken whole by
/// the first few. The `first` worker of a depot also connects ahead for
/// the connections a far depot will earn (see [`ahead`]).
async fn place(ctx: &Ctx, d: DepotId, depot: &str, first: bool) {
    if !ctx.lock().sched.tuned(d) {
        return;
    }
    let mut early = Vec::new();
    if ctx.pool.rtt(depot).is_none() {
        let connect = ctx.pool.get(depot);
        tokio::pin!(connect);
        let got = tokio::select! {
            c = &mut connect => c,
            () = tokio::time::sleep(SPECULATE_AFTER), if first => {
                let spare = ahead(ctx, d, depot);
                let c = connect.await;
                early = spare.await;
                c
            }
        };
        // A failure is the first fetch's to meet and report.
        if let Ok(c) = got {
            ctx.pool.put(c);
        }
    }
    if !first {
        // Its first worker sets the level once its connects are in: a
        // piece taken before would be cut for too few connections.
        loop {
            let notified = ctx.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !ctx.lock().sched.connects_ahead(d) {
                break;
            }
            notified.await;
        }
    }
    let mut g = ctx.lock();
    let grown = (ctx.pool.rtt(depot)).and_then(|rtt| g.sched.at_distance(d, rtt));
    let ahead = first && g.sched.connects_ahead(d);
    if ahead {
        g.sched.set_connects_ahead(d, false);
    }
    let wake = ahead || grown.is_some();
    // Those the level uses wait in the pool for the connections grown;
    // the rest close now rather than hold a depot's slots to the end.
    early.truncate(grown.as_ref().map_or(0, ExactSizeIterator::len));
    if let Some(conns) = grown {
        g.grown.push((d, conns));
    }
    drop(g);
    for c in early {
        ctx.pool.put(c);
    }
    if wake {
        ctx.wake.notify_waiters();
    }
}

/// A depot that has not answered a connect within this long is at least
/// this far away: it will earn more connections than
/// [`super::AUTO_CONNECTIONS`] (one per [`super::RTT_PER_CONNECTION`]).
const SPECULATE_AFTER: Duration = Duration::from_millis(16);

/// Connections made ahead, over all the depots of a download: they spare
/// the connections a far depot earns the round trip of their connect
/// (which would otherwise start only once its first connect measured the
/// distance); a download from many depots makes none.
const SPECULATE_TOTAL: usize = 256;

/// Starts the connects of the connections `depot` will likely earn (its
/// first connect has taken [`SPECULATE_AFTER`] already); the future ends
/// with those made by a sixteenth of a round trip after the first one
/// (they started [`SPECULATE_AFTER`] after it), so the
/// connections grown then find them in the pool. The rest are dropped as
/// they arrive: a slow connect is no loss, the grown worker connects.
fn ahead(
    ctx: &Ctx,
    d: DepotId,
    depot: &str,
) -> impl std::future::Future<Output = Vec<lors_ibp::Connection>> + use<> {
    let depots = {
        let mut g = ctx.lock();
        g.sched.set_connects_ahead(d, true);
        g.sched.depots().max(1)
    };
    let n = (SPECULATE_TOTAL / depots)
        .min(super::MAX_AUTO_CONNECTIONS)
        .saturating_sub(super::AUTO_CONNECTIONS);
    let mut connects = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (pool, depot) = (ctx.pool.clone(), depot.to_owned());
        connects.spawn(async move { pool.get(&depot).await });
    }
    let (pool, depot) = (ctx.pool.clone(), depot.to_owned());
    async move {
        let rtt = pool.rtt(&depot).unwrap_or(SPECULATE_AFTER);
        let mut made = Vec::new();
        let _ = tokio::time::timeout(SPECULATE_AFTER + rtt / 16, async {
            while let Some(r) = connects.join_next().await {
                if let Ok(Ok(c)) = r {
                    made.push(c);
                }
            }
        })
        .await;
        made
    }
}

/// Reads piece `(offset, len)` through mapping `m` on `depot`: raw bytes
/// into the output file or memory; encoded ones as `enc` says (the e2e
/// blocks that hold the piece, or the whole mapping), checked, then cut.
async fn fetch(
    ctx: &Ctx,
    depot: &str,
    m: usize,
    (offset, len): (u64, u64),
    enc: Result<Option<Encoded>, E2eError>,
    out: Option<&OutFile>,
    taken: &mut Taken<'_>,
) -> Result<Got, Fail> {
    let map = &ctx.x.mappings[m];
    if let Some(rb) = ctx.rebuild.as_ref().filter(|r| r.is_virtual(m)) {
        return rebuilt(ctx, rb, m, offset, len, enc, out.is_some().then_some(taken)).await;
    }
    let cap = map.read.as_ref().expect("planned mappings are readable");
    match enc {
        Err(e) => Err(Fail::Remote(Cause::local(e.to_string()), false)),
        Ok(None) => {
            let at = map.alloc_offset + (offset - map.exnode_offset);
            // Taken before any wait, so pieces picked in a row get buffers
            // in a row (adjacent, when the pool cuts them from slabs).
            let splice = out.is_none() && ctx.spliced.load(Ordering::Relaxed);
            let buf = (out.is_none() && !splice).then(|| ctx.bufs.take(len));
            let mut c = ctx.pool.get(depot).await.map_err(ibp_err)?;
            if let Some(f) = out {
                // Raw bytes to a file: straight from the socket into
                // place. A hedged twin writes the same bytes to the
                // same place, so the race is harmless.
                c.load_to_file(cap, at, len, f.file.shared(), offset - ctx.base)
                    .await
                    .map_err(ibp_err)?;
                ctx.pool.put(c);
                return Ok(Got::Written);
            }
            if splice {
                match c.load_spliced(cap, at, len).await {
                    Ok(held) => {
                        ctx.pool.put(c);
                        return Ok(Got::Data(Data::Spliced(held)));
                    }
                    // No pipe to be had, the LOAD not sent: into memory,
                    // from now on.
                    Err(e @ lors_ibp::Error::Local { .. }) if c.is_healthy() => {
                        tracing::debug!(error = %e, "pieces go to memory from here on");
                        ctx.spliced.store(false, Ordering::Relaxed);
                    }
                    Err(e) => return Err(ibp_err(e)),
                }
            }
            let mut buf = buf.unwrap_or_else(|| ctx.bufs.take(len));
            c.load_buf(cap, at, len, &mut buf).await.map_err(ibp_err)?;
            ctx.pool.put(c);
            Ok(Got::Data(Data::Mem(buf)))
        }
        Ok(Some(_)) if map.alloc_length > MAX_ENCODED_MAPPING => Err(Fail::Remote(
            Cause::local(format!(
                "encoded mapping of {} bytes is larger than the {} bytes decoded in memory",
                map.alloc_length, MAX_ENCODED_MAPPING
            )),
            false,
        )),
        Ok(Some(e)) => {
            // The e2e blocks that hold the piece (the whole mapping where
            // its layout needs it), fetched, verified, then cut.
            let mut stored = ctx.bufs.take(e.stored.end - e.stored.start);
            let mut c = ctx.pool.get(depot).await.map_err(ibp_err)?;
            let (at, n) = (
                map.alloc_offset + e.stored.start,
                e.stored.end - e.stored.start,
            );
            c.load_buf(cap, at, n, &mut stored).await.map_err(ibp_err)?;
            ctx.pool.put(c);
            let piece = offset - map.exnode_offset..offset - map.exnode_offset + len;
            let bufs = ctx.bufs.clone();
            let to_file = out.is_some();
            let mapping = map.clone();
            tokio::task::spawn_blocking(move || e.open(&mapping, stored, piece, to_file, &bufs))
                .await
                .map_err(|e| Fail::Remote(Cause::local(e.to_string()), false))?
                .map_err(|e| Fail::Remote(Cause::local(format!("{e} (from {depot})")), false))
        }
    }
}

/// Piece `offset..offset+len` of the data block virtual mapping `m`
/// stands for, rebuilt from its stripe: its stored bytes, then checked and
/// decoded as a fetched piece is. When the check fails, the blocks used
/// may hold the damage: the piece is rebuilt again without the parity
/// used (or, with none used, without the data blocks), a bounded number
/// of times.
///
/// With `taken` (a file output), the pieces of the stripe's other data
/// blocks at the same place that are still pending are taken too: their
/// bytes are read for the rebuild anyway, and come back ready.
async fn rebuilt(
    ctx: &Ctx,
    rb: &super::rebuild::Rebuild,
    m: usize,
    offset: u64,
    len: u64,
    enc: Result<Option<Encoded>, E2eError>,
    mut taken: Option<&mut Taken<'_>>,
) -> Result<Got, Fail> {
    let map = &ctx.x.mappings[m];
    let at = offset - map.exnode_offset;
    let enc = enc.map_err(|e| Fail::Remote(Cause::local(e.to_string()), false))?;
    let want = match &enc {
        None => at..at + len,
        Some(e) => e.stored.clone(),
    };
    let to_file = taken.is_some();
    let siblings = taken.as_deref().map_or(Vec::new(), |t| t.indices(rb));
    let Some(e) = enc else {
        let loaded = rb
            .load(ctx, m, want, &Default::default(), &siblings)
            .await?;
        if let Some(t) = taken {
            t.open(rb, loaded.siblings).await;
        }
        return Ok(Got::Data(Data::Mem(loaded.bytes)));
    };
    let mut exclude = std::collections::HashSet::new();
    let mut attempts = 0;
    loop {
        let loaded = rb.load(ctx, m, want.clone(), &exclude, &siblings).await?;
        let (stored, used) = (loaded.bytes, loaded.used);
        if let Some(t) = taken.as_deref_mut() {
            t.open(rb, loaded.siblings).await;
        }
        let piece = at..at + len;
        let (bufs, mapping) = (ctx.bufs.clone(), map.clone());
        let (e2, piece2) = (e.again(), piece.clone());
        let opened =
            tokio::task::spawn_blocking(move || e2.open(&mapping, stored, piece2, to_file, &bufs))
                .await
                .map_err(|e| Fail::Remote(Cause::local(e.to_string()), false))?;
        match opened {
            Ok(got) => return Ok(got),
            Err(err) if attempts < 3 => {
                tracing::debug!(error = %err, "a rebuilt piece failed its check: rebuilding it from other blocks");
                let k = rb.data_blocks();
                let parity: Vec<_> = used.iter().filter(|(i, _)| *i >= k).cloned().collect();
                exclude.extend(if parity.is_empty() { used } else { parity });
                attempts += 1;
            }
            Err(err) => {
                return Err(Fail::Remote(
                    Cause::local(format!("{err} (rebuilt from parity)")),
                    false,
                ));
            }
        }
    }
}

/// Where bytes `offset..offset+len` of the file are stored in `map`'s
/// allocation (the e2e blocks holding them, for an encoded mapping).
pub(super) fn stored_range(
    map: &lors_exnode::Mapping,
    offset: u64,
    len: u64,
) -> Option<Range<u64>> {
    let at = offset.checked_sub(map.exnode_offset)?;
    match Encoded::of(map, offset, len).ok()? {
        None => Some(at..at + len),
        Some(e) => Some(e.stored),
    }
}

/// How a piece of an encoded mapping is read.
struct Encoded {
    codec: Codec,
    /// The e2e blocks holding the piece; `None`: the whole mapping.
    slice: Option<Slice>,
    /// Their stored bytes, within the allocation.
    stored: Range<u64>,
    /// Their logical bytes, within the mapping.
    logical: Range<u64>,
}

impl Encoded {
    /// The same reading, for another attempt.
    fn again(&self) -> Encoded {
        Encoded {
            codec: self.codec.clone(),
            slice: self.slice.clone(),
            stored: self.stored.clone(),
            logical: self.logical.clone(),
        }
    }

    /// For bytes `offset..offset+len` of the file in `map`; `None` for a
    /// mapping stored as is.
    fn of(map: &lors_exnode::Mapping, offset: u64, len: u64) -> Result<Option<Encoded>, E2eError> {
        let Some(codec) = Codec::from_mapping(map)? else {
            return Ok(None);
        };
        let slice = codec.slice(map, offset - map.exnode_offset, len);
        let (stored, logical) = match &slice {
            Some(s) => (s.stored.clone(), s.logical.clone()),
            None => (0..map.alloc_length, 0..map.logical_length),
        };
        Ok(Some(Encoded {
            codec,
            slice,
            stored,
            logical,
        }))
    }

    /// Checks and decodes `stored` and gives `piece`'s logical bytes (within
    /// the mapping). Checksums alone, for a file, are checked in place: the
    /// data is written from where it was received.
    fn open(
        self,
        map: &lors_exnode::Mapping,
        stored: BytesMut,
        piece: Range<u64>,
        to_file: bool,
        bufs: &Buffers,
    ) -> Result<Got, E2eError> {
        if let (Some(s), true) = (&self.slice, to_file) {
            match self.codec.check_slice(s, &stored) {
                Ok(Some(parts)) => {
                    let parts = clip(&parts, self.logical.start, &piece);
                    return Ok(Got::Checked(stored, parts));
                }
                Ok(None) => {}
                Err(e) => {
                    bufs.give(stored);
                    return Err(e);
                }
            }
        }
        // A free buffer's memory, not a fresh allocation per block.
        let mut plain = Vec::from(bufs.take(0));
        let r = match &self.slice {
            Some(s) => self.codec.decode_slice_into(s, &stored, &mut plain),
            None => self.codec.decode_mapping_into(map, &stored, &mut plain),
        };
        bufs.give(stored);
        r?;
        // Without a copy: the Vec's own allocation.
        let plain = BytesMut::from(Bytes::from(plain));
        let from = usize::try_from(piece.start - self.logical.start).unwrap_or(usize::MAX);
        let to =
            from.saturating_add(usize::try_from(piece.end - piece.start).unwrap_or(usize::MAX));
        if from == 0 && to == plain.len() {
            return Ok(Got::Data(Data::Mem(plain))); // the usual case: no copy
        }
        let cut = plain.get(from..to).map(BytesMut::from);
        bufs.give(plain);
        cut.map(|p| Got::Data(Data::Mem(p)))
            .ok_or(E2eError::Malformed("mapping shorter than recorded"))
    }
}

/// The parts of `piece` (logical bytes within the mapping) among the
/// stored ranges `parts`, which hold the logical bytes from `start` on, in
/// order: each as its stored range and its offset within the piece.
fn clip(parts: &[Range<usize>], start: u64, piece: &Range<u64>) -> Vec<(Range<usize>, u64)> {
    let mut at = start;
    let mut out = Vec::with_capacity(parts.len());
    for r in parts {
        let end = at + r.len() as u64;
        let (lo, hi) = (at.max(piece.start), end.min(piece.end));
        if lo < hi {
            let from = r.start + (lo - at) as usize;
            out.push((from..from + (hi - lo) as usize, lo - piece.start));
        }
        at = end;
    }
    out
}
