//! An upload's concurrency fitted to its depots' distance.
//!
//! A block goes to a depot over one connection, and an untuned TCP
//! connection moves one window (about 32 KiB) per round trip: 188 ms away,
//! under 3 Mbit/s. Eight blocks in flight, enough on a LAN, then fill a
//! tenth of a 100 Mbit/s link. So before the first block the upload
//! connects to its depots (the connections are then reused for the
//! ALLOCATEs), and the round trips it measures buy blocks in flight as
//! they buy a download connections ([`crate::download::RTT_PER_CONNECTION`]
//! each, up to [`crate::download::MAX_AUTO_CONNECTIONS`]). A file of known
//! size is cut into blocks enough for [`WAVES`] of them on every
//! connection when its own blocks would be fewer: of a hundred transfers
//! sharing a link some finish seconds after the others, and a last few
//! blocks each moving one window per round trip leave the link idle, so
//! the work is dealt in smaller blocks that the quicker connections
//! take more of.
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::UploadOptions;
use crate::Pool;
use crate::download::{MAX_AUTO_CONNECTIONS, connections_for};

/// Blocks per connection a file is cut into for distance: one each left
/// 128 MiB going to a depot 188 ms away at 66 Mbit/s of its 100, the last
/// transfers alone on the link for seconds; three to four each, 80–82.
pub(super) const WAVES: u64 = 4;

/// The smallest block the upload cuts a file into for distance.
pub(super) const MIN_FITTED_BLOCK: u64 = 256 << 10;

/// What blocks in memory may hold at once (eight 10 MiB blocks, the
/// defaults): a stream, or a file read through end-to-end functions, gets
/// smaller blocks rather than more memory when distance adds blocks.
pub(super) const MEMORY_BUDGET: u64 = 80 << 20;

/// Blocks in flight for depots at `rtts`: `threads`, or one per
/// [`crate::download::RTT_PER_CONNECTION`] of their round trips together when that is more
/// (at most [`MAX_AUTO_CONNECTIONS`]).
pub(super) fn threads(threads: usize, rtts: &[Duration]) -> usize {
    let want = rtts
        .iter()
        .map(|&r| connections_for(r))
        .fold(0, usize::saturating_add);
    threads.max(want.min(MAX_AUTO_CONNECTIONS))
}

/// The block size for `threads` blocks in flight: `bs`, or smaller so a
/// file of `size` bytes makes [`WAVES`] blocks for each (never below
/// [`MIN_FITTED_BLOCK`]), and in memory (`in_memory`) no more than
/// [`MEMORY_BUDGET`] in all (never below a MiB).
pub(super) fn block_size(bs: u64, threads: usize, size: Option<u64>, in_memory: bool) -> u64 {
    let n = u64::try_from(threads.max(1)).unwrap_or(u64::MAX);
    let mut fitted = bs;
    if let Some(size) = size {
        let each = size.div_ceil(n.saturating_mul(WAVES));
        fitted = fitted.min(each.next_multiple_of(4096).max(MIN_FITTED_BLOCK));
    }
    if in_memory {
        fitted = fitted.min((MEMORY_BUDGET / n).max(1 << 20));
    }
    fitted.max(1)
}

/// Blocks in flight shared by the uploads of a batch (`lors upload` of
/// many files): a file of a MiB is four blocks at distance, so a hundred of
/// them one after another would each wait out its round trips with the
/// link mostly idle. Run side by side with one `Slots`, they keep as many
/// blocks in flight together as one large file would, and no more (the
/// depots' per-client caps see one upload's worth of connections).
///
/// ```no_run
/// # async fn f(opts: lors::upload::UploadOptions, pool: std::sync::Arc<lors::Pool>) {
/// let slots = lors::upload::Slots::measure(&opts, &pool).await;
/// // Each upload of the batch is given `slots.clone()` in its Control.
/// assert!(slots.threads() >= 1);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Slots {
    sem: Arc<Semaphore>,
    threads: usize,
}

impl Slots {
    /// Blocks in flight for uploads with `opts` to its depots: the
    /// threads it sets, raised by the depots' round trips (measured
    /// through `pool`, whose connections the uploads then reuse) unless
    /// the threads were chosen by hand.
    pub async fn measure(opts: &UploadOptions, pool: &Arc<Pool>) -> Slots {
        let mut n = opts.threads.max(1);
        if opts.auto_threads {
            let rtts = pool
                .round_trips(&opts.depots, crate::pool::MEASURE_WAIT)
                .await;
            n = threads(n, &rtts);
        }
        Slots::new(n)
    }

    /// `threads` blocks in flight (at least one).
    pub fn new(threads: usize) -> Slots {
        let threads = threads.max(1);
        Slots {
            sem: Arc::new(Semaphore::new(threads)),
            threads,
        }
    }

    /// Blocks in flight at most, over every upload sharing these slots.
    pub fn threads(&self) -> usize {
        self.threads
    }

    pub(super) fn semaphore(&self) -> Arc<Semaphore> {
        self.sem.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn a_lan_keeps_the_threads_it_was_given() {
        assert_eq!(threads(8, &ms(&[0, 1, 1])), 8);
        assert_eq!(threads(8, &[]), 8);
        assert_eq!(threads(3, &ms(&[10])), 5);
    }

    #[test]
    fn round_trips_buy_blocks_in_flight_up_to_the_cap() {
        assert_eq!(threads(8, &ms(&[188])), 94);
        assert_eq!(threads(8, &ms(&[14, 30, 45])), 44);
        assert_eq!(threads(8, &ms(&[188, 188, 188])), MAX_AUTO_CONNECTIONS);
        assert_eq!(threads(200, &ms(&[188])), 200, "a hand-set count stays");
        assert_eq!(threads(8, &[Duration::MAX]), MAX_AUTO_CONNECTIONS);
    }

    #[test]
    fn a_file_gets_waves_of_blocks_for_its_threads() {
        let bs = block_size(10 * MIB, 94, Some(100 * MIB), false);
        let blocks = (100 * MIB).div_ceil(bs);
        assert!((360..=376).contains(&blocks), "{blocks} blocks of {bs}");
        assert_eq!(bs % 4096, 0);
        // A big file keeps its blocks; a small one is not cut to crumbs.
        assert_eq!(block_size(10 * MIB, 94, Some(10 << 30), false), 10 * MIB);
        assert_eq!(block_size(10 * MIB, 94, Some(MIB), false), MIN_FITTED_BLOCK);
        assert_eq!(block_size(10 * MIB, 8, Some(0), false), MIN_FITTED_BLOCK);
        assert_eq!(block_size(64 << 10, 94, Some(100 * MIB), false), 64 << 10);
        assert_eq!(block_size(10 * MIB, 8, Some(u64::MAX), false), 10 * MIB);
    }

    #[test]
    fn blocks_in_memory_stay_within_the_budget() {
        assert_eq!(block_size(10 * MIB, 8, None, true), 10 * MIB);
        assert_eq!(block_size(10 * MIB, 94, None, true), MIB);
        assert_eq!(block_size(10 * MIB, 16, Some(10 << 30), true), 5 * MIB);
    }
}
