//! Erasure-coded files: any `m` of a stripe's `k + m` blocks may be lost at
//! `(k + m) / k` the space (three copies survive two losses at 3×;
//! Reed-Solomon 6+3 survives three at 1.5×).
//!
//! **Layout** (`docs/exnode.md`). The file is cut into stripes of `k` data
//! blocks of `block_size` logical bytes each; the last stripe may be
//! short (shorter blocks, or empty ones, which are not stored). A data
//! block is stored like any block — its e2e functions applied — and is an
//! ordinary `<exnode:mapping>`: tools that know nothing of erasure codes,
//! the LoRS 0.82 ones included, read the file while its data blocks are
//! there. Parity is computed over the **stored** bytes: each data block's
//! stored bytes, zero-padded to the stripe's shard length `S` (its longest
//! stored block rounded up to even), and `m` parity shards of `S` bytes,
//! each an allocation written as `<exnode:parity>` (an element the LoRS
//! tools skip, so they can never read parity as data). A rebuilt data
//! block is therefore checked by its own e2e checksums.
//!
//! The code is Leopard-RS over GF(2^16) as `reed-solomon-simd` 3 computes
//! it (codec name [`CODEC`]): symbol position by symbol position, so any
//! 64-byte-aligned range of the shards decodes on its own ([`window`]).
//!
//! ```
//! use lors_exnode::erasure::{Erasure, Scheme};
//! let e = Erasure { scheme: Scheme::parse("4+2").unwrap(), block_size: 4, size: 14 };
//! let data: Vec<&[u8]> = vec![b"tele", b"scop", b"e da", b"ta"];
//! let parity = e.scheme.encode(&data, 4).unwrap();
//! // Lose two data blocks; any four of the six rebuild them.
//! let have = [(0, data[0]), (3, data[3]), (4, &parity[0][..]), (5, &parity[1][..])];
//! let all = e.scheme.recover(&have, 4).unwrap();
//! assert_eq!(&all[1][..], b"scop");
//! assert_eq!(&all[2][..], b"e da");
//! ```

use std::ops::Range;

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

use crate::model::{ExNode, Mapping, Metadata, Value};

/// The codec name recorded in `ec_codec`.
pub const CODEC: &str = "leopard16";
/// ExNode metadata: the codec.
pub const META_CODEC: &str = "ec_codec";
/// ExNode metadata: data blocks per stripe (`k`).
pub const META_DATA: &str = "ec_data";
/// ExNode metadata: parity blocks per stripe (`m`).
pub const META_PARITY: &str = "ec_parity";
/// ExNode metadata: logical bytes per data block.
pub const META_BLOCK: &str = "ec_block_size";
/// ExNode metadata: the file's logical size.
pub const META_SIZE: &str = "ec_size";
/// Block metadata: the stripe.
pub const META_STRIPE: &str = "ec_stripe";
/// Block metadata: the index in the stripe (`< k` data, else parity).
pub const META_INDEX: &str = "ec_index";

/// Most stripes in one exNode (as many as its mappings can be).
pub const MAX_STRIPES: u64 = 4_000_000;

/// Largest data block of an erasure-coded file: its blocks are encoded,
/// rebuilt and checked whole in memory.
pub const MAX_BLOCK_BYTES: u64 = crate::functions::MAX_ENCODED_MAPPING;

/// The most a block of `block_size` logical bytes may take stored: four
/// times it (e2e checksums, compression that did not pay) and a MiB more.
/// A record claiming more is damaged or hostile: believed, it would have a
/// reader set aside memory for it before a byte arrives.
pub fn max_stored(block_size: u64) -> u64 {
    block_size.saturating_mul(4).saturating_add(1 << 20)
}

/// Most blocks in one stripe (each needs its own depot).
pub const MAX_BLOCKS: usize = 256;

