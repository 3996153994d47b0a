//! The Internet Backplane Protocol (IBP) as real IBP 1.3/1.4 clients and depots
//! speak it.
//!
//! * [`proto`] is sans-I/O: request parsing/encoding, reply shapes, the wire
//!   status-code table and hard limits. It never touches a socket, so the depot,
//!   the client and the fuzz targets share one total parser.
//! * [`caps`] holds capability URLs (`ibp://host:port/RID#KEY/TYPEKEY/READ`) and
//!   the secret keys inside them (CSPRNG-generated, redacted in `Debug`,
//!   compared in constant time).
//! * [`client`] is a tokio client with deadlines on every network wait.
//! * [`wire`] has the bounded async line reader both sides use.
//!
//! ```
//! use lors_ibp::proto::Request;
//! let req = Request::parse(b"1 8 1#abc 42 0 11 10\n").unwrap();
//! assert_eq!(req.command(), lors_ibp::proto::Command::Load);
//! assert_eq!(req.encode(), "1 8 1#abc 42 0 11 10 \n");
//! ```

pub mod caps;
pub mod client;
pub mod error;
pub mod ewma;
pub mod hex;
pub mod idle;
pub mod proto;
pub mod spliced;
pub mod units;
pub mod wire;
pub mod zerocopy;

pub use caps::{CapKind, CapSet, Capability, Key};
pub use client::{ClientConfig, Connection};
pub use error::{Error, Result};
pub use idle::IdleConnections;
pub use proto::{ProbeInfo, StatusCode};

/// The IANA-unregistered but traditional IBP depot port.
pub const DEFAULT_DEPOT_PORT: u16 = 6714;

/// Raises this process's soft limit on open files to its hard limit: a
/// depot holds a descriptor per connection and per open allocation, a FUSE
/// mount one per piece it keeps in a pipe ([`spliced`]), and the usual soft
/// default (1024) is far below what either needs. Returns the limit
/// now in force, or `None` when it could not be read.
pub fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    // An unlimited hard limit still stops at the kernel's nr_open (2^20 by
    // default).
    let want = l.maximum.unwrap_or(1 << 20);
    if l.current.is_some_and(|c| c < want) {
        l.current = Some(want);
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            tracing::warn!(error = %e, "could not raise the open-file limit");
        }
    }
    let now = getrlimit(Resource::Nofile).current;
    grow_descriptor_table(now.unwrap_or(1024).min(4096));
    now
}

/// Grows this process's table of descriptors to `n` entries now. The
/// kernel doubles it as descriptors are opened, and in a process with
/// several threads each doubling waits for an RCU grace period
/// (milliseconds): a `lors mount`, which opens a pipe per piece it keeps,
/// read 256 MiB 10-20 % slower than one whose table was already large.
fn grow_descriptor_table(n: u64) {
    let Ok(null) = std::fs::File::open("/dev/null") else {
        return;
    };
    let last = i32::try_from(n.saturating_sub(1)).unwrap_or(i32::MAX);
    // A descriptor at the table's far end, closed again at once: the
    // table keeps its size.
    let _ = rustix::io::fcntl_dupfd_cloexec(&null, last);
}

#[cfg(test)]
mod tests {
    /// Raising the limit also grows the descriptor table, so no later
    /// open waits for the kernel to grow it (`FDSize` in /proc is its
    /// size).
    #[test]
    fn raising_the_limit_grows_the_descriptor_table() {
        let limit = super::raise_open_file_limit().expect("a limit");
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let size: u64 = (status.lines())
            .find_map(|l| l.strip_prefix("FDSize:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap();
        assert!(size >= limit.min(4096), "{size} entries, limit {limit}");
    }
}
