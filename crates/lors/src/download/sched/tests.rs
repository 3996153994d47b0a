//! The scheduler driven by a fake clock and fake depots: every fetch takes
//! the time its depot's link needs, or fails, or never ends.

use std::collections::BTreeMap;

use super::*;

const MIB: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Delivers at `rate` bytes/s per connection.
    Ok(f64),
    /// Refuses connections: the first fetch fails as unreachable.
    Dead,
    /// Answers every read, with bytes that fail verification.
    Corrupt(f64),
    /// Accepts the read and never sends a byte.
    Silent,
    /// Says it is busy `n` times, then delivers at `rate`.
    Busy(u32, f64),
    /// Delivers at `rate` per connection, except its first connection,
    /// which crawls at `slow` (a flow that lost the race for a shared link).
    OneSlow { rate: f64, slow: f64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Claim,
    Fail(bool),
    Busy,
}

struct Sim {
    s: Sched,
    kinds: Vec<Kind>,
    t0: Instant,
    now: Instant,
    /// Connections: (depot, index); `None` once exited.
    conns: Vec<Option<(DepotId, usize)>>,
    /// (when, sequence) -> (connection, piece, mapping, outcome).
    in_flight: BTreeMap<(Instant, u64), (usize, PieceId, usize, Outcome)>,
    busy_left: Vec<u32>,
    busy_conns: Vec<bool>,
    seq: u64,
    /// Ordered output: which pieces are delivered, and the first missing.
    delivered: Vec<bool>,
    written: usize,
    /// Every fetch handed out: (piece, depot, at).
    fetches: Vec<(PieceId, DepotId, Instant)>,
}

/// `pieces` pieces of `size` bytes; piece i on mappings `layout(i)`;
/// mapping m on depot `m % depots`.
fn plan(pieces: usize, size: u64, layout: impl Fn(usize) -> Vec<usize>) -> Vec<Segment> {
    (0..pieces)
        .map(|i| Segment {
            offset: i as u64 * size,
            len: size,
            sources: layout(i),
        })
        .collect()
}

impl Sim {
    fn new(cfg: Config, kinds: &[Kind], plan: Vec<Segment>) -> Sim {
        let n = kinds.len();
        let mappings = plan
            .iter()
            .flat_map(|s| s.sources.iter().copied())
            .max()
            .map_or(0, |m| m + 1);
        let t0 = Instant::now();
        let names = (0..n).map(|d| format!("depot{d}:6714")).collect();
        let per = match cfg.conns_per_depot {
            0 => super::super::tune::AUTO_CONNECTIONS,
            c => c,
        };
        let pieces = plan.len();
        let s = Sched::new(cfg, names, (0..mappings).map(|m| m % n).collect(), plan, t0);
        let conns = (0..n)
            .flat_map(|d| (0..per).map(move |c| Some((d, c))))
            .collect::<Vec<_>>();
        Sim {
            s,
            kinds: kinds.to_vec(),
            t0,
            now: t0,
            busy_conns: vec![false; conns.len()],
            conns,
            in_flight: BTreeMap::new(),
            busy_left: kinds
                .iter()
                .map(|k| if let Kind::Busy(n, _) = k { *n } else { 0 })
                .collect(),
            seq: 0,
            delivered: vec![false; pieces],
            written: 0,
            fetches: Vec::new(),
        }
    }

    fn start(&mut self, c: usize, p: PieceId, m: usize) {
        let (d, i) = self.conns[c].expect("live");
        let (_, len) = self.s.piece(p);
        let secs = |rate: f64| Duration::from_secs_f64(len as f64 / rate);
        let (after, outcome) = match self.kinds[d] {
            Kind::Ok(rate) => (secs(rate), Outcome::Claim),
            Kind::OneSlow { slow, .. } if i == 0 => (secs(slow), Outcome::Claim),
            Kind::OneSlow { rate, .. } => (secs(rate), Outcome::Claim),
            Kind::Dead => (Duration::from_millis(1), Outcome::Fail(true)),
            Kind::Corrupt(rate) => (secs(rate), Outcome::Fail(false)),
            Kind::Silent => (Duration::from_secs(1 << 30), Outcome::Claim),
            Kind::Busy(_, rate) if self.busy_left[d] == 0 => (secs(rate), Outcome::Claim),
            Kind::Busy(..) => {
                self.busy_left[d] -= 1;
                (Duration::from_millis(1), Outcome::Busy)
            }
        };
        self.seq += 1;
        self.in_flight
            .insert((self.now + after, self.seq), (c, p, m, outcome));
        self.busy_conns[c] = true;
        self.fetches.push((p, d, self.now));
    }

    /// Lets every idle connection pick, as a notification would.
    fn offer(&mut self) {
        loop {
            let mut started = false;
            for c in 0..self.conns.len() {
                let Some((d, i)) = self.conns[c] else {
                    continue;
                };
                if self.busy_conns[c] {
                    continue;
                }
                let head_only = false;
                match self.s.pick(d, i, head_only, self.now) {
                    Pick::Fetch { piece, mapping } => {
                        if let Some(w) = self.s.cfg.window {
                            assert!(
                                piece < self.written + w,
                                "piece {piece} handed out with {} written and a window of {w}",
                                self.written
                            );
                        }
                        self.start(c, piece, mapping);
                        started = true;
                    }
                    Pick::Wait => {}
                    Pick::Exit => self.conns[c] = None,
                }
            }
            if !started {
                return;
            }
        }
    }

