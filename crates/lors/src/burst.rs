//! Depot-to-depot bursts: the order in which a copy between sites
//! ([`crate::manage::replicate`]: `lors route`, `lors augment`) takes its
//! blocks, so that every source depot sends and every target depot
//! receives at once, none of them with more than its share — the Data
//! Reservoir's "burst" transfers, each disk server straight to its peer,
//! the client only steering. Pure: no I/O.
//!
//! Each source depot has a queue of the blocks it holds. The next copy
//! comes from the source with the fewest copies in flight (ties: the
//! longest queue, so the sources finish together); its target is the one
//! receiving the fewest ([`Links::target`]). With `w` copies in flight over
//! `s` sources and `t` targets, each source sends about `w / s` and each
//! target receives about `w / t`: no link idle while another has two
//! queued.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// Copies in flight per link: two keep a link busy across the pause
/// between one copy's end and the next one's start.
pub const PER_LINK: usize = 2;

/// Copies a run keeps in flight for `sources` source and `targets` target
/// depots: [`PER_LINK`] per link of the wider side, at least 8 (a single
/// depot's copies still overlap) and at most 64.
///
/// ```
/// use lors::burst::in_flight;
/// assert_eq!(in_flight(4, 4), 8);
/// assert_eq!(in_flight(16, 4), 32);
/// assert_eq!(in_flight(1000, 1000), 64);
/// ```
pub fn in_flight(sources: usize, targets: usize) -> usize {
    (PER_LINK * sources.max(targets)).clamp(8, 64)
}

/// [`in_flight`] for depots `rtt` apart (the longest round trip measured
/// to them): each link also gets a copy in flight per
/// [`crate::download::RTT_PER_CONNECTION`] of it, up to
/// [`crate::download::MAX_AUTO_CONNECTIONS`] in all. A copy is one
/// connection from source to target, and between hosts whose TCP is not
/// tuned each moves a window per round trip.
///
/// ```
/// use std::time::Duration;
/// use lors::burst::in_flight_at;
/// assert_eq!(in_flight_at(1, 1, Duration::from_millis(1)), 8);
/// assert_eq!(in_flight_at(1, 1, Duration::from_millis(188)), 94);
/// assert_eq!(in_flight_at(4, 4, Duration::from_millis(188)), 128);
/// ```
pub fn in_flight_at(sources: usize, targets: usize, rtt: std::time::Duration) -> usize {
    let far = crate::download::connections_for(rtt).saturating_mul(sources.max(targets));
    in_flight(sources, targets).max(far.min(crate::download::MAX_AUTO_CONNECTIONS))
}

/// The copies in flight on each depot's link, and the blocks each source
/// depot still has to send.
#[derive(Debug, Default)]
pub struct Links {
    /// Per source depot, the blocks it holds not yet taken, in file order.
    queues: BTreeMap<String, VecDeque<usize>>,
    taken: Vec<bool>,
    sending: HashMap<String, usize>,
    receiving: HashMap<String, usize>,
}

impl Links {
    /// Blocks `0..holders.len()`, block `i` readable from the depots
    /// `holders[i]`.
    pub fn new(holders: &[Vec<String>]) -> Links {
        let mut l = Links {
            taken: vec![false; holders.len()],
            ..Links::default()
        };
        for (i, hs) in holders.iter().enumerate() {
            for h in hs {
                l.queues.entry(h.clone()).or_default().push_back(i);
            }
        }
        l
    }

    /// The next block and the depot to send it: the source with the fewest
    /// copies in flight, ties to the longest queue. The send counts as in
    /// flight until [`Links::sent`]. `None` when every block is taken.
    pub fn next_copy(&mut self) -> Option<(usize, String)> {
        for q in self.queues.values_mut() {
            while q.front().is_some_and(|&b| self.taken[b]) {
                q.pop_front();
            }
        }
        self.queues.retain(|_, q| !q.is_empty());
        let busy = |d: &String| self.sending.get(d).copied().unwrap_or(0);
        let (src, q) = (self.queues.iter())
            .min_by_key(|(d, q)| (busy(d), std::cmp::Reverse(q.len())))
            .map(|(d, q)| (d.clone(), q))?;
        let block = *q.front().expect("non-empty");
        self.taken[block] = true;
        *self.sending.entry(src.clone()).or_default() += 1;
        Some((block, src))
    }

    /// The target for a copy: of `candidates` (in order of preference),
    /// the one receiving the fewest, counted as receiving until
    /// [`Links::received`].
    pub fn target<'a>(&mut self, candidates: impl Iterator<Item = &'a str>) -> Option<String> {
        let busy = |d: &str| self.receiving.get(d).copied().unwrap_or(0);
        let t = candidates.min_by_key(|d| busy(d))?.to_owned();
        *self.receiving.entry(t.clone()).or_default() += 1;
        Some(t)
    }

    /// How many copies `depot` receives now.
    pub fn receiving(&self, depot: &str) -> usize {
        self.receiving.get(depot).copied().unwrap_or(0)
    }

    /// A send from `src` ended (done or failed).
    pub fn sent(&mut self, src: &str) {
        if let Some(n) = self.sending.get_mut(src) {
            *n = n.saturating_sub(1);
        }
    }

    /// A copy to `target` ended (done or failed).
    pub fn received(&mut self, target: &str) {
        if let Some(n) = self.receiving.get_mut(target) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize, site: &str) -> Vec<String> {
        (0..n).map(|i| format!("{site}{i}")).collect()
    }

    /// A file striped round-robin over four depots, copied to four with
    /// eight in flight: each source sends two and each target receives two
    /// the whole time, and every block is copied once.
    #[test]
    fn every_link_carries_its_share_and_no_more() {
        let a = names(4, "a");
        let b = names(4, "b");
        let holders: Vec<Vec<String>> = (0..40).map(|i| vec![a[i % 4].clone()]).collect();
        let mut l = Links::new(&holders);
        let w = in_flight(4, 4);
        let mut flying: VecDeque<(usize, String, String)> = VecDeque::new();
        let mut copied = [0; 40];
        loop {
            while flying.len() < w {
                let Some((blk, src)) = l.next_copy() else {
                    break;
                };
                let t = l.target(b.iter().map(String::as_str)).unwrap();
                flying.push_back((blk, src, t));
            }
            if flying.len() == w {
                for d in &a {
                    assert_eq!(l.sending[d], 2, "{:?}", l.sending);
                }
                for d in &b {
                    assert_eq!(l.receiving(d), 2);
                }
            }
            let Some((blk, src, t)) = flying.pop_front() else {
                break;
            };
            copied[blk] += 1;
            l.sent(&src);
            l.received(&t);
        }
        assert!(copied.iter().all(|&n| n == 1));
    }

    /// A block on two sources goes once, from the less busy; a source with
    /// the longer queue goes first among equals.
    #[test]
    fn replicas_are_sent_once_from_the_idler_source() {
        let holders = vec![
            vec!["x".to_owned()],
            vec!["x".to_owned()],
            vec!["x".to_owned(), "y".to_owned()],
        ];
        let mut l = Links::new(&holders);
        assert_eq!(l.next_copy(), Some((0, "x".to_owned())));
        assert_eq!(l.next_copy(), Some((2, "y".to_owned())));
        assert_eq!(l.next_copy(), Some((1, "x".to_owned())));
        assert_eq!(l.next_copy(), None);
        assert_eq!(Links::new(&[]).next_copy(), None);
    }
}
