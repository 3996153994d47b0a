//! The native half of the Python package `lors` (`lors._lors`), built by
//! maturin: exNodes, upload, download, augment, trim, refresh and xio
//! files over the `lors` crate. The Python half (`python/src/lors`) adds
//! the buffered file objects of `lors.open`, the exceptions and the fsspec
//! filesystem.
//!
//! Every transfer runs on the `lors` runtime with the GIL released; the
//! calling thread wakes every 100 ms to report progress and notice Ctrl-C
//! (see `run::block_on`).

mod errors;
mod exnode;
mod file;
mod ops;
mod run;
mod settings;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _lors(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<exnode::PyExNode>()?;
    m.add_class::<exnode::PyMapping>()?;
    m.add_class::<file::File>()?;
    m.add_function(wrap_pyfunction!(ops::upload, m)?)?;
    m.add_function(wrap_pyfunction!(ops::download, m)?)?;
    m.add_function(wrap_pyfunction!(ops::read_range, m)?)?;
    m.add_function(wrap_pyfunction!(ops::read_ranges, m)?)?;
    m.add_function(wrap_pyfunction!(ops::augment, m)?)?;
    m.add_function(wrap_pyfunction!(ops::trim, m)?)?;
    m.add_function(wrap_pyfunction!(ops::refresh, m)?)?;
    m.add_function(wrap_pyfunction!(ops::remove, m)?)?;
    m.add_function(wrap_pyfunction!(ops::copy, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
