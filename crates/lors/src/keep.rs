//! Keeping stored data alive and whole: one keeper cycle over an exNode.
//!
//! Every allocation has a lease, and a depot deletes an allocation nobody
//! refreshes; a depot that dies leaves its blocks one copy short. [`cycle`]
//! does what an operator would, in this order:
//!
//! 1. probes every mapping (one connection per depot, in parallel), and
//!    reads back and checks those the caller's scrub budget names;
//! 2. extends the lease of each live allocation with less than the margin
//!    left;
//! 3. gives each block with fewer live replicas than the policy new ones,
//!    copied depot to depot from a live replica onto depots that do not
//!    hold it;
//! 4. drops the mappings that are gone for good (expired, freed, refused)
//!    from blocks that have a live replica, and those of unreachable or
//!    hung depots once their block has its copies again elsewhere (their
//!    allocations are left to their leases: a depot that cannot be reached
//!    cannot be asked to free them).
//!
//! It never drops the last replica of a block it cannot replace, and never
//! makes a replica from anything but a live one: a block with no live
//! replica is reported lost, with its bytes. The caller writes the result.
//!
//! ```no_run
//! # async fn f(x: lors_exnode::ExNode, pool: std::sync::Arc<lors::Pool>) -> lors::Result<()> {
//! use std::time::Duration;
//! use lors::keep::{Places, Policy, Probed, cycle};
//! let policy = Policy::new(lors::manage::Lease::Max, Duration::from_secs(86_400));
//! let depots = Places::given(vec!["d4:6714".to_string()]);
//! let kept = cycle(&x, &depots, &policy, &pool, &[], &Probed::none()).await?;
//! println!("{} refreshed, {} new replicas, lost {:?}", kept.refreshed, kept.healed, kept.lost);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lors_exnode::{ExNode, Mapping};
use lors_ibp::proto::Reliability;

use crate::error::{Cause, Error, Result};
use crate::manage::{self, CopyOptions, Lease, Probe, Replicas};
use crate::pool::Pool;
use crate::progress::NoProgress;

/// How long a keeper waits for a silent depot by default: a restart, a
/// network blip or a paused process is back well within it.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(15 * 60);

/// The answer of [`Places`]: depots, or why there are none.
pub type Found = std::result::Result<Vec<String>, String>;

/// Where a cycle's new replicas may go, found the first time a file
/// needs one: a file whose blocks all have their copies asks no L-Bone
/// (one that is down costs nothing, and says nothing, until it is
/// needed).
///
/// ```
/// # async fn f() {
/// let given = lors::keep::Places::given(vec!["d1.example.org:6714".into()]);
/// let lazy = lors::keep::Places::new(|| Box::pin(async { Err("no L-Bone".to_string()) }));
/// assert_eq!(given.get().await, Ok(&["d1.example.org:6714".to_string()][..]));
/// assert_eq!(lazy.get().await, Err("no L-Bone"));
/// # }
/// ```
pub struct Places<'a> {
    find: Box<dyn Fn() -> Pin<Box<dyn Future<Output = Found> + Send + 'a>> + Send + Sync + 'a>,
    found: tokio::sync::OnceCell<Found>,
}

impl<'a> Places<'a> {
    /// Asks `find` when first needed, once.
    pub fn new(
        find: impl Fn() -> Pin<Box<dyn Future<Output = Found> + Send + 'a>> + Send + Sync + 'a,
    ) -> Self {
        Places {
            find: Box::new(find),
            found: tokio::sync::OnceCell::new(),
        }
    }

    /// These depots.
    pub fn given(depots: Vec<String>) -> Self {
        Places::known(Ok(depots))
    }

    /// None, for `why`.
    pub fn given_none(why: String) -> Self {
        Places::known(Err(why))
    }

    fn known(found: Found) -> Self {
        Places {
            find: Box::new(|| Box::pin(async { Ok(Vec::new()) })),
            found: tokio::sync::OnceCell::new_with(Some(found)),
        }
    }

    /// The depots, asked for now if not yet.
    pub async fn get(&self) -> std::result::Result<&[String], &str> {
        match self.found.get_or_init(|| (self.find)()).await {
            Ok(d) => Ok(d),
            Err(why) => Err(why),
        }
    }

    /// The depots to use (none when they could not be found), and why
    /// there are none.
    async fn or_none(&self) -> (&[String], Option<String>) {
        match self.get().await {
            Ok(d) => (d, None),
            Err(why) => (&[], Some(why.to_owned())),
        }
    }
}

/// What a keeper keeps.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Live replicas each block keeps; `None`: the exNode's own
    /// ([`ExNode::copies_policy`]).
    pub copies: Option<usize>,
    /// What a refresh sets.
    pub lease: Lease,
    /// An allocation with less than this left is refreshed.
    pub margin: Duration,
    /// New replicas: their lease, reliability, and the stop signal.
    pub copy: CopyOptions,
    /// How long a depot may not answer before its replicas are made again
    /// elsewhere (the mark is `lors_silent_since` on its mappings); zero:
    /// at once.
    pub grace: Duration,
}

