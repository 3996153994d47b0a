//! The LoRS tools (`lors upload/download/ls`) against real depots.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lors::download::{DownloadOptions, Output, download};
use lors::upload::{UploadOptions, upload};
use lors::{NoProgress, Pool};
use lors_ibp::proto::Reliability;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::util::{
    DepotProc, client_cfg, depots, flip_stored_byte, free_block, lors, lors_cmd, lors_within,
    lors_within_env, pattern, tempdir,
};

fn depot_args(ds: &[DepotProc]) -> Vec<String> {
    ds.iter()
        .flat_map(|d| ["--depot".to_string(), d.addr.clone()])
        .collect()
}

/// Every copy of a block sits on a different depot.
fn assert_distinct_replicas(x: &lors_exnode::ExNode) {
    let mut by_block: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    for m in &x.mappings {
        by_block
            .entry(m.exnode_offset)
            .or_default()
            .push(m.depot().unwrap());
    }
    for (off, ds) in by_block {
        let set: HashSet<_> = ds.iter().collect();
        assert_eq!(
            set.len(),
            ds.len(),
            "block {off}: replicas share a depot: {ds:?}"
        );
    }
}

#[test]
fn round_trips_over_sizes_block_sizes_copies_and_threads() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let addrs: Vec<String> = ds.iter().map(|d| d.addr.clone()).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        prop_oneof![Just(0usize), Just(1), 2usize..5000, 5000usize..300_000],
        prop_oneof![Just(1024u64), Just(4096), 1000u64..70_000],
        1usize..=3,
        1usize..=6,
        any::<u8>(),
        (0usize..8, 100u64..5000),
    );
    runner
        .run(
            &strategy,
            |(size, bs, copies, threads, seed, (which, ebs))| {
                use lors_exnode::functions::{Chain, Codec, LegacyChain, LegacyKind, Step};
                let key = Step::random_key().unwrap();
                let native = |steps| {
                    Some(Codec::Native(Chain {
                        block_size: ebs,
                        steps,
                    }))
                };
                // The original LoRS formats, as lors_upload writes them.
                let legacy = |kinds| Some(Codec::Legacy(LegacyChain::new(ebs, kinds)));
                let chain = match which {
                    0 => None,
                    1 => native(vec![Step::Blake3]),
                    2 => native(vec![Step::Md5]),
                    3 => native(vec![
                        Step::Zstd { level: 3 },
                        Step::Aes256Gcm { key },
                        Step::Blake3,
                    ]),
                    4 => native(vec![Step::ChaCha20Poly1305 { key }, Step::Md5]),
                    5 => legacy(vec![LegacyKind::Aes { key: [3; 16] }, LegacyKind::Checksum]),
                    6 => legacy(vec![
                        LegacyKind::Xor {
                            key: b"q7&Zp0!".to_vec(),
                        },
                        LegacyKind::Checksum,
                    ]),
                    _ => legacy(vec![LegacyKind::Zlib, LegacyKind::Checksum]),
                };
                let data = pattern(size, seed);
                let opts = UploadOptions {
                    depots: addrs.clone(),
                    block_size: bs,
                    copies,
                    threads,
                    duration: std::time::Duration::from_secs(600),
                    reliability: Reliability::Hard,
                    filename: "p.bin".into(),
                    erasure: None,
                    sparse: false,
                    auto_threads: false,
                    auto_block_size: false,
                    e2e: chain.clone(),
                };
                let (x, back) = rt.block_on(async {
                    let pool = Arc::new(Pool::new(client_cfg()));
                    let x = upload(
                        &data[..],
                        Some(size as u64),
                        &opts,
                        pool.clone(),
                        Arc::new(NoProgress),
                    )
                    .await
                    .unwrap()
                    .exnode;
                    let (tx, mut rx) = tokio::io::duplex(1 << 20);
                    let dl = DownloadOptions {
                        block_size: bs.max(4096),
                        ..DownloadOptions::default()
                    };
                    let reader = tokio::spawn(async move {
                        let mut v = Vec::new();
                        tokio::io::AsyncReadExt::read_to_end(&mut rx, &mut v)
                            .await
                            .unwrap();
                        v
                    });
                    download(
                        &x,
                        Output::Stream {
                            writer: Box::new(tx),
                            name: "the test pipe".into(),
                        },
                        &dl,
                        pool,
                        Arc::new(NoProgress),
                    )
                    .await
                    .unwrap();
                    (x, reader.await.unwrap())
                });
                prop_assert_eq!(x.logical_size(), size as u64);
                prop_assert_eq!(
                    x.mappings.len(),
                    (size as u64).div_ceil(bs) as usize * copies
                );
                assert_distinct_replicas(&x);
                prop_assert!(
                    back == data,
                    "downloaded bytes differ (size {}, bs {}, copies {})",
                    size,
                    bs,
                    copies
                );
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn cli_upload_ls_download_and_stream() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let data = pattern(3_000_001, 5);
    let xnd = upload_cli(&ds, dir.path(), "in.bin", &data, &["-c", "2", "-b", "256K"]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&xnd).unwrap().permissions().mode() & 0o777,
        0o600,
        "exNodes with write caps are secrets"
    );
    let x = lors_exnode::xml::parse(&std::fs::read(&xnd).unwrap()).unwrap();
    assert_eq!(x.filename(), Some("in.bin"));
    assert_eq!(x.mappings.len(), 12 * 2);
    assert_distinct_replicas(&x);
    // ls: LoRS rows, every mapping probed as hard, 1 read ref, byte array.
    let (ok, out, err) = lors(&["ls", xnd.to_str().unwrap()]);
    assert!(ok, "{err}");
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text.lines().filter(|l| l.contains(" Hrwma  1 ")).count(),
        24,
        "{text}"
    );
    let (ok, out, _) = lors(&["ls", "--json", xnd.to_str().unwrap()]);
    assert!(ok);
    let json = String::from_utf8(out).unwrap();
    assert!(
        json.contains("\"size\":3000001") && json.contains("\"reliability\":\"hard\""),
        "{json}"
    );
    // Download to a file and to stdout.
    let dst = dir.path().join("out.bin");
    let (ok, _, err) = lors(&[
        "download",
        "--quiet",
        "-o",
        dst.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&dst).unwrap() == data);
    let (ok, out, err) = lors(&["download", "--quiet", "-o", "-", xnd.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out == data);
    // JSON summaries for scripts.
    let (ok, out, _) = lors(&[
        "download",
        "--quiet",
        "--json",
        "-o",
        dst.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok);
    let j = String::from_utf8(out).unwrap();
    let done = j.lines().last().unwrap_or_default();
    assert!(
        done.starts_with("{\"event\":\"done\",\"op\":\"download\",\"done\":3000001,")
            && done.contains("\"bytes\":3000001,\"resumed_bytes\":0,")
            && done.contains("\"per_depot\":[{\"depot\":"),
        "{j}"
    );
    // A byte range.
    let (ok, out, _) = lors(&[
        "download",
        "--quiet",
        "-O",
        "1000",
        "-L",
        "300000",
        "-o",
        "-",
        xnd.to_str().unwrap(),
    ]);
    assert!(ok);
    assert!(out == data[1000..301_000]);
}

#[test]
fn download_completes_from_replicas_when_a_depot_dies_mid_transfer() {
    let dir = tempdir();
    let mut ds = depots(3, dir.path());
    let data = pattern(40 << 20, 9);
    let xnd = upload_cli(&ds, dir.path(), "big.bin", &data, &["-c", "2", "-b", "1M"]);
    let dst = dir.path().join("big.out");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_lors"))
        .args([
            "download",
            "--quiet",
            "-a",
            "1",
            "-b",
            "256K",
            "-o",
            dst.to_str().unwrap(),
            xnd.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(150));
    ds[1].kill9();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&dst).unwrap() == data,
        "output differs after a depot died"
    );
}

