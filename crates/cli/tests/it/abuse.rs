//! Against a hostile peer, round two: LStore's extensions (aliases, disk
//! checksums, checksummed queues), resource amplification (budget, idle
//! connections, per-allocation overhead), the L-Bone, and hostile exNodes.
//! Each test makes the attack with raw sockets against real `lors depot` and
//! `lors lbone` processes and checks what a legitimate client gets and what
//! the server holds afterwards.

use std::path::Path;
use std::time::{Duration, Instant};

use lors_ibp::caps::Capability;
use lors_ibp::proto::{Reply, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::util::{DepotProc, LboneProc, Raw, lors, lors_within, memory_of, pattern, tempdir};

const MIB: u64 = 1 << 20;

/// `key typekey` of a capability.
fn tok(c: &Capability) -> String {
    format!("{} {}", c.key_token(), c.typekey)
}

/// Read, write and manage tokens from an ALLOCATE-shaped reply.
fn caps(reply: &str) -> [String; 3] {
    assert!(reply.starts_with("1 "), "{reply:?}");
    let c: Vec<String> = reply
        .split_whitespace()
        .skip(1)
        .map(|c| tok(&c.parse().unwrap()))
        .collect();
    c.try_into().unwrap()
}

async fn request(r: &mut Raw, line: &str) -> String {
    r.send(format!("{line}\n").as_bytes()).await;
    r.line().await
}

async fn allocate(r: &mut Raw, line: &str) -> [String; 3] {
    caps(&request(r, line).await)
}

fn err(code: StatusCode) -> String {
    Reply::fail(code).encode()
}

/// A STORE or WRITE of `data` with its go-ahead; the final reply.
async fn put(r: &mut Raw, line: &str, data: &[u8]) -> String {
    assert_eq!(request(r, line).await, "1 \n", "{line}");
    r.send(data).await;
    r.line().await
}

async fn load(r: &mut Raw, read: &str, off: u64, len: u64) -> Vec<u8> {
    assert_eq!(
        request(r, &format!("1 8 {read} {off} {len} 10")).await,
        format!("1 {len} \n")
    );
    r.bytes(len as usize).await
}

/// PROBE through a manage key: `(size, max_size)`.
async fn probe(r: &mut Raw, manage: &str) -> (u64, u64) {
    let l = request(r, &format!("1 9 {manage} 40 0 0 0 0 10")).await;
    let f: Vec<u64> = l
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    assert_eq!(f.first(), Some(&1), "PROBE {l:?}");
    (f[3], f[4])
}

/// Every file under the resource's data directory, with its size.
fn data_files(dir: &Path) -> Vec<(String, u64)> {
    fn walk(p: &Path, out: &mut Vec<(String, u64)>) {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk(&e.path(), out);
            } else {
                out.push((e.path().display().to_string(), m.len()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&dir.join("data"), &mut out);
    out
}

/// A depot from a TOML `extra` plus one 1 GiB resource in `dir`.
fn configured_depot(dir: &Path, extra: &str) -> DepotProc {
    let cfg = format!(
        "listen = \"127.0.0.1:0\"\n{extra}\n[[resource]]\nrid = \"1\"\npath = \"{}\"\nsize = \"1GiB\"\n",
        dir.display()
    );
    let path = dir.join("depot.toml");
    std::fs::write(&path, cfg).unwrap();
    DepotProc::start(dir, &["--config", path.to_str().unwrap()])
}

/// Item 1: a zero-length WRITE at the end of an alias's window moved the
/// committed length past the bytes on disk; the allocation was then moved
/// to `damaged/` at restart and the owner's acknowledged bytes were gone.
#[tokio::test]
async fn zero_length_writes_change_nothing_even_through_an_alias() {
    let dir = tempdir();
    let mut d = DepotProc::start(dir.path(), &["--size", "100M"]);
    let listen = format!("127.0.0.1:{}", d.port);
    let mut r = Raw::connect(&d.addr).await;
    let [rd, wr, mg] = allocate(&mut r, "1 1 1 2 1 3600 8192 10").await;
    let owner = pattern(1000, 3);
    assert_eq!(
        put(&mut r, &format!("1 2 {wr} 1000 10"), &owner).await,
        "1 1000 \n"
    );
    let [_, awr, _] = allocate(&mut r, &format!("1 14 {mg} 1000 4096 0 10")).await;
    // Through the alias, at the end of its window; and through the owner's
    // key past the end; and a checksummed allocation the same way.
    for line in [
        format!("1 13 {awr} 4096 0 30"),
        format!("1 13 {wr} 5000 0 30"),
        format!("1 13 {wr} 8192 0 30"),
    ] {
        assert_eq!(put(&mut r, &line, b"").await, "1 0 \n", "{line}");
    }
    assert_eq!(probe(&mut r, &mg).await, (1000, 8192));
    assert_eq!(load(&mut r, &rd, 0, 1000).await, owner);
    let [crd, cwr, cmg] = allocate(&mut r, "1 29 4 1024 1 2 1 3600 8192 10").await;
    assert_eq!(
        put(&mut r, &format!("1 2 {cwr} 100 10"), &owner[..100]).await,
        "1 100 \n"
    );
    assert_eq!(
        put(&mut r, &format!("1 13 {cwr} 4000 0 30"), b"").await,
        "1 0 \n"
    );
    assert_eq!(request(&mut r, &format!("1 32 {cmg} 0 10")).await, "1 0\n");
    assert_eq!(load(&mut r, &crd, 0, 100).await, &owner[..100]);

    // After a restart nothing is damaged and every byte is there.
    drop(r);
    d.terminate();
    let d = DepotProc::start(dir.path(), &["--size", "100M", "--listen", &listen]);
    let mut r = Raw::connect(&d.addr).await;
    assert!(
        !dir.path().join("damaged").exists(),
        "an allocation was damaged"
    );
    assert_eq!(probe(&mut r, &mg).await, (1000, 8192));
    assert_eq!(load(&mut r, &rd, 0, 1000).await, owner);
    assert_eq!(probe(&mut r, &cmg).await, (100, 8192));
}

/// Item 2: SHA-512 over 1-byte blocks made 64 bytes of digest per byte
/// allocated: one 8 MiB allocation put 537 MB on disk and GET_CHKSUM took
/// 1 GiB of memory.
#[tokio::test]
async fn tiny_checksum_blocks_cannot_amplify_disk_or_memory() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "1G"]);
    let mut r = Raw::connect(&d.addr).await;
    let blocksize = err(StatusCode::CHKSUM_BLOCKSIZE);
    for bs in [1, 64, 1024] {
        assert_eq!(
            request(&mut r, &format!("1 29 2 {bs} 0 2 1 3600 8388608 30")).await,
            blocksize,
            "block size {bs}"
        );
    }
    // The smallest block that keeps digests within a sixteenth: accepted,
    // written at its far end, its digests read back.
    let [_, wr, mg] = allocate(&mut r, "1 29 2 2048 0 2 1 3600 8388608 30").await;
    assert_eq!(
        put(&mut r, &format!("1 13 {wr} {} 1 30", 8 * MIB - 1), b"!").await,
        "1 1 \n"
    );
    let head = request(&mut r, &format!("1 31 {mg} 0 30")).await;
    assert_eq!(head, "1 2 64 2048 4096 262144\n");
    r.bytes(262_144).await;
    assert_eq!(request(&mut r, &format!("1 32 {mg} 0 30")).await, "1 0\n");
    let on_disk: u64 = data_files(dir.path()).iter().map(|(_, n)| n).sum();
    assert!(
        on_disk <= 4096 + 8 * MIB + MIB / 2 + 4096,
        "{on_disk} bytes on disk"
    );
    // A small allocation may have small blocks, but not grow with them.
    let [_, _, smg] = allocate(&mut r, "1 29 2 4 0 2 1 3600 64 30").await;
    assert_eq!(
        request(&mut r, &format!("1 9 {smg} 43 0 8388608 -1 -1 30")).await,
        blocksize
    );
    assert_eq!(
        request(&mut r, &format!("1 9 {smg} 45 8388608 30")).await,
        blocksize
    );
    assert!(memory_of(d.pid(), "VmHWM") < 200 * MIB, "depot peak memory");
}

