//! Per-client limits: how many connections, data phases and transfer-buffer
//! bytes one client address may hold at once, so that one peer — hostile or
//! merely greedy — cannot take the whole depot from everyone else
//! (`THREAT-MODEL.md`, "Per-client limits").

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::timeout;

use super::CHUNK_BYTES;

/// The limits one client address is held to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientLimits {
    /// Open connections.
    pub connections: usize,
    /// Data phases (STORE, WRITE, queue LOAD) at once.
    pub transfers: usize,
    /// Transfer-buffer permits ([`CHUNK_BYTES`] each) at once.
    pub buffer_permits: u32,
}

/// What one client address holds now.
struct Client {
    connections: usize,
    transfers: Arc<Semaphore>,
    buffers: Arc<Semaphore>,
    /// Its connections waiting for a command, oldest first, each with the
    /// signal that closes it.
    idle: BTreeMap<u64, Arc<Evict>>,
}

/// The table of connected clients, by address.
pub(crate) struct Clients {
    limits: ClientLimits,
    table: Mutex<HashMap<IpAddr, Client>>,
    /// Orders idle connections.
    seq: AtomicU64,
}

/// One admitted connection's hold on its client's entry; dropping it
/// releases the connection (and the entry, with the last one).
pub(crate) struct ClientSlot {
    clients: Arc<Clients>,
    ip: IpAddr,
    /// The client's data-phase slots.
    pub transfers: Arc<Semaphore>,
    /// The client's share of the transfer-buffer budget.
    pub buffers: Arc<Semaphore>,
}

impl Clients {
    pub(crate) fn new(limits: ClientLimits) -> Arc<Clients> {
        Arc::new(Clients {
            limits,
            table: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
        })
    }

    /// The limits in force.
    pub(crate) fn limits(&self) -> ClientLimits {
        self.limits
    }

    /// Admits one more connection from `ip`, or `None` when that address
    /// already holds its share of connections.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        // An IPv4 peer on a dual-stack socket is the same client either way.
        let ip = ip.to_canonical();
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let c = t.entry(ip).or_insert_with(|| Client {
            connections: 0,
            transfers: Arc::new(Semaphore::new(self.limits.transfers)),
            buffers: Arc::new(Semaphore::new(self.limits.buffer_permits as usize)),
            idle: BTreeMap::new(),
        });
        if c.connections >= self.limits.connections {
            return None;
        }
        c.connections += 1;
        Some(ClientSlot {
            clients: self.clone(),
            ip,
            transfers: c.transfers.clone(),
            buffers: c.buffers.clone(),
        })
    }

    /// Closes one connection that waits for a command, to make room for a
    /// new one when the depot is at `max_connections`: the oldest idle
    /// connection of the address holding the most connections, so a host
    /// that parks hundreds of idle connections loses them before anyone
    /// else loses one. The closed connection hands its place (its permit)
    /// to the receiver returned, not to whoever waits longest; `None`: no
    /// connection is idle.
    pub(crate) fn evict_idle(&self) -> Option<oneshot::Receiver<OwnedSemaphorePermit>> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let c = t
            .values_mut()
            .filter(|c| !c.idle.is_empty())
            .max_by_key(|c| c.connections)?;
        let (_, victim) = c.idle.pop_first()?;
        Some(victim.evict())
    }

    /// Connections `ip` has open now.
    #[cfg(test)]
    fn connections(&self, ip: IpAddr) -> usize {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.get(&ip.to_canonical()).map_or(0, |c| c.connections)
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut t = self.clients.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = t.get_mut(&self.ip) {
            c.connections = c.connections.saturating_sub(1);
            if c.connections == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

/// Why a connection could not get what a data phase needs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Nothing freed up within the deadline.
    TimedOut,
}

/// A connection waiting for its next command, listed as one the depot may
/// close under pressure ([`Clients::evict_idle`]); dropped once a command
/// arrives.
pub(crate) struct Idle<'a> {
    slot: &'a ClientSlot,
    seq: u64,
    evict: Arc<Evict>,
}

impl Idle<'_> {
    /// Resolves when the depot closes this connection to make room; then
    /// [`hand_over`](Idle::hand_over) its place.
    pub(crate) async fn evicted(&self) {
        self.evict.close.notified().await;
    }

    /// Gives this evicted connection's place to the one it makes room for.
    pub(crate) fn hand_over(&self, place: OwnedSemaphorePermit) {
        self.evict.hand_over(place);
    }
}

/// How a connection is closed to make room: a signal, and where its place
/// goes.
#[derive(Default)]
struct Evict {
    close: Notify,
    to: Mutex<Option<oneshot::Sender<OwnedSemaphorePermit>>>,
}

impl Evict {
    /// Signals the connection; its place arrives on the receiver.
    fn evict(&self) -> oneshot::Receiver<OwnedSemaphorePermit> {
        let (tx, rx) = oneshot::channel();
        *self.to.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        self.close.notify_one();
        rx
    }

    fn hand_over(&self, place: OwnedSemaphorePermit) {
        if let Some(tx) = self.to.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(place);
        }
    }
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        let c = &self.slot.clients;
        let mut t = c.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = t.get_mut(&self.slot.ip) {
            entry.idle.remove(&self.seq);
        }
    }
}

