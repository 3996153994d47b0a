//! How the exNode directory's tree maps onto the mount: inode numbers
//! for paths, and what a directory lists.
//!
//! A path on the mount is relative to the exNode directory. A
//! subdirectory is itself; a file `NAME` is `NAME.xnd` beside it. When a
//! directory `NAME` and an exNode `NAME.xnd` both exist, the directory is
//! what the mount shows (the exNode stays, reachable by the `lors` tools).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use fuser::FileType;

/// The root's inode number, as FUSE fixes it.
pub(crate) const ROOT: u64 = 1;
/// What an exNode file's name ends with.
pub(crate) const SUFFIX: &str = ".xnd";
/// The start of the names files unlinked while open are kept under, in the
/// root of the exNode directory, until their last holder closes them:
/// `.lors-unlinked.PID.N.xnd`. Neither listed nor found by name.
pub(crate) const UNLINKED: &str = ".lors-unlinked.";

/// Inode numbers of the paths the kernel was told of, both ways.
pub(crate) struct Nodes {
    by_path: HashMap<PathBuf, u64>,
    by_ino: HashMap<u64, PathBuf>,
    next: u64,
}

impl Default for Nodes {
    fn default() -> Nodes {
        let mut n = Nodes {
            by_path: HashMap::new(),
            by_ino: HashMap::new(),
            next: ROOT,
        };
        n.by_path.insert(PathBuf::new(), ROOT);
        n.by_ino.insert(ROOT, PathBuf::new());
        n
    }
}

impl Nodes {
    /// The inode number of `path`, given one now if it has none.
    pub(crate) fn ino(&mut self, path: &Path) -> u64 {
        if let Some(&i) = self.by_path.get(path) {
            return i;
        }
        self.next += 1;
        self.by_path.insert(path.to_owned(), self.next);
        self.by_ino.insert(self.next, path.to_owned());
        self.next
    }

    /// The inode number `path` has, if any.
    pub(crate) fn get(&self, path: &Path) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The path of `ino` (`None` once unlinked).
    pub(crate) fn path(&self, ino: u64) -> Option<&Path> {
        self.by_ino.get(&ino).map(PathBuf::as_path)
    }

    /// `path` and everything under it are gone.
    pub(crate) fn forget(&mut self, path: &Path) {
        let gone: Vec<PathBuf> = (self.by_path.keys())
            .filter(|p| p.starts_with(path))
            .cloned()
            .collect();
        for p in gone {
            if let Some(i) = self.by_path.remove(&p) {
                self.by_ino.remove(&i);
            }
        }
    }

    /// `from` (and, for a directory, everything under it) is now `to`;
    /// whatever was at `to` is gone. The inode numbers stay: open files
    /// and the kernel's cached names keep pointing at the same things.
    pub(crate) fn rename(&mut self, from: &Path, to: &Path) {
        self.forget(to);
        let moved: Vec<(PathBuf, u64)> = (self.by_path.iter())
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (p, i) in moved {
            self.by_path.remove(&p);
            let rest = p.strip_prefix(from).unwrap_or(Path::new(""));
            let q = if rest.as_os_str().is_empty() {
                to.to_owned()
            } else {
                to.join(rest)
            };
            self.by_path.insert(q.clone(), i);
            self.by_ino.insert(i, q);
        }
    }
}

/// The `.xnd` of the file at `path` under the exNode directory `dir`.
pub(crate) fn xnd(dir: &Path, path: &Path) -> PathBuf {
    let mut n = dir.join(path).into_os_string();
    n.push(SUFFIX);
    PathBuf::from(n)
}

/// What `path` is on the mount: a directory, a file, or nothing.
pub(crate) fn kind(dir: &Path, path: &Path) -> Option<FileType> {
    if path.as_os_str().is_empty() {
        return Some(FileType::Directory);
    }
    if hidden(path) {
        return None;
    }
    // Links are not followed: a link in the exNode directory leads out
    // of it, and the mount shows only what lies inside.
    if std::fs::symlink_metadata(dir.join(path)).is_ok_and(|m| m.is_dir()) {
        return Some(FileType::Directory);
    }
    let x = std::fs::symlink_metadata(xnd(dir, path));
    x.is_ok_and(|m| m.is_file())
        .then_some(FileType::RegularFile)
}

/// A name the mount keeps for itself (a file unlinked while open).
pub(crate) fn hidden(path: &Path) -> bool {
    path.parent() == Some(Path::new(""))
        && path.as_os_str().as_bytes().starts_with(UNLINKED.as_bytes())
}

/// The entries of the directory `rel` under `dir`: subdirectories, and
/// the files of its `.xnd` exNodes, sorted by name.
pub(crate) fn list(dir: &Path, rel: &Path) -> std::io::Result<Vec<(OsString, FileType)>> {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir.join(rel))? {
        let Ok(e) = e else { continue };
        let Ok(t) = e.file_type() else { continue };
        let n = e.file_name();
        if t.is_dir() {
            dirs.push(n);
            continue;
        }
        let b = n.as_bytes();
        if t.is_file()
            && b.len() > SUFFIX.len()
            && b.ends_with(SUFFIX.as_bytes())
            && !(rel.as_os_str().is_empty() && b.starts_with(UNLINKED.as_bytes()))
        {
            files.push(OsStr::from_bytes(&b[..b.len() - SUFFIX.len()]).to_owned());
        }
    }
    dirs.sort();
    // A directory hides an exNode of its name.
    files.retain(|f| dirs.binary_search(f).is_err());
    let mut all: Vec<(OsString, FileType)> = (dirs.into_iter())
        .map(|d| (d, FileType::Directory))
        .chain(files.into_iter().map(|f| (f, FileType::RegularFile)))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_directory_keeps_the_inode_numbers_under_it() {
        let mut n = Nodes::default();
        let a = n.ino(Path::new("a"));
        let f = n.ino(Path::new("a/f"));
        let g = n.ino(Path::new("a/b/g"));
        let ab = n.ino(Path::new("ab"));
        let gone = n.ino(Path::new("c/old"));
        n.rename(Path::new("a"), Path::new("c"));
        assert_eq!(n.get(Path::new("c")), Some(a));
        assert_eq!(n.get(Path::new("c/f")), Some(f));
        assert_eq!(n.path(g), Some(Path::new("c/b/g")));
        // Another name that merely starts alike is untouched.
        assert_eq!(n.path(ab), Some(Path::new("ab")));
        assert_eq!(n.path(gone), None);
        assert_eq!(n.get(Path::new("a/f")), None);
        assert_eq!(n.path(ROOT), Some(Path::new("")));
    }

    #[test]
    fn a_listing_shows_directories_and_exnodes_and_hides_the_rest() {
        let d = std::env::temp_dir().join(format!("lors-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        for f in [
            "a.xnd",
            "sub.xnd",
            "b.xnd.lock",
            "c.xnd.journal.1.0",
            ".lors-unlinked.1.0.xnd",
            ".xnd",
        ] {
            std::fs::write(d.join(f), b"").unwrap();
        }
        std::fs::write(d.join("sub/.lors-unlinked.2.0.xnd"), b"").unwrap();
        let names: Vec<String> = list(&d, Path::new(""))
            .unwrap()
            .into_iter()
            .map(|(n, _)| n.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a", "sub"]);
        assert_eq!(kind(&d, Path::new("sub")), Some(FileType::Directory));
        assert_eq!(kind(&d, Path::new(".lors-unlinked.1.0")), None);
        // Hidden in the root only: elsewhere such a name is a file.
        let sub = list(&d, Path::new("sub")).unwrap();
        assert_eq!(sub.len(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
