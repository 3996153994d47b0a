//! Prometheus exposition.
