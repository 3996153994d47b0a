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
use lors_lbone::client::BaseUrl;
use lors_lbone::client::{DepotQuery, Directory};
use lors_lbone::model::Location;
use lors_lbone::server::LBone;

use super::{nonzero_block_size_arg, size_arg};

/// Start an L-Bone and 4 depots on loopback, upload a generated file striped
/// with 2 copies on the depots the L-Bone ranks, kill a depot, download,
/// verify, and report. The L-Bone's dashboard URL is printed at the start.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors demo                      # 256 MiB, about 5 seconds
  lors demo --size 1G --linger 120   # then look at the dashboard for 2 minutes")]
pub struct Args {
    /// Size of the generated file.
    #[arg(long, value_parser = size_arg, default_value = "256M")]
    size: u64,
    /// Block size.
    #[arg(short = 'b', long = "block-size", value_parser = nonzero_block_size_arg, default_value = "8M")]
    block_size: u64,
    /// Keep the L-Bone and the surviving depots up this long afterwards, to
    /// look at the dashboard.
    #[arg(long, value_parser = super::duration_arg, default_value = "0s")]
    linger: Duration,
}

/// Where the demo depots pretend to be.
const PLACES: [(&str, &str, f64, f64); 4] = [
    ("Knoxville", "US", 35.96, -83.92),
    ("Brno", "CZ", 49.19, 16.61),
    ("Amsterdam", "NL", 52.37, 4.90),
    ("Tokyo", "JP", 35.68, 139.69),
];

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1048576.0 / d.as_secs_f64().max(1e-9)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("lors-demo-{}", std::process::id()));
    let rt = super::runtime(super::Threads::Many)?;
    let res = rt.block_on(demo(&a, &dir));
    let _ = std::fs::remove_dir_all(&dir);
    res
}

