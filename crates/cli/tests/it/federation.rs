//! Three L-Bone instances on one real PostgreSQL: a depot registered
//! through any is listed by all, and clients and depots given the three
//! lose nothing when one dies or hangs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use lors_lbone::client::{Announcement, BaseUrl, DepotQuery, Directory, register_first};
use lors_lbone::model::{Location, Registration, Resource};

use crate::util::{DepotProc, LboneProc, lors, pattern, tempdir};

fn pg_url() -> Option<String> {
    match std::env::var("LORS_TEST_PG_URL") {
        Ok(u) => Some(u),
        Err(_) => {
            assert!(
                std::env::var_os("LORS_REQUIRE_SERVICES").is_none(),
                "LORS_REQUIRE_SERVICES is set but LORS_TEST_PG_URL is not"
            );
            eprintln!(
                "federation test skipped: LORS_TEST_PG_URL not set (scripts/test.sh sets it)"
            );
            None
        }
    }
}

fn registration(k: usize) -> Registration {
    Registration {
        host: format!("d{k}.example.org"),
        port: 6714,
        resources: vec![Resource {
            rid: "1".into(),
            hard_free: 1 << 40,
            hard_total: 1 << 40,
            soft_free: 0,
            soft_total: 0,
            max_duration: 30 * 86_400,
            types: vec!["byte_array".into()],
        }],
        location: Location {
            city: Some(format!("City{}", k % 7)),
            latitude: Some(-40.0 + (k % 80) as f64),
            longitude: Some(-150.0 + (k % 300) as f64),
            ..Location::default()
        },
        version: "test".into(),
    }
}

/// How many depots (offline ones too) `lb` lists.
async fn listed(lb: &BaseUrl) -> usize {
    Directory::Http(lb.clone())
        .depot_views(&DepotQuery::default(), true, Duration::from_secs(10))
        .await
        .map_or(0, |v| v.len())
}

async fn until(what: &str, limit: Duration, mut ok: impl AsyncFnMut() -> bool) {
    let t = Instant::now();
    while !ok().await {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_postgres_lose_nothing_when_one_dies_or_hangs() {
    let Some(url) = pg_url() else { return };
    let schema = format!("lbone_fed_{}", std::process::id());
    let dir = tempdir();
    let lbs: Vec<LboneProc> = (0..3)
        .map(|i| {
            LboneProc::start(
                &dir.path().join(format!("lb{i}")),
                &[
                    "--database",
                    &url,
                    "--schema",
                    &schema,
                    "--offline-after",
                    "4s",
                ],
            )
        })
        .collect();
    let bases: Vec<BaseUrl> = lbs
        .iter()
        .map(|l| BaseUrl::parse(&l.url()).unwrap())
        .collect();
    let token = lbs[0].token.clone();

    // 300 depots, each registered through one instance: all three list all.
    const N: usize = 300;
    for k in 0..N {
        let reg = registration(k);
        register_first(
            &bases,
            k % 3,
            &token,
            &Announcement::Here(&reg),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    for b in &bases {
        until(
            "every instance lists every depot",
            Duration::from_secs(5),
            async || listed(b).await == N,
        )
        .await;
    }

    // A real depot that knows the three, and a client that does.
    let depot = DepotProc::start(
        &dir.path().join("depot"),
        &[
            "--size",
            "64M",
            "--lbone",
            &lbs.iter().map(LboneProc::url).collect::<Vec<_>>().join(","),
            "--lbone-token",
            &token,
            "--heartbeat",
            "1s",
            "--city",
            "Brno",
        ],
    );
    let all = Directory::Any(bases.iter().cloned().map(Directory::Http).collect());

    // Load through the lists: queries and heartbeats, while instance 0
    // is killed.
    let stop = Arc::new(AtomicBool::new(false));
    let (queries, heartbeats, failed) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(std::sync::Mutex::new(Vec::<String>::new())),
    );
    let mut load = tokio::task::JoinSet::new();
    for c in 0..4 {
        let (all, stop, queries, failed) =
            (all.clone(), stop.clone(), queries.clone(), failed.clone());
        load.spawn(async move {
            let q = DepotQuery {
                count: 8,
                hard: 1 << 30,
                duration: 86_400,
                location: format!("city= City{c}"),
            };
            while !stop.load(Relaxed) {
                match all.depots(&q, Duration::from_secs(10)).await {
                    Ok(v) if v.len() == 8 => queries.fetch_add(1, Relaxed),
                    Ok(v) => {
                        failed.lock().unwrap().push(format!("{} depots", v.len()));
                        0
                    }
                    Err(e) => {
                        failed.lock().unwrap().push(e.to_string());
                        0
                    }
                };
            }
        });
    }
    {
        let (bases, token, stop, heartbeats, failed) = (
            bases.clone(),
            token.clone(),
            stop.clone(),
            heartbeats.clone(),
            failed.clone(),
        );
        load.spawn(async move {
            let mut k = 0;
            let mut current = 0;
            while !stop.load(Relaxed) {
                let reg = registration(k % N);
                match register_first(
                    &bases,
                    current,
                    &token,
                    &Announcement::Here(&reg),
                    Duration::from_secs(10),
                )
                .await
                {
                    Ok(i) => {
                        current = i;
                        heartbeats.fetch_add(1, Relaxed);
                    }
                    Err(e) => failed.lock().unwrap().push(e.to_string()),
                }
                k += 1;
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_kill = queries.load(Relaxed);
    lbs[0].signal("KILL");
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Relaxed);
    while load.join_next().await.is_some() {}
    let failed = failed.lock().unwrap().clone();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let (q, h) = (queries.load(Relaxed), heartbeats.load(Relaxed));
    assert!(
        q > before_kill,
        "queries went on after the kill: {before_kill} then {q}"
    );
    assert!(h >= N, "{h} heartbeats");
    eprintln!(
        "{q} queries and {h} registrations, 0 failed; instance 0 killed after {before_kill} queries"
    );

    // Every depot is still listed by the survivors, and the real depot,
    // whose heartbeats went to instance 0, is online there.
    for b in &bases[1..] {
        assert_eq!(listed(b).await, N + 1);
        let online = Directory::Http(b.clone())
            .depots(&DepotQuery::default(), Duration::from_secs(10))
            .await
            .unwrap();
        assert!(online.contains(&depot.addr), "{} online at {b}", depot.addr);
    }

    // A hung instance (stopped, its port still accepting) costs a second,
    // not a timeout: the next is asked beside it.
    lbs[1].signal("STOP");
    let t = Instant::now();
    let v = all
        .depots(
            &DepotQuery {
                count: 4,
                ..DepotQuery::default()
            },
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(v.len(), 4);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "{:?} with one instance dead, one hung",
        t.elapsed()
    );
    // So does the tool, given the list as LBONE_SERVER would give it.
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(100_000, 9)).unwrap();
    let xnd = dir.path().join("src.xnd");
    let list = lbs.iter().map(LboneProc::url).collect::<Vec<_>>().join(",");
    let t = Instant::now();
    let (ok, _, err) = lors(&[
        "upload",
        "-H",
        &list,
        "--copies",
        "1",
        "--location",
        "city= Brno",
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    lbs[1].signal("CONT");
    assert!(ok, "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "upload took {:?}",
        t.elapsed()
    );
}
