//! The end-to-end functions of the original LoRS tools (`libe2e`), so exNodes
//! that `lors_upload` wrote with `-k`, `-x`, `-a` or `-z` can be downloaded.
//!
//! LoRS applies each function to a whole mapping's bytes. A function cuts its
//! input into blocks of its *input* block size (the previous function's output
//! block size, the e2e block size for the first one), transforms each, and
//! records its *output* block size as the `blocksize` argument. A reader undoes
//! the outermost function first, cutting the stored bytes by that argument.
//! The byte formats, as `libe2e/e2e.c` produces them:
//!
//! * `checksum`: per block, 32 lowercase hex digits of the block's MD5, `:`,
//!   the block. Output block = input block + 33. "MD5" is what LoRS computes
//!   on a 64-bit host (`lors_md5`), which is what we write; we accept
//!   standard MD5 digests too.
//! * `xor_encrypt`: per block, bytes at even offsets XORed with the last
//!   character of `KEY`, odd offsets left as they are (an old indexing bug
//!   that LoRS keeps "for compatibility"; odd offsets meet the key's NUL
//!   terminator). Same size.
//! * `aes_encrypt`: AES-128 (`KEY` = 32 hex digits), input block size rounded
//!   up to 16. Each block is stored as a 16-byte IV then CBC ciphertext with
//!   ciphertext stealing, so exactly 16 bytes longer than its plaintext;
//!   blocks of at most 16 bytes are stored as the first `n` IV bytes followed
//!   by one encrypted block.
//! * `zlib_compress`: the whole mapping, stored as its length in 12 zero-padded
//!   decimal digits, `:`, then a zlib stream (RFC 1950). Output block = all of it.
//!
//! `des_encrypt` is not supported: DES in LoRS is broken on 64-bit hosts, so
//! such exNodes cannot be read by the original tools either.
//!
//! None of these (except `checksum`) authenticate: a tampered XOR or AES block
//! decrypts to garbage without an error. LoRS puts `checksum` outermost by
//! default, which catches it; our own uploads use the AEAD ciphers instead.

use std::io::Read as _;

use super::lors_md5::Md5Variant;
use super::{E2eError, hex, unhex};
use crate::model::{Function, Metadata, Value};
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit, generic_array::GenericArray};

/// Bytes of the MD5 `checksum` header (`32 hex digits` + `:`).
pub const CHECKSUM_HEADER: u64 = 33;
/// Bytes of the zlib length header (`12 digits` + `:`).
pub const ZLIB_HEADER: u64 = 13;
const AES_BLOCK: usize = 16;

/// One LoRS function with the block size it recorded.
#[derive(Clone, PartialEq, Eq)]
pub struct LegacyStep {
    /// What the function does.
    pub kind: LegacyKind,
    /// The function's `blocksize` argument: its output block size.
    pub blocksize: u64,
}

/// The LoRS function kinds we can undo (and, for tests and compatibility, do).
#[derive(Clone, PartialEq, Eq)]
pub enum LegacyKind {
    /// `checksum` (MD5 per block).
    Checksum,
    /// `xor_encrypt` with its `KEY` string.
    Xor {
        /// The key characters (LoRS generates 7 printable ones).
        key: Vec<u8>,
    },
    /// `aes_encrypt` (AES-128-CBC with ciphertext stealing, IV per block).
    Aes {
        /// The 16-byte key (32 hex digits in the exNode).
        key: [u8; 16],
    },
    /// `zlib_compress` of the whole mapping.
    Zlib,
}

impl std::fmt::Debug for LegacyStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys stay out of logs.
        let name = match self.kind {
            LegacyKind::Checksum => "checksum",
            LegacyKind::Xor { .. } => "xor_encrypt(key redacted)",
            LegacyKind::Aes { .. } => "aes_encrypt(key redacted)",
            LegacyKind::Zlib => "zlib_compress",
        };
        write!(f, "{name}/{}", self.blocksize)
    }
}

