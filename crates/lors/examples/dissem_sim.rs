//! A flow-level simulation of `lors disseminate`: the same sans-I/O
//! scheduler (`lors::dissem::sched`) the command runs, its transfers turned
//! into flows over hosts' up and down links shared max-min fairly, in time
//! steps. Checked against the network lab at N <= 8 (`bench/dissem.py`),
//! then run where no lab reaches: hundreds or thousands of sites with
//! rates drawn from a spread, some lost mid-run.
//!
//!     cargo run --release -p lors --example dissem_sim -- --sites 8
//!     cargo run --release -p lors --example dissem_sim -- --sites 1000 --spread 0.7 --lose 0.05
//!
//! Options: --sites N (8), --size MiB (48), --rate Mbit/s (100, the median
//! site and the source), --spread SIGMA (0: every site at --rate; else
//! log-normal rates, clipped to rate/10..rate*10), --lose FRACTION (sites
//! killed at half the ideal time), --blocks B (default: as the command,
//! ~16 per site, at most 256 here), --setup MS (per copy before data flows:
//! allocate + request, 3), --efficiency F (TCP goodput over line rate,
//! 0.95), --steps K (time steps per S/R, 4000), --client-weight W (2: the client's copies run over warm pooled
//! connections, a depot's SEND opens a new one per copy and starts slow;
//! with it the model meets the lab), --seed S. SIM_TRACE=1 prints the
//! source's progress as it goes.
//!
//! Prints one line: total time over S/R, per-site time over what the site's
//! own link allows, S/min(r, R) (median, max), source egress over S, copies
//! made.
//!
//! Validated against the lab (docs/bench/2026-11-23-dissem.md): N = 2, 4, 8
//! give 1.15, 1.13, 1.20 × S/R where the lab measured 1.19, 1.18, 1.22
//! (whole commands, start-up included).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lors::dissem::sched::{Config, Sched, Source, Transfer};

struct Args {
    sites: usize,
    size: f64,
    rate: f64,
    spread: f64,
    lose: f64,
    blocks: Option<usize>,
    setup: f64,
    efficiency: f64,
    seed: u64,
    /// Weight of the client's flows against relays' in the sharing.
    client_weight: f64,
    /// Time steps per S/R.
    steps: f64,
}

