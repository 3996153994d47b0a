//! `lors upload` and `lors download` of many files at once: side by side,
//! one exNode each, byte-exact; refused before anything is stored when the
//! words do not say where each exNode goes; one file's failure does not
//! stop the others; an interrupted batch leaves on the depots only what
//! its exNodes and records name, and the same command with
//! `--skip-existing` finishes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::interrupt::interrupted_upload;
use crate::tools::used;
use crate::util::{DepotProc, depots, list, lors, lors_cmd, pattern, tempdir};

/// `n` files of assorted sizes (one empty, one of several blocks) in
/// `dir/in`, with their contents.
fn files(dir: &Path, n: usize) -> Vec<(PathBuf, Vec<u8>)> {
    let src = dir.join("in");
    std::fs::create_dir_all(&src).unwrap();
    (0..n)
        .map(|i| {
            let len = match i {
                0 => 0,
                1 => (3 << 20) + 17,
                _ => 4096 * i + i,
            };
            let data = pattern(len, i as u8);
            let p = src.join(format!("f{i:02}.dat"));
            std::fs::write(&p, &data).unwrap();
            (p, data)
        })
        .collect()
}

/// Bytes of allocations the exNodes and upload records in `dir` name.
fn named_bytes_in(dir: &Path) -> u64 {
    let mut sum = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let s = p.to_string_lossy();
        if (s.ends_with(".xnd") || s.ends_with(".xnd.partial"))
            && let Ok(x) = lors::xnd::load(&p)
        {
            sum += x.allocations().map(|m| m.alloc_length).sum::<u64>();
        }
    }
    sum
}

fn held(ds: &[DepotProc]) -> u64 {
    ds.iter().map(used).sum()
}

fn strs(ps: &[(PathBuf, Vec<u8>)]) -> Vec<String> {
    ps.iter().map(|(p, _)| p.display().to_string()).collect()
}

#[test]
fn many_files_go_up_and_come_down_side_by_side_byte_exact() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let all = list(&ds.iter().collect::<Vec<_>>());
    let fs = files(dir.path(), 24);
    let xnds = dir.path().join("xnds");
    std::fs::create_dir(&xnds).unwrap();
    let names = strs(&fs);
    let mut args = vec!["upload", "-c", "2", "-b", "1M", "--depot", &all, "-o"];
    let xs = format!("{}/", xnds.display());
    args.push(&xs);
    args.extend(names.iter().map(String::as_str));
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    assert!(err.contains("uploaded 24 of 24 files"), "{err}");
    assert!(err.contains("f01.dat (3145745 bytes) ->"), "{err}");
    // Each file its own exNode, two copies of each block, spread over
    // every depot (the order of the depots turns from file to file).
    for (p, data) in &fs {
        let name = p.file_name().unwrap().to_string_lossy();
        let x = lors::xnd::load(&xnds.join(format!("{name}.xnd"))).unwrap();
        assert_eq!(x.logical_size(), data.len() as u64, "{name}");
        assert_eq!(x.filename(), Some(name.as_ref()));
    }
    assert!(ds.iter().all(|d| used(d) > 0), "a depot got nothing");
    assert_eq!(
        held(&ds),
        named_bytes_in(&xnds),
        "the depots hold what the exNodes name"
    );

    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let mut xnd_paths: Vec<String> = std::fs::read_dir(&xnds)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    xnd_paths.sort();
    let os = format!("{}/", out.display());
    let mut args = vec!["download", "-j", "5", "-o", &os];
    args.extend(xnd_paths.iter().map(String::as_str));
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    assert!(err.contains("downloaded 24 of 24 files"), "{err}");
    for (p, data) in &fs {
        let got = std::fs::read(out.join(p.file_name().unwrap())).unwrap();
        assert!(got == *data, "{} differs", p.display());
    }
    // --json: one done event naming every file.
    let out2 = dir.path().join("out2");
    std::fs::create_dir(&out2).unwrap();
    let os2 = format!("{}/", out2.display());
    let mut args = vec!["download", "--json", "-o", &os2];
    args.extend(xnd_paths.iter().take(3).map(String::as_str));
    let (ok, stdout, err) = lors(&args);
    assert!(ok, "{err}");
    let done = String::from_utf8_lossy(&stdout)
        .lines()
        .chain(err.lines())
        .find(|l| l.contains("\"event\":\"done\""))
        .map(str::to_owned)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&done).expect("a done event");
    assert_eq!(v["files"].as_array().map(Vec::len), Some(3), "{done}");
}

