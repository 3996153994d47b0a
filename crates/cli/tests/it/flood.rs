//! The L-Bone under clients that hold what they are given: HTTP/2 streams
//! whose window never opens, request bodies that never finish, floods of
//! history queries, oversized registrations. Everyone else's queries are
//! answered all along.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::abuse::{http_from, post, register_many};
use crate::util::{LboneProc, tempdir};

/// An h2c connection from `from` whose streams never open their receive
/// window: the server can send headers, never a byte of a body.
async fn stingy(addr: &str, from: &str) -> Option<h2::client::SendRequest<Bytes>> {
    let sock = tokio::net::TcpSocket::new_v4().ok()?;
    sock.bind(format!("{from}:0").parse().unwrap()).ok()?;
    let tcp = sock.connect(addr.parse().unwrap()).await.ok()?;
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(client)
}

/// A stream opened and never read: its answer, and its request body's
/// sender when the body is left unfinished.
type Held = (h2::client::ResponseFuture, Option<h2::SendStream<Bytes>>);

/// Opens as many streams on `c` as the server lets it (up to `most`),
/// each a request for `path` (with `body` sent but never finished, if
/// given); returns their response futures, to be held and never read.
async fn streams(
    c: &mut h2::client::SendRequest<Bytes>,
    method: &str,
    path: &str,
    body: Option<&'static [u8]>,
    most: usize,
) -> Vec<Held> {
    let mut held = Vec::new();
    for _ in 0..most {
        let ready = tokio::time::timeout(Duration::from_millis(300), c.clone().ready()).await;
        let Ok(Ok(mut ready)) = ready else { break };
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://lbone{path}"));
        if body.is_some() {
            req = req.header("content-length", "100000");
        }
        let Ok((resp, mut send)) = ready.send_request(req.body(()).unwrap(), body.is_none()) else {
            break;
        };
        let send = body.map(|b| {
            let _ = send.send_data(Bytes::from_static(b), false);
            send
        });
        held.push((resp, send));
    }
    held
}

