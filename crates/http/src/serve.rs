//! Serving an axum [`Router`] over HTTP/1.1 (keep-alive) and h2c, with the
//! limits every service of a deployment needs: connections and requests in
//! flight per client address and overall (see [`crate::peers`]), header
//! and body size, request bodies read whole within a deadline before they
//! take one of the slots handlers run in, a time limit per request,
//! responses dropped when they stop moving ([`crate::stall`]), and idle
//! connections closed. Shutdown is graceful: requests in flight finish,
//! idle connections close, new ones are refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower::ServiceExt as _;

use crate::peers::{Peers, Slot, place_for};
use crate::stall::{Paced, Watched, watched};

/// The bounds a server keeps.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections one client address may hold at once.
    pub per_client: usize,
    /// Requests (HTTP/2 streams included) one client address may have in
    /// flight at once, a response counting until its body is sent; more
    /// are answered 429 at once.
    pub per_client_requests: usize,
    /// A response body that makes no progress this long is dropped with
    /// its connection (HTTP/1.1) or stream (HTTP/2).
    pub send_stall: Duration,
    /// Largest request head (HTTP/1.1 buffer, HTTP/2 header list).
    pub header_bytes: usize,
    /// Largest request body.
    pub body_bytes: usize,
    /// Time to receive a request's head, and to answer it.
    pub request_timeout: Duration,
    /// An open connection with no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// Requests handled at once; more wait their turn within
    /// `request_timeout`. A request takes its turn once its body is in.
    pub concurrency: usize,
}

/// HTTP/2 streams one connection may have open at once.
const STREAMS_PER_CONNECTION: u32 = 16;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            per_client: 32,
            per_client_requests: 32,
            send_stall: Duration::from_secs(5),
            header_bytes: 16 * 1024,
            body_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            concurrency: 512,
        }
    }
}

/// A server's certificate and key: connections are TLS (HTTP/1.1 or h2 by
/// ALPN).
#[derive(Clone)]
pub struct Tls(tokio_rustls::TlsAcceptor);

impl Tls {
    /// From PEM files: the certificate chain (the server's first) and its
    /// private key.
    pub fn from_pem_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Tls, String> {
        use rustls_pki_types::pem::PemObject as _;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .and_then(|it| it.collect::<Result<_, _>>())
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!("{}: no certificate in it", cert.display()));
        }
        let key =
            PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key do not go together: {e}"))?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(
            cfg,
        ))))
    }
}

/// How long a connection admitted by closing a waiting one waits for the
/// place that one hands over.
const EVICT_WAIT: Duration = Duration::from_secs(2);

/// How long a connection told to close may take to finish what is in
/// flight.
const DRAIN: Duration = Duration::from_secs(10);

/// How long a connection closed to make room may take to go.
const EVICT_DRAIN: Duration = Duration::from_millis(500);

impl Limits {
    /// `router` behind the body-size, time and concurrency limits, as
    /// `tower` layers. [`serve`] applies them; this is for callers that
    /// serve the router some other way.
    pub fn apply(&self, router: Router) -> Router {
        router
            .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
                self.concurrency.max(1),
            ))
            .layer(tower_http::timeout::TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                self.request_timeout,
            ))
            .layer(axum::middleware::from_fn_with_state(
                self.request_timeout,
                read_body,
            ))
            .layer(tower_http::limit::RequestBodyLimitLayer::new(
                self.body_bytes,
            ))
    }
}

/// Reads a request's body whole within `limit` before the request goes on
/// to wait for a slot: a client sending its body slowly holds one of its
/// address's requests, never a slot everyone shares.
async fn read_body(
    axum::extract::State(limit): axum::extract::State<Duration>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    use http_body_util::BodyExt as _;
    use hyper::body::Body as _;
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        let req = axum::extract::Request::from_parts(parts, body);
        return next.run(req).await;
    }
    match tokio::time::timeout(limit, body.collect()).await {
        Ok(Ok(b)) => {
            let req =
                axum::extract::Request::from_parts(parts, axum::body::Body::from(b.to_bytes()));
            next.run(req).await
        }
        Ok(Err(e)) => {
            let too_big = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_big {
                (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n").into_response()
            } else {
                (StatusCode::BAD_REQUEST, "request body not read whole\n").into_response()
            }
        }
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time\n",
        )
            .into_response(),
    }
}

/// Serves `router` on `listener` until `shutdown` turns true, then lets
/// each connection finish its request in flight (up to ten seconds).
/// Handlers find the client's address as [`ConnectInfo<SocketAddr>`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) {
    serve_tls(listener, router, limits, None, shutdown).await;
}

