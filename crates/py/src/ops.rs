//! `lors.upload`, `lors.download`, `lors.augment`, `lors.trim`,
//! `lors.refresh`, and the range reads the fsspec filesystem is built on.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use lors::download::{DownloadOptions, Output};
use lors::job::edit::{Edit, Unfinished, copies_outcome};
use lors::job::upload::{Failed, Source, Upload};
use lors::manage::{CopyOptions, Selection};
use lors::settings::Settings;
use lors::upload::{E2e, UploadOptions};
use lors_exnode::ExNode;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{from_lors, from_xnd};
use crate::exnode::{PathOrStr, PyExNode, Target};
use crate::run::{Stop, Stopped, Watch, block_on, pool};
use crate::settings::{Opts, exnode_ref, size};

/// Stores the file at `path` on depots and returns its exNode, also saved
/// to `output` when given.
#[pyfunction]
#[pyo3(signature = (path, output = None, *, depots = None, lbone = None, location = None,
    copies = None, ec = None, block_size = None, duration = None, threads = None,
    timeout = None, checksum = None, compress = false, encrypt = None, force = false,
    dense = false, bwlimit = None, progress = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn upload(
    py: Python<'_>,
    path: PathOrStr,
    output: Option<PathOrStr>,
    depots: Option<Bound<'_, PyAny>>,
    lbone: Option<String>,
    location: Option<String>,
    copies: Option<usize>,
    ec: Option<String>,
    block_size: Option<Bound<'_, PyAny>>,
    duration: Option<Bound<'_, PyAny>>,
    threads: Option<usize>,
    timeout: Option<Bound<'_, PyAny>>,
    checksum: Option<String>,
    compress: bool,
    encrypt: Option<String>,
    force: bool,
    dense: bool,
    bwlimit: Option<Bound<'_, PyAny>>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<PyExNode> {
    let opts = Opts {
        depots: crate::settings::depots(depots.as_ref())?,
        lbone,
        location,
        copies,
        ec,
        block_size: size("block_size", block_size.as_ref())?,
        threads,
        duration: crate::settings::duration("duration", duration.as_ref())?,
        timeout: crate::settings::duration("timeout", timeout.as_ref())?,
    };
    let uri = output.map(|o| exnode_ref(&o.0)).transpose()?;
    let out = uri.as_ref().map(|u| u.path.clone());
    if let Some(o) = &out {
        lors::job::check_output(o, force).map_err(|e| refused(py, e))?;
    }
    let s = opts.settings(uri.as_ref())?;
    let e2e = E2e {
        checksum,
        compress,
        encrypt,
        ..E2e::default()
    };
    let mut up = placed(py, &opts, &s, &path.0, &e2e)?;
    up.sparse = !dense;
    let source = input(&path.0)?;
    let pool = pool(&s, size("bwlimit", bwlimit.as_ref())?);
    let job = Upload {
        opts: up,
        out: out.clone(),
        force,
        slots: None,
    };
    let (job, source, ready) = {
        let pool = pool.clone();
        crate::run::wait(py, async move {
            let ready = job.prepare(&source, &pool).await;
            (job, source, ready)
        })?
    };
    let ready = ready.map_err(|e| refused(py, e))?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut watch = Watch::new(progress);
    let tally = watch.tally.clone();
    let run = async move { job.run(ready, source, pool, tally, Some(rx)).await };
    let done = match block_on(py, run, &mut watch, Stop::Signal(tx)) {
        Ok(Ok(done)) => done,
        Ok(Err(failed)) => return Err(upload_failed(py, None, failed)),
        Err(Stopped { err, result }) => {
            return Err(match result {
                Some(Err(failed)) => upload_failed(py, Some(err), failed),
                _ => err,
            });
        }
    };
    Ok(PyExNode::new(as_saved(done.exnode, out.as_deref()), out))
}

/// A refused upload as Python raises it: an existing output is
/// `FileExistsError`, a record of another upload `ValueError`.
fn refused(py: Python<'_>, e: lors::job::Refused) -> PyErr {
    use lors::job::Refused as R;
    match e {
        R::Exists(p) => crate::errors::os_error(
            libc::EEXIST,
            format!(
                "{} already exists and may hold the only capabilities to its data: choose another output, or pass force=True to replace it",
                p.display()
            ),
            Some(&p.display().to_string()),
        ),
        R::Foreign(e) => PyValueError::new_err(crate::errors::chain(&e)),
        R::Output(e) => from_xnd(py, &e),
        R::Lors(e) => from_lors(py, &e, None),
    }
}

