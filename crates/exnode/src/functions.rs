//! End-to-end functions: what a client does to each block's bytes before they
//! leave it, and undoes after they come back (`docs/exnode.md` §Functions).
//!
//! A mapping's data is cut into e2e blocks of `e2e_blocksize` bytes, each
//! encoded on its own by the chain's steps in order (compress, encrypt,
//! checksum); the stored bytes are the encoded blocks back to back. Chains
//! with compression prefix each encoded block with its length (u32, little
//! endian); others have a fixed overhead per block, so their layout is exactly
//! the original LoRS one for the `checksum` (MD5) step.
//!
//! Decoding detects corruption (checksum mismatch, failed AEAD tag, bad
//! frame) and never inflates a block beyond its logical size.

use std::borrow::Cow;
use std::ops::Range;

use aes_gcm::aead::{Aead, KeyInit};

use crate::model::{Function, Mapping, Metadata, Value};

pub mod legacy;
pub mod lors_md5;

pub use legacy::{LegacyChain, LegacyKind};

/// Largest encoded mapping (stored or logical bytes) we decode. Encoded
/// mappings are fetched and decoded whole in memory, so a hostile exNode must
/// not be able to ask for more; LoRS data blocks are a few MiB.
pub const MAX_ENCODED_MAPPING: u64 = 1 << 30;

/// Mapping metadata holding the BLAKE3 digest (64 hex digits) of the
/// mapping's stored bytes. Written beside a LoRS `checksum` chain, whose
/// digest alone misses some corruption ([`Codec::needs_stored_digest`]);
/// checked by [`Codec::decode_mapping`]. LoRS tools ignore it.
pub const STORED_BLAKE3: &str = "stored_blake3";

/// The [`STORED_BLAKE3`] metadata item for a mapping's stored bytes.
pub fn stored_digest(stored: &[u8]) -> Metadata {
    Metadata::string(STORED_BLAKE3, &hex(blake3::hash(stored).as_bytes()))
}

/// Largest e2e block size accepted.
pub const MAX_E2E_BLOCK: u64 = 256 << 20;

/// Bytes of nonce stored in front of each encrypted block.
pub const NONCE_BYTES: usize = 12;
/// Bytes of AEAD tag after each encrypted block.
pub const TAG_BYTES: usize = 16;

/// One transformation.
#[derive(Clone, PartialEq, Eq)]
pub enum Step {
    /// BLAKE3 of the block appended (`blake3_checksum`).
    Blake3,
    /// The original LoRS `checksum`: 32 hex digits of the block's MD5 as
    /// LoRS 0.82 computes it on 64-bit hosts ([`lors_md5::LorsMd5`]), `:`,
    /// the block. Readers accept standard MD5 digests too.
    Md5,
    /// The same format with standard MD5 (RFC 1321) digests, as 32-bit LoRS
    /// builds and earlier versions of this tool wrote. Written by name only
    /// (`-k md5-rfc1321`); an exNode records both as `checksum`.
    Md5Rfc1321,
    /// zstd compression (`zstd_compress`).
    Zstd {
        /// Compression level (1–19).
        level: i32,
    },
    /// AES-256-GCM with a random nonce per block (`aes256gcm_encrypt`).
    Aes256Gcm {
        /// The key, kept in the exNode.
        key: [u8; 32],
    },
    /// ChaCha20-Poly1305 with a random nonce per block (`chacha20poly1305_encrypt`).
    ChaCha20Poly1305 {
        /// The key, kept in the exNode.
        key: [u8; 32],
    },
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are secrets: never in Debug output.
        f.write_str(match self {
            Step::Blake3 => "Blake3",
            Step::Md5 => "Md5",
            Step::Md5Rfc1321 => "Md5Rfc1321",
            Step::Zstd { .. } => "Zstd",
            Step::Aes256Gcm { .. } => "Aes256Gcm(key redacted)",
            Step::ChaCha20Poly1305 { .. } => "ChaCha20Poly1305(key redacted)",
        })
    }
}

