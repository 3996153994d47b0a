//! The dissemination scheduler, sans I/O: it decides which block goes from
//! where to which site, and learns from completions and failures. The
//! driver ([`super::disseminate`]) turns its [`Transfer`]s into STOREs and
//! depot-to-depot SENDs; a flow-level simulation
//! (`crates/lors/examples/dissem_sim.rs`) turns them into simulated flows.
//!
//! Seed 004 (DDMG) splits the file into N parts, sends part *i* to site *i*
//! and lets the sites relay to each other. Here the same shape comes out of
//! pulling, block by block: a site with a free inbound slot takes the
//! rarest block it lacks from a holder with a free outbound slot, and only
//! when no holder can give it anything does it ask the source for a block
//! no site has or receives yet. So the source sends each block about once
//! (its egress stays near the file size, whatever N), every site relays
//! what it has, a slow site takes fewer blocks because its slot frees
//! later, and it is not fed new blocks by the source (everyone would wait
//! for them behind its link). A site that keeps failing is dropped; what
//! it held is found elsewhere.
//!
//! ```
//! use std::time::Instant;
//! use lors::dissem::sched::{Config, Sched, Source};
//!
//! // Two blocks from the client to two sites.
//! let mut s = Sched::new(vec![10, 10], 2, Some(Config::default()), None, &[]);
//! let now = Instant::now();
//! let first = s.next(now);
//! // Each site takes a different block from the client: nobody has any.
//! assert_eq!(first.len(), 2);
//! assert!(first.iter().all(|t| t.from == Source::Client));
//! assert_ne!(first[0].block, first[1].block);
//! for t in &first {
//!     s.done(t.id, now);
//! }
//! // Then the sites swap them.
//! let relays = s.next(now);
//! assert!(relays.iter().all(|t| matches!(t.from, Source::Site(_))));
//! for t in &relays {
//!     s.done(t.id, now);
//! }
//! assert!(s.finished());
//! ```

use lors_ibp::ewma::Ewma;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A destination site (one depot), by index.
pub type SiteId = usize;
/// A block of the file, by index.
pub type BlockId = usize;

/// Where a copy of a block comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// The client, from its file (a STORE).
    Client,
    /// A depot that held the block before the run: a replica in the input
    /// exNode (a SEND from it).
    Origin(usize),
    /// A destination site that has it by now (a SEND from it).
    Site(SiteId),
}

/// One copy to make: `block` from `from` to site `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Names it in [`Sched::done`] and [`Sched::failed`].
    pub id: u64,
    /// The block.
    pub block: BlockId,
    /// Where it comes from.
    pub from: Source,
    /// The site it goes to.
    pub to: SiteId,
}

/// Who a failed transfer is blamed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The destination (it refused the allocation or the data).
    To,
    /// The source (it could not read or send).
    From,
    /// Either: a copy between two depots that did not complete.
    Both,
    /// Neither: a depot said it is busy (IBP's -66), the destination's
    /// with `to`, else the source's ([`Sched::busy`]).
    Busy {
        /// The destination said so.
        to: bool,
    },
}

/// What the scheduler noticed, for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Site `site` failed too often in a row and is given up; its
    /// transfers in flight are void.
    SiteDropped {
        /// The site.
        site: SiteId,
        /// How many failures in a row.
        failures: u32,
    },
    /// Origin `origin` failed too often in a row; the blocks it held come
    /// from elsewhere.
    OriginDropped {
        /// The origin.
        origin: usize,
    },
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Copies a site receives at once.
    pub in_slots: usize,
    /// Copies a site or an origin sends at once.
    pub out_slots: usize,
    /// Copies the client sends at once.
    pub client_slots: usize,
    /// Failures in a row (no success between) after which a site or an
    /// origin is given up.
    pub max_failures: u32,
    /// A site receiving at less than this fraction of the median site's
    /// rate gets no new blocks from the source, and relays from it are
    /// avoided while a faster holder exists.
    pub slow: f64,
    /// Sites copy to each other (false: every site gets every block from
    /// the source — unicast, for comparison).
    pub relay: bool,
    /// A block received by nobody yet whose copies in flight have taken
    /// this many times the typical transfer is sent again by the source.
    pub hedge_after: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            in_slots: 6,
            out_slots: 6,
            client_slots: 4,
            max_failures: 3,
            slow: 0.5,
            relay: true,
            hedge_after: 3.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Has {
    Missing,
    Coming,
    Have,
}

