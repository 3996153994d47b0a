//! `lors::xio::File` against real depots: write coalescing, overwrites,
//! O_RDWR, truncate, stat, read-ahead and random reads, and the errors a
//! program sees.

use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::Path;

use lors::settings::{Env, Layer, Settings};
use lors::xio::{self, OpenOptions};

use crate::tools::used;
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

/// Each byte once per copy, or in a hole (a file grown past its end):
/// no stale range left beside a new one.
fn assert_covered_once_per_copy(path: &Path, size: u64, copies: usize) {
    let x = lors::xnd::load(path).unwrap();
    assert_eq!(x.logical_size(), size);
    let total: u64 = x.mappings.iter().map(|m| m.logical_length).sum();
    let stored = size - x.hole_bytes();
    assert_eq!(
        total,
        stored * copies as u64,
        "{:#?} {:?}",
        x.mappings,
        x.holes
    );
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
    // A random read fetches its 1 MiB; a read just past that stretch, a
    // scan from there and a look back behind the scan's read-ahead each
    // get their own bytes.
    let mut f = reader().open(p).unwrap();
    for (off, len) in [
        (100 << 10, 4096),
        (MIB + MIB / 2, 4096),
        (MIB + MIB / 2 + 4096, MIB),
        (MIB, 4096),
    ] {
        let mut b = vec![0u8; len];
        f.seek(SeekFrom::Start(off as u64)).unwrap();
        f.read_exact(&mut b).unwrap();
        assert_eq!(b, model[off..off + len], "at {off}");
    }
}

/// Bytes with no period, so a piece served at the wrong offset shows.
fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// 12 MiB and a bit of noise written as one copy over two new depots;
/// the depots (stopped when dropped), the exNode and the bytes.
fn noise_on_two_depots(dir: &Path) -> (DepotProc, DepotProc, std::path::PathBuf, Vec<u8>) {
    let d1 = DepotProc::start(&dir.join("d1"), &[]);
    let d2 = DepotProc::start(&dir.join("d2"), &[]);
    let path = dir.join("f.xnd");
    let model = noise(12 * MIB + 777);
    let mut f = writer(&[&d1, &d2], 1).open(path.to_str().unwrap()).unwrap();
    f.write_all(&model).unwrap();
    f.close().unwrap();
    (d1, d2, path, model)
}

/// Thread `t`'s reads of a file of `len` bytes: threads 0-3 their quarter,
/// thread 4 the whole file backwards; in a row, of `sizes` in turn
/// (starting at the `t`th).
fn scan(t: usize, len: usize, sizes: &[usize]) -> Vec<(usize, usize)> {
    let quarter = len / 4;
    let (mut off, end) = match t {
        4 => (0, len),
        _ => (t * quarter, (t + 1) * quarter),
    };
    let mut spans = Vec::new();
    let mut i = t;
    while off < end {
        let len = sizes[i % sizes.len()].min(end - off);
        spans.push((off, len));
        off += len;
        i += 1;
    }
    if t == 4 {
        spans.reverse();
    }
    spans
}

