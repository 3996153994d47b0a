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
    assert_eq!(lors::manage::copies_policy(&x), Some(2));
    let out = dir.path().join("out");
    let (ok, _, err) = lors(&[
        "download",
        "-q",
        "-o",
        out.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);

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
    assert_eq!(lors::manage::copies_policy(&x), Some(1));
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
    for cmd in [&["ls"][..], &["stat"], &["verify"], &["keep", "--once"]] {
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

/// Many exNodes and one hung depot: `stat` probes them together, so the
/// hung depot costs one probe timeout in all, not one per file (21 files
/// took 34 s one after another).
#[test]
fn stat_over_many_files_pays_for_a_hung_depot_once() {
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
    ds[0].signal("STOP");
    let args = ["stat", "--expiring", "7d", many.to_str().unwrap()];
    let r = lors_within(&args, std::time::Duration::from_secs(20));
    ds[0].signal("CONT");
    let (_, err) = r.expect("21 files with a hung depot take about one probe timeout, not 21");
    assert!(!err.contains("panicked"), "{err}");
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
    let (ok, _, err) = lors(&["keep", "--once", "--depot", &list(&five), path]);
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
    let (ok, out, err) = lors(&["keep", "--once", "--depot", &list(&all), path]);
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