/// Smoothed bytes per second.
#[derive(Debug, Clone, Copy)]
struct Rate(Ewma);

impl Default for Rate {
    fn default() -> Rate {
        Rate(Ewma::new(0.3))
    }
}

impl Rate {
    fn add(&mut self, bytes: u64, took: Duration) {
        self.0.add(bytes as f64 / took.as_secs_f64().max(1e-6));
    }

    fn get(&self) -> Option<f64> {
        self.0.get()
    }
}

/// Slots a depot that said it is busy (IBP's -66) is held to: halved
/// once per wave of such replies ([`crate::download::BUSY_SETTLE`]), down to one.
#[derive(Debug, Clone, Copy, Default)]
struct BusyCap {
    limit: Option<usize>,
    since: Option<Instant>,
}

impl BusyCap {
    fn of(&self, slots: usize) -> usize {
        self.limit.map_or(slots, |l| l.min(slots))
    }

    fn halve(&mut self, slots: usize, now: Instant) {
        let settled = self
            .since
            .is_none_or(|t| now.saturating_duration_since(t) >= crate::download::BUSY_SETTLE);
        if settled {
            self.since = Some(now);
            self.limit = Some((self.of(slots) / 2).max(1));
        }
    }
}

struct Site {
    has: Vec<Has>,
    /// Blocks it has or receives.
    count: usize,
    have: usize,
    in_busy: usize,
    /// Of those, copies from the client.
    from_client: usize,
    out_busy: usize,
    dead: bool,
    /// Failures in a row receiving.
    failures: u32,
    /// Failures in a row sending to others; at the limit the site is no
    /// longer a source, and still receives: a slow or flaky uplink is not
    /// a reason to give up the site's own replica.
    send_failures: u32,
    muted: bool,
    rate_in: Rate,
    rate_out: Rate,
    in_cap: BusyCap,
    out_cap: BusyCap,
}

struct Origin {
    out_busy: usize,
    out_cap: BusyCap,
    dead: bool,
    failures: u32,
    rate_out: Rate,
}

/// The scheduler. See the module documentation.
pub struct Sched {
    cfg: Config,
    lens: Vec<u64>,
    sites: Vec<Site>,
    origins: Vec<Origin>,
    /// Per block: the origins holding it.
    origin_of: Vec<Vec<usize>>,
    client: bool,
    client_busy: usize,
    /// Per block: sites that have it or receive it.
    copies: Vec<usize>,
    /// Per block: sites that have it.
    holders: Vec<Vec<SiteId>>,
    /// Blocks some site or origin can give, rarest (fewest copies) first.
    relayable: BTreeSet<(usize, BlockId)>,
    /// Blocks no site has or receives and no origin holds: the source's.
    unsent: BTreeSet<BlockId>,
    running: HashMap<u64, (Transfer, Instant)>,
    next_id: u64,
    /// Typical seconds per byte of a completed transfer.
    typical: Ewma,
    client_bytes: u64,
    notes: Vec<Note>,
    /// Refreshed at each [`Sched::next`]: the median receiving and sending
    /// rates, and how many live sites are not slow.
    median_in: Option<f64>,
    median_out: Option<f64>,
    fast_sites: usize,
}

