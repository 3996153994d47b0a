//! One client connection: read a bounded line, parse it, run the command,
//! repeat. Protocol errors get an error reply and the connection survives;
//! errors around a data phase close it, because the client may already have
//! sent bytes we can no longer frame.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use lors_ibp::caps::{CapKind, CapSet, Capability};
use lors_ibp::proto::chksum::NetChksum;
use lors_ibp::proto::{
    AliasAllocate, AliasOp, AliasProbeInfo, Allocate, ChksumQuery, Command, MAX_LINE_BYTES,
    ManageOp, ParseError, Plain, Reply, Request, StatusBody, StatusCode, StatusOp, StatusV13,
    Timeout, Version, sends_no_data,
};
use lors_ibp::wire::{Line, read_line};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::timeout;

use super::clients::ClientSlot;
use super::fail::{Fail, Flow, blocking, log_failure, verified};
use super::transfer::{
    Checked, CheckedError, XferError, recv_checked, recv_to_file, send_checked, send_file,
    send_framed, timed_out,
};
use super::{CHUNK_BYTES, Depot, copy};
use crate::store::datafile::{Extent, HEADER_BYTES};
use crate::store::{
    Alloc, AllocRequest, Change, Lease, Planned, QueueIn, RefCount, StoreError, Window,
};

type Res<T = Flow> = Result<T, Fail>;

pub(super) struct Conn {
    pub depot: Arc<Depot>,
    pub rd: BufReader<TcpStream>,
    pub peer: SocketAddr,
    /// This connection's hold on its client's limits.
    slot: ClientSlot,
}

/// Bytes received per reservation of transfer-buffer budget: a data phase
/// gives its budget back between rounds and waits for the client's next
/// bytes without it.
const RECV_ROUND_BYTES: u64 = 8 * CHUNK_BYTES as u64;

/// The longest a round of a data phase holds transfer budget.
const BUDGET_HOLD: Duration = Duration::from_secs(1);

/// The bytes a client must have waiting before a round takes budget.
const READY_BYTES: u64 = 32 << 10;

/// How often, at the longest, the waiting bytes of a client sending too
/// slowly for a batch are counted.
const SLOW_POLL: Duration = Duration::from_millis(50);

/// Why a receive stopped.
enum RecvFail {
    /// The peer or the disk failed.
    Xfer(XferError),
    /// No transfer budget freed up within the deadline.
    Busy,
    /// A block of a checksummed data phase did not match its digest.
    Chksum,
}

impl From<CheckedError> for RecvFail {
    fn from(e: CheckedError) -> Self {
        match e {
            CheckedError::Xfer(x) => RecvFail::Xfer(x),
            CheckedError::Mismatch => RecvFail::Chksum,
        }
    }
}

pub(super) async fn serve(
    depot: Arc<Depot>,
    sock: TcpStream,
    peer: SocketAddr,
    slot: ClientSlot,
    place: tokio::sync::OwnedSemaphorePermit,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut c = Conn {
        depot,
        rd: BufReader::with_capacity(64 * 1024, sock),
        peer,
        slot,
    };
    let idle = c.depot.cfg.idle_timeout.0;
    let mut line = Vec::with_capacity(256);
    loop {
        if *shutdown.borrow() {
            return;
        }
        let waiting = c.slot.idle();
        let got = tokio::select! {
            r = timeout(idle, read_line(&mut c.rd, MAX_LINE_BYTES, &mut line)) => r,
            _ = shutdown.changed() => return,
            () = waiting.evicted() => {
                tracing::debug!(peer = %c.peer, "idle connection closed to make room");
                waiting.hand_over(place);
                return;
            }
        };
        drop(waiting);
        match got {
            Err(_) | Ok(Err(_)) | Ok(Ok(Line::Eof | Line::Truncated)) => return,
            Ok(Ok(Line::TooLong)) => {
                c.metric_invalid(StatusCode::BAD_FORMAT);
                let _ = c.answer(Reply::fail(StatusCode::BAD_FORMAT)).await;
                return;
            }
            Ok(Ok(Line::Complete)) => {}
        }
        c.depot.commands.fetch_add(1, Relaxed);
        let req = match Request::parse(&line) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(peer = %c.peer, error = %e, "rejected request");
                c.metric_invalid(e.status());
                if c.answer(Reply::fail(e.status())).await.is_err() {
                    return;
                }
                // Data we will not read would read as commands: an unknown
                // command's, or that of a STORE or WRITE (plain or
                // checksummed) refused before its go-ahead — clients such as
                // LStore's send it without waiting.
                let unframed = match e {
                    ParseError::UnknownCommand(n) => !sends_no_data(n),
                    _ => command_number(&line)
                        .and_then(Command::from_number)
                        .is_some_and(Command::uploads),
                };
                if unframed {
                    return;
                }
                continue;
            }
        };
        let command = req.command();
        let started = std::time::Instant::now();
        let done = c.dispatch(req).await;
        let result = done.as_ref().map(drop).map_err(|f| f.code);
        c.depot
            .metrics
            .request(Some(command), result, started.elapsed());
        match done {
            Ok(Flow::Continue) => {}
            Ok(Flow::Close) => return,
            Err(f) => {
                tracing::debug!(peer = %c.peer, command = command.name(), code = f.code.code(), "command failed");
                if c.answer(Reply::fail(f.code)).await.is_err() || f.close {
                    return;
                }
            }
        }
    }
}

