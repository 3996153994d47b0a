//! A sweep: the planned configurations, the record of every timed transfer
//! (appended to a CSV file as it completes, so an interrupted sweep
//! resumes), and running a mover command for one configuration.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::stats::{FileStat, combine, file_stat};

/// One configuration of the dynamic variables ("Simulations of Distributed Systems in a Computing Centre" Table II).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Config {
    /// Size of each file, bytes.
    pub size: u64,
    /// Files moved in parallel.
    pub parallel: usize,
    /// Streams (connections, threads) per file.
    pub streams: usize,
}

/// The lists swept and the repetitions of each configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// File sizes, bytes.
    pub sizes: Vec<u64>,
    /// Numbers of files moved in parallel.
    pub parallel: Vec<usize>,
    /// Streams per file.
    pub streams: Vec<usize>,
    /// Repetitions of each configuration.
    pub reps: usize,
}

impl Plan {
    /// Every configuration, sizes varying slowest.
    pub fn configs(&self) -> Vec<Config> {
        let mut out = Vec::new();
        for &size in &self.sizes {
            for &parallel in &self.parallel {
                for &streams in &self.streams {
                    out.push(Config {
                        size,
                        parallel,
                        streams,
                    });
                }
            }
        }
        out
    }

    /// The runs still to do, `(configuration, repetition)`, round by round
    /// (every configuration once, then again), so a noisy spell on a shared
    /// machine spreads over all configurations rather than spoiling one.
    /// A run counts as done when all its files are in `done`.
    ///
    /// ```
    /// use lors_bench::sweep::Plan;
    /// let plan = Plan { sizes: vec![1 << 20], parallel: vec![1, 2], streams: vec![1], reps: 2 };
    /// let todo = plan.pending(&[]);
    /// assert_eq!(todo.iter().map(|(c, r)| (c.parallel, *r)).collect::<Vec<_>>(), [(1, 0), (2, 0), (1, 1), (2, 1)]);
    /// ```
    pub fn pending(&self, done: &[Run]) -> Vec<(Config, usize)> {
        let mut files: BTreeMap<(Config, usize), BTreeSet<usize>> = BTreeMap::new();
        for r in done {
            files.entry((r.config, r.rep)).or_default().insert(r.file);
        }
        let configs = self.configs();
        (0..self.reps)
            .flat_map(|rep| configs.iter().map(move |c| (*c, rep)))
            .filter(|(c, rep)| files.get(&(*c, *rep)).is_none_or(|f| f.len() < c.parallel))
            .collect()
    }

    /// Bytes the staged source files take: one file per size and parallel
    /// slot.
    pub fn staged_bytes(&self) -> u64 {
        let slots = self.parallel.iter().copied().max().unwrap_or(0) as u64;
        self.sizes.iter().sum::<u64>() * slots
    }
}

/// One timed transfer of one file.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The configuration it belongs to.
    #[serde(flatten)]
    pub config: Config,
    /// Repetition number, from 0.
    pub rep: usize,
    /// Which of the parallel files, from 0.
    pub file: usize,
    /// Wall-clock seconds from starting the command to its exit.
    pub seconds: f64,
}

/// The first line of a runs file.
pub const CSV_HEADER: &str = "size_bytes,parallel,streams,rep,file,seconds";

/// Errors reading a runs file or running a mover.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// I/O on the runs file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A line of the runs file is not a run.
    #[error("{path}:{line}: not a run ({why}); expected `{CSV_HEADER}`")]
    Parse {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// The mover could not be started.
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
    /// The mover failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// The end of what it wrote to standard error.
        stderr: String,
    },
    /// The mover exited 0 but did not write the whole file.
    #[error("`{command}` exited 0 but left {got} bytes in {dst}, not {want}")]
    Short {
        /// The command line.
        command: String,
        /// The destination.
        dst: String,
        /// Bytes found.
        got: u64,
        /// Bytes expected.
        want: u64,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SweepError + '_ {
    move |source| SweepError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Longest line accepted in a runs file: a run is six numbers.
const MAX_LINE: usize = 256;

/// Reads a runs file; a missing file is an empty record. A last line cut
/// short by an interrupted write is dropped (that run is simply redone).
pub fn read_runs(path: &Path) -> Result<Vec<Run>, SweepError> {
    let all = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(path)(e)),
    };
    parse_runs(&all, &path.display().to_string())
}

