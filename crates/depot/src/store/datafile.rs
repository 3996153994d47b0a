//! One allocation's bytes on disk (`docs/depot-format.md`).
//!
//! Layout: a 4096-byte header, then data. The header holds the *committed*
//! extent — bytes a reader may see — so a data phase can stream straight into
//! the file beyond it and becomes visible only when the header moves:
//!
//! | offset | size | field                                          |
//! |-------:|-----:|------------------------------------------------|
//! | 0      | 8    | magic `LORSALC1`                               |
//! | 8      | 4    | format version (1), little endian              |
//! | 12     | 4    | allocation type number                         |
//! | 16     | 8    | `head`: ring start (queues) or 0               |
//! | 24     | 8    | `len`: committed bytes                         |
//! | 32     | 8    | `capacity`: ring size (queues) or 0            |
//! | 40     | 8    | first 8 bytes of BLAKE3 over bytes 0..40       |
//!
//! Byte arrays keep byte `i` at `HEADER_BYTES + i`. Queues keep a ring of
//! `capacity` bytes; logical byte `i` of the queue is at
//! `HEADER_BYTES + (head + i) % capacity`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes before the data. Page-sized so data stays page-aligned for sendfile.
pub const HEADER_BYTES: u64 = 4096;
const MAGIC: &[u8; 8] = b"LORSALC1";
const FORMAT_VERSION: u32 = 1;

/// The committed extent of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Extent {
    /// Ring start (queues); 0 for byte arrays.
    pub head: u64,
    /// Committed bytes.
    pub len: u64,
    /// Ring size for queues; 0 for byte arrays.
    pub capacity: u64,
}

fn header_bytes(type_num: u32, e: Extent) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[0..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&type_num.to_le_bytes());
    h[16..24].copy_from_slice(&e.head.to_le_bytes());
    h[24..32].copy_from_slice(&e.len.to_le_bytes());
    h[32..40].copy_from_slice(&e.capacity.to_le_bytes());
    let sum = blake3::hash(&h[0..40]);
    h[40..48].copy_from_slice(&sum.as_bytes()[0..8]);
    h
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// Why a data file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DataFileError {
    /// OS error.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Header damaged or of another format.
    #[error("data file header is damaged or of an unknown format")]
    BadHeader,
}

/// Creates a new, empty data file and makes it durable.
pub fn create(path: &Path, type_num: u32, capacity: u64, sync: bool) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    let e = Extent {
        head: 0,
        len: 0,
        capacity,
    };
    f.write_all_at(&header_bytes(type_num, e), 0)?;
    // The whole header page exists from the start, so the file's length is
    // always `HEADER_BYTES + committed bytes` (or more, mid data phase).
    f.set_len(HEADER_BYTES)?;
    if sync {
        f.sync_all()?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
    }
    Ok(f)
}

/// What [`open`] found.
#[derive(Debug)]
pub enum Opened {
    /// A data file with a good header; bytes past the committed extent (an
    /// unacknowledged data phase cut short) have been dropped.
    File {
        /// The open file.
        file: File,
        /// Its committed extent.
        extent: Extent,
        /// The allocation type number in its header.
        type_num: u32,
    },
    /// A file the depot created but never committed a byte to: a crash came
    /// between creating it and writing its header. It has been removed; the
    /// allocation simply has no data yet.
    Unwritten,
}

