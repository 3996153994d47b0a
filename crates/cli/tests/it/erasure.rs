//! Erasure-coded files (`lors upload --ec`) with real depot processes:
//! killed, hung and corrupt depots read around, repair, the other tools,
//! and what the LoRS 0.82 tools see of such an exNode.

use std::path::Path;
use std::time::Duration;

use crate::tools::used;
use crate::util::*;

/// 1.2 MiB in 64 KiB blocks at 6+3: three stripes and a short fourth.
fn data() -> Vec<u8> {
    pattern(3 * 6 * (64 << 10) + (64 << 10) + 1000, 43)
}

fn stat(xnd: &Path) -> String {
    let (_, out, err) = lors(&["stat", xnd.to_str().unwrap()]);
    String::from_utf8_lossy(&out).into_owned() + &err
}

fn download(xnd: &Path, out: &Path) -> (bool, String) {
    let _ = std::fs::remove_file(out);
    let (ok, _, err) = lors(&[
        "download",
        "-q",
        "--stall",
        "2s",
        "-o",
        out.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    (ok, err)
}

/// Three depots killed: the file reads back whole; repair onto three new
/// depots gives every stripe its margin of three again, so three more
/// can die.
#[test]
fn three_dead_depots_read_around_then_repair_restores_the_margin() {
    let dir = tempdir();
    let mut ds = depots(12, dir.path());
    let data = data();
    let first: Vec<&DepotProc> = ds[..9].iter().collect();
    let xnd = upload(
        &first,
        dir.path(),
        "f",
        &data,
        &["--ec", "6+3", "-b", "64K"],
    );
    let x = lors::xnd::load(&xnd).unwrap();
    assert_eq!((x.mappings.len(), x.parity.len()), (20, 12));
    assert!(
        stat(&xnd).contains("every stripe can lose 3 more blocks"),
        "{}",
        stat(&xnd)
    );
    let out = dir.path().join("out");
    for i in [0, 4, 8] {
        ds[i].kill9();
    }
    // Which stripes lose a block depends on where the upload placed them:
    // the three full ones always, the short last one only sometimes.
    let dead: Vec<&str> = [0, 4, 8].iter().map(|&i| ds[i].addr.as_str()).collect();
    let mut hit: Vec<u64> = (x.allocations())
        .filter(|m| m.depot().is_some_and(|d| dead.contains(&d.as_str())))
        .filter_map(|m| m.shard().map(|(s, _)| s))
        .collect();
    hit.sort();
    hit.dedup();
    let (ok, err) = download(&xnd, &out);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
    let st = stat(&xnd);
    assert!(st.contains("at margin 0: stripes 0, 1, 2"), "{st}");
    let spares = list(&ds[9..].iter().collect::<Vec<_>>());
    let live = list(&[&ds[1], &ds[2], &ds[3], &ds[5], &ds[6], &ds[7]]);
    let (ok, _, err) = lors(&[
        "augment",
        "--repair",
        "--depot",
        &format!("{live},{spares}"),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let repaired = format!("repaired {} stripes", hit.len());
    assert!(err.contains(&repaired), "{err}");
    let st = stat(&xnd);
    assert!(st.contains("every stripe can lose 3 more blocks"), "{st}");
    // Never two blocks of a stripe on one live depot.
    let y = lors::xnd::load(&xnd).unwrap();
    for s in 0..4u64 {
        let blocks = (x.allocations())
            .filter(|m| m.shard().is_some_and(|(t, _)| t == s))
            .count();
        let mut on: Vec<String> = (y.allocations())
            .filter(|m| m.shard().is_some_and(|(t, _)| t == s))
            .filter_map(|m| m.depot())
            .filter(|d| !dead.contains(&d.as_str()))
            .collect();
        // The short last stripe: two data blocks and its parity.
        assert_eq!(on.len(), blocks, "stripe {s}: {on:?}");
        on.sort();
        on.dedup();
        assert_eq!(on.len(), blocks, "stripe {s}: two blocks on one depot");
    }
    for i in [1, 5, 9] {
        ds[i].kill9();
    }
    let (ok, err) = download(&xnd, &out);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
}

/// A block whose bytes rotted on the depot's disk fails its checksum; the
/// download rebuilds it from the stripe and says so.
#[test]
fn a_corrupt_block_is_detected_and_decoded_around() {
    let dir = tempdir();
    let ds = depots(9, dir.path());
    let data = data();
    let all: Vec<&DepotProc> = ds.iter().collect();
    let xnd = upload(&all, dir.path(), "f", &data, &["--ec", "6+3", "-b", "64K"]);
    let x = lors::xnd::load(&xnd).unwrap();
    let victim = x.mappings[7].clone();
    flip_stored_byte(&ds, dir.path(), &victim, 5000);
    let out = dir.path().join("out");
    let (ok, _, err) = lors(&[
        "download",
        "-o",
        out.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
    assert!(
        err.contains("checksum mismatch"),
        "the damage is reported: {err}"
    );
    assert!(err.contains("parity"), "and the rebuild: {err}");
    // The repair finds it too, and makes it again elsewhere.
    let (ok, _, err) = lors(&[
        "augment",
        "--repair",
        "--depot",
        &list(&all),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("1 blocks made again"), "{err}");
    let (ok, err) = download(&xnd, &out);
    assert!(ok && std::fs::read(&out).unwrap() == data, "{err}");
}

/// A depot that accepts connections and never answers (SIGSTOP) costs the
/// stall time, not the network timeout: its blocks are rebuilt.
#[test]
fn a_hung_depot_is_read_around_by_parity() {
    let dir = tempdir();
    let ds = depots(9, dir.path());
    let data = data();
    let all: Vec<&DepotProc> = ds.iter().collect();
    let xnd = upload(&all, dir.path(), "f", &data, &["--ec", "6+3", "-b", "64K"]);
    let x = lors::xnd::load(&xnd).unwrap();
    let hung = (ds.iter())
        .find(|d| Some(&d.addr) == x.mappings[0].depot().as_ref())
        .unwrap();
    hung.signal("STOP");
    let out = dir.path().join("out");
    let r = lors_within(
        &[
            "download",
            "-q",
            "--stall",
            "2s",
            "-T",
            "120",
            "-o",
            out.to_str().unwrap(),
            xnd.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    hung.signal("CONT");
    let (ok, err) = r.expect("the download does not wait for the network timeout");
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
}

/// What the LoRS 0.82 tools read of an erasure-coded exNode: libexnode
/// takes the `<exnode:mapping>` elements and skips the `<exnode:parity>`
/// ones (unknown children of the root), so they see the data blocks — an
/// ordinary striped file — and nothing else. Uploaded with their MD5
/// checksum (`-k md5`), those blocks are what `lors_download` reads: the
/// file without its parity reads back whole, and no parity byte is ever
/// in a mapping.
#[test]
fn the_lors_tools_see_the_data_blocks_and_never_the_parity() {
    let dir = tempdir();
    let ds = depots(6, dir.path());
    let data = data();
    let all: Vec<&DepotProc> = ds.iter().collect();
    let xnd = upload(
        &all,
        dir.path(),
        "f",
        &data,
        &["--ec", "4+2", "-b", "64K", "-k", "md5"],
    );
    let text = std::fs::read_to_string(&xnd).unwrap();
    let x = lors::xnd::load(&xnd).unwrap();
    assert_eq!(text.matches("<exnode:mapping>").count(), x.mappings.len());
    assert_eq!(text.matches("<exnode:parity>").count(), x.parity.len());
    assert!(x.mappings.iter().all(|m| {
        m.function
            .as_ref()
            .is_some_and(|f| f.name == "checksum" && f.inner.is_empty())
    }));
    // The file as a reader that knows no erasure code takes it.
    let mut plain = x.clone();
    plain.parity.clear();
    plain.metadata.retain(|m| !m.name.starts_with("ec_"));
    let mut covered = 0;
    for m in &plain.mappings {
        assert_eq!(m.exnode_offset, covered, "data blocks tile the file");
        covered += m.logical_length;
    }
    assert_eq!(covered, data.len() as u64);
    let only = dir.path().join("plain.xnd");
    lors::xnd::save(&only, &plain).unwrap();
    let out = dir.path().join("out");
    let (ok, err) = download(&only, &out);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
}

/// Trim keeps every stripe readable unless told otherwise; refresh and
/// `--decrement` reach the parity blocks too; tools that would lose them
/// refuse the file.
#[test]
fn trim_refresh_and_the_other_tools_know_the_parity() {
    let dir = tempdir();
    let ds = depots(6, dir.path());
    let data = pattern(300_000, 7);
    let all: Vec<&DepotProc> = ds.iter().collect();
    let xnd = upload(&all, dir.path(), "f", &data, &["--ec", "4+2", "-b", "64K"]);
    let x = xnd.to_str().unwrap();
    let (ok, out, _) = lors(&["ls", x]);
    let out = String::from_utf8(out).unwrap();
    assert!(ok);
    assert!(
        out.contains("and 4 parity blocks (erasure code 4+2)"),
        "{out}"
    );
    assert!(out.contains("[parity 5 of stripe 1]"), "{out}");
    let (ok, out, _) = lors(&["refresh", "--json", "--by", "1h", x]);
    assert!(ok);
    assert!(String::from_utf8(out).unwrap().contains("\"refreshed\":9"));
    // Three depots' blocks would leave stripe 0 with 3 of the 4 it needs.
    let three = list(&[&ds[0], &ds[1], &ds[2]]);
    let (ok, _, err) = lors(&["trim", "--depot", &three, x]);
    assert!(!ok);
    assert!(
        err.contains("would leave stripe 0 (bytes 0..262144) with 3 of the 4 blocks it needs"),
        "{err}"
    );
    let two = list(&[&ds[0], &ds[1]]);
    let (ok, _, err) = lors(&["trim", "-q", "--decrement", "--depot", &two, x]);
    assert!(ok, "{err}");
    assert_eq!(
        used(&ds[0]) + used(&ds[1]),
        0,
        "their blocks, parity too, are freed"
    );
    assert!(stat(&xnd).contains("every stripe can lose 0 more blocks"));
    let out = dir.path().join("out");
    let (ok, err) = download(&xnd, &out);
    assert!(ok && std::fs::read(&out).unwrap() == data, "{err}");
    let (ok, _, err) = lors(&["route", "--depot", &ds[3].addr, x]);
    assert!(!ok && err.contains("erasure-coded"), "{err}");
}

/// `lors route` moves every block of a coded file, parity too, keeping
/// each stripe on as many depots; `lors disseminate` reads its data
/// blocks and gives a site a whole copy that reads with every coded
/// block's depot gone.
#[test]
fn route_moves_every_block_and_disseminate_copies_the_data_to_a_site() {
    let dir = tempdir();
    let mut ds = depots(14, dir.path());
    let data = pattern(5 * 4 * (64 << 10) + 12_345, 9);
    let first: Vec<&DepotProc> = ds[..6].iter().collect();
    let xnd = upload(
        &first,
        dir.path(),
        "f",
        &data,
        &["--ec", "4+2", "-b", "64K"],
    );
    let x = xnd.to_str().unwrap();
    let blocks = lors::xnd::load(&xnd).unwrap().allocations().count();
    let targets = list(&ds[6..12].iter().collect::<Vec<_>>());
    let five = list(&ds[6..11].iter().collect::<Vec<_>>());
    let (ok, _, err) = lors(&["route", "--depot", &five, x]);
    assert!(!ok);
    assert!(
        err.contains("erasure-coded 4+2: its blocks go to at least 6 depots"),
        "{err}"
    );
    let (ok, _, err) = lors(&["route", "-c", "2", "--depot", &targets, x]);
    assert!(!ok && err.contains("one copy of each block"), "{err}");
    assert_eq!(lors::xnd::load(&xnd).unwrap().allocations().count(), blocks);
    // One of six targets dead: no stripe fits, and nothing is left behind.
    ds[13].kill9();
    let with_dead = format!("{five},{}", ds[13].addr);
    let (ok, _, err) = lors(&["route", "-q", "--depot", &with_dead, x]);
    assert!(
        !ok && err.contains("could not be stored on any depot"),
        "{err}"
    );
    assert_eq!(lors::xnd::load(&xnd).unwrap().allocations().count(), blocks);
    for d in &ds[6..11] {
        assert_eq!(used(d), 0, "a failed route frees what it copied");
    }
    let (ok, _, err) = lors(&["route", "-q", "--depot", &targets, x]);
    assert!(ok, "{err}");
    let y = lors::xnd::load(&xnd).unwrap();
    assert_eq!(y.allocations().count(), blocks, "each block once");
    for d in &ds[..6] {
        assert_eq!(used(d), 0, "the old blocks are freed");
    }
    let new: Vec<&str> = ds[6..12].iter().map(|d| d.addr.as_str()).collect();
    for s in 0..6u64 {
        let mut on: Vec<String> = (y.allocations())
            .filter(|m| m.shard().is_some_and(|(t, _)| t == s))
            .filter_map(|m| m.depot())
            .collect();
        assert!(on.iter().all(|d| new.contains(&d.as_str())), "{on:?}");
        let n = on.len();
        on.sort();
        on.dedup();
        assert_eq!(on.len(), n, "stripe {s}: two blocks on one depot");
    }
    assert!(stat(&xnd).contains("every stripe can lose 2 more blocks"));
    let out = dir.path().join("out");
    let (ok, err) = download(&xnd, &out);
    assert!(ok && std::fs::read(&out).unwrap() == data, "{err}");
    // A site far away gets a whole copy of the data.
    let (ok, _, err) = lors(&["disseminate", "-q", x, "--to", &ds[12].addr]);
    assert!(ok, "{err}");
    let z = lors::xnd::load(&xnd).unwrap();
    assert_eq!(z.parity, y.parity);
    assert_eq!(z.mappings.len(), 2 * y.mappings.len());
    for d in &mut ds[6..12] {
        d.kill9();
    }
    let (ok, err) = download(&xnd, &out);
    assert!(ok && std::fs::read(&out).unwrap() == data, "{err}");
}

/// `lors keep` heals a coded file: one cycle after a depot is lost, every
/// stripe has its full margin again, on depots holding none of it.
#[test]
fn keep_remakes_a_lost_depots_blocks_and_restores_the_margin() {
    let dir = tempdir();
    let mut ds = depots(8, dir.path());
    let data = pattern(4 * 4 * (64 << 10) + 777, 21);
    let first: Vec<&DepotProc> = ds[..6].iter().collect();
    let xnd = upload(
        &first,
        dir.path(),
        "f",
        &data,
        &["--ec", "4+2", "-b", "64K"],
    );
    let x = xnd.to_str().unwrap();
    ds[2].kill9();
    assert!(
        stat(&xnd).contains("every stripe can lose 1 more block"),
        "{}",
        stat(&xnd)
    );
    let all = list(&ds.iter().collect::<Vec<_>>());
    let (ok, _, err) = lors(&["keep", "--grace", "0", "--once", "--depot", &all, x]);
    assert!(ok, "{err}");
    let st = stat(&xnd);
    assert!(st.contains("every stripe can lose 2 more blocks"), "{st}");
    let y = lors::xnd::load(&xnd).unwrap();
    for s in 0..5u64 {
        let mut on: Vec<String> = (y.allocations())
            .filter(|m| m.shard().is_some_and(|(t, _)| t == s))
            .filter_map(|m| m.depot())
            .filter(|d| *d != ds[2].addr)
            .collect();
        let n = on.len();
        on.sort();
        on.dedup();
        assert_eq!(on.len(), n, "stripe {s}: two blocks on one depot");
    }
    ds[3].kill9();
    ds[4].kill9();
    let out = dir.path().join("out");
    let (ok, err) = download(&xnd, &out);
    assert!(ok && std::fs::read(&out).unwrap() == data, "{err}");
}

/// `--ec` from every source, and what cannot work refused up front.
#[test]
fn ec_settings_come_from_flags_uri_env_and_xndrc_and_bad_ones_are_refused() {
    let dir = tempdir();
    let ds = depots(5, dir.path());
    let src = dir.path().join("f");
    std::fs::write(&src, pattern(100_000, 1)).unwrap();
    let all = list(&ds.iter().collect::<Vec<_>>());
    let xnd = dir.path().join("f.xnd");
    let up = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec![
            "upload",
            "-q",
            "--force",
            "--small-blocks",
            "--depot",
            &all,
            "-b",
            "16K",
        ];
        args.extend_from_slice(extra);
        args.extend(["-o", xnd.to_str().unwrap(), src.to_str().unwrap()]);
        let (ok, _, err) = lors_env(&args, env);
        let parity = ok.then(|| lors::xnd::load(&xnd).unwrap().parity.len());
        (parity, err)
    };
    // 100,000 bytes are 7 blocks of 16K: 3 stripes of 3+2, 2 of 4+1.
    assert_eq!(up(&["--ec", "3+2"], &[]).0, Some(3 * 2));
    assert_eq!(up(&[], &[("LORS_EC", "4+1")]).0, Some(2));
    // A flag for copies beats an erasure code from below.
    assert_eq!(up(&["-c", "2"], &[("LORS_EC", "4+1")]).0, Some(0));
    let uri = format!("lors:///{}?ec=2+1", xnd.display());
    let (ok, _, err) = lors(&[
        "upload",
        "-q",
        "--force",
        "--small-blocks",
        "--depot",
        &all,
        "-b",
        "16K",
        "-o",
        &uri,
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(lors::xnd::load(&xnd).unwrap().parity.len(), 4);
    let rc = dir.path().join("xndrc");
    std::fs::write(&rc, "EC 3+1\n").unwrap();
    assert_eq!(up(&["--xndrc", rc.to_str().unwrap()], &[]).0, Some(3));
    let (none, err) = up(&["--ec", "4+2"], &[]);
    assert!(none.is_none());
    assert!(
        err.contains("a 4+2 stripe needs 6 distinct depots but only 5 are usable"),
        "{err}"
    );
    for bad in ["6", "0+2", "3+0", "300+1"] {
        let (none, err) = up(&["--ec", bad], &[]);
        assert!(
            none.is_none() && err.contains("is not an erasure code"),
            "{bad}: {err}"
        );
    }
}