impl LegacyKind {
    fn name(&self) -> &'static str {
        match self {
            LegacyKind::Checksum => "checksum",
            LegacyKind::Xor { .. } => "xor_encrypt",
            LegacyKind::Aes { .. } => "aes_encrypt",
            LegacyKind::Zlib => "zlib_compress",
        }
    }

    /// The names this module handles (a mapping using any of them beyond
    /// `checksum` is decoded here).
    pub fn is_legacy_name(name: &str) -> bool {
        matches!(
            name,
            "xor_encrypt" | "aes_encrypt" | "zlib_compress" | "des_encrypt"
        )
    }
}

/// A LoRS function chain, in the order the functions were applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyChain {
    /// The e2e block size the first function cut its input by.
    pub e2e_blocksize: u64,
    /// Steps, first applied first.
    pub steps: Vec<LegacyStep>,
}

fn to_usize(v: u64, what: &'static str) -> Result<usize, E2eError> {
    usize::try_from(v).map_err(|_| E2eError::Malformed(what))
}

/// Cuts `data` into blocks of `bs` the way `block_length_count` does: full
/// blocks, then one last block of 1..=bs bytes (none for empty input).
fn blocks(data: &[u8], bs: usize) -> std::slice::Chunks<'_, u8> {
    data.chunks(bs.max(1))
}

fn round16(v: u64) -> u64 {
    v.div_ceil(AES_BLOCK as u64) * AES_BLOCK as u64
}

impl LegacyChain {
    /// Builds the chain the function elements of a mapping describe.
    pub fn from_function(f: &Function, e2e_blocksize: u64) -> Result<LegacyChain, E2eError> {
        let mut steps = Vec::new();
        for func in f.chain().into_iter().rev() {
            let blocksize = match func.argument("blocksize") {
                Some(Value::Integer(n)) if *n > 0 => *n as u64,
                _ if func.name == "identity" => continue,
                _ => return Err(E2eError::Malformed("LoRS function without a blocksize")),
            };
            let key_text = || match func.argument("KEY") {
                Some(Value::String(k)) if !k.is_empty() => Ok(k.as_str()),
                _ => Err(E2eError::Malformed("LoRS cipher without KEY")),
            };
            let kind = match func.name.as_str() {
                "checksum" => LegacyKind::Checksum,
                "xor_encrypt" => LegacyKind::Xor {
                    key: key_text()?.as_bytes().to_vec(),
                },
                "aes_encrypt" => LegacyKind::Aes {
                    key: unhex(key_text()?)
                        .and_then(|v| <[u8; 16]>::try_from(v).ok())
                        .ok_or(E2eError::Malformed("aes_encrypt KEY must be 32 hex digits"))?,
                },
                "zlib_compress" => LegacyKind::Zlib,
                "identity" => continue,
                "des_encrypt" => {
                    return Err(E2eError::Unsupported(
                        "des_encrypt (LoRS DES is broken on 64-bit hosts; not readable)".into(),
                    ));
                }
                other => return Err(E2eError::Unsupported(other.to_owned())),
            };
            steps.push(LegacyStep { kind, blocksize });
        }
        if steps.iter().filter(|s| s.kind == LegacyKind::Zlib).count() > 1 {
            return Err(E2eError::Unsupported("zlib_compress applied twice".into()));
        }
        Ok(LegacyChain {
            e2e_blocksize,
            steps,
        })
    }

    /// A chain applying `kinds` in order from an e2e block size, with each
    /// step's block size derived as LoRS derives it. `Zlib`'s block size is
    /// known only after encoding; [`LegacyChain::encode`] returns the chain
    /// with the real values.
    pub fn new(e2e_blocksize: u64, kinds: Vec<LegacyKind>) -> LegacyChain {
        LegacyChain {
            e2e_blocksize,
            steps: kinds
                .into_iter()
                .map(|kind| LegacyStep { kind, blocksize: 0 })
                .collect(),
        }
    }

