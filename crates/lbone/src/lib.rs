//! The L-Bone ("IBP Deployment Tests and Integration with DiDaS Project" §3.2.1, the LoCI iGrid 2002 paper (Video IBPster) §2.2): a directory of IBP depots.
//!
//! Depots register and heartbeat over an HTTP/JSON API with a token; clients
//! ask for depots with enough space and lease length, ordered by proximity to
//! a point or location hint and by the bandwidth their network has measured
//! (see [`rank`] and [`forecast`]). The original LoRS tools ask over the
//! 512-byte [`legacy`] protocol on port 6767. State lives in a [`store::Store`]:
//! SQLite by default, PostgreSQL for several instances behind one database.
//! A dashboard at `/` maps the depots.
//!
//! * [`server`] — the server; [`client`] — queries, rate reports, heartbeats.
//! * [`model`] — the JSON bodies; [`api`] — the API's query strings. HTTP
//!   itself is `lors-http`'s (axum and hyper).

pub mod api;
pub mod budget;
pub mod client;
pub mod forecast;
pub mod legacy;
#[cfg(feature = "server")]
mod metrics;
pub mod model;
pub mod rank;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod store;

/// Port of the legacy protocol.
pub const LEGACY_PORT: u16 = 6767;
/// Default port of the HTTP API and dashboard.
pub const HTTP_PORT: u16 = 8767;
