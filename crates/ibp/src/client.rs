//! An async IBP client: one [`Connection`] per depot socket, reused across
//! commands as the reference depot allows.
//!
//! Every wait has a deadline ([`ClientConfig`]); data phases use an inactivity
//! deadline per chunk, so a slow but live transfer is not cut off while a stalled
//! one is.
//!
//! ```no_run
//! # async fn demo() -> lors_ibp::Result<()> {
//! use lors_ibp::{ClientConfig, Connection};
//! use lors_ibp::proto::{AllocType, Lease, Reliability};
//! let mut c = Connection::connect("127.0.0.1:6714", &ClientConfig::default()).await?;
//! let caps = c.allocate("0", Reliability::Hard, AllocType::ByteArray, Lease::Secs(3600), 1 << 20).await?;
//! c.store(&caps.write, b"hello").await?;
//! let mut out = vec![0; 5];
//! c.load(&caps.read, 0, &mut out).await?;
//! assert_eq!(&out, b"hello");
//! # Ok(()) }
//! ```

use std::time::Duration;

use bytes::BufMut;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::caps::{CapKind, CapSet, Capability};
use crate::error::{Error, Result};
use crate::proto::limits::{MAX_LINE_BYTES, MAX_STATUS_BODY_BYTES};
use crate::proto::{
    AliasAllocate, AliasManage, AliasOp, AliasProbeInfo, AllocType, Allocate, KeyToken, Keyed,
    Lease, Load, Manage, ManageOp, ProbeInfo, Reliability, Reply, Request, Send, Shape, Status,
    StatusBody, StatusOp, Store, Timeout, Version, Write,
};
use crate::wire::{Line, read_line, read_line_exact};
use crate::zerocopy;

/// Default connect deadline.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The slowest delivery a LOAD's data phase is allowed on average: it
/// must end within the inactivity deadline plus its length at this rate
/// (a 2 MiB piece: 32 s more). A depot that trickles a byte a second
/// never trips the inactivity deadline; this ends it.
pub const MIN_RATE: u64 = 64 << 10;

/// How long a data phase of `len` bytes may take in all: the inactivity
/// deadline `idle`, plus `len` at [`MIN_RATE`].
///
/// ```
/// use std::time::Duration;
/// use lors_ibp::client::data_deadline;
/// assert_eq!(data_deadline(Duration::from_secs(60), 2 << 20), Duration::from_secs(92));
/// ```
pub fn data_deadline(idle: Duration, len: u64) -> Duration {
    idle.saturating_add(Duration::from_secs(len / MIN_RATE))
}

/// Default inactivity deadline for replies and data chunks.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Chunk size for streaming data phases.
const CHUNK_BYTES: usize = 1 << 20;

/// Client deadlines.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Deadline for establishing the TCP connection.
    pub connect_timeout: Duration,
    /// Deadline for each reply line and each data chunk.
    pub io_timeout: Duration,
    /// The server-side timeout field sent in requests.
    pub server_timeout: Timeout,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            io_timeout: DEFAULT_IO_TIMEOUT,
            server_timeout: Timeout::Secs(60),
        }
    }
}

impl ClientConfig {
    /// Defaults with the inactivity deadline `io`; connecting never waits
    /// longer than that either, so a depot whose link is cut is given up on
    /// within the deadline the user chose.
    pub fn with_io_timeout(io: Duration) -> Self {
        ClientConfig {
            connect_timeout: io.min(DEFAULT_CONNECT_TIMEOUT),
            io_timeout: io,
            ..ClientConfig::default()
        }
    }
}

/// The slowest depot-to-depot copy a client waits for: 1 Mbit/s.
pub const COPY_FLOOR_BYTES_PER_SEC: u64 = 125_000;

/// How long to wait for the reply to a SEND of `len` bytes, which comes
/// only when the whole copy is done: the inactivity deadline `idle`, plus
/// the time the copy takes at [`COPY_FLOOR_BYTES_PER_SEC`].
///
/// ```
/// use std::time::Duration;
/// use lors_ibp::client::copy_reply_deadline;
/// assert_eq!(copy_reply_deadline(Duration::from_secs(60), 0), Duration::from_secs(60));
/// assert_eq!(copy_reply_deadline(Duration::from_secs(60), 10_000_000), Duration::from_secs(140));
/// ```
pub fn copy_reply_deadline(idle: Duration, len: u64) -> Duration {
    idle.saturating_add(Duration::from_secs(len / COPY_FLOOR_BYTES_PER_SEC))
}

