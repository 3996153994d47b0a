//! The keeper survives its directory and its peers: one bad entry, one
//! hostile exNode or one trickling depot never stops the cycle or costs
//! another file its lease; two keepers never strand what either made; the
//! scrub goes round for ever; exit codes follow the words.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::tools::used;
use crate::util::{DepotProc, client_cfg, list, lors, lors_cmd, pattern, tempdir, upload};

/// A proxy in front of `upstream` that passes the first 200 bytes of
/// everything the depot sends at once (reply lines: PROBE, MANAGE) and the
/// rest at a byte a second (a LOAD's data): a depot that answers and never
/// delivers. Its address.
fn trickle(upstream: &str) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let upstream = upstream.to_owned();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let Ok(u) = TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut c2, mut u2) = (c.try_clone().unwrap(), u.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut u2);
                let _ = u2.shutdown(std::net::Shutdown::Write);
            });
            let (mut c, mut u) = (c, u);
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = u.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    let fast = n.min(200);
                    if c.write_all(&buf[..fast]).is_err() {
                        return;
                    }
                    for b in &buf[fast..n] {
                        std::thread::sleep(Duration::from_secs(1));
                        if c.write_all(&[*b]).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// The exNode at `from` with every capability pointed at `addr` instead
/// of `depot`, saved at `to`.
fn redirect(from: &Path, depot: &str, addr: &str, to: &Path) {
    let text = std::fs::read_to_string(from).unwrap();
    std::fs::write(to, text.replace(depot, addr)).unwrap();
}

/// Seconds the allocations of the exNode at `xnd` have left (the least).
fn seconds_left(xnd: &Path) -> Option<i64> {
    let x = lors::xnd::load(xnd).ok()?;
    let probes = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let pool = lors::Pool::new(client_cfg());
        lors::manage::probe_all(&x, &pool).await
    });
    probes
        .iter()
        .map(|p| match p {
            lors::manage::Probe::Live(i) => Some(i.seconds_left),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .min()
}

/// An erasure-coded exNode whose parity block claims 2^44 bytes, built on
/// the mappings of `x` (two 64 KiB blocks).
fn huge_parity(x: &lors_exnode::ExNode) -> lors_exnode::ExNode {
    use lors_exnode::erasure::{Erasure, Scheme};
    let e = Erasure {
        scheme: Scheme::parse("2+1").unwrap(),
        block_size: 65536,
        size: 131072,
    };
    let mut y = x.clone();
    for m in e.metadata() {
        y.set_meta(m);
    }
    let mut p = x.mappings[0].clone();
    p.alloc_length = 1 << 44;
    p.metadata.extend(Erasure::block_meta(0, 2));
    y.parity = vec![p];
    y
}

/// Acceptance: a keeper over a directory that holds a FIFO, a link to
/// `/dev/zero`, an erasure-coded exNode claiming a 2^44-byte parity block,
/// 100,001 entries and an exNode on a depot that trickles keeps a 40 s
/// lease beside them alive for 120 s, and is still running.
#[test]
fn one_bad_entry_or_depot_never_costs_another_file_its_lease() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let kept = dir.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    let control = upload(
        &[&ds[0]],
        dir.path(),
        "control",
        &pattern(64 << 10, 1),
        &["-c", "1", "-d", "40s"],
    );
    std::fs::rename(&control, kept.join("a-control.xnd")).unwrap();
    let control = kept.join("a-control.xnd");
    let two = upload(
        &[&ds[0]],
        dir.path(),
        "two",
        &pattern(128 << 10, 2),
        &["-c", "1", "-b", "64K"],
    );
    // The trickling depot's exNode: read through the proxy.
    redirect(
        &two,
        &ds[0].addr,
        &trickle(&ds[0].addr),
        &kept.join("t-trickle.xnd"),
    );
    let crafted = huge_parity(&lors::xnd::load(&two).unwrap());
    lors::xnd::save(&kept.join("ec-huge.xnd"), &crafted).unwrap();
    let fifo = kept.join("0.xnd");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    std::os::unix::fs::symlink("/dev/zero", kept.join("b-zero.xnd")).unwrap();
    // Last in name order: the walk stops at the cap inside it.
    let many = kept.join("z-many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..100_001 {
        std::fs::File::create(many.join(format!("{i:06}.xnd"))).unwrap();
    }
    let t0 = Instant::now();
    let mut keeper = lors_cmd(&[
        "keep",
        "--grace",
        "0",
        "-q",
        "--every",
        "10s",
        "--lease",
        "60s",
        "--margin",
        "35s",
        "--scrub-rate",
        "64M",
        "--file-deadline",
        "8s",
        "-T",
        "2s",
        kept.to_str().unwrap(),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut err = keeper.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    while t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_secs(5));
        assert!(
            keeper.try_wait().unwrap().is_none(),
            "the keeper exited after {:?}",
            t0.elapsed()
        );
    }
    let left = seconds_left(&control);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &keeper.id().to_string()])
        .status();
    let _ = keeper.wait();
    let said = said.join().unwrap();
    assert!(
        left.is_some_and(|s| s > 0),
        "the control's lease ran out: {left:?}\n{}",
        said.lines().take(40).collect::<Vec<_>>().join("\n")
    );
    for bad in [
        "0.xnd: skipped",
        "b-zero.xnd: skipped",
        "ec-huge.xnd: not kept",
    ] {
        assert!(
            said.contains(bad),
            "{bad}:\n{}",
            &said[..said.len().min(4000)]
        );
    }
    assert!(
        said.contains("the first 100000 in name order are kept"),
        "{}",
        &said[..said.len().min(4000)]
    );
    assert!(
        !said.contains("memory allocation"),
        "{}",
        &said[..said.len().min(4000)]
    );
}