/// A site's sending rate, or (before it has sent) its receiving rate:
/// links are mostly as fast one way as the other, and a slow site must not
/// be taken for the best holder just because nothing is known of it.
fn sent_or_received(x: &Site) -> Option<f64> {
    x.rate_out.get().or(x.rate_in.get())
}

/// How many missing blocks a site looks at for a relay before it asks the
/// source: bounds the work per decision when every holder is busy.
const SCAN: usize = 256;

impl Sched {
    /// Blocks of `lens` bytes for `sites` sites. `cfg: None` takes the
    /// defaults. With `origins: None` the client holds every block;
    /// otherwise `origins[b]` lists the origins holding block `b` and the
    /// client holds none. `preheld` lists `(site, block)` copies the sites
    /// hold already (a run resumed from its exNode).
    pub fn new(
        lens: Vec<u64>,
        sites: usize,
        cfg: Option<Config>,
        origins: Option<&[Vec<usize>]>,
        preheld: &[(SiteId, BlockId)],
    ) -> Sched {
        let cfg = cfg.unwrap_or_default();
        let b = lens.len();
        let client = origins.is_none();
        let origin_of: Vec<Vec<usize>> = (0..b)
            .map(|i| origins.and_then(|o| o.get(i)).cloned().unwrap_or_default())
            .collect();
        let n_origins = origin_of
            .iter()
            .flatten()
            .map(|&o| o + 1)
            .max()
            .unwrap_or(0);
        let mut s = Sched {
            lens,
            sites: (0..sites)
                .map(|_| Site {
                    has: vec![Has::Missing; b],
                    count: 0,
                    have: 0,
                    in_busy: 0,
                    from_client: 0,
                    out_busy: 0,
                    dead: false,
                    failures: 0,
                    send_failures: 0,
                    muted: false,
                    rate_in: Rate::default(),
                    rate_out: Rate::default(),
                    in_cap: BusyCap::default(),
                    out_cap: BusyCap::default(),
                })
                .collect(),
            origins: (0..n_origins)
                .map(|_| Origin {
                    out_busy: 0,
                    out_cap: BusyCap::default(),
                    dead: false,
                    failures: 0,
                    rate_out: Rate::default(),
                })
                .collect(),
            origin_of,
            client,
            client_busy: 0,
            copies: vec![0; b],
            holders: vec![Vec::new(); b],
            relayable: BTreeSet::new(),
            unsent: BTreeSet::new(),
            running: HashMap::new(),
            next_id: 0,
            typical: Ewma::new(0.2),
            client_bytes: 0,
            notes: Vec::new(),
            median_in: None,
            median_out: None,
            fast_sites: 0,
            cfg,
        };
        for &(site, block) in preheld {
            if site < sites && block < b && s.sites[site].has[block] == Has::Missing {
                let x = &mut s.sites[site];
                x.has[block] = Has::Have;
                x.count += 1;
                x.have += 1;
                s.copies[block] += 1;
                s.holders[block].push(site);
            }
        }
        for block in 0..b {
            s.index(block);
        }
        s
    }

    /// Puts `block` in the set it belongs to by its holders and copies.
    fn index(&mut self, block: BlockId) {
        let c = self.copies[block];
        let held = (self.holders[block].iter()).any(|&h| !self.sites[h].muted)
            || self.origin_of[block].iter().any(|&o| !self.origins[o].dead);
        // Held only by sites that cannot send: the client sends it again.
        let muted_only = !self.holders[block].is_empty();
        if held {
            self.relayable.insert((c, block));
        } else if (c == 0 || muted_only) && self.client {
            self.unsent.insert(block);
        }
    }

    fn unindex(&mut self, block: BlockId) {
        self.relayable.remove(&(self.copies[block], block));
        self.unsent.remove(&block);
    }

