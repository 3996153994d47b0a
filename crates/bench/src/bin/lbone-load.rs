//! The L-Bone load generator: a federation's worth of depots heartbeating
//! while clients ask for ranked depots, against running `lors lbone`
//! instances. `bench/lbone_load.py` starts the instances, runs this, and
//! writes the report.
//!
//! ```text
//! lbone-load --lbone http://127.0.0.1:8767[,http://…] --token T \
//!            [--depots 10000] [--regs 333] [--queries 1000] [--seconds 60] [--clients 64]
//! ```
//!
//! It registers `--depots` depots (200 cities with coordinates), prints
//! `load` on a line of its own, then for `--seconds` keeps up, open loop,
//! `--regs` registrations and `--queries` ranked queries a second, each
//! like an upload's (`count=8&hard=1G&duration=1d&location=city=…&lat=…&
//! lon=…`). Requests go from `--clients` loopback addresses (127.0.0.2…),
//! each a keep-alive client as the tools and depots are, spread over the
//! instances. A request is timed from when it was due, so a server that
//! falls behind shows it in the latency. Prints one JSON line of results.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lors_http::{BaseUrl, Client};

const CITIES: u64 = 200;

struct Args {
    lbones: Vec<BaseUrl>,
    token: String,
    depots: u64,
    regs: f64,
    queries: f64,
    seconds: f64,
    clients: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        lbones: Vec::new(),
        token: String::new(),
        depots: 10_000,
        regs: 333.0,
        queries: 1000.0,
        seconds: 60.0,
        clients: 64,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<f64>()
                .map_err(|_| format!("{flag}: not a number"))
        };
        match flag.as_str() {
            "--lbone" => {
                for u in v.split(',') {
                    a.lbones.push(BaseUrl::parse(u)?);
                }
            }
            "--token" => a.token = v,
            "--depots" => a.depots = num(&v)? as u64,
            "--regs" => a.regs = num(&v)?,
            "--queries" => a.queries = num(&v)?,
            "--seconds" => a.seconds = num(&v)?,
            "--clients" => a.clients = (num(&v)? as usize).clamp(1, 250),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.lbones.is_empty() || a.token.is_empty() {
        return Err("give --lbone URL[,URL…] and --token".into());
    }
    Ok(a)
}

fn registration(i: u64) -> Vec<u8> {
    let c = i % CITIES;
    serde_json::json!({
        "host": format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
        "port": 6714,
        "resources": [{
            "rid": "1",
            "hard_free": (1 + i % 50) << 30,
            "hard_total": 100u64 << 30,
            "soft_free": 0,
            "soft_total": 0,
            "max_duration": 30 * 86_400,
            "types": ["byte_array"],
        }],
        "location": {
            "city": format!("City{c}"),
            "country": "US",
            "latitude": -60.0 + (c as f64 * 0.6) % 120.0,
            "longitude": -170.0 + (c as f64 * 1.7) % 340.0,
        },
        "version": "lors load",
    })
    .to_string()
    .into_bytes()
}

/// A small deterministic generator (xorshift): the same queries each run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
}

fn query(rng: &mut Rng) -> String {
    let c = rng.next() % CITIES;
    let (lat, lon) = (rng.uniform(-60.0, 60.0), rng.uniform(-170.0, 170.0));
    format!(
        "/api/v1/depots?count=8&hard=1G&duration=1d&location=city%3DCity{c}&lat={lat:.3}&lon={lon:.3}"
    )
}

/// What one stream of requests saw.
#[derive(Default)]
struct Seen {
    done: u64,
    latencies: Vec<f64>,
    errors: Vec<String>,
}