    /// Encodes a mapping's data as `lors_upload` would; returns the stored
    /// bytes and the chain with every step's recorded block size.
    pub fn encode(&self, data: &[u8]) -> Result<(Vec<u8>, LegacyChain), E2eError> {
        let mut cur = data.to_vec();
        let mut in_bs = self.e2e_blocksize.max(1);
        let mut steps = Vec::with_capacity(self.steps.len());
        for s in &self.steps {
            let bs = to_usize(in_bs, "block size")?;
            let (next, out_bs) = match &s.kind {
                LegacyKind::Checksum => {
                    let mut out = Vec::with_capacity(cur.len() + cur.len() / bs * 33 + 33);
                    for b in blocks(&cur, bs) {
                        out.extend_from_slice(Md5Variant::Lors64.hex_digest(b).as_bytes());
                        out.push(b':');
                        out.extend_from_slice(b);
                    }
                    (out, in_bs + CHECKSUM_HEADER)
                }
                LegacyKind::Xor { key } => {
                    xor_blocks(&mut cur, bs, key)?;
                    (cur, in_bs)
                }
                LegacyKind::Aes { key } => {
                    let cipher = aes::Aes128::new(GenericArray::from_slice(key));
                    let abs = round16(in_bs);
                    let mut out = Vec::with_capacity(cur.len() + cur.len() / bs * 16 + 16);
                    for b in blocks(&cur, to_usize(abs, "block size")?) {
                        let mut iv = [0u8; AES_BLOCK];
                        getrandom::fill(&mut iv)
                            .map_err(|_| E2eError::Malformed("no IV source"))?;
                        aes_encrypt_block(&cipher, &iv, b, &mut out);
                    }
                    (out, abs + AES_BLOCK as u64)
                }
                LegacyKind::Zlib => {
                    let head = format!("{:012}:", cur.len()).into_bytes();
                    let mut enc =
                        flate2::write::ZlibEncoder::new(head, flate2::Compression::default());
                    let out = std::io::Write::write_all(&mut enc, &cur)
                        .and_then(|()| enc.finish())
                        .map_err(|_| E2eError::Malformed("zlib compression failed"))?;
                    let n = out.len() as u64;
                    (out, n)
                }
            };
            cur = next;
            steps.push(LegacyStep {
                kind: s.kind.clone(),
                blocksize: out_bs,
            });
            in_bs = out_bs;
        }
        Ok((
            cur,
            LegacyChain {
                e2e_blocksize: self.e2e_blocksize,
                steps,
            },
        ))
    }

    /// Size of `len` bytes after the first `n` steps, as encoding computes it;
    /// `None` past a zlib step (its size depends on the data).
    fn encoded_len(&self, n: usize, len: u64) -> Option<u64> {
        let mut len = len;
        let mut in_bs = self.e2e_blocksize.max(1);
        for s in &self.steps[..n] {
            let count = len.div_ceil(in_bs);
            match s.kind {
                LegacyKind::Checksum => {
                    len = len.checked_add(count.checked_mul(CHECKSUM_HEADER)?)?;
                    in_bs += CHECKSUM_HEADER;
                }
                LegacyKind::Xor { .. } => {}
                LegacyKind::Aes { .. } => {
                    let abs = round16(in_bs);
                    len = len.checked_add(len.div_ceil(abs).checked_mul(16)?)?;
                    in_bs = abs + AES_BLOCK as u64;
                }
                LegacyKind::Zlib => return None,
            }
        }
        Some(len)
    }

