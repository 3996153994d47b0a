//! No command destroys a file it failed to replace: the new exNode is
//! saved before anything the old one named is freed, a command killed at
//! any moment leaves every allocation its exNode names alive and, once the
//! next command on it has settled, nothing on the depots that no file
//! names; downloads never write over a file they were not told to, and
//! trust no partial file they did not make.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::tools::used;
use crate::util::{DepotProc, client_cfg, list, lors, lors_cmd, pattern, tempdir, upload};

/// Bytes of the allocations `x` names, each once.
fn named_bytes(x: &lors_exnode::ExNode) -> u64 {
    let mut seen = std::collections::HashSet::new();
    (x.allocations())
        .filter(|m| lors::commit::key(m).is_some_and(|k| seen.insert(k)))
        .map(|m| m.alloc_length)
        .sum()
}

/// The allocations on the disks of depots `ds` (started by
/// [`crate::util::depots`] under `dir`) that no mapping of `x` names, each
/// as (depot, id, committed bytes).
fn unnamed_on_disk(
    ds: &[DepotProc],
    dir: &Path,
    x: &lors_exnode::ExNode,
) -> Vec<(String, u64, u64)> {
    use std::io::{Read as _, Seek as _};
    let named: std::collections::HashSet<(String, u64)> = (x.allocations())
        .filter_map(|m| {
            let c = m.manage.as_ref()?;
            Some((c.address(), c.typekey.parse().ok()?))
        })
        .collect();
    let mut out = Vec::new();
    for (i, d) in ds.iter().enumerate() {
        let data = dir.join(format!("d{i}")).join("data");
        let Ok(shards) = std::fs::read_dir(&data) else {
            continue;
        };
        for f in shards.flat_map(|s| std::fs::read_dir(s.unwrap().path()).unwrap()) {
            let f = f.unwrap();
            let Ok(id) = u64::from_str_radix(&f.file_name().to_string_lossy(), 16) else {
                continue;
            };
            if named.contains(&(d.addr.clone(), id)) {
                continue;
            }
            let mut h = [0u8; 8];
            let mut file = std::fs::File::open(f.path()).unwrap();
            file.seek(std::io::SeekFrom::Start(24)).unwrap();
            let len = match file.read_exact(&mut h) {
                Ok(()) => u64::from_le_bytes(h),
                Err(_) => 0,
            };
            out.push((d.addr.clone(), id, len));
        }
    }
    out
}

/// Checks what the depots `ds` hold beyond what the exNode at `xnd` names,
/// once a killed command's leftovers are settled: no allocation that ever
/// held a byte (a data file is made on the first write). What is left is
/// allocations the depots granted in the instant of a kill, before the
/// client read their capabilities — IBP's ALLOCATE names an allocation in
/// its reply only, so nothing can have journaled them; empty, they go
/// with their lease. How many of those there are now.
fn nothing_unnamed_holds_data(ds: &[DepotProc], dir: &Path, xnd: &Path, at: &str) -> u64 {
    let x = lors::xnd::load(xnd).unwrap();
    let with_data = unnamed_on_disk(ds, dir, &x);
    assert!(
        with_data.is_empty(),
        "{at}: allocations that held data and that nothing names: {with_data:?}"
    );
    let held: u64 = ds.iter().map(|d| crate::tools::usage(d).1).sum();
    held - lors::commit::named(&x).len() as u64
}

/// Once the provisional lease of an allocation no journal could name has
/// ended, the depots `ds` hold exactly what the exNode at `xnd` names:
/// nothing is stranded.
fn provisional_leases_end(ds: &[DepotProc], dir: &Path, xnd: &Path) {
    std::thread::sleep(lors::pool::PROVISIONAL_LEASE + Duration::from_secs(3));
    let left = nothing_unnamed_holds_data(ds, dir, xnd, "at the end");
    assert_eq!(
        left, 0,
        "allocations named nowhere outlive their provisional lease"
    );
}

/// Whether every allocation the exNode at `xnd` names is alive on its depot.
fn all_live(xnd: &Path) -> Result<(), String> {
    let x = lors::xnd::load(xnd).map_err(|e| format!("{e:#}"))?;
    let probes = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let pool = lors::Pool::new(client_cfg());
        lors::manage::probe_all(&x, &pool).await
    });
    match probes.iter().position(|p| !p.is_live()) {
        None => Ok(()),
        Some(i) => Err(format!("mapping {i}: {}", probes[i].reason())),
    }
}

