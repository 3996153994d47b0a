//! Aliases (LStore's "proxy" allocations, `docs/ibp-protocol.md` §2.6): a
//! second set of keys for a window of an allocation, with its own reference
//! counts and a lease no longer than the allocation's. An alias holds no
//! bytes and takes no space; it goes when its counts reach zero, its lease
//! ends, or its allocation goes.

use lors_ibp::units::unix_now;
use std::sync::Arc;

use lors_ibp::caps::CapKind;
use lors_ibp::proto::{AllocType, KeyToken};

use super::meta::AliasRecord;
use super::{
    Alloc, Lease, NewAlloc, RefCount, Resource, Result, State, Store, StoreError, key_hash, lock,
};

/// Most aliases one allocation may have. An alias costs no space, so
/// without a bound a client could grow the metadata without limit.
pub const MAX_ALIASES_PER_ALLOC: usize = 1024;

/// Most aliases a `max_size`-byte allocation may have: one per KiB of the
/// quota it takes, at least 4 and at most [`MAX_ALIASES_PER_ALLOC`], so
/// the memory aliases hold grows with the quota, not with how many tiny
/// allocations a client makes.
///
/// ```
/// use lors_depot::store::alias::alias_limit;
/// assert_eq!(alias_limit(1), 4);
/// assert_eq!(alias_limit(60 << 10), 64);
/// assert_eq!(alias_limit(1 << 30), 1024);
/// ```
pub fn alias_limit(max_size: u64) -> usize {
    let per_kib = max_size.saturating_add(super::ALLOC_CHARGE) >> 10;
    usize::try_from(per_kib).map_or(MAX_ALIASES_PER_ALLOC, |n| n.clamp(4, MAX_ALIASES_PER_ALLOC))
}

/// The part of an allocation a key reaches: all of it for the allocation's
/// own keys, an alias's window for an alias's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Where the window starts in the allocation.
    pub offset: u64,
    /// Its length; 0 = to the end of the allocation.
    pub length: u64,
}

impl Window {
    /// The whole allocation.
    pub const WHOLE: Window = Window {
        offset: 0,
        length: 0,
    };

    /// Whether the window starts at the allocation's start (appends, and the
    /// checksum commands, need that, as on the ACCRE depot).
    pub fn at_start(&self) -> bool {
        self.offset == 0
    }

    /// `length` bytes at `offset` within the window, in allocation offsets;
    /// `None` if they do not fit in it.
    ///
    /// ```
    /// use lors_depot::store::Window;
    /// let w = Window { offset: 100, length: 50 };
    /// assert_eq!(w.map(10, 40), Some(110));
    /// assert_eq!(w.map(10, 41), None);
    /// assert_eq!(Window::WHOLE.map(7, u64::MAX - 7), Some(7));
    /// ```
    pub fn map(&self, offset: u64, length: u64) -> Option<u64> {
        let at = self.offset.checked_add(offset)?;
        let end = at.checked_add(length)?;
        (end <= self.end()).then_some(at)
    }

    /// The first allocation offset past the window.
    pub fn end(&self) -> u64 {
        if self.length == 0 {
            u64::MAX
        } else {
            self.offset.saturating_add(self.length)
        }
    }
}

/// What ALIAS_MANAGE PROBE reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AliasProbe {
    /// Read reference count.
    pub read_refs: u32,
    /// Write reference count.
    pub write_refs: u32,
    /// Window start.
    pub offset: u64,
    /// Window length (0 = to the end).
    pub length: u64,
    /// Seconds of lease left.
    pub seconds_left: u64,
}

impl State {
    pub(super) fn insert_alias(&mut self, id: u64, rec: AliasRecord) {
        for (kind, h) in CapKind::ALL.iter().zip(rec.key_hashes.iter()) {
            self.keys.insert(*h, (id, *kind));
        }
        self.alias_expiry.insert((rec.expires_at, id));
        self.aliases_of.entry(rec.master).or_default().insert(id);
        self.aliases.insert(id, rec);
    }

    pub(super) fn remove_alias(&mut self, id: u64) -> Option<AliasRecord> {
        let rec = self.aliases.remove(&id)?;
        for h in &rec.key_hashes {
            self.keys.remove(h);
        }
        self.alias_expiry.remove(&(rec.expires_at, id));
        if let Some(set) = self.aliases_of.get_mut(&rec.master) {
            set.remove(&id);
            if set.is_empty() {
                self.aliases_of.remove(&rec.master);
            }
        }
        Some(rec)
    }

    /// Forgets every alias of `master` (which is going); returns their ids
    /// for the metadata database.
    pub(super) fn drop_aliases_of(&mut self, master: u64) -> Vec<u64> {
        let ids: Vec<u64> = self
            .aliases_of
            .get(&master)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for id in &ids {
            self.remove_alias(*id);
        }
        ids
    }