impl Policy {
    /// Refreshes to `lease` with `margin`; new replicas of a day, hard; the
    /// exNode's own copy count.
    pub fn new(lease: Lease, margin: Duration) -> Self {
        Policy {
            copies: None,
            lease,
            margin,
            copy: CopyOptions {
                duration: Duration::from_secs(86_400),
                reliability: Reliability::Hard,
                stop: None,
            },
            grace: DEFAULT_GRACE,
        }
    }
}

/// What one cycle did and found.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The exNode as it should now be (the input when nothing changed).
    pub exnode: ExNode,
    /// Whether it differs from the input.
    pub changed: bool,
    /// Live replicas each block should have.
    pub copies: usize,
    /// Leases extended.
    pub refreshed: usize,
    /// Leases that could not be extended: mapping index in the input, why.
    pub not_refreshed: Vec<(usize, Cause)>,
    /// New replicas made.
    pub healed: usize,
    /// Mappings dropped.
    pub trimmed: usize,
    /// Byte ranges with no live replica: lost unless their depot comes back.
    pub lost: Vec<Range<u64>>,
    /// Blocks still short of their copies after the cycle (no depot could
    /// take them), as byte ranges.
    pub short: Vec<Range<u64>>,
    /// Why healing fell short, if it did.
    pub heal_error: Option<Unhealed>,
    /// Stored bytes read back and checked.
    pub scrubbed: u64,
    /// Replicas the scrub found corrupt: mapping index in the input, why.
    pub corrupt: Vec<(usize, String)>,
    /// The corrupt replicas dropped (their blocks have good ones): to be
    /// freed once the new exNode is written ([`release`]).
    pub dropped_corrupt: Vec<lors_exnode::Mapping>,
    /// Replicas dropped on a depot silent past the grace (their blocks
    /// have live ones again): to be freed once the new exNode is written,
    /// which, while the depot is away, records them beside it for a later
    /// cycle to free when it answers.
    pub stale: Vec<lors_exnode::Mapping>,
    /// Of an erasure-coded file: its code, and each stripe left below its
    /// full margin after the cycle (its blocks were not all made again),
    /// with why. `short` and `heal_error` then say nothing more.
    pub stripes: Option<(lors_exnode::erasure::Scheme, Vec<StripeShort>)>,
}

/// A stripe of an erasure-coded file still missing blocks after a cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeShort {
    /// The stripe.
    pub stripe: u64,
    /// Its bytes in the file.
    pub bytes: Range<u64>,
    /// How many more of its blocks it can lose and still be read
    /// (negative: it cannot be read now).
    pub margin: i64,
    /// Why its blocks were not made again.
    pub why: Unhealed,
}

/// Why a cycle could not give every block its copies (or every stripe its
/// blocks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealed {
    /// No depot to put them on, and why: the L-Bone's failure, no lock
    /// beside the file, none given.
    #[error("{0}")]
    NoDepots(String),
    /// Copying failed: the last failure, with its depot and status when a
    /// depot answered with one.
    #[error("{0}")]
    Failed(Cause),
}

/// Reads back and checks the live mappings among `which`: the corrupt ones
/// with why, and the stored bytes read.
async fn scrub_some(
    x: &ExNode,
    probes: &[Probe],
    which: &[usize],
    pool: &Arc<Pool>,
) -> (Vec<(usize, String)>, u64) {
    let idx: Vec<usize> = (which.iter().copied())
        .filter(|&i| probes.get(i).is_some_and(Probe::is_live))
        .collect();
    if idx.is_empty() {
        return (Vec::new(), 0);
    }
    let sub = ExNode {
        holes: Vec::new(),
        parity: Vec::new(),
        metadata: Vec::new(),
        mappings: idx.iter().map(|&i| x.mappings[i].clone()).collect(),
    };
    let bytes = sub.mappings.iter().map(|m| m.alloc_length).sum();
    match crate::verify::verify(&sub, pool, Arc::new(NoProgress)).await {
        Ok(checks) => {
            let bad = (idx.iter().zip(checks))
                .filter(|(_, c)| matches!(c, crate::verify::Check::Corrupt(_)))
                .map(|(&i, c)| (i, c.reason()))
                .collect();
            (bad, bytes)
        }
        Err(e) => {
            tracing::warn!(error = %e, "scrub skipped");
            (Vec::new(), 0)
        }
    }
}

