//! Progress reporting. The library calls these hooks as work is done; front
//! ends draw bars, print periodic stats or emit JSON events from them.
//!
//! ```
//! use std::sync::Mutex;
//! use lors::progress::{Event, Progress};
//!
//! /// Keeps the bytes per depot and every event.
//! #[derive(Default)]
//! struct Log(Mutex<(Vec<(String, u64)>, Vec<String>)>);
//!
//! impl Progress for Log {
//!     fn advance(&self, depot: &str, n: u64) {
//!         self.0.lock().unwrap().0.push((depot.to_owned(), n));
//!     }
//!     fn event(&self, e: &Event) {
//!         self.0.lock().unwrap().1.push(e.to_string());
//!     }
//! }
//!
//! let log = Log::default();
//! log.advance("d1:6714", 4096);
//! log.event(&Event::Stalled { depot: "d2:6714".into(), silent: std::time::Duration::from_secs(30) });
//! assert!(log.0.lock().unwrap().1[0].contains("d2:6714 has sent nothing for 30s"));
//! ```

use std::time::Duration;

/// Something that happened to one depot during an operation, worth telling
/// the user (or a script) about. `Display` gives the sentence to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// One operation on `depot` failed; it is tried again (another replica,
    /// another depot, another source).
    Retry {
        /// The depot (`host:port`).
        depot: String,
        /// What failed, as the error says it.
        why: String,
    },
    /// A read from `depot`, which holds the only copy of what it was
    /// reading, was cut off (a reset, a refused connect): it is asked
    /// again after a pause, for a while (a depot that restarts comes back).
    /// A `retry` to a script.
    Again {
        /// The depot (`host:port`).
        depot: String,
        /// What failed, as the error says it.
        why: String,
    },
    /// `depot` is given up for the rest of the operation; its work moves
    /// to the other depots.
    Failover {
        /// The depot (`host:port`).
        depot: String,
        /// Why.
        why: String,
    },
    /// `depot` sent nothing for `silent` while others delivered; what it
    /// had in flight goes to other replicas.
    Stalled {
        /// The depot (`host:port`).
        depot: String,
        /// How long it has been silent.
        silent: Duration,
    },
    /// A stalled depot delivers again.
    Recovered {
        /// The depot (`host:port`).
        depot: String,
    },
}

impl Event {
    /// The depot the event is about.
    pub fn depot(&self) -> &str {
        match self {
            Event::Retry { depot, .. }
            | Event::Again { depot, .. }
            | Event::Failover { depot, .. }
            | Event::Stalled { depot, .. }
            | Event::Recovered { depot } => depot,
        }
    }

    /// A short name for the kind of event (`retry`, `failover`, `stalled`,
    /// `recovered`), as JSON event streams name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Retry { .. } | Event::Again { .. } => "retry",
            Event::Failover { .. } => "failover",
            Event::Stalled { .. } => "stalled",
            Event::Recovered { .. } => "recovered",
        }
    }
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Retry { depot, why } => {
                write!(f, "depot {depot}: {why}; trying again elsewhere")
            }
            Event::Again { depot, why } => write!(
                f,
                "depot {depot}: {why}; it holds the only copy: asking it again"
            ),
            Event::Failover { depot, why } => write!(
                f,
                "depot {depot} given up: {why}; its work moves to the other depots, if any"
            ),
            Event::Stalled { depot, silent } => write!(
                f,
                "depot {depot} has sent nothing for {}s while others deliver; \
                 reading its pieces in flight from other replicas",
                silent.as_secs()
            ),
            Event::Recovered { depot } => write!(f, "depot {depot} delivers again"),
        }
    }
}

/// Receives progress. All methods have no-op defaults. Units are those of
/// the operation: bytes for transfers and copies, allocations for lease
/// changes and releases.
pub trait Progress: Send + Sync {
    /// The operation begins; `total` units, when known.
    fn start(&self, _total: Option<u64>) {}
    /// `n` more units done, moved to or from `depot` (`host:port`).
    fn advance(&self, _depot: &str, _n: u64) {}
    /// Something happened to a depot.
    fn event(&self, _e: &Event) {}
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {}
