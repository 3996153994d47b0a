//! Where depots come from, for every command that places data: depots
//! named outright, else the L-Bone named (`-H`, `LBONE_SERVER`, a
//! `lors://HOST` URI), else the `DEPOT` lines of `~/.xndrc`, else its
//! `LBONE_SERVER` lines tried in order (fail-over: the first that answers;
//! see [`Directory::Any`]). `-H` and `LBONE_SERVER` may name several too.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lors::directory::DirectoryError> {
//! use lors::directory::{find_depots, Wanted};
//! let rc = lors::xndrc::parse("LBONE_SERVER lbone.example.org 6767\n").unwrap();
//! let want = Wanted {
//!     count: 4,
//!     bytes: 10 << 20,
//!     secs: 86_400,
//!     location: String::new(),
//!     exclude: vec![],
//! };
//! let found = find_depots(&[], None, &rc, &want).await?;
//! println!("{:?} from {:?}", found.depots, found.directory);
//! # Ok(()) }
//! ```

use std::collections::HashSet;
use std::time::Duration;

use lors_exnode::ExNode;

use lors_lbone::client::{DepotQuery, Directory};

use crate::xndrc::Xndrc;

/// How long an L-Bone has to answer a depot query.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the depots must offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// How many depots to ask an L-Bone for.
    pub count: usize,
    /// Bytes per allocation.
    pub bytes: u64,
    /// Lease, in seconds.
    pub secs: u64,
    /// Location hint (`city= Brno`); empty for none.
    pub location: String,
    /// Depots not to count (they already hold the data): an L-Bone is asked
    /// for that many more, and they are left out of its answer.
    pub exclude: Vec<String>,
}

/// The depots found, and the L-Bone that named them (to report rates to).
#[derive(Debug, Clone)]
pub struct Found {
    /// `host:port` of each depot, best first.
    pub depots: Vec<String>,
    /// The L-Bone asked, if one was.
    pub directory: Option<Directory>,
}

/// Why no depots were found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirectoryError {
    /// Nothing names a depot or an L-Bone.
    #[error("no depots given and no L-Bone to ask")]
    NoSource,
    /// An `LBONE_SERVER` line of `~/.xndrc` is malformed.
    #[error("~/.xndrc: {0}")]
    BadServer(lors_lbone::client::Error),
    /// Every L-Bone asked failed; the last one's failure.
    #[error("asking the L-Bone for depots: {0}")]
    Lbone(lors_lbone::client::Error),
    /// The L-Bone answered but named no depot that fits.
    #[error(
        "asking the L-Bone for depots: it lists no online depot with {bytes} bytes for {secs} s{}",
        if near.is_empty() { String::new() } else { format!(" near {near:?}") }
    )]
    NoneFits {
        /// Bytes asked for.
        bytes: u64,
        /// Lease asked for, seconds.
        secs: u64,
        /// The location hint, if any.
        near: String,
    },
}

/// Finds depots in the order the [module docs](self) give. `named` is an
/// L-Bone the caller was told to use; it wins over `~/.xndrc`.
pub async fn find_depots(
    explicit: &[String],
    named: Option<Directory>,
    rc: &Xndrc,
    want: &Wanted,
) -> Result<Found, DirectoryError> {
    if !explicit.is_empty() {
        return Ok(Found {
            depots: explicit.to_vec(),
            directory: named,
        });
    }
    if named.is_none() && !rc.depots.is_empty() {
        return Ok(Found {
            depots: rc.depots.clone(),
            directory: None,
        });
    }
    // The file's lines are one list: tried in order, the next asked at once
    // when one is down and beside it when one is slow to answer.
    let candidates = match named {
        Some(d) => vec![d],
        None => {
            let mut list: Vec<Directory> = rc
                .lbone_servers
                .iter()
                .map(|s| Directory::parse(s, None).map_err(DirectoryError::BadServer))
                .collect::<Result<_, _>>()?;
            if list.len() > 1 {
                list = vec![Directory::Any(list)];
            }
            list
        }
    };
    let q = DepotQuery {
        count: want.count + want.exclude.len(),
        hard: want.bytes,
        duration: want.secs,
        location: want.location.clone(),
    };
    let mut last = DirectoryError::NoSource;
    for d in candidates {
        // Settled once, and of a list the one that answered: the rate
        // report after the transfer goes to it.
        let answer = d.depots_from(&q, QUERY_TIMEOUT).await.map(|(list, who)| {
            let mut list: Vec<String> = list
                .into_iter()
                .filter(|a| !want.exclude.contains(a))
                .collect();
            list.truncate(want.count);
            (list, who)
        });
        match answer {
            Ok((list, who)) if !list.is_empty() => {
                return Ok(Found {
                    depots: list,
                    directory: Some(who),
                });
            }
            Ok(_) => {
                last = DirectoryError::NoneFits {
                    bytes: want.bytes,
                    secs: want.secs,
                    near: want.location.clone(),
                };
            }
            Err(e) => {
                // The error returned says it; a list's failover says
                // each instance that failed before one answered.
                tracing::debug!(error = %e, "L-Bone failed");
                last = DirectoryError::Lbone(e);
            }
        }
    }
    Err(last)
}

