//! `lors::xio::File` against real depots: write coalescing, overwrites,
//! O_RDWR, truncate, stat, read-ahead and random reads, and the errors a
//! program sees.

use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::Path;

use lors::settings::{Env, Layer, Settings};
use lors::xio::{self, OpenOptions};

use crate::util::{DepotProc, lors, pattern, tempdir};

const MIB: usize = 1 << 20;

/// Settings as a user with no `~/.xndrc` and no LORS_ variables has them,
/// plus `flags`.
fn settings(flags: Layer) -> Settings {
    Settings::resolve(flags, None, &Env::from_pairs([]), Default::default()).unwrap()
}

fn writer(depots: &[&DepotProc], copies: usize) -> OpenOptions {
    let mut o = OpenOptions::new();
    o.write(true)
        .create(true)
        .truncate(true)
        .buffer(MIB)
        .depots(depots.iter().map(|d| d.addr.clone()).collect())
        .settings(settings(Layer {
            copies: Some(copies),
            block_size: Some(MIB as u64),
            timeout: Some(std::time::Duration::from_secs(10)),
            ..Layer::default()
        }));
    o
}

fn reader() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).settings(settings(Layer {
        timeout: Some(std::time::Duration::from_secs(10)),
        ..Layer::default()
    }));
    o
}

fn read_all(path: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    reader()
        .open(path.to_str().unwrap())
        .unwrap()
        .read_to_end(&mut v)
        .unwrap();
    v
}

/// Each mapping range once per copy: no stale range left beside a new one.
fn assert_covered_once_per_copy(path: &Path, size: u64, copies: usize) {
    let x = lors::xnd::load(path).unwrap();
    assert_eq!(x.logical_size(), size);
    let total: u64 = x.mappings.iter().map(|m| m.logical_length).sum();
    assert_eq!(total, size * copies as u64, "{:#?}", x.mappings);
}

#[test]
fn write_patterns_give_the_same_file_and_mappings_per_block_not_per_call() {
    let dir = tempdir();
    let d1 = DepotProc::start(&dir.path().join("d1"), &[]);
    let d2 = DepotProc::start(&dir.path().join("d2"), &[]);
    let data = pattern(5 * MIB / 2 + 123, 7);
    let mut shapes = Vec::new();
    for (name, call) in [("one", 1), ("page", 4096), ("mib", MIB)] {
        let path = dir.path().join(format!("{name}.xnd"));
        let mut f = writer(&[&d1, &d2], 2).open(path.to_str().unwrap()).unwrap();
        for piece in data.chunks(call) {
            f.write_all(piece).unwrap();
        }
        assert_eq!(f.metadata().unwrap().len, data.len() as u64);
        f.close().unwrap();
        assert_eq!(read_all(&path), data, "{name}: read back through xio");
        // The tools read it too.
        let out = dir.path().join(format!("{name}.out"));
        let (ok, _, err) = lors(&[
            "download",
            path.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        assert_eq!(std::fs::read(&out).unwrap(), data);
        let x = lors::xnd::load(&path).unwrap();
        let shape: Vec<(u64, u64)> = (x.mappings.iter())
            .map(|m| (m.exnode_offset, m.logical_length))
            .collect();
        shapes.push(shape);
    }
    // 2.5 MiB in 1 MiB buffers: 3 blocks × 2 copies, whatever the calls.
    assert_eq!(shapes[0].len(), 6, "{:?}", shapes[0]);
    assert_eq!(shapes[0], shapes[1]);
    assert_eq!(shapes[0], shapes[2]);
}

#[test]
fn seeks_overwrites_rdwr_and_random_reads() {
    let dir = tempdir();
    let d1 = DepotProc::start(&dir.path().join("d1"), &[]);
    let d2 = DepotProc::start(&dir.path().join("d2"), &[]);
    let path = dir.path().join("f.xnd");
    let p = path.to_str().unwrap();
    let mut model = pattern(3 * MIB, 1);
    let mut f = writer(&[&d1, &d2], 2).open(p).unwrap();
    f.write_all(&model).unwrap();
    f.close().unwrap();
    let before = lors::xnd::load(&path).unwrap();

    // O_RDWR: overwrite across a block boundary, read it back before and
    // after closing.
    let mut f = writer(&[&d1, &d2], 2)
        .truncate(false)
        .read(true)
        .open(p)
        .unwrap();
    let at = 2 * MIB - 100;
    f.seek(SeekFrom::Start(at as u64)).unwrap();
    f.write_all(&[b'X'; 300]).unwrap();
    model[at..at + 300].fill(b'X');
    // The whole first block: its allocations are released on close.
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&pattern(MIB, 99)).unwrap();
    model[..MIB].copy_from_slice(&pattern(MIB, 99));
    // Past the end: a hole of zeros, then data.
    f.seek(SeekFrom::End(1000)).unwrap();
    f.write_all(b"tail").unwrap();
    model.extend_from_slice(&[0; 1000]);
    model.extend_from_slice(b"tail");
    let mut got = vec![0u8; 400];
    f.seek(SeekFrom::Start(at as u64 - 50)).unwrap();
    f.read_exact(&mut got).unwrap();
    assert_eq!(got, model[at - 50..at + 350]);
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut all = Vec::new();
    f.read_to_end(&mut all).unwrap();
    assert_eq!(all, model, "read through the writing handle");
    f.close().unwrap();
    assert_eq!(read_all(&path), model);
    assert_covered_once_per_copy(&path, model.len() as u64, 2);
    // The block written over whole is gone from the depots; the others are
    // still read (narrowed, over the same allocation).
    let after = lors::xnd::load(&path).unwrap();
    let old_reads: Vec<_> = before
        .mappings
        .iter()
        .filter_map(|m| m.read.clone())
        .collect();
    let kept = (after.mappings.iter())
        .filter(|m| m.read.as_ref().is_some_and(|r| old_reads.contains(r)))
        .count();
    assert_eq!(
        kept, 4,
        "blocks 1 and 2 × 2 copies, cut short around the overwrite"
    );
    let old = dir.path().join("before.xnd");
    lors::xnd::save(&old, &before).unwrap();
    let (ok, _, err) = lors(&["download", old.to_str().unwrap(), "-o", "-", "-T", "5"]);
    assert!(!ok, "the first block's old copies were released");
    assert!(err.contains("bytes 0.."), "{err}");

    // Random reads of 4 KiB compare with the model.
    let mut f = reader().open(p).unwrap();
    let mut seed = 12345u64;
    for _ in 0..50 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = (seed >> 20) as usize % (model.len() - 4096);
        let mut b = vec![0u8; 4096];
        f.seek(SeekFrom::Start(off as u64)).unwrap();
        f.read_exact(&mut b).unwrap();
        assert_eq!(b, model[off..off + 4096], "at {off}");
    }
}

