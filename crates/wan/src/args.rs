//! The command line.

use std::time::Duration;

pub const USAGE: &str = "usage: lors-wan --tap A --tap B [--delay D | --delay-ab D --delay-ba D] [--jitter D] [--loss PCT] [--reorder] [--queue BYTES] [--seed N]
  D: 94ms, 0.5s, 250us; PCT: percent of frames dropped at random, each way";

/// What the wire does.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// The two TAP devices' names.
    pub taps: (String, String),
    /// One-way delay from A to B.
    pub delay_ab: Duration,
    /// One-way delay from B to A.
    pub delay_ba: Duration,
    /// Most extra delay drawn per frame.
    pub jitter: Duration,
    /// Percent of frames lost, each way.
    pub loss: f64,
    /// Let jitter reorder frames.
    pub reorder: bool,
    /// Bytes a direction's queue holds before dropping.
    pub queue: usize,
    /// Seed of the loss and jitter draws.
    pub seed: u64,
}

/// `94ms`, `0.5s`, `250us`, or plain milliseconds.
pub fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "ms"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration"))?;
    let secs = match unit {
        "s" => v,
        "ms" => v / 1e3,
        "us" => v / 1e6,
        _ => return Err(format!("{s:?}: the unit is s, ms or us")),
    };
    if !(0.0..=60.0).contains(&secs) {
        return Err(format!("{s:?}: between 0 and 60 s"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl Args {
    /// Parses the arguments after the program's name.
    pub fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut taps = Vec::new();
        let mut a = Args {
            taps: (String::new(), String::new()),
            delay_ab: Duration::ZERO,
            delay_ba: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: 0.0,
            reorder: false,
            queue: 64 << 20,
            seed: 1,
        };
        while let Some(flag) = it.next() {
            if flag == "--reorder" {
                a.reorder = true;
                continue;
            }
            let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--tap" => taps.push(v),
                "--delay" => {
                    a.delay_ab = duration(&v)?;
                    a.delay_ba = a.delay_ab;
                }
                "--delay-ab" => a.delay_ab = duration(&v)?,
                "--delay-ba" => a.delay_ba = duration(&v)?,
                "--jitter" => a.jitter = duration(&v)?,
                "--loss" => {
                    a.loss = v.parse().map_err(|_| format!("--loss {v:?}: a percent"))?;
                    if !(0.0..=100.0).contains(&a.loss) {
                        return Err(format!("--loss {v}: between 0 and 100"));
                    }
                }
                "--queue" => a.queue = v.parse().map_err(|_| format!("--queue {v:?}: bytes"))?,
                "--seed" => a.seed = v.parse().map_err(|_| format!("--seed {v:?}: a number"))?,
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        match taps.as_slice() {
            [x, y] if x != y && x.len() < 16 && y.len() < 16 => a.taps = (x.clone(), y.clone()),
            _ => return Err("give two --tap names, distinct, under 16 bytes".into()),
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, String> {
        Args::parse(s.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn durations_and_limits() {
        assert_eq!(duration("94ms"), Ok(Duration::from_millis(94)));
        assert_eq!(duration("0.5s"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(duration("7"), Ok(Duration::from_millis(7)));
        assert!(duration("-1ms").is_err() && duration("61s").is_err() && duration("1h").is_err());
        let a = parse("--tap a --tap b --delay-ab 10ms --delay-ba 20ms --loss 1").unwrap();
        assert_eq!(
            (a.delay_ab, a.delay_ba, a.loss),
            (Duration::from_millis(10), Duration::from_millis(20), 1.0)
        );
        assert!(parse("--tap a --tap a").is_err());
        assert!(parse("--tap a --tap b --loss 101").is_err());
        assert!(parse("--tap a").is_err());
        assert!(parse("--tap a --tap b --delay").is_err());
    }
}
