//! Connections by client address, so that no one host — or handful of
//! hosts — can take a service from everyone else: each address holds at
//! most a share of the connections and of the requests in flight (HTTP/2
//! streams included), and at the overall limit the server closes a
//! connection with no request in flight (still waiting for its first, or
//! idle between two), the oldest of the address holding the most, which
//! hands its place to the newcomer; when every connection is busy, the
//! oldest of the address holding the most is closed anyway, if that
//! address holds more than the newcomer's (`THREAT-MODEL.md`).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, oneshot};

/// The table of connected addresses.
pub struct Peers {
    per_client: usize,
    per_client_requests: usize,
    table: Mutex<HashMap<IpAddr, Peer>>,
    seq: AtomicU64,
}

#[derive(Default)]
struct Peer {
    open: usize,
    /// Requests in flight on its connections, response bodies included.
    requests: usize,
    /// Its connections with no request in flight, oldest first, each with
    /// the signal that closes it.
    waiting: BTreeMap<u64, Arc<Evict>>,
    /// All its connections, oldest first.
    all: BTreeMap<u64, Arc<Evict>>,
}

/// How a connection is closed to make room: a signal, and where its place
/// goes.
#[derive(Default)]
struct Evict {
    close: Notify,
    to: Mutex<Option<oneshot::Sender<OwnedSemaphorePermit>>>,
    /// Closed with requests in flight: at once, not after they finish.
    busy: std::sync::atomic::AtomicBool,
    /// It holds a place (one waiting for a place has none to hand over).
    placed: std::sync::atomic::AtomicBool,
    /// It was chosen to make room (its place goes to that newcomer only),
    /// or its task has ended: never to be chosen again.
    chosen: std::sync::atomic::AtomicBool,
}

/// One admitted connection; dropping it releases its place.
pub struct Slot {
    peers: Arc<Peers>,
    ip: IpAddr,
    seq: u64,
    evict: Arc<Evict>,
    /// Requests in flight.
    busy: AtomicUsize,
    /// Since when none has been.
    idle_since: Mutex<Instant>,
}

/// A request in flight on a [`Slot`]; dropping it ends the request.
pub struct Busy(Arc<Slot>);

