//! The depot's accounting and limits against a hostile client, driven from
//! raw sockets: every reply, the STATUS figures and the bytes on disk after.

use std::path::Path;
use std::time::Duration;

use lors_ibp::caps::Capability;
use lors_ibp::proto::{Reply, StatusCode};
use tokio::io::AsyncWriteExt;

use crate::util::{DepotProc, Raw, pattern, tempdir};

const MIB: u64 = 1 << 20;

/// Read, write and manage tokens (`key typekey`) of one allocation.
struct Caps {
    read: String,
    write: String,
    manage: String,
}

fn tok(c: &Capability) -> String {
    format!("{} {}", c.key_token(), c.typekey)
}

async fn allocate(r: &mut Raw, size: u64) -> Caps {
    let reply = try_allocate(r, size).await;
    assert!(reply.starts_with("1 "), "ALLOCATE {size}: {reply:?}");
    let caps: Vec<Capability> = reply
        .split_whitespace()
        .skip(1)
        .map(|c| c.parse().unwrap())
        .collect();
    Caps {
        read: tok(&caps[0]),
        write: tok(&caps[1]),
        manage: tok(&caps[2]),
    }
}

async fn try_allocate(r: &mut Raw, size: u64) -> String {
    r.send(format!("1 1 1 2 1 3600 {size} 10\n").as_bytes())
        .await;
    r.line().await
}

fn err(code: StatusCode) -> String {
    Reply::fail(code).encode()
}

/// `(used, free, allocations)` of resource 1, from the version report.
async fn usage(r: &mut Raw) -> (u64, u64, u64) {
    r.send(b"1 4 5 10\n").await;
    assert_eq!(r.line().await, "1\n");
    let mut found = None;
    loop {
        let l = r.line().await;
        assert!(!l.is_empty(), "report cut short");
        if l == "END\n" {
            break;
        }
        if let Some(rest) = l.strip_prefix("RID: 1 ") {
            let w: Vec<&str> = rest.split_whitespace().collect();
            let num = |name: &str| -> u64 {
                let i = w.iter().position(|x| *x == name).unwrap();
                w[i + 1].parse().unwrap()
            };
            found = Some((num("Used:"), num("Free:"), num("Allocations:")));
        }
    }
    found.expect("report names RID 1")
}

/// PROBE: `(size, max_size)`.
async fn probe(r: &mut Raw, c: &Caps) -> (u64, u64) {
    r.send(format!("1 9 {} 40 0 0 0 0 10\n", c.manage).as_bytes())
        .await;
    let l = r.line().await;
    let w: Vec<u64> = l
        .split_whitespace()
        .map(|x| x.parse().unwrap_or_else(|_| panic!("PROBE reply {l:?}")))
        .collect();
    assert_eq!(w[0], 1, "PROBE reply {l:?}");
    (w[3], w[4])
}

async fn store(r: &mut Raw, c: &Caps, data: &[u8]) {
    r.send(format!("1 2 {} {} 10\n", c.write, data.len()).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    r.send(data).await;
    assert_eq!(r.line().await, format!("1 {} \n", data.len()));
}

async fn load(r: &mut Raw, c: &Caps, offset: u64, len: usize) -> Vec<u8> {
    r.send(format!("1 8 {} {offset} {len} 10\n", c.read).as_bytes())
        .await;
    assert_eq!(r.line().await, format!("1 {len} \n"));
    r.bytes(len).await
}

/// Bytes in the resource's data files (headers included).
fn bytes_on_disk(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p).map_or(0, |rd| {
            rd.flatten()
                .map(|e| {
                    let m = e.metadata().unwrap();
                    if m.is_dir() { walk(&e.path()) } else { m.len() }
                })
                .sum()
        })
    }
    walk(&dir.join("data"))
}

const HEADER: u64 = 4096;

/// What the quota charges each allocation besides its size: its header.
const CHARGE: u64 = HEADER;

