//! What `lors download` says when it is done: a line, or `--json`.

use super::Args;
use crate::report::Reporter;

/// The last word: a line on stderr, or the `--json` summary.
pub(super) fn summary(a: &Args, progress: &Reporter, stats: &lors::download::Stats) {
    if progress.is_json() {
        progress.done(&Report {
            bytes: stats.bytes,
            resumed_bytes: stats.resumed_bytes,
            retries: stats.retries,
            hedged: stats.hedged,
            seconds: crate::commands::json_secs(stats.elapsed),
            per_depot: stats
                .per_depot
                .iter()
                .map(|(depot, bytes)| DepotBytes {
                    depot,
                    bytes: *bytes,
                })
                .collect(),
        });
    } else if !a.report.quiet {
        let secs = stats.elapsed.as_secs_f64();
        let depots: Vec<String> = stats
            .per_depot
            .iter()
            .map(|(d, b)| format!("{d} {:.1} MiB", *b as f64 / 1048576.0))
            .collect();
        eprintln!(
            "lors: downloaded {} bytes in {:.2}s, {:.1} MiB/s{}{} [{}]",
            stats.bytes,
            secs,
            stats.bytes as f64 / 1048576.0 / secs.max(1e-9),
            if stats.resumed_bytes > 0 {
                format!(", {} bytes resumed", stats.resumed_bytes)
            } else {
                String::new()
            },
            if stats.retries > 0 {
                format!(", {} reads retried", stats.retries)
            } else {
                String::new()
            },
            depots.join(", ")
        );
    }
}

/// `--json`: what a download did.
#[derive(serde::Serialize)]
struct Report<'a> {
    bytes: u64,
    resumed_bytes: u64,
    retries: u64,
    hedged: u64,
    seconds: f64,
    per_depot: Vec<DepotBytes<'a>>,
}

/// Bytes one depot delivered.
#[derive(serde::Serialize)]
struct DepotBytes<'a> {
    depot: &'a str,
    bytes: u64,
}
