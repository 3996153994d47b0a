//! `~/.xndrc`: the LoRS tools' settings file (ibp-protocol.md §5.3).
//!
//! Whitespace-separated `KEYWORD value…` lines, `#` comments. Settings apply
//! below flags, `lors://` URIs and environment variables (see
//! [`crate::settings`]).
//!
//! ```
//! let x = lors::xndrc::parse("DEPOT d1.example.org 6714\nCOPIES 2\nDURATION 2d\n").unwrap();
//! assert_eq!(x.depots, vec!["d1.example.org:6714"]);
//! assert_eq!(x.copies, Some(2));
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use lors_ibp::units::{parse_block_size, parse_duration};

/// What a `.xndrc` file sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Xndrc {
    /// `DEPOT host port` lines, as `host:port`.
    pub depots: Vec<String>,
    /// `LBONE_SERVER host port` lines, in fail-over order.
    pub lbone_servers: Vec<String>,
    /// `ROUTE_DEPOT`/`TARGET_DEPOT` lines (for route).
    pub route_depots: Vec<String>,
    /// `LOCATION …` hint.
    pub location: Option<String>,
    /// `DURATION` (or `DURATION_DAYS`).
    pub duration: Option<Duration>,
    /// `STORAGE_TYPE`: true = HARD.
    pub hard: Option<bool>,
    /// `DATA_BLOCKSIZE`.
    pub block_size: Option<u64>,
    /// `E2E_BLOCKSIZE`.
    pub e2e_block_size: Option<u64>,
    /// `COPIES` (1–1000).
    pub copies: Option<usize>,
    /// `EC K+M` (or `EC none`): erasure-code uploads instead of copying.
    pub ec: Option<Option<lors_exnode::erasure::Scheme>>,
    /// `THREADS`.
    pub threads: Option<usize>,
    /// `MAXDEPOTS`.
    pub max_depots: Option<usize>,
    /// `TIMEOUT`.
    pub timeout: Option<Duration>,
    /// Lines with a keyword neither we nor the original tools know (a
    /// typo, most likely): `line N: KEYWORD`, for a warning.
    pub unknown: Vec<String>,
}

/// Keywords of the original tools' files that these tools do not use:
/// accepted without a warning.
const THEIRS: [&str; 6] = [
    "VERBOSE",
    "E2E_ORDER",
    "DEMO",
    "FRAGMENTS_PER_FILE",
    "MAX_INTERNAL_BUFFER",
    "RESOLUTION_FILE",
];

/// Most lines a settings file may have (it is ours, but still input).
const MAX_LINES: usize = 10_000;

/// Parses the text of a `.xndrc`. Keywords of the original tools we do not
/// use (`VERBOSE`, `DEMO`, …) are ignored; others we do not know are listed
/// in [`Xndrc::unknown`] for a warning; a known keyword with a bad value is
/// an error naming the line.
pub fn parse(text: &str) -> Result<Xndrc, String> {
    let mut x = Xndrc::default();
    for (n, raw) in text.lines().enumerate().take(MAX_LINES) {
        let line = raw.split('#').next().unwrap_or("").trim();
        let mut f = line.split_whitespace();
        let Some(key) = f.next() else { continue };
        let rest: Vec<&str> = f.collect();
        let bad = |what: &str| format!("line {}: {key}: {what}", n + 1);
        let one = || match rest.as_slice() {
            [v] => Ok(*v),
            [] => Err(bad("missing value")),
            _ => Err(bad("expected one value")),
        };
        let host_port = || match rest.as_slice() {
            [h, p] => p
                .parse::<u16>()
                .map(|p| format!("{h}:{p}"))
                .map_err(|_| bad("port must be a number")),
            [hp] if hp.contains(':') => Ok((*hp).to_owned()),
            _ => Err(bad("expected HOST PORT")),
        };
        match key.to_ascii_uppercase().as_str() {
            "DEPOT" => x.depots.push(host_port()?),
            "LBONE_SERVER" => x.lbone_servers.push(host_port()?),
            "ROUTE_DEPOT" | "TARGET_DEPOT" => x.route_depots.push(host_port()?),
            "LOCATION" => x.location = Some(rest.join(" ")),
            "DURATION" => x.duration = Some(parse_duration(one()?).map_err(|e| bad(&e))?),
            "DURATION_DAYS" => {
                let d: u64 = one()?.parse().map_err(|_| bad("days must be a number"))?;
                x.duration = Some(Duration::from_secs(d.saturating_mul(86_400)));
            }
            "STORAGE_TYPE" => {
                x.hard = Some(match one()?.to_ascii_uppercase().as_str() {
                    "HARD" => true,
                    "SOFT" => false,
                    _ => return Err(bad("use HARD or SOFT")),
                });
            }
            "DATA_BLOCKSIZE" => x.block_size = Some(parse_block_size(one()?).map_err(|e| bad(&e))?),
            "E2E_BLOCKSIZE" => {
                x.e2e_block_size = Some(parse_block_size(one()?).map_err(|e| bad(&e))?)
            }
            "COPIES" => {
                let c: usize = one()?.parse().map_err(|_| bad("must be a number"))?;
                if !(1..=1000).contains(&c) {
                    return Err(bad("must be between 1 and 1000"));
                }
                x.copies = Some(c);
            }
            "EC" => x.ec = Some(crate::uri::parse_ec(one()?).map_err(|e| bad(&e))?),
            "THREADS" => x.threads = Some(one()?.parse().map_err(|_| bad("must be a number"))?),
            "MAXDEPOTS" => {
                x.max_depots = Some(one()?.parse().map_err(|_| bad("must be a number"))?)
            }
            "TIMEOUT" => x.timeout = Some(parse_duration(one()?).map_err(|e| bad(&e))?),
            k if THEIRS.contains(&k) => {}
            _ => x.unknown.push(format!("line {}: {key}", n + 1)),
        }
    }
    Ok(x)
}

