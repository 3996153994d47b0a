//! `lors upload` of many files: side by side, one exNode each.
//!
//! A file of a MiB 188 ms away is four blocks that each wait out an
//! ALLOCATE, a STORE's go-ahead and its reply: one file after another, the
//! link idles through those round trips. So the files go side by side
//! (`-j`, by default as many as the blocks in flight) and take their
//! blocks' turns from one [`Slots`]: together they keep as many blocks in
//! flight as one large file would. Each file is its own upload job — saved,
//! resumed, recorded or released on its own — and one that fails does not
//! stop the others.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;
use std::time::{Duration, Instant};

use lors::Pool;
use lors::job::upload::{Done, Failed, Source, Upload};
use lors::progress::Progress;
use lors::upload::{Slots, UploadOptions};
use lors_lbone::client::Directory;
use tokio::sync::{Semaphore, watch};

use super::store::said;
use super::{Args, Report, Target};
use crate::report::{Reporter, Shared, Unit, eprint_line};

/// A batch's settings, resolved by `lors upload`.
pub(super) struct Batch<'a> {
    pub(super) a: &'a Args,
    pub(super) rt: &'a tokio::runtime::Runtime,
    pub(super) pool: &'a Arc<Pool>,
    pub(super) directory: Option<&'a Directory>,
}

/// One file's upload as its task ends it: refused or failed before it
/// ran, or the job's outcome.
enum Ran {
    Refused(anyhow::Error),
    Ran {
        r: Box<Result<Done, Failed>>,
        resumed: usize,
        took: Duration,
    },
}

impl Batch<'_> {
    /// Uploads `targets` with `opts` (the depots found, the filename left
    /// to each), each file said as it ends; fails when any did.
    pub(super) fn run(self, targets: Vec<Target>, opts: UploadOptions) -> anyhow::Result<()> {
        let (a, rt) = (self.a, self.rt);
        let started = Instant::now();
        let sizes: Vec<u64> = (targets.iter())
            .map(|t| std::fs::metadata(&t.file).map_or(0, |m| m.len()))
            .collect();
        let progress = Reporter::new("upload", Unit::Bytes, &a.report, false);
        progress.start(Some(sizes.iter().sum()));
        let (stop, signal) = crate::commands::stop_on_signal(rt);
        let slots = rt.block_on(Slots::measure(&opts, self.pool));
        let at_once = a
            .jobs
            .map_or_else(|| files_at_once(&opts, &slots), |j| j as usize);
        let each: Arc<dyn Progress> = Arc::new(Shared(progress.clone()));
        let mut tasks = tokio::task::JoinSet::new();
        let gate = Arc::new(Semaphore::new(at_once));
        let mut tally = Tally::default();
        let copies = opts.copies;
        rt.block_on(async {
            for (i, t) in targets.iter().enumerate() {
                if *stop.borrow() {
                    break;
                }
                let permit = tokio::select! {
                    p = gate.clone().acquire_owned() => p.expect("never closed"),
                    () = stopped(stop.clone()) => break,
                };
                let job = Upload {
                    opts: for_file(&opts, t, i),
                    out: Some(t.out.path.clone()),
                    force: a.force,
                    slots: Some(slots.clone()),
                };
                let (pool, each, stop) = (self.pool.clone(), each.clone(), stop.clone());
                let file = t.file.clone();
                tasks.spawn(async move {
                    let r = one(job, file, pool, each, stop).await;
                    drop(permit);
                    (i, r)
                });
                // Files that ended meanwhile are said now, not at the end.
                while let Some(j) = tasks.try_join_next() {
                    self.said(&targets, j, (&signal, copies), &mut tally);
                }
            }
            while let Some(j) = tasks.join_next().await {
                self.said(&targets, j, (&signal, copies), &mut tally);
            }
        });
        progress.finish();
        let per_depot = merged(tally.done.iter().map(|r| &r.1));
        rt.block_on(lors::directory::report_rates(
            self.directory,
            &per_depot,
            started.elapsed(),
        ));
        self.summary(&progress, &tally, targets.len(), started.elapsed());
        if tally.interrupted {
            return Err(crate::commands::interrupted(&signal));
        }
        match tally.failed.len() {
            0 => Ok(()),
            n => Err(anyhow::anyhow!(
                "{n} of {} files failed (said above); the same command with --skip-existing uploads the rest (an interrupted file resumes)",
                targets.len()
            )),
        }
    }

    /// A file's task ended: said, and counted.
    fn said(
        &self,
        targets: &[Target],
        joined: Result<(usize, Ran), tokio::task::JoinError>,
        (signal, copies): (&AtomicU8, usize),
        tally: &mut Tally,
    ) {
        let (i, ran) = match joined {
            Ok(j) => j,
            Err(e) => {
                tally
                    .failed
                    .push((String::new(), format!("a task failed: {e}")));
                return;
            }
        };
        let (t, quiet) = (&targets[i], self.a.report.quiet || self.a.report.json);
        let (r, resumed, took) = match ran {
            Ran::Refused(e) => return tally.fail(t, &e, quiet),
            Ran::Ran { r, resumed, took } => (*r, resumed, took),
        };
        if resumed > 0 && !quiet {
            eprint_line(&format!(
                "lors: {}: resumed from {}.partial ({resumed} blocks already stored)",
                t.file.display(),
                t.out.path.display()
            ));
        }
        let interrupted = matches!(r, Err(Failed::Interrupted(_)));
        match said(r, &t.out.path, quiet, signal) {
            Ok(done) => {
                let x = done.exnode;
                if !quiet {
                    eprint_line(&format!(
                        "lors: uploaded {} ({} bytes) -> {}",
                        t.file.display(),
                        x.logical_size(),
                        t.out.path.display()
                    ));
                }
                let report = Report::of(&t.out.path, &x, copies, took);
                tally.done.push((report, x.stored_per_depot()));
            }
            Err(_) if interrupted => tally.interrupted = true,
            Err(e) => tally.fail(t, &e, quiet),
        }
    }

    /// The last word: a line, or `--json`'s `done` with every file.
    fn summary(&self, progress: &Reporter, tally: &Tally, files: usize, took: Duration) {
        let bytes: u64 = tally.done.iter().map(|r| r.0.size - r.0.holes).sum();
        let secs = took.as_secs_f64();
        let mib_per_s = bytes as f64 / 1048576.0 / secs.max(1e-9);
        if progress.is_json() {
            progress.done(&BatchReport {
                files: tally.done.iter().map(|r| &r.0).collect(),
                failed: (tally.failed.iter())
                    .map(|(file, error)| FailedJson { file, error })
                    .collect(),
                seconds: crate::commands::json_secs(took),
                mib_per_s: (mib_per_s * 10.0).round() / 10.0,
            });
        } else if !self.a.report.quiet {
            let failed = match tally.failed.len() {
                0 => String::new(),
                n => format!(", {n} failed"),
            };
            eprintln!(
                "lors: uploaded {} of {files} files ({bytes} bytes{failed}) in {secs:.2}s, {mib_per_s:.1} MiB/s",
                tally.done.len()
            );
        }
    }
}

