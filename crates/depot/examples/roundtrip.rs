//! The main job for now: start a depot on loopback, push a file through it in
//! IBP allocations, read it back, verify every byte, report the throughput.
//!
//! `cargo run --release -p lors-depot --example roundtrip -- [FILE]`
//! (without FILE, 256 MiB of generated data).

use std::sync::Arc;
use std::time::Instant;

use lors_depot::Depot;
use lors_depot::config::{ByteSize, Config, ResourceConfig};
use lors_ibp::proto::{AllocType, Lease, Reliability};
use lors_ibp::{ClientConfig, Connection};

const BLOCK: usize = 16 << 20;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = match std::env::args().nth(1) {
        Some(path) => std::fs::read(&path).map_err(|e| format!("reading {path}: {e}"))?,
        None => (0..256u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect(),
    };
    let dir = tempfile::Builder::new()
        .prefix("lors-roundtrip-")
        .tempdir()?;
    let mut res = ResourceConfig::new("1", dir.path().join("r1"));
    res.size = ByteSize((data.len() as u64 + (64 << 20)).max(1 << 30));
    let cfg = Config {
        listen: "127.0.0.1:0".parse()?,
        resources: vec![res],
        ..Config::default()
    };
    let depot: Arc<Depot> = Depot::open(cfg).await?;
    let listeners = depot.bind().await?;
    let addr = listeners.ibp.local_addr()?.to_string();
    let (_stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(lors_depot::server::run(listeners, depot, rx));
    println!(
        "depot serving IBP on {addr} (data in {})",
        dir.path().display()
    );

    let mut c = Connection::connect(&addr, &ClientConfig::default()).await?;
    let t = Instant::now();
    let mut caps = Vec::new();
    for block in data.chunks(BLOCK) {
        let cs = c
            .allocate(
                "0",
                Reliability::Hard,
                AllocType::ByteArray,
                Lease::Secs(3600),
                block.len() as u64,
            )
            .await?;
        c.store(&cs.write, block).await?;
        caps.push((cs, block.len()));
    }
    let up = t.elapsed();
    let t = Instant::now();
    let mut back = Vec::with_capacity(data.len());
    for (cs, len) in &caps {
        let mut buf = vec![0u8; *len];
        c.load(&cs.read, 0, &mut buf).await?;
        back.extend_from_slice(&buf);
    }
    let down = t.elapsed();
    let mib = data.len() as f64 / f64::from(1 << 20);
    if back != data {
        return Err("data read back differs from data stored".into());
    }
    println!(
        "stored {mib:.1} MiB in {} allocations: {:.0} MiB/s",
        caps.len(),
        mib / up.as_secs_f64()
    );
    println!(
        "loaded and verified every byte: {:.0} MiB/s",
        mib / down.as_secs_f64()
    );
    if let Some((cs, _)) = caps.first() {
        let p = c.probe(&cs.manage).await?;
        println!(
            "first allocation: {} bytes of {}, expires in {} s",
            p.size, p.max_size, p.seconds_left
        );
    }
    println!("round trip OK");
    Ok(())
}