    /// Runs until every piece is delivered or lost; returns the fake time
    /// it took.
    fn run(&mut self) -> Duration {
        self.offer();
        while !self.s.finished() {
            let next = self.in_flight.keys().next().copied();
            let check = self.s.next_check(self.now);
            let check_first = check.filter(|&t| next.is_none_or(|(n, _)| t < n));
            match (next, check_first) {
                (_, Some(t)) => {
                    self.now = t;
                    self.s.check_stalls(self.now);
                }
                (Some(key), None) => {
                    let (c, p, m, outcome) = self.in_flight.remove(&key).expect("present");
                    self.now = key.0;
                    self.busy_conns[c] = false;
                    match outcome {
                        Outcome::Claim => {
                            if self.s.claim(p, m, self.now) && p < self.delivered.len() {
                                self.delivered[p] = true;
                                while self.written < self.delivered.len()
                                    && self.delivered[self.written]
                                {
                                    self.written += 1;
                                }
                                self.s.written(self.written);
                            }
                        }
                        Outcome::Fail(unreachable) => self.s.failed(p, m, "bad", unreachable),
                        Outcome::Busy => {
                            self.s.busy(p, m, "busy", self.now);
                        }
                    }
                    self.s.check_stalls(self.now);
                }
                (None, None) => panic!(
                    "no fetch in flight and nothing to wait for, yet {} of {} pieces settled",
                    self.s.done + self.s.lost.len(),
                    self.s.len()
                ),
            }
            self.reap();
            self.offer();
        }
        self.now - self.t0
    }

    /// Stops the fetches the scheduler no longer needs, as a worker does:
    /// their connections are free at once.
    fn reap(&mut self) {
        let gone: Vec<_> = (self.in_flight.iter())
            .filter(|(_, (_, p, m, _))| self.s.is_cancelled(*p, *m))
            .map(|(k, v)| (*k, *v))
            .collect();
        for (key, (c, p, m, _)) in gone {
            self.in_flight.remove(&key);
            self.busy_conns[c] = false;
            self.s.abandon(p, m);
        }
    }

    /// Delivered pieces tile the planned range exactly once.
    fn assert_tiles(&self, total: u64) {
        let mut ranges: Vec<(u64, u64)> = (0..self.s.len())
            .filter(|&p| self.s.pieces[p].st == St::Done)
            .map(|p| self.s.piece(p))
            .collect();
        ranges.sort_unstable();
        let mut next = 0;
        for (offset, len) in ranges {
            assert_eq!(offset, next, "pieces must tile the range");
            next += len;
        }
        assert_eq!(next, total);
    }

    fn bytes_from(&self, d: DepotId) -> u64 {
        self.s.depots[d].bytes
    }
}

fn fixed(conns: usize) -> Config {
    Config {
        conns_per_depot: conns,
        ..Config::default()
    }
}

/// Piece i on two of `n` depots: mapping 2i on depot 2i % n, mapping 2i+1
/// on the next one.
fn two_copies(i: usize) -> Vec<usize> {
    vec![2 * i, 2 * i + 1]
}

/// Piece i of a plan over four depots on depots i % 4 and (i + 1) % 4: every
/// depot shares pieces with both neighbours.
fn ring_of_four(i: usize) -> Vec<usize> {
    vec![4 * i + i % 4, 4 * i + (i + 1) % 4]
}

#[test]
fn healthy_depots_deliver_every_byte_once_and_share_the_work() {
    let mut sim = Sim::new(fixed(2), &[Kind::Ok(10e6); 4], plan(400, MIB, two_copies));
    sim.run();
    sim.assert_tiles(400 * MIB);
    assert_eq!(sim.s.counters().bytes, 400 * MIB);
    assert_eq!(sim.s.counters().retries, 0);
    assert!(sim.s.lost().is_empty());
    for d in 0..4 {
        let share = sim.bytes_from(d) as f64 / (400 * MIB) as f64;
        assert!((0.2..0.3).contains(&share), "depot {d} took {share}");
    }
}

#[test]
fn faster_depots_take_more_pieces() {
    let kinds = [Kind::Ok(40e6), Kind::Ok(10e6)];
    let mut sim = Sim::new(fixed(2), &kinds, plan(200, MIB, two_copies));
    sim.run();
    let fast = sim.bytes_from(0) as f64;
    let slow = sim.bytes_from(1) as f64;
    assert!(fast > 3.0 * slow, "fast {fast} slow {slow}");
}

#[test]
fn an_unreachable_depot_fails_over_to_the_replicas_at_once() {
    let kinds = [Kind::Dead, Kind::Ok(10e6), Kind::Ok(10e6)];
    let mut sim = Sim::new(fixed(4), &kinds, plan(300, MIB, two_copies));
    sim.run();
    sim.assert_tiles(300 * MIB);
    assert_eq!(sim.bytes_from(0), 0);
    let events = sim.s.take_events();
    let unreachable = events
        .iter()
        .filter(|e| matches!(e, Event::Unreachable { depot: 0, .. }))
        .count();
    assert_eq!(unreachable, 1, "{events:?}");
    // Each of depot 0's connections failed once; no piece was tried there again.
    let tries_on_dead = sim.fetches.iter().filter(|f| f.1 == 0).count();
    assert!(
        tries_on_dead <= 4,
        "{tries_on_dead} fetches on the dead depot"
    );
}

