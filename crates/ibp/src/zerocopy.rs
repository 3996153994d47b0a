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

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use rustix::pipe::{PipeFlags, SpliceFlags, fcntl_setpipe_size, pipe_with, splice};
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

fn timed_out() -> io::Error {
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
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    // A bigger pipe means fewer rounds; the default (64 KiB) still works.
    let _ = fcntl_setpipe_size(&w, PIPE_BYTES);
    Ok((r, w))
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
    mut pos: u64,
    len: u64,
    idle: Duration,
) -> Result<(), XferError> {
    let head = &head[..usize::try_from(len).map_or(head.len(), |l| l.min(head.len()))];
    file.write_all_at(head, pos).map_err(XferError::Disk)?;
    pos += head.len() as u64;
    let mut left = len - head.len() as u64;
    if left == 0 {
        return Ok(());
    }
    let (pr, pw) = match pipe() {
        Ok(p) => p,
        Err(_) => return recv_copy(sock, file, pos, left, idle).await,
    };
    while left > 0 {
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(PIPE_BYTES);
        let res = timeout(
            idle,
            sock.async_io(Interest::READABLE, || {
                splice(
                    sock,
                    None,
                    &pw,
                    None,
                    want,
                    SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
                )
                .map_err(io::Error::from)
            }),
        )
        .await;
        let mut n = match res {
            Err(_) => return Err(XferError::Peer(timed_out())),
            Ok(Ok(0)) => return Err(XferError::Peer(io::ErrorKind::UnexpectedEof.into())),
            Ok(Ok(n)) => n,
            // Nothing is in the pipe yet: a kernel that cannot splice this
            // socket falls back to copying.
            Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                return recv_copy(sock, file, pos, left, idle).await;
            }
            Ok(Err(e)) => return Err(XferError::Peer(e)),
        };
        left -= n as u64;
        // Drained here, not on a blocking thread: the pipe holds at most one
        // round (PIPE_BYTES), and a page-cache write of that size is short.
        while n > 0 {
            match splice(&pr, None, file, Some(&mut pos), n, SpliceFlags::MOVE) {
                Ok(0) => {
                    return Err(XferError::Disk(io::Error::other("file accepted no bytes")));
                }
                Ok(k) => n -= k,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::INVAL) => {
                    // The file system cannot take a splice: copy out of the pipe.
                    drain_by_copy(&pr, file, &mut pos, n)?;
                    n = 0;
                }
                Err(e) => return Err(XferError::Disk(e.into())),
            }
        }
    }
    Ok(())
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
    use tokio::io::AsyncBufRead;
    let head = rd
        .buffer()
        .len()
        .min(usize::try_from(len).unwrap_or(usize::MAX));
    let r = recv_file(rd.get_ref(), &rd.buffer()[..head], file, pos, len, idle).await;
    std::pin::Pin::new(rd).consume(head);
    r
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

/// The read + pwrite path, for kernels or sockets that cannot splice.
async fn recv_copy(
    sock: &TcpStream,
    file: &File,
    mut pos: u64,
    mut left: u64,
    idle: Duration,
) -> Result<(), XferError> {
    let mut buf = vec![0u8; usize::try_from(left).unwrap_or(usize::MAX).min(PIPE_BYTES)];
    while left > 0 {
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        let res = timeout(
            idle,
            sock.async_io(Interest::READABLE, || {
                rustix::io::read(sock, &mut buf[..want]).map_err(io::Error::from)
            }),
        )
        .await;
        let n = match res {
            Err(_) => return Err(XferError::Peer(timed_out())),
            Ok(Ok(0)) => return Err(XferError::Peer(io::ErrorKind::UnexpectedEof.into())),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(XferError::Peer(e)),
        };
        file.write_all_at(&buf[..n], pos).map_err(XferError::Disk)?;
        pos += n as u64;
        left -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
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
