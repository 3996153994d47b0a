//! Per-block digests of a byte array allocated with LStore's
//! ALLOCATE_CHKSUM (`docs/ibp-protocol.md` §2.7), kept beside its data file
//! in `<data file>.cks`:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 72 | tail slot 0: committed length it describes (u64 LE), digest |
//! | 72 | 72 | tail slot 1 |
//! | 144 | `d` per block | digest of every *full* block, block `k` at `144 + k·d` |
//!
//! Block `k` is bytes `[k·bs, (k+1)·bs)`. A full block's digest has one
//! place. The last block, while it is short, has its digest in a tail slot
//! marked with the committed length it was computed for: an append writes
//! the new length's tail into the slot the current length does not use,
//! before the data file's header commits the new length. A crash between
//! the two leaves the old length and its tail digest as they were, so the
//! acknowledged bytes still verify. (A full block rewritten by a WRITE has
//! its digest replaced in place, as its bytes are: a crash in the middle of
//! that unacknowledged WRITE can leave the block failing its digest, which
//! VALIDATE_CHKSUM reports and, asked to, repairs.)

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use lors_ibp::proto::chksum::{BlockHasher, NetChksum};

use super::datafile::HEADER_BYTES;

/// Largest digest block the depot keeps (a block is read whole to check it).
pub const MAX_DISK_CHKSUM_BLOCK: u64 = 16 << 20;

const SLOT: u64 = 72;
const FULL_AT: u64 = 2 * SLOT;

/// Blocks whose digests are read in one go (1 MiB of SHA-256 digests).
pub const RUN_BLOCKS: u64 = 32 * 1024;

/// Digest bytes any allocation may have, however small.
const DIGEST_ALLOWANCE: u64 = 4096;

/// Whether the digests of a `size`-byte allocation kept per `cs` fit the
/// bound on overhead: a sixteenth of the allocation, or 4 KiB for small
/// ones. Digests are disk the quota does not count, and GET_CHKSUM and
/// VALIDATE_CHKSUM read them: without a bound, SHA-512 over 1-byte blocks
/// made 64 bytes of digest (and of memory) per byte allocated.
///
/// ```
/// use lors_depot::store::digests::overhead_fits;
/// use lors_ibp::proto::chksum::{ChksumType, NetChksum};
/// let cs = |block_size| NetChksum { kind: ChksumType::Sha512, block_size };
/// assert!(overhead_fits(cs(65536), 1 << 30));
/// assert!(overhead_fits(cs(4), 64)); // 16 digests: small enough
/// assert!(!overhead_fits(cs(1), 8 << 20));
/// assert!(overhead_fits(cs(2048), 8 << 20));
/// ```
pub fn overhead_fits(cs: NetChksum, size: u64) -> bool {
    let dlen = cs.kind.hex_len() as u64 / 2;
    let bytes = size
        .div_ceil(cs.block_size.max(1))
        .saturating_mul(dlen)
        .saturating_add(FULL_AT);
    bytes <= (size / 16).max(DIGEST_ALLOWANCE)
}

/// The digest file of the data file at `data`.
pub fn path_for(data: &Path) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(".cks");
    PathBuf::from(p)
}

/// One allocation's digest file, open.
pub struct Digests {
    /// `None`: no digest file yet (nothing was ever committed).
    file: Option<File>,
    cs: NetChksum,
    dlen: usize,
}

/// How a verify ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Verified {
    /// Every block matched.
    Good,
    /// Block `n` did not.
    Bad(u64),
}

