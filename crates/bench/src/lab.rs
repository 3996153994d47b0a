//! What a sweep sets up and runs: the staged source files, a depot on
//! 127.0.0.1 for the loopback scenario, a GridFTP server for the GridFTP
//! one, the mover's command line, and the timed runs themselves, appended
//! to `DIR/runs.csv` as they complete so an interrupted sweep resumes.
//! `lors bench sweep` maps its flags onto [`SweepOptions`] and calls
//! [`sweep()`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lors_ibp::units::Bytes;
use serde::{Deserialize, Serialize};

use crate::sweep::{self, Check, Config, Mover, Plan, Point, Run, SweepError};

/// What moves the files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Plain `cp` between local paths ("Simulations of Distributed Systems
    /// in a Computing Centre" scenario 1).
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

/// A sweep as asked for: where, with what, over which values.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// Results directory (absolute: movers run elsewhere).
    pub out: PathBuf,
    /// The mover.
    pub scenario: Scenario,
    /// The depots of the depots scenario.
    pub depots: Vec<String>,
    /// The command template of the command scenario.
    pub command: Option<String>,
    /// The values and repetitions.
    pub plan: Plan,
    /// Time uploads instead of downloads (loopback and depots).
    pub upload: bool,
    /// Block size of the files on the depots.
    pub block_size: u64,
    /// Only list what would run.
    pub dry_run: bool,
    /// No progress lines on stderr.
    pub quiet: bool,
    /// The `lors` program the depot scenarios run.
    pub lors: PathBuf,
}

