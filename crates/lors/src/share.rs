//! Revocable, attenuated sharing through IBP aliases.
//!
//! Handing out an exNode stripped of its write and manage capabilities
//! (`lors modify -w --strip-manage`) gives read access for as long as the
//! allocations live, and it cannot be taken back: the read keys are the
//! owner's own. [`share`] gives each replica's reader a key of its own
//! instead: an IBP alias (ALIAS_ALLOCATE), a second key set for a window of
//! the allocation with a lease of its own. The shared exNode carries only
//! the aliases' read capabilities, so whoever holds it can read those
//! bytes — nothing outside the window, nothing after the alias's lease, and
//! never write, resize or free anything.
//!
//! [`revoke`] deletes the aliases (ALIAS_MANAGE DECR, which needs the
//! manage key of the allocation itself): the next read with the shared
//! exNode fails with "no allocation has this key", while the owner's keys
//! go on working. Deleting an alias needs its own manage key too; the
//! shared exNode carries it sealed under the owner's manage key of the
//! allocation (ChaCha20-Poly1305 under a key derived with BLAKE3), so only someone
//! holding both the shared exNode and the owner's can revoke, and the
//! recipient learns nothing from it.
//!
//! ```no_run
//! # async fn f(owner: lors_exnode::ExNode, pool: lors::Pool) -> Result<(), lors::share::ShareError> {
//! use lors::share::{Options, revoke, share};
//! let week = Options { expires: Some(7 * 86_400), range: None };
//! let made = share(&owner, &week, &pool).await?;
//! // … hand `made.exnode` out; later:
//! let done = revoke(&made.exnode, &owner, &pool).await?;
//! assert!(done.failed.is_empty());
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use lors_exnode::{ExNode, Mapping, Metadata, Value};
use lors_ibp::caps::{CapSet, Capability};
use lors_ibp::proto::{Lease, StatusCode};

use crate::manage::{Failure, by_depot};

mod coded;
use crate::pool::Pool;
use crate::progress::NoProgress;

/// File metadata naming a share (an id for messages and logs).
pub const SHARE_META: &str = "lors_share";
/// File metadata: when the share's aliases end, in Unix seconds (the
/// earliest of them).
pub const EXPIRES_META: &str = "lors_share_expires";
/// File metadata: where the shared bytes start in the owner's file.
pub const OFFSET_META: &str = "lors_share_offset";
/// Mapping metadata: the alias's manage capability, sealed.
pub const SEAL_META: &str = "lors_revoke";

/// What [`share`] makes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Seconds the aliases last; `None`: as long as each allocation's
    /// lease has left now (a later refresh of the owner's exNode does not
    /// extend them: [`extend`] does).
    pub expires: Option<u64>,
    /// Share only `len` bytes from `offset` (`(offset, len)`); the shared
    /// exNode's file starts at `offset`'s byte.
    pub range: Option<(u64, u64)>,
}

