//! Choosing and ordering depots for a client.
//!
//! A depot qualifies when one of its resources has the hard and soft space,
//! the lease length and the allocation type asked for. Qualifying depots are
//! ordered by, in turn:
//!
//! 1. online before offline (offline = no heartbeat within the window);
//! 2. reachable before unreachable (a forecast under 5% of the best one —
//!    clients report 0 for depots they could not reach);
//! 3. more location-hint terms matched (`city= Brno country= CZ`);
//! 4. great-circle distance from the query's point, in 250 km bands (the point
//!    is given as `near`, or is the centre of the depots the hint matches);
//!    depots without coordinates after those with;
//! 5. forecast bandwidth for the client's network, highest first (no forecast
//!    counts as the average of the known ones);
//! 6. free hard space, then the address, so the order is stable.

use std::collections::HashMap;

use crate::model::{DepotRecord, DepotView, Registration};

/// Sort key: offline, unreachable, hint matches, distance band, forecast,
/// free hard space (see the module doc for the directions).
type Key = (bool, bool, usize, u64, f64, u64);

/// A depot as ranked: its key, index in the listing, distance, forecast and
/// heartbeat age.
type Keyed = (Key, usize, Option<f64>, Option<f64>, i64);

/// Earth's mean radius, km.
const EARTH_KM: f64 = 6371.0;
/// Width of a distance band, km.
const BAND_KM: f64 = 250.0;

/// What a client asks for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Query {
    /// Depots wanted; 0 = every match.
    pub count: usize,
    /// Hard bytes needed on one resource.
    pub hard: u64,
    /// Soft bytes needed on one resource.
    pub soft: u64,
    /// Lease seconds needed.
    pub duration: u64,
    /// Allocation type needed (`byte_array`, …).
    pub alloc_type: Option<String>,
    /// Location hint terms, `(key, value)`.
    pub hint: Vec<(String, String)>,
    /// Reference point (latitude, longitude).
    pub near: Option<(f64, f64)>,
    /// Also list offline depots (at the end).
    pub include_offline: bool,
}

/// Hint keys understood (the LoRS ones plus `tag`).
pub const HINT_KEYS: [&str; 7] = [
    "city", "state", "country", "zip", "airport", "hostname", "tag",
];

/// Parses a LoRS location hint: `key= value` terms, values may hold spaces
/// (`city= New York state= NY`). Unknown keys are an error naming them.
///
/// ```
/// let h = lors_lbone::rank::parse_hint("city= New York state=NY").unwrap();
/// assert_eq!(h, [("city".into(), "New York".into()), ("state".into(), "NY".into())]);
/// ```
pub fn parse_hint(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for tok in s.split_whitespace() {
        if let Some((k, v)) = tok.split_once('=') {
            let k = k.to_ascii_lowercase();
            if !HINT_KEYS.contains(&k.as_str()) {
                return Err(format!(
                    "unknown location key {k:?} (use {})",
                    HINT_KEYS.join("=, ") + "="
                ));
            }
            out.push((k, v.to_owned()));
        } else if let Some(last) = out.last_mut() {
            if !last.1.is_empty() {
                last.1.push(' ');
            }
            last.1.push_str(tok);
        } else if s.trim() != "NULL" {
            return Err(format!("location hint {s:?}: expected key= value terms"));
        }
    }
    out.retain(|(_, v)| !v.is_empty());
    Ok(out)
}

/// Great-circle distance in km (haversine).
pub fn distance_km(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (la1, lo1) = (a.0.to_radians(), a.1.to_radians());
    let (la2, lo2) = (b.0.to_radians(), b.1.to_radians());
    let h = ((la2 - la1) / 2.0).sin().powi(2)
        + la1.cos() * la2.cos() * ((lo2 - lo1) / 2.0).sin().powi(2);
    2.0 * EARTH_KM * h.sqrt().min(1.0).asin()
}