/// Item 3: a DECR that deleted an allocation while its STORE was under way
/// left the `.cks` file re-created by the STORE's commit, an orphan nothing
/// would remove until a restart.
#[tokio::test]
async fn deleting_an_allocation_during_its_store_leaves_no_files() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "100M"]);
    let mut owner = Raw::connect(&d.addr).await;
    for round in 0..4 {
        let [_, wr, mg] = allocate(&mut owner, "1 29 1 4096 0 2 1 3600 4194304 10").await;
        let mut w = Raw::connect(&d.addr).await;
        let data = pattern(4 * MIB as usize, round);
        assert_eq!(
            request(&mut w, &format!("1 2 {wr} {} 30", data.len())).await,
            "1 \n"
        );
        w.send(&data[..data.len() / 2]).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            request(&mut owner, &format!("1 9 {mg} 42 1 10")).await,
            "1 \n"
        );
        w.send(&data[data.len() / 2..]).await;
        let reply = w.line().await;
        assert!(
            reply == "1 4194304 \n" || reply.starts_with('-'),
            "{reply:?}"
        );
        assert_eq!(
            request(&mut owner, &format!("1 9 {mg} 40 0 0 0 0 10")).await,
            err(StatusCode::CAP_NOT_FOUND)
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        data_files(dir.path()),
        vec![],
        "files of deleted allocations"
    );
}