/// The exception of an upload that did not finish (`stopped`: the
/// KeyboardInterrupt that stopped it), with a note saying what it left.
fn upload_failed(py: Python<'_>, stopped: Option<PyErr>, failed: Failed) -> PyErr {
    let err = match (stopped, failed.cause()) {
        (Some(err), _) => err,
        (None, Some(cause)) => from_lors(py, cause, None),
        (None, None) => pyo3::exceptions::PyKeyboardInterrupt::new_err("upload interrupted"),
    };
    if let Some(left) = failed.left() {
        note_left(py, &err, left);
    }
    err
}

/// Adds to `err` the note saying what an unfinished job `left`, when it
/// left or released anything.
fn note_left(py: Python<'_>, err: &PyErr, left: &lors::job::Left) {
    if left.is_nothing() && left.released == 0 {
        return;
    }
    let resume = match (&left.record, left.resumable) {
        (Some(_), true) => ": the same call resumes from it",
        _ => "",
    };
    let note = format!("lors: {left}{resume}{}", left.released_clause());
    let _ = err.value(py).call_method1("add_note", (note,));
}

/// The upload's options, its depots found as the settings say.
fn placed(
    py: Python<'_>,
    opts: &Opts,
    s: &Settings,
    path: &str,
    e2e: &E2e,
) -> PyResult<UploadOptions> {
    let filename = Path::new(path)
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let e2e = e2e.codec(&s.rc).map_err(PyValueError::new_err)?;
    let mut up = UploadOptions::from_settings(s, Vec::new(), filename, e2e);
    let (spread, room) = up.need();
    up.depots = opts.find(py, s, spread, room, Vec::new())?.depots;
    Ok(up)
}

/// The regular file to upload.
fn input(path: &str) -> PyResult<Source> {
    let file = std::fs::File::open(path).map_err(|e| {
        crate::errors::os_error(lors::xio::errno(&e), format!("{path}: {e}"), Some(path))
    })?;
    if !file.metadata()?.is_file() {
        return Err(PyValueError::new_err(format!(
            "{path}: not a regular file (write a stream with lors.open(xnd, \"wb\"))"
        )));
    }
    Ok(Source::File(file))
}

/// Downloads the exNode's file (or `length` bytes of it from `offset`) to
/// `path`; returns the bytes written. An interrupted download resumes.
#[pyfunction]
#[pyo3(signature = (exnode, path, *, offset = 0, length = None, connections = None,
    timeout = None, bwlimit = None, progress = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn download(
    py: Python<'_>,
    exnode: Bound<'_, PyAny>,
    path: PathOrStr,
    offset: u64,
    length: Option<u64>,
    connections: Option<usize>,
    timeout: Option<Bound<'_, PyAny>>,
    bwlimit: Option<Bound<'_, PyAny>>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<u64> {
    let t = Target::of(py, &exnode)?;
    let s = Opts::timeout_only(timeout.as_ref(), t.uri.as_ref())?;
    let d = DownloadOptions {
        offset,
        length,
        conns_per_depot: connections.unwrap_or(0),
        resume: true,
        ..DownloadOptions::default()
    };
    let pool = pool(&s, size("bwlimit", bwlimit.as_ref())?);
    let mut watch = Watch::new(progress);
    let tally = watch.tally.clone();
    let out = Output::File(PathBuf::from(path.0));
    // A sparse file's holes are written too (as holes): they count.
    let size = t.x.logical_size();
    let end = length.map_or(size, |l| offset.saturating_add(l).min(size));
    let holes: u64 = t.x.holes_in(offset, end).map(|h| h.length).sum();
    let run = async move { lors::download::download(&t.x, out, &d, pool, tally).await };
    match block_on(py, run, &mut watch, Stop::Abort) {
        Ok(Ok(stats)) => Ok(stats.bytes + stats.resumed_bytes + holes),
        Ok(Err(e)) => Err(from_lors(py, &e, None)),
        Err(s) => Err(s.err),
    }
}

/// Collects a stream download in memory.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<u8>>>);

