//! Shares of erasure-coded files: every block, parity too, gets an alias
//! of its whole allocation, and the shared exNode keeps the code's layout
//! (its metadata, stripes and block order), so a reader rebuilds what a
//! lost block held as it would from the owner's. A stripe is read whole,
//! so a share is of the whole file; a block whose depot did not answer is
//! left unreadable in its place, as long as every stripe keeps the blocks
//! it needs.

use std::collections::BTreeMap;

use lors_exnode::erasure::Erasure;
use lors_exnode::{ExNode, Mapping};
use lors_ibp::caps::CapSet;

use super::{Cut, Options, SEAL_META, ShareError};
use crate::manage::Failure;

/// A cut per allocation, each the whole of it.
pub(super) fn cuts(x: &ExNode, opts: &Options) -> Result<Vec<Cut>, ShareError> {
    if let Some((off, len)) = opts.range
        && (off, len) != (0, x.logical_size())
    {
        return Err(ShareError::RangeOfCoded);
    }
    Ok((x.allocations().enumerate())
        .map(|(index, m)| {
            let mut metadata = m.metadata.clone();
            metadata.retain(|d| d.name != SEAL_META);
            Cut {
                index,
                window: (m.alloc_offset, m.alloc_length),
                mapping: Mapping {
                    alloc_offset: 0,
                    metadata,
                    read: None,
                    write: None,
                    manage: None,
                    ..m.clone()
                },
            }
        })
        .collect())
}

/// Why the blocks aliased (`got`, by allocation) cannot make a share: a
/// stripe short of the blocks it needs.
pub(super) fn refusal(
    x: &ExNode,
    got: &BTreeMap<usize, CapSet>,
    failures: &[(usize, Failure)],
) -> Option<ShareError> {
    let e = match Erasure::of(x) {
        Ok(Some(e)) => e,
        // An exNode whose code does not parse was refused before; nothing
        // to measure here.
        _ => return None,
    };
    let short = (e.margins(x, |i| got.contains_key(&i)).into_iter()).find(|m| m.margin < 0)?;
    let why = (failures.last()).map_or_else(|| "no alias made".to_owned(), |(_, f)| f.to_string());
    Some(ShareError::StripeUnshared {
        stripe: short.stripe,
        from: short.bytes.start,
        to: short.bytes.end,
        shared: short.blocks,
        need: e.scheme.data,
        why,
    })
}
