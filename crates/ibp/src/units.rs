//! Sizes, durations and times as people write and read them: `10M`,
//! `1.5G`, `90s`, `30d` parsed; bytes and seconds printed; the Unix clock.
//! Binary multiples, as LoRS's `-b 5M` meant.

use std::fmt;
use std::time::{Duration, SystemTime};

/// Seconds since the Unix epoch now (0 on a clock set before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Bytes for people, in binary units: `{}` gives one decimal (`1.5 MiB`,
/// `512.0 KiB`, `100 B`), the steady width a progress line wants; `{:#}`
/// drops a zero fraction (`1 GiB`, `1.5 MiB`), as a report's prose wants.
///
/// ```
/// use lors_ibp::units::Bytes;
/// assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
/// assert_eq!(Bytes(1 << 30).to_string(), "1.0 GiB");
/// assert_eq!(format!("{:#}", Bytes(1 << 30)), "1 GiB");
/// assert_eq!(format!("{:#}", Bytes(100)), "100 B");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else if f.alternate() {
            let n = format!("{v:.3}");
            write!(
                f,
                "{} {}",
                n.trim_end_matches('0').trim_end_matches('.'),
                UNITS[u]
            )
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

/// A span of seconds for people, in its two largest units: `2d 3h`,
/// `3h 5m`, `4m 10s`, `9s`.
///
/// ```
/// use lors_ibp::units::Secs;
/// assert_eq!(Secs(93_784).to_string(), "1d 2h");
/// assert_eq!(Secs(250).to_string(), "4m 10s");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secs(pub u64);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        match (s / 86_400, s / 3600 % 24, s / 60 % 60) {
            (0, 0, 0) => write!(f, "{s}s"),
            (0, 0, m) => write!(f, "{m}m {}s", s % 60),
            (0, h, m) => write!(f, "{h}h {m}m"),
            (d, h, _) => write!(f, "{d}d {h}h"),
        }
    }
}

/// Parses `10`, `10K`, `10KiB`, `1.5G` (binary multiples, as LoRS's `-b 5M`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("unknown size unit in {s:?} (use K, M, G or T)")),
    };
    let bytes = if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
        let b = v * mult as f64;
        if !(0.0..1.8e19).contains(&b) {
            return Err(format!("size {s:?} out of range"));
        }
        b as u64
    } else {
        let v: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
        v.checked_mul(mult)
            .ok_or_else(|| format!("size {s:?} out of range"))?
    };
    Ok(bytes)
}

/// Largest bare number [`parse_block_size`] takes, in megabytes.
pub const BARE_BLOCK_MAX_MB: u64 = 4096;

/// Parses a block size: as [`parse_size`], except that a bare number means
/// megabytes, as `bs=` and `LORS_BLOCKSIZE` do in the LoRS paper — the same
/// in `-b`, `lors://…?bs=`, the environment and `~/.xndrc`, so `-b 10` is
/// 10 MiB wherever it is written. A bare number above
/// [`BARE_BLOCK_MAX_MB`] is refused rather than guessed at: it is almost
/// certainly bytes, and `B` says so.
///
/// ```
/// use lors_ibp::units::parse_block_size;
/// assert_eq!(parse_block_size("10"), Ok(10 << 20));
/// assert_eq!(parse_block_size("512K"), Ok(512 << 10));
/// assert_eq!(parse_block_size("65536B"), Ok(65536));
/// assert!(parse_block_size("1048576").unwrap_err().contains("1048576B"));
/// ```
pub fn parse_block_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let mb: u64 = t.parse().map_err(|_| format!("bad size {s:?}"))?;
        if mb > BARE_BLOCK_MAX_MB {
            return Err(format!(
                "a block size without a unit is megabytes, and {mb} MiB is surely not meant: \
                 write {mb}B for bytes, or use K, M or G"
            ));
        }
        return Ok(mb << 20);
    }
    parse_size(t)
}

/// [`parse_size`] for a size that cannot be zero (a memory bound, a file
/// size to predict for).
pub fn parse_nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("give at least 1 byte (0 would mean nothing to do)".into()),
        n => Ok(n),
    }
}

/// Parses `3600`, `90s`, `30m`, `12h`, `30d`, `2w`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: u64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let mult = match unit.trim() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(format!(
                "unknown duration unit in {s:?} (use s, m, h, d or w)"
            ));
        }
    };
    v.checked_mul(mult)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("duration {s:?} out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse_with_units() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("1.5 KiB"), Ok(1536));
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("2 fortnights").is_err());
    }
}
