//! Sparse inputs: a regular file's data extents, found with
//! `SEEK_DATA`/`SEEK_HOLE`, so an upload stores only the bytes the file
//! system holds and records the rest as holes (the Data Reservoir's
//! "send only the blocks a file system uses").
//!
//! Holes shorter than [`MIN_HOLE`] are stored as zeros: a mapping per
//! small gap would cost more than the zeros. The file's last bytes are
//! always stored, so the LoRS 0.82 tools, which take a file's size from
//! its furthest mapping and skip `<exnode:hole>`, see its true size and
//! refuse the gap instead of reading a shorter file.

use std::os::fd::AsFd;

use lors_exnode::Hole;

/// Shortest hole recorded as one: a shorter one is stored as zeros.
pub const MIN_HOLE: u64 = 1 << 20;

/// Most holes one file records: past it, the shortest are stored as zeros
/// (so an exNode stays well under the reader's limits).
pub const MAX_HOLES: usize = 1 << 17;

/// The file's last bytes, always stored (see the module's notes).
const TAIL: u64 = 4096;

/// A file's layout: the extents to store and the holes between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    /// `(start, end)` of each run of bytes to store, in order.
    pub extents: Vec<(u64, u64)>,
    /// What lies between them.
    pub holes: Vec<Hole>,
}

impl Layout {
    /// Bytes to store.
    pub fn data_bytes(&self) -> u64 {
        self.extents.iter().map(|(a, b)| b - a).sum()
    }
}

/// The layout of the `size` bytes of `file`, or `None` when it has no
/// hole worth skipping (or its file system cannot tell: then every byte
/// is data).
pub(super) fn layout(file: &std::fs::File, size: u64) -> std::io::Result<Option<Layout>> {
    let found = data_extents(file.as_fd(), size)?;
    // Reading goes by offset, but a reader of the file position must not
    // find it moved.
    let _ = rustix::fs::seek(file.as_fd(), rustix::fs::SeekFrom::Start(0));
    Ok(plan(found, size))
}

/// The data extents as the file system reports them, gaps shorter than
/// [`MIN_HOLE`] closed as they are found.
fn data_extents(fd: std::os::fd::BorrowedFd<'_>, size: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use rustix::fs::{SeekFrom, seek};
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut pos = 0;
    while pos < size {
        let data = match seek(fd, SeekFrom::Data(pos)) {
            Ok(d) => d.min(size),
            // Only holes from here to the end.
            Err(rustix::io::Errno::NXIO) => break,
            // No SEEK_DATA here: all data.
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) if pos == 0 => {
                return Ok(vec![(0, size)]);
            }
            Err(e) => return Err(e.into()),
        };
        let hole = seek(fd, SeekFrom::Hole(data))?.clamp(data, size);
        if hole == data {
            break;
        }
        push(&mut out, (data, hole), MIN_HOLE);
        pos = hole;
    }
    Ok(out)
}

/// The layout for data extents `found` (in order, apart) of a file of
/// `size` bytes: the tail stored, at most [`MAX_HOLES`] holes, and `None`
/// when no hole is left.
fn plan(extents: Vec<(u64, u64)>, size: u64) -> Option<Layout> {
    let mut extents = close_gaps(extents, MIN_HOLE);
    let tail = (size.saturating_sub(TAIL), size);
    match extents.last_mut() {
        _ if size == 0 => return None,
        Some(last) if tail.0.saturating_sub(last.1) < MIN_HOLE => last.1 = size,
        _ => extents.push(tail),
    }
    let mut min = MIN_HOLE;
    while extents.len() > MAX_HOLES + 1 {
        min *= 2;
        extents = close_gaps(extents, min);
    }
    let mut holes = Vec::with_capacity(extents.len());
    let mut at = 0;
    for &(a, b) in &extents {
        if a > at {
            holes.push(Hole {
                offset: at,
                length: a - at,
            });
        }
        at = b;
    }
    (!holes.is_empty()).then_some(Layout { extents, holes })
}

/// `extents` with every gap shorter than `min` closed.
fn close_gaps(extents: Vec<(u64, u64)>, min: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(extents.len());
    for e in extents {
        push(&mut out, e, min);
    }
    out
}

