//! `OUT.partial`: what an upload (or augment, route, disseminate) that
//! could not finish leaves on the depots, recorded so nothing stays there
//! unnamed. An interrupted upload's record also says which input and
//! settings it was (its identity), so running the same upload again resumes
//! from it: the blocks it stored are not sent again.
//!
//! ```
//! use std::path::Path;
//! assert_eq!(
//!     lors::leftover::record_path(Path::new("run42.xnd")),
//!     Path::new("run42.xnd.partial")
//! );
//! ```

use std::path::{Path, PathBuf};

use lors_exnode::{ExNode, Mapping, Metadata, Value};

use crate::xnd::{self, XndError};

/// The metadata item that makes an `OUT.partial` a record an upload can
/// resume from, and its value: the input (size, modification time) and the
/// settings that decide the blocks.
const RESUME_META: &str = "lors_resume";

/// Per-mapping metadata of an allocation cut off mid-block: its bytes are
/// incomplete, it is recorded only so it can be freed.
const INCOMPLETE_META: &str = "lors_incomplete";

/// Where the record of `out` goes.
pub fn record_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// What makes two runs the same upload: the input file's size and
/// modification time, and the settings that decide its blocks (of these
/// `opts`).
pub fn identity(m: &std::fs::Metadata, opts: &crate::upload::UploadOptions) -> String {
    let (block, copies, e2e) = (opts.block_size, opts.copies, opts.e2e.is_some());
    // Sparse runs cut their blocks at the holes (records written before
    // holes existed are of dense runs, and say nothing).
    let sparse = match opts.sparse && opts.erasure.is_none() {
        true => " sparse",
        false => "",
    };
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    format!(
        "size={} mtime={}.{:09} block={block} copies={copies} e2e={e2e}{sparse}",
        m.len(),
        mtime.as_secs(),
        mtime.subsec_nanos()
    )
}

/// Why a record cannot be resumed from.
#[derive(Debug, thiserror::Error)]
pub enum LeftoverError {
    /// The record is of another input or other settings: it names
    /// allocations nothing else does, so it is not overwritten.
    #[error(
        "{path} records an interrupted upload of another version of this file or with other settings ({recorded}; now {now}): run it with those again to resume, or free what it names with `lors trim --decrement --allow-holes {trim}` and delete it"
    )]
    Foreign {
        /// The record.
        path: String,
        /// Its identity.
        recorded: String,
        /// This run's.
        now: String,
        /// The `lors trim` arguments that free what it names.
        trim: String,
    },
    /// The record could not be read.
    #[error(transparent)]
    Read(#[from] XndError),
}

/// The blocks an interrupted run of this same upload stored, from its
/// record at `path`; none when there is no record, or it is not one an
/// upload can resume from.
pub fn resumable(path: &Path, identity: &str) -> Result<Vec<Mapping>, LeftoverError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(Vec::new());
    }
    let x = xnd::load(path)?;
    let recorded = match x.meta(RESUME_META) {
        Some(Value::String(s)) => s.clone(),
        // A record of allocations a failed upload could not release.
        _ => return Ok(Vec::new()),
    };
    if recorded != identity {
        return Err(LeftoverError::Foreign {
            path: path.display().to_string(),
            recorded,
            now: identity.to_owned(),
            trim: trim_args(&x, path),
        });
    }
    Ok(x.mappings
        .into_iter()
        .filter(|m| !m.metadata.iter().any(|d| d.name == INCOMPLETE_META))
        .collect())
}

/// `--depot A --depot B … PATH`: the `lors trim` arguments that free every
/// allocation `x` (saved at `path`) names.
pub fn trim_args(x: &ExNode, path: &Path) -> String {
    trim_args_for(&depots(x), path)
}

/// [`trim_args`] for the record at `path` naming allocations on `depots`.
pub(crate) fn trim_args_for(depots: &[String], path: &Path) -> String {
    let mut s: Vec<String> = depots.iter().map(|d| format!("--depot {d}")).collect();
    s.push(path.display().to_string());
    s.join(" ")
}

/// The depots `x` names, sorted, once each.
pub fn depots(x: &ExNode) -> Vec<String> {
    let mut depots: Vec<String> = x.mappings.iter().filter_map(|m| m.depot()).collect();
    depots.sort();
    depots.dedup();
    depots
}

/// The record of an unfinished upload: the blocks `stored` whole, the
/// allocations `stranded` mid-block (marked incomplete: only to be freed)
/// and, for an upload that can be resumed, its `identity`.
pub fn record(stored: &ExNode, stranded: &ExNode, identity: Option<&str>) -> ExNode {
    let mut rec = stored.clone();
    for m in &stranded.mappings {
        let mut m = m.clone();
        m.metadata.push(Metadata::string(INCOMPLETE_META, "1"));
        rec.mappings.push(m);
    }
    if let Some(id) = identity {
        rec.set_meta(Metadata::string(RESUME_META, id));
    }
    rec
}

