//! A small, strict HTTP/1.1 layer: one request per connection, bodies only
//! by `Content-Length`, hard limits on every part. Enough for a JSON API and
//! a dashboard page, and small enough to fuzz whole.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Largest request body.
pub const MAX_BODY: usize = 1024 * 1024;
/// Largest response body a client accepts.
pub const MAX_RESPONSE: usize = 16 * 1024 * 1024;
/// Most headers.
pub const MAX_HEADERS: usize = 64;

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    /// `GET`, `POST`, ….
    pub method: String,
    /// Path without the query, percent-decoded.
    pub path: String,
    /// Query parameters, decoded, in order.
    pub query: Vec<(String, String)>,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Request {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A query parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The bearer token, if any.
    pub fn bearer(&self) -> Option<&str> {
        self.header("authorization")?
            .strip_prefix("Bearer ")
            .map(str::trim)
    }
}

/// Why a request was refused; carries the status to answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {reason}")]
pub struct HttpError {
    /// HTTP status.
    pub status: u16,
    /// Explanation for the client.
    pub reason: String,
}

fn err(status: u16, reason: impl Into<String>) -> HttpError {
    HttpError {
        status,
        reason: reason.into(),
    }
}

/// Decodes `%XX` (and `+` as space when `plus`); invalid escapes are errors.
pub fn percent_decode(s: &str, plus: bool) -> Result<String, HttpError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| err(400, "bad percent escape"))?;
                out.push(hex);
                i += 3;
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| err(400, "not UTF-8"))
}

/// Parses a request head (everything before the blank line). Returns the
/// request without its body and the declared body length.
pub fn parse_head(head: &[u8]) -> Result<(Request, usize), HttpError> {
    let text = std::str::from_utf8(head).map_err(|_| err(400, "request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) if !m.is_empty() && !t.is_empty() => (m, t, v),
        _ => return Err(err(400, "malformed request line")),
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(err(505, "HTTP/1.0 or 1.1 only"));
    }
    if !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(err(400, "bad method"));
    }
    if !target.starts_with('/') {
        return Err(err(400, "target must be a path"));
    }
    let (raw_path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    let mut req = Request {
        method: method.to_owned(),
        path: percent_decode(raw_path, false)?,
        ..Request::default()
    };
    for kv in raw_query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        req.query
            .push((percent_decode(k, true)?, percent_decode(v, true)?));
    }
    let mut body_len = 0usize;
    for l in lines {
        if l.is_empty() {
            continue;
        }
        if req.headers.len() == MAX_HEADERS {
            return Err(err(431, "too many headers"));
        }
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| err(400, "malformed header"))?;
        if k.is_empty()
            || k.bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(err(400, "malformed header name"));
        }
        let k = k.to_ascii_lowercase();
        let v = v.trim().to_owned();
        match k.as_str() {
            "content-length" => {
                body_len = v.parse().map_err(|_| err(400, "bad Content-Length"))?;
                if body_len > MAX_BODY {
                    return Err(err(413, format!("bodies are limited to {MAX_BODY} bytes")));
                }
            }
            "transfer-encoding" => return Err(err(501, "send a Content-Length, not chunks")),
            _ => {}
        }
        req.headers.push((k, v));
    }
    Ok((req, body_len))
}

/// Reads one request from `io` within `timeout`.
pub async fn read_request<R: AsyncReadExt + Unpin>(
    io: &mut R,
    timeout: Duration,
) -> Result<Request, HttpError> {
    tokio::time::timeout(timeout, async {
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p;
            }
            if buf.len() > MAX_HEAD {
                return Err(err(431, "request head too large"));
            }
            let n = io
                .read(&mut chunk)
                .await
                .map_err(|e| err(400, e.to_string()))?;
            if n == 0 {
                return Err(err(400, "connection closed mid-request"));
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        if end > MAX_HEAD {
            return Err(err(431, "request head too large"));
        }
        let (mut req, len) = parse_head(&buf[..end])?;
        let mut body = buf.split_off(end + 4);
        if body.len() > len {
            return Err(err(400, "more body than Content-Length"));
        }
        let have = body.len();
        body.resize(len, 0);
        io.read_exact(&mut body[have..])
            .await
            .map_err(|_| err(400, "body shorter than Content-Length"))?;
        req.body = body;
        Ok(req)
    })
    .await
    .map_err(|_| err(408, "request not received in time"))?
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status.
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body (shared: one listing may answer many requests).
    pub body: std::sync::Arc<Vec<u8>>,
}

