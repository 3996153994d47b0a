//! Reading every replica back and checking it: a scrub of an exNode.
//!
//! A download stops at the first good replica of each block, so a damaged
//! or vanished second copy goes unnoticed until the first one is lost too.
//! [`verify`] reads every mapping whole, a few MiB at a time, the depots in
//! parallel (one connection each), and checks each end-to-end block
//! against its checksum (BLAKE3, MD5, an AEAD tag). An erasure-coded file's
//! parity blocks are read too, each checked against the BLAKE3 digest of
//! the parity its data encoded to at upload (or repair). Mappings stored as
//! they are, without a digest, have nothing to check against: they are
//! read through, which proves the depot still holds every byte, and
//! reported as unchecked. Nothing is written anywhere.
//!
//! ```no_run
//! # async fn f(x: lors_exnode::ExNode, pool: lors::Pool) -> Result<(), lors::plan::PlanError> {
//! use std::sync::Arc;
//! let report = lors::verify::verify(&x, &pool, Arc::new(lors::NoProgress)).await?;
//! for (m, check) in x.allocations().zip(&report) {
//!     println!("{} {}: {}", m.exnode_offset, check.state(), check.reason());
//! }
//! # Ok(()) }
//! ```

use std::ops::Range;
use std::sync::Arc;

use lors_exnode::ExNode;
use lors_exnode::functions::{Codec, E2eError, STORED_BLAKE3, Slice};

use crate::manage::{Failure, Probe, by_depot};
use crate::plan::{PlanError, check_geometry};
use crate::pool::Pool;
use crate::progress::{NoProgress, Progress};

/// Stored bytes read and checked at a time: enough that a request's round
/// trip costs little, little enough that every depot's read is in memory
/// at once.
pub const CHUNK: u64 = 4 << 20;

/// What reading one replica back found.
#[derive(Debug, Clone)]
pub enum Check {
    /// Every end-to-end block matched its checksum.
    Good,
    /// Stored as is: every byte was read, none could be checked.
    Unchecked,
    /// Blocks that do not match: each as its byte range in the file and why.
    Corrupt(Vec<(Range<u64>, String)>),
    /// The replica could not be read (expired, refused, unreachable, hung…).
    Unreadable(Probe),
}

impl Check {
    /// Whether the replica can be relied on: read whole, and checked where
    /// it can be.
    pub fn is_good(&self) -> bool {
        matches!(self, Check::Good | Check::Unchecked)
    }

    /// One word or two for listings: `good`, `unchecked`, `corrupt`, or
    /// the state of an unreadable one (`expired`, `refused`,
    /// `unreachable`, `no answer`, `failed`).
    pub fn state(&self) -> &'static str {
        match self {
            Check::Good => "good",
            Check::Unchecked => "unchecked",
            Check::Corrupt(_) => "corrupt",
            Check::Unreadable(p) => p.state(),
        }
    }

    /// A sentence for a person.
    pub fn reason(&self) -> String {
        match self {
            Check::Good => "every block matches its checksum".into(),
            Check::Unchecked => "read whole; stored without checksums, nothing to check".into(),
            Check::Corrupt(bad) => {
                let (r, why) = &bad[0];
                let more = match bad.len() {
                    1 => String::new(),
                    n => format!(" (and {} more blocks)", n - 1),
                };
                format!("bytes {}..{}: {why}{more}", r.start, r.end)
            }
            Check::Unreadable(p) => p.reason(),
        }
    }
}

/// One read of a [`verify`] run: part of a mapping.
#[derive(Debug, Clone)]
struct Part {
    mapping: usize,
    /// Logical bytes, within the mapping; the whole mapping when its
    /// layout can only be checked whole. (What the part is; the reads go
    /// by `stored`.)
    #[cfg_attr(not(test), allow(dead_code))]
    logical: Range<u64>,
    /// The stored bytes read, within the allocation.
    stored: Range<u64>,
    /// How they are checked: `None` for a mapping stored as is; the e2e
    /// blocks read, or `None` for the whole mapping.
    codec: Option<(Codec, Option<Slice>)>,
}

/// Whether mapping `m` records the digest of its stored bytes.
fn has_digest(m: &lors_exnode::Mapping) -> bool {
    m.metadata.iter().any(|d| d.name == STORED_BLAKE3)
}

