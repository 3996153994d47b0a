//! Bytes received from a depot and kept in kernel pipes instead of user
//! memory, to be handed on later without a copy through user space.
//!
//! A FUSE mount answers a READ by writing the reply to `/dev/fuse`. From
//! memory that costs two copies of every byte on the way in (socket →
//! buffer → page cache); from a pipe, one: `splice(2)` moves the socket's
//! pages into a pipe by reference, `tee(2)` and `splice(2)` pass references
//! on, and only the last splice into `/dev/fuse` copies. On two cores that
//! copy was a sixth of a mount's CPU, and the mount was CPU-bound.
//!
//! A [`Spliced`] can be read many times (a cache keeps it for look-backs):
//! every read duplicates its pipes' buffers with `tee(2)` and never consumes
//! them. `tee` starts at the head of a pipe, so a read from the middle tees
//! the head too and drops the part before its first byte into `/dev/null`,
//! which costs a reference per page, not a copy.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use rustix::io::Errno;
use rustix::pipe::{
    PipeFlags, SpliceFlags, fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, splice, tee,
};
use tokio::io::{AsyncBufRead, BufReader, Interest};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::zerocopy::{XferError, timed_out};

/// What one pipe of a [`Spliced`] is sized for. A received page may arrive
/// split over two socket buffers, and each takes a pipe slot: twice a
/// stream piece (256 KiB) leaves room for that. Bytes that do not fit go to
/// another pipe.
pub const PART_BYTES: usize = 512 << 10;

/// Bytes held in pipes, read as often as asked ([`Spliced::tee_to`],
/// [`Spliced::copy_to`]); dropped, its pipes are emptied and kept for the
/// next bytes.
///
/// ```no_run
/// # async fn f(mut rd: tokio::io::BufReader<tokio::net::TcpStream>) -> Result<(), lors_ibp::zerocopy::XferError> {
/// use std::time::Duration;
/// use lors_ibp::spliced::{Room, recv};
/// let room = Room::new().map_err(lors_ibp::zerocopy::XferError::Disk)?;
/// let held = recv(&mut rd, room, 1 << 20, Duration::from_secs(30)).await?;
/// let mut first = vec![0u8; 4096];
/// held.copy_to(0, &mut first).map_err(lors_ibp::zerocopy::XferError::Disk)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Spliced {
    parts: Vec<(Held, usize)>,
    len: usize,
}

/// Pipes this module has open: holding bytes, or emptied and kept.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// How many pipes this process keeps bytes in, or keeps empty for the
/// next bytes (each two descriptors).
pub fn held() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// A pipe bytes are kept in, counted in [`HELD`] while it is open.
#[derive(Debug)]
struct Held {
    r: OwnedFd,
    w: OwnedFd,
    /// What it was sized for.
    size: usize,
}

impl Held {
    fn fd(&self) -> BorrowedFd<'_> {
        self.r.as_fd()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Emptied pipes of [`PART_BYTES`], for the next pieces: making a pipe,
/// sizing it and closing it again for every piece cost a tenth of a
/// mount's CPU.
static SPARE: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// The most emptied pipes kept (a read-ahead's worth of pieces in flight).
const SPARE_MAX: usize = 128;

fn spare() -> MutexGuard<'static, Vec<Held>> {
    SPARE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A pipe to keep bytes in: an emptied one, or a new one. A first pipe
/// (`first`) is refused, so the bytes go to memory instead, when this
/// module's pipes already take a quarter of the open-file limit (the rest
/// is for sockets and files, which a download cannot do without), or when
/// the kernel will not size it (an unprivileged user past
/// `pipe-user-pages-soft` gets pipes of two pages). A pipe for the rest of
/// a piece whose first pipe filled up is made as long as the kernel can:
/// the piece is on its way.
fn held_pipe(bytes: usize, first: bool) -> io::Result<Held> {
    if bytes == PART_BYTES
        && let Some(p) = spare().pop()
    {
        return Ok(p);
    }
    static MOST: OnceLock<usize> = OnceLock::new();
    // (Read once: a process raises its limit at start, if at all.)
    let most = *MOST.get_or_init(|| {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1 << 20);
        usize::try_from(limit / 8).unwrap_or(usize::MAX)
    });
    if HELD.fetch_add(1, Ordering::Relaxed) >= most && first {
        HELD.fetch_sub(1, Ordering::Relaxed);
        return Err(io::Error::other(format!(
            "{most} pipes are open already (a quarter of the open-file limit)"
        )));
    }
    let (r, w) = pipe(bytes).inspect_err(|_| {
        HELD.fetch_sub(1, Ordering::Relaxed);
    })?;
    // (Counted from here: dropped, it is counted off.)
    let p = Held { r, w, size: bytes };
    if first && fcntl_getpipe_size(&p.w).is_ok_and(|n| n < bytes) {
        return Err(io::Error::other(
            "the kernel will not size a pipe (pipe-user-pages-soft reached)",
        ));
    }
    Ok(p)
}

