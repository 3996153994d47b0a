//! The original L-Bone query protocol (port 6767), so the LoRS 0.82 tools
//! find depots through our directory (`docs/lbone.md` §Legacy protocol).
//!
//! A client sends one 512-byte message: the version, right-aligned in 10
//! characters, the request type as a 10-character decimal, then for a depot
//! query (type 1) the number of depots, hard MB, soft MB and duration in
//! seconds (each 10 characters), then the location hint (or `NULL`), zero
//! padded. Type 3 asks for the depot count; type 4 (`%-10s%-10d` + location)
//! for every depot ordered by proximity. The reply is a 10-byte status
//! (`1` = success), a 10-byte count (or error code), then per depot a
//! 256-byte host field and a 10-byte port field. The original client reads
//! only the first 9 bytes of each 10-byte number (`header[9] = '\0'`), so
//! numbers are written left-aligned.

/// Request and reply message size.
pub const MESSAGE_LEN: usize = 512;
/// Host field of a reply entry.
pub const HOST_FIELD: usize = 256;
const FIELD: usize = 10;
/// Longest location string in a type-1 request.
pub const MAX_LOCATION: usize = 452;

/// Request types.
pub const CLIENT_REQUEST: i64 = 1;
/// Depot count.
pub const DEPOT_COUNT: i64 = 3;
/// Proximity list.
pub const PROXIMITY_LIST: i64 = 4;

/// Error codes of the original server (`lbone_base.h`).
pub const UNKNOWN_CLIENT_REQUEST: i32 = -1111;
/// Malformed parameters.
pub const INVALID_PARAMS: i32 = -1114;

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegacyRequest {
    /// Type 1: depots with this much space for this long, near `location`.
    Depots {
        /// Depots wanted.
        count: usize,
        /// Hard (stable) MB.
        hard_mb: u64,
        /// Soft (volatile) MB.
        soft_mb: u64,
        /// Seconds.
        duration: u64,
        /// Location hint, empty for `NULL`.
        location: String,
    },
    /// Type 3: how many depots there are.
    Count,
    /// Type 4: every depot, nearest to `location` first.
    Proximity {
        /// Location hint.
        location: String,
    },
}

/// Why a message was refused (the code goes back to the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} (L-Bone error {code})")]
pub struct LegacyError {
    /// Error code for the reply.
    pub code: i32,
    /// What was wrong.
    pub what: String,
}

fn field(msg: &[u8], at: usize) -> &str {
    let raw = &msg[at..at + FIELD];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(FIELD);
    std::str::from_utf8(&raw[..end]).unwrap_or("").trim()
}

fn number(msg: &[u8], at: usize, name: &str) -> Result<i64, LegacyError> {
    field(msg, at).parse().map_err(|_| LegacyError {
        code: INVALID_PARAMS,
        what: format!("{name} field {:?} is not a number", field(msg, at)),
    })
}

fn text(msg: &[u8], at: usize, max: usize) -> String {
    let raw = &msg[at..(at + max).min(msg.len())];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let s = String::from_utf8_lossy(&raw[..end]).trim().to_owned();
    if s == "NULL" { String::new() } else { s }
}

/// Parses one request message.
///
/// ```
/// use lors_lbone::legacy::{LegacyRequest, encode_request, parse_request};
/// let r = LegacyRequest::Depots { count: 4, hard_mb: 10, soft_mb: 0, duration: 86400, location: "state= TN".into() };
/// assert_eq!(parse_request(&encode_request(&r)).unwrap(), r);
/// ```
pub fn parse_request(msg: &[u8; MESSAGE_LEN]) -> Result<LegacyRequest, LegacyError> {
    let kind = number(msg, FIELD, "request type")?;
    match kind {
        CLIENT_REQUEST => {
            let nonneg = |at, name| {
                let v = number(msg, at, name)?;
                u64::try_from(v).map_err(|_| LegacyError {
                    code: INVALID_PARAMS,
                    what: format!("{name} is negative"),
                })
            };
            let count = nonneg(2 * FIELD, "depot count")?;
            Ok(LegacyRequest::Depots {
                count: usize::try_from(count.min(10_000)).unwrap_or(10_000),
                hard_mb: nonneg(3 * FIELD, "stable size")?,
                soft_mb: nonneg(4 * FIELD, "volatile size")?,
                duration: nonneg(5 * FIELD, "duration")?,
                location: text(msg, 6 * FIELD, MAX_LOCATION),
            })
        }
        DEPOT_COUNT => Ok(LegacyRequest::Count),
        PROXIMITY_LIST => Ok(LegacyRequest::Proximity {
            location: text(msg, 2 * FIELD, MESSAGE_LEN - 2 * FIELD),
        }),
        other => Err(LegacyError {
            code: UNKNOWN_CLIENT_REQUEST,
            what: format!("request type {other} is not supported"),
        }),
    }
}

