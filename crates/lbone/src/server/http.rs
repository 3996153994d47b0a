//! The directory's HTTP face: requests decoded by extractors that refuse a
//! bad one in the API's error form (`{"error": "…"}` with a 4xx), handlers
//! that return typed answers or an [`ApiError`], and the routes.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request, State};
use axum::http::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use http_body_util::Full;

use super::{DASHBOARD, LBone, Response, ServerError};
use crate::api::{self, QueryError};
use crate::budget::{NoRoom, Room};
use crate::model::{Departure, Healthy, Invalid, RateReports, Registration};
use crate::rank::Query;

/// Why a request got no answer: each is said to the client with its
/// status and text.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The depot query cannot be read (400).
    #[error(transparent)]
    Query(#[from] QueryError),
    /// A body that is not the message the route takes (400).
    #[error("{what} body: {source}")]
    Body {
        /// Which message.
        what: &'static str,
        /// The decoder's words.
        source: serde_json::Error,
    },
    /// A body larger than its message may be (413).
    #[error("a {what} is at most {max} bytes")]
    TooLarge {
        /// Which message.
        what: &'static str,
        /// Its bound.
        max: usize,
    },
    /// The body could not be read at all (axum's status and words).
    #[error("{1}")]
    Unreadable(StatusCode, String),
    /// A registration out of bounds (400).
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// More reports in one post than the API takes (400).
    #[error("at most 1024 reports of known depots")]
    TooManyRates,
    /// The network posted its reports for this minute (429).
    #[error("too many rate reports from your network: at most 60 a minute")]
    ReportsPerMinute,
    /// No room in the body budget, or no turn, within the wait (429 or 503).
    #[error("{}", match .0 {
        NoRoom::Share => "your address has as many answers in flight as it may: read them, then retry",
        NoRoom::Busy => "the directory is busy: retry in a second",
    })]
    Room(NoRoom),
    /// The store or the index failed (503).
    #[error(transparent)]
    Server(#[from] ServerError),
    /// An answer that could not be encoded (500).
    #[error("the answer could not be encoded")]
    Encode,
    /// No registration token, or the wrong one (401).
    #[error("registration needs the L-Bone token: Authorization: Bearer TOKEN")]
    Token,
    /// No such route (404).
    #[error("no such endpoint: try GET /api/v1/depots or the dashboard at /")]
    NoRoute,
    /// The route takes another method (405).
    #[error("method not allowed")]
    Method,
}

impl From<NoRoom> for ApiError {
    fn from(e: NoRoom) -> Self {
        ApiError::Room(e)
    }
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::Query(_)
            | ApiError::Body { .. }
            | ApiError::Invalid(_)
            | ApiError::TooManyRates => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unreadable(s, _) => *s,
            ApiError::ReportsPerMinute | ApiError::Room(NoRoom::Share) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Room(NoRoom::Busy) | ApiError::Server(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Encode => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Token => StatusCode::UNAUTHORIZED,
            ApiError::NoRoute => StatusCode::NOT_FOUND,
            ApiError::Method => StatusCode::METHOD_NOT_ALLOWED,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        #[derive(serde::Serialize)]
        struct Refusal {
            error: String,
        }
        let body = Refusal {
            error: self.to_string(),
        };
        json(
            self.status(),
            Body::from(serde_json::to_vec(&body).unwrap_or_default()),
        )
    }
}

/// A typed answer, sent as JSON with 200.
pub struct Answer<T>(pub T);

impl<T: serde::Serialize> IntoResponse for Answer<T> {
    fn into_response(self) -> Response {
        match serde_json::to_vec(&self.0) {
            Ok(b) => json(StatusCode::OK, Body::from(b)),
            Err(_) => ApiError::Encode.into_response(),
        }
    }
}

/// A message a route takes as its JSON body.
pub trait Message: serde::de::DeserializeOwned {
    /// Its name in errors.
    const WHAT: &'static str;
    /// Its largest body; a larger one is refused before it is decoded.
    const MAX: usize = 2 << 20;
}

impl Message for Registration {
    const WHAT: &'static str = "registration";
    const MAX: usize = crate::model::MAX_REGISTRATION;
}

impl Message for Departure {
    const WHAT: &'static str = "deregistration";
}

impl Message for RateReports {
    const WHAT: &'static str = "rates";
}

