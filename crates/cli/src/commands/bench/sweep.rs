//! `lors bench sweep`: its flags onto [`lors_bench::lab::SweepOptions`],
//! and the lab's progress and outcome onto the terminal.

use std::path::PathBuf;

use anyhow::Context as _;
use lors_bench::lab::{self, LabError, Outcome, Scenario, Step, SweepOptions};
use lors_bench::sweep::Plan;
use lors_ibp::units::{Bytes, Secs};

use crate::commands::outln;
use crate::exit::UsageError;

#[derive(clap::Args)]
#[command(
    after_help = "The sweep appends every timed transfer to DIR/runs.csv as it completes; \
run the same command again to resume an interrupted sweep, or with more \
repetitions or values to extend it. DIR/sweep.json holds the set-up (machine, \
versions, command) and the per-configuration statistics.

--command templates may use {src}, {dst}, {streams} and {size}, substituted as \
they are (quote them if your paths need it); the command runs under sh -c."
)]
pub(super) struct SweepArgs {
    /// Results directory.
    #[arg(short, long, value_name = "DIR")]
    out: PathBuf,
    /// The mover [default: depots with --depot, command with --command, else
    /// loopback].
    #[arg(long, value_enum)]
    scenario: Option<Scenario>,
    /// A depot to download from (repeat, or a comma list; files are striped
    /// over them). Without --depot, `--scenario depots` asks the L-Bone
    /// (-H, LBONE_SERVER, ~/.xndrc) for one, or --max-depots of them.
    #[arg(
        long = "depot",
        value_name = "HOST[:PORT]",
        value_delimiter = ',',
        value_parser = crate::commands::depot_arg
    )]
    depots: Vec<String>,
    #[command(flatten)]
    lbone: crate::commands::LboneOpts,
    #[command(flatten)]
    place: crate::commands::PlaceOpts,
    #[command(flatten)]
    net: crate::commands::NetOpts,
    /// A command template for --scenario command, e.g. 'rclone copyto {src} {dst}'.
    #[arg(long, value_name = "TEMPLATE")]
    command: Option<String>,
    /// File sizes.
    #[arg(long, value_delimiter = ',', value_parser = crate::commands::size_arg, default_value = "1M,2M,4M,16M,64M")]
    sizes: Vec<u64>,
    /// Numbers of files moved in parallel.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,6,8")]
    parallel: Vec<usize>,
    /// Streams per file (`-t` of lors download, `-p` of globus-url-copy).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    streams: Vec<usize>,
    /// Repetitions of each configuration (2 or more give error bars).
    #[arg(short, long, default_value_t = 5)]
    reps: usize,
    /// Time uploads to the depots (`lors upload`, one copy) instead of
    /// downloads; each upload is released once timed.
    #[arg(long)]
    upload: bool,
    /// Block size of the files on the depots (more blocks give streams
    /// something to share).
    #[arg(short = 'b', long, value_parser = crate::commands::nonzero_block_size_arg, default_value = "1M")]
    block_size: u64,
    /// List the planned runs and what staging takes, then stop.
    #[arg(long)]
    dry_run: bool,
    /// No progress lines.
    #[arg(short, long)]
    quiet: bool,
}

pub(super) fn run(mut a: SweepArgs) -> anyhow::Result<()> {
    // Movers get absolute paths: a GridFTP URL or a command run elsewhere
    // has no notion of our working directory.
    a.out =
        std::path::absolute(&a.out).with_context(|| format!("resolving {}", a.out.display()))?;
    let plan = check_plan(&a)?;
    let scenario = scenario_of(&a)?;
    if scenario == Scenario::Depots && a.depots.is_empty() {
        let rt = crate::commands::runtime(crate::commands::Threads::One)?;
        a.depots = lbone_depots(&a, &plan, &rt)?;
    }
    let o = SweepOptions {
        out: a.out.clone(),
        scenario,
        depots: a.depots.clone(),
        command: a.command.clone(),
        plan,
        upload: a.upload,
        block_size: a.block_size,
        dry_run: a.dry_run,
        quiet: a.quiet,
        lors: std::env::current_exe().context("finding the lors binary")?,
    };
    let quiet = a.quiet;
    let outcome = lab::sweep(&o, &mut |s| {
        if !quiet {
            progress(s);
        }
    })
    .map_err(|e| match e {
        LabError::Usage(m) => anyhow::Error::new(UsageError(m)),
        e => anyhow::Error::new(e),
    })?;
    let runs = o.out.join("runs.csv");
    match outcome {
        Outcome::Planned {
            todo,
            configs,
            done,
        } => {
            outln!(
                "{configs} configurations × {} repetitions: {} runs to do ({done} done already in {})",
                o.plan.reps,
                todo.len(),
                runs.display()
            );
            for (c, rep) in &todo {
                outln!(
                    "  {:>10} × {:>3} parallel, {:>2} stream{}, repetition {}",
                    format!("{:#}", Bytes(c.size)),
                    c.parallel,
                    c.streams,
                    if c.streams == 1 { " " } else { "s" },
                    rep + 1
                );
            }
            let slots = o.plan.parallel.iter().copied().max().unwrap_or(1);
            let staged = matches!(scenario, Scenario::Loopback | Scenario::Depots) && !o.upload;
            outln!(
                "staging: {} files, {:#} ({} scenario{})",
                o.plan.sizes.len() * slots,
                Bytes(o.plan.staged_bytes()),
                format!("{scenario:?}").to_lowercase(),
                if staged {
                    ", uploaded to the depots"
                } else {
                    ""
                }
            );
            Ok(())
        }
        Outcome::NothingToDo {
            done,
            planned,
            points,
        } => {
            outln!(
                "nothing to do: the {planned} runs planned are done, {done} timed transfers in {} (raise -r or add values to extend the sweep)",
                runs.display()
            );
            super::results::print_points(&points)
        }
        Outcome::Swept(file) => {
            super::results::print_points(&file.points)?;
            outln!(
                "{} runs in {}; next: lors bench fit {dir}, lors bench report {dir}",
                file.runs.len(),
                runs.display(),
                dir = o.out.display()
            );
            Ok(())
        }
    }
}