/// Opens an existing data file and checks its header against every state the
/// depot itself can leave behind:
///
/// * a header and committed bytes, perhaps followed by the uncommitted tail
///   of a data phase a crash cut short (the tail is dropped);
/// * a header with nothing committed, whatever the file's length (a STORE of
///   zero bytes, or a crash right after a STORE's go-ahead; files written
///   before the header page was preallocated are only 48 bytes long);
/// * no header at all — an empty file, or one whose header is still zeros
///   (a crash between creating the file and writing its header).
///
/// Anything else — a bad checksum, another format, committed bytes missing —
/// is [`DataFileError::BadHeader`]: damage from outside the depot.
pub fn open(path: &Path) -> Result<Opened, DataFileError> {
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let have = f.metadata()?.len();
    let mut h = [0u8; 48];
    let got = read_up_to(&f, &mut h)?;
    if h[..got].iter().all(|&b| b == 0) && (got < h.len() || have <= HEADER_BYTES) {
        drop(f);
        std::fs::remove_file(path)?;
        return Ok(Opened::Unwritten);
    }
    if got < h.len() || &h[0..8] != MAGIC || h[8..12] != FORMAT_VERSION.to_le_bytes() {
        return Err(DataFileError::BadHeader);
    }
    if blake3::hash(&h[0..40]).as_bytes()[0..8] != h[40..48] {
        return Err(DataFileError::BadHeader);
    }
    let e = Extent {
        head: le_u64(&h[16..24]),
        len: le_u64(&h[24..32]),
        capacity: le_u64(&h[32..40]),
    };
    let want = HEADER_BYTES
        .checked_add(if e.capacity == 0 { e.len } else { 0 })
        .ok_or(DataFileError::BadHeader)?;
    if e.capacity > 0 && (e.len > e.capacity || e.head >= e.capacity) {
        return Err(DataFileError::BadHeader);
    }
    if e.capacity == 0 && have > want {
        f.set_len(want)?;
    } else if have < want {
        if e.len > 0 && e.capacity == 0 {
            // Committed bytes missing: the file was cut by something other
            // than us. Refuse rather than serve zeros as data.
            return Err(DataFileError::BadHeader);
        }
        f.set_len(want)?;
    }
    let type_num = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
    Ok(Opened::File {
        file: f,
        extent: e,
        type_num,
    })
}

