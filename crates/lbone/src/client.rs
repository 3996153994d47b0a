//! Talking to an L-Bone: depot queries and rate reports for the tools, and
//! the registration heartbeat for depots.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::legacy::{self, LegacyRequest};
use crate::model::{DepotView, RateReport, RateReports, Registration};
pub use lors_http::BaseUrl;
use lors_http::client as http;

/// Why an L-Bone could not be asked, or refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `LBONE_SERVER` (or a list of them) cannot be read.
    #[error("L-Bone {given:?}: {why}")]
    Address {
        /// What was given.
        given: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An `http(s)://` address that is not a usable URL.
    #[error("{0}")]
    Url(String),
    /// More than [`MAX_LBONES`] in a list.
    #[error("at most {MAX_LBONES} L-Bones in a list")]
    TooMany,
    /// An empty list.
    #[error("no L-Bone given")]
    NoneGiven,
    /// The legacy protocol's TCP exchange failed.
    #[error("L-Bone {at}: {source}")]
    Io {
        /// `host:port`.
        at: String,
        /// What the socket said.
        source: std::io::Error,
    },
    /// No whole legacy answer in time.
    #[error("L-Bone {at} did not answer within {after:?}")]
    Timeout {
        /// `host:port`.
        at: String,
        /// The time allowed.
        after: Duration,
    },
    /// A legacy server's error or malformed reply.
    #[error(transparent)]
    Legacy(#[from] legacy::LegacyError),
    /// No HTTP answer.
    #[error(transparent)]
    Fetch(#[from] http::FetchError),
    /// An HTTP answer other than 200.
    #[error("the L-Bone answered {status}: {body}")]
    Status {
        /// Its status.
        status: u16,
        /// Its body, as text.
        body: String,
    },
    /// A 200 whose body is not what the API returns.
    #[error("L-Bone answer is not a depot list: {0}")]
    Answer(serde_json::Error),
    /// The registration token was refused (401): a setting to fix, not a
    /// failure to wait out.
    #[error("the L-Bone refused the registration token")]
    TokenRefused,
    /// Asked of a legacy L-Bone, which names addresses only.
    #[error("the legacy L-Bone protocol returns addresses only")]
    AddressesOnly,
    /// A query's task ended without an answer (it panicked).
    #[error("{0}")]
    Task(tokio::task::JoinError),
    /// Every L-Bone of a list failed: each with what it said.
    #[error("{}", list(.0))]
    Each(Vec<(String, Error)>),
}

fn list(failures: &[(String, Error)]) -> String {
    let each: Vec<String> = failures.iter().map(|(d, e)| format!("{d}: {e}")).collect();
    each.join("; ")
}

impl Error {
    /// Whether every L-Bone asked refused the registration token.
    pub fn is_token_refused(&self) -> bool {
        match self {
            Error::TokenRefused => true,
            Error::Each(v) => !v.is_empty() && v.iter().all(|(_, e)| e.is_token_refused()),
            _ => false,
        }
    }
}

/// An L-Bone to ask: our HTTP API, or any server speaking the legacy protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Directory {
    /// `http://host:port` or `https://…` — our API.
    Http(BaseUrl),
    /// `host` + port — the 512-byte protocol, as the original tools speak it.
    Legacy(String, u16),
    /// `host:port` with no scheme, on a port other than the legacy one:
    /// our HTTP API if it answers HTTP there, else the legacy protocol.
    Either(String, u16),
    /// Several L-Bones (instances of one directory, say), in order: the
    /// first that answers is used. A refusal moves on at once; one that
    /// has not answered within [`HEDGE`] is asked beside the next, so a hung
    /// instance costs a second, not a timeout.
    Any(Vec<Directory>),
}

/// How long one of [`Directory::Any`]'s L-Bones has to answer before the
/// next is asked too.
pub const HEDGE: Duration = Duration::from_secs(1);

/// Most L-Bones in one list.
pub const MAX_LBONES: usize = 16;

impl std::fmt::Display for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Directory::Http(b) => write!(f, "{b}"),
            Directory::Legacy(h, p) => write!(f, "{h}:{p} (legacy protocol)"),
            Directory::Either(h, p) => write!(f, "{h}:{p}"),
            Directory::Any(ds) => {
                for (i, d) in ds.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{d}")?;
                }
                Ok(())
            }
        }
    }
}

