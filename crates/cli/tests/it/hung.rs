//! A hung depot — one that accepts connections and never answers, as a
//! stopped process or a path that black-holes packets does (`SIGSTOP`
//! reproduces it) — costs a command the stall time, not the network
//! timeout, whenever other depots can do the work.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::util::{DepotProc, list, lors, lors_cmd, pattern, tempdir, upload};

/// Every command here runs with `-T 60s` where it takes one: a run that
/// waits for it is caught by this bound, which is still generous beside the
/// second or two a healthy run takes (the stall floor is 2 s).
const LIMIT: Duration = Duration::from_secs(25);

fn four(dir: &Path) -> Vec<DepotProc> {
    (0..4)
        .map(|i| DepotProc::start(&dir.join(format!("d{i}")), &["--sync", "never"]))
        .collect()
}

/// What a finished run left: success, stdout, stderr, how long it took.
struct Run {
    ok: bool,
    out: Vec<u8>,
    err: String,
    took: Duration,
}

/// Runs `lors ARGS…`, stopping `freeze` `after` it starts (the depot is
/// thawed by the caller); panics when the run outlives [`LIMIT`].
fn run(args: &[&str], freeze: Option<(&DepotProc, Duration)>) -> Run {
    let t0 = Instant::now();
    let mut child = lors_cmd(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lors");
    let (mut o, mut e) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = o.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = e.read_to_string(&mut s);
        s
    });
    let mut frozen = freeze.is_none();
    let status = loop {
        if let Some((d, after)) = freeze
            && !frozen
            && t0.elapsed() >= after
        {
            d.signal("STOP");
            frozen = true;
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lors {args:?} still running after {LIMIT:?}: it waited for the timeout");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    if let Some((d, _)) = freeze
        && !frozen
    {
        d.signal("STOP"); // the run ended first: the caller thaws it all the same
    }
    Run {
        ok: status.success(),
        out: out.join().unwrap(),
        err: err.join().unwrap(),
        took: t0.elapsed(),
    }
}

#[test]
fn downloads_read_around_a_depot_that_hangs_at_any_moment() {
    let dir = tempdir();
    let ds = four(dir.path());
    let all: Vec<&DepotProc> = ds.iter().collect();
    let data = pattern(96 << 20, 31);
    // End-to-end checksummed blocks of the default 10 MiB (fetched in
    // pieces through memory slots, which the hung depot's fetches once
    // held all of) and raw ones (spliced into the output file).
    let e2e = upload(&all, dir.path(), "e.bin", &data, &["-c", "2"]);
    let raw = upload(
        &all,
        dir.path(),
        "r.bin",
        &data,
        &["-c", "2", "-b", "1M", "-n"],
    );
    let out = dir.path().join("out.bin");
    let out_s = out.to_str().unwrap().to_owned();
    let mut slowest = Duration::ZERO;
    for i in 0..20u64 {
        let xnd = if i % 2 == 0 { &e2e } else { &raw };
        let to = if i % 4 < 2 { out_s.as_str() } else { "-" };
        let _ = std::fs::remove_file(&out);
        let args = [
            "download",
            "-q",
            "-T",
            "60s",
            "-o",
            to,
            xnd.to_str().unwrap(),
        ];
        // From before the first byte to the last pieces.
        let r = run(&args, Some((&ds[2], Duration::from_millis(i * 15))));
        ds[2].signal("CONT");
        assert!(r.ok, "run {i} to {to}: {}", r.err);
        let got = if to == "-" {
            r.out
        } else {
            std::fs::read(&out).unwrap()
        };
        assert!(got == data, "run {i} to {to}: the output differs");
        slowest = slowest.max(r.took);
    }
    eprintln!("slowest of 20 downloads with a depot hung at some moment: {slowest:?}");
}

#[test]
fn every_command_finishes_at_the_pace_of_the_healthy_depots() {
    let dir = tempdir();
    let ds = four(dir.path());
    let all: Vec<&DepotProc> = ds.iter().collect();
    let hung = &ds[2];
    let data = pattern(12 << 20, 37);
    let two = upload(&all, dir.path(), "two.bin", &data, &["-c", "2", "-b", "1M"]);
    let doomed = upload(
        &all,
        dir.path(),
        "doomed.bin",
        &data,
        &["-c", "2", "-b", "1M"],
    );
    let one = upload(
        &[&ds[0], &ds[1]],
        dir.path(),
        "one.bin",
        &data,
        &["-c", "1", "-b", "1M"],
    );
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let (two_s, one_s, doomed_s) = (
        two.to_str().unwrap(),
        one.to_str().unwrap(),
        doomed.to_str().unwrap(),
    );
    let depots = list(&all);
    let targets = list(&[&ds[2], &ds[3]]);
    let src = p("two.bin");
    let (up, aug, routed, dis) = (p("up.xnd"), p("aug.xnd"), p("routed.xnd"), p("dis.xnd"));
    hung.signal("STOP");
    let t = ["-T", "60s"];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "upload",
            [
                &[
                    "upload", "-q", "-c", "2", "-b", "1M", "--depot", &depots, "-o", &up,
                ][..],
                &t,
                &[&src],
            ]
            .concat(),
        ),
        (
            "augment",
            [
                &["augment", "-q", "-c", "1", "--depot", &depots, "-o", &aug][..],
                &t,
                &[one_s],
            ]
            .concat(),
        ),
        (
            "route",
            [
                &[
                    "route",
                    "-q",
                    "-c",
                    "1",
                    "--keep-old",
                    "--depot",
                    &targets,
                    "-o",
                    &routed,
                ][..],
                &t,
                &[one_s],
            ]
            .concat(),
        ),
        (
            "disseminate",
            vec!["disseminate", "-q", "--to", &depots, "-o", &dis, &src],
        ),
        ("stat", [&["stat"][..], &t, &[two_s]].concat()),
        ("ls", [&["ls"][..], &t, &[two_s]].concat()),
        ("verify", [&["verify", "-q"][..], &t, &[two_s]].concat()),
        (
            "refresh",
            [&["refresh", "--by", "1h"][..], &t, &[two_s]].concat(),
        ),
        (
            "trim",
            [
                &["trim", "-q", "--decrement", "--allow-holes", "--depot"][..],
                &[hung.addr.as_str(), "--depot", ds[3].addr.as_str()],
                &t,
                &[doomed_s],
            ]
            .concat(),
        ),
    ];
    for (what, args) in &cases {
        let r = run(args, None);
        let out = String::from_utf8_lossy(&r.out);
        eprintln!("{what}: {:?}", r.took);
        match *what {
            // Work another depot can do is done there.
            "upload" | "augment" | "route" => assert!(r.ok, "{what}: {}", r.err),
            // A site that must hold a replica cannot be replaced: named, fast.
            "disseminate" => {
                assert!(!r.ok);
                assert!(r.err.contains(&format!("({}: ", hung.addr)), "{}", r.err);
            }
            // Reports give its lines as "no answer".
            "stat" => assert!(out.contains("no answer"), "{what}: {out}"),
            "ls" => assert!(out.contains("no answer"), "{what}: {out}"),
            "verify" => {
                assert!(!r.ok);
                assert!(out.contains(": no answer: "), "{what}: {out}");
                assert!(
                    out.contains(" good"),
                    "the healthy replicas are read: {out}"
                );
            }
            "refresh" => {
                assert!(!r.ok);
                assert!(out.contains("not refreshed: no answer"), "{out}");
            }
            "trim" => assert!(r.err.contains("not released"), "{what}: {}", r.err),
            _ => unreachable!(),
        }
    }
    // Nothing new was placed on the hung depot.
    for made in [&up, &aug] {
        let x = lors::xnd::load(Path::new(made)).unwrap();
        assert!(
            x.mappings
                .iter()
                .all(|m| m.depot().as_deref() != Some(&hung.addr)),
            "{made} names the hung depot"
        );
    }
    let x = lors::xnd::load(Path::new(&routed)).unwrap();
    assert!(x.mappings.iter().all(|m| m.depot().unwrap() == ds[3].addr));
    hung.signal("CONT");
    // What the commands wrote reads back whole.
    for made in [&up, &aug, &routed] {
        let (ok, got, err) = lors(&["download", "-q", "-o", "-", made]);
        assert!(ok, "{made}: {err}");
        assert!(got == data, "{made} differs");
    }
}

