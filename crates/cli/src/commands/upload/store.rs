//! The upload itself: from a file (resuming what an interrupted run of it
//! stored) or a stream, under SIGINT/SIGTERM, and what a stop or failure
//! leaves recorded.

use std::sync::Arc;

use anyhow::Context as _;
use lors::Pool;
use lors::leftover;
use lors::upload::{Control, UploadOptions, upload, upload_file_with};

use super::Args;
use super::leftover_notes::{failed, record_partial, record_unreleased};
use crate::UsageError;
use crate::report::Reporter;

/// Stores the input, resuming from the record an interrupted run of the
/// same upload left; the exNode of what was stored, and whether it resumed.
/// An interrupted or failed upload records what it left on the depots and
/// says so.
pub(super) fn store(
    a: &Args,
    out: &std::path::Path,
    opts: &UploadOptions,
    rt: &tokio::runtime::Runtime,
    pool: &Arc<Pool>,
    progress: &Arc<Reporter>,
) -> anyhow::Result<(lors_exnode::ExNode, bool)> {
    let input = (a.file.as_os_str() != "-")
        .then(|| {
            std::fs::File::open(&a.file).with_context(|| format!("opening {}", a.file.display()))
        })
        .transpose()?;
    let meta = input.as_ref().and_then(|f| f.metadata().ok());
    // What identifies this upload in a record for resuming it.
    let identity = (meta.as_ref().filter(|m| m.is_file())).map(|m| leftover::identity(m, opts));
    let partial = leftover::record_path(out);
    let done = match &identity {
        Some(id) => leftover::resumable(&partial, id).map_err(|e| match e {
            e @ leftover::LeftoverError::Foreign { .. } => UsageError(e.to_string()).into(),
            e => anyhow::Error::new(e),
        })?,
        None => Vec::new(),
    };
    if !done.is_empty() && !a.report.quiet {
        let blocks: std::collections::BTreeSet<u64> =
            done.iter().map(|m| m.exnode_offset).collect();
        eprintln!(
            "lors: resuming the upload recorded in {}: {} blocks already stored are not sent again",
            partial.display(),
            blocks.len()
        );
    }
    // SIGINT/SIGTERM: the upload stops, releases what it cut off and
    // records what it stored.
    let (stop_rx, signal) = crate::commands::stop_on_signal(rt);
    let control = Control {
        stop: Some(stop_rx),
        done: done.clone(),
    };
    let r = rt.block_on(async {
        let pool = pool.clone();
        match input {
            None => upload(tokio::io::stdin(), None, opts, pool, progress.clone()).await,
            Some(f) if meta.as_ref().is_some_and(std::fs::Metadata::is_file) => {
                upload_file_with(f, opts, pool, progress.clone(), control).await
            }
            Some(f) => {
                // A pipe or device: read it as a stream.
                let size = meta.as_ref().map(|m| m.len()).filter(|&n| n > 0);
                upload(
                    tokio::fs::File::from_std(f),
                    size,
                    opts,
                    pool,
                    progress.clone(),
                )
                .await
            }
        }
    });
    progress.finish();
    let id = identity.as_deref();
    match r {
        Ok(up) => {
            if !up.unreleased.mappings.is_empty() {
                record_unreleased(
                    &up.unreleased,
                    "the upload succeeded, but of the allocations of attempts that failed, ",
                    out,
                );
            }
            Ok((up.exnode, !done.is_empty()))
        }
        Err(lors::Error::Interrupted {
            stored,
            released,
            stranded,
        }) => {
            record_partial("interrupted", &stored, released, &stranded, id, &partial);
            Err(crate::commands::interrupted(&signal))
        }
        // A resumed upload that fails keeps the record of what it resumed
        // from (those allocations are named nowhere else).
        Err(lors::Error::Abandoned {
            cause,
            released,
            stranded,
        }) if !done.is_empty() => {
            let kept = lors_exnode::ExNode {
                mappings: done,
                ..Default::default()
            };
            record_partial("failed", &kept, released, &stranded, id, &partial);
            Err((*cause).into())
        }
        Err(e) => Err(failed(e, out)),
    }
}

/// Saves the uploaded `x` at `out`, then releases what the exNode it
/// `replaced` named; the new data is released if the save fails (nothing
/// would name it).
pub(super) fn save(
    rt: &tokio::runtime::Runtime,
    out: &std::path::Path,
    x: &lors_exnode::ExNode,
    replaced: Option<super::checks::Replaced>,
    pool: &std::sync::Arc<lors::Pool>,
) -> anyhow::Result<Option<lors::commit::Committed>> {
    let saved = match replaced {
        Some(r) => (rt.block_on(lors::commit::save_then_release(out, x, r.old, pool)))
            .map(Some)
            .map_err(anyhow::Error::new),
        None => lors::xnd::save(out, x)
            .map(|()| None)
            .map_err(anyhow::Error::new),
    };
    let Err(e) = saved else {
        return saved;
    };
    // Saved, and what followed failed: the new data is named, and stays.
    let digest = lors::commit::digest(x);
    if lors::xnd::load(out).is_ok_and(|y| lors::commit::digest(&y) == digest) {
        return Err(e.context(format!(
            "{} is saved; releasing what the exNode it replaced named failed",
            out.display()
        )));
    }
    // Without its exNode nobody can reach the data: free it now.
    let made: Vec<_> = x.allocations().cloned().collect();
    let kept = rt.block_on(pool.release_all(made.clone())).len();
    Err(e.context(format!(
        "the upload finished but its exNode could not be written; {} of {} allocations were released",
        made.len() - kept,
        made.len()
    )))
}