/// Runs one I/O future under the inactivity deadline; any failure marks the
/// connection unhealthy. A macro rather than a method so the future may borrow
/// `self.stream` while the error path touches other fields.
macro_rules! io {
    ($conn:expr, $during:expr, $fut:expr) => {{
        let res = match timeout($conn.cfg.io_timeout, $fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(Error::Io {
                addr: $conn.addr.clone(),
                during: $during,
                source,
            }),
            Err(_) => Err(Error::Timeout {
                addr: $conn.addr.clone(),
                during: $during,
                secs: $conn.cfg.io_timeout.as_secs(),
            }),
        };
        if res.is_err() {
            $conn.healthy = false;
        }
        res
    }};
}

/// One open connection to a depot.
pub struct Connection {
    stream: BufReader<TcpStream>,
    addr: String,
    cfg: ClientConfig,
    line: Vec<u8>,
    healthy: bool,
}

impl Connection {
    /// Connects to `addr` (`host:port`).
    pub async fn connect(addr: &str, cfg: &ClientConfig) -> Result<Connection> {
        let stream = match timeout(cfg.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => {
                return Err(Error::Connect {
                    addr: addr.to_owned(),
                    source,
                });
            }
            Err(_) => {
                return Err(Error::Timeout {
                    addr: addr.to_owned(),
                    during: "connect",
                    secs: cfg.connect_timeout.as_secs(),
                });
            }
        };
        // Small request lines must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        Ok(Connection {
            stream: BufReader::with_capacity(64 * 1024, stream),
            addr: addr.to_owned(),
            cfg: cfg.clone(),
            line: Vec::with_capacity(256),
            healthy: true,
        })
    }

    /// Connects to the depot a capability names.
    pub async fn connect_cap(cap: &Capability, cfg: &ClientConfig) -> Result<Connection> {
        Connection::connect(&cap.address(), cfg).await
    }

    /// Uses `cfg`'s timeouts from now on (a pooled connection taken up
    /// for a command with limits of its own; the connect timeout no longer
    /// applies).
    pub fn reconfigure(&mut self, cfg: &ClientConfig) {
        self.cfg = cfg.clone();
    }

    /// The depot address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// False once any error happened: the depot may have closed the socket or
    /// the stream may be mid-reply, so the connection must not be reused.
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    /// Whether an idle connection can carry another command: healthy, and
    /// the depot has neither closed it (a depot closes connections idle
    /// longer than its limit, 60 s by default) nor sent anything
    /// unasked. Checked without waiting, before a pooled connection is
    /// reused, so a command is not lost to a socket closed while idle.
    pub fn is_reusable(&self) -> bool {
        if !self.healthy || !self.stream.buffer().is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut probe);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        // Pending: nothing to read, the peer still there. Anything else
        // (end of stream, stray bytes, an error) retires the connection.
        self.stream
            .get_ref()
            .poll_peek(&mut cx, &mut buf)
            .is_pending()
    }

    async fn send_line(&mut self, during: &'static str, line: &str) -> Result<()> {
        io!(
            self,
            during,
            self.stream.get_mut().write_all(line.as_bytes())
        )
    }

    /// Reads one reply line and returns its text (without the newline).
    pub async fn read_reply_line(&mut self, during: &'static str) -> Result<String> {
        self.reply_line(during, false).await
    }

    /// With `exact`, nothing past the newline is read (see
    /// [`read_line_exact`]), unless earlier bytes are already buffered.
    async fn reply_line(&mut self, during: &'static str, exact: bool) -> Result<String> {
        let mut buf = std::mem::take(&mut self.line);
        let res = if exact && self.stream.buffer().is_empty() {
            io!(
                self,
                during,
                read_line_exact(self.stream.get_mut(), MAX_LINE_BYTES, &mut buf)
            )
        } else {
            io!(
                self,
                during,
                read_line(&mut self.stream, MAX_LINE_BYTES, &mut buf)
            )
        };
        let text = String::from_utf8_lossy(&buf).trim_end().to_owned();
        self.line = buf;
        match res? {
            Line::Complete => Ok(text),
            Line::Eof | Line::Truncated => Err(self.closed(during)),
            Line::TooLong => {
                self.healthy = false;
                Err(self.protocol(during, &text))
            }
        }
    }

    /// The depot closed the connection `during` something: it is not
    /// reused.
    fn closed(&mut self, during: &'static str) -> Error {
        self.healthy = false;
        Error::Closed {
            addr: self.addr.clone(),
            during,
        }
    }

    fn protocol(&self, during: &'static str, line: &str) -> Error {
        let mut line = line.to_owned();
        line.truncate(200);
        Error::Protocol {
            addr: self.addr.clone(),
            during,
            line,
        }
    }

    /// Reads a reply line of `shape`: an error status becomes
    /// [`Error::Depot`], a line that is not such a reply [`Error::Protocol`].
    /// With `exact`, nothing past the line is read (LOAD's data follows).
    async fn expect(&mut self, during: &'static str, shape: Shape, exact: bool) -> Result<Reply> {
        let line = self.reply_line(during, exact).await?;
        match Reply::parse(shape, &line) {
            Ok(Reply::Fail { code, .. }) => {
                // The reference depot closes the connection after most errors.
                self.healthy = false;
                Err(Error::Depot {
                    addr: self.addr.clone(),
                    during,
                    code,
                })
            }
            Ok(r) => Ok(r),
            Err(_) => {
                self.healthy = false;
                Err(self.protocol(during, &line))
            }
        }
    }

    /// A reply of another shape than asked for; `Reply::parse` gives none,
    /// so this only keeps the matches below total.
    fn unexpected(&mut self, during: &'static str, r: &Reply) -> Error {
        self.healthy = false;
        self.protocol(during, r.encode().trim_end())
    }

    /// Expects `1 \n`.
    async fn expect_bare(&mut self, during: &'static str) -> Result<()> {
        match self.expect(during, Shape::Bare, false).await? {
            Reply::Ok => Ok(()),
            r => Err(self.unexpected(during, &r)),
        }
    }

    /// Expects `1 <len> \n`, with exactly `len`.
    async fn expect_count(&mut self, during: &'static str, len: u64, exact: bool) -> Result<u64> {
        match self.expect(during, Shape::Count, exact).await? {
            Reply::Count(n) if n == len => Ok(n),
            r => Err(self.unexpected(during, &r)),
        }
    }

    /// The fields every request on `cap` starts with, in the v1.4 form.
    fn keyed(&self, cap: &Capability) -> Keyed {
        Keyed {
            version: Version::V14,
            key: KeyToken::of(cap),
            typekey: cap.typekey.clone(),
            timeout: self.cfg.server_timeout,
        }
    }

    /// Sends a raw request line and returns the first reply line (tests, tools).
    pub async fn raw(&mut self, line: &str) -> Result<String> {
        self.send_line("raw request", line).await?;
        self.read_reply_line("raw request").await
    }

    /// ALLOCATE (v1.4 form) on resource `rid` (`"0"` = depot chooses).
    pub async fn allocate(
        &mut self,
        rid: &str,
        reliability: Reliability,
        alloc_type: AllocType,
        lease: Lease,
        size: u64,
    ) -> Result<CapSet> {
        let req = Request::Allocate(Allocate {
            version: Version::V14,
            rid: Some(rid.to_owned()),
            reliability,
            alloc_type,
            lease,
            size,
            timeout: self.cfg.server_timeout,
        });
        self.send_line("ALLOCATE", &req.encode()).await?;
        match self.expect("ALLOCATE", Shape::Caps, false).await? {
            Reply::Caps(caps) => Ok(*caps),
            r => Err(self.unexpected("ALLOCATE", &r)),
        }
    }

    /// STORE: appends `data` to the allocation; returns the bytes stored.
    pub async fn store(&mut self, cap: &Capability, data: &[u8]) -> Result<u64> {
        let req = Store {
            at: self.keyed(cap),
            length: data.len() as u64,
        };
        self.data_out("STORE", &req.encode(), data).await
    }

    /// WRITE: writes `data` at `offset`; returns the bytes written.
    pub async fn write_at(&mut self, cap: &Capability, offset: u64, data: &[u8]) -> Result<u64> {
        let req = Write {
            at: self.keyed(cap),
            offset,
            length: data.len() as u64,
        };
        self.data_out("WRITE", &req.encode(), data).await
    }

    async fn data_out(&mut self, during: &'static str, line: &str, data: &[u8]) -> Result<u64> {
        self.begin_data(during, line).await?;
        for chunk in data.chunks(CHUNK_BYTES) {
            io!(self, during, self.stream.get_mut().write_all(chunk))?;
        }
        self.finish_data(during, data.len() as u64).await
    }

    async fn begin_data(&mut self, during: &'static str, line: &str) -> Result<()> {
        self.send_line(during, line).await?;
        // The depot answers "1 \n" before it reads data, or an error.
        self.expect_bare(during).await
    }

    async fn finish_data(&mut self, during: &'static str, len: u64) -> Result<u64> {
        self.healthy = true;
        self.expect_count(during, len, false).await
    }

    /// Starts a STORE of `len` bytes and waits for the depot's go-ahead. The
    /// caller then writes exactly `len` bytes to [`Connection::socket`] and
    /// calls [`Connection::finish_store`]. Used for zero-copy depot-to-depot
    /// copies.
    pub async fn begin_store(&mut self, cap: &Capability, len: u64) -> Result<()> {
        let req = Store {
            at: self.keyed(cap),
            length: len,
        };
        self.begin_data("STORE", &req.encode()).await
    }

    /// Reads the reply that ends a STORE begun with [`Connection::begin_store`].
    pub async fn finish_store(&mut self, len: u64) -> Result<u64> {
        self.finish_data("STORE", len).await
    }

    /// The raw socket, for writing a data phase directly. Nothing is buffered
    /// on the write side, so writes go straight out.
    pub fn socket(&mut self) -> &mut TcpStream {
        self.healthy = false; // until finish_store proves the stream is in step
        self.stream.get_mut()
    }

    /// LOAD: reads `out.len()` bytes at `offset` into `out`.
    pub async fn load(&mut self, cap: &Capability, offset: u64, out: &mut [u8]) -> Result<()> {
        self.load_buf(cap, offset, out.len() as u64, &mut &mut out[..])
            .await
    }

    /// LOAD: appends the `len` bytes at `offset` to `out`, read straight
    /// into its spare room: a buffer with room for them is neither zeroed
    /// first nor grown.
    pub async fn load_buf<B: BufMut>(
        &mut self,
        cap: &Capability,
        offset: u64,
        len: u64,
        out: &mut B,
    ) -> Result<()> {
        self.load_header(cap, offset, len).await?;
        let until = self.data_until(len);
        let mut left = len;
        while left > 0 {
            self.check_rate(until, "LOAD data")?;
            let room = (&mut *out).limit(usize::try_from(left).unwrap_or(usize::MAX));
            let n = io!(self, "LOAD data", self.stream.read_buf(&mut { room }))?;
            if n == 0 {
                return Err(self.closed("LOAD data"));
            }
            left -= n as u64;
        }
        Ok(())
    }

    /// LOAD streamed into a writer (a file, a socket, a sink) without holding
    /// the whole range in memory. Returns the bytes copied.
    pub async fn load_to<W: AsyncWrite + Unpin>(
        &mut self,
        cap: &Capability,
        offset: u64,
        len: u64,
        w: &mut W,
    ) -> Result<u64> {
        self.load_header(cap, offset, len).await?;
        let mut left = len;
        let mut buf = vec![
            0u8;
            CHUNK_BYTES
                .min(usize::try_from(len).unwrap_or(CHUNK_BYTES))
                .max(1)
        ];
        let until = self.data_until(len);
        while left > 0 {
            self.check_rate(until, "LOAD data")?;
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            let n = io!(self, "LOAD data", self.stream.read(&mut buf[..want]))?;
            if n == 0 {
                return Err(self.closed("LOAD data"));
            }
            let fut = w.write_all(&buf[..n]);
            if let Err(source) = fut.await {
                self.healthy = false;
                return Err(Error::Local {
                    during: "LOAD output",
                    source,
                });
            }
            left -= n as u64;
        }
        Ok(len)
    }

    /// LOAD straight into `file` at byte `pos`, with no copy through user
    /// space on Linux (see [`crate::zerocopy`]); other connections may be
    /// loading into the same file, taking turns at its `gate`
    /// ([`zerocopy::recv_shared`]). Errors writing the file are
    /// [`Error::Local`].
    pub async fn load_to_file(
        &mut self,
        cap: &Capability,
        offset: u64,
        len: u64,
        (file, gate): (&std::fs::File, &std::sync::Mutex<()>),
        pos: u64,
    ) -> Result<()> {
        self.load_header(cap, offset, len).await?;
        let idle = self.cfg.io_timeout;
        let all = data_deadline(idle, len);
        let r = zerocopy::recv_shared(&mut self.stream, file, gate, pos, len, idle);
        match timeout(all, r).await {
            Ok(r) => self.xfer_result(r, "LOAD data", "LOAD output"),
            Err(_) => Err(self.too_slow("LOAD data", all)),
        }
    }

    /// LOAD into kernel pipes ([`crate::spliced`]): the bytes are not
    /// copied into user memory, and can later be handed on by reference
    /// (a FUSE reply) or copied out. Running out of descriptors or pipe
    /// memory is [`Error::Local`]: before the LOAD is sent the connection
    /// stays healthy ([`Connection::is_healthy`]), and the caller can load
    /// into memory instead.
    pub async fn load_spliced(
        &mut self,
        cap: &Capability,
        offset: u64,
        len: u64,
    ) -> Result<crate::spliced::Spliced> {
        let n = usize::try_from(len).map_err(|_| Error::Local {
            during: "LOAD output",
            source: std::io::Error::other("more bytes than this machine addresses"),
        })?;
        let room = crate::spliced::Room::new().map_err(|source| Error::Local {
            during: "LOAD output",
            source,
        })?;
        self.load_header(cap, offset, len).await?;
        let idle = self.cfg.io_timeout;
        let all = data_deadline(idle, len);
        match timeout(all, crate::spliced::recv(&mut self.stream, room, n, idle)).await {
            Ok(r) => self.xfer_result(r, "LOAD data", "LOAD output"),
            Err(_) => Err(self.too_slow("LOAD data", all)),
        }
    }

    /// STORE `len` bytes of `file` from byte `pos`, sent with `sendfile(2)`;
    /// returns the bytes stored. Errors reading the file are
    /// [`Error::Local`].
    pub async fn store_from_file(
        &mut self,
        cap: &Capability,
        file: &std::fs::File,
        pos: u64,
        len: u64,
    ) -> Result<u64> {
        self.begin_store(cap, len).await?;
        let r =
            zerocopy::send_file(self.stream.get_ref(), file, pos, len, self.cfg.io_timeout).await;
        self.xfer_result(r, "STORE data", "STORE input")?;
        self.finish_store(len).await
    }

    /// When a data phase of `len` bytes begun now must be over, and how
    /// long that is.
    fn data_until(&self, len: u64) -> (tokio::time::Instant, Duration) {
        let all = data_deadline(self.cfg.io_timeout, len);
        (tokio::time::Instant::now() + all, all)
    }

    /// [`Error::TooSlow`] once the phase's time is up.
    fn check_rate(
        &mut self,
        (until, all): (tokio::time::Instant, Duration),
        during: &'static str,
    ) -> Result<()> {
        match tokio::time::Instant::now() <= until {
            true => Ok(()),
            false => Err(self.too_slow(during, all)),
        }
    }

    /// The data phase took longer than `all`: the stream is out of step.
    fn too_slow(&mut self, during: &'static str, all: Duration) -> Error {
        self.healthy = false;
        Error::TooSlow {
            addr: self.addr.clone(),
            during,
            secs: all.as_secs(),
        }
    }

    fn xfer_result<T>(
        &mut self,
        r: std::result::Result<T, zerocopy::XferError>,
        during: &'static str,
        local: &'static str,
    ) -> Result<T> {
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        // Either way the stream is no longer in step with the protocol.
        self.healthy = false;
        Err(match e {
            zerocopy::XferError::Peer(source) if source.kind() == std::io::ErrorKind::TimedOut => {
                Error::Timeout {
                    addr: self.addr.clone(),
                    during,
                    secs: self.cfg.io_timeout.as_secs(),
                }
            }
            zerocopy::XferError::Peer(source) => Error::Io {
                addr: self.addr.clone(),
                during,
                source,
            },
            zerocopy::XferError::Disk(source) => Error::Local {
                during: local,
                source,
            },
        })
    }

    async fn load_header(&mut self, cap: &Capability, offset: u64, len: u64) -> Result<()> {
        let req = Load {
            at: self.keyed(cap),
            offset,
            length: len,
        };
        self.send_line("LOAD", &req.encode()).await?;
        // The data follows the reply: leave all of it to the caller's splice.
        self.expect_count("LOAD", len, true).await.map(drop)
    }

    /// SEND: the depot holding `src` (a read capability) appends
    /// `[offset, offset+len)` to `dest` (a write capability on any depot).
    pub async fn send(
        &mut self,
        src: &Capability,
        dest: &Capability,
        offset: u64,
        len: u64,
    ) -> Result<u64> {
        let req = Send {
            at: self.keyed(src),
            dest: dest.clone(),
            offset,
            length: len,
            dest_timeout: self.cfg.server_timeout,
            client_timeout: self.cfg.server_timeout,
        };
        self.send_line("SEND", &req.encode()).await?;
        // The depot answers only once the whole copy is done.
        let idle = self.cfg.io_timeout;
        self.cfg.io_timeout = copy_reply_deadline(idle, len);
        let r = self.expect_count("SEND", len, false).await;
        self.cfg.io_timeout = idle;
        r
    }

    async fn manage(&mut self, cap: &Capability, op: ManageOp, shape: Shape) -> Result<Reply> {
        let req = Manage {
            at: self.keyed(cap),
            op,
        };
        self.send_line("MANAGE", &req.encode()).await?;
        self.expect("MANAGE", shape, false).await
    }

    /// MANAGE PROBE.
    pub async fn probe(&mut self, cap: &Capability) -> Result<ProbeInfo> {
        let op = ManageOp::Probe {
            cap_type: cap.kind.number(),
        };
        match self.manage(cap, op, Shape::Probe).await? {
            Reply::Probe(p) => Ok(p),
            r => Err(self.unexpected("PROBE", &r)),
        }
    }

    /// MANAGE INCR of the read or write reference count.
    pub async fn incr(&mut self, cap: &Capability, which: CapKind) -> Result<()> {
        self.manage(
            cap,
            ManageOp::Incr {
                cap_type: which.number(),
            },
            Shape::Bare,
        )
        .await
        .map(drop)
    }

    /// MANAGE DECR; the allocation is deleted when both counts reach zero.
    pub async fn decr(&mut self, cap: &Capability, which: CapKind) -> Result<()> {
        self.manage(
            cap,
            ManageOp::Decr {
                cap_type: which.number(),
            },
            Shape::Bare,
        )
        .await
        .map(drop)
    }

    /// MANAGE CHNG: new max size (0 keeps it on our depot, not on the
    /// reference one), a lease of `duration_secs` from now (`None` keeps
    /// it), reliability (`None` keeps it).
    pub async fn change(
        &mut self,
        cap: &Capability,
        max_size: u64,
        duration_secs: Option<u64>,
        reliability: Option<Reliability>,
    ) -> Result<()> {
        let op = ManageOp::Change {
            cap_type: cap.kind.number(),
            max_size,
            duration: duration_secs,
            reliability,
        };
        self.manage(cap, op, Shape::Bare).await.map(drop)
    }

    /// ALIAS_ALLOCATE: three new capabilities for `length` bytes at `offset`
    /// of the allocation `manage` names (both 0: all of it), leased for
    /// `duration_secs` (0: until the allocation's lease ends). An alias
    /// holds no bytes; its keys reach only its window, and deleting it
    /// leaves the allocation as it was.
    pub async fn alias_allocate(
        &mut self,
        manage: &Capability,
        offset: u64,
        length: u64,
        lease: Lease,
    ) -> Result<CapSet> {
        let req = AliasAllocate {
            at: self.keyed(manage),
            offset,
            length,
            lease,
        };
        self.send_line("ALIAS_ALLOCATE", &req.encode()).await?;
        match self.expect("ALIAS_ALLOCATE", Shape::Caps, false).await? {
            Reply::Caps(caps) => Ok(*caps),
            r => Err(self.unexpected("ALIAS_ALLOCATE", &r)),
        }
    }

    /// ALIAS_MANAGE on the alias whose manage capability is `alias`.
    async fn alias_manage(
        &mut self,
        alias: &Capability,
        op: AliasOp,
        shape: Shape,
    ) -> Result<Reply> {
        let req = AliasManage {
            at: self.keyed(alias),
            op,
        };
        self.send_line("ALIAS_MANAGE", &req.encode()).await?;
        self.expect("ALIAS_MANAGE", shape, false).await
    }

    /// ALIAS_MANAGE PROBE: the alias's counts, window and lease.
    pub async fn alias_probe(&mut self, alias: &Capability) -> Result<AliasProbeInfo> {
        let op = AliasOp::Probe {
            cap_type: CapKind::Manage.number(),
        };
        match self.alias_manage(alias, op, Shape::AliasProbe).await? {
            Reply::AliasProbe(p) => Ok(p),
            r => Err(self.unexpected("ALIAS_MANAGE PROBE", &r)),
        }
    }

    /// ALIAS_MANAGE DECR of the alias's read count, with the manage
    /// capability of its allocation (`master`): an alias made by
    /// [`Connection::alias_allocate`] is deleted by it, and its keys stop
    /// working at once.
    pub async fn alias_decr(&mut self, alias: &Capability, master: &Capability) -> Result<()> {
        let op = AliasOp::Decr {
            cap_type: CapKind::Read.number(),
            master: KeyToken::of(master),
            master_typekey: master.typekey.clone(),
        };
        self.alias_manage(alias, op, Shape::Bare).await.map(drop)
    }

    /// ALIAS_MANAGE CHNG of the alias's lease only (its window kept).
    pub async fn alias_extend(
        &mut self,
        alias: &Capability,
        master: &Capability,
        lease: Lease,
    ) -> Result<()> {
        let op = AliasOp::Change {
            cap_type: Some(CapKind::Manage.number()),
            offset: 0,
            length: 0,
            lease: Some(lease),
            master: KeyToken::of(master),
            master_typekey: master.typekey.clone(),
        };
        self.alias_manage(alias, op, Shape::Bare).await.map(drop)
    }

    /// MANAGE TRUNCATE.
    pub async fn truncate(&mut self, cap: &Capability, size: u64) -> Result<()> {
        self.manage(cap, ManageOp::Truncate { size }, Shape::Bare)
            .await
            .map(drop)
    }

    /// STATUS INQ, v1.4 form.
    pub async fn status(&mut self, rid: &str, password: &str) -> Result<StatusBody> {
        let req = Status {
            version: Version::V14,
            op: StatusOp::Inquire {
                rid: Some(rid.to_owned()),
                password: password.to_owned(),
            },
            timeout: self.cfg.server_timeout,
        };
        self.send_line("STATUS", &req.encode()).await?;
        let n = match self.expect("STATUS", Shape::Count, false).await? {
            Reply::Count(n) if n <= MAX_STATUS_BODY_BYTES as u64 => n as usize,
            r => return Err(self.unexpected("STATUS", &r)),
        };
        let mut body = vec![0u8; n];
        io!(self, "STATUS body", self.stream.read_exact(&mut body))?;
        StatusBody::parse(&String::from_utf8_lossy(&body))
            .map_err(|e| self.protocol("STATUS", &e.to_string()))
    }

    /// STATUS RES: the depot's resource ids.
    pub async fn resources(&mut self) -> Result<Vec<String>> {
        let req = Status {
            version: Version::V14,
            op: StatusOp::Resources,
            timeout: self.cfg.server_timeout,
        };
        self.send_line("STATUS RES", &req.encode()).await?;
        match self.expect("STATUS RES", Shape::Resources, false).await? {
            Reply::Resources(rids) => Ok(rids),
            r => Err(self.unexpected("STATUS RES", &r)),
        }
    }

    /// STATUS VERSION: the human-readable report (lines up to `END`).
    pub async fn version(&mut self) -> Result<String> {
        let req = Status {
            version: Version::V14,
            op: StatusOp::Version,
            timeout: self.cfg.server_timeout,
        };
        self.send_line("STATUS VERSION", &req.encode()).await?;
        match self.expect("STATUS VERSION", Shape::Report, false).await? {
            Reply::Report => {}
            r => return Err(self.unexpected("STATUS VERSION", &r)),
        }
        let mut out = String::new();
        for _ in 0..1000 {
            let line = self.read_reply_line("STATUS VERSION").await?;
            if line == "END" {
                return Ok(out);
            }
            out.push_str(&line);
            out.push('\n');
        }
        self.healthy = false;
        Err(self.protocol("STATUS VERSION", "report without END"))
    }
}
