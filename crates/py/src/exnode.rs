//! `lors.ExNode` and `lors.Mapping`: an exNode as Python sees it.

use std::path::PathBuf;
use std::sync::Arc;

use lors_exnode::erasure::Erasure;
use lors_exnode::{ExNode, Mapping};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{Detail, Kind, from_xnd, raise};
use crate::settings::{Opts, exnode_ref};

/// A file on depots: where its blocks are, under which capabilities.
///
/// Load one with `ExNode.load("run42.xnd")`; `lors.upload` returns one.
#[pyclass(name = "ExNode", module = "lors", frozen)]
pub(crate) struct PyExNode {
    pub(crate) x: Arc<ExNode>,
    /// The `.xnd` file it was loaded from or last saved to.
    pub(crate) path: Option<PathBuf>,
}

impl PyExNode {
    pub(crate) fn new(x: ExNode, path: Option<PathBuf>) -> Self {
        PyExNode {
            x: Arc::new(x),
            path,
        }
    }
}

/// One block of the file in one allocation on one depot.
#[pyclass(name = "Mapping", module = "lors", frozen, get_all)]
pub(crate) struct PyMapping {
    /// First byte of the file it holds.
    offset: u64,
    /// Bytes of the file it holds.
    length: u64,
    /// `host:port` of its depot.
    depot: Option<String>,
    /// Bytes stored in the allocation (with checksums, padding, compression).
    alloc_length: u64,
    /// Of an erasure-coded file: the stripe, and the block's index in it.
    stripe: Option<u64>,
    /// Index in its stripe: below k a data block, else parity.
    index: Option<usize>,
    /// A parity block (never file data).
    parity: bool,
    /// It has a read capability.
    readable: bool,
    /// It has a write capability.
    writable: bool,
    /// It has a manage capability (refresh, trim).
    manageable: bool,
}

impl PyMapping {
    fn of(m: &Mapping, parity: bool) -> Self {
        let shard = m.shard();
        PyMapping {
            offset: m.exnode_offset,
            length: m.logical_length,
            depot: m.depot(),
            alloc_length: m.alloc_length,
            stripe: shard.map(|s| s.0),
            index: shard.map(|s| s.1),
            parity,
            readable: m.read.is_some(),
            writable: m.write.is_some(),
            manageable: m.manage.is_some(),
        }
    }
}

#[pymethods]
impl PyMapping {
    fn __repr__(&self) -> String {
        let at = self.depot.as_deref().unwrap_or("?");
        match (self.stripe, self.index) {
            (Some(s), Some(i)) => format!(
                "Mapping(stripe={s}, index={i}, offset={}, length={}, depot={at:?})",
                self.offset, self.length
            ),
            _ => format!(
                "Mapping(offset={}, length={}, depot={at:?})",
                self.offset, self.length
            ),
        }
    }
}

#[pymethods]
impl PyExNode {
    /// Reads an `.xnd` file (a path or a `lors://` URI).
    #[staticmethod]
    fn load(py: Python<'_>, path: PathOrStr) -> PyResult<Self> {
        let r = exnode_ref(&path.0)?;
        let x = lors::xnd::load(&r.path).map_err(|e| from_xnd(py, &e))?;
        Ok(PyExNode::new(x, Some(r.path)))
    }

    /// An exNode from its XML text.
    #[staticmethod]
    fn from_xml(py: Python<'_>, text: &[u8]) -> PyResult<Self> {
        let x = lors_exnode::xml::parse(text).map_err(|e| {
            raise(
                py,
                Kind::ExNode,
                crate::errors::chain(&e),
                Detail::default(),
            )
        })?;
        Ok(PyExNode::new(x, None))
    }

    /// The XML text, as `.xnd` files hold it.
    fn to_xml(&self) -> String {
        lors_exnode::xml::write(&self.x)
    }

    /// Writes the exNode to `path`, atomically (readers see the old file
    /// or the new one); owner-only, as it holds the capabilities.
    fn save(&self, py: Python<'_>, path: PathOrStr) -> PyResult<()> {
        let r = exnode_ref(&path.0)?;
        lors::xnd::save(&r.path, &self.x).map_err(|e| from_xnd(py, &e))
    }

    /// Bytes in the file.
    #[getter]
    fn size(&self) -> u64 {
        self.x.logical_size()
    }

    /// The file's name as the exNode records it.
    #[getter]
    fn filename(&self) -> Option<String> {
        self.x.filename().map(str::to_owned)
    }

