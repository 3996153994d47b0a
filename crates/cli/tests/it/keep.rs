//! `lors keep`: leases kept alive, lost replicas remade from live ones,
//! dead mappings dropped, lost bytes named, a stop that leaves nothing
//! behind.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::tools::used;
use crate::util::{
    DepotProc, depots, flip_stored_byte, free_block, list, lors, lors_cmd, pattern, tempdir, upload,
};

/// Live replicas per block, on which depots.
fn holders(x: &Path) -> Vec<Vec<String>> {
    let x = lors::xnd::load(x).unwrap();
    x.blocks()
        .values()
        .map(|idx| {
            idx.iter()
                .map(|&i| x.mappings[i].depot().unwrap())
                .collect()
        })
        .collect()
}

/// (a) A depot killed for good: one cycle later every block has its two
/// copies again on the others, and the file reads with the depot gone.
#[test]
fn a_dead_depot_is_replaced_in_one_cycle() {
    let dir = tempdir();
    let mut ds = depots(4, dir.path());
    let data = pattern((6 << 20) + 99, 3);
    let xnd = upload(
        &[&ds[0], &ds[1], &ds[2]],
        dir.path(),
        "f",
        &data,
        &["-c", "2", "-b", "1M"],
    );
    let x = xnd.to_str().unwrap();
    let dead = ds[1].addr.clone();
    assert!(holders(&xnd).iter().any(|h| h.contains(&dead)));
    ds[1].kill9();
    let all = list(&ds.iter().collect::<Vec<_>>());
    let (ok, out, err) = lors(&["keep", "--grace", "0", "--once", "--depot", &all, x]);
    assert!(ok, "{err}");
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("new replicas") && out.contains("dead mappings dropped"),
        "{out}"
    );
    for h in holders(&xnd) {
        assert_eq!(h.len(), 2, "{h:?}");
        assert!(!h.contains(&dead), "{h:?}");
        assert_ne!(h[0], h[1], "two copies on one depot: {h:?}");
    }
    let (ok, got, err) = lors(&["download", "-q", "-o", "-", x]);
    assert!(ok && got == data, "{err}");
    let (ok, _, err) = lors(&["verify", "-q", x]);
    assert!(ok, "{err}");
    // Nothing left to do: a second cycle changes nothing.
    let before = std::fs::read(&xnd).unwrap();
    let (ok, _, err) = lors(&["keep", "--grace", "0", "--once", "--depot", &all, x]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&xnd).unwrap() == before);
}

/// (c) Leases of 10 s kept alive by `lors keep --every 2s` for three times
/// as long, while the same file without a keeper expires; SIGTERM stops
/// the service at once.
#[test]
fn a_keeper_keeps_short_leases_alive() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let to: Vec<&DepotProc> = ds.iter().collect();
    let data = pattern(3 << 20, 4);
    let flags = ["-c", "2", "-b", "1M", "-d", "10s"];
    let kept = upload(&to, dir.path(), "kept", &data, &flags);
    let control = upload(&to, dir.path(), "control", &data, &flags);
    let mut keeper = lors_cmd(&[
        "keep",
        "--grace",
        "0",
        "--every",
        "2s",
        "--lease",
        "10s",
        "--margin",
        "6s",
        "--depot",
        &list(&to),
        kept.to_str().unwrap(),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_secs(30));
    let (ok, got, err) = lors(&["download", "-q", "-o", "-", kept.to_str().unwrap()]);
    assert!(ok && got == data, "the kept file: {err}");
    let (ok, out, _) = lors(&["stat", control.to_str().unwrap()]);
    assert!(!ok, "the control file expired");
    assert!(String::from_utf8(out).unwrap().contains("expired"));
    let t0 = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &keeper.id().to_string()])
        .status();
    let st = loop {
        if let Some(st) = keeper.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "keep did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut keeper.stderr.take().unwrap(), &mut err).unwrap();
    assert!(st.success(), "{err}");
    assert!(err.contains("keep stopped"), "{err}");
}

/// (e) A block whose every replica is gone is reported lost with its bytes,
/// and `--once` exits non-zero; the rest is still kept.
#[test]
fn a_block_with_no_replica_left_is_reported_lost() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let to: Vec<&DepotProc> = ds.iter().collect();
    let data = pattern(4 << 20, 6);
    let xnd = upload(&to, dir.path(), "f", &data, &["-c", "2", "-b", "1M"]);
    let x = xnd.to_str().unwrap();
    // Both copies of block 1 freed, through another exNode.
    free_block(&xnd, 1 << 20);
    let before = std::fs::read(&xnd).unwrap();
    let (ok, _, err) = lors(&["keep", "--grace", "0", "--once", "--depot", &list(&to), x]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "LOST: bytes {}..{} have no live replica",
            1 << 20,
            2 << 20
        )),
        "{err}"
    );
    assert!(err.contains("1048576 bytes lost"), "{err}");
    // The lost block's mappings stay: the exNode never names less of the
    // file than before (and here nothing else needed doing).
    assert!(std::fs::read(&xnd).unwrap() == before);
}