/// Why a share could not be made or revoked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShareError {
    /// `--range` is empty or reaches past the file.
    #[error("the range {offset}:{len} is {why} (the file has {size} bytes)")]
    Range {
        /// Asked offset.
        offset: u64,
        /// Asked length.
        len: u64,
        /// The file's size.
        size: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The range cuts a mapping stored encoded, which can only be read
    /// whole.
    #[error(
        "the range {offset}:{len} cuts bytes {from}..{to}, stored encoded (checksummed, encrypted or compressed) as one piece that is read whole: a share reaches whole pieces only, and never more than asked; --range {wider_off}:{wider_len} covers it"
    )]
    CutsEncoded {
        /// Asked offset.
        offset: u64,
        /// Asked length.
        len: u64,
        /// The mapping's first byte.
        from: u64,
        /// One past its last.
        to: u64,
        /// The smallest range of whole pieces that covers the asked one.
        wider_off: u64,
        /// Its length.
        wider_len: u64,
    },
    /// A replica carries no manage capability, without which no alias can
    /// be made.
    #[error(
        "the replica of bytes {from}..{to} on {depot} has no manage capability: share from the owner's exNode (the one upload wrote)"
    )]
    NoManage {
        /// First byte.
        from: u64,
        /// One past the last.
        to: u64,
        /// Its depot.
        depot: String,
    },
    /// A depot does not implement aliases.
    #[error(
        "depot {depot} does not support IBP aliases (a LoRS 0.82-era depot), so a share of its replicas could not be revoked; for read-only access that cannot be taken back: lors modify -w --strip-manage -o SHARED.xnd OWNER.xnd"
    )]
    NoAliases {
        /// The depot.
        depot: String,
    },
    /// The asked lease is longer than an allocation's.
    #[error(
        "--expires {asked}s is longer than the lease the replica on {depot} has left: extend the owner's leases first (lors refresh -d DURATION OWNER.xnd) or share for less"
    )]
    TooLong {
        /// The depot.
        depot: String,
        /// Seconds asked.
        asked: u64,
    },
    /// Some bytes of the range have no replica an alias could be made on.
    #[error("no replica of bytes {from}..{to} could be shared: {why}")]
    Unshared {
        /// First byte.
        from: u64,
        /// One past the last.
        to: u64,
        /// The last failure.
        why: String,
    },
    /// A range of an erasure-coded file: its stripes are read whole.
    #[error(
        "the file is erasure-coded: its stripes are read whole, so a share is of the whole file; to share part of it, download the part and upload it on its own"
    )]
    RangeOfCoded,
    /// An erasure-coded file's blocks that could be shared leave a stripe
    /// short of the blocks it needs.
    #[error(
        "stripe {stripe} (bytes {from}..{to}) could not be shared: {shared} of its blocks were, and it needs {need}; last error: {why}"
    )]
    StripeUnshared {
        /// The stripe.
        stripe: u64,
        /// Its first byte.
        from: u64,
        /// One past its last.
        to: u64,
        /// Blocks aliased.
        shared: usize,
        /// Blocks it needs.
        need: usize,
        /// The last failure.
        why: String,
    },
    /// The exNode given to revoke or extend is not a share.
    #[error("this exNode was not made by lors share: it carries no revocation keys")]
    NotAShare,
    /// None of the owner's manage keys opens the share's revocation keys.
    #[error(
        "the owner's exNode given is not the one this share was made from: none of its manage keys opens the share's revocation keys"
    )]
    WrongOwner,
}

/// A replica or alias a share operation left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    /// The bytes of the shared file it holds.
    pub bytes: std::ops::Range<u64>,
    /// Its depot.
    pub depot: String,
    /// Why it was left out.
    pub why: String,
}

/// A share [`share`] made.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The exNode to hand out: alias read capabilities only.
    pub exnode: ExNode,
    /// Replicas left out, their depot unreachable or failing; every byte
    /// still has another.
    pub skipped: Vec<LeftOut>,
    /// When the first alias ends (Unix seconds).
    pub expires_at: u64,
}

/// What [`revoke`] or [`extend`] did.
#[derive(Debug, Clone, Default)]
pub struct Revoked {
    /// Aliases deleted (or extended).
    pub done: usize,
    /// Aliases already gone (revoked before, expired, or their allocation
    /// freed).
    pub gone: usize,
    /// Aliases left as they were.
    pub failed: Vec<LeftOut>,
}

/// The part of one owner mapping a share reaches: the window of the
/// allocation and where its bytes land in the shared file.
#[derive(Debug, Clone)]
struct Cut {
    /// Index among the owner's allocations (its mappings, then its
    /// parity blocks).
    index: usize,
    window: (u64, u64),
    mapping: Mapping,
}

