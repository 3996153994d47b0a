//! Keeping exNode files over many cycles: the scrub's budget and its place
//! between cycles ([`Scrub`], [`Cursor`]), what a cycle found over all the
//! files ([`Totals`]), and writing a kept exNode back unless another writer
//! changed it meanwhile ([`save_kept`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lors_exnode::ExNode;

use super::{Kept, release};
use crate::pool::Pool;
use crate::xnd::XndError;

/// Where the scrub goes on: the exNode and its first mapping not yet
/// checked. Kept in a state file between runs.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    /// The exNode file.
    pub file: PathBuf,
    /// Its first mapping not yet checked.
    pub mapping: usize,
}

impl Cursor {
    /// The mapping of a cursor whose file the scrub has finished: the
    /// next cycle goes on with the file after it.
    pub const DONE: usize = usize::MAX;

    /// The cursor saved at `path`, or the start (a state that cannot be
    /// read, or is not one, starts the scrub over).
    pub fn load(path: Option<&Path>) -> Cursor {
        path.and_then(|p| crate::xnd::read_regular(p, 1 << 20).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Saves it at `path`, whole or not at all, never through a link: a
    /// new file made beside it (exclusively), synced, renamed over it.
    pub fn save(&self, path: Option<&Path>) -> std::io::Result<()> {
        let Some(path) = path else { return Ok(()) };
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        crate::xnd::save_bytes(path, &bytes, 0o600).map_err(std::io::Error::other)
    }
}

/// The scrub's share of one cycle: stored bytes it may still read back,
/// and where it is.
#[derive(Debug, Clone)]
pub struct Scrub {
    /// Bytes left this cycle.
    pub budget: u64,
    /// Where it goes on.
    pub cursor: Cursor,
}

impl Scrub {
    /// The mappings of `x` (the file at `path`) to check this cycle, from
    /// `first` on as far as the budget goes; the cursor moves past them.
    ///
    /// ```
    /// use lors::keep::{Cursor, Scrub};
    /// use lors_exnode::{ExNode, Mapping};
    /// let m = Mapping { alloc_length: 100, ..Mapping::default() };
    /// let x = ExNode { mappings: vec![m; 5], ..ExNode::default() };
    /// let mut s = Scrub { budget: 250, cursor: Cursor::default() };
    /// assert_eq!(s.plan(&x, "a.xnd".as_ref(), 1), vec![1, 2, 3]);
    /// assert_eq!((s.budget, s.cursor.mapping), (0, 4));
    /// ```
    pub fn plan(&mut self, x: &ExNode, path: &Path, first: usize) -> Vec<usize> {
        let mut checked = Vec::new();
        let mut next = first;
        while next < x.mappings.len() && self.budget > 0 {
            self.budget = self.budget.saturating_sub(x.mappings[next].alloc_length);
            checked.push(next);
            next += 1;
        }
        if !checked.is_empty() || self.budget > 0 {
            // The place to go on from: later in this file, or (past its
            // end, or a place it never had) the next file.
            self.cursor = Cursor {
                file: path.to_owned(),
                mapping: match next < x.mappings.len() {
                    true => next,
                    false => Cursor::DONE,
                },
            };
        }
        checked
    }
}

/// What a cycle did over every exNode.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Totals {
    /// ExNodes kept.
    pub exnodes: usize,
    /// Stored bytes read back and checked.
    pub scrubbed_bytes: u64,
    /// Corrupt replicas found.
    pub corrupt: usize,
    /// Leases extended.
    pub refreshed: usize,
    /// Leases not extended.
    pub not_refreshed: usize,
    /// Replicas made.
    pub healed: usize,
    /// Blocks of erasure-coded files made again.
    pub remade: usize,
    /// Mappings dropped.
    pub trimmed: usize,
    /// Bytes with no live replica.
    pub lost_bytes: u64,
    /// Blocks short of their copies, and stripes of erasure-coded files
    /// below their full margin.
    pub short_blocks: usize,
    /// ExNodes that could not be kept.
    pub failed: usize,
    /// ExNodes another lors command was changing: left to the next cycle.
    pub busy: usize,
}

impl Totals {
    /// Counts one exNode's cycle.
    pub fn add(&mut self, k: &Kept) {
        self.exnodes += 1;
        self.scrubbed_bytes += k.scrubbed;
        self.corrupt += k.corrupt.len();
        self.refreshed += k.refreshed;
        self.not_refreshed += k.not_refreshed.len();
        match &k.stripes {
            Some((_, short)) => {
                self.remade += k.healed;
                self.short_blocks += short.len();
            }
            None => {
                self.healed += k.healed;
                self.short_blocks += k.short.len();
            }
        }
        self.trimmed += k.trimmed;
        self.lost_bytes += k.lost.iter().map(|r| r.end - r.start).sum::<u64>();
    }

    /// Whether everything is kept: nothing lost, short, unrefreshed or
    /// failed.
    pub fn all_kept(&self) -> bool {
        self.lost_bytes == 0
            && self.failed == 0
            && self.not_refreshed == 0
            && self.short_blocks == 0
    }
}

/// Why a kept exNode was not written back.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// Another writer changed the file while the cycle ran.
    #[error("it changed while it was kept: left to the next cycle")]
    Changed,
    /// The file could not be written.
    #[error(transparent)]
    Write(#[from] XndError),
}

/// Writes a changed exNode back to `path`, whose bytes were `before` when
/// the cycle read it, then frees the corrupt replicas it dropped. A second
/// writer (augment, trim, another keeper) that changed the file meanwhile
/// wins: this cycle's new replicas are freed and the file is left to the
/// next cycle (an error says so). The depots of the new replicas.
pub async fn save_kept(
    path: &Path,
    before: &[u8],
    k: &Kept,
    pool: &Arc<Pool>,
) -> Result<Vec<String>, SaveError> {
    // What this cycle made: named by the kept exNode and not by the one
    // it read (an erasure-coded file's new blocks are not all at the end,
    // parity among them). Unreadable before: nothing is taken as new.
    let old = lors_exnode::xml::parse(before).map(|x| crate::commit::named(&x));
    let made: Vec<lors_exnode::Mapping> = match &old {
        Ok(old) => (k.exnode.allocations())
            .filter(|m| crate::commit::key(m).is_some_and(|key| !old.contains(&key)))
            .cloned()
            .collect(),
        Err(_) => Vec::new(),
    };
    if std::fs::read(path).ok().as_deref() != Some(before) {
        release(&made, pool).await;
        return Err(SaveError::Changed);
    }
    // Named nowhere once the save is done: freed after it, recorded
    // beside the file until then (a depot that does not free one leaves
    // it in the record for the next cycle's settle).
    let free = (k.dropped_corrupt.iter())
        .chain(&k.stale)
        .cloned()
        .collect();
    crate::commit::save_then_release(path, &k.exnode, free, pool)
        .await
        .map_err(|e| match e {
            crate::Error::Xnd(x) => SaveError::Write(x),
            e => SaveError::Write(XndError::Write {
                path: path.to_owned(),
                source: std::io::Error::other(e.to_string()),
            }),
        })?;
    Ok(made.iter().filter_map(|m| m.depot()).collect())
}