/// Why erasure coding could not be done or its record not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErasureError {
    /// A `K+M` that is not one.
    #[error(
        "{0:?} is not an erasure code: give data+parity blocks, e.g. 6+3 (each at least 1, at most {MAX_BLOCKS} in all)"
    )]
    Scheme(String),
    /// The exNode's `ec_*` metadata is missing, mistyped or out of range.
    #[error("the exNode's erasure-code record is invalid: {0}")]
    Record(String),
    /// Fewer than `k` blocks of a stripe to rebuild from.
    #[error("{have} of the {need} blocks needed to rebuild")]
    TooFew {
        /// Blocks given.
        have: usize,
        /// Blocks needed (`k`).
        need: usize,
    },
    /// A shard of the wrong length or index.
    #[error("{0}")]
    Shard(String),
}

/// `k` data and `m` parity blocks per stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// Data blocks per stripe.
    pub data: usize,
    /// Parity blocks per stripe: the losses a stripe survives.
    pub parity: usize,
}

impl Scheme {
    /// Parses `K+M` (`6+3`).
    pub fn parse(s: &str) -> Result<Scheme, ErasureError> {
        let bad = || ErasureError::Scheme(s.to_owned());
        let (k, m) = s.trim().split_once('+').ok_or_else(bad)?;
        let k: usize = k.trim().parse().map_err(|_| bad())?;
        let m: usize = m.trim().parse().map_err(|_| bad())?;
        let ok = k >= 1 && m >= 1 && k.checked_add(m).is_some_and(|n| n <= MAX_BLOCKS);
        ok.then_some(Scheme { data: k, parity: m }).ok_or_else(bad)
    }

    /// Blocks per stripe.
    pub fn blocks(&self) -> usize {
        self.data + self.parity
    }

    /// The `m` parity shards of `data` (each at most `len` bytes, shorter
    /// ones zero-padded; missing trailing blocks count as zeros). `len`
    /// must be even.
    pub fn encode(&self, data: &[&[u8]], len: usize) -> Result<Vec<Vec<u8>>, ErasureError> {
        if data.len() > self.data {
            return Err(ErasureError::Shard(format!(
                "{} data blocks for a {}+{} stripe",
                data.len(),
                self.data,
                self.parity
            )));
        }
        let zeros = vec![0u8; len];
        let data: Vec<std::borrow::Cow<'_, [u8]>> = (0..self.data)
            .map(|i| padded(data.get(i).copied().unwrap_or(&[]), len, &zeros))
            .collect::<Result<_, _>>()?;
        let mut parity = vec![vec![0u8; len]; self.parity];
        for c in columns(len) {
            let mut enc =
                ReedSolomonEncoder::new(self.data, self.parity, c.len()).map_err(codec)?;
            for d in &data {
                enc.add_original_shard(&d[c.clone()]).map_err(codec)?;
            }
            let out = enc.encode().map_err(codec)?;
            for (p, r) in parity.iter_mut().zip(out.recovery_iter()) {
                p[c.clone()].copy_from_slice(r);
            }
        }
        Ok(parity)
    }

    /// All `k` data shards (each `len` bytes, zero-padded) from any `k` of
    /// the stripe's shards, given as (index, bytes): data shards of at
    /// most `len` bytes (zero-padded), parity shards of exactly `len`.
    pub fn recover(
        &self,
        have: &[(usize, &[u8])],
        len: usize,
    ) -> Result<Vec<Vec<u8>>, ErasureError> {
        let mut all = vec![Vec::new(); self.data];
        self.restore(have, len, |i, d| all[i] = d.to_vec())?;
        Ok(all)
    }

    /// Data shard `want` alone (as [`Scheme::recover`] gives it), copied
    /// once: what a read of a lost block needs.
    pub fn recover_one(
        &self,
        have: &[(usize, &[u8])],
        len: usize,
        want: usize,
    ) -> Result<Vec<u8>, ErasureError> {
        let mut out = None;
        self.restore(have, len, |i, d| {
            if i == want {
                out = Some(d.to_vec());
            }
        })?;
        out.ok_or_else(|| ErasureError::Shard(format!("no data block {want}")))
    }

