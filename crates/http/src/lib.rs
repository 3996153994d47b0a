//! The services' HTTP, on `hyper`, `axum` and `tower`: the L-Bone's API and
//! dashboard and the metrics endpoints of depots, L-Bones and keepers are
//! served by [`serve`] with the same limits; their clients share one pooled
//! keep-alive [`client`].
//!
//! * [`client`] — a pooled client, bounded in time and answer size.
//! * [`serve`] (feature `server`) — an axum router over HTTP/1.1 and h2c,
//!   with per-client admission ([`peers`]), responses that must keep moving
//!   ([`stall`]) and graceful shutdown.
//! * [`metrics`] (feature `server`) — a Prometheus registry served at
//!   `/metrics`.

pub mod client;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod peers;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(feature = "server")]
pub mod stall;

pub use client::{BaseUrl, Client, FetchError, fetch};
