//! LoRS errors as the exceptions of `lors.errors` (defined in Python, so
//! they pickle, document and type-check as ordinary classes): the message a
//! person reads, and what a program decides on — the IBP status, the depot,
//! the bytes of the file.

use std::io;

use pyo3::exceptions::{PyOSError, PyPermissionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A class of `lors.errors`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// `LorsError`: the base.
    Lors,
    /// `DepotError`: a depot refused or failed.
    Depot,
    /// `UnreadableError`: bytes no replica (or stripe) can give.
    Unreadable,
    /// `NoDepotsError`: nowhere to put the data.
    NoDepots,
    /// `ExNodeError`: an `.xnd` that cannot be read as an exNode.
    ExNode,
}

impl Kind {
    fn class(self) -> &'static str {
        match self {
            Kind::Lors => "LorsError",
            Kind::Depot => "DepotError",
            Kind::Unreadable => "UnreadableError",
            Kind::NoDepots => "NoDepotsError",
            Kind::ExNode => "ExNodeError",
        }
    }
}

/// What an exception carries besides its message.
#[derive(Debug, Default)]
pub(crate) struct Detail {
    pub status: Option<lors_ibp::StatusCode>,
    pub depot: Option<String>,
    pub range: Option<(u64, u64)>,
    pub errno: Option<i32>,
    /// The `.xnd` (or local file) concerned, as `OSError.filename`.
    pub filename: Option<String>,
}

/// An exception of class `kind` with `message` and `d`.
pub(crate) fn raise(py: Python<'_>, kind: Kind, message: String, d: Detail) -> PyErr {
    let made = || -> PyResult<PyErr> {
        let class = py.import("lors.errors")?.getattr(kind.class())?;
        let kw = PyDict::new(py);
        kw.set_item("status", d.status.map(lors_ibp::StatusCode::code))?;
        kw.set_item("status_name", d.status.and_then(lors_ibp::StatusCode::name))?;
        kw.set_item("depot", d.depot)?;
        kw.set_item("range", d.range)?;
        kw.set_item("errno", d.errno)?;
        kw.set_item("filename", d.filename)?;
        Ok(PyErr::from_value(class.call((message,), Some(&kw))?))
    };
    made().unwrap_or_else(|e| e)
}

/// `e` with its sources, as `anyhow` prints `{:#}`.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        let text = c.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        next = c.source();
    }
    s
}

fn kind_of(e: &lors::Error) -> Kind {
    use lors::Error as E;
    match e {
        E::NoDepots | E::NotEnoughDepots { .. } | E::NotEnoughDepotsForStripe { .. } => {
            Kind::NoDepots
        }
        E::Unreadable { .. } | E::StripesLost { .. } => Kind::Unreadable,
        E::Store { .. } | E::Ibp(_) => Kind::Depot,
        E::Abandoned { cause, .. } => kind_of(cause),
        _ => Kind::Lors,
    }
}

/// A local error as Python's `OSError(errno, message, filename)`, which
/// Python makes the subclass of its errno (`FileNotFoundError` for
/// `ENOENT`, …). A file that cannot be written because it is read-only
/// (`EROFS`: a share, an erasure-coded file) is a `PermissionError`.
pub(crate) fn os_error(errno: i32, message: String, filename: Option<&str>) -> PyErr {
    let args = (errno, message, filename.map(str::to_owned));
    if errno == libc::EROFS {
        return PyPermissionError::new_err(args);
    }
    PyOSError::new_err(args)
}

/// A LoRS error as its exception, about the file `filename`. Local file
/// errors are the `OSError`s Python has for their errno
/// (`FileNotFoundError`, `PermissionError`, …).
pub(crate) fn from_lors(py: Python<'_>, e: &lors::Error, filename: Option<&str>) -> PyErr {
    match e {
        lors::Error::Io { source, .. } => {
            return os_error(lors::xio::errno(source), chain(e), filename);
        }
        lors::Error::Xnd(x) => return from_xnd(py, x),
        _ => {}
    }
    let d = Detail {
        status: e.status(),
        depot: e.depot().map(str::to_owned),
        range: e.range().map(|r| (r.start, r.end)),
        errno: None,
        filename: filename.map(str::to_owned),
    };
    raise(py, kind_of(e), chain(e), d)
}

/// An exNode file's error: missing is `FileNotFoundError`, unreadable as an
/// exNode `ExNodeError`; `filename` is the `.xnd`.
pub(crate) fn from_xnd(py: Python<'_>, e: &lors::xnd::XndError) -> PyErr {
    use lors::xnd::XndError as X;
    let path = match e {
        X::Read { path, .. }
        | X::Write { path, .. }
        | X::TooLarge { path, .. }
        | X::Parse { path, .. } => Some(path.display().to_string()),
        _ => None,
    };
    match e {
        X::Read { source, .. } | X::Write { source, .. } => {
            os_error(lors::xio::errno(source), chain(e), path.as_deref())
        }
        _ => raise(
            py,
            Kind::ExNode,
            chain(e),
            Detail {
                errno: Some(libc::EINVAL),
                filename: path,
                ..Detail::default()
            },
        ),
    }
}

/// An xio error on the file `filename`: the LoRS error inside it as its
/// exception (with the `errno` a program would see); no depots to write
/// to as `NoDepotsError` (`ENOSPC`); else the `OSError` of its errno.
pub(crate) fn from_io(py: Python<'_>, e: io::Error, filename: Option<&str>) -> PyErr {
    let errno = lors::xio::errno(&e);
    if let Some(inner) = e.get_ref() {
        if let Some(le) = inner.downcast_ref::<lors::Error>() {
            let err = from_lors(py, le, filename);
            if matches!(le, lors::Error::Io { .. }) {
                return err;
            }
            let _ = err.value(py).setattr("errno", errno);
            return err;
        }
        if let Some(xe) = inner.downcast_ref::<lors::xnd::XndError>() {
            return from_xnd(py, xe);
        }
    }
    let d = || Detail {
        errno: Some(errno),
        filename: filename.map(str::to_owned),
        ..Detail::default()
    };
    match e.kind() {
        io::ErrorKind::InvalidInput => PyValueError::new_err(e.to_string()),
        io::ErrorKind::StorageFull => raise(py, Kind::NoDepots, e.to_string(), d()),
        io::ErrorKind::Other | io::ErrorKind::TimedOut if e.raw_os_error().is_none() => {
            raise(py, Kind::Lors, e.to_string(), d())
        }
        _ => os_error(errno, e.to_string(), filename),
    }
}