    /// The data shards not among `have`, decoded (as [`Scheme::recover`]
    /// gives them): what a read of several lost blocks of a stripe needs,
    /// from one decode.
    pub fn recover_missing(
        &self,
        have: &[(usize, &[u8])],
        len: usize,
    ) -> Result<Vec<(usize, Vec<u8>)>, ErasureError> {
        let mut out = Vec::new();
        self.restore(have, len, |i, d| {
            if !have.iter().any(|&(j, _)| j == i) {
                out.push((i, d.to_vec()));
            }
        })?;
        Ok(out)
    }

    /// Calls `emit` with each data shard (index, `len` bytes): those given
    /// as they are (padded if short), the others decoded.
    fn restore(
        &self,
        have: &[(usize, &[u8])],
        len: usize,
        mut emit: impl FnMut(usize, &[u8]),
    ) -> Result<(), ErasureError> {
        let zeros = vec![0u8; len];
        let mut data: Vec<Option<std::borrow::Cow<'_, [u8]>>> = vec![None; self.data];
        let mut recovery: Vec<(usize, &[u8])> = Vec::new();
        for &(i, bytes) in have {
            match i {
                i if i < self.data => {
                    if data[i].is_none() {
                        data[i] = Some(padded(bytes, len, &zeros)?);
                    }
                }
                i if i < self.blocks() => {
                    if bytes.len() != len {
                        return Err(ErasureError::Shard(format!(
                            "parity block {i} is {} bytes, not {len}",
                            bytes.len()
                        )));
                    }
                    if !recovery.iter().any(|&(j, _)| j == i) {
                        recovery.push((i, bytes));
                    }
                }
                i => {
                    return Err(ErasureError::Shard(format!(
                        "no block {i} in a {}+{} stripe",
                        self.data, self.parity
                    )));
                }
            }
        }
        let known = data.iter().flatten().count();
        if known == self.data {
            for (i, d) in data.iter().enumerate() {
                emit(i, d.as_deref().unwrap_or_default());
            }
            return Ok(());
        }
        if known + recovery.len() < self.data {
            return Err(ErasureError::TooFew {
                have: known + recovery.len(),
                need: self.data,
            });
        }
        let missing: Vec<usize> = (0..self.data).filter(|&i| data[i].is_none()).collect();
        let mut restored = vec![vec![0u8; len]; missing.len()];
        let recovery = &recovery[..self.data - known];
        for c in columns(len) {
            let mut dec =
                ReedSolomonDecoder::new(self.data, self.parity, c.len()).map_err(codec)?;
            for (i, d) in data.iter().enumerate() {
                if let Some(d) = d {
                    dec.add_original_shard(i, &d[c.clone()]).map_err(codec)?;
                }
            }
            for &(i, r) in recovery {
                dec.add_recovery_shard(i - self.data, &r[c.clone()])
                    .map_err(codec)?;
            }
            let out = dec.decode().map_err(codec)?;
            for (slot, &i) in restored.iter_mut().zip(&missing) {
                let r = out.restored_original(i).ok_or_else(|| {
                    ErasureError::Shard(format!("data block {i} was not restored"))
                })?;
                slot[c.clone()].copy_from_slice(r);
            }
        }
        for (i, d) in data.iter().enumerate() {
            match d {
                Some(d) => emit(i, d),
                None => {
                    let at = missing.iter().position(|&j| j == i).unwrap_or_default();
                    emit(i, &restored[at]);
                }
            }
        }
        Ok(())
    }
}

/// The code works symbol position by symbol position, so shards are coded
/// a column at a time: the coder's work then stays in the CPU's caches
/// (whole 10 MiB blocks encode three times slower, benches/erasure.rs). Columns
/// start on 64-byte chunks; the last takes the shard's partial chunk, as
/// coding the whole shard would.
const COLUMN: usize = 1 << 20;

fn columns(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..len.div_ceil(COLUMN).max(1)).map(move |c| c * COLUMN..((c + 1) * COLUMN).min(len))
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.data, self.parity)
    }
}