impl Step {
    /// The function name in the exNode.
    pub fn name(&self) -> &'static str {
        match self {
            Step::Blake3 => "blake3_checksum",
            Step::Md5 | Step::Md5Rfc1321 => "checksum",
            Step::Zstd { .. } => "zstd_compress",
            Step::Aes256Gcm { .. } => "aes256gcm_encrypt",
            Step::ChaCha20Poly1305 { .. } => "chacha20poly1305_encrypt",
        }
    }

    /// Fixed bytes added per block, or `None` when the size varies.
    fn overhead(&self) -> Option<u64> {
        match self {
            Step::Blake3 => Some(32),
            Step::Md5 | Step::Md5Rfc1321 => Some(33),
            Step::Zstd { .. } => None,
            Step::Aes256Gcm { .. } | Step::ChaCha20Poly1305 { .. } => {
                Some((NONCE_BYTES + TAG_BYTES) as u64)
            }
        }
    }

    /// Whether the step only checks the bytes (they are stored as they are).
    fn is_checksum(&self) -> bool {
        matches!(self, Step::Blake3 | Step::Md5 | Step::Md5Rfc1321)
    }

    /// For a checksum step: checks block `index`'s bytes `cur` and returns
    /// where in them the data lies. `None` for a step that transforms.
    fn check(&self, index: u64, cur: &[u8]) -> Result<Option<Range<usize>>, E2eError> {
        let corrupt = |what| E2eError::Corrupt { block: index, what };
        match self {
            Step::Blake3 => {
                let n = cur.len().checked_sub(32).ok_or(corrupt("short block"))?;
                if blake3::hash(&cur[..n]).as_bytes()[..] != cur[n..] {
                    return Err(corrupt("BLAKE3 checksum mismatch"));
                }
                Ok(Some(0..n))
            }
            Step::Md5 | Step::Md5Rfc1321 => {
                if cur.len() < 33 || cur[32] != b':' {
                    return Err(corrupt("malformed MD5 checksum header"));
                }
                if !lors_md5::matches(&cur[..32], &cur[33..]) {
                    return Err(corrupt("MD5 checksum mismatch"));
                }
                Ok(Some(33..cur.len()))
            }
            _ => Ok(None),
        }
    }

    /// A fresh random 256-bit key for a cipher step.
    pub fn random_key() -> std::io::Result<[u8; 32]> {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(k)
    }
}

/// Why stored bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum E2eError {
    /// The bytes are damaged (checksum, tag or frame mismatch).
    #[error("block {block} is corrupted: {what}")]
    Corrupt {
        /// e2e block index within the mapping.
        block: u64,
        /// What failed.
        what: &'static str,
    },
    /// A function this version cannot undo.
    #[error("end-to-end function {0:?} is not supported")]
    Unsupported(String),
    /// The function description in the exNode is malformed.
    #[error("malformed function description: {0}")]
    Malformed(&'static str),
}

/// A chain of steps in the order they are applied at upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// Logical bytes per e2e block.
    pub block_size: u64,
    /// Steps, first applied first.
    pub steps: Vec<Step>,
}

fn random_nonce() -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    // The OS CSPRNG does not fail on Linux after boot; if it ever did, a
    // counter-free zero nonce would be catastrophic, so stop instead.
    getrandom::fill(&mut n).expect("OS random source available");
    n
}

use lors_ibp::hex::{decode as unhex, encode as hex};