impl tokio::io::AsyncWrite for Collect {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Poll::Ready(Ok(b.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The bytes `start..end` of `x` (clipped to the file), in memory.
async fn fetch(
    x: Arc<ExNode>,
    start: u64,
    end: u64,
    pool: Arc<lors::Pool>,
) -> lors::Result<Vec<u8>> {
    let size = x.logical_size();
    let (start, end) = (start.min(size), end.min(size));
    if start >= end {
        return Ok(Vec::new());
    }
    let len = end - start;
    // The download takes its own copy of the exNode: of a replicated file,
    // only the mappings the range touches (a 64 KiB read of a terabyte
    // file would copy every capability otherwise). An erasure-coded file
    // keeps its whole stripes for rebuilds.
    let x = if x.parity.is_empty() {
        Arc::new(ExNode {
            metadata: x.metadata.clone(),
            mappings: (x.mappings.iter())
                .filter(|m| m.exnode_offset < end && m.logical_end() > start)
                .cloned()
                .collect(),
            parity: Vec::new(),
            holes: x.holes_in(start, end).collect(),
        })
    } else {
        x
    };
    let sink = Collect::default();
    let d = DownloadOptions {
        offset: start,
        length: Some(len),
        // A small range is a piece or two: more connections only wait.
        conns_per_depot: if len <= 4 << 20 { 2 } else { 0 },
        ..DownloadOptions::default()
    };
    let out = Output::Stream {
        writer: Box::new(sink.clone()),
        name: "memory".into(),
    };
    lors::download::download(&x, out, &d, pool, Arc::new(lors::NoProgress)).await?;
    let bytes = std::mem::take(&mut *sink.0.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(bytes)
}

/// The bytes `start..end` of the file (clipped to its size).
#[pyfunction]
#[pyo3(signature = (exnode, start, end, *, timeout = None))]
pub(crate) fn read_range<'py>(
    py: Python<'py>,
    exnode: Bound<'py, PyAny>,
    start: u64,
    end: u64,
    timeout: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let t = Target::of(py, &exnode)?;
    let s = Opts::timeout_only(timeout.as_ref(), t.uri.as_ref())?;
    let pool = pool(&s, None);
    match crate::run::wait(py, fetch(t.x, start, end, pool))? {
        Ok(b) => Ok(PyBytes::new(py, &b)),
        Err(e) => Err(from_lors(py, &e, None)),
    }
}

/// Several ranges of the file at once, `concurrency` in flight: a list of
/// `bytes` in the order of `ranges` (`(start, end)` pairs).
#[pyfunction]
#[pyo3(signature = (exnode, ranges, *, concurrency = 32, timeout = None))]
pub(crate) fn read_ranges<'py>(
    py: Python<'py>,
    exnode: Bound<'py, PyAny>,
    ranges: Vec<(u64, u64)>,
    concurrency: usize,
    timeout: Option<Bound<'py, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let t = Target::of(py, &exnode)?;
    let s = Opts::timeout_only(timeout.as_ref(), t.uri.as_ref())?;
    let pool = pool(&s, None);
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency.clamp(1, 1024)));
    let x = t.x;
    let all = async move {
        let mut set = tokio::task::JoinSet::new();
        for (i, (a, b)) in ranges.into_iter().enumerate() {
            let (x, pool, gate) = (x.clone(), pool.clone(), gate.clone());
            set.spawn(async move {
                let _turn = gate.acquire_owned().await;
                (i, fetch(x, a, b, pool).await)
            });
        }
        let mut out: Vec<Option<Vec<u8>>> = vec![None; set.len()];
        while let Some(j) = set.join_next().await {
            let Ok((i, r)) = j else { continue };
            out[i] = Some(r?);
        }
        Ok::<_, lors::Error>(
            out.into_iter()
                .map(Option::unwrap_or_default)
                .collect::<Vec<_>>(),
        )
    };
    match crate::run::wait(py, all)? {
        Ok(v) => Ok(v.iter().map(|b| PyBytes::new(py, b)).collect()),
        Err(e) => Err(from_lors(py, &e, None)),
    }
}

/// `x` as saved at `path`: with the record of the file it was saved as
/// (what tells a later copy of it for one), so the object and its file
/// are the same exNode.
pub(crate) fn as_saved(x: ExNode, path: Option<&std::path::Path>) -> ExNode {
    path.and_then(|p| lors::xnd::load(p).ok()).unwrap_or(x)
}