fn args() -> Args {
    let mut a = Args {
        sites: 8,
        size: 48.0 * 1048576.0,
        rate: 100e6 / 8.0,
        spread: 0.0,
        lose: 0.0,
        blocks: None,
        setup: 0.003,
        efficiency: 0.95,
        seed: 1,
        client_weight: 2.0,
        steps: 4000.0,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    for pair in v.chunks(2) {
        let x = pair.get(1).map(String::as_str).unwrap_or("");
        let f = || x.parse::<f64>().expect("a number");
        match pair[0].as_str() {
            "--sites" => a.sites = f() as usize,
            "--size" => a.size = f() * 1048576.0,
            "--rate" => a.rate = f() * 1e6 / 8.0,
            "--spread" => a.spread = f(),
            "--lose" => a.lose = f(),
            "--blocks" => a.blocks = Some(f() as usize),
            "--setup" => a.setup = f() / 1000.0,
            "--efficiency" => a.efficiency = f(),
            "--seed" => a.seed = f() as u64,
            "--client-weight" => a.client_weight = f(),
            "--steps" => a.steps = f(),
            o => panic!("unknown option {o}"),
        }
    }
    a
}

/// xorshift64*: reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-12), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

struct Flow {
    t: Transfer,
    from: usize,
    to: usize,
    left: f64,
    /// Seconds of set-up left before data flows.
    setup: f64,
}

/// Weighted max-min fair rates for flows `(from, to, weight)` over
/// per-host `up` and `down` capacities: the common level of the flows not
/// yet limited rises until a link fills; its flows keep that level; a heap
/// of the level at which each link would fill finds the next, so a round
/// costs O(flows log links) and 1,000 sites run in minutes.
fn fair(flows: &[(usize, usize, f64)], up: &[f64], down: &[f64]) -> Vec<f64> {
    use std::cmp::Ordering;
    use std::collections::BinaryHeap;
    #[derive(PartialEq)]
    struct At(f64, usize, u32);
    impl Eq for At {}
    impl PartialOrd for At {
        fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for At {
        // Lowest level first.
        fn cmp(&self, o: &Self) -> Ordering {
            o.0.total_cmp(&self.0)
        }
    }
    let h = up.len();
    // Link x: host x's up link; link h + x: its down link.
    let mut rem: Vec<f64> = up.iter().chain(down).copied().collect();
    let mut wsum = vec![0.0f64; 2 * h];
    let mut on: Vec<Vec<usize>> = vec![Vec::new(); 2 * h];
    for (i, &(f, t, w)) in flows.iter().enumerate() {
        for l in [f, h + t] {
            wsum[l] += w;
            on[l].push(i);
        }
    }
    let mut version = vec![0u32; 2 * h];
    let mut heap: BinaryHeap<At> = (0..2 * h)
        .filter(|&l| wsum[l] > 0.0)
        .map(|l| At(rem[l] / wsum[l], l, 0))
        .collect();
    let mut rate = vec![f64::NAN; flows.len()];
    while let Some(At(level, l, v)) = heap.pop() {
        if v != version[l] || wsum[l] <= 0.0 {
            continue;
        }
        wsum[l] = 0.0;
        for &i in &on[l] {
            if !rate[i].is_nan() {
                continue;
            }
            let (f, t, w) = flows[i];
            rate[i] = level * w;
            let other = if l == f { h + t } else { f };
            rem[other] -= level * w;
            wsum[other] -= w;
            version[other] += 1;
            if wsum[other] > 1e-12 {
                heap.push(At(
                    (rem[other] / wsum[other]).max(level),
                    other,
                    version[other],
                ));
            }
        }
    }
    rate
}

/// Moves every flow on by `dt` at its fair share of the links; the
/// transfers that ended.
fn advance(flows: &mut Vec<Flow>, cap: &[f64], client_weight: f64, dt: f64) -> Vec<Transfer> {
    let moving: Vec<usize> = (0..flows.len())
        .filter(|&i| flows[i].setup <= 0.0)
        .collect();
    // The client's copies run over warm pooled connections; a SEND is a new
    // depot-to-depot connection per copy, starting slow.
    let pairs: Vec<(usize, usize, f64)> = (moving.iter())
        .map(|&i| {
            let w = if flows[i].from == 0 {
                client_weight
            } else {
                1.0
            };
            (flows[i].from, flows[i].to, w)
        })
        .collect();
    let rates = fair(&pairs, cap, cap);
    for f in flows.iter_mut() {
        f.setup -= dt;
    }
    for (k, &i) in moving.iter().enumerate() {
        flows[i].left -= rates[k] * dt;
    }
    let mut finished = Vec::new();
    flows.retain(|f| {
        let end = f.left <= 0.0;
        if end {
            finished.push(f.t);
        }
        !end
    });
    finished
}

fn main() {
    let a = args();
    let mut rng = Rng(a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    // Host 0 is the source; host i+1 is site i. Links symmetric.
    let mut cap = vec![a.rate * a.efficiency];
    for _ in 0..a.sites {
        let r = if a.spread > 0.0 {
            (a.rate * (a.spread * rng.normal()).exp()).clamp(a.rate / 10.0, a.rate * 10.0)
        } else {
            a.rate
        };
        cap.push(r * a.efficiency);
    }
    let blocks = a.blocks.unwrap_or_else(|| {
        let bs = lors::dissem::block_size_for(a.size as u64, a.sites) as f64;
        ((a.size / bs).ceil() as usize).clamp(1, 256)
    });
    let bs = a.size / blocks as f64;
    let lens = vec![bs as u64; blocks];
    let mut s = Sched::new(lens, a.sites, Some(Config::default()), None, &[]);
    let t0 = Instant::now();
    let ideal = a.size / a.rate;
    let dt = ideal / a.steps;
    let mut now = 0.0f64;
    let mut flows: Vec<Flow> = Vec::new();
    let mut done_at: HashMap<usize, f64> = HashMap::new();
    let mut lost = Vec::new();
    let mut copies = 0u64;
    let clock = |t: f64| t0 + Duration::from_secs_f64(t);
    loop {
        if a.lose > 0.0 && lost.is_empty() && now >= ideal / 2.0 {
            let n = ((a.sites as f64) * a.lose).round().max(1.0) as usize;
            lost = (0..a.sites)
                .filter(|_| rng.unit() < a.lose)
                .take(n)
                .collect();
            for &x in &lost {
                let void = s.drop_site(x);
                flows.retain(|f| !void.contains(&f.t.id));
            }
        }
        for t in s.next(clock(now)) {
            let from = match t.from {
                Source::Client => 0,
                Source::Site(h) => h + 1,
                Source::Origin(_) => unreachable!("no origins simulated"),
            };
            copies += 1;
            flows.push(Flow {
                t,
                from,
                to: t.to + 1,
                left: bs,
                setup: a.setup,
            });
        }
        if flows.is_empty() {
            break;
        }
        let finished = advance(&mut flows, &cap, a.client_weight, dt);
        now += dt;
        if std::env::var_os("SIM_TRACE").is_some() {
            let busy_in = flows.iter().filter(|f| f.setup <= 0.0).count();
            if ((now / dt) as u64).is_multiple_of(200) {
                eprintln!(
                    "t={:.2} flows={busy_in} client={:.2} done={}",
                    now / ideal,
                    s.client_bytes() as f64 / a.size,
                    done_at.len()
                );
            }
        }
        for t in finished {
            s.done(t.id, clock(now));
            if s.is_complete(t.to) {
                done_at.entry(t.to).or_insert(now);
            }
        }
        assert!(now < ideal * 1000.0, "the simulation runs away");
    }
    let mut per_site: Vec<f64> = (0..a.sites)
        .filter(|x| !lost.contains(x))
        .map(|x| {
            done_at.get(&x).copied().unwrap_or(f64::NAN)
                / (a.size / (cap[x + 1].min(cap[0]) / a.efficiency))
        })
        .collect();
    per_site.sort_by(f64::total_cmp);
    let incomplete = (0..a.sites)
        .filter(|x| !lost.contains(x) && !s.is_complete(*x))
        .count();
    println!(
        "sites {} blocks {blocks} spread {} lost {} | total {:.2} x S/R | per site x own S/r: median {:.2} max {:.2} | source egress {:.2} x S | copies {copies} | incomplete {incomplete}",
        a.sites,
        a.spread,
        lost.len(),
        now / ideal,
        per_site[per_site.len() / 2],
        per_site[per_site.len() - 1],
        s.client_bytes() as f64 / a.size,
    );
}
