//! `lors verify`: read every replica back and check it (a scrub).

use std::sync::Arc;

use lors::Pool;
use lors::uri::ExnodeRef;
use lors::verify::Check;

use crate::report::{ReportOpts, Reporter, Unit};

/// Read every replica of each exNode back and check it against its
/// end-to-end checksums; nothing is written.
#[derive(clap::Args)]
#[command(
    after_help = "A download stops at the first good replica of each block: a damaged or
expired second copy goes unnoticed until the first is lost too. verify reads
every replica whole, the depots in parallel, and checks each end-to-end block
(BLAKE3, MD5, AES-GCM/ChaCha20 tags). Replicas stored without checksums
(`upload -n`) are read through and reported as unchecked. An erasure-coded
file's parity blocks are read too, each checked against the digest of the
parity its data encoded to; its bytes are lost only where a stripe has fewer
good blocks than it has data blocks.

Exit status: 0 when every replica is good or unchecked, 1 when any is
corrupt or cannot be read.

EXAMPLES:
  lors verify run42.xnd                   # the bad replicas, and a summary
  lors verify --all data/                 # every exNode under data/, a line per replica
  lors verify --json run42.xnd | jq 'select(.state? and .state != \"good\")'
  lors trim -m 3 run42.xnd && lors augment -c 1 run42.xnd   # drop a bad replica, make a new one"
)]
pub struct Args {
    /// The exNodes: files, or directories whose `*.xnd` files (at any
    /// depth) are verified.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|DIR|lors://…", required = true)]
    exnodes: Vec<ExnodeRef>,
    /// List every replica, the good ones too [default: only those that are
    /// not good].
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    net: super::NetOpts,
    #[command(flatten)]
    report: ReportOpts,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let rt = super::runtime(super::Threads::One)?;
    let progress = Reporter::new("verify", Unit::Bytes, &a.report, false);
    let json = progress.is_json();
    let mut total = Summary::default();
    let mut report = Vec::new();
    let mut jobs = Vec::new();
    for (r, path) in files(&a.exnodes)? {
        let s = super::settings(&a.net, Default::default(), Some(r))?;
        let x = lors::xnd::load(&path)?;
        // What a download would refuse is no file to vouch for.
        lors::plan::check_exnode(&x)?;
        jobs.push((
            path.display().to_string(),
            Arc::new(x),
            Arc::new(Pool::new(s.client())),
        ));
    }
    let progress_dyn: Arc<dyn lors::Progress> = progress.clone();
    let all = rt.block_on(verify_all(&jobs, progress_dyn))?;
    for ((name, x, _), checks) in jobs.iter().zip(all) {
        let mut lines = replica_lines(x, &checks, name, json, a.all)?;
        let good: Vec<bool> = checks.iter().map(Check::is_good).collect();
        let lost = lors_exnode::erasure::unreadable(x, &good)?.bytes;
        let mut file = Summary {
            replicas: checks.len(),
            good: checks.iter().filter(|c| matches!(c, Check::Good)).count(),
            unchecked: checks
                .iter()
                .filter(|c| matches!(c, Check::Unchecked))
                .count(),
            ..Summary::default()
        };
        file.bad = file.replicas - file.good - file.unchecked;
        file.lost_bytes = lost.iter().map(|r| r.end - r.start).sum();
        if !json {
            let mut states: Vec<(&str, usize)> = Vec::new();
            for c in &checks {
                match states.iter_mut().find(|(s, _)| *s == c.state()) {
                    Some((_, k)) => *k += 1,
                    None => states.push((c.state(), 1)),
                }
            }
            let states: Vec<String> = states.iter().map(|(s, k)| format!("{k} {s}")).collect();
            let of = match lors_exnode::erasure::Erasure::of(x)? {
                Some(e) => format!("blocks of {} stripes ({})", e.stripes(), e.scheme),
                None => format!("replicas of {} blocks", x.blocks().len()),
            };
            report.push(match file.replicas {
                0 if x.logical_size() == 0 => format!("{name}: empty, nothing to read"),
                _ => format!("{name}: {} {of}: {}", file.replicas, states.join(", ")),
            });
        }
        report.append(&mut lines);
        if !json {
            for std::ops::Range { start: s, end: e } in &lost {
                report.push(format!("  LOST: bytes {s}..{e} have no good replica"));
            }
        }
        total.add(&file);
    }
    // Printed once every file is read: progress bars stay out of the way.
    progress.finish();
    for l in &report {
        super::outln!("{l}");
    }
    progress.done(&total);
    // Any LOST line fails the command, whether a replica went bad or no
    // mapping ever held the bytes.
    anyhow::ensure!(
        total.lost_bytes == 0,
        "{} bytes have no good replica{}",
        total.lost_bytes,
        match total.bad {
            0 => ": no mapping holds them (trimmed, or never uploaded)".to_string(),
            n => format!(
                " ({n} of {} replicas are corrupt or cannot be read; `lors augment` makes new replicas from good ones where any are left)",
                total.replicas
            ),
        }
    );
    anyhow::ensure!(
        total.bad == 0,
        "{} of {} replicas are corrupt or cannot be read: `lors trim -m N` drops a bad one, `lors augment` makes new replicas from the good ones",
        total.bad,
        total.replicas,
    );
    Ok(())
}

