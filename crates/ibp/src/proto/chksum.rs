//! LStore's network checksums (`docs/ibp-protocol.md` §2.5): the data phase
//! of a checksummed STORE, WRITE or LOAD is cut into blocks of the requested
//! size, and each block — the last one possibly short — is followed by the
//! lowercase hex digest of that block alone.
//!
//! ```
//! use lors_ibp::proto::chksum::{BlockHasher, ChksumType, NetChksum};
//! let ncs = NetChksum { kind: ChksumType::Md5, block_size: 4 };
//! // Six bytes travel as 4 + digest + 2 + digest.
//! assert_eq!(ncs.framed_len(6), 6 + 2 * 32);
//! let mut h = BlockHasher::new(ChksumType::Md5);
//! h.update(b"abc");
//! assert_eq!(h.finish_hex(), "900150983cd24fb0d6963f7d28e17f72");
//! ```

use md5::Digest as _;
use sha2::Digest as _;

/// A checksum algorithm, numbered as LStore's toolbox numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChksumType {
    /// `CHKSUM_SHA256` (1).
    Sha256,
    /// `CHKSUM_SHA512` (2).
    Sha512,
    /// `CHKSUM_SHA1` (3).
    Sha1,
    /// `CHKSUM_MD5` (4).
    Md5,
}

impl ChksumType {
    /// From the wire number; `None` for 0 (`CHKSUM_NONE`) and unknown ones.
    pub fn from_number(n: i64) -> Option<Self> {
        match n {
            1 => Some(ChksumType::Sha256),
            2 => Some(ChksumType::Sha512),
            3 => Some(ChksumType::Sha1),
            4 => Some(ChksumType::Md5),
            _ => None,
        }
    }

    /// Wire number.
    pub fn number(self) -> i64 {
        match self {
            ChksumType::Sha256 => 1,
            ChksumType::Sha512 => 2,
            ChksumType::Sha1 => 3,
            ChksumType::Md5 => 4,
        }
    }

    /// Length of the hex digest sent after each block.
    pub fn hex_len(self) -> usize {
        match self {
            ChksumType::Sha256 => 64,
            ChksumType::Sha512 => 128,
            ChksumType::Sha1 => 40,
            ChksumType::Md5 => 32,
        }
    }
}

/// The `<type> <blocksize>` pair of a checksummed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetChksum {
    /// Algorithm.
    pub kind: ChksumType,
    /// Data bytes per digest (≥ 1).
    pub block_size: u64,
}

impl NetChksum {
    /// Bytes on the wire for `len` data bytes: the data plus one digest per
    /// started block.
    pub fn framed_len(&self, len: u64) -> u64 {
        let blocks = len.div_ceil(self.block_size);
        len.saturating_add(blocks.saturating_mul(self.kind.hex_len() as u64))
    }
}

/// Digest of one block at a time.
pub struct BlockHasher(Inner);

enum Inner {
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
    Sha1(sha1::Sha1),
    Md5(md5::Md5),
}

impl BlockHasher {
    /// A hasher for `kind`.
    pub fn new(kind: ChksumType) -> Self {
        BlockHasher(match kind {
            ChksumType::Sha256 => Inner::Sha256(sha2::Sha256::new()),
            ChksumType::Sha512 => Inner::Sha512(sha2::Sha512::new()),
            ChksumType::Sha1 => Inner::Sha1(sha1::Sha1::new()),
            ChksumType::Md5 => Inner::Md5(md5::Md5::new()),
        })
    }

    /// Adds bytes of the current block.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.0 {
            Inner::Sha256(h) => h.update(data),
            Inner::Sha512(h) => h.update(data),
            Inner::Sha1(h) => h.update(data),
            Inner::Md5(h) => md5::Digest::update(h, data),
        }
    }

    /// The block's digest; the hasher starts the next block.
    pub fn finish_bytes(&mut self) -> Vec<u8> {
        match &mut self.0 {
            Inner::Sha256(h) => h.finalize_reset().to_vec(),
            Inner::Sha512(h) => h.finalize_reset().to_vec(),
            Inner::Sha1(h) => h.finalize_reset().to_vec(),
            Inner::Md5(h) => md5::Digest::finalize_reset(h).to_vec(),
        }
    }

    /// The block's lowercase hex digest; the hasher starts the next block.
    pub fn finish_hex(&mut self) -> String {
        crate::hex::encode(&self.finish_bytes())
    }
}

/// Frames `data` as a checksummed data phase (what a client sends after a
/// checksummed STORE or WRITE, and what the depot sends after a checksummed
/// LOAD's reply line).
pub fn frame(ncs: &NetChksum, data: &[u8]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(usize::try_from(ncs.framed_len(data.len() as u64)).unwrap_or(0));
    let mut h = BlockHasher::new(ncs.kind);
    let bs = usize::try_from(ncs.block_size).unwrap_or(usize::MAX);
    for block in data.chunks(bs) {
        h.update(block);
        out.extend_from_slice(block);
        out.extend_from_slice(h.finish_hex().as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_the_standard_known_answers() {
        let hex = |kind| {
            let mut h = BlockHasher::new(kind);
            h.update(b"abc");
            h.finish_hex()
        };
        assert_eq!(
            hex(ChksumType::Sha256),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(ChksumType::Sha1),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert!(hex(ChksumType::Sha512).starts_with("ddaf35a193617aba"));
        assert_eq!(hex(ChksumType::Md5), "900150983cd24fb0d6963f7d28e17f72");
        for k in [
            ChksumType::Sha256,
            ChksumType::Sha512,
            ChksumType::Sha1,
            ChksumType::Md5,
        ] {
            assert_eq!(hex(k).len(), k.hex_len());
            assert_eq!(ChksumType::from_number(k.number()), Some(k));
        }
        assert_eq!(ChksumType::from_number(0), None);
    }

    #[test]
    fn frames_put_a_digest_of_each_block_after_it() {
        let ncs = NetChksum {
            kind: ChksumType::Md5,
            block_size: 3,
        };
        let f = frame(&ncs, b"abcdefgh");
        assert_eq!(f.len() as u64, ncs.framed_len(8));
        assert_eq!(&f[..3], b"abc");
        assert_eq!(&f[3..35], b"900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(&f[35..38], b"def");
        assert_eq!(&f[70..72], b"gh");
        assert!(frame(&ncs, b"").is_empty());
        assert_eq!(ncs.framed_len(0), 0);
    }
}
