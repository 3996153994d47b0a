//! Mappings dropped from an exNode (trim), capabilities stripped (modify):
//! changes of the exNode alone, nothing on a depot.

use lors_exnode::{ExNode, Mapping};

use crate::error::{Error, Result};

/// Which mappings to act on.
#[derive(Debug, Clone)]
pub enum Selection {
    /// By index in the exNode.
    Indices(Vec<usize>),
    /// Every mapping on one of these depots (`host:port`).
    Depots(Vec<String>),
    /// Every mapping not on one of these depots.
    NotOn(Vec<String>),
}

impl Selection {
    /// Whether mapping `i` is selected.
    pub fn contains(&self, i: usize, m: &Mapping) -> bool {
        let d = m.depot().unwrap_or_default();
        match self {
            Selection::Indices(v) => v.contains(&i),
            Selection::Depots(v) => v.contains(&d),
            Selection::NotOn(v) => !v.contains(&d),
        }
    }
}

/// Result of a trim.
#[derive(Debug)]
pub struct Trimmed {
    /// The exNode without the selected mappings.
    pub exnode: ExNode,
    /// How many mappings were removed.
    pub removed: usize,
    /// The removed allocations, each with its index in the input: what a
    /// `--decrement` releases once the trimmed exNode is saved
    /// ([`crate::commit::save_then_release`]), never before.
    pub dropped: Vec<(usize, Mapping)>,
}

/// Removes the selected allocations (mappings, and parity blocks numbered
/// after them) from a copy of `x`; nothing on a depot changes. Unless
/// `allow_holes`, refuses to remove the last replica of any block — or,
/// for an erasure-coded file, to leave any stripe with fewer blocks than
/// it needs to be read. Releasing what was removed is the caller's, after
/// the result is saved: [`crate::commit`].
///
/// ```
/// use lors::manage::{Selection, trim};
/// use lors_exnode::{ExNode, Mapping};
/// let m = Mapping { logical_length: 10, ..Mapping::default() };
/// let x = ExNode { mappings: vec![m.clone(), m], ..ExNode::default() };
/// let t = trim(&x, &Selection::Indices(vec![1]), false)?;
/// assert_eq!((t.exnode.mappings.len(), t.dropped[0].0), (1, 1));
/// assert!(trim(&t.exnode, &Selection::Indices(vec![0]), false).is_err()); // the last copy
/// # Ok::<(), lors::Error>(())
/// ```
pub fn trim(x: &ExNode, sel: &Selection, allow_holes: bool) -> Result<Trimmed> {
    let erasure = lors_exnode::erasure::Erasure::of(x)?;
    if let (Some(e), false) = (&erasure, allow_holes) {
        // A data block's last copy may go while its stripe can rebuild it.
        let kept = |i: usize| x.allocation(i).is_some_and(|m| !sel.contains(i, m));
        if let Some(m) = e.margins(x, kept).into_iter().find(|m| m.margin < 0) {
            return Err(Error::StripeBelowNeed {
                stripe: m.stripe,
                bytes: m.bytes,
                left: m.blocks,
                need: e.scheme.data,
            });
        }
    }
    if !allow_holes && erasure.is_none() {
        for ((offset, len), idx) in x.blocks() {
            if idx.iter().all(|&i| sel.contains(i, &x.mappings[i])) {
                return Err(Error::LastReplica {
                    offset,
                    end: offset + len,
                });
            }
        }
    }
    let mut keep = ExNode {
        holes: x.holes.clone(),
        parity: Vec::new(),
        metadata: x.metadata.clone(),
        mappings: Vec::new(),
    };
    let mut dropped = Vec::new();
    let mut parity = Vec::new();
    for (i, m) in x.allocations().enumerate() {
        if sel.contains(i, m) {
            dropped.push((i, m.clone()));
            continue;
        }
        match i < x.mappings.len() {
            true => keep.mappings.push(m.clone()),
            false => parity.push((i, m.clone())),
        }
    }
    keep.parity = parity.iter().map(|(_, m)| m.clone()).collect();
    if erasure.is_some() && lors_exnode::erasure::Erasure::of(&keep).is_err() {
        // Holes allowed and whole stripes gone: the record no longer
        // describes what is left, and parity cannot rebuild a stripe with
        // nothing left of it. The file becomes its remaining data blocks;
        // the parity goes with the rest.
        lors_exnode::erasure::Erasure::forget(&mut keep);
        keep.parity.clear();
        dropped.extend(parity);
        dropped.sort_by_key(|(i, _)| *i);
    }
    Ok(Trimmed {
        exnode: keep,
        removed: dropped.len(),
        dropped,
    })
}

/// A copy of the exNode without the chosen capabilities, for sharing: strip
/// write and manage to hand out a read-only file.
pub fn modify(x: &ExNode, strip_read: bool, strip_write: bool, strip_manage: bool) -> ExNode {
    let mut y = x.clone();
    for m in y.mappings.iter_mut().chain(&mut y.parity) {
        if strip_read {
            m.read = None;
        }
        if strip_write {
            m.write = None;
        }
        if strip_manage {
            m.manage = None;
        }
    }
    y
}