/// The `r` part of `cur`, without a copy when it is borrowed.
fn narrow(cur: Cow<'_, [u8]>, r: Range<usize>) -> Cow<'_, [u8]> {
    match cur {
        Cow::Borrowed(b) => Cow::Borrowed(&b[r]),
        Cow::Owned(mut v) => {
            v.truncate(r.end);
            v.drain(..r.start);
            Cow::Owned(v)
        }
    }
}

impl Chain {
    fn framed(&self) -> bool {
        self.steps.iter().any(|s| s.overhead().is_none())
    }

    fn encode_block(&self, data: &[u8]) -> Vec<u8> {
        let mut cur = data.to_vec();
        for s in &self.steps {
            cur = match s {
                Step::Blake3 => {
                    let h = blake3::hash(&cur);
                    cur.extend_from_slice(h.as_bytes());
                    cur
                }
                Step::Md5 | Step::Md5Rfc1321 => {
                    let variant = if *s == Step::Md5 {
                        lors_md5::Md5Variant::Lors64
                    } else {
                        lors_md5::Md5Variant::Rfc1321
                    };
                    let mut out = variant.hex_digest(&cur).into_bytes();
                    out.push(b':');
                    out.extend_from_slice(&cur);
                    out
                }
                Step::Zstd { level } => {
                    zstd::bulk::compress(&cur, *level).expect("in-memory compression does not fail")
                }
                Step::Aes256Gcm { key } => seal(&aes_gcm::Aes256Gcm::new(key.into()), &cur),
                Step::ChaCha20Poly1305 { key } => {
                    seal(&chacha20poly1305::ChaCha20Poly1305::new(key.into()), &cur)
                }
            };
        }
        cur
    }

    /// Encodes a mapping's data.
    pub fn encode(&self, data: &[u8]) -> Vec<u8> {
        let bs = usize::try_from(self.block_size.max(1)).unwrap_or(usize::MAX);
        let mut out = Vec::with_capacity(data.len() + data.len() / bs * 64 + 64);
        for block in data.chunks(bs) {
            let enc = self.encode_block(block);
            if self.framed() {
                out.extend_from_slice(
                    &u32::try_from(enc.len())
                        .expect("block fits u32")
                        .to_le_bytes(),
                );
            }
            out.extend_from_slice(&enc);
        }
        out
    }

    /// Decodes block `index` onto the end of `out`. Checksums are checked
    /// in place: a chain of checksums alone copies each byte once.
    fn decode_block_into(
        &self,
        index: u64,
        stored: &[u8],
        logical: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), E2eError> {
        let corrupt = |what| E2eError::Corrupt { block: index, what };
        let mut cur = Cow::Borrowed(stored);
        for s in self.steps.iter().rev() {
            if let Some(r) = s.check(index, &cur)? {
                cur = narrow(cur, r);
                continue;
            }
            cur = match s {
                Step::Zstd { .. } => {
                    let out = zstd::bulk::decompress(&cur, logical)
                        .map_err(|_| corrupt("zstd data is invalid"))?;
                    if out.len() != logical {
                        return Err(corrupt("decompressed size differs"));
                    }
                    Cow::Owned(out)
                }
                Step::Aes256Gcm { key } => Cow::Owned(
                    open(&aes_gcm::Aes256Gcm::new(key.into()), &cur)
                        .ok_or(corrupt("AES-GCM authentication failed"))?,
                ),
                Step::ChaCha20Poly1305 { key } => Cow::Owned(
                    open(&chacha20poly1305::ChaCha20Poly1305::new(key.into()), &cur)
                        .ok_or(corrupt("ChaCha20-Poly1305 authentication failed"))?,
                ),
                Step::Blake3 | Step::Md5 | Step::Md5Rfc1321 => unreachable!("checked above"),
            };
        }
        if cur.len() != logical {
            return Err(corrupt("decoded size differs"));
        }
        out.extend_from_slice(&cur);
        Ok(())
    }

    /// Decodes a mapping's stored bytes back to its `logical_len` bytes.
    pub fn decode(&self, stored: &[u8], logical_len: u64) -> Result<Vec<u8>, E2eError> {
        let mut out = Vec::new();
        self.decode_into(stored, logical_len, &mut out)?;
        Ok(out)
    }

    /// [`Chain::decode`] into `out` (cleared first), whose capacity a caller
    /// decoding many mappings reuses.
    pub fn decode_into(
        &self,
        stored: &[u8],
        logical_len: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), E2eError> {
        self.decode_blocks_into(stored, 0, logical_len, out)
    }

    /// Decodes the stored bytes of consecutive blocks, the first being
    /// block `first` of its mapping (what errors name), into their
    /// `logical_len` bytes.
    fn decode_blocks_into(
        &self,
        stored: &[u8],
        first: u64,
        logical_len: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), E2eError> {
        let bs = self.block_size.max(1);
        let n_blocks = logical_len.div_ceil(bs);
        out.clear();
        out.reserve(usize::try_from(logical_len.min(MAX_ENCODED_MAPPING)).unwrap_or(0));
        let mut pos = 0usize;
        let fixed: u64 = self.steps.iter().filter_map(Step::overhead).sum();
        for i in 0..n_blocks {
            let logical = usize::try_from((logical_len - i * bs).min(bs))
                .map_err(|_| E2eError::Malformed("block size"))?;
            let len = if self.framed() {
                let hdr = stored.get(pos..pos + 4).ok_or(E2eError::Corrupt {
                    block: first + i,
                    what: "truncated frame",
                })?;
                pos += 4;
                u32::from_le_bytes(hdr.try_into().expect("4 bytes")) as usize
            } else {
                logical + usize::try_from(fixed).map_err(|_| E2eError::Malformed("overhead"))?
            };
            let end = pos.checked_add(len).ok_or(E2eError::Corrupt {
                block: first + i,
                what: "frame length",
            })?;
            let block = stored.get(pos..end).ok_or(E2eError::Corrupt {
                block: first + i,
                what: "truncated data",
            })?;
            self.decode_block_into(first + i, block, logical, out)?;
            pos = end;
        }
        if pos != stored.len() {
            return Err(E2eError::Corrupt {
                block: first + n_blocks,
                what: "trailing bytes",
            });
        }
        Ok(())
    }

    /// The exNode function element for this chain: the last step applied is
    /// the outermost function, earlier ones nest inside.
    pub fn to_function(&self) -> Option<Function> {
        let mut inner: Option<Function> = None;
        let mut size = self.block_size;
        for s in &self.steps {
            let mut args = Vec::new();
            match s {
                Step::Aes256Gcm { key } | Step::ChaCha20Poly1305 { key } => {
                    args.push(Metadata::string("KEY", &hex(key)))
                }
                Step::Zstd { level } => args.push(Metadata::integer("level", i64::from(*level))),
                _ => {}
            }
            if let Some(o) = s.overhead() {
                size += o;
            }
            // As LoRS does: blocksize = this step's output block size (fixed steps).
            if s.overhead().is_some() && !self.framed() {
                args.push(Metadata::integer(
                    "blocksize",
                    i64::try_from(size).unwrap_or(i64::MAX),
                ));
            }
            inner = Some(Function {
                name: s.name().into(),
                metadata: vec![],
                arguments: args,
                inner: inner.into_iter().collect(),
            });
        }
        inner
    }

    /// The chain a mapping records, if any.
    pub fn from_mapping(m: &Mapping) -> Result<Option<Chain>, E2eError> {
        let Some(f) = &m.function else {
            return Ok(None);
        };
        if f.name == "identity" && f.inner.is_empty() {
            return Ok(None);
        }
        let mut steps = Vec::new();
        for func in f.chain().into_iter().rev() {
            let key = || -> Result<[u8; 32], E2eError> {
                match func.argument("KEY") {
                    Some(Value::String(k)) => unhex(k)
                        .and_then(|v| <[u8; 32]>::try_from(v).ok())
                        .ok_or(E2eError::Malformed("KEY must be 64 hex digits")),
                    _ => Err(E2eError::Malformed("cipher without KEY")),
                }
            };
            steps.push(match func.name.as_str() {
                "blake3_checksum" => Step::Blake3,
                "checksum" => Step::Md5,
                "zstd_compress" => Step::Zstd { level: 3 },
                "aes256gcm_encrypt" => Step::Aes256Gcm { key: key()? },
                "chacha20poly1305_encrypt" => Step::ChaCha20Poly1305 { key: key()? },
                "identity" => continue,
                other => return Err(E2eError::Unsupported(other.to_owned())),
            });
        }
        if m.e2e_blocksize == 0 {
            return Err(E2eError::Malformed("function without e2e_blocksize"));
        }
        if m.e2e_blocksize > MAX_E2E_BLOCK {
            return Err(E2eError::Malformed("e2e_blocksize over 256 MiB"));
        }
        Ok(Some(Chain {
            block_size: m.e2e_blocksize,
            steps,
        }))
    }
}

/// How a mapping's bytes are encoded: our per-block chain or a chain of the
/// original LoRS functions ([`legacy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Codec {
    /// Our functions (and the LoRS `checksum` alone, which fits both).
    Native(Chain),
    /// The LoRS `xor_encrypt` / `aes_encrypt` / `zlib_compress` family.
    Legacy(LegacyChain),
}