#[test]
fn interrupted_download_resumes_without_refetching_finished_blocks() {
    let dir = tempdir();
    let mut ds = depots(2, dir.path());
    let data = pattern(8 << 20, 3);
    let xnd = upload_cli(&ds, dir.path(), "r.bin", &data, &["-c", "1", "-b", "512K"]);
    // One depot goes away: with one copy, its blocks are unreachable.
    let port = ds[1].port;
    let x = lors_exnode::xml::parse(&std::fs::read(&xnd).unwrap()).unwrap();
    let live: u64 = x
        .mappings
        .iter()
        .filter(|m| m.depot().unwrap() != ds[1].addr)
        .map(|m| m.logical_length)
        .sum();
    assert!(
        live > 0 && live < data.len() as u64,
        "blocks are spread over both depots"
    );
    ds[1].kill9();
    let dst = dir.path().join("r.out");
    let (ok, _, err) = lors(&[
        "download",
        "--quiet",
        "-o",
        dst.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(!ok, "must fail while blocks are unreachable");
    assert!(err.contains("could not be read from any replica"), "{err}");
    assert!(
        err.contains("r.out.lors-part") && err.contains("run the same command again"),
        "the error says where the data is and what to do: {err}"
    );
    assert!(
        !dst.exists(),
        "nothing that looks complete under the final name"
    );
    let record = dir.path().join("r.out.lors-resume");
    assert!(record.exists(), "the resume record is kept");
    assert!(dir.path().join("r.out.lors-part").exists());
    // The depot comes back (same data, same port); resume fetches only the rest.
    let _back = DepotProc::start(
        &dir.path().join("d1"),
        &["--sync", "never", "--listen", &format!("127.0.0.1:{port}")],
    );
    // The same command again resumes (no -R needed).
    let (ok, _, err) = lors(&[
        "download",
        "-o",
        dst.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains(&format!(", {live} bytes resumed")),
        "everything reachable was kept: {err}"
    );
    assert!(std::fs::read(&dst).unwrap() == data);
    assert!(!record.exists(), "the record is removed when complete");
    assert!(
        !dir.path().join("r.out.lors-part").exists(),
        "renamed into place"
    );
    // Kill the downloader itself mid-way, then resume: output identical.
    let dst2 = dir.path().join("r2.out");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lors"))
        .args([
            "download",
            "--quiet",
            "-a",
            "1",
            "-b",
            "64K",
            "-o",
            dst2.to_str().unwrap(),
            xnd.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(60));
    let _ = child.kill();
    let _ = child.wait();
    let (ok, _, err) = lors(&[
        "download",
        "--quiet",
        "-R",
        "-o",
        dst2.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&dst2).unwrap() == data);
}

#[test]
fn completions_and_man_pages_come_from_the_commands() {
    let (ok, out, err) = lors(&["completions", "bash"]);
    let bash = String::from_utf8(out).unwrap();
    assert!(ok, "{err}");
    for word in [
        "_lors()",
        "upload",
        "download",
        "--copies",
        "--prebuffer",
        "complete",
    ] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    let (ok, out, _) = lors(&["completions", "zsh"]);
    assert!(ok && String::from_utf8(out).unwrap().starts_with("#compdef lors"));
    let (ok, _, err) = lors(&["completions", "tcsh"]);
    assert!(
        !ok && err.contains("possible values") && err.contains("bash"),
        "{err}"
    );

    // One page per command, each with its options and examples.
    let dir = tempdir();
    let (ok, _, err) = lors(&["man", "--out-dir", dir.path().to_str().unwrap()]);
    assert!(ok, "{err}");
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    for want in [
        "lors.1",
        "lors-upload.1",
        "lors-download.1",
        "lors-trim.1",
        "lors-man.1",
    ] {
        assert!(
            pages.iter().any(|p| p == want),
            "{want} missing from {pages:?}"
        );
    }
    assert!(!pages.iter().any(|p| p == "lors-help.1"), "{pages:?}");
    let trim = std::fs::read_to_string(dir.path().join("lors-trim.1")).unwrap();
    assert!(trim.contains(".TH lors-trim 1"), "{trim}");
    assert!(
        trim.contains("decrement") && trim.contains("EXAMPLES"),
        "{trim}"
    );
    // Every page lors(1) names is there; examples keep their lines.
    let main = std::fs::read_to_string(dir.path().join("lors.1")).unwrap();
    for named in main.split("lors\\-").skip(1) {
        let Some((cmd, _)) = named.split_once("(1)") else {
            continue;
        };
        assert!(
            pages.contains(&format!("lors-{cmd}.1")),
            "lors(1) names lors-{cmd}(1), which has no page"
        );
    }
    let download = std::fs::read_to_string(dir.path().join("lors-download.1")).unwrap();
    assert!(
        download.contains(".nf\n  lors download \\-o run42.dat run42.xnd\n"),
        "{download}"
    );
    // Without a directory, lors(1) goes to stdout (`lors man | man -l -`).
    let (ok, out, _) = lors(&["man"]);
    let page = String::from_utf8(out).unwrap();
    assert!(
        ok && page.contains(".TH lors 1") && page.contains("lors\\-upload(1)"),
        "{page}"
    );
}

#[test]
fn tools_explain_bad_usage() {
    let dir = tempdir();
    let out = dir.path().join("x.xnd");
    let out = out.to_str().unwrap();
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        "127.0.0.1:1",
        "-c",
        "2",
        "-o",
        out,
        "/etc/hostname",
    ]);
    assert!(
        !ok && err.contains("2 copies need 2 distinct depots"),
        "{err}"
    );
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        "127.0.0.1:1",
        "-c",
        "1",
        "/etc/hostname",
    ]);
    assert!(!ok && err.contains("-o OUT.xnd"), "{err}");
    // `-b 10B` (ten bytes): refused, with the count and what to write instead.
    let src = dir.path().join("f.bin");
    std::fs::write(&src, vec![0u8; 800_000]).unwrap();
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        "127.0.0.1:1",
        "-c",
        "1",
        "-b",
        "10B",
        "-o",
        out,
        src.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("80000 allocations") && err.contains("-b 10M"),
        "{err}"
    );
    // A bare number is megabytes, as in a URI's bs=; one that cannot be
    // megabytes is refused with the spelling for bytes.
    for b in ["-b", "--block-size"] {
        let (ok, _, err) = lors(&["upload", b, "1048576", "-o", out, "f"]);
        assert!(!ok && err.contains("write 1048576B"), "{err}");
    }
    let (ok, _, err) = lors(&["ls", "lors:///x.xnd?bs=1048576"]);
    assert!(!ok && err.contains("write 1048576B"), "{err}");
    assert!(!std::path::Path::new(out).exists());
    let (ok, _, err) = lors(&["download", "-o", "/tmp/x", "/nonexistent.xnd"]);
    assert!(!ok && err.contains("reading /nonexistent.xnd"), "{err}");
    // A depot without a port is on the IBP port; a malformed one is refused
    // by name before anything is tried.
    let src = src.to_str().unwrap();
    let (ok, _, err) = lors(&["upload", "--depot", "127.0.0.1", "-c", "1", "-o", out, src]);
    assert!(!ok && err.contains("127.0.0.1:6714"), "{err}");
    let (ok, _, err) = lors(&["upload", "--depot", "d1:port", "-c", "1", "-o", out, src]);
    assert!(
        !ok && err.contains("\"d1:port\": give HOST or HOST:PORT"),
        "{err}"
    );
    assert!(!std::path::Path::new(out).exists());
    // Misspelled commands and options get the nearest spelling.
    let (ok, _, err) = lors(&["downlod", "x.xnd"]);
    assert!(
        !ok && err.contains("similar") && err.contains("download"),
        "{err}"
    );
    let (ok, _, err) = lors(&["upload", "--deopt", "127.0.0.1", "-o", out, src]);
    assert!(!ok && err.contains("--depot"), "{err}");
    // Zero where nothing could be done is a usage error, named.
    for args in [
        &["download", "-b", "0", "-o", "/tmp/x", "x.xnd"][..],
        &["download", "--memory", "0", "-o", "/tmp/x", "x.xnd"],
        &["upload", "-b", "0B", "-o", out, src],
        &["bench", "predict", "runs", "--size", "0"],
        &[
            "bench",
            "predict",
            "runs",
            "--size",
            "1M",
            "--parallel",
            "0",
        ],
    ] {
        let (ok, _, err) = lors(args);
        assert!(!ok && err.contains("invalid value '0"), "{args:?}: {err}");
    }
}

/// Every depot-list option takes a comma list as it takes repetition (a
/// list was taken for one host name, `[a,b]:6714`).
#[test]
fn depot_lists_take_commas_and_repetition_alike() {
    let dir = tempdir();
    let d1 = DepotProc::start(&dir.path().join("d1"), &[]);
    let d2 = DepotProc::start(&dir.path().join("d2"), &[]);
    let d3 = DepotProc::start(&dir.path().join("d3"), &[]);
    let src = dir.path().join("f");
    std::fs::write(&src, pattern(3 << 20, 8)).unwrap();
    let xnd = dir.path().join("f.xnd");
    let (x, s) = (xnd.to_str().unwrap(), src.to_str().unwrap());
    let list = format!("{},{}", d1.addr, d2.addr);
    let (ok, _, err) = lors(&[
        "upload", "--depot", &list, "-c", "2", "-b", "1M", "-o", x, s,
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = lors(&[
        "augment", "--depot", &d3.addr, "--depot", &list, "-c", "1", x,
    ]);
    assert!(ok, "{err}");
    let got = read_x(&xnd);
    let on = |d: &DepotProc| {
        (got.mappings.iter())
            .filter(|m| m.depot().as_deref() == Some(d.addr.as_str()))
            .count()
    };
    assert!(
        on(&d1) > 0 && on(&d2) > 0 && on(&d3) > 0,
        "{:?}",
        got.mappings
    );
    assert_eq!(got.mappings.len(), 9, "three blocks, three copies each");
}

#[test]
fn demo_runs_and_verifies() {
    let (ok, out, err) = lors(&["demo", "--size", "24M", "-b", "1M"]);
    let out = String::from_utf8(out).unwrap();
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("== killed depot") && out.contains("demo OK"),
        "{out}"
    );
    // The embedded L-Bone: its dashboard URL, and a ranking that puts the
    // Czech depot first for a client asking for "country= CZ".
    assert!(
        out.contains("== L-Bone directory and dashboard: http://127.0.0.1:"),
        "{out}"
    );
    // The URL is dead once the demo ends: it says so, and how to keep it.
    assert!(
        out.contains("up while the demo runs; --linger 120 keeps it up after"),
        "{out}"
    );
    assert!(out.contains("\"country= CZ\": Brno, "), "{out}");
    // A file smaller than one block: the depots still have room for it.
    let (ok, out, err) = lors(&["demo", "--size", "1M"]);
    let out = String::from_utf8(out).unwrap();
    assert!(ok && out.contains("demo OK"), "{out}{err}");
}

#[test]
fn lors_uris_lors_zlib_and_download_threads() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let data = pattern(3 * (1 << 20) + 77, 9);
    let src = dir.path().join("u.bin");
    std::fs::write(&src, &data).unwrap();
    // A lors:// URI as the exNode name carries block size (MB) and copies.
    let xnd = dir.path().join("u.xnd");
    let uri = format!("lors:///{}?bs=1&copies=2", xnd.display());
    let mut args = vec!["upload", "--quiet", "-o", &uri];
    let da = depot_args(&ds);
    args.extend(da.iter().map(String::as_str));
    args.push(src.to_str().unwrap());
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    let x = read_x(&xnd);
    assert_eq!(x.mappings.len(), 4 * 2, "1 MiB blocks, 2 copies");
    assert_distinct_replicas(&x);
    // The same bare number means the same in -b and in LORS_BLOCKSIZE.
    for (flag, env) in [(Some("1"), None), (None, Some("1"))] {
        let x2 = dir.path().join("u2.xnd");
        let mut args = vec!["upload", "--quiet", "--force", "-c", "2", "-o"];
        args.push(x2.to_str().unwrap());
        if let Some(b) = flag {
            args.extend(["-b", b]);
        }
        args.extend(da.iter().map(String::as_str));
        args.push(src.to_str().unwrap());
        let env: Vec<(&str, &str)> = env.map(|v| ("LORS_BLOCKSIZE", v)).into_iter().collect();
        let (ok, _, err) = crate::util::lors_env(&args, &env);
        assert!(ok, "{err}");
        let y = read_x(&x2);
        assert_eq!(y.mappings.len(), 4 * 2, "-b 1 / LORS_BLOCKSIZE=1 is 1 MiB");
    }
    // Read back through a URI with settings, with a thread cap and a small
    // prebuffer, to stdout in order.
    let (ok, out, err) = lors(&[
        "download",
        "--quiet",
        "-t",
        "1",
        "--prebuffer",
        "2",
        "-o",
        "-",
        &format!("lors:///{}?threads=2&timeout=30", xnd.display()),
    ]);
    assert!(ok, "{err}");
    assert!(out == data);
    let (ok, _, err) = lors(&["ls", "lors:///nonexistent.xnd?colour=red"]);
    assert!(!ok && err.contains("unknown parameter"), "{err}");

    // LoRS zlib (+ MD5 checksum outermost): the original function names and
    // layout, compressed, and our download reads it back.
    let text = b"the same line again and again\n".repeat(40_000);
    let z = upload_cli(&ds, dir.path(), "z.txt", &text, &["-c", "1", "--zlib"]);
    let xz = read_x(&z);
    let f = xz.mappings[0].function.as_ref().unwrap();
    let names: Vec<&str> = f.chain().iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["checksum", "zlib_compress"]);
    assert!(xz.mappings[0].alloc_length < xz.mappings[0].logical_length / 10);
    let back = dir.path().join("z.back");
    let (ok, _, err) = lors(&[
        "download",
        "--quiet",
        "-o",
        back.to_str().unwrap(),
        z.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&back).unwrap() == text);
    let (ok, _, err) = lors(&[
        "upload", "--zlib", "-k", "blake3", "--depot", "h:1", "-o", "x.xnd", "f",
    ]);
    assert!(!ok && err.contains("-k md5"), "{err}");
}