/// `PATH` + `ext`.
fn beside(p: &Path, ext: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

/// A route whose output cannot be written fails before any depot is
/// touched: the input exNode is unchanged, every allocation it names is
/// alive, and the target depot holds nothing.
#[test]
fn a_route_that_cannot_save_its_output_touches_no_depot() {
    let dir = tempdir();
    let ds = crate::util::depots(2, dir.path());
    let data = pattern(4 << 20, 3);
    let xnd = upload(&[&ds[0]], dir.path(), "x", &data, &["-c", "1", "-b", "1M"]);
    let before = std::fs::read(&xnd).unwrap();
    let x = xnd.to_str().unwrap();
    let missing = dir.path().join("nosuchdir/x.xnd");
    for bad in [missing.to_str().unwrap(), "/dev/full", "/dev/null"] {
        let (ok, _, err) = lors(&["route", "-q", "--depot", &ds[1].addr, "-o", bad, x]);
        assert!(!ok, "route -o {bad} succeeded");
        assert!(err.contains(bad), "the error names {bad}: {err}");
        assert_eq!(std::fs::read(&xnd).unwrap(), before, "-o {bad}");
        all_live(&xnd).unwrap_or_else(|e| panic!("-o {bad}: {e}"));
        assert_eq!(used(&ds[1]), 0, "-o {bad}: nothing copied");
        assert_eq!(used(&ds[0]), named_bytes(&lors::xnd::load(&xnd).unwrap()));
    }
    // trim and augment check it as early.
    let (ok, _, err) = lors(&[
        "augment",
        "-q",
        "--depot",
        &ds[1].addr,
        "-o",
        "/dev/full",
        x,
    ]);
    assert!(!ok && err.contains("/dev/full"), "{err}");
    assert_eq!(used(&ds[1]), 0, "augment copied nothing");
    let (ok, _, err) = lors(&[
        "trim",
        "-m",
        "0",
        "--allow-holes",
        "--decrement",
        "-o",
        missing.to_str().unwrap(),
        x,
    ]);
    assert!(!ok && err.contains("nosuchdir"), "{err}");
    all_live(&xnd).unwrap();
}

/// In place on a full file system, the save of the new exNode fails: the
/// old one stays as it was, every replica it names alive, and the copies
/// made are released.
#[test]
fn a_route_in_place_on_a_full_file_system_keeps_the_old_file_whole() {
    let dir = tempdir();
    let ds = crate::util::depots(2, dir.path());
    let data = pattern(6 << 20, 4);
    let xnd = upload(&[&ds[0]], dir.path(), "x", &data, &["-c", "1", "-b", "1M"]);
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let after = dir.path().join("after.xnd");
    // The exNode on a 64 KiB tmpfs filled to the last byte, in a private
    // mount namespace; the file is copied out for the checks.
    let script = format!(
        "mount -t tmpfs -o size=64k tmpfs {m} || exit 77; cp {x} {m}/x.xnd; \
         dd if=/dev/zero of={m}/fill bs=4k 2>/dev/null; \
         {lors} route -q --depot {d} {m}/x.xnd; rc=$?; cp {m}/x.xnd {after}; ls -a {m}; exit $rc",
        m = mnt.display(),
        x = xnd.display(),
        d = ds[1].addr,
        after = after.display(),
        lors = env!("CARGO_BIN_EXE_lors"),
    );
    let Some(run) = crate::util::in_private_mounts(&script) else {
        return;
    };
    let err = String::from_utf8_lossy(&run.stderr);
    // Whichever write fails first (the journal, the record, the save).
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(
        err.contains("No space left on device") || err.contains("is its disk full?"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&after).unwrap(),
        std::fs::read(&xnd).unwrap(),
        "the exNode is as it was"
    );
    all_live(&after).unwrap();
    assert_eq!(used(&ds[1]), 0, "the copies made are released");
    let left = String::from_utf8_lossy(&run.stdout);
    assert!(
        !left
            .lines()
            .any(|l| l.ends_with(".journal") || l.ends_with(".lock")),
        "{left}"
    );
}

/// A save that fails after the allocations to free are recorded (here the
/// output is a directory) releases nothing and takes them out of the
/// record again: the old exNode names them, alive.
#[test]
fn a_save_that_fails_releases_nothing() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let xnd = upload(
        &[&ds[0]],
        dir.path(),
        "x",
        &pattern(2 << 20, 2),
        &["-c", "1", "-b", "1M"],
    );
    let x = lors::xnd::load(&xnd).unwrap();
    let out = dir.path().join("out.xnd");
    std::fs::create_dir(&out).unwrap();
    let pool = std::sync::Arc::new(lors::Pool::new(client_cfg()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let empty = lors_exnode::ExNode::default();
    let r = rt.block_on(lors::commit::save_then_release(
        &out,
        &empty,
        x.mappings.clone(),
        &pool,
    ));
    assert!(r.is_err(), "saved over a directory");
    all_live(&xnd).unwrap();
    assert!(
        !beside(&out, ".partial").exists(),
        "the record is as before"
    );
    assert_eq!(used(&ds[0]), named_bytes(&x));
}

/// A run killed before its save left allocations marked to free in the
/// record that the old exNode still names: the next run drops them from
/// the record and frees nothing of the old file; one killed after its
/// save has them freed.
#[test]
fn a_record_of_allocations_to_free_frees_only_after_the_save_it_names() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let data = pattern(3 << 20, 5);
    let xnd = upload(&[&ds[0]], dir.path(), "x", &data, &["-c", "1", "-b", "1M"]);
    let x = lors::xnd::load(&xnd).unwrap();
    let record = beside(&xnd, ".partial");
    // As a route killed between its record and its save leaves it: the
    // exNode's own allocations, marked for a save of another exNode.
    let other = lors_exnode::ExNode::default();
    lors::leftover::to_free(&record, &x.mappings, &lors::commit::digest(&other)).unwrap();
    let pool = std::sync::Arc::new(lors::Pool::new(client_cfg()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let freed = rt.block_on(lors::commit::settle(&xnd, &pool)).unwrap();
    assert_eq!(freed, 0, "nothing the exNode names is freed");
    assert!(!record.exists(), "the record is settled");
    all_live(&xnd).unwrap();
    // After the save: the exNode no longer names them, and is the one the
    // record waits for.
    let t = lors::manage::trim(&x, &lors::manage::Selection::Indices(vec![0]), true).unwrap();
    lors::leftover::to_free(
        &record,
        &[x.mappings[0].clone()],
        &lors::commit::digest(&t.exnode),
    )
    .unwrap();
    lors::xnd::save(&xnd, &t.exnode).unwrap();
    let freed = rt.block_on(lors::commit::settle(&xnd, &pool)).unwrap();
    assert_eq!(freed, 1);
    assert!(!record.exists());
    assert_eq!(used(&ds[0]), named_bytes(&t.exnode));
}

/// Runs `lors ARGS` and kills it `after` in: kill number `k` is a
/// SIGTERM every third time, else a -9. The signal's name.
fn kill_at(args: &[&str], after: Duration, k: usize) -> &'static str {
    let signal = if k % 3 == 2 { "TERM" } else { "KILL" };
    kill_with(args, after, signal);
    signal
}

/// Runs `lors ARGS` and sends it `signal` `after` in.
fn kill_with(args: &[&str], after: Duration, signal: &str) {
    let mut child = lors_cmd(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(after);
    let _ = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// A deterministic stream of delays: the same kills on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

/// Route, augment, trim and repair killed (-9, or SIGTERM) at many
/// points: after each kill every allocation the exNode names is alive and
/// the file reads back whole; once the next command on it has settled
/// what the killed one left, the depots hold exactly what the exNode
/// names. `LORS_KILLS` sets how many kills (24 by default).
#[test]
fn commands_killed_at_any_point_lose_nothing_and_strand_nothing() {
    let kills: usize = std::env::var("LORS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let dir = tempdir();
    let ds = crate::util::depots(4, dir.path());
    let (a, b) = (list(&[&ds[0], &ds[1]]), list(&[&ds[2], &ds[3]]));
    let data = pattern(8 << 20, 9);
    let xnd = upload(
        &[&ds[0], &ds[1]],
        dir.path(),
        "x",
        &data,
        &["-c", "1", "-b", "512K"],
    );
    let x = xnd.to_str().unwrap().to_owned();
    let back = dir.path().join("back");
    let mut rng = Lcg(0x55);
    let mut by_kind = std::collections::BTreeMap::<&str, usize>::new();
    let mut granted_at_kill = 0;
    for k in 0..kills {
        // In turn: move to B, add a copy on A, drop it, move back, heal
        // to two copies (a keeper's cycle), …
        let (what, args): (&str, Vec<&str>) = match k % 5 {
            0 => (
                "route",
                vec!["route", "-q", "--bwlimit", "16M", "--depot", &b],
            ),
            1 => (
                "augment",
                vec!["augment", "-q", "--bwlimit", "16M", "--depot", &a],
            ),
            2 => ("trim", vec!["trim", "-q", "--decrement", "--depot", &a]),
            3 => (
                "route",
                vec!["route", "-q", "--bwlimit", "16M", "--depot", &a],
            ),
            _ => (
                "keep",
                vec![
                    "keep", "--grace", "0", "--once", "-q", "-c", "2", "--depot", &b,
                ],
            ),
        };
        let mut args = args;
        args.push(&x);
        // Trims are quick: their kills land in the first 100 ms.
        let span = if what == "trim" { 100 } else { 700 };
        let after = Duration::from_millis(rng.below(span));
        let signal = kill_at(&args, after, k);
        *by_kind.entry(what).or_default() += 1;
        let at = format!("kill {k} ({what}, {signal} after {after:?})");
        // Every allocation the exNode names is alive; the file is whole.
        all_live(&xnd).unwrap_or_else(|e| panic!("{at}: {e}"));
        let (ok, _, err) = lors(&["download", "-q", "-o", back.to_str().unwrap(), &x]);
        assert!(ok, "{at}: {err}");
        assert!(
            std::fs::read(&back).unwrap() == data,
            "{at}: the file reads back"
        );
        // What the killed run left, settled by the next command on the
        // exNode (a keeper's cycle here): exactly what it names is kept.
        let (ok, _, err) = lors(&["keep", "--grace", "0", "--once", "-q", "-c", "1", &x]);
        assert!(ok, "{at}: {err}");
        let left: Vec<String> = (std::fs::read_dir(dir.path()).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("x.xnd."))
            .collect();
        assert!(left.is_empty(), "{at}: {left:?} left");
        granted_at_kill = nothing_unnamed_holds_data(&ds, dir.path(), &xnd, &at);
    }
    eprintln!(
        "{kills} kills: {by_kind:?}; {granted_at_kill} empty allocations granted in the instant of a kill named nowhere, until their provisional lease ends"
    );
    provisional_leases_end(&ds, dir.path(), &xnd);
}

/// The allocations the journal at `path` lists, as (depot, id): its lines
/// are `SIZE READ WRITE MANAGE`.
fn journaled(path: &Path) -> std::collections::HashSet<(String, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    (text.lines())
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|c| c.parse::<lors_ibp::caps::Capability>().ok())
        .filter_map(|c| Some((c.address(), c.typekey.parse().ok()?)))
        .collect()
}

/// `lors upload` killed with -9 at many points: every allocation that
/// holds data is in the exNode (the kill came after the save) or in the
/// journal beside it, and running the same command again frees what the
/// journal lists, finishes the upload (byte-exact) and leaves no journal,
/// lock or record: the depots hold what the exNodes name, and nothing
/// else that ever held a byte.
#[test]
fn an_upload_killed_with_9_strands_nothing_once_run_again() {
    let kills: u64 = std::env::var("LORS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(8, |k: u64| k.div_ceil(3));
    let dir = tempdir();
    let ds = crate::util::depots(3, dir.path());
    let depots = list(&ds.iter().collect::<Vec<_>>());
    let data = pattern(8 << 20, 13);
    let src = dir.path().join("in.bin");
    std::fs::write(&src, &data).unwrap();
    let mut rng = Lcg(0x9);
    let mut all = lors_exnode::ExNode::default();
    let back = dir.path().join("back");
    for k in 0..kills {
        let out = dir.path().join(format!("u{k}.xnd"));
        let args = [
            "upload",
            "-q",
            "-c",
            "2",
            "-b",
            "256K",
            "--bwlimit",
            "16M",
            "--depot",
            &depots,
            "-o",
            out.to_str().unwrap(),
            src.to_str().unwrap(),
        ];
        let after = Duration::from_millis(30 + rng.below(900));
        kill_with(&args, after, "KILL");
        let at = format!("kill {k} after {after:?}");
        // What holds data is named by the saved exNode or the journal.
        let mut named = all.clone();
        if let Ok(x) = lors::xnd::load(&out) {
            named.mappings.extend(x.mappings);
        }
        let journal = journaled(&beside(&out, ".journal"));
        let with_data: Vec<_> = (unnamed_on_disk(&ds, dir.path(), &named).into_iter())
            .filter(|(addr, id, len)| *len > 0 && !journal.contains(&(addr.clone(), *id)))
            .collect();
        assert!(with_data.is_empty(), "{at}: named nowhere: {with_data:?}");
        if !out.exists() {
            let (ok, _, err) = lors(&args);
            assert!(ok, "{at}: run again: {err}");
        }
        let (ok, _, err) = lors(&[
            "download",
            "-q",
            "-o",
            back.to_str().unwrap(),
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{at}: {err}");
        assert!(std::fs::read(&back).unwrap() == data, "{at}: differs");
        for ext in [".journal", ".lock", ".partial"] {
            assert!(!beside(&out, ext).exists(), "{at}: {ext} left");
        }
        all.mappings.extend(lors::xnd::load(&out).unwrap().mappings);
        let with_data: Vec<_> = (unnamed_on_disk(&ds, dir.path(), &all).into_iter())
            .filter(|(_, _, len)| *len > 0)
            .collect();
        assert!(
            with_data.is_empty(),
            "{at}: stranded after the rerun: {with_data:?}"
        );
    }
    let held: u64 = ds.iter().map(|d| crate::tools::usage(d).1).sum();
    let empty = held - lors::commit::named(&all).len() as u64;
    eprintln!("{kills} kills: {empty} empty allocations granted in the instant of a kill");
}

/// `lors augment --repair` of an erasure-coded file killed (-9, or
/// SIGTERM) at many points while it remakes a lost block: the file always
/// reads back whole, and once the next command has settled and finished
/// the repair, the depots hold exactly what the exNode names.
#[test]
fn a_repair_killed_at_any_point_loses_nothing_and_strands_nothing() {
    let kills: usize = std::env::var("LORS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(8, |k: usize| k.div_ceil(3));
    let dir = tempdir();
    let ds = crate::util::depots(4, dir.path());
    let data = pattern(4 << 20, 11);
    let xnd = upload(
        &[&ds[0], &ds[1], &ds[2]],
        dir.path(),
        "ec",
        &data,
        &["--ec", "2+1", "-b", "256K"],
    );
    let x = xnd.to_str().unwrap().to_owned();
    let targets = list(&[&ds[0], &ds[1], &ds[2], &ds[3]]);
    let back = dir.path().join("back");
    let mut rng = Lcg(0x77);
    let mut granted_at_kill = 0;
    // A block of each of four stripes lost.
    let lose = || {
        for s in 0..4u64 {
            crate::util::free_block(&xnd, s * (512 << 10));
        }
    };
    let repair = [
        "augment",
        "-q",
        "--repair",
        "--bwlimit",
        "8M",
        "--depot",
        &targets,
        &x,
    ];
    // How long a whole repair takes: the kills land anywhere in it.
    lose();
    let t0 = std::time::Instant::now();
    let (ok, _, err) = lors(&repair);
    assert!(ok, "{err}");
    let whole = t0.elapsed().as_millis() as u64;
    for k in 0..kills {
        lose();
        let after = Duration::from_millis(rng.below(whole));
        let signal = kill_at(&repair, after, k);
        let at = format!("repair kill {k} ({signal} after {after:?})");
        let (ok, _, err) = lors(&["download", "-q", "-o", back.to_str().unwrap(), &x]);
        assert!(ok, "{at}: {err}");
        assert!(std::fs::read(&back).unwrap() == data, "{at}");
        // Settled, and the repair finished: the lost block made again.
        let (ok, _, err) = lors(&["augment", "-q", "--repair", "--depot", &targets, &x]);
        assert!(ok, "{at}: {err}");
        all_live(&xnd).unwrap_or_else(|e| panic!("{at}: {e}"));
        for ext in [".journal", ".lock", ".partial"] {
            assert!(!beside(&xnd, ext).exists(), "{at}: {ext} left");
        }
        granted_at_kill = nothing_unnamed_holds_data(&ds, dir.path(), &xnd, &at);
    }
    eprintln!(
        "{kills} repair kills; {granted_at_kill} empty allocations granted in the instant of a kill named nowhere, until their provisional lease ends"
    );
    provisional_leases_end(&ds, dir.path(), &xnd);
}

/// A download never writes over a file it was not told to: the recorded
/// name (with -f, or -o DIR/) is not used when a file has it, and no
/// output is the exNode being read.
#[test]
fn a_download_never_overwrites_a_file_it_was_not_told_to() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let data = pattern(1 << 20, 6);
    // An exNode recording the name of the user's exNode, and one
    // recording `.bashrc`.
    let xnd = upload(&[&ds[0]], dir.path(), "run42.xnd", &data, &["-c", "1"]);
    let precious = std::fs::read(&xnd).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::copy(&xnd, work.join("run42.xnd")).unwrap();
    let rc = work.join(".bashrc");
    std::fs::write(&rc, "alias ll='ls -l'\n").unwrap();
    let mut x = lors::xnd::load(&xnd).unwrap();
    x.set_meta(lors_exnode::Metadata::string("filename", ".bashrc"));
    let bashrc_xnd = dir.path().join("b.xnd");
    lors::xnd::save(&bashrc_xnd, &x).unwrap();
    let run = |args: &[&str]| {
        lors_cmd(args)
            .current_dir(&work)
            .output()
            .expect("run lors")
    };
    let r = run(&["download", "-q", "-f", "run42.xnd"]);
    assert!(!r.status.success(), "-f over the exNode itself");
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("is there already"), "{err}");
    assert_eq!(std::fs::read(work.join("run42.xnd")).unwrap(), precious);
    let b = bashrc_xnd.to_str().unwrap();
    let r = run(&["download", "-q", "-f", b]);
    assert!(!r.status.success());
    let r = run(&["download", "-q", "-o", "./", b]);
    assert!(!r.status.success());
    assert_eq!(std::fs::read_to_string(&rc).unwrap(), "alias ll='ls -l'\n");
    // Named by the user, the output is theirs to replace — but never the
    // exNode being read.
    let r = run(&["download", "-q", "-o", "run42.xnd", "run42.xnd"]);
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("is the exNode being read"), "{err}");
    assert_eq!(std::fs::read(work.join("run42.xnd")).unwrap(), precious);
    let r = run(&["download", "-q", "-o", ".bashrc", b]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(&rc).unwrap() == data);
}

/// A partial file and resume record planted beside the output (a forged
/// record over a file of `E`s, links to a victim) are never trusted or
/// followed: the download fetches everything and writes only its output.
#[test]
fn a_planted_partial_file_is_never_resumed_or_followed() {
    let dir = tempdir();
    let ds = crate::util::depots(1, dir.path());
    let data = pattern(8 << 20, 8);
    let xnd = upload(&[&ds[0]], dir.path(), "f", &data, &["-c", "1", "-b", "1M"]);
    let x = xnd.to_str().unwrap();
    let out = dir.path().join("out");
    let o = out.to_str().unwrap();
    // A real interrupted download makes a record; its header is what
    // anyone holding the exNode can compute.
    let state = dir.path().join("state");
    let env = [("XDG_STATE_HOME", state.to_str().unwrap())];
    let mut child = lors_cmd(&["download", "-q", "--bwlimit", "4M", "-o", o, x])
        .envs(env)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let _ = child.kill();
    let _ = child.wait();
    let record = beside(&out, ".lors-resume");
    let header = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned();
    // Forged: every piece "done", over a file of E's.
    let part = beside(&out, ".lors-part");
    std::fs::remove_file(&part).unwrap();
    std::fs::write(&part, vec![b'E'; data.len()]).unwrap();
    let mut forged = format!("{header}\nmac {}\n", "0".repeat(64));
    for p in 0..8u64 {
        forged.push_str(&format!("{} {}\n", p << 20, 1 << 20));
    }
    std::fs::write(&record, forged).unwrap();
    let r = lors_cmd(&["download", "-o", o, x])
        .envs(env)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(&out).unwrap() == data, "not a byte of E's");
    let said = String::from_utf8_lossy(&r.stderr);
    assert!(!said.contains("resumed"), "{said}");
    // Links planted under both names: followed by neither.
    std::fs::remove_file(&out).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    std::os::unix::fs::symlink(&victim, &part).unwrap();
    std::os::unix::fs::symlink(&victim, &record).unwrap();
    let r = lors_cmd(&["download", "-q", "-o", o, x])
        .envs(env)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(&out).unwrap() == data);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
}
