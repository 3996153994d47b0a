//! Copies of an exNode — one made with `cp`, one with `lors cp` — trimmed,
//! routed, overwritten through the mount and removed with `lors rm`: the
//! others always download byte-exact, and the depots end holding exactly
//! what the remaining exNodes name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::fuse::Mount;
use crate::util::*;

/// The allocations each depot holds: the data files under its directory.
pub(crate) fn held(ds: &[DepotProc], dir: &Path) -> BTreeMap<String, BTreeSet<u64>> {
    (ds.iter().enumerate())
        .map(|(i, d)| (d.addr.clone(), held_in(&dir.join(format!("d{i}")))))
        .collect()
}

/// The allocations the depot whose directory is `depot` holds.
pub(crate) fn held_in(depot: &Path) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    for sub in std::fs::read_dir(depot.join("data"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for f in std::fs::read_dir(sub.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            if let Ok(id) = u64::from_str_radix(&name, 16)
                && name.len() == 16
            {
                ids.insert(id);
            }
        }
    }
    ids
}

/// The allocations the exNodes `xnds` name, by depot (every depot of `ds`
/// listed, naming none or some).
pub(crate) fn named(ds: &[DepotProc], xnds: &[&PathBuf]) -> BTreeMap<String, BTreeSet<u64>> {
    let mut out: BTreeMap<String, BTreeSet<u64>> = ds
        .iter()
        .map(|d| (d.addr.clone(), BTreeSet::new()))
        .collect();
    out.extend(named_in(xnds));
    out
}

/// The allocations the exNodes `xnds` name, by the depots they name.
pub(crate) fn named_in(xnds: &[&PathBuf]) -> BTreeMap<String, BTreeSet<u64>> {
    let mut out: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for p in xnds {
        let x = lors::xnd::load(p).unwrap();
        for m in x.allocations() {
            let cap = m.read.as_ref().unwrap();
            let id: u64 = cap.typekey.parse().unwrap();
            out.entry(cap.address()).or_default().insert(id);
        }
    }
    out
}

/// Each of `live` downloads as its data, and the depots hold what they
/// name and nothing else.
pub(crate) fn check(ds: &[DepotProc], dir: &Path, live: &[(&PathBuf, &[u8])], after: &str) {
    for (xnd, data) in live {
        eprintln!("after {after}: {}", xnd.display());
        crate::util::assert_downloads(xnd, data, dir);
    }
    let xnds: Vec<&PathBuf> = live.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        held(ds, dir),
        named(ds, &xnds),
        "after {after}: what the depots hold"
    );
}