/// (d) SIGTERM at any moment of a heal: the exNode is the old one or the
/// new one, and once a cycle completes the depots hold exactly what it
/// names.
#[test]
fn a_stopped_heal_leaves_the_old_or_the_new_exnode_and_nothing_stranded() {
    let dir = tempdir();
    let ds = depots(4, dir.path());
    let to: Vec<&DepotProc> = ds[..3].iter().collect();
    let all = list(&ds.iter().collect::<Vec<_>>());
    let data = pattern(24 << 20, 8);
    let mut cut = 0;
    // Run 0 is timed whole; the others are stopped at sevenths of its time.
    let mut whole = Duration::ZERO;
    for i in 0..7u32 {
        let xnd = upload(
            &to,
            dir.path(),
            &format!("f{i}"),
            &data,
            &["-c", "2", "-b", "1M"],
        );
        let x = xnd.to_str().unwrap();
        // Depot 1's copies freed: every block it held is one short.
        let on_1 = lors::xnd::load(&xnd).unwrap();
        let on_1: Vec<&lors_exnode::Mapping> = (on_1.mappings.iter())
            .filter(|m| m.depot().as_ref() == Some(&ds[1].addr))
            .collect();
        crate::util::free_allocations(&on_1);
        let before = std::fs::read(&xnd).unwrap();
        let t0 = Instant::now();
        let mut child = lors_cmd(&["keep", "--grace", "0", "--once", "--depot", &all, x])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if i > 0 {
            std::thread::sleep(whole * i / 7);
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let st = child.wait().unwrap();
        if i == 0 {
            whole = t0.elapsed();
        }
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(st.success(), "{err}");
        let now = std::fs::read(&xnd).unwrap();
        if now == before {
            cut += 1;
        } else {
            assert!(
                holders(&xnd).iter().all(|h| h.len() == 2),
                "a half-healed exNode"
            );
        }
        // A full cycle, then every allocation on the depots is named.
        let (ok, _, err) = lors(&["keep", "--grace", "0", "--once", "--depot", &all, x]);
        assert!(ok, "{err}");
        let (ok, got, err) = lors(&["download", "-q", "-o", "-", x]);
        assert!(ok && got == data, "{err}");
    }
    let held: u64 = ds.iter().map(used).sum();
    let named: u64 = (0..7)
        .map(|i| {
            let x = lors::xnd::load(&dir.path().join(format!("f{i}.xnd"))).unwrap();
            x.mappings.iter().map(|m| m.alloc_length).sum::<u64>()
        })
        .sum();
    assert_eq!(
        held, named,
        "allocations no exNode names ({cut} of 6 runs were stopped mid-heal)"
    );
    assert!(
        cut >= 2,
        "only {cut} of 6 runs were stopped before they wrote"
    );
}

/// (b) A byte flipped on a depot's disk: the scrub, a few replicas a run
/// and resuming from its state file, names the replica, replaces it from
/// the good copy and frees it.
#[test]
fn the_scrub_finds_a_flipped_byte_and_replaces_the_replica() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let data = pattern(4 << 20, 9);
    let xnd = upload(
        &[&ds[0], &ds[1]],
        dir.path(),
        "f",
        &data,
        &["-c", "2", "-b", "1M"],
    );
    let x = xnd.to_str().unwrap();
    let xn = lors::xnd::load(&xnd).unwrap();
    let victim = (xn.mappings.iter())
        .find(|m| m.exnode_offset == 2 << 20 && m.depot().as_deref() == Some(&ds[0].addr))
        .unwrap()
        .clone();
    flip_stored_byte(&ds, dir.path(), &victim, 4096 + 1000);
    let state = dir.path().join("scrub.json");
    let all = list(&ds.iter().collect::<Vec<_>>());
    let mut found = String::new();
    // 3 MiB a run: three of the eight replicas; all of them in three runs.
    for _ in 0..3 {
        let (ok, _, err) = lors(&[
            "keep",
            "--grace",
            "0",
            "--once",
            "--every",
            "1s",
            "--scrub-rate",
            "3M",
            "--state",
            state.to_str().unwrap(),
            "--depot",
            &all,
            x,
        ]);
        assert!(ok, "{err}");
        found += &err;
    }
    assert_eq!(found.matches(" is corrupt: ").count(), 1, "{found}");
    assert!(found.contains("BLAKE3 checksum mismatch"), "{found}");
    let h = holders(&xnd);
    assert!(h.iter().all(|h| h.len() == 2), "{h:?}");
    let new = lors::xnd::load(&xnd).unwrap();
    assert!(
        !new.mappings.iter().any(|m| m.read == victim.read),
        "the corrupt replica is dropped"
    );
    let (ok, _, err) = lors(&["verify", "-q", x]);
    assert!(ok, "{err}");
    let held: u64 = ds.iter().map(used).sum();
    let named: u64 = new.mappings.iter().map(|m| m.alloc_length).sum();
    assert_eq!(held, named, "the corrupt allocation is freed");
}

