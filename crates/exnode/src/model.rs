//! The exNode model, independent of any serialization.

use lors_ibp::caps::{CapKind, Capability};

/// A typed metadata or function-argument value (`type=` in the XML).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `type="string"`.
    String(String),
    /// `type="integer"`: signed 64-bit.
    Integer(i64),
    /// `type="double"`: finite.
    Double(f64),
    /// `type="meta"`: nested metadata.
    Meta(Vec<Metadata>),
}

/// One named value.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    /// The `name` attribute.
    pub name: String,
    /// The typed value.
    pub value: Value,
}

impl Metadata {
    /// A string item.
    pub fn string(name: &str, v: &str) -> Self {
        Metadata {
            name: name.into(),
            value: Value::String(v.into()),
        }
    }
    /// An integer item.
    pub fn integer(name: &str, v: i64) -> Self {
        Metadata {
            name: name.into(),
            value: Value::Integer(v),
        }
    }
    /// A double item.
    pub fn double(name: &str, v: f64) -> Self {
        Metadata {
            name: name.into(),
            value: Value::Double(v),
        }
    }
}

/// An end-to-end function applied to a mapping's bytes (checksum, encryption,
/// compression…). The outermost function was applied last at upload and is
/// undone first at download; `inner` holds the earlier ones.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Function {
    /// Function name, e.g. `checksum`, `aes_encrypt`, `zlib_compress`.
    pub name: String,
    /// Function metadata.
    pub metadata: Vec<Metadata>,
    /// Function arguments (e.g. `blocksize`, `KEY`).
    pub arguments: Vec<Metadata>,
    /// Functions applied before this one.
    pub inner: Vec<Function>,
}

impl Function {
    /// An argument by name.
    pub fn argument(&self, name: &str) -> Option<&Value> {
        self.arguments
            .iter()
            .find(|m| m.name == name)
            .map(|m| &m.value)
    }

    /// This function and its inner ones, outermost first (the order a
    /// downloader undoes them).
    pub fn chain(&self) -> Vec<&Function> {
        let mut out = vec![self];
        let mut cur = self;
        while let Some(next) = cur.inner.first() {
            out.push(next);
            cur = next;
        }
        out
    }
}

/// One piece of the file in one allocation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Mapping {
    /// Logical offset in the file.
    pub exnode_offset: u64,
    /// Bytes of original data covered.
    pub logical_length: u64,
    /// Offset inside the allocation.
    pub alloc_offset: u64,
    /// Bytes stored in the allocation (differs from `logical_length` with
    /// checksums, encryption padding or compression).
    pub alloc_length: u64,
    /// End-to-end block size (0 = no e2e functions).
    pub e2e_blocksize: u64,
    /// Other mapping metadata, kept as read (e.g. dlt-lors `start`/`end`).
    pub metadata: Vec<Metadata>,
    /// The function chain, if any.
    pub function: Option<Function>,
    /// Read capability.
    pub read: Option<Capability>,
    /// Write capability.
    pub write: Option<Capability>,
    /// Manage capability.
    pub manage: Option<Capability>,
}

impl Mapping {
    /// End of the logical range this mapping covers.
    pub fn logical_end(&self) -> u64 {
        self.exnode_offset.saturating_add(self.logical_length)
    }

    /// The capability of one kind, if present.
    pub fn cap(&self, kind: CapKind) -> Option<&Capability> {
        match kind {
            CapKind::Read => self.read.as_ref(),
            CapKind::Write => self.write.as_ref(),
            CapKind::Manage => self.manage.as_ref(),
        }
    }

    /// The stripe and index of an erasure-coded block (`ec_stripe`,
    /// `ec_index` metadata): index `< k` a data block, else parity.
    pub fn shard(&self) -> Option<(u64, usize)> {
        let int = |name| match self.metadata.iter().find(|m| m.name == name) {
            Some(Metadata {
                value: Value::Integer(v),
                ..
            }) => u64::try_from(*v).ok(),
            _ => None,
        };
        let index = usize::try_from(int(crate::erasure::META_INDEX)?).ok()?;
        Some((int(crate::erasure::META_STRIPE)?, index))
    }

