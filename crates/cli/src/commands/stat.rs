//! `lors stat`: a summary of an exNode and its health, or a line each for
//! many.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod detail;
mod many;

use detail::detail;
use many::many;

use lors::manage::Probe;
use lors::uri::ExnodeRef;

/// Summarize an exNode: size, blocks, replicas, depots, leases, problems;
/// or many exNodes (several files, directories), a line each.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors stat run42.xnd                      # one file in detail
  lors stat data/                          # every *.xnd under data/, a line each
  lors stat --expiring 7d data/ || alert   # what expires within a week, is under its
                                           # copy count or has lost bytes (exit 1 if lost)")]
pub struct Args {
    /// The exNodes: files, or directories whose `*.xnd` files (at any
    /// depth) are summarized a line each.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|DIR|lors://…", required = true)]
    exnodes: Vec<ExnodeRef>,
    /// Only the exNodes with an allocation that expires within this long,
    /// and those under their copy count or with lost bytes.
    #[arg(long, value_parser = super::duration_arg, value_name = "DURATION")]
    expiring: Option<Duration>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    net: super::NetOpts,
}

/// The line-per-exNode listing, for `lors ls` given several exNodes, a
/// directory or `--expiring`.
pub(crate) fn listing(
    exnodes: Vec<ExnodeRef>,
    expiring: Option<Duration>,
    json: bool,
    net: super::NetOpts,
) -> anyhow::Result<()> {
    many(&Args {
        exnodes,
        expiring,
        json,
        net,
    })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match a.exnodes.as_slice() {
        [one] if a.expiring.is_none() && !one.path.is_dir() => detail(&a, one),
        _ => many(&a),
    }
}

/// Most exNodes one run lists: a directory tree larger than this is a
/// mistake (or an attack) rather than a data set to probe file by file.
pub(crate) const MAX_FILES: usize = 100_000;

/// What a walk of directories found: the exNode files, in name order, and
/// the `*.xnd` entries it passed over (with why).
#[derive(Debug, Default)]
pub(crate) struct Walk {
    /// Regular `*.xnd` files.
    pub files: Vec<PathBuf>,
    /// Entries named `*.xnd` that are not regular files: FIFOs, devices,
    /// sockets, symbolic links.
    pub skipped: Vec<(PathBuf, &'static str)>,
    /// More than `max` were there: the walk stopped at `max`.
    pub truncated: bool,
}

/// The `*.xnd` files under `dir`, at any depth, in name order, at most
/// `max`. Only regular files: a FIFO would block its reader for ever and
/// a device (`/dev/zero`) never end; a symbolic link may lead out of the
/// tree (or back into it, where its target is found as itself), and a
/// rewrite through it would replace the link. Neither is followed.
pub(crate) fn xnd_files(dir: &Path, w: &mut Walk, max: usize) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("reading directory {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if w.truncated {
            return Ok(());
        }
        let p = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            xnd_files(&p, w, max)?;
            continue;
        }
        if p.extension().is_none_or(|x| x != "xnd") {
            continue;
        }
        if kind.is_symlink() {
            w.skipped
                .push((p, "a symbolic link: not followed (name its target)"));
        } else if !kind.is_file() {
            w.skipped
                .push((p, "not a regular file (a FIFO, socket or device)"));
        } else if w.files.len() == max {
            w.truncated = true;
        } else {
            w.files.push(p);
        }
    }
    Ok(())
}

/// An erasure-coded file's stripes, as probed.
pub(super) struct Stripes {
    pub(super) erasure: lors_exnode::erasure::Erasure,
    pub(super) margins: Vec<lors_exnode::erasure::Margin>,
    data: usize,
    parity: usize,
}

/// `--json`: the stripes of an erasure-coded file.
#[derive(serde::Serialize)]
pub(super) struct StripesJson {
    pub(super) code: String,
    pub(super) stripes: usize,
    /// Fewest further losses any stripe can take (negative: unreadable).
    pub(super) min_margin: i64,
    /// Stripes one more loss would make unreadable.
    pub(super) at_margin_zero: Vec<u64>,
    /// Stripes that cannot be read.
    pub(super) lost: Vec<u64>,
    /// Blocks per stripe, data and parity.
    pub(super) blocks: usize,
    /// The margin of a stripe none of whose blocks is lost.
    pub(super) full_margin: i64,
}

impl Stripes {
    pub(super) fn of(x: &lors_exnode::ExNode, probes: &[Probe]) -> anyhow::Result<Option<Stripes>> {
        let Some(erasure) = lors_exnode::erasure::Erasure::of(x)? else {
            return Ok(None);
        };
        let live = |i: usize| probes.get(i).is_some_and(Probe::is_live);
        Ok(Some(Stripes {
            erasure,
            margins: erasure.margins(x, live),
            data: x.mappings.len(),
            parity: x.parity.len(),
        }))
    }

    pub(super) fn min_margin(&self) -> i64 {
        self.margins
            .iter()
            .map(|m| m.margin)
            .min()
            .unwrap_or(self.erasure.scheme.parity as i64)
    }

    pub(super) fn with(&self, f: impl Fn(i64) -> bool) -> Vec<u64> {
        (self.margins.iter())
            .filter(|m| f(m.margin))
            .map(|m| m.stripe)
            .collect()
    }

    pub(super) fn json(&self) -> StripesJson {
        StripesJson {
            code: self.erasure.scheme.to_string(),
            stripes: self.margins.len(),
            min_margin: self.min_margin(),
            at_margin_zero: self.with(|m| m == 0),
            lost: self.with(|m| m < 0),
            blocks: self.erasure.scheme.blocks(),
            full_margin: self.erasure.scheme.parity as i64,
        }
    }

    pub(super) fn print(&self) -> anyhow::Result<()> {
        let e = &self.erasure.scheme;
        crate::commands::outln!(
            "code:      erasure {e}: {} stripes, {} data and {} parity blocks",
            self.margins.len(),
            self.data,
            self.parity
        );
        let list = |v: &[u64]| {
            let mut s: Vec<String> = v.iter().take(10).map(u64::to_string).collect();
            if v.len() > 10 {
                s.push(format!("… ({} in all)", v.len()));
            }
            s.join(", ")
        };
        let (zero, lost) = (self.with(|m| m == 0), self.with(|m| m < 0));
        let min = self.min_margin();
        if min >= 0 {
            crate::commands::outln!(
                "margin:    every stripe can lose {min} more block{} ({} of {} at most)",
                if min == 1 { "" } else { "s" },
                e.parity,
                e.blocks()
            );
        }
        if !zero.is_empty() {
            crate::commands::outln!(
                "at margin 0: stripes {} (one more loss makes them unreadable); repair with `lors augment --repair`",
                list(&zero)
            );
        }
        if !lost.is_empty() {
            crate::commands::outln!(
                "lost:      stripes {} have fewer than {} live blocks",
                list(&lost),
                e.data
            );
        }
        Ok(())
    }
}