#[tokio::test]
async fn truncate_cannot_grow_an_allocation_past_the_resource() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "100M"]);
    let mut r = Raw::connect(&d.addr).await;
    let a = allocate(&mut r, 1000).await;
    // The reproduction: 1 TiB on a 100 MiB resource.
    for size in [1u64 << 40, 100 * MIB + 1, u64::MAX - 1, u64::MAX] {
        r.send(format!("1 9 {} 45 {size} 10\n", a.manage).as_bytes())
            .await;
        assert_eq!(
            r.line().await,
            err(StatusCode::WOULD_EXCEED_POLICY),
            "TRUNCATE to {size}"
        );
    }
    assert_eq!(probe(&mut r, &a).await, (0, 1000));
    assert_eq!(
        usage(&mut r).await,
        (1000 + CHARGE, 100 * MIB - 1000 - CHARGE, 1)
    );
    // Within the resource, but more than is free: refused as no space.
    let b = allocate(&mut r, 60 * MIB).await;
    r.send(format!("1 9 {} 45 {} 10\n", a.manage, 40 * MIB + 1).as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_LIMIT));
    // Other clients can still allocate what is free.
    let mut other = Raw::connect(&d.addr).await;
    let c = allocate(&mut other, 30 * MIB).await;
    // A 150 MiB STORE into the 1000-byte allocation is refused before a byte.
    r.send(format!("1 2 {} {} 10\n", a.write, 150 * MIB).as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_LIMIT));
    assert!(r.closed().await, "STORE refusals close: data may follow");
    let mut r = Raw::connect(&d.addr).await;
    // Growth that fits is allowed and accounted.
    let grown = 10 * MIB - 1000 - 3 * CHARGE;
    r.send(format!("1 9 {} 45 {grown} 10\n", a.manage).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    store(&mut r, &a, &pattern(5 * MIB as usize, 1)).await;
    assert_eq!(probe(&mut r, &a).await, (5 * MIB, grown));
    assert_eq!(usage(&mut r).await, (100 * MIB - 1000, 1000, 3));
    // Shrinking below the data cuts it, on disk too.
    r.send(format!("1 9 {} 45 {} 10\n", a.manage, MIB).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    assert_eq!(probe(&mut r, &a).await, (MIB, MIB));
    assert_eq!(load(&mut r, &a, 0, 16).await, pattern(16, 1));
    assert_eq!(bytes_on_disk(dir.path()), HEADER + MIB);
    drop((b, c));
}

#[tokio::test]
async fn chng_to_u64_max_does_not_wrap_the_usage() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "100M"]);
    let mut r = Raw::connect(&d.addr).await;
    let a = allocate(&mut r, 1000).await;
    let b = allocate(&mut r, 1000).await;
    for size in [u64::MAX, u64::MAX - 1, 1 << 40] {
        for rel in ["-1", "1", "2"] {
            r.send(format!("1 9 {} 43 0 {size} -1 {rel} 10\n", a.manage).as_bytes())
                .await;
            assert_eq!(
                r.line().await,
                err(StatusCode::WOULD_EXCEED_POLICY),
                "CHNG {size} rel {rel}"
            );
        }
    }
    assert_eq!(
        usage(&mut r).await,
        (2000 + 2 * CHARGE, 100 * MIB - 2000 - 2 * CHARGE, 2)
    );
    assert_eq!(probe(&mut r, &a).await, (0, 1000));
    // Exactly what is free, and not a byte more.
    let rest = 100 * MIB - 2000 - 3 * CHARGE;
    assert_eq!(
        try_allocate(&mut r, rest + 1).await,
        err(StatusCode::WOULD_EXCEED_LIMIT)
    );
    r.send(format!("1 9 {} 43 0 {} -1 -1 10\n", b.manage, 100 * MIB - 999).as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_LIMIT));
    let c = allocate(&mut r, rest).await;
    assert_eq!(usage(&mut r).await, (100 * MIB, 0, 3));
    r.send(format!("1 9 {} 43 0 1001 -1 -1 10\n", a.manage).as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_LIMIT));
    // A 150 MiB STORE is refused; the resource holds what it promised.
    r.send(format!("1 2 {} {} 10\n", b.write, 150 * MIB).as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_LIMIT));
    let mut r = Raw::connect(&d.addr).await;
    store(&mut r, &c, &pattern(MIB as usize, 3)).await;
    assert_eq!(bytes_on_disk(dir.path()), HEADER + MIB);
    // Shrinking frees space to the byte; shrinking below the data is refused.
    r.send(format!("1 9 {} 43 0 {} -1 -1 10\n", c.manage, MIB - 1).as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_DAMAGE_DATA));
    r.send(format!("1 9 {} 43 0 {} -1 -1 10\n", c.manage, MIB).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    let used = 2000 + MIB + 3 * CHARGE;
    assert_eq!(usage(&mut r).await, (used, 100 * MIB - used, 3));
}

