//! One pooled keep-alive HTTP client for the whole process: the tools'
//! depot queries and rate reports and the depots' heartbeats reuse their
//! connections instead of opening one per request.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as Pooled;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// Largest response body a client accepts.
pub const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// How long an idle pooled connection is kept (servers close theirs after
/// a minute or so; closing first avoids racing their close).
const POOL_IDLE: Duration = Duration::from_secs(20);

/// An `http://` or `https://host:port[/prefix]` base URL.
///
/// ```
/// use lors_http::client::BaseUrl;
/// let b = BaseUrl::parse("http://lbone.example.org:8080/dir/").unwrap();
/// assert_eq!(b.authority, "lbone.example.org:8080");
/// assert_eq!(b.prefix, "/dir");
/// assert_eq!(b.to_string(), "http://lbone.example.org:8080/dir");
/// let s = BaseUrl::parse("https://lbone.example.org").unwrap();
/// assert_eq!((s.authority.as_str(), s.tls), ("lbone.example.org:443", true));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BaseUrl {
    /// `host:port` to connect to.
    pub authority: String,
    /// Path prefix without a trailing `/`.
    pub prefix: String,
    /// `https://`: the server is verified and the exchange encrypted.
    pub tls: bool,
}

impl BaseUrl {
    /// Parses `http://host[:port][/prefix]` (port 80 by default) or
    /// `https://…` (port 443).
    pub fn parse(url: &str) -> Result<BaseUrl, String> {
        let (rest, tls) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (r, false),
            (_, Some(r)) => (r, true),
            _ => return Err(format!("{url:?}: give an http:// or https:// URL")),
        };
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
            format!("{auth}:{}", if tls { 443 } else { 80 })
        };
        let prefix = format!("/{}", path.trim_end_matches('/'));
        Ok(BaseUrl {
            authority,
            prefix: if prefix == "/" { String::new() } else { prefix },
            tls,
        })
    }

    /// The host, without port or brackets.
    pub fn host(&self) -> &str {
        let h = match self.authority.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() && !h.ends_with(':') => h,
            _ => &self.authority,
        };
        h.trim_start_matches('[').trim_end_matches(']')
    }

    /// Whether the server is this machine (`localhost`, 127.0.0.0/8,
    /// `::1`): what goes there never crosses a network.
    ///
    /// ```
    /// use lors_http::client::BaseUrl;
    /// assert!(BaseUrl::parse("http://127.0.0.1:8767").unwrap().is_loopback());
    /// assert!(BaseUrl::parse("http://[::1]:8767").unwrap().is_loopback());
    /// assert!(!BaseUrl::parse("http://lbone.example.org").unwrap().is_loopback());
    /// ```
    pub fn is_loopback(&self) -> bool {
        let h = self.host();
        h.eq_ignore_ascii_case("localhost")
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.prefix)
    }
}

/// The certificate authorities `https://` servers are verified against,
/// when set by [`trust`] before the first request.
static CA_FILE: OnceLock<PathBuf> = OnceLock::new();

/// Verifies `https://` servers against the CA certificates (PEM) in
/// `path` instead of the system's: for a deployment with its own CA. Call
/// it before any request; `LORS_CA_FILE` in the environment does the same.
pub fn trust(path: &Path) -> Result<(), String> {
    roots_from(path)?;
    match CA_FILE.set(path.to_owned()) {
        Ok(()) => Ok(()),
        Err(_) if CA_FILE.get().map(PathBuf::as_path) == Some(path) => Ok(()),
        Err(_) => Err("another CA file is already trusted".to_owned()),
    }
}

fn roots_from(path: &Path) -> Result<rustls::RootCertStore, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    use rustls_pki_types::pem::PemObject as _;
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(roots)
}

/// The TLS settings of every client: the roots of [`trust`] or
/// `LORS_CA_FILE`, else the system's.
fn tls_config() -> rustls::ClientConfig {
    let ca = CA_FILE
        .get()
        .cloned()
        .or_else(|| std::env::var_os("LORS_CA_FILE").map(PathBuf::from));
    let roots = match ca {
        Some(path) => roots_from(&path).unwrap_or_else(|e| {
            // Nothing verifies then, and every https request says why.
            tracing::error!("LORS_CA_FILE: {e}");
            rustls::RootCertStore::empty()
        }),
        None => {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            roots
        }
    };
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
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
    inner: Pooled<HttpsConnector<HttpConnector>, Full<Bytes>>,
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
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config())
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
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
            .uri(format!("{base}{path_and_query}"))
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
                    reason: if bad_certificate(&e) {
                        format!(
                            "{} (the server's certificate is not one this machine trusts: give its CA with --ca-file or LORS_CA_FILE)",
                            error_chain(&e)
                        )
                    } else {
                        error_chain(&e)
                    },
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

/// Whether `e`, or an error it wraps, is rustls refusing the server's
/// certificate.
fn bad_certificate(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        // An `io::Error` hides the error it carries from `source()`, and
        // the TLS connector wraps one `io::Error` in another.
        let mut x = c;
        loop {
            if let Some(rustls::Error::InvalidCertificate(_)) = x.downcast_ref::<rustls::Error>() {
                return true;
            }
            match x
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(inner) => x = inner,
                None => break,
            }
        }
        cause = c.source();
    }
    false
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
        assert!(BaseUrl::parse("https://h").unwrap().tls);
        for bad in ["ftp://h", "http://", "http://a b", "http://u@h"] {
            assert!(BaseUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
