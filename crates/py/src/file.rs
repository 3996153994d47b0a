//! `lors._lors.File`: an exNode opened as a file (`lors::xio::File`), the
//! raw file under `lors.open`'s buffered objects.
//!
//! Writes are all or nothing ([`OpenOptions::all_or_nothing`]): the `.xnd`
//! changes only when `close` has stored every byte, so a failed, abandoned
//! or interrupted write leaves the old file (or none), never a truncated
//! one. Each call runs on a thread of the file's own while the caller
//! waits in ticks, looking for Ctrl-C between them: a read from a hung
//! depot stops at once rather than at the transfer's timeout.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lors::upload::E2e;
use lors::xio::OpenOptions;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::errors::from_io;
use crate::settings::{Opts, exnode_ref, size};

/// How often a caller waiting for its file's thread looks for Ctrl-C.
const TICK: Duration = Duration::from_millis(20);

/// One call, run on the file's thread with the file (`None` once closed).
type Job = Box<dyn FnOnce(&mut Option<lors::xio::File>) + Send>;

/// An exNode as a file, read and written through xio: sequential reads
/// start a read-ahead, other reads fetch their 1 MiB stretch, writes are
/// stored a buffer at a time and saved, whole, by `close`. Every call
/// releases the GIL.
#[pyclass(name = "File", module = "lors._lors")]
pub(crate) struct File {
    /// The file's thread; `None` once closed. Dropped without `close`, the
    /// thread ends and drops the file, which discards what it wrote.
    jobs: Mutex<Option<Sender<Job>>>,
    name: String,
    readable: bool,
    writable: bool,
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O operation on a closed file")
}

/// The file's thread: runs calls in order until the handle goes.
fn worker(f: lors::xio::File) -> PyResult<Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("lors-file".into())
        .spawn(move || {
            let mut f = Some(f);
            while let Ok(job) = rx.recv() {
                job(&mut f);
            }
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the file's thread: {e}")))?;
    Ok(tx)
}

/// Whether Ctrl-C ends the caller's wait: a read or write goes on in the
/// background (the next call waits for it); a close or discard is waited
/// for, and the Ctrl-C raised after it, so its outcome is known. Ctrl-C
/// during a close that is still storing turns it into a discard.
#[derive(Clone, Copy)]
enum Wait<'a> {
    Interruptible,
    ToTheEnd(&'a AtomicBool),
}

impl File {
    /// Runs `f` on the open file's thread, the GIL released while waiting.
    fn call<T: Send + 'static>(
        &self,
        py: Python<'_>,
        wait: Wait,
        f: impl FnOnce(&mut Option<lors::xio::File>) -> Option<std::io::Result<T>> + Send + 'static,
    ) -> PyResult<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |slot| {
            let _ = tx.send(f(slot));
        });
        {
            let g = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            let sender = g.as_ref().ok_or_else(closed)?;
            sender.send(job).map_err(|_| closed())?;
        }
        self.wait(py, rx, wait)
    }

    /// Runs `f` on the open file.
    fn with<T: Send + 'static>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut lors::xio::File) -> std::io::Result<T> + Send + 'static,
    ) -> PyResult<T> {
        self.call(py, Wait::Interruptible, |slot| slot.as_mut().map(f))
    }

    fn wait<T: Send>(
        &self,
        py: Python<'_>,
        mut rx: Receiver<Option<std::io::Result<T>>>,
        wait: Wait<'_>,
    ) -> PyResult<T> {
        let mut interrupted: Option<PyErr> = None;
        loop {
            // The receiver goes with the wait and comes back (it is not Sync).
            let (got, back) = py.detach(move || (rx.recv_timeout(TICK), rx));
            rx = back;
            let r = match got {
                Ok(None) => Err(closed()),
                Ok(Some(Ok(v))) => Ok(v),
                Ok(Some(Err(e))) => Err(from_io(py, e, Some(&self.name))),
                Err(RecvTimeoutError::Disconnected) => Err(PyRuntimeError::new_err(
                    "the file's call ended without a result (a bug: it panicked)",
                )),
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        match wait {
                            Wait::Interruptible => return Err(e),
                            Wait::ToTheEnd(abandon) => abandon.store(true, Ordering::SeqCst),
                        }
                        interrupted.get_or_insert(e);
                    }
                    continue;
                }
            };
            return match interrupted {
                Some(e) => Err(e),
                None => r,
            };
        }
    }

    /// Ends the file: saved whole (`save`), or discarded. A file only
    /// read is not waited for: a read still waiting on a hung depot ends on
    /// its own, and the file with it.
    fn end(&self, py: Python<'_>, save: bool) -> PyResult<()> {
        let sender = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(sender) = sender else {
            return Ok(());
        };
        let abandon = Arc::new(AtomicBool::new(!save));
        let (tx, rx) = mpsc::sync_channel(1);
        let flag = abandon.clone();
        let job: Job = Box::new(move |slot| {
            let r = slot.take().map_or(Ok(()), |mut f| {
                // What is still buffered is stored first: Ctrl-C meanwhile
                // makes this a discard; once stored, the save is quick.
                match (f.sync_all(), flag.load(Ordering::SeqCst)) {
                    (_, true) => f.discard(),
                    (Ok(()), false) => f.close(),
                    (Err(e), false) => {
                        // Not all stored: what was is freed, the old stays.
                        let _ = f.discard();
                        Err(e)
                    }
                }
            });
            let _ = tx.send(Some(r));
        });
        if sender.send(job).is_err() || !self.writable {
            return Ok(());
        }
        self.wait(py, rx, Wait::ToTheEnd(&abandon))
    }
}

