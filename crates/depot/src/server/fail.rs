//! How a command ends: its outcome, the error status it answers, and the
//! helpers the connection and the depot-to-depot copy share to reach the
//! store (blocking work off the async threads, digest checks).

use std::sync::Arc;

use lors_ibp::proto::StatusCode;

use crate::store::{Alloc, StoreError};

/// What to do after a command.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    Close,
}

/// A failed command: the status to send and whether to close afterwards.
#[derive(Debug)]
pub(super) struct Fail {
    pub code: StatusCode,
    pub close: bool,
}

impl Fail {
    pub fn new(code: StatusCode) -> Self {
        Fail { code, close: false }
    }
    pub fn closing(code: StatusCode) -> Self {
        Fail { code, close: true }
    }
}

/// Logs failures of the depot itself (not of the request) before they are
/// answered.
pub(super) fn log_failure(e: &StoreError) {
    match e {
        StoreError::Write(io) | StoreError::Read(io) if crate::store::out_of_descriptors(io) => {
            tracing::error!(
                error = %e,
                "out of file descriptors: answering -23; raise `ulimit -n` (the depot raises its soft limit to the hard one at start) or lower max_connections"
            );
        }
        StoreError::Meta(_) | StoreError::Write(_) | StoreError::Read(_) => {
            tracing::error!(error = %e, "storage failure");
        }
        _ => {}
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        log_failure(&e);
        Fail::new(e.status())
    }
}

/// Runs blocking store work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Write(std::io::Error::other(e.to_string())))?
}

/// Checks `[offset, offset+length)` of a checksummed allocation against its
/// stored digests: bytes that fail are refused (-63), not served. Checked
/// between data phases, so never against a half-done write.
pub(super) async fn verified(a: &Arc<Alloc>, offset: u64, length: u64) -> Result<(), Fail> {
    if a.disk_chksum.is_none() {
        return Ok(());
    }
    let w = a.writer().await;
    Ok(blocking(move || w.verify(offset, length)).await?)
}