    /// The transfers to start now. Call again after every completion or
    /// failure; each returned transfer must end in [`Sched::done`] or
    /// [`Sched::failed`].
    pub fn next(&mut self, now: Instant) -> Vec<Transfer> {
        self.refresh_medians();
        let mut out = Vec::new();
        // The source's link is the one resource every block must cross: it
        // is kept busy first, with blocks nobody has, spread over the
        // sites; relays take the slots left.
        if self.client && self.cfg.relay {
            let takers: Vec<SiteId> = (0..self.sites.len())
                .filter(|&s| !self.sites[s].dead && !self.is_slow(s))
                .collect();
            let per_site = self.cfg.client_slots.div_ceil(takers.len().max(1));
            while self.client_busy < self.cfg.client_slots {
                // (A block only sites that cannot send hold goes to the
                // others.)
                let take = |s: SiteId, b: BlockId| {
                    let x = &self.sites[s];
                    x.in_busy < self.in_slots(s)
                        && x.from_client < per_site
                        && x.has[b] == Has::Missing
                };
                let next = (self.unsent.iter().take(SCAN)).find_map(|&b| {
                    let to = (takers.iter().copied())
                        .filter(|&s| take(s, b))
                        .min_by_key(|&s| (self.sites[s].from_client, self.sites[s].count))?;
                    Some((b, to))
                });
                let Some((b, to)) = next else {
                    break;
                };
                out.push(self.start(b, Source::Client, to, now));
            }
        }
        loop {
            // The neediest sites first: they have the most to receive.
            let mut order: Vec<SiteId> = (0..self.sites.len())
                .filter(|&s| {
                    let x = &self.sites[s];
                    !x.dead && x.in_busy < self.in_slots(s) && x.count < self.lens.len()
                })
                .collect();
            order.sort_by_key(|&s| self.sites[s].count);
            let before = out.len();
            for s in order {
                if let Some(t) = self.pick(s, now) {
                    out.push(t);
                }
            }
            if out.len() == before {
                return out;
            }
        }
    }

    fn pick(&mut self, s: SiteId, now: Instant) -> Option<Transfer> {
        // A relay: the rarest block this site lacks that a holder can send.
        let mut scanned = 0;
        let mut found = None;
        for &(_, b) in &self.relayable {
            if self.sites[s].has[b] != Has::Missing {
                continue;
            }
            if let Some(from) = self.holder(b) {
                found = Some((b, from));
                break;
            }
            scanned += 1;
            if scanned >= SCAN {
                break;
            }
        }
        if let Some((b, from)) = found {
            return Some(self.start(b, from, s, now));
        }
        if !self.client || self.client_busy >= self.cfg.client_slots {
            return None;
        }
        if !self.cfg.relay {
            // Unicast: the source sends this site everything, in order.
            let b = (0..self.lens.len()).find(|&b| self.sites[s].has[b] == Has::Missing)?;
            return Some(self.start(b, Source::Client, s, now));
        }
        // A slow site gets new blocks from the source only when no other
        // site could take them.
        // (A slow site is not among the fast ones counted.)
        if self.is_slow(s) && self.fast_sites > 0 {
            return None;
        }
        let lacks = |b: &&BlockId| self.sites[s].has[**b] == Has::Missing;
        if let Some(&b) = self.unsent.iter().take(SCAN).find(lacks) {
            return Some(self.start(b, Source::Client, s, now));
        }
        // Nothing new left: a block nobody has yet whose copies in flight
        // are overdue goes again (a slow or failing receiver must not hold
        // everyone's last blocks).
        let late = self.typical.get()? * self.cfg.hedge_after;
        let overdue = (self.running.values())
            .filter(|(t, started)| {
                self.holders[t.block].is_empty()
                    && self.sites[s].has[t.block] == Has::Missing
                    && now.saturating_duration_since(*started).as_secs_f64()
                        > late * self.lens[t.block] as f64
            })
            .map(|(t, _)| t.block)
            .min()?;
        Some(self.start(overdue, Source::Client, s, now))
    }