/// Item 4: a checksummed LOAD from a queue was framed whole in memory:
/// SHA-512 over 1-byte blocks is 129 bytes of memory per queued byte.
#[tokio::test]
async fn checksummed_queue_loads_are_framed_as_they_go() {
    use lors_ibp::proto::chksum::{BlockHasher, ChksumType};
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "1G"]);
    let mut r = Raw::connect(&d.addr).await;
    let [rd, wr, _] = allocate(&mut r, "1 1 1 2 3 3600 1048576 10").await;
    let data = pattern(MIB as usize, 9);
    assert_eq!(
        put(&mut r, &format!("1 2 {wr} {MIB} 30"), &data).await,
        "1 1048576 \n"
    );
    let before = memory_of(d.pid(), "VmHWM");
    // MD5 over 1-byte blocks: 33 bytes on the wire per byte queued.
    assert_eq!(
        request(&mut r, &format!("1 24 4 1 {rd} 0 {MIB} 60")).await,
        format!("1 {MIB} \n")
    );
    let framed = r.bytes(33 * MIB as usize).await;
    let after = memory_of(d.pid(), "VmHWM");
    for i in [0usize, 1, 4097, MIB as usize - 1] {
        let block = &framed[i * 33..i * 33 + 33];
        assert_eq!(block[0], data[i]);
        let mut h = BlockHasher::new(ChksumType::Md5);
        h.update(&data[i..=i]);
        assert_eq!(&block[1..], h.finish_hex().as_bytes(), "digest of byte {i}");
    }
    assert!(
        after < before + 16 * MIB,
        "peak memory grew {} MiB for a 1 MiB queue",
        (after - before) / MIB
    );
}

/// A STORE of `len` bytes into a fresh allocation of type `ty`, started
/// from `host`: its go-ahead received, no byte sent.
async fn started_store(d: &DepotProc, setup: &mut Raw, host: &str, ty: u8, len: u64) -> Raw {
    let [_, wr, _] = allocate(setup, &format!("1 1 1 2 {ty} 3600 {len} 10")).await;
    let mut t = Raw::connect_from(&d.addr, host).await;
    assert_eq!(request(&mut t, &format!("1 2 {wr} {len} 60")).await, "1 \n");
    t
}

