//! The HTTP API's query strings: `GET /api/v1/depots?count=8&hard=1G&…`
//! decoded into a ranking [`Query`]. Strict: an unknown parameter or a bad
//! value is an error naming it, never ignored.

use crate::rank::{self, Query};

/// Longest query string read.
pub const MAX_QUERY: usize = 4096;

/// Why a query string is refused (answered 400 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// Longer than [`MAX_QUERY`].
    #[error("the query is longer than {MAX_QUERY} bytes")]
    TooLong,
    /// A `%` not followed by two hex digits.
    #[error("bad percent escape")]
    BadEscape,
    /// Decoded bytes that are not UTF-8.
    #[error("not UTF-8")]
    NotUtf8,
    /// A parameter the API does not have (never ignored).
    #[error("unknown parameter {0:?}")]
    Unknown(String),
    /// A parameter whose value cannot be read.
    #[error("{param}: {why}")]
    BadValue {
        /// The parameter.
        param: &'static str,
        /// What is wrong with its value.
        why: String,
    },
    /// `lat` without `lon` (or the other way), or out of range.
    #[error("lat and lon go together, within ±90 / ±180")]
    LatLon,
}

/// Decodes `%XX` (and `+` as space when `plus`). Stricter than the
/// decoder under it: a `%` not followed by two hex digits is an error, not
/// kept as it is.
pub fn percent_decode(s: &str, plus: bool) -> Result<String, QueryError> {
    let b = s.as_bytes();
    let escapes_ok = (b.iter().enumerate())
        .filter(|&(_, &c)| c == b'%')
        .all(|(i, _)| {
            b.get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        });
    if !escapes_ok {
        return Err(QueryError::BadEscape);
    }
    let spaced;
    let s = if plus && s.contains('+') {
        spaced = s.replace('+', " ");
        &spaced
    } else {
        s
    };
    (percent_encoding::percent_decode_str(s).decode_utf8())
        .map(|d| d.into_owned())
        .map_err(|_| QueryError::NotUtf8)
}

/// A query string's parameters, decoded, in order.
///
/// ```
/// use lors_lbone::api::params;
/// assert_eq!(params("location=city%3D+Brno&count=2").unwrap(),
///            [("location".to_owned(), "city= Brno".to_owned()), ("count".to_owned(), "2".to_owned())]);
/// assert!(params("a=%zz").is_err());
/// ```
pub fn params(raw: &str) -> Result<Vec<(String, String)>, QueryError> {
    if raw.len() > MAX_QUERY {
        return Err(QueryError::TooLong);
    }
    raw.split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Ok((percent_decode(k, true)?, percent_decode(v, true)?))
        })
        .collect()
}

/// The ranking query the parameters ask for.
pub fn query_from(params: &[(String, String)]) -> Result<Query, QueryError> {
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let bad = |param: &'static str, why: String| QueryError::BadValue { param, why };
    let size = |k: &'static str| -> Result<u64, QueryError> {
        param(k).map_or(Ok(0), |v| {
            lors_ibp::units::parse_size(v).map_err(|e| bad(k, e))
        })
    };
    let float = |k: &'static str| -> Result<Option<f64>, QueryError> {
        param(k)
            .map(|v| v.parse::<f64>().map_err(|_| bad(k, "not a number".into())))
            .transpose()
    };
    let near = match (float("lat")?, float("lon")?) {
        (Some(a), Some(b)) if (-90.0..=90.0).contains(&a) && (-180.0..=180.0).contains(&b) => {
            Some((a, b))
        }
        (None, None) => None,
        _ => return Err(QueryError::LatLon),
    };
    const KNOWN: [&str; 9] = [
        "count", "hard", "soft", "duration", "type", "location", "lat", "lon", "all",
    ];
    if let Some((k, _)) = params.iter().find(|(k, _)| !KNOWN.contains(&k.as_str())) {
        return Err(QueryError::Unknown(k.clone()));
    }
    Ok(Query {
        count: param("count").map_or(Ok(0), |v| {
            v.parse().map_err(|_| bad("count", "not a number".into()))
        })?,
        hard: size("hard")?,
        soft: size("soft")?,
        duration: param("duration").map_or(Ok(0), |v| {
            lors_ibp::units::parse_duration(v)
                .map(|d| d.as_secs())
                .map_err(|e| bad("duration", e))
        })?,
        alloc_type: param("type").map(str::to_owned),
        hint: rank::parse_hint(param("location").unwrap_or("")).map_err(|e| bad("location", e))?,
        near,
        include_offline: param("all").is_some_and(|v| v == "1" || v == "true"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        let q =
            query_from(&params("count=2&hard=1G&location=city%3DBrno&lat=49.2&lon=16.6").unwrap())
                .unwrap();
        assert_eq!(q.count, 2);
        assert_eq!(q.hard, 1 << 30);
        assert_eq!(q.near, Some((49.2, 16.6)));
        for bad in [
            "colour=red",
            "count=x",
            "lat=1",
            "lat=91&lon=0",
            "hard=lots",
            "duration=-1",
        ] {
            assert!(query_from(&params(bad).unwrap()).is_err(), "{bad}");
        }
        assert!(params(&"a".repeat(MAX_QUERY + 1)).is_err());
        for bad in ["a=%", "a=%4", "a=%g0", "%zz=1"] {
            assert_eq!(params(bad), Err(QueryError::BadEscape), "{bad}");
        }
        assert_eq!(params("a=%ff"), Err(QueryError::NotUtf8));
        assert_eq!(params("a=%2B+b").unwrap()[0].1, "+ b");
    }
}
