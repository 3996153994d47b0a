//! The response bytes the L-Bone holds at once: one budget for every body
//! it makes (listings, history, metrics), each body's room reserved before
//! it is made and held until it is sent or dropped — with a share per
//! client address, so a handful of addresses cannot hold it all.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes one unit of the budget stands for.
pub const UNIT: usize = 64 << 10;

/// The budget.
pub struct Budget {
    total: Arc<Semaphore>,
    units: usize,
    share: usize,
    /// Each address's semaphore of `share` units, while it holds any.
    shares: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

/// Room for one body; given back when dropped.
pub struct Room {
    _total: OwnedSemaphorePermit,
    _share: OwnedSemaphorePermit,
    units: usize,
}

/// Why no room was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoom {
    /// The address's own share stayed full for the wait.
    Share,
    /// The whole budget stayed full for the wait.
    Busy,
}

impl Budget {
    /// `bytes` in all, at most `bytes / shares` held by one address (a
    /// body larger than that takes the whole share, so an address holds
    /// one at a time).
    pub fn new(bytes: usize, shares: usize) -> Arc<Budget> {
        let units = (bytes / UNIT).max(1);
        Arc::new(Budget {
            total: Arc::new(Semaphore::new(units)),
            units,
            share: (units / shares.max(1)).max(1),
            shares: Mutex::new(HashMap::new()),
        })
    }

    fn units_for(&self, bytes: usize) -> usize {
        bytes.div_ceil(UNIT).clamp(1, self.units)
    }

    /// Room for `bytes` for `peer`, waited for up to `wait`: its share
    /// first, then the budget.
    pub async fn room(&self, bytes: usize, peer: IpAddr, wait: Duration) -> Result<Room, NoRoom> {
        let units = self.units_for(bytes);
        let sem = {
            let mut m = self.shares.lock().unwrap_or_else(|e| e.into_inner());
            // Shares nobody holds go, so the table stays as small as the
            // set of addresses with bodies in flight.
            m.retain(|_, s| s.available_permits() < self.share || Arc::strong_count(s) > 1);
            m.entry(peer.to_canonical())
                .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
                .clone()
        };
        let of_share = u32::try_from(units.min(self.share)).unwrap_or(u32::MAX);
        let of_total = u32::try_from(units).unwrap_or(u32::MAX);
        let take = async {
            let share =
                (sem.clone().acquire_many_owned(of_share).await).map_err(|_| NoRoom::Share)?;
            let total = (self.total.clone().acquire_many_owned(of_total).await)
                .map_err(|_| NoRoom::Busy)?;
            Ok::<_, NoRoom>((share, total))
        };
        match tokio::time::timeout(wait, take).await {
            Ok(Ok((share, total))) => Ok(Room {
                _total: total,
                _share: share,
                units,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) if sem.available_permits() < of_share as usize => Err(NoRoom::Share),
            Err(_) => Err(NoRoom::Busy),
        }
    }

    /// Units free now (for tests and metrics).
    pub fn free_units(&self) -> usize {
        self.total.available_permits()
    }
}

impl Room {
    /// Whether `bytes` fit in this room.
    pub fn holds(&self, bytes: usize) -> bool {
        bytes <= self.units.saturating_mul(UNIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_address_holds_its_share_and_others_still_get_room() {
        let b = Budget::new(16 * UNIT, 4);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let c: IpAddr = "127.0.0.3".parse().unwrap();
        let wait = Duration::from_millis(100);
        // A body larger than a share takes the whole share and its size.
        let big = b.room(6 * UNIT, a, wait).await.unwrap();
        assert!(big.holds(6 * UNIT));
        assert_eq!(b.free_units(), 10);
        assert_eq!(b.room(1, a, wait).await.err(), Some(NoRoom::Share));
        // Another address is not held up by it.
        let other = b.room(4 * UNIT, c, wait).await.unwrap();
        assert_eq!(b.free_units(), 6);
        drop((big, other));
        assert_eq!(b.free_units(), 16);
        assert!(b.room(UNIT, a, wait).await.is_ok());
    }
}