    /// Every alias belongs to a live allocation and is indexed under it,
    /// and every key names something (for [`Store::check_accounting`]).
    pub(super) fn check_aliases(&self) -> std::result::Result<(), String> {
        for (id, rec) in &self.aliases {
            if !self.allocs.contains_key(&rec.master) {
                return Err(format!("alias {id} outlived its allocation {}", rec.master));
            }
            if !self
                .aliases_of
                .get(&rec.master)
                .is_some_and(|s| s.contains(id))
            {
                return Err(format!("alias {id} is not indexed under {}", rec.master));
            }
        }
        let indexed: usize = self.aliases_of.values().map(|s| s.len()).sum();
        let keys = 3 * (self.allocs.len() + self.aliases.len());
        if indexed != self.aliases.len() || keys != self.keys.len() {
            return Err(format!(
                "{} allocations and {} aliases ({indexed} indexed) but {} keys",
                self.allocs.len(),
                self.aliases.len(),
                self.keys.len()
            ));
        }
        Ok(())
    }

    /// The live alias a manage key names.
    fn alias_by_manage_key(&self, token: &KeyToken, now: u64) -> Result<(u64, &AliasRecord)> {
        let (id, kind) = *self
            .keys
            .get(&key_hash(&token.key))
            .ok_or(StoreError::NotFound)?;
        let rec = self.aliases.get(&id).ok_or(StoreError::NotFound)?;
        if kind != CapKind::Manage || rec.expires_at <= now {
            return Err(StoreError::NotFound);
        }
        Ok((id, rec))
    }

    /// Checks that `master` is the manage key of the allocation alias `rec`
    /// belongs to.
    fn check_master(&self, rec: &AliasRecord, master: &KeyToken) -> Result<()> {
        match self.keys.get(&key_hash(&master.key)) {
            Some((id, CapKind::Manage)) if *id == rec.master => Ok(()),
            _ => Err(StoreError::WrongMaster),
        }
    }
}

impl Store {
    /// ALIAS_ALLOCATE on `master` (found by its manage key): a window of
    /// `length` bytes at `offset` (both 0: all of it), leased for
    /// `lease` ([`Lease::Longest`]: until the master expires). Blocking.
    pub fn alias_allocate(
        &self,
        master: &Arc<Alloc>,
        offset: u64,
        length: u64,
        lease: Lease,
    ) -> Result<NewAlloc> {
        let now = unix_now();
        let (max_size, expires) = {
            let info = lock(&master.info);
            (info.rec.max_size, info.rec.expires_at)
        };
        if master.atype != AllocType::ByteArray && (offset, length) != (0, 0) {
            // A queue has no fixed offsets to window.
            return Err(StoreError::InvalidCmd);
        }
        if offset.checked_add(length).is_none_or(|e| e > max_size) {
            return Err(StoreError::NoSpace);
        }
        let expires_at = match lease {
            Lease::Longest => expires,
            Lease::Secs(d) => now.saturating_add(d),
        };
        if expires_at > expires {
            return Err(StoreError::LongDuration);
        }
        let keys = super::new_keys()?;
        let rec = AliasRecord {
            master: master.id,
            offset,
            length,
            expires_at,
            created_at: now,
            read_refs: 1,
            write_refs: 0,
            key_hashes: [key_hash(&keys[0]), key_hash(&keys[1]), key_hash(&keys[2])],
        };
        // Metadata alone, but it grows the database: a resource whose disk
        // filled keeps what room is left for deletions and changes.
        if master.res.db.degraded() {
            return Err(StoreError::NoSpace);
        }
        let mut st = lock(&self.state);
        if !st.allocs.contains_key(&master.id) {
            return Err(StoreError::NotFound);
        }
        if st.aliases_of.get(&master.id).map_or(0, |s| s.len()) >= alias_limit(max_size) {
            return Err(StoreError::Policy("too many aliases of this allocation"));
        }
        let id = st.fresh_id()?;
        st.insert_alias(id, rec.clone());
        drop(st);
        if let Err(e) = master.res.db.apply_aliases(&[(id, rec)], &[]) {
            lock(&self.state).remove_alias(id);
            return Err(e.into());
        }
        Ok(NewAlloc {
            id,
            rid: master.res.rid().to_owned(),
            keys,
            revoked: 0,
        })
    }

