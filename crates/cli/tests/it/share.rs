//! `lors share`: a shared exNode reads through IBP aliases, carries no key
//! that writes or manages anything, reaches only its range, and stops
//! working when revoked or expired while the owner's goes on.

use std::path::Path;

use lors_ibp::caps::Capability;

use crate::util::{DepotProc, Raw, depots, lors, pattern, tempdir, upload};

/// Every capability an exNode names, as URLs.
fn caps(x: &Path) -> Vec<Capability> {
    let x = lors::xnd::load(x).unwrap();
    x.mappings
        .iter()
        .flat_map(|m| [&m.read, &m.write, &m.manage])
        .flatten()
        .cloned()
        .collect()
}

fn download(x: &Path) -> (bool, Vec<u8>, String) {
    lors(&["download", "-q", "-o", "-", x.to_str().unwrap()])
}

/// What the depot answers each request that would change something,
/// made with `cap`'s key: none may succeed.
fn try_to_change(cap: &Capability) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tok = format!("{} {}", cap.key_token(), cap.typekey);
        let mut out = Vec::new();
        for line in [
            format!("1 13 {tok} 0 4 10\n"),        // WRITE
            format!("1 2 {tok} 4 10\n"),           // STORE
            format!("1 9 {tok} 43 1 0 1 2 10\n"),  // MANAGE CHNG
            format!("1 9 {tok} 42 1 10\n"),        // MANAGE DECR
            format!("1 9 {tok} 41 1 10\n"),        // MANAGE INCR
            format!("1 9 {tok} 45 0 10\n"),        // TRUNCATE
            format!("1 14 {tok} 0 0 0 10\n"),      // ALIAS_ALLOCATE
            format!("1 15 {tok} 42 1 {tok} 10\n"), // ALIAS_MANAGE DECR
            format!("1 16 {tok} 10\n"),            // RENAME
        ] {
            let mut r = Raw::connect(&cap.address()).await;
            r.send(line.as_bytes()).await;
            out.push(format!("{} → {}", line.trim(), r.line().await.trim()));
        }
        out
    })
}

/// LOAD of `len` bytes at `off` through `cap`: the data or the reply line.
fn load(cap: &Capability, off: u64, len: usize) -> Result<Vec<u8>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut r = Raw::connect(&cap.address()).await;
        let tok = format!("{} {}", cap.key_token(), cap.typekey);
        crate::lstore::load(&mut r, &tok, off, len).await
    })
}

/// (f) A share downloads; nothing in it writes or manages; a range limits
/// it; revoked, it fails with a clear error while the owner's still reads.
#[test]
fn a_share_reads_only_what_it_names_until_revoked() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let data = pattern((3 << 20) + 17, 7);
    let owner = upload(
        &[&ds[0], &ds[1]],
        dir.path(),
        "f",
        &data,
        &["-c", "2", "-b", "1M"],
    );
    let o = owner.to_str().unwrap();
    let shared = dir.path().join("s.xnd");
    let s = shared.to_str().unwrap();
    let (ok, _, err) = lors(&["share", "--expires", "1h", "-o", s, o]);
    assert!(ok, "{err}");
    assert!(err.contains("revoke with: lors share --revoke"), "{err}");
    let (ok, got, err) = download(&shared);
    assert!(ok && got == data, "{err}");

    // Read capabilities only, none of them the owner's, and every change
    // refused.
    let theirs = caps(&shared);
    let mine: Vec<String> = caps(&owner).iter().map(|c| c.key_token()).collect();
    let text = std::fs::read_to_string(&shared).unwrap();
    assert_eq!(theirs.len(), 8, "one alias per replica");
    for c in &theirs {
        assert_eq!(c.kind, lors_ibp::caps::CapKind::Read);
        assert!(!mine.contains(&c.key_token()));
        for reply in try_to_change(c) {
            assert!(reply.contains("→ -"), "{reply}");
        }
    }
    for k in caps(&owner) {
        assert!(
            !text.contains(k.key.expose()),
            "an owner's key is in the share"
        );
    }

    // A range: exactly those bytes, and the keys reach no further.
    let part = dir.path().join("part.xnd");
    let (ok, _, err) = lors(&["share", "--range", "1M:1M", "-o", part.to_str().unwrap(), o]);
    assert!(ok, "{err}");
    let (ok, got, err) = download(&part);
    assert!(ok && got[..] == data[1 << 20..2 << 20], "{err}");
    let (ok, _, err) = lors(&[
        "share",
        "--range",
        "100:1000",
        "-o",
        part.to_str().unwrap(),
        o,
    ]);
    assert!(!ok);
    assert!(err.contains("--range 0:1048576 covers it"), "{err}");
    let raw = upload(
        &[&ds[0]],
        dir.path(),
        "raw",
        &data,
        &["-n", "-c", "1", "-b", "1M"],
    );
    let (ok, _, err) = lors(&[
        "share",
        "--range",
        "1000:2000000",
        "-o",
        part.to_str().unwrap(),
        raw.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, got, err) = download(&part);
    assert!(ok && got[..] == data[1000..2_001_000], "{err}");
    let first = &caps(&part)[0];
    assert_eq!(load(first, 0, 4).unwrap(), data[1000..1004]);
    let window = (1 << 20) - 1000;
    assert!(load(first, window - 1, 1).is_ok());
    assert!(load(first, window - 1, 2).unwrap_err().starts_with('-'));

    // Revoked: the share fails, clearly; the owner's works.
    let other = upload(&[&ds[0]], dir.path(), "g", b"other", &["-c", "1"]);
    let (ok, _, err) = lors(&["share", "--revoke", s, "--owner", other.to_str().unwrap()]);
    assert!(
        !ok && err.contains("not the one this share was made from"),
        "{err}"
    );
    let (ok, _, err) = lors(&["share", "--revoke", s, "--owner", o]);
    assert!(ok, "{err}");
    assert!(err.contains("8 aliases revoked"), "{err}");
    let (ok, _, err) = download(&shared);
    assert!(!ok && err.contains("access revoked or expired"), "{err}");
    let (ok, got, err) = download(&owner);
    assert!(ok && got == data, "{err}");
    // Again: nothing left to do, and no error.
    let (ok, _, err) = lors(&["share", "--revoke", s, "--owner", o]);
    assert!(ok && err.contains("8 already gone"), "{err}");
}

