//! Running a transfer from Python: on the transfer runtime with the GIL
//! released, Ctrl-C noticed within a tick, progress handed to a callback
//! from the calling thread (never from a transfer thread).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use lors::settings::Settings;
use lors::{Pool, Progress};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How often a waiting call looks for Ctrl-C and reports progress.
const TICK: Duration = Duration::from_millis(100);

/// Counts what an operation has done, for the progress callback.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    done: AtomicU64,
    /// `u64::MAX` until the operation says.
    total: AtomicU64,
}

impl Tally {
    pub(crate) fn new() -> Arc<Tally> {
        Arc::new(Tally {
            done: AtomicU64::new(0),
            total: AtomicU64::new(u64::MAX),
        })
    }

    fn read(&self) -> (u64, Option<u64>) {
        let total = self.total.load(Ordering::Relaxed);
        (
            self.done.load(Ordering::Relaxed),
            (total != u64::MAX).then_some(total),
        )
    }
}

impl Progress for Tally {
    fn start(&self, total: Option<u64>) {
        self.total
            .store(total.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn advance(&self, _depot: &str, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }
}

/// The progress callback of one call, `callback(done, total)`.
pub(crate) struct Watch<'py> {
    callback: Option<Bound<'py, PyAny>>,
    pub(crate) tally: Arc<Tally>,
    last: Option<(u64, Option<u64>)>,
}

impl<'py> Watch<'py> {
    pub(crate) fn new(callback: Option<Bound<'py, PyAny>>) -> Self {
        Watch {
            callback: callback.filter(|c| !c.is_none()),
            tally: Tally::new(),
            last: None,
        }
    }

    /// Calls the callback when something changed; its exception stops the
    /// operation as Ctrl-C does.
    fn report(&mut self) -> PyResult<()> {
        let Some(cb) = &self.callback else {
            return Ok(());
        };
        let now = self.tally.read();
        if self.last != Some(now) {
            self.last = Some(now);
            cb.call1(now)?;
        }
        Ok(())
    }
}

/// What stops an operation when Python asks it to (Ctrl-C, an exception
/// from the progress callback).
pub(crate) enum Stop {
    /// Drop it: its tasks end at their next await (a download, whose
    /// `PATH.lors-part` and record let a later call resume).
    Abort,
    /// Tell it and wait for it to wind down, so that what it made is
    /// released or named (an upload, a copy): a second Ctrl-C drops it.
    Signal(tokio::sync::watch::Sender<bool>),
}

/// An operation Python stopped: why, and what it came to when it wound
/// down (`None` when it was dropped).
pub(crate) struct Stopped<T> {
    pub(crate) err: PyErr,
    pub(crate) result: Option<T>,
}

/// One result handed from a transfer task to the waiting thread.
struct Slot<T>(Mutex<Option<T>>, Condvar);

impl<T> Slot<T> {
    fn put(&self, v: T) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
        self.1.notify_all();
    }

    fn wait(&self, d: Duration) -> Option<T> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (mut g, _) =
            (self.1.wait_timeout_while(g, d, |v| v.is_none())).unwrap_or_else(|p| p.into_inner());
        g.take()
    }
}

/// Runs `fut` to its end on the transfer runtime, the GIL released while
/// it runs; `stop` says how Ctrl-C (or a failing progress callback) ends it.
pub(crate) fn block_on<T, F>(
    py: Python<'_>,
    fut: F,
    watch: &mut Watch<'_>,
    stop: Stop,
) -> Result<T, Stopped<T>>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let slot = Arc::new(Slot(Mutex::new(None), Condvar::new()));
    let put = slot.clone();
    let task = lors::xio::runtime().spawn(async move { put.put(fut.await) });
    let finished = |py: Python<'_>| {
        let (slot, task) = (slot.clone(), &task);
        py.detach(|| {
            slot.wait(TICK)
                .map(Ok)
                .or_else(|| task.is_finished().then_some(Err(())))
        })
    };
    let err = loop {
        match finished(py) {
            Some(Ok(v)) => {
                let _ = watch.report();
                return Ok(v);
            }
            Some(Err(())) => {
                return Err(Stopped {
                    err: PyRuntimeError::new_err(
                        "the transfer ended without a result (a bug: it panicked)",
                    ),
                    result: None,
                });
            }
            None => {}
        }
        if let Err(e) = py.check_signals().and_then(|()| watch.report()) {
            break e;
        }
    };
    let tx = match stop {
        Stop::Abort => {
            task.abort();
            return Err(Stopped { err, result: None });
        }
        Stop::Signal(tx) => tx,
    };
    let _ = tx.send(true);
    loop {
        match finished(py) {
            Some(Ok(v)) => {
                return Err(Stopped {
                    err,
                    result: Some(v),
                });
            }
            Some(Err(())) => return Err(Stopped { err, result: None }),
            None if py.check_signals().is_err() => {
                task.abort();
                return Err(Stopped { err, result: None });
            }
            None => {}
        }
    }
}

/// A plain wait, for short calls (finding depots, probes): Ctrl-C drops it.
pub(crate) fn wait<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    block_on(py, fut, &mut Watch::new(None), Stop::Abort).map_err(|s| s.err)
}

/// The connection pool for `s`'s timeout policy, shared by every call of
/// the process with that policy (connections to a depot are reused); a
/// call with a `bwlimit` (bytes per second) has a pool of its own.
pub(crate) fn pool(s: &Settings, bwlimit: Option<u64>) -> Arc<Pool> {
    static POOLS: OnceLock<Mutex<HashMap<Duration, Arc<Pool>>>> = OnceLock::new();
    if bwlimit.is_some() {
        return Arc::new(Pool::new(s.client()).with_limit(bwlimit));
    }
    let mut pools = (POOLS.get_or_init(Default::default).lock()).unwrap_or_else(|p| p.into_inner());
    pools
        .entry(s.timeout)
        .or_insert_with(|| Arc::new(Pool::new(s.client())))
        .clone()
}
