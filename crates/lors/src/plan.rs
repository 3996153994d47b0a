//! Download planning: cut a byte range into segments, each servable by every
//! mapping that fully covers it. Pure; no I/O.
//!
//! Replicas need not share block boundaries, so the cut points are every
//! mapping start and end inside the range, then pieces longer than the block
//! size are split further so work can spread over depots. A sparse file's
//! holes get no segment: they are zeros, read from nowhere.

use lors_exnode::{Hole, Mapping};

/// One piece of the output and where it can come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Logical offset in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Indices into the exNode's mappings that hold this whole piece and can
    /// be read (have a read capability).
    pub sources: Vec<usize>,
}

/// The largest allocation a mapping may claim (16 TiB): more than any depot
/// rents in one piece. An exNode claiming more is damaged or hostile, and
/// believing it would make the planner cut the claim into pieces by the
/// billion.
pub const MAX_MAPPING_BYTES: u64 = 1 << 44;

/// The farthest byte an exNode may claim (8 PiB: 2^53).
pub const MAX_FILE_BYTES: u64 = 1 << 53;

/// Most pieces one download plans (each costs the plan and the scheduler
/// some 500 bytes): a larger range gets larger pieces, up to
/// [`MAX_PIECE_BYTES`].
pub const MAX_SEGMENTS: u64 = 1 << 17;

/// The largest piece the planner makes to stay within [`MAX_SEGMENTS`]
/// (a piece may be held in memory whole): one plan reaches 16 TiB.
pub const MAX_PIECE_BYTES: u64 = 128 << 20;

/// Why a range cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The range would take more than [`MAX_SEGMENTS`] pieces of at most
    /// [`MAX_PIECE_BYTES`].
    #[error(
        "{len} bytes are more than one download can plan ({} at most): read the file in parts (-O/--length)",
        MAX_SEGMENTS * MAX_PIECE_BYTES
    )]
    TooLarge {
        /// Bytes asked for.
        len: u64,
    },
    /// Bytes in the range that no readable mapping covers.
    #[error(
        "bytes {start}..{end} are not held by any readable mapping (trimmed or never uploaded)"
    )]
    Hole {
        /// First missing byte.
        start: u64,
        /// One past the last missing byte.
        end: u64,
    },
    /// A mapping's recorded sizes cannot be right: the exNode is damaged or
    /// was edited. Found before any I/O.
    #[error(
        "the exNode is inconsistent: mapping {number} {what}; nothing was read (fix or re-create the exNode)"
    )]
    Geometry {
        /// Mapping number, as `lors ls` and `lors_ls` show it.
        number: usize,
        /// What does not add up.
        what: String,
    },
    /// A hole reaching past [`MAX_FILE_BYTES`]: the exNode is damaged or
    /// hostile.
    #[error(
        "the exNode is inconsistent: a hole at {offset} of {length} bytes ends past byte {MAX_FILE_BYTES}; nothing was read"
    )]
    HoleTooFar {
        /// The hole's offset.
        offset: u64,
        /// Its length.
        length: u64,
    },
}

