//! `lors upload`: store a file on depots as an exNode.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use lors::Pool;
use lors::upload::{UploadOptions, upload};
use lors_ibp::ClientConfig;
use lors_ibp::proto::Reliability;

use super::{TermProgress, duration_arg, size_arg, write_exnode};
use crate::UsageError;

/// Store a file on IBP depots, striped and replicated; write its exNode.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors upload --depot d1:6714 --depot d2:6714 -c 2 -b 10M -o run42.xnd run42.dat
  tar c data/ | lors upload --depot d1:6714 -c 1 -o data.tar.xnd -
  lors upload --depot d1:6714 -c 1 -f video.mp4          # writes video.mp4.xnd")]
pub struct Args {
    /// File to upload; `-` reads standard input.
    file: PathBuf,
    /// Depot HOST:PORT to use (repeat for several).
    #[arg(long = "depot", value_name = "HOST:PORT", required = true)]
    depots: Vec<String>,
    /// Copies of each block, on distinct depots [default: 3].
    #[arg(short, long, env = "LORS_COPIES", default_value_t = 3)]
    copies: usize,
    /// Block (allocation) size, e.g. 10M.
    #[arg(short = 'b', long = "block-size", env = "LORS_BLOCKSIZE", value_parser = size_arg, default_value = "10M")]
    block_size: u64,
    /// Blocks transferred at once.
    #[arg(short, long, env = "LORS_THREADS", default_value_t = 8)]
    threads: usize,
    /// Allocation lifetime, e.g. 2h, 7d.
    #[arg(short, long, env = "LORS_DURATION", value_parser = duration_arg, default_value = "1d")]
    duration: Duration,
    /// Soft (revocable) storage instead of hard.
    #[arg(short = 's', long)]
    soft: bool,
    /// Per-operation network timeout, e.g. 60s.
    #[arg(short = 'T', long, env = "LORS_TIMEOUT", value_parser = duration_arg, default_value = "600s")]
    timeout: Duration,
    /// No end-to-end functions (the only mode so far; accepted for LoRS compatibility).
    #[arg(short = 'n', long = "none")]
    no_e2e: bool,
    /// Write the exNode here.
    #[arg(short, long, value_name = "OUT.xnd", conflicts_with = "auto_name")]
    output: Option<PathBuf>,
    /// Write the exNode to FILE.xnd.
    #[arg(short = 'f', long = "auto-name")]
    auto_name: bool,
    /// No progress display.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let _ = a.no_e2e;
    let stdin = a.file.as_os_str() == "-";
    let out = match (&a.output, a.auto_name) {
        (Some(o), _) => o.clone(),
        (None, true) if !stdin => {
            let mut s = a.file.clone().into_os_string();
            s.push(".xnd");
            PathBuf::from(s)
        }
        _ => {
            return Err(UsageError(
                "say where the exNode goes: -o OUT.xnd (or -f to write FILE.xnd)".into(),
            )
            .into());
        }
    };
    let filename = if stdin {
        out.file_stem()
            .map_or_else(|| "stdin".into(), |s| s.to_string_lossy().into_owned())
    } else {
        a.file
            .file_name()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    };
    let opts = UploadOptions {
        depots: a.depots.clone(),
        block_size: a.block_size,
        copies: a.copies,
        threads: a.threads,
        duration: a.duration,
        reliability: if a.soft {
            Reliability::Soft
        } else {
            Reliability::Hard
        },
        filename,
    };
    let cfg = ClientConfig {
        io_timeout: a.timeout,
        ..ClientConfig::default()
    };
    let progress = Arc::new(TermProgress::new("uploading", a.quiet));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = std::time::Instant::now();
    let x = rt.block_on(async {
        let pool = Arc::new(Pool::new(cfg));
        if stdin {
            upload(tokio::io::stdin(), None, &opts, pool, progress.clone()).await
        } else {
            let f = tokio::fs::File::open(&a.file)
                .await
                .with_context(|| format!("opening {}", a.file.display()))?;
            let size = f.metadata().await.ok().map(|m| m.len());
            upload(f, size, &opts, pool, progress.clone()).await
        }
        .map_err(anyhow::Error::from)
    })?;
    progress.finish();
    write_exnode(&out, &x)?;
    let size = x.logical_size();
    let secs = started.elapsed().as_secs_f64();
    if !a.quiet {
        eprintln!(
            "lors: uploaded {} bytes as {} mappings ({} copies) in {:.2}s, {:.1} MiB/s -> {}",
            size,
            x.mappings.len(),
            a.copies,
            secs,
            size as f64 / 1048576.0 / secs.max(1e-9),
            out.display()
        );
    }
    Ok(())
}