/// One keeper cycle over `x`: probe, scrub the mappings `scrub` names
/// (read back and checked, [`crate::verify`]), refresh, heal onto
/// `depots`, trim (see the module docs). A corrupt replica counts as
/// dead: it is replaced from a good one, then dropped, for the caller to
/// free ([`Kept::dropped_corrupt`]). Fails only when stopped
/// ([`Error::Interrupted`]: the replicas made are released and the exNode
/// is to stay as it was); everything else that goes wrong is in the
/// result.
pub async fn cycle(
    x: &ExNode,
    depots: &Places<'_>,
    policy: &Policy,
    pool: &Arc<Pool>,
    scrub: &[usize],
    probed: &Probed,
) -> Result<Kept> {
    let erasure = lors_exnode::erasure::Erasure::of(x)?;
    let probes = probed.of_exnode(x, pool).await;
    // Leases first: they are what is lost soonest, and the scrub's reads
    // (of a depot that trickles, say) must not hold them up.
    let (refreshed, not_refreshed) = refresh_due(x, &probes, policy, pool).await;
    let (corrupt, scrubbed) = scrub_some(x, &probes, scrub, pool).await;
    // From here a depot silent for less than the grace counts as there.
    let now = lors_ibp::units::unix_now();
    let (marked, marks_changed, probes) = pause::apply(x, probes, policy.grace, now);
    let x = &marked;
    if let Some(e) = erasure {
        let seen = stripes::Seen {
            probes,
            corrupt,
            scrubbed,
            refreshed,
            not_refreshed,
        };
        let mut k = stripes::cycle(x, e, seen, depots, policy, pool).await?;
        k.changed |= marks_changed;
        return Ok(k);
    }
    let live = |i: usize| probes[i].is_live() && !corrupt.iter().any(|(c, _)| *c == i);
    let copies = policy
        .copies
        .or_else(|| x.copies_policy())
        .unwrap_or(1)
        .max(1);
    let blocks = x.blocks();
    let (new, heal_error) = heal(x, &blocks, &live, copies, depots, policy, pool).await?;
    let healed = new.len();
    let s = settle(x, &blocks, &probes, &live, new, copies);
    Ok(Kept {
        changed: s.trimmed > 0 || healed > 0 || marks_changed,
        scrubbed,
        corrupt,
        dropped_corrupt: s.bad,
        stale: s.stale,
        exnode: s.kept,
        copies,
        refreshed,
        not_refreshed,
        healed,
        trimmed: s.trimmed,
        lost: s.lost,
        short: s.short,
        stripes: None,
        heal_error,
    })
}

/// Extends the leases of the live allocations (parity blocks too) with
/// less than the margin left: how many were, and those that could not be,
/// with why.
async fn refresh_due(
    x: &ExNode,
    probes: &[Probe],
    policy: &Policy,
    pool: &Arc<Pool>,
) -> (usize, Vec<(usize, Cause)>) {
    let due: Vec<usize> = (0..probes.len())
        .filter(|&i| match &probes[i] {
            Probe::Live(p) => u64::try_from(p.seconds_left).unwrap_or(0) < policy.margin.as_secs(),
            _ => false,
        })
        .collect();
    let mut refreshed = 0;
    let mut not_refreshed = Vec::new();
    if due.is_empty() {
        return (refreshed, not_refreshed);
    }
    let sub = ExNode {
        holes: Vec::new(),
        parity: Vec::new(),
        metadata: Vec::new(),
        mappings: (due.iter())
            .filter_map(|&i| x.allocation(i).cloned())
            .collect(),
    };
    for (j, r) in manage::refresh(&sub, policy.lease, pool, &NoProgress).await {
        match r {
            Ok(_) => refreshed += 1,
            Err(e) => not_refreshed.push((due[j], e)),
        }
    }
    (refreshed, not_refreshed)
}

/// New replicas for the blocks short of live ones, grouped by how many
/// they lack, each group copied from its live replicas alone; and why
/// healing fell short, if it did. Stopped, it releases what it made.
async fn heal(
    x: &ExNode,
    blocks: &Blocks,
    live: &(dyn Fn(usize) -> bool + Sync),
    copies: usize,
    places: &Places<'_>,
    policy: &Policy,
    pool: &Arc<Pool>,
) -> Result<(Vec<Mapping>, Option<Unhealed>)> {
    let mut by_lack: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for idx in blocks.values() {
        let good: Vec<usize> = idx.iter().copied().filter(|&i| live(i)).collect();
        if !good.is_empty() && good.len() < copies {
            by_lack.entry(copies - good.len()).or_default().extend(good);
        }
    }
    let mut new = Vec::new();
    if by_lack.is_empty() {
        return Ok((new, None));
    }
    let (depots, unplaced) = places.or_none().await;
    let mut heal_error = None;
    for (lack, sources) in by_lack {
        let sub = ExNode {
            holes: Vec::new(),
            parity: Vec::new(),
            metadata: x.metadata.clone(),
            mappings: sources.iter().map(|&i| x.mappings[i].clone()).collect(),
        };
        let more = Replicas::More(lack);
        match manage::replicate(&sub, depots, more, &policy.copy, pool, &NoProgress).await {
            Ok(y) => new.extend(y.mappings.into_iter().skip(sub.mappings.len())),
            Err(e @ Error::Interrupted { .. }) => {
                // This run's earlier groups were not released by it.
                release(&new, pool).await;
                return Err(e);
            }
            Err(e) => heal_error = Some(Unhealed::Failed(Cause::from(&e))),
        }
    }
    // Without depots, why there are none is the error that matters.
    Ok((
        new,
        heal_error.map(|e| unplaced.map_or(e, Unhealed::NoDepots)),
    ))
}

