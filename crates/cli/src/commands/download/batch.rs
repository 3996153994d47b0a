//! `lors download` of many exNodes: side by side, each to its recorded
//! name.
//!
//! A file of a MiB 188 ms away is a few round trips of LOADs whatever
//! its connections: one file after another, the link idles through them.
//! So the files go side by side (`-j`: four, or as many as share the
//! connections one far download would open, four each), and the
//! connections a depot's distance adds are divided among them
//! ([`DownloadOptions::beside`]), so the depots see about one download's
//! worth. Each file is its own download — resumed from its
//! `.lors-part`, renamed when complete — and one that fails does not stop
//! the others.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lors::Pool;
use lors::download::{AUTO_CONNECTIONS, DownloadOptions, MAX_AUTO_CONNECTIONS, Output, Stats};
use lors::progress::Progress;
use lors::settings::Settings;
use lors::uri::ExnodeRef;
use lors_exnode::ExNode;
use tokio::sync::Semaphore;

use super::Args;
use crate::exit::UsageError;
use crate::report::{Reporter, Shared, Unit, eprint_line};

/// Files fetched at once from depots on a LAN.
const NEAR_JOBS: usize = 4;

/// The least memory for fetched data each file of a batch gets, whatever
/// `--memory` over `-j` leaves.
const MIN_MEMORY: u64 = 16 << 20;

/// One exNode of the batch, loaded, and where its file goes.
struct Item {
    exnode: ExnodeRef,
    x: Arc<ExNode>,
    out: PathBuf,
}

/// Fetches `exnodes` (more than one) into `-o DIR` or here (`-f`), each
/// file said as it ends; fails when any did.
pub(super) fn run(a: &Args, s: &Settings, exnodes: Vec<ExnodeRef>) -> anyhow::Result<()> {
    let started = Instant::now();
    let quiet = a.report.quiet || a.report.json;
    let mut failed: Vec<(String, String)> = Vec::new();
    let items = items(a, exnodes, &mut failed, quiet)?;
    let rt = crate::commands::runtime(crate::commands::Threads::Many)?;
    let directory = crate::commands::directory(&rt, s);
    let every = ExNode {
        mappings: (items.iter().flat_map(|i| i.x.mappings.iter().cloned())).collect(),
        ..ExNode::default()
    };
    let last_resort = rt.block_on(lors::directory::last_resort(directory.as_ref(), &every));
    let pool = Arc::new(a.bwlimit.pool(s.client()));
    let depots: Vec<String> = (every.mappings.iter().filter_map(|m| m.depot()))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let rtts = rt.block_on(pool.round_trips(&depots, lors::pool::MEASURE_WAIT));
    let at_once = a
        .jobs
        .map_or_else(|| jobs_for(&rtts), |j| j as usize)
        .clamp(1, items.len().max(1));
    let mut opts = super::options(a, s, last_resort);
    opts.beside = at_once;
    // --memory is the batch's, not each file's.
    opts.memory = (opts.memory / at_once as u64).max(MIN_MEMORY);
    let progress = Reporter::new("download", Unit::Bytes, &a.report, false);
    progress.start(Some(items.iter().map(|i| i.x.logical_size()).sum()));
    let each: Arc<dyn Progress> = Arc::new(Shared(progress.clone()));
    let mut done: Vec<(usize, Stats)> = Vec::new();
    rt.block_on(async {
        let gate = Arc::new(Semaphore::new(at_once));
        let mut tasks = tokio::task::JoinSet::new();
        for (i, item) in items.iter().enumerate() {
            let permit = gate.clone().acquire_owned().await.expect("never closed");
            let (x, out, opts) = (item.x.clone(), item.out.clone(), opts.clone());
            let (pool, each) = (pool.clone(), each.clone());
            tasks.spawn(async move {
                let r = one(&x, out, &opts, pool, each).await;
                drop(permit);
                (i, r)
            });
            while let Some(j) = tasks.try_join_next() {
                said(&items, j, &mut done, &mut failed, quiet);
            }
        }
        while let Some(j) = tasks.join_next().await {
            said(&items, j, &mut done, &mut failed, quiet);
        }
    });
    progress.finish();
    let mut per_depot: std::collections::BTreeMap<&str, u64> = Default::default();
    for (d, n) in done.iter().flat_map(|(_, s)| s.per_depot.iter()) {
        *per_depot.entry(d.as_str()).or_default() += n;
    }
    let per_depot: Vec<(String, u64)> = per_depot.into_iter().map(|(d, n)| (d.into(), n)).collect();
    rt.block_on(lors::directory::report_rates(
        directory.as_ref(),
        &per_depot,
        started.elapsed(),
    ));
    summary(a, &progress, &items, &done, &failed, started.elapsed());
    match failed.len() {
        0 => Ok(()),
        n => Err(anyhow::anyhow!(
            "{n} of {} files failed (said above); the same command with --skip-existing fetches the rest (an interrupted file resumes)",
            done.len() + n
        )),
    }
}

/// Connections each file of a batch gets from far depots: 188 ms away,
/// 100 files of a MiB took 15.4 s with eight each (eleven files at
/// once), 11.1 s with four (23 at once) and 12 s with two, against 9.6 s
/// for one file of 100 MiB (`bench/wan.py --files`).
const FAR_PER_FILE: usize = 4;