/// A share's lease ends on its own (the owner's does not), and can be
/// renewed before it does.
#[test]
fn a_share_expires_unless_renewed() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let data = pattern(300_000, 9);
    let owner = upload(&[&ds[0]], dir.path(), "f", &data, &["-c", "1", "-b", "64K"]);
    let o = owner.to_str().unwrap();
    let (short, kept) = (dir.path().join("short.xnd"), dir.path().join("kept.xnd"));
    for x in [&short, &kept] {
        let (ok, _, err) = lors(&[
            "share",
            "-q",
            "--expires",
            "2s",
            "-o",
            x.to_str().unwrap(),
            o,
        ]);
        assert!(ok, "{err}");
    }
    let k = kept.to_str().unwrap();
    let (ok, _, err) = lors(&["share", "--renew", k, "--owner", o, "--expires", "1h"]);
    assert!(ok && err.contains("5 aliases renewed for 1h"), "{err}");
    std::thread::sleep(std::time::Duration::from_millis(3100));
    let (ok, _, err) = download(&short);
    assert!(!ok && err.contains("access revoked or expired"), "{err}");
    assert!(err.contains("its lease ended"), "{err}");
    let (ok, got, err) = download(&kept);
    assert!(ok && got == data, "{err}");
    let (ok, got, err) = download(&owner);
    assert!(ok && got == data, "{err}");
    // Longer than the owner's lease: refused, nothing made.
    let (ok, _, err) = lors(&["share", "--expires", "3000d", "-o", k, o]);
    assert!(!ok && err.contains("longer than the lease"), "{err}");
}

/// A depot without aliases (LoRS 0.82 era): share says so and what to do
/// instead, and leaves no alias behind on the depots that have them.
#[test]
fn a_depot_without_aliases_is_named() {
    let dir = tempdir();
    let ds = [
        DepotProc::start(&dir.path().join("d0"), &["--sync", "never"]),
        DepotProc::start(&dir.path().join("d1"), &["--sync", "never", "--no-aliases"]),
    ];
    let owner = upload(
        &[&ds[0], &ds[1]],
        dir.path(),
        "f",
        &pattern(200_000, 1),
        &["-c", "2"],
    );
    let out = dir.path().join("s.xnd");
    let (ok, _, err) = lors(&[
        "share",
        "-o",
        out.to_str().unwrap(),
        owner.to_str().unwrap(),
    ]);
    assert!(!ok, "{err}");
    assert!(
        err.contains(&format!(
            "depot {} does not support IBP aliases",
            ds[1].addr
        )),
        "{err}"
    );
    assert!(err.contains("lors modify -w --strip-manage"), "{err}");
    assert!(!out.exists());
}

/// An erasure-coded file is shared whole: every block, parity too, through
/// an alias, with a block whose depot is down left out as long as each
/// stripe keeps enough (the share rebuilds around it when read); it
/// carries no write or manage key, and stops when revoked. A
/// range is refused with why (a stripe is read whole). It used to be
/// refused as "does not handle such files yet".
#[test]
fn an_erasure_coded_file_is_shared_whole_and_revoked() {
    let dir = tempdir();
    let mut ds = depots(4, dir.path());
    let all: Vec<&DepotProc> = ds.iter().collect();
    let data = pattern(3 * (128 << 10) * 3 + 777, 4);
    let xnd = upload(&all, dir.path(), "f", &data, &["--ec", "3+1", "-b", "128k"]);
    let (x, shared) = (xnd.to_str().unwrap(), dir.path().join("s.xnd"));
    let s = shared.to_str().unwrap();
    let (ok, _, err) = lors(&["share", "--range", "0:1000", "-o", s, x]);
    assert!(!ok && err.contains("stripes are read whole"), "{err}");
    // One depot down while sharing: its blocks stay out, the rest suffice.
    ds[3].kill9();
    let (ok, _, err) = lors(&["share", "--expires", "1h", "-o", s, x]);
    assert!(ok && err.contains("not in the share"), "{err}");
    let y = lors::xnd::load(&shared).unwrap();
    assert!(!y.parity.is_empty(), "the share keeps the code's parity");
    assert!(
        caps(&shared)
            .iter()
            .all(|c| c.kind == lors_ibp::caps::CapKind::Read)
    );
    assert!(
        y.allocations()
            .all(|m| m.write.is_none() && m.manage.is_none())
    );
    let (ok, got, err) = download(&shared);
    assert!(ok && got == data, "{err}");
    let (ok, _, err) = lors(&["share", "--revoke", s, "--owner", x]);
    assert!(ok, "{err}");
    let (ok, _, err) = download(&shared);
    assert!(!ok && err.contains("access revoked"), "{err}");
    let (ok, got, err) = download(&xnd);
    assert!(ok && got == data, "the owner's file still reads: {err}");
}
