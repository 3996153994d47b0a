//! The L-Bone dashboard in real headless Chromium (Debian's package, which
//! `scripts/services.sh` installs and names in `LORS_CHROMIUM`): the page
//! loads, lists the registered depots, marks an offline one, and draws a map
//! marker per depot. Also leaves a screenshot for people to look at.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::lbone::{call, located_depot};
use crate::util::{LboneProc, tempdir};

fn chromium() -> Option<PathBuf> {
    match std::env::var_os("LORS_CHROMIUM") {
        Some(p) => Some(p.into()),
        None => {
            assert!(
                std::env::var_os("LORS_REQUIRE_SERVICES").is_none(),
                "LORS_REQUIRE_SERVICES is set but LORS_CHROMIUM is not"
            );
            eprintln!("dashboard test skipped: LORS_CHROMIUM not set (scripts/test.sh sets it)");
            None
        }
    }
}

/// Runs headless Chromium on `url` with `extra` flags; returns stdout.
fn headless(chrome: &Path, profile: &Path, url: &str, extra: &[&str]) -> String {
    let out = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,900",
            // Let the page's fetch and render finish before the dump.
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dashboard_lists_depots_marks_offline_and_maps_them() {
    let Some(chrome) = chromium() else { return };
    let dir = tempdir();
    let lb = LboneProc::start(&dir.path().join("lb"), &["--offline-after", "2s"]);
    let places: [&[&str]; 3] = [
        &[
            "--city",
            "Brno",
            "--country",
            "CZ",
            "--lat",
            "49.19",
            "--lon",
            "16.61",
        ],
        &[
            "--city",
            "Knoxville",
            "--state",
            "TN",
            "--country",
            "US",
            "--lat",
            "35.96",
            "--lon",
            "-83.92",
        ],
        &[
            "--city",
            "Tokyo",
            "--country",
            "JP",
            "--lat",
            "35.68",
            "--lon",
            "139.69",
        ],
    ];
    let mut depots: Vec<_> = places
        .iter()
        .enumerate()
        .map(|(i, p)| located_depot(&dir.path().join(format!("d{i}")), &lb, "2G", p))
        .collect();
    let gone = depots[2].addr.clone();
    depots[2].kill9();
    let t = Instant::now();
    loop {
        let (_, v) = call(&lb, "GET", "/api/v1/depots?all=1", None, None);
        if v["depots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["online"] == false)
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "depot never went offline"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let url = format!("{}/", lb.url());
    let dom = headless(&chrome, &dir.path().join("profile1"), &url, &["--dump-dom"]);
    assert!(dom.contains("L-Bone"), "page loaded: {dom}");
    for d in &depots[..2] {
        assert!(
            dom.contains(&format!("<tr class=\"online\" data-addr=\"{}\">", d.addr)),
            "row for {} in {dom}",
            d.addr
        );
    }
    assert!(
        dom.contains(&format!("<tr class=\"offline\" data-addr=\"{gone}\">")),
        "offline row for {gone}"
    );
    assert_eq!(dom.matches("class=\"marker online\"").count(), 2, "{dom}");
    assert_eq!(dom.matches("class=\"marker offline\"").count(), 1);
    assert!(dom.contains("<b id=\"n-online\">2</b>") && dom.contains("<b id=\"n-offline\">1</b>"));
    for city in ["Brno", "Knoxville", "Tokyo"] {
        assert!(dom.contains(city), "{city} labelled");
    }

    // A screenshot to look at (kept in the target directory).
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lbone-dashboard.png");
    let _ = std::fs::remove_file(&shot);
    headless(
        &chrome,
        &dir.path().join("profile2"),
        &url,
        &[&format!("--screenshot={}", shot.display())],
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}