#[tokio::test]
async fn empty_stores_and_crashes_after_a_go_ahead_survive_restarts() {
    let dir = tempdir();
    let mut d = DepotProc::start(dir.path(), &["--size", "100M"]);
    let listen = format!("127.0.0.1:{}", d.port);
    let mut r = Raw::connect(&d.addr).await;
    let empty = allocate(&mut r, 1000).await;
    let cut = allocate(&mut r, 1000).await;
    let hurt = allocate(&mut r, 1000).await;
    // A zero-byte STORE.
    r.send(format!("1 2 {} 0 10\n", empty.write).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    assert_eq!(r.line().await, "1 0 \n");
    store(&mut r, &hurt, b"will be damaged").await;
    // A STORE whose go-ahead came, then the depot died before any byte.
    let mut c = Raw::connect(&d.addr).await;
    c.send(format!("1 2 {} 10 10\n", cut.write).as_bytes())
        .await;
    assert_eq!(c.line().await, "1 \n");
    d.kill9();

    // After the crash, both take STOREs; the intact one is still intact.
    let mut d = DepotProc::start(dir.path(), &["--size", "100M", "--listen", &listen]);
    let mut r = Raw::connect(&d.addr).await;
    store_and_check(&mut r, &[&empty, &cut], 0).await;
    assert_eq!(load(&mut r, &hurt, 0, 15).await, b"will be damaged");
    let used = 3000 + 3 * CHARGE;
    assert_eq!(usage(&mut r).await, (used, 100 * MIB - used, 3));
    assert_eq!(bytes_on_disk(dir.path()), 3 * HEADER + 15 + 200);
    d.terminate();

    // Damage one data file's header while the depot is down: after a clean
    // restart it is reported and reclaimed (caps gone, space back, the file
    // kept aside for the operator); the others work on.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(data_file(dir.path(), &hurt))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"XX", 30).unwrap();
    let mut d = DepotProc::start(dir.path(), &["--size", "100M", "--listen", &listen]);
    let mut r = Raw::connect(&d.addr).await;
    let used = 2000 + 2 * CHARGE;
    assert_eq!(usage(&mut r).await, (used, 100 * MIB - used, 2));
    r.send(format!("1 9 {} 40 0 0 0 0 10\n", hurt.manage).as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::CAP_NOT_FOUND));
    let kept = std::fs::read_dir(dir.path().join("damaged"))
        .unwrap()
        .count();
    assert_eq!(kept, 1);
    store_and_check(&mut r, &[&empty, &cut], 1).await;
    assert_eq!(bytes_on_disk(dir.path()), 2 * HEADER + 400);
    d.kill9();

    // And once more after a crash.
    let d = DepotProc::start(dir.path(), &["--size", "100M", "--listen", &listen]);
    let mut r = Raw::connect(&d.addr).await;
    store_and_check(&mut r, &[&empty, &cut], 2).await;
    assert_eq!(bytes_on_disk(dir.path()), 2 * HEADER + 600);
}

/// Appends 100 bytes to each allocation and reads them back.
async fn store_and_check(r: &mut Raw, allocs: &[&Caps], round: u8) {
    for (i, a) in allocs.iter().enumerate() {
        let seed = round * 2 + i as u8;
        let (size, _) = probe(r, a).await;
        assert_eq!(size, u64::from(round) * 100);
        store(r, a, &pattern(100, seed)).await;
        assert_eq!(load(r, a, size, 100).await, pattern(100, seed));
    }
}

/// The data file of `c`, found by its allocation id (the capability's typekey
/// is the id; files are named by it in hex).
fn data_file(dir: &Path, c: &Caps) -> std::path::PathBuf {
    let id: u64 = c.manage.split_whitespace().nth(1).unwrap().parse().unwrap();
    dir.join("data")
        .join(format!("{:02x}", id & 0xff))
        .join(format!("{id:016x}"))
}