/// A boxed call on one L-Bone of a list.
type Call<T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, Error>> + Send>>;

/// The first answer of `members`, asked in order: the next is asked when
/// one fails, or has not answered within [`HEDGE`]. The others are
/// cancelled once one answers. Returns the answer and who gave it; or every
/// failure, each with its L-Bone.
async fn first_answer<T: Send + 'static>(
    members: &[Directory],
    call: impl Fn(Directory) -> Call<T>,
) -> Result<(T, Directory), Error> {
    let mut asked = tokio::task::JoinSet::new();
    let mut next = 0;
    let mut failures = Vec::new();
    loop {
        if asked.is_empty() {
            let Some(d) = members.get(next) else {
                return Err(if failures.is_empty() {
                    Error::NoneGiven
                } else {
                    Error::Each(failures)
                });
            };
            let work = call(d.clone());
            let d = d.clone();
            asked.spawn(async move { (work.await, d) });
            next += 1;
        }
        tokio::select! {
            Some(done) = asked.join_next() => match done {
                Ok((Ok(v), d)) => return Ok((v, d)),
                Ok((Err(e), d)) => {
                    tracing::warn!(lbone = %d, "L-Bone failed, trying the next: {e}");
                    failures.push((d.to_string(), e));
                }
                Err(e) => failures.push(("a query task".to_owned(), Error::Task(e))),
            },
            () = tokio::time::sleep(HEDGE), if next < members.len() => {
                let d = &members[next];
                tracing::info!(lbone = %d, "no answer yet: asking the next L-Bone too");
                let work = call(d.clone());
                let d = d.clone();
                asked.spawn(async move { (work.await, d) });
                next += 1;
            }
        }
    }
}

/// How long [`Directory::Either`] waits for an HTTP answer before trying
/// the legacy protocol (a legacy server waits for a whole 512-byte request
/// and never answers a short HTTP one).
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the tools ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DepotQuery {
    /// Depots wanted (0 = all).
    pub count: usize,
    /// Hard bytes per allocation.
    pub hard: u64,
    /// Lease, seconds.
    pub duration: u64,
    /// Location hint (`city= Brno`), may be empty.
    pub location: String,
}

impl Directory {
    /// From `LBONE_SERVER` (a host, `host:port`, or an `http://` URL) and
    /// `LBONE_PORT`. A bare host speaks the legacy protocol (on `port`, else
    /// 6767), as the original tools do; `host:port` on any other port than
    /// 6767 is tried as HTTP first.
    ///
    /// ```
    /// use lors_lbone::client::Directory;
    /// assert_eq!(Directory::parse("lbone.example.org", None).unwrap(),
    ///            Directory::Legacy("lbone.example.org".into(), 6767));
    /// assert_eq!(Directory::parse("lbone.example.org:6767", None).unwrap(),
    ///            Directory::Legacy("lbone.example.org".into(), 6767));
    /// assert_eq!(Directory::parse("127.0.0.1:8767", None).unwrap(),
    ///            Directory::Either("127.0.0.1".into(), 8767));
    /// assert!(matches!(Directory::parse("http://127.0.0.1:8767", None).unwrap(), Directory::Http(_)));
    /// ```
    pub fn parse(server: &str, port: Option<u16>) -> Result<Directory, Error> {
        let list: Vec<&str> = server
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .collect();
        if list.len() > MAX_LBONES {
            return Err(Error::TooMany);
        }
        if list.len() > 1 {
            return list
                .into_iter()
                .map(|s| Self::parse_one(s, port))
                .collect::<Result<_, _>>()
                .map(Directory::Any);
        }
        Self::parse_one(server, port)
    }