/// What the files of a batch came to.
#[derive(Default)]
struct Tally {
    /// Each file uploaded, and what it stored on each depot.
    done: Vec<(Report, Vec<(String, u64)>)>,
    /// Each file that failed, and why.
    failed: Vec<(String, String)>,
    interrupted: bool,
}

impl Tally {
    fn fail(&mut self, t: &Target, e: &anyhow::Error, quiet: bool) {
        let why = format!("{e:#}");
        if !quiet {
            eprint_line(&format!("lors: {}: {why}", t.file.display()));
        }
        self.failed.push((t.file.display().to_string(), why));
    }
}

/// Files open at once by default: one per block in flight; erasure-coded,
/// whose stripes each upload keeps in memory on its own, one per stripe
/// in flight and at most [`EC_FILES`].
fn files_at_once(opts: &UploadOptions, slots: &Slots) -> usize {
    match opts.erasure {
        Some(e) => (slots.threads() / e.blocks()).clamp(1, EC_FILES),
        None => slots.threads(),
    }
}

/// Erasure-coded files uploaded at once at most by default.
const EC_FILES: usize = 4;

/// The options of the batch's `i`-th file `t`: its name, and the depots
/// in an order turned by one per file, so the first blocks of many small
/// files do not all go to the first depot.
fn for_file(opts: &UploadOptions, t: &Target, i: usize) -> UploadOptions {
    let mut o = opts.clone();
    o.filename = super::filename(t);
    if !o.depots.is_empty() {
        let n = o.depots.len();
        o.depots.rotate_left(i % n);
    }
    o
}

/// Uploads `file` as `job` says, stopped when `stop` turns true.
async fn one(
    job: Upload,
    file: PathBuf,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
    stop: watch::Receiver<bool>,
) -> Ran {
    let started = Instant::now();
    let source = match Source::open(&file) {
        Ok(s) => s,
        Err(e) => return Ran::Refused(e.into()),
    };
    let ready = match job.prepare(&source, &pool).await {
        Ok(r) => r,
        Err(e) => return Ran::Refused(crate::commands::refused(e)),
    };
    let resumed = ready.resumed_blocks();
    let r = job.run(ready, source, pool, progress, Some(stop)).await;
    Ran::Ran {
        r: Box::new(r),
        resumed,
        took: started.elapsed(),
    }
}

/// Returns once `stop` turns true (never when it cannot).
async fn stopped(mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|&v| v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Bytes per depot over many files.
fn merged<'a>(each: impl Iterator<Item = &'a Vec<(String, u64)>>) -> Vec<(String, u64)> {
    let mut per: std::collections::BTreeMap<String, u64> = Default::default();
    for (d, n) in each.flatten() {
        *per.entry(d.clone()).or_default() += n;
    }
    per.into_iter().collect()
}

/// `--json`: what a batch made.
#[derive(serde::Serialize)]
struct BatchReport<'a> {
    files: Vec<&'a Report>,
    failed: Vec<FailedJson<'a>>,
    seconds: f64,
    mib_per_s: f64,
}

#[derive(serde::Serialize)]
struct FailedJson<'a> {
    file: &'a str,
    error: &'a str,
}
