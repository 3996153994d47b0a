//! `lors bench`: sweeps against real depots and local movers, their files,
//! fits, reports and predictions.

use std::path::Path;

use crate::util::{DepotProc, lors, tempdir};

fn rows(dir: &Path) -> usize {
    let text = std::fs::read_to_string(dir.join("runs.csv")).unwrap();
    assert!(
        text.starts_with("size_bytes,parallel,streams,rep,file,seconds\n"),
        "{text}"
    );
    text.lines().count() - 1
}

/// Every depot's hard storage in use is 0.
fn assert_empty(depots: &[DepotProc], what: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for dp in depots {
        let used = rt.block_on(async {
            dp.connect()
                .await
                .status("1", "ibp")
                .await
                .map(|s| s.used_hard)
        });
        assert_eq!(used.ok(), Some(0), "{} still holds {what}", dp.addr);
    }
}

fn ok(args: &[&str]) -> String {
    let (success, out, err) = lors(args);
    assert!(success, "lors {args:?} failed: {err}");
    String::from_utf8(out).unwrap()
}

#[test]
fn a_sweep_against_real_depots_gives_csv_json_fits_a_report_and_a_prediction() {
    let tmp = tempdir();
    let depots: Vec<DepotProc> = (0..2)
        .map(|i| DepotProc::start(&tmp.path().join(format!("d{i}")), &[]))
        .collect();
    let dir = tmp.path().join("sweep");
    let d = dir.to_str().unwrap();
    let out = ok(&[
        "bench",
        "sweep",
        "-o",
        d,
        "--depot",
        &depots[0].addr,
        "--depot",
        &depots[1].addr,
        "--sizes",
        "64K,256K,1M,2M",
        "--parallel",
        "1,2,3",
        "-r",
        "3",
        "-b",
        "256K",
        "-q",
    ]);
    assert!(out.contains("total throughput"), "{out}");
    // Every file of every repetition: 3 × (1 + 2 + 3) × 4 sizes.
    assert_eq!(rows(&dir), 72);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("sweep.json")).unwrap()).unwrap();
    let meta = &json["meta"];
    assert_eq!(meta["scenario"], "depots");
    assert_eq!(meta["lors_version"], env!("CARGO_PKG_VERSION"));
    assert!(
        meta["host"].as_str().is_some_and(|h| !h.is_empty()) && meta["cpus"].as_u64() >= Some(1)
    );
    assert_eq!(json["runs"].as_array().unwrap().len(), 72);
    let points = json["points"].as_array().unwrap();
    assert_eq!(points.len(), 12);
    for p in points {
        let (mean, err) = (p["mean"].as_f64().unwrap(), p["error"].as_f64().unwrap());
        assert!(mean > 0.0 && err > 0.0 && err < mean, "{p}");
        let total = p["total"].as_f64().unwrap();
        assert!((total - mean * p["parallel"].as_f64().unwrap()).abs() < 1e-6 * total);
    }
    // The staged files were released from the depots and their exNodes removed.
    assert!(!dir.join("stage").exists());
    assert_empty(&depots, "staged data");

    let fit = ok(&["bench", "fit", d]);
    assert!(
        fit.contains("mean R²") && fit.contains("throughput vs size at 2 parallel, 1 stream"),
        "{fit}"
    );
    let fits: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("fits.json")).unwrap()).unwrap();
    let table = fits["table"].as_array().unwrap();
    assert!(
        table.iter().any(|r| r["var"] == "size") && table.iter().any(|r| r["var"] == "parallel")
    );
    assert!(table.iter().all(|r| r["mean_r2"].as_f64().unwrap() <= 1.0));

    let rep = ok(&["bench", "report", d]);
    assert!(rep.contains("report.html"), "{rep}");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        2,
        "one plot per variable varied"
    );
    assert!(html.contains("<circle") && html.contains("<polyline") && html.contains("mean R²"));
    assert!(
        html.contains(&depots[0].addr),
        "the report names what was measured"
    );
    for plot in ["plot-size.svg", "plot-parallel.svg"] {
        assert!(
            std::fs::read_to_string(dir.join(plot))
                .unwrap()
                .starts_with("<svg")
        );
    }

    let line = ok(&["bench", "predict", d, "--size", "1M", "--parallel", "2"]);
    assert!(
        line.starts_with("this setup sustains ") && line.contains(" ± "),
        "{line}"
    );
    assert!(
        line.contains("transfers/min of 1 MiB files with 2 in parallel"),
        "{line}"
    );
    assert!(!line.contains("outside"), "{line}");
    let far = ok(&["bench", "predict", d, "--size", "64M", "--parallel", "2"]);
    assert!(
        far.contains("outside the measured range (sizes 64 KiB-2 MiB)"),
        "{far}"
    );
    let (success, _, err) = lors(&["bench", "predict", d, "--size", "3M", "--parallel", "5"]);
    assert!(
        !success && err.contains("no fitted curve passes through 3 MiB, 5 parallel"),
        "{err}"
    );

    // Uploads: each is timed, then released, so the depots end empty.
    let up = tmp.path().join("up");
    let up_sweep = [
        "bench",
        "sweep",
        "-o",
        up.to_str().unwrap(),
        "--upload",
        "--depot",
        &depots[0].addr,
        "--depot",
        &depots[1].addr,
        "--sizes",
        "64K,256K,1M",
        "--parallel",
        "1,2",
        "-r",
        "2",
        "-q",
    ];
    ok(&up_sweep);
    assert_eq!(rows(&up), 2 * 3 * 3);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(up.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(json["meta"]["command"][1], "upload");
    assert!(
        json["meta"]["target"]
            .as_str()
            .unwrap()
            .starts_with("uploads to ")
    );
    assert_empty(&depots, "timed uploads");
    // An upload cut short by an interrupted sweep is released by the next
    // run, even one with nothing left to time.
    std::fs::create_dir_all(up.join("scratch")).unwrap();
    let src = tmp.path().join("src");
    std::fs::write(&src, vec![1u8; 100_000]).unwrap();
    let left = up.join("scratch/dst-0");
    ok(&[
        "upload",
        src.to_str().unwrap(),
        "--depot",
        &depots[0].addr,
        "-c",
        "1",
        "-q",
        "-o",
        left.to_str().unwrap(),
    ]);
    let again = ok(&up_sweep);
    assert!(again.contains("nothing to do"), "{again}");
    assert_empty(&depots, "an interrupted sweep's upload");
    assert!(!up.join("scratch").exists());
    let (success, _, err) = lors(&["bench", "sweep", "-o", d, "--scenario", "cp", "--upload"]);
    assert!(
        !success && err.contains("--upload is for the loopback and depots"),
        "{err}"
    );
}

