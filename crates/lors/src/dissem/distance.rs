//! A dissemination's concurrency fitted to its sites' distance.
//!
//! Every copy, from the client or from one site to another, goes over one
//! connection, and an untuned TCP connection moves one window (about
//! 32 KiB) per round trip: six copies at once between sites 300 ms apart
//! move under 8 Mbit/s. Four sites 30 to 188 ms from the client, 100
//! Mbit/s each, took 18 times the file's time through one link that way.
//! So before the first copy the client connects to every site (the
//! connections are kept for the first copies) and its round trips buy
//! copies in flight as they buy a download connections (one per
//! [`crate::download::RTT_PER_CONNECTION`], up to
//! [`crate::download::MAX_AUTO_CONNECTIONS`]). Two sites' round trip to
//! each other is not the client's to see: it is taken as the sum of
//! theirs to the client (the path through the client's side of the
//! network), the longest such pair setting every site's slots. A file is
//! then cut into blocks enough for [`crate::upload`]'s waves on every
//! slot, as an upload's are.
use std::time::Duration;

use super::sched::Config;
use crate::download::{MAX_AUTO_CONNECTIONS, connections_for};

/// Blocks per slot a file is cut into at distance (as an upload's, see
/// `upload::distance`).
const WAVES: u64 = 4;

/// The smallest block a file is cut into at distance: each block is an
/// allocation on every site.
const MIN_FITTED_BLOCK: u64 = 256 << 10;

/// Raises `cfg`'s slots for sites at round trips `rtts` from the client:
/// a site's in and out slots to one per `RTT_PER_CONNECTION` of the
/// longest round trip between two sites, the client's to one per
/// `RTT_PER_CONNECTION` of the longest to a site (never fewer than they
/// are). Whether anything was raised.
pub(super) fn fit(cfg: &mut Config, rtts: &[Duration]) -> bool {
    let mut sorted = rtts.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let far = sorted.first().copied().unwrap_or_default();
    let pair = far + sorted.get(1).copied().unwrap_or_default();
    let slots = connections_for(pair).min(MAX_AUTO_CONNECTIONS);
    let client = connections_for(far).min(MAX_AUTO_CONNECTIONS);
    let raised = slots > cfg.in_slots || slots > cfg.out_slots || client > cfg.client_slots;
    cfg.in_slots = cfg.in_slots.max(slots);
    cfg.out_slots = cfg.out_slots.max(slots);
    cfg.client_slots = cfg.client_slots.max(client);
    raised
}

/// The block size of a file of `size` bytes with `slots` copies in flight
/// per site: `bs`, or smaller so each slot gets [`WAVES`] blocks (never
/// below [`MIN_FITTED_BLOCK`]).
pub(super) fn block_size(bs: u64, size: u64, slots: usize) -> u64 {
    let n = u64::try_from(slots.max(1)).unwrap_or(u64::MAX);
    let each = size.div_ceil(n.saturating_mul(WAVES));
    bs.min(each.next_power_of_two().max(MIN_FITTED_BLOCK))
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn far_sites_get_slots_for_the_longest_pair_and_the_client_for_the_farthest() {
        let mut cfg = Config::default();
        assert!(fit(&mut cfg, &ms(&[30, 60, 120, 188])));
        assert_eq!(
            (cfg.in_slots, cfg.out_slots),
            (128, 128),
            "308 ms between the two farthest"
        );
        assert_eq!(cfg.client_slots, 94);
        let mut cfg = Config::default();
        assert!(fit(&mut cfg, &ms(&[10, 14])));
        assert_eq!((cfg.in_slots, cfg.out_slots, cfg.client_slots), (12, 12, 7));
    }

    #[test]
    fn a_lan_keeps_the_defaults() {
        let mut cfg = Config::default();
        assert!(!fit(&mut cfg, &ms(&[0, 1, 1])));
        assert!(!fit(&mut cfg, &[]));
        let d = Config::default();
        assert_eq!(
            (cfg.in_slots, cfg.client_slots),
            (d.in_slots, d.client_slots)
        );
    }

    #[test]
    fn blocks_are_cut_for_four_waves_but_not_below_256_kib() {
        assert_eq!(block_size(2 << 20, 128 << 20, 128), 256 << 10);
        assert_eq!(block_size(2 << 20, 128 << 20, 16), 2 << 20);
        assert_eq!(block_size(2 << 20, 1000, 128), 256 << 10);
        assert_eq!(block_size(8 << 20, u64::MAX, 128), 8 << 20);
        assert_eq!(block_size(8 << 20, u64::MAX, usize::MAX), 256 << 10);
    }
}