/// Settings that would hammer the depots or let leases lapse between
/// cycles are refused before anything is touched.
#[test]
fn settings_that_lose_data_or_spin_are_refused() {
    let dir = tempdir();
    let x = dir.path().join("none.xnd");
    let x = x.to_str().unwrap();
    for (args, says) in [
        (vec!["--every", "0s"], "--every must be at least 1s"),
        (
            vec!["--file-deadline", "0s"],
            "--file-deadline must be at least 1s",
        ),
        (vec!["--lease", "0s"], "leases would end between cycles"),
        (
            vec!["--every", "2h", "--lease", "1h"],
            "leases would end between cycles",
        ),
    ] {
        let mut cmd = vec!["keep", "--grace", "0", "--once"];
        cmd.extend(args);
        cmd.push(x);
        let out = lors_cmd(&cmd).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(says));
    }
}

/// `GET /metrics` of a keeper at `addr`, or `None` while it is not up.
fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The value of metric `name` in a scrape.
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A keeper run as a service serves what its cycles did and what the last
/// one found: a depot lost shows as lost bytes at the next cycle.
#[test]
fn a_keeper_serves_its_findings_as_prometheus_metrics() {
    let dir = tempdir();
    let mut ds = depots(2, dir.path());
    let data = pattern(2 << 20, 8);
    let to: Vec<&DepotProc> = ds.iter().collect();
    let xnd = upload(&to, dir.path(), "f", &data, &["-c", "1", "-b", "1M"]);
    let all = list(&to);
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut keeper = lors_cmd(&[
        "keep",
        "--grace",
        "0",
        "-q",
        "--every",
        "1s",
        "--metrics",
        &addr,
        "--depot",
        &all,
        xnd.to_str().unwrap(),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let wait_for = |what: &dyn Fn(&str) -> bool| -> String {
        let t0 = Instant::now();
        loop {
            if let Some(body) = scrape(&addr)
                && what(&body)
            {
                return body;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no such scrape in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let body = wait_for(&|b| metric(b, "lors_keep_cycles_total").is_some_and(|n| n >= 1.0));
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert_eq!(metric(&body, "lors_keep_exnodes"), Some(1.0), "{body}");
    assert_eq!(metric(&body, "lors_keep_lost_bytes"), Some(0.0), "{body}");
    assert!(body.contains("# TYPE lors_keep_leases_extended_total counter"));
    ds[1].kill9();
    let body = wait_for(&|b| metric(b, "lors_keep_lost_bytes").is_some_and(|n| n > 0.0));
    assert_eq!(
        metric(&body, "lors_keep_lost_bytes"),
        Some((1 << 20) as f64),
        "{body}"
    );
    assert_eq!(metric(&body, "lors_keep_short_blocks"), Some(0.0), "{body}");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &keeper.id().to_string()])
        .status();
    assert!(keeper.wait().unwrap().success());
}

/// Healing many small exNodes in one cycle spreads their new replicas over
/// the depots that may take them, instead of giving each exNode's to the
/// first one listed.
#[test]
fn a_cycle_spreads_new_replicas_over_the_depots() {
    let dir = tempdir();
    let mut ds = depots(5, dir.path());
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    for i in 0..9u8 {
        upload(
            &[&ds[0], &ds[1]],
            &files,
            &format!("f{i}"),
            &pattern(100_000, i),
            &["-c", "2"],
        );
    }
    ds[0].kill9();
    let targets: Vec<&DepotProc> = ds[1..].iter().collect();
    let (ok, _, err) = lors(&[
        "keep",
        "--grace",
        "0",
        "--once",
        "--depot",
        &list(&targets),
        files.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let mut per: std::collections::BTreeMap<String, usize> = Default::default();
    for i in 0..9 {
        for h in holders(&files.join(format!("f{i}.xnd"))) {
            assert_eq!(h.len(), 2, "{h:?}");
            for d in h.into_iter().filter(|d| *d != ds[1].addr) {
                *per.entry(d).or_default() += 1;
            }
        }
    }
    let counts: Vec<usize> = per.values().copied().collect();
    assert_eq!(counts, vec![3, 3, 3], "new replicas per depot: {per:?}");
}
