//! Per-client limits: how many connections, data phases and transfer-buffer
//! bytes one client address may hold at once, so that one peer — hostile or
//! merely greedy — cannot take the whole depot from everyone else
//! (`THREAT-MODEL.md`, "Per-client limits").

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
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
}

/// The table of connected clients, by address.
pub(crate) struct Clients {
    limits: ClientLimits,
    table: Mutex<HashMap<IpAddr, Client>>,
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

impl ClientSlot {
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

    #[test]
    fn permits_round_up_and_never_reach_zero() {
        assert_eq!(permits_in(0), 1);
        assert_eq!(permits_in(1), 1);
        assert_eq!(permits_in(CHUNK_BYTES as u64), 1);
        assert_eq!(permits_in(CHUNK_BYTES as u64 + 1), 2);
        assert_eq!(permits_in(u64::MAX), u32::MAX);
    }
}