fn codec(e: reed_solomon_simd::Error) -> ErasureError {
    ErasureError::Shard(format!("Reed-Solomon: {e}"))
}

/// `d` as `len` bytes: itself, or a zero-padded copy when shorter.
fn padded<'a>(
    d: &'a [u8],
    len: usize,
    zeros: &'a [u8],
) -> Result<std::borrow::Cow<'a, [u8]>, ErasureError> {
    use std::borrow::Cow;
    match d.len() {
        n if n == len => Ok(Cow::Borrowed(d)),
        0 => Ok(Cow::Borrowed(zeros)),
        n if n < len => {
            let mut v = Vec::with_capacity(len);
            v.extend_from_slice(d);
            v.resize(len, 0);
            Ok(Cow::Owned(v))
        }
        n => Err(ErasureError::Shard(format!(
            "a data block of {n} bytes in shards of {len}"
        ))),
    }
}

/// The shard length of a stripe whose longest stored data block is
/// `longest` bytes: rounded up to even, as the code needs.
pub fn shard_len(longest: u64) -> u64 {
    longest.max(1).next_multiple_of(2)
}

/// The range of shards to read and decode to rebuild bytes `want` of a
/// shard of `len` bytes: `want` widened to 64-byte boundaries (the code's
/// chunks), and to the end of the shard when it reaches into the last,
/// partial chunk (laid out by its length).
pub fn window(want: Range<u64>, len: u64) -> Range<u64> {
    let start = (want.start / 64) * 64;
    let tail = (len / 64) * 64;
    let end = want.end.next_multiple_of(64);
    let end = if end > tail { len } else { end };
    start.min(len)..end.max(start.min(len))
}

/// An erasure-coded file's record: its scheme and layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Erasure {
    /// `k + m`.
    pub scheme: Scheme,
    /// Logical bytes per data block.
    pub block_size: u64,
    /// The file's logical size.
    pub size: u64,
}

impl Erasure {
    /// The record of `x`: `None` for a file that is not erasure-coded.
    pub fn of(x: &ExNode) -> Result<Option<Erasure>, ErasureError> {
        let Some(codec) = x.meta(META_CODEC) else {
            return Ok(None);
        };
        if *codec != Value::String(CODEC.into()) {
            return Err(ErasureError::Record(format!(
                "codec {codec:?}: this version reads {CODEC:?} only"
            )));
        }
        let int = |name: &str| match x.meta(name) {
            Some(Value::Integer(v)) => {
                u64::try_from(*v).map_err(|_| ErasureError::Record(format!("{name} is negative")))
            }
            _ => Err(ErasureError::Record(format!(
                "{name} is missing or not an integer"
            ))),
        };
        let (k, m) = (int(META_DATA)?, int(META_PARITY)?);
        let scheme =
            Scheme::parse(&format!("{k}+{m}")).map_err(|e| ErasureError::Record(e.to_string()))?;
        let block_size = int(META_BLOCK)?;
        if block_size == 0 {
            return Err(ErasureError::Record(format!("{META_BLOCK} is 0")));
        }
        let e = Erasure {
            scheme,
            block_size,
            size: int(META_SIZE)?,
        };
        if e.stripe_len().is_none() {
            return Err(ErasureError::Record("a stripe overflows 64 bits".into()));
        }
        // Each stripe's data is at least one mapping: no more stripes than
        // an exNode holds mappings (what is kept per stripe stays bounded).
        // Nor more stripes than it names blocks: each stripe has some (a
        // file whose every block is gone has nothing left to describe),
        // and a few hundred bytes claiming millions would cost millions.
        if block_size > MAX_BLOCK_BYTES {
            return Err(ErasureError::Record(format!(
                "{META_BLOCK} is {block_size}, more than the {MAX_BLOCK_BYTES} bytes a block may have"
            )));
        }
        let most = max_stored(block_size);
        if let Some((i, m)) = (x.allocations().enumerate())
            .find(|(_, m)| m.alloc_length > most || m.logical_length > most)
        {
            return Err(ErasureError::Record(format!(
                "block {i} claims {} stored / {} logical bytes; blocks of {block_size} bytes take at most {most} (stored, parity too)",
                m.alloc_length, m.logical_length
            )));
        }
        let named = x.mappings.len() as u64 + x.parity.len() as u64;
        if e.stripes() > MAX_STRIPES || e.stripes() > named.max(1) {
            return Err(ErasureError::Record(format!(
                "{} stripes claimed for {named} blocks named (at most {MAX_STRIPES})",
                e.stripes()
            )));
        }
        Ok(Some(e))
    }