/// How many depots to ask for: `max_depots` if given; else, with a
/// location hint, just the copies (so the hint decides where the data goes
/// rather than being one preference among four); else 4, for striping.
pub fn depot_count(max_depots: Option<usize>, copies: usize, location: &str) -> usize {
    match max_depots {
        Some(n) => n.max(copies),
        None if !location.trim().is_empty() => copies.max(1),
        None => 4.max(copies),
    }
}

/// The depots of `x` that `dir` does not list as online: a download reads
/// them only when no other replica is left. Without an L-Bone, or when it
/// does not answer (the data may still be reachable), none.
pub async fn last_resort(dir: Option<&Directory>, x: &ExNode) -> HashSet<String> {
    let Some(dir) = dir else {
        return HashSet::new();
    };
    match dir
        .depots(&DepotQuery::default(), Duration::from_secs(10))
        .await
    {
        Ok(online) => x
            .mappings
            .iter()
            .filter_map(lors_exnode::Mapping::depot)
            .filter(|addr| !online.contains(addr))
            .collect(),
        Err(e) => {
            tracing::warn!("L-Bone not consulted: {e}");
            HashSet::new()
        }
    }
}

/// Tells the L-Bone how fast each depot was (best effort: a failure is only
/// logged, the transfer itself succeeded).
pub async fn report_rates(dir: Option<&Directory>, per_depot: &[(String, u64)], elapsed: Duration) {
    let Some(dir) = dir else { return };
    let secs = elapsed.as_secs_f64().max(1e-3);
    let rates = per_depot
        .iter()
        .map(|(d, b)| lors_lbone::model::RateReport {
            depot: d.clone(),
            bytes_per_sec: *b as f64 / secs,
        })
        .collect();
    if let Err(e) = dir.report(rates, Duration::from_secs(10)).await {
        tracing::warn!("could not report rates to the L-Bone: {e}");
    }
}

/// A depot as a user names it (`--depot`, `depots=` of the Python
/// package): `HOST:PORT`, or a bare `HOST` (an IPv6 address with or without
/// brackets) on the IBP port 6714; `host:port` as the tools use it.
///
/// ```
/// use lors::directory::depot_address;
/// assert_eq!(depot_address("d1").unwrap(), "d1:6714");
/// assert_eq!(depot_address("::1").unwrap(), "[::1]:6714");
/// assert!(depot_address("d1:0").is_err());
/// ```
pub fn depot_address(s: &str) -> Result<String, String> {
    let s = s.trim();
    let bad = || format!("{s:?}: give HOST or HOST:PORT (IPv6 as [ADDR]:PORT)");
    let with_port = |host: &str, port: &str| -> Result<String, String> {
        let port: u16 = port.parse().map_err(|_| bad())?;
        (!host.is_empty() && port != 0)
            .then(|| format!("{host}:{port}"))
            .ok_or_else(bad)
    };
    let default = lors_ibp::DEFAULT_DEPOT_PORT.to_string();
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after {
            "" => default.as_str(),
            p => p.strip_prefix(':').ok_or_else(bad)?,
        };
        return with_port(&format!("[{addr}]"), port);
    }
    match s.matches(':').count() {
        0 => with_port(s, &default),
        1 => {
            let (host, port) = s.split_once(':').ok_or_else(bad)?;
            with_port(host, port)
        }
        _ => with_port(&format!("[{s}]"), &default), // a bare IPv6 address
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_hint_decides_placement_unless_told_how_many() {
        assert_eq!(depot_count(None, 1, ""), 4);
        assert_eq!(depot_count(None, 6, ""), 6);
        assert_eq!(depot_count(None, 1, "city= Tokyo"), 1);
        assert_eq!(depot_count(None, 2, "city= Tokyo"), 2);
        assert_eq!(depot_count(Some(8), 2, "city= Tokyo"), 8);
        assert_eq!(depot_count(Some(1), 3, ""), 3);
    }

    #[tokio::test]
    async fn named_depots_win_then_xndrc_depots_then_nothing() {
        let want = Wanted {
            count: 4,
            bytes: 1,
            secs: 1,
            location: String::new(),
            exclude: vec![],
        };
        let rc = crate::xndrc::parse("DEPOT d1 6714\n").unwrap();
        let f = find_depots(&["x:1".into()], None, &rc, &want)
            .await
            .unwrap();
        assert_eq!(f.depots, ["x:1"]);
        let f = find_depots(&[], None, &rc, &want).await.unwrap();
        assert_eq!(f.depots, ["d1:6714"]);
        let none = find_depots(&[], None, &Xndrc::default(), &want).await;
        assert!(matches!(none, Err(DirectoryError::NoSource)));
        let bad = crate::xndrc::Xndrc {
            lbone_servers: vec!["http://".into()],
            ..Xndrc::default()
        };
        let e = find_depots(&[], None, &bad, &want).await;
        assert!(matches!(e, Err(DirectoryError::BadServer(_))), "{e:?}");
    }
}
