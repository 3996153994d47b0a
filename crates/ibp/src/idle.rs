//! Idle connections kept for reuse, per depot address, within bounds.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::Connection;

/// Idle connections by depot address: at most `per_addr` to one depot and
/// `total` in all, so a process that talked to many depots holds a bounded
/// number of descriptors. A connection the depot closed while it sat here
/// (a depot drops connections idle a minute) is never handed out.
pub struct IdleConnections {
    per_addr: usize,
    total: usize,
    idle: Mutex<HashMap<String, Vec<Connection>>>,
}

impl IdleConnections {
    /// Room for `per_addr` connections to one depot, `total` in all.
    pub fn new(per_addr: usize, total: usize) -> Self {
        IdleConnections {
            per_addr,
            total,
            idle: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Connection>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle connection to `addr` still open, if one is kept.
    pub fn take(&self, addr: &str) -> Option<Connection> {
        let mut idle = self.lock();
        let v = idle.get_mut(addr)?;
        while let Some(c) = v.pop() {
            if c.is_reusable() {
                return Some(c);
            }
        }
        None
    }

    /// Keeps `c` for reuse if it is healthy and there is room (closed ones
    /// are swept out when the total is reached); else it is dropped.
    pub fn keep(&self, c: Connection) {
        if !c.is_healthy() {
            return;
        }
        let mut idle = self.lock();
        if idle.values().map(Vec::len).sum::<usize>() >= self.total {
            for v in idle.values_mut() {
                v.retain(Connection::is_reusable);
            }
            idle.retain(|_, v| !v.is_empty());
            if idle.values().map(Vec::len).sum::<usize>() >= self.total {
                return;
            }
        }
        let v = idle.entry(c.addr().to_owned()).or_default();
        if v.len() < self.per_addr {
            v.push(c);
        }
    }
}
