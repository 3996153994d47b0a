//! Responses that stop moving are dropped. An HTTP/2 client can open a
//! stream and never open its receive window, or an HTTP/1.1 client stop
//! reading: the response then waits for ever, holding what it holds (its
//! bytes, the budget they were reserved from, a request slot). Every
//! response body is handed out in small pieces, each one taken noting the
//! time; a watchdog around the task that sends it (the connection for
//! HTTP/1.1, the stream for HTTP/2) drops the task when a body has taken
//! nothing for the stall limit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes};
use hyper::body::{Body, Frame, SizeHint};

/// The most a body hands out at once: what may sit in the connection's
/// send buffer beyond what the client has read.
pub const PIECE: usize = 64 << 10;

/// When the bodies sent by one task last moved.
pub struct Progress {
    start: Instant,
    /// Milliseconds after `start`.
    last: AtomicU64,
    /// Bodies being sent.
    sending: AtomicUsize,
}

tokio::task_local! {
    static PROGRESS: Arc<Progress>;
}

impl Progress {
    fn new() -> Arc<Progress> {
        Arc::new(Progress {
            start: Instant::now(),
            last: AtomicU64::new(0),
            sending: AtomicUsize::new(0),
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Relaxed);
    }

    /// A body is being sent and none has moved for `limit`.
    fn stalled(&self, limit: Duration) -> bool {
        if self.sending.load(Relaxed) == 0 {
            return false;
        }
        let last = Duration::from_millis(self.last.load(Relaxed));
        self.start.elapsed().saturating_sub(last) > limit
    }
}

/// Runs `fut` until it ends, or until a response body it sends has taken
/// nothing for `limit`: then it is dropped (its connection or stream
/// reset), and everything its bodies held goes with it.
pub async fn watched<F: Future>(fut: F, limit: Duration) -> Option<F::Output> {
    let p = Progress::new();
    let run = PROGRESS.scope(p.clone(), fut);
    tokio::pin!(run);
    let every = (limit / 4).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            out = &mut run => return Some(out),
            () = tokio::time::sleep(every) => {
                if p.stalled(limit) {
                    tracing::debug!("a response made no progress for {limit:?}: dropped");
                    return None;
                }
            }
        }
    }
}

/// The executor for HTTP/2 streams: each stream is [`watched`].
#[derive(Clone, Copy, Debug)]
pub struct Watched(pub Duration);

impl<F> hyper::rt::Executor<F> for Watched
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(watched(fut, self.0));
    }
}

/// A response body handed out in pieces of at most [`PIECE`] bytes, each
/// noted as progress, holding `G` (what the response keeps while it is
/// being sent) until it ends or is dropped.
pub struct Paced<B, G> {
    inner: B,
    rest: Bytes,
    progress: Option<Arc<Progress>>,
    _held: G,
}

impl<B, G> Paced<B, G> {
    /// `inner`, paced, in the task being [`watched`] (if any).
    pub fn new(inner: B, held: G) -> Self {
        let progress = PROGRESS.try_with(Arc::clone).ok();
        if let Some(p) = &progress {
            p.sending.fetch_add(1, Relaxed);
            p.touch();
        }
        Paced {
            inner,
            rest: Bytes::new(),
            progress,
            _held: held,
        }
    }

    fn piece(&mut self) -> Bytes {
        let n = self.rest.len().min(PIECE);
        let out = self.rest.slice(..n);
        self.rest.advance(n);
        out
    }
}

impl<B, G> Drop for Paced<B, G> {
    fn drop(&mut self) {
        if let Some(p) = &self.progress {
            p.sending.fetch_sub(1, Relaxed);
        }
    }
}

impl<B, G> Body for Paced<B, G>
where
    B: Body<Data = Bytes> + Unpin,
    G: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(p) = &self.progress {
            p.touch();
        }
        if !self.rest.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(self.piece()))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => match f.into_data() {
                Ok(data) => {
                    self.rest = data;
                    Poll::Ready(Some(Ok(Frame::data(self.piece()))))
                }
                Err(f) => Poll::Ready(Some(Ok(f))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut h = SizeHint::new();
        h.set_lower(inner.lower().saturating_add(rest));
        if let Some(u) = inner.upper() {
            h.set_upper(u.saturating_add(rest));
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt as _, Full};

    #[tokio::test]
    async fn bodies_go_in_pieces_and_a_stalled_one_is_dropped() {
        let body = Full::new(Bytes::from(vec![7u8; 3 * PIECE + 5]));
        let out = watched(
            async {
                let mut p = Paced::new(body, ());
                let mut sizes = Vec::new();
                while let Some(f) = p.frame().await {
                    sizes.push(f.unwrap().into_data().unwrap().len());
                }
                sizes
            },
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(out, Some(vec![PIECE, PIECE, PIECE, 5]));
        // A body nobody takes from: the task goes after the limit.
        let t = Instant::now();
        let out = watched(
            async {
                let _p = Paced::new(Full::new(Bytes::from_static(b"x")), ());
                std::future::pending::<()>().await;
            },
            Duration::from_millis(200),
        )
        .await;
        assert!(out.is_none());
        assert!(t.elapsed() < Duration::from_secs(2));
        // No body being sent: waiting is not stalling.
        let out = watched(
            tokio::time::sleep(Duration::from_millis(400)),
            Duration::from_millis(100),
        )
        .await;
        assert!(out.is_some());
    }
}
