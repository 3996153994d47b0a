//! What an unfinished upload (augment, route, disseminate) says it left on
//! the depots. The job layer ([`lors::job`]) decides what is recorded in
//! `OUT.partial` or released; these only say it.

use lors::job::Left;
use lors::job::edit::Unfinished;

/// Says `left`, after `said` (which says what happened): where it is
/// named, and how to resume from it or free it.
pub(crate) fn say_left(said: &str, left: &Left) {
    crate::report::clear();
    let free = match left.trim_args() {
        Some(args) if !left.is_nothing() => {
            let trim = format!("`lors trim --decrement --allow-holes {args}`");
            match (left.resumable, left.blocks) {
                (true, _) => {
                    format!("; run the same command again to resume, or free them with {trim}")
                }
                (false, 0) => format!(
                    ": free them with {trim} once the depots are back (else they expire with their lease)"
                ),
                (false, _) => format!(": free them with {trim}"),
            }
        }
        _ => String::new(),
    };
    eprintln!("lors: {said}{left}{free}{}", left.released_clause());
}

/// The outcome of a copy job (augment, route, repair) run under
/// [`crate::commands::stop_on_signal`]: interrupted, the exNode is
/// unchanged, the replicas made were released (those that could not be are
/// recorded beside `out`), and the error carries the signal's exit status;
/// failed, what it left is said before its error.
pub(crate) fn copies_outcome<T>(
    what: &str,
    r: lors::Result<T>,
    out: &std::path::Path,
    signal: &std::sync::atomic::AtomicU8,
) -> anyhow::Result<T> {
    match lors::job::edit::copies_outcome(r, Some(out)) {
        Ok(v) => Ok(v),
        Err(Unfinished::Interrupted(left)) => {
            say_left(
                &format!("{what} interrupted: the exNode is unchanged; "),
                &left,
            );
            Err(crate::commands::interrupted(signal))
        }
        Err(Unfinished::Failed { cause, left }) => {
            if !left.is_nothing() || left.released > 0 {
                say_left(&format!("{what} failed: "), &left);
            }
            Err((*cause).into())
        }
    }
}

/// What replacing the old exNode released.
pub(crate) fn replaced_said(out: &std::path::Path, done: &lors::commit::Committed) {
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