/// Item 5: hosts trickling one byte at a time into big FIFO and byte-array
/// STOREs held the whole transfer budget: every other client's STORE waited
/// out the I/O timeout, then got -66.
#[tokio::test]
async fn tricklers_on_many_hosts_leave_the_budget_to_others() {
    let dir = tempdir();
    let d = configured_depot(
        dir.path(),
        "io_timeout = \"3s\"\nmax_client_timeout = \"60s\"",
    );
    let mut setup = Raw::connect(&d.addr).await;
    let mut tricklers = Vec::new();
    // Four hosts, one 64 MiB FIFO STORE each; eight hosts, sixteen 4 MiB
    // byte-array STOREs each.
    for h in 2..6 {
        tricklers.push(started_store(&d, &mut setup, &format!("127.0.0.{h}"), 3, 64 * MIB).await);
    }
    for h in 10..18 {
        for _ in 0..16 {
            let from = format!("127.0.0.{h}");
            tricklers.push(started_store(&d, &mut setup, &from, 1, 4 * MIB).await);
        }
    }
    let trickle = async {
        for _ in 0..6 {
            for t in &mut tricklers {
                let _ = t.rd.get_mut().write_all(b"x").await;
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
    };
    let legit = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut r = Raw::connect(&d.addr).await;
        let [rd, wr, _] = allocate(&mut r, "1 1 1 2 1 3600 8388608 10").await;
        let data = pattern(8 * MIB as usize, 4);
        let t0 = Instant::now();
        let reply = put(&mut r, &format!("1 2 {wr} {} 10", data.len()), &data).await;
        let took = t0.elapsed();
        assert_eq!(reply, "1 8388608 \n");
        assert_eq!(load(&mut r, &rd, 0, 8 * MIB).await, data);
        took
    };
    let ((), took) = tokio::join!(trickle, legit);
    assert!(
        took < Duration::from_secs(3),
        "the legitimate STORE took {took:?}"
    );
}

/// Item 6: hosts parking idle connections up to the depot's connection cap
/// (each under its per-client share) left every legitimate client `-66`.
#[tokio::test]
async fn idle_connections_make_room_at_the_connection_cap() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--max-connections", "32"]);
    let mut idle = Vec::new();
    for h in 2..6 {
        for _ in 0..8 {
            idle.push(Raw::connect_from(&d.addr, &format!("127.0.1.{h}")).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Five clients, each kept connected: each needs a place of its own.
    let mut served = Vec::new();
    for _ in 0..5 {
        let mut r = Raw::connect(&d.addr).await;
        let reply = request(&mut r, "1 1 1 2 1 3600 1000 10").await;
        assert!(reply.starts_with("1 ibp://"), "{reply:?}");
        served.push(r);
    }
    // The room came from the parked connections.
    let mut closed = 0;
    for r in &mut idle {
        let mut b = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(50), r.rd.read(&mut b)).await
        {
            closed += 1;
        }
    }
    assert!(closed >= 5, "{closed} idle connections closed");
}

/// Item 7: quota did not bound overhead: 100,000 one-byte allocations fit
/// in 100,000 bytes of quota; 20,480 aliases fit on 80 KiB.
#[tokio::test]
async fn allocations_pay_for_their_overhead() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "10M"]);
    let mut r = Raw::connect(&d.addr).await;
    let mut granted = 0;
    loop {
        let reply = request(&mut r, "1 1 1 2 1 3600 1 10").await;
        if !reply.starts_with("1 ") {
            assert_eq!(reply, err(StatusCode::WOULD_EXCEED_LIMIT));
            break;
        }
        granted += 1;
        assert!(granted <= 3000, "one-byte allocations without end");
    }
    assert_eq!(granted, (10 * MIB / (4096 + 1)) as usize);
    // Aliases: a handful for a tiny allocation.
    let dir2 = tempdir();
    let d2 = DepotProc::start(dir2.path(), &["--size", "10M"]);
    let mut r = Raw::connect(&d2.addr).await;
    let [_, _, mg] = allocate(&mut r, "1 1 1 2 1 3600 1 10").await;
    for _ in 0..4 {
        allocate(&mut r, &format!("1 14 {mg} 0 0 0 10")).await;
    }
    assert_eq!(
        request(&mut r, &format!("1 14 {mg} 0 0 0 10")).await,
        err(StatusCode::WOULD_EXCEED_POLICY)
    );
    // And a cap on allocations however large the quota.
    let dir3 = tempdir();
    let d3 = configured_depot(dir3.path(), "max_allocations = 50");
    let mut r = Raw::connect(&d3.addr).await;
    for _ in 0..50 {
        allocate(&mut r, "1 1 1 2 1 3600 1 10").await;
    }
    assert_eq!(
        request(&mut r, "1 1 1 2 1 3600 1 10").await,
        err(StatusCode::WOULD_EXCEED_POLICY)
    );
}

