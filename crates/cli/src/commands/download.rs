//! `lors download`: fetch an exNode's file from its depots.

use std::path::PathBuf;
use std::sync::Arc;

use lors::download::{DownloadOptions, Output, download};
use lors::settings::Layer;
use lors::uri::ExnodeRef;

use super::nonzero_block_size_arg;
use crate::exit::UsageError;
use crate::report::{ReportOpts, Reporter, Unit};

mod summary;
use summary::summary;

/// Download a file from the depots its exNode names (fastest replicas first).
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors download -o run42.dat run42.xnd
  lors download -o - video.xnd | mplayer -        # stream to stdout, in order
  lors download --start-buffer 8M -o - video.xnd | mplayer -   # 8 MB ahead before play
  lors download -o run42.dat run42.xnd            # again after a failure: resumes
  lors download -o results/ run42.xnd             # writes results/<recorded name>
  lors download -o /dev/null run42.xnd            # fetch and verify, keep nothing
  lors download -O 1G -L 100M -o part.bin run42.xnd
  lors download -t 16 -a 8 --prebuffer 32 -o - big.xnd > big.dat  # 32 blocks ahead

-q is --quiet here as in every lors command (lors_download's -q, the
prebuffer depth, is --prebuffer).")]
pub struct Args {
    #[command(flatten)]
    bwlimit: super::Bwlimit,
    /// The exNode.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…")]
    exnode: ExnodeRef,
    /// Where the data goes, as with -o (`lors download X.xnd OUT`, as cp
    /// and rclone take it).
    #[arg(value_name = "OUT", conflicts_with_all = ["output", "auto_name"])]
    dest: Option<PathBuf>,
    /// Output file; `-` writes standard output; a directory (or a path
    /// ending in `/`) gets the exNode's recorded file name. Data goes to
    /// OUT.lors-part and is renamed to OUT once complete.
    #[arg(short, long, value_name = "OUT")]
    output: Option<PathBuf>,
    /// Write to the exNode's recorded file name.
    #[arg(short = 'f', long = "auto-name", conflicts_with = "output")]
    auto_name: bool,
    #[command(flatten)]
    tuning: lors::download::Tuning,
    /// Largest piece fetched in one request [default: bs= of a lors://
    /// URI, else LORS_BLOCKSIZE, else DATA_BLOCKSIZE in ~/.xndrc, else 2M]. Small pieces keep every depot
    /// busy to the end of the transfer.
    #[arg(short = 'b', long = "block-size", value_parser = nonzero_block_size_arg)]
    block_size: Option<u64>,
    /// Fetches in flight across all depots [default: threads=, else
    /// LORS_THREADS, else THREADS in ~/.xndrc, else connections × depots].
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// With an L-Bone (-H, LBONE_SERVER): depots it does not list as online
    /// are read only when no other replica is left, and the measured rates
    /// are reported back to it.
    #[command(flatten)]
    lbone: super::LboneOpts,
    /// Resume an interrupted download to the same output file (the
    /// default whenever OUT.lors-part is there from the same exNode).
    #[arg(short = 'R', long, conflicts_with = "restart")]
    resume: bool,
    #[command(flatten)]
    net: super::NetOpts,
    #[command(flatten)]
    report: ReportOpts,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let flags = Layer {
        block_size: a.block_size,
        threads: a.threads,
        ..a.lbone.layer()
    };
    let s = super::settings(&a.net, flags, Some(&a.exnode))?;
    let x = lors::xnd::load(&a.exnode.path)?;
    let size = x.logical_size();
    let offset = a.tuning.offset;
    if offset > size || (offset == size && size > 0) {
        return Err(UsageError(format!(
            "-O {} is past the end of the file ({size} bytes)",
            offset
        ))
        .into());
    }
    let out = output(&a, &x)?;
    let stdout = out.as_os_str() == "-";
    // A device or pipe (/dev/null, a FIFO) is written as a stream, in order.
    let device = !stdout && std::fs::metadata(&out).is_ok_and(|m| !m.is_file() && !m.is_dir());
    if (stdout || device) && a.resume {
        return Err(UsageError("-R needs an output file, not a stream".into()).into());
    }
    let rt = super::runtime(super::Threads::Many)?;
    let directory = super::directory(&rt, &s);
    let last_resort = rt.block_on(lors::directory::last_resort(directory.as_ref(), &x));
    let block_size = s
        .block_size
        .unwrap_or(DownloadOptions::default().block_size);
    let opts = a
        .tuning
        .options(block_size, s.threads.unwrap_or(0), last_resort);
    let cfg = s.client();
    // A share checked before anything is written: revoked or run out, it
    // says so in one line and leaves nothing behind.
    let probing = lors::Pool::new(cfg.clone());
    if let Some(why) = rt.block_on(lors::share::gone(&x, &probing)) {
        anyhow::bail!(why);
    }
    let progress = Reporter::new("download", Unit::Bytes, &a.report, stdout);
    let stats = rt.block_on(async {
        let pool = Arc::new(a.bwlimit.pool(cfg));
        let output = if stdout {
            Output::Stream {
                writer: Box::new(tokio::io::stdout()),
                name: "standard output".into(),
            }
        } else if device {
            let f = tokio::fs::OpenOptions::new()
                .write(true)
                .open(&out)
                .await
                .map_err(|e| lors::Error::Io {
                    what: format!("opening {}", out.display()),
                    source: e,
                })?;
            Output::Stream {
                writer: Box::new(f),
                name: out.display().to_string(),
            }
        } else {
            Output::File(out.clone())
        };
        download(&x, output, &opts, pool, progress.clone()).await
    });
    let revoked = (stats.as_ref().err()).and_then(|e| lors::share::access_lost(&x, e));
    let stats = match stats.map_err(|e| share_revoked(&x, e)) {
        Ok(s) => s,
        // Revoked mid-way: a rerun cannot resume, so nothing is kept.
        Err(_) if revoked.is_some() && !stdout && !device => {
            let _ = std::fs::remove_file(lors::download::partial_path(&out));
            let _ = std::fs::remove_file(lors::download::record_path(&out));
            anyhow::bail!(revoked.unwrap_or_default());
        }
        Err(e) if !stdout && !device => {
            let part = lors::download::partial_path(&out);
            return Err(if part.exists() {
                e.context(format!(
                    "download to {} failed; what was fetched is kept in {}: run the same command again to resume (--restart to start over)",
                    out.display(),
                    part.display()
                ))
            } else {
                e.context(format!("download to {} failed", out.display()))
            });
        }
        Err(e) => return Err(e),
    };
    progress.finish();
    rt.block_on(lors::directory::report_rates(
        directory.as_ref(),
        &stats.per_depot,
        stats.elapsed,
    ));
    summary(&a, &progress, &stats);
    Ok(())
}