/// Reads from byte 0 until `buf` is full or the file ends; returns the count.
fn read_up_to(f: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Writes the header for a new committed extent. With `sync`, data written
/// before this call is made durable first, then the header, so a crash never
/// leaves a header that points at bytes that are not on disk.
pub fn commit(f: &File, type_num: u32, e: Extent, sync: bool) -> io::Result<()> {
    if sync {
        f.sync_data()?;
    }
    f.write_all_at(&header_bytes(type_num, e), 0)?;
    if sync {
        f.sync_data()?;
    }
    Ok(())
}

/// Bytes per round of the buffered fallback of [`copy_range`].
const COPY_CHUNK: usize = 1 << 20;

/// Copies `len` bytes between files (blocking): `copy_file_range` where the
/// kernel can, a buffered loop otherwise.
pub fn copy_range(src: &File, src_pos: u64, dst: &File, dst_pos: u64, len: u64) -> io::Result<()> {
    let (mut sp, mut dp, mut left) = (src_pos, dst_pos, len);
    while left > 0 {
        let want = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
        match rustix::fs::copy_file_range(src, Some(&mut sp), dst, Some(&mut dp), want) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => left -= n as u64,
            Err(rustix::io::Errno::XDEV | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => {
                let mut buf = vec![0u8; COPY_CHUNK];
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

/// Writes `buf` at logical offset `pos` of a ring of `capacity` bytes.
pub fn ring_write(f: &File, capacity: u64, pos: u64, buf: &[u8]) -> io::Result<()> {
    let mut done = 0usize;
    let mut p = pos % capacity;
    while done < buf.len() {
        let room = usize::try_from(capacity - p).unwrap_or(usize::MAX);
        let n = room.min(buf.len() - done);
        f.write_all_at(&buf[done..done + n], HEADER_BYTES + p)?;
        done += n;
        p = (p + n as u64) % capacity;
    }
    Ok(())
}

/// Reads `buf.len()` bytes at logical offset `pos` of a ring.
pub fn ring_read(f: &File, capacity: u64, pos: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    let mut p = pos % capacity;
    while done < buf.len() {
        let room = usize::try_from(capacity - p).unwrap_or(usize::MAX);
        let n = room.min(buf.len() - done);
        f.read_exact_at(&mut buf[done..done + n], HEADER_BYTES + p)?;
        done += n;
        p = (p + n as u64) % capacity;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopen_drops_uncommitted_tail_and_detects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        let f = create(&p, 1, 0, true).unwrap();
        f.write_all_at(b"hello", HEADER_BYTES).unwrap();
        commit(
            &f,
            1,
            Extent {
                head: 0,
                len: 5,
                capacity: 0,
            },
            true,
        )
        .unwrap();
        // An unacknowledged store that a crash cut short.
        f.write_all_at(b" world", HEADER_BYTES + 5).unwrap();
        drop(f);
        let Opened::File {
            file: f, extent: e, ..
        } = open(&p).unwrap()
        else {
            panic!("a written file opens as one")
        };
        assert_eq!(e.len, 5);
        assert_eq!(f.metadata().unwrap().len(), HEADER_BYTES + 5);
        // Flip a header byte: refused, not served.
        f.write_all_at(&[0xff], 25).unwrap();
        assert!(matches!(open(&p), Err(DataFileError::BadHeader)));
    }

    fn opened(p: &Path) -> (File, Extent) {
        match open(p).unwrap() {
            Opened::File { file, extent, .. } => (file, extent),
            Opened::Unwritten => panic!("expected a data file"),
        }
    }

    #[test]
    fn every_state_the_depot_leaves_behind_reopens() {
        let dir = tempfile::tempdir().unwrap();
        // A new file (a zero-byte STORE, or a crash right after a STORE's
        // go-ahead): nothing committed, and it stays usable.
        let p = dir.path().join("new");
        drop(create(&p, 1, 0, true).unwrap());
        let (f, e) = opened(&p);
        assert_eq!(e, Extent::default());
        assert_eq!(f.metadata().unwrap().len(), HEADER_BYTES);
        // The same with bytes of the cut-short data phase after the header.
        f.write_all_at(b"unacknowledged", HEADER_BYTES).unwrap();
        drop(f);
        let (f, e) = opened(&p);
        assert_eq!((e.len, f.metadata().unwrap().len()), (0, HEADER_BYTES));
        // A header-only file as earlier versions wrote it (48 bytes).
        let p = dir.path().join("short");
        let f = create(&p, 1, 0, false).unwrap();
        f.set_len(48).unwrap();
        drop(f);
        let (f, e) = opened(&p);
        assert_eq!((e.len, f.metadata().unwrap().len()), (0, HEADER_BYTES));
        // A crash between creating the file and writing its header: an empty
        // file, or a header page still all zeros. Removed, not "damaged".
        for len in [0, 20, 48, HEADER_BYTES] {
            let p = dir.path().join(format!("unwritten-{len}"));
            File::create(&p).unwrap().set_len(len).unwrap();
            assert!(matches!(open(&p), Ok(Opened::Unwritten)), "{len}");
            assert!(!p.exists());
        }
        // A queue whose ring was never written past the header.
        let p = dir.path().join("queue");
        drop(create(&p, 3, 1000, true).unwrap());
        let (_, e) = opened(&p);
        assert_eq!(e.capacity, 1000);
    }

    #[test]
    fn damage_from_outside_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        let f = create(&p, 1, 0, true).unwrap();
        f.write_all_at(b"hello", HEADER_BYTES).unwrap();
        let five = Extent {
            head: 0,
            len: 5,
            capacity: 0,
        };
        commit(&f, 1, five, true).unwrap();
        // Committed bytes cut off.
        f.set_len(HEADER_BYTES + 2).unwrap();
        assert!(matches!(open(&p), Err(DataFileError::BadHeader)));
        // A queue extent that does not fit its ring (checksum still good).
        for bad in [
            Extent {
                head: 0,
                len: 11,
                capacity: 10,
            },
            Extent {
                head: 10,
                len: 0,
                capacity: 10,
            },
        ] {
            commit(&f, 3, bad, false).unwrap();
            assert!(matches!(open(&p), Err(DataFileError::BadHeader)), "{bad:?}");
        }
        // A committed length that would overflow the file offset.
        let huge = Extent {
            head: 0,
            len: u64::MAX,
            capacity: 0,
        };
        commit(&f, 1, huge, false).unwrap();
        assert!(matches!(open(&p), Err(DataFileError::BadHeader)));
        // Garbage where the header should be.
        f.write_all_at(b"not a header at all, just text....", 0)
            .unwrap();
        assert!(matches!(open(&p), Err(DataFileError::BadHeader)));
    }

    #[test]
    fn ring_wraps() {
        let dir = tempfile::tempdir().unwrap();
        let f = create(&dir.path().join("q"), 3, 8, false).unwrap();
        ring_write(&f, 8, 6, b"abcdef").unwrap();
        let mut out = [0u8; 6];
        ring_read(&f, 8, 6, &mut out).unwrap();
        assert_eq!(&out, b"abcdef");
    }
}
