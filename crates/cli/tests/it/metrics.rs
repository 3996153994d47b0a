//! The services' `/metrics`: what a depot and an L-Bone expose passes
//! `promtool check metrics` (Debian's `prometheus` package, which
//! `scripts/services.sh` installs and names in `LORS_PROMTOOL`), and the
//! counters move with the traffic that should move them.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::lbone::{call, located_depot};
use crate::util::{LboneProc, lors, pattern, tempdir};

fn promtool() -> Option<String> {
    match std::env::var("LORS_PROMTOOL") {
        Ok(p) => Some(p),
        Err(_) => {
            assert!(
                std::env::var_os("LORS_REQUIRE_SERVICES").is_none(),
                "LORS_REQUIRE_SERVICES is set but LORS_PROMTOOL is not"
            );
            eprintln!("promtool check skipped: LORS_PROMTOOL not set (scripts/test.sh sets it)");
            None
        }
    }
}

/// `GET url` as a scraper without OpenMetrics would (curl, promtool).
pub(crate) fn scrape(authority: &str, accept: &str) -> (String, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(authority).await.unwrap();
        let req = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let ctype = head
            .lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .unwrap_or("")
            .to_owned();
        (ctype, body.to_owned())
    })
}

/// A sample's value (`name` with its labels as written).
pub(crate) fn value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn check(tool: &str, what: &str, body: &str) {
    let mut p = Command::new(tool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool on the {what}'s metrics: {}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn both_services_pass_promtool_and_counters_follow_the_traffic() {
    let dir = tempdir();
    let lb = LboneProc::start(&dir.path().join("lb"), &[]);
    let d = located_depot(
        &dir.path().join("d"),
        &lb,
        "64M",
        &["--metrics-listen", "127.0.0.1:0", "--city", "Brno"],
    );
    let depot_metrics = d.metrics.clone().expect("metrics address");
    let before = scrape(&depot_metrics, "*/*").1;
    // Traffic: an upload and a download through the depot, queries and a
    // refused registration at the L-Bone.
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(300_000, 3)).unwrap();
    let xnd = dir.path().join("src.xnd");
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        &d.addr,
        "--copies",
        "1",
        "-b",
        "100k",
        "-o",
        xnd.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let back = dir.path().join("back");
    let (ok, _, err) = lors(&[
        "download",
        "-o",
        back.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        call(&lb, "GET", "/api/v1/depots?count=1", None, None).0,
        200
    );
    assert_eq!(
        call(&lb, "POST", "/api/v1/register", Some("wrong"), Some("{}")).0,
        401
    );
    assert_eq!(call(&lb, "GET", "/no/such/thing", None, None).0, 404);

    let (ctype, after) = scrape(&depot_metrics, "text/plain");
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let moved =
        |name: &str| value(&after, name).unwrap_or(0.0) - value(&before, name).unwrap_or(0.0);
    // The file's bytes and each block's 32-byte checksum, once each way.
    assert_eq!(moved("lors_depot_bytes_in_total"), 300_096.0, "{after}");
    assert_eq!(moved("lors_depot_bytes_out_total"), 300_096.0, "{after}");
    assert_eq!(
        moved("lors_depot_requests_total{command=\"ALLOCATE\",status=\"ok\"}"),
        3.0,
        "{after}"
    );
    assert!(moved("lors_depot_request_duration_seconds_count{command=\"LOAD\"}") >= 3.0);
    assert!(value(&after, "lors_depot_allocations{rid=\"1\"}") >= Some(3.0));
    // What Prometheus itself asks for: OpenMetrics.
    let (ctype, om) = scrape(&depot_metrics, "application/openmetrics-text;version=1.0.0");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(om.ends_with("# EOF\n"), "{om}");

    let lb_authority = lb.url().trim_start_matches("http://").to_owned();
    // The heartbeats are counted too (one a second).
    std::thread::sleep(Duration::from_millis(1500));
    let (_, lbm) = scrape(&lb_authority, "text/plain");
    assert_eq!(
        value(&lbm, "lors_lbone_depots{state=\"online\"}"),
        Some(1.0),
        "{lbm}"
    );
    assert_eq!(
        value(&lbm, "lors_lbone_refused_tokens_total"),
        Some(1.0),
        "{lbm}"
    );
    assert!(value(&lbm, "lors_lbone_registrations_total{kind=\"heartbeat\"}") >= Some(1.0));
    assert!(
        value(
            &lbm,
            "lors_lbone_http_requests_total{route=\"/api/v1/depots\",method=\"GET\",status=\"200\"}"
        ) >= Some(1.0),
        "{lbm}"
    );
    // Unknown paths count as one route, whatever was asked.
    assert!(
        lbm.contains("route=\"other\",method=\"GET\",status=\"404\""),
        "{lbm}"
    );
    assert!(!lbm.contains("/no/such/thing"), "{lbm}");

    if let Some(tool) = promtool() {
        check(&tool, "depot", &after);
        check(&tool, "L-Bone", &lbm);
    }
}