/// A file's shared reads (the FUSE mount's threads use them): threads
/// reading at once, out of order, each get their own bytes; a read whose
/// block is stuck on an unresponsive depot holds back none of the others.
#[test]
fn shared_reads_serve_threads_at_once_and_wait_only_for_their_own_bytes() {
    let dir = tempdir();
    let (_d1, _d2, path, model) = noise_on_two_depots(dir.path());
    let p = path.to_str().unwrap();

    // Four threads, each a sequential scan of its own quarter in requests
    // of varied sizes, plus one reading the whole file backwards.
    let reads = reader().open(p).unwrap().reads().unwrap();
    let model = std::sync::Arc::new(model);
    let mut threads = Vec::new();
    for t in 0..5 {
        let (reads, model) = (reads.clone(), model.clone());
        threads.push(std::thread::spawn(move || {
            let sizes = [4096, 131072, 1000, MIB];
            for (off, len) in scan(t, model.len(), &sizes) {
                let got = reads.read_with(off as u64, len, |b| b.to_vec()).unwrap();
                assert!(got == model[off..off + len], "thread {t} at {off}+{len}");
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    // Past the end: nothing; across it: what there is.
    let n = model.len() as u64;
    assert_eq!(reads.read_with(n, 4096, |b| b.len()).unwrap(), 0);
    assert_eq!(reads.read_with(n - 10, 4096, |b| b.len()).unwrap(), 10);

    // The last whole block's copy moved to a depot that takes connections
    // and never answers.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    let mut x = lors::xnd::load(&path).unwrap();
    let tail = 11 * MIB;
    let last = (x.mappings.iter_mut())
        .find(|m| m.exnode_offset == tail as u64 && m.logical_length == MIB as u64)
        .unwrap();
    for cap in [&mut last.read, &mut last.write, &mut last.manage] {
        cap.as_mut().unwrap().port = port;
    }
    let stuck = dir.path().join("stuck.xnd");
    lors::xnd::save(&stuck, &x).unwrap();
    let reads = reader()
        .open(stuck.to_str().unwrap())
        .unwrap()
        .reads()
        .unwrap();
    // Reading from the start sets the read-ahead going through the file.
    assert!(reads.read_with(0, 4096, |b| b == &model[..4096]).unwrap());
    // Two reads in the stuck block: one takes the read-ahead's next piece
    // and waits on the depot, the other waits for it.
    let (started, waiting) = std::sync::mpsc::channel();
    let blocked: Vec<_> = [tail, tail + MIB / 2]
        .into_iter()
        .map(|off| {
            let (reads, started) = (reads.clone(), started.clone());
            std::thread::spawn(move || {
                started.send(()).unwrap();
                reads.read_with(off as u64, 4096, |b| b.to_vec())
            })
        })
        .collect();
    waiting.recv().unwrap();
    waiting.recv().unwrap();
    hole.set_nonblocking(true).unwrap();
    let asked = std::time::Instant::now();
    let conn = loop {
        match hole.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(
                    asked.elapsed().as_secs() < 30,
                    "nobody asked for the stuck block"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Bytes before the stuck block are read while that read still waits.
    let at = tail - 3 * MIB;
    let got = reads.read_with(at as u64, MIB, |b| b.to_vec()).unwrap();
    assert!(got == model[at..at + MIB]);
    assert!(
        blocked.iter().all(|t| !t.is_finished()),
        "the stuck block's reads wait on"
    );
    // The stuck depot gone, both its reads fail (no other copy): EIO.
    drop((conn, hole));
    for t in blocked {
        let e = t.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Other, "{e}");
    }
}

/// A read-ahead that keeps its pieces in kernel pipes (the mount's, which
/// splices them into its replies): threads reading at once get their own
/// bytes whether copied out (`read_with`) or passed on into a pipe
/// (`splice_to`), pieces are read again as often as asked, and the file's
/// end is where it was.
#[test]
fn spliced_reads_give_the_bytes_by_copy_and_into_a_pipe() {
    let dir = tempdir();
    let (_d1, _d2, path, model) = noise_on_two_depots(dir.path());
    let p = path.to_str().unwrap();

    let reads = reader().spliced(true).open(p).unwrap().reads().unwrap();
    let model = std::sync::Arc::new(model);
    let mut threads = Vec::new();
    for t in 0..5 {
        let (reads, model) = (reads.clone(), model.clone());
        threads.push(std::thread::spawn(move || {
            // (What a 1 MiB pipe surely holds, however the bytes arrived.)
            let sizes = [4096, 131072, 1000, 262144];
            let (r, w) = lors_ibp::spliced::pipe(MIB).unwrap();
            let mut r = std::fs::File::from(r);
            for (k, (off, len)) in scan(t, model.len(), &sizes).into_iter().enumerate() {
                let got = if (t + k) % 2 == 0 {
                    reads.read_with(off as u64, len, |b| b.to_vec()).unwrap()
                } else {
                    use std::os::fd::AsFd;
                    let n = reads.splice_to(off as u64, len, w.as_fd()).unwrap();
                    assert_eq!(n, len);
                    let mut v = vec![0u8; len];
                    r.read_exact(&mut v).unwrap();
                    v
                };
                assert!(got == model[off..off + len], "thread {t} at {off}+{len}");
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        lors_ibp::spliced::held() > 0,
        lors_ibp::spliced::unlimited(),
        "the cache holds pipes (with privilege; without, memory)"
    );
    let n = model.len() as u64;
    let (r, w) = lors_ibp::spliced::pipe(MIB).unwrap();
    use std::os::fd::AsFd;
    assert_eq!(reads.splice_to(n, 4096, w.as_fd()).unwrap(), 0);
    assert_eq!(reads.splice_to(n - 10, 4096, w.as_fd()).unwrap(), 10);
    let mut tail = Vec::new();
    drop(w);
    std::fs::File::from(r).read_to_end(&mut tail).unwrap();
    assert_eq!(tail, &model[model.len() - 10..]);
    // A plain read of the file, pieces copied out of their pipes.
    let mut all = Vec::new();
    let mut f = reader().spliced(true).open(p).unwrap();
    f.read_to_end(&mut all).unwrap();
    assert!(all == *model);
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
    // BLAKE3-checksummed 1 MiB blocks: a write stores each one it touches whole.
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

    // Grow: zeros (a hole, nothing stored).
    let mut f = writer(&[&d], 1).truncate(false).open(p).unwrap();
    f.set_len(model.len() as u64 + 3000).unwrap();
    f.close().unwrap();
    model.extend_from_slice(&[0; 3000]);
    assert_eq!(read_all(&path), model);
    let st = xio::stat(p).unwrap();
    assert_eq!(st.len, model.len() as u64);
    assert!(!st.readonly);
    // O_TRUNC empties it and frees the blocks: the depot holds nothing.
    let f = writer(&[&d], 1).open(p).unwrap();
    assert_eq!(f.metadata().unwrap().len, 0);
    drop(f);
    assert!(lors::xnd::load(&path).unwrap().mappings.is_empty());
    assert_eq!(
        used(&d),
        0,
        "every allocation, old and superseded, was released"
    );
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

    // No room on the only depot: ENOSPC, and the saved exNode is untouched,
    // and what was stored before the failure is released (nothing on the
    // depot that no exNode names).
    let before = used(&d);
    let full = dir.path().join("full.xnd");
    let mut f = writer(&[&d], 1).open(full.to_str().unwrap()).unwrap();
    let wrote = f
        .write_all(&pattern(4 * MIB, 1))
        .and_then(|()| f.sync_all());
    let e = wrote.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StorageFull, "{e}");
    drop(f);
    assert!(lors::xnd::load(&full).unwrap().mappings.is_empty());
    assert_eq!(
        used(&d),
        before,
        "the blocks stored before ENOSPC were released"
    );

    // The only depot gone: EIO (ErrorKind::Other) on read, not a hang.
    d.kill9();
    let mut f = reader().open(p).unwrap();
    let mut b = vec![0u8; 4096];
    let e = f.read(&mut b).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Other, "{e}");
}

/// `libxio.so` and `include/xio.h` as `cargo build` leaves them beside the
/// `lors` binary under test (built now if this test runs alone).
fn libxio() -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_lors"))
        .parent()
        .unwrap()
        .to_path_buf();
    if !dir.join("libxio.so").exists() || !dir.join("include/xio.h").exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "-p", "lors-xio-ffi"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(cmd.status().unwrap().success(), "building libxio");
    }
    dir
}

#[test]
fn c_program_reads_and_writes_through_libxio() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &[]);
    let lib = libxio();
    // ldd-clean: every library it needs is found.
    let ldd = std::process::Command::new("ldd")
        .arg(lib.join("libxio.so"))
        .output()
        .unwrap();
    let ldd = String::from_utf8_lossy(&ldd.stdout);
    assert!(!ldd.contains("not found"), "{ldd}");
    let exe = dir.path().join("xio_test");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../xio-ffi/tests/xio_test.c");
    let out = std::process::Command::new("gcc")
        .args([
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-D_DEFAULT_SOURCE",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-I{}", lib.join("include").display()))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lxio")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Depots as a user's ~/.xndrc names them.
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let (host, port) = d.addr.rsplit_once(':').unwrap();
    std::fs::write(
        home.join(".xndrc"),
        format!("DEPOT {host} {port}\nCOPIES 1\n"),
    )
    .unwrap();
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let run = std::process::Command::new(&exe)
        .arg(&scratch)
        .env("HOME", &home)
        .env("XIO_DEBUG", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(
        run.status.success() && stdout.contains("xio_test: ok"),
        "{stdout}\n{stderr}"
    );
    // The exNode it wrote is an ordinary one: the tools read it.
    let xnd = scratch.join("c.xnd");
    let (ok, bytes, err) = lors(&["download", xnd.to_str().unwrap(), "-o", "-"]);
    assert!(ok, "{err}");
    assert_eq!(bytes.len(), 2_000_003);
    assert_eq!(&bytes[1048570..1048580], b"0123456789");
    assert_eq!(&bytes[2_000_000..], b"end");
}

#[test]
fn a_second_writer_never_overwrites_the_first_nor_strands_its_blocks() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &[]);
    let path = dir.path().join("f.xnd");
    let p = path.to_str().unwrap();
    let mut a = writer(&[&d], 1).open(p).unwrap();
    let mut b = writer(&[&d], 1).truncate(false).open(p).unwrap();
    a.write_all(&pattern(MIB, 1)).unwrap();
    b.write_all(&pattern(MIB, 2)).unwrap();
    a.close().unwrap();
    // b read the exNode before a saved: its save would drop a's blocks.
    let e = b.close().unwrap_err();
    assert!(e.to_string().contains("changed by another writer"), "{e}");
    assert_eq!(
        read_all(&path),
        pattern(MIB, 1),
        "the first writer's file is intact"
    );
    let conflict = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(".conflict-"))
        .expect("the second writer's version is saved beside it");
    assert_eq!(read_all(&conflict), pattern(MIB, 2));
    // Every block on the depot is named by one of the two exNodes.
    assert_eq!(used(&d), 2 * MIB as u64);
}

/// A write through xio (and so the mount) gives the bytes it writes as
/// many replicas as the file keeps, or fails: never fewer, silently.
#[test]
fn writes_keep_the_files_copies_or_fail() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = (0..3)
        .map(|i| DepotProc::start(&dir.path().join(format!("d{i}")), &["--sync", "never"]))
        .collect();
    let mut model = pattern(2 * MIB, 17);
    let src = dir.path().join("m.dat");
    std::fs::write(&src, &model).unwrap();
    let path = dir.path().join("m.xnd");
    let p = path.to_str().unwrap();
    let depots = ds
        .iter()
        .map(|d| d.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let (ok, _, err) = lors(&[
        "upload",
        "-q",
        "-c",
        "2",
        "-b",
        "1M",
        "--depot",
        &depots,
        "-o",
        p,
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    // Five bytes written at 1000 by a program that says nothing of copies
    // (no -c, no COPIES): they get the file's two.
    let rdwr = |depots: &[&DepotProc]| {
        let mut o = OpenOptions::new();
        o.read(true)
            .write(true)
            .depots(depots.iter().map(|d| d.addr.clone()).collect())
            .settings(settings(Layer::default()));
        o
    };
    let mut f = rdwr(&[&ds[0], &ds[1], &ds[2]]).open(p).unwrap();
    f.seek(SeekFrom::Start(1000)).unwrap();
    f.write_all(b"PATCH").unwrap();
    f.close().unwrap();
    model[1000..1005].copy_from_slice(b"PATCH");
    let x = lors::xnd::load(&path).unwrap();
    let holders: std::collections::BTreeSet<String> = (x.mappings.iter())
        .filter(|m| m.exnode_offset <= 1000 && m.exnode_offset + m.logical_length >= 1005)
        .filter_map(|m| m.depot())
        .collect();
    assert_eq!(holders.len(), 2, "{:#?}", x.mappings);
    // Either copy alone serves the patched bytes.
    for gone in &holders {
        let d = ds.iter().find(|d| &d.addr == gone).unwrap();
        d.signal("STOP");
        let mut o = reader();
        o.settings(settings(Layer {
            timeout: Some(std::time::Duration::from_secs(3)),
            ..Layer::default()
        }));
        let mut got = Vec::new();
        o.open(p).unwrap().read_to_end(&mut got).unwrap();
        d.signal("CONT");
        assert!(
            got == model,
            "with {gone} stopped the file reads differently"
        );
    }
    // Only one depot to write to: the write fails with ENOSPC, and the
    // file on disk is as it was.
    let mut f = rdwr(&[&ds[0]]).open(p).unwrap();
    f.seek(SeekFrom::Start(50)).unwrap();
    f.write_all(b"LOST").unwrap();
    let e = f.close().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StorageFull, "{e}");
    assert!(e.to_string().contains("2 copies"), "{e}");
    assert!(read_all(&path) == model);
}

/// A hung depot (stopped: it accepts and never answers) costs reads and
/// writes through xio the stall time, not the timeout, when other depots
/// hold the bytes or can take them.
#[test]
fn xio_reads_and_writes_around_a_hung_depot() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = (0..4)
        .map(|i| DepotProc::start(&dir.path().join(format!("d{i}")), &["--sync", "never"]))
        .collect();
    let all: Vec<&DepotProc> = ds.iter().collect();
    let path = dir.path().join("h.xnd");
    let p = path.to_str().unwrap();
    let model = pattern(8 * MIB, 29);
    let mut f = writer(&all, 2).open(p).unwrap();
    f.write_all(&model).unwrap();
    f.close().unwrap();
    ds[1].signal("STOP");
    let slow = || {
        settings(Layer {
            timeout: Some(std::time::Duration::from_secs(60)),
            ..Layer::default()
        })
    };
    let t0 = std::time::Instant::now();
    let mut got = Vec::new();
    let mut o = reader();
    o.settings(slow());
    o.open(p).unwrap().read_to_end(&mut got).unwrap();
    assert!(got == model);
    let mut w = OpenOptions::new();
    w.read(true)
        .write(true)
        .buffer(MIB)
        .depots(all.iter().map(|d| d.addr.clone()).collect())
        .settings(slow());
    let mut f = w.open(p).unwrap();
    f.seek(SeekFrom::Start(3 * MIB as u64)).unwrap();
    f.write_all(&pattern(2 * MIB, 30)).unwrap();
    f.close().unwrap();
    let took = t0.elapsed();
    ds[1].signal("CONT");
    assert!(
        took < std::time::Duration::from_secs(30),
        "a read and a write took {took:?}: the 60 s timeout was waited out"
    );
    let mut want = model;
    want[3 * MIB..5 * MIB].copy_from_slice(&pattern(2 * MIB, 30));
    assert!(read_all(&path) == want);
}

/// Single bytes written each past the end, as sqlite3 grows its WAL
/// index one page at a time (a byte at the end of each page): every gap
/// reads as zeros, with the writes still in flight or landed, before and
/// after the save.
#[test]
fn bytes_written_past_the_end_one_page_apart_read_back_with_zeros_between() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = (0..3)
        .map(|i| DepotProc::start(&dir.path().join(format!("d{i}")), &[]))
        .collect();
    let p = dir.path().join("shm.xnd");
    let mut o = writer(&ds.iter().collect::<Vec<_>>(), 2);
    o.read(true).buffer(10 << 20);
    let mut f = o.open(p.to_str().unwrap()).unwrap();
    let mut want = vec![0u8; 8 * 4096];
    for i in 0..8u64 {
        let at = i * 4096 + 4095;
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&[i as u8 + 1]).unwrap();
        want[at as usize] = i as u8 + 1;
    }
    // As the mount reads: a page at a time from the cache, without a copy.
    let mut got = Vec::new();
    for page in 0..8 {
        got.extend(f.read_with(page * 4096, 4096, |b| b.to_vec()).unwrap());
    }
    assert!(got == want, "read back before the save");
    let mut got = vec![0u8; want.len()];
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut got).unwrap();
    assert!(got == want, "read back before the save");
    f.close().unwrap();
    assert!(read_all(&p) == want, "read back after the save");
    assert_covered_once_per_copy(&p, want.len() as u64, 2);
}
