//! `lors keep --metrics`: what a Prometheus scrape of the keeper sees.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use lors::keep::Totals;
use lors_http::metrics::prometheus_client::metrics::{counter::Counter, gauge::Gauge};

/// What `--metrics` serves: counters over the run, and the last cycle's
/// findings as gauges (what is lost or short now, not ever).
pub(super) struct Metrics {
    registry: lors_http::metrics::Registry,
    cycles: Counter,
    refreshed: Counter,
    healed: Counter,
    remade: Counter,
    trimmed: Counter,
    scrubbed_bytes: Counter,
    corrupt: Counter,
    last_seconds: Gauge<f64, AtomicU64>,
    last_end: Gauge,
    exnodes: Gauge,
    lost_bytes: Gauge,
    short_blocks: Gauge,
    not_refreshed: Gauge,
    failed: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = lors_http::metrics::Registry::with_prefix("lors_keep");
        let m = Metrics {
            registry: Default::default(),
            cycles: Default::default(),
            refreshed: Default::default(),
            healed: Default::default(),
            remade: Default::default(),
            trimmed: Default::default(),
            scrubbed_bytes: Default::default(),
            corrupt: Default::default(),
            last_seconds: Default::default(),
            last_end: Default::default(),
            exnodes: Default::default(),
            lost_bytes: Default::default(),
            short_blocks: Default::default(),
            not_refreshed: Default::default(),
            failed: Default::default(),
        };
        r.register("cycles", "Cycles finished", m.cycles.clone());
        r.register("leases_extended", "Leases extended", m.refreshed.clone());
        r.register(
            "replicas_made",
            "Replicas made for blocks short of copies",
            m.healed.clone(),
        );
        r.register(
            "blocks_remade",
            "Blocks of erasure-coded files made again",
            m.remade.clone(),
        );
        r.register(
            "mappings_dropped",
            "Dead or corrupt mappings dropped",
            m.trimmed.clone(),
        );
        r.register(
            "scrubbed_bytes",
            "Stored bytes read back and checked",
            m.scrubbed_bytes.clone(),
        );
        r.register(
            "corrupt_replicas",
            "Replicas the scrub found corrupt",
            m.corrupt.clone(),
        );
        r.register(
            "last_cycle_seconds",
            "How long the last cycle took",
            m.last_seconds.clone(),
        );
        r.register(
            "last_cycle_end_timestamp_seconds",
            "When the last cycle ended (Unix time)",
            m.last_end.clone(),
        );
        r.register("exnodes", "ExNodes in the last cycle", m.exnodes.clone());
        r.register(
            "lost_bytes",
            "Bytes with no live replica, as the last cycle found them",
            m.lost_bytes.clone(),
        );
        r.register(
            "short_blocks",
            "Blocks short of their copies after the last cycle",
            m.short_blocks.clone(),
        );
        r.register(
            "leases_not_extended",
            "Leases the last cycle could not extend",
            m.not_refreshed.clone(),
        );
        r.register(
            "failed_exnodes",
            "ExNodes the last cycle could not keep",
            m.failed.clone(),
        );
        Metrics { registry: r, ..m }
    }
}

impl Metrics {
    pub(super) fn cycle(&self, t: &Totals, took: Duration) {
        let n = |v: usize| v as u64;
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.cycles.inc();
        self.scrubbed_bytes.inc_by(t.scrubbed_bytes);
        self.corrupt.inc_by(n(t.corrupt));
        self.refreshed.inc_by(n(t.refreshed));
        self.healed.inc_by(n(t.healed));
        self.remade.inc_by(n(t.remade));
        self.trimmed.inc_by(n(t.trimmed));
        self.last_seconds.set(took.as_secs_f64());
        self.last_end.set(g(lors_ibp::units::unix_now()));
        self.exnodes.set(g(n(t.exnodes)));
        self.lost_bytes.set(g(t.lost_bytes));
        self.short_blocks.set(g(n(t.short_blocks)));
        self.not_refreshed.set(g(n(t.not_refreshed)));
        self.failed.set(g(n(t.failed)));
    }

    pub(super) fn render(&self) -> String {
        lors_http::metrics::encode(&self.registry)
    }
}
