//! `lors bench`: characterize a data mover as "Simulations of Distributed Systems in a Computing Centre" does — sweep file
//! sizes, parallel files and streams; fit; report; predict.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use lors_bench::analysis::{self, Curve};
use lors_bench::sweep::{self, Check, Config, Mover, Plan, Point};
use serde::{Deserialize, Serialize};

use super::size_arg;
use crate::UsageError;
use lors_ibp::units::{Bytes, Secs};

/// Measure, fit and predict the throughput of a data mover (after "Simulations
/// of Distributed Systems in a Computing Centre", "Simulations of Distributed Systems in a Computing Centre").
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
    Sweep(Box<SweepArgs>),
    /// Fit the candidate models to throughput against each variable.
    Fit(DirArgs),
    /// Write an HTML report with plots and the fit table.
    Report(DirArgs),
    /// How many transfers per minute the measured setup sustains.
    Predict(PredictArgs),
}

/// What moves the files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Scenario {
    /// Plain `cp` between local paths ("Simulations of Distributed Systems in a Computing Centre" scenario 1).
    Cp,
    /// `lors download` from a depot started for the sweep on 127.0.0.1.
    Loopback,
    /// `lors download` from the depots given with --depot.
    Depots,
    /// `globus-url-copy` from a GridFTP server started on 127.0.0.1
    /// ("Simulations of Distributed Systems in a Computing Centre" scenario 2).
    Gridftp,
    /// Your own command (--command).
    Command,
}

#[derive(clap::Args)]
#[command(
    after_help = "The sweep appends every timed transfer to DIR/runs.csv as it completes; \
run the same command again to resume an interrupted sweep, or with more \
repetitions or values to extend it. DIR/sweep.json holds the set-up (machine, \
versions, command) and the per-configuration statistics.

--command templates may use {src}, {dst}, {streams} and {size}, substituted as \
they are (quote them if your paths need it); the command runs under sh -c."
)]
struct SweepArgs {
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
        value_parser = super::depot_arg
    )]
    depots: Vec<String>,
    #[command(flatten)]
    lbone: super::LboneOpts,
    #[command(flatten)]
    place: super::PlaceOpts,
    #[command(flatten)]
    net: super::NetOpts,
    /// A command template for --scenario command, e.g. 'rclone copyto {src} {dst}'.
    #[arg(long, value_name = "TEMPLATE")]
    command: Option<String>,
    /// File sizes.
    #[arg(long, value_delimiter = ',', value_parser = size_arg, default_value = "1M,2M,4M,16M,64M")]
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
    #[arg(short = 'b', long, value_parser = super::nonzero_block_size_arg, default_value = "1M")]
    block_size: u64,
    /// List the planned runs and what staging takes, then stop.
    #[arg(long)]
    dry_run: bool,
    /// No progress lines.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct DirArgs {
    /// Results directory of `lors bench sweep`.
    dir: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct PredictArgs {
    /// Results directory of `lors bench sweep`.
    dir: PathBuf,
    /// File size.
    #[arg(long, value_parser = super::nonzero_size_arg)]
    size: u64,
    /// Files moved in parallel.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    parallel: u16,
    /// Streams per file.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    streams: u16,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match a.cmd {
        Cmd::Sweep(s) => sweep_cmd(*s),
        Cmd::Fit(d) => fit_cmd(&d),
        Cmd::Report(d) => report_cmd(&d),
        Cmd::Predict(p) => predict_cmd(&p),
    }
}

/// The set-up of a sweep, kept in sweep.json.
#[derive(Serialize, Deserialize)]
struct Meta {
    scenario: Scenario,
    /// What the scenario moves from and with, e.g. the depots or the command.
    target: String,
    /// The mover's command line, placeholders unfilled.
    command: Vec<String>,
    lors_version: String,
    host: String,
    kernel: String,
    cpu: String,
    cpus: usize,
    memory: String,
    /// Unix time of the first run.
    started: u64,
    plan: Plan,
}