/// The blocks of an exNode: mapping indices by (offset, length).
type Blocks = BTreeMap<(u64, u64), Vec<usize>>;

/// The exNode after a cycle, and what it found.
struct Settled {
    kept: ExNode,
    trimmed: usize,
    short: Vec<Range<u64>>,
    lost: Vec<Range<u64>>,
    /// Corrupt replicas dropped.
    bad: Vec<Mapping>,
    /// Replicas on depots silent past the grace, dropped.
    stale: Vec<Mapping>,
}

/// What each block has live now, counting the `new` replicas: the
/// mappings to keep and to drop (see the module docs), the blocks still
/// short, the bytes lost.
fn settle(
    x: &ExNode,
    blocks: &Blocks,
    probes: &[Probe],
    live: &(dyn Fn(usize) -> bool + Sync),
    new: Vec<Mapping>,
    copies: usize,
) -> Settled {
    let mut kept = ExNode {
        holes: x.holes.clone(),
        parity: x.parity.clone(),
        metadata: x.metadata.clone(),
        mappings: Vec::new(),
    };
    let mut live_now = Vec::new();
    let live_after = |range: (u64, u64), idx: &[usize]| {
        idx.iter().filter(|&&i| live(i)).count()
            + (new.iter())
                .filter(|m| m.exnode_offset == range.0 && m.logical_length == range.1)
                .count()
    };
    let mut trimmed = 0;
    let mut short = Vec::new();
    let mut bad = Vec::new();
    let mut stale = Vec::new();
    for (range, idx) in blocks {
        let alive = live_after(*range, idx);
        let whole = alive >= copies;
        if !whole && alive > 0 {
            short.push(range.0..range.0 + range.1);
        }
        for &i in idx {
            let drop = match &probes[i] {
                // Corrupt: replaced above, and freed by the caller.
                Probe::Live(_) if !live(i) => {
                    if alive > 0 {
                        bad.push(x.mappings[i].clone());
                    }
                    alive > 0
                }
                Probe::Live(_) => false,
                // Gone for good, but a lost block's mappings stay: the
                // exNode never names less of the file than before.
                Probe::Gone | Probe::Refused(_) => alive > 0,
                // Silent past the grace: dropped once the block is whole
                // again, and freed when its depot answers (the caller
                // records it).
                Probe::Unreachable(_) | Probe::NoAnswer(_) => {
                    if whole {
                        stale.push(x.mappings[i].clone());
                    }
                    whole
                }
                // Perhaps back tomorrow: kept while the block needs it.
                Probe::Failed(_) => whole,
            };
            if drop {
                trimmed += 1;
            } else {
                live_now.push(live(i));
                kept.mappings.push(x.mappings[i].clone());
            }
        }
    }
    // Mappings outside any block (none are, but keep them whatever they are).
    for (i, m) in x.mappings.iter().enumerate() {
        if !blocks.values().any(|idx| idx.contains(&i)) {
            live_now.push(live(i));
            kept.mappings.push(m.clone());
        }
    }
    live_now.extend(new.iter().map(|_| true));
    kept.mappings.extend(new);
    let lost = kept.uncovered(&live_now);
    Settled {
        kept,
        trimmed,
        short,
        lost,
        bad,
        stale,
    }
}

/// Frees the allocations of `made` (named by no saved exNode), each
/// release within [`crate::stall::RELEASE_WAIT`]; those a depot does not
/// free are left to their leases.
pub async fn release(made: &[lors_exnode::Mapping], pool: &Arc<Pool>) {
    if made.is_empty() {
        return;
    }
    let kept = pool.release_all(made.to_vec()).await;
    if !kept.is_empty() {
        tracing::warn!(
            allocations = kept.len(),
            "new replicas not released: left to their leases"
        );
    }
}

mod files;
mod keeper;
mod pause;
mod probed;
mod stripes;
pub use files::{Cursor, SaveError, Scrub, Totals, save_kept};
pub use keeper::{Cycle, FileError, Keeper, Outcome, Targets};
pub use probed::Probed;
