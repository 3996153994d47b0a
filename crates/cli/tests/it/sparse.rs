//! Sparse files with real depot processes: an upload stores only the data
//! extents and records the holes; downloads (to a file, to a stream, of a
//! range), xio reads, trim and augment keep them; `--dense` stores every
//! byte; holes read with every depot gone.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use lors::settings::{Env, Layer, Settings};

use crate::util::*;

const MIB: u64 = 1 << 20;

/// A 64 MiB file holding 1.5 MiB of data: a leading hole, two data runs
/// and a trailing hole. Returns its bytes as a reader sees them.
fn sparse_file(path: &Path) -> Vec<u8> {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(64 * MIB).unwrap();
    f.write_all_at(&pattern(MIB as usize, 3), 4 * MIB).unwrap();
    f.write_all_at(&pattern(512 << 10, 9), 40 * MIB + 12345)
        .unwrap();
    f.sync_all().unwrap();
    std::fs::read(path).unwrap()
}

/// Bytes the file system holds for `path` (`du`).
fn on_disk(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// `lors upload -q -c 1 FLAGS SRC` to `depot` as `xnd`: its exNode, or
/// `None` (said) when the file system keeps no holes to find.
pub fn upload_sparse(
    depot: &str,
    src: &Path,
    xnd: &Path,
    flags: &[&str],
) -> Option<lors_exnode::ExNode> {
    let mut args = vec!["upload", "-q", "--depot", depot, "-c", "1"];
    args.extend_from_slice(flags);
    args.extend(["-o", xnd.to_str().unwrap(), src.to_str().unwrap()]);
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    let x = lors::xnd::load(xnd).unwrap();
    if x.holes.is_empty() {
        eprintln!("skipped: this file system does not keep holes");
        return None;
    }
    Some(x)
}

/// `lors download -o - FLAGS XND`: what it writes.
fn streamed(xnd: &Path, flags: &[&str]) -> Vec<u8> {
    let mut args = vec!["download", "-q", "-o", "-"];
    args.extend_from_slice(flags);
    args.push(xnd.to_str().unwrap());
    let (ok, out, err) = lors(&args);
    assert!(ok, "{err}");
    out
}

fn stored(x: &lors_exnode::ExNode) -> u64 {
    x.mappings.iter().map(|m| m.alloc_length).sum()
}

#[test]
fn a_sparse_file_stores_its_data_and_downloads_sparse_and_equal() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let src = dir.path().join("img");
    let data = sparse_file(&src);
    if on_disk(&src) > 8 * MIB {
        eprintln!("this file system does not keep holes: skipped");
        return;
    }
    let xnd = dir.path().join("img.xnd");
    let depots = list(&ds.iter().collect::<Vec<_>>());
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        &depots,
        "-c",
        "2",
        "-b",
        "1M",
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("in holes, not stored"), "{err}");
    let x = lors::xnd::load(&xnd).unwrap();
    assert_eq!(x.logical_size(), 64 * MIB);
    assert!(x.hole_bytes() >= 62 * MIB, "{:?}", x.holes);
    // Two copies of the data (and the file's last 4 KiB), no more.
    assert!(stored(&x) <= 2 * (3 * MIB), "{} bytes stored", stored(&x));
    let text = std::fs::read_to_string(&xnd).unwrap();
    assert_eq!(text.matches("<exnode:hole>").count(), x.holes.len());
    let (_, out, _) = lors(&["stat", xnd.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("holes, not stored"), "{out}");

    // To a file: equal, and sparse.
    let back = dir.path().join("back");
    let (ok, _, err) = lors(&[
        "download",
        "-q",
        "-o",
        back.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        std::fs::read(&back).unwrap() == data,
        "downloaded bytes differ"
    );
    assert!(
        on_disk(&back) <= 8 * MIB,
        "{} bytes on disk",
        on_disk(&back)
    );

    // To a stream, whole and a range across hole edges.
    assert!(streamed(&xnd, &[]) == data, "streamed bytes differ");
    let (a, n) = (3 * MIB + 7, 40 * MIB);
    let range = streamed(&xnd, &["-O", &a.to_string(), "-L", &n.to_string()]);
    assert!(
        range[..] == data[a as usize..(a + n) as usize],
        "range differs"
    );

    // Trim of one copy keeps the holes; augment copies only data.
    let (ok, _, err) = lors(&["trim", "--depot", &ds[1].addr, xnd.to_str().unwrap()]);
    assert!(ok, "{err}");
    let t = lors::xnd::load(&xnd).unwrap();
    assert_eq!(t.holes, x.holes);
    let (ok, _, err) = lors(&["augment", "--depot", &ds[1].addr, xnd.to_str().unwrap()]);
    assert!(ok, "{err}");
    let y = lors::xnd::load(&xnd).unwrap();
    assert_eq!(y.holes, x.holes);
    assert!(stored(&y) <= 2 * (3 * MIB), "{} bytes stored", stored(&y));
    assert!(
        streamed(&xnd, &[]) == data,
        "bytes differ after trim and augment"
    );
}

/// xio reads a hole as zeros without asking a depot: with every depot
/// stopped, the holes still read; the data then fails with an error, not
/// zeros.
#[test]
fn holes_read_through_xio_with_every_depot_gone() {
    let dir = tempdir();
    let mut ds = depots(1, dir.path());
    let src = dir.path().join("img");
    let data = sparse_file(&src);
    let xnd = dir.path().join("img.xnd");
    // (-n: no e2e functions, sent from the file with sendfile.)
    if upload_sparse(&ds[0].addr, &src, &xnd, &["-n"]).is_none() {
        return;
    }
    let settings = Settings::resolve(
        Layer {
            timeout: Some(std::time::Duration::from_secs(3)),
            ..Layer::default()
        },
        None,
        &Env::from_pairs([]),
        Default::default(),
    )
    .unwrap();
    let mut o = lors::xio::OpenOptions::new();
    o.read(true).settings(settings);
    let mut f = o.open(xnd.to_str().unwrap()).unwrap();
    let mut buf = vec![0u8; 3 << 20];
    f.seek(SeekFrom::Start(MIB)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    ds[0].kill9();
    let mut f = o.open(xnd.to_str().unwrap()).unwrap();
    f.seek(SeekFrom::Start(50 * MIB)).unwrap();
    let mut buf = vec![1u8; 8 << 20];
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "a hole reads as zeros");
    f.seek(SeekFrom::Start(4 * MIB)).unwrap();
    let e = f.read(&mut buf[..4096]).expect_err("its data is gone");
    assert!(!e.to_string().is_empty());
    assert_eq!(data[50 * MIB as usize], 0);
}

/// `--dense` stores every byte (as the LoRS 0.82 tools need); a stream
/// and an erasure-coded upload are dense anyway.
#[test]
fn dense_uploads_store_every_byte() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let src = dir.path().join("img");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(8 * MIB).unwrap();
    f.write_all_at(b"data", 5 * MIB).unwrap();
    let data = std::fs::read(&src).unwrap();
    let xnd = dir.path().join("d.xnd");
    let all = list(&ds.iter().collect::<Vec<_>>());
    let up = |flags: &[&str]| {
        let mut args = vec!["upload", "-q", "--force", "--depot", &all];
        args.extend_from_slice(flags);
        args.extend(["-o", xnd.to_str().unwrap(), src.to_str().unwrap()]);
        let (ok, _, err) = lors(&args);
        assert!(ok, "{err}");
        lors::xnd::load(&xnd).unwrap()
    };
    for flags in [&["--dense", "-c", "1"][..], &["--ec", "2+1"][..]] {
        let x = up(flags);
        assert!(x.holes.is_empty(), "{flags:?}");
        assert_eq!(x.logical_size(), 8 * MIB);
        assert!(streamed(&xnd, &[]) == data);
    }
}