/// Works out which part of each mapping `opts.range` reaches.
fn cuts(x: &ExNode, opts: &Options) -> Result<Vec<Cut>, ShareError> {
    if x.is_erasure_coded() {
        return coded::cuts(x, opts);
    }
    let size = x.logical_size();
    let (off, len) = opts.range.unwrap_or((0, size));
    let end = match off.checked_add(len) {
        _ if len == 0 && opts.range.is_some() => None,
        Some(e) if e <= size => Some(e),
        _ => None,
    };
    let Some(end) = end else {
        let why = if len == 0 { "empty" } else { "past the end" };
        return Err(ShareError::Range {
            offset: off,
            len,
            size,
            why,
        });
    };
    let mut out = Vec::new();
    let (mut wider_off, mut wider_end, mut cut) = (off, end, None);
    for (index, m) in x.mappings.iter().enumerate() {
        let (from, to) = (m.exnode_offset.max(off), m.logical_end().min(end));
        if from >= to || m.alloc_length == 0 {
            continue;
        }
        let raw = m.function.is_none() && m.logical_length == m.alloc_length;
        let whole = from == m.exnode_offset && to == m.logical_end();
        if !raw && !whole {
            wider_off = wider_off.min(m.exnode_offset);
            wider_end = wider_end.max(m.logical_end());
            cut.get_or_insert((m.exnode_offset, m.logical_end()));
            continue;
        }
        let skip = from - m.exnode_offset;
        let (window, logical, stored) = if raw {
            ((m.alloc_offset + skip, to - from), to - from, to - from)
        } else {
            (
                (m.alloc_offset, m.alloc_length),
                m.logical_length,
                m.alloc_length,
            )
        };
        let mut metadata = m.metadata.clone();
        metadata.retain(|d| d.name != SEAL_META);
        out.push(Cut {
            index,
            window,
            mapping: Mapping {
                exnode_offset: from - off,
                logical_length: logical,
                alloc_offset: 0,
                alloc_length: stored,
                e2e_blocksize: m.e2e_blocksize,
                metadata,
                function: m.function.clone(),
                read: None,
                write: None,
                manage: None,
            },
        });
    }
    if let Some((from, to)) = cut {
        return Err(ShareError::CutsEncoded {
            offset: off,
            len,
            from,
            to,
            wider_off,
            wider_len: wider_end - wider_off,
        });
    }
    Ok(out)
}

/// The owner's allocation `c` reaches.
fn owner_of<'a>(x: &'a ExNode, c: &Cut) -> &'a Mapping {
    x.allocation(c.index)
        .expect("cuts name the owner's allocations")
}

/// Whether a depot's refusal means it does not know aliases at all.
fn unsupported(e: &lors_ibp::Error) -> bool {
    e.status()
        .is_some_and(|c| c == StatusCode::UNKNOWN_FUNCTION || c == StatusCode::BAD_FORMAT)
}