    /// The best holder of `b` with a free outbound slot: the fastest sender,
    /// never a slow one while a faster holder exists (busy or not).
    fn holder(&self, b: BlockId) -> Option<Source> {
        if !self.cfg.relay && self.client {
            return None;
        }
        let median = self.median_out;
        let fast = |r: Option<f64>| match (r, median) {
            (Some(r), Some(m)) => r >= self.cfg.slow * m,
            _ => true,
        };
        let mut best: Option<(f64, Source)> = None;
        let mut any_fast = false;
        let mut slow_free = None;
        let sites = (self.holders[b].iter()).map(|&h| {
            let x = &self.sites[h];
            (
                Source::Site(h),
                sent_or_received(x),
                x.out_busy,
                x.out_cap.of(self.cfg.out_slots),
                x.dead || x.muted,
            )
        });
        let origins = (self.origin_of[b].iter()).map(|&o| {
            let x = &self.origins[o];
            let slots = x.out_cap.of(self.cfg.out_slots);
            (
                Source::Origin(o),
                x.rate_out.get(),
                x.out_busy,
                slots,
                x.dead,
            )
        });
        let relays = if self.cfg.relay { Some(sites) } else { None };
        for (src, rate, busy, slots, dead) in relays.into_iter().flatten().chain(origins) {
            if dead {
                continue;
            }
            let free = busy < slots;
            if fast(rate) {
                any_fast = true;
                // Unknown rates first: a holder that has not sent yet is
                // tried, and its rate learned.
                let r = rate.unwrap_or(f64::INFINITY);
                if free && best.is_none_or(|(br, _)| r > br) {
                    best = Some((r, src));
                }
            } else if free {
                slow_free = Some(src);
            }
        }
        match best {
            Some((_, src)) => Some(src),
            None if !any_fast => slow_free,
            None => None,
        }
    }

    fn median(&self, f: impl Fn(&Site) -> Option<f64>) -> Option<f64> {
        let mut v: Vec<f64> = (self.sites.iter())
            .filter(|x| !x.dead)
            .filter_map(f)
            .collect();
        if v.len() < 2 {
            return None;
        }
        let mid = v.len() / 2;
        Some(*v.select_nth_unstable_by(mid, f64::total_cmp).1)
    }

    /// The medians rates are judged by, once per decision round rather than
    /// per site asked (with 1,000 sites that was most of the work).
    fn refresh_medians(&mut self) {
        self.median_in = self.median(|x| x.rate_in.get());
        self.median_out = self.median(sent_or_received);
        self.fast_sites = (0..self.sites.len())
            .filter(|&s| !self.sites[s].dead && !self.is_slow(s))
            .count();
    }

    /// Copies site `s` receives at once: a slow site's link is filled by
    /// two, and more flows on it only lengthen each copy (and the time a
    /// block it holds back is missed).
    fn in_slots(&self, s: SiteId) -> usize {
        let slots = self.sites[s].in_cap.of(self.cfg.in_slots);
        if self.is_slow(s) { slots.min(2) } else { slots }
    }

    /// Whether site `s` receives at less than the slow fraction of the
    /// median site (as the rates stood at the last [`Sched::next`]).
    pub fn is_slow(&self, s: SiteId) -> bool {
        match (self.sites[s].rate_in.get(), self.median_in) {
            (Some(r), Some(m)) => r < self.cfg.slow * m,
            _ => false,
        }
    }

    fn start(&mut self, b: BlockId, from: Source, to: SiteId, now: Instant) -> Transfer {
        self.unindex(b);
        self.copies[b] += 1;
        self.index(b);
        let x = &mut self.sites[to];
        x.has[b] = Has::Coming;
        x.count += 1;
        x.in_busy += 1;
        x.from_client += usize::from(from == Source::Client);
        self.out_busy(from, true);
        self.next_id += 1;
        let t = Transfer {
            id: self.next_id,
            block: b,
            from,
            to,
        };
        self.running.insert(t.id, (t, now));
        t
    }