#[test]
fn a_batch_that_does_not_say_where_each_exnode_goes_stores_nothing() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let d = ds[0].addr.clone();
    let fs = files(dir.path(), 3);
    let [a, b, c] = [0, 1, 2].map(|i| fs[i].0.display().to_string());
    let refused = |args: &[&str], says: &str| {
        let out = lors_cmd(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    };
    let up = ["upload", "--depot", d.as_str(), "-c", "1"];
    let upload_refused = |rest: &[&str], says: &str| refused(&[&up[..], rest].concat(), says);
    upload_refused(&[&a, &b, &c], "-f (FILE.xnd beside each) or -o DIR");
    upload_refused(&["-o", "no-such-dir", &a, &b], "is not one");
    upload_refused(
        &["-f", &a, "-"],
        "standard input (-) is uploaded on its own",
    );
    // `FILE OUT.xnd` is still one file; a second data file is not taken
    // for an exNode to replace.
    upload_refused(&[&a, &b], "is a file, not an exNode");
    upload_refused(&["-o", "x.xnd", &a, "y.xnd"], "cannot be used with -o");
    // Two files named alike would have one exNode.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let twin = other.join("f00.dat");
    std::fs::write(&twin, b"x").unwrap();
    let xnds = dir.path().join("xnds");
    std::fs::create_dir(&xnds).unwrap();
    let xs = xnds.display().to_string();
    let twin = twin.display().to_string();
    upload_refused(&["-o", &xs, &a, &twin], "would have the same exNode");
    // An exNode already there refuses the whole batch before anything
    // is stored (--skip-existing leaves it out instead).
    let (ok, _, err) = lors(&[&up[..], &["-q", "-o", &xs, &a]].concat());
    assert!(ok, "{err}");
    let before = used(&ds[0]);
    upload_refused(&["-o", &xs, &a, &b, &c], "already exists");
    assert_eq!(used(&ds[0]), before, "a refused batch stored something");
    refused(
        &["download", &format!("{xs}/f00.dat.xnd"), &a, &b],
        "-o DIR",
    );
}

