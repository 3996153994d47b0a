//! Data phases between a TCP socket and a file without a trip through user
//! space: `sendfile(2)` file → socket, and `splice(2)` socket → pipe → file.
//!
//! Both the depot (STORE/LOAD) and the client (upload from a file, download
//! to a file) use these; they are what lets one connection run at the speed of
//! the kernel's own copy. Every wait is bounded by an inactivity deadline, so a
//! slow but live peer is not cut off while a stalled one is.
//!
//! Socket → file moves the socket's pages into a pipe by reference and copies
//! them once into the file's page cache: one copy instead of two (kernel →
//! buffer → kernel) and no buffer to allocate or zero. Where the kernel
//! refuses a splice (some file systems), the copy falls back to read + pwrite.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use rustix::pipe::{SpliceFlags, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Bytes one pipe holds: one splice round moves at most this much.
const PIPE_BYTES: usize = 1 << 20;

/// Who failed during a data phase.
#[derive(Debug)]
pub enum XferError {
    /// The peer stalled, closed or reset.
    Peer(io::Error),
    /// Our file (the depot's disk, the client's input or output) failed.
    Disk(io::Error),
}

impl std::fmt::Display for XferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XferError::Peer(e) => write!(f, "peer: {e}"),
            XferError::Disk(e) => write!(f, "local file: {e}"),
        }
    }
}

impl std::error::Error for XferError {}

pub(crate) fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no progress within the I/O timeout",
    )
}

fn peer_or_disk(e: io::Error) -> XferError {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => XferError::Peer(e),
        _ => XferError::Disk(e),
    }
}

/// Sends `len` bytes of `file` from byte `pos` with `sendfile(2)`.
///
/// # Errors
/// [`XferError::Peer`] when the socket stalls for `idle` or breaks,
/// [`XferError::Disk`] when the file cannot be read or is shorter than `len`.
pub async fn send_file(
    sock: &TcpStream,
    file: &File,
    mut pos: u64,
    len: u64,
    idle: Duration,
) -> Result<(), XferError> {
    let mut left = len;
    while left > 0 {
        // sendfile moves at most ~2 GiB per call.
        let want = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
        let res = timeout(
            idle,
            sock.async_io(Interest::WRITABLE, || {
                rustix::fs::sendfile(sock, file, Some(&mut pos), want).map_err(io::Error::from)
            }),
        )
        .await;
        match res {
            Err(_) => return Err(XferError::Peer(timed_out())),
            Ok(Err(e)) => return Err(peer_or_disk(e)),
            Ok(Ok(0)) => {
                return Err(XferError::Disk(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shorter than the length being sent",
                )));
            }
            Ok(Ok(n)) => left -= n as u64,
        }
    }
    Ok(())
}

/// A pipe sized for one splice round.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        // A bigger pipe means fewer rounds; the default (64 KiB) still works.
        let (r, w) = crate::spliced::pipe(PIPE_BYTES)?;
        Ok(Pipe { r, w })
    }
}

/// Pipes one receive may hold filled while another writes the shared file.
const HELD_PIPES: usize = 4;

thread_local! {
    /// Empty pipes kept between receives on this thread. A download makes
    /// one receive per piece; making and closing its pipes each time cost a
    /// few percent of the client's CPU.
    static SPARE: std::cell::RefCell<Vec<Pipe>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Where one receive puts its pipes' contents: drained at once into a
/// file, or, with a gate (see [`recv_shared`]), at this receive's turn.
struct Sink<'a> {
    file: &'a File,
    gate: Option<&'a std::sync::Mutex<()>>,
    free: Vec<Pipe>,
    /// Filled pipes waiting for a turn at the shared file: (pipe, pos, n).
    held: VecDeque<(Pipe, u64, usize)>,
}

impl<'a> Sink<'a> {
    fn inline(file: &'a File) -> Self {
        Self::with(file, None)
    }

    fn shared(file: &'a File, gate: &'a std::sync::Mutex<()>) -> Self {
        Self::with(file, Some(gate))
    }