    fn out_busy(&mut self, from: Source, more: bool) {
        let n = match from {
            Source::Client => &mut self.client_busy,
            Source::Origin(o) => &mut self.origins[o].out_busy,
            Source::Site(h) => &mut self.sites[h].out_busy,
        };
        if more {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    }

    /// Ends a transfer; its slots are free again.
    fn end(&mut self, id: u64) -> Option<(Transfer, Instant)> {
        let (t, started) = self.running.remove(&id)?;
        let x = &mut self.sites[t.to];
        x.in_busy -= 1;
        x.from_client -= usize::from(t.from == Source::Client);
        self.out_busy(t.from, false);
        Some((t, started))
    }

    /// Transfer `id` completed: its site holds the block.
    pub fn done(&mut self, id: u64, now: Instant) {
        let Some((t, started)) = self.end(id) else {
            return;
        };
        let len = self.lens[t.block];
        let took = now.saturating_duration_since(started);
        if self.sites[t.to].dead {
            return;
        }
        let per_byte = took.as_secs_f64() / len.max(1) as f64;
        self.typical.add(per_byte);
        let x = &mut self.sites[t.to];
        x.has[t.block] = Has::Have;
        x.have += 1;
        x.failures = 0;
        x.rate_in.add(len, took);
        match t.from {
            Source::Client => self.client_bytes += len,
            Source::Origin(o) => {
                self.origins[o].failures = 0;
                self.origins[o].rate_out.add(len, took);
            }
            Source::Site(h) => {
                self.sites[h].send_failures = 0;
                self.sites[h].rate_out.add(len, took);
            }
        }
        self.unindex(t.block);
        self.holders[t.block].push(t.to);
        self.index(t.block);
    }

    /// Transfer `id` failed; `blame` says whose fault it may be. Returns
    /// the transfers made void by a site given up (their results are to be
    /// thrown away, their allocations released).
    pub fn failed(&mut self, id: u64, blame: Blame) -> Vec<u64> {
        let Some((t, _)) = self.end(id) else {
            return Vec::new();
        };
        self.forget(t.to, t.block, false);
        let mut void = Vec::new();
        if matches!(blame, Blame::To | Blame::Both) {
            self.sites[t.to].failures += 1;
            if self.sites[t.to].failures >= self.cfg.max_failures {
                void.extend(self.drop_site(t.to));
            }
        }
        if matches!(blame, Blame::From | Blame::Both) {
            match t.from {
                Source::Client => {}
                Source::Site(h) => {
                    let x = &mut self.sites[h];
                    x.send_failures += 1;
                    if x.send_failures >= self.cfg.max_failures && !x.muted {
                        x.muted = true;
                        for b in 0..self.lens.len() {
                            if self.sites[h].has[b] == Has::Have {
                                self.unindex(b);
                                self.index(b);
                            }
                        }
                    }
                }
                Source::Origin(o) => {
                    let x = &mut self.origins[o];
                    x.failures += 1;
                    if x.failures >= self.cfg.max_failures && !x.dead {
                        x.dead = true;
                        self.notes.push(Note::OriginDropped { origin: o });
                        for b in 0..self.lens.len() {
                            if self.origin_of[b].contains(&o) {
                                self.unindex(b);
                                self.index(b);
                            }
                        }
                    }
                }
            }
        }
        void
    }

    /// Transfer `id` was refused by a depot that said it is busy — the
    /// destination's with `to`, else the source's: no failure counts (the
    /// depot answered), the block is wanted again, and the busy depot's
    /// slots halve, once per wave of such replies, down to one.
    pub fn busy(&mut self, id: u64, to: bool, now: Instant) {
        let Some((t, _)) = self.end(id) else {
            return;
        };
        self.forget(t.to, t.block, false);
        let (cfg_in, cfg_out) = (self.cfg.in_slots, self.cfg.out_slots);
        match (to, t.from) {
            (true, _) => self.sites[t.to].in_cap.halve(cfg_in, now),
            (false, Source::Site(h)) => self.sites[h].out_cap.halve(cfg_out, now),
            (false, Source::Origin(o)) => self.origins[o].out_cap.halve(cfg_out, now),
            (false, Source::Client) => {}
        }
    }

    /// Site `s` no longer has or receives block `b`.
    fn forget(&mut self, s: SiteId, b: BlockId, had: bool) {
        self.unindex(b);
        self.copies[b] -= 1;
        if had {
            self.holders[b].retain(|&h| h != s);
            self.sites[s].have -= 1;
        }
        let x = &mut self.sites[s];
        x.has[b] = Has::Missing;
        x.count -= 1;
        self.index(b);
    }

    /// Gives site `s` up: what it holds is no longer a source, its
    /// transfers in flight (either way) are void and returned.
    pub fn drop_site(&mut self, s: SiteId) -> Vec<u64> {
        if self.sites[s].dead {
            return Vec::new();
        }
        self.sites[s].dead = true;
        self.notes.push(Note::SiteDropped {
            site: s,
            failures: self.sites[s].failures,
        });
        let void: Vec<u64> = (self.running.values())
            .filter(|(t, _)| t.to == s || t.from == Source::Site(s))
            .map(|(t, _)| t.id)
            .collect();
        for &id in &void {
            if let Some((t, _)) = self.end(id) {
                self.forget(t.to, t.block, false);
            }
        }
        for b in 0..self.lens.len() {
            if self.sites[s].has[b] == Has::Have {
                self.forget(s, b, true);
            }
        }
        void
    }

    /// Every site still in the run holds every block, or nothing more can
    /// happen (see [`Sched::unreachable`]).
    pub fn finished(&self) -> bool {
        self.running.is_empty()
            && (self.sites.iter())
                .filter(|x| !x.dead)
                .all(|x| x.have == self.lens.len() || !self.reachable_for(x))
    }

    fn reachable_for(&self, x: &Site) -> bool {
        (0..self.lens.len()).all(|b| x.has[b] == Has::Have || self.available(b))
    }

    /// Whether block `b` can still be had from someone.
    fn available(&self, b: BlockId) -> bool {
        self.client
            || self.holders[b].iter().any(|&h| !self.sites[h].muted)
            || self.origin_of[b].iter().any(|&o| !self.origins[o].dead)
    }

    /// Blocks no live holder, origin or source can give any more.
    pub fn unreachable(&self) -> Vec<BlockId> {
        (0..self.lens.len())
            .filter(|&b| !self.available(b))
            .collect()
    }

    /// Whether site `s` was given up.
    pub fn is_dropped(&self, s: SiteId) -> bool {
        self.sites[s].dead
    }

    /// Whether site `s` holds every block.
    pub fn is_complete(&self, s: SiteId) -> bool {
        !self.sites[s].dead && self.sites[s].have == self.lens.len()
    }

    /// Blocks site `s` holds.
    pub fn held(&self, s: SiteId) -> usize {
        self.sites[s].have
    }

    /// Bytes the client sent so far (its egress).
    pub fn client_bytes(&self) -> u64 {
        self.client_bytes
    }

    /// How long a transfer of `len` bytes may take before it is given up:
    /// `floor`, or eight times the typical transfer of that size.
    pub fn deadline(&self, len: u64, floor: Duration) -> Duration {
        let typical = self.typical.get().map_or(0.0, |x| x * len as f64 * 8.0);
        floor.max(Duration::from_secs_f64(typical.min(86_400.0)))
    }

    /// What happened since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// Whether transfer `id` is in flight (not ended, not made void).
    pub fn is_running(&self, id: u64) -> bool {
        self.running.contains_key(&id)
    }
}

#[cfg(test)]
mod tests;