    /// ALIAS_MANAGE PROBE.
    pub fn alias_probe(&self, token: &KeyToken) -> Result<AliasProbe> {
        let now = unix_now();
        let st = lock(&self.state);
        let (_, rec) = st.alias_by_manage_key(token, now)?;
        // An alias lives no longer than its allocation, whose lease may
        // have been shortened since the alias was made.
        let master_ends = st.allocs.get(&rec.master).map_or(now, |e| e.expires_at);
        Ok(AliasProbe {
            read_refs: rec.read_refs,
            write_refs: rec.write_refs,
            offset: rec.offset,
            length: rec.length,
            seconds_left: rec.expires_at.min(master_ends).saturating_sub(now),
        })
    }

    /// ALIAS_MANAGE INCR/DECR; the alias goes when both counts reach zero.
    /// Blocking.
    pub fn alias_refcount(
        &self,
        token: &KeyToken,
        master: &KeyToken,
        which: RefCount,
        up: bool,
    ) -> Result<()> {
        self.alias_update(token, master, |rec, _| {
            Ok(super::bump_count(
                &mut rec.read_refs,
                &mut rec.write_refs,
                which,
                up,
            ))
        })
    }

    /// ALIAS_MANAGE CHNG: a new window (`length` 0 keeps it) and, unless
    /// `None`, a new lease. Blocking.
    pub fn alias_change(
        &self,
        token: &KeyToken,
        master: &KeyToken,
        offset: u64,
        length: u64,
        lease: Option<Lease>,
    ) -> Result<()> {
        let now = unix_now();
        self.alias_update(token, master, |rec, m| {
            let (max_size, m_expires, queue) = {
                let info = lock(&m.info);
                (info.rec.max_size, info.rec.expires_at, m.is_queue())
            };
            if length > 0 {
                if queue || offset.checked_add(length).is_none_or(|e| e > max_size) {
                    return Err(StoreError::Policy("window beyond the allocation"));
                }
                rec.offset = offset;
                rec.length = length;
            }
            rec.expires_at = match lease {
                Some(Lease::Longest) => m_expires,
                Some(Lease::Secs(d)) => now.saturating_add(d),
                None => rec.expires_at,
            };
            if rec.expires_at > m_expires {
                return Err(StoreError::Policy("alias would outlive its allocation"));
            }
            Ok(true)
        })
    }

    /// Applies `f` to the alias `token` names after checking `master`, and
    /// persists the result (`f` returns false: delete the alias).
    fn alias_update(
        &self,
        token: &KeyToken,
        master: &KeyToken,
        f: impl FnOnce(&mut AliasRecord, &Arc<Alloc>) -> Result<bool>,
    ) -> Result<()> {
        let now = unix_now();
        let st = lock(&self.state);
        let (id, rec) = st.alias_by_manage_key(token, now)?;
        st.check_master(rec, master)?;
        let old = rec.clone();
        let m = st
            .allocs
            .get(&old.master)
            .ok_or(StoreError::NotFound)?
            .alloc
            .clone();
        let mut rec = old.clone();
        // The master's info lock is taken inside `f` with the state lock
        // held, against the store's lock order: take it first instead.
        drop(st);
        let keep = f(&mut rec, &m)?;
        let mut st = lock(&self.state);
        if st.aliases.get(&id) != Some(&old) {
            // Changed or deleted by someone else meanwhile: let them win.
            return Err(StoreError::NotFound);
        }
        st.remove_alias(id);
        if keep {
            st.insert_alias(id, rec.clone());
        }
        drop(st);
        let written = if keep {
            m.res.db.apply_aliases(&[(id, rec)], &[])
        } else {
            m.res.db.apply_aliases(&[], &[id])
        };
        if let Err(e) = written {
            let mut st = lock(&self.state);
            st.remove_alias(id);
            st.insert_alias(id, old);
            return Err(e.into());
        }
        Ok(())
    }

    /// Deletes the aliases whose lease has run out; returns how many.
    pub(super) fn reap_aliases(&self, now: u64) -> usize {
        let gone: Vec<(u64, Arc<Resource>)> = {
            let mut st = lock(&self.state);
            let ids: Vec<u64> = st
                .alias_expiry
                .range(..=(now, u64::MAX))
                .map(|(_, id)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| {
                    let rec = st.remove_alias(id)?;
                    let res = st.allocs.get(&rec.master)?.alloc.res.clone();
                    Some((id, res))
                })
                .collect()
        };
        for (id, res) in &gone {
            forget_aliases(res, &[*id]);
        }
        gone.len()
    }
}

/// Removes alias records from `res`'s metadata database. A failure is
/// logged only: the next start drops records whose allocation is gone.
pub(super) fn forget_aliases(res: &Resource, ids: &[u64]) {
    if ids.is_empty() {
        return;
    }
    if let Err(e) = res.db.apply_aliases(&[], ids) {
        tracing::warn!(error = %e, "could not delete alias records; dropped at next start");
    }
}