impl Response {
    /// A JSON body.
    pub fn json(status: u16, body: String) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: std::sync::Arc::new(body.into_bytes()),
        }
    }

    /// A JSON error: `{"error": "…"}`.
    pub fn error(status: u16, reason: &str) -> Response {
        Response::json(status, serde_json::json!({ "error": reason }).to_string())
    }

    /// Serializes with `Connection: close`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.head();
        out.extend_from_slice(&self.body);
        out
    }

    /// The status line and headers, to send before [`Response::body`]
    /// without copying the body beside them.
    pub fn head(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            204 => "No Content",
            400 => "Bad Request",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            429 => "Too Many Requests",
            408 => "Request Timeout",
            413 => "Payload Too Large",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            501 => "Not Implemented",
            503 => "Service Unavailable",
            505 => "HTTP Version Not Supported",
            _ => "Status",
        };
        format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes()
    }
}

/// An `http://host:port[/prefix]` base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Sends one request and returns the status and body. Every step is bounded
/// by `timeout`; the response body by [`MAX_RESPONSE`].
pub async fn fetch(
    base: &BaseUrl,
    method: &str,
    path_and_query: &str,
    bearer: Option<&str>,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let work = async {
        let mut s = tokio::net::TcpStream::connect(&base.authority)
            .await
            .map_err(|e| format!("connecting to {}: {e}", base.authority))?;
        let mut head = format!(
            "{method} {}{path_and_query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\n",
            base.prefix, base.authority
        );
        if let Some(t) = bearer {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        let body = body.unwrap_or(&[]);
        if !body.is_empty() || method == "POST" {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(body).await.map_err(|e| e.to_string())?;
        let mut resp = Vec::new();
        (&mut s)
            .take(MAX_RESPONSE as u64 + MAX_HEAD as u64)
            .read_to_end(&mut resp)
            .await
            .map_err(|e| e.to_string())?;
        let end = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("response without a header end")?;
        let head = std::str::from_utf8(&resp[..end])
            .map_err(|_| "response head not UTF-8")?
            .to_owned();
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or("malformed status line")?;
        let mut body = resp.split_off(end + 4);
        if let Some(len) = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        }) {
            if body.len() < len {
                return Err("response body cut short".to_owned());
            }
            body.truncate(len);
        }
        Ok((status, body))
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| format!("no answer from {} within {timeout:?}", base.authority))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let (r, n) = parse_head(
            b"GET /api/v1/depots?location=city%3D+Brno&count=2 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret",
        )
        .unwrap();
        assert_eq!(r.path, "/api/v1/depots");
        assert_eq!(r.param("location"), Some("city= Brno"));
        assert_eq!(r.param("count"), Some("2"));
        assert_eq!(r.bearer(), Some("s3cret"));
        assert_eq!(n, 0);
        for (bad, status) in [
            (&b"GET / HTTP/2"[..], 505),
            (b"GET  / HTTP/1.1", 400),
            (b"get / HTTP/1.1", 400),
            (b"GET x HTTP/1.1", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: 99999999", 413),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", 501),
            (b"GET /%zz HTTP/1.1", 400),
            (b"GET / HTTP/1.1\r\nno colon", 400),
        ] {
            assert_eq!(parse_head(bad).unwrap_err().status, status, "{bad:?}");
        }
    }

    #[test]
    fn base_urls() {
        let b = BaseUrl::parse("http://lbone.example.org:8080/dir/").unwrap();
        assert_eq!(b.authority, "lbone.example.org:8080");
        assert_eq!(b.prefix, "/dir");
        assert_eq!(BaseUrl::parse("http://h").unwrap().authority, "h:80");
        assert!(BaseUrl::parse("https://h").is_err());
    }
}
