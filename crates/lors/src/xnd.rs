//! `.xnd` files on disk: read with a size limit, saved atomically (a
//! reader or a crash sees the old file or the new one, never half of one),
//! private (0600) while they hold write or manage capabilities.
//!
//! ```no_run
//! let x = lors::xnd::load("run42.xnd".as_ref())?;
//! lors::xnd::save("copy.xnd".as_ref(), &x)?;
//! # Ok::<(), lors::xnd::XndError>(())
//! ```

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use lors_exnode::model::Metadata;
use lors_exnode::{ExNode, xml};

/// The largest `.xnd` file read (an exNode of a million mappings is ~500 MB;
/// this is far beyond any real one and still bounded).
pub const MAX_XND_BYTES: u64 = 1 << 30;

/// Why an `.xnd` file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XndError {
    /// Reading failed.
    #[error("reading {}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_XND_BYTES`].
    #[error("{} is {size} bytes, more than any exNode ({MAX_XND_BYTES} at most)", .path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// The file is not a valid exNode.
    #[error("parsing exNode {}", .path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: lors_exnode::xml::XmlError,
    },
    /// Writing failed; the old file, if any, is untouched.
    #[error("writing {}", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Reads and parses an exNode file. Only a regular file is read: a FIFO
/// would block the reader for ever and a device (`/dev/zero`) never end,
/// so both are refused before a byte is read (the open does not wait for
/// a FIFO's writer), and the read stops at [`MAX_XND_BYTES`] whatever the
/// file claims.
pub fn load(path: &Path) -> Result<ExNode, XndError> {
    let bytes = read_regular(path, MAX_XND_BYTES)?;
    xml::parse(&bytes).map_err(|source| XndError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// The bytes of the regular file at `path`, at most `limit` of them
/// (more is [`XndError::TooLarge`]). Symbolic links are followed: a user
/// names a link on purpose; [`crate::keep`] refuses those that leave its
/// directory before it gets here.
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, XndError> {
    use std::io::Read as _;
    let read = |source| XndError::Read {
        path: path.to_owned(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read)?;
    let meta = f.metadata().map_err(read)?;
    if !meta.is_file() {
        return Err(read(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a directory, FIFO, socket or device is never read as an exNode)",
        )));
    }
    if meta.len() > limit {
        return Err(XndError::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // A file that grows while it is read still stops at the limit.
    f.take(limit + 1).read_to_end(&mut bytes).map_err(read)?;
    if bytes.len() as u64 > limit {
        return Err(XndError::TooLarge {
            path: path.to_owned(),
            size: bytes.len() as u64,
        });
    }
    Ok(bytes)
}

/// Writes an exNode atomically: a temporary file beside it, fsync, rename,
/// fsync of the directory. Mode 0600 when it holds write or manage
/// capabilities (it is then a secret), else 0644.
pub fn save(path: &Path, x: &ExNode) -> Result<(), XndError> {
    let mode = if x.holds_secrets() { 0o600 } else { 0o644 };
    // Where it is saved, for a copy to find its original by.
    let at = (path.parent().filter(|p| !p.as_os_str().is_empty()))
        .unwrap_or(Path::new("."))
        .canonicalize()
        .map(|d| d.join(path.file_name().unwrap_or_default()))
        .unwrap_or_else(|_| path.to_owned());
    // The file's line: kept by every save of it (and by copies of it), new
    // for a new exNode.
    let lineage = match Identity::of(x) {
        Some(id) => id.lineage,
        None => new_lineage(&at),
    };
    save_with(path, mode, |f| {
        let mut x = x.clone();
        let id = format!("{}:{lineage}:{}", identity_of(f)?, at.display());
        x.set_meta(Metadata::string(IDENTITY_META, &id));
        Ok(xml::write(&x).into_bytes())
    })
}

/// What [`IDENTITY_META`] records.
struct Identity {
    /// `DEV:INO` of the file saved.
    file: String,
    lineage: String,
    path: PathBuf,
}

impl Identity {
    fn of(x: &ExNode) -> Option<Identity> {
        let Some(lors_exnode::model::Value::String(saved)) = x.meta(IDENTITY_META) else {
            return None;
        };
        let mut parts = saved.splitn(4, ':');
        let (dev, ino, lineage) = (parts.next()?, parts.next()?, parts.next()?);
        Some(Identity {
            file: format!("{dev}:{ino}"),
            lineage: lineage.to_owned(),
            path: PathBuf::from(parts.next().unwrap_or("")),
        })
    }
}

/// A new exNode's line: unique without any coordination.
fn new_lineage(at: &Path) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos}:{}:{}", std::process::id(), at.display());
    blake3::hash(seed.as_bytes()).to_hex()[..16].to_owned()
}

/// The exNode metadata item naming the file it was saved as: device and
/// inode, the file's line (kept by its every save) and its path
/// (`DEV:INO:LINE:PATH`). A copy made outside lors (`cp`, `rsync`, `tar`)
/// carries its original's, and is known by it ([`outside_copy`]).
pub const IDENTITY_META: &str = "lors_file";

/// Device and inode of an open file, as [`IDENTITY_META`] records them.
fn identity_of(f: &std::fs::File) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    let m = f.metadata()?;
    Ok(format!("{}:{}", m.dev(), m.ino()))
}