/// The commands that read a directory or an exNode refuse a FIFO or a
/// device at once instead of waiting on it, and a 2^44-byte claim is an
/// error, not an abort.
#[test]
fn fifos_devices_and_huge_claims_are_refused_at_once() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let two = upload(
        &[&ds[0]],
        dir.path(),
        "two",
        &pattern(128 << 10, 2),
        &["-c", "1", "-b", "64K"],
    );
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let fifo = sub.join("0.xnd");
    std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    std::fs::copy(&two, sub.join("1.xnd")).unwrap();
    let ec = dir.path().join("ec.xnd");
    lors::xnd::save(&ec, &huge_parity(&lors::xnd::load(&two).unwrap())).unwrap();
    let out = dir.path().join("out");
    let limit = Duration::from_secs(20);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["stat", sub.to_str().unwrap()], "skipped"),
        (vec!["verify", fifo.to_str().unwrap()], "not a regular file"),
        (vec!["ls", "/dev/zero"], "not a regular file"),
        (
            vec!["download", "-o", "-", fifo.to_str().unwrap()],
            "not a regular file",
        ),
        (
            vec![
                "augment",
                "--repair",
                "--depot",
                &ds[0].addr,
                ec.to_str().unwrap(),
            ],
            "2^44",
        ),
        (
            vec!["keep", "--grace", "0", "--once", ec.to_str().unwrap()],
            "2^44",
        ),
        (vec!["download", "-o", "-", ec.to_str().unwrap()], "2^44"),
        (
            vec![
                "download",
                "-o",
                out.to_str().unwrap(),
                ec.to_str().unwrap(),
            ],
            "2^44",
        ),
    ];
    for (args, want) in cases {
        let want = want.replace("2^44", &(1u64 << 44).to_string());
        let (ok, err) = crate::util::lors_within(&args, limit)
            .unwrap_or_else(|| panic!("{args:?} still running after {limit:?}"));
        assert!(err.contains(&want), "{args:?}: wanted {want:?} in {err}");
        if args[0] != "stat" {
            assert!(!ok, "{args:?} succeeded");
        }
        assert!(!err.contains("memory allocation"), "{args:?}: {err}");
    }
}

/// With one exNode, the scrub goes round and round; a corrupt state (a
/// place past any file's end) starts it over; the state is written over a
/// link, never through it.
#[test]
fn the_scrub_wraps_and_its_state_is_never_written_through_a_link() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let xnd = upload(
        &[&ds[0]],
        dir.path(),
        "f",
        &pattern(4 << 20, 3),
        &["-c", "1", "-b", "1M"],
    );
    let x = xnd.to_str().unwrap();
    let state = dir.path().join("scrub.json");
    let s = state.to_str().unwrap();
    // 2 MiB a cycle: two of the four blocks.
    let cycle = || {
        let (ok, out, err) = lors(&[
            "keep",
            "--grace",
            "0",
            "--once",
            "--json",
            "--every",
            "1s",
            "--scrub-rate",
            "2M",
            "--state",
            s,
            x,
        ]);
        assert!(ok, "{err}");
        let text = String::from_utf8(out).unwrap();
        let kept: serde_json::Value = (text.lines())
            .filter_map(|l| serde_json::from_str(l).ok())
            .find(|v: &serde_json::Value| v["event"] == "kept")
            .unwrap_or_else(|| panic!("no kept event: {text}"));
        kept["scrubbed_bytes"].as_u64().unwrap()
    };
    let scrubbed: Vec<u64> = (0..5).map(|_| cycle()).collect();
    assert!(
        scrubbed.iter().all(|&b| b >= 2 << 20),
        "every cycle scrubs its share: {scrubbed:?}"
    );
    let corrupt = format!(
        "{{\"file\":{:?},\"mapping\":{}}}",
        xnd.canonicalize().unwrap(),
        u64::MAX
    );
    std::fs::write(&state, corrupt).unwrap();
    assert!(cycle() >= 2 << 20, "a place past the end starts over");
    // A link at --state is replaced; its target stays as it was.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    std::fs::remove_file(&state).unwrap();
    std::os::unix::fs::symlink(&victim, &state).unwrap();
    cycle();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(!std::fs::symlink_metadata(&state).unwrap().is_symlink());
}

