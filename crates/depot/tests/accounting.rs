//! Property test of the depot's accounting: random sequences of ALLOCATE,
//! STORE, WRITE, TRUNCATE, CHNG, INCR/DECR and expiry against a real depot on
//! 127.0.0.1, restarted in between, checked after every step against a model:
//!
//! * the used space the depot reports is the sum of its live allocations'
//!   max sizes, each with its per-allocation charge, and stays within the
//!   resource and its hard and soft caps;
//! * every acknowledged byte reads back;
//! * an allocation goes only when its owner drops it, its lease runs out, or
//!   (soft only) a hard ALLOCATE revokes it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use lors_depot::Depot;
use lors_depot::config::{ByteSize, Config, ResourceConfig, SyncPolicy};
use lors_depot::store::ALLOC_CHARGE;
use lors_ibp::caps::{CapKind, CapSet};
use lors_ibp::proto::{AllocType, Lease, Reliability, StatusCode};
use lors_ibp::units::unix_now;
use lors_ibp::{ClientConfig, Connection};
use proptest::prelude::*;
use tokio::sync::watch;

const TOTAL: u64 = 1 << 20;
const HARD_CAP: u64 = 768 << 10;
const SOFT_CAP: u64 = 512 << 10;
/// Leases: short ones end at the next `Expire`, long ones never here.
const SHORT: Lease = Lease::Secs(100);
const LONG: Lease = Lease::Secs(100_000);

#[derive(Debug, Clone)]
enum Op {
    Allocate {
        size: u64,
        hard: bool,
        short: bool,
    },
    Store {
        i: usize,
        len: usize,
    },
    Write {
        i: usize,
        at: u64,
        len: usize,
    },
    Truncate {
        i: usize,
        size: u64,
    },
    Chng {
        i: usize,
        size: u64,
        rel: Option<bool>,
    },
    Incr {
        i: usize,
    },
    Decr {
        i: usize,
    },
    Expire,
    Restart,
}

/// Sizes from the wire: small, at the resource's edges, and at u64's.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1..=(96u64 << 10),
        1 => Just(0),
        1 => Just(1),
        1 => Just(TOTAL - 1),
        1 => Just(TOTAL),
        1 => Just(TOTAL + 1),
        1 => Just(u64::MAX - 1),
        1 => Just(u64::MAX),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let i = 0..16usize;
    prop_oneof![
        4 => (size(), any::<bool>(), any::<bool>())
            .prop_map(|(size, hard, short)| Op::Allocate { size, hard, short }),
        4 => (i.clone(), 0..20_000usize).prop_map(|(i, len)| Op::Store { i, len }),
        3 => (i.clone(), 0..120_000u64, 0..8_000usize)
            .prop_map(|(i, at, len)| Op::Write { i, at, len }),
        2 => (i.clone(), size()).prop_map(|(i, size)| Op::Truncate { i, size }),
        2 => (i.clone(), size(), proptest::option::of(any::<bool>()))
            .prop_map(|(i, size, rel)| Op::Chng { i, size, rel }),
        1 => i.clone().prop_map(|i| Op::Incr { i }),
        2 => i.prop_map(|i| Op::Decr { i }),
        1 => Just(Op::Expire),
        1 => Just(Op::Restart),
    ]
}

/// What the model knows of one allocation.
#[derive(Debug)]
struct Model {
    caps: CapSet,
    max: u64,
    hard: bool,
    short: bool,
    refs: u32,
    data: Vec<u8>,
}

struct Running {
    depot: Weak<Depot>,
    resource: Weak<lors_depot::store::Resource>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    addr: String,
}

fn config(dir: &std::path::Path) -> Config {
    let mut r = ResourceConfig::new("1", dir.to_path_buf());
    r.size = ByteSize(TOTAL);
    r.hard_size = Some(ByteSize(HARD_CAP));
    r.soft_size = Some(ByteSize(SOFT_CAP));
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        resources: vec![r],
        sync: SyncPolicy::Never,
        ..Config::default()
    }
}

