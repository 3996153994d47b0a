//! Which exNode files a cycle of `lors keep` keeps, and in what order.

use std::path::PathBuf;
use std::sync::Arc;

use lors::keep::{Cursor, Scrub};
use lors::uri::ExnodeRef;

use super::Args;
use crate::commands::stat::{MAX_FILES, Walk};

/// The exNode files `r` names, added to `w`: a named file as itself (a
/// link given by name is followed: the target is kept, in its place);
/// a directory's regular `*.xnd` files, never through links, at most
/// [`MAX_FILES`] in all.
fn files_of(r: &ExnodeRef, w: &mut Walk) -> anyhow::Result<()> {
    if !r.path.is_dir() {
        let target = std::fs::canonicalize(&r.path).unwrap_or_else(|_| r.path.clone());
        w.files.push(target);
        return Ok(());
    }
    crate::commands::stat::xnd_files(&r.path, w, MAX_FILES)
}

/// Every exNode of this cycle, each with its settings, starting at the
/// scrub's place (so its budget goes to the replicas checked longest
/// ago); what is passed over is said.
pub(super) fn of_cycle(
    a: &Args,
    scrub: &mut Scrub,
) -> anyhow::Result<Vec<(PathBuf, Arc<lors::settings::Settings>)>> {
    let mut all = Vec::new();
    let mut w = Walk::default();
    for r in &a.exnodes {
        let flags = a.new_lease.layer(a.targets.layer());
        let s = Arc::new(crate::commands::settings(&a.net, flags, Some(r))?);
        let had = w.files.len();
        files_of(r, &mut w)?;
        all.extend(w.files[had..].iter().map(|p| (p.clone(), s.clone())));
    }
    // One bad entry never stops the rest: said, and passed over.
    for (p, why) in &w.skipped {
        eprintln!("lors: {}: skipped: {why}", p.display());
    }
    if w.truncated {
        eprintln!(
            "lors: more than {MAX_FILES} exNodes: the first {} in name order are kept this cycle; keep the others with a second keeper on their own directory",
            all.len()
        );
    }
    let at = all.iter().position(|(p, _)| *p == scrub.cursor.file);
    match at {
        // The scrub finished that file: it goes on with the next, and
        // after the last (or the only one) with the first again.
        Some(k) if scrub.cursor.mapping == Cursor::DONE => {
            let n = all.len();
            all.rotate_left((k + 1) % n);
            scrub.cursor = Cursor::default();
        }
        Some(k) => all.rotate_left(k),
        None => scrub.cursor = Cursor::default(),
    }
    Ok(all)
}