/// `lors upload -q FLAGS…` of `data` to every depot of `ds`
/// ([`crate::util::upload`] for owned depots); returns the exNode path.
fn upload_cli(
    ds: &[DepotProc],
    dir: &Path,
    name: &str,
    data: &[u8],
    flags: &[&str],
) -> std::path::PathBuf {
    crate::util::upload(&ds.iter().collect::<Vec<_>>(), dir, name, data, flags)
}

fn read_x(p: &Path) -> lors_exnode::ExNode {
    lors_exnode::xml::parse(&std::fs::read(p).unwrap()).unwrap()
}

async fn probe(m: &lors_exnode::Mapping) -> Result<lors_ibp::ProbeInfo, lors_ibp::Error> {
    let cap = m.manage.as_ref().unwrap();
    let mut c = lors_ibp::Connection::connect(&cap.address(), &client_cfg()).await?;
    c.probe(cap).await
}

/// `lors refresh` in every mode against a depot as strict as the reference
/// one, which refuses CHNG with max size 0 ("keep" on our lenient depot).
#[tokio::test(flavor = "multi_thread")]
async fn refresh_works_against_a_depot_as_strict_as_the_reference() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("strict"), &["--sync", "never", "--strict"]);
    let data = pattern(300_000, 4);
    let xnd = upload_cli(
        std::slice::from_ref(&d),
        dir.path(),
        "s.bin",
        &data,
        &["-c", "1", "-b", "100K", "-d", "1h"],
    );
    let x = read_x(&xnd);
    let before: Vec<_> = {
        let mut v = Vec::new();
        for m in &x.mappings {
            v.push(probe(m).await.unwrap());
        }
        v
    };
    for (mode, want) in [
        (["--to", "3h"], 3 * 3600),
        (["--by", "1h"], 4 * 3600),
        (["--max", ""], 30 * 86_400),
    ] {
        let mut args = vec!["refresh", mode[0]];
        if !mode[1].is_empty() {
            args.push(mode[1]);
        }
        args.push(xnd.to_str().unwrap());
        let (ok, _, err) = lors(&args);
        assert!(ok, "refresh {mode:?} on a strict depot: {err}");
        for (m, b) in x.mappings.iter().zip(&before) {
            let p = probe(m).await.unwrap();
            assert!(
                (want - 10..=want).contains(&p.seconds_left),
                "{mode:?}: {p:?}"
            );
            assert_eq!(
                (p.max_size, p.reliability, p.size),
                (b.max_size, b.reliability, b.size)
            );
        }
    }
    let out = dir.path().join("s.out");
    let (ok, _, err) = lors(&[
        "download",
        "-o",
        out.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
}

#[tokio::test(flavor = "multi_thread")]
async fn augment_trim_refresh_modify_route_as_the_depots_see_them() {
    let dir = tempdir();
    let ds = depots(4, dir.path());
    let data = pattern(450_000, 11);
    let xnd = upload_cli(
        &ds[..2],
        dir.path(),
        "m.bin",
        &data,
        &["-c", "1", "-b", "100K"],
    );
    let x0 = read_x(&xnd);
    assert_eq!(x0.mappings.len(), 5);

    // augment: one more replica of each block, on depots 3/4 only.
    let aug = dir.path().join("aug.xnd");
    let (ok, _, err) = lors(&[
        "augment",
        "--quiet",
        "--depot",
        &ds[2].addr,
        "--depot",
        &ds[3].addr,
        "-c",
        "1",
        "-o",
        aug.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let x1 = read_x(&aug);
    assert_eq!(x1.mappings.len(), 10);
    assert_distinct_replicas(&x1);
    for m in &x1.mappings[5..] {
        let d = m.depot().unwrap();
        assert!(d == ds[2].addr || d == ds[3].addr, "new replica on {d}");
        let p = probe(m).await.unwrap();
        assert_eq!(
            p.size, m.alloc_length,
            "the depot holds the copied (encoded) bytes"
        );
    }

    // Two files now name the originals, each with its reference.
    for m in &x1.mappings[..5] {
        assert_eq!(
            probe(m).await.unwrap().read_refs,
            2,
            "m.bin.xnd's and aug.xnd's"
        );
    }

    // trim into a new file: the input keeps its references, nothing is
    // freed; removing both files that name the originals frees them
    // (probe: not found), and the new file downloads from its replicas.
    let trimmed = dir.path().join("trim.xnd");
    let (ok, _, err) = lors(&[
        "trim",
        "--depot",
        &ds[0].addr,
        "--depot",
        &ds[1].addr,
        "--decrement",
        "-o",
        trimmed.to_str().unwrap(),
        aug.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let x2 = read_x(&trimmed);
    assert_eq!(x2.mappings.len(), 5);
    for m in &x1.mappings[..5] {
        assert_eq!(probe(m).await.unwrap().read_refs, 2, "not freed: named");
    }
    for f in [&aug, &xnd] {
        let (ok, _, err) = lors(&["rm", "-q", f.to_str().unwrap()]);
        assert!(ok, "{err}");
    }
    for m in &x1.mappings[..5] {
        let e = probe(m).await.unwrap_err();
        assert_eq!(
            e.status().unwrap().code(),
            -4,
            "released allocation is gone"
        );
    }
    let out = dir.path().join("m.out");
    let (ok, _, err) = lors(&[
        "download",
        "--quiet",
        "-o",
        out.to_str().unwrap(),
        trimmed.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
    // Removing the last replica needs --allow-holes.
    let (ok, _, err) = lors(&[
        "trim",
        "-m",
        "0",
        "-o",
        "/dev/null",
        trimmed.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("last replica"), "{err}");

    // refresh: leases as the depots report them; a summary, not a line
    // per allocation (those come with -v).
    let (ok, out, err) = lors(&["refresh", "--to", "3h", trimmed.to_str().unwrap()]);
    assert!(ok, "{err}");
    let out = String::from_utf8(out).unwrap();
    let n = x2.mappings.len();
    assert_eq!(out.lines().count(), 1, "{out}");
    let head = format!("refreshed {n} allocations on 2 depots; the soonest expires in ");
    let rest = out.strip_prefix(&head).unwrap_or_else(|| panic!("{out}"));
    assert!(
        ["3h 0m (127.0.0.1:", "2h 59m (127.0.0.1:"]
            .iter()
            .any(|w| rest.starts_with(w)),
        "{out}"
    );
    let (ok, out, err) = lors(&["refresh", "-v", "--to", "3h", trimmed.to_str().unwrap()]);
    assert!(ok, "{err}");
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out.lines().count(), n + 1, "{out}");
    assert!(
        out.lines().next().unwrap().contains("expires in 10"),
        "{out}"
    );
    for m in &x2.mappings {
        let s = probe(m).await.unwrap().seconds_left;
        assert!((3 * 3600 - 10..=3 * 3600).contains(&s), "{s}");
    }
    let (ok, _, err) = lors(&["refresh", "--by", "1h", trimmed.to_str().unwrap()]);
    assert!(ok, "{err}");
    let s = probe(&x2.mappings[0]).await.unwrap().seconds_left;
    assert!((4 * 3600 - 10..=4 * 3600).contains(&s), "{s}");
    let (ok, _, err) = lors(&["refresh", "--max", trimmed.to_str().unwrap()]);
    assert!(ok, "{err}");
    let s = probe(&x2.mappings[0]).await.unwrap().seconds_left;
    assert!(s > 29 * 86_400, "depot maximum is 30 days: {s}");

    // modify: a read-only copy, world-readable, that still downloads.
    let share = dir.path().join("share.xnd");
    let (ok, _, err) = lors(&[
        "modify",
        "-w",
        "--strip-manage",
        "-o",
        share.to_str().unwrap(),
        trimmed.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let x3 = read_x(&share);
    assert!(
        x3.mappings
            .iter()
            .all(|m| m.read.is_some() && m.write.is_none() && m.manage.is_none())
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&share).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let (ok, out, _) = lors(&["download", "--quiet", "-o", "-", share.to_str().unwrap()]);
    assert!(ok && out == data);

    // route into a new file: everything onto depot 1; the old replicas
    // go once trim.xnd, which still names them, is removed.
    let routed = dir.path().join("routed.xnd");
    let (ok, _, err) = lors(&[
        "route",
        "--quiet",
        "--depot",
        &ds[0].addr,
        "-o",
        routed.to_str().unwrap(),
        trimmed.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let x4 = read_x(&routed);
    assert_eq!(x4.mappings.len(), 5);
    assert!(x4.mappings.iter().all(|m| m.depot().unwrap() == ds[0].addr));
    for m in &x2.mappings {
        assert!(probe(m).await.is_ok(), "trim.xnd still names it");
    }
    let (ok, _, err) = lors(&["rm", "-q", trimmed.to_str().unwrap()]);
    assert!(ok, "{err}");
    for m in &x2.mappings {
        assert_eq!(probe(m).await.unwrap_err().status().unwrap().code(), -4);
    }
    let (ok, out, _) = lors(&["download", "--quiet", "-o", "-", routed.to_str().unwrap()]);
    assert!(ok && out == data);

    // stat sums it up.
    let (ok, out, err) = lors(&["stat", "--json", routed.to_str().unwrap()]);
    assert!(ok, "{err}");
    let s = String::from_utf8(out).unwrap();
    assert!(
        s.contains("\"size\":450000")
            && s.contains("\"blocks\":5")
            && s.contains("\"min_live_replicas\":1")
            && s.contains("\"blocks_lost\":0"),
        "{s}"
    );
}

/// `lors stat` over a directory: a line per exNode (at any depth), what
/// expires soon, what is under its copy count, what is lost or cannot be
/// read, and a non-zero exit when anything is lost.
#[test]
fn stat_over_many_exnodes_names_what_expires_is_short_or_lost() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let data = pattern(3 << 20, 5);
    let up = |name: &str, flags: &[&str]| {
        let x = upload_cli(&ds, dir.path(), name, &data, flags);
        let to = if name.starts_with('s') {
            tree.join("sub").join(format!("{name}.xnd"))
        } else {
            tree.join(format!("{name}.xnd"))
        };
        std::fs::rename(&x, &to).unwrap();
        to
    };
    up("healthy", &["-c", "2", "-b", "1M", "-d", "2d"]);
    up("soon", &["-c", "2", "-b", "1M", "-d", "1h"]);
    let short = up("short", &["-c", "2", "-b", "1M", "-d", "2d"]);
    let lost = up("lost", &["-c", "1", "-b", "1M", "-d", "2d"]);
    std::fs::write(tree.join("junk.xnd"), "<exnode").unwrap();
    std::fs::write(tree.join("notes.txt"), "not an exNode").unwrap();
    // One copy of a block of "short" freed; the only copy of a block of "lost".
    crate::util::free_numbered(&short, 0);
    crate::util::free_numbered(&lost, 1);
    let t = tree.to_str().unwrap();
    let (ok, out, err) = lors(&["stat", t]);
    let out = String::from_utf8(out).unwrap();
    assert!(!ok, "lost bytes fail the run: {out}");
    assert!(
        err.contains("1 of 5 exNodes have bytes with no live replica and 1 cannot be read"),
        "{err}"
    );
    let line = |name: &str| {
        out.lines()
            .find(|l| l.contains(&format!("{name}.xnd: ")))
            .unwrap_or_else(|| panic!("no line for {name}: {out}"))
            .to_owned()
    };
    // (A lease just taken may show its whole length or a second less.)
    let healthy = line("healthy");
    assert!(
        healthy.contains("3.0 MiB, 3 blocks, 2 of 2 copies, expires in ")
            && (healthy.ends_with("2d 0h") || healthy.ends_with("1d 23h")),
        "{out}"
    );
    let soon = line("soon");
    assert!(
        soon.contains("2 of 2 copies, expires in ")
            && (soon.ends_with("1h 0m") || soon.contains("in 59m")),
        "{out}"
    );
    assert!(
        line("short").contains("1 of 2 copies") && line("short").contains("under its copy count"),
        "{out}"
    );
    assert!(
        line("lost").contains("0 of 1 copies") && line("lost").contains("LOST 1048576 bytes"),
        "{out}"
    );
    assert!(line("junk").contains("cannot be read"), "{out}");
    assert!(!out.contains("notes.txt"), "{out}");
    assert!(
        out.contains(
            "5 exNodes: 1 under their copy count or parity margin, 1 with lost bytes, 1 unreadable"
        ),
        "{out}"
    );
    // Within two hours: the lease that ends, and the problems; not the rest.
    let (_, out, _) = lors(&["stat", "--expiring", "2h", t]);
    let out = String::from_utf8(out).unwrap();
    for name in ["soon", "short", "lost", "junk"] {
        assert!(out.contains(&format!("{name}.xnd: ")), "{name}: {out}");
    }
    assert!(!out.contains("healthy.xnd"), "{out}");
    assert!(out.contains("5 exNodes: 1 expire within 2h 0m,"), "{out}");
    // `lors ls --expiring` is the same report.
    let (ok, ls_out, _) = lors(&["ls", "--expiring", "2h", t]);
    assert!(!ok);
    let ls_out = String::from_utf8(ls_out).unwrap();
    let names = |o: &str| -> Vec<String> {
        o.lines()
            .filter_map(|l| l.split(".xnd: ").next().filter(|_| l.contains(".xnd: ")))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(names(&ls_out), names(&out), "{ls_out}");
    let (_, out, _) = lors(&["stat", "--json", "--expiring", "2h", t]);
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.lines().any(|l| l.contains("\"lost_bytes\":1048576")),
        "{out}"
    );
    assert!(
        out.lines()
            .last()
            .unwrap()
            .contains("\"files\":5,\"expiring\":1,\"under\":1,\"lost\":1,\"unreadable\":1"),
        "{out}"
    );
}

/// `lors verify` reads every replica, not the first good one: a flipped
/// byte in one copy, a freed allocation, a block with no copy left and a
/// dead depot are each named with their bytes, and the exit status says
/// so; a raw upload is read through and reported unchecked.
#[test]
fn verify_names_every_bad_replica() {
    let dir = tempdir();
    let mut ds = depots(4, dir.path());
    let data = pattern((5 << 20) + 777, 23);
    let flags = ["-c", "2", "-b", "1M", "-E", "256K"];
    let xnd = upload_cli(&ds[..3], dir.path(), "v.bin", &data, &flags);
    let x = xnd.to_str().unwrap();
    let verify = |args: &[&str]| {
        let (ok, out, err) = lors(&[&["verify", "-q"][..], args].concat());
        (ok, String::from_utf8(out).unwrap(), err)
    };
    let (ok, out, err) = verify(&["--all", x]);
    assert!(ok, "{err}");
    assert!(out.contains("12 replicas of 6 blocks: 12 good"), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.contains(": good: ")).count(),
        12,
        "{out}"
    );
    let raw = upload_cli(&ds[3..], dir.path(), "r.bin", &data, &["-c", "1", "-n"]);
    let (ok, out, err) = verify(&[raw.to_str().unwrap()]);
    assert!(ok && out.contains(": 1 unchecked"), "{out}{err}");

    let xn = read_x(&xnd);
    let of_block = |off: u64| -> Vec<usize> {
        (0..xn.mappings.len())
            .filter(|&i| xn.mappings[i].exnode_offset == off)
            .collect()
    };
    // A byte of block 2's second e2e block (bytes 2 MiB + 256 KiB ..) flipped
    // on disk in one of its two copies.
    let victim = &xn.mappings[of_block(2 << 20)[0]];
    let di = ds
        .iter()
        .position(|d| Some(&d.addr) == victim.depot().as_ref())
        .unwrap();
    flip_stored_byte(&ds, dir.path(), victim, 4096 + (256 << 10) + 32 + 100);
    // Both copies of block 4 freed, through another exNode.
    free_block(&xnd, 4 << 20);
    let (ok, out, err) = verify(&[x]);
    assert!(!ok, "{out}");
    let corrupt = format!(
        "bytes {}..{}: ",
        (2 << 20) + (256 << 10),
        (2 << 20) + (512 << 10)
    );
    assert!(
        out.lines()
            .any(|l| l.contains(&format!("on {}: corrupt: {corrupt}", ds[di].addr))),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.contains(": expired: ")).count(),
        2,
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "LOST: bytes {}..{} have no good replica",
            4 << 20,
            5 << 20
        )),
        "{out}"
    );
    let summary = out.lines().next().unwrap_or_default();
    for n in [
        "12 replicas of 6 blocks: ",
        "9 good",
        "1 corrupt",
        "2 expired",
    ] {
        assert!(summary.contains(n), "{out}");
    }
    assert!(
        err.contains("3 of 12 replicas are corrupt or cannot be read")
            && err.contains("1048576 bytes have no good replica"),
        "{err}"
    );
    // A dead depot: its replicas are unreachable, the others still read.
    let dead = ds[(di + 1) % 3].addr.clone();
    ds[(di + 1) % 3].kill9();
    let (ok, out, _) = verify(&[x, raw.to_str().unwrap()]);
    assert!(!ok);
    let down = xn
        .mappings
        .iter()
        .filter(|m| m.depot().as_deref() == Some(&dead))
        .count();
    assert!(down > 0);
    assert_eq!(
        out.lines()
            .filter(|l| l.contains(&format!("on {dead}: unreachable: ")))
            .count(),
        down,
        "{out}"
    );
    assert!(out.contains(": 1 unchecked"), "{out}");
}

#[test]
fn a_flipped_byte_on_a_depot_is_detected_and_read_from_the_replica() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    for (flags, label) in [
        (vec![], "blake3 (default)"),
        (vec!["-k", "md5"], "md5"),
        (vec!["-k", "md5-rfc1321"], "md5-rfc1321"),
        (vec!["-z", "-e", "chacha"], "zstd+chacha+blake3"),
    ] {
        let data = pattern(700_000, 21);
        let mut f = vec!["-c", "2", "-b", "256K", "-E", "64K"];
        f.extend(flags.iter().copied());
        let name = format!("c-{}.bin", label.replace(' ', "_"));
        let xnd = upload_cli(&ds, dir.path(), &name, &data, &f);
        let x = read_x(&xnd);
        // The LoRS digest misses some flips: MD5 chains carry a BLAKE3 of
        // the stored bytes beside it; chains with a strong check need none.
        let digests = x
            .mappings
            .iter()
            .filter(|m| m.metadata.iter().any(|i| i.name == "stored_blake3"))
            .count();
        let weak = label.starts_with("md5");
        assert_eq!(digests, if weak { x.mappings.len() } else { 0 }, "{label}");
        // Damage the first replica of block 1 on its depot's disk.
        let victim = x
            .mappings
            .iter()
            .find(|m| m.exnode_offset == 256 << 10)
            .unwrap();
        flip_stored_byte(&ds, dir.path(), victim, 4096 + 1000);
        // Only the damaged replica left for block 1: the damage is caught
        // and named, not written out.
        let other = x
            .mappings
            .iter()
            .position(|m| m.exnode_offset == 256 << 10 && m.depot() != victim.depot())
            .unwrap()
            .to_string();
        let one = dir.path().join("one.xnd");
        let (ok, _, err) = lors(&[
            "trim",
            "-m",
            &other,
            "-o",
            one.to_str().unwrap(),
            xnd.to_str().unwrap(),
        ]);
        assert!(ok, "{label}: trim: {err}");
        let out = dir.path().join("c.out");
        let (ok, _, err) = lors(&[
            "download",
            "-o",
            out.to_str().unwrap(),
            one.to_str().unwrap(),
        ]);
        assert!(
            !ok,
            "{label}: a download from the damaged replica alone must fail"
        );
        assert!(
            err.contains("corrupted"),
            "{label}: the damage is reported: {err}"
        );
        // With both replicas, the file comes back whole whichever is read.
        let (ok, _, err) = lors(&[
            "download",
            "-o",
            out.to_str().unwrap(),
            xnd.to_str().unwrap(),
        ]);
        assert!(ok, "{label}: {err}");
        assert!(
            std::fs::read(&out).unwrap() == data,
            "{label}: output differs"
        );
    }
}

/// Encoded replicas of different block and e2e block sizes: any range, to
/// a file or a stream, from each replica alone and from all of them, comes
/// back exact (an encoded piece is read as the e2e blocks that hold it).
#[test]
fn encoded_ranges_come_back_from_replicas_of_any_geometry() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let data = pattern((3 << 20) + 12_345, 17);
    let replicas = [
        upload_cli(
            &ds[..1],
            dir.path(),
            "a.bin",
            &data,
            &["-c", "1", "-b", "1M", "-E", "64K"],
        ),
        upload_cli(
            &ds[1..2],
            dir.path(),
            "b.bin",
            &data,
            &["-c", "1", "-b", "700K", "-E", "100K"],
        ),
        upload_cli(
            &ds[2..],
            dir.path(),
            "c.bin",
            &data,
            &["-c", "1", "-b", "900K", "-E", "128K", "-e", "aes"],
        ),
    ];
    let mut all = read_x(&replicas[0]);
    for r in &replicas[1..] {
        all.mappings.extend(read_x(r).mappings);
    }
    let merged = dir.path().join("all.xnd");
    std::fs::write(&merged, lors_exnode::xml::write(&all)).unwrap();
    let n = data.len();
    let ranges = [
        (0, n),
        (1, 65_535),
        (65_535, 2),
        (100 * 1024 - 1, 300_000),
        (700 * 1024, 1 << 20),
        (n - 1, 1),
    ];
    let out = dir.path().join("range.out");
    for x in replicas.iter().chain([&merged]) {
        for (off, len) in ranges {
            let want = &data[off..off + len];
            let (o, l) = (off.to_string(), len.to_string());
            let base = ["download", "-q", "-b", "100K", "-O", &o, "-L", &l];
            let (ok, got, err) = lors(&[&base[..], &["-o", "-", x.to_str().unwrap()]].concat());
            assert!(
                ok && got == want,
                "{} {off}+{len} to a stream: {err}",
                x.display()
            );
            let to_file = ["-o", out.to_str().unwrap(), x.to_str().unwrap()];
            let (ok, _, err) = lors(&[&base[..], &to_file].concat());
            assert!(ok, "{err}");
            assert!(
                std::fs::read(&out).unwrap() == want,
                "{} {off}+{len} to a file",
                x.display()
            );
        }
    }
}

#[test]
fn xndrc_supplies_depots_and_defaults_below_flags_and_env() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let rc = dir.path().join("xndrc");
    std::fs::write(
        &rc,
        format!(
            "# as lors_setup.sh writes it\nDEPOT {} {}\nDEPOT {}\nCOPIES 2\nDATA_BLOCKSIZE 64K\nDURATION 2h\nSTORAGE_TYPE SOFT\n",
            ds[0].addr.split(':').next().unwrap(),
            ds[0].port,
            ds[1].addr
        ),
    )
    .unwrap();
    let src = dir.path().join("f.bin");
    std::fs::write(&src, pattern(200_000, 1)).unwrap();
    let xnd = dir.path().join("f.xnd");
    let (ok, _, err) = lors(&[
        "upload",
        "--quiet",
        "--xndrc",
        rc.to_str().unwrap(),
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let x = read_x(&xnd);
    assert_eq!(
        x.mappings.len(),
        4 * 2,
        "64K blocks, 2 copies, from the file"
    );
    let (ok, out, _) = lors(&["ls", "--json", xnd.to_str().unwrap()]);
    assert!(ok);
    assert!(
        String::from_utf8(out)
            .unwrap()
            .contains("\"reliability\":\"soft\"")
    );
    // A flag beats the file; the environment beats the file too.
    let (ok, _, err) = lors(&[
        "upload",
        "--quiet",
        "--force",
        "--xndrc",
        rc.to_str().unwrap(),
        "-c",
        "1",
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(read_x(&xnd).mappings.len(), 4);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lors"))
        .args([
            "upload",
            "--quiet",
            "--force",
            "--xndrc",
            rc.to_str().unwrap(),
            "-o",
            xnd.to_str().unwrap(),
            src.to_str().unwrap(),
        ])
        .env("LORS_BLOCKSIZE", "100K")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(read_x(&xnd).mappings.len(), 2 * 2);
    // A malformed file is reported with its line.
    std::fs::write(&rc, "COPIES many\n").unwrap();
    let (ok, _, err) = lors(&[
        "upload",
        "--force",
        "--xndrc",
        rc.to_str().unwrap(),
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("line 1: COPIES"), "{err}");
}

/// Runs `lors ARGS…` with its standard output already closed by the reader
/// (as `| head` does once it has what it wants); returns the exit code and
/// stderr, failing if it does not end within 30 s.
fn lors_into_closed_pipe(args: &[&str], read_first: usize) -> (Option<i32>, String) {
    use std::io::Read as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_lors"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut head = vec![0u8; read_first];
    out.read_exact(&mut head).unwrap();
    drop(out);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "`lors {}` still running 30 s after its reader left",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    // 3 MB in 30 blocks: many in flight when the reader leaves.
    let data = pattern(3_000_000, 8);
    let xnd = upload_cli(&ds, dir.path(), "p.bin", &data, &["-c", "1", "-b", "100K"]);
    let x = xnd.to_str().unwrap();
    for (args, read_first) in [
        (vec!["download", "--quiet", "-o", "-", x], 100),
        (vec!["stat", x], 0),
        (vec!["ls", x], 0),
        (vec!["stat", "--json", x], 0),
    ] {
        let (code, err) = lors_into_closed_pipe(&args, read_first);
        assert_eq!(code, Some(141), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("error"), "{args:?} says nothing: {err}");
    }
}

/// Bytes the depot has allocated: the allocations' sizes, without their charge.
pub fn used(d: &DepotProc) -> u64 {
    usage(d).0
}

/// What the depot holds: the allocations' sizes (without their charge),
/// and how many there are.
pub fn usage(d: &DepotProc) -> (u64, u64) {
    // STATUS counts each allocation's size and its 4 KiB charge; the
    // version report says how many allocations there are.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut c = d.connect().await;
        let st = c.status("1", "ibp").await.unwrap();
        let charged = st.used_total;
        let report = c.version().await.unwrap();
        let count: u64 = report
            .lines()
            .find_map(|l| l.strip_prefix("RID: 1 "))
            .and_then(|l| l.split("Allocations: ").nth(1))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no allocation count in {report:?}"));
        (charged - count * lors_depot::store::ALLOC_CHARGE, count)
    })
}

#[test]
fn a_failed_upload_leaves_nothing_unnamed_on_the_depots() {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let dir = tempdir();
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    let a = DepotProc::start(&da, &[]);
    let mut b = DepotProc::start(&db, &[]);
    let src = dir.path().join("f.bin");
    std::fs::write(&src, pattern(1 << 20, 4)).unwrap();
    let both = ["--depot", &a.addr, "--depot", &b.addr];

    // An output that cannot be written is refused before anything is stored.
    let bad = dir.path().join("no/such/dir/out.xnd");
    let mut args = vec!["upload", "--quiet", "-c", "2", "-b", "64K"];
    args.extend(both);
    args.extend(["-o", bad.to_str().unwrap(), src.to_str().unwrap()]);
    let (ok, _, err) = lors(&args);
    assert!(!ok && err.contains("nothing was uploaded"), "{err}");
    assert_eq!((used(&a), used(&b)), (0, 0), "no allocation was made");

    // An existing exNode is not overwritten without --force.
    let out = dir.path().join("f.xnd");
    let mut args = vec!["upload", "--quiet", "-c", "1"];
    args.extend(both);
    args.extend(["-o", out.to_str().unwrap(), src.to_str().unwrap()]);
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    let first = std::fs::read(&out).unwrap();
    let before = used(&a) + used(&b);
    let (ok, _, err) = lors(&args);
    assert!(
        !ok && err.contains("already exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&out).unwrap(),
        first,
        "the exNode is untouched"
    );
    assert_eq!(used(&a) + used(&b), before, "nothing was stored");
    args.insert(1, "--force");
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    assert_eq!(
        used(&a) + used(&b),
        before,
        "--force replaces the file, and the data the old one named is released"
    );
    let (ok, _, err) = lors(&["rm", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!((used(&a), used(&b)), (0, 0));

    // A depot dies mid-upload: what was stored is released, and what sits on
    // the dead depot is named in OUT.partial.
    let (fresh_a, fresh_b) = (0, 0);
    let out = dir.path().join("g.xnd");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lors"))
        .args(["upload", "--quiet", "-c", "2", "-b", "64K", "-T", "10s"])
        .args(both)
        .args(["-o", out.to_str().unwrap(), "-"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&pattern(640 << 10, 5)).unwrap();
    stdin.flush().unwrap();
    // Wait until the first ten blocks sit on both depots and all is quiet.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while used(&b) < fresh_b + (640 << 10) {
        assert!(
            std::time::Instant::now() < deadline,
            "blocks never reached b"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    b.kill9();
    let _ = stdin.write_all(&pattern(640 << 10, 6));
    drop(stdin);
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(!out.exists(), "no exNode for a failed upload");
    assert_eq!(used(&a), fresh_a, "a's allocations were released: {err}");
    let partial = dir.path().join("g.xnd.partial");
    assert!(
        err.contains(partial.to_str().unwrap()) && err.contains("lors trim --decrement"),
        "{err}"
    );
    let px = read_x(&partial);
    assert!(!px.mappings.is_empty());
    assert!(
        px.mappings
            .iter()
            .all(|m| m.depot().as_deref() == Some(b.addr.as_str()))
    );
    // Back up: exactly what the partial exNode names is left on b, and the
    // command it suggests frees it.
    let port = b.port.to_string();
    let listen = format!("127.0.0.1:{port}");
    let b = DepotProc::start(&db, &["--listen", &listen]);
    let named: u64 = px.mappings.iter().map(|m| m.alloc_length).sum();
    assert_eq!(used(&b), fresh_b + named, "{err}");
    let (ok, _, e) = lors(&[
        "trim",
        "--decrement",
        "--allow-holes",
        "--depot",
        &b.addr,
        partial.to_str().unwrap(),
    ]);
    assert!(ok, "{e}");
    assert_eq!(used(&b), fresh_b);
}

/// `lors ls` numbers and orders mappings as `lors_ls` does — by offset, and
/// replicas sharing an offset in the order LoRS's red-black tree leaves them,
/// which is not file order — and `lors trim -m N` removes the mapping
/// `lors_trim -m N` would.
#[test]
fn ls_and_trim_number_mappings_as_the_lors_tools_do() {
    let dir = tempdir();
    let ds = depots(3, dir.path());
    let data = pattern(300_000, 4);
    let xnd = upload_cli(&ds, dir.path(), "n.bin", &data, &["-c", "3", "-b", "100K"]);
    let x = read_x(&xnd);
    assert_eq!(x.mappings.len(), 9);
    // Reorder the file so its blocks run 2,1,1,0,2,1,0,0,2: the reference
    // tools list that as file indices 3,6,7,1,5,2,0,4,8 (known answer from
    // LoRS 0.82's code, see lors_exnode::numbering).
    let mut blocks: Vec<Vec<lors_exnode::Mapping>> = vec![Vec::new(); 3];
    for m in &x.mappings {
        blocks[usize::try_from(m.exnode_offset / 102_400).unwrap()].push(m.clone());
    }
    let mut y = x.clone();
    y.mappings = [2, 1, 1, 0, 2, 1, 0, 0, 2]
        .iter()
        .map(|&b| blocks[b].pop().unwrap())
        .collect();
    let shuffled = dir.path().join("shuffled.xnd");
    std::fs::write(&shuffled, lors_exnode::xml::write(&y)).unwrap();
    let p = shuffled.to_str().unwrap();
    let lors_order = [3, 6, 7, 1, 5, 2, 0, 4, 8];

    let (ok, out, err) = lors(&["ls", p]);
    assert!(ok, "{err}");
    let out = String::from_utf8(out).unwrap();
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 9, "{out}");
    for (n, &i) in lors_order.iter().enumerate() {
        let m = &y.mappings[i];
        let want = [
            n.to_string(),
            m.exnode_offset.to_string(),
            m.depot().unwrap(),
        ];
        assert_eq!(
            [rows[n][0], rows[n][3], rows[n][5]],
            want,
            "row {n} of\n{out}"
        );
    }
    let (ok, out, err) = lors(&["ls", "--json", p]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    for (n, &i) in lors_order.iter().enumerate() {
        let row = &v["mappings"][n];
        assert_eq!(row["index"], n);
        assert_eq!(row["exnode_offset"], y.mappings[i].exnode_offset);
        assert_eq!(row["depot"], y.mappings[i].depot().unwrap());
    }

    // Number 4 is file index 5: a replica of block 1, not the fifth mapping
    // in the file (block 2).
    let trimmed = dir.path().join("trimmed.xnd");
    let (ok, _, err) = lors(&["trim", "-m", "4", "-o", trimmed.to_str().unwrap(), p]);
    assert!(ok, "{err}");
    let z = read_x(&trimmed);
    assert_eq!(z.mappings.len(), 8);
    for (i, m) in y.mappings.iter().enumerate() {
        assert_eq!(z.mappings.contains(m), i != 5, "mapping at file index {i}");
    }
    let (ok, _, err) = lors(&["trim", "-m", "9", "-o", "/dev/null", p]);
    assert!(
        !ok && err.contains("no mapping 9") && err.contains("0 to 8"),
        "{err}"
    );
}

#[test]
fn ls_and_stat_tell_expired_from_unreachable_and_fail_when_bytes_are_lost() {
    let dir = tempdir();
    let mut ds = depots(3, dir.path());
    let data = pattern(300_000, 9);
    let xnd = upload_cli(&ds, dir.path(), "s.bin", &data, &["-c", "2", "-b", "100K"]);
    let x = read_x(&xnd);
    let p = xnd.to_str().unwrap();
    let (ok, out, err) = lors(&["stat", p]);
    let out = String::from_utf8(out).unwrap();
    assert!(ok && out.contains("mappings:  6 live"), "{out}{err}");

    // Free one replica of block 0 behind the exNode's back.
    let (i, m) = x
        .mappings
        .iter()
        .enumerate()
        .find(|(_, m)| m.exnode_offset == 0)
        .unwrap();
    let other = x
        .mappings
        .iter()
        .find(|o| o.exnode_offset == 0 && o.depot() != m.depot())
        .unwrap()
        .depot()
        .unwrap();
    let n = x.numbering().number(i);
    crate::util::free_numbered(&xnd, n);
    let (ok, out, err) = lors(&["ls", "--json", p]);
    assert!(ok, "one replica of each block is still live: {err}");
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["mappings"][n]["state"], "expired");
    assert_eq!(
        v["mappings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["state"] == "live")
            .count(),
        5
    );

    // Now the depot with block 0's other replica goes down: bytes 0..100K
    // have no live replica, and both commands say so and fail.
    let k = ds.iter().position(|d| d.addr == other).unwrap();
    ds[k].kill9();
    let (ok, out, err) = lors(&["stat", p]);
    let out = String::from_utf8(out).unwrap();
    assert!(!ok, "lost bytes are an error: {out}");
    assert!(
        out.contains("1 expired") && out.contains("unreachable"),
        "{out}"
    );
    assert!(
        out.contains(&format!("unreachable depots: {other}")),
        "{out}"
    );
    assert!(
        err.contains("no live replica") && err.contains("0..102400"),
        "{err}"
    );
    let (ok, out, err) = lors(&["ls", p]);
    let out = String::from_utf8(out).unwrap();
    assert!(!ok && err.contains("no live replica"), "{err}");
    assert!(
        out.contains("Unknown (expired)") && out.contains("Unknown (unreachable)"),
        "{out}"
    );
    assert!(
        out.contains("expired or freed") && out.contains("depot unreachable"),
        "{out}"
    );
    let (ok, out, _) = lors(&["stat", "--json", p]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(!ok);
    assert_eq!(v["states"]["expired"], 1);
    assert_eq!(v["unreachable_depots"][0], other.as_str());
    // Offline listing does not probe, so it cannot fail.
    let (ok, _, err) = lors(&["ls", "--offline", p]);
    assert!(ok, "{err}");
}

#[test]
fn a_tampered_exnode_is_blamed_before_any_io() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let xnd = upload_cli(
        &ds,
        dir.path(),
        "t.bin",
        &pattern(300_000, 3),
        &["-c", "1", "-b", "100K", "-n"],
    );
    let mut x = read_x(&xnd);
    let last = x.mappings.len() - 1;
    x.mappings[last].logical_length = 100_000_000_000;
    let bad = dir.path().join("bad.xnd");
    std::fs::write(&bad, lors_exnode::xml::write(&x)).unwrap();
    let out = dir.path().join("t.out");
    let (ok, _, err) = lors(&[
        "download",
        "--quiet",
        "-o",
        out.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("exNode is inconsistent")
            && err.contains(&format!("mapping {last}"))
            && err.contains("100000000000"),
        "{err}"
    );
    assert!(!err.contains("depot"), "the depots are not blamed: {err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("t.out"))
        .collect();
    assert!(left.is_empty(), "nothing written: {left:?}");
}

#[test]
fn download_outputs_dev_null_directories_and_restart() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let data = pattern(500_000, 12);
    let xnd = upload_cli(&ds, dir.path(), "n.bin", &data, &["-c", "1", "-b", "100K"]);
    let x = xnd.to_str().unwrap();
    // /dev/null: fetched and verified, nothing kept.
    let (ok, _, err) = lors(&["download", "--quiet", "-o", "/dev/null", x]);
    assert!(ok, "{err}");
    // A directory gets the recorded name, with or without a trailing slash.
    let sub = dir.path().join("results");
    std::fs::create_dir(&sub).unwrap();
    for o in [format!("{}/", sub.display()), sub.display().to_string()] {
        let (ok, _, err) = lors(&["download", "--quiet", "-o", &o, x]);
        assert!(ok, "{err}");
        assert_eq!(std::fs::read(sub.join("n.bin")).unwrap(), data);
        std::fs::remove_file(sub.join("n.bin")).unwrap();
    }
    let missing = format!("{}/", dir.path().join("nope").display());
    let (ok, _, err) = lors(&["download", "--quiet", "-o", &missing, x]);
    assert!(!ok && err.contains("is not a directory"), "{err}");
    // A partial from another exNode is never resumed into this one; a stale
    // partial of this one is discarded by --restart.
    let out = dir.path().join("n.out");
    std::fs::write(dir.path().join("n.out.lors-part"), vec![0xAAu8; data.len()]).unwrap();
    std::fs::write(
        dir.path().join("n.out.lors-resume"),
        format!(
            "lors-partial v2 0 {} 2097152 0000000000000000\n0 100000\n",
            data.len()
        ),
    )
    .unwrap();
    let (ok, _, err) = lors(&["download", "-o", out.to_str().unwrap(), x]);
    assert!(ok, "{err}");
    assert!(!err.contains("resumed"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), data);
    std::fs::write(dir.path().join("n.out.lors-part"), vec![0xAAu8; data.len()]).unwrap();
    let (ok, _, err) = lors(&[
        "download",
        "--quiet",
        "--restart",
        "-o",
        out.to_str().unwrap(),
        x,
    ]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), data);
}

/// A loopback port that accepts nothing: its listen queue is full, so new
/// connections hang in SYN as with a host that drops packets. Keep the
/// returned values alive.
fn black_hole() -> (std::net::TcpListener, Vec<std::net::TcpStream>, u16) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut held = Vec::new();
    let addr = l.local_addr().unwrap();
    while let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
        held.push(s);
        assert!(held.len() < 10_000, "the listen queue never filled");
    }
    (l, held, port)
}

#[test]
fn a_depot_that_black_holes_connections_is_marked_unreachable_once() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let data = pattern(2_000_000, 17);
    let xnd = upload_cli(&ds, dir.path(), "h.bin", &data, &["-c", "1", "-b", "100K"]);
    let (_l, _held, port) = black_hole();
    // Each block gets a first replica on the black hole.
    let mut x = read_x(&xnd);
    let mut bogus = x.mappings.clone();
    for m in &mut bogus {
        for c in [&mut m.read, &mut m.write, &mut m.manage]
            .into_iter()
            .flatten()
        {
            c.port = port;
        }
    }
    // Block 0 only on the black hole, so the download must try it.
    bogus.extend(x.mappings.drain(..).filter(|m| m.exnode_offset > 0));
    x.mappings = bogus;
    let two = dir.path().join("two.xnd");
    std::fs::write(&two, lors_exnode::xml::write(&x)).unwrap();
    let out = dir.path().join("h.out");
    let (ok, _, err) = lors(&[
        "download",
        "-T",
        "2s",
        "-o",
        out.to_str().unwrap(),
        two.to_str().unwrap(),
    ]);
    assert!(!ok, "block 0 has no reachable replica: {err}");
    assert!(err.contains("bytes 0..102400 could not be read"), "{err}");
    let hole = format!("127.0.0.1:{port}");
    assert!(
        err.contains(&format!("depot {hole} given up")),
        "a connect timeout marks the depot dead: {err}"
    );
    assert!(
        !err.contains(&format!("depot {hole}: ")),
        "it is not tried block by block: {err}"
    );
}

#[test]
fn a_stalled_depot_is_named_and_its_pieces_read_elsewhere() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let data = pattern(8 << 20, 23);
    let raw = upload_cli(
        &ds,
        dir.path(),
        "s.bin",
        &data,
        &["-c", "2", "-b", "1M", "-n"],
    );
    let e2e = upload_cli(&ds, dir.path(), "t.bin", &data, &["-c", "2", "-b", "1M"]);
    // Frozen, its sockets still accept and take requests: nothing comes back.
    ds[1].signal("STOP");
    let out = dir.path().join("s.out");
    let out_s = out.to_str().unwrap();
    // Without redundant fetches only stall detection can finish these; with
    // them (the default) an idle connection re-fetches the stuck pieces too.
    // A stream reads in order, a window at a time: the healthy depot may
    // serve every piece before the frozen one is handed any, and then
    // there is no stall to name.
    let runs = [
        (&raw, out_s, "--no-redundancy", true),
        (&e2e, "-", "--no-redundancy", false),
        (&raw, out_s, "--restart", false),
    ];
    for (xnd, to, flag, named) in runs {
        let args = [
            "download",
            "--quiet",
            "-T",
            "300s",
            "--stall",
            "1s",
            "-b",
            "256K",
            flag,
            "-o",
            to,
            xnd.to_str().unwrap(),
        ];
        // Without either this waits out the 300 s timeout.
        let (ok, err) = lors_within(&args, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("download {flag} to {to} hung on a stalled depot"));
        assert!(ok, "{err}");
        if named {
            assert!(
                err.contains(&format!("depot {} has sent nothing for", ds[1].addr)),
                "the stalled depot is named: {err}"
            );
            assert!(err.contains("from other replicas"), "{err}");
        }
        if to != "-" {
            assert!(std::fs::read(&out).unwrap() == data, "output differs");
            std::fs::remove_file(&out).unwrap();
        }
    }
    ds[1].signal("CONT");
}

#[test]
fn a_full_output_ends_the_download_at_once_and_names_it() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let data = pattern(40 << 20, 29);
    let xnd = upload_cli(&ds, dir.path(), "f.bin", &data, &["-c", "1", "-b", "1M"]);
    let x = xnd.to_str().unwrap();
    // Streams: /dev/full answers every write with ENOSPC.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = lors_cmd(&["download", "--quiet", "-o", "-", x])
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("writing standard output: No space left on device"),
        "{err}"
    );
    assert_eq!(err.matches("No space left").count(), 1, "said once: {err}");
    let (ok, err) = lors_within(
        &["download", "--quiet", "-o", "/dev/full", x],
        Duration::from_secs(60),
    )
    .expect("a download to a full device ends");
    assert!(
        !ok && err.contains("writing /dev/full: No space left on device"),
        "{err}"
    );
    // A file on a full file system (a 4 MiB tmpfs in a private mount
    // namespace, where this machine allows one).
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=4m tmpfs {m} || exit 77; {lors} download --quiet -o {m}/out {x}; \
         rc=$?; ls {m}; exit $rc",
        m = mnt.display(),
        lors = env!("CARGO_BIN_EXE_lors"),
    );
    let Some(run) = crate::util::in_private_mounts(&script) else {
        return;
    };
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        err.contains(&format!("{}/out.lors-part", mnt.display())),
        "{err}"
    );
    let left = String::from_utf8_lossy(&run.stdout);
    assert!(
        !left.lines().any(|l| l == "out"),
        "nothing under the final name: {left}"
    );
}

/// The allocation bytes (max sizes) the mappings of `xs` hold on `addr`.
fn named_on(xs: &[lors_exnode::ExNode], addr: &str) -> u64 {
    xs.iter()
        .flat_map(|x| &x.mappings)
        .filter(|m| m.depot().as_deref() == Some(addr))
        .map(|m| m.alloc_length)
        .sum()
}

#[test]
fn twenty_uploads_and_downloads_survive_a_depot_killed_three_times() {
    const N: usize = 20;
    let dir = tempdir();
    let mut ds = depots(4, dir.path());
    let da = depot_args(&ds);
    let size = |i: usize| (8 << 20) + i * 37_001;
    // The download side: files stored before the faults.
    let mut before = Vec::new();
    for i in 0..N {
        let data = pattern(size(i), i as u8);
        let xnd = upload_cli(
            &ds,
            dir.path(),
            &format!("old{i}"),
            &data,
            &["-c", "2", "-b", "128K"],
        );
        before.push((xnd, data));
    }
    let spawn = |args: Vec<String>| {
        lors_cmd(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Kill depot 0 (SIGKILL: no cleanup) and bring it back on its address,
    // three times, while the transfers start and run.
    let addr = ds[0].addr.clone();
    let d0 = dir.path().join("d0");
    let (ups, downs) = std::thread::scope(|scope| {
        let first = &mut ds[0];
        scope.spawn(|| {
            for _ in 0..3 {
                std::thread::sleep(Duration::from_millis(200));
                first.kill9();
                std::thread::sleep(Duration::from_millis(300));
                *first = DepotProc::start(&d0, &["--sync", "never", "--listen", &addr]);
            }
        });
        // Uploads and downloads interleaved, so both meet every fault.
        let (mut ups, mut downs) = (Vec::new(), Vec::new());
        for (i, (xnd, data)) in before.iter().enumerate() {
            let new = pattern(size(i), 100 + i as u8);
            let src = dir.path().join(format!("new{i}"));
            std::fs::write(&src, &new).unwrap();
            let up_xnd = dir.path().join(format!("new{i}.xnd"));
            let mut args: Vec<String> = ["upload", "--quiet", "-c", "2", "-b", "128K", "-T", "10s"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.extend(["-o".into(), up_xnd.display().to_string()]);
            args.extend(da.iter().cloned());
            args.push(src.display().to_string());
            ups.push((spawn(args), up_xnd, new));
            let out = dir.path().join(format!("old{i}.out"));
            let args = ["download", "--quiet", "-T", "10s", "-b", "128K", "-o"];
            let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            args.push(out.display().to_string());
            args.push(xnd.display().to_string());
            downs.push((spawn(args), out, data));
            std::thread::sleep(Duration::from_millis(40));
        }
        (ups, downs)
    });
    let finish = |c: std::process::Child| {
        let out = c.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (c, out, data) in downs {
        let (ok, err) = finish(c);
        assert!(ok, "a download with a replica of every block failed: {err}");
        assert!(std::fs::read(&out).unwrap() == *data, "download differs");
    }
    let mut named: Vec<lors_exnode::ExNode> = before.iter().map(|(x, _)| read_x(x)).collect();
    let (mut good, mut failed, mut hit) = (0, 0, 0);
    for (c, xnd, data) in ups {
        let (ok, err) = finish(c);
        if err.contains(&addr) {
            hit += 1;
        }
        let partial = std::path::PathBuf::from(format!("{}.partial", xnd.display()));
        if partial.exists() {
            named.push(read_x(&partial));
        }
        if !ok {
            failed += 1;
            assert!(!xnd.exists(), "a failed upload left an exNode: {err}");
            continue;
        }
        good += 1;
        // Every upload that said it succeeded reads back byte for byte.
        let out = dir.path().join("check.out");
        let (ok, _, err) = lors(&[
            "download",
            "--quiet",
            "--restart",
            "-o",
            out.to_str().unwrap(),
            xnd.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        assert!(
            std::fs::read(&out).unwrap() == data,
            "{} differs",
            xnd.display()
        );
        named.push(read_x(&xnd));
    }
    eprintln!("{good} uploads succeeded, {failed} failed, {hit} met the dead depot");
    assert!(
        hit > 0,
        "no upload ran into the killed depot: the test proves nothing"
    );
    // Nothing unnamed on the depots that stayed up; on the killed one, at
    // most what ALLOCATEs in flight at a kill committed without their reply
    // reaching the client (which then cannot know of them).
    for (i, d) in ds.iter().enumerate() {
        let (used, want) = (used(d), named_on(&named, &d.addr));
        if i == 0 {
            assert!(
                used >= want,
                "named allocations missing on the killed depot"
            );
            assert!(
                used - want <= 3 * N as u64 * (128 << 10),
                "{used} used, {want} named"
            );
            eprintln!("killed depot: {} bytes allocated and unnamed", used - want);
        } else {
            assert_eq!(
                used, want,
                "depot {} holds allocations no exNode names",
                d.addr
            );
        }
    }
}

/// One timeout policy, one resolution order: against a depot that accepts
/// connections and never answers (SIGSTOP), every command gives up after
/// the `-T` it was given — by flag, `lors://…?timeout=`, `LORS_TIMEOUT` or
/// `TIMEOUT` in the settings file — and the higher source wins.
#[test]
fn every_command_gives_a_silent_depot_up_after_the_one_timeout() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let data = pattern(200_000, 9);
    let xnd = upload_cli(
        &ds[..1],
        dir.path(),
        "t.bin",
        &data,
        &["-c", "1", "-b", "100K"],
    );
    let path = xnd.to_str().unwrap().to_owned();
    // trim --decrement gets its own file: the DECR it gave up waiting for
    // is still queued at the frozen depot, which frees it once thawed.
    let doomed = upload_cli(
        &ds[..1],
        dir.path(),
        "u.bin",
        &data,
        &["-c", "1", "-b", "100K"],
    );
    let doomed = doomed.to_str().unwrap().to_owned();
    let uri = |t: u32| format!("lors:///{path}?timeout={t}");
    let rc = |t: &str| {
        let f = dir.path().join(format!("xndrc-{t}"));
        std::fs::write(&f, format!("TIMEOUT {t}\n")).unwrap();
        f.display().to_string()
    };
    let (rc_slow, rc_fast) = (rc("600s"), rc("1s"));
    let out = dir.path().join("t.out").display().to_string();
    let copy = dir.path().join("copy.xnd").display().to_string();
    ds[0].signal("STOP");
    // A 20 s limit: the old fixed deadlines (20 s for ls/stat, 60 s for
    // augment/refresh/trim, 600 s for transfers) would all be cut off.
    let limit = Duration::from_secs(20);
    let slow_env = [("LORS_TIMEOUT", "600")];
    let uri_fast = uri(1);
    let uri_slow = uri(600);
    let target = ds[1].addr.clone();
    let frozen = ds[0].addr.clone();
    let src = dir.path().join("t.bin").display().to_string();
    let new_uri = format!("lors:///{}?timeout=1", dir.path().join("new.xnd").display());
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: Vec<(&str, Vec<&str>, Env)> = vec![
        ("ls, flag over URI", vec!["ls", "-T", "1s", &uri_slow], &[]),
        (
            "stat, URI over environment",
            vec!["stat", &uri_fast],
            &slow_env,
        ),
        (
            "refresh, environment over file",
            vec!["refresh", "--by", "1h", "--xndrc", &rc_slow, &path],
            &[("LORS_TIMEOUT", "1")],
        ),
        (
            "trim, file",
            vec![
                "trim",
                "--xndrc",
                &rc_fast,
                "--decrement",
                "--allow-holes",
                "-m",
                "0",
                &doomed,
            ],
            &[],
        ),
        (
            "download, flag over environment",
            vec!["download", "-q", "-T", "1s", "-o", &out, &path],
            &slow_env,
        ),
        (
            "upload, URI over file",
            vec![
                "upload", "-q", "--xndrc", &rc_slow, "--depot", &frozen, "-c", "1", "-o", &new_uri,
                &src,
            ],
            &[],
        ),
        (
            "augment, flag",
            vec![
                "augment", "-q", "-T", "1s", "--depot", &target, "-o", &copy, &path,
            ],
            &[],
        ),
    ];
    for (what, args, env) in &cases {
        let t0 = Instant::now();
        let r = lors_within_env(args, env, limit);
        let took = t0.elapsed();
        ds[0].signal("CONT");
        ds[0].signal("STOP");
        let Some((ok, err)) = r else {
            panic!("{what}: still waiting on the silent depot after {limit:?}")
        };
        assert!(
            took < Duration::from_secs(15),
            "{what}: took {took:?}, so the 1 s timeout was not the one applied"
        );
        // ls, stat and refresh list each mapping's state on stdout and end
        // with what failed; the others name the depot and the timeout.
        let want = match what.split(',').next() {
            Some("ls" | "stat") => "no live replica",
            Some("refresh") => "were not refreshed",
            _ => "within 1s",
        };
        assert!(err.contains(want), "{what}: wanted {want:?} in: {err}");
        if what.starts_with("trim") {
            // The mapping leaves the exNode; the user is told the
            // allocation may not have been released.
            assert!(err.contains("not released"), "{what}: {err}");
        } else {
            assert!(!ok, "{what}: succeeded against a silent depot");
        }
    }
    ds[0].signal("CONT");
    // Nothing was lost on the depot by the commands that gave up.
    let (ok, got, err) = lors(&["download", "-q", "-o", "-", &path]);
    assert!(ok, "{err}");
    assert_eq!(got, data);
}

/// The `--json` event stream of one command: every line one JSON object,
/// `start` first and `done` last (none when `done_expected` is false).
fn json_events(out: &[u8], op: &str) -> Vec<serde_json::Value> {
    let text = String::from_utf8_lossy(out);
    let evs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{op}: not JSON ({e}): {l}")))
        .collect();
    assert_eq!(
        evs.first().map(|e| e["event"].clone()),
        Some("start".into()),
        "{op}: {text}"
    );
    assert_eq!(
        evs.last().map(|e| e["event"].clone()),
        Some("done".into()),
        "{op}: {text}"
    );
    for e in &evs {
        if e["event"] != "progress" {
            assert!(
                e.get("depot").is_some() || e.get("op").is_some(),
                "{op}: {e}"
            );
        }
    }
    assert_eq!(evs[0]["op"], op);
    evs
}

/// `--json` on every transfer command: a start event with the right total,
/// events naming the depot that failed, and a done event that accounts
/// for everything; `--progress` gives plain lines on a non-terminal.
#[test]
fn transfer_commands_stream_json_events_and_plain_progress() {
    let dir = tempdir();
    let mut ds = depots(3, dir.path());
    let (a, b, c) = (ds[0].addr.clone(), ds[1].addr.clone(), ds[2].addr.clone());
    let data = pattern(1_000_000, 3);
    let src = dir.path().join("e.bin");
    std::fs::write(&src, &data).unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    let (xnd, aug, out) = (p("e.xnd"), p("aug.xnd"), p("e.out"));
    let src = src.display().to_string();
    let size = data.len() as u64;

    let (ok, got, err) = lors(&[
        "upload", "--json", "--depot", &a, "--depot", &b, "-c", "2", "-b", "100K", "-o", &xnd, &src,
    ]);
    assert!(ok, "{err}");
    let ev = json_events(&got, "upload");
    assert_eq!(ev[0]["total"], size);
    let done = ev.last().unwrap();
    assert_eq!(
        (done["done"].clone(), done["mappings"].clone()),
        (size.into(), 20.into())
    );

    // Plain periodic lines when stderr is not a terminal.
    let (ok, _, err) = lors(&[
        "upload",
        "--progress",
        "--depot",
        &a,
        "-c",
        "1",
        "-b",
        "100K",
        "-o",
        &p("plain.xnd"),
        &src,
    ]);
    assert!(ok, "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("lors: upload [##############] 100% 976.6 KiB/976.6 KiB")),
        "no plain progress line: {err}"
    );

    // augment counts what it copies: one new replica of every byte.
    let (ok, got, err) = lors(&[
        "augment", "--json", "--depot", &c, "-c", "1", "-o", &aug, &xnd,
    ]);
    assert!(ok, "{err}");
    let ev = json_events(&got, "augment");
    assert_eq!(ev[0]["total"], size, "augment's total");
    let done = ev.last().unwrap();
    assert_eq!(
        (done["done"].clone(), done["added"].clone()),
        (size.into(), 10.into())
    );

    // With A dead: download fails over and says so.
    ds[0].kill9();
    let (ok, got, err) = lors(&["download", "--json", "-o", &out, &aug]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), data);
    let ev = json_events(&got, "download");
    assert!(
        ev.iter()
            .any(|e| e["event"] == "failover" && e["depot"] == a.as_str()),
        "no failover event naming {a}: {ev:?}"
    );
    assert_eq!(ev.last().unwrap()["done"], size);

    // refresh: allocations as the unit; the dead depot's are listed as failed.
    let (ok, got, _) = lors(&["refresh", "--json", "--by", "1h", &aug]);
    assert!(!ok, "refresh with a dead depot must fail");
    let ev = json_events(&got, "refresh");
    assert_eq!(ev[0]["unit"], "allocations");
    assert_eq!(ev[0]["total"], 30);
    let done = ev.last().unwrap();
    assert_eq!(done["refreshed"], 20);
    let failed = done["failed"].as_array().unwrap();
    assert!(
        failed.len() == 10 && failed.iter().all(|f| f["depot"] == a.as_str()),
        "{done}"
    );

    // trim: releases counted per allocation (in place: into a new file,
    // the input would keep them).
    let (ok, got, err) = lors(&["trim", "--json", "--depot", &b, "--decrement", &aug]);
    assert!(ok, "{err}");
    let ev = json_events(&got, "trim");
    let done = ev.last().unwrap();
    assert_eq!(
        (ev[0]["total"].clone(), done["done"].clone()),
        (10.into(), 10.into())
    );
    assert_eq!(
        (done["removed"].clone(), done["not_released"].clone()),
        (10.into(), 0.into())
    );

    // route onto C: the old replicas on the dead depot cannot be released.
    let (ok, got, err) = lors(&["route", "--json", "--depot", &c, "-c", "1", &aug]);
    assert!(ok, "{err}");
    let ev = json_events(&got, "route");
    let done = ev.last().unwrap();
    assert_eq!(done["depots"], serde_json::json!([c]));
    assert_eq!(
        (done["removed"].clone(), done["not_released"].clone()),
        (10.into(), 10.into())
    );
    let (ok, got, err) = lors(&["download", "-q", "-o", "-", &aug]);
    assert!(ok, "{err}");
    assert!(got == data);
}

/// Errors a new user met: each says its cause once, in words that fit.
#[test]
fn errors_say_their_cause_once() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let data = pattern(300_000, 9);
    let xnd = upload_cli(&ds, dir.path(), "e.bin", &data, &["-c", "1", "-b", "100K"]);
    let x = xnd.to_str().unwrap();
    let (ok, _, err) = lors(&["trim", "-m", "0", "-o", "/dev/null", x]);
    assert!(
        !ok && err.contains("would remove the last replica of bytes 0..102400"),
        "{err}"
    );
    assert!(!err.contains("could not be read"), "{err}");
    let out = dir.path().join("o.bin");
    // An exNode is saved by renaming over the old file: never over a
    // device or a FIFO (as root, `-o /dev/null` replaced the node itself).
    let fifo = dir.path().join("fifo");
    if std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let (ok, _, err) = lors(&["modify", "-w", "-o", fifo.to_str().unwrap(), x]);
        use std::os::unix::fs::FileTypeExt as _;
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(!ok && err.contains("not a regular file"), "{err}");
    }
    let (ok, _, err) = lors(&["download", "-O", "300000", "-o", out.to_str().unwrap(), x]);
    assert!(
        !ok && err.contains("-O 300000 is past the end of the file (300000 bytes)"),
        "{err}"
    );
    // A lease past the depot's 30 d limit: said once for the depot.
    let (ok, stdout, _) = lors(&["refresh", "--to", "1000d", x]);
    let stdout = String::from_utf8_lossy(&stdout);
    assert!(!ok);
    assert_eq!(stdout.matches("not refreshed").count(), 1, "{stdout}");
    assert!(
        stdout.contains("mappings 0, 1, 2 not refreshed") && stdout.contains("--max"),
        "{stdout}"
    );
    // A misspelt keyword in the settings file is named with its line.
    let rc = dir.path().join("xndrc");
    std::fs::write(&rc, "COPIES 1\nTIMOUT 30\nVERBOSE 1\n").unwrap();
    let (ok, _, err) = lors(&["ls", "--xndrc", rc.to_str().unwrap(), x]);
    assert!(ok, "{err}");
    assert!(err.contains("line 2: TIMOUT: unknown keyword"), "{err}");
    assert!(
        !err.contains("VERBOSE"),
        "the original tools' keywords are fine: {err}"
    );
    // A missing directory is named as such, not blamed on FUSE.
    let (ok, _, err) = lors(&[
        "mount",
        "/nonexistent-xnd-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("the exNode directory /nonexistent-xnd-dir"),
        "{err}"
    );
    assert!(
        !err.contains("fuse") && err.matches("No such file").count() == 1,
        "{err}"
    );
}

/// `lors upload FILE OUT.xnd` and `lors download X.xnd OUT`, as cp and
/// rclone take a destination.
#[test]
fn destinations_may_be_positional() {
    let dir = tempdir();
    let ds = depots(1, dir.path());
    let src = dir.path().join("p.bin");
    let data = pattern(200_000, 3);
    std::fs::write(&src, &data).unwrap();
    let (xnd, out) = (dir.path().join("p.xnd"), dir.path().join("p.out"));
    let (x, o) = (xnd.to_str().unwrap(), out.to_str().unwrap());
    let (ok, _, err) = lors(&[
        "upload",
        "-q",
        "-c",
        "1",
        "--depot",
        &ds[0].addr,
        src.to_str().unwrap(),
        x,
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = lors(&["download", "-q", x, o]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
    let (ok, _, err) = lors(&["download", "-q", x, o, "-o", o]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
}

/// `--bwlimit` holds a command's data, over all its connections, to the
/// rate: 3 MiB at 1 MiB/s cannot take less than about 3 s.
#[test]
fn bwlimit_holds_uploads_downloads_and_copies_to_the_rate() {
    let dir = tempdir();
    let ds = depots(2, dir.path());
    let src = dir.path().join("b.bin");
    let data = pattern(3 << 20, 6);
    std::fs::write(&src, &data).unwrap();
    let (xnd, out, aug) = (
        dir.path().join("b.xnd"),
        dir.path().join("b.out"),
        dir.path().join("a.xnd"),
    );
    let (x, o, a) = (
        xnd.to_str().unwrap(),
        out.to_str().unwrap(),
        aug.to_str().unwrap(),
    );
    let timed = |args: &[&str]| {
        let t0 = Instant::now();
        let (ok, _, err) = lors(args);
        assert!(ok, "{args:?}: {err}");
        t0.elapsed()
    };
    let limited = [
        timed(&[
            "upload",
            "-q",
            "-c",
            "1",
            "-b",
            "256K",
            "--bwlimit",
            "1M",
            "--depot",
            &ds[0].addr,
            src.to_str().unwrap(),
            x,
        ]),
        timed(&["download", "-q", "-b", "256K", "--bwlimit", "1M", x, o]),
        timed(&[
            "augment",
            "-q",
            "-c",
            "1",
            "--bwlimit",
            "1M",
            "--depot",
            &ds[1].addr,
            "-o",
            a,
            x,
        ]),
    ];
    for (what, took) in ["upload", "download", "augment"].iter().zip(limited) {
        assert!(
            took >= Duration::from_millis(2500),
            "{what} took {took:?} at 1 MiB/s"
        );
    }
    assert!(std::fs::read(&out).unwrap() == data);
    let (ok, _, err) = lors(&["download", "-q", "--bwlimit", "0", x, o]);
    assert!(!ok && err.contains("--bwlimit"), "{err}");
}

/// A download to a stream with a block no replica serves writes every byte
/// before it, then fails naming it: it neither hangs at the gap nor stops
/// before the bytes ahead of it are out.
#[test]
fn a_stream_download_stops_at_the_first_gap_with_what_comes_before() {
    let dir = tempdir();
    let ds = crate::util::depots(2, dir.path());
    let data = pattern(4 << 20, 12);
    let to: Vec<&DepotProc> = ds.iter().collect();
    let xnd = crate::util::upload(&to, dir.path(), "f", &data, &["-c", "1", "-b", "1M"]);
    let x = xnd.to_str().unwrap();
    // Block 2's only copy freed through another exNode.
    free_block(&xnd, 2 << 20);
    let t0 = Instant::now();
    let (ok, out, err) = lors(&["download", "-q", "-o", "-", x]);
    assert!(!ok);
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    assert!(err.contains("error: bytes 2097152.."), "{err}");
    assert!(out == data[..2 << 20], "wrote {} bytes", out.len());
}
