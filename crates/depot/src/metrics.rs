//! Depot counters, exported in the Prometheus text format on an optional
//! HTTP port (`metrics_listen`).

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::store::ResourceStatus;

/// Commands we count, in the order of [`Metrics::requests`].
pub const COMMANDS: [&str; 13] = [
    "ALLOCATE",
    "STORE",
    "WRITE",
    "LOAD",
    "SEND",
    "MANAGE",
    "STATUS",
    "ALIAS_ALLOCATE",
    "ALIAS_MANAGE",
    "ALLOCATE_CHKSUM",
    "GET_CHKSUM",
    "VALIDATE_CHKSUM",
    "INVALID",
];

/// Index of a command name in [`COMMANDS`].
pub fn command_index(name: &str) -> usize {
    COMMANDS
        .iter()
        .position(|c| *c == name)
        .unwrap_or(COMMANDS.len() - 1)
}

/// Live counters. All relaxed atomics: they are statistics, not synchronization.
#[derive(Default)]
pub struct Metrics {
    /// Bytes received in data phases.
    pub bytes_in: AtomicU64,
    /// Bytes sent in LOAD replies.
    pub bytes_out: AtomicU64,
    /// Bytes copied depot-to-depot by SEND.
    pub bytes_copied: AtomicU64,
    /// Connections accepted.
    pub connections_total: AtomicU64,
    /// Connections open now.
    pub connections_open: AtomicI64,
    /// Connections turned away busy (`-66`).
    pub connections_rejected: AtomicU64,
    /// Requests by command.
    pub requests: [AtomicU64; COMMANDS.len()],
    /// Error replies by command.
    pub errors: [AtomicU64; COMMANDS.len()],
    /// Allocations deleted by the expiry worker.
    pub expired: AtomicU64,
}

impl Metrics {
    /// Renders the Prometheus text exposition.
    pub fn render(&self, status: &[ResourceStatus]) -> String {
        let mut s = String::new();
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            "lors_depot_bytes_in_total",
            "Bytes received by STORE and WRITE.",
            self.bytes_in.load(Relaxed),
        );
        counter(
            "lors_depot_bytes_out_total",
            "Bytes sent by LOAD.",
            self.bytes_out.load(Relaxed),
        );
        counter(
            "lors_depot_bytes_copied_total",
            "Bytes copied to other allocations by SEND.",
            self.bytes_copied.load(Relaxed),
        );
        counter(
            "lors_depot_connections_total",
            "Connections accepted.",
            self.connections_total.load(Relaxed),
        );
        counter(
            "lors_depot_connections_rejected_total",
            "Connections turned away as busy.",
            self.connections_rejected.load(Relaxed),
        );
        counter(
            "lors_depot_expired_total",
            "Allocations deleted on expiry.",
            self.expired.load(Relaxed),
        );
        let _ = writeln!(
            s,
            "# HELP lors_depot_requests_total Requests by command.\n# TYPE lors_depot_requests_total counter"
        );
        for (i, c) in COMMANDS.iter().enumerate() {
            let _ = writeln!(
                s,
                "lors_depot_requests_total{{command=\"{c}\"}} {}",
                self.requests[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            s,
            "# HELP lors_depot_errors_total Error replies by command.\n# TYPE lors_depot_errors_total counter"
        );
        for (i, c) in COMMANDS.iter().enumerate() {
            let _ = writeln!(
                s,
                "lors_depot_errors_total{{command=\"{c}\"}} {}",
                self.errors[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            s,
            "# HELP lors_depot_connections_open Connections open now.\n# TYPE lors_depot_connections_open gauge\nlors_depot_connections_open {}",
            self.connections_open.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP lors_depot_allocations Live allocations per resource.\n# TYPE lors_depot_allocations gauge"
        );
        for r in status {
            let _ = writeln!(
                s,
                "lors_depot_allocations{{rid=\"{}\"}} {}",
                r.rid, r.usage.count
            );
        }
        let _ = writeln!(
            s,
            "# HELP lors_depot_space_bytes Space per resource by kind.\n# TYPE lors_depot_space_bytes gauge"
        );
        for r in status {
            for (kind, v) in [
                ("total", r.total),
                ("hard_used", r.usage.hard),
                ("soft_used", r.usage.soft),
                ("free", r.free()),
            ] {
                let _ = writeln!(
                    s,
                    "lors_depot_space_bytes{{rid=\"{}\",kind=\"{kind}\"}} {v}",
                    r.rid
                );
            }
        }
        s
    }
}

/// Serves `GET /metrics` until shutdown, with the text `render` makes at
/// each request. Each request is bounded in size and time.
pub async fn serve(
    listener: TcpListener,
    render: impl Fn() -> String + Send + Sync + 'static,
    mut shutdown: watch::Receiver<bool>,
) {
    let render = Arc::new(render);
    loop {
        let (mut sock, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let render = render.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut n = 0;
            // Read until the end of the request head, at most 8 KiB, 5 s.
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while n < buf.len() {
                    let k = sock.read(&mut buf[n..]).await?;
                    if k == 0 {
                        break;
                    }
                    n += k;
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n")
                        || buf[..n].windows(2).any(|w| w == b"\n\n")
                    {
                        break;
                    }
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let reply = if head.starts_with("GET /metrics ") || head.starts_with("GET / ") {
                let body = render();
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 22\r\nConnection: close\r\n\r\ntry GET /metrics here\n".to_owned()
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), sock.write_all(reply.as_bytes()))
                .await;
        });
    }
}
