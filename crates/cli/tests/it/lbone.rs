//! The L-Bone with real depots: registration, query filtering and ordering,
//! tokens, heartbeat expiry, the legacy protocol, and the tools using it.

use std::time::{Duration, Instant};

use lors_http::{BaseUrl, fetch};
use lors_lbone::legacy::{self, LegacyRequest};
use serde_json::Value;

use crate::util::{DepotProc, LboneProc, lors_env, pattern, tempdir};

/// GET/POST against the L-Bone; returns (status, JSON body).
pub fn call(
    lb: &LboneProc,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let base = BaseUrl::parse(&lb.url()).unwrap();
    let (status, body) = rt
        .block_on(fetch(
            &base,
            method,
            path,
            token,
            body.map(str::as_bytes),
            Duration::from_secs(10),
        ))
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// The hosts' cities, in the order the L-Bone ranks them for `query`.
pub fn cities(lb: &LboneProc, query: &str) -> Vec<String> {
    let (status, v) = call(lb, "GET", &format!("/api/v1/depots?{query}"), None, None);
    assert_eq!(status, 200, "{v}");
    v["depots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["depot"]["location"]["city"]
                .as_str()
                .unwrap_or("?")
                .to_owned()
        })
        .collect()
}

/// A depot registered with `lb` at a place.
pub fn located_depot(
    dir: &std::path::Path,
    lb: &LboneProc,
    size: &str,
    place: &[&str],
) -> DepotProc {
    let url = lb.url();
    let mut args = vec![
        "--size",
        size,
        "--lbone",
        &url,
        "--lbone-token",
        &lb.token,
        "--heartbeat",
        "1s",
    ];
    args.extend_from_slice(place);
    DepotProc::start(dir, &args)
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn lbone_registration_ranking_tokens_legacy_expiry_and_tools() {
    let dir = tempdir();
    let lb = LboneProc::start(
        &dir.path().join("lb"),
        &[
            "--heartbeat",
            "1s",
            "--offline-after",
            "3s",
            "--drop-after",
            "8s",
        ],
    );
    let mut brno = located_depot(
        &dir.path().join("brno"),
        &lb,
        "1G",
        &[
            "--city",
            "Brno",
            "--country",
            "CZ",
            "--lat",
            "49.19",
            "--lon",
            "16.61",
            "--tag",
            "campus",
        ],
    );
    let knox = located_depot(
        &dir.path().join("knox"),
        &lb,
        "20G",
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
    );
    let prague = located_depot(
        &dir.path().join("prague"),
        &lb,
        "5G",
        &[
            "--city",
            "Prague",
            "--country",
            "CZ",
            "--lat",
            "50.08",
            "--lon",
            "14.43",
        ],
    );
    // Registered before each depot said ready.
    assert_eq!(cities(&lb, "all=1").len(), 3);

    // Filtering by space and lease; ordering by hint, point, then space.
    assert_eq!(cities(&lb, "hard=2G"), ["Knoxville", "Prague"]);
    assert_eq!(cities(&lb, "hard=2G&duration=31d"), Vec::<String>::new());
    assert_eq!(
        cities(&lb, "location=city%3D%20Brno"),
        ["Brno", "Prague", "Knoxville"]
    );
    assert_eq!(cities(&lb, "location=tag%3Dcampus&count=1"), ["Brno"]);
    assert_eq!(
        cities(&lb, "lat=36&lon=-84"),
        ["Knoxville", "Prague", "Brno"]
    );
    assert_eq!(
        cities(&lb, "location=country%3D+US"),
        ["Knoxville", "Prague", "Brno"]
    );
    let (s, v) = call(&lb, "GET", "/api/v1/depots?colour=red", None, None);
    assert!(
        s == 400 && v["error"].as_str().unwrap().contains("colour"),
        "{v}"
    );
    let (s, _) = call(
        &lb,
        "GET",
        "/api/v1/depots?location=planet%3DMars",
        None,
        None,
    );
    assert_eq!(s, 400);

    // Registration needs the token; bodies are typed.
    let body = r#"{"host":"evil.example.org","port":6714,"resources":[{"rid":"1","hard_free":1,"hard_total":1,"soft_free":0,"soft_total":0,"max_duration":1}]}"#;
    assert_eq!(
        call(&lb, "POST", "/api/v1/register", None, Some(body)).0,
        401
    );
    assert_eq!(
        call(
            &lb,
            "POST",
            "/api/v1/register",
            Some("wrong-token-000000"),
            Some(body)
        )
        .0,
        401
    );
    let typo = body.replace("\"port\"", "\"prot\"");
    assert_eq!(
        call(
            &lb,
            "POST",
            "/api/v1/register",
            Some(&lb.token),
            Some(&typo)
        )
        .0,
        400
    );
    assert_eq!(
        cities(&lb, "all=1").len(),
        3,
        "nothing registered by refused requests"
    );

    // The legacy protocol, as lors_upload 0.82 asks: 2 depots, 2048 MB hard,
    // an hour, near Prague.
    let req = legacy::encode_request(&LegacyRequest::Depots {
        count: 2,
        hard_mb: 2048,
        soft_mb: 0,
        duration: 3600,
        location: "city= Prague".into(),
    });
    let reply = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&lb.legacy).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&req).unwrap();
        let mut r = Vec::new();
        s.read_to_end(&mut r).unwrap();
        r
    };
    let list = legacy::parse_depots_reply(&reply).unwrap();
    assert_eq!(
        list,
        [
            ("127.0.0.1".to_string(), prague.port),
            ("127.0.0.1".to_string(), knox.port)
        ]
    );

    // `lors upload` with nothing but LBONE_SERVER: the HTTP API, then the
    // legacy protocol with LBONE_PORT. No ~/.xndrc (HOME is empty).
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let src = dir.path().join("f.bin");
    let data = pattern(700_000, 3);
    std::fs::write(&src, &data).unwrap();
    // The depot ports an exNode's mappings use, sorted.
    let ports_of = |xnd: &std::path::Path| {
        let x = lors_exnode::xml::parse(&std::fs::read(xnd).unwrap()).unwrap();
        let mut p: Vec<u16> = x
            .mappings
            .iter()
            .map(|m| m.read.as_ref().unwrap().port)
            .collect();
        p.sort();
        p.dedup();
        p
    };
    // Uploads `src` with only L-Bone settings in the environment; returns
    // the exNode path and the depot ports its mappings use, sorted.
    let upload_via = |name: &str, copies: &str, hint: &str, env: &[(&str, &str)]| {
        let xnd = dir.path().join(name);
        let mut env = env.to_vec();
        env.push(("HOME", home.to_str().unwrap()));
        let (ok, _, err) = lors_env(
            &[
                "upload",
                "--quiet",
                "-c",
                copies,
                "--max-depots",
                copies,
                "-b",
                "256K",
                "-l",
                hint,
                "-o",
                xnd.to_str().unwrap(),
                src.to_str().unwrap(),
            ],
            &env,
        );
        assert!(ok, "{err}");
        let ports = ports_of(&xnd);
        (xnd, ports)
    };
    let url = lb.url();
    let env = [("LBONE_SERVER", url.as_str())];
    let (_, ports) = upload_via("f1.xnd", "1", "city= Brno", &env);
    assert_eq!(ports, [brno.port], "every block on the top-ranked depot");
    let legacy_port = lb.legacy.rsplit(':').next().unwrap();
    let legacy_env = [("LBONE_SERVER", "127.0.0.1"), ("LBONE_PORT", legacy_port)];
    let (_, ports) = upload_via("f2.xnd", "1", "city= Prague", &legacy_env);
    assert_eq!(ports, [prague.port]);
    // HOST:PORT without a scheme: the HTTP API when it answers HTTP there,
    // else the legacy protocol on that port.
    let (_, ports) = upload_via("f2h.xnd", "1", "city= Brno", &[("LBONE_SERVER", &lb.http)]);
    assert_eq!(ports, [brno.port]);
    let (_, ports) = upload_via(
        "f2l.xnd",
        "1",
        "city= Prague",
        &[("LBONE_SERVER", &lb.legacy)],
    );
    assert_eq!(ports, [prague.port]);
    // Two copies land on the two best-ranked depots.
    let (x3, ports) = upload_via("f3.xnd", "2", "country= CZ", &env);
    let mut want = vec![brno.port, prague.port];
    want.sort();
    assert_eq!(ports, want);

    // A location hint decides placement without --max-depots: every block
    // on the matching depot, not striped over the four best.
    let with_home = |mut env: Vec<(&'static str, String)>| {
        env.push(("HOME", home.to_str().unwrap().to_owned()));
        env
    };
    let run = |args: &[&str], env: &[(&'static str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (ok, _, err) = lors_env(args, &env);
        assert!(ok, "{args:?}: {err}");
    };
    let lb_env = with_home(vec![("LBONE_SERVER", url.clone())]);
    let hinted = dir.path().join("hinted.xnd");
    let hinted_s = hinted.to_str().unwrap();
    run(
        &[
            "upload",
            "--quiet",
            "-c",
            "1",
            "-b",
            "64K",
            "-l",
            "city= Prague",
            "-o",
            hinted_s,
            src.to_str().unwrap(),
        ],
        &lb_env,
    );
    assert_eq!(ports_of(&hinted), [prague.port], "11 blocks, all in Prague");

    // augment and route find their depots through the L-Bone as upload does.
    run(
        &[
            "augment",
            "--quiet",
            "-c",
            "1",
            "-l",
            "city= Knoxville",
            hinted_s,
        ],
        &lb_env,
    );
    let mut want = vec![prague.port, knox.port];
    want.sort();
    assert_eq!(ports_of(&hinted), want, "a second copy in Knoxville");
    run(&["route", "--quiet", "-l", "city= Brno", hinted_s], &lb_env);
    assert_eq!(ports_of(&hinted), [brno.port], "moved to Brno");
    // With nothing to ask, the error says what to give.
    let (ok, _, err) = lors_env(
        &["augment", "-c", "1", hinted_s],
        &[("HOME", home.to_str().unwrap())],
    );
    assert!(
        !ok && err.contains("--depot") && err.contains("LBONE_SERVER"),
        "{err}"
    );

    // The upload reported its rates: the L-Bone now has a forecast for
    // this client's network.
    let (_, v) = call(
        &lb,
        "GET",
        "/api/v1/depots?location=city%3DBrno&count=1",
        None,
        None,
    );
    assert!(v["depots"][0]["forecast"].as_f64().unwrap() > 0.0, "{v}");

    // Heartbeat expiry: a killed depot goes offline, sinks out of queries,
    // and is dropped later; downloads via the L-Bone still work.
    brno.kill9();
    wait_for("Brno offline", Duration::from_secs(15), || {
        cities(&lb, "all=1").last().map(String::as_str) == Some("Brno")
            && !cities(&lb, "").contains(&"Brno".to_string())
    });
    let (_, v) = call(&lb, "GET", "/api/v1/depots?all=1", None, None);
    let b = v["depots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["depot"]["location"]["city"] == "Brno")
        .unwrap();
    assert_eq!(b["online"], false);
    let back = dir.path().join("back.bin");
    let env = [
        ("LBONE_SERVER", url.as_str()),
        ("HOME", home.to_str().unwrap()),
    ];
    let (ok, _, err) = lors_env(
        &[
            "download",
            "--quiet",
            "-o",
            back.to_str().unwrap(),
            x3.to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "{err}");
    assert!(std::fs::read(&back).unwrap() == data);
    wait_for("Brno dropped", Duration::from_secs(20), || {
        cities(&lb, "all=1").len() == 2
    });
    drop((knox, prague));
}

/// A depot leaves the directory on a clean stop; tokens come from files;
/// the L-Bone logs registrations, offline transitions, departures and
/// refused tokens.
#[test]
fn depots_leave_on_a_clean_stop_tokens_come_from_files_and_the_lbone_logs_it() {
    let dir = tempdir();
    let token_file = dir.path().join("lbone-token");
    std::fs::write(&token_file, "from-a-file-0123456789\n").unwrap();
    let token_arg = token_file.display().to_string();
    let log = dir.path().join("lbone.log");
    let lb = LboneProc::start_logging(
        &dir.path().join("lb"),
        &["--token-file", &token_arg, "--offline-after", "2s"],
        &log,
    );
    assert_eq!(lb.token, "from-a-file-0123456789");
    let url = lb.url();
    let depot = |name: &str| {
        let args = [
            "--lbone",
            url.as_str(),
            "--lbone-token-file",
            &token_arg,
            "--heartbeat",
            "1s",
        ];
        DepotProc::start(&dir.path().join(name), &args)
    };
    let mut leaving = depot("leaving");
    let mut crashing = depot("crashing");
    let listed = || {
        let (status, v) = call(&lb, "GET", "/api/v1/depots", None, None);
        assert_eq!(status, 200, "{v}");
        (v["depots"].as_array().unwrap().iter())
            .map(|d| {
                format!(
                    "{}:{}",
                    d["depot"]["host"].as_str().unwrap(),
                    d["depot"]["port"]
                )
            })
            .collect::<Vec<_>>()
    };
    wait_for("both depots listed", Duration::from_secs(10), || {
        listed().len() == 2
    });

    // A clean stop: gone from the directory by the time the process exits.
    leaving.terminate();
    assert_eq!(listed(), [crashing.addr.clone()]);

    // A crash: listed until the heartbeats are missed, then logged offline.
    crashing.kill9();
    let logged = |what: &str| std::fs::read_to_string(&log).unwrap().contains(what);
    wait_for(
        "the offline transition in the log",
        Duration::from_secs(15),
        || logged("offline: no heartbeat"),
    );

    // A wrong token is refused, and the refusal is logged with the peer.
    let (status, _) = call(
        &lb,
        "POST",
        "/api/v1/deregister",
        Some("not-the-token"),
        Some("{}"),
    );
    assert_eq!(status, 401);
    wait_for("the refusal in the log", Duration::from_secs(5), || {
        logged("refused: wrong or missing token")
    });
    let text = std::fs::read_to_string(&log).unwrap();
    for (what, depot) in [
        ("registered", &leaving.addr),
        ("registered", &crashing.addr),
        ("deregistered", &leaving.addr),
        ("offline: no heartbeat", &crashing.addr),
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains(what) && l.contains(depot.as_str())),
            "no {what:?} line for {depot} in the L-Bone log:\n{text}"
        );
    }
    assert!(
        !text.contains("from-a-file-0123456789"),
        "the token reached the log"
    );

    // An empty token file is refused before anything starts, saying why.
    let empty = dir.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let (ok, _, err) = lors_env(
        &[
            "depot",
            "--data",
            &dir.path().join("x").display().to_string(),
            "--lbone",
            &url,
            "--lbone-token-file",
            &empty.display().to_string(),
        ],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("is empty: put the token on its first line"),
        "{err}"
    );

    // A wrong token stops the depot at once, saying what to fix, rather
    // than serving unlisted.
    let data = dir.path().join("w").display().to_string();
    let args = [
        "depot",
        "--listen",
        "127.0.0.1:0",
        "--data",
        &data,
        "--lbone",
        &url,
    ];
    let (ok, _, err) = lors_env(&[&args[..], &["--lbone-token", "wrong"]].concat(), &[]);
    assert!(!ok);
    assert!(
        err.contains("refused the registration token") && err.contains("--lbone-token"),
        "{err}"
    );
    // HOST:PORT, as the clients take it: the HTTP API there.
    let bare = url.trim_start_matches("http://").to_owned();
    let d = DepotProc::start(
        &dir.path().join("bare"),
        &[
            "--lbone",
            &bare,
            "--lbone-token-file",
            &token_arg,
            "--heartbeat",
            "1s",
        ],
    );
    wait_for(
        "the depot given HOST:PORT listed",
        Duration::from_secs(10),
        || listed().contains(&d.addr),
    );
}