/// Item 8: a checksummed allocation nothing was written to answered
/// GET_CHKSUM, VALIDATE_CHKSUM and `LOAD 0 0` with -16, and logged a
/// storage failure anyone with the read key could repeat.
#[tokio::test]
async fn a_fresh_checksummed_allocation_answers_every_command() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "100M"]);
    let mut r = Raw::connect(&d.addr).await;
    let [rd, _, mg] = allocate(&mut r, "1 29 1 4096 0 2 1 3600 65536 10").await;
    assert_eq!(
        request(&mut r, &format!("1 31 {mg} 0 10")).await,
        "1 1 32 4096 0 0\n"
    );
    assert_eq!(
        request(&mut r, &format!("1 31 {mg} 1 10")).await,
        "1 1 32 4096 0 0\n"
    );
    assert_eq!(request(&mut r, &format!("1 32 {mg} 0 10")).await, "1 0\n");
    assert_eq!(request(&mut r, &format!("1 32 {mg} 1 10")).await, "1 0\n");
    assert_eq!(request(&mut r, &format!("1 8 {rd} 0 0 10")).await, "1 0 \n");
    assert_eq!(
        request(&mut r, &format!("1 8 {rd} 0 1 10")).await,
        err(StatusCode::WOULD_EXCEED_LIMIT)
    );
    assert_eq!(data_files(dir.path()), vec![], "a reader made files");
}

/// An alias lives no longer than its allocation: after the allocation's
/// lease is shortened, the alias's PROBE says so.
#[tokio::test]
async fn an_alias_probe_reports_its_allocations_shortened_lease() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "100M"]);
    let mut r = Raw::connect(&d.addr).await;
    let [_, _, mg] = allocate(&mut r, "1 1 1 2 1 3600 1000 10").await;
    let [_, _, amg] = allocate(&mut r, &format!("1 14 {mg} 0 0 0 10")).await;
    assert_eq!(
        request(&mut r, &format!("1 9 {mg} 43 0 0 100 -1 10")).await,
        "1 \n"
    );
    let p = request(&mut r, &format!("1 15 {amg} 40 3 10")).await;
    let left: u64 = p.split_whitespace().nth(5).unwrap().parse().unwrap();
    assert!(left <= 100, "{p:?}");
}