#[test]
fn sweeps_resume_extend_plan_and_fail_clearly() {
    let tmp = tempdir();
    let dir = tmp.path().join("cp");
    let d = dir.to_str().unwrap();
    let sweep = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "sweep",
            "-o",
            d,
            "--scenario",
            "cp",
            "--sizes",
            "4K,16K,64K",
            "--parallel",
            "1,2",
        ];
        args.extend_from_slice(extra);
        let (success, out, err) = lors(&args);
        assert!(success, "{err}");
        (String::from_utf8(out).unwrap(), err)
    };
    sweep(&["-r", "2"]);
    assert_eq!(rows(&dir), 2 * 3 * 3);
    // A run cut off mid-line is redone, not misread.
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("runs.csv"))
            .unwrap();
        f.write_all(b"4096,2,1,2,0,0.0").unwrap();
    }
    let (plan, _) = sweep(&["-r", "3", "--dry-run"]);
    assert!(
        plan.contains("6 configurations × 3 repetitions: 6 runs to do"),
        "{plan}"
    );
    assert!(
        plan.contains("repetition 3") && !plan.contains("repetition 2"),
        "{plan}"
    );
    // Extending to 3 repetitions runs only the third.
    let (_, progress) = sweep(&["-r", "3"]);
    assert!(
        progress.contains("[6/6]") && !progress.contains("[7/"),
        "{progress}"
    );
    assert_eq!(
        rows(&dir),
        3 * 3 * 3,
        "the torn line is gone, every run is whole"
    );

    // Nothing left: nothing staged, the figures printed again.
    let (again, progress) = sweep(&["-r", "3"]);
    assert!(
        again.contains("nothing to do: the 18 runs planned are done, 27 timed transfers")
            && again.contains("per file MiB/s"),
        "{again}"
    );
    assert!(!progress.contains("staging"), "{progress}");

    // The same directory for another mover is refused.
    let (success, _, err) = lors(&["bench", "sweep", "-o", d, "--scenario", "loopback"]);
    assert!(!success && err.contains("holds a sweep of Cp"), "{err}");
    // A failing mover stops the sweep with its message and what to do.
    let bad = tmp.path().join("bad");
    let (success, _, err) = lors(&[
        "bench",
        "sweep",
        "-o",
        bad.to_str().unwrap(),
        "--command",
        "echo depot unreachable >&2; exit 4",
        "--sizes",
        "4K",
        "--parallel",
        "1",
        "-r",
        "2",
    ]);
    assert!(
        !success && err.contains("depot unreachable") && err.contains("to resume"),
        "{err}"
    );
    // A mover that exits 0 without writing the whole file is caught.
    let (success, _, err) = lors(&[
        "bench",
        "sweep",
        "-o",
        bad.join("short").to_str().unwrap(),
        "--command",
        "head -c 100 {src} > {dst}",
        "--sizes",
        "4K",
        "--parallel",
        "1",
        "-r",
        "2",
    ]);
    assert!(!success && err.contains("left 100 bytes"), "{err}");
    let (success, _, err) = lors(&["bench", "sweep", "-o", d, "--scenario", "depots"]);
    assert!(!success && err.contains("no depots: give --depot"), "{err}");
    let (success, _, err) = lors(&["bench", "fit", tmp.path().join("none").to_str().unwrap()]);
    assert!(!success && err.contains("holds no runs"), "{err}");
}