fn eq(a: &Option<String>, b: &str) -> bool {
    a.as_deref().is_some_and(|a| a.eq_ignore_ascii_case(b))
}

/// How many hint terms a depot matches.
pub fn hint_matches(reg: &Registration, hint: &[(String, String)]) -> usize {
    let l = &reg.location;
    hint.iter()
        .filter(|(k, v)| match k.as_str() {
            "city" => eq(&l.city, v),
            "state" => eq(&l.state, v),
            "country" => eq(&l.country, v),
            "zip" => eq(&l.zip, v),
            "airport" => eq(&l.airport, v),
            "hostname" => reg.host.eq_ignore_ascii_case(v),
            "tag" => l.tags.iter().any(|t| t.eq_ignore_ascii_case(v)),
            _ => false,
        })
        .count()
}

/// Whether one resource can hold what `q` asks for.
pub fn fits(reg: &Registration, q: &Query) -> bool {
    reg.resources.iter().any(|r| {
        r.hard_free >= q.hard
            && r.soft_free >= q.soft
            && r.max_duration >= q.duration
            && q.alloc_type
                .as_ref()
                .is_none_or(|t| r.types.is_empty() || r.types.iter().any(|x| x == t))
    })
}

/// The depots of a listing by location term (`("city", "brno")`, values
/// in lower case): the depots a hint names are found without reading the
/// others.
#[derive(Debug, Default)]
pub struct Index {
    by_term: HashMap<(&'static str, String), Vec<usize>>,
}

impl Index {
    /// Indexes `depots` (built once per listing read, not per query).
    pub fn build(depots: &[DepotRecord]) -> Index {
        let mut by_term: HashMap<(&'static str, String), Vec<usize>> = HashMap::new();
        for (i, d) in depots.iter().enumerate() {
            let l = &d.reg.location;
            let fields = [
                ("city", l.city.as_deref()),
                ("state", l.state.as_deref()),
                ("country", l.country.as_deref()),
                ("zip", l.zip.as_deref()),
                ("airport", l.airport.as_deref()),
                ("hostname", Some(d.reg.host.as_str())),
            ];
            let tags = l.tags.iter().map(|t| ("tag", Some(t.as_str())));
            for (k, v) in fields.into_iter().chain(tags) {
                if let Some(v) = v {
                    let list = by_term.entry((k, v.to_ascii_lowercase())).or_default();
                    // A depot with a tag twice is listed once.
                    if list.last() != Some(&i) {
                        list.push(i);
                    }
                }
            }
        }
        Index { by_term }
    }

    /// The depots matching every term of `hint` (none for an empty hint).
    fn matching_all(&self, hint: &[(String, String)]) -> Vec<usize> {
        let lists: Option<Vec<&Vec<usize>>> = hint
            .iter()
            .map(|(k, v)| {
                let key = HINT_KEYS.iter().find(|h| **h == k.as_str())?;
                self.by_term.get(&(*key, v.to_ascii_lowercase()))
            })
            .collect();
        let Some(mut lists) = lists.filter(|l| !l.is_empty()) else {
            return Vec::new();
        };
        lists.sort_by_key(|l| l.len());
        let rest = &lists[1..];
        lists[0]
            .iter()
            .copied()
            .filter(|i| rest.iter().all(|l| l.binary_search(i).is_ok()))
            .collect()
    }
}

/// Filters and orders `depots` for `q` (see the module doc).
/// `forecasts` maps `host:port` to forecast bytes/s for the asking client.
pub fn rank(
    depots: &[DepotRecord],
    q: &Query,
    now: i64,
    offline_after: i64,
    forecasts: &HashMap<String, f64>,
) -> Vec<DepotView> {
    rank_indexed(depots, None, q, now, offline_after, forecasts)
}

/// [`rank`], with the listing's [`Index`]: a query for a few depots with a
/// location hint that enough online depots match in full is answered from
/// those alone (every other depot matches fewer terms, so ranks after
/// them); otherwise every depot is read, as without one.
pub fn rank_indexed(
    depots: &[DepotRecord],
    index: Option<&Index>,
    q: &Query,
    now: i64,
    offline_after: i64,
    forecasts: &HashMap<String, f64>,
) -> Vec<DepotView> {
    if let Some(index) = index
        && q.count > 0
        && !q.hint.is_empty()
    {
        let full = index.matching_all(&q.hint);
        if full.len() >= q.count {
            let ranked = Ranking::new(
                depots,
                full.iter().copied(),
                q,
                now,
                offline_after,
                forecasts,
            );
            if ranked.leading() >= q.count {
                return ranked.top(q.count);
            }
        }
    }
    Ranking::new(depots, 0..depots.len(), q, now, offline_after, forecasts).top(q.count)
}

/// The depots of a listing a query may get, keyed.
struct Ranking<'a> {
    depots: &'a [DepotRecord],
    keyed: Vec<Keyed>,
}

impl<'a> Ranking<'a> {
    /// Keys the depots `among` (indices into `depots`) that fit `q`. The
    /// reference point comes from them, so `among` must hold every depot
    /// that matches the hint best.
    fn new(
        depots: &'a [DepotRecord],
        among: impl Iterator<Item = usize> + Clone,
        q: &Query,
        now: i64,
        offline_after: i64,
        forecasts: &HashMap<String, f64>,
    ) -> Ranking<'a> {
        let point = q.near.or_else(|| {
            // The centre of the depots that match the hint best.
            let best = among
                .clone()
                .map(|i| hint_matches(&depots[i].reg, &q.hint))
                .max()
                .filter(|&m| m > 0)?;
            let pts: Vec<(f64, f64)> = among
                .clone()
                .filter(|&i| hint_matches(&depots[i].reg, &q.hint) == best)
                .filter_map(|i| depots[i].reg.location.point())
                .collect();
            (!pts.is_empty()).then(|| {
                let n = pts.len() as f64;
                (
                    pts.iter().map(|p| p.0).sum::<f64>() / n,
                    pts.iter().map(|p| p.1).sum::<f64>() / n,
                )
            })
        });
        let known: Vec<f64> = forecasts.values().copied().collect();
        let best_fc = known.iter().copied().fold(0.0, f64::max);
        let avg_fc = if known.is_empty() {
            0.0
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        };
        // Keys first, views only for the depots kept: with thousands listed
        // and a handful asked for, copying every registration and sorting
        // them all cost a query most of its time.
        let keyed = among
            .filter(|&i| fits(&depots[i].reg, q))
            .filter_map(|i| {
                let d = &depots[i];
                let age = (now - d.last_seen).max(0);
                let online = age <= offline_after;
                if !online && !q.include_offline {
                    return None;
                }
                let forecast = if forecasts.is_empty() {
                    None
                } else {
                    forecasts.get(&d.reg.addr()).copied()
                };
                let distance = point
                    .zip(d.reg.location.point())
                    .map(|(a, b)| distance_km(a, b));
                let unreachable = forecast.is_some_and(|f| f < 0.05 * best_fc || best_fc <= 0.0);
                let key = (
                    !online,
                    unreachable,
                    hint_matches(&d.reg, &q.hint),
                    distance.map_or(u64::MAX, |km| (km / BAND_KM) as u64),
                    forecast.unwrap_or(avg_fc),
                    d.reg.hard_free(),
                );
                Some((key, i, distance, forecast, age))
            })
            .collect();
        Ranking { depots, keyed }
    }

