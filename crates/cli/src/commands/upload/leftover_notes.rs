//! What an unfinished upload (augment, route, disseminate) says it left on
//! the depots. The job layer ([`lors::job`]) decides what is recorded in
//! `OUT.partial` or released; these only say it.

use lors::job::Left;

/// Says `left`, after `said` (which says what happened): where it is
/// named, and how to resume from it or free it.
pub(crate) fn say_left(said: &str, left: &Left) {
    crate::report::clear();
    let resume = match left.resumable {
        true => "; run the same command again to resume",
        false => "",
    };
    let free = match left.trim_args() {
        Some(args) if !left.is_nothing() => format!(
            "{resume}, or free them with `lors trim --decrement --allow-holes {args}`{}",
            match left.blocks {
                0 => " once the depots are back (else they expire with their lease)",
                _ => "",
            }
        ),
        _ => String::new(),
    };
    eprintln!("lors: {said}{left}{free}{}", left.released_clause());
}

/// The error of a failed copy job (augment's repair), after saying what
/// it left on the depots: allocations it could not release are recorded
/// in `OUT.partial`.
pub(crate) fn failed(e: lors::Error, out: &std::path::Path) -> anyhow::Error {
    let lors::Error::Abandoned {
        cause,
        released,
        stranded,
    } = e
    else {
        return e.into();
    };
    say_left("", &lors::job::unreleased(out, &stranded, released));
    (*cause).into()
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
    let left = lors::job::unreleased(out, &stranded, released);
    say_left(
        &format!("{what} interrupted: the exNode is unchanged; "),
        &left,
    );
    Err(crate::commands::interrupted(signal))
}

/// What replacing the old exNode released.
pub(super) fn replaced_said(out: &std::path::Path, done: &lors::commit::Committed) {
    match (done.kept.first(), &done.record) {
        (Some((_, why)), Some(record)) => eprintln!(
            "lors: {} replaced: {} allocations of the old exNode released, {} not ({why}): named in {} for the next command on it to free",
            out.display(),
            done.freed,
            done.kept.len(),
            record.display()
        ),
        _ => eprintln!(
            "lors: {} replaced: {} allocations of the old exNode released",
            out.display(),
            done.freed
        ),
    }
}
