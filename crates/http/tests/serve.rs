//! The server's limits and the pooled client, against a real listener.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use lors_http::serve::{Limits, serve};
use lors_http::{BaseUrl, Client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// A server answering `/port` with the client's port (one per connection)
/// and `/echo` with the body's length; its address and its stop switch.
async fn start(limits: Limits) -> (BaseUrl, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let app = Router::new()
        .route(
            "/port",
            get(|ConnectInfo(p): ConnectInfo<SocketAddr>| async move { p.port().to_string() }),
        )
        .route(
            "/echo",
            post(|b: axum::body::Bytes| async move { b.len().to_string() }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "done"
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = BaseUrl::parse(&format!("http://{}", l.local_addr().unwrap())).unwrap();
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(serve(l, app, limits, rx));
    (base, tx, task)
}

async fn get_text(c: &Client, base: &BaseUrl, path: &str) -> (u16, String) {
    let (s, b) = c
        .fetch(base, "GET", path, None, None, Duration::from_secs(5))
        .await
        .unwrap();
    (s, String::from_utf8_lossy(&b).into_owned())
}

/// Raw bytes in, the whole answer out (the server closes after it).
async fn raw(base: &BaseUrl, req: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(&base.authority)
        .await
        .unwrap();
    s.write_all(req).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn requests_share_a_connection_and_limits_hold() {
    let (base, stop, task) = start(Limits {
        body_bytes: 1000,
        header_bytes: 8192,
        ..Limits::default()
    })
    .await;
    let c = Client::new();
    let ports: Vec<_> = ports_in_sequence(&c, &base, 5).await;
    assert!(
        ports.windows(2).all(|w| w[0] == w[1]),
        "one connection: {ports:?}"
    );
    // A body past the limit and a head past the limit are refused.
    let (s, _) = c
        .fetch(
            &base,
            "POST",
            "/echo",
            None,
            Some(&[0; 2000]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(s, 413);
    let (s, b) = c
        .fetch(
            &base,
            "POST",
            "/echo",
            None,
            Some(&[0; 999]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!((s, &b[..]), (200, &b"999"[..]));
    let big = format!(
        "GET /port HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    assert!(raw(&base, big.as_bytes()).await.starts_with("HTTP/1.1 431"));
    // Shutdown lets the request in flight finish.
    let slow = tokio::spawn({
        let (c, base) = (c.clone(), base.clone());
        async move { get_text(&c, &base, "/slow").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(true).unwrap();
    assert_eq!(slow.await.unwrap(), (200, "done".to_owned()));
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the server stops")
        .unwrap();
}

async fn ports_in_sequence(c: &Client, base: &BaseUrl, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (s, port) = get_text(c, base, "/port").await;
        assert_eq!(s, 200);
        out.push(port);
    }
    out
}

#[tokio::test]
async fn idle_connections_close_and_silent_ones_too() {
    let (base, _stop, _task) = start(Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    })
    .await;
    // Connected, never a byte: closed after the idle time.
    let mut s = tokio::net::TcpStream::connect(&base.authority)
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("a silent connection is closed");
    assert_eq!(n.unwrap_or(0), 0);
    // A keep-alive client whose connection was closed while idle gets a
    // new one.
    let c = Client::new();
    let (_, first) = get_text(&c, &base, "/port").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (s, second) = get_text(&c, &base, "/port").await;
    assert_eq!(s, 200);
    assert_ne!(first, second);
}

#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let (base, _stop, _task) = start(Limits {
        max_connections: 8,
        per_client: 4,
        ..Limits::default()
    })
    .await;
    let mut idle = Vec::new();
    for i in 0..12 {
        let from: std::net::IpAddr = format!("127.0.3.{}", 1 + i / 4).parse().unwrap();
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind((from, 0).into()).unwrap();
        idle.push(sock.connect(base.authority.parse().unwrap()).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Every place is taken by idle connections; a newcomer closes one.
    for _ in 0..3 {
        let out = raw(
            &base,
            b"GET /port HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out:?}");
    }
}

#[test]
fn the_shared_pool_outlives_a_runtime() {
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let server = tokio::runtime::Runtime::new().unwrap();
    let (base, _stop, _task) = server.block_on(start(Limits::default()));
    for _ in 0..3 {
        let (s, _) = rt().block_on(get_text(Client::shared(), &base, "/port"));
        assert_eq!(s, 200);
    }
}