impl Codec {
    /// The codec a mapping records, if any.
    ///
    /// ```
    /// use lors_exnode::functions::{Codec, Chain, Step};
    /// use lors_exnode::Mapping;
    /// let chain = Chain { block_size: 4, steps: vec![Step::Md5] };
    /// let m = Mapping { e2e_blocksize: 4, function: chain.to_function(), ..Mapping::default() };
    /// assert_eq!(Codec::from_mapping(&m).unwrap(), Some(Codec::Native(chain)));
    /// ```
    pub fn from_mapping(m: &Mapping) -> Result<Option<Codec>, E2eError> {
        let Some(f) = &m.function else {
            return Ok(None);
        };
        if f.chain()
            .iter()
            .any(|g| LegacyKind::is_legacy_name(&g.name))
        {
            return LegacyChain::from_function(f, m.e2e_blocksize).map(|c| Some(Codec::Legacy(c)));
        }
        Ok(Chain::from_mapping(m)?.map(Codec::Native))
    }

    /// Whether the chain's only integrity check is the LoRS `checksum`
    /// (no BLAKE3 step, no AEAD tag). Its MD5 as LoRS 0.82 computes it on
    /// 64-bit hosts misses some single-bit flips (the 64-bit rotation ORs
    /// bits together), so writers record [`STORED_BLAKE3`] beside it.
    pub fn needs_stored_digest(&self) -> bool {
        match self {
            Codec::Native(c) => {
                c.steps
                    .iter()
                    .any(|s| matches!(s, Step::Md5 | Step::Md5Rfc1321))
                    && !c.steps.iter().any(|s| {
                        matches!(
                            s,
                            Step::Blake3 | Step::Aes256Gcm { .. } | Step::ChaCha20Poly1305 { .. }
                        )
                    })
            }
            Codec::Legacy(c) => c.steps.iter().any(|s| s.kind == LegacyKind::Checksum),
        }
    }

