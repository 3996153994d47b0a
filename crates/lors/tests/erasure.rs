//! Erasure-coded files through the real upload and download engines, on
//! nine depots in this process: every way of losing three of the nine
//! reads back byte for byte; losing four fails naming the stripes.
//!
//! A lost depot is a capability pointing at a port nobody listens on (the
//! depot "refuses connections"), which costs a download nothing to find
//! out: 84 downloads take seconds.

use std::sync::Arc;

use lors::download::{DownloadOptions, Output, download};
use lors::upload::{UploadOptions, upload_file};
use lors::{Error, NoProgress, Pool};
use lors_depot::Depot;
use lors_depot::config::{Config, ResourceConfig, SyncPolicy};
use lors_exnode::ExNode;
use lors_exnode::erasure::Scheme;
use lors_exnode::functions::{Chain, Codec, Step};
use lors_ibp::Capability;
use lors_ibp::proto::Reliability;

/// Nine depots serving from `dir`, for as long as the runtime runs.
async fn depots(dir: &std::path::Path) -> Vec<String> {
    served_depots(dir)
        .await
        .into_iter()
        .map(|(a, _)| a)
        .collect()
}

/// Nine depots serving from `dir`, and each one's handle.
async fn served_depots(dir: &std::path::Path) -> Vec<(String, Arc<Depot>)> {
    let (stop, rx) = tokio::sync::watch::channel(false);
    std::mem::forget(stop);
    let mut v = Vec::new();
    for i in 0..9 {
        let cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            sync: SyncPolicy::Never,
            resources: vec![ResourceConfig::new("1", dir.join(format!("d{i}")))],
            ..Config::default()
        };
        let d = Depot::open(cfg).await.unwrap();
        let l = d.bind().await.unwrap();
        v.push((l.ibp.local_addr().unwrap().to_string(), d.clone()));
        tokio::spawn(lors_depot::server::run(l, d, rx.clone()));
    }
    v
}

/// An address nobody listens on.
fn dead_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `x` with every block on the depots `lost` moved to `dead`: gone.
fn without(x: &ExNode, lost: &[&String], dead: &str) -> ExNode {
    let mut y = x.clone();
    for m in y.mappings.iter_mut().chain(&mut y.parity) {
        if lost.iter().any(|d| m.depot().as_ref() == Some(*d)) {
            for c in [&mut m.read, &mut m.write, &mut m.manage]
                .into_iter()
                .flatten()
            {
                *c = Capability::parse(&c.to_url().replace(&c.address(), dead)).unwrap();
            }
        }
    }
    y
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect()
}