/// A request's body decoded as the message `T`. Unlike axum's `Json` it
/// does not ask for a `Content-Type` (the depots' registrations never sent
/// one) and refuses in the API's error form.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: Message> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let body = Bytes::from_request(req, state)
            .await
            .map_err(|r| ApiError::Unreadable(r.status(), r.body_text()))?;
        if body.len() > T::MAX {
            return Err(ApiError::TooLarge {
                what: T::WHAT,
                max: T::MAX,
            });
        }
        serde_json::from_slice(&body)
            .map(Json)
            .map_err(|source| ApiError::Body {
                what: T::WHAT,
                source,
            })
    }
}

/// `GET /api/v1/depots`'s query string, read strictly ([`api::query_from`]).
pub struct DepotsQuery {
    /// As sent: answers to the same question are shared by it.
    pub raw: String,
    /// What it asks.
    pub query: Query,
    /// Whether it asks for every depot and nothing else (`all=1` alone):
    /// the largest listing there is.
    pub all: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for DepotsQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let raw = parts.uri.query().unwrap_or("").to_owned();
        let params = api::params(&raw)?;
        let query = api::query_from(&params)?;
        Ok(DepotsQuery {
            all: query.include_offline && params.len() == 1,
            raw,
            query,
        })
    }
}

fn json(status: StatusCode, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A shared listing, holding its room in the body budget until the body
/// has been sent (or the client has gone).
pub(super) fn json_held(body: Bytes, room: Room) -> Response {
    json(StatusCode::OK, held(Full::new(body), room))
}

/// `body`, holding `room` until it has been sent.
pub(super) fn held<B>(body: B, room: Room) -> Body
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    Body::new(Held { body, _room: room })
}

/// A body and the budget it holds.
struct Held<B> {
    body: B,
    _room: Room,
}

impl<B: http_body::Body<Data = Bytes> + Unpin> http_body::Body for Held<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Lets a request through only with the L-Bone's token (`Authorization:
/// Bearer TOKEN`); a refusal is counted and logged.
async fn require_token(
    State(lb): State<Arc<LBone>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let given = (req.headers().get(AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if lb.token_ok(given) {
        return next.run(req).await;
    }
    lb.metrics.refused_token();
    let path = req.uri().path();
    tracing::warn!(peer = %peer.ip(), path, "refused: wrong or missing token");
    ApiError::Token.into_response()
}

/// The HTTP API and the dashboard.
pub fn router(lb: Arc<LBone>) -> Router {
    type S = State<Arc<LBone>>;
    type Peer = ConnectInfo<SocketAddr>;
    let dashboard = || async { ([(CONTENT_TYPE, "text/html; charset=utf-8")], DASHBOARD) };
    let http = lb.metrics.http.clone();
    // The routes that change the directory: the token is checked before
    // the body is read.
    let registration = Router::new()
        .route(
            "/api/v1/register",
            post(|State(lb): S, Json(reg): Json<Registration>| async move {
                lb.register(reg).await.map(Answer)
            }),
        )
        .route(
            "/api/v1/deregister",
            post(|State(lb): S, Json(d): Json<Departure>| async move {
                lb.deregister(d).await.map(Answer)
            }),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            lb.clone(),
            require_token,
        ));
    let router = Router::new()
        .route("/", get(dashboard))
        .route("/index.html", get(dashboard))
        .route("/healthz", get(|| async { Answer(Healthy { ok: true }) }))
        .route(
            "/api/v1/history",
            get(|State(lb): S, peer: Peer| async move { lb.history(peer.0.ip()).await }),
        )
        .route(
            "/metrics",
            get(|State(lb): S, peer: Peer, headers: HeaderMap| async move {
                lb.metrics_page(peer.0.ip(), &headers).await
            }),
        )
        .route(
            "/api/v1/depots",
            get(|State(lb): S, peer: Peer, q: DepotsQuery| async move {
                lb.listing(q, peer.0.ip()).await
            }),
        )
        .merge(registration)
        .route(
            "/api/v1/rates",
            post(
                |State(lb): S, peer: Peer, Json(r): Json<RateReports>| async move {
                    lb.rates(r, peer.0.ip()).await.map(Answer)
                },
            ),
        )
        .method_not_allowed_fallback(|| async { ApiError::Method })
        .fallback(|| async { ApiError::NoRoute })
        .layer(axum::middleware::map_response(|mut r: Response| async {
            let h = r.headers_mut();
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
            r
        }))
        .with_state(lb);
    http.layer(router)
}