    /// The `.xnd` file it was loaded from or saved to by the call that made it.
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        self.path.clone()
    }

    /// The erasure code (`"6+3"`), or `None` for a replicated file.
    #[getter]
    fn ec(&self) -> Option<String> {
        erasure(&self.x).map(|e| e.scheme.to_string())
    }

    /// The file's blocks, each copy its own mapping (parity not included).
    #[getter]
    fn mappings(&self) -> Vec<PyMapping> {
        self.x
            .mappings
            .iter()
            .map(|m| PyMapping::of(m, false))
            .collect()
    }

    /// An erasure-coded file's parity blocks.
    #[getter]
    fn parity(&self) -> Vec<PyMapping> {
        self.x
            .parity
            .iter()
            .map(|m| PyMapping::of(m, true))
            .collect()
    }

    /// What the exNode says and, with `probe` (the default), what its
    /// depots say: live allocations, the bytes no live copy holds, and for
    /// an erasure-coded file each stripe's margin (losses it can still take).
    #[pyo3(signature = (probe = true, timeout = None))]
    fn stat<'py>(
        &self,
        py: Python<'py>,
        probe: bool,
        timeout: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let x = &self.x;
        let d = PyDict::new(py);
        d.set_item("size", x.logical_size())?;
        d.set_item("holes", x.hole_bytes())?;
        d.set_item("filename", x.filename())?;
        d.set_item("mappings", x.mappings.len())?;
        d.set_item("parity", x.parity.len())?;
        let copies: Vec<usize> = x.blocks().values().map(Vec::len).collect();
        d.set_item("copies", copies.iter().min().copied().unwrap_or(0))?;
        d.set_item("ec", self.ec())?;
        let mut per_depot = std::collections::BTreeMap::<String, usize>::new();
        for m in x.allocations() {
            *per_depot.entry(m.depot().unwrap_or_default()).or_default() += 1;
        }
        d.set_item("depots", per_depot)?;
        if !probe {
            return Ok(d);
        }
        let pool = crate::run::pool(&Opts::timeout_only(timeout.as_ref(), None)?, None);
        let shared = self.x.clone();
        let probes = crate::run::wait(
            py,
            async move { lors::manage::probe_all(&shared, &pool).await },
        )?;
        let live: Vec<bool> = probes.iter().map(lors::manage::Probe::is_live).collect();
        d.set_item("live", live.iter().filter(|&&l| l).count())?;
        let dead: Vec<(usize, String, String)> = (x.allocations().zip(&probes).enumerate())
            .filter(|(_, (_, p))| !p.is_live())
            .map(|(i, (m, p))| (i, m.depot().unwrap_or_default(), p.reason()))
            .collect();
        d.set_item("dead", dead)?;
        if let Some(e) = erasure(x) {
            let margins = e.margins(x, |i| live.get(i).copied().unwrap_or(false));
            let min = margins.iter().map(|m| m.margin).min();
            d.set_item("margin", min)?;
            let at = |f: fn(i64) -> bool| -> Vec<u64> {
                (margins.iter())
                    .filter(|m| f(m.margin))
                    .map(|m| m.stripe)
                    .collect()
            };
            d.set_item("stripes_at_margin_0", at(|m| m == 0))?;
            d.set_item("stripes_lost", at(|m| m < 0))?;
        }
        // An erasure record this version cannot read is read as replicas
        // (as `ec` says None). `[(start, end)]`, as the API has always given.
        let gaps = (lors_exnode::erasure::unreadable(x, &live))
            .map_or_else(|_| x.uncovered(&live), |u| u.bytes);
        let pairs: Vec<(u64, u64)> = gaps.iter().map(|r| (r.start, r.end)).collect();
        d.set_item("unreadable", pairs)?;
        Ok(d)
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.x.logical_size()).unwrap_or(usize::MAX)
    }

    fn __repr__(&self) -> String {
        let name = self.x.filename().unwrap_or("");
        let how = match erasure(&self.x) {
            Some(e) => format!("ec={:?}", e.scheme.to_string()),
            None => format!(
                "copies={}",
                (self.x.blocks().values().map(Vec::len).min()).unwrap_or(0)
            ),
        };
        format!(
            "ExNode({name:?}, size={}, mappings={}, {how})",
            self.x.logical_size(),
            self.x.mappings.len()
        )
    }
}

fn erasure(x: &ExNode) -> Option<Erasure> {
    Erasure::of(x).ok().flatten()
}

/// A path as `str` or `os.PathLike`.
pub(crate) struct PathOrStr(pub(crate) String);

impl<'py> FromPyObject<'_, 'py> for PathOrStr {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(s) = ob.extract::<String>() {
            return Ok(PathOrStr(s));
        }
        let p: PathBuf = ob.extract()?;
        Ok(PathOrStr(p.to_string_lossy().into_owned()))
    }
}

/// An exNode argument: an `ExNode`, or the path or `lors://` URI of an
/// `.xnd` file (loaded).
pub(crate) struct Target {
    pub(crate) x: Arc<ExNode>,
    /// Its file, where a change is saved unless told otherwise.
    pub(crate) path: Option<PathBuf>,
    pub(crate) uri: Option<lors::uri::ExnodeRef>,
}

impl Target {
    pub(crate) fn of(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<Target> {
        if let Ok(e) = v.cast::<PyExNode>() {
            let e = e.get();
            return Ok(Target {
                x: e.x.clone(),
                path: e.path.clone(),
                uri: None,
            });
        }
        let Ok(p) = v.extract::<PathOrStr>() else {
            return Err(PyTypeError::new_err(
                "give an ExNode, or the path or lors:// URI of an .xnd file",
            ));
        };
        let r = exnode_ref(&p.0)?;
        let x = lors::xnd::load(&r.path).map_err(|e| from_xnd(py, &e))?;
        Ok(Target {
            x: Arc::new(x),
            path: Some(r.path.clone()),
            uri: Some(r),
        })
    }
}
