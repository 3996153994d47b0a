//! `lors disseminate` against real depots on 127.0.0.1: every site ends
//! with a byte-identical full replica; failing sites are dropped without
//! stopping the others and leave nothing behind; an exNode's data is
//! relayed from its depots; a second run completes what the first missed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lors_exnode::ExNode;

use crate::util::{DepotProc, lors, lors_within, pattern, tempdir};

fn depots(n: usize, dir: &Path, extra: &[&str]) -> Vec<DepotProc> {
    (0..n)
        .map(|i| {
            let mut args = vec!["--sync", "never"];
            args.extend_from_slice(extra);
            DepotProc::start(&dir.join(format!("site{i}")), &args)
        })
        .collect()
}

/// `--to` for these depots.
fn to_list<'a>(ds: impl IntoIterator<Item = &'a DepotProc>) -> String {
    let addrs: Vec<&str> = ds.into_iter().map(|d| d.addr.as_str()).collect();
    addrs.join(",")
}

fn read_x(p: &Path) -> ExNode {
    lors_exnode::xml::parse(&std::fs::read(p).unwrap()).unwrap()
}

/// Downloads the replica on `depot` alone (an exNode of its mappings only)
/// and checks it is `data`.
fn assert_replica(xnd: &Path, depot: &str, data: &[u8]) {
    let mut x = read_x(xnd);
    x.mappings.retain(|m| m.depot().as_deref() == Some(depot));
    assert!(!x.mappings.is_empty(), "no mapping on {depot}");
    let dir = xnd.parent().unwrap();
    let one = dir.join(format!("only-{}.xnd", depot.replace(':', "_")));
    lors::xnd::save(&one, &x).unwrap();
    let out = dir.join("replica.out");
    let (ok, _, err) = lors(&[
        "download",
        "--quiet",
        "-o",
        out.to_str().unwrap(),
        one.to_str().unwrap(),
    ]);
    assert!(ok, "replica on {depot}: {err}");
    assert!(
        std::fs::read(&out).unwrap() == data,
        "replica on {depot} differs"
    );
}

/// A test file `name` of `len` bytes in `dir`: its bytes and path.
fn source(dir: &Path, name: &str, len: usize, seed: u8) -> (Vec<u8>, PathBuf) {
    let data = pattern(len, seed);
    let src = dir.join(name);
    std::fs::write(&src, &data).unwrap();
    (data, src)
}

/// The `--json` summary: the last line of stdout.
fn summary(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let last = text.lines().last().expect("a summary line");
    serde_json::from_str(last).unwrap()
}

fn disseminate(args: &[&str]) -> (bool, serde_json::Value, String) {
    let mut a = vec!["disseminate", "--json"];
    a.extend_from_slice(args);
    let (ok, out, err) = lors(&a);
    (ok, summary(&out), err)
}

