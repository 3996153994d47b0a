//! The response bytes the L-Bone holds at once: one budget for every body
//! it makes (listings, history, metrics), each body's room reserved before
//! it is made and held until every answer sending it is sent or dropped
//! (a body shared by many answers is counted once) — and a share per
//! client address of the answers in flight, so a handful of addresses
//! cannot hold it all.

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

/// A body's room in the budget, shared by the answers sending it.
pub struct Reserved {
    _total: OwnedSemaphorePermit,
    units: usize,
}

/// Room for one answer: its body's reservation and its address's share;
/// given back when dropped.
pub struct Room {
    body: Arc<Reserved>,
    _share: OwnedSemaphorePermit,
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

    /// Room for a new body of `bytes` for `peer`, waited for up to
    /// `wait`: its share first, then the budget.
    pub async fn room(&self, bytes: usize, peer: IpAddr, wait: Duration) -> Result<Room, NoRoom> {
        let units = self.units_for(bytes);
        let take = async {
            let share = self.share_of(units, peer).await?;
            let total = (self.total.clone())
                .acquire_many_owned(u32::try_from(units).unwrap_or(u32::MAX))
                .await
                .map_err(|_| NoRoom::Busy)?;
            Ok::<_, NoRoom>(Room {
                body: Arc::new(Reserved {
                    _total: total,
                    units,
                }),
                _share: share,
            })
        };
        match tokio::time::timeout(wait, take).await {
            Ok(r) => r,
            Err(_) if self.share_full(peer) => Err(NoRoom::Share),
            Err(_) => Err(NoRoom::Busy),
        }
    }

    /// Room for another answer sending a body already reserved: `peer`'s
    /// share only, waited for up to `wait`.
    pub async fn again(
        &self,
        body: &Arc<Reserved>,
        peer: IpAddr,
        wait: Duration,
    ) -> Result<Room, NoRoom> {
        match tokio::time::timeout(wait, self.share_of(body.units, peer)).await {
            Ok(Ok(share)) => Ok(Room {
                body: body.clone(),
                _share: share,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(NoRoom::Share),
        }
    }

    /// Makes `room` (not yet shared) hold `bytes`: more of the budget,
    /// waited for up to `wait`; its address's share stays as it is.
    pub async fn grow(&self, room: &mut Room, bytes: usize, wait: Duration) -> Result<(), NoRoom> {
        let units = self.units_for(bytes);
        let Some(body) = Arc::get_mut(&mut room.body) else {
            return Err(NoRoom::Busy);
        };
        if units <= body.units {
            return Ok(());
        }
        let more = u32::try_from(units - body.units).unwrap_or(u32::MAX);
        match tokio::time::timeout(wait, self.total.clone().acquire_many_owned(more)).await {
            Ok(Ok(p)) => {
                body._total.merge(p);
                body.units = units;
                Ok(())
            }
            _ => Err(NoRoom::Busy),
        }
    }

    /// `peer`'s semaphore, made if it holds none.
    fn share_sem(&self, peer: IpAddr) -> Arc<Semaphore> {
        let mut m = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        // Shares nobody holds or waits for go, so the table stays as small
        // as the set of addresses with answers in flight.
        m.retain(|_, s| Arc::strong_count(s) > 1);
        m.entry(peer.to_canonical())
            .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
            .clone()
    }

    /// `units` of `peer`'s share (all of it for a body larger than it).
    async fn share_of(&self, units: usize, peer: IpAddr) -> Result<OwnedSemaphorePermit, NoRoom> {
        let n = u32::try_from(units.min(self.share)).unwrap_or(u32::MAX);
        (self.share_sem(peer).acquire_many_owned(n).await).map_err(|_| NoRoom::Share)
    }

    fn share_full(&self, peer: IpAddr) -> bool {
        let m = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&peer.to_canonical())
            .is_some_and(|s| s.available_permits() < self.share)
    }

    /// Units free now (for tests and metrics).
    pub fn free_units(&self) -> usize {
        self.total.available_permits()
    }
}

impl Room {
    /// Whether `bytes` fit in this room.
    pub fn holds(&self, bytes: usize) -> bool {
        bytes <= self.body.units.saturating_mul(UNIT)
    }

    /// The body's reservation, for other answers sending the same body.
    pub fn body(&self) -> Arc<Reserved> {
        self.body.clone()
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
        // A body larger than its room grows it from the budget.
        let e: IpAddr = "127.0.0.4".parse().unwrap();
        let mut small = b.room(UNIT, e, wait).await.unwrap();
        b.grow(&mut small, 2 * UNIT, wait).await.unwrap();
        assert!(small.holds(2 * UNIT));
        assert_eq!(b.free_units(), 4);
        drop(small);
        // A body sent again costs its address's share, not the budget.
        let body = other.body();
        drop(other);
        assert_eq!(b.free_units(), 6);
        let again = b.again(&body, a, wait).await.err();
        assert_eq!(again, Some(NoRoom::Share), "a's share is still held");
        drop(big);
        let again = b.again(&body, a, wait).await.unwrap();
        assert_eq!(b.free_units(), 12);
        drop((body, again));
        assert_eq!(b.free_units(), 16);
        assert!(b.room(UNIT, a, wait).await.is_ok());
    }
}
