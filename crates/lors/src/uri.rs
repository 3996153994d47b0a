//! `lors://` URIs ("IBP Deployment Tests and Integration with DiDaS Project" §3.3): an exNode file name plus, optionally, the
//! L-Bone to find depots through and transfer settings.
//!
//! `lors://HOST[:PORT]/PATH?bs=&duration=&copies=&threads=&timeout=` or the
//! short form `lors:///PATH`. As in LoRS `libxio`, the one `/` after the
//! authority is a separator, so `lors:///run42.xnd` names `run42.xnd` in the
//! current directory and `lors:////data/run42.xnd` an absolute path. Numbers
//! without a unit mean what the paper says: `bs` in megabytes (as every block
//! size, see [`parse_block_size`]), `duration` and `timeout` in seconds;
//! `bs=512K` or `duration=2h` spell a unit out.
//!
//! ```
//! use lors::uri::ExnodeRef;
//! let r = ExnodeRef::parse("lors://lbone.example.org/runs/42.xnd?bs=4&copies=2").unwrap();
//! assert_eq!(r.path, std::path::PathBuf::from("runs/42.xnd"));
//! assert_eq!(r.lbone, Some(("lbone.example.org".to_string(), 6767)));
//! assert_eq!(r.block_size, Some(4 << 20));
//! assert_eq!(r.copies, Some(2));
//! // Plain paths are plain paths.
//! assert_eq!(ExnodeRef::parse("42.xnd").unwrap().path, std::path::PathBuf::from("42.xnd"));
//! ```

use std::path::PathBuf;
use std::time::Duration;

use lors_ibp::units::{parse_block_size, parse_duration};

/// The default L-Bone port.
pub const LBONE_PORT: u16 = 6767;

/// An exNode named by a path or a `lors://` URI.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExnodeRef {
    /// The exNode file.
    pub path: PathBuf,
    /// The L-Bone server (`HOST[:PORT]` of the URI).
    pub lbone: Option<(String, u16)>,
    /// `bs=`: block size in bytes.
    pub block_size: Option<u64>,
    /// `duration=`: allocation lease.
    pub duration: Option<Duration>,
    /// `copies=`.
    pub copies: Option<usize>,
    /// `threads=`.
    pub threads: Option<usize>,
    /// `timeout=`.
    pub timeout: Option<Duration>,
    /// `ec=K+M` (`ec=none`: copies): erasure-code new uploads.
    pub ec: Option<Option<lors_exnode::erasure::Scheme>>,
}

/// An erasure code as users write it: `K+M`, or `none` (copies).
pub fn parse_ec(v: &str) -> Result<Option<lors_exnode::erasure::Scheme>, String> {
    if v.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    lors_exnode::erasure::Scheme::parse(v)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// With no unit, a number is `unit` (the paper's units).
fn with_unit(v: &str, unit: &str) -> String {
    if v.bytes().all(|b| b.is_ascii_digit()) {
        format!("{v}{unit}")
    } else {
        v.to_owned()
    }
}

impl ExnodeRef {
    /// Parses a command-line file argument.
    pub fn parse(arg: &str) -> Result<ExnodeRef, String> {
        let Some(rest) = arg.strip_prefix("lors://") else {
            return Ok(ExnodeRef {
                path: arg.into(),
                ..ExnodeRef::default()
            });
        };
        let bad = |why: &str| {
            format!(
                "{arg:?}: {why} (form: lors://[HOST[:PORT]]/PATH[?bs=MB&duration=S&copies=N&ec=K+M&threads=N&timeout=S])"
            )
        };
        let slash = rest.find('/').ok_or_else(|| bad("no path"))?;
        let (authority, rest) = (&rest[..slash], &rest[slash + 1..]);
        let lbone = if authority.is_empty() {
            None
        } else {
            let (host, port) = match authority.rsplit_once(':') {
                Some((h, p)) => (h, p.parse().map_err(|_| bad("bad L-Bone port"))?),
                None => (authority, LBONE_PORT),
            };
            if host.is_empty() {
                return Err(bad("empty L-Bone host"));
            }
            Some((host.to_owned(), port))
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(bad("no path"));
        }
        let mut r = ExnodeRef {
            path: path.into(),
            lbone,
            ..ExnodeRef::default()
        };
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(&format!("{kv:?} is not key=value")))?;
            let num = |v: &str| {
                v.parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(&format!("{k} must be a positive number")))
            };
            match k {
                "bs" => r.block_size = Some(parse_block_size(v).map_err(|e| bad(&e))?),
                "duration" => {
                    r.duration = Some(parse_duration(&with_unit(v, "s")).map_err(|e| bad(&e))?)
                }
                "timeout" => {
                    r.timeout = Some(parse_duration(&with_unit(v, "s")).map_err(|e| bad(&e))?)
                }
                "copies" => r.copies = Some(num(v)?),
                "threads" => r.threads = Some(num(v)?),
                "ec" => r.ec = Some(parse_ec(v).map_err(|e| bad(&e))?),
                other => return Err(bad(&format!("unknown parameter {other:?}"))),
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let r = ExnodeRef::parse("lors:///video.dv.xnd").unwrap();
        assert_eq!(r.path, PathBuf::from("video.dv.xnd"));
        assert_eq!(r.lbone, None);
        let r = ExnodeRef::parse("lors:////abs/x.xnd").unwrap();
        assert_eq!(r.path, PathBuf::from("/abs/x.xnd"));
        let r = ExnodeRef::parse(
            "lors://lb:7000/x.xnd?bs=512K&duration=3600&copies=3&threads=4&timeout=100",
        )
        .unwrap();
        assert_eq!(r.lbone, Some(("lb".into(), 7000)));
        assert_eq!(r.block_size, Some(512 << 10));
        assert_eq!(r.duration, Some(Duration::from_secs(3600)));
        assert_eq!(r.copies, Some(3));
        assert_eq!(r.threads, Some(4));
        assert_eq!(r.timeout, Some(Duration::from_secs(100)));
        let r = ExnodeRef::parse("lors:///x.xnd?duration=2h").unwrap();
        assert_eq!(r.duration, Some(Duration::from_secs(7200)));
    }

    #[test]
    fn mistakes_say_what_is_wrong() {
        for (uri, why) in [
            ("lors://", "no path"),
            ("lors://host", "no path"),
            ("lors:///", "no path"),
            ("lors://h:x/a", "bad L-Bone port"),
            ("lors://:6767/a", "empty L-Bone host"),
            ("lors:///a?bs", "not key=value"),
            ("lors:///a?copies=0", "positive"),
            ("lors:///a?colour=red", "unknown parameter"),
            ("lors:///a?bs=lots", "lots"),
        ] {
            let e = ExnodeRef::parse(uri).unwrap_err();
            assert!(e.contains(why), "{uri}: {e}");
        }
    }
}