/// [`serve`], over TLS when `tls` is given (the handshake bounded by the
/// request timeout).
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Tls>,
    shutdown: watch::Receiver<bool>,
) {
    let router = limits.apply(router);
    let peers = Peers::new(limits.per_client, limits.per_client_requests);
    let places = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut builder = auto::Builder::new(Watched(limits.send_stall));
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_timeout)
        .max_buf_size(limits.header_bytes.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(STREAMS_PER_CONNECTION);
    let builder = Arc::new(builder);
    let mut stop = shutdown.clone();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors, most often: wait for some to close.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        while tasks.try_join_next().is_some() {}
        let Some(slot) = peers.admit(peer.ip()) else {
            tracing::debug!(%peer, "per-client connection limit reached");
            continue;
        };
        // At the overall limit a connection with nothing in flight makes
        // room; else the newcomer is refused rather than queued.
        let place = match places.clone().try_acquire_owned() {
            Ok(p) => Ok(p),
            Err(_) => match peers.evict_waiting(&slot) {
                Some(handed) => Err(handed),
                None => continue,
            },
        };
        let conn = Connection {
            router: router.clone(),
            builder: builder.clone(),
            limits: limits.clone(),
            shutdown: shutdown.clone(),
        };
        let tls = tls.clone();
        let stall = limits.send_stall;
        let places = places.clone();
        tasks.spawn(watched(
            async move {
                let place = match place {
                    Ok(p) => p,
                    Err(handed) => match place_for(handed, places, EVICT_WAIT).await {
                        Some(p) => p,
                        None => return,
                    },
                };
                slot.placed();
                let _ = stream.set_nodelay(true);
                match tls {
                    None => conn.run(stream, peer, slot, place).await,
                    Some(Tls(acceptor)) => {
                        // A connection still in its handshake has no request in
                        // flight: it may be closed to make room like any other.
                        let hs = tokio::time::timeout(
                            conn.limits.request_timeout,
                            acceptor.accept(stream),
                        );
                        tokio::select! {
                            r = hs => match r {
                                Ok(Ok(s)) => conn.run(s, peer, slot, place).await,
                                Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                                Err(_) => tracing::debug!(%peer, "TLS handshake not done in time"),
                            },
                            () = slot.evicted() => slot.hand_over(place),
                        }
                    }
                }
            },
            stall,
        ));
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// The answer to a request over its address's share in flight.
fn too_many() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(axum::http::header::RETRY_AFTER, "1")],
        "too many requests in flight from your address: retry when some are answered\n",
    )
        .into_response()
}

/// What one connection's task needs.
struct Connection {
    router: Router,
    builder: Arc<auto::Builder<Watched>>,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
}

impl Connection {
    async fn run<S>(mut self, stream: S, peer: SocketAddr, slot: Slot, place: OwnedSemaphorePermit)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let slot = Arc::new(slot);
        let router = self.router.clone();
        let s = slot.clone();
        let svc = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
            // Both held until the response body is sent, or dropped.
            let busy = s.begin();
            let request = s.request();
            req.extensions_mut().insert(ConnectInfo(peer));
            let router = router.clone();
            async move {
                let Some(request) = request else {
                    return Ok(too_many());
                };
                let resp = router.oneshot(req.map(axum::body::Body::new)).await?;
                Ok::<_, std::convert::Infallible>(
                    resp.map(|b| axum::body::Body::new(Paced::new(b, (busy, request)))),
                )
            }
        });
        let conn = self.builder.serve_connection(TokioIo::new(stream), svc);
        tokio::pin!(conn);
        let mut evicted = false;
        let closing = loop {
            let idle_for = slot.idle_for();
            let idle_left = self
                .limits
                .idle_timeout
                .saturating_sub(idle_for.unwrap_or_default());
            tokio::select! {
                _ = conn.as_mut() => break false,
                () = slot.evicted() => {
                    evicted = true;
                    break true;
                }
                _ = self.shutdown.changed() => break true,
                () = tokio::time::sleep(idle_left) => {
                    if slot.idle_for().is_some_and(|d| d >= self.limits.idle_timeout) {
                        break true;
                    }
                }
            }
        };
        // Closed to make room: the newcomer gets the place at once, and
        // this one goes within moments (a socket over the limit briefly).
        let place = if evicted {
            slot.hand_over(place);
            None
        } else {
            Some(place)
        };
        // Closed to make room while busy: its requests are cut (it is the
        // busiest address's oldest), not waited for.
        if closing && !(evicted && slot.evicted_busy()) {
            conn.as_mut().graceful_shutdown();
            // One closed to make room had nothing in flight by our count;
            // if it does not go at once (a request body still unread
            // behind an answer), it is cut.
            let drain = if evicted { EVICT_DRAIN } else { DRAIN };
            let _ = tokio::time::timeout(drain, conn.as_mut()).await;
        }
        // Chosen to make room as it closed on its own: the newcomer waits
        // for this place. Not to be chosen again: its streams may outlive
        // it, its place does not.
        slot.ended();
        if let Some(place) = place {
            slot.hand_over(place);
        }
    }
}
