//! `lors._lors.File`: an exNode opened as a file (`lors::xio::File`), the
//! raw file under `lors.open`'s buffered objects.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Mutex;

use lors::xio::OpenOptions;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;

use crate::errors::from_io;
use crate::settings::{Opts, exnode_ref, size};

/// An exNode as a file, read and written through xio: sequential reads
/// start a read-ahead, other reads fetch their 1 MiB stretch, writes are
/// stored a buffer at a time. Every call releases the GIL.
#[pyclass(name = "File", module = "lors._lors")]
pub(crate) struct File {
    inner: Mutex<Option<lors::xio::File>>,
    readable: bool,
    writable: bool,
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O operation on a closed file")
}

impl File {
    /// Runs `f` on the open file with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut lors::xio::File) -> std::io::Result<T> + Send,
    ) -> PyResult<T> {
        let r = py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.as_mut().map(f)
        });
        match r {
            None => Err(closed()),
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(from_io(py, e)),
        }
    }
}

#[pymethods]
impl File {
    /// Opens `target` (an `.xnd` path or a `lors://` URI) as `open()` does
    /// with `mode`: `rb`, `wb`, `ab`, `xb`, `r+b`, `w+b`, `a+b`.
    #[new]
    #[pyo3(signature = (target, mode = "rb", *, depots = None, lbone = None, location = None,
        copies = None, block_size = None, duration = None, timeout = None))]
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
        o.settings(opts.settings(Some(&r))?);
        if !opts.depots.is_empty() {
            o.depots(opts.depots.clone());
        }
        let f = py.detach(|| o.open_ref(&r)).map_err(|e| from_io(py, e))?;
        Ok(File {
            inner: Mutex::new(Some(f)),
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
        let len = buf.len_bytes();
        // SAFETY: the buffer protocol hands out `len` bytes at `buf_ptr`,
        // writable (checked above) and contiguous, and keeps them where
        // they are (a bytearray cannot resize while exported) until `buf`
        // is released, which is after the read: nothing else in this call
        // touches them. A Python thread writing the same buffer meanwhile
        // races as it would with `os.readv`, never with our memory.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr().cast::<u8>(), len) };
        let n = self.with(py, move |f| {
            let mut done = 0;
            // Fill the buffer (a short count only at the end of the file),
            // as a regular file's readinto does.
            while done < dst.len() {
                match f.read(&mut dst[done..])? {
                    0 => break,
                    n => done += n,
                }
            }
            Ok(done)
        });
        drop(buf);
        n
    }

    /// Writes `data` (any contiguous buffer); returns its length.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let buf = PyBuffer::<u8>::get(data)?;
        if !buf.is_c_contiguous() {
            return Err(PyBufferError::new_err("write needs a contiguous buffer"));
        }
        let len = buf.len_bytes();
        // SAFETY: as in `readinto`, the exported bytes stay put until `buf`
        // is released after the write; they are only read.
        let src = unsafe { std::slice::from_raw_parts(buf.buf_ptr().cast::<u8>(), len) };
        let r = self.with(py, move |f| f.write_all(src).map(|()| src.len()));
        drop(buf);
        r
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

    /// Stores what is buffered and saves the exNode.
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

    /// Closes the file: what is buffered is stored and the exNode saved;
    /// an error doing so is raised here.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let f = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        match f {
            None => Ok(()),
            Some(f) => py.detach(|| f.close()).map_err(|e| from_io(py, e)),
        }
    }

    /// Bytes in the file, with what is buffered.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |f| f.metadata().map(|m| m.len))
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner
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