#[derive(Serialize, Deserialize)]
struct SweepFile {
    meta: Meta,
    runs: Vec<sweep::Run>,
    points: Vec<Point>,
    /// Mean over configurations of the total throughput, bytes/s.
    mean_total: Option<f64>,
}

fn first_line(path: &str, key: Option<&str>) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let line = match key {
        Some(k) => text
            .lines()
            .find(|l| l.starts_with(k))
            .map(|l| l.split_once(':').map_or(l, |(_, v)| v)),
        None => text.lines().next(),
    };
    line.unwrap_or("unknown").trim().to_string()
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
    let s = super::settings(&a.net, a.place.layer(a.lbone.layer()), None)?;
    let block = plan
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .min(a.block_size);
    let placement = super::Placement {
        depots: &[],
        settings: &s,
    };
    Ok(placement
        .find(rt, 1, block + (64 << 10), Vec::new())?
        .depots)
}

/// A process the sweep started (a GridFTP server); killed when dropped.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a running sweep holds on to: the loopback depot, a server.
#[derive(Default)]
struct Guards {
    depot_stop: Option<tokio::sync::watch::Sender<bool>>,
    server: Option<Child>,
}

/// The sweep's one runtime and connection pool: the L-Bone query, the
/// loopback depot, and every release of staged files and timed uploads.
struct Net {
    rt: tokio::runtime::Runtime,
    pool: Arc<lors::Pool>,
}

impl Net {
    fn new() -> anyhow::Result<Net> {
        // Worker threads: the loopback depot serves while the sweep waits
        // on its movers.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let pool = Arc::new(lors::Pool::new(lors_ibp::ClientConfig::default()));
        Ok(Net { rt, pool })
    }

    /// Releases `mappings`' allocations within 20 s; returns how many
    /// were not.
    fn release(&self, mappings: Vec<lors_exnode::Mapping>) -> usize {
        let n = mappings.len();
        self.rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), self.pool.release_all(mappings))
                .await
                .map_or(n, |kept| kept.len())
        })
    }
}

