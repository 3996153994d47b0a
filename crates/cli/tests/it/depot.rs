//! The depot against real clients: every command, persistence, expiry,
//! refcounts, revocation, limits, bad input, concurrency.

use std::time::Duration;

use lors_ibp::caps::{CapKind, Capability};
use lors_ibp::proto::{AllocType, Lease, Reliability, StatusCode};
use lors_ibp::{CapSet, Connection, Error};

use crate::util::{DepotProc, Raw, client_cfg, pattern, tempdir};

async fn alloc(c: &mut Connection, size: u64, secs: u64) -> CapSet {
    c.allocate(
        "0",
        Reliability::Hard,
        AllocType::ByteArray,
        Lease::Secs(secs),
        size,
    )
    .await
    .unwrap()
}

fn code(e: Error) -> i32 {
    e.status()
        .unwrap_or_else(|| panic!("expected a depot status, got {e}"))
        .code()
}

fn tok(c: &Capability) -> String {
    format!("{} {}", c.key_token(), c.typekey)
}

/// The reference depot's PROBE reply for the session below: the lease's
/// seconds left may have ticked down on a loaded machine, the rest is exact.
fn assert_probe_shape(l: &str) {
    let f: Vec<&str> = l.split(' ').collect();
    assert_eq!(f.len(), 9, "{l:?}");
    assert_eq!(&f[..5], ["1", "1", "0", "11", "1024"], "{l:?}");
    let left: u64 = f[5].parse().unwrap();
    assert!((3590..=3600).contains(&left), "{l:?}");
    assert_eq!(&f[6..], ["2", "1", "\n"], "{l:?}");
}

#[tokio::test]
async fn worked_session_reply_shapes_match_the_reference_depot() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &[]);
    let mut r = Raw::connect(&d.addr).await;
    r.send(b"1 1 1 2 1 3600 1024 10\n").await;
    let l = r.line().await;
    assert!(
        l.starts_with("1 ibp://127.0.0.1:") && l.ends_with("/MANAGE \n"),
        "{l:?}"
    );
    let caps: Vec<Capability> = l
        .split_whitespace()
        .skip(1)
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(caps.len(), 3);
    assert_eq!(caps[0].rid.as_deref(), Some("1"));
    assert_eq!(caps[0].key.expose().len(), 32);
    let (rd, wr, mg) = (tok(&caps[0]), tok(&caps[1]), tok(&caps[2]));
    r.send(format!("1 2 {wr} 5 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"hello").await;
    assert_eq!(r.line().await, "1 5 \n");
    r.send(format!("1 13 {wr} 5 6 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b" world").await;
    assert_eq!(r.line().await, "1 6 \n");
    r.send(format!("1 8 {rd} 0 11 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 11 \n");
    assert_eq!(r.bytes(11).await, b"hello world");
    // Connection reuse, and PROBE in the reference depot's shape.
    r.send(format!("1 9 {mg} 40 0 0 0 0 10\n").as_bytes()).await;
    assert_probe_shape(&r.line().await);
    // LoRS 0.82's forms: version 0, trailing space, PROBE with the read key, timeout 0.
    r.send(format!("0 9 {rd} 40 0 0 0 0 0\n").as_bytes()).await;
    assert_probe_shape(&r.line().await);
    r.send(format!("0 8 {rd} 6 5 0.5 \n").as_bytes()).await;
    assert_eq!(r.line().await, "1 5 \n");
    assert_eq!(r.bytes(5).await, b"world");
}

#[tokio::test]
async fn status_inquiry_answers_lors_and_both_protocol_versions() {
    let dir = tempdir();
    let d = DepotProc::start(
        dir.path(),
        &[
            "--size",
            "100M",
            "--max-duration",
            "1h",
            "--password",
            "s3cret",
        ],
    );
    let mut r = Raw::connect(&d.addr).await;
    // LoRS always sends "ibp": accepted whatever the configured password.
    r.send(b"1 4 0 1 ibp 0\n").await;
    let head = r.line().await;
    let n: usize = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = String::from_utf8(r.bytes(n).await).unwrap();
    assert!(
        body.starts_with("VS:1.4:1.0 DT:1  RID:0 RT:1 CT:104857600 "),
        "{body}"
    );
    assert!(body.ends_with(" DR:3600 RE \n"), "{body}");
    r.send(b"1 4 1 1 s3cret 10\n").await;
    assert!(r.line().await.starts_with("1 "));
    let body = r.line().await; // the body is one line ending in " RE \n"
    assert!(
        body.contains("RID:1 ") && body.ends_with(" RE \n"),
        "{body}"
    );
    r.send(b"0 4 1 ibp 0\n").await;
    assert_eq!(r.line().await, "100 0 100 0 3600 \n");
    r.send(b"1 4 0 1 wrong 0\n").await;
    assert_eq!(r.line().await, "-29 \n");
    r.send(b"1 4 9 1 ibp 0\n").await;
    assert_eq!(r.line().await, "-50 \n");
    r.send(b"1 4 3 10\n").await;
    assert_eq!(r.line().await, "1 1 \n");
    // ST_CHANGE is refused, and its second line does not desync the stream.
    r.send(b"1 4 1 2 ibp 10\n1 1 1\n").await;
    assert_eq!(r.line().await, "-25 \n");
    let mut c = d.connect().await;
    let report = c.version().await.unwrap();
    assert!(
        report.contains("LoRS depot") && report.contains("RID: 1"),
        "{report}"
    );
    let st = c.status("1", "ibp").await.unwrap();
    assert_eq!(st.config_total, 100 << 20);
    assert_eq!(c.resources().await.unwrap(), vec!["1"]);
}

#[tokio::test]
async fn allocate_accepts_both_forms_and_enforces_policy() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "1M", "--max-duration", "1h"]);
    let mut r = Raw::connect(&d.addr).await;
    r.send(b"0 1 2 1 60 1000 10\n").await; // v1.3, no RID
    assert!(r.line().await.starts_with("1 ibp://"));
    r.send(b"1 1 1 2 1 -1 1000 10\n").await; // -1 = resource maximum
    let l = r.line().await;
    let m: Capability = l.split_whitespace().nth(3).unwrap().parse().unwrap();
    let mut c = d.connect().await;
    let p = c.probe(&m).await.unwrap();
    assert!((3590..=3600).contains(&p.seconds_left), "{p:?}");
    for (line, want) in [
        ("1 1 1 2 1 7200 1000 10\n", "-28 \n"),  // beyond max duration
        ("1 1 1 2 1 0 1000 10\n", "-30 \n"),     // zero duration
        ("1 1 1 2 1 60 0 10\n", "-30 \n"),       // zero size
        ("1 1 7 2 1 60 1000 10\n", "-50 \n"),    // unknown RID
        ("1 1 1 2 1 60 2000000 10\n", "-45 \n"), // bigger than the resource
        ("1 1 1 2 2 60 1000 10\n", "-22 \n"),    // BUFFER type is not offered
    ] {
        r.send(line.as_bytes()).await;
        assert_eq!(r.line().await, want, "{line}");
    }
    // Fill the resource (each allocation is charged its 4 KiB header
    // besides its size), then one more byte does not fit.
    let mut c2 = d.connect().await;
    c2.allocate(
        "1",
        Reliability::Hard,
        AllocType::ByteArray,
        Lease::Secs(60),
        (1 << 20) - 2000 - 3 * 4096,
    )
    .await
    .unwrap();
    let e = c2
        .allocate(
            "1",
            Reliability::Hard,
            AllocType::ByteArray,
            Lease::Secs(60),
            1,
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), StatusCode::WOULD_EXCEED_LIMIT.code());
}