    /// Removes the record from `x`'s metadata: its blocks are then read as
    /// an ordinary striped file's.
    pub fn forget(x: &mut ExNode) {
        let record = [META_CODEC, META_DATA, META_PARITY, META_BLOCK, META_SIZE];
        x.metadata.retain(|m| !record.contains(&m.name.as_str()));
    }

    /// The exNode metadata recording it.
    pub fn metadata(&self) -> Vec<Metadata> {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        vec![
            Metadata::string(META_CODEC, CODEC),
            Metadata::integer(META_DATA, int(self.scheme.data as u64)),
            Metadata::integer(META_PARITY, int(self.scheme.parity as u64)),
            Metadata::integer(META_BLOCK, int(self.block_size)),
            Metadata::integer(META_SIZE, int(self.size)),
        ]
    }

    /// Logical bytes per stripe (`None`: overflows).
    pub fn stripe_len(&self) -> Option<u64> {
        self.block_size.checked_mul(self.scheme.data as u64)
    }

    /// Stripes in the file.
    pub fn stripes(&self) -> u64 {
        self.size.div_ceil(self.stripe_len().unwrap_or(u64::MAX))
    }

    /// The logical bytes of stripe `s`.
    pub fn stripe(&self, s: u64) -> Range<u64> {
        let len = self.stripe_len().unwrap_or(u64::MAX);
        let start = s.saturating_mul(len).min(self.size);
        start..start.saturating_add(len).min(self.size)
    }

    /// The logical bytes of data block `i` of stripe `s` (empty past the
    /// end of the file: such a block is zeros and not stored).
    pub fn block(&self, s: u64, i: usize) -> Range<u64> {
        let stripe = self.stripe(s);
        let start = stripe
            .start
            .saturating_add((i as u64).saturating_mul(self.block_size))
            .min(stripe.end);
        start..start.saturating_add(self.block_size).min(stripe.end)
    }

    /// The stripe and index of allocation `m` of an exNode with this
    /// record, checked against the layout: a data block (`parity` false)
    /// by its `ec_*` metadata, else by the bytes it covers (a copy made by
    /// a tool that drops the metadata is still block `i`); a parity block
    /// by its metadata.
    pub fn shard_of(&self, m: &Mapping, parity: bool) -> Option<(u64, usize)> {
        let k = self.scheme.data;
        match (m.shard(), parity) {
            (Some((s, i)), false) if i < k && s < self.stripes() => {
                let b = self.block(s, i);
                (m.exnode_offset == b.start && m.logical_end() == b.end).then_some((s, i))
            }
            (Some((s, i)), true)
                if (k..self.scheme.blocks()).contains(&i) && s < self.stripes() =>
            {
                Some((s, i))
            }
            (None, false) => {
                let stripe_len = self.stripe_len()?;
                let s = m.exnode_offset / stripe_len;
                let i = usize::try_from((m.exnode_offset % stripe_len) / self.block_size).ok()?;
                let b = self.block(s, i);
                (m.exnode_offset == b.start && m.logical_end() == b.end && !b.is_empty())
                    .then_some((s, i))
            }
            _ => None,
        }
    }

