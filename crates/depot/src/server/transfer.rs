//! Data phases: socket → file (`splice`) and file → socket (`sendfile`), no
//! copy through user space (both in `lors_ibp::zerocopy`), and file → file.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::CHUNK_BYTES;

pub(crate) use lors_ibp::zerocopy::{XferError, send_file};

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

/// Streams `len` bytes from the socket into `file` at byte `pos`, spliced
/// through a pipe (no copy through user space; see `lors_ibp::zerocopy`).
/// Bytes the reader already buffered go first. On error the caller rolls the
/// file back.
pub(crate) async fn recv_to_file(
    rd: &mut BufReader<TcpStream>,
    file: Arc<File>,
    pos: u64,
    len: u64,
    idle: Duration,
) -> Result<(), XferError> {
    lors_ibp::zerocopy::recv_buffered(rd, &file, pos, len, idle).await
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