#[test]
fn a_file_reaches_every_site_whole_and_leaves_the_source_about_once() {
    let dir = tempdir();
    let ds = depots(4, dir.path(), &[]);
    let (data, src) = source(dir.path(), "run42.dat", 6 << 20, 41);
    let xnd = dir.path().join("run42.xnd");
    let (ok, s, err) = disseminate(&[
        src.to_str().unwrap(),
        "--to",
        &to_list(&ds),
        "-b",
        "256K",
        "-o",
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    for d in &ds {
        assert_replica(&xnd, &d.addr, &data);
    }
    let size = data.len() as u64;
    // Each block leaves the client once; the sites relay the other copies.
    assert_eq!(s["source_bytes"], size, "{s}");
    assert_eq!(s["relayed_bytes"], 3 * size, "{s}");
    let sites = s["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 4);
    for site in sites {
        assert_eq!(site["complete"], true, "{site}");
        assert_eq!(site["received"], size, "{site}");
        assert!(
            site["relayed"].as_u64().unwrap() > 0,
            "every site relays: {site}"
        );
    }
    // 4 replicas of 24 blocks, nothing else.
    assert_eq!(read_x(&xnd).mappings.len(), 4 * 24);
}

#[test]
fn unicast_sends_everything_from_the_client() {
    let dir = tempdir();
    let ds = depots(3, dir.path(), &[]);
    let (data, src) = source(dir.path(), "u.dat", 2 << 20, 42);
    let (ok, s, err) = disseminate(&[
        src.to_str().unwrap(),
        "--to",
        &to_list(&ds),
        "-b",
        "256K",
        "--unicast",
    ]);
    assert!(ok, "{err}");
    assert_eq!(s["source_bytes"], 3 * data.len() as u64, "{s}");
    assert_eq!(s["relayed_bytes"], 0, "{s}");
    let xnd = PathBuf::from(format!("{}.xnd", src.display()));
    for d in &ds {
        assert_replica(&xnd, &d.addr, &data);
    }
}

#[test]
fn failing_sites_are_dropped_the_others_finish_and_a_rerun_completes_them() {
    let dir = tempdir();
    let ds = depots(3, dir.path(), &[]);
    // A site that fills up part way through: its depot refuses more.
    let small = DepotProc::start(
        &dir.path().join("small"),
        &["--sync", "never", "--size", "1M"],
    );
    // A site that stops answering (frozen with its sockets open).
    let frozen = DepotProc::start(&dir.path().join("frozen"), &["--sync", "never"]);
    frozen.signal("STOP");
    let (data, src) = source(dir.path(), "f.dat", 4 << 20, 43);
    let xnd = dir.path().join("f.xnd");
    let list = to_list(ds.iter().chain([&small, &frozen]));
    let args = [
        "disseminate",
        "--json",
        src.to_str().unwrap(),
        "--to",
        &list,
        "-b",
        "256K",
        "--stall",
        "2s",
        "-o",
        xnd.to_str().unwrap(),
    ];
    let (ok, err) = lors_within(&args, Duration::from_secs(120))
        .expect("a frozen site must not hang the dissemination");
    assert!(!ok, "two sites failed: the command says so");
    assert!(
        err.contains("2 of 5 sites did not get a full replica"),
        "{err}"
    );
    assert!(
        err.contains(&small.addr) && err.contains(&frozen.addr),
        "{err}"
    );
    assert!(err.contains("run the same command on"), "{err}");
    // The others hold full replicas, and only they are in the exNode.
    for d in &ds {
        assert_replica(&xnd, &d.addr, &data);
    }
    let x = read_x(&xnd);
    assert!(
        (x.mappings.iter()).all(
            |m| m.depot() != Some(small.addr.clone()) && m.depot() != Some(frozen.addr.clone())
        ),
        "incomplete sites are not in the exNode"
    );
    // What the small site took was released, not left to its lease.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let used = rt.block_on(async {
        let mut c = small.connect().await;
        c.status("1", "ibp").await.map(|s| s.used_hard)
    });
    assert_eq!(
        used.ok(),
        Some(0),
        "the small site's partial copies are released"
    );
    // The frozen site comes back: running again on the exNode completes it
    // (and the small one still cannot hold the file), relayed from the sites
    // that have it, not from the client.
    frozen.signal("CONT");
    let (ok, s, err) = disseminate(&[
        xnd.to_str().unwrap(),
        "--to",
        &to_list(ds.iter().chain([&frozen])),
    ]);
    assert!(ok, "{err}");
    assert_eq!(s["source_bytes"], 0, "{s}");
    assert_eq!(s["relayed_bytes"], data.len() as u64, "{s}");
    assert_replica(&xnd, &frozen.addr, &data);
}

#[test]
fn an_exnode_is_relayed_from_its_depots_not_from_the_client() {
    let dir = tempdir();
    let origins = depots(2, dir.path(), &[]);
    let (data, src) = source(dir.path(), "o.dat", 3 << 20, 44);
    let xnd = dir.path().join("o.xnd");
    let mut up = vec![
        "upload",
        "--quiet",
        "-c",
        "1",
        "-b",
        "512K",
        "-o",
        xnd.to_str().unwrap(),
    ];
    for d in &origins {
        up.extend(["--depot", d.addr.as_str()]);
    }
    up.push(src.to_str().unwrap());
    let (ok, _, err) = lors(&up);
    assert!(ok, "{err}");
    let before = read_x(&xnd).mappings.len();
    let dir2 = tempdir();
    let sites = depots(3, dir2.path(), &[]);
    let out = dir.path().join("o-sites.xnd");
    let (ok, s, err) = disseminate(&[
        xnd.to_str().unwrap(),
        "--to",
        &to_list(&sites),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(s["source_bytes"], 0, "the client moved no data: {s}");
    assert_eq!(s["relayed_bytes"], 3 * data.len() as u64, "{s}");
    for d in &sites {
        assert_replica(&out, &d.addr, &data);
    }
    // The input's replicas stay named, the new ones follow.
    assert_eq!(read_x(&out).mappings.len(), before + 3 * before);
}

#[test]
fn bad_arguments_are_refused_with_what_to_do() {
    let dir = tempdir();
    let ds = depots(1, dir.path(), &[]);
    let (ok, _, err) = lors(&["disseminate", "/nonexistent/file", "--to", &ds[0].addr]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/file"), "{err}");
    let f = dir.path().join("x.dat");
    std::fs::write(&f, b"x").unwrap();
    // An exNode in the way is not overwritten: it may name the only copy
    // of other data.
    let other = dir.path().join("x.dat.xnd");
    std::fs::write(&other, b"<exnode/>").unwrap();
    let (ok, _, err) = lors(&["disseminate", f.to_str().unwrap(), "--to", &ds[0].addr]);
    assert!(!ok);
    assert!(
        err.contains("already exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(&other).unwrap(), b"<exnode/>");
    let (ok, _, err) = lors(&[
        "disseminate",
        f.to_str().unwrap(),
        "--to",
        &ds[0].addr,
        "--force",
    ]);
    assert!(ok, "{err}");
    let twice = format!("{0},{0}", ds[0].addr);
    let (ok, _, err) = lors(&["disseminate", f.to_str().unwrap(), "--to", &twice]);
    assert!(!ok);
    assert!(err.contains("twice"), "{err}");
}