/// Makes an alias of every replica `opts` reaches and returns the exNode
/// that names them (read capabilities only). A replica whose depot cannot
/// be reached is left out when the other replicas cover its bytes; if
/// anything fails otherwise, the aliases made are deleted again.
pub async fn share(x: &ExNode, opts: &Options, pool: &Pool) -> Result<Shared, ShareError> {
    let cuts = Arc::new(cuts(x, opts)?);
    // Where the shared file starts in the owner's: its offsets plus this.
    let at = opts.range.map_or(0, |r| r.0);
    let mut jobs = Vec::with_capacity(cuts.len());
    for (i, c) in cuts.iter().enumerate() {
        let m = owner_of(x, c);
        match &m.manage {
            Some(cap) => jobs.push((i, cap.clone())),
            None => {
                return Err(ShareError::NoManage {
                    from: m.exnode_offset,
                    to: m.logical_end(),
                    depot: m.depot().unwrap_or_default(),
                });
            }
        }
    }
    let duration = opts.expires.unwrap_or(0);
    let lease = alias_lease(duration);
    let windows = cuts.clone();
    let made = by_depot(jobs, pool, &NoProgress, move |mut c, i, cap| {
        let (off, len) = windows[i].window;
        async move {
            let r = async {
                let caps = c.alias_allocate(&cap, off, len, lease).await?;
                let left = c.alias_probe(&caps.manage).await;
                Ok((caps, left.map(|p| p.seconds_left)))
            }
            .await;
            (c, r)
        }
    })
    .await;
    let now = lors_ibp::units::unix_now();
    let mut got: BTreeMap<usize, CapSet> = BTreeMap::new();
    let mut expires_at = u64::MAX;
    let mut failures: Vec<(usize, Failure)> = Vec::new();
    for (i, r) in made {
        match r {
            Ok((caps, left)) => {
                // A probe that failed leaves the asked lease as the answer.
                let left = left.unwrap_or(duration);
                expires_at = expires_at.min(now + left);
                got.insert(i, caps);
            }
            Err(f) => failures.push((i, f)),
        }
    }
    if let Some(e) = refusal(x, &cuts, &got, &failures, duration, at) {
        let made: Vec<(Capability, Capability)> = got
            .iter()
            .filter_map(|(&i, caps)| {
                let master = owner_of(x, &cuts[i]).manage.clone()?;
                Some((caps.manage.clone(), master))
            })
            .collect();
        delete_aliases(made, pool).await;
        return Err(e);
    }
    let mut y = shared_exnode(x, &cuts, got);
    let (off, len) = opts.range.unwrap_or((0, x.logical_size()));
    y.holes = x.holes_in(off, off.saturating_add(len)).collect();
    let expires_at = if expires_at == u64::MAX {
        now + duration
    } else {
        expires_at
    };
    y.set_meta(Metadata::integer(
        EXPIRES_META,
        i64::try_from(expires_at).unwrap_or(i64::MAX),
    ));
    y.set_meta(Metadata::integer(
        OFFSET_META,
        i64::try_from(at).unwrap_or(i64::MAX),
    ));
    let skipped = failures
        .iter()
        .map(|(i, f)| {
            let c = &cuts[*i];
            let m = owner_of(x, c);
            LeftOut {
                bytes: c.mapping.exnode_offset + at..c.mapping.logical_end() + at,
                depot: m.depot().unwrap_or_default(),
                why: f.to_string(),
            }
        })
        .collect();
    Ok(Shared {
        exnode: y,
        skipped,
        expires_at,
    })
}

/// Why a share cannot be made of what was made (`got`) and what failed:
/// a depot without aliases, a lease longer than one allows, or a byte no
/// replica shares any more.
fn refusal(
    x: &ExNode,
    cuts: &[Cut],
    got: &BTreeMap<usize, CapSet>,
    failures: &[(usize, Failure)],
    duration: u64,
    at: u64,
) -> Option<ShareError> {
    let fatal = |i: usize, f: &Failure| -> Option<ShareError> {
        let Failure::Op(e) = f else { return None };
        let depot = owner_of(x, &cuts[i]).depot().unwrap_or_default();
        if unsupported(e) {
            Some(ShareError::NoAliases { depot })
        } else if e.status() == Some(StatusCode::LONG_DURATION) {
            Some(ShareError::TooLong {
                depot,
                asked: duration,
            })
        } else {
            None
        }
    };
    if let Some(e) = failures.iter().find_map(|(i, f)| fatal(*i, f)) {
        return Some(e);
    }
    if x.is_erasure_coded() {
        return coded::refusal(x, got, failures);
    }
    // Every byte must keep at least one replica.
    let covered: BTreeSet<(u64, u64)> = (got.keys())
        .map(|&i| {
            let m = &cuts[i].mapping;
            (m.exnode_offset, m.logical_end())
        })
        .collect();
    failures.iter().find_map(|(i, f)| {
        let m = &cuts[*i].mapping;
        let (from, to) = (m.exnode_offset, m.logical_end());
        let other = covered.iter().any(|&(a, b)| a <= from && b >= to);
        (!other).then(|| ShareError::Unshared {
            from: from + at,
            to: to + at,
            why: f.to_string(),
        })
    })
}