/// Adds `copies` more copies of every block, depot to depot; the exNode
/// is saved to `output`, else back to the file it came from.
#[pyfunction]
#[pyo3(signature = (exnode, copies = 1, *, output = None, depots = None, lbone = None,
    location = None, duration = None, timeout = None, progress = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn augment(
    py: Python<'_>,
    exnode: Bound<'_, PyAny>,
    copies: usize,
    output: Option<PathOrStr>,
    depots: Option<Bound<'_, PyAny>>,
    lbone: Option<String>,
    location: Option<String>,
    duration: Option<Bound<'_, PyAny>>,
    timeout: Option<Bound<'_, PyAny>>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<PyExNode> {
    let t = Target::of(py, &exnode)?;
    if copies == 0 {
        return Err(PyValueError::new_err(
            "copies=0 adds nothing: give at least 1",
        ));
    }
    let opts = Opts::placing(depots, lbone, location, duration, timeout)?;
    let s = opts.settings(t.uri.as_ref())?;
    let biggest =
        t.x.mappings
            .iter()
            .map(|m| m.alloc_length)
            .max()
            .unwrap_or(0);
    let held = t.x.depots();
    let found = opts.find(py, &s, copies + held.len(), biggest, Vec::new())?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let copy = CopyOptions {
        duration: s.duration,
        reliability: s.reliability,
        stop: Some(rx),
    };
    // A pool of its own: the edit journals every allocation it makes.
    let pool = Arc::new(lors::Pool::new(s.client()));
    let mut watch = Watch::new(progress);
    let tally = watch.tally.clone();
    let out = output_path(&t, output)?;
    let (input, x, to) = (t.path.clone(), (*t.x).clone(), out.clone());
    let run = async move {
        let Some(out) = to else {
            let r = lors::manage::augment(&x, &found.depots, copies, &copy, &pool, tally.as_ref());
            return copies_outcome(r.await, None);
        };
        let edit = Edit::begin(input.as_deref(), x, &out, &pool)
            .await
            .map_err(failed)?;
        let r = lors::manage::augment(
            edit.exnode(),
            &found.depots,
            copies,
            &copy,
            &pool,
            tally.as_ref(),
        );
        let r = match copies_outcome(r.await, Some(&out)) {
            Ok(mut y) => (edit.save(&mut y, Vec::new(), &pool).await)
                .map(|_| y)
                .map_err(failed),
            Err(e) => Err(e),
        };
        let ended = edit.end(&pool).await;
        let y = r?;
        ended.map_err(failed)?;
        Ok(y)
    };
    let y = match block_on(py, run, &mut watch, Stop::Signal(tx)) {
        Ok(r) => r.map_err(|e| unfinished(py, None, e))?,
        Err(Stopped { err, result }) => {
            return Err(match result {
                Some(Err(e)) => unfinished(py, Some(err), e),
                _ => err,
            });
        }
    };
    Ok(PyExNode::new(as_saved(y, out.as_deref()), out))
}

/// Where a changed exNode goes: `output`, else the file it came from.
fn output_path(t: &Target, output: Option<PathOrStr>) -> PyResult<Option<PathBuf>> {
    Ok(match output {
        Some(o) => Some(exnode_ref(&o.0)?.path),
        None => t.path.clone(),
    })
}

/// An error of a copy job's set-up or save, which left nothing to say.
fn failed(cause: lors::Error) -> Unfinished {
    Unfinished::Failed {
        cause: Box::new(cause),
        left: lors::job::Left::default(),
    }
}

/// The exception of a copy job that did not finish (`stopped`: the
/// KeyboardInterrupt that stopped it), with a note saying what it left.
fn unfinished(py: Python<'_>, stopped: Option<PyErr>, e: Unfinished) -> PyErr {
    let (err, left) = match e {
        Unfinished::Interrupted(left) => (
            stopped.unwrap_or_else(|| {
                pyo3::exceptions::PyKeyboardInterrupt::new_err(
                    "interrupted: the exNode is unchanged",
                )
            }),
            left,
        ),
        Unfinished::Failed { cause, left } => {
            (stopped.unwrap_or_else(|| from_lors(py, &cause, None)), left)
        }
    };
    note_left(py, &err, &left);
    err
}