/// A progress line for a timed configuration.
fn progress(s: &Step<'_>) {
    let c = s.config;
    let mean = s.times.iter().sum::<f64>() / s.times.len() as f64;
    eprintln!(
        "[{}/{}] {:#} × {} parallel, {} stream{}, rep {}: {:.3} s/file, {:.1} MiB/s per file — ETA {}",
        s.index + 1,
        s.of,
        Bytes(c.size),
        c.parallel,
        c.streams,
        if c.streams == 1 { "" } else { "s" },
        s.rep + 1,
        mean,
        c.size as f64 / mean / (1u64 << 20) as f64,
        Secs(s.left.round() as u64)
    );
}

fn check_plan(a: &SweepArgs) -> Result<Plan, UsageError> {
    let bad = |m: &str| Err(UsageError(m.to_string()));
    if a.sizes.is_empty() || a.sizes.contains(&0) {
        return bad("--sizes: give sizes above 0, e.g. --sizes 1M,16M");
    }
    if a.parallel.is_empty() || a.parallel.contains(&0) || a.parallel.iter().any(|&p| p > 256) {
        return bad("--parallel: give counts from 1 to 256, e.g. --parallel 1,2,4");
    }
    if a.streams.is_empty() || a.streams.contains(&0) || a.streams.iter().any(|&s| s > 64) {
        return bad("--streams: give counts from 1 to 64");
    }
    if a.reps == 0 {
        return bad("--reps: at least 1 (2 or more for error bars)");
    }
    Ok(Plan {
        sizes: sorted_unique(&a.sizes),
        parallel: sorted_unique(&a.parallel),
        streams: sorted_unique(&a.streams),
        reps: a.reps,
    })
}

fn sorted_unique<T: Ord + Copy>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

fn scenario_of(a: &SweepArgs) -> Result<Scenario, UsageError> {
    let s = a
        .scenario
        .unwrap_or(if !a.depots.is_empty() || !a.lbone.lbone.is_empty() {
            Scenario::Depots
        } else if a.command.is_some() {
            Scenario::Command
        } else {
            Scenario::Loopback
        });
    match s {
        Scenario::Command if a.command.is_none() => Err(UsageError(
            "--scenario command needs --command TEMPLATE, e.g. --command 'cp {src} {dst}'".into(),
        )),
        s if a.upload && !matches!(s, Scenario::Loopback | Scenario::Depots) => Err(UsageError(
            format!("--upload is for the loopback and depots scenarios, not {s:?}").to_lowercase(),
        )),
        s if s != Scenario::Depots && !a.depots.is_empty() => Err(UsageError(
            format!("--depot is for --scenario depots, not {s:?}").to_lowercase(),
        )),
        s => Ok(s),
    }
}

/// The depots an L-Bone (or ~/.xndrc) names for the staged files: one,
/// or --max-depots, with room for a block.
fn lbone_depots(
    a: &SweepArgs,
    plan: &Plan,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<String>> {
    let s = crate::commands::settings(&a.net, a.place.layer(a.lbone.layer()), None)?;
    let block = plan
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .min(a.block_size);
    let placement = crate::commands::Placement {
        depots: &[],
        settings: &s,
    };
    Ok(placement
        .find(rt, 1, block + (64 << 10), Vec::new())?
        .depots)
}
