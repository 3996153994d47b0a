//! Edges a new user hit with copies and erasure codes: each a command a
//! user ran and what they then checked.

use std::collections::HashMap;

use crate::util::*;

/// The depots holding each block of `x` (by offset), parity left out.
fn replicas(x: &lors_exnode::ExNode) -> HashMap<u64, Vec<String>> {
    let mut on: HashMap<u64, Vec<String>> = HashMap::new();
    for m in &x.mappings {
        on.entry(m.exnode_offset).or_default().extend(m.depot());
    }
    on
}

/// `lors route` without `-c` keeps the file's two copies (it used to
/// default to one and drop the other silently); `-c 1` says otherwise and
/// becomes the file's policy.
#[test]
fn route_keeps_the_files_copy_count_unless_told() {
    let dir = tempdir();
    let ds = depots(7, dir.path());
    let data = pattern(700_000, 5);
    let first: Vec<&DepotProc> = ds[..3].iter().collect();
    let xnd = upload(&first, dir.path(), "f", &data, &["-c", "2", "-b", "100K"]);
    let targets = list(&ds[3..6].iter().collect::<Vec<_>>());
    let (ok, _, err) = lors(&["route", "-q", "--depot", &targets, xnd.to_str().unwrap()]);
    assert!(ok, "{err}");
    let x = lors::xnd::load(&xnd).unwrap();
    for (offset, on) in replicas(&x) {
        assert_eq!(on.len(), 2, "block at {offset}: {on:?}");
        assert!(on.iter().all(|d| targets.contains(d.as_str())), "{on:?}");
    }
    assert_eq!(x.copies_policy(), Some(2));
    assert_downloads(&xnd, &data, dir.path());

    let (ok, _, err) = lors(&[
        "route",
        "-q",
        "--depot",
        &ds[6].addr,
        "-c",
        "1",
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let x = lors::xnd::load(&xnd).unwrap();
    assert!(replicas(&x).values().all(|on| on == &[ds[6].addr.clone()]));
    assert_eq!(x.copies_policy(), Some(1));
    let (ok, _, err) = lors(&[
        "route",
        "-q",
        "--depot",
        &ds[0].addr,
        "-c",
        "0",
        xnd.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("-c 0"), "{err}");
}

/// Every block of an erasure-coded file trimmed with `--allow-holes`:
/// the exNode written is one the tools read (it used to claim stripes for
/// no block and be refused by every command after), and every allocation
/// was freed.
#[tokio::test(flavor = "multi_thread")]
async fn trimming_every_block_of_an_erasure_coded_file_leaves_a_readable_exnode() {
    let dir = tempdir();
    let ds = depots(6, dir.path());
    let data = pattern(8 * 4 * (64 << 10) - 5000, 9);
    let all: Vec<&DepotProc> = ds.iter().collect();
    let xnd = upload(&all, dir.path(), "f", &data, &["--ec", "4+2", "-b", "64K"]);
    let before = lors::xnd::load(&xnd).unwrap();
    let (ok, _, err) = lors(&[
        "trim",
        "-q",
        "--decrement",
        "--allow-holes",
        "--depot",
        &list(&all),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let x = lors::xnd::load(&xnd).unwrap();
    assert_eq!(x.allocations().count(), 0);
    for cmd in [
        &["ls"][..],
        &["stat"],
        &["verify"],
        &["keep", "--grace", "0", "--once"],
    ] {
        let mut args = cmd.to_vec();
        args.push(xnd.to_str().unwrap());
        let (ok, out, err) = lors(&args);
        let text = String::from_utf8_lossy(&out) + err.as_str();
        assert!(!text.contains("claimed"), "{cmd:?}: {text}");
        if cmd != ["stat"] && cmd != ["verify"] {
            assert!(ok, "{cmd:?}: {text}");
        }
    }
    for m in before.allocations() {
        let cap = m.manage.as_ref().unwrap();
        let mut c = lors_ibp::Connection::connect(&cap.address(), &client_cfg())
            .await
            .unwrap();
        assert!(c.probe(cap).await.is_err(), "still on {}", cap.address());
    }
}

/// `lors stat --expiring` over a directory of erasure-coded files speaks
/// in stripes and margins: a dead depot costs a block of some stripes,
/// not "LOST" (it used to say "0 of 1 copies; LOST", exit 1, while the
/// file downloaded whole); repaired, the file is healthy again and left
/// out of the listing.
#[test]
fn stat_over_erasure_coded_files_reports_their_margin_not_lost_copies() {
    let dir = tempdir();
    let mut ds = depots(7, dir.path());
    let ec = dir.path().join("ec");
    std::fs::create_dir(&ec).unwrap();
    let data = pattern(3 * 4 * (64 << 10) + 777, 3);
    let six: Vec<&DepotProc> = ds[..6].iter().collect();
    let xnd = upload(&six, &ec, "f", &data, &["--ec", "4+2", "-b", "64K"]);
    let x = lors::xnd::load(&xnd).unwrap();
    let dead = (ds.iter())
        .position(|d| Some(&d.addr) == x.mappings[0].depot().as_ref())
        .unwrap();
    ds[dead].kill9();
    let (ok, out, err) = lors(&["stat", "--expiring", "1h", ec.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("every stripe can lose 1 more of its 6"),
        "{out}"
    );
    assert!(out.contains("below its full margin"), "{out}");
    assert!(!out.contains("LOST") && !out.contains("copies;"), "{out}");
    let live: Vec<&DepotProc> = (0..7).filter(|&i| i != dead).map(|i| &ds[i]).collect();
    let (ok, _, err) = lors(&[
        "augment",
        "--repair",
        "--depot",
        &list(&live),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = lors(&["stat", "--expiring", "1h", ec.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "{out}{err}");
    assert!(!out.contains("f.xnd"), "a healthy file is left out: {out}");
    assert!(
        out.contains("0 under their copy count or parity margin"),
        "{out}"
    );
}

/// A parity block whose bytes rotted on disk: `lors verify` reads parity
/// too and says which block (it used to read only the data blocks and
/// report every replica good); `lors verify DIR` takes a directory as
/// `stat` does.
#[test]
fn verify_reads_parity_blocks_and_takes_directories() {
    let dir = tempdir();
    let ds = depots(6, dir.path());
    let ec = dir.path().join("ec");
    std::fs::create_dir(&ec).unwrap();
    let data = pattern(2 * 4 * (64 << 10), 8);
    let all: Vec<&DepotProc> = ds.iter().collect();
    let xnd = upload(&all, &ec, "f", &data, &["--ec", "4+2", "-b", "64K"]);
    let (ok, out, err) = lors(&["verify", ec.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("12 blocks of 2 stripes (4+2): 12 good"),
        "{out}"
    );
    let x = lors::xnd::load(&xnd).unwrap();
    flip_stored_byte(&ds, dir.path(), &x.parity[1], 4096 + 8);
    let (ok, out, err) = lors(&["verify", xnd.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&out);
    assert!(!ok, "{out}{err}");
    let (s, i) = x.parity[1].shard().unwrap();
    assert!(
        out.contains(&format!("parity block 9, stripe {s} block {i}")) && out.contains("corrupt"),
        "{out}"
    );
    assert!(
        !out.contains("LOST"),
        "one bad block of a stripe loses nothing: {out}"
    );
}

/// Many exNodes and one hung depot: `stat` probes them together and
/// `verify` reads them together, and `keep` probes them in batches, so the
/// hung depot costs one stall in all, not one per file (21 files took 34 s
/// one after another; verify and keep 2 s a file).
#[test]
fn stat_verify_and_keep_over_many_files_pay_for_a_hung_depot_once() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let many = dir.path().join("many");
    std::fs::create_dir(&many).unwrap();
    let all: Vec<&DepotProc> = ds.iter().collect();
    for i in 0..21 {
        upload(
            &all,
            &many,
            &format!("f{i:02}"),
            &pattern(50_000, i),
            &["-c", "2"],
        );
    }
    // The depot holding the first file's first replica: it holds some.
    let x = lors::xnd::load(&many.join("f00.xnd")).unwrap();
    let hung = (ds.iter())
        .find(|d| x.mappings[0].depot().as_ref() == Some(&d.addr))
        .unwrap();
    hung.signal("STOP");
    let m = many.to_str().unwrap();
    let limit = std::time::Duration::from_secs(20);
    let stat = lors_within(&["stat", "--expiring", "7d", m], limit);
    let verify = lors_within(&["verify", m], limit);
    let keep = lors_within(&["keep", "--once", m], limit);
    hung.signal("CONT");
    let (ok, err) = keep.expect("keep over 21 files with a hung depot probes them together");
    assert!(ok, "a pause within the grace is no loss: {err}");
    let (_, err) = stat.expect("21 files with a hung depot take about one probe timeout, not 21");
    assert!(!err.contains("panicked"), "{err}");
    let (ok, err) =
        verify.expect("21 files verified with a hung depot take about one stall, not 21");
    assert!(!ok && err.contains("cannot be read"), "{err}");
}

/// `lors keep` over an erasure-coded file with a dead depot and no depot
/// left to remake its blocks on: a line per stripe, each naming its own
/// stripe, bytes and margin (every line used to repeat the first
/// stripe's error); with a spare depot, the cycle counts the blocks it
/// remade (it used to say "0 new replicas").
#[test]
fn keep_speaks_of_each_short_stripe_and_counts_blocks_remade() {
    let dir = tempdir();
    let mut ds = depots(7, dir.path());
    let data = pattern(3 * 4 * (64 << 10) + 99, 31);
    let six: Vec<&DepotProc> = ds[..6].iter().collect();
    let xnd = upload(&six, dir.path(), "f", &data, &["--ec", "4+2", "-b", "64K"]);
    let x = lors::xnd::load(&xnd).unwrap();
    let dead = (ds.iter())
        .position(|d| Some(&d.addr) == x.mappings[0].depot().as_ref())
        .unwrap();
    let hit: std::collections::BTreeSet<u64> = (x.allocations())
        .filter(|m| m.depot().as_ref() == Some(&ds[dead].addr))
        .filter_map(|m| m.shard().map(|(s, _)| s))
        .collect();
    ds[dead].kill9();
    let five: Vec<&DepotProc> = (0..6).filter(|&i| i != dead).map(|i| &ds[i]).collect();
    let path = xnd.to_str().unwrap();
    let (ok, _, err) = lors(&[
        "keep",
        "--grace",
        "0",
        "--once",
        "--depot",
        &list(&five),
        path,
    ]);
    assert!(!ok, "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("not made whole"))
        .collect();
    assert_eq!(lines.len(), hit.len(), "{err}");
    for s in &hit {
        let e = lors_exnode::erasure::Erasure::of(&x).unwrap().unwrap();
        let r = e.stripe(*s);
        let want = format!(
            "stripe {s} (bytes {}..{}) can lose 1 more of its 6 blocks",
            r.start, r.end
        );
        assert!(lines.iter().any(|l| l.contains(&want)), "{want}: {err}");
    }
    let mut all = five.clone();
    all.push(&ds[6]);
    let (ok, out, err) = lors(&[
        "keep",
        "--grace",
        "0",
        "--once",
        "--depot",
        &list(&all),
        path,
    ]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "{out}{err}");
    let n = hit.len();
    assert!(out.contains(&format!("{n} blocks remade")), "{out}");
    assert!(
        err.contains(&format!("0 new replicas, {n} blocks remade")),
        "{err}"
    );
}

/// The documented ways to join an L-Bone are ones a depot accepts: it
/// refuses to send its token in clear to another machine, so no example
/// (docs, `lors depot --help`) registers over plain http:// without
/// `--insecure` (docs/lbone.md and the help once both did).
#[test]
fn no_example_registers_a_depot_over_plain_http() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut texts: Vec<(String, String)> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    texts.push((
        "README.md".into(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    ));
    let (_, help, _) = lors(&["depot", "--help"]);
    texts.push((
        "lors depot --help".into(),
        String::from_utf8_lossy(&help).into_owned(),
    ));
    for (name, text) in &texts {
        // A command continued over lines is one example.
        let joined = text.replace("\\\n", " ");
        for line in joined.lines().filter(|l| l.contains("--lbone http://")) {
            let url = line.split("--lbone http://").nth(1).unwrap_or("");
            let local = url.starts_with("127.0.0.1") || url.starts_with("localhost");
            assert!(
                local || line.contains("--insecure"),
                "{name}: an example the depot refuses: {line}"
            );
        }
    }
}

/// `route --keep-old -o` writes a second exNode sharing the blocks already
/// on the targets; trimming the original's copies there used to destroy
/// the new file's replicas. The new file holds its own references now.
#[test]
fn a_routed_copy_keeps_its_replicas_when_the_original_is_trimmed() {
    let dir = tempdir();
    let ds = depots(4, dir.path());
    let data = pattern(500_000, 12);
    let first: Vec<&DepotProc> = ds[..3].iter().collect();
    let f = upload(&first, dir.path(), "f", &data, &["-c", "2", "-b", "100K"]);
    let at_b = dir.path().join("at-b.xnd");
    let targets = list(&[&ds[2], &ds[3]]);
    let (ok, _, err) = lors(&[
        "route",
        "-q",
        "--keep-old",
        "--depot",
        &targets,
        "-o",
        at_b.to_str().unwrap(),
        f.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = lors(&[
        "trim",
        "-q",
        "--decrement",
        "--allow-holes",
        "--depot",
        &ds[2].addr,
        f.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_downloads(&at_b, &data, dir.path());
    let (ok, _, err) = lors(&["verify", at_b.to_str().unwrap()]);
    assert!(ok, "every replica of the routed copy is whole: {err}");
}

/// A `lors://HOST:PORT/…` URI names its L-Bone as `-H HOST:PORT` does:
/// HTTP when spoken there (it used to be taken for the legacy protocol and
/// fail with "bad status field (L-Bone error 0)").
#[test]
fn a_lors_uri_finds_the_lbone_on_its_http_port() {
    let dir = tempdir();
    let lb = LboneProc::start(&dir.path().join("lb"), &["--heartbeat", "1s"]);
    let _d = crate::lbone::located_depot(&dir.path().join("d"), &lb, "1G", &[]);
    let src = dir.path().join("src");
    let data = pattern(200_000, 4);
    std::fs::write(&src, &data).unwrap();
    // Once the depot is listed, as `-H` sees it.
    let t0 = std::time::Instant::now();
    loop {
        let probe = dir.path().join("probe.xnd");
        let (ok, _, err) = lors(&[
            "upload",
            "-q",
            "-c",
            "1",
            "-H",
            &lb.http,
            "-o",
            probe.to_str().unwrap(),
            src.to_str().unwrap(),
        ]);
        if ok {
            break;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "{err}");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let xnd = dir.path().join("u.xnd");
    // (lors://HOST//abs/path: an absolute path.)
    let uri = format!("lors://{}/{}?copies=1", lb.http, xnd.display());
    let (ok, _, err) = lors(&["upload", "-q", "-o", &uri, src.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_downloads(&xnd, &data, dir.path());
}

/// `lors upload DIR` says what to do instead (it used to fail with "Is a
/// directory (os error 21)"); `-o DIR/` puts the exNode in the directory,
/// named after the file (it used to upload, fail "not a regular file" and
/// release everything).
#[test]
fn upload_takes_a_directory_output_and_explains_a_directory_input() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &["--sync", "never"]);
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        &d.addr,
        "-o",
        "x.xnd",
        tree.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("is a directory") && err.contains("lors mount"),
        "{err}"
    );
    let src = dir.path().join("run42.dat");
    let data = pattern(150_000, 6);
    std::fs::write(&src, &data).unwrap();
    let xnds = dir.path().join("xnds");
    std::fs::create_dir(&xnds).unwrap();
    let (ok, _, err) = lors(&[
        "upload",
        "-q",
        "-c",
        "1",
        "--depot",
        &d.addr,
        "-o",
        xnds.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let xnd = xnds.join("run42.dat.xnd");
    assert_downloads(&xnd, &data, dir.path());
}

/// A share's `stat` shows when the share ends, not the owner's lease
/// (it showed the owner's 7 days for a one-hour share); downloading a
/// revoked share says so in one line and leaves nothing behind (it tried
/// every replica, printed a line each, and left a part file to "resume").
#[test]
fn a_share_shows_its_own_end_and_a_revoked_one_says_so_once() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &["--sync", "never"]);
    let data = pattern(400_000, 2);
    let f = upload(
        &[&d],
        dir.path(),
        "f",
        &data,
        &["-c", "1", "-b", "100K", "-d", "7d"],
    );
    let sh = dir.path().join("sh.xnd");
    let (ok, _, err) = lors(&[
        "share",
        "--expires",
        "1h",
        "-o",
        sh.to_str().unwrap(),
        f.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = lors(&["stat", "--json", sh.to_str().unwrap()]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let left = v["soonest_expiry_s"].as_i64().unwrap();
    assert!(
        (3500..=3600).contains(&left),
        "the share's hour, not the owner's week: {v}"
    );
    let (ok, _, err) = lors(&[
        "share",
        "--revoke",
        sh.to_str().unwrap(),
        "--owner",
        f.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let out = dir.path().join("out");
    let (ok, _, err) = lors(&[
        "download",
        "-o",
        out.to_str().unwrap(),
        sh.to_str().unwrap(),
    ]);
    assert!(!ok);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("access revoked or expired"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("out"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A depot paused for a moment is not a loss: `lors keep` waits out the
/// grace before copying its blocks elsewhere (a 2 s pause used to
/// re-replicate everything on it and strand the old copies), and once it
/// does, the old copies are freed when their depot answers again: the
/// depots end holding exactly what the exNode names.
#[test]
fn keep_waits_out_a_pause_and_frees_the_old_copies_when_the_depot_is_back() {
    let dir = tempdir();
    let ds = depots(4, dir.path());
    let data = pattern(400_000, 13);
    let first: Vec<&DepotProc> = ds[..3].iter().collect();
    // (Leases far from their end: no refresh is due while a depot sleeps.)
    let f = upload(
        &first,
        dir.path(),
        "f",
        &data,
        &["-c", "2", "-b", "100K", "-d", "7d"],
    );
    let path = f.to_str().unwrap();
    let all = list(&ds.iter().collect::<Vec<_>>());
    let paused = (ds[..3].iter())
        .position(|d| {
            lors::xnd::load(&f)
                .unwrap()
                .mappings
                .iter()
                .any(|m| m.depot().as_ref() == Some(&d.addr))
        })
        .unwrap();
    ds[paused].signal("STOP");
    let (ok, out, err) = lors(&["keep", "--once", "--depot", &all, path]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "a pause within the grace is no fault: {out}{err}");
    assert!(
        !out.contains("new replicas") && !out.contains("dropped"),
        "{out}"
    );
    ds[paused].signal("CONT");
    let (ok, out, err) = lors(&["keep", "--once", "--depot", &all, path]);
    assert!(
        ok && !String::from_utf8_lossy(&out).contains("new replicas"),
        "{err}"
    );
    assert!(
        !std::fs::read_to_string(&f)
            .unwrap()
            .contains("lors_silent_since"),
        "the mark went"
    );

    // Past a (short) grace, its blocks are copied elsewhere; its old
    // copies stay recorded until it answers, then go.
    ds[paused].signal("STOP");
    let grace = ["keep", "--once", "--grace", "1s", "--depot", &all, path];
    let (ok, _, err) = lors(&grace);
    assert!(ok, "{err}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (_, out, err) = lors(&grace);
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("new replicas"), "{out}{err}");
    ds[paused].signal("CONT");
    let (ok, _, err) = lors(&grace);
    assert!(ok, "{err}");
    assert_downloads(&f, &data, dir.path());
    assert_eq!(
        crate::copies::held(&ds, dir.path()),
        crate::copies::named(&ds, &[&f]),
        "the depots hold what the exNode names"
    );
}

/// An empty file kept with two copies is short of nothing: `stat
/// --expiring` left it out of its report (it flagged "0 of 2 copies" every
/// day).
#[test]
fn an_empty_file_is_not_under_its_copy_count() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let all: Vec<&DepotProc> = ds.iter().collect();
    let tree = dir.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    upload(&all, &tree, "empty", b"", &["-c", "2", "-d", "30d"]);
    let (ok, out, err) = lors(&["stat", "--expiring", "7d", tree.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "{out}{err}");
    assert!(!out.contains("empty.xnd"), "{out}");
    assert!(out.contains("0 under their copy count"), "{out}");
    let t = tree.to_str().unwrap();
    let (ok, out, err) = lors(&["keep", "--once", "--grace", "0", "-c", "2", t]);
    assert!(ok, "{err}");
    assert!(!String::from_utf8_lossy(&out).contains("empty"), "keep");
    let (ok, out, err) = lors(&["verify", t]);
    let out = String::from_utf8_lossy(&out);
    assert!(
        ok && out.contains("empty.xnd: empty, nothing to read"),
        "{out}{err}"
    );
}

/// An L-Bone that is down is said once, where it matters: not as a WARN
/// line repeating the error, and not by a keeper cycle over files that
/// need no new copy (it said so for each of 21 files).
#[test]
fn a_dead_lbone_is_said_once_and_only_when_it_is_needed() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let tree = dir.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..3 {
        upload(
            &[&ds[0]],
            &tree,
            &format!("f{i}"),
            &pattern(70_000, i),
            &["-c", "1"],
        );
    }
    let t = tree.to_str().unwrap();
    let down = ["-H", "127.0.0.1:1"];
    let (ok, out, err) = lors(&[&["keep", "--once", "--grace", "0"][..], &down, &[t]].concat());
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "{out}{err}");
    assert!(!err.contains("L-Bone") && !err.contains("WARN"), "{err}");
    let (ok, out, err) = lors(
        &[
            &["keep", "--once", "--grace", "0", "-c", "2"][..],
            &down,
            &[t],
        ]
        .concat(),
    );
    let out = String::from_utf8_lossy(&out);
    assert!(!ok, "{out}{err}");
    assert!(!err.contains("WARN") && !out.contains("WARN"), "{err}");
    let said = |f: &str| {
        (err.lines().chain(out.lines()))
            .filter(|l| l.contains(f) && l.contains("asking the L-Bone"))
            .count()
    };
    for f in ["f0.xnd", "f1.xnd", "f2.xnd"] {
        assert_eq!(said(f), 1, "{f}: {out}{err}");
    }
    let src = tree.join("f0");
    let (ok, _, err) = lors(
        &[
            &["upload", "-c", "1", "-o", "n.xnd"][..],
            &down,
            &[src.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("asking the L-Bone") && !err.contains("WARN"),
        "{err}"
    );
}