    /// Decodes a mapping's stored bytes as [`Codec::decode`] does, after
    /// checking them against the mapping's [`STORED_BLAKE3`] digest when it
    /// records one. What downloads call.
    ///
    /// ```
    /// use lors_exnode::functions::{stored_digest, Chain, Codec, Step};
    /// use lors_exnode::Mapping;
    /// let codec = Codec::Native(Chain { block_size: 8, steps: vec![Step::Md5] });
    /// let (mut stored, function) = codec.encode(b"telescope").unwrap();
    /// let m = Mapping { logical_length: 9, e2e_blocksize: 8, function,
    ///                   metadata: vec![stored_digest(&stored)], ..Mapping::default() };
    /// assert_eq!(codec.decode_mapping(&m, &stored).unwrap(), b"telescope");
    /// stored[40] ^= 1;
    /// assert!(codec.decode_mapping(&m, &stored).is_err());
    /// ```
    pub fn decode_mapping(&self, m: &Mapping, stored: &[u8]) -> Result<Vec<u8>, E2eError> {
        let mut out = Vec::new();
        self.decode_mapping_into(m, stored, &mut out)?;
        Ok(out)
    }

    /// [`Codec::decode_mapping`] into `out`, whose capacity is reused where
    /// the codec allows (native chains).
    pub fn decode_mapping_into(
        &self,
        m: &Mapping,
        stored: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), E2eError> {
        Self::check_stored_digest(m, stored)?;
        self.decode_into(stored, m.logical_length, out)
    }

