//! `lors download`: fetch an exNode's file from its depots.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use lors::download::{DownloadOptions, Output, download};
use lors::settings::Layer;
use lors::uri::ExnodeRef;

use super::nonzero_block_size_arg;
use crate::exit::UsageError;
use crate::report::{ReportOpts, Reporter, Unit};

mod batch;
mod output;
mod summary;
use output::output;
use summary::summary;

/// Download a file from the depots its exNode names (fastest replicas first).
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors download -o run42.dat run42.xnd
  lors download -o - video.xnd | mplayer -        # stream to stdout, in order
  lors download --start-buffer 8M -o - video.xnd | mplayer -   # 8 MB ahead before play
  lors download -o run42.dat run42.xnd            # again after a failure: resumes
  lors download -o results/ run42.xnd             # writes results/<recorded name>
  lors download -o results/ xnds/*.xnd            # many files, side by side
  lors download -o /dev/null run42.xnd            # fetch and verify, keep nothing
  lors download -O 1G -L 100M -o part.bin run42.xnd
  lors download -t 16 -a 8 --prebuffer 32 -o - big.xnd > big.dat  # 32 blocks ahead

-q is --quiet here as in every lors command (lors_download's -q, the
prebuffer depth, is --prebuffer).")]
pub struct Args {
    #[command(flatten)]
    bwlimit: super::Bwlimit,
    /// The exNodes. Two words without -o or -f are X.xnd OUT (as cp and
    /// rclone take them); more exNodes need -o DIR or -f (each to its
    /// recorded name) and are fetched side by side.
    #[arg(value_name = "FILE.xnd|lors://…", required = true)]
    words: Vec<String>,
    /// Files fetched at once, of many [default: 4; from far depots as many
    /// as share, four each, the connections one file would open].
    #[arg(short = 'j', long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    jobs: Option<u32>,
    /// Leave out an exNode whose output is already there (from an earlier
    /// run of the same command); an interrupted one resumes either way.
    #[arg(long)]
    skip_existing: bool,
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
    let (exnodes, dest) = words(&a)?;
    let flags = Layer {
        block_size: a.block_size,
        threads: a.threads,
        ..a.lbone.layer()
    };
    let s = super::settings(&a.net, flags, Some(&exnodes[0]))?;
    if exnodes.len() > 1 {
        return batch::run(&a, &s, exnodes);
    }
    let exnode = &exnodes[0];
    let x = lors::xnd::load(&exnode.path)?;
    let size = x.logical_size();
    let offset = a.tuning.offset;
    if offset > size || (offset == size && size > 0) {
        return Err(UsageError(format!(
            "-O {} is past the end of the file ({size} bytes)",
            offset
        ))
        .into());
    }
    let out = output(&a, &x, exnode, dest)?;
    if a.skip_existing && out.as_os_str() != "-" && out.is_file() {
        if !a.report.quiet && !a.report.json {
            eprintln!(
                "lors: {} is there: {} skipped",
                out.display(),
                exnode.path.display()
            );
        }
        return Ok(());
    }
    let stdout = out.as_os_str() == "-";
    // A device or pipe (/dev/null, a FIFO) is written as a stream, in order.
    let device = !stdout && std::fs::metadata(&out).is_ok_and(|m| !m.is_file() && !m.is_dir());
    if (stdout || device) && a.resume {
        return Err(UsageError("-R needs an output file, not a stream".into()).into());
    }
    let rt = super::runtime(super::Threads::Many)?;
    let directory = super::directory(&rt, &s);
    let last_resort = rt.block_on(lors::directory::last_resort(directory.as_ref(), &x));
    let opts = options(&a, &s, last_resort);
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
    let stats = match stats {
        Ok(s) => s,
        Err(e) if !stdout && !device => return Err(failed(&x, &out, e)),
        Err(e) => return Err(share_revoked(&x, e)),
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

/// The exNodes the words name, and the output a second word names
/// (`lors download X.xnd OUT`); more exNodes need `-o DIR` or `-f`.
fn words(a: &Args) -> anyhow::Result<(Vec<ExnodeRef>, Option<PathBuf>)> {
    let mut words = a.words.clone();
    let mut dest = None;
    if words.len() == 2 && a.output.is_none() && !a.auto_name {
        dest = words.pop().map(PathBuf::from);
    } else if words.len() == 2 && lors::xnd::load(std::path::Path::new(&words[1])).is_err() {
        return Err(UsageError(format!(
            "the output {} cannot be used with {}: name it once (lors download X.xnd OUT, or -o OUT X.xnd)",
            words[1],
            if a.auto_name { "-f" } else { "-o" }
        ))
        .into());
    }
    let exnodes = (words.iter())
        .map(|w| super::exnode_arg(w).map_err(UsageError))
        .collect::<Result<Vec<_>, _>>()?;
    if exnodes.len() > 1 {
        if a.tuning.offset > 0 || a.tuning.length.is_some() {
            return Err(UsageError("-O and -L take one exNode".into()).into());
        }
        match &a.output {
            Some(o) if o.as_os_str() == "-" || !o.is_dir() => {
                return Err(UsageError(format!(
                    "{} exNodes: -o names the directory their files go in (each under its recorded name), and {} is not one",
                    exnodes.len(),
                    o.display()
                ))
                .into());
            }
            None if !a.auto_name => {
                return Err(UsageError(format!(
                    "say where the files of {} exNodes go: -o DIR (each under its recorded name) or -f (here)",
                    exnodes.len()
                ))
                .into());
            }
            _ => {}
        }
    }
    Ok((exnodes, dest))
}

/// The download's options from the flags and settings `s`.
fn options(
    a: &Args,
    s: &lors::settings::Settings,
    last_resort: HashSet<String>,
) -> DownloadOptions {
    let block_size = s
        .block_size
        .unwrap_or(DownloadOptions::default().block_size);
    a.tuning
        .options(block_size, s.threads.unwrap_or(0), last_resort)
}

/// A download of `x` to the file `out` failed: what to do next. What
/// was fetched is kept for a rerun to resume, unless the share was
/// revoked mid-way (a rerun cannot resume then, so nothing is kept).
fn failed(x: &lors_exnode::ExNode, out: &std::path::Path, e: lors::Error) -> anyhow::Error {
    if let Some(why) = lors::share::access_lost(x, &e) {
        let _ = std::fs::remove_file(lors::download::partial_path(out));
        let _ = std::fs::remove_file(lors::download::record_path(out));
        return anyhow::anyhow!(why);
    }
    let part = lors::download::partial_path(out);
    match part.exists() {
        true => anyhow::Error::from(e).context(format!(
            "download to {} failed; what was fetched is kept in {}: run the same command again to resume (--restart to start over)",
            out.display(),
            part.display()
        )),
        false => anyhow::Error::from(e).context(format!("download to {} failed", out.display())),
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