    /// Decodes a mapping's stored bytes back to its `logical_len` bytes,
    /// undoing the outermost function first. Damage that a checksum, the
    /// zlib stream or the block layout reveals is an error; nothing is ever
    /// inflated beyond what the inner steps can produce from `logical_len`.
    pub fn decode(&self, stored: &[u8], logical_len: u64) -> Result<Vec<u8>, E2eError> {
        let mut cur = stored.to_vec();
        for (i, s) in self.steps.iter().enumerate().rev() {
            let bs = to_usize(s.blocksize, "blocksize")?;
            cur = match &s.kind {
                LegacyKind::Checksum => {
                    if bs <= CHECKSUM_HEADER as usize {
                        return Err(E2eError::Malformed("checksum blocksize too small"));
                    }
                    let mut out = Vec::with_capacity(cur.len());
                    for (n, b) in blocks(&cur, bs).enumerate() {
                        let corrupt = |what| E2eError::Corrupt {
                            block: n as u64,
                            what,
                        };
                        if b.len() < 33 || b[32] != b':' {
                            return Err(corrupt("malformed MD5 checksum header"));
                        }
                        if !super::lors_md5::matches(&b[..32], &b[33..]) {
                            return Err(corrupt("MD5 checksum mismatch"));
                        }
                        out.extend_from_slice(&b[33..]);
                    }
                    out
                }
                LegacyKind::Xor { key } => {
                    xor_blocks(&mut cur, bs, key)?;
                    cur
                }
                LegacyKind::Aes { key } => {
                    let cipher = aes::Aes128::new(GenericArray::from_slice(key));
                    let abs = to_usize(round16(s.blocksize), "blocksize")?;
                    let mut out = Vec::with_capacity(cur.len());
                    for (n, b) in blocks(&cur, abs).enumerate() {
                        aes_decrypt_block(&cipher, b, &mut out).ok_or(E2eError::Corrupt {
                            block: n as u64,
                            what: "AES block shorter than its IV",
                        })?;
                    }
                    out
                }
                LegacyKind::Zlib => {
                    let bound = self
                        .encoded_len(i, logical_len)
                        .ok_or(E2eError::Unsupported("zlib_compress applied twice".into()))?;
                    zlib_decode(&cur, bound)?
                }
            };
        }
        if cur.len() as u64 != logical_len {
            return Err(E2eError::Corrupt {
                block: 0,
                what: "decoded size differs from logical_length",
            });
        }
        Ok(cur)
    }

    /// The exNode function element (outermost = last applied).
    pub fn to_function(&self) -> Option<Function> {
        let mut inner: Option<Function> = None;
        for s in &self.steps {
            let mut args = Vec::new();
            match &s.kind {
                LegacyKind::Xor { key } => {
                    args.push(Metadata::string("KEY", &String::from_utf8_lossy(key)));
                }
                LegacyKind::Aes { key } => args.push(Metadata::string("KEY", &hex(key))),
                _ => {}
            }
            args.push(Metadata::integer(
                "blocksize",
                i64::try_from(s.blocksize).unwrap_or(i64::MAX),
            ));
            inner = Some(Function {
                name: s.kind.name().into(),
                metadata: vec![],
                arguments: args,
                inner: inner.into_iter().collect(),
            });
        }
        inner
    }
}

fn xor_blocks(data: &mut [u8], bs: usize, key: &[u8]) -> Result<(), E2eError> {
    let k = *key
        .last()
        .ok_or(E2eError::Malformed("empty xor_encrypt KEY"))?;
    for b in data.chunks_mut(bs.max(1)) {
        for v in b.iter_mut().step_by(2) {
            *v ^= k;
        }
    }
    Ok(())
}

fn xor16(a: &mut [u8], b: &[u8]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}