#[test]
fn copies_of_an_exnode_never_destroy_each_other() {
    let dir = tempdir();
    let ds = depots(4, dir.path());
    let x = dir.path().join("x");
    std::fs::create_dir(&x).unwrap();
    let data = pattern(600_000, 77);
    let first: Vec<&DepotProc> = ds[..3].iter().collect();
    let f = upload(&first, &x, "f", &data, &["-c", "2", "-b", "100K"]);
    std::fs::remove_file(x.join("f")).unwrap();
    let c1 = x.join("c1.xnd");
    let c2 = x.join("c2.xnd");
    std::fs::copy(&f, &c1).unwrap();
    let (ok, _, err) = lors(&["cp", f.to_str().unwrap(), c2.to_str().unwrap()]);
    assert!(ok, "{err}");
    check(
        &ds,
        dir.path(),
        &[(&f, &data), (&c1, &data), (&c2, &data)],
        "the copies",
    );

    // The cp copy trimmed, freeing what it drops: the others keep theirs.
    let (ok, _, err) = lors(&[
        "trim",
        "-q",
        "--decrement",
        "--depot",
        &ds[0].addr,
        c1.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    check(
        &ds,
        dir.path(),
        &[(&f, &data), (&c1, &data), (&c2, &data)],
        "trim of the cp copy",
    );

    // The lors copy moved onto other depots.
    let targets = list(&[&ds[2], &ds[3]]);
    let (ok, _, err) = lors(&["route", "-q", "--depot", &targets, c2.to_str().unwrap()]);
    assert!(ok, "{err}");
    check(
        &ds,
        dir.path(),
        &[(&f, &data), (&c1, &data), (&c2, &data)],
        "route of the lors copy",
    );

    // The original, and a new cp copy of it, overwritten through the mount.
    let fresh = pattern(600_000, 78);
    let other = pattern(300_000, 79);
    if Path::new("/dev/fuse").exists() {
        let c3 = x.join("c3.xnd");
        std::fs::copy(&f, &c3).unwrap();
        let m = dir.path().join("m");
        std::fs::create_dir(&m).unwrap();
        let mut mount = Mount::start(&x, &m, &["--depot", &list(&first)]);
        std::fs::write(m.join("f"), &fresh).unwrap();
        std::fs::write(m.join("c3"), &other).unwrap();
        assert!(mount.stop().success());
        let live = [(&f, &fresh[..]), (&c1, &data), (&c2, &data), (&c3, &other)];
        check(&ds, dir.path(), &live, "overwrites through the mount");
        let (ok, _, err) = lors(&["rm", "-q", c3.to_str().unwrap()]);
        assert!(ok, "{err}");
        check(
            &ds,
            dir.path(),
            &[(&f, &fresh), (&c1, &data), (&c2, &data)],
            "rm of the overwritten copy",
        );
    } else {
        eprintln!("skipped the mount's part: /dev/fuse is absent");
    }

    // Removed: the original and the cp copy, then the last one.
    let (ok, _, err) = lors(&["rm", "-q", f.to_str().unwrap(), c1.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(!f.exists() && !c1.exists());
    check(&ds, dir.path(), &[(&c2, &data)], "rm of two");
    let (ok, _, err) = lors(&["rm", "-q", c2.to_str().unwrap()]);
    assert!(ok, "{err}");
    check(&ds, dir.path(), &[], "rm of the last");
    let left: Vec<_> = std::fs::read_dir(&x)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the exNodes' directory: {left:?}");
}

/// `lors upload --force` over an exNode releases what the old one named
/// once the new one is saved — it used to leave it on the depots, named by
/// nothing, until the leases ended — and a copy (made with `cp` or `lors
/// cp`) of the file it replaced keeps its data.
#[test]
fn upload_force_releases_what_it_replaced_and_spares_copies() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let x = dir.path().join("x");
    std::fs::create_dir(&x).unwrap();
    let all: Vec<&DepotProc> = ds.iter().collect();
    let (old, new) = (pattern(300_000, 1), pattern(200_000, 2));
    let f = upload(&all, &x, "f", &old, &["-c", "2", "-b", "64K"]);
    let (outside, lcp) = (x.join("outside.xnd"), x.join("lcp.xnd"));
    std::fs::copy(&f, &outside).unwrap();
    let (ok, _, err) = lors(&["cp", f.to_str().unwrap(), lcp.to_str().unwrap()]);
    assert!(ok, "{err}");
    let src = x.join("new");
    std::fs::write(&src, &new).unwrap();
    let force = |over: &PathBuf| {
        let (ok, _, err) = lors(&[
            "upload",
            "--depot",
            &list(&all),
            "-c",
            "1",
            "--force",
            "-o",
            over.to_str().unwrap(),
            src.to_str().unwrap(),
        ]);
        assert!(ok && err.contains("replaced"), "{err}");
    };
    force(&outside);
    check(
        &ds,
        dir.path(),
        &[(&f, &old), (&lcp, &old), (&outside, &new)],
        "over a cp copy",
    );
    force(&f);
    check(
        &ds,
        dir.path(),
        &[(&f, &new), (&lcp, &old), (&outside, &new)],
        "over the original",
    );
    force(&lcp);
    check(
        &ds,
        dir.path(),
        &[(&f, &new), (&lcp, &new), (&outside, &new)],
        "over the last",
    );
}