/// Parses the text of a runs file (`path` names it in errors). A last line
/// without its newline that does not parse is a write cut short: dropped.
///
/// ```
/// use lors_bench::sweep::{CSV_HEADER, parse_runs};
/// let runs = parse_runs(&format!("{CSV_HEADER}\n4096,1,1,0,0,0.25\n4096,1,1,1,0,0."), "runs.csv").unwrap();
/// assert_eq!(runs.len(), 1);
/// assert!(parse_runs("size,time\n", "runs.csv").is_err());
/// ```
pub fn parse_runs(all: &str, path: &str) -> Result<Vec<Run>, SweepError> {
    let bad = |line: usize, why: String| SweepError::Parse {
        path: path.to_string(),
        line,
        why,
    };
    let header = all.lines().next().unwrap_or("");
    if header != CSV_HEADER {
        return Err(bad(
            1,
            format!("header {:?}", header.chars().take(80).collect::<String>()),
        ));
    }
    let complete = all.ends_with('\n');
    let lines: Vec<&str> = all.lines().collect();
    let mut runs = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate().skip(1) {
        if line.is_empty() {
            continue;
        }
        let last = i + 1 == lines.len();
        match parse_run(line) {
            Ok(r) => runs.push(r),
            Err(_) if last && !complete => break,
            Err(why) => return Err(bad(i + 1, why)),
        }
    }
    Ok(runs)
}

fn parse_run(line: &str) -> Result<Run, String> {
    if line.len() > MAX_LINE {
        return Err(format!("{} bytes long", line.len()));
    }
    let f: Vec<&str> = line.split(',').collect();
    if f.len() != 6 {
        return Err(format!("{} fields, not 6", f.len()));
    }
    let int = |s: &str, what: &str| s.trim().parse::<u64>().map_err(|_| format!("{what} {s:?}"));
    let seconds: f64 = f[5]
        .trim()
        .parse()
        .map_err(|_| format!("seconds {:?}", f[5]))?;
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("seconds {seconds}"));
    }
    let run = Run {
        config: Config {
            size: int(f[0], "size")?,
            parallel: int(f[1], "parallel")? as usize,
            streams: int(f[2], "streams")? as usize,
        },
        rep: int(f[3], "rep")? as usize,
        file: int(f[4], "file")? as usize,
        seconds,
    };
    if run.config.parallel == 0 || run.file >= run.config.parallel {
        return Err(format!(
            "file {} of {} parallel",
            run.file, run.config.parallel
        ));
    }
    Ok(run)
}

/// Appends runs to a runs file, writing the header first if it is new, and
/// syncs it: a run on disk is never redone.
pub fn append_runs(path: &Path, runs: &[Run]) -> Result<(), SweepError> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)
        .map_err(io_err(path))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    // A line torn by an interrupted write is cut off first, so the new runs
    // start on a line of their own.
    if len > 0 {
        let tail = len.min(MAX_LINE as u64 + 1);
        let mut buf = vec![0u8; tail as usize];
        f.seek(SeekFrom::Start(len - tail))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(io_err(path))?;
        if buf.last() != Some(&b'\n') {
            let keep = buf
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| len - tail + i as u64 + 1);
            f.set_len(keep).map_err(io_err(path))?;
        }
    }
    let mut out = String::new();
    if f.metadata().map_err(io_err(path))?.len() == 0 {
        out.push_str(CSV_HEADER);
        out.push('\n');
    }
    for r in runs {
        let c = r.config;
        out.push_str(&format!(
            "{},{},{},{},{},{:.6}\n",
            c.size, c.parallel, c.streams, r.rep, r.file, r.seconds
        ));
    }
    f.write_all(out.as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(io_err(path))
}

/// One configuration's runs, reduced: "Simulations of Distributed Systems in a Computing Centre"'s data point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The configuration.
    #[serde(flatten)]
    pub config: Config,
    /// Each file's timings, reduced (eq. 1).
    pub files: Vec<FileStat>,
    /// Mean throughput per file, bytes/s (eq. 2).
    pub mean: f64,
    /// Its error, bytes/s (eq. 3), when there were two repetitions or more.
    pub error: Option<f64>,
    /// Throughput of all the parallel files together, bytes/s: `mean ·
    /// parallel` ("Simulations of Distributed Systems in a Computing Centre" Table IV).
    pub total: f64,
}

/// Reduces runs to one point per configuration, in configuration order.
pub fn summarize(runs: &[Run]) -> Vec<Point> {
    let mut by: BTreeMap<Config, BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
    for r in runs {
        by.entry(r.config)
            .or_default()
            .entry(r.file)
            .or_default()
            .push(r.seconds);
    }
    by.into_iter()
        .filter_map(|(config, files)| {
            let files: Vec<FileStat> = files
                .values()
                .filter_map(|t| file_stat(config.size as f64, t))
                .collect();
            let c = combine(&files)?;
            Some(Point {
                config,
                files,
                mean: c.mean,
                error: c.error,
                total: c.mean * config.parallel as f64,
            })
        })
        .collect()
}