async fn start(dir: &std::path::Path) -> (Running, Arc<Depot>) {
    // The last reference to a stopped depot may still be closing its
    // metadata database on another thread (its lock goes with the close).
    let mut tries = 0;
    let depot = loop {
        match Depot::open(config(dir)).await {
            Ok(d) => break d,
            Err(e) if tries < 100 && e.to_string().contains("already open") => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("depot opens: {e}"),
        }
    };
    let listeners = depot.bind().await.unwrap();
    let addr = listeners.ibp.local_addr().unwrap().to_string();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(lors_depot::server::run(listeners, depot.clone(), rx));
    (
        Running {
            depot: Arc::downgrade(&depot),
            resource: Arc::downgrade(&depot.store().resources()[0]),
            stop,
            task,
            addr,
        },
        depot,
    )
}

/// Stops the depot and waits until nothing holds it (its metadata database
/// is locked while it lives).
async fn stop(r: Running) {
    let _ = r.stop.send(true);
    let _ = r.task.await;
    for _ in 0..500 {
        if r.depot.upgrade().is_none() && r.resource.upgrade().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "still referenced after shutdown: depot {}, resource {}",
        r.depot.strong_count(),
        r.resource.strong_count()
    );
}

async fn connect(addr: &str) -> Connection {
    let cfg = ClientConfig {
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    };
    Connection::connect(addr, &cfg).await.unwrap()
}

fn bytes(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + seed * 13) as u8).collect()
}

fn code(e: &lors_ibp::Error) -> StatusCode {
    e.status()
        .unwrap_or_else(|| panic!("expected a depot status, got {e}"))
}

async fn run_ops(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let (mut running, mut depot) = start(dir.path()).await;
    let mut c = connect(&running.addr).await;
    let mut live: Vec<Model> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        if !c.is_healthy() {
            c = connect(&running.addr).await;
        }
        let mut revoked_ok = false;
        let pick = |i: usize, n: usize| (n > 0).then(|| i % n);
        match op.clone() {
            Op::Allocate { size, hard, short } => {
                let rel = if hard {
                    Reliability::Hard
                } else {
                    Reliability::Soft
                };
                let dur = if short { SHORT } else { LONG };
                match c.allocate("1", rel, AllocType::ByteArray, dur, size).await {
                    Ok(caps) => {
                        assert!(size > 0 && size <= TOTAL, "step {step}: {op:?} granted");
                        revoked_ok = hard;
                        live.push(Model {
                            caps,
                            max: size,
                            hard,
                            short,
                            refs: 1,
                            data: Vec::new(),
                        });
                    }
                    Err(e) => {
                        let _ = code(&e);
                    }
                }
            }
            Op::Store { i, len } => {
                if let Some(i) = pick(i, live.len()) {
                    let m = &mut live[i];
                    let data = bytes(len, step);
                    let fits = (m.data.len() + len) as u64 <= m.max;
                    match c.store(&m.caps.write, &data).await {
                        Ok(n) => {
                            assert!(fits, "step {step}: STORE past the max size");
                            assert_eq!(n, len as u64);
                            m.data.extend_from_slice(&data);
                        }
                        Err(e) => {
                            assert!(!fits, "step {step}: STORE that fits refused: {e}");
                            assert_eq!(code(&e), StatusCode::WOULD_EXCEED_LIMIT);
                        }
                    }
                }
            }
            Op::Write { i, at, len } => {
                if let Some(i) = pick(i, live.len()) {
                    let m = &mut live[i];
                    let data = bytes(len, step);
                    let end = at + len as u64;
                    match c.write_at(&m.caps.write, at, &data).await {
                        Ok(_) => {
                            assert!(end <= m.max, "step {step}: WRITE past the max size");
                            let end = end as usize;
                            if m.data.len() < end {
                                m.data.resize(end, 0);
                            }
                            m.data[at as usize..end].copy_from_slice(&data);
                        }
                        Err(e) => {
                            assert!(end > m.max, "step {step}: WRITE that fits refused: {e}");
                        }
                    }
                }
            }
            Op::Truncate { i, size } => {
                if let Some(i) = pick(i, live.len()) {
                    let m = &mut live[i];
                    match c.truncate(&m.caps.manage, size).await {
                        Ok(()) => {
                            m.max = size;
                            m.data.truncate(size as usize);
                        }
                        Err(e) => {
                            // Shrinking (to a size above 0) always succeeds.
                            assert!(size == 0 || size > m.max, "step {step}: {op:?}: {e}");
                        }
                    }
                }
            }
            Op::Chng { i, size, rel } => {
                if let Some(i) = pick(i, live.len()) {
                    let m = &mut live[i];
                    let r = rel.map(|h| {
                        if h {
                            Reliability::Hard
                        } else {
                            Reliability::Soft
                        }
                    });
                    match c.change(&m.caps.manage, size, None, r).await {
                        Ok(()) => {
                            assert!(
                                size == 0 || size >= m.data.len() as u64,
                                "step {step}: CHNG below the data"
                            );
                            if size > 0 {
                                m.max = size;
                            }
                            if let Some(h) = rel {
                                m.hard = h;
                            }
                        }
                        Err(e) => {
                            let why = code(&e);
                            if size > 0 && size < m.data.len() as u64 {
                                assert_eq!(why, StatusCode::WOULD_DAMAGE_DATA);
                            }
                        }
                    }
                }
            }
            Op::Incr { i } => {
                if let Some(i) = pick(i, live.len()) {
                    c.incr(&live[i].caps.manage, CapKind::Read).await.unwrap();
                    live[i].refs += 1;
                }
            }
            Op::Decr { i } => {
                if let Some(i) = pick(i, live.len()) {
                    c.decr(&live[i].caps.manage, CapKind::Read).await.unwrap();
                    live[i].refs -= 1;
                    if live[i].refs == 0 {
                        live.remove(i);
                    }
                }
            }
            Op::Expire => {
                let store = depot.store().clone();
                tokio::task::spawn_blocking(move || store.reap_expired(unix_now() + 1_000))
                    .await
                    .unwrap();
                live.retain(|m| !m.short);
            }
            Op::Restart => {
                drop(c);
                drop(depot);
                stop(running).await;
                (running, depot) = start(dir.path()).await;
                c = connect(&running.addr).await;
            }
        }
        if !c.is_healthy() {
            c = connect(&running.addr).await;
        }
        check(&mut c, &mut live, revoked_ok, step, &op).await;
        if let Err(e) = depot.store().check_accounting() {
            panic!("step {step} ({op:?}): {e}");
        }
    }
    drop(c);
    drop(depot);
    stop(running).await;
}