impl Digests {
    /// Opens (creating if need be) the digest file for `data`.
    pub fn open(data: &Path, cs: NetChksum) -> io::Result<Digests> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path_for(data))?;
        Ok(Digests {
            file: Some(file),
            cs,
            dlen: cs.kind.hex_len() / 2,
        })
    }

    /// Opens the digest file for `data` if there is one (`None`: there is
    /// none yet), never creating it.
    pub fn open_existing(data: &Path, cs: NetChksum) -> io::Result<Option<Digests>> {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .open(path_for(data))
        {
            Ok(file) => Ok(Some(Digests {
                file: Some(file),
                cs,
                dlen: cs.kind.hex_len() / 2,
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The digests of an allocation nothing was committed to: none.
    pub fn empty(cs: NetChksum) -> Digests {
        Digests {
            file: None,
            cs,
            dlen: cs.kind.hex_len() / 2,
        }
    }

    /// The digest file, to change it.
    fn writable(&self) -> io::Result<&File> {
        self.file.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the digest file was never made")
        })
    }

    fn bs(&self) -> u64 {
        self.cs.block_size
    }

    /// Number of blocks in `len` bytes.
    pub fn blocks(&self, len: u64) -> u64 {
        len.div_ceil(self.bs())
    }

    /// Bytes of one digest.
    pub fn digest_len(&self) -> usize {
        self.dlen
    }

    fn hash(&self, bytes: &[u8]) -> Vec<u8> {
        let mut h = BlockHasher::new(self.cs.kind);
        h.update(bytes);
        h.finish_bytes()
    }

    /// Block `k` of the data in `data` (committed length `len`), hashed.
    fn compute(&self, data: &File, k: u64, len: u64, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
        let start = k * self.bs();
        let n = usize::try_from((len - start).min(self.bs())).map_err(io::Error::other)?;
        buf.resize(n, 0);
        data.read_exact_at(buf, HEADER_BYTES + start)?;
        Ok(self.hash(buf))
    }

    fn slots(&self) -> io::Result<[(u64, Vec<u8>); 2]> {
        let mut b = [0u8; FULL_AT as usize];
        let got = read_up_to(self.file.as_ref(), &mut b, 0)?;
        b[got..].fill(0);
        let slot = |i: usize| {
            let at = i * SLOT as usize;
            let len = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
            (len, b[at + 8..at + 8 + self.dlen].to_vec())
        };
        Ok([slot(0), slot(1)])
    }

    /// The stored digests of `blocks` when the committed length is `len`:
    /// the full blocks' in one read, the short last block's from its slot.
    fn stored(&self, blocks: Range<u64>, len: u64) -> io::Result<Stored> {
        let full_end = (len / self.bs()).max(blocks.start);
        let n =
            usize::try_from(blocks.end.min(full_end) - blocks.start).map_err(io::Error::other)?;
        let mut full = vec![0u8; n * self.dlen];
        let got = read_up_to(
            self.file.as_ref(),
            &mut full,
            FULL_AT + blocks.start * self.dlen as u64,
        )?;
        full.truncate(got);
        let tail = if !len.is_multiple_of(self.bs()) && blocks.end > full_end {
            self.slots()?
                .into_iter()
                .find(|(l, _)| *l == len)
                .map(|(_, d)| d)
        } else {
            None
        };
        Ok(Stored {
            first: blocks.start,
            end: blocks.end,
            full,
            full_end,
            tail,
            dlen: self.dlen,
        })
    }

    /// Brings the digests up to date after bytes `[start, end)` of `data`
    /// were written, before its committed length goes from `old_len` to
    /// `new_len` at the header commit. A write past `old_len` leaves the
    /// hole `[old_len, start)`, which reads as zeros and is covered too.
    pub fn update(
        &self,
        data: &File,
        (start, end): (u64, u64),
        old_len: u64,
        new_len: u64,
        sync: bool,
    ) -> io::Result<()> {
        let bs = self.bs();
        let mut buf = Vec::new();
        let mut zero: Option<Vec<u8>> = None;
        let full_end = new_len / bs; // blocks below this are full
        let first = start.min(old_len) / bs;
        let last_full = end.div_ceil(bs).min(full_end);
        let mut run = Vec::with_capacity(
            usize::try_from(last_full.saturating_sub(first)).unwrap_or(0) * self.dlen,
        );
        for k in first..last_full {
            // A block wholly inside the hole is zeros: no need to read it.
            let hole = k * bs >= old_len && (k + 1) * bs <= start;
            let d = if hole {
                zero.get_or_insert_with(|| self.hash(&vec![0u8; bs as usize]))
                    .clone()
            } else {
                self.compute(data, k, new_len, &mut buf)?
            };
            run.extend_from_slice(&d);
        }
        if !run.is_empty() {
            self.writable()?
                .write_all_at(&run, FULL_AT + first * self.dlen as u64)?;
        }
        if new_len != old_len || end > full_end * bs {
            self.write_tail(data, old_len, new_len, &mut buf)?;
        }
        if sync {
            self.writable()?.sync_data()?;
        }
        Ok(())
    }

    /// Writes the short last block's digest for `new_len` (if it has one)
    /// into the slot `old_len` does not use.
    fn write_tail(
        &self,
        data: &File,
        old_len: u64,
        new_len: u64,
        buf: &mut Vec<u8>,
    ) -> io::Result<()> {
        if new_len.is_multiple_of(self.bs()) {
            return Ok(());
        }
        let slots = self.slots()?;
        let i = if new_len == old_len {
            slots.iter().position(|(l, _)| *l == old_len).unwrap_or(0)
        } else {
            slots
                .iter()
                .position(|(l, _)| *l == new_len)
                .or_else(|| slots.iter().position(|(l, _)| *l != old_len))
                .unwrap_or(0)
        };
        let d = self.compute(data, new_len / self.bs(), new_len, buf)?;
        let mut b = Vec::with_capacity(SLOT as usize);
        b.extend_from_slice(&new_len.to_le_bytes());
        b.extend_from_slice(&d);
        b.resize(SLOT as usize, 0);
        self.writable()?.write_all_at(&b, i as u64 * SLOT)
    }

    /// Checks every block overlapping `[off, off+n)` of data whose committed
    /// length is `len`.
    pub fn verify(&self, data: &File, off: u64, n: u64, len: u64) -> io::Result<Verified> {
        if n == 0 {
            return Ok(Verified::Good);
        }
        let blocks = off / self.bs()..(off + n).div_ceil(self.bs());
        let stored = self.stored(blocks.clone(), len)?;
        let mut buf = Vec::new();
        for k in blocks {
            if stored.get(k) != Some(&self.compute(data, k, len, &mut buf)?[..]) {
                return Ok(Verified::Bad(k));
            }
        }
        Ok(Verified::Good)
    }

    /// Counts the blocks of `[0, len)` that fail their digest; with
    /// `correct`, stores fresh digests for them.
    pub fn validate(&self, data: &File, len: u64, correct: bool, sync: bool) -> io::Result<u64> {
        let mut buf = Vec::new();
        let mut bad = 0;
        let mut stored = self.stored(0..0, len)?;
        for k in 0..self.blocks(len) {
            if k >= stored.end {
                // The stored digests a run at a time: memory stays bounded
                // however many blocks there are.
                stored = self.stored(k..(k + RUN_BLOCKS).min(self.blocks(len)), len)?;
            }
            let have = self.compute(data, k, len, &mut buf)?;
            if stored.get(k) == Some(&have[..]) {
                continue;
            }
            bad += 1;
            if correct {
                if (k + 1) * self.bs() <= len {
                    self.writable()?
                        .write_all_at(&have, FULL_AT + k * self.dlen as u64)?;
                } else {
                    self.write_tail(data, len, len, &mut buf)?;
                }
            }
        }
        if correct && bad > 0 && sync {
            self.writable()?.sync_data()?;
        }
        Ok(bad)
    }

    /// The stored digests of `blocks` of `[0, len)`, in order (a block
    /// with none stored reads as zeros). Ask for at most [`RUN_BLOCKS`] at
    /// once to keep memory bounded.
    pub fn range(&self, len: u64, blocks: Range<u64>) -> io::Result<Vec<u8>> {
        let blocks = blocks.start..blocks.end.min(self.blocks(len));
        let stored = self.stored(blocks.clone(), len)?;
        let mut out = Vec::new();
        for k in blocks {
            match stored.get(k) {
                Some(d) => out.extend_from_slice(d),
                None => out.resize(out.len() + self.dlen, 0),
            }
        }
        Ok(out)
    }

    /// Drops the full-block digests past `len` (after TRUNCATE).
    pub fn cut(&self, len: u64) -> io::Result<()> {
        self.writable()?
            .set_len(FULL_AT + (len / self.bs()) * self.dlen as u64)
    }
}

/// Stored digests of a run of blocks (`Digests::stored`).
struct Stored {
    first: u64,
    /// The end of the run asked for.
    end: u64,
    /// Full blocks' digests from `first`, as far as the file had them.
    full: Vec<u8>,
    /// Blocks below this are full.
    full_end: u64,
    /// The short last block's digest, if the range reaches it.
    tail: Option<Vec<u8>>,
    dlen: usize,
}

impl Stored {
    fn get(&self, k: u64) -> Option<&[u8]> {
        if k >= self.full_end {
            return self.tail.as_deref();
        }
        let at = usize::try_from(k - self.first).ok()? * self.dlen;
        self.full.get(at..at + self.dlen)
    }
}

fn read_up_to(f: Option<&File>, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let Some(f) = f else {
        return Ok(0);
    };
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lors_ibp::proto::chksum::ChksumType;

    fn setup() -> (tempfile::TempDir, File, Digests) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0000000000000001");
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        data.set_len(HEADER_BYTES).unwrap();
        let cs = NetChksum {
            kind: ChksumType::Sha1,
            block_size: 4,
        };
        let d = Digests::open(&path, cs).unwrap();
        (dir, data, d)
    }

    fn put(data: &File, at: u64, b: &[u8]) {
        data.write_all_at(b, HEADER_BYTES + at).unwrap();
    }

    #[test]
    fn an_append_cut_by_a_crash_leaves_the_committed_tail_verifiable() {
        let (_dir, data, d) = setup();
        put(&data, 0, b"abcdef");
        d.update(&data, (0, 6), 0, 6, false).unwrap();
        assert_eq!(d.verify(&data, 0, 6, 6).unwrap(), Verified::Good);
        // An append's bytes and digests land, then the crash: the header
        // still says 6 bytes, and they still verify.
        put(&data, 6, b"ghij");
        d.update(&data, (6, 10), 6, 10, false).unwrap();
        assert_eq!(d.verify(&data, 0, 6, 6).unwrap(), Verified::Good);
        assert_eq!(d.verify(&data, 0, 10, 10).unwrap(), Verified::Good);
        // Another append from 6 (the first was never acknowledged).
        put(&data, 6, b"GH");
        d.update(&data, (6, 8), 6, 8, false).unwrap();
        assert_eq!(d.verify(&data, 0, 8, 8).unwrap(), Verified::Good);
        assert_eq!(d.validate(&data, 8, false, false).unwrap(), 0);
    }

    #[test]
    fn holes_verify_as_zeros_and_damage_is_found_and_corrected() {
        let (_dir, data, d) = setup();
        // A write far past the end: the hole's digests are those of zeros.
        put(&data, 20, b"xyz");
        d.update(&data, (20, 23), 0, 23, false).unwrap();
        assert_eq!(d.validate(&data, 23, false, false).unwrap(), 0);
        assert_eq!(d.range(23, 0..u64::MAX).unwrap().len(), 6 * 20);
        put(&data, 9, b"!");
        assert_eq!(d.verify(&data, 0, 8, 23).unwrap(), Verified::Good);
        assert_eq!(d.verify(&data, 0, 23, 23).unwrap(), Verified::Bad(2));
        put(&data, 21, b"!");
        assert_eq!(d.validate(&data, 23, true, false).unwrap(), 2);
        assert_eq!(d.validate(&data, 23, false, false).unwrap(), 0);
        // A cut to 10 bytes: the new short last block gets its digest.
        d.update(&data, (10, 10), 23, 10, false).unwrap();
        d.cut(10).unwrap();
        assert_eq!(d.validate(&data, 10, false, false).unwrap(), 0);
        assert_eq!(d.blocks(10), 3);
    }
}