/// Raw HTTP to the L-Bone from a chosen local address; the status code
/// (`None`: reset or closed without an answer) and the body.
pub(crate) async fn http_from(addr: &str, from: &str, req: &str) -> (Option<u16>, String) {
    let mut r = Raw::connect_from(addr, from).await;
    if r.rd.get_mut().write_all(req.as_bytes()).await.is_err() {
        return (None, String::new());
    }
    let mut out = Vec::new();
    let got = tokio::time::timeout(Duration::from_secs(10), r.rd.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = match got {
        Ok(Ok(_)) => text.split_whitespace().nth(1).and_then(|s| s.parse().ok()),
        _ => None,
    };
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

pub(crate) fn post(path: &str, token: Option<&str>, body: &str) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn registration(host: &str, city: &str) -> String {
    serde_json::json!({
        "host": host,
        "port": 6714,
        "resources": [{"rid": "1", "hard_free": 1u64 << 30, "hard_total": 1u64 << 30,
            "soft_free": 0, "soft_total": 0, "max_duration": 86400,
            "types": ["byte_array"]}],
        "location": {"city": city, "tags": []},
        "version": "test",
    })
    .to_string()
}

/// `n` depots registered with `lb`, each with a 240-character city: a
/// listing of about 1 KB a depot.
pub(crate) async fn register_many(lb: &LboneProc, n: usize) {
    for i in 0..n {
        let req = post(
            "/api/v1/register",
            Some(&lb.token),
            &registration(&format!("depot{i}.example.org"), &"Brno".repeat(60)),
        );
        let (s, body) = http_from(&lb.http, "127.0.0.1", &req).await;
        assert_eq!(s, Some(200), "{body}");
    }
}

fn db_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("lbone.sqlite"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// Item 9: anyone could grow the L-Bone's database with rate reports of
/// made-up depots (165 MiB in 30 s).
#[tokio::test]
async fn lbone_rate_reports_cannot_grow_the_directory() {
    let dir = tempdir();
    let lb = LboneProc::start(dir.path(), &[]);
    let (s, _) = http_from(
        &lb.http,
        "127.0.0.1",
        &post(
            "/api/v1/register",
            Some(&lb.token),
            &registration("d1.example.org", "Brno"),
        ),
    )
    .await;
    assert_eq!(s, Some(200));
    let made_up = |i: usize| {
        let rates: Vec<_> = (0..1024)
            .map(|k| serde_json::json!({"depot": format!("{}{i}-{k}:1", "x".repeat(280)), "bytes_per_sec": 1e6}))
            .collect();
        serde_json::json!({ "rates": rates }).to_string()
    };
    let before = db_bytes(dir.path());
    let mut limited = 0;
    for i in 0..80 {
        let (s, body) = http_from(
            &lb.http,
            "127.0.5.1",
            &post("/api/v1/rates", None, &made_up(i)),
        )
        .await;
        match s {
            Some(200) => assert!(body.contains("\"recorded\":0"), "{body}"),
            Some(429) => limited += 1,
            other => panic!("rate report answered {other:?}: {body}"),
        }
    }
    assert!(limited >= 20, "{limited} of 80 reports in a minute refused");
    assert!(
        db_bytes(dir.path()) < before + MIB,
        "the database grew from {before} to {} bytes",
        db_bytes(dir.path())
    );
    // A report of a listed depot from another network still counts.
    let real = r#"{"rates":[{"depot":"d1.example.org:6714","bytes_per_sec":5e6}]}"#;
    let (s, body) = http_from(&lb.http, "127.0.6.1", &post("/api/v1/rates", None, real)).await;
    assert_eq!(s, Some(200), "{body}");
    assert!(body.contains("\"recorded\":1"), "{body}");
    // Hosts that are not hosts are refused.
    for host in [":", "..", "a:b:c", "-x.org", "a..b"] {
        let (s, _) = http_from(
            &lb.http,
            "127.0.0.1",
            &post(
                "/api/v1/register",
                Some(&lb.token),
                &registration(host, "Brno"),
            ),
        )
        .await;
        assert_eq!(s, Some(400), "host {host:?}");
    }
}

/// Item 10: 300 idle connections from one host took every connection the
/// L-Bone serves: everyone else's requests were reset.
#[tokio::test]
async fn lbone_one_host_cannot_take_every_connection() {
    let dir = tempdir();
    let lb = LboneProc::start(dir.path(), &[]);
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(Raw::connect_from(&lb.http, "127.0.9.1").await);
    }
    // Eight more hosts with a share each fill the rest.
    for h in 2..10 {
        for _ in 0..32 {
            idle.push(Raw::connect_from(&lb.http, &format!("127.0.10.{h}")).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..5 {
        let (s, body) = http_from(
            &lb.http,
            "127.0.0.1",
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(s, Some(200), "{body}");
    }
    // The legacy port too.
    let mut legacy = Vec::new();
    for _ in 0..300 {
        legacy.push(Raw::connect_from(&lb.legacy, "127.0.9.2").await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut r = Raw::connect(&lb.legacy).await;
    let msg = lors_lbone::legacy::encode_request(&lors_lbone::legacy::LegacyRequest::Count);
    r.send(&msg).await;
    let mut reply = Vec::new();
    let got = tokio::time::timeout(Duration::from_secs(10), r.rd.read_to_end(&mut reply)).await;
    assert!(got.is_ok() && !reply.is_empty(), "legacy query unanswered");
}

/// Item 11: 96 concurrent listings of 10,000 depots took 2 GiB of the
/// L-Bone's memory, and it kept 1.9 GiB afterwards.
#[tokio::test]
async fn lbone_concurrent_listings_share_memory() {
    let dir = tempdir();
    let lb = LboneProc::start(dir.path(), &[]);
    // 2,000 depots with long place names: a listing of a few MB.
    register_many(&lb, 2000).await;
    let (s, one) = http_from(
        &lb.http,
        "127.0.0.1",
        "GET /api/v1/depots?all=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(s, Some(200));
    let listing = one.len() as u64;
    assert!(listing > MIB, "{listing} bytes");
    let base = memory_of(lb.pid(), "VmHWM");
    // 96 at once from two networks, every one asking something else (so no
    // answer is shared), read slowly: all at once after a second.
    let mut conns = Vec::new();
    for i in 0..96 {
        let mut r =
            Raw::connect_from(&lb.http, &format!("127.0.{}.{}", 11 + i % 2, i % 8 + 1)).await;
        r.send(
            format!(
                "GET /api/v1/depots?all=1&count={} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                5000 + i
            )
            .as_bytes(),
        )
        .await;
        conns.push(r);
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let readers = conns.into_iter().map(|mut r| {
        tokio::spawn(async move {
            let mut out = Vec::new();
            let got =
                tokio::time::timeout(Duration::from_secs(30), r.rd.read_to_end(&mut out)).await;
            matches!(got, Ok(Ok(_))) && out.starts_with(b"HTTP/1.1 200")
        })
    });
    let mut answered = 0;
    for t in readers.collect::<Vec<_>>() {
        answered += usize::from(t.await.unwrap());
    }
    let peak = memory_of(lb.pid(), "VmHWM");
    assert_eq!(answered, 96, "listings answered");
    // The old server held 96 listings and their JSON trees at once.
    assert!(
        peak < base + 64 * MIB + 8 * listing,
        "peak {} MiB over a base of {} MiB for {listing}-byte listings",
        peak / MIB,
        base / MIB
    );
}

/// Item 12: one mapping claiming 2^63 bytes made `lors download` plan a
/// piece per 2 MiB of the claim (it aborted at 3.2 GB) before reading a byte.
#[test]
fn a_hostile_exnode_is_refused_before_any_plan() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &[]);
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(1 << 20, 5)).unwrap();
    let xnd = dir.path().join("f.xnd");
    // Stored as is (-n): no end-to-end function bounds the mapping.
    let (ok, _, e) = lors(&[
        "upload",
        "--depot",
        &d.addr,
        "-c",
        "1",
        "-n",
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{e}");
    let hostile = dir.path().join("hostile.xnd");
    let mut x = lors::xnd::load(&xnd).unwrap();
    x.mappings.truncate(1);
    x.mappings[0].logical_length = i64::MAX as u64;
    x.mappings[0].alloc_length = i64::MAX as u64;
    lors::xnd::save(&hostile, &x).unwrap();
    for out in ["-", dir.path().join("out").to_str().unwrap()] {
        let args = ["download", "-o", out, hostile.to_str().unwrap()];
        let (ok, e) = lors_within(&args, Duration::from_secs(30))
            .expect("the download of a 2^63-byte claim ended within 30 s");
        assert!(!ok, "a 2^63-byte claim downloaded");
        assert!(e.contains("inconsistent") && e.contains("mapping 0"), "{e}");
    }
    assert!(!dir.path().join("out").exists(), "a file was left");
}