    /// Checks a mapping's stored bytes against its [`STORED_BLAKE3`]
    /// digest, when it records one (a malformed digest is an error, never
    /// a pass).
    pub fn check_stored_digest(m: &Mapping, stored: &[u8]) -> Result<(), E2eError> {
        if let Some(v) = m.metadata.iter().find(|x| x.name == STORED_BLAKE3) {
            let want = match &v.value {
                Value::String(h) => unhex(h).filter(|d| d.len() == 32),
                _ => None,
            }
            .ok_or(E2eError::Malformed("stored_blake3 must be 64 hex digits"))?;
            if blake3::hash(stored).as_bytes()[..] != want[..] {
                return Err(E2eError::Corrupt {
                    block: 0,
                    what: "stored bytes do not match the mapping's BLAKE3 digest",
                });
            }
        }
        Ok(())
    }

    /// Encodes a mapping's data; returns the stored bytes and the function
    /// element to record (LoRS zlib's block size depends on the data).
    pub fn encode(&self, data: &[u8]) -> Result<(Vec<u8>, Option<Function>), E2eError> {
        match self {
            Codec::Native(c) => Ok((c.encode(data), c.to_function())),
            Codec::Legacy(c) => c.encode(data).map(|(b, rec)| (b, rec.to_function())),
        }
    }

    /// Decodes a mapping's stored bytes back to its `logical_len` bytes
    /// (each at most [`MAX_ENCODED_MAPPING`]).
    pub fn decode(&self, stored: &[u8], logical_len: u64) -> Result<Vec<u8>, E2eError> {
        let mut out = Vec::new();
        self.decode_into(stored, logical_len, &mut out)?;
        Ok(out)
    }

    /// [`Codec::decode`] into `out`, reusing its capacity for native chains.
    pub fn decode_into(
        &self,
        stored: &[u8],
        logical_len: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), E2eError> {
        if logical_len > MAX_ENCODED_MAPPING || stored.len() as u64 > MAX_ENCODED_MAPPING {
            return Err(E2eError::Malformed("encoded mapping larger than 1 GiB"));
        }
        match self {
            Codec::Native(c) => c.decode_into(stored, logical_len, out),
            Codec::Legacy(c) => {
                *out = c.decode(stored, logical_len)?;
                Ok(())
            }
        }
    }

    /// The `e2e_blocksize` mapping metadata.
    pub fn e2e_blocksize(&self) -> u64 {
        match self {
            Codec::Native(c) => c.block_size,
            Codec::Legacy(c) => c.e2e_blocksize,
        }
    }

    /// The stored length of `logical` bytes, when it follows from the
    /// length alone: a native chain of fixed overhead per e2e block (no
    /// compression, whose output depends on the data).
    pub fn stored_len(&self, logical: u64) -> Option<u64> {
        let Codec::Native(c) = self else { return None };
        if c.framed() {
            return None;
        }
        let overhead: u64 = c.steps.iter().filter_map(Step::overhead).sum();
        logical
            .div_ceil(c.block_size.max(1))
            .checked_mul(overhead)?
            .checked_add(logical)
    }