#[test]
fn a_corrupting_depot_costs_retries_not_data() {
    let kinds = [Kind::Corrupt(10e6), Kind::Ok(10e6)];
    let mut sim = Sim::new(fixed(2), &kinds, plan(100, MIB, two_copies));
    sim.run();
    sim.assert_tiles(100 * MIB);
    assert_eq!(sim.bytes_from(1), 100 * MIB);
    assert!(sim.s.counters().retries > 0);
    // A piece whose read from depot 0 failed is never read there again.
    let mut seen = std::collections::HashSet::new();
    for &(p, d, _) in &sim.fetches {
        if d == 0 {
            assert!(
                seen.insert(p),
                "piece {p} read twice from the corrupting depot"
            );
        }
    }
}

#[test]
fn pieces_only_a_dead_depot_holds_are_lost_and_the_rest_still_arrive() {
    // Even pieces on depots 0 and 1, odd ones on depot 0 only.
    let layout = |i: usize| {
        if i.is_multiple_of(2) {
            vec![2 * i, 2 * i + 1]
        } else {
            vec![2 * i]
        }
    };
    let kinds = [Kind::Dead, Kind::Ok(10e6)];
    let mut sim = Sim::new(fixed(2), &kinds, plan(20, MIB, layout));
    sim.run();
    assert_eq!(sim.s.lost().len(), 10);
    assert_eq!(sim.bytes_from(1), 10 * MIB);
    assert!(sim.s.lost().iter().all(|l| (l.offset / MIB) % 2 == 1));
}

#[test]
fn an_idle_depot_hedges_a_straggler_and_the_first_copy_wins() {
    // Depot 1 is 100x slower; with hedging the fast depot refetches its
    // last pieces instead of waiting for them.
    let kinds = [Kind::Ok(50e6), Kind::Ok(0.5e6)];
    let run = |hedge: bool| {
        let cfg = Config {
            hedge,
            split_tail: false,
            ..fixed(1)
        };
        let mut sim = Sim::new(cfg, &kinds, plan(40, MIB, two_copies));
        let t = sim.run();
        sim.assert_tiles(40 * MIB);
        (t, sim.s.counters().hedged)
    };
    let (with, hedged) = run(true);
    let (without, none) = run(false);
    assert!(hedged > 0);
    assert_eq!(none, 0);
    // Without: the slow depot's last piece alone takes 2 s.
    assert!(without >= Duration::from_secs(2), "{without:?}");
    assert!(with < without / 2, "with {with:?}, without {without:?}");
}

#[test]
fn a_straggling_connection_is_fetched_around_while_its_depot_is_still_busy() {
    // Each depot's first connection crawls; its second is fast. Both
    // depots keep a fetch running to the end, so neither is ever idle: the
    // fast connections must still fetch the crawling pieces from the other
    // replica once those run far longer than pieces do.
    let kinds = [Kind::OneSlow {
        rate: 10e6,
        slow: 0.1e6,
    }; 2];
    let mut sim = Sim::new(fixed(2), &kinds, plan(40, MIB, two_copies));
    let t = sim.run();
    sim.assert_tiles(40 * MIB);
    // Waiting for the crawlers: 1 MiB at 0.1 MB/s = 10.5 s. The fast
    // connections move the other 38 MiB in 2 s, then fetch the two
    // crawling pieces again once they run twice the typical 0.1 s.
    assert!(t < Duration::from_secs(3), "{t:?}");
    assert_eq!(sim.s.counters().hedged, 2);
}

#[test]
fn a_piece_is_not_fetched_twice_for_running_a_little_long() {
    // A connection at 2/3 of the others' speed is slow, not stuck: its
    // pieces take 1.5 x the typical time and are never fetched twice. (One
    // depot holding both copies: it is never idle while that connection
    // runs, so only the straggler rule could fetch a piece twice.)
    let kinds = [Kind::OneSlow {
        rate: 1e6,
        slow: 0.67e6,
    }];
    let mut sim = Sim::new(fixed(2), &kinds, plan(40, MIB, two_copies));
    sim.run();
    sim.assert_tiles(40 * MIB);
    assert_eq!(sim.s.counters().hedged, 0);
}

#[test]
fn the_end_game_cuts_the_last_pieces_so_connections_finish_together() {
    let kinds = [Kind::Ok(10e6); 2];
    let mut sim = Sim::new(fixed(4), &kinds, plan(10, 4 * MIB, two_copies));
    sim.run();
    sim.assert_tiles(40 * MIB);
    assert!(sim.s.len() > 10, "no piece was cut");
    for p in 10..sim.s.len() {
        let (offset, len) = sim.s.piece(p);
        assert!(len >= TAIL_PIECE_MIN);
        assert_eq!(offset % (64 << 10), 0);
    }
}

#[test]
fn end_game_cuts_cover_a_piece_in_aligned_shares_no_smaller_than_the_floor() {
    let size = (2 << 20) + 12345;
    let cfg = Config {
        conns_per_depot: 8,
        hedge: false,
        ..Config::default()
    };
    let mut sim = Sim::new(cfg, &[Kind::Ok(10e6)], plan(1, size, |_| vec![0]));
    sim.run();
    sim.assert_tiles(size);
    // One piece, eight connections: each takes its share, the floor of
    // 256 KiB, and the last the odd end with it (too small to cut).
    let mut lens: Vec<u64> = (0..sim.s.len()).map(|p| sim.s.piece(p).1).collect();
    lens.sort_unstable();
    let mut want = vec![256 << 10; 7];
    want.push((256 << 10) + 12345);
    assert_eq!(lens, want);
}