/// The mean over configurations of the total throughput ("Simulations of Distributed Systems in a Computing Centre" Table
/// IV), bytes/s.
pub fn mean_total(points: &[Point]) -> Option<f64> {
    (!points.is_empty()).then(|| points.iter().map(|p| p.total).sum::<f64>() / points.len() as f64)
}

/// A mover: a command line template run once per file. `{src}`, `{dst}`,
/// `{streams}` and `{size}` in any word are replaced by the file's source,
/// a scratch destination, the streams per file and the size in bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mover {
    /// The program and its arguments, with placeholders.
    pub argv: Vec<String>,
    /// What a successful transfer must leave at `{dst}`.
    pub check: Check,
}

/// What a mover must leave at its destination for a transfer to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// A file of the configuration's size (a copy).
    Size,
    /// A file that is not empty (an exNode of an upload).
    NonEmpty,
    /// Nothing (a command that writes elsewhere).
    Nothing,
}

impl Mover {
    /// The command for one file.
    pub fn command(&self, src: &str, dst: &Path, config: Config) -> Vec<String> {
        self.argv
            .iter()
            .map(|w| {
                w.replace("{src}", src)
                    .replace("{dst}", &dst.display().to_string())
                    .replace("{streams}", &config.streams.to_string())
                    .replace("{size}", &config.size.to_string())
            })
            .collect()
    }

    /// Runs `config.parallel` transfers at once, file `i` from `sources[i]`
    /// to `scratch/dst-i`, and returns each one's wall-clock seconds. Each
    /// destination left is handed to `after` (to release what an upload
    /// stored, say), untimed, then removed.
    pub fn run(
        &self,
        config: Config,
        sources: &[String],
        scratch: &Path,
        after: &mut dyn FnMut(&Path),
    ) -> Result<Vec<f64>, SweepError> {
        let jobs: Vec<(Vec<String>, std::path::PathBuf)> = (0..config.parallel)
            .map(|i| {
                let dst = scratch.join(format!("dst-{i}"));
                (self.command(&sources[i % sources.len()], &dst, config), dst)
            })
            .collect();
        for (_, dst) in &jobs {
            let _ = std::fs::remove_file(dst);
        }
        let results: Vec<Result<f64, SweepError>> = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|(argv, _)| s.spawn(move || time_one(argv)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a timing thread panicked"))
                .collect()
        });
        let mut times = Vec::with_capacity(results.len());
        let mut first_err = None;
        for (r, (argv, dst)) in results.into_iter().zip(&jobs) {
            let checked = r.and_then(|t| {
                let got = std::fs::metadata(dst).map(|m| m.len()).unwrap_or(0);
                let want = match self.check {
                    Check::Size => config.size,
                    Check::NonEmpty => got.max(1),
                    Check::Nothing => got,
                };
                if got != want {
                    return Err(SweepError::Short {
                        command: argv.join(" "),
                        dst: dst.display().to_string(),
                        got,
                        want,
                    });
                }
                Ok(t)
            });
            if dst.exists() {
                after(dst);
            }
            let _ = std::fs::remove_file(dst);
            match checked {
                Ok(t) => times.push(t),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(times), Err)
    }
}

/// Longest tail of a failed mover's standard error kept for the message.
const STDERR_TAIL: usize = 600;