/// One LoRS AES block: `iv` then CBC with ciphertext stealing.
fn aes_encrypt_block(cipher: &aes::Aes128, iv: &[u8; 16], p: &[u8], out: &mut Vec<u8>) {
    if p.len() <= AES_BLOCK {
        // Short input: the first len IV bytes, then E((p ‖ 0…) ⊕ IV).
        let mut b = [0u8; AES_BLOCK];
        b[..p.len()].copy_from_slice(p);
        xor16(&mut b, iv);
        cipher.encrypt_block(GenericArray::from_mut_slice(&mut b));
        out.extend_from_slice(&iv[..p.len()]);
        out.extend_from_slice(&b);
        return;
    }
    out.extend_from_slice(iv);
    let mut prev = *iv;
    let full = p.len() / AES_BLOCK;
    let rest = p.len() % AES_BLOCK;
    for (n, c) in p.chunks(AES_BLOCK).take(full).enumerate() {
        let mut b = [0u8; AES_BLOCK];
        b.copy_from_slice(c);
        xor16(&mut b, &prev);
        cipher.encrypt_block(GenericArray::from_mut_slice(&mut b));
        if rest > 0 && n == full - 1 {
            // Ciphertext stealing: the last full block's ciphertext chains
            // the zero-padded tail, and only its first `rest` bytes are kept.
            let mut last = [0u8; AES_BLOCK];
            last[..rest].copy_from_slice(&p[full * AES_BLOCK..]);
            xor16(&mut last, &b);
            cipher.encrypt_block(GenericArray::from_mut_slice(&mut last));
            out.extend_from_slice(&last);
            out.extend_from_slice(&b[..rest]);
            return;
        }
        out.extend_from_slice(&b);
        prev = b;
    }
}

/// Undoes [`aes_encrypt_block`]; `None` if `c` is too short to be one.
fn aes_decrypt_block(cipher: &aes::Aes128, c: &[u8], out: &mut Vec<u8>) -> Option<()> {
    if c.len() < AES_BLOCK {
        return None;
    }
    if c.len() <= 2 * AES_BLOCK {
        let len = c.len() - AES_BLOCK;
        let mut b = [0u8; AES_BLOCK];
        b.copy_from_slice(&c[len..]);
        cipher.decrypt_block(GenericArray::from_mut_slice(&mut b));
        out.extend(c[..len].iter().zip(&b).map(|(iv, x)| iv ^ x));
        return Some(());
    }
    let (iv, body) = c.split_at(AES_BLOCK);
    let mut prev = [0u8; AES_BLOCK];
    prev.copy_from_slice(iv);
    let full = body.len() / AES_BLOCK;
    let rest = body.len() % AES_BLOCK;
    for (n, blk) in body.chunks(AES_BLOCK).take(full).enumerate() {
        let mut d = [0u8; AES_BLOCK];
        d.copy_from_slice(blk);
        cipher.decrypt_block(GenericArray::from_mut_slice(&mut d));
        if rest > 0 && n == full - 1 {
            // `blk` is the stolen final block: D(blk) = (tail ‖ 0…) ⊕ C',
            // and C' is the kept prefix plus D(blk)'s own high bytes.
            let mut cprev = [0u8; AES_BLOCK];
            cprev[..rest].copy_from_slice(&body[full * AES_BLOCK..]);
            cprev[rest..].copy_from_slice(&d[rest..]);
            let tail: Vec<u8> = (0..rest).map(|i| d[i] ^ cprev[i]).collect();
            let mut p = cprev;
            cipher.decrypt_block(GenericArray::from_mut_slice(&mut p));
            xor16(&mut p, &prev);
            out.extend_from_slice(&p);
            out.extend_from_slice(&tail);
            return Some(());
        }
        xor16(&mut d, &prev);
        out.extend_from_slice(&d);
        prev.copy_from_slice(blk);
    }
    Some(())
}

