//! Data phases: socket → file (`splice`) and file → socket (`sendfile`), no
//! copy through user space (both in `lors_ibp::zerocopy`), and file → file;
//! checksummed data phases, which pass through user space to be hashed.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lors_ibp::proto::chksum::{BlockHasher, NetChksum};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::CHUNK_BYTES;

pub(crate) use lors_ibp::zerocopy::{XferError, send_file};

pub(crate) fn timed_out() -> io::Error {
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

/// Streams up to `len` bytes from the socket into `file` at byte `pos`,
/// spliced through a pipe (no copy through user space; see
/// `lors_ibp::zerocopy`), ending early at `until`; returns how many came.
/// Bytes the reader already buffered go first. On error the caller rolls
/// the file back.
pub(crate) async fn recv_to_file(
    rd: &mut BufReader<TcpStream>,
    file: Arc<File>,
    pos: u64,
    len: u64,
    idle: Duration,
    until: Instant,
) -> Result<u64, XferError> {
    lors_ibp::zerocopy::recv_buffered_until(rd, &file, pos, len, idle, until).await
}

/// Where a checksummed data phase stands between rounds (LStore's network
/// checksums, `docs/ibp-protocol.md` §2.5): the hash of the block under way
/// and how many of its bytes have passed.
pub(crate) struct Checked {
    ncs: NetChksum,
    hasher: BlockHasher,
    in_block: u64,
    /// Room for the digest that follows a block, kept for the whole phase.
    digest: Vec<u8>,
}

/// Why a checksummed receive stopped.
pub(crate) enum CheckedError {
    Xfer(XferError),
    /// A block's digest did not match its bytes.
    Mismatch,
}

impl Checked {
    pub(crate) fn new(ncs: NetChksum) -> Self {
        Checked {
            ncs,
            hasher: BlockHasher::new(ncs.kind),
            in_block: 0,
            digest: vec![0u8; ncs.kind.hex_len()],
        }
    }

    /// Data bytes that may be read before the next digest.
    fn room(&self, left: u64) -> u64 {
        left.min(CHUNK_BYTES as u64)
            .min(self.ncs.block_size - self.in_block)
    }

    /// Reads the digest that follows a block and compares it with the
    /// block's own (either case of hex digits).
    async fn check_digest(
        &mut self,
        rd: &mut BufReader<TcpStream>,
        idle: Duration,
    ) -> Result<(), CheckedError> {
        read_exact_idle(rd, &mut self.digest, idle)
            .await
            .map_err(|e| CheckedError::Xfer(XferError::Peer(e)))?;
        if self
            .digest
            .eq_ignore_ascii_case(self.hasher.finish_hex().as_bytes())
        {
            Ok(())
        } else {
            Err(CheckedError::Mismatch)
        }
    }

    /// Counts `n` hashed bytes; whether a digest is due (the block is full,
    /// or these were the data phase's last bytes).
    fn advance(&mut self, n: u64, phase_ends: bool) -> bool {
        self.in_block += n;
        let due = self.in_block == self.ncs.block_size || phase_ends;
        if due {
            self.in_block = 0;
        }
        due
    }
}

/// Receives up to `len` bytes of a checksummed data phase into `file` at
/// `pos`, checking each block's digest as it arrives, ending early at
/// `until`; returns how many data bytes came. `last` says the phase ends
/// with these `len` bytes, so a short final block is checked here. The
/// bytes reach the file before their digest is checked: the caller rolls
/// back on error.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn recv_checked(
    rd: &mut BufReader<TcpStream>,
    file: &Arc<File>,
    pos: u64,
    len: u64,
    last: bool,
    idle: Duration,
    until: Instant,
    st: &mut Checked,
) -> Result<u64, CheckedError> {
    let peer = |e| CheckedError::Xfer(XferError::Peer(e));
    // Bytes gather here across blocks and go to the file a buffer at a
    // time: small blocks would otherwise cost a disk write each.
    let mut buf = vec![0u8; usize::try_from(len.min(CHUNK_BYTES as u64)).unwrap_or(CHUNK_BYTES)];
    let (mut filled, mut at) = (0usize, pos);
    let mut done = 0u64;
    while done < len {
        let room = usize::try_from(st.room(len - done)).unwrap_or(CHUNK_BYTES);
        let k = room.min(buf.len() - filled);
        let mut got = 0;
        while got < k {
            let now = Instant::now();
            if now >= until {
                break;
            }
            let into = &mut buf[filled + got..filled + k];
            match timeout((until - now).min(idle), rd.read(into)).await {
                Err(_) if Instant::now() >= until => break,
                Err(_) => return Err(peer(timed_out())),
                Ok(Ok(0)) => return Err(peer(io::ErrorKind::UnexpectedEof.into())),
                Ok(Ok(n)) => got += n,
                Ok(Err(e)) => return Err(peer(e)),
            }
        }
        st.hasher.update(&buf[filled..filled + got]);
        filled += got;
        done += got as u64;
        let ended = got < k; // the round's time is up
        if filled == buf.len() || done == len || ended {
            let f = file.clone();
            let n = filled;
            buf = tokio::task::spawn_blocking(move || f.write_all_at(&buf[..n], at).map(|()| buf))
                .await
                .map_err(io::Error::other)
                .and_then(|r| r)
                .map_err(|e| CheckedError::Xfer(XferError::Disk(e)))?;
            at += filled as u64;
            filled = 0;
        }
        if got > 0 && st.advance(got as u64, last && done == len) {
            st.check_digest(rd, idle).await?;
        }
        if ended {
            break;
        }
    }
    Ok(done)
}

