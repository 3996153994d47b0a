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

/// Filters and orders `depots` for `q` (see the module doc).
/// `forecasts` maps `host:port` to forecast bytes/s for the asking client.
pub fn rank(
    depots: &[DepotRecord],
    q: &Query,
    now: i64,
    offline_after: i64,
    forecasts: &HashMap<String, f64>,
) -> Vec<DepotView> {
    let point = q.near.or_else(|| {
        // The centre of the depots that match the hint best.
        let best = depots
            .iter()
            .map(|d| hint_matches(&d.reg, &q.hint))
            .max()
            .filter(|&m| m > 0)?;
        let pts: Vec<(f64, f64)> = depots
            .iter()
            .filter(|d| hint_matches(&d.reg, &q.hint) == best)
            .filter_map(|d| d.reg.location.point())
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
    let mut out: Vec<(DepotView, Key)> = depots
        .iter()
        .filter(|d| fits(&d.reg, q))
        .filter_map(|d| {
            let age = (now - d.last_seen).max(0);
            let online = age <= offline_after;
            if !online && !q.include_offline {
                return None;
            }
            let addr = d.reg.addr();
            let forecast = forecasts.get(&addr).copied();
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
            Some((
                DepotView {
                    addr,
                    online,
                    age,
                    depot: d.reg.clone(),
                    distance_km: distance,
                    forecast,
                },
                key,
            ))
        })
        .collect();
    out.sort_by(|(va, a), (vb, b)| {
        a.0.cmp(&b.0)
            .then(a.1.cmp(&b.1))
            .then(b.2.cmp(&a.2))
            .then(a.3.cmp(&b.3))
            .then(b.4.total_cmp(&a.4))
            .then(b.5.cmp(&a.5))
            .then(va.addr.cmp(&vb.addr))
    });
    let mut views: Vec<DepotView> = out.into_iter().map(|(v, _)| v).collect();
    if q.count > 0 {
        views.truncate(q.count);
    }
    views
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