    /// The mapping of data block `i` of stripe `s`: one of `x`'s for it;
    /// else — every copy of it trimmed — one made from a sibling when the
    /// file's blocks are stored with a layout that follows from their
    /// length (as they are, or e2e functions of a fixed overhead per
    /// block): what a rebuild of the block needs to know to decode it.
    /// Such a mapping keeps the sibling's capabilities; they are not the
    /// block's. `None` for an empty block or when nothing says how it was
    /// stored.
    pub fn data_record(&self, x: &ExNode, s: u64, i: usize) -> Option<Mapping> {
        let b = self.block(s, i);
        if b.is_empty() {
            return None;
        }
        if let Some(m) = (x.mappings.iter()).find(|m| self.shard_of(m, false) == Some((s, i))) {
            return Some(m.clone());
        }
        let len = b.end - b.start;
        x.mappings.iter().find_map(|m| {
            self.shard_of(m, false)?;
            let stored = match crate::functions::Codec::from_mapping(m).ok()? {
                None => len,
                Some(c) => c.stored_len(len)?,
            };
            let mut r = m.clone();
            r.exnode_offset = b.start;
            r.logical_length = len;
            r.alloc_offset = 0;
            r.alloc_length = stored;
            r.metadata.retain(|d| {
                ![META_STRIPE, META_INDEX, crate::functions::STORED_BLAKE3]
                    .contains(&d.name.as_str())
            });
            r.metadata.extend(Erasure::block_meta(s, i));
            Some(r)
        })
    }

    /// Each stripe's state: which of its blocks are present — among the
    /// allocations of `x` (numbered as [`ExNode::allocations`]) those
    /// `present` accepts, and the data blocks past the end of the file
    /// (zeros, never stored).
    pub fn margins(&self, x: &ExNode, present: impl Fn(usize) -> bool) -> Vec<Margin> {
        let n = usize::try_from(self.stripes()).unwrap_or(usize::MAX);
        let (k, b) = (self.scheme.data, self.scheme.blocks());
        let mut have = vec![false; n.saturating_mul(b)];
        for (s, row) in have.chunks_mut(b).enumerate() {
            for (i, h) in row.iter_mut().enumerate().take(k) {
                *h = self.block(s as u64, i).is_empty();
            }
        }
        let data = x.mappings.len();
        for (j, m) in x.allocations().enumerate() {
            if let Some((s, i)) = self.shard_of(m, j >= data)
                && present(j)
            {
                have[s as usize * b + i] = true;
            }
        }
        (have.chunks(b).enumerate())
            .map(|(s, row)| {
                let s = s as u64;
                let blocks = row.iter().filter(|&&h| h).count();
                Margin {
                    stripe: s,
                    bytes: self.stripe(s),
                    blocks,
                    margin: blocks as i64 - k as i64,
                    missing: (0..row.len()).filter(|&i| !row[i]).collect(),
                }
            })
            .collect()
    }

    /// The metadata naming block `i` of stripe `s`.
    pub fn block_meta(s: u64, i: usize) -> [Metadata; 2] {
        [
            Metadata::integer(META_STRIPE, i64::try_from(s).unwrap_or(i64::MAX)),
            Metadata::integer(META_INDEX, i64::try_from(i).unwrap_or(i64::MAX)),
        ]
    }
}

/// What of a file cannot be read from its live allocations alone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Unreadable {
    /// The bytes, in order: of a replicated file those no live replica
    /// covers, of an erasure-coded one the stripes that cannot be decoded.
    pub bytes: Vec<Range<u64>>,
    /// Of an erasure-coded file, its stripes.
    pub stripes: Option<Stripes>,
}

/// An erasure-coded file's stripes, as [`Unreadable`] found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stripes {
    /// Its code.
    pub scheme: Scheme,
    /// Stripes in all.
    pub of: u64,
    /// Those with fewer live blocks than the code's data blocks, in order.
    pub lost: Vec<u64>,
}