/// Why a sweep stopped.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The sweep asked for cannot run as given (a tool missing, a
    /// directory in use): the fix is the user's.
    #[error("{0}")]
    Usage(String),
    /// Local I/O.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file could not be staged, or a server started.
    #[error("{0}")]
    Setup(String),
    /// Reading the runs or running a mover; `saved` runs are kept.
    #[error(
        "{source}\n{saved} runs are saved in {runs}; fix the cause and run the same command to resume"
    )]
    Run {
        /// The failure.
        source: SweepError,
        /// Runs saved so far.
        saved: usize,
        /// The runs file.
        runs: String,
    },
    /// The runs file could not be read or written.
    #[error(transparent)]
    Runs(#[from] SweepError),
    /// `sweep.json` could not be read.
    #[error("reading {path}: {source}")]
    Json {
        /// The file.
        path: String,
        /// The error.
        source: serde_json::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Io { what, source }
}

/// The set-up of a sweep, kept in sweep.json.
#[derive(Serialize, Deserialize)]
pub struct Meta {
    /// The mover.
    pub scenario: Scenario,
    /// What the scenario moves from and with, e.g. the depots or the command.
    pub target: String,
    /// The mover's command line, placeholders unfilled.
    pub command: Vec<String>,
    /// The version of the tools.
    pub lors_version: String,
    /// The machine.
    pub host: String,
    /// Its kernel.
    pub kernel: String,
    /// Its processor.
    pub cpu: String,
    /// Its processors.
    pub cpus: usize,
    /// Its memory.
    pub memory: String,
    /// Unix time of the first run.
    pub started: u64,
    /// The values swept.
    pub plan: Plan,
}

/// `DIR/sweep.json`.
#[derive(Serialize, Deserialize)]
pub struct SweepFile {
    /// The set-up.
    pub meta: Meta,
    /// Every timed transfer.
    pub runs: Vec<Run>,
    /// The runs reduced per configuration.
    pub points: Vec<Point>,
    /// Mean over configurations of the total throughput, bytes/s.
    pub mean_total: Option<f64>,
}

/// The set-up of a results directory, if it holds one.
pub fn read_meta(dir: &Path) -> Option<Meta> {
    std::fs::read(dir.join("sweep.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<SweepFile>(&b).ok())
        .map(|f| f.meta)
}

/// What a sweep did.
pub enum Outcome {
    /// A dry run: the runs still to do (configuration, repetition), of
    /// `configs` configurations, with `done` runs recorded already.
    Planned {
        /// Runs to do.
        todo: Vec<(Config, usize)>,
        /// Configurations planned.
        configs: usize,
        /// Runs recorded already.
        done: usize,
    },
    /// Every planned run was done before: the points as they are.
    NothingToDo {
        /// Runs recorded.
        done: usize,
        /// Runs planned.
        planned: usize,
        /// The runs reduced.
        points: Vec<Point>,
    },
    /// The sweep ran: `sweep.json` as written.
    Swept(Box<SweepFile>),
}

/// One timed configuration, for progress lines.
pub struct Step<'a> {
    /// Which of `of`.
    pub index: usize,
    /// Runs in this sweep.
    pub of: usize,
    /// The configuration and repetition.
    pub config: Config,
    /// Its repetition.
    pub rep: usize,
    /// Each file's seconds.
    pub times: &'a [f64],
    /// Estimated seconds left.
    pub left: f64,
}

/// What a sweep of `o` targets, as `sweep.json` names it.
pub fn target(o: &SweepOptions) -> String {
    let up = if o.upload { "uploads to " } else { "" };
    match o.scenario {
        Scenario::Depots => format!("{up}{}", o.depots.join(",")),
        Scenario::Command => o.command.clone().unwrap_or_default(),
        Scenario::Gridftp => "globus-gridftp-server on 127.0.0.1".into(),
        Scenario::Loopback => format!("{up}a depot on 127.0.0.1"),
        Scenario::Cp => "local files".into(),
    }
}

/// Runs the sweep `o` asks for (or plans it, with `dry_run`), calling
/// `step` after each configuration is timed.
pub fn sweep(o: &SweepOptions, step: &mut dyn FnMut(&Step<'_>)) -> Result<Outcome, LabError> {
    let runs_path = o.out.join("runs.csv");
    let json_path = o.out.join("sweep.json");
    let target = target(o);
    let old: Option<SweepFile> = match std::fs::read(&json_path) {
        Ok(b) => Some(serde_json::from_slice(&b).map_err(|source| LabError::Json {
            path: json_path.display().to_string(),
            source,
        })?),
        Err(_) => None,
    };
    if let Some(m) = old.as_ref().map(|f| &f.meta)
        && (m.scenario != o.scenario || m.target != target)
    {
        return Err(LabError::Usage(format!(
            "{} holds a sweep of {:?} ({}); give another -o DIR for {:?} ({target})",
            o.out.display(),
            m.scenario,
            m.target,
            o.scenario
        )));
    }
    let done = sweep::read_runs(&runs_path)?;
    let todo = o.plan.pending(&done);
    let configs = o.plan.configs().len();
    if o.dry_run {
        let done = done.len();
        return Ok(Outcome::Planned {
            todo,
            configs,
            done,
        });
    }
    std::fs::create_dir_all(&o.out).map_err(io(format!("creating {}", o.out.display())))?;
    let mut lab = Lab::new()?;
    let (stage, scratch) = (o.out.join("stage"), o.out.join("scratch"));
    lab.clear_stage(o.scenario, &stage, &scratch)?;
    if todo.is_empty() && old.is_some() {
        return Ok(Outcome::NothingToDo {
            done: done.len(),
            planned: configs * o.plan.reps,
            points: sweep::summarize(&done),
        });
    }
    for d in [&stage, &scratch] {
        std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
    }
    let started = old
        .as_ref()
        .map_or_else(lors_ibp::units::unix_now, |f| f.meta.started);
    let result = lab.run(o, &stage, &scratch, &todo, done, started, step);
    lab.release_staged(&stage);
    let _ = std::fs::remove_dir_all(&scratch);
    let file = result?;
    write_atomic(
        &json_path,
        &serde_json::to_vec_pretty(&file).unwrap_or_default(),
    )?;
    Ok(Outcome::Swept(Box::new(file)))
}

/// Writes `bytes` to `path` through a temporary file renamed over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LabError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(io(format!("writing {}", path.display())))
}

/// The sweep's one runtime and connection pool (the loopback depot, every
/// release of staged files and timed uploads) and what it started: the
/// loopback depot, a GridFTP server, stopped when it is dropped.
struct Lab {
    /// Taken at the end to shut down within a bound.
    rt: Option<tokio::runtime::Runtime>,
    pool: Arc<lors::Pool>,
    depot_stop: Option<tokio::sync::watch::Sender<bool>>,
    server: Option<std::process::Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(stop) = self.depot_stop.take() {
            let _ = stop.send(true);
        }
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl Lab {
    fn new() -> Result<Lab, LabError> {
        // Worker threads: the loopback depot serves while the sweep waits
        // on its movers.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(io("starting the async runtime"))?;
        let pool = Arc::new(lors::Pool::new(lors_ibp::ClientConfig::default()));
        Ok(Lab {
            rt: Some(rt),
            pool,
            depot_stop: None,
            server: None,
        })
    }

    /// Times every run of `todo`, appending each to the runs file as it
    /// completes; `sweep.json`'s contents at the end.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        o: &SweepOptions,
        stage: &Path,
        scratch: &Path,
        todo: &[(Config, usize)],
        mut all: Vec<Run>,
        started: u64,
        step: &mut dyn FnMut(&Step<'_>),
    ) -> Result<SweepFile, LabError> {
        let runs_path = o.out.join("runs.csv");
        let (mover, sources) = self.prepare(o, stage)?;
        let meta = Meta {
            scenario: o.scenario,
            target: target(o),
            command: mover.argv.clone(),
            lors_version: env!("CARGO_PKG_VERSION").into(),
            host: first_line("/proc/sys/kernel/hostname", None),
            kernel: first_line("/proc/sys/kernel/osrelease", None),
            cpu: first_line("/proc/cpuinfo", Some("model name")),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory: first_line("/proc/meminfo", Some("MemTotal")),
            started,
            plan: o.plan.clone(),
        };
        // An upload's allocations go as soon as it is timed.
        let mut release = |dst: &Path| {
            if mover.check == Check::NonEmpty
                && let Ok(x) = lors::xnd::load(dst)
            {
                let kept = self.release(x.mappings);
                if kept > 0 {
                    eprintln!(
                        "warning: {kept} allocations of a timed upload could not be released now; their lease ends within the hour"
                    );
                }
            }
        };
        let t0 = Instant::now();
        for (i, &(c, rep)) in todo.iter().enumerate() {
            let times = mover
                .run(c, &sources[&c.size], scratch, &mut release)
                .map_err(|source| LabError::Run {
                    source,
                    saved: all.len(),
                    runs: runs_path.display().to_string(),
                })?;
            let new: Vec<Run> = (times.iter().enumerate())
                .map(|(file, &seconds)| Run {
                    config: c,
                    rep,
                    file,
                    seconds,
                })
                .collect();
            sweep::append_runs(&runs_path, &new)?;
            all.extend_from_slice(&new);
            step(&Step {
                index: i,
                of: todo.len(),
                config: c,
                rep,
                times: &times,
                left: t0.elapsed().as_secs_f64() / (i + 1) as f64 * (todo.len() - i - 1) as f64,
            });
        }
        let points = sweep::summarize(&all);
        Ok(SweepFile {
            mean_total: sweep::mean_total(&points),
            meta,
            runs: all,
            points,
        })
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt
            .as_ref()
            .expect("the runtime is taken only when dropped")
    }

    /// Releases `mappings`' allocations within 20 s; returns how many
    /// were not.
    fn release(&self, mappings: Vec<lors_exnode::Mapping>) -> usize {
        let n = mappings.len();
        self.rt().block_on(async {
            tokio::time::timeout(Duration::from_secs(20), self.pool.release_all(mappings))
                .await
                .map_or(n, |kept| kept.len())
        })
    }

    /// What an interrupted sweep staged, released (the loopback depot's
    /// data lives in the stage directory itself, gone with it).
    fn clear_stage(
        &self,
        scenario: Scenario,
        stage: &Path,
        scratch: &Path,
    ) -> Result<(), LabError> {
        if scenario == Scenario::Loopback {
            let _ = std::fs::remove_dir_all(stage);
        }
        self.release_staged(scratch);
        self.release_staged(stage);
        if stage.exists() {
            return Err(LabError::Usage(format!(
                "{} holds staged files on depots that cannot be reached now; remove it once they are released or expired",
                stage.display()
            )));
        }
        Ok(())
    }

    /// Releases the allocations named by the exNodes in `dir` (staged
    /// files, or timed uploads an interrupted sweep left in scratch) and
    /// removes it; what a depot that cannot be reached holds stays named by
    /// the exNodes left there, until its lease ends.
    fn release_staged(&self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
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
        if mappings.is_empty() || self.release(mappings) == 0 {
            let _ = std::fs::remove_dir_all(dir);
        } else {
            eprintln!(
                "warning: some allocations of an earlier sweep could not be released now; their leases end within a day (exNodes in {})",
                dir.display()
            );
        }
    }

    /// Stages the sources and builds the mover: local files for cp, GridFTP
    /// and commands; exNodes of files uploaded to the depots for lors.
    fn prepare(
        &mut self,
        o: &SweepOptions,
        stage: &Path,
    ) -> Result<(Mover, HashMap<u64, Vec<String>>), LabError> {
        if o.scenario == Scenario::Gridftp {
            for p in ["globus-url-copy", "globus-gridftp-server"] {
                if which(p).is_none() {
                    return Err(LabError::Usage(format!(
                        "{p} is not installed (Debian: apt-get install globus-gass-copy-progs globus-gridftp-server-progs)"
                    )));
                }
            }
        }
        let slots = o.plan.parallel.iter().copied().max().unwrap_or(1);
        if !o.quiet {
            eprintln!(
                "staging {} files, {:#}",
                o.plan.sizes.len() * slots,
                Bytes(o.plan.staged_bytes())
            );
        }
        let depots = match o.scenario {
            Scenario::Loopback => vec![self.start_depot(&o.plan, stage)?],
            Scenario::Depots => o.depots.clone(),
            _ => Vec::new(),
        };
        let mut sources = HashMap::new();
        for &size in &o.plan.sizes {
            let mut list = Vec::new();
            for i in 0..slots {
                let src = stage.join(format!("src-{size}-{i}"));
                write_source(&src, size, size ^ ((i as u64) << 48))
                    .map_err(io(format!("writing {}", src.display())))?;
                if depots.is_empty() || o.upload {
                    list.push(src.display().to_string());
                } else {
                    list.push(stage_on_depots(o, &src, size, &depots)?);
                }
            }
            sources.insert(size, list);
        }
        let mover = match o.scenario {
            Scenario::Gridftp => {
                let port = self.start_gridftp(stage)?;
                for s in sources.values_mut().flatten() {
                    *s = format!("ftp://127.0.0.1:{port}{s}");
                }
                mover(o, &depots)
            }
            _ => mover(o, &depots),
        };
        Ok((mover, sources))
    }

    /// Starts a depot on 127.0.0.1 for the loopback scenario, its data
    /// under the stage directory; returns its address.
    fn start_depot(&mut self, plan: &Plan, stage: &Path) -> Result<String, LabError> {
        use lors_depot::config::{ByteSize, Config as DepotConfig, ResourceConfig, SyncPolicy};
        let mut r = ResourceConfig::new("1", stage.join("depot"));
        r.size = ByteSize(plan.staged_bytes() + plan.staged_bytes() / 4 + (64 << 20));
        let cfg = DepotConfig {
            listen: ([127, 0, 0, 1], 0).into(),
            sync: SyncPolicy::Never,
            resources: vec![r],
            ..DepotConfig::default()
        };
        let setup = |e: &dyn std::fmt::Display| LabError::Setup(format!("the loopback depot: {e}"));
        let (addr, stop) = self.rt().block_on(async {
            let depot = lors_depot::Depot::open(cfg).await.map_err(|e| setup(&e))?;
            let l = depot.bind().await.map_err(|e| setup(&e))?;
            let addr = l.ibp.local_addr().map_err(|e| setup(&e))?.to_string();
            let (tx, rx) = tokio::sync::watch::channel(false);
            tokio::spawn(lors_depot::server::run(l, depot, rx));
            Ok::<_, LabError>((addr, tx))
        })?;
        self.depot_stop = Some(stop);
        Ok(addr)
    }

    /// Starts an anonymous GridFTP server on 127.0.0.1 serving the stage
    /// directory, as "Simulations of Distributed Systems in a Computing
    /// Centre"'s scenario 2 ran one on the node itself.
    fn start_gridftp(&mut self, stage: &Path) -> Result<u16, LabError> {
        let root = open_to_nobody(stage)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(io("finding a free port"))?
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
            .map_err(io("starting globus-gridftp-server"))?;
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(LabError::Setup(format!(
                    "globus-gridftp-server did not listen on 127.0.0.1:{port} within 15 s (log: {})",
                    log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(port)
    }
}

/// As root the GridFTP server serves anonymous users as `nobody`: the
/// staged files must be readable by everyone, and every directory above
/// them searchable. Whether we are root.
fn open_to_nobody(stage: &Path) -> Result<bool, LabError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root {
        return Ok(false);
    }
    let chmod = |p: &Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
            .map_err(io(format!("opening {} to the GridFTP server", p.display())))
    };
    let stage = stage
        .canonicalize()
        .map_err(io(format!("resolving {}", stage.display())))?;
    for e in std::fs::read_dir(&stage).into_iter().flatten().flatten() {
        chmod(&e.path(), 0o644)?;
    }
    chmod(&stage, 0o755)?;
    if let Some(closed) = stage
        .ancestors()
        .skip(1)
        .find(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
    {
        return Err(LabError::Usage(format!(
            "the GridFTP server serves anonymous users as nobody, who cannot enter {}: \
             use an -o directory under world-searchable directories, or chmod o+x it",
            closed.display()
        )));
    }
    Ok(true)
}

/// Uploads the staged file `src` to `depots` with `lors upload` (one copy,
/// a day's lease); its exNode, which replaces it.
fn stage_on_depots(
    o: &SweepOptions,
    src: &Path,
    size: u64,
    depots: &[String],
) -> Result<String, LabError> {
    let xnd = src.with_extension("xnd");
    let mut cmd = std::process::Command::new(&o.lors);
    cmd.arg("upload")
        .arg(src)
        .args(["-c", "1", "-n", "-q", "-d", "1d", "-b"]);
    cmd.arg(format!("{}B", o.block_size)).arg("-o").arg(&xnd);
    for d in depots {
        cmd.args(["--depot", d]);
    }
    let out = cmd
        .output()
        .map_err(io("running lors upload to stage a file"))?;
    if !out.status.success() {
        return Err(LabError::Setup(format!(
            "staging {:#} on {} failed: {}",
            Bytes(size),
            depots.join(", "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    std::fs::remove_file(src).map_err(io(format!("removing {}", src.display())))?;
    Ok(xnd.display().to_string())
}

/// The mover's command line for the scenario.
fn mover(o: &SweepOptions, depots: &[String]) -> Mover {
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let lors = o.lors.display().to_string();
    let (argv, check) = match o.scenario {
        Scenario::Cp => (words(&["cp", "{src}", "{dst}"]), Check::Size),
        Scenario::Loopback | Scenario::Depots if o.upload => {
            let mut argv = vec![lors];
            argv.extend(words(&[
                "upload",
                "-q",
                "{src}",
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
            ]));
            argv.push(format!("{}B", o.block_size));
            for d in depots {
                argv.extend(["--depot".to_string(), d.clone()]);
            }
            (argv, Check::NonEmpty)
        }
        Scenario::Loopback | Scenario::Depots => {
            let mut argv = vec![lors];
            argv.extend(words(&[
                "download",
                "-q",
                "{src}",
                "-o",
                "{dst}",
                "-t",
                "{streams}",
            ]));
            (argv, Check::Size)
        }
        Scenario::Gridftp => (
            words(&[
                "globus-url-copy",
                "-p",
                "{streams}",
                "{src}",
                "file://{dst}",
            ]),
            Check::Size,
        ),
        Scenario::Command => {
            let t = o.command.clone().unwrap_or_default();
            let check = if t.contains("{dst}") {
                Check::Size
            } else {
                Check::Nothing
            };
            (vec!["sh".into(), "-c".into(), t], check)
        }
    };
    Mover { argv, check }
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

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}