#[test]
fn overwriting_and_truncating_encoded_blocks_of_an_uploaded_file() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &[]);
    let src = dir.path().join("src");
    let mut model = pattern(3 * MIB + 17, 3);
    std::fs::write(&src, &model).unwrap();
    let path = dir.path().join("up.xnd");
    let p = path.to_str().unwrap();
    // BLAKE3-checksummed 1 MiB blocks: verified whole, cannot be cut.
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        &d.addr,
        "-c",
        "1",
        "-b",
        "1M",
        "-o",
        p,
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let mut f = writer(&[&d], 1).truncate(false).open(p).unwrap();
    f.seek(SeekFrom::Start(MIB as u64 + 10)).unwrap();
    f.write_all(b"hello").unwrap();
    model[MIB + 10..MIB + 15].copy_from_slice(b"hello");
    f.set_len(2 * MIB as u64 + 500).unwrap();
    model.truncate(2 * MIB + 500);
    assert_eq!(f.metadata().unwrap().len, model.len() as u64);
    f.close().unwrap();
    assert_eq!(read_all(&path), model);
    assert_covered_once_per_copy(&path, model.len() as u64, 1);
    let out = dir.path().join("out");
    let (ok, _, err) = lors(&["download", p, "-o", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), model);

    // Grow: zeros.
    let mut f = writer(&[&d], 1).truncate(false).open(p).unwrap();
    f.set_len(model.len() as u64 + 3000).unwrap();
    f.close().unwrap();
    model.extend_from_slice(&[0; 3000]);
    assert_eq!(read_all(&path), model);
    let st = xio::stat(p).unwrap();
    assert_eq!(st.len, model.len() as u64);
    assert!(!st.readonly);
    // O_TRUNC empties it and frees the blocks.
    let f = writer(&[&d], 1).open(p).unwrap();
    assert_eq!(f.metadata().unwrap().len, 0);
    drop(f);
    assert!(lors::xnd::load(&path).unwrap().mappings.is_empty());
}

#[test]
fn errors_a_program_understands() {
    let dir = tempdir();
    let mut d = DepotProc::start(&dir.path().join("d"), &["--size", "3M"]);
    let path = dir.path().join("f.xnd");
    let p = path.to_str().unwrap();
    let data = pattern(2 * MIB, 9);
    let mut f = writer(&[&d], 1).open(p).unwrap();
    f.write_all(&data).unwrap();
    f.close().unwrap();

    // Missing file: ENOENT; write without O_CREAT on a missing file too.
    let e = reader()
        .open(dir.path().join("none.xnd").to_str().unwrap())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    // Read-only file handle: EBADF on write.
    let mut r = reader().open(p).unwrap();
    assert_eq!(r.write(b"x").unwrap_err().raw_os_error(), Some(9));

    // An exNode without write capabilities is read-only: EROFS.
    let mut x = lors::xnd::load(&path).unwrap();
    for m in &mut x.mappings {
        m.write = None;
    }
    let ro = dir.path().join("ro.xnd");
    lors::xnd::save(&ro, &x).unwrap();
    let e = writer(&[&d], 1)
        .truncate(false)
        .open(ro.to_str().unwrap())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ReadOnlyFilesystem, "{e}");
    assert!(xio::stat(ro.to_str().unwrap()).unwrap().readonly);

    // No room on the only depot: ENOSPC, and the saved exNode is untouched.
    let full = dir.path().join("full.xnd");
    let mut f = writer(&[&d], 1).open(full.to_str().unwrap()).unwrap();
    let wrote = f
        .write_all(&pattern(4 * MIB, 1))
        .and_then(|()| f.sync_all());
    let e = wrote.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StorageFull, "{e}");
    drop(f);
    assert!(lors::xnd::load(&full).unwrap().mappings.is_empty());

    // The only depot gone: EIO (ErrorKind::Other) on read, not a hang.
    d.kill9();
    let mut f = reader().open(p).unwrap();
    let mut b = vec![0u8; 4096];
    let e = f.read(&mut b).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Other, "{e}");
}