/// A link in a kept directory is not followed, and stays a link; named
/// on the command line, its target is kept in place.
#[test]
fn links_are_never_replaced_by_the_keeper() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let xnd = upload(
        &[&ds[0]],
        dir.path(),
        "f",
        &pattern(1 << 20, 4),
        &["-c", "1"],
    );
    let kept = dir.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    let link = kept.join("outside.xnd");
    std::os::unix::fs::symlink(&xnd, &link).unwrap();
    let (ok, _, err) = lors(&["keep", "--grace", "0", "--once", kept.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(err.contains("outside.xnd: skipped"), "{err}");
    let (ok, _, err) = lors(&[
        "keep",
        "--grace",
        "0",
        "--once",
        "-c",
        "2",
        "--depot",
        &ds[0].addr,
        link.to_str().unwrap(),
    ]);
    // One depot cannot hold a second copy: short, and said; what matters
    // is where the exNode went.
    let _ = (ok, err);
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
}

/// Two keepers over one directory, healing the same exNodes at once after
/// a depot died, never strand an allocation: each exNode is kept by one
/// of them at a time, and the depots hold exactly what the exNodes name.
#[test]
fn two_keepers_on_one_directory_strand_nothing() {
    let dir = tempdir();
    let mut ds = crate::util::depots(4, dir.path());
    let kept = dir.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    for i in 0..12 {
        let x = upload(
            &[&ds[0], &ds[1]],
            dir.path(),
            &format!("f{i}"),
            &pattern(512 << 10, i as u8),
            &["-c", "2", "-b", "128K"],
        );
        std::fs::rename(&x, kept.join(format!("f{i}.xnd"))).unwrap();
    }
    ds[0].kill9();
    let live = [&ds[1], &ds[2], &ds[3]];
    let targets = list(&[&ds[2], &ds[3]]);
    for round in 0..3 {
        let run = || {
            lors_cmd(&[
                "keep",
                "--grace",
                "0",
                "--once",
                "-q",
                "--depot",
                &targets,
                kept.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
        };
        let (mut a, mut b) = (run(), run());
        let _ = (a.wait(), b.wait());
        let mut named = 0;
        for i in 0..12 {
            let x = lors::xnd::load(&kept.join(format!("f{i}.xnd"))).unwrap();
            named += x
                .mappings
                .iter()
                .filter(|m| m.depot().as_deref() != Some(ds[0].addr.as_str()))
                .map(|m| m.alloc_length)
                .sum::<u64>();
        }
        let on: u64 = live.iter().map(|d| used(d)).sum();
        assert_eq!(
            on, named,
            "round {round}: nothing unnamed on the live depots"
        );
    }
}

/// A single replica on a depot that trickles its bytes: a download gives
/// up after a bounded time, saying the depot was too slow.
#[test]
fn a_trickling_single_replica_fails_in_bounded_time() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = crate::util::depots(1, dir.path());
    let xnd = upload(
        &[&ds[0]],
        dir.path(),
        "f",
        &pattern(256 << 10, 5),
        &["-c", "1"],
    );
    let slow = dir.path().join("slow.xnd");
    redirect(&xnd, &ds[0].addr, &trickle(&ds[0].addr), &slow);
    let t0 = Instant::now();
    let (ok, err) = crate::util::lors_within(
        &["download", "-T", "2s", "-o", "-", slow.to_str().unwrap()],
        Duration::from_secs(60),
    )
    .expect("the download ends");
    assert!(!ok);
    assert!(err.contains("bytes/s"), "{err}");
    eprintln!("gave up after {:?}", t0.elapsed());
}

/// Exit codes follow the words: a LOST line fails `verify` and `stat`,
/// whether a replica went bad or no mapping ever held the bytes.
#[test]
fn any_lost_bytes_fail_the_command() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let xnd = upload(
        &[&ds[0]],
        dir.path(),
        "f",
        &pattern(3 << 20, 6),
        &["-c", "1", "-b", "1M"],
    );
    let mut x = lors::xnd::load(&xnd).unwrap();
    x.mappings.remove(1);
    let gap = dir.path().join("gap.xnd");
    lors::xnd::save(&gap, &x).unwrap();
    for cmd in ["verify", "stat"] {
        let (ok, out, err) = lors(&[cmd, gap.to_str().unwrap()]);
        let said = String::from_utf8_lossy(&out).to_string() + &err;
        assert!(
            !ok,
            "{cmd} exits 0 with bytes 1048576..2097152 missing: {said}"
        );
    }
    let (ok, _, _) = lors(&["download", "-o", "-", gap.to_str().unwrap()]);
    assert!(!ok);
}

/// A replica whose depot acknowledged the copy and never made it (its
/// allocation holds nothing) is not counted live: `stat` says so and
/// fails, and a keeper replaces it from a good one and drops it.
#[test]
fn a_copy_that_never_arrived_is_not_a_live_replica() {
    let dir = tempdir();
    let ds = crate::util::depots(3, dir.path());
    let data = pattern(1 << 20, 7);
    let xnd = upload(&[&ds[0]], dir.path(), "f", &data, &["-c", "1"]);
    let mut x = lors::xnd::load(&xnd).unwrap();
    // The "copy": an allocation of the right size on another depot, never
    // written, as a lying depot's would be.
    let m = x.mappings[0].clone();
    let caps = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut c = ds[1].connect().await;
        c.allocate(
            "0",
            lors_ibp::proto::Reliability::Hard,
            lors_ibp::proto::AllocType::ByteArray,
            lors_ibp::proto::Lease::Secs(3600),
            m.alloc_offset + m.alloc_length,
        )
        .await
        .unwrap()
    });
    let mut fake = m.clone();
    (fake.read, fake.write, fake.manage) = (Some(caps.read), Some(caps.write), Some(caps.manage));
    x.mappings.push(fake);
    lors::xnd::save(&xnd, &x).unwrap();
    let x_s = xnd.to_str().unwrap();
    let (ok, out, _) = lors(&["stat", x_s]);
    let said = String::from_utf8_lossy(&out);
    assert!(said.contains("1 live, 1 failed"), "{said}");
    let _ = ok;
    let (ok, _, err) = lors(&[
        "keep",
        "--grace",
        "0",
        "--once",
        "-c",
        "2",
        "--depot",
        &ds[2].addr,
        x_s,
    ]);
    assert!(ok, "{err}");
    let kept = lors::xnd::load(&xnd).unwrap();
    let on: Vec<String> = kept.mappings.iter().filter_map(|m| m.depot()).collect();
    assert!(
        !on.contains(&ds[1].addr) && on.contains(&ds[2].addr),
        "the empty one dropped, a real copy made: {on:?}"
    );
    let (ok, _, err) = lors(&["verify", x_s]);
    assert!(ok, "{err}");
}