/// The parts allocation `m` is read in, of about `chunk` bytes.
fn parts(x: &ExNode, m: usize, chunk: u64) -> Vec<Part> {
    let Some(map) = x.allocation(m) else {
        return Vec::new();
    };
    let len = map.logical_length;
    // (Mappings whose functions cannot be undone are not read at all.)
    let codec = Codec::from_mapping(map).ok().flatten();
    let step = match &codec {
        Some(c) if c.is_sliceable(map) => chunk.next_multiple_of(c.e2e_blocksize().max(1)),
        Some(_) => len,
        // Its digest is of the whole stored block: read in one.
        None if has_digest(map) => len,
        None => chunk,
    };
    let part = |logical: Range<u64>| {
        let (stored, codec) = match &codec {
            None => (logical.clone(), None),
            Some(c) => match c.slice(map, logical.start, logical.end - logical.start) {
                Some(s) => (s.stored.clone(), Some((c.clone(), Some(s)))),
                None => (0..map.alloc_length, Some((c.clone(), None))),
            },
        };
        Part {
            mapping: m,
            logical,
            stored,
            codec,
        }
    };
    if len == 0 || step >= len {
        return vec![part(0..len)];
    }
    (0..len.div_ceil(step))
        .map(|k| part(k * step..((k + 1) * step).min(len)))
        .collect()
}

/// Reads every readable allocation of `x` back and checks it; one
/// [`Check`] per allocation, in the order of [`ExNode::allocations`]
/// (mappings, then parity blocks; one without a read capability is
/// unreadable). `progress` counts stored bytes read. An exNode whose
/// sizes cannot be right is refused before any read, as a download
/// refuses it.
pub async fn verify(
    x: &ExNode,
    pool: &Pool,
    progress: Arc<dyn Progress>,
) -> Result<Vec<Check>, PlanError> {
    check_geometry(&x.mappings)?;
    let out: Vec<Check> = (x.allocations())
        .map(|m| match (&m.read, Codec::from_mapping(m)) {
            (None, _) => Check::Unreadable(Probe::Failed("no read capability".into())),
            (_, Err(e)) => Check::Unreadable(Probe::Failed(format!("unusable function: {e}"))),
            (Some(_), Ok(Some(_))) => Check::Good,
            (Some(_), Ok(None)) if has_digest(m) => Check::Good,
            (Some(_), Ok(None)) => Check::Unchecked,
        })
        .collect();
    let count = out.len();
    let readable = || (0..count).filter(|&m| !matches!(out[m], Check::Unreadable(_)));
    let length = |m: usize| x.allocation(m).map_or(0, |a| a.logical_length);
    // As a download plans: however much there is, a bounded number of
    // parts, larger ones for more data.
    let bytes = readable().fold(0u64, |a, m| a.saturating_add(length(m)));
    let chunk = crate::plan::piece_for(bytes, CHUNK)?;
    let all: Vec<Part> = readable().flat_map(|m| parts(x, m, chunk)).collect();
    let jobs = (all.iter().enumerate())
        .filter_map(|(j, p)| Some((j, x.allocation(p.mapping)?.read.clone()?)))
        .collect();
    let total = (all.iter())
        .map(|p| p.stored.end - p.stored.start)
        .sum::<u64>();
    progress.start(Some(total));
    let (shared, table) = (Arc::new(x.clone()), Arc::new(all));
    let op = {
        let (x, table, progress) = (shared.clone(), table.clone(), progress.clone());
        move |mut c: lors_ibp::Connection, j: usize, cap: lors_ibp::caps::Capability| {
            let (x, table, progress) = (x.clone(), table.clone(), progress.clone());
            async move {
                let r = read_part(&mut c, &x, &table[j], &cap).await;
                if r.is_ok() {
                    let p = &table[j];
                    progress.advance(&cap.address(), p.stored.end - p.stored.start);
                }
                (c, r)
            }
        }
    };
    let mut out = out;
    let mut results = by_depot(jobs, pool, &NoProgress, op).await;
    // In file order, so a mapping's corrupt blocks are listed in order.
    results.sort_unstable_by_key(|(j, _)| *j);
    for (j, r) in results {
        let part = &table[j];
        let check = &mut out[part.mapping];
        if matches!(check, Check::Unreadable(_)) {
            continue; // its first failure says why
        }
        match r {
            Ok(None) => {}
            Ok(Some(bad)) => match check {
                Check::Corrupt(list) => list.push(bad),
                _ => *check = Check::Corrupt(vec![bad]),
            },
            Err(Failure::Op(e)) => *check = Check::Unreadable(Probe::from_result(Err(e))),
            Err(Failure::Skipped(why)) => *check = Check::Unreadable(Probe::Unreachable(why)),
            Err(Failure::Silent(why)) => *check = Check::Unreadable(Probe::NoAnswer(why)),
        }
    }
    Ok(out)
}

