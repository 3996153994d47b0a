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
//! assert_eq!(req.command_name(), "LOAD");
//! assert_eq!(req.encode(), "1 8 1#abc 42 0 11 10 \n");
//! ```

pub mod caps;
pub mod client;
pub mod error;
pub mod proto;
pub mod units;
pub mod wire;
pub mod zerocopy;

pub use caps::{CapKind, CapSet, Capability, Key};
pub use client::{ClientConfig, Connection, StatusInfo};
pub use error::{Error, Result};
pub use proto::{ProbeInfo, StatusCode};

/// The IANA-unregistered but traditional IBP depot port.
pub const DEFAULT_DEPOT_PORT: u16 = 6714;