    fn with(file: &'a File, gate: Option<&'a std::sync::Mutex<()>>) -> Self {
        Sink {
            file,
            gate,
            free: Vec::new(),
            held: VecDeque::new(),
        }
    }

    /// An empty pipe: a free one, a new one, or one emptied by waiting for
    /// a turn. `None` when no pipe can be made and none is held.
    fn pipe(&mut self) -> Result<Option<Pipe>, XferError> {
        if let Some(p) = self.free.pop() {
            return Ok(Some(p));
        }
        if self.held.len() < HELD_PIPES {
            if let Some(p) = SPARE.with(|s| s.borrow_mut().pop()) {
                return Ok(Some(p));
            }
            if let Ok(p) = Pipe::new() {
                return Ok(Some(p));
            }
        }
        self.write_held(true)?;
        Ok(self.free.pop())
    }

    /// Hands over `n` bytes in `pipe` for byte `pos` of the file.
    fn put(&mut self, pipe: Pipe, pos: u64, n: usize) -> Result<(), XferError> {
        if self.gate.is_none() {
            // Drained here, not on a blocking thread: the pipe holds at
            // most one round (PIPE_BYTES), and a page-cache write of that
            // size is short.
            drain(&pipe.r, self.file, pos, n)?;
            self.free.push(pipe);
            return Ok(());
        }
        self.held.push_back((pipe, pos, n));
        self.write_held(false)
    }

    /// Writes the held pipes if it is this receive's turn; with `wait`, waits
    /// for the turn (another receive's write of at most [`HELD_PIPES`] pipes).
    fn write_held(&mut self, wait: bool) -> Result<(), XferError> {
        let Some(gate) = self.gate else {
            return Ok(());
        };
        if self.held.is_empty() {
            return Ok(());
        }
        let _turn = match gate.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::WouldBlock) if !wait => return Ok(()),
            Err(std::sync::TryLockError::WouldBlock) => {
                gate.lock().unwrap_or_else(|e| e.into_inner())
            }
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        };
        while let Some((pipe, pos, n)) = self.held.pop_front() {
            drain(&pipe.r, self.file, pos, n)?;
            self.free.push(pipe);
        }
        Ok(())
    }
}

impl Drop for Sink<'_> {
    fn drop(&mut self) {
        // Only drained pipes are kept: a held one may still have data in it.
        // (`try_with`: a receive dropped while its thread exits just closes
        // its pipes.)
        let _ = SPARE.try_with(|s| {
            let mut s = s.borrow_mut();
            let room = (HELD_PIPES + 1).saturating_sub(s.len());
            s.extend(self.free.drain(..).take(room));
        });
    }
}

/// Receives exactly `len` bytes from `sock` into `file` at byte `pos`.
///
/// The caller hands over bytes it already buffered from the socket as
/// `head` (they count towards `len`). On error the file may hold part of the
/// data; the caller decides what that means (the depot rolls back).
///
/// # Errors
/// [`XferError::Peer`] when the peer stalls for `idle`, closes early or resets;
/// [`XferError::Disk`] when the file cannot be written.
pub async fn recv_file(
    sock: &TcpStream,
    head: &[u8],
    file: &File,
    pos: u64,
    len: u64,
    idle: Duration,
) -> Result<(), XferError> {
    recv_into(sock, head, Sink::inline(file), pos, len, Wait::idle(idle))
        .await
        .map(drop)
}

/// How long a receive waits for the peer's next bytes.
#[derive(Clone, Copy)]
struct Wait {
    /// Longer than this without a byte is an error.
    idle: Duration,
    /// Set: at this moment the receive ends early, with what it got (no
    /// error).
    until: Option<Instant>,
}

impl Wait {
    fn idle(idle: Duration) -> Wait {
        Wait { idle, until: None }
    }

    /// Whether the receive should end now, early.
    fn due(&self) -> bool {
        self.until.is_some_and(|u| Instant::now() >= u)
    }

    /// The wait for one read.
    fn limit(&self) -> Duration {
        self.until.map_or(self.idle, |u| {
            u.saturating_duration_since(Instant::now()).min(self.idle)
        })
    }

