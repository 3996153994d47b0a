//! What an L-Bone counts, served at `/metrics` beside its API: its HTTP
//! (requests by route and status, latency), registrations, legacy
//! queries, refused tokens, and the directory as it stands at each scrape
//! (depots online and offline, how late their heartbeats are).

use std::sync::Arc;
use std::time::Duration;

use lors_http::metrics::{HttpMetrics, Registry, encode, latency_histogram};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::model::DepotRecord;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    /// `new`, `heartbeat` or `deregistration`.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

/// How a depot's registration counted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Registered {
    New,
    Heartbeat,
    Departure,
}

pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) http: Arc<HttpMetrics>,
    registrations: Family<Kind, Counter>,
    refused_tokens: Counter,
    legacy: Counter,
    legacy_latency: Histogram,
    store_errors: Counter,
    depots: Family<State, Gauge>,
    lag_median: Gauge<f64, std::sync::atomic::AtomicU64>,
    lag_max: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut r = Registry::with_prefix("lors_lbone");
        let http = HttpMetrics::register(&mut r);
        let m = Metrics {
            registry: Registry::default(),
            http,
            registrations: Family::default(),
            refused_tokens: Counter::default(),
            legacy: Counter::default(),
            legacy_latency: latency_histogram(),
            store_errors: Counter::default(),
            depots: Family::default(),
            lag_median: Gauge::default(),
            lag_max: Gauge::default(),
        };
        r.register(
            "registrations",
            "Registrations taken, by kind (new, heartbeat, deregistration)",
            m.registrations.clone(),
        );
        r.register(
            "refused_tokens",
            "Registrations refused for a wrong or missing token",
            m.refused_tokens.clone(),
        );
        r.register(
            "legacy_queries",
            "Queries answered on the legacy 512-byte protocol",
            m.legacy.clone(),
        );
        r.register(
            "legacy_query_duration_seconds",
            "Time to answer a legacy query",
            m.legacy_latency.clone(),
        );
        r.register(
            "store_errors",
            "Store operations that failed (the answer was 503)",
            m.store_errors.clone(),
        );
        r.register(
            "depots",
            "Depots listed, by state (online, offline), as of the scrape",
            m.depots.clone(),
        );
        r.register(
            "heartbeat_lag_median_seconds",
            "Median time since an online depot's last heartbeat, as of the scrape",
            m.lag_median.clone(),
        );
        r.register(
            "heartbeat_lag_max_seconds",
            "Longest time since an online depot's last heartbeat, as of the scrape",
            m.lag_max.clone(),
        );
        Metrics { registry: r, ..m }
    }

    pub(crate) fn registered(&self, how: Registered) {
        let kind = match how {
            Registered::New => "new",
            Registered::Heartbeat => "heartbeat",
            Registered::Departure => "deregistration",
        };
        self.registrations.get_or_create(&Kind { kind }).inc();
    }

    pub(crate) fn refused_token(&self) {
        self.refused_tokens.inc();
    }

    pub(crate) fn store_error(&self) {
        self.store_errors.inc();
    }

    pub(crate) fn legacy_query(&self, took: Duration) {
        self.legacy.inc();
        self.legacy_latency.observe(took.as_secs_f64());
    }

    /// The exposition, with the directory's gauges set from `depots` as
    /// of `now` (a depot silent `offline_after` seconds is offline).
    pub(crate) fn render(&self, depots: &[DepotRecord], now: i64, offline_after: i64) -> String {
        let mut lags: Vec<i64> = depots
            .iter()
            .map(|d| (now - d.last_seen).max(0))
            .filter(|&lag| lag <= offline_after)
            .collect();
        let online = lags.len();
        self.depots
            .get_or_create(&State { state: "online" })
            .set(i64::try_from(online).unwrap_or(i64::MAX));
        self.depots
            .get_or_create(&State { state: "offline" })
            .set(i64::try_from(depots.len() - online).unwrap_or(i64::MAX));
        lags.sort_unstable();
        self.lag_median
            .set(lags.get(lags.len() / 2).copied().unwrap_or(0) as f64);
        self.lag_max.set(lags.last().copied().unwrap_or(0) as f64);
        encode(&self.registry)
    }
}