/// What [`outside_copy`] found of a copy made outside lors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copied {
    /// Its original is still where it was saved (as it was, or saved
    /// since by lors: the same line): two files name the same
    /// allocations, and the copy holds no reference of its own.
    BesideOriginal,
    /// No exNode of its line is where its original was saved (moved to
    /// another file system, removed without `lors rm`, replaced by another
    /// upload, restored from a backup): the copy is the one name left,
    /// and the original's references are its own.
    OriginalGone,
}

/// Whether `x`, read from `path`, is a copy of an exNode made outside
/// lors — it records being saved as another file — and whether its
/// original is still there. `None` for an exNode saved as `path`, or one
/// that records nothing (another tool's, or older: taken as an original).
pub fn outside_copy(path: &Path, x: &ExNode) -> Option<Copied> {
    let id = Identity::of(x)?;
    let of = |p: &Path| std::fs::File::open(p).and_then(|f| identity_of(&f)).ok();
    if of(path)? == id.file {
        return None;
    }
    let original = load(&id.path).ok().and_then(|o| Identity::of(&o));
    Some(match original {
        Some(o) if o.lineage == id.lineage && of(&id.path).is_some_and(|f| f == o.file) => {
            Copied::BesideOriginal
        }
        _ => Copied::OriginalGone,
    })
}

/// Writes `bytes` to `path` atomically with `mode`: a new file beside it
/// (made exclusively, so never through a link planted under its name),
/// fsync, rename over `path` (a link there is replaced, its target never
/// written), fsync of the directory. A device or FIFO at `path` is refused.
pub fn save_bytes(path: &Path, bytes: &[u8], mode: u32) -> Result<(), XndError> {
    save_with(path, mode, |_| Ok(bytes.to_vec()))
}

/// [`save_bytes`] of what `bytes` makes, given the new file before it is
/// written.
fn save_with(
    path: &Path,
    mode: u32,
    bytes: impl FnOnce(&std::fs::File) -> std::io::Result<Vec<u8>>,
) -> Result<(), XndError> {
    let fail = |source| XndError::Write {
        path: path.to_owned(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| fail(std::io::Error::other("the path names no file")))?;
    // The save renames a new file over the old: over a device or a FIFO
    // (`-o /dev/null`) that would replace the node itself, for everyone.
    if let Ok(m) = std::fs::metadata(path)
        && !m.is_file()
    {
        return Err(fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file: an exNode is saved by replacing the file, which this would destroy",
        )));
    }
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(fail)?;
    let res = (|| {
        // The file keeps its owner: a mount or a root-run keeper saving
        // a user's exNode does not take it over. (Without the privilege
        // to give it away the saver owns it, as before.)
        if let Ok(m) = std::fs::metadata(path) {
            use std::os::unix::fs::MetadataExt as _;
            let _ = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()));
        }
        f.write_all(&bytes(&f)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(fail)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_fifo_or_device_is_refused_at_once_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("0.xnd");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            // No writer ever opens it: a blocking open would wait for ever.
            let e = load(&fifo).unwrap_err();
            assert!(format!("{e:?}").contains("not a regular file"), "{e:?}");
        }
        let e = load(Path::new("/dev/zero")).unwrap_err();
        assert!(format!("{e:?}").contains("not a regular file"), "{e:?}");
        let link = dir.path().join("zero.xnd");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(load(&link).is_err());
        let big = dir.path().join("big.xnd");
        std::fs::write(&big, vec![b' '; 100]).unwrap();
        assert!(matches!(
            read_regular(&big, 99),
            Err(XndError::TooLarge { size: 100, .. })
        ));
    }

    #[test]
    fn a_device_or_fifo_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            return; // no mkfifo here
        }
        let e = save(&fifo, &ExNode::default()).unwrap_err();
        assert!(format!("{e:?}").contains("not a regular file"), "{e:?}");
        use std::os::unix::fs::FileTypeExt as _;
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }

    #[test]
    fn saved_files_are_whole_private_when_secret_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.xnd");
        let mut x = ExNode::default();
        save(&path, &x).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o644, "no capabilities: readable by all");
        assert_eq!(load(&path).unwrap().mappings.len(), 0);

        let cap = "ibp://d1:6714/1#key/1/";
        let cap = |kind| lors_ibp::Capability::parse(&format!("{cap}{kind}")).unwrap();
        x.mappings.push(lors_exnode::Mapping {
            logical_length: 1,
            alloc_length: 1,
            read: Some(cap("READ")),
            write: Some(cap("WRITE")),
            ..Default::default()
        });
        save(&path, &x).unwrap();
        assert_eq!(mode(&path), 0o600, "a write capability is a secret");
        assert_eq!(load(&path).unwrap().mappings.len(), 1);
        // Nothing left behind but the file itself.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);

        // Into a directory that does not exist: an error naming the file,
        // and nothing written.
        let e = save(&dir.path().join("no/such/b.xnd"), &x).unwrap_err();
        assert!(e.to_string().contains("b.xnd"), "{e}");
        let e = load(&dir.path().join("missing.xnd")).unwrap_err();
        assert!(matches!(e, XndError::Read { .. }), "{e}");
        std::fs::write(dir.path().join("bad.xnd"), "<exnode").unwrap();
        let e = load(&dir.path().join("bad.xnd")).unwrap_err();
        assert!(matches!(e, XndError::Parse { .. }), "{e}");
    }
}
