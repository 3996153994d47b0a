//! Reused connections per depot. A connection goes back to the pool only if
//! its last command left it in step (`Connection::is_healthy`).

use std::collections::HashMap;
use std::sync::Mutex;

use lors_ibp::{ClientConfig, Connection, Result};

/// Idle connections kept per depot.
const MAX_IDLE_PER_DEPOT: usize = 16;

/// A pool of idle depot connections.
pub struct Pool {
    cfg: ClientConfig,
    idle: Mutex<HashMap<String, Vec<Connection>>>,
}

impl Pool {
    /// An empty pool whose connections use `cfg`.
    pub fn new(cfg: ClientConfig) -> Self {
        Pool {
            cfg,
            idle: Mutex::new(HashMap::new()),
        }
    }

    /// The client settings.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// An idle connection to `addr`, or a new one.
    pub async fn get(&self, addr: &str) -> Result<Connection> {
        let reused = self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(addr)
            .and_then(Vec::pop);
        match reused {
            Some(c) => Ok(c),
            None => Connection::connect(addr, &self.cfg).await,
        }
    }

    /// Returns a connection for reuse (dropped if it is not healthy).
    pub fn put(&self, c: Connection) {
        if !c.is_healthy() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let v = idle.entry(c.addr().to_owned()).or_default();
        if v.len() < MAX_IDLE_PER_DEPOT {
            v.push(c);
        }
    }
}
