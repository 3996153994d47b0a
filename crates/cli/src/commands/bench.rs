//! `lors bench`: characterize a data mover as "Simulations of Distributed Systems in a Computing Centre" does — sweep file
//! sizes, parallel files and streams; fit; report; predict.

use std::path::PathBuf;

mod results;
mod sweep;

/// Measure, fit and predict the throughput of a data mover (after
/// "Simulations of Distributed Systems in a Computing Centre").
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors bench sweep -o cp-run --scenario cp --sizes 16M,64M,256M --parallel 1,2,4,8
  lors bench sweep -o lo --sizes 1M,4M,16M,64M --parallel 1,2,4 --streams 1,4 -r 5
  lors bench sweep -o wan --depot d1:6714 --depot d2:6714 --dry-run
  lors bench fit lo
  lors bench report lo            # writes lo/report.html and lo/plot-*.svg
  lors bench predict lo --size 64M --parallel 4")]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Time transfers over lists of file sizes, parallel files and streams.
    Sweep(Box<sweep::SweepArgs>),
    /// Fit the candidate models to throughput against each variable.
    Fit(DirArgs),
    /// Write an HTML report with plots and the fit table.
    Report(DirArgs),
    /// How many transfers per minute the measured setup sustains.
    Predict(PredictArgs),
}

#[derive(clap::Args)]
pub(super) struct DirArgs {
    /// Results directory of `lors bench sweep`.
    pub(super) dir: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(clap::Args)]
pub(super) struct PredictArgs {
    /// Results directory of `lors bench sweep`.
    pub(super) dir: PathBuf,
    /// File size.
    #[arg(long, value_parser = super::nonzero_size_arg)]
    pub(super) size: u64,
    /// Files moved in parallel.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(super) parallel: u16,
    /// Streams per file.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(super) streams: u16,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match a.cmd {
        Cmd::Sweep(s) => sweep::run(*s),
        Cmd::Fit(d) => results::fit(&d),
        Cmd::Report(d) => results::report(&d),
        Cmd::Predict(p) => results::predict(&p),
    }
}