#[test]
fn a_silent_depot_is_stalled_its_pieces_move_and_it_recovers_when_it_delivers() {
    let kinds = [Kind::Silent, Kind::Ok(10e6)];
    let cfg = Config {
        stall: Duration::from_secs(5),
        ..fixed(2)
    };
    let mut sim = Sim::new(cfg, &kinds, plan(100, MIB, two_copies));
    let t = sim.run();
    sim.assert_tiles(100 * MIB);
    assert_eq!(sim.bytes_from(1), 100 * MIB);
    let events = sim.s.take_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Stalled {
                depot: 0,
                moved: 2,
                ..
            }
        )),
        "{events:?}"
    );
    // 100 MiB over two 10 MB/s connections is 5.2 s, plus at most the stall time.
    assert!(t < Duration::from_secs(11), "{t:?}");
    // Once stalled, the depot was read no more while the other could serve.
    let stalled_at = sim.t0 + Duration::from_secs(5);
    assert!(
        sim.fetches
            .iter()
            .all(|&(_, d, at)| d != 0 || at < stalled_at)
    );
}

#[test]
fn a_hung_depot_is_stalled_after_a_few_typical_pieces_not_the_configured_limit() {
    let kinds = [Kind::Silent, Kind::Ok(10e6)];
    let cfg = Config {
        stall: Duration::from_secs(60),
        ..fixed(2)
    };
    let mut sim = Sim::new(cfg, &kinds, plan(100, MIB, two_copies));
    let t = sim.run();
    sim.assert_tiles(100 * MIB);
    // A piece takes 0.1 s: the stall is the 2 s floor, not 60 s.
    assert!(t < Duration::from_secs(5 + 3), "{t:?}");
    let silent = (sim.s.take_events().into_iter())
        .find_map(|e| match e {
            Event::Stalled {
                depot: 0, silent, ..
            } => Some(silent),
            _ => None,
        })
        .expect("the hung depot is named");
    assert_eq!(silent, crate::stall::FLOOR);
    // Its stuck fetches were stopped, freeing their connections.
    assert!(sim.in_flight.is_empty());
    assert_eq!(sim.s.depots[0].running, 0);
}

#[test]
fn a_busy_depot_gets_fewer_connections_and_its_pieces_wait_without_blame() {
    let kinds = [Kind::Busy(50, 10e6)];
    let mut sim = Sim::new(Config::default(), &kinds, plan(30, MIB, |i| vec![i]));
    sim.run();
    sim.assert_tiles(30 * MIB);
    assert!(sim.s.lost().is_empty());
    // They come in one wave, at once: the first halves, the others of the
    // same wave say nothing new (see tune::BUSY_SETTLE).
    assert_eq!(
        sim.s.level(0),
        super::super::tune::AUTO_CONNECTIONS / 2,
        "fifty busy replies at once halve the level once"
    );
}

#[test]
fn a_piece_that_is_busy_too_often_fails_on_that_replica() {
    let kinds = [Kind::Busy(u32::MAX, 10e6)];
    let cfg = Config {
        split_tail: false,
        ..fixed(1)
    };
    let mut sim = Sim::new(cfg, &kinds, plan(1, MIB, |_| vec![0]));
    sim.run();
    assert_eq!(sim.s.lost().len(), 1);
    assert_eq!(sim.s.counters().retries, u64::from(BUSY_MAX) + 1);
}

#[test]
fn a_last_resort_depot_serves_only_what_no_other_replica_holds() {
    // Depot 1 is last resort; pieces 0..10 are on both, 10..12 on depot 1 only.
    let layout = |i: usize| {
        if i < 10 {
            vec![2 * i, 2 * i + 1]
        } else {
            vec![2 * i + 1]
        }
    };
    let cfg = Config {
        last_resort: vec![1],
        ..fixed(2)
    };
    let mut sim = Sim::new(
        cfg,
        &[Kind::Ok(10e6), Kind::Ok(10e6)],
        plan(12, MIB, layout),
    );
    sim.run();
    sim.assert_tiles(12 * MIB);
    assert_eq!(sim.bytes_from(1), 2 * MIB);
}

#[test]
fn a_rebuilding_depot_hedges_a_slow_depots_pieces_but_takes_no_others() {
    // Pieces alternate between depots 0 and 1 (one copy each, as the data
    // blocks of an erasure-coded file); depot 2 can rebuild any of them
    // (the parity), last resort. Depot 1 crawls at 1/50 of depot 0's rate:
    // its pieces are rebuilt once they straggle, not waited for (the stall
    // rule alone moves them later), and depot 2 takes nothing the others
    // serve in time.
    let layout = |i: usize| vec![3 * i + (i % 2), 3 * i + 2];
    let plan: Vec<Segment> = (0..20)
        .map(|i| Segment {
            offset: i as u64 * MIB,
            len: MIB,
            sources: layout(i),
        })
        .collect();
    let run = |rebuilders: Vec<DepotId>| {
        let cfg = Config {
            last_resort: vec![2],
            rebuilders,
            split_tail: false,
            ..fixed(4)
        };
        // Mapping m is on depot m % 3: 3i + (i % 2) on 0 or 1 as i
        // alternates, 3i + 2 on depot 2 for every i.
        let kinds = [Kind::Ok(10e6), Kind::Ok(0.2e6), Kind::Ok(10e6)];
        let mut sim = Sim::new(cfg, &kinds, plan.clone());
        let t = sim.run();
        sim.assert_tiles(20 * MIB);
        (t, sim.bytes_from(2))
    };
    let (waited, none) = run(vec![]);
    let (rebuilt, from_parity) = run(vec![2]);
    // Without: the stall rule moves some of them (7.2 s); with: every
    // one of depot 1's ten, and none of depot 0's — two races lost and
    // depot 1's pieces go to the rebuilder first (2.2 s; 3.3 s when each
    // still had to straggle first).
    assert!(none < 10 * MIB, "{none}");
    assert_eq!(from_parity, 10 * MIB);
    assert!(
        rebuilt < waited * 2 / 3,
        "rebuilt {rebuilt:?}, waited {waited:?}"
    );
}