/// Records `stored` (whole blocks) and `stranded` (allocations cut off,
/// only to be freed) in the record at `path`, beside what it names
/// already: an earlier run's allocations are named nowhere else, so they
/// stay. With `identity`, running the same upload again resumes from the
/// record; an earlier entry is resumed from only when it was recorded
/// with that same identity, every other one is marked incomplete.
pub fn keep(
    path: &Path,
    stored: &ExNode,
    stranded: &ExNode,
    identity: Option<&str>,
) -> Result<(), XndError> {
    let mut rec = record(stored, stranded, identity);
    let old = existing(path)?;
    let same = identity.is_some()
        && matches!(old.meta(RESUME_META), Some(Value::String(s)) if Some(s.as_str()) == identity);
    let have: std::collections::HashSet<String> =
        rec.allocations().filter_map(crate::commit::key).collect();
    let earlier = |m: &Mapping| crate::commit::key(m).is_none_or(|k| !have.contains(&k));
    for mut m in old.mappings.into_iter().filter(earlier) {
        if !same && !m.metadata.iter().any(|d| d.name == INCOMPLETE_META) {
            m.metadata.push(Metadata::string(INCOMPLETE_META, "1"));
        }
        rec.mappings.push(m);
    }
    rec.parity.extend(old.parity.into_iter().filter(earlier));
    if rec.allocations().next().is_none() {
        return match std::fs::symlink_metadata(path) {
            Ok(_) => std::fs::remove_file(path).map_err(|source| XndError::Write {
                path: path.to_owned(),
                source,
            }),
            Err(_) => Ok(()),
        };
    }
    xnd::save(path, &rec)
}

/// What the record at `path` still names once the upload it resumed is
/// saved as `done`: the entries `done` names are dropped, the record stops
/// being one to resume from, and the allocations left that no save is
/// waiting on (whole blocks the rerun did not use, blocks an earlier run
/// cut off) are returned for the caller to release and [`drop_from`].
pub fn resumed(path: &Path, done: &ExNode) -> Result<Vec<Mapping>, XndError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(Vec::new());
    }
    let mut rec = xnd::load(path)?;
    let named: std::collections::HashSet<String> =
        done.allocations().filter_map(crate::commit::key).collect();
    let unnamed = |m: &Mapping| crate::commit::key(m).is_none_or(|k| !named.contains(&k));
    rec.mappings.retain(unnamed);
    rec.parity.retain(unnamed);
    rec.metadata.retain(|d| d.name != RESUME_META);
    if rec.allocations().next().is_none() {
        std::fs::remove_file(path).map_err(|source| XndError::Write {
            path: path.to_owned(),
            source,
        })?;
        return Ok(Vec::new());
    }
    xnd::save(path, &rec)?;
    Ok((rec.allocations())
        .filter(|m| !m.metadata.iter().any(|d| d.name == FREE_META))
        .cloned()
        .collect())
}

/// Per-mapping metadata of an allocation to free once a replacement is
/// saved: a replacement ([`crate::commit`]) writes it before its save and
/// removes it after the release. Its value is the BLAKE3 of the exNode
/// whose save makes the allocation free ([`crate::commit::digest`]), or
/// [`ORPHAN`] for one no exNode names; [`crate::commit::settle`] frees an
/// allocation only when the file beside the record is that exNode, and
/// otherwise (the run died before its save) drops it from the record: the
/// old exNode still names it.
pub const FREE_META: &str = "lors_free_when_saved";

/// [`FREE_META`]'s value for an allocation no exNode names (made by a run
/// that was killed, and not released since): always free.
pub const ORPHAN: &str = "orphan";

/// Adds `free` to the record at `path` (made if need be), each marked
/// [`FREE_META`] = `when` (and incomplete, so an upload never resumes
/// from it); saved durably before the caller goes on.
pub fn to_free(path: &Path, free: &[Mapping], when: &str) -> Result<(), XndError> {
    let mut rec = existing(path)?;
    for m in free {
        let mut m = m.clone();
        m.metadata
            .retain(|d| d.name != FREE_META && d.name != INCOMPLETE_META);
        m.metadata.push(Metadata::string(FREE_META, when));
        m.metadata.push(Metadata::string(INCOMPLETE_META, "1"));
        rec.mappings.push(m);
    }
    xnd::save(path, &rec)
}

/// The allocations of the record at `path` marked [`FREE_META`], each
/// with the mark's value.
pub fn pending_frees(path: &Path) -> Result<Vec<(Mapping, String)>, XndError> {
    Ok(existing(path)?
        .mappings
        .into_iter()
        .filter_map(|m| {
            let when = m.metadata.iter().find(|d| d.name == FREE_META)?;
            let when = match &when.value {
                Value::String(s) => s.clone(),
                _ => return None,
            };
            Some((m, when))
        })
        .collect())
}

