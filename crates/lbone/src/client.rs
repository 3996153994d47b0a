//! Talking to an L-Bone: depot queries and rate reports for the tools, and
//! the registration heartbeat for depots.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::legacy::{self, LegacyRequest};
use crate::model::{DepotView, RateReport, RateReports, Registration};
pub use lors_http::BaseUrl;
use lors_http::client as http;

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
type Call<T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, String>> + Send>>;

/// The first answer of `members`, asked in order: the next is asked when
/// one fails, or has not answered within [`HEDGE`]. The others are
/// cancelled once one answers. Returns the answer and who gave it; or every
/// failure, each with its L-Bone.
async fn first_answer<T: Send + 'static>(
    members: &[Directory],
    call: impl Fn(Directory) -> Call<T>,
) -> Result<(T, Directory), String> {
    let mut asked = tokio::task::JoinSet::new();
    let mut next = 0;
    let mut failures = Vec::new();
    loop {
        if asked.is_empty() {
            let Some(d) = members.get(next) else {
                return Err(if failures.is_empty() {
                    "no L-Bone given".to_owned()
                } else {
                    failures.join("; ")
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
                    failures.push(format!("{d}: {e}"));
                }
                Err(e) => failures.push(e.to_string()),
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
    pub fn parse(server: &str, port: Option<u16>) -> Result<Directory, String> {
        let list: Vec<&str> = server
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .collect();
        if list.len() > MAX_LBONES {
            return Err(format!("at most {MAX_LBONES} L-Bones in a list"));
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

    fn parse_one(server: &str, port: Option<u16>) -> Result<Directory, String> {
        let server = server.trim();
        if server.starts_with("http://") || server.starts_with("https://") {
            return BaseUrl::parse(server).map(Directory::Http);
        }
        if server.is_empty() || server.contains('/') {
            return Err(format!(
                "L-Bone {server:?}: give a host (with LBONE_PORT) or an http(s)://host:port URL"
            ));
        }
        match server.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => {
                let p = p
                    .parse()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| format!("L-Bone {server:?}: bad port"))?;
                if h.is_empty() {
                    return Err(format!("L-Bone {server:?}: no host"));
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
    pub async fn depots(&self, q: &DepotQuery, timeout: Duration) -> Result<Vec<String>, String> {
        self.depots_from(q, timeout).await.map(|(v, _)| v)
    }

    /// Ranked depots for `q`, and the L-Bone that named them (of a list,
    /// the one that answered: where to report rates to).
    pub async fn depots_from(
        &self,
        q: &DepotQuery,
        timeout: Duration,
    ) -> Result<(Vec<String>, Directory), String> {
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
    async fn depots_one(&self, q: &DepotQuery, timeout: Duration) -> Result<Vec<String>, String> {
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
            Directory::Any(_) => return Err("a list of L-Bones inside a list".into()),
        };
        let req = LegacyRequest::Depots {
            count: q.count,
            hard_mb: q.hard.div_ceil(1 << 20),
            soft_mb: 0,
            duration: q.duration,
            location: q.location.clone(),
        };
        let work = async {
            let mut s = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| format!("connecting to L-Bone {host}:{port}: {e}"))?;
            s.write_all(&legacy::encode_request(&req))
                .await
                .map_err(|e| e.to_string())?;
            let mut reply = Vec::new();
            // At most 10,000 depots of 266 bytes each.
            (&mut s)
                .take(20 + 10_000 * 266)
                .read_to_end(&mut reply)
                .await
                .map_err(|e| e.to_string())?;
            legacy::parse_depots_reply(&reply).map_err(|e| e.to_string())
        };
        let list = tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| format!("L-Bone {host}:{port} did not answer within {timeout:?}"))??;
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
    ) -> Result<Vec<DepotView>, String> {
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
    ) -> Result<Vec<DepotView>, String> {
        let Directory::Http(base) = self else {
            return Err("the legacy L-Bone protocol returns addresses only".into());
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
        let (status, body) = http::fetch(base, "GET", &path, None, None, timeout)
            .await
            .map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!(
                "L-Bone answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        // Not `deny_unknown_fields`: the answer also carries `now` and
        // `offline_after`, and newer servers may add more.
        #[derive(serde::Deserialize)]
        struct Answer {
            depots: Vec<DepotView>,
        }
        let a: Answer = serde_json::from_slice(&body)
            .map_err(|e| format!("L-Bone answer is not a depot list: {e}"))?;
        Ok(a.depots)
    }

    /// Reports measured rates (HTTP API only; the legacy protocol has no
    /// such message, so this is a no-op there).
    pub async fn report(&self, rates: Vec<RateReport>, timeout: Duration) -> Result<(), String> {
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
    async fn report_one(&self, rates: Vec<RateReport>, timeout: Duration) -> Result<(), String> {
        let Directory::Http(base) = self else {
            return Ok(());
        };
        let body = serde_json::to_vec(&RateReports { rates }).map_err(|e| e.to_string())?;
        let (status, resp) = http::fetch(base, "POST", "/api/v1/rates", None, Some(&body), timeout)
            .await
            .map_err(|e| e.to_string())?;
        if status == 200 {
            Ok(())
        } else {
            Err(format!(
                "L-Bone answered {status}: {}",
                String::from_utf8_lossy(&resp)
            ))
        }
    }
}

/// Percent-encodes a query component.
pub fn encode_component(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// Registers (or heartbeats) once. Errors say what to fix.
pub async fn register(
    base: &BaseUrl,
    token: &str,
    reg: &Registration,
    timeout: Duration,
) -> Result<(), String> {
    let body = serde_json::to_vec(reg).map_err(|e| e.to_string())?;
    post_with_token(base, "/api/v1/register", token, &body, timeout).await
}

/// Takes a depot out of the directory at once (a clean stop), instead of
/// leaving it listed until its heartbeats are missed.
pub async fn deregister(
    base: &BaseUrl,
    token: &str,
    depot: &crate::model::Departure,
    timeout: Duration,
) -> Result<(), String> {
    let body = serde_json::to_vec(depot).map_err(|e| e.to_string())?;
    post_with_token(base, "/api/v1/deregister", token, &body, timeout).await
}

/// What [`register`] and [`deregister`] say when the L-Bone refuses the
/// token: a setting to fix, not a failure to wait out.
pub const TOKEN_REFUSED: &str = "the L-Bone refused the registration token";

async fn post_with_token(
    base: &BaseUrl,
    path: &str,
    token: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(), String> {
    let (status, resp) = http::fetch(base, "POST", path, Some(token), Some(body), timeout)
        .await
        .map_err(|e| e.to_string())?;
    match status {
        200 => Ok(()),
        401 => Err(TOKEN_REFUSED.into()),
        _ => Err(format!(
            "the L-Bone answered {status}: {}",
            String::from_utf8_lossy(&resp)
        )),
    }
}

/// Registers (or heartbeats, or with `leave` deregisters) with the first
/// of `bases`, in order from `from`, that takes it; returns which did. With
/// several, each has at most five seconds: a hung instance must not cost
/// the whole heartbeat. Fails with [`TOKEN_REFUSED`] when every one refused
/// the token, else with every failure.
pub async fn register_first(
    bases: &[BaseUrl],
    from: usize,
    token: &str,
    body: &Announcement<'_>,
    timeout: Duration,
) -> Result<usize, String> {
    let each = if bases.len() > 1 {
        timeout.min(Duration::from_secs(5))
    } else {
        timeout
    };
    let mut failures = Vec::new();
    let mut refused = 0;
    for k in 0..bases.len() {
        let i = (from + k) % bases.len();
        let r = match body {
            Announcement::Here(reg) => register(&bases[i], token, reg, each).await,
            Announcement::Leaving(d) => deregister(&bases[i], token, d, each).await,
        };
        match r {
            Ok(()) => return Ok(i),
            Err(e) => {
                refused += usize::from(e == TOKEN_REFUSED);
                failures.push(format!("{}: {e}", bases[i]));
            }
        }
    }
    if refused == bases.len() {
        return Err(TOKEN_REFUSED.into());
    }
    Err(failures.join("; "))
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