/// What of `x` cannot be read when allocation `i` (mappings, then parity
/// blocks: [`ExNode::allocations`]) is live as `live[i]` says: the one
/// answer for a replicated and an erasure-coded file.
///
/// ```
/// use lors_exnode::{ExNode, Mapping};
/// let mut x = ExNode::default();
/// for at in [0, 10] {
///     x.mappings.push(Mapping { exnode_offset: at, logical_length: 10, ..Mapping::default() });
/// }
/// let u = lors_exnode::erasure::unreadable(&x, &[true, false]).unwrap();
/// assert_eq!(u.bytes, [10..20]);
/// assert!(u.stripes.is_none());
/// ```
pub fn unreadable(x: &ExNode, live: &[bool]) -> Result<Unreadable, ErasureError> {
    let Some(e) = Erasure::of(x)? else {
        return Ok(Unreadable {
            bytes: x.uncovered(live),
            stripes: None,
        });
    };
    let lost: Vec<Margin> = (e.margins(x, |i| live.get(i).copied().unwrap_or(false)))
        .into_iter()
        .filter(|m| m.margin < 0)
        .collect();
    Ok(Unreadable {
        bytes: lost.iter().map(|m| m.bytes.clone()).collect(),
        stripes: Some(Stripes {
            scheme: e.scheme,
            of: e.stripes(),
            lost: lost.iter().map(|m| m.stripe).collect(),
        }),
    })
}

