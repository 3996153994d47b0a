//! Performance characterization of data movers, after "Simulations of Distributed Systems in a Computing Centre": sweep file
//! sizes, files moved in parallel and streams per file with repetitions;
//! reduce the timings to mean throughput per file and its error; fit model
//! functions to throughput against each variable and rank them by R²;
//! report with plots; predict how many transfers a setup sustains.
//!
//! The library holds the arithmetic, the bookkeeping and the lab ([`lab`]:
//! staging, movers, a loopback depot, a GridFTP server); `lors bench` maps
//! its flags onto it.

pub mod analysis;
pub mod fit;
pub mod lab;
pub mod model;
pub mod report;
pub mod stats;
pub mod sweep;