    /// `host:port` of the depot holding this mapping.
    pub fn depot(&self) -> Option<String> {
        self.read
            .as_ref()
            .or(self.manage.as_ref())
            .or(self.write.as_ref())
            .map(Capability::address)
    }
}

/// Why an exNode is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// Offsets or lengths overflow 64 bits.
    #[error("mapping {index}: {what} overflows")]
    Overflow {
        /// Mapping index.
        index: usize,
        /// Which range.
        what: &'static str,
    },
    /// A capability element holds a capability of another kind.
    #[error("mapping {index}: the {slot} element holds a {found:?} capability")]
    WrongCapKind {
        /// Mapping index.
        index: usize,
        /// Element name.
        slot: &'static str,
        /// Kind found.
        found: CapKind,
    },
    /// The holes are not in order, overlap one another, are empty, or
    /// overlap a mapping: the bytes a hole says are zeros would not be.
    #[error("hole {index} ({offset}+{length}): {what}")]
    Hole {
        /// Hole index, in document order.
        index: usize,
        /// Its offset.
        offset: u64,
        /// Its length.
        length: u64,
        /// What is wrong with it.
        what: &'static str,
    },
}

/// A run of zeros the file holds without storing them (`<exnode:hole>`):
/// a sparse file's hole, read as zeros with no depot asked. See
/// `docs/exnode.md` ("Sparse files").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hole {
    /// Logical offset in the file.
    pub offset: u64,
    /// Bytes of zeros.
    pub length: u64,
}

impl Hole {
    /// One past its last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.length)
    }
}

/// A network file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExNode {
    /// File-level metadata (`filename`, `lorsversion`, …).
    pub metadata: Vec<Metadata>,
    /// The mappings, in document order; replicas are mappings with the same range.
    pub mappings: Vec<Mapping>,
    /// The parity blocks of an erasure-coded file (`<exnode:parity>`; see
    /// [`crate::erasure`]), never file data: kept apart from `mappings`
    /// so that nothing that reads mappings can take them for it.
    pub parity: Vec<Mapping>,
    /// Runs of zeros not stored anywhere (a sparse file's holes), in order
    /// and apart from one another and from every mapping.
    pub holes: Vec<Hole>,
}

/// The exNode metadata item naming the file (as the LoRS tools write it).
pub const FILENAME_META: &str = "filename";

/// The exNode metadata item with the LoRS version that wrote the file.
pub const LORS_VERSION_META: &str = "lorsversion";

/// The exNode metadata item recording how many replicas of each block the
/// file keeps: set by upload, kept by writes through xio and the mount.
pub const COPIES_META: &str = "lors_copies";

impl ExNode {
    /// Blocks of the exNode: each distinct logical range with the indices
    /// of the mappings (replicas) that hold it.
    pub fn blocks(&self) -> std::collections::BTreeMap<(u64, u64), Vec<usize>> {
        let mut b: std::collections::BTreeMap<(u64, u64), Vec<usize>> = Default::default();
        for (i, m) in self.mappings.iter().enumerate() {
            b.entry((m.exnode_offset, m.logical_length))
                .or_default()
                .push(i);
        }
        b
    }

    /// How many replicas of each block the file keeps: its recorded policy
    /// ([`COPIES_META`]), else — an exNode from before it was recorded, or
    /// from another tool — the most any of its blocks has on distinct
    /// depots. `None` for an exNode with neither.
    pub fn copies_policy(&self) -> Option<usize> {
        if let Some(Value::Integer(n)) = self.meta(COPIES_META) {
            return usize::try_from(*n).ok().filter(|&n| n >= 1);
        }
        (self.blocks().values())
            .map(|idx| {
                let on: std::collections::HashSet<String> = idx
                    .iter()
                    .filter_map(|&i| self.mappings[i].depot())
                    .collect();
                on.len()
            })
            .max()
            .filter(|&n| n >= 1)
    }