/// The settings file to read: `explicit`, else `$HOME/.xndrc`.
pub fn default_path(explicit: Option<&Path>) -> Option<PathBuf> {
    explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".xndrc")))
}

/// Reads the settings file. A missing default file is fine (`Ok(default)`);
/// a missing explicit one, or a malformed one, is an error.
pub fn load(explicit: Option<&Path>) -> Result<Xndrc, String> {
    let Some(path) = default_path(explicit) else {
        return Ok(Xndrc::default());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
            Ok(Xndrc::default())
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keywords_are_named_by_line() {
        let x = parse("COPIES 2\nCOPIESS 3\n# DEPOTT in a comment\nTIMOUT 30\n").unwrap();
        assert_eq!(x.unknown, ["line 2: COPIESS", "line 4: TIMOUT"]);
        assert_eq!(x.copies, Some(2));
    }

    #[test]
    fn reads_what_lors_setup_writes() {
        let x = parse(
            "# written by lors_setup.sh\nLBONE_SERVER lbone.example.org 6767\nDEPOT d1 6714\nDEPOT d2:6715\n\
             LOCATION zip= 37996 state= TN\nDURATION_DAYS 2\nSTORAGE_TYPE soft\nDATA_BLOCKSIZE 5M\n\
             E2E_BLOCKSIZE 1M\nCOPIES 3\nTHREADS 8\nMAXDEPOTS 4\nTIMEOUT 600s\nVERBOSE 1\nE2E_ORDER none\n",
        )
        .unwrap();
        assert_eq!(x.depots, ["d1:6714", "d2:6715"]);
        assert!(
            x.unknown.is_empty(),
            "the original tools' keywords: {:?}",
            x.unknown
        );
        assert_eq!(x.lbone_servers, ["lbone.example.org:6767"]);
        assert_eq!(x.location.as_deref(), Some("zip= 37996 state= TN"));
        assert_eq!(x.duration, Some(Duration::from_secs(2 * 86_400)));
        assert_eq!(x.hard, Some(false));
        assert_eq!(
            (x.block_size, x.e2e_block_size),
            (Some(5 << 20), Some(1 << 20))
        );
        assert_eq!(
            (x.copies, x.threads, x.max_depots),
            (Some(3), Some(8), Some(4))
        );
        assert_eq!(x.timeout, Some(Duration::from_secs(600)));
    }

    #[test]
    fn bad_values_name_their_line() {
        let e = parse("COPIES 2\nCOPIES lots\n").unwrap_err();
        assert!(e.starts_with("line 2: COPIES"), "{e}");
        assert!(parse("DEPOT hostonly").is_err());
        assert!(parse("COPIES 0").is_err());
        assert!(parse("DATA_BLOCKSIZE 5 parsecs").is_err());
    }
}