#[tokio::test]
async fn store_write_load_enforce_limits_and_key_kinds() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &[]);
    let mut c = d.connect().await;
    let caps = alloc(&mut c, 100, 600).await;
    c.store(&caps.write, &pattern(60, 1)).await.unwrap();
    // Beyond max size: refused before any data byte is read.
    let mut c2 = d.connect().await;
    assert_eq!(
        code(c2.store(&caps.write, &pattern(41, 2)).await.unwrap_err()),
        -19
    );
    let mut c2 = d.connect().await;
    assert_eq!(
        code(
            c2.write_at(&caps.write, 90, &pattern(11, 2))
                .await
                .unwrap_err()
        ),
        -19
    );
    // Reading past the written size.
    let mut out = vec![0; 61];
    assert_eq!(
        code(c.load(&caps.read, 0, &mut out).await.unwrap_err()),
        -19
    );
    // Wrong kind of key: read key to write, write key to read, manage to read.
    let mut c = d.connect().await;
    assert_eq!(code(c.store(&caps.read, b"x").await.unwrap_err()), -4);
    let mut c = d.connect().await;
    let mut out = vec![0; 1];
    assert_eq!(
        code(c.load(&caps.write, 0, &mut out).await.unwrap_err()),
        -4
    );
    let mut c = d.connect().await;
    assert_eq!(
        code(c.load(&caps.manage, 0, &mut out).await.unwrap_err()),
        -4
    );
    let mut c = d.connect().await;
    assert_eq!(
        code(c.incr(&caps.read, CapKind::Read).await.unwrap_err()),
        -4
    );
    // A made-up key, and a real key on a resource that does not exist.
    let mut fake = caps.read.clone();
    fake.key = lors_ibp::Key::generate().unwrap();
    let mut c = d.connect().await;
    assert_eq!(code(c.load(&fake, 0, &mut out).await.unwrap_err()), -4);
    let mut bad_rid = caps.read.clone();
    bad_rid.rid = Some("9".into());
    let mut c = d.connect().await;
    assert_eq!(code(c.load(&bad_rid, 0, &mut out).await.unwrap_err()), -50);
    // WRITE over committed bytes and past them (leaving a hole of zeros).
    let mut c = d.connect().await;
    c.write_at(&caps.write, 10, b"OVERWRITE").await.unwrap();
    c.write_at(&caps.write, 80, b"tail").await.unwrap();
    let mut all = vec![0; 84];
    c.load(&caps.read, 0, &mut all).await.unwrap();
    let mut want = pattern(60, 1);
    want[10..19].copy_from_slice(b"OVERWRITE");
    want.resize(80, 0);
    want.extend_from_slice(b"tail");
    assert_eq!(all, want);
    assert_eq!(c.probe(&caps.manage).await.unwrap().size, 84);
}

/// LOAD into a buffer's spare room: the bytes land after what it holds,
/// in the room it has (not grown, not moved), over many reads of a large
/// range; a refused LOAD leaves it as it was.
#[tokio::test]
async fn load_buf_appends_into_the_room_a_buffer_has() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &[]);
    let mut c = d.connect().await;
    let len = 3 << 20;
    let caps = alloc(&mut c, len as u64, 600).await;
    let data = pattern(len, 9);
    c.store(&caps.write, &data).await.unwrap();
    let mut buf = bytes::BytesMut::with_capacity(len + 5);
    buf.extend_from_slice(b"head:");
    let at = buf.as_ptr();
    c.load_buf(&caps.read, 0, len as u64, &mut buf)
        .await
        .unwrap();
    assert_eq!((buf.as_ptr(), buf.capacity()), (at, len + 5));
    assert_eq!(&buf[..5], b"head:");
    assert!(buf[5..] == data[..], "the bytes, in order");
    // Past the end: refused before any data, the buffer untouched.
    let mut c = d.connect().await;
    let e = c.load_buf(&caps.read, 1, len as u64, &mut buf).await;
    assert_eq!(code(e.unwrap_err()), -19);
    assert_eq!(buf.len(), len + 5);
}

