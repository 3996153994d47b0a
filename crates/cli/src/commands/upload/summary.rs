//! What `lors upload` says when it is done: a line, or `--json`.

use super::Args;
use crate::report::Reporter;

/// The last word: a line on stderr, or the `--json` summary.
pub(super) fn summary(
    a: &Args,
    progress: &Reporter,
    out: &std::path::Path,
    x: &lors_exnode::ExNode,
    copies: usize,
    took: std::time::Duration,
) {
    let ec = lors_exnode::erasure::Erasure::of(x)
        .ok()
        .flatten()
        .map(|e| e.scheme);
    let (size, holes) = (x.logical_size(), x.hole_bytes());
    let secs = took.as_secs_f64();
    let mib_per_s = (size - holes) as f64 / 1048576.0 / secs.max(1e-9);
    if progress.is_json() {
        progress.done(&Report::of(out, x, copies, took));
    } else if !a.report.quiet {
        let how = match ec {
            Some(e) => format!(
                "{} data and {} parity blocks (erasure code {e}: any {} of each stripe's {} may be lost)",
                x.mappings.len(),
                x.parity.len(),
                e.parity,
                e.blocks()
            ),
            None => format!("{} mappings ({copies} copies)", x.mappings.len()),
        };
        let sparse = match holes {
            0 => String::new(),
            h => format!(" ({h} of them in holes, not stored)"),
        };
        eprintln!(
            "lors: uploaded {size} bytes{sparse} as {how} in {secs:.2}s, {mib_per_s:.1} MiB/s -> {}",
            out.display()
        );
    }
}

/// `--json`: what an upload made.
#[derive(serde::Serialize)]
pub(super) struct Report {
    exnode: String,
    pub(super) size: u64,
    /// Bytes of `size` in holes (a sparse file's), not stored.
    #[serde(skip_serializing_if = "is_zero")]
    pub(super) holes: u64,
    mappings: usize,
    copies: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    ec: Option<String>,
    #[serde(skip_serializing_if = "is_zero")]
    parity: usize,
    seconds: f64,
    mib_per_s: f64,
}

impl Report {
    /// The exNode `x` saved at `out`, of `copies`, in `took`.
    pub(super) fn of(
        out: &std::path::Path,
        x: &lors_exnode::ExNode,
        copies: usize,
        took: std::time::Duration,
    ) -> Report {
        let ec = lors_exnode::erasure::Erasure::of(x)
            .ok()
            .flatten()
            .map(|e| e.scheme);
        let (size, holes) = (x.logical_size(), x.hole_bytes());
        let mib_per_s = (size - holes) as f64 / 1048576.0 / took.as_secs_f64().max(1e-9);
        Report {
            exnode: out.display().to_string(),
            size,
            holes,
            mappings: x.mappings.len(),
            copies: if ec.is_some() { 1 } else { copies },
            ec: ec.map(|e| e.to_string()),
            parity: x.parity.len(),
            seconds: crate::commands::json_secs(took),
            mib_per_s: (mib_per_s * 10.0).round() / 10.0,
        }
    }
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}