/// The shared exNode: each alias's read capability, its manage key sealed
/// for the owner, and the share's id.
fn shared_exnode(x: &ExNode, cuts: &[Cut], mut got: BTreeMap<usize, CapSet>) -> ExNode {
    let mut y = ExNode {
        metadata: x.metadata.clone(),
        mappings: Vec::with_capacity(got.len()),
        parity: Vec::new(),
        holes: Vec::new(),
    };
    let mut ids = blake3::Hasher::new();
    for (i, c) in cuts.iter().enumerate() {
        let mut m = c.mapping.clone();
        match got.remove(&i) {
            Some(caps) => {
                let master = owner_of(x, c).manage.as_ref().expect("checked above");
                let sealed = seal(
                    &seal_key(master, &caps.read),
                    caps.manage.to_url().as_bytes(),
                );
                m.metadata.push(Metadata::string(SEAL_META, &sealed));
                ids.update(caps.read.key.expose().as_bytes());
                m.read = Some(caps.read);
            }
            // A block of a code keeps its place, unreadable, so the
            // others keep theirs in the stripes; a replica is left out.
            None if x.is_erasure_coded() => {}
            None => continue,
        }
        if c.index >= x.mappings.len() {
            y.parity.push(m);
        } else {
            y.mappings.push(m);
        }
    }
    let id = ids.finalize().to_hex();
    y.set_meta(Metadata::string(SHARE_META, &id[..16]));
    y
}

/// Seconds until the share `x` ends ([`EXPIRES_META`]; 0 once it has),
/// or `None` when `x` is no share with an end.
pub fn ends_in(x: &ExNode) -> Option<i64> {
    match x.meta(EXPIRES_META) {
        Some(Value::Integer(t)) => {
            let now = i64::try_from(lors_ibp::units::unix_now()).unwrap_or(i64::MAX);
            Some(t.saturating_sub(now).max(0))
        }
        _ => None,
    }
}

/// When `e` (from reading `x`) is a depot refusing a key of `x`, and `x`
/// is a share: a sentence saying that the share was revoked or expired,
/// and when it was due to end.
pub fn access_lost(x: &ExNode, e: &crate::Error) -> Option<String> {
    if e.status() != Some(StatusCode::CAP_NOT_FOUND) {
        return None;
    }
    revoked(x)
}

/// For a share `x` whose depots no longer know its keys: the sentence
/// saying it was revoked or ran out. `None` when `x` is no share.
pub fn revoked(x: &ExNode) -> Option<String> {
    let Some(Value::String(id)) = x.meta(SHARE_META) else {
        return None;
    };
    let until = match x.meta(EXPIRES_META) {
        Some(Value::Integer(t))
            if u64::try_from(*t).is_ok_and(|t| t <= lors_ibp::units::unix_now()) =>
        {
            " (its lease ended)".to_owned()
        }
        _ => " (its owner revoked it, or an allocation it reads went)".to_owned(),
    };
    Some(format!(
        "access revoked or expired: this exNode is share {id}{until}; ask its owner for a new one"
    ))
}

/// Checked before a download writes anything: when `x` is a share and a
/// depot says one of its keys is gone, the sentence [`revoked`] says;
/// `None` for any other exNode, or a share whose keys its depots still
/// know (or that cannot be asked now: the download says what is wrong
/// then).
pub async fn gone(x: &ExNode, pool: &Pool) -> Option<String> {
    let why = revoked(x)?;
    let probes = crate::manage::probe_all(x, pool).await;
    (probes.iter())
        .any(|p| matches!(p, crate::manage::Probe::Gone))
        .then_some(why)
}

/// Best effort: deletes aliases made for a share that failed. One that
/// cannot be deleted holds no space and its keys were never handed out; it
/// ends with its lease.
async fn delete_aliases(made: Vec<(Capability, Capability)>, pool: &Pool) {
    let masters: Arc<Vec<Capability>> = Arc::new(made.iter().map(|(_, m)| m.clone()).collect());
    let jobs = made.into_iter().map(|(a, _)| a).enumerate().collect();
    let _ = by_depot(jobs, pool, &NoProgress, move |mut c, i, alias| {
        let master = masters[i].clone();
        async move {
            let r = c.alias_decr(&alias, &master).await;
            (c, r)
        }
    })
    .await;
}