#[tokio::test]
async fn malformed_requests_get_errors_and_never_touch_data() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &[]);
    let mut c = d.connect().await;
    let caps = alloc(&mut c, 1000, 600).await;
    c.store(&caps.write, b"precious").await.unwrap();
    let mut r = Raw::connect(&d.addr).await;
    for (line, want) in [
        (&b"garbage\n"[..], "-21 \n"),
        (b"1 16 a b 10\n", "-43 \n"), // RENAME: not served, and sends no data
        (b"3 8 1#k 1 0 1 1\n", "-27 \n"),
        (b"1 8 1#k 1 0\n", "-21 \n"),
        (b"1 8 1#k 1 -1 5 10\n", "-30 \n"),
        (b"1 9 1#k 1 99 1 10\n", "-30 \n"),
        (b"\xff\xfe\n", "-21 \n"),
    ] {
        r.send(line).await;
        assert_eq!(r.line().await, want, "{:?}", String::from_utf8_lossy(line));
    }
    // After all that, the same connection still works.
    r.send(b"1 4 3 10\n").await;
    assert_eq!(r.line().await, "1 1 \n");
    // A command we do not serve whose data phase we cannot size (here
    // LStore's checksummed vector WRITE with its data behind it, and a
    // number nobody defined): one error reply, then the connection closes
    // instead of reading the data as commands.
    for req in [
        &b"1 34 1 65536 1#k 1 1 0 4 10
DATA"[..],
        b"1 77 a b
0 9 1#k 1 40
",
    ] {
        let mut r = Raw::connect(&d.addr).await;
        r.send(req).await;
        assert_eq!(r.line().await, "-43 \n");
        assert!(r.closed().await, "{:?}", String::from_utf8_lossy(req));
    }
    // So does a STORE or WRITE refused before its go-ahead: LStore sends
    // the data without waiting for one.
    for req in [
        &b"1 27 1 65536 1#k 1 0 4 10
DATA"[..],
        b"1 2 1#k 1 x 10
DATA",
        b"1 13 1#k 1 0 4
DATA",
    ] {
        let mut r = Raw::connect(&d.addr).await;
        r.send(req).await;
        assert!(r.line().await.starts_with('-'));
        assert!(r.closed().await, "{:?}", String::from_utf8_lossy(req));
    }
    // An endless line is cut off at the limit and the connection closed.
    let mut r = Raw::connect(&d.addr).await;
    r.send(&vec![b'7'; 10_000]).await;
    assert_eq!(r.line().await, "-21 \n");
    assert!(r.closed().await);
    // A STORE whose data phase is cut short leaves nothing behind.
    let mut r = Raw::connect(&d.addr).await;
    r.send(format!("1 2 {} 100 10\n", tok(&caps.write)).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    r.send(&[b'X'; 50]).await;
    drop(r);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = d.connect().await;
    assert_eq!(c.probe(&caps.manage).await.unwrap().size, 8);
    c.store(&caps.write, b"!").await.unwrap();
    let mut out = vec![0; 9];
    c.load(&caps.read, 0, &mut out).await.unwrap();
    assert_eq!(&out, b"precious!");
    // A WRITE over committed bytes cut short leaves the old bytes intact.
    let mut r = Raw::connect(&d.addr).await;
    r.send(format!("1 13 {} 0 9 10\n", tok(&caps.write)).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"XXXX").await;
    drop(r);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = d.connect().await;
    c.load(&caps.read, 0, &mut out).await.unwrap();
    assert_eq!(&out, b"precious!");
    // A STORE with its data right behind the header (no wait for "1 \n").
    let mut r = Raw::connect(&d.addr).await;
    r.send(format!("1 2 {} 3 10\nabc", tok(&caps.write)).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    assert_eq!(r.line().await, "1 3 \n");
}

#[tokio::test]
async fn send_copies_between_depots_and_to_itself() {
    let (d1dir, d2dir) = (tempdir(), tempdir());
    let d1 = DepotProc::start(d1dir.path(), &[]);
    let d2 = DepotProc::start(d2dir.path(), &[]);
    let mut c1 = d1.connect().await;
    let mut c2 = d2.connect().await;
    let src = alloc(&mut c1, 4 << 20, 600).await;
    let data = pattern(3 << 20, 7);
    c1.store(&src.write, &data).await.unwrap();
    let dst = alloc(&mut c2, 4 << 20, 600).await;
    // Third-party copy: the bytes go depot to depot, not through us.
    assert_eq!(
        c1.send(&src.read, &dst.write, 1000, 2 << 20).await.unwrap(),
        2 << 20
    );
    let mut out = vec![0; 2 << 20];
    c2.load(&dst.read, 0, &mut out).await.unwrap();
    assert!(out == data[1000..1000 + (2 << 20)]);
    // To an allocation on the same depot, and to the source itself.
    let local = alloc(&mut c1, 1 << 20, 600).await;
    c1.send(&src.read, &local.write, 5, 100).await.unwrap();
    let mut out = vec![0; 100];
    c1.load(&local.read, 0, &mut out).await.unwrap();
    assert_eq!(out, data[5..105]);
    let own = alloc(&mut c1, 100, 600).await;
    c1.store(&own.write, b"abc").await.unwrap();
    c1.send(&own.read, &own.write, 0, 3).await.unwrap();
    let mut out = vec![0; 6];
    c1.load(&own.read, 0, &mut out).await.unwrap();
    assert_eq!(&out, b"abcabc");
    // Errors from the target depot reach the client.
    let tiny = alloc(&mut c2, 10, 600).await;
    let mut c1 = d1.connect().await;
    assert_eq!(
        code(c1.send(&src.read, &tiny.write, 0, 11).await.unwrap_err()),
        -19
    );
    let mut c1 = d1.connect().await;
    assert_eq!(
        code(c1.send(&src.read, &dst.read, 0, 1).await.unwrap_err()),
        -11
    );
    // Beyond the source's data.
    let mut c1 = d1.connect().await;
    assert_eq!(
        code(
            c1.send(&src.read, &dst.write, 3 << 20, 1)
                .await
                .unwrap_err()
        ),
        -19
    );
    // A target depot that is gone.
    let mut gone = dst.write.clone();
    gone.port = 1;
    let mut c1 = d1.connect().await;
    assert_eq!(
        code(c1.send(&src.read, &gone, 0, 1).await.unwrap_err()),
        StatusCode::CONNECTION.code()
    );
}

#[tokio::test]
async fn manage_refcounts_change_and_truncate() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--max-duration", "2h"]);
    let mut c = d.connect().await;
    let caps = alloc(&mut c, 1000, 600).await;
    c.store(&caps.write, &pattern(500, 3)).await.unwrap();
    let p = c.probe(&caps.manage).await.unwrap();
    assert_eq!(
        (p.read_refs, p.write_refs, p.size, p.max_size),
        (1, 0, 500, 1000)
    );
    c.incr(&caps.manage, CapKind::Read).await.unwrap();
    c.incr(&caps.manage, CapKind::Write).await.unwrap();
    assert_eq!(c.probe(&caps.read).await.unwrap().read_refs, 2);
    // CHNG: grow, extend the lease, make it soft.
    c.change(&caps.manage, 2000, Some(3600), Some(Reliability::Soft))
        .await
        .unwrap();
    let p = c.probe(&caps.write).await.unwrap();
    assert_eq!((p.max_size, p.reliability), (2000, 1));
    assert!(p.seconds_left > 3500);
    let mut c2 = d.connect().await;
    assert_eq!(
        code(c2.change(&caps.manage, 100, None, None).await.unwrap_err()),
        -20
    );
    let mut c2 = d.connect().await;
    assert_eq!(
        code(
            c2.change(&caps.manage, 0, Some(3 * 3600), None)
                .await
                .unwrap_err()
        ),
        -45
    );
    let mut c2 = d.connect().await;
    assert_eq!(
        code(c2.change(&caps.read, 0, Some(60), None).await.unwrap_err()),
        -4
    );
    let mut c2 = d.connect().await;
    let reply = c2
        .raw(&format!("1 9 {} 41 3 10\n", tok(&caps.manage)))
        .await
        .unwrap();
    assert_eq!(reply, "-11", "INCR of a manage count is a cap-type error");
    // TRUNCATE cuts data.
    c.truncate(&caps.manage, 300).await.unwrap();
    let p = c.probe(&caps.manage).await.unwrap();
    assert_eq!((p.size, p.max_size), (300, 300));
    let mut out = vec![0; 300];
    c.load(&caps.read, 0, &mut out).await.unwrap();
    assert_eq!(out, pattern(500, 3)[..300]);
    // Deleted when both counts reach zero, not before.
    for _ in 0..2 {
        c.decr(&caps.manage, CapKind::Read).await.unwrap();
    }
    assert_eq!(c.probe(&caps.manage).await.unwrap().read_refs, 0);
    c.decr(&caps.manage, CapKind::Write).await.unwrap();
    let mut c = d.connect().await;
    assert_eq!(code(c.probe(&caps.manage).await.unwrap_err()), -4);
    let mut c = d.connect().await;
    assert_eq!(code(c.load(&caps.read, 0, &mut out).await.unwrap_err()), -4);
}