    /// A read that waited [`Wait::limit`] in vain: `Ok` ends the receive
    /// early, `Err` fails it.
    fn expired(&self) -> Result<(), XferError> {
        if self.due() {
            Ok(())
        } else {
            Err(XferError::Peer(timed_out()))
        }
    }
}

/// Receives up to `len` bytes into `file` at `pos` as [`recv_buffered`]
/// does, ending early — with no error — at `until`; returns how many bytes
/// it received (all in the file by then). A server holding memory for a
/// receive uses it to give the memory back from a peer that sends slowly or
/// not at all, then waits (up to its own deadline) for more.
///
/// # Errors
/// As [`recv_file`].
pub async fn recv_buffered_until(
    rd: &mut tokio::io::BufReader<TcpStream>,
    file: &File,
    pos: u64,
    len: u64,
    idle: Duration,
    until: Instant,
) -> Result<u64, XferError> {
    let wait = Wait {
        idle,
        until: Some(until),
    };
    recv_buffered_into(rd, Sink::inline(file), pos, len, wait).await
}

async fn recv_into(
    sock: &TcpStream,
    head: &[u8],
    mut sink: Sink<'_>,
    mut pos: u64,
    len: u64,
    wait: Wait,
) -> Result<u64, XferError> {
    let head = &head[..usize::try_from(len).map_or(head.len(), |l| l.min(head.len()))];
    sink.file.write_all_at(head, pos).map_err(XferError::Disk)?;
    pos += head.len() as u64;
    let mut left = len - head.len() as u64;
    while left > 0 {
        if wait.due() {
            break;
        }
        let Some(p) = sink.pipe()? else {
            let got = recv_copy(sock, sink.file, pos, left, wait).await?;
            return Ok(len - left + got);
        };
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(PIPE_BYTES);
        let res = timeout(
            wait.limit(),
            sock.async_io(Interest::READABLE, || {
                splice(
                    sock,
                    None,
                    &p.w,
                    None,
                    want,
                    SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
                )
                .map_err(io::Error::from)
            }),
        )
        .await;
        let n = match res {
            Err(_) => {
                wait.expired()?;
                sink.free.push(p);
                sink.write_held(true)?;
                return Ok(len - left);
            }
            Ok(Ok(0)) => return Err(XferError::Peer(io::ErrorKind::UnexpectedEof.into())),
            Ok(Ok(n)) => n,
            // Nothing is in the pipe yet: a kernel that cannot splice this
            // socket falls back to copying.
            Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                sink.write_held(true)?;
                let got = recv_copy(sock, sink.file, pos, left, wait).await?;
                return Ok(len - left + got);
            }
            Ok(Err(e)) => return Err(XferError::Peer(e)),
        };
        sink.put(p, pos, n)?;
        pos += n as u64;
        left -= n as u64;
    }
    sink.write_held(true)?;
    Ok(len - left)
}

/// [`recv_file`] on a buffered socket: bytes the reader already holds (they
/// arrived with the command or reply line) go first and are consumed.
///
/// # Errors
/// As [`recv_file`].
pub async fn recv_buffered(
    rd: &mut tokio::io::BufReader<TcpStream>,
    file: &File,
    pos: u64,
    len: u64,
    idle: Duration,
) -> Result<(), XferError> {
    recv_buffered_into(rd, Sink::inline(file), pos, len, Wait::idle(idle))
        .await
        .map(drop)
}

