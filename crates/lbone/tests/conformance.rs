//! One conformance suite for every `Store` backend: SQLite always, and a real
//! PostgreSQL when `LORS_TEST_PG_URL` names one (the README test command
//! starts one and sets it, with `LORS_REQUIRE_SERVICES=1` so it cannot be skipped).

use lors_lbone::forecast::Forecaster;
use lors_lbone::model::{Location, Registration, Resource};
use lors_lbone::store::{Change, PostgresStore, SqliteStore, Store};

fn reg(host: &str, hard_free: u64, city: &str) -> Registration {
    Registration {
        host: host.into(),
        port: 6714,
        resources: vec![Resource {
            rid: "1".into(),
            hard_free,
            hard_total: 1 << 40,
            soft_free: 0,
            soft_total: 0,
            max_duration: 86400,
            types: vec!["byte_array".into(), "fifo".into()],
        }],
        location: Location {
            city: Some(city.into()),
            latitude: Some(49.2),
            longitude: Some(16.6),
            tags: vec!["ünïcode ✓".into(), "quote\"'".into()],
            ..Location::default()
        },
        version: "lors 0.1.0".into(),
    }
}

/// Everything a backend must do, checked the same way for each.
/// One report through the batch call: whether it was stored.
async fn record_rate(s: &Store, client: &str, depot: &str, bps: f64, now: i64) -> bool {
    s.record_rates(client, vec![(depot.to_owned(), bps)], now)
        .await
        .unwrap()
        == 1
}

async fn suite(s: &Store) {
    assert!(s.list().await.unwrap().is_empty(), "starts empty");

    // Register, then heartbeat with new figures: first_seen stays.
    // Each answer is the depot's previous heartbeat: none when new.
    assert_eq!(
        s.upsert(&reg("a.example.org", 100, "Brno"), 100)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.upsert(&reg("b.example.org", 200, "Praha"), 120)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.upsert(&reg("a.example.org", 50, "Brno"), 150)
            .await
            .unwrap(),
        Some(100)
    );
    let l = s.list().await.unwrap();
    assert_eq!(l.len(), 2);
    assert_eq!(
        l[0].reg,
        reg("a.example.org", 50, "Brno"),
        "latest figures, text intact"
    );
    assert_eq!((l[0].first_seen, l[0].last_seen), (100, 150));
    // Fetched by address: only the listed ones, whatever else is asked.
    let got = s
        .get(&["b.example.org:6714".into(), "nobody.example.org:1".into()])
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].reg.addr(), got[0].last_seen),
        ("b.example.org:6714".into(), 120)
    );
    assert_eq!((l[1].first_seen, l[1].last_seen), (120, 120));

    // Silent depots are dropped, the others stay.
    assert_eq!(s.drop_silent(130).await.unwrap(), ["b.example.org:6714"]);
    assert_eq!(s.drop_silent(130).await.unwrap(), Vec::<String>::new());
    let l = s.list().await.unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].reg.host, "a.example.org");

    // A depot that leaves is removed at once; removing it again finds nothing.
    assert_eq!(
        s.upsert(&reg("c.example.org", 1, "Brno"), 160)
            .await
            .unwrap(),
        None
    );
    assert!(s.remove("c.example.org:6714").await.unwrap());
    assert!(!s.remove("c.example.org:6714").await.unwrap());
    assert_eq!(s.list().await.unwrap().len(), 1);

    // Rates: the stored forecaster is exactly the one the series produces,
    // per client network.
    let series = [100.0, 120.0, 80.0, 0.0, 110.0];
    let mut want = Forecaster::default();
    for x in series {
        record_rate(s, "10.0.0.0/24", "a.example.org:6714", x, 200).await;
        want.update(x);
    }
    assert!(record_rate(s, "10.9.9.0/24", "a.example.org:6714", 5.0, 200).await);
    // Reports of depots the directory does not list store nothing.
    assert!(!record_rate(s, "10.9.9.0/24", "made-up.example.org:6714", 5.0, 200).await);
    assert!(
        !s.forecasts("10.9.9.0/24")
            .await
            .unwrap()
            .contains_key("made-up.example.org:6714")
    );
    let fc = s.forecasts("10.0.0.0/24").await.unwrap();
    assert_eq!(fc.len(), 1);
    assert_eq!(fc["a.example.org:6714"], want);
    assert_eq!(
        s.forecasts("10.9.9.0/24").await.unwrap()["a.example.org:6714"].n,
        1
    );
    assert!(s.forecasts("192.168.0.0/24").await.unwrap().is_empty());

    // A depot that goes takes its forecasts with it, and forecasts not
    // reported since the cutoff go at the next sweep.
    s.upsert(&reg("d.example.org", 1, "Brno"), 210)
        .await
        .unwrap();
    assert!(record_rate(s, "10.0.0.0/24", "d.example.org:6714", 1.0, 210).await);
    assert!(s.remove("d.example.org:6714").await.unwrap());
    assert!(
        !s.forecasts("10.0.0.0/24")
            .await
            .unwrap()
            .contains_key("d.example.org:6714")
    );
    s.upsert(&reg("a.example.org", 50, "Brno"), 400)
        .await
        .unwrap();
    assert!(s.drop_silent(300).await.unwrap().is_empty());
    assert!(
        s.forecasts("10.0.0.0/24").await.unwrap().is_empty(),
        "stale forecasts swept"
    );
}

