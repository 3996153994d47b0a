//! SEND: third-party copy of a byte range to another allocation, appended
//! there (`docs/ibp-protocol.md` §2.2). To another depot we act as an IBP
//! client issuing STORE and stream with `sendfile`; to ourselves we copy
//! between files inside the kernel.

use std::sync::Arc;
use std::time::Duration;

use lors_ibp::caps::{CapKind, Capability};
use lors_ibp::proto::{AllocType, KeyToken, StatusCode, Timeout};
use lors_ibp::{ClientConfig, Connection, Error as ClientError};

use super::Depot;
use super::fail::{Fail, blocking, verified};
use super::transfer::{XferError, send_file};
use crate::store::Alloc;
use crate::store::datafile::HEADER_BYTES;

pub(super) async fn send(
    depot: &Arc<Depot>,
    src: &Arc<Alloc>,
    dest: &Capability,
    offset: u64,
    length: u64,
    idle: Duration,
    dest_timeout: Timeout,
) -> Result<u64, Fail> {
    if src.atype != AllocType::ByteArray {
        return Err(Fail::new(StatusCode::INVALID_CMD));
    }
    if dest.kind != CapKind::Write {
        return Err(Fail::new(StatusCode::WRONG_CAP_FORMAT));
    }
    let _busy = src.res.busy();
    let (file, ext) = {
        let src = src.clone();
        blocking(move || src.snapshot()).await?
    };
    let end = offset
        .checked_add(length)
        .ok_or(Fail::new(StatusCode::WOULD_EXCEED_LIMIT))?;
    if end > ext.len {
        return Err(Fail::new(StatusCode::WOULD_EXCEED_LIMIT));
    }
    verified(src, offset, length).await?;
    if depot.is_self(&dest.host, dest.port) {
        return local(depot, file, dest, offset, length).await;
    }
    let cfg = ClientConfig {
        connect_timeout: Duration::from_secs(10),
        io_timeout: idle,
        server_timeout: dest_timeout,
    };
    let map = |e: ClientError| {
        tracing::info!(dest = ?dest, error = %e, "SEND to remote depot failed");
        Fail::new(match &e {
            ClientError::Depot { code, .. } => *code,
            ClientError::Timeout { .. } => StatusCode::SERVER_TIMEOUT,
            _ => StatusCode::CONNECTION,
        })
    };
    let mut conn = match idle_to(depot, dest) {
        // A reused connection the peer closed meanwhile fails before any
        // byte of data: the STORE goes again on a fresh one.
        Some(mut c) => {
            c.reconfigure(&cfg);
            match c.begin_store(dest, length).await {
                Ok(()) => c,
                Err(ClientError::Io { .. } | ClientError::Closed { .. }) => {
                    fresh(dest, &cfg, length).await.map_err(map)?
                }
                Err(e) => return Err(map(e)),
            }
        }
        None => fresh(dest, &cfg, length).await.map_err(map)?,
    };
    if length > 0 {
        let Some(file) = file else {
            return Err(Fail::new(StatusCode::FILE_READ));
        };
        if let Err(e) = send_file(conn.socket(), &file, HEADER_BYTES + offset, length, idle).await {
            return Err(Fail::new(match e {
                XferError::Peer(_) => StatusCode::CONNECTION,
                XferError::Disk(_) => StatusCode::FILE_READ,
            }));
        }
    }
    let stored = conn.finish_store(length).await.map_err(map)?;
    keep_idle(depot, conn);
    Ok(stored)
}

/// Idle connections kept per depot SENDs go to: as many as a client at
/// distance keeps copies in flight to it.
const MAX_IDLE_OUT: usize = 128;

/// A new connection to `dest`'s depot, its STORE of `length` bytes begun.
async fn fresh(
    dest: &Capability,
    cfg: &ClientConfig,
    length: u64,
) -> Result<Connection, ClientError> {
    let mut c = Connection::connect_cap(dest, cfg).await?;
    c.begin_store(dest, length).await?;
    Ok(c)
}

/// An idle connection to `dest`'s depot still open, if one is kept.
fn idle_to(depot: &Depot, dest: &Capability) -> Option<Connection> {
    let mut out = depot.outgoing.lock().unwrap_or_else(|e| e.into_inner());
    let idle = out.get_mut(&dest.address())?;
    while let Some(c) = idle.pop() {
        if c.is_reusable() {
            return Some(c);
        }
    }
    None
}

/// Idle connections kept to all depots together (closed ones swept out
/// when the count reaches it), so a depot that copied to many others
/// holds no more descriptors than this for it.
const MAX_IDLE_OUT_TOTAL: usize = 512;

/// Keeps `conn`, its last STORE answered, for the next SEND to its depot.
fn keep_idle(depot: &Depot, conn: Connection) {
    if !conn.is_healthy() {
        return;
    }
    let mut out = depot.outgoing.lock().unwrap_or_else(|e| e.into_inner());
    if out.values().map(Vec::len).sum::<usize>() >= MAX_IDLE_OUT_TOTAL {
        for idle in out.values_mut() {
            idle.retain(Connection::is_reusable);
        }
        out.retain(|_, idle| !idle.is_empty());
        if out.values().map(Vec::len).sum::<usize>() >= MAX_IDLE_OUT_TOTAL {
            return;
        }
    }
    let idle = out.entry(conn.addr().to_owned()).or_default();
    if idle.len() < MAX_IDLE_OUT {
        idle.push(conn);
    }
}

/// Copy into one of our own allocations (possibly the source itself).
async fn local(
    depot: &Arc<Depot>,
    src_file: Option<Arc<std::fs::File>>,
    dest: &Capability,
    offset: u64,
    length: u64,
) -> Result<u64, Fail> {
    let (d, window) = depot
        .store
        .lookup_view(&KeyToken::of(dest), Some(CapKind::Write))
        .map_err(|e| Fail::new(e.status()))?;
    let w = d.writer().await;
    blocking(move || w.append_copy(src_file.as_deref(), offset, length, window))
        .await
        .map_err(|e| Fail::new(e.status()))?;
    Ok(length)
}