/// Seed 002's scenario 2: `globus-url-copy` through a GridFTP server on the
/// node itself, where GridFTP is installed.
#[test]
fn gridftp_scenario_where_installed() {
    let installed = ["globus-url-copy", "globus-gridftp-server"]
        .iter()
        .all(|p| {
            std::process::Command::new("which")
                .arg(p)
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if !installed {
        eprintln!("skipped: globus-url-copy or globus-gridftp-server is not installed");
        return;
    }
    let tmp = tempdir();
    // The server serves anonymous users as nobody when run as root.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tmp.path().join("gridftp");
    let d = dir.to_str().unwrap();
    ok(&[
        "bench",
        "sweep",
        "-o",
        d,
        "--scenario",
        "gridftp",
        "--sizes",
        "64K,256K,1M",
        "--parallel",
        "1,2",
        "--streams",
        "1,2",
        "-r",
        "2",
        "-q",
    ]);
    assert_eq!(rows(&dir), 2 * 3 * 3 * 2);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(json["meta"]["command"][0], "globus-url-copy");
    let line = ok(&[
        "bench",
        "predict",
        d,
        "--size",
        "512K",
        "--parallel",
        "2",
        "--streams",
        "2",
    ]);
    assert!(
        line.contains("transfers/min of 512 KiB files with 2 in parallel (2 streams each"),
        "{line}"
    );
}

/// With no mover named, the sweep runs its own depot on 127.0.0.1 and
/// leaves only its results behind.
#[test]
fn the_default_scenario_runs_a_depot_of_its_own_and_leaves_only_results() {
    let tmp = tempdir();
    let dir = tmp.path().join("lo");
    let d = dir.to_str().unwrap();
    let (success, out, err) = lors(&[
        "bench",
        "sweep",
        "-o",
        d,
        "--sizes",
        "64K,128K,256K",
        "--parallel",
        "1,2",
        "-r",
        "2",
    ]);
    assert!(success, "{err}");
    assert!(
        err.contains("staging 6 files") && err.contains("[12/12]") && err.contains("ETA"),
        "{err}"
    );
    assert!(
        String::from_utf8(out)
            .unwrap()
            .contains("next: lors bench fit")
    );
    assert_eq!(rows(&dir), 2 * 3 * 3);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(json["meta"]["scenario"], "loopback");
    assert_eq!(json["meta"]["command"][1], "download");
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["runs.csv", "sweep.json"],
        "staged files, the depot's data and scratch copies are gone"
    );
}

/// Depots chosen by the L-Bone, as `lors upload -H` chooses them.
#[test]
fn a_sweep_of_the_depots_an_lbone_names() {
    let tmp = tempdir();
    let lb = crate::util::LboneProc::start(&tmp.path().join("lb"), &[]);
    let depots: Vec<DepotProc> = (0..2)
        .map(|i| crate::lbone::located_depot(&tmp.path().join(format!("d{i}")), &lb, "1G", &[]))
        .collect();
    let dir = tmp.path().join("lb-sweep");
    let url = lb.url();
    ok(&[
        "bench",
        "sweep",
        "-o",
        dir.to_str().unwrap(),
        "-H",
        &url,
        "--max-depots",
        "2",
        "--sizes",
        "64K,256K,1M",
        "--parallel",
        "1,2",
        "-r",
        "2",
        "-q",
    ]);
    assert_eq!(rows(&dir), 2 * 3 * 3);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(json["meta"]["scenario"], "depots");
    let target = json["meta"]["target"].as_str().unwrap();
    assert!(depots.iter().all(|d| target.contains(&d.addr)), "{target}");
    assert_empty(&depots, "staged data");
}
