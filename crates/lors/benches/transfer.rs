//! Upload and download of a 1 GiB file across 4 local depots with 1, 4 and 8
//! threads, beside a plain single-stream STORE/LOAD of the same bytes through
//! one depot measured in the same run. Prints figures and ratios; asserts none.
//!
//! `cargo bench -p lors --bench transfer` (env `LORS_BENCH_MIB`, default 1024;
//! `LORS_BENCH_REPS`, default 3; data in /dev/shm when present).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lors::download::{DownloadOptions, Output, download};
use lors::upload::{UploadOptions, upload};
use lors::{NoProgress, Pool};
use lors_depot::Depot;
use lors_depot::config::{ByteSize, Config, ResourceConfig, SyncPolicy};
use lors_exnode::functions::{Chain, Codec, Step};
use lors_ibp::proto::{AllocType, Lease, Reliability};
use lors_ibp::{CapKind, ClientConfig, Connection};

const MIB: u64 = 1 << 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let mib: u64 = std::env::var("LORS_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let reps: usize = std::env::var("LORS_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm".to_string()
    } else {
        std::env::temp_dir().display().to_string()
    };
    let dir = tempfile::Builder::new()
        .prefix("lors-transfer-")
        .tempdir_in(&base)
        .expect("temp dir");
    let size = mib * MIB;
    // Depots on their own runtime, the client on another, as separate processes would be.
    let depot_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let addrs: Vec<String> = depot_rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..4 {
            let mut r = ResourceConfig::new("1", dir.path().join(format!("d{i}")));
            r.size = ByteSize(size * 2 + (64 << 20));
            let cfg = Config {
                listen: "127.0.0.1:0".parse().unwrap(),
                sync: SyncPolicy::Never,
                resources: vec![r],
                ..Config::default()
            };
            let d = Depot::open(cfg).await.unwrap();
            let l = d.bind().await.unwrap();
            v.push(l.ibp.local_addr().unwrap().to_string());
            tokio::spawn(lors_depot::server::run(l, d, rx.clone()));
        }
        v
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let data: Vec<u8> = (0..size)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    println!(
        "lors transfer benchmark — {mib} MiB, 4 depots on loopback, data in {base}, {reps} reps, medians"
    );
    let rate = |d: Duration| mib as f64 / d.as_secs_f64();

    // Baseline: one connection, one depot, STORE then LOAD in 10 MiB pieces.
    let (mut bu, mut bd) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (u, d) = rt.block_on(async {
            let mut c = Connection::connect(&addrs[0], &ClientConfig::default())
                .await
                .unwrap();
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
            for chunk in data.chunks(10 << 20) {
                c.store(&caps.write, chunk).await.unwrap();
            }
            let u = t.elapsed();
            let t = Instant::now();
            c.load_to(&caps.read, 0, size, &mut tokio::io::sink())
                .await
                .unwrap();
            let d = t.elapsed();
            c.decr(&caps.manage, CapKind::Read).await.unwrap();
            (u, d)
        });
        bu.push(rate(u));
        bd.push(rate(d));
    }
    let (base_up, base_down) = (median(bu), median(bd));
    println!(
        "\n{:<34} {:>12} {:>12} {:>10} {:>10}",
        "configuration", "upload MiB/s", "dl MiB/s", "up/base", "dl/base"
    );
    println!(
        "{:<34} {:>12.0} {:>12.0} {:>10} {:>10}",
        "single stream, 1 depot (baseline)", base_up, base_down, "1.00", "1.00"
    );
    for (threads, e2e, label) in [
        (1, None, "lors, 4 depots, 1 thread, raw"),
        (4, None, "lors, 4 depots, 4 threads, raw"),
        (8, None, "lors, 4 depots, 8 threads, raw"),
        (8, Some(()), "lors, 4 depots, 8 threads, blake3"),
    ] {
        let (mut us, mut ds) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let opts = UploadOptions {
                depots: addrs.clone(),
                block_size: 10 * MIB,
                copies: 1,
                threads,
                duration: Duration::from_secs(600),
                reliability: Reliability::Hard,
                filename: "bench".into(),
                erasure: None,
                sparse: false,
                auto_threads: false,
                auto_block_size: false,
                e2e: e2e.map(|()| {
                    Codec::Native(Chain {
                        block_size: MIB,
                        steps: vec![Step::Blake3],
                    })
                }),
            };
            let (u, d) = rt.block_on(async {
                let pool = Arc::new(Pool::new(ClientConfig::default()));
                let t = Instant::now();
                let x = upload(
                    &data[..],
                    Some(size),
                    &opts,
                    pool.clone(),
                    Arc::new(NoProgress),
                )
                .await
                .unwrap()
                .exnode;
                let u = t.elapsed();
                let dl = DownloadOptions {
                    conns_per_depot: threads.div_ceil(4).max(1),
                    ..DownloadOptions::default()
                };
                let t = Instant::now();
                download(
                    &x,
                    Output::Stream {
                        writer: Box::new(tokio::io::sink()),
                        name: "a sink".into(),
                    },
                    &dl,
                    pool.clone(),
                    Arc::new(NoProgress),
                )
                .await
                .unwrap();
                let d = t.elapsed();
                // Freed for the next round (no exNode names them).
                pool.release_all(x.mappings.clone()).await;
                (u, d)
            });
            us.push(rate(u));
            ds.push(rate(d));
        }
        let (u, d) = (median(us), median(ds));
        println!(
            "{label:<34} {u:>12.0} {d:>12.0} {:>10.2} {:>10.2}",
            u / base_up,
            d / base_down
        );
    }
    println!(
        "\n(loopback: all depots share this machine's 2 cores and memory bandwidth, so striping"
    );
    println!(
        " shows engine overhead here; link-rate scaling is measured in the network lab, issue 5)"
    );
}