/// A sparse upload cut off by Ctrl-C records what it stored; the same
/// command resumes it, sending only the missing extents' blocks, and the
/// file reads back equal.
#[test]
fn an_interrupted_sparse_upload_resumes() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let src = dir.path().join("img");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(256 * MIB).unwrap();
    for i in 0..8u64 {
        f.write_all_at(&pattern(4 * MIB as usize, i as u8), i * 32 * MIB + 12345)
            .unwrap();
    }
    drop(f);
    let data = std::fs::read(&src).unwrap();
    let xnd = dir.path().join("img.xnd");
    let args = [
        "upload",
        "-q",
        "--depot",
        &ds[0].addr,
        "-c",
        "1",
        "-b",
        "1M",
        "--bwlimit",
        "16M",
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ];
    let mut child = crate::util::lors_cmd(&args).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    let _ = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let st = child.wait().unwrap();
    assert!(!st.success(), "32 MiB at 16 MiB/s was not cut off");
    assert!(!xnd.exists());
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    let x = lors::xnd::load(&xnd).unwrap();
    assert!(!x.holes.is_empty() || on_disk(&src) > 64 * MIB);
    assert!(stored(&x) < 40 * MIB, "{} bytes stored", stored(&x));
    assert_eq!(
        crate::tools::used(&ds[0]),
        stored(&x),
        "the depot holds what the exNode names"
    );
    assert!(streamed(&xnd, &[]) == data, "bytes differ after the resume");
}