/// Removes (and by default frees) the allocations on `depots`, or those
/// numbered `mappings`; refuses to drop a block's last copy (or a stripe
/// below k) unless `allow_holes`. Saved to `output`, else back in place.
#[pyfunction]
#[pyo3(signature = (exnode, *, depots = None, mappings = None, release = true,
    allow_holes = false, output = None, timeout = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn trim(
    py: Python<'_>,
    exnode: Bound<'_, PyAny>,
    depots: Option<Bound<'_, PyAny>>,
    mappings: Option<Vec<usize>>,
    release: bool,
    allow_holes: bool,
    output: Option<PathOrStr>,
    timeout: Option<Bound<'_, PyAny>>,
) -> PyResult<PyExNode> {
    let t = Target::of(py, &exnode)?;
    let on = crate::settings::depots(depots.as_ref())?;
    let sel = match (on.is_empty(), mappings) {
        (false, None) => Selection::Depots(on),
        (true, Some(m)) => Selection::Indices(m),
        _ => {
            return Err(PyValueError::new_err(
                "say what to trim: depots=[…] or mappings=[…] (one of them)",
            ));
        }
    };
    let s = Opts::timeout_only(timeout.as_ref(), t.uri.as_ref())?;
    // What to remove, checked before anything else (a mapping that is not
    // there, a last replica), with nothing touched.
    lors::manage::trim(&t.x, &sel, allow_holes).map_err(|e| from_lors(py, &e, None))?;
    // A pool of its own: the edit journals what it does.
    let pool = Arc::new(lors::Pool::new(s.client()));
    let path = output_path(&t, output)?;
    let (input, before, out) = (t.path.clone(), (*t.x).clone(), path.clone());
    let run = async move {
        let Some(out) = out else {
            // An exNode only in memory is the caller's to keep.
            let t = lors::manage::trim(&before, &sel, allow_holes)?;
            if release {
                pool.release_all(t.dropped.into_iter().map(|(_, m)| m).collect())
                    .await;
            }
            return Ok(t.exnode);
        };
        let edit = Edit::begin(input.as_deref(), before.clone(), &out, &pool).await?;
        let r = async {
            edit.check_as_read(&before)?;
            let mut t = lors::manage::trim(edit.exnode(), &sel, allow_holes)?;
            let free = match release {
                true => t.dropped.into_iter().map(|(_, m)| m).collect(),
                false => Vec::new(),
            };
            edit.save(&mut t.exnode, free, &pool).await?;
            Ok::<_, lors::Error>(t.exnode)
        }
        .await;
        let ended = edit.end(&pool).await;
        let y = r?;
        ended?;
        Ok::<_, lors::Error>(y)
    };
    let x = crate::run::wait(py, run)?.map_err(|e| from_lors(py, &e, None))?;
    Ok(PyExNode::new(as_saved(x, path.as_deref()), path))
}

/// One allocation's refresh: its number, its new seconds left, or why not.
type Renewed = (usize, Option<i64>, Option<String>);

/// Extends every allocation's lease to `duration` from now (the settings'
/// duration when not given); returns each allocation's new seconds left,
/// or the error that kept it from being extended.
#[pyfunction]
#[pyo3(signature = (exnode, duration = None, *, timeout = None))]
pub(crate) fn refresh(
    py: Python<'_>,
    exnode: Bound<'_, PyAny>,
    duration: Option<Bound<'_, PyAny>>,
    timeout: Option<Bound<'_, PyAny>>,
) -> PyResult<Vec<Renewed>> {
    let t = Target::of(py, &exnode)?;
    let opts = Opts {
        duration: crate::settings::duration("duration", duration.as_ref())?,
        timeout: crate::settings::duration("timeout", timeout.as_ref())?,
        ..Opts::default()
    };
    let s = opts.settings(t.uri.as_ref())?;
    let lease = lors::manage::Lease::To(s.duration);
    let pool = pool(&s, None);
    let x = t.x.clone();
    let run = async move { lors::manage::refresh(&x, lease, &pool, &lors::NoProgress).await };
    let outcomes = crate::run::wait(py, run)?;
    Ok(outcomes
        .into_iter()
        .map(|(i, r)| match r {
            Ok(secs) => (i, Some(secs), None),
            Err(c) => (i, None, Some(c.text)),
        })
        .collect())
}