fn sweep_cmd(mut a: SweepArgs) -> anyhow::Result<()> {
    // Movers get absolute paths: a GridFTP URL or a command run elsewhere
    // has no notion of our working directory.
    a.out =
        std::path::absolute(&a.out).with_context(|| format!("resolving {}", a.out.display()))?;
    let plan = check_plan(&a)?;
    let scenario = scenario_of(&a)?;
    let net = Net::new()?;
    if scenario == Scenario::Depots && a.depots.is_empty() {
        a.depots = lbone_depots(&a, &plan, &net.rt)?;
    }
    let runs_path = a.out.join("runs.csv");
    let json_path = a.out.join("sweep.json");
    let up = if a.upload { "uploads to " } else { "" };
    let target = match scenario {
        Scenario::Depots => format!("{up}{}", a.depots.join(",")),
        Scenario::Command => a.command.clone().unwrap_or_default(),
        Scenario::Gridftp => "globus-gridftp-server on 127.0.0.1".into(),
        Scenario::Loopback => format!("{up}a depot on 127.0.0.1"),
        Scenario::Cp => "local files".into(),
    };
    let old: Option<SweepFile> = match std::fs::read(&json_path) {
        Ok(b) => Some(
            serde_json::from_slice(&b)
                .with_context(|| format!("reading {}", json_path.display()))?,
        ),
        Err(_) => None,
    };
    if let Some(o) = &old
        && (o.meta.scenario != scenario || o.meta.target != target)
    {
        return Err(UsageError(format!(
            "{} holds a sweep of {:?} ({}); give another -o DIR for {:?} ({target})",
            a.out.display(),
            o.meta.scenario,
            o.meta.target,
            scenario
        ))
        .into());
    }
    let done = sweep::read_runs(&runs_path)?;
    let todo = plan.pending(&done);
    let configs = plan.configs();
    let slots = plan.parallel.iter().copied().max().unwrap_or(1);
    if a.dry_run {
        super::outln!(
            "{} configurations × {} repetitions: {} runs to do ({} done already in {})",
            configs.len(),
            plan.reps,
            todo.len(),
            done.len(),
            runs_path.display()
        );
        for (c, rep) in &todo {
            super::outln!(
                "  {:>10} × {:>3} parallel, {:>2} stream{}, repetition {}",
                format!("{:#}", Bytes(c.size)),
                c.parallel,
                c.streams,
                if c.streams == 1 { " " } else { "s" },
                rep + 1
            );
        }
        super::outln!(
            "staging: {} files, {:#} ({} scenario{})",
            plan.sizes.len() * slots,
            Bytes(plan.staged_bytes()),
            format!("{scenario:?}").to_lowercase(),
            if matches!(scenario, Scenario::Loopback | Scenario::Depots) && !a.upload {
                ", uploaded to the depots"
            } else {
                ""
            }
        );
        return Ok(());
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let stage = a.out.join("stage");
    let scratch = a.out.join("scratch");
    // What an interrupted sweep staged: released now (the loopback depot's
    // data lives in the stage directory itself, gone with it).
    if scenario == Scenario::Loopback {
        let _ = std::fs::remove_dir_all(&stage);
    }
    release_staged(&scratch, &net);
    release_staged(&stage, &net);
    if stage.exists() {
        anyhow::bail!(
            "{} holds staged files on depots that cannot be reached now; remove it once they are released or expired",
            stage.display()
        );
    }
    if todo.is_empty() && old.is_some() {
        super::outln!(
            "nothing to do: the {} runs planned are done, {} timed transfers in {} (raise -r or add values to extend the sweep)",
            configs.len() * plan.reps,
            done.len(),
            runs_path.display()
        );
        return print_points(&sweep::summarize(&done));
    }
    std::fs::create_dir_all(&stage)?;
    std::fs::create_dir_all(&scratch)?;
    let mut guards = Guards::default();
    let lors = std::env::current_exe().context("finding the lors binary")?;
    let result = (|| -> anyhow::Result<()> {
        let (mover, sources) = prepare(scenario, &a, &plan, &stage, &lors, &net, &mut guards)?;
        let meta = Meta {
            scenario,
            target: target.clone(),
            command: mover.argv.clone(),
            lors_version: env!("CARGO_PKG_VERSION").into(),
            host: first_line("/proc/sys/kernel/hostname", None),
            kernel: first_line("/proc/sys/kernel/osrelease", None),
            cpu: first_line("/proc/cpuinfo", Some("model name")),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory: first_line("/proc/meminfo", Some("MemTotal")),
            started: old
                .as_ref()
                .map_or_else(lors_ibp::units::unix_now, |o| o.meta.started),
            plan: plan.clone(),
        };
        // An upload's allocations go as soon as it is timed.
        let mut release = |dst: &Path| {
            if mover.check == Check::NonEmpty
                && let Ok(x) = lors::xnd::load(dst)
            {
                let kept = net.release(x.mappings);
                if kept > 0 {
                    eprintln!(
                        "warning: {kept} allocations of a timed upload could not be released now; their lease ends within the hour"
                    );
                }
            }
        };
        let mut all = done.clone();
        let t0 = Instant::now();
        for (i, (c, rep)) in todo.iter().enumerate() {
            let times = mover.run(*c, &sources[&c.size], &scratch, &mut release).map_err(|e| {
                anyhow::anyhow!(
                    "{e}\n{} runs are saved in {}; fix the cause and run the same command to resume",
                    all.len(),
                    runs_path.display()
                )
            })?;
            let new: Vec<sweep::Run> = times
                .iter()
                .enumerate()
                .map(|(file, &seconds)| sweep::Run {
                    config: *c,
                    rep: *rep,
                    file,
                    seconds,
                })
                .collect();
            sweep::append_runs(&runs_path, &new)?;
            all.extend_from_slice(&new);
            if !a.quiet {
                let mean = times.iter().sum::<f64>() / times.len() as f64;
                let left =
                    t0.elapsed().as_secs_f64() / (i + 1) as f64 * (todo.len() - i - 1) as f64;
                eprintln!(
                    "[{}/{}] {:#} × {} parallel, {} stream{}, rep {}: {:.3} s/file, {:.1} MiB/s per file — ETA {}",
                    i + 1,
                    todo.len(),
                    Bytes(c.size),
                    c.parallel,
                    c.streams,
                    if c.streams == 1 { "" } else { "s" },
                    rep + 1,
                    mean,
                    c.size as f64 / mean / (1u64 << 20) as f64,
                    Secs(left.round() as u64)
                );
            }
        }
        let points = sweep::summarize(&all);
        let file = SweepFile {
            mean_total: sweep::mean_total(&points),
            meta,
            runs: all,
            points,
        };
        write_atomic(&json_path, &serde_json::to_vec_pretty(&file)?)?;
        print_points(&file.points)?;
        super::outln!(
            "{} runs in {}; next: lors bench fit {dir}, lors bench report {dir}",
            file.runs.len(),
            runs_path.display(),
            dir = a.out.display()
        );
        Ok(())
    })();
    release_staged(&stage, &net);
    let _ = std::fs::remove_dir_all(&scratch);
    if let Some(stop) = guards.depot_stop.take() {
        let _ = stop.send(true);
    }
    drop(guards);
    net.rt.shutdown_timeout(Duration::from_secs(5));
    result
}

fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing {}", path.display()))
}

