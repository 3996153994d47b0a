//! One pooled keep-alive HTTP client for the whole process: the tools'
//! depot queries and rate reports and the depots' heartbeats reuse their
//! connections instead of opening one per request.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper_util::client::legacy::Client as Pooled;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// Largest response body a client accepts.
pub const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// How long an idle pooled connection is kept (servers close theirs after
/// a minute or so; closing first avoids racing their close).
const POOL_IDLE: Duration = Duration::from_secs(20);

/// An `http://host:port[/prefix]` base URL.
///
/// ```
/// use lors_http::client::BaseUrl;
/// let b = BaseUrl::parse("http://lbone.example.org:8080/dir/").unwrap();
/// assert_eq!(b.authority, "lbone.example.org:8080");
/// assert_eq!(b.prefix, "/dir");
/// assert_eq!(b.to_string(), "http://lbone.example.org:8080/dir");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BaseUrl {
    /// `host:port` to connect to.
    pub authority: String,
    /// Path prefix without a trailing `/`.
    pub prefix: String,
}

impl BaseUrl {
    /// Parses `http://host[:port][/prefix]` (port 80 by default).
    pub fn parse(url: &str) -> Result<BaseUrl, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url:?}: only http:// URLs are supported"))?;
        let (auth, path) = rest.split_once('/').unwrap_or((rest, ""));
        if auth.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        if auth.bytes().any(|b| b.is_ascii_whitespace() || b == b'@') {
            return Err(format!("{url:?}: not a host[:port]"));
        }
        let authority = if auth
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            || auth.ends_with(']')
        {
            auth.to_owned()
        } else {
            format!("{auth}:80")
        };
        let prefix = format!("/{}", path.trim_end_matches('/'));
        Ok(BaseUrl {
            authority,
            prefix: if prefix == "/" { String::new() } else { prefix },
        })
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.prefix)
    }
}

/// Why a request got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The request could not be built (a bad path or token).
    #[error("request to {authority}: {reason}")]
    Request {
        /// The server.
        authority: String,
        /// What was wrong.
        reason: String,
    },
    /// No connection, or it broke before the answer was in.
    #[error("connecting to {authority}: {reason}")]
    Connect {
        /// The server.
        authority: String,
        /// The transport's words.
        reason: String,
    },
    /// No whole answer within the time allowed.
    #[error("no answer from {authority} within {after:?}")]
    Timeout {
        /// The server.
        authority: String,
        /// The time allowed.
        after: Duration,
    },
    /// The answer's body is larger than [`MAX_RESPONSE`] or was cut short.
    #[error("answer from {authority}: {reason}")]
    Body {
        /// The server.
        authority: String,
        /// What was wrong.
        reason: String,
    },
}

/// A pooled keep-alive client.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Pooled<HttpConnector, Full<Bytes>>,
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl Client {
    /// A client with its own pool.
    pub fn new() -> Client {
        Self::from_address(None)
    }

    /// A client with its own pool whose connections leave from `local`
    /// (a load generator posing as many hosts on loopback, say).
    pub fn from_address(local: Option<std::net::IpAddr>) -> Client {
        let mut connector = HttpConnector::new();
        connector.set_local_address(local);
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        let inner = Pooled::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(32)
            .build(connector);
        Client { inner }
    }

    /// The process's client: every caller shares its pool. Connections made
    /// on a runtime that has since ended are found closed and replaced.
    pub fn shared() -> &'static Client {
        static SHARED: OnceLock<Client> = OnceLock::new();
        SHARED.get_or_init(Client::new)
    }

    /// Sends one request and returns the status and body. The whole
    /// exchange is bounded by `timeout`, the body by [`MAX_RESPONSE`].
    pub async fn fetch(
        &self,
        base: &BaseUrl,
        method: &str,
        path_and_query: &str,
        bearer: Option<&str>,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<(u16, Bytes), FetchError> {
        let authority = || base.authority.clone();
        let bad = |reason: String| FetchError::Request {
            authority: authority(),
            reason,
        };
        let mut req = Request::builder()
            .method(method)
            .uri(format!(
                "http://{}{}{path_and_query}",
                base.authority, base.prefix
            ))
            .header(HOST, &base.authority)
            .header(ACCEPT, "application/json");
        if let Some(t) = bearer {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        let body = body.map(Bytes::copy_from_slice).unwrap_or_default();
        if !body.is_empty() || method == "POST" {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(body)).map_err(|e| bad(e.to_string()))?;
        let work = async {
            let resp = self
                .inner
                .request(req)
                .await
                .map_err(|e| FetchError::Connect {
                    authority: authority(),
                    reason: error_chain(&e),
                })?;
            let status = resp.status().as_u16();
            let body = Limited::new(resp.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| FetchError::Body {
                    authority: authority(),
                    reason: error_chain(e.as_ref()),
                })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| FetchError::Timeout {
                authority: authority(),
                after: timeout,
            })?
    }
}

/// An error and its causes on one line ("client error (Connect): tcp
/// connect error: Connection refused"), as hyper's outer errors alone say
/// little.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !s.contains(&c_text) {
            s.push_str(": ");
            s.push_str(&c_text);
        }
        cause = c.source();
    }
    s
}

/// [`Client::fetch`] on the [shared](Client::shared) client.
pub async fn fetch(
    base: &BaseUrl,
    method: &str,
    path_and_query: &str,
    bearer: Option<&str>,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<(u16, Bytes), FetchError> {
    Client::shared()
        .fetch(base, method, path_and_query, bearer, body, timeout)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let b = BaseUrl::parse("http://lbone.example.org:8080/dir/").unwrap();
        assert_eq!(b.authority, "lbone.example.org:8080");
        assert_eq!(b.prefix, "/dir");
        assert_eq!(BaseUrl::parse("http://h").unwrap().authority, "h:80");
        assert_eq!(BaseUrl::parse("http://[::1]").unwrap().authority, "[::1]");
        for bad in ["https://h", "http://", "http://a b", "http://u@h"] {
            assert!(BaseUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