/// Sends `len` bytes of `file` from `pos` as a checksummed data phase: each
/// block followed by its digest. Passes through user space to be hashed.
pub(crate) async fn send_checked(
    sock: &mut TcpStream,
    file: &Arc<File>,
    pos: u64,
    len: u64,
    idle: Duration,
    ncs: NetChksum,
) -> Result<(), XferError> {
    let mut st = Checked::new(ncs);
    let mut buf = vec![0u8; usize::try_from(st.room(len)).unwrap_or(CHUNK_BYTES)];
    let mut done = 0u64;
    while done < len {
        let n = st.room(len - done);
        let k = usize::try_from(n).unwrap_or(CHUNK_BYTES);
        let f = file.clone();
        let at = pos + done;
        buf = tokio::task::spawn_blocking(move || f.read_exact_at(&mut buf[..k], at).map(|()| buf))
            .await
            .map_err(io::Error::other)
            .and_then(|r| r)
            .map_err(XferError::Disk)?;
        st.hasher.update(&buf[..k]);
        write_idle(sock, &buf[..k], idle).await?;
        done += n;
        if st.advance(n, done == len) {
            write_idle(sock, st.hasher.finish_hex().as_bytes(), idle).await?;
        }
    }
    Ok(())
}

/// Sends `data` (in memory: a queue's bytes) as a checksummed data phase,
/// framed a batch at a time: the framed form can be many times the data
/// (SHA-512 over 1-byte blocks is 129 bytes a byte), so it is never built
/// whole.
pub(crate) async fn send_framed(
    sock: &mut TcpStream,
    data: &[u8],
    idle: Duration,
    ncs: NetChksum,
) -> Result<(), XferError> {
    const BATCH: usize = 256 << 10;
    let bs = usize::try_from(ncs.block_size).unwrap_or(usize::MAX);
    let mut out = Vec::with_capacity(BATCH + ncs.kind.hex_len());
    for block in data.chunks(bs) {
        for piece in block.chunks(BATCH) {
            if out.len() + piece.len() > BATCH {
                write_idle(sock, &out, idle).await?;
                out.clear();
            }
            out.extend_from_slice(piece);
        }
        let mut h = BlockHasher::new(ncs.kind);
        h.update(block);
        out.extend_from_slice(h.finish_hex().as_bytes());
        if out.len() >= BATCH {
            write_idle(sock, &out, idle).await?;
            out.clear();
        }
    }
    if !out.is_empty() {
        write_idle(sock, &out, idle).await?;
    }
    Ok(())
}

async fn write_idle(sock: &mut TcpStream, b: &[u8], idle: Duration) -> Result<(), XferError> {
    timeout(idle, sock.write_all(b))
        .await
        .map_err(|_| XferError::Peer(timed_out()))?
        .map_err(XferError::Peer)
}