/// One request: a failure is a refusal, a transport error, a non-200
/// answer, or no answer within ten seconds.
async fn one(
    c: &Client,
    at: &BaseUrl,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
) -> Result<(), String> {
    let method = if body.is_some() { "POST" } else { "GET" };
    match c
        .fetch(at, method, path, token, body, Duration::from_secs(10))
        .await
    {
        Ok((200, _)) => Ok(()),
        Ok((s, b)) => Err(format!(
            "HTTP {s} {}",
            String::from_utf8_lossy(&b[..b.len().min(80)])
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// Requests `make(k)` at `rate` a second for `seconds`, open loop: each
/// is started when due (at most 4,096 in flight) and timed from then.
async fn paced(
    a: &Args,
    clients: &[Client],
    rate: f64,
    make: impl Fn(u64) -> (String, Option<Vec<u8>>),
) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    if rate <= 0.0 {
        return Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap();
    }
    let n = (rate * a.seconds) as u64;
    let room = Arc::new(tokio::sync::Semaphore::new(4096));
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..n {
        let due = start + Duration::from_secs_f64(k as f64 / rate);
        tokio::time::sleep_until(due).await;
        let permit = room.clone().acquire_owned().await.expect("never closed");
        let c = clients[k as usize % clients.len()].clone();
        // Client addresses stay with one instance, as a client would.
        let at = a.lbones[k as usize % clients.len() % a.lbones.len()].clone();
        let (path, body) = make(k);
        let token = body.as_ref().map(|_| a.token.clone());
        let seen = seen.clone();
        tasks.spawn(async move {
            let r = one(&c, &at, &path, token.as_deref(), body.as_deref()).await;
            let took = due.elapsed().as_secs_f64();
            let mut s = seen.lock().unwrap();
            s.done += 1;
            s.latencies.push(took);
            if let Err(e) = r {
                s.errors.push(e);
            }
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((p / 100.0 * sorted.len() as f64) as usize).min(sorted.len() - 1)]
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lbone-load: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(run(a));
}

async fn run(a: Args) {
    let clients: Vec<Client> = (0..a.clients)
        .map(|i| Client::from_address(Some(IpAddr::from([127, 0, 0, 2 + i as u8]))))
        .collect();
    // Every depot registered first, 64 at a time.
    let t = Instant::now();
    let mut setup = tokio::task::JoinSet::new();
    let room = Arc::new(tokio::sync::Semaphore::new(64));
    for i in 0..a.depots {
        let permit = room.clone().acquire_owned().await.expect("never closed");
        let c = clients[i as usize % clients.len()].clone();
        let at = a.lbones[i as usize % a.lbones.len()].clone();
        let token = a.token.clone();
        setup.spawn(async move {
            let r = one(
                &c,
                &at,
                "/api/v1/register",
                Some(&token),
                Some(&registration(i)),
            )
            .await;
            drop(permit);
            r
        });
        while let Some(r) = setup.try_join_next() {
            if let Ok(Err(e)) = r {
                eprintln!("lbone-load: a registration failed while setting up: {e}");
                std::process::exit(1);
            }
        }
    }
    while let Some(r) = setup.join_next().await {
        if let Ok(Err(e)) = r {
            eprintln!("lbone-load: a registration failed while setting up: {e}");
            std::process::exit(1);
        }
    }
    let setup_rate = a.depots as f64 / t.elapsed().as_secs_f64();
    // The driver samples the servers' CPU from here.
    println!("load");
    let rng = Mutex::new(Rng(0x9E37_79B9_7F4A_7C15));
    let depots = a.depots.max(1);
    let t = Instant::now();
    let (q, r) = tokio::join!(
        paced(&a, &clients, a.queries, |_| (
            query(&mut rng.lock().unwrap()),
            None
        )),
        paced(&a, &clients, a.regs, |k| (
            "/api/v1/register".to_owned(),
            Some(registration(k % depots))
        )),
    );
    let wall = t.elapsed().as_secs_f64();
    let mut lat = q.latencies;
    lat.sort_by(f64::total_cmp);
    let mut kinds: Vec<String> = q.errors.iter().chain(&r.errors).cloned().collect();
    kinds.sort();
    kinds.dedup();
    kinds.truncate(4);
    let out = serde_json::json!({
        "setup_regs_per_s": setup_rate,
        "regs_per_s": (r.done - r.errors.len() as u64) as f64 / wall,
        "queries_per_s": (q.done - q.errors.len() as u64) as f64 / wall,
        "p50_ms": pct(&lat, 50.0) * 1e3,
        "p99_ms": pct(&lat, 99.0) * 1e3,
        "max_ms": lat.last().copied().unwrap_or(f64::NAN) * 1e3,
        "errors": q.errors.len() + r.errors.len(),
        "error_kinds": kinds,
        "wall_s": wall,
    });
    println!("{out}");
}