    fn parse_one(server: &str, port: Option<u16>) -> Result<Directory, Error> {
        let server = server.trim();
        let bad = |why| Error::Address {
            given: server.to_owned(),
            why,
        };
        if server.starts_with("http://") || server.starts_with("https://") {
            return BaseUrl::parse(server)
                .map(Directory::Http)
                .map_err(Error::Url);
        }
        if server.is_empty() || server.contains('/') {
            return Err(bad(
                "give a host (with LBONE_PORT) or an http(s)://host:port URL",
            ));
        }
        match server.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => {
                let p = p
                    .parse()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| bad("bad port"))?;
                if h.is_empty() {
                    return Err(bad("no host"));
                }
                Ok(if p == crate::LEGACY_PORT {
                    Directory::Legacy(h.to_owned(), p)
                } else {
                    Directory::Either(h.to_owned(), p)
                })
            }
            _ => Ok(Directory::Legacy(
                server.to_owned(),
                port.unwrap_or(crate::LEGACY_PORT),
            )),
        }
    }

    /// Which protocol an [`Directory::Either`] speaks: HTTP if an HTTP
    /// answer (any status) comes back within three seconds, else legacy.
    /// A list's members are settled each (at once); other directories are
    /// returned as they are.
    pub async fn resolve(&self) -> Directory {
        let Directory::Any(ds) = self else {
            return self.resolve_one().await;
        };
        let mut settling = tokio::task::JoinSet::new();
        for (i, d) in ds.iter().enumerate() {
            let d = d.clone();
            settling.spawn(async move { (i, d.resolve_one().await) });
        }
        let mut out = ds.clone();
        while let Some(Ok((i, d))) = settling.join_next().await {
            out[i] = d;
        }
        Directory::Any(out)
    }

    /// [`Directory::resolve`] of one L-Bone (lists hold no lists).
    async fn resolve_one(&self) -> Directory {
        let Directory::Either(host, port) = self else {
            return self.clone();
        };
        let host_part = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        let Ok(base) = BaseUrl::parse(&format!("http://{host_part}:{port}")) else {
            return Directory::Legacy(host.clone(), *port);
        };
        let probe = http::fetch(
            &base,
            "GET",
            "/api/v1/depots?count=1",
            None,
            None,
            PROBE_TIMEOUT,
        );
        match probe.await {
            Ok(_) => Directory::Http(base),
            Err(_) => Directory::Legacy(host.clone(), *port),
        }
    }

    /// Ranked depots (`host:port`) for `q`.
    pub async fn depots(&self, q: &DepotQuery, timeout: Duration) -> Result<Vec<String>, Error> {
        self.depots_from(q, timeout).await.map(|(v, _)| v)
    }

    /// Ranked depots for `q`, and the L-Bone that named them (of a list,
    /// the one that answered: where to report rates to).
    pub async fn depots_from(
        &self,
        q: &DepotQuery,
        timeout: Duration,
    ) -> Result<(Vec<String>, Directory), Error> {
        let Directory::Any(ds) = self else {
            let d = self.resolve_one().await;
            return d.depots_one(q, timeout).await.map(|v| (v, d));
        };
        first_answer(ds, |d| {
            let q = q.clone();
            Box::pin(async move { d.resolve_one().await.depots_one(&q, timeout).await })
        })
        .await
    }

    /// The depots one resolved L-Bone names.
    async fn depots_one(&self, q: &DepotQuery, timeout: Duration) -> Result<Vec<String>, Error> {
        let (host, port) = match self {
            Directory::Http(_) => {
                return Ok(self
                    .views_one(q, false, timeout)
                    .await?
                    .into_iter()
                    .map(|d| d.addr)
                    .collect());
            }
            Directory::Legacy(host, port) | Directory::Either(host, port) => (host, *port),
            // Lists hold no lists: `parse` makes none.
            Directory::Any(_) => return Err(Error::NoneGiven),
        };
        let req = LegacyRequest::Depots {
            count: q.count,
            hard_mb: q.hard.div_ceil(1 << 20),
            soft_mb: 0,
            duration: q.duration,
            location: q.location.clone(),
        };
        let at = || format!("{host}:{port}");
        let work = async {
            let mut s = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            s.write_all(&legacy::encode_request(&req)).await?;
            let mut reply = Vec::new();
            // At most 10,000 depots of 266 bytes each.
            (&mut s)
                .take(20 + 10_000 * 266)
                .read_to_end(&mut reply)
                .await?;
            Ok::<_, std::io::Error>(reply)
        };
        let reply = tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| Error::Timeout {
                at: at(),
                after: timeout,
            })?
            .map_err(|source| Error::Io { at: at(), source })?;
        let list = legacy::parse_depots_reply(&reply)?;
        Ok(list
            .into_iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                }
            })
            .collect())
    }

    /// The full answer of our HTTP API (`all` includes offline depots).
    pub async fn depot_views(
        &self,
        q: &DepotQuery,
        all: bool,
        timeout: Duration,
    ) -> Result<Vec<DepotView>, Error> {
        let Directory::Any(ds) = self else {
            return self.resolve_one().await.views_one(q, all, timeout).await;
        };
        first_answer(ds, |d| {
            let q = q.clone();
            Box::pin(async move { d.resolve_one().await.views_one(&q, all, timeout).await })
        })
        .await
        .map(|(v, _)| v)
    }

    /// [`Directory::depot_views`] of one resolved L-Bone.
    async fn views_one(
        &self,
        q: &DepotQuery,
        all: bool,
        timeout: Duration,
    ) -> Result<Vec<DepotView>, Error> {
        let Directory::Http(base) = self else {
            return Err(Error::AddressesOnly);
        };
        let mut path = format!(
            "/api/v1/depots?count={}&hard={}&duration={}",
            q.count, q.hard, q.duration
        );
        if !q.location.is_empty() {
            path.push_str("&location=");
            path.push_str(&encode_component(&q.location));
        }
        if all {
            path.push_str("&all=1");
        }
        let (status, body) = http::fetch(base, "GET", &path, None, None, timeout).await?;
        if status != 200 {
            return Err(Error::status(status, &body));
        }
        // Not `deny_unknown_fields`: the answer also carries `now` and
        // `offline_after`, and newer servers may add more.
        #[derive(serde::Deserialize)]
        struct Answer {
            depots: Vec<DepotView>,
        }
        let a: Answer = serde_json::from_slice(&body).map_err(Error::Answer)?;
        Ok(a.depots)
    }

    /// Reports measured rates (HTTP API only; the legacy protocol has no
    /// such message, so this is a no-op there).
    pub async fn report(&self, rates: Vec<RateReport>, timeout: Duration) -> Result<(), Error> {
        if rates.is_empty() {
            return Ok(());
        }
        let Directory::Any(ds) = self else {
            return self.resolve_one().await.report_one(rates, timeout).await;
        };
        first_answer(ds, |d| {
            let rates = rates.clone();
            Box::pin(async move { d.resolve_one().await.report_one(rates, timeout).await })
        })
        .await
        .map(|((), _)| ())
    }

    /// [`Directory::report`] to one resolved L-Bone.
    async fn report_one(&self, rates: Vec<RateReport>, timeout: Duration) -> Result<(), Error> {
        let Directory::Http(base) = self else {
            return Ok(());
        };
        let body = json_of(&RateReports { rates });
        let (status, resp) =
            http::fetch(base, "POST", "/api/v1/rates", None, Some(&body), timeout).await?;
        match status {
            200 => Ok(()),
            _ => Err(Error::status(status, &resp)),
        }
    }
}

