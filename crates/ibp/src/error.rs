//! Client-side errors, tagged so the transfer engine can tell "try another
//! replica" from "give up".

use crate::proto::StatusCode;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong talking to a depot.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// TCP connect failed.
    #[error("cannot connect to depot {addr}: {source}")]
    Connect {
        /// Depot address.
        addr: String,
        /// OS error.
        source: std::io::Error,
    },
    /// A read or write on an open connection failed.
    #[error("I/O error with depot {addr} during {during}: {source}")]
    Io {
        /// Depot address.
        addr: String,
        /// What we were doing.
        during: &'static str,
        /// OS error.
        source: std::io::Error,
    },
    /// Our own file (the input of a STORE, the output of a LOAD) failed:
    /// no other depot or replica can help.
    /// The OS error is the source, not repeated in the message.
    #[error("local file error during {during}")]
    Local {
        /// What we were doing.
        during: &'static str,
        /// OS error.
        source: std::io::Error,
    },
    /// A deadline passed.
    #[error("depot {addr} did not respond within {secs}s during {during}")]
    Timeout {
        /// Depot address.
        addr: String,
        /// What we were doing.
        during: &'static str,
        /// The deadline.
        secs: u64,
    },
    /// A data phase went on below the minimum delivery rate
    /// ([`crate::client::MIN_RATE`]): bytes trickled in, never long
    /// enough apart for the inactivity deadline, but far too slowly to
    /// finish.
    #[error(
        "depot {addr} delivered {during} below {} bytes/s: given up after {secs}s",
        crate::client::MIN_RATE
    )]
    TooSlow {
        /// Depot address.
        addr: String,
        /// What we were doing.
        during: &'static str,
        /// How long it was given.
        secs: u64,
    },
    /// The depot answered with an IBP error code.
    #[error("depot {addr} refused {during}: {code}")]
    Depot {
        /// Depot address.
        addr: String,
        /// What we asked.
        during: &'static str,
        /// The code it sent.
        code: StatusCode,
    },
    /// The depot sent something that is not IBP.
    #[error("depot {addr} sent a malformed reply to {during}: {line:?}")]
    Protocol {
        /// Depot address.
        addr: String,
        /// What we asked.
        during: &'static str,
        /// The offending line (truncated).
        line: String,
    },
    /// The depot closed the connection early.
    #[error("depot {addr} closed the connection during {during}")]
    Closed {
        /// Depot address.
        addr: String,
        /// What we were doing.
        during: &'static str,
    },
}

impl Error {
    /// The IBP status code, when the depot sent one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Depot { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the depot could not be reached at all: the connection was
    /// refused, or connecting timed out (a host or firewall that drops
    /// packets). Other requests to it will fare no better for now.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. }
                | Error::Timeout {
                    during: "connect",
                    ..
                }
        )
    }

    /// Whether the depot said it is busy (`-66`, its connection or per-client
    /// limit) or recovering: the same request will succeed later, so the
    /// replica is not bad — ask again after a pause, with fewer connections.
    pub fn is_busy(&self) -> bool {
        matches!(
            self.status(),
            Some(StatusCode::OUT_OF_SOCKETS | StatusCode::SERVER_RECOVERING)
        )
    }

    /// Whether retrying (on this or another replica) may succeed: network
    /// trouble and busy depots are transient; a refused key or bad request is not.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Connect { .. }
            | Error::Io { .. }
            | Error::Timeout { .. }
            | Error::TooSlow { .. }
            | Error::Closed { .. }
            | Error::Protocol { .. } => true,
            Error::Local { .. } => false,
            Error::Depot { code, .. } => matches!(
                *code,
                StatusCode::OUT_OF_SOCKETS
                    | StatusCode::SERVER_TIMEOUT
                    | StatusCode::CONNECTION
                    | StatusCode::CANT_CONNECT
                    | StatusCode::SOCK_READ
                    | StatusCode::SOCK_WRITE
                    | StatusCode::SERVER_RECOVERING
            ),
        }
    }
}
