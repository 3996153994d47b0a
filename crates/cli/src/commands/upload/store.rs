//! The upload job ([`lors::job::upload`]) run under SIGINT/SIGTERM, and
//! what it says it did or left.

use std::sync::Arc;

use lors::Pool;
use lors::job::upload::{Done, Failed, Source, Upload};

use super::{Args, Target};
use crate::left::{replaced_said, say_left};
use crate::report::Reporter;

/// Stores the input (resuming from the record an interrupted run of the
/// same upload left) and saves its exNode; an interrupted or failed upload
/// says what it left and where it is named.
pub(super) fn store(
    a: &Args,
    t: &Target,
    job: &Upload,
    rt: &tokio::runtime::Runtime,
    pool: &Arc<Pool>,
    progress: &Arc<Reporter>,
) -> anyhow::Result<Done> {
    let source = match t.stdin() {
        true => Source::Stream(Box::new(tokio::io::stdin()), None),
        false => Source::open(&t.file)?,
    };
    let ready = rt
        .block_on(job.prepare(&source, pool))
        .map_err(crate::commands::refused)?;
    let resumed = ready.resumed_blocks();
    if resumed > 0 && !a.report.quiet {
        eprintln!(
            "lors: resuming the upload recorded in {}.partial: {resumed} blocks already stored are not sent again",
            a_out(job).display(),
        );
    }
    // SIGINT/SIGTERM: the upload stops, releases what it cut off and
    // records what it stored.
    let (stop_rx, signal) = crate::commands::stop_on_signal(rt);
    let r = rt.block_on(job.run(ready, source, pool.clone(), progress.clone(), Some(stop_rx)));
    progress.finish();
    said(r, a_out(job), a.report.quiet, &signal)
}

/// What a finished, failed or interrupted upload to `out` says it did or
/// left (on stderr), and its outcome as the command's.
pub(super) fn said(
    r: Result<Done, Failed>,
    out: &std::path::Path,
    quiet: bool,
    signal: &std::sync::atomic::AtomicU8,
) -> anyhow::Result<Done> {
    match r {
        Ok(done) => {
            if let Some(left) = &done.unreleased {
                say_left(
                    "the upload succeeded, but of the allocations of attempts that failed, ",
                    left,
                );
            }
            if let Some(c) = done.replaced.as_ref().filter(|_| !quiet) {
                replaced_said(out, c);
            }
            Ok(done)
        }
        Err(Failed::Interrupted(left)) => {
            say_left("upload interrupted: ", &left);
            Err(crate::commands::interrupted(signal))
        }
        Err(Failed::Failed { cause, left }) => {
            if !left.is_nothing() || left.released > 0 {
                say_left("upload failed: ", &left);
            }
            Err(cause.into())
        }
        Err(Failed::NotSaved { cause, left }) => {
            say_left("", &left);
            Err(anyhow::Error::new(cause).context(format!(
                "the upload finished but its exNode could not be written at {}",
                out.display()
            )))
        }
        Err(Failed::NotReleased { cause }) => Err(anyhow::Error::new(cause).context(format!(
            "{} is saved; releasing what the exNode it replaced named failed",
            out.display()
        ))),
    }
}

/// The job's output (`lors upload` always has one).
pub(super) fn a_out(job: &Upload) -> &std::path::Path {
    job.out.as_deref().unwrap_or(std::path::Path::new("-"))
}