/// Removes the exNode at `path` as `rm` removes a file: the `.xnd` is
/// saved empty, what it named is freed (an allocation another exNode also
/// names loses only this file's reference), then the `.xnd` goes. When a
/// depot does not free an allocation, the emptied `.xnd` stays with the
/// record naming what is left (removing it again finishes) and
/// `LorsError` says so; `force=True` removes the `.xnd` all the same and
/// warns, the record staying beside where it was. Returns the number of
/// allocations freed.
#[pyfunction]
#[pyo3(signature = (path, *, force = false, timeout = None))]
pub(crate) fn remove(
    py: Python<'_>,
    path: PathOrStr,
    force: bool,
    timeout: Option<Bound<'_, PyAny>>,
) -> PyResult<usize> {
    let r = exnode_ref(&path.0)?;
    let s = Opts::timeout_only(timeout.as_ref(), Some(&r))?;
    let pool = pool(&s, None);
    let name = r.path.display().to_string();
    let target = r.path.clone();
    let run = async move {
        lors::commit::remove(&target, &pool, std::time::Duration::from_secs(10)).await
    };
    match crate::run::wait(py, run)? {
        Ok(n) => Ok(n),
        Err(lors::Error::NotReleased { count, record, .. }) if force => {
            std::fs::remove_file(&r.path).map_err(|e| {
                crate::errors::os_error(lors::xio::errno(&e), e.to_string(), Some(&name))
            })?;
            let warn = py.import("warnings")?;
            let msg = format!(
                "{name} removed with {count} allocations a depot did not free: they stay until their lease ends, named in {}",
                record.display()
            );
            warn.call_method1(
                "warn",
                (msg, py.get_type::<pyo3::exceptions::PyRuntimeWarning>()),
            )?;
            Ok(0)
        }
        Err(e) => {
            let err = from_lors(py, &e, Some(&name));
            if let lors::Error::NotReleased { .. } = e {
                let _ = err.value(py).setattr("errno", libc::EIO);
            }
            Err(err)
        }
    }
}

/// Copies the exNode `src` to the new exNode `dst` with no byte through
/// this machine: every block is copied depot to depot (as `augment` does,
/// onto depots not holding it, as many copies as the source keeps). An
/// erasure-coded file, or one with too few other depots for its copies, is
/// copied by reference instead: `dst` takes its own reference on each
/// allocation, so removing either never frees the other's data. An
/// existing `dst` is replaced (its allocations freed once the copy is
/// saved) only with `force=True`. Returns the copy.
#[pyfunction]
#[pyo3(signature = (src, dst, *, depots = None, lbone = None, location = None,
    duration = None, timeout = None, force = false, progress = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy(
    py: Python<'_>,
    src: Bound<'_, PyAny>,
    dst: PathOrStr,
    depots: Option<Bound<'_, PyAny>>,
    lbone: Option<String>,
    location: Option<String>,
    duration: Option<Bound<'_, PyAny>>,
    timeout: Option<Bound<'_, PyAny>>,
    force: bool,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<PyExNode> {
    let t = Target::of(py, &src)?;
    let out = exnode_ref(&dst.0)?.path;
    if t.path.as_deref().is_some_and(|p| same_file(p, &out)) {
        return Err(PyValueError::new_err(format!(
            "{}: source and destination are the same file",
            out.display()
        )));
    }
    // A link in the destination's place would be replaced, and what its
    // target names freed as if it were the replaced copy's.
    if std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(crate::errors::os_error(
            libc::EEXIST,
            format!(
                "{} is a symbolic link: copy to the file it names, or remove the link first",
                out.display()
            ),
            Some(&out.display().to_string()),
        ));
    }
    lors::job::check_output(&out, force).map_err(|e| refused(py, e))?;
    let opts = Opts::placing(depots, lbone, location, duration, timeout)?;
    let s = opts.settings(t.uri.as_ref())?;
    let pool = pool(&s, None);
    let name = out.display().to_string();
    let copies = t.x.copies_policy().unwrap_or(1);
    let coded = t.x.is_erasure_coded();
    let biggest = (t.x.mappings.iter()).map(|m| m.alloc_length).max();
    // Depots for the copies: enough beside those holding each block.
    let found = match (coded, biggest) {
        (false, Some(b)) => {
            let held = t.x.depots().len();
            (opts
                .find(py, &s, copies + held.min(copies), b, Vec::new())
                .ok())
            .filter(|f| room_for_copies(&t.x, &f.depots, copies))
        }
        _ => None,
    };
    let mut watch = Watch::new(progress);
    let made = match found {
        Some(found) => {
            let (tx, rx) = tokio::sync::watch::channel(false);
            let copy = CopyOptions {
                duration: s.duration,
                reliability: s.reliability,
                stop: Some(rx),
            };
            let (x, pool2, tally) = (t.x.clone(), pool.clone(), watch.tally.clone());
            let run = async move {
                let want = lors::manage::Replicas::More(copies);
                lors::manage::replicate(&x, &found.depots, want, &copy, &pool2, tally.as_ref())
                    .await
            };
            match block_on(py, run, &mut watch, Stop::Signal(tx)) {
                Ok(Ok(y)) => Some(new_only(&t.x, y)),
                Ok(Err(lors::Error::NotEnoughDepots { .. })) => None,
                Ok(Err(e)) => return Err(from_lors(py, &e, Some(&name))),
                Err(s) => return Err(s.err),
            }
        }
        None => None,
    };
    let y = match made {
        Some(y) => y,
        None => by_reference(py, &t.x, &pool, &name)?,
    };
    // Saved before a replaced exNode's allocations are freed.
    // (A read-only exNode's allocations were never its to free.)
    let old: Vec<_> = match lors::xnd::load(&out) {
        Ok(o) => (o.allocations())
            .filter(|m| m.manage.is_some())
            .cloned()
            .collect(),
        Err(_) => Vec::new(),
    };
    let (y2, out2, pool2) = (y.clone(), out.clone(), pool.clone());
    let run = async move { lors::commit::save_then_release(&out2, &y2, old, &pool2).await };
    if let Err(e) = crate::run::wait(py, run)? {
        // Without its exNode nobody reaches the new data: free it.
        // (A reference taken for a shared copy is dropped the same way.)
        let all: Vec<_> = y.allocations().cloned().collect();
        let _ = crate::run::wait(py, async move { pool.release_all(all).await });
        return Err(from_lors(py, &e, Some(&name)));
    }
    Ok(PyExNode::new(as_saved(y, Some(&out)), Some(out)))
}