#[test]
fn an_ordered_output_never_runs_ahead_of_its_window() {
    let cfg = Config {
        window: Some(4),
        split_tail: false,
        ..fixed(4)
    };
    let kinds = [Kind::Ok(10e6), Kind::Ok(3e6), Kind::Ok(7e6)];
    // The window is asserted on every fetch the simulation hands out.
    let mut sim = Sim::new(cfg, &kinds, plan(200, MIB, two_copies));
    sim.run();
    sim.assert_tiles(200 * MIB);
    assert_eq!(sim.written, 200);
}

#[test]
fn a_download_not_told_how_many_opens_every_connection_at_once() {
    // Connections added mid-transfer unsettle the flows already running
    // (see AUTO_CONNECTIONS): all start together and stay.
    let mut sim = Sim::new(
        Config::default(),
        &[Kind::Ok(10e6)],
        plan(50, MIB, |i| vec![i]),
    );
    sim.offer();
    assert_eq!(sim.fetches.len(), super::super::tune::AUTO_CONNECTIONS);
    sim.run();
    sim.assert_tiles(50 * MIB);
    assert_eq!(sim.s.level(0), super::super::tune::AUTO_CONNECTIONS);
}

#[test]
fn a_100000_piece_plan_completes_with_every_depot_busy_to_the_end() {
    let n = 100_000;
    let kinds = [
        Kind::Ok(100e6),
        Kind::Ok(100e6),
        Kind::Ok(50e6),
        Kind::Ok(100e6),
    ];
    let mut sim = Sim::new(fixed(8), &kinds, plan(n, 2 * MIB, ring_of_four));
    let t = sim.run();
    sim.assert_tiles(n as u64 * 2 * MIB);
    // Eight connections per depot at these rates move 8 x 350 MB/s; the
    // fake time stays within 2 % of that ideal: work moved from the slow
    // depot to its neighbours, and no depot ran out of work early.
    let ideal = (n as u64 * 2 * MIB) as f64 / (8.0 * 350e6);
    let ratio = t.as_secs_f64() / ideal;
    assert!(ratio < 1.02, "took {ratio} x the ideal time");
}

#[test]
fn resumed_pieces_are_not_fetched_again() {
    let cfg = Config {
        split_tail: false,
        ..fixed(2)
    };
    let mut sim = Sim::new(cfg, &[Kind::Ok(10e6)], plan(10, MIB, |i| vec![i]));
    for p in [0, 3, 9] {
        sim.s.skip(p);
    }
    sim.run();
    assert_eq!(sim.fetches.len(), 7);
    assert!(sim.fetches.iter().all(|f| ![0, 3, 9].contains(&f.0)));
}