    /// Byte ranges of `[0, logical size)` that no live mapping covers: what
    /// a download could not read (a hole is no gap: it is zeros). `live[i]`
    /// says whether mapping `i` answered.
    pub fn uncovered(&self, live: &[bool]) -> Vec<std::ops::Range<u64>> {
        let mut spans: Vec<(u64, u64)> = (self.mappings.iter().zip(live))
            .filter(|(_, l)| **l)
            .map(|(m, _)| (m.exnode_offset, m.logical_end()))
            .chain(self.holes.iter().map(|h| (h.offset, h.end())))
            .collect();
        spans.sort_unstable();
        let mut gaps = Vec::new();
        let mut at = 0u64;
        for (s, e) in spans {
            if s > at {
                gaps.push(at..s);
            }
            at = at.max(e);
        }
        let size = self.logical_size();
        if at < size {
            gaps.push(at..size);
        }
        gaps
    }

    /// Every allocation: the mappings, then the parity blocks. Where
    /// commands number allocations (probes, refresh, trim), parity block
    /// `j` is number `mappings.len() + j`.
    pub fn allocations(&self) -> impl Iterator<Item = &Mapping> {
        self.mappings.iter().chain(&self.parity)
    }

    /// The depots ([`Mapping::depot`]) holding its allocations, sorted,
    /// each once.
    pub fn depots(&self) -> Vec<String> {
        let mut d: Vec<String> = self.allocations().filter_map(Mapping::depot).collect();
        d.sort();
        d.dedup();
        d
    }

    /// Bytes stored on each depot (its allocations' lengths), by depot
    /// name: what a transfer of the whole file moved to or from each.
    pub fn stored_per_depot(&self) -> Vec<(String, u64)> {
        let mut per: std::collections::BTreeMap<String, u64> = Default::default();
        for m in self.allocations() {
            if let Some(d) = m.depot() {
                *per.entry(d).or_default() += m.alloc_length;
            }
        }
        per.into_iter().collect()
    }

    /// A metadata item by name.
    pub fn meta(&self, name: &str) -> Option<&Value> {
        self.metadata
            .iter()
            .find(|m| m.name == name)
            .map(|m| &m.value)
    }

    /// Sets (replaces or appends) a metadata item.
    pub fn set_meta(&mut self, item: Metadata) {
        match self.metadata.iter_mut().find(|m| m.name == item.name) {
            Some(m) => *m = item,
            None => self.metadata.push(item),
        }
    }

    /// Whether the file is erasure-coded: it has parity blocks, or the
    /// record of a code (even one whose parity is all gone). Such a file's
    /// redundancy is its parity, not copies.
    pub fn is_erasure_coded(&self) -> bool {
        !self.parity.is_empty() || self.meta(crate::erasure::META_CODEC).is_some()
    }

    /// A new, empty exNode of the file `name`, with the metadata the LoRS
    /// tools write at its top ([`FILENAME_META`], [`LORS_VERSION_META`]).
    ///
    /// ```
    /// let x = lors_exnode::ExNode::of_file("run42.dat");
    /// assert_eq!(x.filename(), Some("run42.dat"));
    /// ```
    pub fn of_file(name: &str) -> ExNode {
        let mut x = ExNode::default();
        x.set_meta(Metadata::string(FILENAME_META, name));
        x.set_meta(Metadata::double(
            LORS_VERSION_META,
            crate::xml::LORS_VERSION,
        ));
        x
    }