#[test]
fn one_file_failing_does_not_stop_the_others_and_skip_existing_finishes() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let all = list(&ds.iter().collect::<Vec<_>>());
    let fs = files(dir.path(), 8);
    let names = strs(&fs);
    let xnds = dir.path().join("xnds");
    std::fs::create_dir(&xnds).unwrap();
    let xs = xnds.display().to_string();
    // Three are uploaded first; the batch leaves them out and says so.
    let mut args = vec!["upload", "-q", "-c", "1", "--depot", &all, "-o", &xs];
    args.extend(names[..3].iter().map(String::as_str));
    assert!(lors(&args).0);
    let mut args = vec![
        "upload",
        "--skip-existing",
        "-c",
        "1",
        "--depot",
        &all,
        "-o",
        &xs,
    ];
    args.extend(names.iter().map(String::as_str));
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    assert!(err.contains("f02.dat skipped"), "{err}");
    assert!(err.contains("uploaded 5 of 5 files"), "{err}");
    assert_eq!(held(&ds), named_bytes_in(&xnds));

    // A download batch with one exNode that is not one: the others come
    // down, the command fails naming it.
    let bad = dir.path().join("bad.xnd");
    std::fs::write(&bad, b"<exnode>not really").unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let os = out.display().to_string();
    let mut xnd_paths: Vec<String> = (std::fs::read_dir(&xnds).unwrap())
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    xnd_paths.insert(2, bad.display().to_string());
    let mut args = vec!["download", "-o", &os];
    args.extend(xnd_paths.iter().map(String::as_str));
    let (ok, _, err) = lors(&args);
    assert!(!ok);
    assert!(err.contains("bad.xnd:"), "{err}");
    assert!(err.contains("downloaded 8 of 9 files"), "{err}");
    assert!(err.contains("1 of 9 files failed"), "{err}");
    for (p, data) in &fs {
        assert!(std::fs::read(out.join(p.file_name().unwrap())).unwrap() == *data);
    }
    // Again with --skip-existing: nothing is fetched twice.
    let mut args = vec!["download", "--skip-existing", "-o", &os];
    args.extend(
        xnd_paths
            .iter()
            .filter(|p| !p.contains("bad"))
            .map(String::as_str),
    );
    let (ok, _, err) = lors(&args);
    assert!(ok && err.contains("skipped"), "{err}");
}

/// SIGINT half-way through a batch: finished files have their exNodes,
/// cut-off ones their records, nothing else is held; the same command
/// with `--skip-existing` resumes them and ends byte-exact.
#[test]
fn an_interrupted_batch_leaves_only_what_is_named_and_finishes_when_run_again() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let all = list(&ds.iter().collect::<Vec<_>>());
    let src = dir.path().join("in");
    std::fs::create_dir(&src).unwrap();
    let fs: Vec<(PathBuf, Vec<u8>)> = (0..12)
        .map(|i| {
            let data = pattern((2 << 20) + i * 1000, i as u8 + 3);
            let p = src.join(format!("g{i:02}"));
            std::fs::write(&p, &data).unwrap();
            (p, data)
        })
        .collect();
    let names = strs(&fs);
    let xnds = dir.path().join("xnds");
    std::fs::create_dir(&xnds).unwrap();
    let xs = xnds.display().to_string();
    let mut args = vec![
        "upload",
        "-c",
        "2",
        "-b",
        "256K",
        "-j",
        "3",
        "--bwlimit",
        "8M",
        "--depot",
        &all,
        "-o",
        &xs,
    ];
    args.extend(names.iter().map(String::as_str));
    let (code, err) = interrupted_upload(&args, "INT", Duration::from_millis(1200));
    assert_eq!(code, 130, "{err}");
    assert!(err.contains("upload interrupted"), "{err}");
    let done = (std::fs::read_dir(&xnds).unwrap())
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "xnd")
        })
        .count();
    assert!(
        done < fs.len(),
        "every file finished before the signal: {err}"
    );
    assert_eq!(held(&ds), named_bytes_in(&xnds), "after SIGINT: {err}");

    let mut again = vec!["upload", "-q", "--skip-existing", "-c", "2", "-b", "256K"];
    again.extend(["--depot", &all, "-o", &xs]);
    again.extend(names.iter().map(String::as_str));
    let (ok, _, err) = lors(&again);
    assert!(ok, "{err}");
    let partials = (std::fs::read_dir(&xnds).unwrap())
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .to_string_lossy()
                .ends_with(".partial")
        })
        .count();
    assert_eq!(partials, 0, "records left after the batch finished");
    assert_eq!(
        held(&ds),
        named_bytes_in(&xnds),
        "every allocation is in an exNode"
    );
    for (p, data) in &fs {
        let x = xnds.join(format!("{}.xnd", p.file_name().unwrap().to_string_lossy()));
        let (ok, got, err) = lors(&["download", "-q", "-o", "-", x.to_str().unwrap()]);
        assert!(ok, "{err}");
        assert!(got == *data, "{} differs", p.display());
    }
}