/// The command number of a request line that did not parse, if it has one.
fn command_number(line: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(line).ok()?;
    text.split_ascii_whitespace().nth(1)?.parse().ok()
}

impl Conn {
    /// A request line that is no request.
    fn metric_invalid(&self, code: StatusCode) {
        self.depot.metrics.request(None, Err(code), Duration::ZERO);
    }

    /// The inactivity deadline for a data phase: the depot's `io_timeout`,
    /// raised by the request's timeout field up to `max_client_timeout`, so
    /// no client can park a data phase for as long as it likes.
    fn io_deadline(&self, t: Timeout) -> Duration {
        let cfg = &self.depot.cfg;
        match t {
            Timeout::Secs(s) => cfg
                .io_timeout
                .0
                .max(Duration::from_secs(u64::from(s)).min(cfg.max_client_timeout.0)),
            Timeout::Default => cfg.io_timeout.0,
        }
    }

    /// Takes one of the client's data-phase slots before a go-ahead; a client
    /// running more data phases than its share waits for one of its own, up
    /// to the depot's `io_timeout` (not the client's: a client cannot ask to
    /// queue for longer).
    async fn transfer_slot(&mut self) -> Result<tokio::sync::OwnedSemaphorePermit, Fail> {
        let limit = self.depot.cfg.io_timeout.0;
        self.slot.transfer(limit).await.map_err(|_| {
            tracing::info!(peer = %self.peer, "client at its data-phase limit; refused");
            Fail::closing(StatusCode::OUT_OF_SOCKETS)
        })
    }

