//! Prometheus exposition with `prometheus-client`: a registry rendered in
//! the OpenMetrics text format at `/metrics`, and the HTTP metrics every
//! service keeps of its own routes.
//!
//! ```
//! use lors_http::metrics::{prometheus_client::metrics::counter::Counter, Registry, encode};
//! let mut r = Registry::with_prefix("lors_demo");
//! let hits = Counter::<u64>::default();
//! r.register("hits", "Hits seen", hits.clone());
//! hits.inc();
//! assert!(encode(&r).contains("lors_demo_hits_total 1"));
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::HeaderMap;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
pub use prometheus_client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::serve::{Limits, serve};

/// The OpenMetrics exposition's content type (what Prometheus asks for).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The classic text format's content type (what `curl`, `promtool check
/// metrics` and older scrapers read).
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An OpenMetrics exposition in the classic text format (version 0.0.4),
/// which names a counter's family by its sample (`x_total`, where
/// OpenMetrics says `x`) and has no `# UNIT` or `# EOF` lines.
///
/// ```
/// use lors_http::metrics::to_classic_text;
/// let om = "# HELP hits Hits.\n# TYPE hits counter\nhits_total 3\n# EOF\n";
/// assert_eq!(to_classic_text(om), "# HELP hits_total Hits.\n# TYPE hits_total counter\nhits_total 3\n");
/// ```
pub fn to_classic_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // HELP comes before TYPE: held until the type says how to name it.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split_once(' ').or(Some((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_owned(), "untyped"),
                k => (name.to_owned(), k),
            };
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The registry in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut s, registry);
    s
}

/// Latency buckets, in seconds: 100 µs to about 26 s by factors of four.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.0001, 4.0, 10)
}

/// A latency histogram with [`latency_buckets`] (a constructor for
/// [`Family`]).
pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// The answer to a scrape of `openmetrics` (an exposition in the
/// OpenMetrics format): as it is to a scraper that accepts OpenMetrics, in
/// the classic text format to anyone else.
pub fn exposition(headers: &HeaderMap, openmetrics: String) -> Response {
    let wants_om = headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if wants_om {
        ([(CONTENT_TYPE, OPENMETRICS)], openmetrics).into_response()
    } else {
        ([(CONTENT_TYPE, TEXT)], to_classic_text(&openmetrics)).into_response()
    }
}

/// A router answering `GET /metrics` (and `GET /`) with what `render`
/// makes at each scrape (OpenMetrics text, see [`exposition`]).
pub fn router(render: impl Fn() -> String + Clone + Send + Sync + 'static) -> Router {
    let page = move |headers: HeaderMap| {
        let render = render.clone();
        async move { exposition(&headers, render()) }
    };
    Router::new()
        .route("/metrics", get(page.clone()))
        .route("/", get(page))
        .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "try GET /metrics here\n") })
}

/// Serves [`router`] on `listener` until `shutdown`, with small limits: a
/// scraper sends a short request every few seconds.
pub async fn serve_metrics(
    listener: TcpListener,
    render: impl Fn() -> String + Clone + Send + Sync + 'static,
    shutdown: watch::Receiver<bool>,
) {
    let limits = Limits {
        max_connections: 64,
        per_client: 8,
        body_bytes: 1024,
        request_timeout: Duration::from_secs(5),
        concurrency: 8,
        ..Limits::default()
    };
    serve(listener, router(render), limits, shutdown).await;
}

/// Labels of a request: its route (the pattern matched, so the label set
/// stays small whatever paths clients send) and method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    route: String,
    method: String,
}

/// Labels of an answer: the route, method and status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Answered {
    route: String,
    method: String,
    status: u16,
}

/// What a service counts of its HTTP: requests by route, method and
/// status, their latency by route, and requests in flight.
#[derive(Clone)]
pub struct HttpMetrics {
    requests: Family<Answered, Counter>,
    latency: Family<Route, Histogram, fn() -> Histogram>,
    in_flight: Gauge,
}

impl HttpMetrics {
    /// Registers the HTTP metrics (`http_requests_total`,
    /// `http_request_duration_seconds`, `http_requests_in_flight`) in
    /// `registry`.
    pub fn register(registry: &mut Registry) -> Arc<HttpMetrics> {
        let m = HttpMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            in_flight: Gauge::default(),
        };
        registry.register(
            "http_requests",
            "HTTP requests answered, by route, method and status",
            m.requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Time to answer an HTTP request (until its head is sent), by route and method",
            m.latency.clone(),
        );
        registry.register(
            "http_requests_in_flight",
            "HTTP requests being answered now",
            m.in_flight.clone(),
        );
        Arc::new(m)
    }

    /// `router` with every request counted.
    pub fn layer(self: &Arc<Self>, router: Router) -> Router {
        let m = self.clone();
        router.layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let m = m.clone();
                async move { m.observe(req, next).await }
            },
        ))
    }

    async fn observe(&self, req: Request, next: Next) -> Response {
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map_or("other", MatchedPath::as_str)
            .to_owned();
        let method = known_method(req.method());
        let start = Instant::now();
        self.in_flight.inc();
        let resp = next.run(req).await.into_response();
        self.in_flight.dec();
        let labels = Route { route, method };
        self.latency
            .get_or_create(&labels)
            .observe(start.elapsed().as_secs_f64());
        self.requests
            .get_or_create(&Answered {
                route: labels.route,
                method: labels.method,
                status: resp.status().as_u16(),
            })
            .inc();
        resp
    }
}

/// The method as a label: the standard ones by name, any other as
/// `other`, so made-up methods cannot grow the label set.
fn known_method(m: &axum::http::Method) -> String {
    use axum::http::Method;
    let known = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
        Method::PATCH,
    ];
    if known.contains(m) {
        m.as_str().to_owned()
    } else {
        "other".to_owned()
    }
}