/// Incompressible bytes, cheaply: a xorshift stream.
fn write_source(path: &Path, size: u64, seed: u64) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut left = size;
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        for chunk in buf.chunks_exact_mut(8) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            chunk.copy_from_slice(&s.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()
}

/// Stages the sources and builds the mover: local files for cp, GridFTP
/// and commands; exNodes of files uploaded to the depots for lors.
fn prepare(
    scenario: Scenario,
    a: &SweepArgs,
    plan: &Plan,
    stage: &Path,
    lors: &Path,
    net: &Net,
    guards: &mut Guards,
) -> anyhow::Result<(Mover, std::collections::HashMap<u64, Vec<String>>)> {
    let slots = plan.parallel.iter().copied().max().unwrap_or(1);
    let word = |s: &str| s.to_string();
    if scenario == Scenario::Gridftp {
        for p in ["globus-url-copy", "globus-gridftp-server"] {
            if which(p).is_none() {
                return Err(UsageError(format!(
                    "{p} is not installed (Debian: apt-get install globus-gass-copy-progs globus-gridftp-server-progs)"
                ))
                .into());
            }
        }
    }
    if !a.quiet {
        eprintln!(
            "staging {} files, {:#}",
            plan.sizes.len() * slots,
            Bytes(plan.staged_bytes())
        );
    }
    let depots = match scenario {
        Scenario::Loopback => vec![start_depot(plan, stage, &net.rt, guards)?],
        Scenario::Depots => a.depots.clone(),
        _ => Vec::new(),
    };
    let mut sources = std::collections::HashMap::new();
    for &size in &plan.sizes {
        let mut list = Vec::new();
        for i in 0..slots {
            let src = stage.join(format!("src-{size}-{i}"));
            write_source(&src, size, size ^ ((i as u64) << 48))
                .with_context(|| format!("writing {}", src.display()))?;
            if depots.is_empty() || a.upload {
                list.push(src.display().to_string());
                continue;
            }
            let xnd = src.with_extension("xnd");
            let mut cmd = std::process::Command::new(lors);
            cmd.arg("upload")
                .arg(&src)
                .args(["-c", "1", "-n", "-q", "-d", "1d", "-b"]);
            cmd.arg(format!("{}B", a.block_size)).arg("-o").arg(&xnd);
            for d in &depots {
                cmd.args(["--depot", d]);
            }
            let out = cmd
                .output()
                .context("running lors upload to stage a file")?;
            if !out.status.success() {
                anyhow::bail!(
                    "staging {:#} on {} failed: {}",
                    Bytes(size),
                    depots.join(", "),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            std::fs::remove_file(&src)?;
            list.push(xnd.display().to_string());
        }
        sources.insert(size, list);
    }
    let mover = match scenario {
        Scenario::Cp => Mover {
            argv: ["cp", "{src}", "{dst}"].map(word).to_vec(),
            check: Check::Size,
        },
        Scenario::Loopback | Scenario::Depots if a.upload => {
            let mut argv = vec![
                lors.display().to_string(),
                word("upload"),
                word("-q"),
                word("{src}"),
            ];
            for w in [
                "-o",
                "{dst}",
                "-c",
                "1",
                "-n",
                "-d",
                "1h",
                "-t",
                "{streams}",
                "-b",
            ] {
                argv.push(word(w));
            }
            argv.push(format!("{}B", a.block_size));
            for d in &depots {
                argv.push(word("--depot"));
                argv.push(d.clone());
            }
            Mover {
                argv,
                check: Check::NonEmpty,
            }
        }
        Scenario::Loopback | Scenario::Depots => Mover {
            argv: vec![
                lors.display().to_string(),
                word("download"),
                word("-q"),
                word("{src}"),
                word("-o"),
                word("{dst}"),
                word("-t"),
                word("{streams}"),
            ],
            check: Check::Size,
        },
        Scenario::Gridftp => {
            let port = start_gridftp(stage, guards)?;
            for list in sources.values_mut() {
                for s in list.iter_mut() {
                    *s = format!("ftp://127.0.0.1:{port}{s}");
                }
            }
            Mover {
                argv: [
                    "globus-url-copy",
                    "-p",
                    "{streams}",
                    "{src}",
                    "file://{dst}",
                ]
                .map(word)
                .to_vec(),
                check: Check::Size,
            }
        }
        Scenario::Command => {
            let t = a.command.clone().unwrap_or_default();
            Mover {
                check: if t.contains("{dst}") {
                    Check::Size
                } else {
                    Check::Nothing
                },
                argv: vec![word("sh"), word("-c"), t],
            }
        }
    };
    Ok((mover, sources))
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// Starts a depot on 127.0.0.1 for the loopback scenario, its data under
/// the stage directory; returns its address.
fn start_depot(
    plan: &Plan,
    stage: &Path,
    rt: &tokio::runtime::Runtime,
    guards: &mut Guards,
) -> anyhow::Result<String> {
    use lors_depot::config::{ByteSize, Config as DepotConfig, ResourceConfig, SyncPolicy};
    let mut r = ResourceConfig::new("1", stage.join("depot"));
    r.size = ByteSize(plan.staged_bytes() + plan.staged_bytes() / 4 + (64 << 20));
    let cfg = DepotConfig {
        listen: "127.0.0.1:0".parse()?,
        sync: SyncPolicy::Never,
        resources: vec![r],
        ..DepotConfig::default()
    };
    let (addr, stop) = rt.block_on(async {
        let depot = lors_depot::Depot::open(cfg)
            .await
            .context("opening the loopback depot")?;
        let l = depot.bind().await?;
        let addr = l.ibp.local_addr()?.to_string();
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(lors_depot::server::run(l, depot, rx));
        anyhow::Ok((addr, tx))
    })?;
    guards.depot_stop = Some(stop);
    Ok(addr)
}

/// Starts an anonymous GridFTP server on 127.0.0.1 serving the stage
/// directory, as "Simulations of Distributed Systems in a Computing Centre"'s scenario 2 ran one on the node itself.
fn start_gridftp(stage: &Path, guards: &mut Guards) -> anyhow::Result<u16> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    // As root the server serves anonymous users as `nobody`: the staged
    // files must be readable by everyone, and every directory above them
    // searchable.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if root {
        let stage = stage.canonicalize()?;
        for e in std::fs::read_dir(&stage)?.flatten() {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o644))?;
        }
        std::fs::set_permissions(&stage, std::fs::Permissions::from_mode(0o755))?;
        if let Some(closed) = stage
            .ancestors()
            .skip(1)
            .find(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
        {
            return Err(UsageError(format!(
                "the GridFTP server serves anonymous users as nobody, who cannot enter {}: \
                 use an -o directory under world-searchable directories, or chmod o+x it",
                closed.display()
            ))
            .into());
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = stage.join("gridftp.log");
    let child = std::process::Command::new("globus-gridftp-server")
        .args(["-aa", "-control-interface", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(if root {
            &["-anonymous-user", "nobody"][..]
        } else {
            &[]
        })
        .args(["-d", "error", "-l"])
        .arg(&log)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting globus-gridftp-server")?;
    guards.server = Some(Child(child));
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            anyhow::bail!(
                "globus-gridftp-server did not listen on 127.0.0.1:{port} within 15 s (log: {})",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(port)
}

/// Releases the allocations named by the exNodes in `dir` (staged files,
/// or timed uploads an interrupted sweep left in scratch) and removes it;
/// what a depot that cannot be reached holds stays named by the exNodes
/// left there, until its lease ends.
fn release_staged(stage: &Path, net: &Net) {
    let Ok(entries) = std::fs::read_dir(stage) else {
        return;
    };
    let mappings: Vec<_> = entries
        .flatten()
        // Staged exNodes, and what a timed upload cut short left in scratch.
        .filter(|e| {
            let p = e.path();
            p.extension().is_some_and(|x| x == "xnd")
                || (e.file_name().to_string_lossy().starts_with("dst-")
                    && e.metadata().is_ok_and(|m| m.len() < (16 << 20)))
        })
        .filter_map(|e| lors::xnd::load(&e.path()).ok())
        .flat_map(|x| x.mappings)
        .collect();
    if mappings.is_empty() {
        let _ = std::fs::remove_dir_all(stage);
        return;
    }
    if net.release(mappings) == 0 {
        let _ = std::fs::remove_dir_all(stage);
    } else {
        eprintln!(
            "warning: some allocations of an earlier sweep could not be released now; their leases end within a day (exNodes in {})",
            stage.display()
        );
    }
}

fn print_points(points: &[Point]) -> anyhow::Result<()> {
    const MIB: f64 = (1u64 << 20) as f64;
    super::outln!(
        "{:>10} {:>8} {:>7} {:>16} {:>12} {:>13}",
        "size",
        "parallel",
        "streams",
        "per file MiB/s",
        "± error",
        "total MiB/s"
    );
    for p in points {
        super::outln!(
            "{:>10} {:>8} {:>7} {:>16.2} {:>12} {:>13.2}",
            format!("{:#}", Bytes(p.config.size)),
            p.config.parallel,
            p.config.streams,
            p.mean / MIB,
            p.error
                .map_or_else(|| "–".into(), |e| format!("{:.2}", e / MIB)),
            p.total / MIB
        );
    }
    if let Some(t) = sweep::mean_total(points) {
        super::outln!(
            "total throughput, mean over configurations: {:.2} MiB/s",
            t / MIB
        );
    }
    Ok(())
}

/// The runs of a results directory, reduced and fitted.
fn load(dir: &Path) -> anyhow::Result<(Option<Meta>, Vec<Point>, Vec<Curve>)> {
    let runs = sweep::read_runs(&dir.join("runs.csv"))?;
    if runs.is_empty() {
        return Err(UsageError(format!(
            "{} holds no runs: run `lors bench sweep -o {}` first",
            dir.display(),
            dir.display()
        ))
        .into());
    }
    let meta = std::fs::read(dir.join("sweep.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<SweepFile>(&b).ok())
        .map(|f| f.meta);
    let points = sweep::summarize(&runs);
    let curves = analysis::curves(&points);
    Ok((meta, points, curves))
}

#[derive(Serialize)]
struct Fits<'a> {
    points: &'a [Point],
    curves: &'a [Curve],
    table: Vec<analysis::TableRow>,
    mean_total: Option<f64>,
}

fn fit_cmd(d: &DirArgs) -> anyhow::Result<()> {
    let (_, points, curves) = load(&d.dir)?;
    let fits = Fits {
        points: &points,
        curves: &curves,
        table: analysis::table(&curves),
        mean_total: sweep::mean_total(&points),
    };
    let json = serde_json::to_vec_pretty(&fits)?;
    write_atomic(&d.dir.join("fits.json"), &json)?;
    if d.json {
        super::outln!("{}", String::from_utf8_lossy(&json));
        return Ok(());
    }
    if curves.is_empty() {
        super::outln!(
            "no curves to fit: vary a variable over {} values or more",
            analysis::MIN_CURVE_POINTS
        );
        return Ok(());
    }
    super::outln!(
        "{:<9} {:<10} {:<26} {:>7} {:>8} {:>8}",
        "variable",
        "model",
        "function",
        "curves",
        "mean R²",
        "adjusted"
    );
    for r in &fits.table {
        super::outln!(
            "{:<9} {:<10} {:<26} {:>7} {:>8.4} {:>8}",
            r.var.name(),
            r.model.name(),
            r.model.formula(),
            format!("{}/{}", r.curves, r.of),
            r.mean_r2,
            r.mean_adj_r2
                .map_or_else(|| "–".into(), |v| format!("{v:.4}"))
        );
    }
    super::outln!();
    for c in &curves {
        match c.best() {
            Some(f) => {
                let params: Vec<String> = f
                    .params
                    .iter()
                    .zip(["a", "b", "c", "d"])
                    .map(|(v, n)| format!("{n}={v:.4e}"))
                    .collect();
                super::outln!(
                    "throughput vs {} at {}: {} R² {:.4} ({})",
                    c.var.name(),
                    c.describe_fixed(),
                    f.model,
                    f.r2,
                    params.join(" ")
                );
            }
            None => super::outln!(
                "throughput vs {} at {}: no model fits",
                c.var.name(),
                c.describe_fixed()
            ),
        }
    }
    super::outln!("written: {}", d.dir.join("fits.json").display());
    Ok(())
}

fn report_cmd(d: &DirArgs) -> anyhow::Result<()> {
    let (meta, points, curves) = load(&d.dir)?;
    let mut rows: Vec<(String, String)> = Vec::new();
    if let Some(m) = &meta {
        rows.push((
            "scenario".into(),
            format!("{:?}: {}", m.scenario, m.target).to_lowercase(),
        ));
        rows.push(("mover".into(), m.command.join(" ")));
        rows.push(("lors".into(), m.lors_version.clone()));
        rows.push((
            "host".into(),
            format!(
                "{} ({}; {} CPUs, {}; Linux {})",
                m.host, m.cpu, m.cpus, m.memory, m.kernel
            ),
        ));
        rows.push(("started".into(), super::utc(m.started)));
        let p = &m.plan;
        rows.push((
            "plan".into(),
            format!(
                "sizes {}; parallel {:?}; streams {:?}; {} repetitions",
                p.sizes
                    .iter()
                    .map(|&s| format!("{:#}", Bytes(s)))
                    .collect::<Vec<_>>()
                    .join(", "),
                p.parallel,
                p.streams,
                p.reps
            ),
        ));
    }
    let html = lors_bench::report::html("lors bench report", &rows, &points, &curves);
    let out = d.dir.join("report.html");
    write_atomic(&out, html.as_bytes())?;
    for var in analysis::Var::ALL {
        let along: Vec<&Curve> = curves.iter().filter(|c| c.var == var).collect();
        if !along.is_empty() {
            write_atomic(
                &d.dir.join(format!("plot-{}.svg", var.name())),
                lors_bench::report::svg(var, &along).as_bytes(),
            )?;
        }
    }
    if d.json {
        super::outln!(
            "{}",
            serde_json::json!({ "report": out, "curves": curves.len() })
        );
    } else {
        super::outln!("written: {} ({} curves)", out.display(), curves.len());
    }
    Ok(())
}

fn predict_cmd(p: &PredictArgs) -> anyhow::Result<()> {
    let (_, _, curves) = load(&p.dir)?;
    let q = Config {
        size: p.size,
        parallel: usize::from(p.parallel),
        streams: usize::from(p.streams),
    };
    let pred = analysis::predict(&curves, q).map_err(|e| anyhow::anyhow!("{e}"))?;
    if p.json {
        super::outln!("{}", serde_json::to_string_pretty(&pred)?);
    } else {
        super::outln!("{pred}");
    }
    Ok(())
}