/// A depot configured with short deadlines, so the test sees them pass.
fn limited_depot(dir: &Path, extra: &str) -> DepotProc {
    let cfg = format!(
        "listen = \"127.0.0.1:0\"\nio_timeout = \"1s\"\n{extra}\n\
         [[resource]]\nrid = \"1\"\npath = \"{}\"\nsize = \"1GiB\"\n",
        dir.display()
    );
    let path = dir.join("depot.toml");
    std::fs::write(&path, cfg).unwrap();
    DepotProc::start(dir, &["--config", path.to_str().unwrap()])
}

async fn raw_from(addr: &str, from: &str) -> Raw {
    Raw::connect_from(addr, from).await
}

/// Everything the depot still sends before it closes the connection, which
/// it must do within `limit`.
async fn read_to_close(r: &mut Raw, limit: Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut rest = Vec::new();
    let got = tokio::time::timeout(limit, r.rd.read_to_end(&mut rest)).await;
    assert!(
        got.is_ok(),
        "the depot kept the connection open past {limit:?}"
    );
    String::from_utf8_lossy(&rest).into_owned()
}

/// Sends without panicking: the depot may already have closed the socket.
async fn send_quiet(r: &mut Raw, b: &[u8]) {
    let _ = r.rd.get_mut().write_all(b).await;
}

