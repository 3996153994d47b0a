//! Data phases: socket → file (double-buffered, the disk write of one chunk
//! overlapping the network read of the next) and file → socket (`sendfile`,
//! no copy through user space).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, BufReader, Interest};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::CHUNK_BYTES;

/// Who failed during a data phase.
#[derive(Debug)]
pub(crate) enum XferError {
    /// The peer stalled, closed or reset.
    Peer(io::Error),
    /// Our disk failed.
    Disk(io::Error),
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no progress within the I/O timeout",
    )
}

/// Reads exactly `buf.len()` bytes, each read under the inactivity deadline.
pub(crate) async fn read_exact_idle(
    rd: &mut BufReader<TcpStream>,
    buf: &mut [u8],
    idle: Duration,
) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let n = timeout(idle, rd.read(&mut buf[got..]))
            .await
            .map_err(|_| timed_out())??;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(())
}

/// Streams `len` bytes from the socket into `file` at byte `pos`.
///
/// Two buffers: while one is written to disk on the blocking pool, the next is
/// filled from the network. On error the caller rolls the file back.
pub(crate) async fn recv_to_file(
    rd: &mut BufReader<TcpStream>,
    file: Arc<File>,
    mut pos: u64,
    len: u64,
    idle: Duration,
) -> Result<(), XferError> {
    let chunk = usize::try_from(len).unwrap_or(usize::MAX).min(CHUNK_BYTES);
    let mut spare: Option<Vec<u8>> = Some(vec![0u8; chunk]);
    let mut pending: Option<tokio::task::JoinHandle<(Vec<u8>, io::Result<()>)>> = None;
    let mut left = len;
    while left > 0 {
        let mut buf = match spare.take() {
            Some(b) => b,
            None => vec![0u8; chunk],
        };
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(chunk);
        if let Err(e) = read_exact_idle(rd, &mut buf[..n], idle).await {
            if let Some(h) = pending.take() {
                let _ = h.await;
            }
            return Err(XferError::Peer(e));
        }
        if let Some(h) = pending.take() {
            let (b, r) = h
                .await
                .map_err(|e| XferError::Disk(io::Error::other(e.to_string())))?;
            r.map_err(XferError::Disk)?;
            spare = Some(b);
        }
        let f = file.clone();
        let at = pos;
        pending = Some(tokio::task::spawn_blocking(move || {
            let r = f.write_all_at(&buf[..n], at);
            (buf, r)
        }));
        pos += n as u64;
        left -= n as u64;
    }
    if let Some(h) = pending.take() {
        let (_, r) = h
            .await
            .map_err(|e| XferError::Disk(io::Error::other(e.to_string())))?;
        r.map_err(XferError::Disk)?;
    }
    Ok(())
}

/// Sends `len` bytes of `file` from byte `pos` with `sendfile(2)`.
pub(crate) async fn send_file(
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
            Ok(Err(e)) => {
                // EPIPE/ECONNRESET are the peer; anything else on the file side is ours.
                return Err(match e.kind() {
                    io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted => XferError::Peer(e),
                    _ => XferError::Disk(e),
                });
            }
            Ok(Ok(0)) => {
                return Err(XferError::Disk(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "data file shorter than its committed length",
                )));
            }
            Ok(Ok(n)) => left -= n as u64,
        }
    }
    Ok(())
}

/// Copies `len` bytes between files (blocking): `copy_file_range` where the
/// kernel can, a buffered loop otherwise.
pub(crate) fn copy_range(
    src: &File,
    src_pos: u64,
    dst: &File,
    dst_pos: u64,
    len: u64,
) -> io::Result<()> {
    let (mut sp, mut dp, mut left) = (src_pos, dst_pos, len);
    while left > 0 {
        let want = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
        match rustix::fs::copy_file_range(src, Some(&mut sp), dst, Some(&mut dp), want) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => left -= n as u64,
            Err(rustix::io::Errno::XDEV | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => {
                let mut buf = vec![0u8; CHUNK_BYTES];
                while left > 0 {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    src.read_exact_at(&mut buf[..n], sp)?;
                    dst.write_all_at(&buf[..n], dp)?;
                    sp += n as u64;
                    dp += n as u64;
                    left -= n as u64;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