impl Error {
    fn status(status: u16, body: &[u8]) -> Error {
        Error::Status {
            status,
            body: String::from_utf8_lossy(body).into_owned(),
        }
    }
}

/// A message body as JSON. Our messages are plain structs of strings and
/// numbers: encoding them cannot fail.
fn json_of(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// Bytes a query component keeps as they are (RFC 3986's unreserved).
const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes a query component.
///
/// ```
/// assert_eq!(lors_lbone::client::encode_component("city= Brno"), "city%3D%20Brno");
/// ```
pub fn encode_component(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, COMPONENT).to_string()
}

/// Registers (or heartbeats) once. Errors say what to fix.
pub async fn register(
    base: &BaseUrl,
    token: &str,
    reg: &Registration,
    timeout: Duration,
) -> Result<(), Error> {
    let body = json_of(reg);
    post_with_token(base, "/api/v1/register", token, &body, timeout).await
}

/// Takes a depot out of the directory at once (a clean stop), instead of
/// leaving it listed until its heartbeats are missed.
pub async fn deregister(
    base: &BaseUrl,
    token: &str,
    depot: &crate::model::Departure,
    timeout: Duration,
) -> Result<(), Error> {
    let body = json_of(depot);
    post_with_token(base, "/api/v1/deregister", token, &body, timeout).await
}