#[tokio::test]
async fn idle_data_phases_cannot_starve_other_clients() {
    let dir = tempdir();
    // The per-client caps as they were when this attack was found, so the
    // counts below say which cap did what.
    let d = limited_depot(
        dir.path(),
        "max_client_timeout = \"3s\"\nmax_connections_per_client = 64\nmax_transfers_per_client = 16",
    );
    let mut setup = Raw::connect(&d.addr).await;
    let mut targets = Vec::new();
    for _ in 0..200 {
        targets.push(allocate(&mut setup, 2 * MIB).await);
    }
    // 200 connections from one address, each starting a 2 MiB STORE with a
    // one-hour timeout and sending nothing.
    // (All connect first, so which ones the depot admits does not depend
    // on how fast the refused ones go away.)
    let mut idle = Vec::new();
    for _ in &targets {
        idle.push(raw_from(&d.addr, "127.0.0.2").await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (r, t) in idle.iter_mut().zip(&targets) {
        send_quiet(r, format!("1 2 {} {} 3600\n", t.write, 2 * MIB).as_bytes()).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another client is served at once.
    let mut good = raw_from(&d.addr, "127.0.0.1").await;
    let mine = allocate(&mut good, 2 * MIB).await;
    let data = pattern(2 * MIB as usize, 7);
    store(&mut good, &mine, &data).await;
    assert_eq!(load(&mut good, &mine, 0, data.len()).await, data);

    // What the idle ones got: 64 connections admitted (the per-client cap),
    // the rest "busy"; 16 go-aheads (the per-client data-phase cap); and
    // everyone closed once the capped 3 s deadline passed.
    let (mut busy, mut go, mut refused) = (0, 0, 0);
    for r in &mut idle {
        let first = r.line().await;
        match first.as_str() {
            "-66 1.0\n" => busy += 1,
            "1 \n" => go += 1,
            l if l == err(StatusCode::OUT_OF_SOCKETS) => refused += 1,
            other => panic!("unexpected reply {other:?}"),
        }
        assert!(r.closed().await, "an idle data phase outlived its deadline");
    }
    assert_eq!((busy, go, refused), (136, 16, 48));
    // Nothing of theirs was committed or left on disk.
    for t in targets.iter().take(50) {
        assert_eq!(probe(&mut good, t).await, (0, 2 * MIB));
    }
    assert_eq!(bytes_on_disk(dir.path()), 17 * HEADER + 2 * MIB);
}

#[tokio::test]
async fn a_trickling_client_holds_only_its_share_of_the_buffers() {
    let dir = tempdir();
    let d = limited_depot(
        dir.path(),
        "max_client_timeout = \"12s\"\nbuffer_memory = \"8MiB\"\nmax_buffer_per_client = \"4MiB\"",
    );
    let mut setup = Raw::connect(&d.addr).await;
    let mut targets = Vec::new();
    for _ in 0..4 {
        targets.push(allocate(&mut setup, 8 * MIB).await);
    }
    // Four STOREs that send 1 MiB each and stall mid-round, holding budget
    // for 12 s — longer than the other client will wait for its reply.
    let mut slow = Vec::new();
    for t in &targets {
        let mut r = raw_from(&d.addr, "127.0.0.2").await;
        r.send(format!("1 2 {} {} 12\n", t.write, 8 * MIB).as_bytes())
            .await;
        assert_eq!(r.line().await, "1 \n");
        send_quiet(&mut r, &pattern(MIB as usize, 0)).await;
        slow.push(r);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The other client gets the budget the trickler may not take.
    let mut good = raw_from(&d.addr, "127.0.0.1").await;
    let mine = allocate(&mut good, 4 * MIB).await;
    let data = pattern(4 * MIB as usize, 5);
    store(&mut good, &mine, &data).await;
    assert_eq!(load(&mut good, &mine, 0, data.len()).await, data);
    // Two of them held the client's whole share; the other two were told
    // the depot is busy for them. All are cut off and rolled back.
    for r in &mut slow {
        let rest = read_to_close(r, Duration::from_secs(20)).await;
        assert!(
            rest.is_empty() || rest == err(StatusCode::OUT_OF_SOCKETS),
            "{rest:?}"
        );
    }
    for t in &targets {
        assert_eq!(probe(&mut good, t).await, (0, 8 * MIB));
    }
    assert_eq!(bytes_on_disk(dir.path()), 5 * HEADER + 4 * MIB);
}

/// Every number a request carries, at 0, 1, max − 1 and max: each gets its
/// reply, and the depot's data and accounting are untouched by the refusals.
#[tokio::test]
async fn wire_numbers_at_their_extremes() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "100M", "--max-duration", "1h"]);
    let mut r = Raw::connect(&d.addr).await;
    let a = allocate(&mut r, 1000).await;
    let q = {
        r.send(b"1 1 1 2 3 3600 100 10\n").await;
        let l = r.line().await;
        let caps: Vec<Capability> = l
            .split_whitespace()
            .skip(1)
            .map(|c| c.parse().unwrap())
            .collect();
        Caps {
            read: tok(&caps[0]),
            write: tok(&caps[1]),
            manage: tok(&caps[2]),
        }
    };
    store(&mut r, &a, b"0123456789").await;
    let (u64max, i64max) = (u64::MAX, i64::MAX);
    let (u64m1, i64m1) = (u64::MAX - 1, i64::MAX - 1);
    let exceed = err(StatusCode::WOULD_EXCEED_LIMIT);
    let policy = err(StatusCode::WOULD_EXCEED_POLICY);
    let invalid = err(StatusCode::INVALID_PARAMETER);
    let long = err(StatusCode::LONG_DURATION);
    let (rd, wr, mg) = (&a.read, &a.write, &a.manage);
    // (request, reply; "" = a success reply checked by its first token)
    let cases: Vec<(String, String)> = vec![
        // ALLOCATE size and duration.
        ("1 1 1 2 1 3600 0 10".into(), invalid.clone()),
        (format!("1 1 1 2 1 3600 {u64m1} 10"), policy.clone()),
        (format!("1 1 1 2 1 3600 {u64max} 10"), policy.clone()),
        ("1 1 1 2 1 0 1 10".into(), invalid.clone()),
        ("1 1 1 2 1 -2 1 10".into(), invalid.clone()),
        (format!("1 1 1 2 1 {i64m1} 1 10"), long.clone()),
        (format!("1 1 1 2 1 {i64max} 1 10"), long.clone()),
        (format!("1 1 1 2 1 {} 1 10", i64::MIN), invalid.clone()),
        // LOAD offset and length.
        (format!("1 8 {rd} 0 0 10"), "1 0 \n".into()),
        (format!("1 8 {rd} 10 0 10"), "1 0 \n".into()),
        (format!("1 8 {rd} 11 0 10"), exceed.clone()),
        (format!("1 8 {rd} 0 11 10"), exceed.clone()),
        (format!("1 8 {rd} {u64max} 0 10"), exceed.clone()),
        (format!("1 8 {rd} {u64m1} 1 10"), exceed.clone()),
        (format!("1 8 {rd} 0 {u64max} 10"), exceed.clone()),
        // An offset + length past 2^64 is refused by the parser, before any
        // data phase (WRITE's below).
        (format!("1 8 {rd} {u64max} 1 10"), invalid.clone()),
        (format!("1 8 {rd} 1 {u64max} 10"), invalid.clone()),
        (format!("1 8 {rd} {u64m1} {u64m1} 10"), invalid.clone()),
        // CHNG size and duration; TRUNCATE size.
        (
            format!("1 9 {mg} 43 0 1 -1 -1 10"),
            err(StatusCode::WOULD_DAMAGE_DATA),
        ),
        (format!("1 9 {mg} 43 0 0 {i64max} -1 10"), policy.clone()),
        (format!("1 9 {mg} 43 0 0 {i64m1} -1 10"), policy.clone()),
        (format!("1 9 {mg} 43 0 0 {} -1 10", i64::MIN), "1 \n".into()),
        (format!("1 9 {mg} 43 0 0 0 -1 10"), invalid.clone()),
        (format!("1 9 {mg} 43 0 0 -1 {i64max} 10"), invalid.clone()),
        (format!("1 9 {mg} 45 0 10"), invalid.clone()),
        (format!("1 9 {mg} 45 {u64max} 10"), policy.clone()),
        (format!("1 9 {mg} 45 {u64m1} 10"), policy.clone()),
        // Queue: LOAD more than is queued, at an offset.
        (format!("1 8 {} 0 {u64max} 10", q.read), exceed.clone()),
        (format!("1 8 {} 1 1 10", q.read), invalid.clone()),
        // A request's timeout field at its extremes is accepted.
        (format!("1 8 {rd} 0 1 0"), "1 1 \n".into()),
        (format!("1 8 {rd} 0 1 {}", u32::MAX), "1 1 \n".into()),
        (format!("1 8 {rd} 0 1 {u64max}"), "1 1 \n".into()),
    ];
    for (req, want) in &cases {
        r.send(format!("{req}\n").as_bytes()).await;
        let got = r.line().await;
        assert_eq!(&got, want, "{req}");
        if let Some(n) = got
            .strip_prefix("1 ")
            .and_then(|x| x.trim().parse::<usize>().ok())
        {
            r.bytes(n).await;
        }
    }
    // Data-phase requests that must be refused before any byte, and close
    // (the client may be sending the data already).
    let closing = [
        (format!("1 13 {wr} {u64max} 1 10"), invalid.clone()),
        (format!("1 13 {wr} 1 {u64max} 10"), invalid.clone()),
        (format!("1 13 {wr} {u64m1} {u64m1} 10"), invalid.clone()),
        (format!("1 2 {wr} {u64max} 10"), exceed.clone()),
        (format!("1 2 {wr} {u64m1} 10"), exceed.clone()),
        (format!("1 2 {wr} 991 10"), exceed.clone()),
        (format!("1 13 {wr} {u64max} 0 10"), exceed.clone()),
        (format!("1 13 {wr} {u64m1} 1 10"), exceed.clone()),
        (format!("1 13 {wr} 0 {u64max} 10"), exceed.clone()),
        (format!("1 13 {wr} 1000 1 10"), exceed.clone()),
        (format!("1 2 {} {u64max} 10", q.write), exceed.clone()),
        (format!("1 2 {} 101 10", q.write), exceed.clone()),
    ];
    for (req, want) in &closing {
        let mut c = Raw::connect(&d.addr).await;
        c.send(format!("{req}\n").as_bytes()).await;
        assert_eq!(&c.line().await, want, "{req}");
        assert!(c.closed().await, "{req}");
    }
    // The edges that fit: a STORE of 0 bytes into a queue is answered at
    // once (no data to wait for), and a WRITE of 1 byte at 999 leaves a hole
    // before it that reads as zeros.
    r.send(format!("1 2 {} 0 10\n", q.write).as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    assert_eq!(r.line().await, "1 0 \n");
    r.send(format!("1 13 {wr} 999 1 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"!").await;
    assert_eq!(r.line().await, "1 1 \n");
    let all = load(&mut r, &a, 0, 1000).await;
    assert_eq!(&all[..10], b"0123456789");
    assert!(all[10..999].iter().all(|&b| b == 0));
    assert_eq!(all[999], b'!');
    let used = 1100 + 2 * CHARGE;
    assert_eq!(usage(&mut r).await, (used, 100 * MIB - used, 2));
    // The byte array's header and bytes, and the queue's header (its ring
    // was never written).
    assert_eq!(bytes_on_disk(dir.path()), 2 * HEADER + 1000);
}
