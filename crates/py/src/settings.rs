//! Keyword arguments as settings: the same precedence as the CLI, with the
//! keywords in the place of the flags — keyword > `lors://` URI >
//! environment (`LORS_*`, `LBONE_*`) > `~/.xndrc` > default.

use std::time::Duration;

use lors::directory::{DirectoryError, Found};
use lors::settings::{Env, Layer, LboneAt, Settings};
use lors::uri::ExnodeRef;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::{Detail, Kind, raise};
use crate::run::wait;

/// The keywords every call that places or reaches data takes.
#[derive(Debug, Default, Clone)]
pub(crate) struct Opts {
    pub depots: Vec<String>,
    pub lbone: Option<String>,
    pub location: Option<String>,
    pub copies: Option<usize>,
    pub ec: Option<String>,
    pub block_size: Option<u64>,
    pub threads: Option<usize>,
    pub duration: Option<Duration>,
    pub timeout: Option<Duration>,
}

impl Opts {
    /// The settings these keywords resolve to, for the exNode `uri` names.
    pub(crate) fn settings(&self, uri: Option<&ExnodeRef>) -> PyResult<Settings> {
        let ec = match &self.ec {
            Some(v) => Some(lors::uri::parse_ec(v).map_err(|e| bad("ec", v, &e))?),
            // Copies asked for say copies, whatever a lower source's EC.
            None => self.copies.map(|_| None),
        };
        let flags = Layer {
            timeout: self.timeout,
            block_size: self.block_size,
            threads: self.threads,
            copies: self.copies,
            ec,
            duration: self.duration,
            location: self.location.clone(),
            lbone: self.lbone.clone().map(LboneAt::Named),
            ..Layer::default()
        };
        let rc = lors::xndrc::load(None).map_err(PyValueError::new_err)?;
        Settings::resolve(flags, uri, &Env::process(), rc)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The keywords of a call that places copies of existing blocks
    /// (`augment`, `copy`): where, for how long, and the timeout.
    pub(crate) fn placing(
        depots: Option<Bound<'_, PyAny>>,
        lbone: Option<String>,
        location: Option<String>,
        duration: Option<Bound<'_, PyAny>>,
        timeout: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Opts> {
        Ok(Opts {
            depots: self::depots(depots.as_ref())?,
            lbone,
            location,
            duration: self::duration("duration", duration.as_ref())?,
            timeout: self::duration("timeout", timeout.as_ref())?,
            ..Opts::default()
        })
    }

    /// The settings of a call whose only setting keyword is `timeout=`.
    pub(crate) fn timeout_only(
        timeout: Option<&Bound<'_, PyAny>>,
        uri: Option<&ExnodeRef>,
    ) -> PyResult<Settings> {
        Opts {
            timeout: duration("timeout", timeout)?,
            ..Opts::default()
        }
        .settings(uri)
    }

    /// Depots for `spread` distinct places of allocations of `bytes`: the
    /// `depots` keyword, else the L-Bone, else `~/.xndrc`.
    pub(crate) fn find(
        &self,
        py: Python<'_>,
        s: &Settings,
        spread: usize,
        bytes: u64,
        exclude: Vec<String>,
    ) -> PyResult<Found> {
        let (s2, explicit) = (s.clone(), self.depots.clone());
        let found = wait(py, async move {
            let named = s2.directory().await;
            s2.find_depots(&explicit, named, spread, bytes, exclude)
                .await
        })?;
        found.map_err(|e| {
            let text = match e {
                DirectoryError::NoSource => "no depots: give depots=[\"HOST:PORT\", …], lbone=\"HOST|URL\" (or LBONE_SERVER), or DEPOT lines in ~/.xndrc".to_owned(),
                e => crate::errors::chain(&e),
            };
            raise(py, Kind::NoDepots, text, Detail::default())
        })
    }
}

fn bad(name: &str, v: &str, why: &str) -> PyErr {
    PyValueError::new_err(format!("{name}={v:?}: {why}"))
}

/// `depots=`: a list of `HOST[:PORT]` (or one string, comma-separated).
pub(crate) fn depots(v: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = match v.extract::<String>() {
        Ok(s) => s.split(',').map(str::to_owned).collect(),
        Err(_) => v.extract()?,
    };
    (names.iter())
        .filter(|n| !n.trim().is_empty())
        .map(|n| lors::directory::depot_address(n).map_err(|e| bad("depots", n, &e)))
        .collect()
}

/// A size keyword: bytes as an `int`, or a string with a unit (`"10M"`).
pub(crate) fn size(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if let Ok(s) = v.extract::<String>() {
        return lors_ibp::units::parse_block_size(&s)
            .map(Some)
            .map_err(|e| bad(name, &s, &e));
    }
    let n: i128 = v.extract()?;
    u64::try_from(n)
        .ok()
        .filter(|&n| n > 0)
        .map(Some)
        .ok_or_else(|| bad(name, &n.to_string(), "give a positive number of bytes"))
}

/// A duration keyword: seconds as a number, or a string with a unit
/// (`"2h"`, `"7d"`).
pub(crate) fn duration(name: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if let Ok(s) = v.extract::<String>() {
        return lors_ibp::units::parse_duration(&s)
            .map(Some)
            .map_err(|e| bad(name, &s, &e));
    }
    let secs: f64 = v.extract()?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .map(Some)
        .ok_or_else(|| bad(name, &secs.to_string(), "give a positive number of seconds"))
}

/// An exNode argument given as a path or a `lors://` URI. In Python the
/// path of a URI is absolute, as fsspec reads URLs: `lors:///data/x.xnd`
/// is `/data/x.xnd` (the command-line tools, following the original
/// libxio, read it as the relative `data/x.xnd`); `lors://HOST/PATH`
/// places new blocks through the L-Bone at `HOST`.
pub(crate) fn exnode_ref(target: &str) -> PyResult<ExnodeRef> {
    let Some(rest) = target.strip_prefix("lors://") else {
        return ExnodeRef::parse(target).map_err(|e| bad("exnode", target, &e));
    };
    if !rest.contains('/') {
        return Err(PyValueError::new_err(format!(
            "{target:?} names no file: write lors:///PATH (three slashes) for the exNode at /PATH, or lors://HOST/PATH to place new blocks through the L-Bone at HOST"
        )));
    }
    let mut r = ExnodeRef::parse(target).map_err(|e| bad("exnode", target, &e))?;
    r.path = std::path::Path::new("/").join(&r.path);
    Ok(r)
}