impl Drop for Spliced {
    fn drop(&mut self) {
        for (p, n) in self.parts.drain(..) {
            // Emptied into /dev/null (which drops the page references, no
            // copy) and kept; a pipe that will not empty is closed.
            if p.size == PART_BYTES
                && null().is_ok_and(|null| splice_all(p.fd(), null.as_fd(), n).is_ok())
            {
                let mut s = spare();
                if s.len() < SPARE_MAX {
                    s.push(p);
                }
            }
        }
    }
}

/// An empty pipe (read end, write end), nonblocking both ways, sized for
/// `bytes` if the kernel allows, else for as much of them as an
/// unprivileged process may have (`pipe-max-size`, 1 MiB by default), else
/// the default 64 KiB.
///
/// # Errors
/// No pipe can be made (descriptors or pipe memory ran out).
pub fn pipe(bytes: usize) -> io::Result<(OwnedFd, OwnedFd)> {
    const UNPRIVILEGED_MAX: usize = 1 << 20;
    let (r, w) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    if fcntl_setpipe_size(&w, bytes).is_err() && bytes > UNPRIVILEGED_MAX {
        let _ = fcntl_setpipe_size(&w, UNPRIVILEGED_MAX);
    }
    Ok((r, w))
}

/// `/dev/null`, where the bytes before a read's first one are dropped.
fn null() -> io::Result<&'static File> {
    static NULL: OnceLock<Option<File>> = OnceLock::new();
    NULL.get_or_init(|| {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .ok()
    })
    .as_ref()
    .ok_or_else(|| io::Error::other("/dev/null cannot be opened"))
}

thread_local! {
    /// An empty pipe each thread tees a part's head through when a read
    /// starts past it.
    static SCRATCH: RefCell<Option<(OwnedFd, OwnedFd)>> = const { RefCell::new(None) };
}

/// Short of room in a pipe the bytes were going to.
fn no_room() -> io::Error {
    io::Error::new(io::ErrorKind::WouldBlock, "the pipe has no room left")
}