    /// The chain, when `m`'s blocks can be read and checked a few at a time:
    /// a native chain of fixed overhead per block (no compression), stored
    /// bytes adding up to what that layout gives, and no digest of the
    /// mapping's stored bytes as a whole ([`STORED_BLAKE3`]).
    fn sliceable(&self, m: &Mapping) -> Option<(&Chain, u64)> {
        let Codec::Native(c) = self else { return None };
        if c.framed() || m.metadata.iter().any(|x| x.name == STORED_BLAKE3) {
            return None;
        }
        let bs = c.block_size.max(1);
        let overhead: u64 = c.steps.iter().filter_map(Step::overhead).sum();
        let stored = m
            .logical_length
            .div_ceil(bs)
            .checked_mul(overhead)?
            .checked_add(m.logical_length)?;
        (stored == m.alloc_length).then_some((c, overhead))
    }

    /// Whether [`Codec::slice`] can cut `m` into parts read on their own.
    pub fn is_sliceable(&self, m: &Mapping) -> bool {
        self.sliceable(m).is_some()
    }

    /// The whole e2e blocks that hold logical bytes `start..start + len` of
    /// mapping `m` (offsets within the mapping), when its layout lets them be
    /// read and verified without the rest of the mapping
    /// ([`Codec::is_sliceable`]); `None` otherwise, or for a range outside
    /// the mapping.
    ///
    /// ```
    /// use lors_exnode::functions::{Chain, Codec, Step};
    /// use lors_exnode::Mapping;
    /// let codec = Codec::Native(Chain { block_size: 4, steps: vec![Step::Blake3] });
    /// let data = b"0123456789";
    /// let (stored, function) = codec.encode(data).unwrap();
    /// let m = Mapping { logical_length: 10, alloc_length: stored.len() as u64,
    ///                   e2e_blocksize: 4, function, ..Mapping::default() };
    /// let s = codec.slice(&m, 5, 2).unwrap(); // in block 1, bytes 4..8
    /// assert_eq!((s.stored.start, s.stored.end, s.logical.start), (36, 72, 4));
    /// let part = &stored[s.stored.start as usize..s.stored.end as usize];
    /// assert_eq!(codec.decode_slice(&s, part).unwrap(), b"4567");
    /// ```
    pub fn slice(&self, m: &Mapping, start: u64, len: u64) -> Option<Slice> {
        let (c, overhead) = self.sliceable(m)?;
        let end = start
            .checked_add(len)
            .filter(|&e| len > 0 && e <= m.logical_length)?;
        let bs = c.block_size.max(1);
        let (first, last) = (start / bs, (end - 1) / bs);
        let logical = first * bs..(end.div_ceil(bs) * bs).min(m.logical_length);
        let stored =
            first * (bs + overhead)..last * (bs + overhead) + (logical.end - last * bs) + overhead;
        Some(Slice {
            stored,
            logical,
            first_block: first,
        })
    }