/// Checks what an exNode says of each mapping's sizes before any byte moves,
/// so a damaged or edited exNode is blamed instead of the depots: a mapping
/// stored as is cannot hold more logical bytes than it stores, and an
/// encoded one must name functions we can undo and fit in memory.
pub fn check_geometry(mappings: &[Mapping]) -> Result<(), PlanError> {
    use lors_exnode::functions::{Codec, MAX_ENCODED_MAPPING};
    for (index, m) in mappings.iter().enumerate() {
        let bad = |what: String| {
            let number = lors_exnode::Numbering::of(mappings).number(index);
            Err(PlanError::Geometry { number, what })
        };
        if m.alloc_length > MAX_MAPPING_BYTES || m.logical_length > MAX_MAPPING_BYTES {
            return bad(format!(
                "claims {} logical / {} allocated bytes, more than the {MAX_MAPPING_BYTES} one allocation can hold",
                m.logical_length, m.alloc_length
            ));
        }
        if m.exnode_offset
            .checked_add(m.logical_length)
            .is_none_or(|end| end > MAX_FILE_BYTES)
        {
            return bad(format!(
                "ends past byte {MAX_FILE_BYTES} (offset {} + length {})",
                m.exnode_offset, m.logical_length
            ));
        }
        match Codec::from_mapping(m) {
            Err(e) => return bad(format!("has an unusable function: {e}")),
            // A missing alloc_length (0) is not checked: old writers omit it.
            Ok(None) if m.alloc_length > 0 && m.logical_length > m.alloc_length => {
                return bad(format!(
                    "claims {} bytes of data but its allocation holds {} (alloc_length)",
                    m.logical_length, m.alloc_length
                ));
            }
            Ok(Some(_))
                if m.alloc_length > MAX_ENCODED_MAPPING
                    || m.logical_length > MAX_ENCODED_MAPPING =>
            {
                return bad(format!(
                    "is encoded and claims {} logical / {} stored bytes, more than the {MAX_ENCODED_MAPPING} decoded in memory",
                    m.logical_length, m.alloc_length
                ));
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// Everything [`crate::download`] checks of an exNode before any byte
/// moves — each mapping's and parity block's sizes ([`check_geometry`]),
/// its holes ([`check_holes`]), an erasure-code record and its blocks
/// ([`lors_exnode::erasure::Erasure::of`]) — for the commands that read it
/// without downloading (stat, verify, keep): what a download refuses, they
/// refuse too.
///
/// ```
/// use lors_exnode::{ExNode, Mapping};
/// let bad = Mapping { logical_length: 10, alloc_length: 5, ..Mapping::default() };
/// let x = ExNode { mappings: vec![bad], ..ExNode::default() };
/// assert!(lors::plan::check_exnode(&x).is_err());
/// ```
pub fn check_exnode(x: &lors_exnode::ExNode) -> Result<(), crate::Error> {
    check_geometry(&x.mappings)?;
    check_geometry(&x.parity)?;
    check_holes(&x.holes)?;
    lors_exnode::erasure::Erasure::of(x)?;
    Ok(())
}

/// Checks an exNode's holes reach no further than its mappings may
/// ([`MAX_FILE_BYTES`]): zeros without end are as hostile as a mapping
/// claiming them.
pub fn check_holes(holes: &[Hole]) -> Result<(), PlanError> {
    match holes.last() {
        Some(h) if h.end() > MAX_FILE_BYTES => Err(PlanError::HoleTooFar {
            offset: h.offset,
            length: h.length,
        }),
        _ => Ok(()),
    }
}

/// The piece size for planning `len` bytes in pieces of `piece`: larger
/// when `len` would take more than [`MAX_SEGMENTS`] pieces.
///
/// ```
/// use lors::plan::{piece_for, MAX_SEGMENTS};
/// assert_eq!(piece_for(1 << 30, 2 << 20), Ok(2 << 20));
/// assert_eq!(piece_for(MAX_SEGMENTS * (4 << 20), 2 << 20), Ok(4 << 20));
/// assert_eq!(piece_for(1 << 44, 2 << 20), Ok(128 << 20));
/// assert!(piece_for(u64::MAX, 2 << 20).is_err());
/// ```
pub fn piece_for(len: u64, piece: u64) -> Result<u64, PlanError> {
    let piece = piece.max(1).max(len.div_ceil(MAX_SEGMENTS));
    if piece > MAX_PIECE_BYTES && len > MAX_SEGMENTS * MAX_PIECE_BYTES {
        return Err(PlanError::TooLarge { len });
    }
    Ok(piece)
}

/// Plans `[start, start+len)` into segments of at most `max_seg` bytes
/// (never more than [`MAX_SEGMENTS`] of them split for size: see
/// [`piece_for`]). Bytes in `holes` (sorted, apart: as an exNode keeps
/// them) get no segment; any other byte no readable mapping holds is an
/// error.
pub fn plan(
    mappings: &[Mapping],
    holes: &[Hole],
    start: u64,
    len: u64,
    max_seg: u64,
) -> Result<Vec<Segment>, PlanError> {
    let end = start.saturating_add(len);
    let max_seg = if max_seg == u64::MAX {
        max_seg
    } else {
        piece_for(len, max_seg)?
    };
    let readable: Vec<(usize, &Mapping)> = mappings
        .iter()
        .enumerate()
        .filter(|(_, m)| m.read.is_some() && m.logical_length > 0)
        .collect();
    let mut cuts = vec![start, end];
    for (_, m) in &readable {
        for p in [m.exnode_offset, m.logical_end()] {
            if p > start && p < end {
                cuts.push(p);
            }
        }
    }
    let first_hole = holes.partition_point(|h| h.end() <= start);
    let holes = &holes[first_hole..];
    for h in holes.iter().take_while(|h| h.offset < end) {
        for p in [h.offset, h.end()] {
            if p > start && p < end {
                cuts.push(p);
            }
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut hole = holes.iter().peekable();
    // One sweep over the cuts with the mappings sorted by start: `active`
    // holds those that began at or before the current cut and end after it,
    // so each window looks at the replicas of its own stretch, not at every
    // mapping.
    let mut by_start = readable;
    by_start.sort_by_key(|(i, m)| (m.exnode_offset, *i));
    let mut next = 0;
    let mut active: Vec<(usize, &Mapping)> = Vec::new();
    let mut out = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        while next < by_start.len() && by_start[next].1.exnode_offset <= a {
            active.push(by_start[next]);
            next += 1;
        }
        active.retain(|(_, m)| m.logical_end() > a);
        let mut sources: Vec<usize> = active
            .iter()
            .filter(|(_, m)| m.logical_end() >= b)
            .map(|(i, _)| *i)
            .collect();
        sources.sort_unstable();
        if sources.is_empty() {
            // Windows never straddle a hole's edge: in one, or clear of all.
            while hole.next_if(|h| h.end() <= a).is_some() {}
            if hole.peek().is_some_and(|h| h.offset <= a) {
                continue;
            }
            return Err(PlanError::Hole { start: a, end: b });
        }
        let mut off = a;
        while off < b {
            let l = (b - off).min(max_seg);
            out.push(Segment {
                offset: off,
                len: l,
                sources: sources.clone(),
            });
            off += l;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lors_ibp::caps::{CapKind, Capability, Key};
    use proptest::prelude::*;

    fn m(off: u64, len: u64, host: &str) -> Mapping {
        Mapping {
            exnode_offset: off,
            logical_length: len,
            alloc_length: len,
            read: Some(Capability::new(
                host,
                1,
                "1",
                Key::new("k").unwrap(),
                1,
                CapKind::Read,
            )),
            ..Mapping::default()
        }
    }

    #[test]
    fn replicas_with_different_boundaries_are_cut_at_every_edge() {
        let maps = [
            m(0, 100, "a"),
            m(100, 100, "a"),
            m(0, 150, "b"),
            m(150, 50, "b"),
        ];
        let segs = plan(&maps, &[], 0, 200, 1000).unwrap();
        let got: Vec<(u64, u64, Vec<usize>)> = segs
            .iter()
            .map(|s| (s.offset, s.len, s.sources.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 100, vec![0, 2]),
                (100, 50, vec![1, 2]),
                (150, 50, vec![1, 3])
            ]
        );
    }

    #[test]
    fn ranges_and_holes() {
        let maps = [m(0, 100, "a"), m(200, 100, "a")];
        assert_eq!(
            plan(&maps, &[], 0, 300, 1000),
            Err(PlanError::Hole {
                start: 100,
                end: 200
            })
        );
        let segs = plan(&maps, &[], 250, 30, 1000).unwrap();
        assert_eq!(
            (segs[0].offset, segs[0].len, segs[0].sources.clone()),
            (250, 30, vec![1])
        );
        assert_eq!(plan(&maps, &[], 0, 0, 10).unwrap(), vec![]);
        let mut unreadable = m(100, 100, "b");
        unreadable.read = None;
        assert!(plan(&[m(0, 100, "a"), unreadable], &[], 0, 200, 10).is_err());
    }

    #[test]
    fn holes_get_no_segment_and_excuse_only_their_own_bytes() {
        let maps = [m(0, 100, "a"), m(200, 100, "a")];
        let hole = |offset, length| Hole { offset, length };
        let got = |holes: &[Hole], a, l| {
            plan(&maps, holes, a, l, 60).map(|v| {
                v.iter()
                    .map(|s| (s.offset, s.len))
                    .collect::<Vec<(u64, u64)>>()
            })
        };
        let gap = [hole(100, 100)];
        assert_eq!(
            got(&gap, 0, 300),
            Ok(vec![(0, 60), (60, 40), (200, 60), (260, 40)])
        );
        assert_eq!(got(&gap, 120, 50), Ok(vec![]));
        assert_eq!(got(&gap, 150, 100), Ok(vec![(200, 50)]));
        assert!(check_holes(&gap).is_ok());
        assert!(check_holes(&[hole(MAX_FILE_BYTES - 1, 2)]).is_err());
        // A trailing hole, past every mapping.
        assert_eq!(
            got(&[hole(100, 100), hole(300, 50)], 280, 70),
            Ok(vec![(280, 20)])
        );
        // Half a gap excused is not the whole gap.
        assert_eq!(
            got(&[hole(100, 50)], 0, 300),
            Err(PlanError::Hole {
                start: 150,
                end: 200
            })
        );
    }

    #[test]
    fn hostile_claims_are_refused_before_any_plan() {
        // One 551-byte mapping claiming 2^63 bytes.
        let huge = Mapping {
            alloc_length: i64::MAX as u64,
            logical_length: i64::MAX as u64,
            ..m(0, 1, "a")
        };
        assert!(matches!(
            check_geometry(&[huge]),
            Err(PlanError::Geometry { number: 0, .. })
        ));
        // In bounds each, but ending past the farthest byte.
        let far = m(MAX_FILE_BYTES - 10, 11, "a");
        assert!(check_geometry(&[far]).is_err());
        let wraps = m(u64::MAX, 2, "a");
        assert!(check_geometry(&[wraps]).is_err());
        // The largest claim that passes plans in at most MAX_SEGMENTS pieces.
        let big = m(0, MAX_MAPPING_BYTES, "a");
        check_geometry(std::slice::from_ref(&big)).unwrap();
        let segs = plan(
            std::slice::from_ref(&big),
            &[],
            0,
            MAX_MAPPING_BYTES,
            256 << 10,
        )
        .unwrap();
        assert_eq!(segs.len() as u64, MAX_SEGMENTS);
        // Mappings side by side up to 8 PiB: too much for one download.
        assert!(matches!(
            plan(&[big], &[], 0, MAX_FILE_BYTES, 256 << 10),
            Err(PlanError::TooLarge { .. })
        ));
    }

    #[test]
    fn geometry_blames_the_exnode() {
        use lors_exnode::functions::{Chain, Step};
        let ok = m(0, 100, "a");
        assert_eq!(check_geometry(std::slice::from_ref(&ok)), Ok(()));
        // Stored as is, but claiming more than the allocation holds.
        let long = Mapping {
            logical_length: 101,
            ..ok.clone()
        };
        let e = check_geometry(&[ok.clone(), long]).unwrap_err();
        assert!(matches!(e, PlanError::Geometry { number: 1, .. }), "{e}");
        // A missing alloc_length is not held against it.
        let old = Mapping {
            alloc_length: 0,
            ..ok.clone()
        };
        assert_eq!(check_geometry(&[old]), Ok(()));
        // Encoded, larger than we decode in memory.
        let chain = Chain {
            block_size: 64,
            steps: vec![Step::Blake3],
        };
        let huge = Mapping {
            e2e_blocksize: 64,
            function: chain.to_function(),
            logical_length: 4 << 30,
            alloc_length: 4 << 30,
            ..ok.clone()
        };
        assert!(
            check_geometry(&[huge])
                .unwrap_err()
                .to_string()
                .contains("encoded")
        );
        // A function we cannot undo.
        let mut f = chain.to_function().unwrap();
        f.name = "des_encrypt".into();
        let des = Mapping {
            e2e_blocksize: 64,
            function: Some(f),
            ..ok
        };
        assert!(
            check_geometry(&[des])
                .unwrap_err()
                .to_string()
                .contains("unusable function")
        );
    }

    proptest! {
        #[test]
        fn segments_tile_the_range_exactly_and_sources_cover_them(
            blocks in proptest::collection::vec(1u64..500, 1..20),
            bs2 in 1u64..700,
            max_seg in 1u64..300,
            a in 0u64..2000, l in 0u64..2000,
        ) {
            // Copy 1 with variable blocks, copy 2 with fixed blocks of bs2.
            let mut maps = Vec::new();
            let mut off = 0;
            for b in &blocks { maps.push(m(off, *b, "a")); off += b; }
            let total = off;
            let mut o = 0;
            while o < total { let l = bs2.min(total - o); maps.push(m(o, l, "b")); o += l; }
            let start = a.min(total);
            let len = l.min(total - start);
            let segs = plan(&maps, &[], start, len, max_seg).unwrap();
            let mut pos = start;
            for s in &segs {
                prop_assert_eq!(s.offset, pos);
                prop_assert!(s.len > 0 && s.len <= max_seg);
                prop_assert!(!s.sources.is_empty());
                for &i in &s.sources {
                    prop_assert!(maps[i].exnode_offset <= s.offset && maps[i].logical_end() >= s.offset + s.len);
                }
                pos += s.len;
            }
            prop_assert_eq!(pos, start + len);
        }
    }
}