fn zlib_decode(stored: &[u8], bound: u64) -> Result<Vec<u8>, E2eError> {
    let corrupt = |what| E2eError::Corrupt { block: 0, what };
    let head = stored
        .get(..ZLIB_HEADER as usize)
        .filter(|h| h[12] == b':' && h[..12].iter().all(u8::is_ascii_digit))
        .ok_or(corrupt("malformed zlib length header"))?;
    let len: u64 = std::str::from_utf8(&head[..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(corrupt("malformed zlib length header"))?;
    if len > bound {
        return Err(corrupt("zlib length header larger than the mapping"));
    }
    let mut out = Vec::with_capacity(to_usize(
        len.min(super::MAX_ENCODED_MAPPING),
        "zlib length",
    )?);
    flate2::read::ZlibDecoder::new(&stored[ZLIB_HEADER as usize..])
        .take(len + 1)
        .read_to_end(&mut out)
        .map_err(|_| corrupt("zlib data is invalid"))?;
    if out.len() as u64 != len {
        return Err(corrupt("zlib data length differs from its header"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex16(s: &str) -> [u8; 16] {
        unhex(s).unwrap().try_into().unwrap()
    }

    /// FIPS-197 appendix C.1: a 16-byte block with a zero IV is stored as the
    /// IV followed by the textbook ciphertext.
    #[test]
    fn aes_known_answer_single_block() {
        let key = unhex16("000102030405060708090a0b0c0d0e0f");
        let cipher = aes::Aes128::new(GenericArray::from_slice(&key));
        let p = unhex("00112233445566778899aabbccddeeff").unwrap();
        let mut out = Vec::new();
        aes_encrypt_block(&cipher, &[0; 16], &p, &mut out);
        assert_eq!(
            hex(&out),
            "0000000000000000000000000000000069c4e0d86a7b0430d8cdb78070b4c55a"
        );
        let mut back = Vec::new();
        aes_decrypt_block(&cipher, &out, &mut back).unwrap();
        assert_eq!(back, p);
    }

    /// With a zero IV, CBC's first block is the FIPS vector; a 20-byte input
    /// steals from it: stored = IV, E(tail ⊕ C1), C1[..4].
    #[test]
    fn aes_ciphertext_stealing_layout() {
        let key = unhex16("000102030405060708090a0b0c0d0e0f");
        let cipher = aes::Aes128::new(GenericArray::from_slice(&key));
        let mut p = unhex("00112233445566778899aabbccddeeff").unwrap();
        p.extend_from_slice(b"tail");
        let mut out = Vec::new();
        aes_encrypt_block(&cipher, &[0; 16], &p, &mut out);
        assert_eq!(out.len(), 16 + 20);
        assert_eq!(hex(&out[32..]), "69c4e0d8");
        let mut x = [0u8; 16];
        x[..4].copy_from_slice(b"tail");
        xor16(&mut x, &unhex("69c4e0d86a7b0430d8cdb78070b4c55a").unwrap());
        cipher.encrypt_block(GenericArray::from_mut_slice(&mut x));
        assert_eq!(&out[16..32], &x);
        let mut back = Vec::new();
        aes_decrypt_block(&cipher, &out, &mut back).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn aes_every_length_round_trips() {
        let cipher = aes::Aes128::new(GenericArray::from_slice(&[7u8; 16]));
        for n in 0..100usize {
            let p: Vec<u8> = (0..n as u8).collect();
            let mut out = Vec::new();
            aes_encrypt_block(&cipher, &[9; 16], &p, &mut out);
            assert_eq!(out.len(), n + 16, "len {n}");
            let mut back = Vec::new();
            aes_decrypt_block(&cipher, &out, &mut back).unwrap();
            assert_eq!(back, p, "len {n}");
        }
    }

    #[test]
    fn xor_touches_even_offsets_of_each_block() {
        let mut d = vec![0u8; 7];
        xor_blocks(&mut d, 3, b"abcdefg").unwrap();
        assert_eq!(d, [b'g', 0, b'g', b'g', 0, b'g', b'g']);
    }

    #[test]
    fn zlib_layout() {
        let c = LegacyChain::new(1 << 20, vec![LegacyKind::Zlib]);
        let (stored, rec) = c.encode(b"hello hello hello").unwrap();
        assert_eq!(&stored[..13], b"000000000017:");
        assert_eq!(rec.steps[0].blocksize, stored.len() as u64);
        // Standard zlib: the default-level header.
        assert_eq!(&stored[13..15], &[0x78, 0x9c]);
        assert_eq!(rec.decode(&stored, 17).unwrap(), b"hello hello hello");
        // A header claiming more than the mapping can hold is refused.
        let mut bad = stored.clone();
        bad[..12].copy_from_slice(b"999999999999");
        assert!(rec.decode(&bad, 17).is_err());
    }
}