/// Moves exactly `n` bytes from pipe `from` to `to` (a pipe or a file),
/// both already holding or having room for them.
fn splice_all(from: BorrowedFd<'_>, to: BorrowedFd<'_>, mut n: usize) -> io::Result<()> {
    while n > 0 {
        match splice(from, None, to, None, n, SpliceFlags::NONBLOCK) {
            Ok(0) => return Err(no_room()),
            Ok(k) => n -= k,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return Err(no_room()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Duplicates the first `n` bytes of pipe `from` into pipe `to`.
fn tee_all(from: BorrowedFd<'_>, to: BorrowedFd<'_>, n: usize) -> io::Result<()> {
    // tee(2) always starts at the head of `from`: a retry after a short
    // count would duplicate the same bytes again, so a short count is a
    // failure (`to` ran out of room).
    loop {
        match tee(from, to, n, SpliceFlags::NONBLOCK) {
            Ok(k) if k == n => return Ok(()),
            Ok(_) | Err(Errno::AGAIN) => return Err(no_room()),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

impl Spliced {
    /// How many bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pipes it is kept in (each a descriptor).
    pub fn pipes(&self) -> usize {
        self.parts.len()
    }

    /// Calls `f(part, skip, k)` for each part the `n` bytes from `from`
    /// touch: `k` bytes after the first `skip` of that part.
    fn each(
        &self,
        from: usize,
        n: usize,
        mut f: impl FnMut(BorrowedFd<'_>, usize, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        if from.checked_add(n).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{n} bytes from {from} of {} held", self.len),
            ));
        }
        let (mut at, mut from, mut n) = (0, from, n);
        for (r, len) in &self.parts {
            if n == 0 {
                break;
            }
            if from < at + len {
                let skip = from - at;
                let k = n.min(len - skip);
                f(r.fd(), skip, k)?;
                from += k;
                n -= k;
            }
            at += len;
        }
        Ok(())
    }

    /// Appends the `n` bytes from byte `from` to the pipe `to` (its write
    /// end), by reference. Fails with `WouldBlock` if `to` has no room for
    /// them; `to` may then hold some of them.
    ///
    /// # Errors
    /// As above, or the range is not within the bytes held.
    pub fn tee_to(&self, from: usize, n: usize, to: BorrowedFd<'_>) -> io::Result<()> {
        self.each(from, n, |part, skip, k| {
            if skip == 0 {
                return tee_all(part, to, k);
            }
            past_head(part, skip, k, |sr| splice_all(sr, to, k))
        })
    }

    /// Copies the bytes from byte `from` into `out`.
    ///
    /// # Errors
    /// The range is not within the bytes held, or a pipe failed.
    pub fn copy_to(&self, from: usize, out: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        self.each(from, out.len(), |part, skip, k| {
            past_head(part, skip, k, |sr| {
                let mut want = &mut out[done..done + k];
                while !want.is_empty() {
                    match rustix::io::read(sr, &mut *want) {
                        Ok(0) | Err(Errno::AGAIN) => return Err(no_room()),
                        Ok(m) => want = &mut want[m..],
                        Err(Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                done += k;
                Ok(())
            })
        })
    }

    /// The bytes, copied into memory.
    ///
    /// # Errors
    /// As [`Spliced::copy_to`].
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        self.copy_to(0, &mut v)?;
        Ok(v)
    }
}

/// Copies `bytes` into the pipe `to` (its write end): for bytes in memory
/// that go where held ones are tee'd.
///
/// # Errors
/// `WouldBlock` when `to` has no room for all of them; `to` may then hold
/// some.
pub fn write_to(to: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(to, bytes) {
            Ok(m) => bytes = &bytes[m..],
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return Err(no_room()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Runs `f` on the read end of this thread's scratch pipe holding the `k`
/// bytes after the first `skip` of pipe `part` (tee'd, the head dropped
/// into /dev/null); `f` must take them all. A scratch pipe something
/// failed with may hold bytes: it is closed, not kept.
fn past_head(
    part: BorrowedFd<'_>,
    skip: usize,
    k: usize,
    f: impl FnOnce(BorrowedFd<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let (r, w) = match SCRATCH.with(|s| s.borrow_mut().take()) {
        Some(p) => p,
        // Room for a whole part, whatever its slots hold.
        None => pipe(2 * PART_BYTES)?,
    };
    tee_all(part, w.as_fd(), skip + k)?;
    if skip > 0 {
        splice_all(r.as_fd(), null()?.as_fd(), skip)?;
    }
    f(r.as_fd())?;
    SCRATCH.with(|s| *s.borrow_mut() = Some((r, w)));
    Ok(())
}

/// Whether the kernel lets this process keep as many pipes as a
/// read-ahead fills. A process without `CAP_SYS_ADMIN` or
/// `CAP_SYS_RESOURCE` is held to `/proc/sys/fs/pipe-user-pages-soft` (64
/// MiB of pipe slots per user by default): past it, new pipes get two
/// slots and cannot be resized, and bytes are better kept in memory.
pub fn unlimited() -> bool {
    static UNLIMITED: OnceLock<bool> = OnceLock::new();
    *UNLIMITED.get_or_init(|| {
        let soft = std::fs::read_to_string("/proc/sys/fs/pipe-user-pages-soft");
        if soft.is_ok_and(|s| s.trim() == "0") {
            return true;
        }
        const CAP_SYS_ADMIN: u32 = 21;
        const CAP_SYS_RESOURCE: u32 = 24;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let caps = (status.lines())
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        caps & (1 << CAP_SYS_ADMIN | 1 << CAP_SYS_RESOURCE) != 0
    })
}

/// An empty pipe for [`recv`] to start with. Made before a LOAD is sent,
/// so running out of descriptors leaves the connection in step and the
/// caller free to load into memory instead.
#[derive(Debug)]
pub struct Room(Held);

impl Room {
    /// An empty pipe sized for [`PART_BYTES`].
    ///
    /// # Errors
    /// No pipe can be made: descriptors or pipe memory ran out, held pipes
    /// take a quarter of the open-file limit already, or the kernel limits
    /// this process's pipe memory (see [`unlimited`]).
    pub fn new() -> io::Result<Room> {
        if !unlimited() {
            return Err(io::Error::other(
                "pipes of an unprivileged process are limited (pipe-user-pages-soft)",
            ));
        }
        held_pipe(PART_BYTES, true).map(Room)
    }
}

/// Receives exactly `len` bytes from the buffered socket `rd` into pipes,
/// starting with `room`: bytes the reader already holds first (consumed
/// from it), then the rest spliced from the socket by reference.
///
/// # Errors
/// [`XferError::Peer`] when the peer stalls for `idle`, closes early or
/// resets; [`XferError::Disk`] when another pipe is needed and none can be
/// made. Either way the stream is out of step.
pub async fn recv(
    rd: &mut BufReader<TcpStream>,
    room: Room,
    len: usize,
    idle: Duration,
) -> Result<Spliced, XferError> {
    recv_in(rd, room, len, idle, PART_BYTES).await
}

/// [`recv`], with further pipes sized for `part` bytes.
async fn recv_in(
    rd: &mut BufReader<TcpStream>,
    Room(first): Room,
    len: usize,
    idle: Duration,
    part: usize,
) -> Result<Spliced, XferError> {
    let mut out = Spliced {
        parts: Vec::new(),
        len: 0,
    };
    let head = rd.buffer().len().min(len);
    // An empty pipe takes the few KiB of data that came with the reply line.
    write_to(first.w.as_fd(), &rd.buffer()[..head]).map_err(XferError::Disk)?;
    std::pin::Pin::new(&mut *rd).consume(head);
    // The current part: its ends and the bytes in it.
    let mut cur = Some((first, head));
    let sock = rd.get_ref();
    let mut left = len - head;
    while left > 0 {
        let (p, held) = match cur.take() {
            Some(c) => c,
            None => (held_pipe(part, false).map_err(XferError::Disk)?, 0),
        };
        let res = timeout(
            idle,
            sock.async_io(Interest::READABLE, || {
                match splice(
                    sock,
                    None,
                    &p.w,
                    None,
                    left,
                    SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
                ) {
                    Ok(n) => Ok(Some(n)),
                    // The socket has bytes, yet none moved: the pipe is full.
                    Err(Errno::AGAIN)
                        if held > 0 && rustix::io::ioctl_fionread(sock).is_ok_and(|n| n > 0) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(io::Error::from(e)),
                }
            }),
        )
        .await;
        match res {
            Err(_) => return Err(XferError::Peer(timed_out())),
            Ok(Ok(Some(0))) => return Err(XferError::Peer(io::ErrorKind::UnexpectedEof.into())),
            Ok(Ok(Some(n))) => {
                left -= n;
                cur = Some((p, held + n));
            }
            Ok(Ok(None)) => {
                out.parts.push((p, held));
                out.len += held;
            }
            Ok(Err(e)) => return Err(XferError::Peer(e)),
        }
    }
    if let Some((p, held)) = cur {
        out.parts.push((p, held));
        out.len += held;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zerocopy::tests::pair;
    use tokio::io::AsyncWriteExt;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + i / 4093) as u8).collect()
    }

    /// A piece larger than a pipe holds is held in several, and any range
    /// of it reads back the bytes sent, as often as asked.
    #[tokio::test]
    async fn held_bytes_read_back_from_anywhere_and_again() {
        const PART: usize = 16 << 10;
        let want = data(3 * PART_BYTES / 2 + 777);
        let (mut a, b) = pair().await;
        let mut rd = BufReader::new(b);
        let sent = want.clone();
        let tx = tokio::spawn(async move {
            // A line the reader buffers with the first bytes of data, as a
            // LOAD reply arrives.
            a.write_all(b"0 42 \n").await.unwrap();
            a.write_all(&sent).await.unwrap();
            a
        });
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut rd, &mut line)
            .await
            .unwrap();
        assert_eq!(line, "0 42 \n");
        // Small pipes, so the bytes need many.
        let room = Room(held_pipe(PART, true).unwrap());
        let held = recv_in(&mut rd, room, want.len(), Duration::from_secs(10), PART)
            .await
            .unwrap();
        let _a = tx.await.unwrap();
        assert_eq!(held.len(), want.len());
        assert!(held.pipes() >= 4, "{} pipes", held.pipes());
        assert_eq!(held.to_vec().unwrap(), want);
        for (from, n) in [(0, 4096), (1, 1), (PART - 5, 10), (123_456, 600_000)] {
            let mut got = vec![0u8; n];
            held.copy_to(from, &mut got).unwrap();
            assert_eq!(got, &want[from..from + n], "{n} bytes at {from}");
        }
        // Tee'd into a pipe, twice: the held bytes stay.
        for _ in 0..2 {
            let (r, w) = pipe(1 << 20).unwrap();
            held.tee_to(100, 300_000, w.as_fd()).unwrap();
            let mut got = vec![0u8; 300_000];
            let mut at = 0;
            while at < got.len() {
                at += rustix::io::read(&r, &mut got[at..]).unwrap();
            }
            assert_eq!(got, &want[100..300_100]);
        }
        let mut past = vec![0u8; 2];
        assert!(held.copy_to(want.len() - 1, &mut past).is_err());
    }

    /// Pipes of a dropped piece are emptied and serve the next pieces,
    /// which read back their own bytes only.
    #[tokio::test]
    async fn pipes_used_again_hold_only_the_new_bytes() {
        let (mut a, b) = pair().await;
        let mut rd = BufReader::new(b);
        let first = data(300_000);
        let second: Vec<u8> = first.iter().map(|x| !x).collect();
        let sent = [first.clone(), second.clone()].concat();
        let tx = tokio::spawn(async move {
            a.write_all(&sent).await.unwrap();
            a
        });
        let idle = Duration::from_secs(10);
        let one = recv(&mut rd, Room::new().unwrap(), first.len(), idle)
            .await
            .unwrap();
        assert_eq!(one.to_vec().unwrap(), first);
        // (Other tests take pipes too: what was kept is not asserted.)
        drop(one);
        let two = recv(&mut rd, Room::new().unwrap(), second.len(), idle)
            .await
            .unwrap();
        let _a = tx.await.unwrap();
        assert_eq!(two.to_vec().unwrap(), second);
    }

    /// A peer that closes early is an error, not a short piece.
    #[tokio::test]
    async fn a_peer_closing_early_is_an_error() {
        let (mut a, b) = pair().await;
        a.write_all(&data(1000)).await.unwrap();
        drop(a);
        let mut rd = BufReader::new(b);
        let e = recv(&mut rd, Room::new().unwrap(), 5000, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(e, XferError::Peer(_)), "{e}");
    }
}