/// For each mapping of `shared`, its alias's manage capability and the
/// owner's manage capability of the allocation, when `owner` holds it.
fn unsealed(
    shared: &ExNode,
    owner: &ExNode,
) -> Result<Vec<Option<(Capability, Capability)>>, ShareError> {
    if !matches!(shared.meta(SHARE_META), Some(Value::String(_))) {
        return Err(ShareError::NotAShare);
    }
    // The owner's replicas by depot, to try only those that can match.
    let mut by_depot: BTreeMap<String, Vec<&Capability>> = BTreeMap::new();
    for m in owner.allocations() {
        if let (Some(d), Some(cap)) = (m.depot(), &m.manage) {
            by_depot.entry(d).or_default().push(cap);
        }
    }
    let mut out = Vec::with_capacity(shared.mappings.len());
    let mut any_sealed = false;
    for m in shared.allocations() {
        let sealed = m.metadata.iter().find_map(|d| match &d.value {
            Value::String(s) if d.name == SEAL_META => Some(s.as_str()),
            _ => None,
        });
        let (Some(sealed), Some(read)) = (sealed, &m.read) else {
            out.push(None);
            continue;
        };
        any_sealed = true;
        let found = by_depot
            .get(&read.address())
            .into_iter()
            .flatten()
            .find_map(|master| {
                let plain = unseal(&seal_key(master, read), sealed)?;
                let alias: Capability = std::str::from_utf8(&plain).ok()?.parse().ok()?;
                Some((alias, (*master).clone()))
            });
        out.push(found);
    }
    if !any_sealed {
        return Err(ShareError::NotAShare);
    }
    if out.iter().all(Option::is_none) {
        return Err(ShareError::WrongOwner);
    }
    Ok(out)
}

/// Deletes every alias of `shared` (made by [`share`] from `owner`): the
/// shared exNode stops working at once, the owner's is untouched. Aliases
/// already gone count as done; one whose depot cannot be reached is named
/// in [`Revoked::failed`] (run it again, or it ends with its lease).
pub async fn revoke(shared: &ExNode, owner: &ExNode, pool: &Pool) -> Result<Revoked, ShareError> {
    each_alias(shared, owner, pool, None).await
}

/// Extends every alias of `shared` to `secs` from now (0: to the end of
/// its allocation's lease, as the owner's `refresh` left it).
pub async fn extend(
    shared: &ExNode,
    owner: &ExNode,
    secs: u64,
    pool: &Pool,
) -> Result<Revoked, ShareError> {
    each_alias(shared, owner, pool, Some(secs)).await
}

/// An alias's lease on the wire: 0 seconds is "as long as its allocation".
fn alias_lease(secs: u64) -> Lease {
    match secs {
        0 => Lease::Longest,
        s => Lease::Secs(s),
    }
}

async fn each_alias(
    shared: &ExNode,
    owner: &ExNode,
    pool: &Pool,
    extend: Option<u64>,
) -> Result<Revoked, ShareError> {
    let pairs = unsealed(shared, owner)?;
    let at = match shared.meta(OFFSET_META) {
        Some(Value::Integer(n)) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    let range = |m: &Mapping| (m.exnode_offset + at, m.logical_end() + at);
    let mut out = Revoked::default();
    let mut jobs = Vec::new();
    let mut masters = Vec::new();
    for (m, pair) in shared.allocations().zip(pairs) {
        let (from, to) = range(m);
        let depot = m.depot().unwrap_or_default();
        match pair {
            // A coded block no alias was made for.
            None if m.read.is_none() => {}
            Some((alias, master)) => {
                jobs.push((masters.len(), alias));
                masters.push((master, from, to, depot));
            }
            None => out.failed.push(LeftOut {
                bytes: from..to,
                depot,
                why: "the owner's exNode no longer names this allocation (healed or trimmed since the share was made): the alias ends with the allocation or its own lease".into(),
            }),
        }
    }
    let masters = Arc::new(masters);
    let caps = masters.clone();
    let done = by_depot(jobs, pool, &NoProgress, move |mut c, i, alias| {
        let master = caps[i].0.clone();
        async move {
            let r = match extend {
                None => c.alias_decr(&alias, &master).await,
                Some(secs) => c.alias_extend(&alias, &master, alias_lease(secs)).await,
            };
            (c, r)
        }
    })
    .await;
    for (i, r) in done {
        let (_, from, to, depot) = &masters[i];
        let left_out = |why: String| LeftOut {
            bytes: *from..*to,
            depot: depot.clone(),
            why,
        };
        match r {
            Ok(()) => out.done += 1,
            Err(Failure::Op(e)) if e.status() == Some(StatusCode::CAP_NOT_FOUND) => {
                if extend.is_some() {
                    out.failed.push(left_out("the alias is gone".into()));
                } else {
                    out.gone += 1;
                }
            }
            Err(f) => out.failed.push(left_out(f.to_string())),
        }
    }
    out.failed
        .sort_by_key(|l| (l.bytes.start, l.bytes.end, l.depot.clone()));
    Ok(out)
}

/// The key that seals an alias's manage capability: only someone holding
/// the owner's manage key of the allocation can derive it; the alias's
/// read key makes it different for every alias.
fn seal_key(master: &Capability, alias_read: &Capability) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("lors share 2026-11 alias manage key seal");
    h.update(master.key.expose().as_bytes());
    h.update(&[0]);
    h.update(alias_read.key.expose().as_bytes());
    *h.finalize().as_bytes()
}

