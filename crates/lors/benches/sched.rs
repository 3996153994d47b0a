//! Scheduler cost per piece for plans of 1,000, 10,000 and 100,000 pieces:
//! the download scheduler alone, driven as the workers drive it (pick,
//! claim) with no I/O, four depots holding two replicas of every piece and
//! eight connections each. The target is a flat cost per piece: a scheduler
//! that rescans pending pieces on every pick grows with the plan.
//!
//! `cargo bench -p lors --bench sched` (env `LORS_BENCH_REPS`, default 5).
//! Prints figures and the ratio to the smallest plan; asserts none.

use std::time::{Duration, Instant};

use lors::download::sched::{Config, Pick, Sched};
use lors::plan::Segment;

const DEPOTS: usize = 4;
const CONNS: usize = 8;

/// One download of `n` pieces, every fetch answered at once, in the order
/// the connections ask. Returns the time spent in the scheduler.
fn run(n: usize) -> Duration {
    // Piece i on depots i % 4 and (i + 1) % 4; mapping 2i and 2i + 1.
    let plan: Vec<Segment> = (0..n)
        .map(|i| Segment {
            offset: i as u64 * (2 << 20),
            len: 2 << 20,
            sources: vec![2 * i, 2 * i + 1],
        })
        .collect();
    let depot_of: Vec<usize> = (0..2 * n).map(|m| (m / 2 + m % 2) % DEPOTS).collect();
    let names = (0..DEPOTS).map(|d| format!("depot{d}:6714")).collect();
    let cfg = Config {
        conns_per_depot: CONNS,
        ..Config::default()
    };
    let t0 = Instant::now();
    let mut s = Sched::new(cfg, names, depot_of, plan, t0);
    // Every connection holds one piece; the oldest completes next, and each
    // completion lets every idle connection ask again (as a wake-up does).
    let mut in_flight = std::collections::VecDeque::new();
    let mut busy = [false; DEPOTS * CONNS];
    let mut clock = t0;
    while !s.finished() {
        for (k, b) in busy.iter_mut().enumerate().filter(|(_, b)| !**b) {
            if let Pick::Fetch { piece, mapping } = s.pick(k / CONNS, k % CONNS, false, clock) {
                in_flight.push_back((k, piece, mapping));
                *b = true;
            }
        }
        let Some((k, piece, mapping)) = in_flight.pop_front() else {
            break;
        };
        clock += Duration::from_millis(1);
        s.claim(piece, mapping, clock);
        s.check_stalls(clock);
        busy[k] = false;
    }
    assert!(
        s.finished() && s.lost().is_empty(),
        "the plan did not complete"
    );
    t0.elapsed()
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let reps: usize = std::env::var("LORS_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    println!("download scheduler, {DEPOTS} depots x {CONNS} connections, 2 replicas per piece");
    println!("| pieces | median time | per piece | / 1,000-piece plan |");
    println!("|---|---|---|---|");
    let mut base = None;
    for n in [1_000, 10_000, 100_000] {
        let mut times: Vec<f64> = (0..reps).map(|_| run(n).as_secs_f64()).collect();
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let per = median / n as f64;
        let b = *base.get_or_insert(per);
        println!(
            "| {n} | {:.1} ms | {:.2} µs | {:.2} |",
            median * 1e3,
            per * 1e6,
            per / b
        );
    }
}