/// Files at once for depots `rtts` away: [`NEAR_JOBS`], or as many as
/// share the connections the farthest one earns, [`FAR_PER_FILE`] each.
fn jobs_for(rtts: &[Duration]) -> usize {
    let far = rtts.iter().copied().max().unwrap_or_default();
    match lors::download::connections_for(far).min(MAX_AUTO_CONNECTIONS) {
        n if n > AUTO_CONNECTIONS => (n / FAR_PER_FILE).max(NEAR_JOBS),
        _ => NEAR_JOBS,
    }
}

/// The exNodes loaded and their outputs: one that cannot be read, or
/// whose output cannot be, is a failure of its own (in `failed`); with
/// `--skip-existing` one whose file is there is left out. Two exNodes
/// whose files would be one path are refused before anything is fetched.
fn items(
    a: &Args,
    exnodes: Vec<ExnodeRef>,
    failed: &mut Vec<(String, String)>,
    quiet: bool,
) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::with_capacity(exnodes.len());
    let mut seen = HashSet::new();
    for exnode in exnodes {
        let name = exnode.path.display().to_string();
        let item = lors::xnd::load(&exnode.path)
            .map_err(anyhow::Error::from)
            .and_then(|x| {
                let out = super::output(a, &x, &exnode, None)?;
                Ok((x, out))
            });
        let (x, out) = match item {
            Ok(v) => v,
            Err(e) => {
                fail(&name, &e, failed, quiet);
                continue;
            }
        };
        if a.skip_existing && out.is_file() {
            if !quiet {
                eprintln!("lors: {} is there: {name} skipped", out.display());
            }
            continue;
        }
        if !seen.insert(out.clone()) {
            return Err(UsageError(format!(
                "two exNodes record the same file name {}: fetch them into different directories (-o DIR)",
                out.display()
            ))
            .into());
        }
        items.push(Item {
            exnode,
            x: Arc::new(x),
            out,
        });
    }
    Ok(items)
}

/// Fetches `x` into `out` (through `OUT.lors-part`, resumed when one is
/// there from the same exNode).
async fn one(
    x: &ExNode,
    out: PathBuf,
    opts: &DownloadOptions,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
) -> anyhow::Result<Stats> {
    if let Some(why) = lors::share::gone(x, &pool).await {
        anyhow::bail!(why);
    }
    let r = lors::download::download(x, Output::File(out.clone()), opts, pool, progress).await;
    r.map_err(|e| super::failed(x, &out, e))
}

/// A file's task ended: said, and counted.
fn said(
    items: &[Item],
    joined: Result<(usize, anyhow::Result<Stats>), tokio::task::JoinError>,
    done: &mut Vec<(usize, Stats)>,
    failed: &mut Vec<(String, String)>,
    quiet: bool,
) {
    let (i, r) = match joined {
        Ok(j) => j,
        Err(e) => return failed.push((String::new(), format!("a task failed: {e}"))),
    };
    let item = &items[i];
    match r {
        Ok(stats) => {
            if !quiet {
                eprint_line(&format!(
                    "lors: downloaded {} ({} bytes) -> {}",
                    item.exnode.path.display(),
                    stats.bytes,
                    item.out.display()
                ));
            }
            done.push((i, stats));
        }
        Err(e) => fail(&item.exnode.path.display().to_string(), &e, failed, quiet),
    }
}

fn fail(name: &str, e: &anyhow::Error, failed: &mut Vec<(String, String)>, quiet: bool) {
    let why = format!("{e:#}");
    if !quiet {
        eprint_line(&format!("lors: {name}: {why}"));
    }
    failed.push((name.to_owned(), why));
}

/// The last word: a line, or `--json`'s `done` with every file.
fn summary(
    a: &Args,
    progress: &Reporter,
    items: &[Item],
    done: &[(usize, Stats)],
    failed: &[(String, String)],
    took: Duration,
) {
    let bytes: u64 = done.iter().map(|(_, s)| s.bytes).sum();
    let secs = took.as_secs_f64();
    let mib_per_s = bytes as f64 / 1048576.0 / secs.max(1e-9);
    if progress.is_json() {
        progress.done(&BatchReport {
            files: (done.iter())
                .map(|(i, s)| FileJson {
                    exnode: items[*i].exnode.path.display().to_string(),
                    output: items[*i].out.display().to_string(),
                    bytes: s.bytes,
                    resumed_bytes: s.resumed_bytes,
                    seconds: crate::commands::json_secs(s.elapsed),
                })
                .collect(),
            failed: (failed.iter())
                .map(|(file, error)| FailedJson { file, error })
                .collect(),
            seconds: crate::commands::json_secs(took),
            mib_per_s: (mib_per_s * 10.0).round() / 10.0,
        });
    } else if !a.report.quiet {
        let of = done.len() + failed.len();
        let failed = match failed.len() {
            0 => String::new(),
            n => format!(", {n} failed"),
        };
        eprintln!(
            "lors: downloaded {} of {of} files ({bytes} bytes{failed}) in {secs:.2}s, {mib_per_s:.1} MiB/s",
            done.len()
        );
    }
}

/// `--json`: what a batch fetched.
#[derive(serde::Serialize)]
struct BatchReport<'a> {
    files: Vec<FileJson>,
    failed: Vec<FailedJson<'a>>,
    seconds: f64,
    mib_per_s: f64,
}

#[derive(serde::Serialize)]
struct FileJson {
    exnode: String,
    output: String,
    bytes: u64,
    resumed_bytes: u64,
    seconds: f64,
}

#[derive(serde::Serialize)]
struct FailedJson<'a> {
    file: &'a str,
    error: &'a str,
}
