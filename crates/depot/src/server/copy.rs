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
    let mut conn = match depot.outgoing.take(&dest.address()) {
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
    depot.outgoing.keep(conn);
    Ok(stored)
}

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