/// [`recv_buffered`] into a file other receives write at the same time,
/// taking turns at `gate` (one per file). Returns once every byte is in the
/// file.
///
/// Writes into one file take its inode lock, and a writer that finds it
/// taken spins in the kernel while the holder copies: CPU that the network
/// stack (and, on one machine, the sending depot) needs. Receives sharing a
/// gate take turns in user space instead, and a connection that finds the
/// gate taken goes on receiving into another pipe (up to four), writing
/// what it holds at its next turn. The client's download shares one gate per
/// output file; the depot, whose connections write different files, copies
/// inline ([`recv_file`]).
///
/// ```no_run
/// # async fn f(mut rd: tokio::io::BufReader<tokio::net::TcpStream>) -> std::io::Result<()> {
/// use lors_ibp::zerocopy::recv_shared;
/// let out = std::fs::File::create("/tmp/out")?;
/// let gate = std::sync::Mutex::new(());
/// recv_shared(&mut rd, &out, &gate, 0, 1 << 20, std::time::Duration::from_secs(30))
///     .await
///     .map_err(std::io::Error::other)?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`recv_file`].
pub async fn recv_shared(
    rd: &mut tokio::io::BufReader<TcpStream>,
    file: &File,
    gate: &std::sync::Mutex<()>,
    pos: u64,
    len: u64,
    idle: Duration,
) -> Result<(), XferError> {
    recv_buffered_into(rd, Sink::shared(file, gate), pos, len, Wait::idle(idle))
        .await
        .map(drop)
}

async fn recv_buffered_into(
    rd: &mut tokio::io::BufReader<TcpStream>,
    sink: Sink<'_>,
    pos: u64,
    len: u64,
    wait: Wait,
) -> Result<u64, XferError> {
    use tokio::io::AsyncBufRead;
    let head = rd
        .buffer()
        .len()
        .min(usize::try_from(len).unwrap_or(usize::MAX));
    let r = recv_into(rd.get_ref(), &rd.buffer()[..head], sink, pos, len, wait).await;
    std::pin::Pin::new(rd).consume(head);
    r
}

/// Moves `n` bytes out of the pipe into `file` at byte `pos`.
fn drain(pr: &OwnedFd, file: &File, mut pos: u64, mut n: usize) -> Result<(), XferError> {
    while n > 0 {
        match splice(pr, None, file, Some(&mut pos), n, SpliceFlags::MOVE) {
            Ok(0) => {
                return Err(XferError::Disk(io::Error::other("file accepted no bytes")));
            }
            Ok(k) => n -= k,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::INVAL) => {
                // The file system cannot take a splice: copy out of the pipe.
                return drain_by_copy(pr, file, &mut pos, n);
            }
            Err(e) => return Err(XferError::Disk(e.into())),
        }
    }
    Ok(())
}

/// Copies `n` bytes out of the pipe into the file with read + pwrite.
fn drain_by_copy(pr: &OwnedFd, file: &File, pos: &mut u64, mut n: usize) -> Result<(), XferError> {
    let mut buf = vec![0u8; n.min(PIPE_BYTES)];
    while n > 0 {
        let want = n.min(buf.len());
        let k = rustix::io::read(pr, &mut buf[..want]).map_err(|e| XferError::Disk(e.into()))?;
        file.write_all_at(&buf[..k], *pos)
            .map_err(XferError::Disk)?;
        *pos += k as u64;
        n -= k;
    }
    Ok(())
}