    /// For a chain of checksums alone, whose stored blocks hold the data
    /// as it is: checks the stored bytes [`Codec::slice`] named and returns
    /// where in them `slice.logical`'s bytes lie, in order, so they can be
    /// written out without a copy. `Ok(None)` for a chain that transforms
    /// the bytes ([`Codec::decode_slice`] then).
    ///
    /// ```
    /// use lors_exnode::functions::{Chain, Codec, Step};
    /// use lors_exnode::Mapping;
    /// let codec = Codec::Native(Chain { block_size: 4, steps: vec![Step::Blake3] });
    /// let (stored, function) = codec.encode(b"0123456789").unwrap();
    /// let m = Mapping { logical_length: 10, alloc_length: stored.len() as u64,
    ///                   e2e_blocksize: 4, function, ..Mapping::default() };
    /// let s = codec.slice(&m, 0, 10).unwrap();
    /// let parts = codec.check_slice(&s, &stored).unwrap().unwrap();
    /// let data: Vec<u8> = parts.iter().flat_map(|r| stored[r.clone()].to_vec()).collect();
    /// assert_eq!(data, b"0123456789");
    /// ```
    pub fn check_slice(
        &self,
        slice: &Slice,
        stored: &[u8],
    ) -> Result<Option<Vec<Range<usize>>>, E2eError> {
        let Codec::Native(c) = self else {
            return Ok(None);
        };
        if !c.steps.iter().all(Step::is_checksum) {
            return Ok(None);
        }
        let truncated = |block| E2eError::Corrupt {
            block,
            what: "truncated data",
        };
        if stored.len() as u64 != slice.stored.end - slice.stored.start {
            return Err(truncated(slice.first_block));
        }
        let bs = c.block_size.max(1);
        let overhead: u64 = c.steps.iter().filter_map(Step::overhead).sum();
        let mut parts = Vec::new();
        let (mut at, mut logical) = (0usize, slice.logical.start);
        while logical < slice.logical.end {
            let index = logical / bs;
            let n = (slice.logical.end - logical).min(bs);
            let len =
                usize::try_from(n + overhead).map_err(|_| E2eError::Malformed("block size"))?;
            let mut r = at..at + len;
            for s in c.steps.iter().rev() {
                let block = stored.get(r.clone()).ok_or(truncated(index))?;
                let inner = s.check(index, block)?.expect("a checksum step");
                r = r.start + inner.start..r.start + inner.end;
            }
            if r.len() as u64 != n {
                return Err(E2eError::Corrupt {
                    block: index,
                    what: "decoded size differs",
                });
            }
            parts.push(r);
            at += len;
            logical += n;
        }
        Ok(Some(parts))
    }

    /// Decodes the stored bytes [`Codec::slice`] named into
    /// `slice.logical`'s bytes.
    pub fn decode_slice(&self, slice: &Slice, stored: &[u8]) -> Result<Vec<u8>, E2eError> {
        let mut out = Vec::new();
        self.decode_slice_into(slice, stored, &mut out)?;
        Ok(out)
    }

    /// [`Codec::decode_slice`] into `out`, reusing its capacity.
    pub fn decode_slice_into(
        &self,
        slice: &Slice,
        stored: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), E2eError> {
        let Codec::Native(c) = self else {
            return Err(E2eError::Malformed("only native chains are read in slices"));
        };
        if stored.len() as u64 != slice.stored.end - slice.stored.start {
            return Err(E2eError::Corrupt {
                block: slice.first_block,
                what: "truncated data",
            });
        }
        let logical = slice.logical.end - slice.logical.start;
        c.decode_blocks_into(stored, slice.first_block, logical, out)
    }
}

/// Consecutive whole e2e blocks of a mapping: where they are stored and
/// the logical bytes they decode to, both as offsets within the mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// Stored bytes, from the allocation's start (the mapping's
    /// `alloc_offset`).
    pub stored: Range<u64>,
    /// Logical bytes, from the mapping's start.
    pub logical: Range<u64>,
    /// Index of the first block in the mapping.
    pub first_block: u64,
}

fn seal<C: Aead>(cipher: &C, data: &[u8]) -> Vec<u8> {
    let nonce = random_nonce();
    let ct = cipher
        .encrypt(
            aes_gcm::aead::generic_array::GenericArray::from_slice(&nonce),
            data,
        )
        .expect("in-memory encryption does not fail");
    let mut out = Vec::with_capacity(NONCE_BYTES + ct.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    out
}

fn open<C: Aead>(cipher: &C, stored: &[u8]) -> Option<Vec<u8>> {
    if stored.len() < NONCE_BYTES + TAG_BYTES {
        return None;
    }
    let (n, ct) = stored.split_at(NONCE_BYTES);
    cipher
        .decrypt(
            aes_gcm::aead::generic_array::GenericArray::from_slice(n),
            ct,
        )
        .ok()
}