async fn demo(a: &Args, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("lbone"))?;
    let token = lors_ibp::caps::Key::generate()?.expose().to_owned();
    let store = lors_lbone::store::SqliteStore::open(&dir.join("lbone").join("lbone.sqlite"))
        .context("opening the demo L-Bone store")?;
    let lb = LBone::new(
        store,
        lors_lbone::server::Config {
            token: token.clone(),
            heartbeat: Duration::from_secs(1),
            offline_after: Duration::from_secs(3),
            sweep_every: Duration::from_secs(1),
            ..lors_lbone::server::Config::default()
        },
    );
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let lb_url = format!("http://{}", http.local_addr()?);
    let (lb_stop, lb_rx) = tokio::sync::watch::channel(false);
    let lb_task = tokio::spawn(lors_lbone::server::run(lb, http, None, lb_rx));
    let up = match a.linger.is_zero() {
        true => "up while the demo runs; --linger 120 keeps it up after".to_string(),
        false => format!("up until {}s after the demo", a.linger.as_secs()),
    };
    println!("== L-Bone directory and dashboard: {lb_url}/ ({up})");
    let base = BaseUrl::parse(&lb_url).map_err(anyhow::Error::msg)?;
    println!(
        "== starting 4 depots on 127.0.0.1 (data in {}), registering with the L-Bone",
        dir.display()
    );
    let (addrs, cities, mut stops) = start_depots(a, dir, &base, &token).await?;
    let directory = Directory::Http(base.clone());
    let ranked = directory
        .depots(
            &DepotQuery {
                count: 4,
                hard: a.block_size * 2,
                duration: 3600,
                location: "country= CZ".into(),
            },
            Duration::from_secs(10),
        )
        .await
        .map_err(anyhow::Error::msg)?;
    println!(
        "== the L-Bone ranks them for a client asking for \"country= CZ\": {}",
        ranked
            .iter()
            .map(|d| cities.get(d).copied().unwrap_or("?"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    println!("== generating {} MiB of test data", a.size >> 20);
    let data: Vec<u8> = (0..a.size)
        .map(|i| (i.wrapping_mul(0x9E37_79B9) >> 11) as u8)
        .collect();
    let pool = Arc::new(Pool::new(ClientConfig::default()));
    let opts = upload_options(a, ranked);
    let t = Instant::now();
    let x = upload(
        &data[..],
        Some(a.size),
        &opts,
        pool.clone(),
        Arc::new(NoProgress),
    )
    .await?
    .exnode;
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
    let stats = download_and_check(a, &x, &data, pool).await?;
    lors::directory::report_rates(Some(&directory), &stats.per_depot, stats.elapsed).await;
    println!("== verified: every byte identical. demo OK");
    if !a.linger.is_zero() {
        println!(
            "== keeping the L-Bone ({lb_url}/) and the depots up for {}s (Ctrl-C to stop)",
            a.linger.as_secs()
        );
        tokio::select! {
            _ = tokio::time::sleep(a.linger) => {}
            _ = super::depot::wait_for_signal() => {}
        }
    }
    for (tx, task) in stops {
        let _ = tx.send(true);
        let _ = task.await;
    }
    let _ = lb_stop.send(true);
    let _ = lb_task.await;
    Ok(())
}

/// A depot's stop switch and its task.
type Running = (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<std::io::Result<()>>,
);

/// Starts the four depots, each registered with the L-Bone at `base`:
/// their addresses, each one's city, and how to stop them.
async fn start_depots(
    a: &Args,
    dir: &std::path::Path,
    base: &BaseUrl,
    token: &str,
) -> anyhow::Result<(
    Vec<String>,
    std::collections::HashMap<String, &'static str>,
    Vec<Running>,
)> {
    let mut addrs = Vec::new();
    let mut cities = std::collections::HashMap::new();
    let mut stops = Vec::new();
    for (i, (city, country, lat, lon)) in (1..=4).zip(PLACES) {
        let mut r = ResourceConfig::new("1", dir.join(format!("depot{i}")));
        // Room for two copies of the file however it is cut: a file smaller
        // than one block still asks the L-Bone for depots with room for a
        // block, and each allocation takes 4 KiB more.
        r.size = ByteSize(a.size.max(a.block_size).max(1 << 20) * 2 + (1 << 20));
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
        let loc = Location {
            city: Some(city.into()),
            country: Some(country.into()),
            latitude: Some(lat),
            longitude: Some(lon),
            ..Location::default()
        };
        let (first, _heartbeat) = super::depot::join_lbone(
            &depot,
            vec![base.clone()],
            token.to_owned(),
            loc,
            Duration::from_secs(1),
            rx.clone(),
        )
        .await;
        first.map_err(anyhow::Error::msg)?;
        let task = tokio::spawn(lors_depot::server::run(l, depot, rx));
        println!("   depot {i}: ibp://{addr} ({city}, {country})");
        cities.insert(addr.clone(), city);
        addrs.push(addr);
        stops.push((tx, task));
    }
    Ok((addrs, cities, stops))
}

/// Downloads `x` through a pipe from the depots still up, checks every
/// byte against `data`, and says how it went.
async fn download_and_check(
    a: &Args,
    x: &lors_exnode::ExNode,
    data: &[u8],
    pool: Arc<Pool>,
) -> anyhow::Result<lors::download::Stats> {
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
        x,
        Output::Stream {
            writer: Box::new(wtx),
            name: "the checking pipe".into(),
        },
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
    Ok(stats)
}

/// The demo's upload: two copies of BLAKE3-checked blocks on `depots`.
fn upload_options(a: &Args, depots: Vec<String>) -> UploadOptions {
    UploadOptions {
        depots,
        block_size: a.block_size,
        copies: 2,
        duration: Duration::from_secs(3600),
        filename: "demo.bin".into(),
        auto_block_size: false,
        e2e: Some(Codec::Native(Chain {
            block_size: 1 << 20,
            steps: vec![Step::Blake3],
        })),
        ..UploadOptions::default()
    }
}
