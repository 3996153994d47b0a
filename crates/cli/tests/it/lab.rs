//! Fault and straggler scenarios in a network lab: each depot on a host of
//! its own (a network namespace) behind a rate-limited link, built by
//! `scripts/netlab.sh`; the client's host has an unlimited link. Needs root
//! and iproute2: skipped otherwise, unless `LORS_REQUIRE_SERVICES=1` (as in
//! CI), which makes a missing lab a failure.
//!
//! Each scenario checks what a user would: the transfer completes and the
//! bytes are identical. Times are printed, never asserted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::util::{DepotProc, pattern, tempdir};

/// Every depot link, Mbit/s each way.
const RATE: u32 = 40;
const SIZE: usize = 24 << 20;

fn netlab_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netlab.sh")
}

struct Lab {
    prefix: String,
    net: String,
    depots: Vec<Option<DepotProc>>,
    dir: tempfile::TempDir,
}

impl Lab {
    /// `n` depot hosts (1..=n) at [`RATE`] and a client host n+1, or `None`
    /// when this machine cannot build a lab.
    fn up(prefix: &str, net: &str, n: usize) -> Option<Lab> {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let required = std::env::var("LORS_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
        if !root {
            assert!(!required, "the network lab needs root");
            eprintln!("skipping: the network lab needs root");
            return None;
        }
        let mut lab = Lab {
            prefix: prefix.into(),
            net: net.into(),
            depots: Vec::new(),
            dir: tempdir(),
        };
        let up = lab.netlab(&["up", &(n + 1).to_string(), &RATE.to_string()]);
        if !up.status.success() {
            let why = String::from_utf8_lossy(&up.stderr).into_owned();
            assert!(!required, "cannot build the network lab: {why}");
            eprintln!("skipping: cannot build the network lab: {why}");
            return None;
        }
        assert!(
            lab.netlab(&["rate", &(n + 1).to_string(), "0"])
                .status
                .success()
        );
        for i in 1..=n {
            let data = lab.dir.path().join(format!("depot-{i}"));
            let listen = format!("{}:6714", lab.addr(i));
            let d = DepotProc::start_in(&lab.ns(i), &data, &["--listen", &listen]);
            lab.depots.push(Some(d));
        }
        Some(lab)
    }

    fn netlab(&self, args: &[&str]) -> Output {
        Command::new("bash")
            .arg(netlab_script())
            .args(args)
            .env("NL_PREFIX", &self.prefix)
            .env("NL_NET", &self.net)
            .output()
            .expect("run netlab.sh")
    }

    fn addr(&self, i: usize) -> String {
        let out = self.netlab(&["addr", &i.to_string()]);
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    fn ns(&self, i: usize) -> Vec<String> {
        ["ip", "netns", "exec", &format!("{}-h{i}", self.prefix)]
            .map(String::from)
            .to_vec()
    }

    fn client(&self) -> usize {
        self.depots.len() + 1
    }

    /// `lors ARGS…` on the client host, not waited for.
    fn spawn(&self, args: &[&str]) -> Child {
        let ns = self.ns(self.client());
        Command::new(&ns[0])
            .args(&ns[1..])
            .arg(env!("CARGO_BIN_EXE_lors"))
            .args(args)
            .env("RUST_LOG", "warn")
            .env_remove("LBONE_SERVER")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lors in the lab")
    }

    /// `lors ARGS…` on the client host.
    fn run(&self, args: &[&str]) -> Output {
        self.spawn(args).wait_with_output().unwrap()
    }

    fn depot_args(&self) -> Vec<String> {
        self.depots
            .iter()
            .flatten()
            .flat_map(|d| ["--depot".to_string(), d.addr.clone()])
            .collect()
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Writes the test file and uploads it: 2 copies of 1 MiB blocks.
    fn place(&self) -> (Vec<u8>, String) {
        let data: Vec<u8> = (0..SIZE as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(self.path("src.bin"), &data).unwrap();
        let xnd = self.path("src.xnd");
        let mut args = vec!["upload", "--quiet", "-n", "-c", "2", "-b", "1M", "-o", &xnd];
        let depots = self.depot_args();
        args.extend(depots.iter().map(String::as_str));
        let src = self.path("src.bin");
        args.push(&src);
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (data, xnd)
    }

    /// Cuts host `i`'s link: its packets go nowhere, its connections hang.
    fn cut(&self, i: usize) {
        let ns = self.ns(i);
        let st = Command::new(&ns[0])
            .args(&ns[1..])
            .args(["ip", "link", "set", "eth0", "down"])
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut d) = self.depots[i - 1].take() {
            d.kill9();
            self.depots[i - 1] = Some(d); // keep its address for depot_args
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.depots.clear();
        let _ = self.netlab(&["down"]);
    }
}

/// Downloads `xnd` on the client host with `-T 2s` and checks the bytes.
fn download_identical(lab: &Lab, xnd: &str, want: &[u8], fault: impl FnOnce()) -> String {
    let out = lab.path("out.bin");
    let t0 = Instant::now();
    let child = lab.spawn(&["download", "--quiet", "--json", "-T", "2s", "-o", &out, xnd]);
    fault();
    let res = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&res.stderr).into_owned();
    assert!(res.status.success(), "download failed: {stderr}");
    let got = std::fs::read(&out).unwrap();
    assert!(got == want, "downloaded bytes differ from the upload");
    eprintln!("download took {:.2}s", t0.elapsed().as_secs_f64());
    String::from_utf8_lossy(&res.stdout).into_owned() + &stderr
}

fn after(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// Writes `len` test bytes to `name` in the lab's directory: the bytes, the
/// path, and the path of its exNode-to-be.
fn lab_file(lab: &Lab, name: &str, len: usize, seed: u8) -> (Vec<u8>, String, String) {
    let data = pattern(len, seed);
    let src = lab.path(name);
    std::fs::write(&src, &data).unwrap();
    (data, src, lab.path(&format!("{name}.xnd")))
}

/// The depots of the lab's sites, in host order.
fn lab_sites(lab: &Lab) -> Vec<String> {
    lab.depots
        .iter()
        .flatten()
        .map(|d| d.addr.clone())
        .collect()
}

/// The `--json` summary: the last line of a command's stdout.
fn json_summary(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().expect("a summary line")).unwrap()
}

/// Downloads the replica on `depot` alone (an exNode of its mappings only)
/// and checks it is `want`.
fn replica_identical(lab: &Lab, xnd: &str, depot: &str, want: &[u8]) {
    let mut x = lors::xnd::load(Path::new(xnd)).unwrap();
    x.mappings.retain(|m| m.depot().as_deref() == Some(depot));
    let one = lab.path("one.xnd");
    lors::xnd::save(Path::new(&one), &x).unwrap();
    download_identical(lab, &one, want, || {});
}

#[test]
fn a_depot_at_a_tenth_of_the_rate_serves_less_and_the_download_is_identical() {
    let Some(lab) = Lab::up("lt1", "10.213.31", 3) else {
        return;
    };
    let (data, xnd) = lab.place();
    assert!(
        lab.netlab(&["rate", "1", &(RATE / 10).to_string()])
            .status
            .success()
    );
    let report = download_identical(&lab, &xnd, &data, || {});
    // The JSON summary lists bytes per depot: the slow one must not have
    // carried its even share.
    let slow = lab.depots[0].as_ref().unwrap().addr.clone();
    let done = report
        .lines()
        .find(|l| l.starts_with("{\"event\":\"done\""))
        .expect("a JSON done event");
    let v: serde_json::Value = serde_json::from_str(done).expect("JSON summary");
    let served = v["per_depot"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["depot"] == slow.as_str())
        .map_or(0, |d| d["bytes"].as_u64().unwrap());
    assert!(
        served < (SIZE / 3) as u64,
        "the slowed depot served {served} of {SIZE} bytes"
    );
}

#[test]
fn a_depot_link_cut_mid_download_leaves_the_output_identical() {
    let Some(lab) = Lab::up("lt2", "10.213.32", 3) else {
        return;
    };
    let (data, xnd) = lab.place();
    download_identical(&lab, &xnd, &data, || {
        after(400);
        lab.cut(1);
    });
}

#[test]
fn a_depot_killed_mid_download_leaves_the_output_identical() {
    let Some(mut lab) = Lab::up("lt3", "10.213.33", 3) else {
        return;
    };
    let (data, xnd) = lab.place();
    let out = lab.path("out.bin");
    let child = lab.spawn(&["download", "--quiet", "-T", "2s", "-o", &out, &xnd]);
    after(400);
    lab.kill(1);
    let res = child.wait_with_output().unwrap();
    assert!(
        res.status.success(),
        "download failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    assert!(
        std::fs::read(&out).unwrap() == data,
        "downloaded bytes differ"
    );
}

/// Uploads with a fault injected 400 ms in; the upload must complete and
/// the file come back identical with the fault still in place.
fn upload_survives(prefix: &str, net: &str, fault: impl FnOnce(&mut Lab)) {
    let Some(mut lab) = Lab::up(prefix, net, 4) else {
        return;
    };
    let data: Vec<u8> = (0..SIZE as u64).map(|i| (i * 7 + i / 4099) as u8).collect();
    let src = lab.path("src.bin");
    std::fs::write(&src, &data).unwrap();
    let xnd = lab.path("up.xnd");
    let depots = lab.depot_args();
    let mut args = vec!["upload", "--quiet", "-n", "-c", "2", "-b", "1M", "-T", "2s"];
    args.extend(depots.iter().map(String::as_str));
    args.extend(["-o", &xnd, &src]);
    let t0 = Instant::now();
    let child = lab.spawn(&args);
    after(400);
    fault(&mut lab);
    let res = child.wait_with_output().unwrap();
    assert!(
        res.status.success(),
        "upload failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    eprintln!("upload took {:.2}s", t0.elapsed().as_secs_f64());
    download_identical(&lab, &xnd, &data, || {});
}

#[test]
fn an_upload_completes_on_the_other_depots_when_one_is_killed() {
    upload_survives("lt4", "10.213.34", |lab| lab.kill(1));
}

#[test]
fn an_upload_completes_on_the_other_depots_when_a_link_is_cut() {
    upload_survives("lt5", "10.213.35", |lab| lab.cut(2));
}

/// On a terminal 80 columns wide, a download over rate-limited links draws
/// a total line with rate and ETA and one line per depot, none wrapping,
/// and names a depot that stalls.
#[test]
fn progress_bars_show_each_depot_fit_80_columns_and_name_a_stall() {
    let Some(lab) = Lab::up("lt6", "10.213.36", 3) else {
        return;
    };
    let (data, xnd) = lab.place();
    let out = lab.path("out.bin");
    // `script` gives the download a terminal of its own, 80 columns wide.
    let cmd = format!(
        "stty cols 80 rows 24; {} download --stall 1s -T 20s -o {out} {xnd}",
        env!("CARGO_BIN_EXE_lors")
    );
    let ns = lab.ns(lab.client());
    let child = Command::new(&ns[0])
        .args(&ns[1..])
        .args(["script", "-qec", &cmd, "/dev/null"])
        .env("RUST_LOG", "warn")
        .env("TERM", "xterm")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run script");
    let frozen = lab.depots[0].as_ref().unwrap();
    // Frozen once bytes arrive, not after a guess at how long a loaded
    // machine takes to start the download: a freeze over before it began
    // would stall nothing.
    let part = lors::download::partial_path(Path::new(&out));
    let t0 = Instant::now();
    while std::fs::metadata(&part).map_or(true, |m| m.len() == 0) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the download never started"
        );
        after(20);
    }
    frozen.signal("STOP");
    after(3000);
    frozen.signal("CONT");
    let res = child.wait_with_output().unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    assert!(
        std::fs::read(&out).unwrap() == data,
        "downloaded bytes differ"
    );
    // What the terminal was sent, as lines: escape sequences dropped, cursor
    // returns and newlines as breaks.
    let raw = String::from_utf8_lossy(&res.stdout);
    let mut text = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else if c == '\r' {
            text.push('\n');
        } else {
            text.push(c);
        }
    }
    // indicatif pads every line to the terminal's width and lets the
    // terminal wrap to the next: cut what it drew into 80-column rows. A
    // line of ours longer than 80 would leave a row starting mid-text.
    let mut rows: Vec<String> = Vec::new();
    for seg in text.lines().filter(|l| l.starts_with("download [")) {
        let chars: Vec<char> = seg.chars().collect();
        for row in chars.chunks(80) {
            let row: String = row.iter().collect();
            if !row.trim().is_empty() {
                rows.push(row.trim_end().to_owned());
            }
        }
    }
    for r in &rows {
        assert!(
            r.starts_with("download [") || r.starts_with("  "),
            "a progress line wrapped at 80 columns, leaving the row {r:?}: {text}"
        );
    }
    assert!(
        rows.iter()
            .any(|l| l.starts_with("download [") && l.contains("ETA")),
        "no total line with an ETA: {text}"
    );
    for d in lab.depots.iter().flatten() {
        assert!(
            rows.iter().any(|l| l.starts_with(&format!("  {}", d.addr))),
            "no line for depot {}: {text}",
            d.addr
        );
    }
    assert!(
        text.contains(&format!("depot {} has sent nothing for", frozen.addr)),
        "the stalled depot is not named: {text}"
    );
}

#[test]
fn dissemination_a_slow_site_gets_its_replica_without_holding_up_the_others() {
    let Some(lab) = Lab::up("lt7", "10.213.37", 4) else {
        return;
    };
    assert!(
        lab.netlab(&["rate", "1", &(RATE / 10).to_string()])
            .status
            .success()
    );
    let (data, src, xnd) = lab_file(&lab, "d.bin", 8 << 20, 47);
    let sites = lab_sites(&lab);
    let to = sites.join(",");
    let out = lab.run(&["disseminate", "--json", "-o", &xnd, &src, "--to", &to]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v = json_summary(&out);
    let secs: Vec<f64> = (v["sites"].as_array().unwrap().iter())
        .map(|s| {
            assert_eq!(s["complete"], true, "{s}");
            s["seconds"].as_f64().unwrap()
        })
        .collect();
    let (slow, fast) = (secs[0], secs[1..].iter().copied().fold(0.0, f64::max));
    eprintln!(
        "slow site {slow:.2}s, the others by {fast:.2}s, source sent {}",
        v["source_bytes"]
    );
    // Its link is a tenth of theirs: they finish long before it, not
    // after waiting for blocks only it holds.
    assert!(
        fast < slow / 3.0,
        "the others took {fast:.2}s, the slow site {slow:.2}s"
    );
    // It was fed by relays: the client still sent each block about once.
    let sent = v["source_bytes"].as_u64().unwrap();
    assert!(
        sent < data.len() as u64 * 5 / 4,
        "the source sent {sent} bytes"
    );
    // A fast site's replica, read back alone, is the file.
    replica_identical(&lab, &xnd, &sites[1], &data);
}

#[test]
fn dissemination_goes_on_when_a_site_is_killed_mid_run() {
    let Some(mut lab) = Lab::up("lt8", "10.213.38", 4) else {
        return;
    };
    let (data, src, xnd) = lab_file(&lab, "k.bin", 16 << 20, 48);
    let sites = lab_sites(&lab);
    let to = sites.join(",");
    // 16 MiB at 40 Mbit/s: about 3.4 s; the depot dies a second in.
    let child = lab.spawn(&[
        "disseminate",
        "--json",
        "--stall",
        "5s",
        "-o",
        &xnd,
        &src,
        "--to",
        &to,
    ]);
    after(1000);
    lab.kill(2);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a site failed: the command says so");
    assert!(
        stderr.contains(&format!(
            "1 of 4 sites did not get a full replica ({}: ",
            sites[1]
        )),
        "{stderr}"
    );
    let v = json_summary(&out);
    for (i, s) in v["sites"].as_array().unwrap().iter().enumerate() {
        assert_eq!(s["complete"], i != 1, "{s}");
    }
    eprintln!("{v}");
    // The survivors' replicas are whole; the dead site is not in the exNode.
    let x = lors::xnd::load(Path::new(&xnd)).unwrap();
    assert!(
        x.mappings
            .iter()
            .all(|m| m.depot().as_deref() != Some(sites[1].as_str()))
    );
    replica_identical(&lab, &xnd, &sites[3], &data);
}

/// At distance: every depot's link 25 ms each way (50 ms round trips to
/// the client, 100 ms depot to depot) with 1 % loss each way, through the
/// lab's wire (`netlab.sh wan`). Upload, download, augment (depot to depot)
/// and a keeper cycle complete, and every copy is byte-exact.
#[test]
fn at_distance_with_loss_every_command_is_byte_exact() {
    let Some(lab) = Lab::up("lt9", "10.213.39", 3) else {
        return;
    };
    for i in 1..=3 {
        let out = lab.netlab(&["wan", &i.to_string(), "25", "1"]);
        assert!(
            out.status.success(),
            "netlab.sh wan (needs the lors-wan binary: cargo build -p lors-wan): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sites = lab_sites(&lab);
    let (data, src, xnd) = lab_file(&lab, "far.bin", 6 << 20, 21);
    let t0 = Instant::now();
    let first = format!("{},{}", sites[0], sites[1]);
    let out = lab.run(&[
        "upload", "-q", "-c", "1", "--depot", &first, "-o", &xnd, &src,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("upload took {:.2}s", t0.elapsed().as_secs_f64());
    // 50 ms away, each depot is worth 25 blocks in flight: the 6 MiB file
    // is cut into 256 KiB blocks (the smallest distance cuts), not one of
    // the 10 MiB default that would go over a single connection.
    let blocks = lors::xnd::load(Path::new(&xnd)).unwrap().mappings.len();
    assert_eq!(blocks, 24, "blocks of the upload at distance");
    // Through the loss, every allocation an attempt made and no block
    // kept was freed before the upload ended: the depots hold exactly the
    // blocks the exNode names.
    let named = crate::copies::named_in(&[&PathBuf::from(&xnd)]);
    for (i, site) in sites.iter().enumerate().take(2) {
        let held = crate::copies::held_in(&lab.dir.path().join(format!("depot-{}", i + 1)));
        assert_eq!(
            held,
            named.get(site).cloned().unwrap_or_default(),
            "what {site} holds after the upload"
        );
    }
    download_identical(&lab, &xnd, &data, || {});
    // Streamed, from depots this far, in 64 KiB pieces: every byte, in order.
    let out = lab.run(&["download", "-q", "-o", "-", &xnd]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout == data,
        "the stream at distance differs from the file"
    );
    let out = lab.run(&["augment", "-q", "-c", "1", "--depot", &sites[2], &xnd]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    replica_identical(&lab, &xnd, &sites[2], &data);
    let out = lab.run(&["keep", "--once", "--grace", "0", &xnd]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    download_identical(&lab, &xnd, &data, || {});
}