#[tokio::test]
async fn strict_mode_refuses_chng_as_the_reference_depot_does() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--strict"]);
    let mut c = d.connect().await;
    let caps = alloc(&mut c, 1000, 600).await;
    c.store(&caps.write, b"abc").await.unwrap();
    let mg = tok(&caps.manage);
    let mut r = Raw::connect(&d.addr).await;
    for (size, want) in [
        ("0", "-20 \n"),   // "keep" on our lenient depot; a size of 0 here
        ("999", "-20 \n"), // below the current max size
        ("1000", "1 \n"),
        ("2000", "1 \n"),
    ] {
        r.send(format!("1 9 {mg} 43 3 {size} 3600 -1 10\n").as_bytes())
            .await;
        assert_eq!(r.line().await, want, "CHNG to {size}");
    }
    let p = c.probe(&caps.manage).await.unwrap();
    assert_eq!((p.max_size, p.size), (2000, 3));
    assert!((3590..=3600).contains(&p.seconds_left));
}

#[tokio::test]
async fn allocations_expire_and_their_space_returns() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "1M"]);
    let mut c = d.connect().await;
    let short = c
        .allocate(
            "1",
            Reliability::Hard,
            AllocType::ByteArray,
            Lease::Secs(1),
            900_000,
        )
        .await
        .unwrap();
    c.store(&short.write, b"ephemeral").await.unwrap();
    let long = alloc(&mut c, 1000, 600).await;
    // No room for another 900 kB while the short one lives.
    let e = c
        .allocate(
            "1",
            Reliability::Hard,
            AllocType::ByteArray,
            Lease::Secs(60),
            900_000,
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), -19);
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let mut c = d.connect().await;
    let mut out = vec![0; 9];
    assert_eq!(
        code(c.load(&short.read, 0, &mut out).await.unwrap_err()),
        -4
    );
    let mut c = d.connect().await;
    c.allocate(
        "1",
        Reliability::Hard,
        AllocType::ByteArray,
        Lease::Secs(60),
        900_000,
    )
    .await
    .unwrap();
    c.probe(&long.manage).await.unwrap();
    // The reaper removed the data file too.
    let files = walk_files(&dir.path().join("data"));
    assert!(files.iter().all(|f| !f.ends_with(&format!(
        "{:016x}",
        short.read.typekey.parse::<u64>().unwrap()
    ))));
}