/// In a directory nothing can be written to (no lock, no journal), the
/// keeper still extends the leases, and makes nothing it could not name.
#[test]
fn a_keeper_extends_leases_where_it_cannot_write() {
    let dir = tempdir();
    let ds = crate::util::depots(2, dir.path());
    let kept = dir.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    let xnd = upload(
        &[&ds[0]],
        dir.path(),
        "f",
        &pattern(100_000, 9),
        &["-c", "1", "-d", "1h"],
    );
    let xnd = {
        let to = kept.join("f.xnd");
        std::fs::rename(&xnd, &to).unwrap();
        to
    };
    let chattr = |flag: &str| {
        std::process::Command::new("chattr")
            .args([flag, kept.to_str().unwrap()])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !chattr("+i") {
        eprintln!("skipping: no immutable directories here");
        return;
    }
    let (ok, _, err) = lors(&[
        "keep",
        "--grace",
        "0",
        "--once",
        "--lease",
        "2h",
        "-c",
        "2",
        "--depot",
        &ds[1].addr,
        xnd.to_str().unwrap(),
    ]);
    chattr("-i");
    assert!(err.contains("1 leases extended"), "{err}");
    assert!(!ok, "short of copies, and said: {err}");
    assert!(seconds_left(&xnd).is_some_and(|s| s > 3600), "{err}");
    assert_eq!(used(&ds[1]), 0, "nothing made that no journal could name");
}