/// augment through the L-Bone leaves out, for each block, the depots that
/// hold it — as `--depot` does — not every depot holding any block.
#[test]
fn augment_through_the_lbone_chooses_per_block() {
    let dir = tempdir();
    let lb = LboneProc::start(&dir.path().join("lb"), &["--heartbeat", "1s"]);
    let mut ds: Vec<DepotProc> = (0..4)
        .map(|i| located_depot(&dir.path().join(format!("d{i}")), &lb, "1G", &[]))
        .collect();
    wait_for("four depots listed", Duration::from_secs(10), || {
        cities(&lb, "").len() == 4
    });
    let depots = ds
        .iter()
        .map(|d| d.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let data = crate::util::pattern(3 << 20, 5);
    let src = dir.path().join("f.bin");
    std::fs::write(&src, &data).unwrap();
    let xnd = dir.path().join("f.xnd");
    let x_s = xnd.to_str().unwrap();
    let (ok, _, err) = crate::util::lors(&[
        "upload",
        "-q",
        "-c",
        "2",
        "-b",
        "256K",
        "--depot",
        &depots,
        "-o",
        x_s,
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let url = lb.url();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let env = [
        ("LBONE_SERVER", url.as_str()),
        ("HOME", home.to_str().unwrap()),
    ];
    let per_block = |x: &lors_exnode::ExNode| {
        let mut n: std::collections::BTreeMap<u64, std::collections::BTreeSet<String>> =
            Default::default();
        for m in &x.mappings {
            n.entry(m.exnode_offset)
                .or_default()
                .insert(m.depot().unwrap());
        }
        n.values().map(|s| s.len()).collect::<Vec<_>>()
    };
    // Every depot holds some block: the L-Bone's four are all candidates.
    let (ok, _, err) = lors_env(&["augment", "-q", "-c", "1", x_s], &env);
    assert!(ok, "{err}");
    let x = lors::xnd::load(&xnd).unwrap();
    assert!(per_block(&x).iter().all(|&n| n == 3), "{:?}", per_block(&x));
    // A fifth depot: two more copies of every block, on the two of the
    // five that lack it.
    ds.push(located_depot(&dir.path().join("d4"), &lb, "1G", &[]));
    wait_for("five depots listed", Duration::from_secs(10), || {
        cities(&lb, "").len() == 5
    });
    let (ok, _, err) = lors_env(
        &["augment", "-q", "-c", "2", "--max-depots", "5", x_s],
        &env,
    );
    assert!(ok, "{err}");
    let x = lors::xnd::load(&xnd).unwrap();
    assert!(per_block(&x).iter().all(|&n| n == 5), "{:?}", per_block(&x));
    let (ok, got, err) = crate::util::lors(&["download", "-q", "-o", "-", x_s]);
    assert!(ok && got == data, "{err}");
}