    /// Receives `len` bytes into `file` at byte `pos`, in rounds that each
    /// hold transfer budget only while the client's bytes flow: a round
    /// takes budget once [`READY_BYTES`] (or the rest) wait in the socket,
    /// and gives it back when its bytes are in or after [`BUDGET_HOLD`],
    /// whichever comes first. A client that trickles bytes so holds no
    /// budget, however many data phases it opens from however many hosts,
    /// and a slow one holds it for a second per batch at most.
    async fn receive(
        &mut self,
        file: &Arc<std::fs::File>,
        pos: u64,
        len: u64,
        idle: Duration,
        ncs: Option<NetChksum>,
    ) -> Result<(), RecvFail> {
        let mut checked = ncs.map(Checked::new);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(RECV_ROUND_BYTES);
            self.queued(n.min(READY_BYTES), idle).await?;
            let budget = self
                .depot
                .budget(&self.slot, n.min(2 * CHUNK_BYTES as u64))
                .await
                .map_err(|_| RecvFail::Busy)?;
            let until = Instant::now() + BUDGET_HOLD;
            let at = pos + done;
            let got = match &mut checked {
                None => recv_to_file(&mut self.rd, file.clone(), at, n, idle, until)
                    .await
                    .map_err(RecvFail::Xfer)?,
                Some(st) => {
                    let last = done + n == len;
                    recv_checked(&mut self.rd, file, at, n, last, idle, until, st).await?
                }
            };
            drop(budget);
            done += got;
        }
        Ok(())
    }

    /// Waits, holding nothing, until `want` bytes of the client's wait to be
    /// read (in our buffer or the socket's); fails when none arrive for
    /// `idle`.
    async fn queued(&mut self, want: u64, idle: Duration) -> Result<(), RecvFail> {
        let peer = |e: std::io::Error| RecvFail::Xfer(XferError::Peer(e));
        // The client closed with less than we wait for: the data phase
        // cannot finish.
        let closed = || peer(std::io::ErrorKind::UnexpectedEof.into());
        let want = usize::try_from(want).unwrap_or(usize::MAX);
        let mut peek = vec![0u8; want.saturating_sub(self.rd.buffer().len())];
        let (mut seen, mut since, mut pause) = (0, Instant::now(), Duration::from_millis(1));
        loop {
            let buffered = self.rd.buffer().len();
            if buffered >= want {
                return Ok(());
            }
            // Through `try_io`, so that "nothing yet" clears the socket's
            // readiness and `ready` below sleeps.
            let sock = self.rd.get_ref();
            let queued = sock.try_io(tokio::io::Interest::READABLE, || {
                let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
                rustix::net::recv(sock, &mut peek[..want - buffered], flags)
                    .map(|(n, _)| n)
                    .map_err(std::io::Error::from)
            });
            let have = match queued {
                Ok(0) => return Err(closed()),
                Ok(n) => buffered + n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => buffered,
                Err(e) => return Err(peer(e)),
            };
            if have >= want {
                return Ok(());
            }
            if have > seen {
                (seen, since) = (have, Instant::now());
            }
            let left = idle
                .checked_sub(since.elapsed())
                .ok_or_else(|| peer(timed_out()))?;
            // With nothing in the socket this sleeps until something comes.
            let ready = match timeout(left, sock.ready(tokio::io::Interest::READABLE)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Err(peer(e)),
                Err(_) => return Err(peer(timed_out())),
            };
            if ready.is_read_closed() {
                return Err(closed());
            }
            if have > buffered {
                // Some bytes, not yet a batch: look again soon, less often
                // the longer it takes.
                tokio::time::sleep(pause.min(left)).await;
                pause = (pause * 2).min(SLOW_POLL);
            }
        }
    }

    async fn answer(&mut self, r: Reply) -> std::io::Result<()> {
        self.reply_bytes(r.encode().as_bytes()).await
    }

    async fn reply_bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
        match timeout(self.depot.cfg.io_timeout.0, self.rd.get_mut().write_all(b)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        }
    }

    /// Sends a success reply; a failure to send ends the connection.
    async fn ok(&mut self, r: Reply) -> Res {
        match self.answer(r).await {
            Ok(()) => Ok(Flow::Continue),
            Err(_) => Ok(Flow::Close),
        }
    }

    async fn dispatch(&mut self, req: Request) -> Res {
        match req {
            Request::Allocate(a) => self.allocate(a, None).await,
            Request::AllocateChksum(r) => self.allocate(r.alloc, r.chksum).await,
            Request::Checksummed(r) => self.data_command(r.req, Some(r.chksum)).await,
            Request::Store(r) => self.data_command(Plain::Store(r), None).await,
            Request::Write(r) => self.data_command(Plain::Write(r), None).await,
            Request::Load(r) => self.data_command(Plain::Load(r), None).await,
            Request::Send(r) => {
                let (a, w) = self
                    .depot
                    .store
                    .lookup_view(&r.at.key, Some(CapKind::Read))?;
                let offset = w
                    .map(r.offset, r.length)
                    .ok_or(Fail::new(StatusCode::WOULD_EXCEED_LIMIT))?;
                self.send(&a, &r.dest, offset, r.length, r.at.timeout, r.dest_timeout)
                    .await
            }
            Request::Manage(r) => self.manage(&r.at.key, r.op).await,
            Request::AliasAllocate(_) | Request::AliasManage(_) if !self.depot.cfg.aliases => {
                Err(Fail::new(StatusCode::UNKNOWN_FUNCTION))
            }
            Request::AliasAllocate(r) => self.alias_allocate(&r).await,
            Request::AliasManage(r) => self.alias_manage(&r.at.key, r.op).await,
            Request::GetChksum(r) => self.get_chksum(&r.at.key, r.flag).await,
            Request::ValidateChksum(ChksumQuery { at, flag: correct }) => {
                let a = self.checksummed(&at.key)?;
                let w = a.writer().await;
                let bad = blocking(move || w.validate(correct)).await?;
                if bad > 0 {
                    tracing::warn!(
                        id = a.id,
                        bad,
                        corrected = correct,
                        "VALIDATE_CHKSUM found blocks failing their digests"
                    );
                }
                self.ok(Reply::BadBlocks(bad)).await
            }
            Request::Status(r) => self.status(r.version, r.op).await,
        }
    }

    /// STORE, WRITE and LOAD, plain or with LStore's network checksums,
    /// through an allocation's keys or an alias's (whose window the range
    /// must fit; a STORE through an alias needs one that starts at 0).
    async fn data_command(&mut self, req: Plain, ncs: Option<NetChksum>) -> Res {
        let beyond = |close: bool| Fail {
            code: StatusCode::WOULD_EXCEED_LIMIT,
            close,
        };
        let store = &self.depot.store;
        match req {
            // Each data phase counts on its resource while it runs: new
            // allocations go to the least busy disks.
            Plain::Store(r) => {
                let (a, w) = store
                    .lookup_view(&r.at.key, Some(CapKind::Write))
                    .map_err(closing)?;
                let _busy = a.res.busy();
                self.store(&a, r.length, r.at.timeout, ncs, w).await
            }
            Plain::Write(r) => {
                let (a, w) = store
                    .lookup_view(&r.at.key, Some(CapKind::Write))
                    .map_err(closing)?;
                let offset = w.map(r.offset, r.length).ok_or(beyond(true))?;
                let _busy = a.res.busy();
                self.write(&a, offset, r.length, r.at.timeout, ncs).await
            }
            Plain::Load(r) => {
                let (a, w) = store.lookup_view(&r.at.key, Some(CapKind::Read))?;
                let offset = w.map(r.offset, r.length).ok_or(beyond(false))?;
                let _busy = a.res.busy();
                self.load(&a, offset, r.length, r.at.timeout, ncs).await
            }
        }
    }

    async fn allocate(&mut self, a: Allocate, disk_chksum: Option<NetChksum>) -> Res {
        let req = AllocRequest {
            rid: a.rid,
            reliability: a.reliability,
            atype: a.alloc_type,
            lease: a.lease,
            size: a.size,
            disk_chksum,
        };
        let store = self.depot.store.clone();
        let new = blocking(move || store.allocate(&req)).await?;
        tracing::info!(peer = %self.peer, rid = %new.rid, id = new.id, size = a.size, "allocated");
        let caps = self.caps_reply(new);
        self.ok(caps).await
    }

    /// The three capabilities, the reply to ALLOCATE and ALIAS_ALLOCATE.
    fn caps_reply(&self, new: crate::store::NewAlloc) -> Reply {
        let (host, port) = self.depot.advertised();
        let [r, w, m] = new.keys;
        let cap = |key, kind| Capability::new(&host, port, &new.rid, key, new.id, kind);
        Reply::Caps(Box::new(CapSet {
            read: cap(r, CapKind::Read),
            write: cap(w, CapKind::Write),
            manage: cap(m, CapKind::Manage),
        }))
    }

    /// STORE through a key that reaches `window` of the allocation.
    async fn store(
        &mut self,
        a: &Arc<Alloc>,
        length: u64,
        t: Timeout,
        ncs: Option<NetChksum>,
        window: Window,
    ) -> Res {
        let idle = self.io_deadline(t);
        let w = a.writer().await;
        if a.is_queue() {
            let q = w.enqueue(length).map_err(closing)?;
            return self.enqueue(q, length, idle, ncs).await;
        }
        let planned = w.append(length, window).map_err(closing)?;
        self.receive_bytes(planned, idle, ncs).await
    }

    async fn write(
        &mut self,
        a: &Arc<Alloc>,
        offset: u64,
        length: u64,
        t: Timeout,
        ncs: Option<NetChksum>,
    ) -> Res {
        let idle = self.io_deadline(t);
        let w = a.writer().await;
        let planned = w.write(offset, length).map_err(closing)?;
        self.receive_bytes(planned, idle, ncs).await
    }

    async fn go_ahead(&mut self) -> Result<(), Fail> {
        self.answer(Reply::Ok)
            .await
            .map_err(|_| Fail::closing(StatusCode::SOCK_WRITE))
    }

    /// The data phase of a STORE or WRITE into a byte array: go-ahead,
    /// bytes, commit, reply. Any failure rolls back (the store's transaction
    /// does that when dropped).
    async fn receive_bytes(
        &mut self,
        planned: Planned,
        idle: Duration,
        ncs: Option<NetChksum>,
    ) -> Res {
        // The slot before any I/O: a client past its data-phase limit
        // creates no file.
        let _slot = self.transfer_slot().await?;
        let incoming = blocking(move || planned.start()).await.map_err(closing)?;
        self.go_ahead().await?;
        let length = incoming.len();
        let (file, pos) = incoming.target();
        let file = file.clone();
        if let Err(e) = self.receive(&file, pos, length, idle, ncs).await {
            return self.data_failed(e);
        }
        self.depot.metrics.bytes_in.inc_by(length);
        match blocking(move || incoming.commit()).await {
            Ok(()) => self.ok(Reply::Count(length)).await,
            Err(e) => Err(closing(e)),
        }
    }

    /// Answers a data phase that did not finish (already rolled back).
    fn data_failed(&mut self, e: RecvFail) -> Res {
        match e {
            RecvFail::Busy => {
                tracing::warn!(peer = %self.peer, "no transfer buffer freed up in time; rolled back");
                Err(Fail::closing(StatusCode::OUT_OF_SOCKETS))
            }
            RecvFail::Xfer(XferError::Peer(err)) => {
                tracing::info!(peer = %self.peer, error = %err, "data phase cut short; rolled back");
                Ok(Flow::Close)
            }
            RecvFail::Xfer(XferError::Disk(err)) => {
                tracing::error!(peer = %self.peer, error = %err, "disk write failed; rolled back");
                Err(Fail::closing(StatusCode::FILE_WRITE))
            }
            RecvFail::Chksum => {
                tracing::info!(peer = %self.peer, "network checksum mismatch; rolled back");
                Err(Fail::closing(StatusCode::CHKSUM))
            }
        }
    }

    /// The data phase of a STORE into a FIFO or circular queue: the bytes
    /// are received into a staging file as a byte array's are (budget held
    /// only while they flow), then written into the ring at commit.
    async fn enqueue(
        &mut self,
        q: QueueIn,
        length: u64,
        idle: Duration,
        ncs: Option<NetChksum>,
    ) -> Res {
        let _slot = self.transfer_slot().await?;
        let q = blocking(move || q.start()).await.map_err(closing)?;
        self.go_ahead().await?;
        let stage = q.stage().clone();
        if let Err(e) = self.receive(&stage, 0, length, idle, ncs).await {
            return self.data_failed(e);
        }
        self.depot.metrics.bytes_in.inc_by(length);
        match blocking(move || q.commit()).await {
            Ok(()) => self.ok(Reply::Count(length)).await,
            Err(e) => Err(closing(e)),
        }
    }

    async fn load(
        &mut self,
        a: &Arc<Alloc>,
        offset: u64,
        length: u64,
        t: Timeout,
        ncs: Option<NetChksum>,
    ) -> Res {
        let idle = self.io_deadline(t);
        if a.is_queue() {
            return self.dequeue(a, offset, length, idle, ncs).await;
        }
        let (file, ext) = snapshot(a).await?;
        let end = offset
            .checked_add(length)
            .ok_or(Fail::new(StatusCode::WOULD_EXCEED_LIMIT))?;
        if end > ext.len {
            return Err(Fail::new(StatusCode::WOULD_EXCEED_LIMIT));
        }
        verified(a, offset, length).await?;
        if self.answer(Reply::Count(length)).await.is_err() {
            return Ok(Flow::Close);
        }
        if length == 0 {
            return Ok(Flow::Continue);
        }
        let Some(file) = file else {
            return Ok(Flow::Close); // unreachable: len > 0 implies a file
        };
        let pos = HEADER_BYTES + offset;
        let sent = match ncs {
            None => send_file(self.rd.get_ref(), &file, pos, length, idle).await,
            Some(c) => send_checked(self.rd.get_mut(), &file, pos, length, idle, c).await,
        };
        match sent {
            Ok(()) => {
                self.depot.metrics.bytes_out.inc_by(length);
                Ok(Flow::Continue)
            }
            Err(e) => {
                if let XferError::Disk(err) = e {
                    tracing::error!(id = a.id, error = %err, "reading allocation failed mid-LOAD");
                }
                Ok(Flow::Close)
            }
        }
    }

    /// LOAD from a queue: the oldest `length` bytes, consumed once sent.
    async fn dequeue(
        &mut self,
        a: &Arc<Alloc>,
        offset: u64,
        length: u64,
        idle: Duration,
        ncs: Option<NetChksum>,
    ) -> Res {
        let w = a.writer().await;
        let out = blocking(move || w.dequeue(offset, length)).await?;
        let _slot = self.transfer_slot().await?;
        let _budget = self
            .depot
            .budget(&self.slot, length)
            .await
            .map_err(|_| Fail::closing(StatusCode::OUT_OF_SOCKETS))?;
        let out = blocking(move || {
            let mut out = out;
            out.read().map(|()| out)
        })
        .await?;
        if self.answer(Reply::Count(length)).await.is_err() {
            return Ok(Flow::Close);
        }
        let sent = match ncs {
            None => timeout(idle, self.rd.get_mut().write_all(out.bytes()))
                .await
                .is_ok_and(|r| r.is_ok()),
            Some(c) => send_framed(self.rd.get_mut(), out.bytes(), idle, c)
                .await
                .is_ok(),
        };
        if !sent {
            return Ok(Flow::Close); // not consumed: the reader never got it
        }
        self.depot.metrics.bytes_out.inc_by(length);
        let id = a.id;
        if let Err(e) = blocking(move || out.commit()).await {
            tracing::error!(id, error = %e, "could not record queue consumption");
        }
        Ok(Flow::Continue)
    }

    async fn send(
        &mut self,
        a: &Arc<Alloc>,
        dest: &Capability,
        offset: u64,
        length: u64,
        t: Timeout,
        dest_t: Timeout,
    ) -> Res {
        let idle = self.io_deadline(t);
        let n = copy::send(&self.depot, a, dest, offset, length, idle, dest_t).await?;
        self.depot.metrics.bytes_copied.inc_by(n);
        self.ok(Reply::Count(n)).await
    }

    async fn manage(&mut self, key: &lors_ibp::proto::KeyToken, op: ManageOp) -> Res {
        let store = self.depot.store.clone();
        match op {
            ManageOp::Probe { .. } => {
                // Any of the three keys may probe: LoRS 0.82 probes with the
                // read key. An alias's key sees its window.
                let (a, w) = store.lookup_view(key, None)?;
                self.ok(Reply::Probe(a.probe_window(w))).await
            }
            ManageOp::Incr { cap_type } | ManageOp::Decr { cap_type } => {
                let up = matches!(op, ManageOp::Incr { .. });
                let which = ref_count(cap_type)?;
                let a = store.lookup(key, Some(CapKind::Manage))?;
                blocking(move || store.change_refcount(&a, which, up)).await?;
                self.ok(Reply::Ok).await
            }
            ManageOp::Change {
                max_size,
                duration,
                reliability,
                ..
            } => {
                let change = Change {
                    // The reference depot takes 0 as a size, not as "keep":
                    // the strict depot does too.
                    max_size: (max_size != 0 || self.depot.cfg.strict).then_some(max_size),
                    lease: duration.map(Lease::Secs),
                    reliability,
                };
                let a = store.lookup(key, Some(CapKind::Manage))?;
                let w = a.writer().await;
                blocking(move || store.change(&w, change)).await?;
                self.ok(Reply::Ok).await
            }
            ManageOp::Truncate { size } => {
                let a = store.lookup(key, Some(CapKind::Manage))?;
                let w = a.writer().await;
                blocking(move || store.truncate(&w, size)).await?;
                self.ok(Reply::Ok).await
            }
        }
    }

    /// The allocation a GET/VALIDATE_CHKSUM manage key names; an alias's
    /// key only if its window starts at 0 (as on the ACCRE depot).
    fn checksummed(&self, key: &lors_ibp::proto::KeyToken) -> Result<Arc<Alloc>, Fail> {
        let (a, w) = self.depot.store.lookup_view(key, Some(CapKind::Manage))?;
        if !w.at_start() {
            return Err(Fail::new(StatusCode::WOULD_EXCEED_LIMIT));
        }
        Ok(a)
    }

    /// GET_CHKSUM: `1 <type> <digest bytes> <block size> <blocks> <bytes>\n`
    /// (no space before the newline, as the ACCRE depot sends it), then the
    /// binary digests unless `info_only`.
    async fn get_chksum(&mut self, key: &lors_ibp::proto::KeyToken, info_only: bool) -> Res {
        let a = self.checksummed(key)?;
        // The turn is held while the digests go out a run at a time, so
        // they describe one state of the data, and memory stays bounded.
        let mut w = a.writer().await;
        let (cs, blocks) = w.chksums()?;
        let dlen = cs.kind.hex_len() as u64 / 2;
        let head = Reply::Chksum {
            kind: cs.kind,
            block_size: cs.block_size,
            blocks,
            bytes: blocks * dlen,
        };
        if info_only || blocks == 0 {
            return self.ok(head).await;
        }
        let mut out = head.encode().into_bytes();
        let mut next = 0;
        while next < blocks {
            let (back, run) = blocking(move || {
                let run = w.chksum_run(next..blocks)?;
                Ok((w, run))
            })
            .await?;
            w = back;
            next += run.len() as u64 / dlen;
            out.extend_from_slice(&run);
            if self.reply_bytes(&out).await.is_err() || run.is_empty() {
                return Ok(Flow::Close);
            }
            out.clear();
        }
        Ok(Flow::Continue)
    }

    async fn alias_allocate(&mut self, r: &AliasAllocate) -> Res {
        let store = self.depot.store.clone();
        let m = store.lookup(&r.at.key, Some(CapKind::Manage))?;
        let (offset, length, lease) = (r.offset, r.length, r.lease);
        let new = blocking(move || store.alias_allocate(&m, offset, length, lease)).await?;
        tracing::info!(peer = %self.peer, rid = %new.rid, alias = new.id, offset, length, "alias allocated");
        let caps = self.caps_reply(new);
        self.ok(caps).await
    }

    async fn alias_manage(&mut self, key: &lors_ibp::proto::KeyToken, op: AliasOp) -> Res {
        let store = self.depot.store.clone();
        let key = key.clone();
        let up = matches!(op, AliasOp::Incr { .. });
        match op {
            AliasOp::Probe { .. } => {
                let p = store.alias_probe(&key)?;
                self.ok(Reply::AliasProbe(AliasProbeInfo {
                    read_refs: p.read_refs.into(),
                    write_refs: p.write_refs.into(),
                    offset: p.offset,
                    length: p.length,
                    seconds_left: p.seconds_left,
                }))
                .await
            }
            AliasOp::Incr {
                cap_type, master, ..
            }
            | AliasOp::Decr {
                cap_type, master, ..
            } => {
                let which = ref_count(cap_type)?;
                blocking(move || store.alias_refcount(&key, &master, which, up)).await?;
                self.ok(Reply::Ok).await
            }
            AliasOp::Change {
                offset,
                length,
                lease,
                master,
                ..
            } => {
                blocking(move || store.alias_change(&key, &master, offset, length, lease)).await?;
                self.ok(Reply::Ok).await
            }
        }
    }

    async fn status(&mut self, version: Version, op: StatusOp) -> Res {
        match op {
            StatusOp::Inquire { rid, password } => {
                if !self.password_ok(&password) {
                    return Err(Fail::new(StatusCode::WRONG_PASSWD));
                }
                let all = self.depot.store.status();
                let chosen: Vec<_> = match rid.as_deref() {
                    None | Some("0") => all,
                    Some(r) => {
                        let v: Vec<_> = all.into_iter().filter(|s| s.rid == r).collect();
                        if v.is_empty() {
                            return Err(Fail::new(StatusCode::INVALID_RID));
                        }
                        v
                    }
                };
                let sum = |f: &dyn Fn(&crate::store::ResourceStatus) -> u64| {
                    chosen.iter().map(f).fold(0u64, u64::saturating_add)
                };
                let total = sum(&|s| s.total);
                let hard_total = sum(&|s| s.hard_total);
                let soft_total = sum(&|s| s.soft_total);
                let used_hard = sum(&|s| s.usage.hard);
                let used_soft = sum(&|s| s.usage.soft);
                let free = sum(&|s| s.free());
                let hard_free = sum(&|s| s.hard_free());
                let max_dur = chosen.iter().map(|s| s.max_duration).max().unwrap_or(0);
                if version == Version::V13 {
                    return self
                        .ok(Reply::StatusV13(StatusV13 {
                            hard_mb: hard_total >> 20,
                            hard_used_mb: used_hard >> 20,
                            soft_mb: soft_total >> 20,
                            soft_used_mb: used_soft >> 20,
                            max_duration: max_dur,
                        }))
                        .await;
                }
                let body = StatusBody {
                    rid: rid.unwrap_or_else(|| "0".to_owned()),
                    config_total: total,
                    served_total: total,
                    used_total: used_hard.saturating_add(used_soft),
                    used_hard,
                    served_hard: hard_total,
                    config_hard: hard_total,
                    free_total: free,
                    free_hard: hard_free,
                    max_duration: max_dur,
                    ..StatusBody::default()
                }
                .encode();
                let mut out = Reply::Count(body.len() as u64).encode();
                out.push_str(&body);
                match self.reply_bytes(out.as_bytes()).await {
                    Ok(()) => Ok(Flow::Continue),
                    Err(_) => Ok(Flow::Close),
                }
            }
            StatusOp::Change { .. } => {
                // A second line with new limits follows; read it so the stream
                // stays in step, then refuse as the reference depot does.
                let mut line = Vec::new();
                let _ = timeout(
                    Duration::from_secs(5),
                    read_line(&mut self.rd, MAX_LINE_BYTES, &mut line),
                )
                .await;
                Err(Fail::new(StatusCode::INVALID_CMD))
            }
            StatusOp::Resources => {
                let rids = self.depot.store.resources();
                let rids = rids.iter().map(|r| r.rid().to_owned()).collect();
                self.ok(Reply::Resources(rids)).await
            }
            StatusOp::Version => {
                let text = self.version_report();
                match self.reply_bytes(text.as_bytes()).await {
                    Ok(()) => Ok(Flow::Continue),
                    Err(_) => Ok(Flow::Close),
                }
            }
        }
    }

    fn password_ok(&self, given: &str) -> bool {
        let cfg = &self.depot.cfg;
        lors_ibp::caps::ct_eq(given.as_bytes(), cfg.password.as_bytes())
            || (cfg.accept_default_password && given == crate::config::DEFAULT_PASSWORD)
    }

    fn version_report(&self) -> String {
        let d = &self.depot;
        let (host, port) = d.advertised();
        let mut s = Reply::Report.encode();
        let _ = writeln!(
            s,
            "LoRS depot {} (IBP 1.4 compatible; byte arrays, FIFO and circular queues)",
            env!("CARGO_PKG_VERSION")
        );
        let _ = writeln!(s, "Interfaces(1): {host}:{port};");
        let _ = writeln!(s, "Uptime: {}s", d.uptime().as_secs());
        let _ = writeln!(
            s,
            "Total Commands: {}  Connections: {}",
            d.commands.load(Relaxed),
            d.metrics.connections_total.get()
        );
        let _ = writeln!(
            s,
            "Depot Transfer Stats --  Read: {} b Write: {} b Copied: {} b",
            d.metrics.bytes_out.get(),
            d.metrics.bytes_in.get(),
            d.metrics.bytes_copied.get()
        );
        for r in d.store.status() {
            let _ = writeln!(
                s,
                "RID: {} Max: {} b Used: {} b Free: {} b Allocations: {} Max duration: {} s",
                r.rid,
                r.total,
                r.usage.used(),
                r.free(),
                r.usage.count,
                r.max_duration
            );
        }
        s.push_str("END\n");
        s
    }
}

/// The allocation's data file (opened if need be) and committed extent.
async fn snapshot(a: &Arc<Alloc>) -> Result<(Option<Arc<std::fs::File>>, Extent), Fail> {
    let a = a.clone();
    Ok(blocking(move || a.snapshot()).await?)
}

/// Which count an INCR/DECR's cap type names (1 read, 2 write).
fn ref_count(cap_type: u32) -> Result<RefCount, Fail> {
    match cap_type {
        1 => Ok(RefCount::Read),
        2 => Ok(RefCount::Write),
        _ => Err(Fail::new(StatusCode::WRONG_CAP_FORMAT)),
    }
}

/// STORE/WRITE lookups close the connection on failure: data may follow.
fn closing(e: StoreError) -> Fail {
    log_failure(&e);
    Fail::closing(e.status())
}