/// `a` and `b` are one file (the same path, a hard link, a link to it).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

/// Every block of `x` has `copies` depots among `depots` that do not hold
/// it yet (where a depot-to-depot copy can put its new replicas).
fn room_for_copies(x: &ExNode, depots: &[String], copies: usize) -> bool {
    let mut held: std::collections::HashMap<u64, std::collections::HashSet<String>> =
        std::collections::HashMap::new();
    for m in &x.mappings {
        let on = held.entry(m.exnode_offset).or_default();
        on.extend(m.depot());
    }
    (held.values()).all(|on| depots.iter().filter(|d| !on.contains(*d)).count() >= copies)
}

/// A copy of `x` that takes its own reference on each allocation `x`
/// names (for `copy` where the depots cannot copy the blocks).
fn by_reference(
    py: Python<'_>,
    x: &Arc<ExNode>,
    pool: &Arc<lors::Pool>,
    name: &str,
) -> PyResult<ExNode> {
    let (input, pool) = (x.clone(), pool.clone());
    let mut y = (**x).clone();
    let run = async move {
        let missed = lors::commit::share_with(&input, &mut y, &pool).await;
        (y, missed)
    };
    let (y, missed) = crate::run::wait(py, run)?;
    if missed > 0 {
        return Err(crate::errors::raise(
            py,
            crate::errors::Kind::Depot,
            format!(
                "{missed} allocations could not take a reference for the copy (is a depot down?); nothing was copied"
            ),
            crate::errors::Detail {
                filename: Some(name.to_owned()),
                ..Default::default()
            },
        ));
    }
    Ok(y)
}

/// The exNode of what `augmented` added to `x`: the new replicas alone.
fn new_only(x: &ExNode, augmented: ExNode) -> ExNode {
    let had = lors::commit::named(x);
    ExNode {
        metadata: x.metadata.clone(),
        mappings: (augmented.mappings.into_iter())
            .filter(|m| lors::commit::key(m).is_some_and(|k| !had.contains(&k)))
            .collect(),
        parity: Vec::new(),
        holes: x.holes.clone(),
    }
}