/// A file with one copy, on a depot that is killed mid-download and comes
/// back on its address two seconds later: the reads it cut off are asked
/// again once it is back, and the download completes byte-exact — it does
/// not fail at the first reset. A depot that stays away fails the
/// download, saying which depot, within the grace.
#[test]
fn a_single_copy_download_outlasts_its_depot_restarting() {
    let dir = tempdir();
    let d0 = dir.path().join("d0");
    let mut d = DepotProc::start(&d0, &["--sync", "never"]);
    let data = pattern(24 << 20, 77);
    let xnd = upload(&[&d], dir.path(), "one", &data, &["-c", "1", "-b", "1M"]);
    let out = dir.path().join("back");
    let args = ["download", "-q", "--bwlimit", "8M", "-o"];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.push(out.display().to_string());
    args.push(xnd.display().to_string());
    let child = lors_cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let addr = d.addr.clone();
    d.kill9();
    std::thread::sleep(Duration::from_secs(2));
    let _d = DepotProc::start(&d0, &["--sync", "never", "--listen", &addr]);
    let got = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&got.stderr);
    assert!(got.status.success(), "{err}");
    assert!(std::fs::read(&out).unwrap() == data, "the file differs");

    // Gone for good: the download fails within the grace, naming it.
    drop(_d);
    let n = args.len();
    args[n - 2] = dir.path().join("again").display().to_string();
    let t0 = Instant::now();
    let r = run(&args.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert!(!r.ok, "a download from a depot that is gone succeeded");
    assert!(r.err.contains(&addr), "{}", r.err);
    assert!(t0.elapsed() < LIMIT, "took {:?}", t0.elapsed());
}