#[test]
fn an_ordered_output_keeps_little_in_flight_until_the_rate_says_more_arrives_in_time() {
    let cfg = Config {
        window: Some(16),
        split_tail: false,
        ..fixed(16)
    };
    let t0 = Instant::now();
    // A stream's pieces: 256 KiB.
    let piece = 256 << 10;
    let new = || {
        Sched::new(
            cfg.clone(),
            vec!["d".into()],
            vec![0],
            plan(64, piece, |_| vec![0]),
            t0,
        )
    };
    let fetch_all = |s: &mut Sched, now| {
        (0..16)
            .filter_map(|c| match s.pick(0, c, false, now) {
                Pick::Fetch { piece, .. } => Some(piece),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let claim_all = |s: &mut Sched, pieces: &[usize], t| {
        for &p in pieces {
            assert!(s.claim(p, 0, t));
        }
    };
    // Nothing measured: 2 MiB ahead, eight pieces, so they are not slowed
    // by eight more on a narrow link.
    let mut slow = new();
    let first = fetch_all(&mut slow, t0);
    assert_eq!(first, (0..8).collect::<Vec<_>>());
    // They took 2 s (1 MiB/s): still 2 MiB ahead of the writer.
    let t = t0 + Duration::from_secs(2);
    claim_all(&mut slow, &first, t);
    slow.written(8);
    assert_eq!(fetch_all(&mut slow, t), (8..16).collect::<Vec<_>>());
    // A 20 Mbit/s link: 2 MiB in 0.7 s is ~2.9 MiB/s, and a second of it
    // is 11 pieces — not the whole window, or the piece the writer needs
    // next shares the link with 15 others and a player's buffer runs dry.
    let mut narrow = new();
    let first = fetch_all(&mut narrow, t0);
    let t = t0 + Duration::from_millis(700);
    claim_all(&mut narrow, &first, t);
    narrow.written(8);
    let second = fetch_all(&mut narrow, t);
    assert_eq!(second, (8..19).collect::<Vec<_>>());
    // A start-up buffer holds the writer back: what arrived counts, and
    // the pieces after the buffer do not crowd it.
    let mut hold = new();
    assert_eq!(fetch_all(&mut hold, t0), first);
    claim_all(&mut hold, &first, t);
    assert_eq!(fetch_all(&mut hold, t), (8..11).collect::<Vec<_>>());
    // All but the piece the writer waits for arrive: nothing more is
    // fetched, so that piece gets the link to itself.
    let mut gap = new();
    assert_eq!(fetch_all(&mut gap, t0), first);
    claim_all(&mut gap, &first, t);
    gap.written(8);
    assert_eq!(fetch_all(&mut gap, t), second);
    let t2 = t + Duration::from_millis(900);
    claim_all(&mut gap, &second[1..], t2);
    assert_eq!(fetch_all(&mut gap, t2), Vec::<usize>::new());
    // The player reads slower than the link: fetched pieces wait for the
    // writer, and the stream fetches on up to the window, not beyond.
    let t = t + Duration::from_millis(900);
    claim_all(&mut narrow, &second, t);
    assert_eq!(fetch_all(&mut narrow, t), (19..24).collect::<Vec<_>>());
    // A fast path: the same 2 MiB within 10 ms is ~200 MiB in 1 s: the
    // whole window.
    let mut fast = new();
    let first = fetch_all(&mut fast, t0);
    let t = t0 + Duration::from_millis(10);
    claim_all(&mut fast, &first, t);
    fast.written(8);
    assert_eq!(
        fetch_all(&mut fast, t),
        (8..24).collect::<Vec<_>>(),
        "16 ahead of the writer"
    );
}

#[test]
fn a_silent_depot_holding_the_whole_stream_window_is_stalled_while_a_replica_waits() {
    let cfg = Config {
        window: Some(16),
        split_tail: false,
        stall: Duration::from_secs(1),
        hedge: false,
        ..fixed(4)
    };
    let t0 = Instant::now();
    // 1 MiB pieces (encoded mappings are fetched whole) on both depots.
    let mut s = Sched::new(
        cfg,
        vec!["a".into(), "b".into()],
        vec![0, 1],
        plan(8, MIB, |_| vec![0, 1]),
        t0,
    );
    // Depot b's connections take the whole 2 MiB window and go silent.
    assert!(matches!(
        s.pick(1, 0, false, t0),
        Pick::Fetch { piece: 0, .. }
    ));
    assert!(matches!(
        s.pick(1, 1, false, t0),
        Pick::Fetch { piece: 1, .. }
    ));
    assert!(matches!(s.pick(0, 0, false, t0), Pick::Wait));
    // Nobody delivers, but a holds replicas and waits: b is stalled.
    let t = t0 + Duration::from_secs(2);
    s.check_stalls(t);
    assert!(matches!(
        s.take_events().as_slice(),
        [Event::Stalled {
            depot: 1,
            moved: 2,
            ..
        }]
    ));
    assert!(matches!(
        s.pick(0, 0, false, t),
        Pick::Fetch { piece: 0, .. }
    ));
}

/// A mapping whose allocation ends early (the depot answers -19 past its
/// size) fails at once for every piece from the refused one on: a claim of
/// a terabyte on a megabyte is one refusal, not a read per piece.
#[test]
fn a_mapping_that_ends_early_fails_its_later_pieces_at_once() {
    // 1,000 pieces on mapping 0 (depot 0), the first 500 also on mapping 1
    // (depot 1).
    let layout = |i: usize| if i < 500 { vec![0, 1] } else { vec![0] };
    let mut sim = Sim::new(
        fixed(1),
        &[Kind::Ok(10e6), Kind::Ok(10e6)],
        plan(1000, MIB, layout),
    );
    let now = sim.now;
    let Pick::Fetch { piece, mapping } = sim.s.pick(0, 0, false, now) else {
        panic!("a piece to fetch");
    };
    assert_eq!(mapping, 0);
    sim.s
        .ends_early(piece, 0, "-19 beyond the allocation's size");
    // The pieces only mapping 0 held are lost; the others wait for depot 1.
    let from = sim.s.piece(piece).0;
    let only_here = (500..1000).filter(|&i| i as u64 * MIB >= from).count();
    assert_eq!(sim.s.lost().len(), only_here);
    assert!(!sim.s.finished());
    let d1 = sim.s.pick(1, 0, false, now);
    assert!(matches!(d1, Pick::Fetch { mapping: 1, .. }), "{d1:?}");
}

/// Pieces of 1 MiB, piece p on mapping 2p on depot `on[p]` and, rebuilt
/// from parity, on mapping 2p + 1 on depot 3 (a last-resort rebuilder),
/// in `rows` (`reserve`: see [`Sched::set_rows`]).
fn rebuildable(on: &[DepotId], rows: Vec<Vec<PieceId>>, reserve: bool) -> Sched {
    let plan: Vec<Segment> = (0..on.len())
        .map(|p| Segment {
            offset: p as u64 * MIB,
            len: MIB,
            sources: vec![2 * p, 2 * p + 1],
        })
        .collect();
    let depot_of = (0..2 * on.len())
        .map(|m| if m % 2 == 1 { 3 } else { on[m / 2] })
        .collect();
    let cfg = Config {
        last_resort: vec![3],
        rebuilders: vec![3],
        split_tail: false,
        stall: Duration::from_secs(5),
        ..fixed(2)
    };
    let depots = on.iter().copied().max().unwrap_or(0).max(3) + 1;
    let names = (0..depots).map(|d| format!("depot{d}:6714")).collect();
    let mut s = Sched::new(cfg, names, depot_of, plan, Instant::now());
    s.set_rows(rows, reserve);
    s
}

/// Two rows of three pieces, as the data blocks of two stripes hold them:
/// piece p on depot p % 3, rows reserved for the rebuilder.
fn rows_of_three() -> Sched {
    let rows = vec![vec![0, 1, 2], vec![3, 4, 5]];
    rebuildable(&[0, 1, 2, 0, 1, 2], rows, true)
}

/// Depot 0's first fetch finds it refusing connections.
fn refuse_depot_0(s: &mut Sched, now: Instant) {
    let Pick::Fetch { piece, mapping } = s.pick(0, 0, false, now) else {
        panic!("depot 0 has pieces");
    };
    s.failed(piece, mapping, "refused", true);
}

#[test]
fn a_lost_blocks_row_is_left_to_the_rebuilder_which_takes_it_whole() {
    let now = Instant::now();
    let mut s = rows_of_three();
    // Depot 0 refuses: pieces 0 and 3 can only be rebuilt now.
    refuse_depot_0(&mut s, now);
    // Their rows' other pieces wait for the rebuilder, which reads their
    // bytes anyway: read by depots 1 and 2 first, they would be read twice.
    assert_eq!(s.pick(1, 0, false, now), Pick::Wait);
    assert_eq!(s.pick(2, 0, false, now), Pick::Wait);
    let mut delivered = Vec::new();
    for conn in 0..2 {
        let Pick::Fetch { piece, mapping } = s.pick(3, conn, false, now) else {
            panic!("the rebuilder has two rows to rebuild");
        };
        assert_eq!(piece % 3, 0, "it rebuilds the lost pieces");
        let with = s.taken_with(piece);
        assert_eq!(with.len(), 2, "and takes the rest of the row");
        for (q, m) in with.into_iter().chain([(piece, mapping)]) {
            assert_eq!(s.depot_of[m], 3);
            assert!(s.claim(q, m, now));
            delivered.push(q);
        }
    }
    delivered.sort_unstable();
    assert_eq!(delivered, vec![0, 1, 2, 3, 4, 5]);
    assert!(s.finished());
    assert_eq!(
        s.per_depot().map(|(_, b)| b).collect::<Vec<_>>(),
        vec![6 * MIB]
    );
}

#[test]
fn a_taken_piece_given_back_goes_to_its_own_depot() {
    let now = Instant::now();
    let mut s = rows_of_three();
    refuse_depot_0(&mut s, now);
    let Pick::Fetch { piece, mapping } = s.pick(3, 0, false, now) else {
        panic!("the rebuilder has rows to rebuild");
    };
    let with = s.taken_with(piece);
    assert_eq!(with.len(), 2);
    // One block of the row could not be read for the rebuild: its piece
    // goes back, and its own depot may read it now the row's lost piece
    // is in hand.
    assert!(s.claim(piece, mapping, now));
    assert!(s.claim(with[0].0, with[0].1, now));
    s.abandon(with[1].0, with[1].1);
    let own = with[1].0 % 3;
    let Pick::Fetch {
        piece: q,
        mapping: m,
    } = s.pick(own, 0, false, now)
    else {
        panic!("depot {own} reads its piece again");
    };
    assert_eq!((q, s.depot_of[m]), (with[1].0, own));
}

#[test]
fn two_lost_blocks_in_a_row_do_not_wait_for_each_other() {
    let now = Instant::now();
    let mut s = rows_of_three();
    // Depots 0 and 1 refuse (piece p is mapping 2p, on depot p % 3).
    refuse_depot_0(&mut s, now);
    // Depot 1's pieces wait for the rebuilder now; its connection finds
    // it dead all the same.
    assert_eq!(s.pick(1, 0, false, now), Pick::Wait);
    s.failed(1, 2, "refused", true);
    // Each row has two pieces only the rebuilder reads: it picks one and
    // takes the rest of the row, the other lost piece among them.
    for conn in 0..2 {
        let Pick::Fetch { piece, mapping } = s.pick(3, conn, false, now) else {
            panic!("the rebuilder has two rows to rebuild");
        };
        let with = s.taken_with(piece);
        assert_eq!(with.len(), 2);
        for (q, m) in with.into_iter().chain([(piece, mapping)]) {
            assert!(s.claim(q, m, now));
        }
    }
    assert!(s.finished());
}

/// Three rows of three pieces, blocks stored as they are (rows not
/// reserved): row A = pieces 0 (depot 1), 1 and 2 (depot 4); row B = 3 and
/// 4 (depot 1), 5 (depot 0); row C = 6 and 7 (depot 4), 8 (depot 0). Every
/// piece can also be rebuilt by depot 3 (mapping 2p + 1).
fn rows_read_back() -> Sched {
    let rows = vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]];
    rebuildable(&[1, 4, 4, 1, 1, 0, 4, 4, 0], rows, false)
}

fn fetch(s: &mut Sched, d: DepotId, conn: usize, now: Instant) -> (PieceId, usize) {
    match s.pick(d, conn, false, now) {
        Pick::Fetch { piece, mapping } => (piece, mapping),
        other => panic!("depot {d} conn {conn}: {other:?}"),
    }
}

#[test]
fn a_stalled_depots_rows_come_first_and_its_pieces_are_rebuilt_as_their_rows_arrive() {
    let t0 = Instant::now();
    let mut s = rows_read_back();
    // Depot 0 takes its two pieces and sends nothing; depot 4 delivers
    // all four of its own.
    assert_eq!(fetch(&mut s, 0, 0, t0).0, 5);
    assert_eq!(fetch(&mut s, 0, 1, t0).0, 8);
    for at in [1, 2] {
        let now = t0 + Duration::from_secs(at);
        let got = [fetch(&mut s, 4, 0, now), fetch(&mut s, 4, 1, now)];
        for (p, m) in got {
            assert!(s.claim(p, m, now + Duration::from_millis(900)));
        }
    }
    let t = t0 + Duration::from_secs(8);
    s.check_stalls(t);
    assert!(
        (s.take_events().iter()).any(|e| matches!(e, Event::Stalled { depot: 0, .. })),
        "depot 0 is stalled"
    );
    // Its pieces wait for the rebuilder, which reads their rows back:
    // depot 1 fetches row B's pieces before piece 0, earlier in the file.
    let (first, _) = fetch(&mut s, 1, 0, t);
    assert_eq!(first, 3, "row B (with a stalled piece) first");
    // The rebuilder: first what costs a parity read and the row read
    // back — piece 8 (its row delivered) and, as depot 4 idles while
    // depot 1 still has two to go, depot 1's piece 0 (its row delivered
    // too; neither depot has sent anything, so the earlier comes first);
    // then piece 5, which has to read piece 4 itself.
    let (a, _) = fetch(&mut s, 3, 0, t);
    assert!(s.taken_with(a).is_empty(), "nothing of its row to take");
    let (b, _) = fetch(&mut s, 3, 1, t);
    assert_eq!((a, b), (0, 8));
    let (c, _) = fetch(&mut s, 3, 2, t);
    assert_eq!(c, 5);
    assert_eq!(
        s.taken_with(c).iter().map(|&(q, _)| q).collect::<Vec<_>>(),
        vec![4],
        "the row's piece not on its way is read with it"
    );
}

#[test]
fn a_stalled_or_slow_depot_has_no_backlog_to_read_parity_from() {
    let t0 = Instant::now();
    let mut s = rows_read_back();
    assert_eq!(s.backlog("depot0:6714"), Some(2));
    assert_eq!(
        s.backlog("elsewhere:6714"),
        Some(0),
        "not in this download: idle"
    );
    assert!(s.serves("depot0:6714"));
    fetch(&mut s, 0, 0, t0);
    let (p, m) = fetch(&mut s, 4, 0, t0);
    assert!(s.claim(p, m, t0 + Duration::from_secs(1)));
    s.check_stalls(t0 + Duration::from_secs(8));
    assert_eq!(s.backlog("depot0:6714"), None);
    assert!(
        !s.serves("depot0:6714"),
        "its connections fetch nothing more"
    );
    assert!(
        !s.serves("depot3:6714"),
        "a rebuilder has no depot connections"
    );
}

#[test]
fn a_cut_read_of_the_only_copy_is_asked_again_within_the_grace_then_lost() {
    let t0 = Instant::now();
    // Two pieces, each on depot 0 alone.
    let plan = plan(2, MIB, |i| vec![i]);
    let cfg = Config {
        split_tail: false,
        ..fixed(1)
    };
    let mut s = Sched::new(cfg, vec!["d0:6714".into()], vec![0, 0], plan, t0);
    let (p, m) = fetch(&mut s, 0, 0, t0);
    assert_eq!(s.cut(p, m, "reset", false, t0), Some(CUT_PAUSE));
    assert!(s.lost().is_empty(), "not lost at the first reset");
    // Asked again: it comes back and delivers; the grace starts over.
    let t1 = t0 + Duration::from_secs(1);
    let (q, m) = fetch(&mut s, 0, 0, t1);
    assert_eq!(q, p, "the piece cut off is read again first");
    assert!(s.claim(q, m, t1));
    let (p, m) = fetch(&mut s, 0, 0, t1);
    assert!(s.cut(p, m, "refused", true, t1).is_some());
    let t2 = t1 + CUT_GRACE - Duration::from_millis(1);
    let (p, m) = fetch(&mut s, 0, 0, t2);
    assert!(s.cut(p, m, "refused", true, t2).is_some());
    // Gone longer than the grace: lost, the depot given up.
    let t3 = t1 + CUT_GRACE;
    let (p, m) = fetch(&mut s, 0, 0, t3);
    assert_eq!(s.cut(p, m, "refused", true, t3), None);
    assert_eq!(s.lost().len(), 1);
    assert!(s.finished());
}

#[test]
fn a_cut_read_with_another_replica_moves_to_it_at_once() {
    let t0 = Instant::now();
    let plan = plan(1, MIB, two_copies);
    let names = vec!["d0:6714".into(), "d1:6714".into()];
    let cfg = Config {
        split_tail: false,
        ..fixed(1)
    };
    let mut s = Sched::new(cfg, names, vec![0, 1], plan, t0);
    let (p, m) = fetch(&mut s, 0, 0, t0);
    assert_eq!(s.cut(p, m, "reset", false, t0), None);
    assert_eq!(s.pick(0, 0, false, t0), Pick::Exit);
    let (q, m) = fetch(&mut s, 1, 0, t0);
    assert_eq!(q, p);
    assert!(s.claim(q, m, t0));
    assert!(s.finished() && s.lost().is_empty());
}