#[pymethods]
impl File {
    /// Opens `target` (an `.xnd` path or a `lors://` URI) as `open()` does
    /// with `mode`: `rb`, `wb`, `ab`, `xb`, `r+b`, `w+b`, `a+b`. A file
    /// opened for writing is saved by `close`, whole; until then the old
    /// `.xnd` (or none) stays.
    #[new]
    #[pyo3(signature = (target, mode = "rb", *, depots = None, lbone = None, location = None,
        copies = None, block_size = None, duration = None, timeout = None, checksum = None,
        compress = false, encrypt = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: &str,
        mode: &str,
        depots: Option<Bound<'_, PyAny>>,
        lbone: Option<String>,
        location: Option<String>,
        copies: Option<usize>,
        block_size: Option<Bound<'_, PyAny>>,
        duration: Option<Bound<'_, PyAny>>,
        timeout: Option<Bound<'_, PyAny>>,
        checksum: Option<String>,
        compress: bool,
        encrypt: Option<String>,
    ) -> PyResult<File> {
        let m: String = mode.chars().filter(|&c| c != 'b').collect();
        if !mode.contains('b') {
            return Err(PyValueError::new_err(format!(
                "mode {mode:?}: exNodes open in binary mode (\"rb\", \"wb\", \"r+b\", …); wrap the file in io.TextIOWrapper for text"
            )));
        }
        let mut o = OpenOptions::new();
        match m.as_str() {
            "r" => o.read(true),
            "r+" => o.read(true).write(true),
            "w" => o.write(true).create(true).truncate(true),
            "w+" => o.read(true).write(true).create(true).truncate(true),
            "a" => o.append(true).create(true),
            "a+" => o.read(true).append(true).create(true),
            "x" => o.write(true).create_new(true),
            "x+" => o.read(true).write(true).create_new(true),
            _ => return Err(PyValueError::new_err(format!("invalid mode {mode:?}"))),
        };
        let opts = Opts {
            depots: crate::settings::depots(depots.as_ref())?,
            lbone,
            location,
            copies,
            block_size: size("block_size", block_size.as_ref())?,
            duration: crate::settings::duration("duration", duration.as_ref())?,
            timeout: crate::settings::duration("timeout", timeout.as_ref())?,
            ..Opts::default()
        };
        let r = exnode_ref(target)?;
        let mut s = opts.settings(Some(&r))?;
        // New blocks as `lors upload` stores them when nothing is set.
        let up = lors::upload::UploadOptions::default();
        s.copies.get_or_insert(up.copies);
        let e2e = E2e {
            checksum,
            compress,
            encrypt,
            ..E2e::default()
        };
        let codec = e2e.codec(&s.rc).map_err(PyValueError::new_err)?;
        o.settings(s).e2e(codec).all_or_nothing(true);
        if !opts.depots.is_empty() {
            o.depots(opts.depots.clone());
        }
        let name = r.path.display().to_string();
        let f = py
            .detach(|| o.open_ref(&r))
            .map_err(|e| from_io(py, e, Some(&name)))?;
        Ok(File {
            jobs: Mutex::new(Some(worker(f)?)),
            name,
            readable: m.starts_with('r') || m.contains('+'),
            writable: !m.starts_with('r') || m.contains('+'),
        })
    }

    /// Reads into `buffer` (any writable, contiguous buffer: `bytearray`,
    /// `memoryview`, a NumPy array) straight from the fetched blocks;
    /// returns the bytes read, 0 at the end of the file.
    fn readinto(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let buf = PyBuffer::<u8>::get(buffer)?;
        if buf.readonly() || !buf.is_c_contiguous() {
            return Err(PyBufferError::new_err(
                "readinto needs a writable, contiguous buffer",
            ));
        }
        // The export goes with the call and is released when the call
        // ends, also when Ctrl-C made the caller return first: until then
        // the bytes stay where they are (a bytearray cannot resize while
        // exported), so the file's thread never writes into freed memory.
        self.with(py, move |f| {
            let len = buf.len_bytes();
            // SAFETY: the buffer protocol hands out `len` writable (checked
            // above), contiguous bytes at `buf_ptr`, kept in place while
            // `buf` holds the export, which it does until this closure
            // ends. A Python thread writing the same buffer meanwhile races
            // as it would with `os.readv`, never with our memory.
            let dst = unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr().cast::<u8>(), len) };
            let mut done = 0;
            // Fill the buffer (a short count only at the end of the file),
            // as a regular file's readinto does.
            while done < dst.len() {
                match f.read(&mut dst[done..])? {
                    0 => break,
                    n => done += n,
                }
            }
            drop(buf);
            Ok(done)
        })
    }

    /// Writes `data` (any contiguous buffer); returns its length.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let buf = PyBuffer::<u8>::get(data)?;
        if !buf.is_c_contiguous() {
            return Err(PyBufferError::new_err("write needs a contiguous buffer"));
        }
        self.with(py, move |f| {
            let len = buf.len_bytes();
            // SAFETY: as in `readinto`, the exported bytes stay put until
            // `buf` is released at the end of this closure; only read.
            let src = unsafe { std::slice::from_raw_parts(buf.buf_ptr().cast::<u8>(), len) };
            let r = f.write_all(src).map(|()| len);
            drop(buf);
            r
        })
    }

    /// Moves the position as `io.IOBase.seek` does; returns the new one.
    #[pyo3(signature = (offset, whence = 0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let to =
            match whence {
                0 => SeekFrom::Start(u64::try_from(offset).map_err(|_| {
                    PyValueError::new_err(format!("negative seek position {offset}"))
                })?),
                1 => SeekFrom::Current(offset),
                2 => SeekFrom::End(offset),
                _ => {
                    return Err(PyValueError::new_err(format!(
                        "invalid whence ({whence}, should be 0, 1 or 2)"
                    )));
                }
            };
        self.with(py, move |f| f.seek(to))
    }

    /// The position.
    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |f| f.stream_position())
    }

    /// Stores what is buffered on the depots; the exNode is saved by
    /// `close`, not before.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        if !self.writable {
            return Ok(());
        }
        self.with(py, |f| f.sync_all())
    }

    /// Cuts or extends the file to `size` bytes.
    fn truncate(&self, py: Python<'_>, size: u64) -> PyResult<u64> {
        self.with(py, move |f| f.set_len(size).map(|()| size))
    }

    /// Closes the file: what is buffered is stored and the exNode saved,
    /// whole; an error doing so is raised here, and the old `.xnd` (or
    /// none) stays, with what this file stored freed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.end(py, true)
    }

    /// Closes without saving: what was written is freed on the depots and
    /// the `.xnd` stays as it was before the open (or absent).
    fn discard(&self, py: Python<'_>) -> PyResult<()> {
        self.end(py, false)
    }

    /// Bytes in the file, with what is buffered.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |f| f.metadata().map(|m| m.len))
    }

    #[getter]
    fn closed(&self) -> bool {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    fn readable(&self) -> bool {
        self.readable
    }

    fn writable(&self) -> bool {
        self.writable
    }
}