/// Where the data goes: `-o` (a directory takes the recorded name), or
/// the recorded name with `-f`. A recorded name is the exNode's word, not
/// the user's: it never replaces a file that is there (a `run42.xnd`
/// holding the only copy of its capabilities, a `.bashrc`); and no output
/// is ever the exNode being read.
fn output(a: &Args, x: &lors_exnode::ExNode) -> anyhow::Result<PathBuf> {
    let recorded = || -> Result<PathBuf, UsageError> {
        x.filename()
            .filter(|f| !f.is_empty() && !f.contains('/') && *f != "." && *f != "..")
            .map(PathBuf::from)
            .ok_or_else(|| UsageError("the exNode records no usable file name; use -o FILE".into()))
    };
    let output = a.output.clone().or_else(|| a.dest.clone());
    let (out, named_by_exnode) = match (&output, a.auto_name) {
        (Some(o), _)
            if o.as_os_str() != "-"
                && (o.is_dir() || o.as_os_str().to_string_lossy().ends_with('/')) =>
        {
            if !o.is_dir() {
                return Err(UsageError(format!("{} is not a directory", o.display())).into());
            }
            (o.join(recorded()?), true)
        }
        (Some(o), _) => (o.clone(), false),
        (None, true) => (recorded()?, true),
        (None, false) => {
            return Err(UsageError(
                "say where the data goes: -o OUT (or -o - for stdout, -f for the recorded name)"
                    .into(),
            )
            .into());
        }
    };
    if named_by_exnode && std::fs::symlink_metadata(&out).is_ok() {
        return Err(UsageError(format!(
            "{} is there already, and the name comes from the exNode: it is not replaced. Name the output with -o {} to replace it, or -o another path",
            out.display(),
            out.display()
        ))
        .into());
    }
    if out.as_os_str() != "-" && same_file(&out, &a.exnode.path) {
        return Err(UsageError(format!(
            "{} is the exNode being read: writing the data there would destroy it; name another output with -o",
            out.display()
        ))
        .into());
    }
    Ok(out)
}

/// Whether `a` and `b` name one file (both there, same device and inode).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// A download through a shared exNode whose depots no longer know its
/// keys: says that the share was revoked or ran out, not only that a key
/// was refused.
fn share_revoked(x: &lors_exnode::ExNode, e: lors::Error) -> anyhow::Error {
    match lors::share::access_lost(x, &e) {
        Some(why) => anyhow::Error::from(e).context(why),
        None => e.into(),
    }
}