impl ClientSlot {
    /// Lists this connection as idle until the returned guard drops.
    pub(crate) fn idle(&self) -> Idle<'_> {
        let seq = self.clients.seq.fetch_add(1, Relaxed);
        let evict = Arc::new(Evict::default());
        let mut t = self.clients.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = t.get_mut(&self.ip) {
            entry.idle.insert(seq, evict.clone());
        }
        Idle {
            slot: self,
            seq,
            evict,
        }
    }

    /// Takes one of the client's data-phase slots, waiting at most `limit`.
    pub(crate) async fn transfer(&self, limit: Duration) -> Result<OwnedSemaphorePermit, Wait> {
        acquire(&self.transfers, 1, limit).await
    }
}

/// Takes `n` permits of `sem`, waiting at most `limit`.
pub(crate) async fn acquire(
    sem: &Arc<Semaphore>,
    n: u32,
    limit: Duration,
) -> Result<OwnedSemaphorePermit, Wait> {
    match timeout(limit, sem.clone().acquire_many_owned(n)).await {
        Ok(Ok(p)) => Ok(p),
        // The semaphores are never closed; treat it as "no room" anyway.
        Ok(Err(_)) | Err(_) => Err(Wait::TimedOut),
    }
}

/// Buffer permits in `bytes`, at least one.
pub(crate) fn permits_in(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(CHUNK_BYTES as u64))
        .unwrap_or(u32::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ClientLimits {
        ClientLimits {
            connections: 2,
            transfers: 1,
            buffer_permits: 4,
        }
    }

    #[test]
    fn connections_are_counted_per_address_and_released_on_drop() {
        let clients = Clients::new(limits());
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let s1 = clients.admit(a).unwrap();
        // The IPv4-mapped form is the same client.
        let s2 = clients.admit("::ffff:127.0.0.2".parse().unwrap()).unwrap();
        assert!(
            clients.admit(a).is_none(),
            "third connection from one address"
        );
        assert!(
            clients.admit(b).is_some(),
            "another address is not affected"
        );
        drop(s1);
        assert_eq!(clients.connections(a), 1);
        let s3 = clients.admit(a).unwrap();
        drop((s2, s3));
        assert_eq!(clients.connections(a), 0);
        assert!(
            clients.table.lock().unwrap().is_empty(),
            "entries go with their last connection"
        );
    }

    #[tokio::test]
    async fn a_client_waits_for_its_own_slots_only_until_the_deadline() {
        let clients = Clients::new(limits());
        let a = clients.admit("127.0.0.4".parse().unwrap()).unwrap();
        let a2 = clients.admit("127.0.0.4".parse().unwrap()).unwrap();
        let b = clients.admit("127.0.0.5".parse().unwrap()).unwrap();
        let held = a.transfer(Duration::from_millis(10)).await.unwrap();
        assert_eq!(
            a2.transfer(Duration::from_millis(20)).await.err(),
            Some(Wait::TimedOut)
        );
        assert!(b.transfer(Duration::from_millis(10)).await.is_ok());
        drop(held);
        assert!(a2.transfer(Duration::from_millis(10)).await.is_ok());
    }

    async fn soon(i: &Idle<'_>) -> bool {
        tokio::time::timeout(Duration::from_millis(200), i.evicted())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn the_busiest_address_loses_its_oldest_idle_connection_first() {
        let clients = Clients::new(ClientLimits {
            connections: 8,
            transfers: 1,
            buffer_permits: 4,
        });
        let many: Vec<ClientSlot> = (0..3)
            .map(|_| clients.admit("127.0.0.6".parse().unwrap()).unwrap())
            .collect();
        let one = clients.admit("127.0.0.7".parse().unwrap()).unwrap();
        assert!(clients.evict_idle().is_none(), "nobody is idle");
        let mine = one.idle();
        let first = many[0].idle();
        let second = many[1].idle();
        let place = clients.evict_idle().unwrap();
        assert!(
            soon(&first).await,
            "the busiest address's oldest goes first"
        );
        assert!(!soon(&second).await && !soon(&mine).await);
        // The evicted connection's place goes to the one that evicted it.
        let places = Arc::new(Semaphore::new(1));
        first.hand_over(places.clone().try_acquire_owned().unwrap());
        assert!(place.await.is_ok());
        assert!(clients.evict_idle().is_some());
        assert!(soon(&second).await);
        assert!(clients.evict_idle().is_some());
        assert!(soon(&mine).await, "then the others' connections");
        // A connection that got a command is no longer listed.
        let again = one.idle();
        drop(again);
        assert!(clients.evict_idle().is_none());
    }

    #[test]
    fn permits_round_up_and_never_reach_zero() {
        assert_eq!(permits_in(0), 1);
        assert_eq!(permits_in(1), 1);
        assert_eq!(permits_in(CHUNK_BYTES as u64), 1);
        assert_eq!(permits_in(CHUNK_BYTES as u64 + 1), 2);
        assert_eq!(permits_in(u64::MAX), u32::MAX);
    }
}