fn walk_files(p: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                out.extend(walk_files(&e.path()));
            } else {
                out.push(e.path().display().to_string());
            }
        }
    }
    out
}

#[tokio::test]
async fn soft_allocations_are_revoked_to_make_room_for_hard_ones() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--size", "1M"]);
    let mut c = d.connect().await;
    let soft = c
        .allocate(
            "1",
            Reliability::Soft,
            AllocType::ByteArray,
            Lease::Secs(600),
            600_000,
        )
        .await
        .unwrap();
    c.store(&soft.write, b"volatile").await.unwrap();
    // Soft cannot push out soft.
    let e = c
        .allocate(
            "1",
            Reliability::Soft,
            AllocType::ByteArray,
            Lease::Secs(600),
            600_000,
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), -19);
    let mut c = d.connect().await;
    let hard = c
        .allocate(
            "1",
            Reliability::Hard,
            AllocType::ByteArray,
            Lease::Secs(600),
            600_000,
        )
        .await
        .unwrap();
    c.store(&hard.write, b"stable").await.unwrap();
    assert_eq!(code(c.probe(&soft.manage).await.unwrap_err()), -4);
    let mut c = d.connect().await;
    assert_eq!(c.probe(&hard.manage).await.unwrap().size, 6);
}

#[tokio::test]
async fn acknowledged_data_and_metadata_survive_kill_9() {
    let dir = tempdir();
    let mut d = DepotProc::start(dir.path(), &[]);
    let port = d.port.to_string();
    let mut c = d.connect().await;
    let a = alloc(&mut c, 8 << 20, 600).await;
    let data = pattern(5 << 20, 9);
    c.store(&a.write, &data).await.unwrap();
    c.incr(&a.manage, CapKind::Read).await.unwrap();
    c.change(&a.manage, 0, Some(500), None).await.unwrap();
    let fifo = c
        .allocate(
            "1",
            Reliability::Hard,
            AllocType::Fifo,
            Lease::Secs(600),
            100,
        )
        .await
        .unwrap();
    c.store(&fifo.write, b"queued").await.unwrap();
    let gone = alloc(&mut c, 10, 600).await;
    c.decr(&gone.manage, CapKind::Read).await.unwrap();
    // An unacknowledged store in flight when the depot dies.
    let mut r = Raw::connect(&d.addr).await;
    r.send(format!("1 2 {} 1000 10\n", tok(&a.write)).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    r.send(&[b'Z'; 500]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    d.kill9();
    drop(c);
    let d = DepotProc::start(dir.path(), &["--listen", &format!("127.0.0.1:{port}")]);
    let mut c = d.connect().await;
    let p = c.probe(&a.manage).await.unwrap();
    assert_eq!(
        (p.size, p.read_refs),
        (5 << 20, 2),
        "only the acknowledged bytes"
    );
    assert!((490..=500).contains(&p.seconds_left));
    let mut out = vec![0; 5 << 20];
    c.load(&a.read, 0, &mut out).await.unwrap();
    assert!(out == data, "data differs after restart");
    let mut q = vec![0; 6];
    c.load(&fifo.read, 0, &mut q).await.unwrap();
    assert_eq!(&q, b"queued");
    assert_eq!(code(c.probe(&gone.manage).await.unwrap_err()), -4);
}

#[tokio::test]
async fn fifo_and_circular_queues_follow_their_documented_semantics() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &[]);
    let mut c = d.connect().await;
    let q = c
        .allocate(
            "1",
            Reliability::Hard,
            AllocType::Fifo,
            Lease::Secs(600),
            10,
        )
        .await
        .unwrap();
    c.store(&q.write, b"abcdef").await.unwrap();
    let mut c2 = d.connect().await;
    assert_eq!(
        code(c2.store(&q.write, b"ghijk").await.unwrap_err()),
        -19,
        "FIFO full"
    );
    let mut out = vec![0; 4];
    c.load(&q.read, 0, &mut out).await.unwrap();
    assert_eq!(&out, b"abcd");
    c.store(&q.write, b"ghijklmn").await.unwrap(); // wraps around the ring
    let mut out = vec![0; 10];
    c.load(&q.read, 0, &mut out).await.unwrap();
    assert_eq!(&out, b"efghijklmn");
    let mut out = vec![0; 1];
    assert_eq!(
        code(c.load(&q.read, 0, &mut out).await.unwrap_err()),
        -19,
        "FIFO empty"
    );
    let mut c = d.connect().await;
    let r = c
        .allocate(
            "1",
            Reliability::Hard,
            AllocType::Circular,
            Lease::Secs(600),
            8,
        )
        .await
        .unwrap();
    c.store(&r.write, b"12345").await.unwrap();
    c.store(&r.write, b"6789AB").await.unwrap(); // drops the oldest 3 bytes
    assert_eq!(c.probe(&r.manage).await.unwrap().size, 8);
    let mut out = vec![0; 8];
    c.load(&r.read, 0, &mut out).await.unwrap();
    assert_eq!(&out, b"456789AB");
    let mut c2 = d.connect().await;
    assert_eq!(
        code(c2.write_at(&r.write, 0, b"x").await.unwrap_err()),
        -25,
        "no WRITE on queues"
    );
}