/// Files verified at once: a depot that does not answer costs one
/// stall for all of them, not one per file.
const AT_ONCE: usize = 16;

/// Every exNode of `jobs` (name, exNode, pool) verified, [`AT_ONCE`] at a
/// time; the checks in `jobs`' order.
async fn verify_all(
    jobs: &[(String, Arc<lors_exnode::ExNode>, Arc<Pool>)],
    progress: Arc<dyn lors::Progress>,
) -> anyhow::Result<Vec<Vec<Check>>> {
    let limit = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    let mut set = tokio::task::JoinSet::new();
    for (i, (_, x, pool)) in jobs.iter().enumerate() {
        let (x, pool, progress, limit) = (x.clone(), pool.clone(), progress.clone(), limit.clone());
        set.spawn(async move {
            let _turn = limit.acquire_owned().await;
            (i, lors::verify::verify(&x, &pool, progress).await)
        });
    }
    let mut out: Vec<Option<Vec<Check>>> = vec![None; jobs.len()];
    while let Some(done) = set.join_next().await {
        let (i, checks) = done?;
        out[i] = Some(checks?);
    }
    Ok(out.into_iter().map(Option::unwrap_or_default).collect())
}

/// A line per allocation `checks` found not good (every one with `all`),
/// in the numbering `lors ls` gives them, or a JSON event each.
fn replica_lines(
    x: &lors_exnode::ExNode,
    checks: &[Check],
    name: &str,
    json: bool,
    all: bool,
) -> anyhow::Result<Vec<String>> {
    let numbering = x.numbering();
    let mut rows: Vec<(usize, usize)> = (0..checks.len())
        .map(|i| (numbering.number(i), i))
        .collect();
    rows.sort_unstable();
    let mut lines = Vec::new();
    let data = x.mappings.len();
    for (n, i) in rows {
        let (Some(m), c) = (x.allocation(i), &checks[i]) else {
            continue;
        };
        let what = match i < data {
            true => "mapping",
            false => "parity block",
        };
        let depot = m.depot().unwrap_or_default();
        if json {
            lines.push(super::json_line(&Replica {
                event: "replica",
                file: name,
                mapping: n,
                offset: m.exnode_offset,
                length: m.logical_length,
                depot: &depot,
                state: c.state(),
                why: (!matches!(c, Check::Good)).then(|| c.reason()),
            })?);
        } else if all || !c.is_good() {
            let place = match m.shard().filter(|_| i >= data) {
                Some((stripe, index)) => format!("stripe {stripe} block {index}"),
                None => format!("bytes {}..{}", m.exnode_offset, m.logical_end()),
            };
            lines.push(format!(
                "  {what} {n}, {place} on {depot}: {}: {}",
                c.state(),
                c.reason()
            ));
        }
    }
    Ok(lines)
}

/// The exNodes named: files, and the `*.xnd` files under directories,
/// each with the argument it came from (its settings).
fn files(args: &[ExnodeRef]) -> anyhow::Result<Vec<(&ExnodeRef, std::path::PathBuf)>> {
    let mut out = Vec::new();
    for r in args {
        if !r.path.is_dir() {
            out.push((r, r.path.clone()));
            continue;
        }
        let max = super::stat::MAX_FILES;
        let mut w = super::stat::Walk::default();
        super::stat::xnd_files(&r.path, &mut w, max)?;
        anyhow::ensure!(
            !w.truncated,
            "more than {max} exNodes under {}: name fewer at once",
            r.path.display()
        );
        for (p, why) in &w.skipped {
            eprintln!("lors: {}: skipped: {why}", p.display());
        }
        out.extend(w.files.into_iter().map(|p| (r, p)));
    }
    Ok(out)
}

/// `--json`: one replica's check.
#[derive(serde::Serialize)]
struct Replica<'a> {
    event: &'static str,
    file: &'a str,
    mapping: usize,
    offset: u64,
    length: u64,
    depot: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
}

/// `--json`: what a verify found, over every exNode.
#[derive(serde::Serialize, Default)]
struct Summary {
    replicas: usize,
    good: usize,
    unchecked: usize,
    bad: usize,
    lost_bytes: u64,
}

impl Summary {
    fn add(&mut self, o: &Summary) {
        self.replicas += o.replicas;
        self.good += o.good;
        self.unchecked += o.unchecked;
        self.bad += o.bad;
        self.lost_bytes += o.lost_bytes;
    }
}