/// The read + pwrite path, for kernels or sockets that cannot splice;
/// returns the bytes received (fewer than `left` only when a hold ended it).
async fn recv_copy(
    sock: &TcpStream,
    file: &File,
    mut pos: u64,
    mut left: u64,
    wait: Wait,
) -> Result<u64, XferError> {
    let all = left;
    let mut buf = vec![0u8; usize::try_from(left).unwrap_or(usize::MAX).min(PIPE_BYTES)];
    while left > 0 && !wait.due() {
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        let res = timeout(
            wait.limit(),
            sock.async_io(Interest::READABLE, || {
                rustix::io::read(sock, &mut buf[..want]).map_err(io::Error::from)
            }),
        )
        .await;
        let n = match res {
            Err(_) => {
                wait.expired()?;
                return Ok(all - left);
            }
            Ok(Ok(0)) => return Err(XferError::Peer(io::ErrorKind::UnexpectedEof.into())),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(XferError::Peer(e)),
        };
        file.write_all_at(&buf[..n], pos).map_err(XferError::Disk)?;
        pos += n as u64;
        left -= n as u64;
    }
    Ok(all - left)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// Two ends of a TCP connection on 127.0.0.1.
    pub(crate) async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    fn tmp(name: &str) -> (std::path::PathBuf, File) {
        let p = std::env::temp_dir().join(format!("lors-zc-{}-{name}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        (p, f)
    }

    #[tokio::test]
    async fn file_to_socket_to_file_is_byte_identical() {
        let data: Vec<u8> = (0..(3 << 20) + 12345u32)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let (sp, src) = tmp("src");
        src.write_all_at(&data, 0).unwrap();
        let (dp, dst) = tmp("dst");
        let (a, b) = pair().await;
        let idle = Duration::from_secs(10);
        // Send from offset 100, with 10 bytes "already buffered" on the receiving side.
        let len = data.len() as u64 - 100;
        let sender = async {
            let mut a = a;
            a.write_all(&data[100..110]).await.unwrap();
            send_file(&a, &src, 110, len - 10, idle).await.unwrap();
        };
        let head = data[100..110].to_vec();
        let receiver = async {
            let mut b = b;
            let mut h = [0u8; 10];
            tokio::io::AsyncReadExt::read_exact(&mut b, &mut h)
                .await
                .unwrap();
            assert_eq!(h[..], head[..]);
            recv_file(&b, &h, &dst, 5, len, idle).await.unwrap();
        };
        tokio::join!(sender, receiver);
        let mut got = vec![0u8; usize::try_from(len).unwrap()];
        dst.read_exact_at(&mut got, 5).unwrap();
        assert!(got == data[100..], "received bytes differ");
        let _ = std::fs::remove_file(sp);
        let _ = std::fs::remove_file(dp);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_receives_into_one_shared_file_land_in_place() {
        // Four connections, each carrying one quarter, interleaved on two
        // threads: every byte must land at its own offset.
        let quarter = (5 << 20) + 777usize;
        let data: Vec<u8> = (0..4 * quarter as u32)
            .map(|i| (i * 13 + i / 509) as u8)
            .collect();
        let data = std::sync::Arc::new(data);
        let (dp, dst) = tmp("shared");
        let out = std::sync::Arc::new((dst, std::sync::Mutex::new(())));
        let idle = Duration::from_secs(10);
        let mut tasks = Vec::new();
        for q in 0..4 {
            let (a, b) = pair().await;
            let d = data.clone();
            tasks.push(tokio::spawn(async move {
                let mut a = a;
                a.write_all(&d[q * quarter..(q + 1) * quarter])
                    .await
                    .unwrap();
            }));
            let out = out.clone();
            tasks.push(tokio::spawn(async move {
                let mut rd = tokio::io::BufReader::new(b);
                let pos = (q * quarter) as u64;
                recv_shared(&mut rd, &out.0, &out.1, pos, quarter as u64, idle)
                    .await
                    .unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut got = vec![0u8; data.len()];
        out.0.read_exact_at(&mut got, 0).unwrap();
        assert!(got == data[..], "received bytes differ");
        let _ = std::fs::remove_file(dp);
    }

    #[tokio::test]
    async fn early_close_is_the_peers_fault_and_stalls_time_out() {
        let (dp, dst) = tmp("eof");
        let (mut a, b) = pair().await;
        a.write_all(&[1u8; 1000]).await.unwrap();
        drop(a);
        let e = recv_file(&b, &[], &dst, 0, 5000, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(e, XferError::Peer(ref e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{e}"
        );
        let (_a, b) = pair().await;
        let e = recv_file(&b, &[], &dst, 0, 10, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(
            matches!(e, XferError::Peer(ref e) if e.kind() == io::ErrorKind::TimedOut),
            "{e}"
        );
        let _ = std::fs::remove_file(dp);
    }

    #[tokio::test]
    async fn a_short_file_is_a_local_error() {
        let (sp, src) = tmp("short");
        src.write_all_at(&[9u8; 100], 0).unwrap();
        let (a, _b) = pair().await;
        let e = send_file(&a, &src, 0, 200, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(e, XferError::Disk(_)), "{e}");
        let _ = std::fs::remove_file(sp);
    }
}
