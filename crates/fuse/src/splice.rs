//! READ replies spliced into `/dev/fuse`.
//!
//! fuser answers a READ with `writev(2)` from memory, so a byte on its way
//! from a depot to a reading program was copied three times: socket →
//! read-ahead buffer → page cache → the program. On the bench's two cores
//! the mount was CPU-bound, and the first of those copies was a sixth of
//! all its CPU. Here the read-ahead keeps the socket's pages in pipes
//! ([`lors_ibp::spliced`]), and a reply is put together in a pipe of its
//! own — the 16-byte header, then the bytes by reference — and spliced
//! into `/dev/fuse`, which copies once, into the page cache.
//!
//! The kernel takes a spliced reply whole from one pipe, so the pipe must
//! hold all of it: one per thread, as large as the kernel allows. A reply
//! it cannot hold, or bytes in memory, take the ordinary way.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use lors::xio::Reads;
use rustix::io::Errno;
use rustix::pipe::{SpliceFlags, splice};

/// The most a READ asks for when replies are spliced (the `max_read` mount
/// option): what a 1 MiB pipe holds with room to spare.
pub(crate) const MAX_READ: usize = 512 << 10;

/// `struct fuse_out_header`: length (with itself), error, request id.
const HEADER: usize = 16;

/// What became of a READ.
pub(crate) enum Outcome {
    /// Answered (or the kernel no longer wants the answer).
    Answered,
    /// Not answered: answer it the ordinary way.
    Fallback,
    /// The bytes could not be read: answer with this error.
    Failed(io::Error),
}

thread_local! {
    /// This thread's reply pipe (read end, write end), empty between
    /// replies.
    static PIPE: RefCell<Option<(OwnedFd, OwnedFd)>> = const { RefCell::new(None) };
}

/// A successful reply's header: its length, error 0, the request's id.
#[expect(
    clippy::host_endian_bytes,
    reason = "the FUSE ABI is in the host's byte order"
)]
fn header(len: u32, unique: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&len.to_ne_bytes());
    h[8..].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// Answers READ request `unique` for `size` bytes at `offset` of `reads`
/// on the FUSE device `dev`, spliced.
pub(crate) fn read(
    dev: BorrowedFd<'_>,
    reads: &Reads,
    unique: u64,
    offset: u64,
    size: u32,
) -> Outcome {
    let (r, w) = match PIPE.with(|p| p.borrow_mut().take()) {
        Some(p) => p,
        // As large as the kernel lets this process make one: 4 MiB (1024
        // slots) with the privilege to exceed `pipe-max-size`.
        None => match lors_ibp::spliced::pipe(4 << 20) {
            Ok(p) => p,
            Err(_) => return Outcome::Fallback,
        },
    };
    // A short reply is end of file to the kernel: all `size` bytes unless
    // the file ends first.
    let n = usize::try_from(u64::from(size).min(reads.len().saturating_sub(offset)))
        .unwrap_or(usize::MAX);
    let head = header(u32::try_from(HEADER + n).unwrap_or(u32::MAX), unique);
    let filled = lors_ibp::spliced::write_to(w.as_fd(), &head)
        .and_then(|()| reads.splice_to(offset, n, w.as_fd()));
    match filled {
        Ok(got) if got == n => {}
        // A pipe that failed is closed, not kept: it may hold bytes.
        Ok(_) => return Outcome::Failed(io::Error::other("the file changed size")),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Outcome::Fallback,
        Err(e) => return Outcome::Failed(e),
    }
    let len = HEADER + n;
    loop {
        // The kernel takes a reply whole or not at all.
        match splice(&r, None, dev, None, len, SpliceFlags::empty()) {
            Ok(k) if k == len => break,
            Ok(_) => return Outcome::Fallback,
            Err(Errno::INTR) => {}
            // The request was interrupted and is gone: no answer is due.
            Err(Errno::NOENT) => return Outcome::Answered,
            Err(e) => {
                tracing::debug!(error = %e, "a spliced READ reply was refused; writing it");
                return Outcome::Fallback;
            }
        }
    }
    PIPE.with(|p| *p.borrow_mut() = Some((r, w)));
    Outcome::Answered
}
