//! The LoRS IBP depot: a storage server that rents out disk as time-limited,
//! capability-protected allocations ("IBP Deployment Tests and Integration with DiDaS Project" §3.1).
//!
//! * [`store`] — resources, allocations, key index, space, expiry; no sockets.
//! * [`server`] — `run(listener, depot, shutdown)`: the IBP protocol handler.
//! * [`metrics`] — counters and the Prometheus endpoint.
//! * [`config`] — the TOML configuration.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use lors_depot::{config::{Config, ResourceConfig}, Depot};
//! let mut cfg = Config::default();
//! cfg.listen = "127.0.0.1:0".parse()?;
//! cfg.resources.push(ResourceConfig::new("1", "/tmp/depot/r1".into()));
//! let depot = Depot::open(cfg).await?;
//! let listener = depot.bind().await?;
//! let (_tx, shutdown) = tokio::sync::watch::channel(false);
//! lors_depot::server::run(listener, depot, shutdown).await?;
//! # Ok(()) }
//! ```

pub mod config;
pub mod metrics;
pub mod server;
pub mod store;

pub use server::Depot;