async fn post_with_token(
    base: &BaseUrl,
    path: &str,
    token: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(), Error> {
    let (status, resp) = http::fetch(base, "POST", path, Some(token), Some(body), timeout).await?;
    match status {
        200 => Ok(()),
        401 => Err(Error::TokenRefused),
        _ => Err(Error::status(status, &resp)),
    }
}

/// Registers (or heartbeats, or with `leave` deregisters) with the first
/// of `bases`, in order from `from`, that takes it; returns which did. With
/// several, each has at most five seconds: a hung instance must not cost
/// the whole heartbeat. Fails with every failure ([`Error::is_token_refused`]
/// when every one refused the token).
pub async fn register_first(
    bases: &[BaseUrl],
    from: usize,
    token: &str,
    body: &Announcement<'_>,
    timeout: Duration,
) -> Result<usize, Error> {
    let each = if bases.len() > 1 {
        timeout.min(Duration::from_secs(5))
    } else {
        timeout
    };
    let mut failures = Vec::new();
    for k in 0..bases.len() {
        let i = (from + k) % bases.len();
        let r = match body {
            Announcement::Here(reg) => register(&bases[i], token, reg, each).await,
            Announcement::Leaving(d) => deregister(&bases[i], token, d, each).await,
        };
        match r {
            Ok(()) => return Ok(i),
            Err(e) => failures.push((bases[i].to_string(), e)),
        }
    }
    Err(match failures.len() {
        1 => failures.remove(0).1,
        _ => Error::Each(failures),
    })
}

/// What a depot tells its L-Bones.
pub enum Announcement<'a> {
    /// Its registration (a heartbeat).
    Here(&'a Registration),
    /// It is leaving.
    Leaving(&'a crate::model::Departure),
}

/// Heartbeats every `every` until `shutdown` turns true; `make` builds the
/// current registration (free space changes). With several L-Bones (the
/// instances of one directory) it stays with the one that last took it
/// and moves on to the next when that one fails. Failures are logged once
/// per outage.
pub async fn heartbeat(
    bases: Vec<BaseUrl>,
    token: String,
    make: impl Fn() -> Registration + Send,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    // While it fails the depot is not listed: said at once, then once a
    // minute, so an operator reading the log sees it is still unlisted.
    let mut warned: Option<std::time::Instant> = None;
    let mut current = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        let reg = make();
        let timeout = every.max(Duration::from_secs(5));
        match register_first(&bases, current, &token, &Announcement::Here(&reg), timeout).await {
            Ok(i) => {
                if i != current {
                    tracing::info!(lbone = %bases[i], "heartbeats now go to this L-Bone");
                    current = i;
                }
                if warned.take().is_some() {
                    tracing::info!("L-Bone heartbeat working again");
                }
            }
            Err(e) if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) => {
                tracing::warn!("L-Bone heartbeat failed, the depot is not listed: {e}");
                warned = Some(std::time::Instant::now());
            }
            Err(e) => tracing::debug!("L-Bone heartbeat failed: {e}"),
        }
    }
}