/// One stripe's state (see [`Erasure::margins`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Margin {
    /// The stripe.
    pub stripe: u64,
    /// Its logical bytes.
    pub bytes: Range<u64>,
    /// Its blocks present (distinct indices).
    pub blocks: usize,
    /// Losses it can still take: `blocks - k` (negative: unreadable).
    pub margin: i64,
    /// Indices of its blocks not present.
    pub missing: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe(k: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        (0..k)
            .map(|i| {
                (0..len)
                    .map(|j| (j as u8).wrapping_mul(31).wrapping_add(seed ^ i as u8))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn schemes_parse_and_refuse() {
        assert_eq!(Scheme::parse("6+3").unwrap(), Scheme { data: 6, parity: 3 });
        assert_eq!(Scheme::parse(" 10 + 4 ").unwrap().to_string(), "10+4");
        for bad in [
            "6",
            "0+3",
            "6+0",
            "+3",
            "6+",
            "a+b",
            "200+100",
            "18446744073709551615+1",
        ] {
            assert!(Scheme::parse(bad).is_err(), "{bad}");
        }
    }

    /// Every way of losing three of nine blocks, and every way of losing
    /// four (which must fail, not produce bytes).
    #[test]
    fn any_three_of_nine_lost_rebuild_and_four_do_not() {
        let s = Scheme { data: 6, parity: 3 };
        let data = stripe(6, 1000, 7);
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = s.encode(&refs, 1000).unwrap();
        let all: Vec<&[u8]> = refs
            .iter()
            .copied()
            .chain(parity.iter().map(Vec::as_slice))
            .collect();
        let mut subsets = 0;
        for a in 0..9 {
            for b in a + 1..9 {
                for c in b + 1..9 {
                    let have: Vec<(usize, &[u8])> = (0..9)
                        .filter(|i| ![a, b, c].contains(i))
                        .map(|i| (i, all[i]))
                        .collect();
                    assert_eq!(s.recover(&have, 1000).unwrap(), data, "lost {a},{b},{c}");
                    subsets += 1;
                    let fewer = &have[1..];
                    assert_eq!(
                        s.recover(fewer, 1000),
                        Err(ErasureError::TooFew { have: 5, need: 6 })
                    );
                }
            }
        }
        assert_eq!(subsets, 84);
    }

    /// Short and missing data blocks are zeros; the last stripe of a file
    /// has them.
    #[test]
    fn short_blocks_are_zero_padded() {
        let s = Scheme { data: 4, parity: 2 };
        let data: Vec<&[u8]> = vec![b"0123456789", b"abc"];
        let parity = s.encode(&data, 10).unwrap();
        let have = [
            (1, data[1]),
            (2, &b""[..]),
            (3, &b""[..]),
            (4, &parity[0][..]),
        ];
        let all = s.recover(&have, 10).unwrap();
        assert_eq!(all[0], b"0123456789");
        assert_eq!(&all[1][..3], b"abc");
        assert!(all[1][3..].iter().all(|&b| b == 0));
    }

    /// A 64-byte-aligned window of every shard decodes on its own, the
    /// last partial chunk included: what lets a download rebuild just the
    /// piece it lacks.
    #[test]
    fn windows_decode_alone() {
        let s = Scheme { data: 3, parity: 2 };
        for len in [2usize, 62, 64, 66, 190, 1000, 4096, 4098] {
            let data = stripe(3, len, len as u8);
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let parity = s.encode(&refs, len).unwrap();
            for (a, b) in [
                (0, len),
                (1, 2),
                (len / 3, len / 2 + 1),
                (len.saturating_sub(3), len),
            ] {
                if a >= b {
                    continue;
                }
                let w = window(a as u64..b as u64, len as u64);
                let (w0, w1) = (w.start as usize, w.end as usize);
                assert!(
                    w0 <= a && b <= w1 && (w1 - w0) % 2 == 0,
                    "{len}: {a}..{b} -> {w:?}"
                );
                let have = [
                    (1, &data[1][w0..w1]),
                    (3, &parity[0][w0..w1]),
                    (4, &parity[1][w0..w1]),
                ];
                let all = s.recover(&have, w1 - w0).unwrap();
                assert_eq!(&all[0][a - w0..b - w0], &data[0][a..b], "{len}: {a}..{b}");
                assert_eq!(&all[2][a - w0..b - w0], &data[2][a..b], "{len}: {a}..{b}");
            }
        }
    }

    /// Coding a column at a time gives what coding whole shards gives
    /// (the parity on depots), across column edges and a partial last
    /// chunk.
    #[test]
    fn columns_code_as_whole_shards_do() {
        let s = Scheme { data: 3, parity: 2 };
        let len = 3 * COLUMN + 130;
        let data = stripe(3, len, 5);
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = s.encode(&refs, len).unwrap();
        let mut whole = ReedSolomonEncoder::new(3, 2, len).unwrap();
        for d in &refs {
            whole.add_original_shard(d).unwrap();
        }
        let out = whole.encode().unwrap();
        for (p, w) in parity.iter().zip(out.recovery_iter()) {
            assert!(p.as_slice() == w);
        }
        let have = [(1, refs[1]), (3, &parity[0][..]), (4, &parity[1][..])];
        assert_eq!(s.recover(&have, len).unwrap(), data);
    }

    /// The parity of a fixed stripe: what is on depots must stay readable
    /// when the codec crate is upgraded.
    #[test]
    fn parity_is_stable() {
        let s = Scheme { data: 4, parity: 2 };
        let data = stripe(4, 256, 1);
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = s.encode(&refs, 256).unwrap();
        let h = blake3::hash(&parity.concat());
        assert_eq!(h.to_hex().as_str(), PARITY_4_2_256);
    }
    const PARITY_4_2_256: &str = "d375abf7e55236b7311b9c1bfe11067deff76fd0af58673b95d0b3690f79342d";

    #[test]
    fn layout_of_a_short_last_stripe() {
        let e = Erasure {
            scheme: Scheme { data: 3, parity: 2 },
            block_size: 10,
            size: 45,
        };
        assert_eq!(e.stripes(), 2);
        assert_eq!(e.stripe(1), 30..45);
        assert_eq!(e.block(1, 0), 30..40);
        assert_eq!(e.block(1, 1), 40..45);
        assert_eq!(e.block(1, 2), 45..45);
        let mut x = ExNode {
            metadata: e.metadata(),
            ..ExNode::default()
        };
        // Two stripes claimed, no block named: refused.
        assert!(Erasure::of(&x).is_err());
        x.mappings = vec![Mapping::default(); 2];
        assert_eq!(Erasure::of(&x).unwrap(), Some(e));
        x.set_meta(Metadata::integer(META_DATA, 0));
        assert!(Erasure::of(&x).is_err());
    }
}
