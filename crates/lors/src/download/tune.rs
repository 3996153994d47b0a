//! Connections per depot for a download not told how many (`-a`).

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

/// A depot's connection budget.
#[derive(Debug, Clone)]
pub(crate) struct Tune {
    /// Connections the depot may use now.
    pub(crate) level: usize,
}

impl Tune {
    pub(crate) fn new() -> Self {
        Tune {
            level: AUTO_CONNECTIONS,
        }
    }

    /// The depot said it is busy: half the connections, for good.
    pub(crate) fn back_off(&mut self) {
        self.level = (self.level / 2).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_replies_halve_the_connections_down_to_one() {
        let mut t = Tune::new();
        let levels: Vec<usize> = (0..5)
            .map(|_| {
                t.back_off();
                t.level
            })
            .collect();
        assert_eq!(levels, [4, 2, 1, 1, 1]);
    }
}