/// The invariants, after every step.
async fn check(c: &mut Connection, live: &mut Vec<Model>, revoked_ok: bool, step: usize, op: &Op) {
    let mut kept = Vec::new();
    for m in live.drain(..) {
        match c.probe(&m.caps.manage).await {
            Ok(p) => {
                assert_eq!(p.max_size, m.max, "step {step} ({op:?}): max size");
                assert_eq!(p.size, m.data.len() as u64, "step {step} ({op:?}): size");
                assert_eq!(p.reliability == Reliability::Hard.number(), m.hard);
                let mut back = vec![0u8; m.data.len()];
                c.load(&m.caps.read, 0, &mut back).await.unwrap();
                assert!(
                    back == m.data,
                    "step {step} ({op:?}): acknowledged bytes differ"
                );
                kept.push(m);
            }
            Err(e) => {
                assert_eq!(code(&e), StatusCode::CAP_NOT_FOUND);
                assert!(
                    revoked_ok && !m.hard,
                    "step {step} ({op:?}): allocation lost: {m:?}"
                );
                *c = connect(c.addr()).await;
            }
        }
    }
    *live = kept;
    let st = c.status("1", "ibp").await.unwrap();
    let used = st.used_total;
    let used_hard = st.used_hard;
    let charged = |m: &Model| m.max + ALLOC_CHARGE;
    let want: u64 = live.iter().map(charged).sum();
    let want_hard: u64 = live.iter().filter(|m| m.hard).map(charged).sum();
    assert_eq!(used, want, "step {step} ({op:?}): used space");
    assert_eq!(
        used_hard, want_hard,
        "step {step} ({op:?}): used hard space"
    );
    assert!(used <= TOTAL && used_hard <= HARD_CAP && used - used_hard <= SOFT_CAP);
    assert_eq!(st.free_total, TOTAL - used, "free space");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn reported_space_matches_live_allocations_and_data_survives(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run_ops(ops));
    }
}
