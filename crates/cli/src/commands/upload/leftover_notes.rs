//! What an unfinished upload (augment, route, disseminate) says it left on
//! the depots, and records in `OUT.partial` ([`lors::leftover`]).

use lors::leftover;

/// The error of a failed upload, after saying what it left on the depots:
/// allocations it could not release are recorded in `OUT.partial`.
pub(crate) fn failed(e: lors::Error, out: &std::path::Path) -> anyhow::Error {
    let lors::Error::Abandoned {
        cause,
        released,
        stranded,
    } = e
    else {
        return e.into();
    };
    if stranded.mappings.is_empty() {
        eprintln!(
            "lors: the {released} allocations already made were released; nothing is left on the depots"
        );
    } else {
        record_unreleased(
            &stranded,
            &format!("released {released} allocations already made; "),
            out,
        );
    }
    (*cause).into()
}

/// After an interrupt (or the failure of a resumed upload): records the
/// stored blocks (and allocations cut off that could not be released) in
/// `partial`, and says how to resume or free them.
pub(super) fn record_partial(
    how: &str,
    stored: &lors_exnode::ExNode,
    released: usize,
    stranded: &lors_exnode::ExNode,
    identity: Option<&str>,
    partial: &std::path::Path,
) {
    crate::report::clear();
    let rec = leftover::record(stored, stranded, identity);
    let blocks: std::collections::BTreeSet<u64> =
        stored.mappings.iter().map(|m| m.exnode_offset).collect();
    let cut = if released > 0 {
        format!("; the {released} allocations of blocks in flight were released")
    } else {
        String::new()
    };
    if rec.mappings.is_empty() {
        let _ = std::fs::remove_file(partial);
        eprintln!("lors: upload {how}: nothing is left on the depots{cut}");
        return;
    }
    let resume = if identity.is_some() && !stored.mappings.is_empty() {
        "; run the same command again to resume"
    } else {
        ""
    };
    match lors::xnd::save(partial, &rec) {
        Ok(()) => eprintln!(
            "lors: upload {how}: {} stored blocks{} are recorded in {}{resume}, or free them with `lors trim --decrement --allow-holes {}`{cut}",
            blocks.len(),
            if stranded.mappings.is_empty() {
                String::new()
            } else {
                format!(
                    " and {} allocations that could not be released",
                    stranded.mappings.len()
                )
            },
            partial.display(),
            leftover::trim_args(&rec, partial),
        ),
        Err(w) => eprintln!(
            "lors: upload {how}; what it stored could not be recorded ({w:#}): it expires with its lease{cut}"
        ),
    }
}

/// The outcome of an augment or route run under [`crate::commands::stop_on_signal`]:
/// interrupted, the exNode is unchanged, the replicas made were released
/// (those that could not be are recorded beside `out`), and the error
/// carries the signal's exit status.
pub(crate) fn copies_outcome<T>(
    what: &str,
    r: lors::Result<T>,
    out: &std::path::Path,
    signal: &std::sync::atomic::AtomicU8,
) -> anyhow::Result<T> {
    let Err(lors::Error::Interrupted {
        released, stranded, ..
    }) = r
    else {
        return Ok(r?);
    };
    crate::report::clear();
    let said = format!("{what} interrupted: the exNode is unchanged; ");
    if stranded.mappings.is_empty() {
        eprintln!("lors: {said}the {released} replicas made were released");
    } else {
        record_unreleased(
            &stranded,
            &format!("{said}released {released} replicas made; "),
            out,
        );
    }
    Err(crate::commands::interrupted(signal))
}

/// Writes the allocations in `stranded` (on depots that could not be
/// reached to release them) to `OUT.partial` and says how to free them.
pub(crate) fn record_unreleased(stranded: &lors_exnode::ExNode, said: &str, out: &std::path::Path) {
    let partial = leftover::record_path(out);
    let depots = leftover::depots(stranded);
    let n = stranded.mappings.len();
    match lors::xnd::save(&partial, stranded) {
        Ok(()) => eprintln!(
            "lors: {said}{n} on unreachable depots ({}) are named in {}: free them with `lors trim --decrement --allow-holes {} {}` once the depots are back (else they expire with their lease)",
            depots.join(", "),
            partial.display(),
            depots
                .iter()
                .map(|d| format!("--depot {d}"))
                .collect::<Vec<_>>()
                .join(" "),
            partial.display()
        ),
        Err(w) => eprintln!(
            "lors: {said}{n} on unreachable depots ({}) could not be recorded ({w:#}); they expire with their lease",
            depots.join(", ")
        ),
    }
}

/// What replacing the old exNode released.
pub(super) fn replaced_said(out: &std::path::Path, done: &lors::commit::Committed) {
    match done.kept.first() {
        None => eprintln!(
            "lors: {} replaced: {} allocations of the old exNode released",
            out.display(),
            done.freed
        ),
        Some((_, why)) => eprintln!(
            "lors: {} replaced: {} allocations of the old exNode released, {} not ({why}): named in {} for the next command on it to free",
            out.display(),
            done.freed,
            done.kept.len(),
            lors::leftover::record_path(out).display()
        ),
    }
}
