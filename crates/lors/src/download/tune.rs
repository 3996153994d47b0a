//! Connections per depot for a download not told how many (`-a`).

use std::ops::Range;
use std::time::{Duration, Instant};

/// Connections per depot a download opens unless told otherwise; a depot
/// that says it is busy gets half, for good, each time.
///
/// Why eight from the start: on a fast local path each added connection
/// takes receive work off the others (eight beat four by 10–20 % on
/// loopback), and on the network lab's shaped links one to eight per depot
/// move the same bytes to within 1–3 %. An earlier tuner started at four
/// and doubled once the first pieces measured a gain, but the four
/// connections added mid-transfer broke the flows already running: with
/// BBR senders and the client's own link the bottleneck, the first four
/// each fell to a fraction of their share for the rest of the download and
/// left a tail behind them (2 depots on 100 Mbit/s links: 8.6–11.4 MiB/s
/// against 11.35–11.40 for eight from the start; 4 depots: 8.1–9.1 against
/// 11.1–11.3).
pub const AUTO_CONNECTIONS: usize = 8;

/// A depot this far away gets one more connection than
/// [`AUTO_CONNECTIONS`] per this much round trip beyond it: a host whose
/// TCP buffers are not tuned (64 KiB, about 32 KiB of window) moves one
/// window per round trip per connection, so a 100 Mbit/s link 188 ms
/// away needs about 70 of them ("Video IBPster" used 150 threads for
/// three such depots). On a tuned host the extra connections cost little
/// and share the slow start, which at such round trips is most of a
/// transfer of a few hundred MB.
pub const RTT_PER_CONNECTION: Duration = Duration::from_millis(2);

/// Connections a host `rtt` away needs for what [`RTT_PER_CONNECTION`]
/// says (not bounded: callers clamp it).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(lors::download::connections_for(Duration::from_millis(188)), 94);
/// assert_eq!(lors::download::connections_for(Duration::from_micros(300)), 0);
/// ```
pub fn connections_for(rtt: Duration) -> usize {
    let per = RTT_PER_CONNECTION.as_micros().max(1);
    usize::try_from(rtt.as_micros() / per).unwrap_or(usize::MAX)
}

/// Busy replies this close to the one that halved a depot's connections
/// are of the same wave and halve nothing more.
pub const BUSY_SETTLE: Duration = Duration::from_secs(1);

/// The most connections a depot gets for its distance.
pub const MAX_AUTO_CONNECTIONS: usize = 128;

/// A depot's connection budget.
#[derive(Debug, Clone)]
pub(crate) struct Tune {
    /// Connections the depot may use now.
    pub(crate) level: usize,
    /// When the depot last said it is busy (its distance no longer adds
    /// any connections then).
    backed_off: Option<Instant>,
    /// Its round trip, once measured.
    rtt: Duration,
    /// Its round trip was measured and the level set by it.
    placed: bool,
    /// Its first worker connects ahead for the connections it will earn,
    /// and sets the level once those are made.
    pub(crate) ahead: bool,
    /// Downloads sharing the depot: what distance adds is divided by it.
    beside: usize,
}

impl Tune {
    /// A depot's budget for a download beside `beside` others from it
    /// (0 or 1: alone).
    pub(crate) fn new(beside: usize) -> Self {
        Tune {
            level: AUTO_CONNECTIONS,
            backed_off: None,
            rtt: Duration::ZERO,
            placed: false,
            ahead: false,
            beside: beside.max(1),
        }
    }

    /// The depot said it is busy: half the connections, for good — once
    /// per [`BUSY_SETTLE`] (or two round trips, when longer): the other
    /// busy replies of the same wave of connections say nothing new.
    pub(crate) fn back_off(&mut self, now: Instant) {
        let settle = BUSY_SETTLE.max(self.rtt * 2);
        if self
            .backed_off
            .is_some_and(|t| now.saturating_duration_since(t) < settle)
        {
            return;
        }
        self.backed_off = Some(now);
        self.level = (self.level / 2).max(1);
    }

    /// Its round trip was measured (its level set by it).
    pub(crate) fn placed(&self) -> bool {
        self.placed
    }

    /// The depot's round trip is `rtt`: the connections it adds (once;
    /// none on a LAN, where [`AUTO_CONNECTIONS`] fill any link).
    pub(crate) fn at_distance(&mut self, rtt: Duration) -> Option<Range<usize>> {
        if std::mem::replace(&mut self.placed, true) || self.backed_off.is_some() {
            return None;
        }
        self.rtt = rtt;
        let far = connections_for(rtt);
        if self.beside > 1 && far > AUTO_CONNECTIONS {
            // Far away, a batch's files share what one download would
            // open: fewer than the LAN's eight each, so more files fit.
            let share = (far / self.beside).clamp(1, MAX_AUTO_CONNECTIONS);
            if share <= self.level {
                self.level = share;
                return None;
            }
        }
        let want = (far / self.beside).clamp(AUTO_CONNECTIONS, MAX_AUTO_CONNECTIONS);
        (want > self.level).then(|| std::mem::replace(&mut self.level, want)..want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_replies_halve_the_connections_down_to_one() {
        let mut t = Tune::new(1);
        let t0 = Instant::now();
        let levels: Vec<usize> = (0..5)
            .map(|i| {
                t.back_off(t0 + BUSY_SETTLE * i);
                t.level
            })
            .collect();
        assert_eq!(levels, [4, 2, 1, 1, 1]);
    }

    #[test]
    fn a_wave_of_busy_replies_halves_once_per_settling_time() {
        let mut t = Tune::new(1);
        assert_eq!(
            t.at_distance(Duration::from_millis(188)),
            Some(AUTO_CONNECTIONS..94)
        );
        let t0 = Instant::now();
        for i in 0..50 {
            t.back_off(t0 + Duration::from_millis(i * 5));
        }
        assert_eq!(t.level, 47, "one wave, one halving");
        t.back_off(t0 + BUSY_SETTLE);
        assert_eq!(t.level, 23, "the next wave halves again");
    }

    #[test]
    fn distance_adds_connections_once_and_never_after_a_busy_reply() {
        let ms = Duration::from_millis;
        let mut lan = Tune::new(1);
        assert_eq!(lan.at_distance(ms(1)), None);
        let mut far = Tune::new(1);
        assert_eq!(far.at_distance(ms(188)), Some(AUTO_CONNECTIONS..94));
        assert_eq!(far.at_distance(ms(300)), None, "measured once");
        let mut farther = Tune::new(1);
        assert_eq!(
            farther.at_distance(ms(900)),
            Some(AUTO_CONNECTIONS..MAX_AUTO_CONNECTIONS)
        );
        let mut busy = Tune::new(1);
        busy.back_off(Instant::now());
        assert_eq!(busy.at_distance(ms(188)), None);
        assert_eq!(busy.level, AUTO_CONNECTIONS / 2);
    }

    #[test]
    fn downloads_side_by_side_share_what_distance_adds() {
        let ms = Duration::from_millis;
        let mut one_of_four = Tune::new(4);
        assert_eq!(one_of_four.at_distance(ms(188)), Some(AUTO_CONNECTIONS..23));
        let mut one_of_23 = Tune::new(23);
        assert_eq!(one_of_23.at_distance(ms(188)), None);
        assert_eq!(one_of_23.level, 4, "far away, fewer than a LAN's eight");
        let mut on_a_lan = Tune::new(23);
        assert_eq!(on_a_lan.at_distance(ms(1)), None);
        assert_eq!(on_a_lan.level, AUTO_CONNECTIONS, "near, eight each");
    }
}
