//! Per-depot connection tuning: hill-climbing on measured throughput.

use std::time::{Duration, Instant};

/// Connections per depot an auto-tuned download starts with.
pub const AUTO_START: usize = 4;
/// Most connections per depot the tuner will open.
pub const AUTO_MAX: usize = 8;
/// A tuner step must gain this much throughput to be followed by another.
const AUTO_GAIN: f64 = 1.10;
/// A tuner step that leaves less than this share of the throughput is undone.
const AUTO_LOSS: f64 = 0.90;
/// A measurement window holds at least this many pieces …
const WINDOW_PIECES: u32 = 4;
/// … and this much time.
const WINDOW_TIME: Duration = Duration::from_millis(250);

/// The depot starts at [`AUTO_START`] connections; after each measurement
/// window (skipping the one right after a step, while the new connections
/// start) it doubles them while the last step raised its rate by at least
/// [`AUTO_GAIN`]; otherwise it stays, or, if the step clearly lowered the
/// rate (below [`AUTO_LOSS`] of it), goes back to the count before it and
/// stays there.
///
/// Why these numbers: on a fast local path each added connection takes
/// receive work off the others (eight beat four by 10–20 % on loopback, and
/// two were slower still), while on the network lab's shaped links one to
/// eight connections per depot move the same bytes to within 1–3 %. So the
/// tuner starts at four and keeps eight unless eight measure clearly slower.
/// Going back only on a clear loss matters: a 250 ms window on a shared
/// machine is too noisy to resolve a 10 % difference either way, and a wrong
/// step back costs the rest of the transfer.
#[derive(Debug, Clone)]
pub(crate) struct Tune {
    /// Connections the depot may use now.
    pub(crate) level: usize,
    growing: bool,
    /// The window after a step is not judged: the new connections are
    /// still connecting and in TCP slow start.
    settling: bool,
    /// The level before the last step, and its rate in bytes/s.
    prev: Option<(usize, f64)>,
    window_start: Instant,
    window_bytes: u64,
    window_pieces: u32,
}

impl Tune {
    pub(crate) fn new(now: Instant) -> Self {
        Tune {
            level: AUTO_START,
            growing: true,
            settling: false,
            prev: None,
            window_start: now,
            window_bytes: 0,
            window_pieces: 0,
        }
    }

    /// Counts a delivered piece; closes the window once it holds enough
    /// pieces and time to mean something.
    pub(crate) fn delivered(&mut self, len: u64, now: Instant) {
        self.window_bytes += len;
        self.window_pieces += 1;
        let took = now.saturating_duration_since(self.window_start);
        if !self.growing || self.window_pieces < WINDOW_PIECES || took < WINDOW_TIME {
            return;
        }
        self.step(self.window_bytes as f64 / took.as_secs_f64());
        self.window_start = now;
        self.window_bytes = 0;
        self.window_pieces = 0;
    }

    /// The depot said it is busy: half the connections, for good.
    pub(crate) fn back_off(&mut self) {
        self.level = (self.level / 2).max(1);
        self.growing = false;
    }

    /// One hill-climbing step on the rate of the window just closed.
    fn step(&mut self, rate: f64) {
        if !self.growing {
            return;
        }
        if self.settling {
            self.settling = false;
            return;
        }
        match self.prev {
            // The step clearly cost throughput: undo it.
            Some((level, p)) if rate < p * AUTO_LOSS => {
                self.level = level;
                self.growing = false;
            }
            // No clear gain: stop here. Going back as well would often
            // undo a real but small gain hidden in one window's noise.
            Some((_, p)) if rate < p * AUTO_GAIN => self.growing = false,
            _ if self.level >= AUTO_MAX => self.growing = false,
            _ => {
                self.prev = Some((self.level, rate));
                self.level = (self.level * 2).min(AUTO_MAX);
                self.settling = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Levels a tuner passes through for a sequence of window rates.
    fn levels(rates: &[f64]) -> Vec<usize> {
        let mut t = Tune::new(Instant::now());
        rates
            .iter()
            .map(|&r| {
                t.step(r);
                t.level
            })
            .collect()
    }

    #[test]
    fn tuner_climbs_while_steps_pay_stays_on_a_small_gain_and_backs_off_a_loss() {
        assert_eq!(AUTO_START, 4, "the sequences below start at 4");
        // The window right after a step (here 50) is not judged.
        // Every doubling pays: to the top, then no further.
        assert_eq!(levels(&[100.0, 50.0, 150.0, 400.0]), [8, 8, 8, 8]);
        // 4 -> 8 gained or lost 5 %: within the noise, kept.
        assert_eq!(levels(&[100.0, 50.0, 105.0, 300.0]), [8, 8, 8, 8]);
        assert_eq!(levels(&[100.0, 50.0, 95.0, 300.0]), [8, 8, 8, 8]);
        // 4 -> 8 lost 15 %: back to 4 for good.
        assert_eq!(levels(&[100.0, 50.0, 85.0, 400.0]), [8, 8, 4, 4]);
    }

    #[test]
    fn windows_close_on_the_clock_they_are_given() {
        let t0 = Instant::now();
        let mut t = Tune::new(t0);
        // Four pieces within 100 ms: no judgement yet.
        for i in 1..=4 {
            t.delivered(1 << 20, t0 + Duration::from_millis(25 * i));
        }
        assert_eq!(t.level, AUTO_START);
        // The window closes at 250 ms: first measurement, one step up.
        t.delivered(1 << 20, t0 + WINDOW_TIME);
        assert_eq!(t.level, AUTO_MAX);
    }
}