/// Takes the allocations whose [`crate::commit::key`] is in `gone` out of
/// the record at `path`; a record left naming nothing (and resuming
/// nothing) is removed.
pub fn drop_from(path: &Path, gone: &std::collections::HashSet<String>) -> Result<(), XndError> {
    if gone.is_empty() || std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let mut rec = xnd::load(path)?;
    let named = |m: &Mapping| crate::commit::key(m).is_none_or(|k| !gone.contains(&k));
    rec.mappings.retain(named);
    rec.parity.retain(named);
    if rec.allocations().next().is_none() && rec.meta(RESUME_META).is_none() {
        return std::fs::remove_file(path).map_err(|source| XndError::Write {
            path: path.to_owned(),
            source,
        });
    }
    xnd::save(path, &rec)
}

/// The record at `path`, or an empty one.
fn existing(path: &Path) -> Result<ExNode, XndError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => xnd::load(path),
        Err(_) => Ok(ExNode::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_resumes_only_the_same_upload_and_only_whole_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.xnd.partial");
        let whole = Mapping {
            logical_length: 10,
            ..Mapping::default()
        };
        let cut = Mapping {
            exnode_offset: 10,
            logical_length: 10,
            ..Mapping::default()
        };
        let stored = ExNode {
            mappings: vec![whole.clone()],
            ..ExNode::default()
        };
        let stranded = ExNode {
            mappings: vec![cut],
            ..ExNode::default()
        };
        xnd::save(&path, &record(&stored, &stranded, Some("size=1"))).unwrap();
        let back = resumable(&path, "size=1").unwrap();
        assert_eq!(back.len(), 1, "the block cut off is not resumed from");
        assert_eq!(back[0].logical_length, whole.logical_length);
        assert!(matches!(
            resumable(&path, "size=2"),
            Err(LeftoverError::Foreign { .. })
        ));
        // A record without an identity (allocations a failed upload could
        // not release) is nothing to resume from.
        xnd::save(&path, &record(&stored, &stranded, None)).unwrap();
        assert!(resumable(&path, "size=1").unwrap().is_empty());
        assert!(
            resumable(&dir.path().join("none"), "size=1")
                .unwrap()
                .is_empty()
        );
    }

    /// A mapping of block `offset` on allocation `n`.
    fn on(n: u32, offset: u64) -> Mapping {
        let cap =
            |kind| lors_ibp::Capability::parse(&format!("ibp://h:6714/{n}#k{n}/7/{kind}")).unwrap();
        Mapping {
            exnode_offset: offset,
            logical_length: 10,
            alloc_length: 10,
            read: Some(cap("READ")),
            write: Some(cap("WRITE")),
            manage: Some(cap("MANAGE")),
            ..Mapping::default()
        }
    }

    fn of(ms: Vec<Mapping>) -> ExNode {
        ExNode {
            mappings: ms,
            ..ExNode::default()
        }
    }

    #[test]
    fn a_record_keeps_what_an_earlier_run_left_and_resumes_only_its_own_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.xnd.partial");
        // A failed run left an allocation it could not release.
        keep(&path, &of(vec![]), &of(vec![on(1, 0)]), None).unwrap();
        // An interrupted run of the upload records its blocks beside it.
        keep(
            &path,
            &of(vec![on(2, 0), on(3, 10)]),
            &of(vec![]),
            Some("size=20"),
        )
        .unwrap();
        let rec = xnd::load(&path).unwrap();
        assert_eq!(
            rec.mappings.len(),
            3,
            "the earlier allocation is still named"
        );
        let back = resumable(&path, "size=20").unwrap();
        assert_eq!(back.len(), 2, "only the blocks of this upload resume");
        // A rerun interrupted before it reached the second block: still named,
        // still resumed from.
        keep(
            &path,
            &of(vec![on(2, 0)]),
            &of(vec![on(4, 10)]),
            Some("size=20"),
        )
        .unwrap();
        let back: Vec<u64> = (resumable(&path, "size=20").unwrap().iter())
            .map(|m| m.exnode_offset)
            .collect();
        assert_eq!(back, [0, 10]);
        assert_eq!(xnd::load(&path).unwrap().mappings.len(), 4);
        // Saved as an exNode naming blocks 2 and 3: the rest is for the
        // caller to release, and the record no longer resumes.
        let rest = resumed(&path, &of(vec![on(2, 0), on(3, 10)])).unwrap();
        let mut rest: Vec<_> = rest.iter().filter_map(crate::commit::key).collect();
        rest.sort();
        assert_eq!(rest.len(), 2);
        assert!(
            rest[0].contains("/1#k1/") && rest[1].contains("/4#k4/"),
            "{rest:?}"
        );
        assert!(resumable(&path, "size=20").unwrap().is_empty());
        drop_from(&path, &rest.into_iter().collect()).unwrap();
        assert!(!path.exists(), "a record naming nothing is removed");
    }
}