/// One of an address's requests in flight (see [`Slot::request`]).
pub struct Request {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    /// At most `per_client` connections and `per_client_requests` requests
    /// in flight per address.
    pub fn new(per_client: usize, per_client_requests: usize) -> Arc<Peers> {
        Arc::new(Peers {
            per_client: per_client.max(1),
            per_client_requests: per_client_requests.max(1),
            table: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Peer>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection from `ip`, listed as waiting for its request;
    /// `None` when the address holds its share already.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let ip = ip.to_canonical();
        let seq = self.seq.fetch_add(1, Relaxed);
        let evict = Arc::new(Evict::default());
        let mut t = self.lock();
        let p = t.entry(ip).or_default();
        if p.open >= self.per_client {
            return None;
        }
        p.open += 1;
        p.waiting.insert(seq, evict.clone());
        p.all.insert(seq, evict.clone());
        Some(Slot {
            peers: self.clone(),
            ip,
            seq,
            evict,
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    /// Closes the oldest connection with no request in flight of the
    /// address holding the most connections (at least as many as the
    /// newcomer's), other than `newcomer`; if every connection is busy,
    /// the oldest of the address holding the most, if that is more than
    /// the newcomer's. Its place (its permit) arrives on the receiver
    /// returned. `None`: no connection may be closed for it.
    pub fn evict_waiting(
        &self,
        newcomer: &Slot,
    ) -> Option<oneshot::Receiver<OwnedSemaphorePermit>> {
        let mut t = self.lock();
        let mine = t.get(&newcomer.ip).map_or(0, |p| p.open);
        // One still waiting for its own place has none to hand over.
        let can = |(s, e): (&u64, &Arc<Evict>)| {
            *s != newcomer.seq && e.placed.load(Relaxed) && !e.chosen.load(Relaxed)
        };
        let waits = |p: &Peer| p.open >= mine && p.waiting.iter().any(can);
        let victim = match t.values_mut().filter(|p| waits(p)).max_by_key(|p| p.open) {
            Some(p) => {
                // Out of both lists: chosen once, never again.
                let seq = *p.waiting.iter().find(|&e| can(e))?.0;
                p.all.remove(&seq);
                p.waiting.remove(&seq)?
            }
            None => {
                let busy = |(ip, p): &(&IpAddr, &mut Peer)| {
                    **ip != newcomer.ip && p.open > mine && p.all.iter().any(can)
                };
                let (_, p) = t.iter_mut().filter(busy).max_by_key(|(_, p)| p.open)?;
                let seq = *p.all.iter().find(|&e| can(e))?.0;
                let v = p.all.remove(&seq)?;
                p.waiting.remove(&seq);
                v.busy.store(true, Relaxed);
                v
            }
        };
        let (tx, rx) = oneshot::channel();
        victim.chosen.store(true, Relaxed);
        *victim.to.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        victim.close.notify_one();
        Some(rx)
    }
}

/// The place a newcomer waits for after [`Peers::evict_waiting`]: handed
/// over by the connection closed for it, or — if that one's task ended
/// first, its place back in `places` — taken from there; `None` after
/// `wait`.
pub async fn place_for(
    handed: oneshot::Receiver<OwnedSemaphorePermit>,
    places: Arc<tokio::sync::Semaphore>,
    wait: Duration,
) -> Option<OwnedSemaphorePermit> {
    let take = async {
        match handed.await {
            Ok(p) => Some(p),
            Err(_) => places.acquire_owned().await.ok(),
        }
    };
    tokio::time::timeout(wait, take).await.ok().flatten()
}

impl Slot {
    /// The request is in: this connection is no longer one to close under
    /// pressure (for a connection that serves one request only).
    pub fn served(&self) {
        if let Some(p) = self.peers.lock().get_mut(&self.ip) {
            p.waiting.remove(&self.seq);
        }
    }

    /// A request has come in; while the guard lives the connection is not
    /// one to close under pressure. When the last in flight ends it is
    /// again, and idle from then.
    pub fn begin(self: &Arc<Self>) -> Busy {
        if self.busy.fetch_add(1, Relaxed) == 0 {
            self.served();
        }
        Busy(self.clone())
    }

    /// How long the connection has had no request in flight; `None` while
    /// one is.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.busy.load(Relaxed) > 0 {
            return None;
        }
        Some(
            self.idle_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed(),
        )
    }

    /// Resolves when the server closes this connection to make room; then
    /// [`hand_over`](Slot::hand_over) its place.
    pub async fn evicted(&self) {
        self.evict.close.notified().await;
    }

    /// The connection's task has ended: it is no longer one to close to
    /// make room (its place is gone with it), though requests of it may
    /// still be finishing elsewhere (HTTP/2 streams).
    pub fn ended(&self) {
        if let Some(p) = self.peers.lock().get_mut(&self.ip) {
            p.waiting.remove(&self.seq);
            p.all.remove(&self.seq);
        }
        self.evict.chosen.store(true, Relaxed);
    }

    /// The connection holds its place now: it may be closed to make room.
    pub fn placed(&self) {
        self.evict.placed.store(true, Relaxed);
    }

    /// Whether it was closed to make room with requests in flight: they
    /// are cut, not waited for.
    pub fn evicted_busy(&self) -> bool {
        self.evict.busy.load(Relaxed)
    }

    /// A request of this connection's address in flight until the guard is
    /// dropped; `None` when the address has its share in flight already.
    pub fn request(&self) -> Option<Request> {
        let mut t = self.peers.lock();
        let p = t.get_mut(&self.ip)?;
        if p.requests >= self.peers.per_client_requests {
            return None;
        }
        p.requests += 1;
        Some(Request {
            peers: self.peers.clone(),
            ip: self.ip,
        })
    }

    /// Gives this evicted connection's place to the one it makes room for.
    pub fn hand_over(&self, place: OwnedSemaphorePermit) {
        if let Some(tx) = self
            .evict
            .to
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = tx.send(place);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let slot = &self.0;
        if slot.busy.fetch_sub(1, Relaxed) != 1 {
            return;
        }
        *slot.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        // Listed again as a connection to close under pressure, at its
        // original age: the oldest idle ones go first.
        if slot.evict.chosen.load(Relaxed) {
            return;
        }
        if let Some(p) = slot.peers.lock().get_mut(&slot.ip) {
            p.waiting.insert(slot.seq, slot.evict.clone());
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self.peers.lock();
        if let Some(p) = t.get_mut(&self.ip) {
            p.waiting.remove(&self.seq);
            p.all.remove(&self.seq);
            p.open = p.open.saturating_sub(1);
            if p.open == 0 && p.requests == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let mut t = self.peers.lock();
        if let Some(p) = t.get_mut(&self.ip) {
            p.requests = p.requests.saturating_sub(1);
            if p.open == 0 && p.requests == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn closed(s: &Slot) -> bool {
        tokio::time::timeout(Duration::from_millis(100), s.evicted())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn shares_per_address_and_the_busiest_waits_lose_first() {
        let peers = Peers::new(3, 2);
        let a: IpAddr = "127.0.9.1".parse().unwrap();
        let b: IpAddr = "127.0.0.1".parse().unwrap();
        let flood: Vec<Arc<Slot>> = (0..3).map(|_| Arc::new(peers.admit(a).unwrap())).collect();
        assert!(peers.admit(a).is_none(), "a fourth from one address");
        for s in &flood {
            s.placed();
        }
        let mine = peers.admit(b).unwrap();
        let place = peers.evict_waiting(&mine).unwrap();
        assert!(closed(&flood[0]).await);
        assert!(!closed(&mine).await);
        // The closed connection's place goes to the newcomer.
        let places = Arc::new(tokio::sync::Semaphore::new(1));
        flood[0].hand_over(places.clone().try_acquire_owned().unwrap());
        assert!(place.await.is_ok());
        // Served connections are never closed to make room, nor is the
        // newcomer itself.
        for s in &flood[1..] {
            s.served();
        }
        mine.served();
        assert!(
            peers.evict_waiting(&flood[1]).is_none(),
            "b holds fewer than a"
        );
        // Every connection busy: the busiest address gives up its oldest
        // not chosen already (a connection makes room for one newcomer).
        let busy = peers.evict_waiting(&mine);
        assert!(busy.is_some());
        assert!(closed(&flood[1]).await && flood[1].evicted_busy());
        assert!(!closed(&flood[0]).await, "chosen once, never again");
        // Requests in flight per address, streams included.
        let r1 = flood[1].request().unwrap();
        let r2 = flood[2].request().unwrap();
        assert!(flood[1].request().is_none(), "a third from one address");
        assert!(mine.request().is_some(), "another address is not counted");
        drop((r1, r2));
        assert!(flood[1].request().is_some());
        // A keep-alive connection between requests may be closed again.
        let busy = flood[2].begin();
        assert!(flood[2].idle_for().is_none());
        drop(busy);
        assert!(flood[2].idle_for().is_some());
        assert!(peers.evict_waiting(&mine).is_some());
        assert!(closed(&flood[2]).await && !flood[2].evicted_busy());
        drop(flood);
        drop(mine);
        assert!(
            peers.lock().is_empty(),
            "entries go with their last connection"
        );
    }
}