/// The legitimate client from 127.0.0.1, fresh connection each time: a
/// five-depot query and `/healthz`. Statuses, and the slowest.
async fn legit(lb: &LboneProc, rounds: usize) -> (Vec<Option<u16>>, Duration) {
    let mut statuses = Vec::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..rounds {
        for path in ["/api/v1/depots?count=5", "/healthz", "/api/v1/history"] {
            let t = Instant::now();
            let (s, _) = http_from(
                &lb.http,
                "127.0.0.1",
                &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            )
            .await;
            slowest = slowest.max(t.elapsed());
            statuses.push(s);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (statuses, slowest)
}

/// `conns` stingy h2c connections from `from`, each with as many streams
/// of `method path` as the server lets it open (up to `most`); the streams
/// and the connections, to be held.
async fn flood_from(
    lb: &LboneProc,
    from: &str,
    conns: usize,
    method: &str,
    path: &str,
    body: Option<&'static [u8]>,
    most: usize,
) -> (Vec<Held>, Vec<h2::client::SendRequest<Bytes>>) {
    let mut held = Vec::new();
    let mut open = Vec::new();
    for _ in 0..conns {
        let Some(mut c) = stingy(&lb.http, from).await else {
            continue;
        };
        held.extend(streams(&mut c, method, path, body, most).await);
        open.push(c);
    }
    (held, open)
}

/// Items 2 and 3: listings and histories on h2 streams whose window never
/// opens, from one address and from eight, held as long as the server
/// lets them: the listing budget and every request slot stayed taken, and
/// every other address's listing timed out (408) for as long as the
/// attack went on.
#[tokio::test]
async fn streams_that_never_read_hold_nothing_for_long() {
    let dir = tempdir();
    let lb = LboneProc::start(dir.path(), &[]);
    register_many(&lb, 600).await;
    let mut held = Vec::new();
    let mut conns = Vec::new();
    for a in 1..=8 {
        for _ in 0..8 {
            let Some(mut c) = stingy(&lb.http, &format!("127.0.20.{a}")).await else {
                continue;
            };
            held.extend(streams(&mut c, "GET", "/api/v1/depots?all=1", None, 40).await);
            held.extend(streams(&mut c, "GET", "/api/v1/history", None, 24).await);
            conns.push(c);
        }
    }
    assert!(held.len() >= 64, "{} streams opened", held.len());
    let (statuses, slowest) = legit(&lb, 8).await;
    assert!(
        statuses.iter().all(|s| *s == Some(200)),
        "{statuses:?} (slowest {slowest:?})"
    );
    // The streams that were answered never got their bodies: the server
    // gave up on them (reset) rather than hold them.
    let ends = held.into_iter().map(|(resp, _)| {
        tokio::spawn(async move {
            let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(20), resp).await else {
                return (false, false);
            };
            let mut body = r.into_body();
            let end = tokio::time::timeout(Duration::from_secs(20), body.data()).await;
            (true, matches!(end, Ok(Some(Err(_))) | Ok(None)))
        })
    });
    let (mut answered, mut reset) = (0, 0);
    for e in ends.collect::<Vec<_>>() {
        let (a, r) = e.await.unwrap();
        answered += usize::from(a);
        reset += usize::from(r);
    }
    eprintln!("{answered} answered, {reset} reset; the legitimate client's slowest {slowest:?}");
    assert!(reset > 0, "no stalled stream was ever reset");
    drop(conns);
}

/// Item 4: request bodies that never finish, over h2 streams from one
/// address and over HTTP/1.1 connections from eight, took every request
/// slot (h2) and every connection place (HTTP/1.1): the legitimate client
/// waited ~10 s per request, or had its connections reset.
#[tokio::test]
async fn bodies_that_never_finish_take_no_one_elses_turn() {
    let dir = tempdir();
    let lb = LboneProc::start(dir.path(), &[]);
    register_many(&lb, 5).await;
    let (held, conns) = flood_from(
        &lb,
        "127.0.21.1",
        32,
        "POST",
        "/api/v1/rates",
        Some(b"{\"rates\":["),
        64,
    )
    .await;
    eprintln!("{} unfinished POST streams", held.len());
    let (statuses, slowest) = legit(&lb, 4).await;
    assert!(
        statuses.iter().all(|s| *s == Some(200)),
        "h2: {statuses:?} (slowest {slowest:?})"
    );
    // Over HTTP/1.1: eight addresses fill the connection table with bodies
    // that never finish.
    let mut raw = Vec::new();
    for a in 1..=8 {
        for _ in 0..32 {
            let mut r = crate::util::Raw::connect_from(&lb.http, &format!("127.0.22.{a}")).await;
            r.send(b"POST /api/v1/rates HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"rates\":[")
                .await;
            raw.push(r);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (statuses, slowest) = legit(&lb, 4).await;
    assert!(
        statuses.iter().all(|s| *s == Some(200)),
        "HTTP/1.1: {statuses:?} (slowest {slowest:?})"
    );
    drop((held, conns, raw));
}

/// Item 5: 1,024 history queries at once from one address were each a
/// database read (heartbeats took 2.1 s); now an address has at most its
/// share in flight — the rest are told to retry — and the others are
/// answered at once.
#[tokio::test]
async fn a_history_flood_is_turned_away_at_the_door() {
    let dir = tempdir();
    let lb = LboneProc::start(dir.path(), &[]);
    register_many(&lb, 5).await;
    let (held, conns) = flood_from(&lb, "127.0.23.1", 32, "GET", "/api/v1/history", None, 32).await;
    let (statuses, _) = legit(&lb, 3).await;
    assert!(statuses.iter().all(|s| *s == Some(200)), "{statuses:?}");
    let mut by_status = std::collections::BTreeMap::new();
    for (resp, _) in held {
        let s = match tokio::time::timeout(Duration::from_secs(10), resp).await {
            Ok(Ok(r)) => r.status().as_u16(),
            _ => 0,
        };
        *by_status.entry(s).or_insert(0) += 1;
    }
    eprintln!("history flood answered {by_status:?}");
    assert!(
        by_status.get(&429).copied().unwrap_or(0) > 0,
        "{by_status:?}: no request of the flood was turned away"
    );
    assert!(
        by_status.get(&200).copied().unwrap_or(0) <= 32,
        "{by_status:?}: more in flight than one address's share"
    );
    drop(conns);
}

/// Item 6: a registration's allocation type names had no length limit (a
/// 1.03 MB registration was accepted, inflating every listing).
#[tokio::test]
async fn registrations_are_bounded_field_by_field() {
    let dir = tempdir();
    let lb = LboneProc::start(dir.path(), &[]);
    let reg = |types: serde_json::Value| {
        serde_json::json!({
            "host": "d.example.org", "port": 6714,
            "resources": [{"rid": "1", "hard_free": 1, "hard_total": 1, "soft_free": 0,
                "soft_total": 0, "max_duration": 60, "types": types}],
            "location": {"city": "Brno", "tags": []}, "version": "t",
        })
        .to_string()
    };
    for (types, want) in [
        (serde_json::json!(["x".repeat(1_000_000)]), 413),
        (serde_json::json!(["x".repeat(100)]), 400),
        (serde_json::json!(vec!["byte_array"; 9]), 400),
        (serde_json::json!(["byte_array", "fifo"]), 200),
    ] {
        let (s, body) = http_from(
            &lb.http,
            "127.0.0.1",
            &post("/api/v1/register", Some(&lb.token), &reg(types)),
        )
        .await;
        assert_eq!(s, Some(want), "{body}");
    }
}