/// Reads part `p` and checks it: `Ok(None)` when it is whole and matches,
/// `Ok(Some(bad))` naming the first block that does not.
async fn read_part(
    c: &mut lors_ibp::Connection,
    x: &ExNode,
    p: &Part,
    cap: &lors_ibp::caps::Capability,
) -> lors_ibp::Result<Option<(Range<u64>, String)>> {
    let Some(m) = x.allocation(p.mapping) else {
        return Ok(None);
    };
    let mut buf = bytes::BytesMut::new();
    let (at, n) = (
        m.alloc_offset + p.stored.start,
        p.stored.end - p.stored.start,
    );
    c.load_buf(cap, at, n, &mut buf).await?;
    let Some((codec, slice)) = p.codec.clone() else {
        // Stored as is: its digest, if it records one; else read whole is
        // all there is.
        let whole = m.logical_length;
        let at = m.exnode_offset;
        return Ok(Codec::check_stored_digest(m, &buf)
            .err()
            .map(|e| (at..at + whole.max(1), e.to_string())));
    };
    let bs = codec.e2e_blocksize().max(1);
    // The range in the file of block `i` of this mapping, and why.
    let bad = |e: E2eError| {
        let i = match e {
            E2eError::Corrupt { block, .. } => block,
            _ => 0,
        };
        let start = m.exnode_offset + (i * bs).min(m.logical_length);
        let end = m.exnode_offset + ((i + 1) * bs).min(m.logical_length);
        Some((
            start..end.max(start + 1).min(m.logical_end()),
            e.to_string(),
        ))
    };
    let map = m.clone();
    let r = tokio::task::spawn_blocking(move || match &slice {
        Some(s) => match codec.check_slice(s, &buf) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => codec.decode_slice(s, &buf).map(drop),
            Err(e) => Err(e),
        },
        None => codec.decode_mapping(&map, &buf).map(drop),
    })
    .await
    .map_err(|e| lors_ibp::Error::Local {
        during: "checking a block",
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(r.err().and_then(bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lors_exnode::Mapping;
    use lors_exnode::functions::{Chain, Step};

    fn mapping(codec: Option<&Codec>, len: u64) -> Mapping {
        let data = vec![7u8; usize::try_from(len).unwrap()];
        let (stored, function, bs) = match codec {
            Some(c) => {
                let (s, f) = c.encode(&data).unwrap();
                (s.len() as u64, f, c.e2e_blocksize())
            }
            None => (len, None, 0),
        };
        Mapping {
            logical_length: len,
            alloc_length: stored,
            e2e_blocksize: bs,
            function,
            ..Mapping::default()
        }
    }

    fn ranges(m: Mapping, chunk: u64) -> Vec<Range<u64>> {
        let x = ExNode {
            mappings: vec![m],
            ..ExNode::default()
        };
        parts(&x, 0, chunk).into_iter().map(|p| p.logical).collect()
    }

    #[test]
    fn parts_are_whole_blocks_where_the_layout_allows() {
        let blake = Codec::Native(Chain {
            block_size: 3 << 20,
            steps: vec![Step::Blake3],
        });
        // 4 MiB rounded up to whole 3 MiB e2e blocks: 6 MiB parts.
        assert_eq!(
            ranges(mapping(Some(&blake), 10 << 20), CHUNK),
            vec![0..6 << 20, 6 << 20..10 << 20]
        );
        // Stored as is: plain 4 MiB parts.
        assert_eq!(
            ranges(mapping(None, 9 << 20), CHUNK),
            vec![0..4 << 20, 4 << 20..8 << 20, 8 << 20..9 << 20]
        );
        // Compressed: only whole.
        let zstd = Codec::Native(Chain {
            block_size: 1 << 20,
            steps: vec![Step::Zstd { level: 1 }],
        });
        assert_eq!(
            ranges(mapping(Some(&zstd), 5 << 20), CHUNK),
            vec![0..5 << 20]
        );
    }
}
