//! What a file system keeps beside the data: size, times, permission bits,
//! kept in the exNode's metadata; and the stamp that tells one saved
//! version of an `.xnd` from another.

use std::io::{self, ErrorKind};
use std::path::Path;
use std::time::SystemTime;

use lors_exnode::ExNode;

use super::errno::xnd_error;
use crate::uri::ExnodeRef;
use crate::xnd;

/// What tells one version of an `.xnd` file from another: saves replace
/// the file (a new inode) atomically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

pub(super) fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        ino: m.ino(),
        len: m.len(),
        modified: m.modified().ok(),
    })
}

/// What [`File::metadata`](super::File::metadata) and [`stat`] report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// Logical size in bytes.
    pub len: u64,
    /// Last data change: the last write through this handle, else the
    /// `.xnd` file's modification time.
    pub modified: SystemTime,
    /// The `.xnd` file's access time.
    pub accessed: SystemTime,
    /// Permission bits (`st_mode & 0o7777`): the `.xnd` file's, without the
    /// write bits when the exNode holds no write capability.
    pub permissions: u32,
    /// No write capability: opening for writing fails with `EROFS`.
    pub readonly: bool,
    /// The permission bits were set through libxio or a mount (`chmod`, a
    /// created file's mode), not taken from the `.xnd` file.
    pub mode_recorded: bool,
}

/// The metadata of the exNode at `target` (a path or `lors://` URI),
/// without opening it for transfers.
pub fn stat(target: &str) -> io::Result<Metadata> {
    let r = ExnodeRef::parse(target).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
    let x = xnd::load(&r.path).map_err(xnd_error)?;
    metadata_of(&r.path, &x, x.logical_size(), None)
}

/// exNode metadata for what a file system keeps beside the data: the
/// modification and access times (nanoseconds since the epoch) and the
/// permission bits a program set (`touch`, `chmod`, `tar`, `rsync -a`).
/// The `.xnd` file itself stays owner-only: it holds keys.
const MTIME_META: &str = "lors_mtime_ns";
const ATIME_META: &str = "lors_atime_ns";
const MODE_META: &str = "lors_mode";

fn meta_int(x: &ExNode, name: &str) -> Option<i64> {
    match x.meta(name) {
        Some(lors_exnode::Value::Integer(n)) => Some(*n),
        _ => None,
    }
}

fn time_of(ns: i64) -> Option<SystemTime> {
    let ns = u64::try_from(ns).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_nanos(ns))
}

fn ns_of(t: SystemTime) -> i64 {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Records in `x` the times and permission bits given (`None` keeps what
/// is there).
pub(super) fn set_attrs(
    x: &mut ExNode,
    modified: Option<SystemTime>,
    accessed: Option<SystemTime>,
    mode: Option<u32>,
) {
    use lors_exnode::Metadata as M;
    if let Some(t) = modified {
        x.set_meta(M::integer(MTIME_META, ns_of(t)));
    }
    if let Some(t) = accessed {
        x.set_meta(M::integer(ATIME_META, ns_of(t)));
    }
    if let Some(m) = mode {
        x.set_meta(M::integer(MODE_META, i64::from(m & 0o7777)));
    }
}

pub(super) fn metadata_of(
    path: &Path,
    x: &ExNode,
    len: u64,
    modified: Option<SystemTime>,
) -> io::Result<Metadata> {
    use std::os::unix::fs::PermissionsExt as _;
    let fs = std::fs::metadata(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let readonly = x.mappings.iter().any(|m| m.write.is_none());
    let recorded = |name| meta_int(x, name).and_then(time_of);
    let recorded_mode = meta_int(x, MODE_META).and_then(|m| u32::try_from(m).ok());
    let mut permissions = recorded_mode.unwrap_or(fs.permissions().mode()) & 0o7777;
    if readonly {
        permissions &= !0o222;
    }
    Ok(Metadata {
        len,
        modified: modified
            .or(recorded(MTIME_META))
            .or(fs.modified().ok())
            .unwrap_or(SystemTime::UNIX_EPOCH),
        accessed: (recorded(ATIME_META))
            .or(fs.accessed().ok())
            .unwrap_or(SystemTime::UNIX_EPOCH),
        permissions,
        readonly,
        mode_recorded: recorded_mode.is_some(),
    })
}

/// Sets the modification and access times and permission bits of the
/// exNode at `target` (`None` keeps one), as `utimensat` and `chmod` do
/// for a file: kept in the exNode, so they survive a remount.
pub fn set_attributes(
    target: &str,
    modified: Option<SystemTime>,
    accessed: Option<SystemTime>,
    mode: Option<u32>,
) -> io::Result<()> {
    let r = ExnodeRef::parse(target).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
    // Read, changed and saved under the exNode's lock: a route or a keeper
    // saving meanwhile is never written over.
    let _lock = crate::commit::Lock::take(&r.path, super::SAVE_WAIT)
        .map_err(|e| io::Error::new(ErrorKind::ResourceBusy, e.to_string()))?;
    let mut x = xnd::load(&r.path).map_err(xnd_error)?;
    set_attrs(&mut x, modified, accessed, mode);
    xnd::save(&r.path, &x).map_err(xnd_error)
}
