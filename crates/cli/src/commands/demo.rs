//! `lors demo`: the whole system on one machine in under a minute.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use lors::download::{DownloadOptions, Output, download};
use lors::upload::{UploadOptions, upload};
use lors::{NoProgress, Pool};
use lors_depot::Depot;
use lors_depot::config::{ByteSize, Config, ResourceConfig, SyncPolicy};
use lors_exnode::functions::{Chain, Codec, Step};
use lors_ibp::ClientConfig;
use lors_ibp::proto::Reliability;

use super::size_arg;

/// Start 4 depots on loopback, upload a generated file striped with 2 copies,
/// list it, kill a depot, download, verify, and report.
#[derive(clap::Args)]
pub struct Args {
    /// Size of the generated file.
    #[arg(long, value_parser = size_arg, default_value = "256M")]
    size: u64,
    /// Block size.
    #[arg(short = 'b', long = "block-size", value_parser = size_arg, default_value = "8M")]
    block_size: u64,
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1048576.0 / d.as_secs_f64().max(1e-9)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("lors-demo-{}", std::process::id()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let res = rt.block_on(demo(&a, &dir));
    let _ = std::fs::remove_dir_all(&dir);
    res
}

async fn demo(a: &Args, dir: &std::path::Path) -> anyhow::Result<()> {
    println!(
        "== starting 4 depots on 127.0.0.1 (data in {})",
        dir.display()
    );
    let mut addrs = Vec::new();
    let mut stops = Vec::new();
    for i in 1..=4 {
        let mut r = ResourceConfig::new("1", dir.join(format!("depot{i}")));
        r.size = ByteSize(a.size.max(1 << 20) * 2);
        let cfg = Config {
            listen: "127.0.0.1:0".parse()?,
            sync: SyncPolicy::Never,
            resources: vec![r],
            ..Config::default()
        };
        let depot = Depot::open(cfg).await.context("opening a demo depot")?;
        let l = depot.bind().await?;
        let addr = l.ibp.local_addr()?.to_string();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(lors_depot::server::run(l, depot, rx));
        println!("   depot {i}: ibp://{addr}");
        addrs.push(addr);
        stops.push((tx, task));
    }

    println!("== generating {} MiB of test data", a.size >> 20);
    let data: Vec<u8> = (0..a.size)
        .map(|i| (i.wrapping_mul(0x9E37_79B9) >> 11) as u8)
        .collect();
    let pool = Arc::new(Pool::new(ClientConfig::default()));
    let opts = UploadOptions {
        depots: addrs.clone(),
        block_size: a.block_size,
        copies: 2,
        threads: 8,
        duration: Duration::from_secs(3600),
        reliability: Reliability::Hard,
        filename: "demo.bin".into(),
        e2e: Some(Codec::Native(Chain {
            block_size: 1 << 20,
            steps: vec![Step::Blake3],
        })),
    };
    let t = Instant::now();
    let x = upload(
        &data[..],
        Some(a.size),
        &opts,
        pool.clone(),
        Arc::new(NoProgress),
    )
    .await?;
    let up = t.elapsed();
    println!(
        "== uploaded: {} blocks x 2 copies = {} mappings in {:.2}s ({:.0} MiB/s; second copies made depot-to-depot)",
        x.mappings.len() / 2,
        x.mappings.len(),
        up.as_secs_f64(),
        mib_s(a.size, up)
    );
    println!("== where the blocks are:");
    for addr in &addrs {
        let n = x
            .mappings
            .iter()
            .filter(|m| m.depot().as_deref() == Some(addr.as_str()))
            .count();
        println!("   {addr}: {n} blocks");
    }

    let victim = addrs[1].clone();
    let (tx, task) = stops.remove(1);
    let _ = tx.send(true);
    let _ = task.await;
    println!("== killed depot {victim}; downloading from the survivors");
    let (wtx, mut rx) = tokio::io::duplex(4 << 20);
    let reader = tokio::spawn(async move {
        let mut v = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut rx, &mut v)
            .await
            .map(|_| v)
    });
    let dl = DownloadOptions {
        block_size: a.block_size,
        ..DownloadOptions::default()
    };
    let stats = download(
        &x,
        Output::Writer(Box::new(wtx)),
        &dl,
        pool,
        Arc::new(NoProgress),
    )
    .await?;
    let back = reader.await??;
    println!(
        "== downloaded {} bytes in {:.2}s ({:.0} MiB/s), {} reads moved to replicas",
        stats.bytes,
        stats.elapsed.as_secs_f64(),
        mib_s(stats.bytes, stats.elapsed),
        stats.retries
    );
    for (d, b) in &stats.per_depot {
        println!("   from {d}: {:.0} MiB", *b as f64 / 1048576.0);
    }
    anyhow::ensure!(back == data, "downloaded data differs from the original");
    println!("== verified: every byte identical. demo OK");
    for (tx, task) in stops {
        let _ = tx.send(true);
        let _ = task.await;
    }
    Ok(())
}
