//! Depot STORE/LOAD throughput on loopback, beside `iperf3` measured in the
//! same run (the physical limit of this machine's loopback, single stream).
//!
//! `cargo bench -p lors-depot --bench loopback` — prints a table and ratios;
//! never asserts a number. Data lives in /dev/shm when it exists, so the disk
//! is not what is measured. Env: `LORS_BENCH_REPS` (default 7),
//! `LORS_BENCH_DIR` (data directory).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lors_depot::Depot;
use lors_depot::config::{ByteSize, Config, ResourceConfig};
use lors_ibp::proto::{AllocType, Lease, Reliability};
use lors_ibp::{ClientConfig, Connection};

const MIB: u64 = 1 << 20;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// iperf3 single-stream loopback throughput in MiB/s, or `None` if absent.
fn iperf3(secs: u32) -> Option<f64> {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
        l.local_addr().ok()?.port()
    };
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(300));
    let out = Command::new("iperf3")
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            &secs.to_string(),
            "-J",
        ])
        .output()
        .ok();
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8(out?.stdout).ok()?;
    // "sum_received": { ... "bits_per_second": N ... }
    let at = text.find("\"sum_received\"")?;
    let rest = &text[at..];
    let b = rest.find("\"bits_per_second\"")?;
    let num: String = rest[b + 17..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '+')
        .collect();
    let bps: f64 = num.parse().ok()?;
    Some(bps / 8.0 / MIB as f64)
}

fn main() {
    // `cargo test --benches` runs bench targets with --bench absent: do nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let reps: usize = std::env::var("LORS_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let base = std::env::var("LORS_BENCH_DIR").unwrap_or_else(|_| {
        if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm".into()
        } else {
            std::env::temp_dir().display().to_string()
        }
    });
    let dir = tempfile::Builder::new()
        .prefix("lors-bench-")
        .tempdir_in(&base)
        .expect("temp dir");
    // The depot gets its own runtime and the client another, as two processes
    // would: sharing one scheduler would make them take turns.
    let depot_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    println!("lors depot loopback benchmark — data in {base}, {reps} repetitions, medians");
    let iperf_before = iperf3(3);
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let addr = depot_rt.block_on(async {
        let mut r = ResourceConfig::new("1", dir.path().join("r1"));
        r.size = ByteSize(4 << 30);
        let cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            resources: vec![r],
            ..Config::default()
        };
        let depot: Arc<Depot> = Depot::open(cfg).await.expect("open depot");
        let l = depot.bind().await.expect("bind");
        let addr = l.ibp.local_addr().unwrap().to_string();
        tokio::spawn(lors_depot::server::run(l, depot, rx));
        addr
    });
    let rows = rt.block_on(async {
        let mut c = Connection::connect(&addr, &ClientConfig::default())
            .await
            .unwrap();
        let mut rows = Vec::new();
        for mib in [1u64, 16, 64] {
            let size = mib * MIB;
            let data = vec![0xA5u8; usize::try_from(size).unwrap()];
            let (mut st, mut ld) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                let caps = c
                    .allocate(
                        "1",
                        Reliability::Hard,
                        AllocType::ByteArray,
                        Lease::Secs(600),
                        size,
                    )
                    .await
                    .unwrap();
                let t = Instant::now();
                c.store(&caps.write, &data).await.unwrap();
                st.push(mib as f64 / t.elapsed().as_secs_f64());
                let t = Instant::now();
                c.load_to(&caps.read, 0, size, &mut tokio::io::sink())
                    .await
                    .unwrap();
                ld.push(mib as f64 / t.elapsed().as_secs_f64());
                c.decr(&caps.manage, lors_ibp::CapKind::Read).await.unwrap();
            }
            let (smin, smax) = (
                st.iter().cloned().fold(f64::MAX, f64::min),
                st.iter().cloned().fold(0.0, f64::max),
            );
            let (lmin, lmax) = (
                ld.iter().cloned().fold(f64::MAX, f64::min),
                ld.iter().cloned().fold(0.0, f64::max),
            );
            rows.push((
                mib,
                median(&mut st),
                smin,
                smax,
                median(&mut ld),
                lmin,
                lmax,
            ));
        }
        rows
    });
    let iperf_after = iperf3(3);
    let iperf = match (iperf_before, iperf_after) {
        (Some(a), Some(b)) => Some((a + b) / 2.0),
        (a, b) => a.or(b),
    };
    println!();
    println!(
        "{:>6}  {:>22}  {:>22}  {:>12}  {:>12}",
        "size", "STORE MiB/s (min–max)", "LOAD MiB/s (min–max)", "STORE/iperf3", "LOAD/iperf3"
    );
    for (mib, s, smin, smax, l, lmin, lmax) in rows {
        let ratio = |x: f64| iperf.map_or("n/a".to_string(), |i| format!("{:.2}", x / i));
        println!(
            "{:>4}MiB  {:>8.0} ({:>5.0}–{:>5.0})  {:>8.0} ({:>5.0}–{:>5.0})  {:>12}  {:>12}",
            mib,
            s,
            smin,
            smax,
            l,
            lmin,
            lmax,
            ratio(s),
            ratio(l)
        );
    }
    match iperf {
        Some(i) => println!(
            "\niperf3 single stream, loopback, same run: {i:.0} MiB/s (before {:.0}, after {:.0})",
            iperf_before.unwrap_or(f64::NAN),
            iperf_after.unwrap_or(f64::NAN)
        ),
        None => {
            println!("\niperf3 not found: install it (apt-get install iperf3) for the ratio column")
        }
    }
}