#[tokio::test]
async fn serves_256_concurrent_clients() {
    let dir = tempdir();
    // All from 127.0.0.1 (and one more to check), so above the per-client
    // default (64).
    let d = DepotProc::start(
        dir.path(),
        &["--sync", "never", "--max-connections-per-client", "300"],
    );
    let addr = d.addr.clone();
    let mut tasks = Vec::new();
    for i in 0..256u32 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Connection::connect(&addr, &client_cfg()).await.unwrap();
            let caps = c
                .allocate(
                    "0",
                    Reliability::Hard,
                    AllocType::ByteArray,
                    Lease::Secs(600),
                    65536,
                )
                .await
                .unwrap();
            let data = pattern(65536, i as u8);
            c.store(&caps.write, &data).await.unwrap();
            let mut out = vec![0; 65536];
            c.load(&caps.read, 0, &mut out).await.unwrap();
            assert!(out == data);
            // Hold the connection open until everyone got here.
            c
        }));
    }
    let mut conns = Vec::new();
    for t in tasks {
        conns.push(t.await.unwrap());
    }
    assert_eq!(conns.len(), 256);
    let mut c = d.connect().await;
    assert!(c.version().await.unwrap().contains("Allocations: 256"));
}

#[tokio::test]
async fn busy_depot_answers_out_of_sockets() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &["--max-connections", "2"]);
    // Two connections in data phases (an idle one would make room).
    let mut setup = d.connect().await;
    let caps = setup
        .allocate(
            "1",
            Reliability::Hard,
            AllocType::ByteArray,
            Lease::Secs(60),
            100,
        )
        .await
        .unwrap();
    drop(setup);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut r = Raw::connect(&d.addr).await;
        let key = format!("{} {}", caps.write.key_token(), caps.write.typekey);
        r.send(format!("1 13 {key} 0 10 30\n").as_bytes()).await;
        busy.push(r);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut r = Raw::connect(&d.addr).await;
    assert_eq!(r.line().await, "-66 1.0\n");
}

#[tokio::test]
async fn sample_config_starts_a_depot_with_metrics() {
    let dir = tempdir();
    let sample = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/depot.toml"
    ))
    .unwrap();
    let cfg = sample.replace("/tmp/lors-depot", &dir.path().display().to_string());
    let path = dir.path().join("depot.toml");
    std::fs::write(&path, cfg).unwrap();
    let d = DepotProc::start(
        dir.path(),
        &[
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let mut c = d.connect().await;
    assert_eq!(c.resources().await.unwrap(), vec!["1", "2"]);
    let caps = c
        .allocate(
            "2",
            Reliability::Hard,
            AllocType::ByteArray,
            Lease::Secs(3600),
            100,
        )
        .await
        .unwrap();
    c.store(&caps.write, b"metrics").await.unwrap();
    let e = c
        .allocate(
            "2",
            Reliability::Hard,
            AllocType::Fifo,
            Lease::Secs(3600),
            100,
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), -22, "resource 2 offers byte arrays only");
    let mut c = d.connect().await;
    let e = c
        .allocate(
            "2",
            Reliability::Hard,
            AllocType::ByteArray,
            Lease::Secs(2 * 86400),
            100,
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), -28);
    let body = http_get(d.metrics.as_deref().unwrap(), "/metrics").await;
    assert!(body.contains("lors_depot_bytes_in_total 7"), "{body}");
    for status in ["ok", "IBP_E_TYPE_NOT_SUPPORTED", "IBP_E_LONG_DURATION"] {
        let line =
            format!("lors_depot_requests_total{{command=\"ALLOCATE\",status=\"{status}\"}} 1");
        assert!(body.contains(&line), "{line} in {body}");
    }
    assert!(
        body.contains("lors_depot_allocations{rid=\"2\"} 1"),
        "{body}"
    );
}