fn time_one(argv: &[String]) -> Result<f64, SweepError> {
    let start = Instant::now();
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| SweepError::Spawn {
            program: argv[0].clone(),
            source,
        })?;
    let seconds = start.elapsed().as_secs_f64();
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        let text = text.trim();
        let cut = text.len().saturating_sub(STDERR_TAIL);
        let cut = (cut..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        return Err(SweepError::Failed {
            command: argv.join(" "),
            status: out.status.to_string(),
            stderr: text[cut..].to_string(),
        });
    }
    Ok(seconds.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(size: u64, parallel: usize, rep: usize, file: usize, seconds: f64) -> Run {
        Run {
            config: Config {
                size,
                parallel,
                streams: 1,
            },
            rep,
            file,
            seconds,
        }
    }

    #[test]
    fn runs_round_trip_and_a_torn_last_line_is_redone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.csv");
        assert!(read_runs(&path).unwrap().is_empty());
        let runs = [run(1000, 2, 0, 0, 0.5), run(1000, 2, 0, 1, 0.25)];
        append_runs(&path, &runs[..1]).unwrap();
        append_runs(&path, &runs[1..]).unwrap();
        assert_eq!(read_runs(&path).unwrap(), runs);
        // An interrupted append leaves a partial line: dropped, not an error.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"1000,2,0,1,0.")
            .unwrap();
        assert_eq!(read_runs(&path).unwrap(), runs);
        // and cut off before the next runs are appended.
        append_runs(&path, &runs[..1]).unwrap();
        assert_eq!(read_runs(&path).unwrap(), [runs[0], runs[1], runs[0]]);
        // The same damage in the middle is an error naming the line.
        std::fs::write(
            &path,
            format!("{CSV_HEADER}\n1000,2,x,0,0,1\n1000,1,1,0,0,1\n"),
        )
        .unwrap();
        let e = read_runs(&path).unwrap_err().to_string();
        assert!(e.contains(":2:") && e.contains("streams"), "{e}");
        std::fs::write(&path, "a,b\n").unwrap();
        assert!(read_runs(&path).unwrap_err().to_string().contains("header"));
        std::fs::write(&path, format!("{CSV_HEADER}\n1000,2,1,0,2,1\n")).unwrap();
        assert!(
            read_runs(&path)
                .unwrap_err()
                .to_string()
                .contains("file 2 of 2")
        );
    }

    #[test]
    fn pending_skips_complete_runs_only() {
        let plan = Plan {
            sizes: vec![1000],
            parallel: vec![1, 2],
            streams: vec![1],
            reps: 2,
        };
        // Rep 0 of parallel 2 has one of its two files: it is redone.
        let done = [
            run(1000, 1, 0, 0, 1.0),
            run(1000, 2, 0, 0, 1.0),
            run(1000, 1, 1, 0, 1.0),
        ];
        let todo: Vec<(usize, usize)> = plan
            .pending(&done)
            .iter()
            .map(|(c, r)| (c.parallel, *r))
            .collect();
        assert_eq!(todo, [(2, 0), (2, 1)]);
        assert_eq!(plan.staged_bytes(), 2000);
    }

    #[test]
    fn summary_by_hand() {
        // Two files of 1000 bytes, two repetitions each.
        let runs = [
            run(1000, 2, 0, 0, 1.0),
            run(1000, 2, 1, 0, 3.0),
            run(1000, 2, 0, 1, 1.0),
            run(1000, 2, 1, 1, 3.0),
        ];
        let p = &summarize(&runs)[0];
        // Each file: μ_t 2 s, σ_t 1 s → 500 ± 250 B/s; together 500 ± 250/√2.
        assert_eq!(p.files.len(), 2);
        assert!((p.mean - 500.0).abs() < 1e-9);
        assert!((p.error.unwrap() - 250.0 / 2f64.sqrt()).abs() < 1e-9);
        assert!((p.total - 1000.0).abs() < 1e-9);
        assert_eq!(mean_total(std::slice::from_ref(p)), Some(p.total));
    }

    #[test]
    fn a_mover_is_timed_checked_and_its_failure_explained() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::write(&src, vec![7u8; 4096]).unwrap();
        let config = Config {
            size: 4096,
            parallel: 3,
            streams: 1,
        };
        let cp = Mover {
            argv: vec!["cp".into(), "{src}".into(), "{dst}".into()],
            check: Check::Size,
        };
        let mut handed = 0;
        let times = cp
            .run(
                config,
                &[src.display().to_string()],
                dir.path(),
                &mut |_| handed += 1,
            )
            .unwrap();
        assert_eq!((times.len(), handed), (3, 3));
        assert!(
            !dir.path().join("dst-0").exists(),
            "destinations are removed"
        );
        // A mover that writes half the file is caught.
        let half = Mover {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "head -c 2048 {src} > {dst}".into(),
            ],
            check: Check::Size,
        };
        let e = half
            .run(
                config,
                &[src.display().to_string()],
                dir.path(),
                &mut |_| {},
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("2048 bytes") && e.contains("not 4096"), "{e}");
        let fail = Mover {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "echo no route to depot >&2; exit 3".into(),
            ],
            check: Check::Nothing,
        };
        let e = fail
            .run(config, &["x".into()], dir.path(), &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no route to depot") && e.contains("exit status: 3"),
            "{e}"
        );
        let missing = Mover {
            argv: vec!["/nonexistent/mover".into()],
            check: Check::Nothing,
        };
        assert!(matches!(
            missing.run(config, &["x".into()], dir.path(), &mut |_| {}),
            Err(SweepError::Spawn { .. })
        ));
    }
}