#[test]
fn any_three_of_nine_depots_lost_read_back_whole_and_four_fail_naming_stripes() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addrs = rt.block_on(depots(dir.path()));
    // 3 stripes and a short fourth with two data blocks (the other four
    // are zeros, never stored).
    let data = pattern(3 * 6 * (64 << 10) + (64 << 10) + 1000);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    let pool = Arc::new(Pool::new(lors_ibp::ClientConfig::default()));
    let opts = UploadOptions {
        depots: addrs.clone(),
        block_size: 64 << 10,
        copies: 1,
        threads: 8,
        duration: std::time::Duration::from_secs(600),
        reliability: Reliability::Hard,
        filename: "src".into(),
        e2e: Some(Codec::Native(Chain {
            block_size: 16 << 10,
            steps: vec![Step::Blake3],
        })),
        erasure: Some(Scheme::parse("6+3").unwrap()),
        sparse: false,
        auto_threads: false,
        auto_block_size: false,
    };
    let file = std::fs::File::open(&src).unwrap();
    let up = rt
        .block_on(upload_file(file, &opts, pool.clone(), Arc::new(NoProgress)))
        .unwrap();
    let x = up.exnode;
    assert_eq!(x.mappings.len(), 3 * 6 + 2);
    assert_eq!(x.parity.len(), 4 * 3);
    // Each stripe's blocks on depots of their own.
    for s in 0..4u64 {
        let mut on: Vec<String> = (x.allocations())
            .filter(|m| m.shard().is_some_and(|(t, _)| t == s))
            .filter_map(|m| m.depot())
            .collect();
        let n = on.len();
        on.sort();
        on.dedup();
        assert_eq!(on.len(), n, "stripe {s}: two blocks on one depot");
    }
    let dead = dead_address();
    let out = dir.path().join("out");
    let read = |y: &ExNode| {
        let _ = std::fs::remove_file(&out);
        let o = DownloadOptions {
            stall: std::time::Duration::from_secs(5),
            ..DownloadOptions::default()
        };
        rt.block_on(download(
            y,
            Output::File(out.clone()),
            &o,
            pool.clone(),
            Arc::new(NoProgress),
        ))
    };
    let mut subsets = 0;
    for a in 0..9 {
        for b in a + 1..9 {
            for c in b + 1..9 {
                let y = without(&x, &[&addrs[a], &addrs[b], &addrs[c]], &dead);
                let r = read(&y);
                assert!(r.is_ok(), "lost {a},{b},{c}: {:?}", r.err());
                assert!(
                    std::fs::read(&out).unwrap() == data,
                    "lost {a},{b},{c}: bytes differ"
                );
                subsets += 1;
            }
        }
    }
    assert_eq!(subsets, 84);
    // xio (and so `lors mount` and libxio) reads it the same way: random
    // seeks into blocks of the lost depots.
    let lost = dir.path().join("lost.xnd");
    lors::xnd::save(
        &lost,
        &without(&x, &[&addrs[0], &addrs[4], &addrs[8]], &dead),
    )
    .unwrap();
    let mut f = lors::xio::File::open(lost.to_str().unwrap()).unwrap();
    for (at, len) in [
        (0usize, 4096usize),
        (70_000, 100_000),
        (400_000, 1),
        (1_100_000, 80_000),
    ] {
        use std::io::{Read, Seek, SeekFrom};
        f.seek(SeekFrom::Start(at as u64)).unwrap();
        let mut buf = vec![0u8; len];
        f.read_exact(&mut buf).unwrap();
        assert!(buf == data[at..at + len], "xio read at {at}");
    }
    for four in [[0, 1, 2, 3], [5, 6, 7, 8], [0, 2, 4, 8]] {
        let lost: Vec<&String> = four.iter().map(|&i| &addrs[i]).collect();
        match read(&without(&x, &lost, &dead)) {
            Err(Error::StripesLost {
                stripes, scheme, ..
            }) => {
                assert_eq!(scheme.to_string(), "6+3");
                assert!(!stripes.is_empty());
                let msg = Error::StripesLost {
                    scheme,
                    stripes: stripes.clone(),
                    last: "x".into(),
                }
                .to_string();
                assert!(msg.contains("stripe 0 (bytes 0..393216)"), "{msg}");
            }
            other => panic!("lost {four:?}: {other:?}"),
        }
        assert!(!out.exists(), "no output file that looks complete");
    }
}

/// A lost block is rebuilt from reads the download makes anyway: the
/// other data blocks' bytes at the same place, read for the rebuild, are
/// delivered as their own pieces rather than read again. With one of nine
/// depots gone the depots send about the file once (the lost blocks' share
/// coming from parity), where reading a stripe's blocks for the rebuild
/// apart from the download sends more than half again as much.
#[test]
fn a_lost_depots_blocks_are_rebuilt_from_reads_the_download_makes_anyway() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let served = rt.block_on(served_depots(dir.path()));
    let addrs: Vec<String> = served.iter().map(|(a, _)| a.clone()).collect();
    let data = pattern(8 * 6 * (1 << 20));
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    let pool = Arc::new(Pool::new(lors_ibp::ClientConfig::default()));
    let opts = UploadOptions {
        depots: addrs.clone(),
        block_size: 1 << 20,
        copies: 1,
        threads: 8,
        duration: std::time::Duration::from_secs(600),
        reliability: Reliability::Hard,
        filename: "src".into(),
        e2e: None,
        erasure: Some(Scheme::parse("6+3").unwrap()),
        sparse: false,
        auto_threads: false,
        auto_block_size: false,
    };
    let file = std::fs::File::open(&src).unwrap();
    let x = rt
        .block_on(upload_file(file, &opts, pool.clone(), Arc::new(NoProgress)))
        .unwrap()
        .exnode;
    let stored: u64 = x.mappings.iter().map(|m| m.alloc_length).sum();
    let dead = dead_address();
    let out = dir.path().join("out");
    let sent = || served.iter().map(|(_, d)| d.bytes_sent()).sum::<u64>();
    for lost in [0, 4, 8] {
        let _ = std::fs::remove_file(&out);
        let y = without(&x, &[&addrs[lost]], &dead);
        let o = DownloadOptions {
            block_size: 64 << 10,
            ..DownloadOptions::default()
        };
        let before = sent();
        let stats = rt
            .block_on(download(
                &y,
                Output::File(out.clone()),
                &o,
                pool.clone(),
                Arc::new(NoProgress),
            ))
            .unwrap();
        assert!(
            std::fs::read(&out).unwrap() == data,
            "lost {lost}: bytes differ"
        );
        let ratio = (sent() - before) as f64 / stored as f64;
        eprintln!(
            "depot {lost} lost: the depots sent {ratio:.3}x the data blocks' bytes; {stats:?}"
        );
        assert!(ratio < 1.15, "lost {lost}: {ratio:.3}x the bytes sent");
    }
}