async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn concurrent_overlapping_writes_to_different_allocations_stay_separate() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &[]);
    let mut tasks = Vec::new();
    for i in 0..16u8 {
        let addr = d.addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Connection::connect(&addr, &client_cfg()).await.unwrap();
            let caps = alloc(&mut c, 4 << 20, 600).await;
            c.store(&caps.write, &pattern(3 << 20, i)).await.unwrap();
            // Overlapping WRITEs go through staging files: they must not mix.
            let patch = pattern(2 << 20, i.wrapping_add(100));
            c.write_at(&caps.write, 1 << 20, &patch).await.unwrap();
            let mut out = vec![0; 3 << 20];
            c.load(&caps.read, 0, &mut out).await.unwrap();
            let mut want = pattern(3 << 20, i);
            want[1 << 20..].copy_from_slice(&patch);
            assert!(out == want, "allocation {i} mixed with another's bytes");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A command prefix that runs `setup` in a shell, then execs the depot.
fn shell_first(setup: &str) -> Vec<String> {
    let script = format!("{setup} && exec \"$0\" \"$@\"");
    vec!["sh".into(), "-c".into(), script]
}

/// The depot's soft and hard limits on open files, and how many of the
/// descriptors the soft limit allows it has open.
fn descriptors(d: &DepotProc) -> (u64, u64, usize) {
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // The limit bounds descriptor numbers, so count those below it (a
    // descriptor inherited from the test harness may sit above).
    let open = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .filter(|&fd| fd < n[0])
        .count();
    (n[0], n[1], open)
}

#[tokio::test]
async fn a_low_soft_open_file_limit_is_raised_at_start() {
    // As a depot started from a shell with `ulimit -Sn 256`.
    let dir = tempdir();
    let d = DepotProc::start_in(
        &shell_first("ulimit -Sn 256"),
        dir.path(),
        &["--sync", "never"],
    );
    let (soft, hard, _) = descriptors(&d);
    assert!(hard > 256, "the hard limit is above 256 here: {hard}");
    assert_eq!(soft, hard, "soft limit raised to the hard one");
}

#[tokio::test]
async fn thousands_of_allocations_need_few_descriptors_and_survive_a_restart() {
    // A descriptor per written allocation failed at ~230 under `ulimit -n
    // 256`, and a restart that reopened them all wedged the depot.
    const N: usize = 2_000;
    let dir = tempdir();
    let limit = shell_first("ulimit -n 128");
    let mut d = DepotProc::start_in(&limit, dir.path(), &["--sync", "never"]);
    let mut c = d.connect().await;
    let mut caps = Vec::new();
    for i in 0..N {
        let cs = alloc(&mut c, 16, 3600).await;
        c.store(&cs.write, format!("allocation {i:05}").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("allocation {i}: {e}"));
        caps.push(cs);
    }
    let (_, hard, open) = descriptors(&d);
    assert_eq!(hard, 128);
    assert!(open < 64, "{open} descriptors open for {N} allocations");
    drop(c);
    d.terminate();
    let d = DepotProc::start_in(&limit, dir.path(), &["--sync", "never"]);
    let mut c = d.connect().await;
    for (i, cs) in caps.iter().enumerate() {
        let mut buf = [0u8; 16];
        c.load(&cs.read, 0, &mut buf)
            .await
            .unwrap_or_else(|e| panic!("allocation {i} after the restart: {e}"));
        assert_eq!(buf, *format!("allocation {i:05}").as_bytes());
    }
    let more = alloc(&mut c, 16, 3600).await;
    c.store(&more.write, b"0123456789abcdef").await.unwrap();
    assert!(descriptors(&d).2 < 64);
}

#[tokio::test]
async fn running_out_of_descriptors_is_reported_as_such_and_the_depot_keeps_serving() {
    // Hard limit 64, nothing to raise, and idle connections take every
    // descriptor: a STORE that needs a new data file is then refused as a
    // resource shortage (-23), not a failing disk (-16).
    let dir = tempdir();
    let d = DepotProc::start_in(
        &shell_first("ulimit -n 64"),
        dir.path(),
        &["--sync", "never"],
    );
    let mut c = d.connect().await;
    let kept = alloc(&mut c, 16, 3600).await;
    c.store(&kept.write, b"0123456789abcdef").await.unwrap();
    let fresh = alloc(&mut c, 16, 3600).await;
    let mut idle = Vec::new();
    while descriptors(&d).2 < 64 && idle.len() < 200 {
        idle.push(tokio::net::TcpStream::connect(&d.addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let e = c
        .store(&fresh.write, b"0123456789abcdef")
        .await
        .unwrap_err();
    assert_eq!(code(e), StatusCode::RSRC_UNAVAIL.code());
    // Still serving once descriptors are free again: what was stored reads
    // back, the refused STORE succeeds, and an allocation can be freed.
    drop(idle);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = d.connect().await;
    let mut buf = [0u8; 16];
    c.load(&kept.read, 0, &mut buf).await.unwrap();
    assert_eq!(&buf, b"0123456789abcdef");
    c.store(&fresh.write, b"0123456789abcdef").await.unwrap();
    c.decr(&kept.manage, CapKind::Read).await.unwrap();
    assert!(c.status("1", "ibp").await.is_ok());
}

/// LStore's network checksums (commands 24, 27, 28) from a plain socket:
/// a digest after every block, in both directions; a wrong digest is
/// answered -63 and changes nothing; bad checksum fields are answered as
/// the reference depot answers them. Digests are literal known answers.
#[tokio::test]
async fn network_checksummed_store_write_and_load_frame_every_block() {
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &[]);
    let mut c = d.connect().await;
    let caps = alloc(&mut c, 1024, 3600).await;
    let (rd, wr) = (tok(&caps.read), tok(&caps.write));
    let mut r = Raw::connect(&d.addr).await;

    // STORE_CHKSUM, MD5 in 4-byte blocks: "hell" + md5 "o wo" + md5 "rld" + md5.
    r.send(format!("1 28 4 4 {wr} 11 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"hell4229d691b07b13341da53f17ab9f2416o woe7c52a655c23270552b9bf9ea01b1483rlde90c8e1edb39b713d0675837a44d40d7").await;
    assert_eq!(r.line().await, "1 11 \n");

    // LOAD_CHKSUM, SHA256 in 6-byte blocks.
    r.send(format!("1 24 1 6 {rd} 0 11 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 11 \n");
    let want = [
        &b"hello "[..],
        b"5e3235a8346e5a4585f8c58562f5052b8fe26a3bb122e1e96c76784964dfc461",
        b"world",
        b"486ea46224d1bb4fb680f34f7c9ad96a8f24ec88be73ea8e5a6c65260e9cb8a7",
    ]
    .concat();
    assert_eq!(r.bytes(want.len()).await, want);

    // WRITE_CHKSUM over committed bytes whose second digest is wrong: -63,
    // the connection closes, and the old bytes are intact.
    r.send(format!("1 27 4 4 {wr} 0 8 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"HELL5fa58915fea0b7f3e0f1e8ec558a9123O WO").await;
    r.send(&[b'0'; 32]).await;
    assert_eq!(r.line().await, "-63 \n");
    assert!(r.closed().await);
    let mut got = [0u8; 11];
    c.load(&caps.read, 0, &mut got).await.unwrap();
    assert_eq!(&got, b"hello world");

    // The same write with the right digests lands.
    let mut r = Raw::connect(&d.addr).await;
    r.send(format!("1 27 4 4 {wr} 0 8 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"HELL5fa58915fea0b7f3e0f1e8ec558a9123O WO8218fb0c520e0168ef923b2604b41ff1")
        .await;
    assert_eq!(r.line().await, "1 8 \n");
    c.load(&caps.read, 0, &mut got).await.unwrap();
    assert_eq!(&got, b"HELLO WOrld");

    // Bad checksum fields: the reference depot's codes, then a close (the
    // client's data would otherwise read as commands).
    for (line, code) in [
        (format!("1 27 0 4 {wr} 0 4 10\n"), "-64 \n"),
        (format!("1 28 9 4 {wr} 4 10\n"), "-64 \n"),
        (format!("1 28 4 0 {wr} 4 10\n"), "-65 \n"),
    ] {
        let mut r = Raw::connect(&d.addr).await;
        r.send(line.as_bytes()).await;
        assert_eq!(r.line().await, code, "{line}");
        assert!(r.closed().await, "{line}");
    }

    // A FIFO: checksummed STORE, then a checksummed LOAD consumes it (SHA1,
    // 3-byte blocks).
    let q = c
        .allocate(
            "0",
            Reliability::Hard,
            AllocType::Fifo,
            Lease::Secs(3600),
            64,
        )
        .await
        .unwrap();
    let mut r = Raw::connect(&d.addr).await;
    r.send(format!("1 28 3 3 {} 5 10\n", tok(&q.write)).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    r.send(
        b"abca9993e364706816aba3e25717850c26c9cd0d89dde600ccd1b71569232d01d110bc63e906beab04d8c",
    )
    .await;
    assert_eq!(r.line().await, "1 5 \n");
    r.send(format!("1 24 3 3 {} 0 5 10\n", tok(&q.read)).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 5 \n");
    assert_eq!(
        r.bytes(5 + 80).await,
        b"abca9993e364706816aba3e25717850c26c9cd0d89dde600ccd1b71569232d01d110bc63e906beab04d8c"
    );
    // Consumed: the same connection's next command sees it gone.
    r.send(format!("1 9 {} 40 0 0 0 0 10\n", tok(&q.manage)).as_bytes())
        .await;
    let probe = r.line().await;
    assert_eq!(probe.split_whitespace().nth(3), Some("0"), "{probe}");
}

/// A checksummed STORE longer than one receive round (8 MiB), with blocks
/// that do not divide it: rounds end mid-block and the next block still fits.
#[tokio::test]
async fn a_long_checksummed_store_with_odd_blocks_lands_whole() {
    use lors_ibp::proto::chksum::{ChksumType, NetChksum, frame};
    let dir = tempdir();
    let d = DepotProc::start(dir.path(), &[]);
    let mut c = d.connect().await;
    let len = 9 << 20;
    let caps = alloc(&mut c, len as u64, 3600).await;
    let data = pattern(len, 7);
    let ncs = NetChksum {
        kind: ChksumType::Md5,
        block_size: 100,
    };
    let mut r = Raw::connect(&d.addr).await;
    r.send(format!("1 28 4 100 {} {len} 30\n", tok(&caps.write)).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    r.send(&frame(&ncs, &data)).await;
    assert_eq!(r.line().await, format!("1 {len} \n"));
    let mut got = vec![0u8; len];
    c.load(&caps.read, 0, &mut got).await.unwrap();
    assert!(got == data);
}

#[test]
fn a_depot_of_four_disks_spreads_an_upload_over_them_and_status_shows_each() {
    let dir = tempdir();
    let mut toml = String::from("listen = \"127.0.0.1:0\"\nsync = \"never\"\n");
    for i in 1..=4 {
        toml.push_str(&format!(
            "[[resource]]\nrid = \"{i}\"\npath = \"{}\"\nsize = \"1GiB\"\n",
            dir.path().join(format!("disk{i}")).display()
        ));
    }
    let cfg = dir.path().join("depot.toml");
    std::fs::write(&cfg, toml).unwrap();
    let d = DepotProc::start(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let src = dir.path().join("run.dat");
    std::fs::write(&src, pattern(24 << 20, 5)).unwrap();
    let xnd = dir.path().join("run.xnd");
    let (ok, _, err) = crate::util::lors(&[
        "upload",
        "-q",
        "--depot",
        &d.addr,
        "-c",
        "1",
        "-b",
        "1M",
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");

    let (ok, out, err) = crate::util::lors(&["depot", "--status", &d.addr]);
    assert!(ok, "{err}");
    let out = String::from_utf8(out).unwrap();
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{out}");
    // 24 blocks of 1 MiB (and their checksums) over four disks: six each,
    // give or take the two allocations the depot lets an idle disk run
    // ahead of the emptiest.
    for row in rows {
        // RID, size and its unit, used and its unit, …
        let f: Vec<&str> = row.split_whitespace().collect();
        let (used, unit): (f64, &str) = (f[3].parse().unwrap(), f[4]);
        assert_eq!(unit, "MiB", "{out}");
        assert!((4.0..=8.2).contains(&used), "{row}\n{out}");
    }
    let (ok, _, err) = crate::util::lors(&[
        "download",
        "-q",
        "-o",
        dir.path().join("back").to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read(dir.path().join("back")).unwrap(),
        std::fs::read(&src).unwrap()
    );
}
