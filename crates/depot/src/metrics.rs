//! Depot metrics, kept with `prometheus-client` and exported in the
//! OpenMetrics text format on an optional HTTP port (`metrics_listen`).

use std::time::Duration;

use lors_http::metrics::{Registry, encode, latency_histogram};
use lors_ibp::proto::{Command, StatusCode};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::store::ResourceStatus;

/// A command by its name; `INVALID` for a line that is no request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Kind(Option<Command>);

impl EncodeLabelValue for Kind {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.0.map_or("INVALID", Command::name), e)
    }
}

/// A command and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    command: Kind,
    /// `ok`, or the `IBP_E_*` name of the error replied.
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByCommand {
    command: Kind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Refusal {
    /// `per_client`: the address held its share of connections; `busy`:
    /// every connection was taken and none idle.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Resource {
    rid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Space {
    rid: String,
    kind: &'static str,
}

/// Why a connection was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its address already held its share of the connections.
    PerClient,
    /// Every connection was taken and none idle to close.
    Busy,
}

/// Live metrics. Counters are atomics: statistics, not synchronization.
pub struct Metrics {
    registry: Registry,
    /// Bytes received in data phases.
    pub bytes_in: Counter,
    /// Bytes sent in LOAD replies.
    pub bytes_out: Counter,
    /// Bytes copied depot-to-depot by SEND.
    pub bytes_copied: Counter,
    /// Connections accepted.
    pub connections_total: Counter,
    /// Connections open now.
    pub connections_open: Gauge,
    /// Allocations deleted by the expiry worker.
    pub expired: Counter,
    refused: Family<Refusal, Counter>,
    requests: Family<Outcome, Counter>,
    latency: Family<ByCommand, Histogram, fn() -> Histogram>,
    allocations: Family<Resource, Gauge>,
    degraded: Family<Resource, Gauge>,
    space: Family<Space, Gauge<u64, std::sync::atomic::AtomicU64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("lors_depot");
        let m = Metrics {
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            bytes_copied: Counter::default(),
            connections_total: Counter::default(),
            connections_open: Gauge::default(),
            expired: Counter::default(),
            refused: Family::default(),
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            allocations: Family::default(),
            degraded: Family::default(),
            space: Family::default(),
            registry: Registry::default(),
        };
        r.register(
            "bytes_in",
            "Bytes received by STORE and WRITE",
            m.bytes_in.clone(),
        );
        r.register("bytes_out", "Bytes sent by LOAD", m.bytes_out.clone());
        r.register(
            "bytes_copied",
            "Bytes copied to other allocations by SEND",
            m.bytes_copied.clone(),
        );
        r.register(
            "connections",
            "Connections accepted",
            m.connections_total.clone(),
        );
        r.register(
            "connections_open",
            "Connections open now",
            m.connections_open.clone(),
        );
        r.register(
            "connections_refused",
            "Connections turned away as busy, by reason (per_client: the address held its share)",
            m.refused.clone(),
        );
        r.register(
            "expired",
            "Allocations deleted on expiry",
            m.expired.clone(),
        );
        r.register(
            "requests",
            "Requests answered, by command and status (ok or the IBP error's name)",
            m.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time to answer a request, data phase included, by command",
            m.latency.clone(),
        );
        r.register(
            "allocations",
            "Live allocations per resource",
            m.allocations.clone(),
        );
        r.register(
            "resource_degraded",
            "1 while a resource takes no new allocation because its disk filled (it comes back by itself when space returns)",
            m.degraded.clone(),
        );
        r.register(
            "space_bytes",
            "Space per resource by kind (total, hard_used, soft_used, free)",
            m.space.clone(),
        );
        Metrics { registry: r, ..m }
    }
}

impl Metrics {
    /// A request answered (`None`: a line that is no request): `Ok` or the
    /// error code replied.
    pub fn request(
        &self,
        command: Option<Command>,
        result: Result<(), StatusCode>,
        took: Duration,
    ) {
        let command = Kind(command);
        let status = match result {
            Ok(()) => "ok",
            Err(code) => code.name().unwrap_or("unknown"),
        };
        self.requests
            .get_or_create(&Outcome { command, status })
            .inc();
        self.latency
            .get_or_create(&ByCommand { command })
            .observe(took.as_secs_f64());
    }

    /// A connection turned away.
    pub fn refused(&self, why: Refused) {
        let reason = match why {
            Refused::PerClient => "per_client",
            Refused::Busy => "busy",
        };
        self.refused.get_or_create(&Refusal { reason }).inc();
    }

    /// The OpenMetrics text, with the resources' space and allocations as
    /// `status` gives them now.
    pub fn render(&self, status: &[ResourceStatus]) -> String {
        for r in status {
            self.allocations
                .get_or_create(&Resource { rid: r.rid.clone() })
                .set(i64::try_from(r.usage.count).unwrap_or(i64::MAX));
            self.degraded
                .get_or_create(&Resource { rid: r.rid.clone() })
                .set(i64::from(r.degraded));
            for (kind, v) in [
                ("total", r.total),
                ("hard_used", r.usage.hard),
                ("soft_used", r.usage.soft),
                ("free", r.free()),
            ] {
                self.space
                    .get_or_create(&Space {
                        rid: r.rid.clone(),
                        kind,
                    })
                    .set(v);
            }
        }
        encode(&self.registry)
    }
}