/// Concurrent rate reports lose nothing.
async fn concurrent_reports(stores: Vec<Store>) {
    stores[0].upsert(&reg("c", 1, "Brno"), 300).await.unwrap();
    let mut reporters = tokio::task::JoinSet::new();
    for i in 0..8 {
        let s = stores[i % stores.len()].clone();
        reporters.spawn(async move {
            for _ in 0..25 {
                assert!(record_rate(&s, "10.1.1.0/24", "c:6714", 1e6, 300).await);
            }
        });
    }
    while let Some(r) = reporters.join_next().await {
        r.unwrap();
    }
    let f = stores[0].forecasts("10.1.1.0/24").await.unwrap()["c:6714"];
    assert_eq!(f.n, 200, "every one of 8 × 25 reports counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lbone.sqlite");
    let s: Store = SqliteStore::open(&path).unwrap().into();
    suite(&s).await;
    assert!(s.describe().starts_with("SQLite"));
    drop(s);
    // Reopened, the state is still there.
    let s: Store = SqliteStore::open(&path).unwrap().into();
    assert_eq!(s.list().await.unwrap().len(), 1);
    let other: Store = SqliteStore::open(&path).unwrap().into();
    concurrent_reports(vec![s, other]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_conforms() {
    let Ok(url) = std::env::var("LORS_TEST_PG_URL") else {
        assert!(
            std::env::var_os("LORS_REQUIRE_SERVICES").is_none(),
            "LORS_REQUIRE_SERVICES is set but LORS_TEST_PG_URL is not"
        );
        eprintln!(
            "postgres_conforms: LORS_TEST_PG_URL not set; run scripts/test.sh for the real PostgreSQL run"
        );
        return;
    };
    // A fresh schema per run, so runs never see each other's rows.
    let schema = format!(
        "lbone_test_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 1_000_000
    );
    let a: Store = PostgresStore::open(&url, &schema).await.unwrap().into();
    suite(&a).await;
    assert!(a.describe().starts_with("PostgreSQL"));
    // A second instance on the same database sees the same directory, and
    // concurrent reports through both lose nothing.
    let b: Store = PostgresStore::open(&url, &schema).await.unwrap().into();
    assert_eq!(b.list().await.unwrap().len(), 1);
    // What one instance changes, the other hears of; not its own changes.
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    assert!(a.watch(tx));
    let next = async |rx: &mut tokio::sync::mpsc::Receiver<Change>| {
        tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .ok()
            .flatten()
    };
    assert_eq!(next(&mut rx).await, Some(Change::Reload), "a reload first");
    a.upsert(&reg("mine.example.org", 1, "Brno"), 300)
        .await
        .unwrap();
    b.upsert(&reg("theirs.example.org", 1, "Brno"), 300)
        .await
        .unwrap();
    let theirs = Some(Change::Depot("theirs.example.org:6714".into()));
    assert_eq!(next(&mut rx).await, theirs);
    assert!(b.remove("theirs.example.org:6714").await.unwrap());
    assert_eq!(next(&mut rx).await, theirs);
    assert!(a.remove("mine.example.org:6714").await.unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "nothing of its own");
    // The database drops every connection (a restart, say): the next
    // calls are served on new ones, and the listener comes back with a
    // reload.
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    let mut listed = None;
    for _ in 0..3 {
        if let Ok(l) = a.list().await {
            listed = Some(l.len());
            break;
        }
    }
    assert_eq!(
        listed,
        Some(1),
        "the store serves again after its connections died"
    );
    let t = std::time::Instant::now();
    loop {
        match next(&mut rx).await {
            Some(Change::Reload) => break,
            Some(_) => {}
            None => panic!("no reload after the listener's connection died"),
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
    }
    concurrent_reports(vec![a, b]).await;
    assert!(PostgresStore::open(&url, "Bad-Name").await.is_err());
}