/// What starts a seal made with ChaCha20-Poly1305 (before it, seals were
/// a BLAKE3 keystream and tag: [`unseal_v1`] still opens those).
const SEAL_V2: &str = "2:";

/// `plain` sealed with ChaCha20-Poly1305 under `key`, in hex after
/// [`SEAL_V2`]. Each key seals one value only (it is derived for one
/// alias), so the nonce can be fixed.
fn seal(key: &[u8; 32], plain: &[u8]) -> String {
    use chacha20poly1305::aead::{Aead as _, KeyInit as _};
    let aead = chacha20poly1305::ChaCha20Poly1305::new(key.into());
    let sealed = (aead.encrypt(&Default::default(), plain))
        .expect("ChaCha20-Poly1305 seals any value of a capability's length");
    format!("{SEAL_V2}{}", lors_ibp::hex::encode(&sealed))
}

/// What [`seal`] (or an older lors's seal) sealed, if `key` is the key it
/// used.
fn unseal(key: &[u8; 32], sealed: &str) -> Option<Vec<u8>> {
    // A capability URL is far shorter; a bound keeps hostile input cheap.
    if sealed.len() > 4096 {
        return None;
    }
    let Some(hex) = sealed.strip_prefix(SEAL_V2) else {
        return unseal_v1(key, sealed);
    };
    use chacha20poly1305::aead::{Aead as _, KeyInit as _};
    let aead = chacha20poly1305::ChaCha20Poly1305::new(key.into());
    aead.decrypt(&Default::default(), lors_ibp::hex::decode(hex)?.as_slice())
        .ok()
}