/// Appends extent `e` (after every one in `out`), joined to the last one
/// when the gap between them is shorter than `min`.
fn push(out: &mut Vec<(u64, u64)>, e: (u64, u64), min: u64) {
    match out.last_mut() {
        Some(last) if e.0 - last.1 < min => last.1 = e.1,
        _ => out.push(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::FileExt;

    const M: u64 = 1 << 20;

    #[test]
    fn a_sparse_file_is_its_data_extents_and_its_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = std::fs::File::create(dir.path().join("s")).unwrap();
        f.set_len(64 * M).unwrap();
        f.write_all_at(&[1; 4096], 8 * M).unwrap();
        f.write_all_at(&[2; 4096], 8 * M + 8192).unwrap();
        f.write_all_at(&[3; 100], 30 * M).unwrap();
        f.seek(SeekFrom::Start(5)).unwrap();
        let Some(l) = layout(&f, 64 * M).unwrap() else {
            // tmpfs and ext4 report holes; a file system that does not
            // makes every file dense, which is no failure of ours.
            eprintln!("no SEEK_HOLE on this file system: skipped");
            return;
        };
        assert_eq!(f.stream_position().unwrap(), 0, "the position is put back");
        // The two writes 4 KiB apart are one extent; the tail is stored.
        assert_eq!(l.extents.len(), 3, "{l:?}");
        assert!(l.extents[0].0 <= 8 * M && l.extents[0].1 >= 8 * M + 12288);
        assert!(l.extents[1].0 <= 30 * M && l.extents[1].1 >= 30 * M + 100);
        assert_eq!(l.extents[2], (64 * M - TAIL, 64 * M));
        assert!(l.data_bytes() < M, "{}", l.data_bytes());
        let holes: u64 = l.holes.iter().map(|h| h.length).sum();
        assert_eq!(holes + l.data_bytes(), 64 * M);
        // A dense file has no layout; nor has an empty one.
        let mut d = std::fs::File::create(dir.path().join("d")).unwrap();
        d.write_all(&vec![7; 3 << 20]).unwrap();
        assert_eq!(layout(&d, 3 << 20).unwrap(), None);
        assert_eq!(layout(&d, 0).unwrap(), None);
        // All hole: only the tail is stored.
        let h = std::fs::File::create(dir.path().join("h")).unwrap();
        h.set_len(10 * M).unwrap();
        let l = layout(&h, 10 * M).unwrap().unwrap();
        assert_eq!(l.extents, [(10 * M - TAIL, 10 * M)]);
        assert_eq!(
            l.holes,
            [Hole {
                offset: 0,
                length: 10 * M - TAIL
            }]
        );
    }

    #[test]
    fn small_gaps_are_stored_and_holes_are_bounded() {
        // A gap shorter than MIN_HOLE joins its neighbours; a tail near
        // the last extent joins it.
        let l = plan(vec![(0, M), (M + 10, 2 * M), (4 * M, 5 * M)], 5 * M + 100).unwrap();
        assert_eq!(l.extents, [(0, 2 * M), (4 * M, 5 * M + 100)]);
        assert_eq!(
            l.holes,
            [Hole {
                offset: 2 * M,
                length: 2 * M
            }]
        );
        // Extents far more than MAX_HOLES: the shortest holes close.
        // (Gaps of 1 to 4 MiB in turn: the 4 MiB ones stay.)
        let mut at = 0;
        let many: Vec<(u64, u64)> = (0..3 * MAX_HOLES as u64)
            .map(|i| {
                let e = (at, at + M);
                at += M + (1 + i % 4) * M;
                e
            })
            .collect();
        let size = at + 8 * M;
        let l = plan(many, size).unwrap();
        assert!(l.holes.len() > MAX_HOLES / 2, "{}", l.holes.len());
        assert!(l.holes.len() <= MAX_HOLES, "{}", l.holes.len());
        assert_eq!(l.extents.last().unwrap().1, size);
        let holes: u64 = l.holes.iter().map(|h| h.length).sum();
        assert_eq!(holes + l.data_bytes(), size);
        // u64 extremes do not overflow.
        let l = plan(vec![(u64::MAX - 2 * M, u64::MAX - M)], u64::MAX).unwrap();
        assert_eq!(l.extents.last().unwrap().1, u64::MAX);
    }
}
