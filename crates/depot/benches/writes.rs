//! Small-WRITE throughput with the durability promise kept, beside the same
//! with syncing off, in one run: 64 KiB and 1 MiB WRITEs from 1 and 16
//! concurrent clients, each client writing its own allocation (as LStore's
//! `ibp_perf` does). The data lives on the real disk (the point is the cost of
//! `fdatasync`), in `LORS_BENCH_DIR` or the system temp directory.
//!
//! `cargo bench -p lors-depot --bench writes` — prints MiB/s per case and the
//! ratio sync/no-sync; never asserts a number. Env: `LORS_BENCH_SECS` (per
//! case, default 3), `LORS_BENCH_REPS` (default 3; the median is shown).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lors_depot::Depot;
use lors_depot::config::{ByteSize, Config, ResourceConfig, SyncPolicy};
use lors_ibp::proto::{AllocType, Lease, Reliability};
use lors_ibp::{ClientConfig, Connection};

const MIB: u64 = 1 << 20;
/// Bytes each client's allocation holds; its WRITEs cycle through it.
const ALLOC: u64 = 64 * MIB;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Starts a depot with `sync` in `dir`; returns it and its address.
async fn depot(dir: &std::path::Path, sync: SyncPolicy) -> (Arc<Depot>, String) {
    let mut res = ResourceConfig::new("1", dir.to_path_buf());
    res.size = ByteSize(64 * ALLOC);
    let cfg = Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        resources: vec![res],
        sync,
        ..Config::default()
    };
    let d = Depot::open(cfg).await.expect("depot opens");
    let l = d.bind().await.expect("bind");
    let addr = l.ibp.local_addr().expect("address").to_string();
    let (tx, rx) = tokio::sync::watch::channel(false);
    std::mem::forget(tx); // serves until the process ends
    tokio::spawn(lors_depot::server::run(l, d.clone(), rx));
    (d, addr)
}

/// MiB/s of `clients` connections each WRITEing `size`-byte pieces into its
/// own allocation for `secs`.
async fn run(addr: &str, clients: usize, size: usize, secs: f64) -> f64 {
    let cfg = ClientConfig::default();
    let mut tasks = Vec::new();
    let start = Instant::now() + Duration::from_millis(200);
    let stop = start + Duration::from_secs_f64(secs);
    for i in 0..clients {
        let addr = addr.to_owned();
        let cfg = cfg.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Connection::connect(&addr, &cfg).await.expect("connect");
            let caps = c
                .allocate(
                    "1",
                    Reliability::Hard,
                    AllocType::ByteArray,
                    Lease::Secs(3600),
                    ALLOC,
                )
                .await
                .expect("allocate");
            let buf = vec![i as u8; size];
            tokio::time::sleep_until(start.into()).await;
            let mut done = 0u64;
            let mut off = 0u64;
            while Instant::now() < stop {
                c.write_at(&caps.write, off, &buf).await.expect("write");
                done += size as u64;
                off = (off + size as u64) % (ALLOC - size as u64);
            }
            c.decr(&caps.manage, lors_ibp::caps::CapKind::Read)
                .await
                .expect("decr");
            done
        }));
    }
    let mut total = 0u64;
    for t in tasks {
        total += t.await.expect("client task");
    }
    total as f64 / MIB as f64 / secs
}

fn main() {
    // `cargo test --benches` runs bench targets with --bench absent: do nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let secs: f64 = std::env::var("LORS_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let reps: usize = std::env::var("LORS_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let base = std::env::var("LORS_BENCH_DIR")
        .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dirs = (
            tempfile::Builder::new()
                .prefix("lors-bench-sync-")
                .tempdir_in(&base)
                .expect("dir"),
            tempfile::Builder::new()
                .prefix("lors-bench-nosync-")
                .tempdir_in(&base)
                .expect("dir"),
        );
        let (_a, synced) = depot(dirs.0.path(), SyncPolicy::Always).await;
        let (_b, unsynced) = depot(dirs.1.path(), SyncPolicy::Never).await;
        println!("WRITE throughput, MiB/s (median of {reps} runs of {secs} s; data in {base})");
        println!(
            "{:>8} {:>8} {:>12} {:>12} {:>10}",
            "size", "clients", "sync=always", "sync=never", "ratio"
        );
        for size in [64usize << 10, 1 << 20] {
            for clients in [1usize, 16] {
                let (mut with, mut without) = (Vec::new(), Vec::new());
                // Interleaved, so both see the same machine.
                for _ in 0..reps {
                    with.push(run(&synced, clients, size, secs).await);
                    without.push(run(&unsynced, clients, size, secs).await);
                }
                let (w, wo) = (median(&mut with), median(&mut without));
                println!(
                    "{:>7}K {:>8} {:>12.1} {:>12.1} {:>10.2}",
                    size >> 10,
                    clients,
                    w,
                    wo,
                    w / wo
                );
            }
        }
    });
}
