//! LoRS errors as the exceptions of `lors.errors` (defined in Python, so
//! they pickle, document and type-check as ordinary classes): the message a
//! person reads, and what a program decides on — the IBP status, the depot,
//! the bytes of the file.

use std::io;

use pyo3::exceptions::{PyFileExistsError, PyFileNotFoundError, PyValueError};
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

/// A LoRS error as its exception. Local file errors stay the `OSError`s
/// Python has for them (`FileNotFoundError`, `PermissionError`, …).
pub(crate) fn from_lors(py: Python<'_>, e: &lors::Error) -> PyErr {
    if let lors::Error::Io { source, .. } = e {
        return PyErr::from(io::Error::new(source.kind(), chain(e)));
    }
    let d = Detail {
        status: e.status(),
        depot: e.depot().map(str::to_owned),
        range: e.range().map(|r| (r.start, r.end)),
        errno: None,
    };
    raise(py, kind_of(e), chain(e), d)
}

/// An exNode file's error: missing is `FileNotFoundError`, unreadable as an
/// exNode `ExNodeError`.
pub(crate) fn from_xnd(py: Python<'_>, e: &lors::xnd::XndError) -> PyErr {
    use lors::xnd::XndError as X;
    match e {
        X::Read { source, .. } | X::Write { source, .. } => {
            PyErr::from(io::Error::new(source.kind(), chain(e)))
        }
        _ => raise(py, Kind::ExNode, chain(e), Detail::default()),
    }
}

/// An xio error: the LoRS error inside it as its exception (with the
/// `errno` a program would see), else the `OSError` of its kind.
pub(crate) fn from_io(py: Python<'_>, e: io::Error) -> PyErr {
    let errno = lors::xio::errno(&e);
    if let Some(inner) = e.get_ref() {
        if let Some(le) = inner.downcast_ref::<lors::Error>() {
            let err = from_lors(py, le);
            let _ = err.value(py).setattr("errno", errno);
            return err;
        }
        if let Some(xe) = inner.downcast_ref::<lors::xnd::XndError>() {
            return from_xnd(py, xe);
        }
    }
    match e.kind() {
        io::ErrorKind::NotFound => PyFileNotFoundError::new_err(e.to_string()),
        io::ErrorKind::AlreadyExists => PyFileExistsError::new_err(e.to_string()),
        io::ErrorKind::InvalidInput => PyValueError::new_err(e.to_string()),
        _ => PyErr::from(e),
    }
}