    /// The `filename` metadata.
    pub fn filename(&self) -> Option<&str> {
        match self.meta(FILENAME_META) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        }
    }

    /// The numbers the LoRS tools (and `lors ls`) give the mappings; the
    /// parity blocks are numbered after them ([`ExNode::allocations`]).
    pub fn numbering(&self) -> crate::Numbering {
        crate::Numbering::of(&self.mappings).then(self.parity.len())
    }

    /// Allocation `i` in the numbering of [`ExNode::allocations`].
    pub fn allocation(&self, i: usize) -> Option<&Mapping> {
        self.mappings
            .get(i)
            .or_else(|| self.parity.get(i.checked_sub(self.mappings.len())?))
    }

    /// The file's logical size: the end of the furthest mapping or hole.
    pub fn logical_size(&self) -> u64 {
        let data = self.mappings.iter().map(Mapping::logical_end).max();
        data.unwrap_or(0)
            .max(self.holes.last().map_or(0, Hole::end))
    }

    /// Bytes the file holds as holes.
    pub fn hole_bytes(&self) -> u64 {
        self.holes.iter().map(|h| h.length).sum()
    }

    /// The hole holding byte `offset`, if one does.
    pub fn hole_at(&self, offset: u64) -> Option<&Hole> {
        let i = self.holes.partition_point(|h| h.end() <= offset);
        self.holes.get(i).filter(|h| h.offset <= offset)
    }

    /// The holes that meet `[start, end)`, clipped to it.
    ///
    /// ```
    /// use lors_exnode::{ExNode, model::Hole};
    /// let mut x = ExNode::default();
    /// x.holes = vec![Hole { offset: 10, length: 10 }, Hole { offset: 40, length: 5 }];
    /// let h: Vec<_> = x.holes_in(15, 42).collect();
    /// assert_eq!(h, [Hole { offset: 15, length: 5 }, Hole { offset: 40, length: 2 }]);
    /// ```
    pub fn holes_in(&self, start: u64, end: u64) -> impl Iterator<Item = Hole> + '_ {
        let first = self.holes.partition_point(|h| h.end() <= start);
        self.holes[first..]
            .iter()
            .take_while(move |h| h.offset < end)
            .map(move |h| {
                let offset = h.offset.max(start);
                Hole {
                    offset,
                    length: h.end().min(end) - offset,
                }
            })
    }

    /// Takes `[start, end)` out of the holes: the range is about to hold
    /// data (a write), or no longer be part of the file (a truncation).
    pub fn fill_holes(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut kept = Vec::with_capacity(self.holes.len() + 1);
        for h in self.holes.drain(..) {
            if h.end() <= start || h.offset >= end {
                kept.push(h);
                continue;
            }
            if h.offset < start {
                kept.push(Hole {
                    offset: h.offset,
                    length: start - h.offset,
                });
            }
            if h.end() > end {
                kept.push(Hole {
                    offset: end,
                    length: h.end() - end,
                });
            }
        }
        self.holes = kept;
    }

    /// Checks ranges and capability kinds (parity blocks are numbered after
    /// the mappings).
    pub fn validate(&self) -> Result<(), ModelError> {
        for (index, m) in self.allocations().enumerate() {
            if m.exnode_offset.checked_add(m.logical_length).is_none() {
                return Err(ModelError::Overflow {
                    index,
                    what: "exnode_offset + logical_length",
                });
            }
            if m.alloc_offset.checked_add(m.alloc_length).is_none() {
                return Err(ModelError::Overflow {
                    index,
                    what: "alloc_offset + alloc_length",
                });
            }
            for (slot, kind) in [
                ("read", CapKind::Read),
                ("write", CapKind::Write),
                ("manage", CapKind::Manage),
            ] {
                if let Some(c) = m.cap(kind)
                    && c.kind != kind
                {
                    return Err(ModelError::WrongCapKind {
                        index,
                        slot,
                        found: c.kind,
                    });
                }
            }
        }
        self.validate_holes()
    }

    /// Holes in order, each non-empty and apart from the others and from
    /// every mapping and parity block: a byte a hole names is a zero for
    /// certain, never a byte a dead depot held.
    fn validate_holes(&self) -> Result<(), ModelError> {
        let bad = |index: usize, h: &Hole, what| {
            Err(ModelError::Hole {
                index,
                offset: h.offset,
                length: h.length,
                what,
            })
        };
        let mut prev_end = 0;
        for (index, h) in self.holes.iter().enumerate() {
            if h.length == 0 {
                return bad(index, h, "is empty");
            }
            if h.offset.checked_add(h.length).is_none() {
                return bad(index, h, "overflows");
            }
            if index > 0 && h.offset < prev_end {
                return bad(index, h, "is out of order or overlaps the hole before it");
            }
            prev_end = h.end();
        }
        if self.holes.is_empty() {
            return Ok(());
        }
        for m in self.allocations() {
            let (a, b) = (m.exnode_offset, m.logical_end());
            let i = self.holes.partition_point(|h| h.end() <= a);
            if let Some(h) = self.holes.get(i)
                && h.offset < b
                && a < b
            {
                return bad(i, h, "overlaps a mapping");
            }
        }
        Ok(())
    }

    /// Whether any mapping still carries a write or manage capability: such an
    /// exNode is a secret and is written with mode 0600.
    pub fn holds_secrets(&self) -> bool {
        self.allocations()
            .any(|m| m.write.is_some() || m.manage.is_some())
    }
}