    /// How many are online and reachable: these come before any other.
    fn leading(&self) -> usize {
        self.keyed.iter().filter(|k| !k.0.0 && !k.0.1).count()
    }

    /// The first `count` in order (0: all of them), as views.
    fn top(mut self, count: usize) -> Vec<DepotView> {
        let depots = self.depots;
        let order = |a: &Keyed, b: &Keyed| {
            let (ka, kb) = (&a.0, &b.0);
            ka.0.cmp(&kb.0)
                .then(ka.1.cmp(&kb.1))
                .then(kb.2.cmp(&ka.2))
                .then(ka.3.cmp(&kb.3))
                .then(kb.4.total_cmp(&ka.4))
                .then(kb.5.cmp(&ka.5))
                .then_with(|| depots[a.1].reg.addr().cmp(&depots[b.1].reg.addr()))
        };
        if count > 0 && count < self.keyed.len() {
            self.keyed.select_nth_unstable_by(count - 1, order);
            self.keyed.truncate(count);
        }
        self.keyed.sort_by(order);
        self.keyed
            .into_iter()
            .map(|(key, i, distance, forecast, age)| {
                let d = &depots[i];
                DepotView {
                    addr: d.reg.addr(),
                    online: !key.0,
                    age,
                    depot: d.reg.clone(),
                    distance_km: distance,
                    forecast,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Location, Resource};

    fn depot(host: &str, city: &str, country: &str, pt: (f64, f64), hard_gb: u64) -> DepotRecord {
        DepotRecord {
            reg: Registration {
                host: host.into(),
                port: 6714,
                resources: vec![Resource {
                    rid: "1".into(),
                    hard_free: hard_gb << 30,
                    hard_total: hard_gb << 30,
                    soft_free: hard_gb << 30,
                    soft_total: hard_gb << 30,
                    max_duration: 86400 * 30,
                    types: vec!["byte_array".into()],
                }],
                location: Location {
                    city: Some(city.into()),
                    country: Some(country.into()),
                    latitude: Some(pt.0),
                    longitude: Some(pt.1),
                    ..Location::default()
                },
                version: "t".into(),
            },
            first_seen: 0,
            last_seen: 100,
        }
    }

    fn fleet() -> Vec<DepotRecord> {
        vec![
            depot("brno", "Brno", "CZ", (49.19, 16.61), 10),
            depot("prague", "Prague", "CZ", (50.08, 14.43), 100),
            depot("knoxville", "Knoxville", "US", (35.96, -83.92), 1000),
            depot("vienna", "Vienna", "AT", (48.21, 16.37), 50),
        ]
    }

    fn addrs(v: &[DepotView]) -> Vec<&str> {
        v.iter().map(|d| d.depot.host.as_str()).collect()
    }

    /// Asking for the first few gives exactly the head of the full order,
    /// ties (same key, told apart by address) included.
    #[test]
    fn the_first_few_are_the_head_of_the_whole_order() {
        let mut all = Vec::new();
        for i in 0..300u64 {
            let city = ["Brno", "Prague", "Vienna"][(i % 3) as usize];
            let pt = (48.0 + (i % 7) as f64, 15.0 + (i % 5) as f64);
            let mut d = depot(
                &format!("10.0.{}.{}", i / 10, i % 97),
                city,
                "CZ",
                pt,
                1 + i % 4,
            );
            d.last_seen = if i % 11 == 0 { 0 } else { 100 };
            all.push(d);
        }
        let mut fc = HashMap::new();
        for (i, d) in all.iter().enumerate().step_by(13) {
            fc.insert(d.reg.addr(), (i % 5) as f64 * 1e6);
        }
        let index = Index::build(&all);
        let hints = [
            "city= Brno",
            "city= bRNO country= cz",
            "city= Brno city= Vienna",
            "tag= none",
        ];
        for (near, hint) in [None, Some((49.0, 16.0))]
            .into_iter()
            .flat_map(|n| hints.map(|h| (n, h)))
        {
            for include_offline in [false, true] {
                let q = Query {
                    hint: parse_hint(hint).unwrap(),
                    near,
                    include_offline,
                    ..Query::default()
                };
                let whole: Vec<String> = rank(&all, &q, 100, 50, &fc)
                    .into_iter()
                    .map(|v| v.addr)
                    .collect();
                for count in [1, 7, 8, 100, 299, 1000] {
                    let q = Query { count, ..q.clone() };
                    let head: Vec<String> = rank(&all, &q, 100, 50, &fc)
                        .into_iter()
                        .map(|v| v.addr)
                        .collect();
                    assert_eq!(head, whole[..count.min(whole.len())], "count {count}");
                    let indexed: Vec<String> = rank_indexed(&all, Some(&index), &q, 100, 50, &fc)
                        .into_iter()
                        .map(|v| v.addr)
                        .collect();
                    assert_eq!(indexed, head, "indexed, count {count}");
                }
            }
        }
    }

    #[test]
    fn distances() {
        let d = distance_km((49.19, 16.61), (48.21, 16.37));
        assert!((d - 110.0).abs() < 5.0, "Brno–Vienna {d}");
        let d = distance_km((35.96, -83.92), (49.19, 16.61));
        assert!((7500.0..8000.0).contains(&d), "Knoxville–Brno {d}");
    }

    #[test]
    fn hint_and_proximity_order_then_space() {
        let q = Query {
            hint: parse_hint("city= Brno").unwrap(),
            ..Query::default()
        };
        let v = rank(&fleet(), &q, 100, 60, &HashMap::new());
        // Brno matches the hint; Vienna (110 km) and Prague (185 km) share
        // its first distance band, so more free space goes first; Knoxville
        // is 7,600 km away.
        assert_eq!(addrs(&v), ["brno", "prague", "vienna", "knoxville"]);
        let q = Query {
            near: Some((36.0, -84.0)),
            count: 2,
            ..Query::default()
        };
        assert_eq!(
            addrs(&rank(&fleet(), &q, 100, 60, &HashMap::new())),
            ["knoxville", "prague"]
        );
    }

    #[test]
    fn filters_space_duration_type() {
        let q = Query {
            hard: 60 << 30,
            ..Query::default()
        };
        assert_eq!(
            addrs(&rank(&fleet(), &q, 100, 60, &HashMap::new())),
            ["knoxville", "prague"]
        );
        let q = Query {
            duration: 86400 * 31,
            ..Query::default()
        };
        assert!(rank(&fleet(), &q, 100, 60, &HashMap::new()).is_empty());
        let q = Query {
            alloc_type: Some("fifo".into()),
            ..Query::default()
        };
        assert!(rank(&fleet(), &q, 100, 60, &HashMap::new()).is_empty());
    }

    #[test]
    fn offline_and_unreachable_sink_and_bandwidth_orders() {
        let mut f = fleet();
        f[3].last_seen = 0; // vienna silent for 100 s
        let q = Query {
            include_offline: true,
            ..Query::default()
        };
        let mut fc = HashMap::new();
        fc.insert("brno:6714".to_string(), 100e6);
        fc.insert("prague:6714".to_string(), 10e6);
        fc.insert("knoxville:6714".to_string(), 0.0);
        let v = rank(&f, &q, 100, 60, &fc);
        assert_eq!(addrs(&v), ["brno", "prague", "knoxville", "vienna"]);
        assert!(!v[3].online && v[3].age == 100);
        let q = Query::default();
        assert_eq!(
            rank(&f, &q, 100, 60, &fc).len(),
            3,
            "offline hidden by default"
        );
    }

    #[test]
    fn hints() {
        assert_eq!(parse_hint("NULL").unwrap(), []);
        assert_eq!(parse_hint("").unwrap(), []);
        assert_eq!(
            parse_hint("zip= 37996 state= TN").unwrap(),
            [
                ("zip".into(), "37996".into()),
                ("state".into(), "TN".into())
            ]
        );
        assert!(parse_hint("planet= Mars").unwrap_err().contains("planet"));
        assert!(parse_hint("Brno").is_err());
    }
}
