//! An interrupted upload (SIGINT, SIGTERM at any moment) leaves on the
//! depots exactly what its exNode or `OUT.xnd.partial` names, and running
//! it again sends only the blocks not yet stored.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::tools::used;
use crate::util::{DepotProc, list, lors, lors_cmd, pattern, tempdir, upload};

/// Bytes of allocations the exNode at `path` names, if it is there.
fn named(path: &Path) -> u64 {
    match lors::xnd::load(path) {
        Ok(x) => x.mappings.iter().map(|m| m.alloc_length).sum(),
        Err(_) => 0,
    }
}

/// `lors upload` interrupted by `signal` after `after`; its exit status.
pub(crate) fn interrupted_upload(args: &[&str], signal: &str, after: Duration) -> (i32, String) {
    let mut child = lors_cmd(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lors");
    std::thread::sleep(after);
    let _ = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the upload did not stop within 20 s of {signal}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    // A signal that comes before the command has set up its handling
    // (on a loaded machine, 20 ms in may still be start-up) ends it the
    // default way: reported as minus the signal's number. It has made
    // nothing yet, which the callers' checks of the depots confirm.
    use std::os::unix::process::ExitStatusExt as _;
    let code = status
        .code()
        .unwrap_or_else(|| -status.signal().unwrap_or(0));
    (code, err)
}

#[test]
fn interrupted_uploads_leave_only_what_a_record_names_and_resume() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = (0..3)
        .map(|i| DepotProc::start(&dir.path().join(format!("d{i}")), &["--sync", "never"]))
        .collect();
    let depots = ds
        .iter()
        .map(|d| d.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let data = pattern(16 << 20, 41);
    let src = dir.path().join("in.bin");
    std::fs::write(&src, &data).unwrap();
    let src = src.to_str().unwrap();
    let mut outs = Vec::new();
    let mut interrupted = 0;
    for i in 0..20u64 {
        let out = dir.path().join(format!("u{i}.xnd"));
        let out_s = out.to_str().unwrap().to_owned();
        // Raw blocks sent from the file, and checksummed ones through memory.
        // The rate limit makes a run last ~0.4 s however fast the machine,
        // so the signals, 20 ms to 0.5 s in, land in every phase of it.
        let mut args = vec![
            "upload",
            "-c",
            "2",
            "-b",
            "256K",
            "--bwlimit",
            "40M",
            "--depot",
            &depots,
        ];
        if i % 3 == 0 {
            args.push("-n");
        }
        args.extend(["-o", &out_s, src]);
        let signal = if i % 2 == 0 { "INT" } else { "TERM" };
        let (code, err) = interrupted_upload(&args, signal, Duration::from_millis(20 + 23 * i));
        let partial = dir.path().join(format!("u{i}.xnd.partial"));
        match code {
            0 => assert!(out.exists()),
            130 | 143 => {
                interrupted += 1;
                assert_eq!(code, if signal == "INT" { 130 } else { 143 }, "{err}");
                assert!(!out.exists(), "an interrupted upload wrote {out_s}");
                assert!(err.contains("upload interrupted"), "{err}");
                if partial.exists() {
                    assert!(
                        err.contains("run the same command again to resume"),
                        "{err}"
                    );
                }
            }
            c if c < 0 => assert!(!out.exists() && !partial.exists(), "{err}"),
            c => panic!("exit {c} after SIG{signal}: {err}"),
        }
        // Whatever the moment, the depots hold what the records name.
        let held: u64 = ds.iter().map(used).sum();
        outs.push((
            out,
            partial,
            args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        ));
        let recorded: u64 = (outs.iter()).map(|(o, p, _)| named(o) + named(p)).sum();
        assert_eq!(held, recorded, "run {i} (SIG{signal}): {err}");
    }
    assert!(
        interrupted >= 10,
        "only {interrupted} of 20 uploads were cut off"
    );
    // Each interrupted upload, run again, completes from its record.
    for (out, partial, args) in &outs {
        if out.exists() {
            continue;
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, err) = lors(&args);
        assert!(ok, "{err}");
        if named(partial) > 0 {
            panic!("{} left behind after a resumed upload", partial.display());
        }
        let (ok, got, err) = lors(&["download", "-q", "-o", "-", out.to_str().unwrap()]);
        assert!(ok, "{err}");
        assert!(got == data, "{} differs", out.display());
    }
    let held: u64 = ds.iter().map(used).sum();
    let recorded: u64 = outs.iter().map(|(o, _, _)| named(o)).sum();
    assert_eq!(
        held, recorded,
        "after resuming, every allocation is in an exNode"
    );
}

/// An interrupted augment changes no exNode and releases the replicas it
/// made; an interrupted route keeps them in its output for a rerun (or
/// changes nothing, when none was complete): either way the depots hold
/// what the exNodes name.
#[test]
fn interrupted_copies_are_released() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = (0..3)
        .map(|i| DepotProc::start(&dir.path().join(format!("d{i}")), &["--sync", "never"]))
        .collect();
    let data = pattern(64 << 20, 43);
    let src = dir.path().join("in.bin");
    std::fs::write(&src, &data).unwrap();
    let one = dir.path().join("one.xnd");
    let one_s = one.to_str().unwrap();
    let (ok, _, err) = lors(&[
        "upload",
        "-q",
        "-c",
        "1",
        "-b",
        "256K",
        "--depot",
        &ds[0].addr,
        "-o",
        one_s,
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let targets = format!("{},{}", ds[1].addr, ds[2].addr);
    let mut outs = vec![one.clone()];
    let mut cut = 0;
    for i in 0..8u64 {
        let out = dir.path().join(format!("c{i}.xnd"));
        let out_s = out.to_str().unwrap().to_owned();
        let cmd = if i % 2 == 0 { "augment" } else { "route" };
        // 64 MiB at 128 MiB/s: each run lasts ~0.5 s on any machine.
        let mut args = vec![
            cmd,
            "-c",
            "1",
            "--bwlimit",
            "128M",
            "--depot",
            &targets,
            "-o",
            &out_s,
        ];
        if cmd == "route" {
            args.push("--keep-old"); // the input stays whole for the next runs
        }
        args.push(one_s);
        let signal = if i % 4 < 2 { "INT" } else { "TERM" };
        let (code, err) = interrupted_upload(&args, signal, Duration::from_millis(30 + 25 * i));
        match code {
            0 => outs.push(out.clone()),
            130 | 143 if cmd == "route" && out.exists() => {
                cut += 1;
                assert!(err.contains("copies made so far are kept in"), "{err}");
                outs.push(out.clone());
            }
            130 | 143 => {
                cut += 1;
                assert!(
                    err.contains(&format!("{cmd} interrupted: the exNode is unchanged")),
                    "{err}"
                );
                assert!(!out.exists());
            }
            c if c < 0 => assert!(!out.exists(), "{err}"),
            c => panic!("{cmd}: exit {c}: {err}"),
        }
        let held: u64 = ds.iter().map(used).sum();
        // A route's output names the input's allocations too: count each once.
        let mut seen = std::collections::HashSet::new();
        let mut recorded = 0;
        for o in &outs {
            for m in lors::xnd::load(o).unwrap().mappings {
                if seen.insert(m.manage.clone()) {
                    recorded += m.alloc_length;
                }
            }
        }
        assert_eq!(held, recorded, "run {i} ({cmd}, SIG{signal}): {err}");
    }
    assert!(cut >= 3, "only {cut} of 8 were cut off");
}

/// A move between sites, interrupted half-way, keeps the copies it made;
/// the same command again copies only the rest and frees the old site:
/// every block once on the new site, nothing left on the old one, the
/// file whole.
#[test]
fn an_interrupted_route_is_finished_by_running_it_again() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = (0..4)
        .map(|i| DepotProc::start(&dir.path().join(format!("d{i}")), &["--sync", "never"]))
        .collect();
    let data = pattern(48 << 20, 17);
    let (a, b) = (list(&[&ds[0], &ds[1]]), list(&[&ds[2], &ds[3]]));
    let xnd = upload(
        &[&ds[0], &ds[1]],
        dir.path(),
        "f",
        &data,
        &["-c", "1", "-b", "1M"],
    );
    let x = xnd.to_str().unwrap();
    // 48 MiB at 24 MiB/s: cut off after about a third.
    let args = ["route", "--bwlimit", "24M", "--depot", &b, x];
    let (code, err) = interrupted_upload(&args, "INT", Duration::from_millis(700));
    assert_eq!(code, 130, "{err}");
    assert!(err.contains("copies made so far are kept in"), "{err}");
    let half = lors::xnd::load(&xnd).unwrap();
    let moved = half.mappings.len() - 48;
    assert!(moved > 0 && moved < 48, "{moved} of 48 blocks copied");
    // Again, reporting which depot sent what to which: only the rest,
    // every A depot sending, every B depot receiving.
    let (ok, out, err) = lors(&["route", "--json", "--depot", &b, x]);
    assert!(ok, "{err}");
    let text = String::from_utf8(out).unwrap() + &err;
    let summary: serde_json::Value = (text.lines().rev())
        .find_map(|l| {
            serde_json::from_str(l)
                .ok()
                .filter(|v: &serde_json::Value| v.get("pairs").is_some())
        })
        .unwrap_or_else(|| panic!("no summary in {text}"));
    let pairs = summary["pairs"].as_array().unwrap();
    let sent: u64 = pairs.iter().map(|p| p["bytes"].as_u64().unwrap()).sum();
    assert_eq!(sent, (48 - moved as u64) << 20, "{summary}");
    for end in ["from", "to"] {
        let on: std::collections::HashSet<&str> =
            pairs.iter().map(|p| p[end].as_str().unwrap()).collect();
        let site = if end == "from" { &a } else { &b };
        assert!(
            on.len() == 2 && on.iter().all(|d| site.contains(d)),
            "{end}: {on:?}"
        );
    }
    let done = lors::xnd::load(&xnd).unwrap();
    assert_eq!(done.mappings.len(), 48, "one copy of each block");
    assert!(
        done.mappings
            .iter()
            .all(|m| b.contains(&m.depot().unwrap()))
    );
    assert_eq!(
        used(&ds[0]) + used(&ds[1]),
        0,
        "the old site is empty ({a})"
    );
    let recorded: u64 = done.mappings.iter().map(|m| m.alloc_length).sum();
    assert_eq!(used(&ds[2]) + used(&ds[3]), recorded, "nothing unnamed");
    let out = dir.path().join("back");
    let (ok, _, err) = lors(&["download", "-q", "-o", out.to_str().unwrap(), x]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
}

/// An interrupted disseminate gives up the sites not yet complete, as it
/// does failing ones: what they got is released, and only complete sites
/// are in the exNode.
#[test]
fn interrupted_dissemination_keeps_only_complete_sites() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = (0..3)
        .map(|i| DepotProc::start(&dir.path().join(format!("d{i}")), &["--sync", "never"]))
        .collect();
    let src = dir.path().join("in.bin");
    std::fs::write(&src, pattern(24 << 20, 47)).unwrap();
    let to = ds
        .iter()
        .map(|d| d.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let mut cut = 0;
    for i in 0..4u64 {
        let out = dir.path().join(format!("s{i}.xnd"));
        let out_s = out.to_str().unwrap().to_owned();
        let args = [
            "disseminate",
            "-b",
            "256K",
            "--bwlimit", // 24 MiB to 3 sites: ~0.7 s on any machine
            "100M",
            "--to",
            &to,
            "-o",
            &out_s,
            src.to_str().unwrap(),
        ];
        let (code, err) = interrupted_upload(&args, "INT", Duration::from_millis(40 + 60 * i));
        match code {
            0 => {}
            130 => {
                cut += 1;
                assert!(err.contains("disseminate interrupted"), "{err}");
            }
            c if c < 0 => assert!(!out.exists(), "{err}"),
            c => panic!("exit {c}: {err}"),
        }
        // Complete sites are named; nothing else is held.
        let named: u64 = if out.exists() { named(&out) } else { 0 };
        let held: u64 = ds.iter().map(used).sum();
        assert_eq!(held, named, "run {i}: {err}");
        if out.exists() {
            let (ok, _, err) = lors(&[
                "trim",
                "-q",
                "--decrement",
                "--allow-holes",
                "--depot",
                &to,
                &out_s,
            ]);
            assert!(ok, "{err}");
        }
    }
    assert!(cut >= 2, "only {cut} of 4 were cut off");
}