/// Opens a seal of the first format (shares made before ChaCha20-Poly1305
/// sealed them): a 16-byte BLAKE3 tag, then the value XORed with a BLAKE3
/// keystream, in hex.
fn unseal_v1(key: &[u8; 32], sealed: &str) -> Option<Vec<u8>> {
    const TAG: usize = 16;
    let bytes = lors_ibp::hex::decode(sealed).filter(|b| b.len() >= TAG)?;
    let (t, body) = bytes.split_at(TAG);
    let mut plain = vec![0; body.len()];
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"stream");
    h.finalize_xof().fill(&mut plain);
    plain.iter_mut().zip(body).for_each(|(p, c)| *p ^= c);
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"tag");
    h.update(&plain);
    let want = h.finalize();
    bool::from(subtle::ConstantTimeEq::ct_eq(&want.as_bytes()[..TAG], t)).then_some(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(key: &str) -> Capability {
        format!("ibp://h:6714/0#{key}/1/MANAGE").parse().unwrap()
    }

    /// A seal as lors made them before ChaCha20-Poly1305 (the first format).
    fn seal_v1(key: &[u8; 32], plain: &[u8]) -> String {
        let mut ks = vec![0; plain.len()];
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(b"stream");
        h.finalize_xof().fill(&mut ks);
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(b"tag");
        h.update(plain);
        let mut out = h.finalize().as_bytes()[..16].to_vec();
        out.extend(plain.iter().zip(ks).map(|(p, k)| p ^ k));
        lors_ibp::hex::encode(&out)
    }

    #[test]
    fn seals_of_older_shares_still_open() {
        let (master, other) = (cap("ownerkey"), cap("otherkey"));
        let read: Capability = "ibp://h:6714/0#aliasread/9/READ".parse().unwrap();
        let plain = b"ibp://h:6714/0#aliasmanage/9/MANAGE";
        let old = seal_v1(&seal_key(&master, &read), plain);
        assert_eq!(
            unseal(&seal_key(&master, &read), &old).as_deref(),
            Some(&plain[..])
        );
        assert_eq!(unseal(&seal_key(&other, &read), &old), None);
        assert!(seal(&seal_key(&master, &read), plain).starts_with(SEAL_V2));
    }

    #[test]
    fn only_the_owners_key_opens_a_seal() {
        let (master, other) = (cap("ownerkey"), cap("otherkey"));
        let read: Capability = "ibp://h:6714/0#aliasread/9/READ".parse().unwrap();
        let plain = b"ibp://h:6714/0#aliasmanage/9/MANAGE";
        let sealed = seal(&seal_key(&master, &read), plain);
        assert!(!sealed.contains("aliasmanage"));
        assert_eq!(
            unseal(&seal_key(&master, &read), &sealed).as_deref(),
            Some(&plain[..])
        );
        assert_eq!(unseal(&seal_key(&other, &read), &sealed), None);
        // Tampered, truncated or junk: refused, no panic.
        let mut bad = sealed.clone().into_bytes();
        bad[40] = if bad[40] == b'0' { b'1' } else { b'0' };
        let bad = String::from_utf8(bad).unwrap();
        assert_eq!(unseal(&seal_key(&master, &read), &bad), None);
        for junk in ["", "zz", &sealed[..31], "é".repeat(40).as_str()] {
            assert_eq!(unseal(&seal_key(&master, &read), junk), None);
        }
    }

    fn raw(off: u64, len: u64) -> Mapping {
        Mapping {
            exnode_offset: off,
            logical_length: len,
            alloc_offset: 0,
            alloc_length: len,
            ..Mapping::default()
        }
    }

    #[test]
    fn a_range_cuts_raw_pieces_but_takes_encoded_ones_whole() {
        let mut x = ExNode {
            metadata: vec![],
            mappings: vec![raw(0, 100), raw(100, 100)],
            parity: vec![],
            holes: vec![],
        };
        let c = cuts(
            &x,
            &Options {
                range: Some((50, 100)),
                expires: None,
            },
        )
        .unwrap();
        let got: Vec<_> = c
            .iter()
            .map(|c| (c.window, c.mapping.exnode_offset, c.mapping.logical_length))
            .collect();
        assert_eq!(got, vec![((50, 50), 0, 50), ((0, 50), 50, 50)]);
        let range = |o, l| Options {
            range: Some((o, l)),
            expires: None,
        };
        assert!(matches!(
            cuts(&x, &range(0, 0)),
            Err(ShareError::Range { .. })
        ));
        assert!(matches!(
            cuts(&x, &range(150, 51)),
            Err(ShareError::Range { .. })
        ));
        assert!(matches!(
            cuts(&x, &range(u64::MAX, 2)),
            Err(ShareError::Range { .. })
        ));
        x.mappings[1].alloc_length = 132; // checksummed
        x.mappings[1].function = Some(lors_exnode::Function::default());
        match cuts(&x, &range(50, 100)) {
            Err(ShareError::CutsEncoded {
                wider_off,
                wider_len,
                ..
            }) => assert_eq!((wider_off, wider_len), (50, 150)),
            r => panic!("{r:?}"),
        }
        let c = cuts(&x, &range(50, 150)).unwrap();
        assert_eq!(c[1].window, (0, 132));
    }
}