/// Encodes a request as the LoRS client library does.
pub fn encode_request(r: &LegacyRequest) -> [u8; MESSAGE_LEN] {
    let text = match r {
        LegacyRequest::Depots {
            count,
            hard_mb,
            soft_mb,
            duration,
            location,
        } => {
            let loc = if location.is_empty() {
                "NULL"
            } else {
                location
            };
            format!(
                "{:>10}{:>10}{count:>10}{hard_mb:>10}{soft_mb:>10}{duration:>10}{loc}",
                "0.0.1", CLIENT_REQUEST
            )
        }
        LegacyRequest::Count => format!("{:<10}{:<10}", "0.0.1", DEPOT_COUNT),
        LegacyRequest::Proximity { location } => {
            format!("{:<10}{:<10}{location}", "0.0.1", PROXIMITY_LIST)
        }
    };
    let mut msg = [0u8; MESSAGE_LEN];
    let n = text.len().min(MESSAGE_LEN - 1);
    msg[..n].copy_from_slice(&text.as_bytes()[..n]);
    msg
}

fn num_field(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(format!("{v:<10}").as_bytes());
}

/// A success reply listing depots.
pub fn encode_depots(depots: &[(String, u16)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 * FIELD + depots.len() * (HOST_FIELD + FIELD));
    num_field(&mut out, 1);
    num_field(&mut out, depots.len() as i64);
    for (host, port) in depots {
        let mut h = format!("{host:<HOST_FIELD$}").into_bytes();
        h.truncate(HOST_FIELD);
        out.extend_from_slice(&h);
        num_field(&mut out, i64::from(*port));
    }
    out
}

/// A success reply carrying a count.
pub fn encode_count(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 * FIELD);
    num_field(&mut out, 1);
    num_field(&mut out, n as i64);
    out
}

/// An error reply.
pub fn encode_error(code: i32) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 * FIELD);
    num_field(&mut out, 0);
    num_field(&mut out, i64::from(code));
    out
}

/// Reads a 10-byte number the way the C client does: the first 9 bytes.
fn reply_number(f: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(&f[..9]).ok()?;
    s.trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .parse()
        .ok()
}

/// Decodes a reply to a type-1 or type-4 request.
pub fn parse_depots_reply(reply: &[u8]) -> Result<Vec<(String, u16)>, LegacyError> {
    let bad = |what: &str| LegacyError {
        code: 0,
        what: what.to_owned(),
    };
    if reply.len() < 2 * FIELD {
        return Err(bad("reply shorter than its header"));
    }
    let status = reply_number(&reply[..FIELD]).ok_or_else(|| bad("bad status field"))?;
    let second = reply_number(&reply[FIELD..2 * FIELD]).ok_or_else(|| bad("bad count field"))?;
    if status != 1 {
        return Err(LegacyError {
            code: i32::try_from(second).unwrap_or(0),
            what: "the L-Bone refused the query".into(),
        });
    }
    let n = usize::try_from(second).map_err(|_| bad("negative count"))?;
    let body = &reply[2 * FIELD..];
    if body.len() != n * (HOST_FIELD + FIELD) {
        return Err(bad("reply length does not match its count"));
    }
    body.chunks(HOST_FIELD + FIELD)
        .map(|e| {
            let host = std::str::from_utf8(&e[..HOST_FIELD])
                .map_err(|_| bad("host is not text"))?
                .split([' ', '\0'])
                .next()
                .unwrap_or("")
                .to_owned();
            let port = reply_number(&e[HOST_FIELD..])
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| bad("bad port"))?;
            Ok((host, port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_layout_is_the_c_sprintf() {
        let m = encode_request(&LegacyRequest::Depots {
            count: 3,
            hard_mb: 100,
            soft_mb: 0,
            duration: 86400,
            location: String::new(),
        });
        assert_eq!(
            &m[..64],
            b"     0.0.1         1         3       100         0     86400NULL"
        );
        assert!(m[64..].iter().all(|&b| b == 0));
    }

    #[test]
    fn replies_parse_like_the_c_client() {
        let r = encode_depots(&[
            ("depot1.example.org".into(), 6714),
            ("10.0.0.2".into(), 7000),
        ]);
        assert_eq!(&r[..20], b"1         2         ");
        assert_eq!(r.len(), 20 + 2 * 266);
        assert_eq!(
            parse_depots_reply(&r).unwrap(),
            [
                ("depot1.example.org".to_string(), 6714),
                ("10.0.0.2".to_string(), 7000)
            ]
        );
        let e = parse_depots_reply(&encode_error(UNKNOWN_CLIENT_REQUEST)).unwrap_err();
        assert_eq!(e.code, UNKNOWN_CLIENT_REQUEST);
        assert_eq!(&encode_count(7)[..], b"1         7         ");
    }

    #[test]
    fn bad_requests_get_codes() {
        let mut m = [0u8; MESSAGE_LEN];
        m[..20].copy_from_slice(b"     0.0.1         9");
        assert_eq!(parse_request(&m).unwrap_err().code, UNKNOWN_CLIENT_REQUEST);
        m[..20].copy_from_slice(b"     0.0.1      junk");
        assert_eq!(parse_request(&m).unwrap_err().code, INVALID_PARAMS);
        let mut m = encode_request(&LegacyRequest::Depots {
            count: 1,
            hard_mb: 1,
            soft_mb: 0,
            duration: 1,
            location: String::new(),
        });
        m[30..40].copy_from_slice(b"       -10");
        assert_eq!(parse_request(&m).unwrap_err().code, INVALID_PARAMS);
        assert_eq!(
            parse_request(&encode_request(&LegacyRequest::Count)).unwrap(),
            LegacyRequest::Count
        );
    }
}
