//! `lors keep`: keep exNodes' data alive and whole, once (cron) or as a
//! service.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lors::Pool;
use lors::keep::{Kept, Policy};
use lors::manage::{CopyOptions, Lease};
use lors::uri::ExnodeRef;

use crate::report::ReportOpts;

/// Keep exNodes' data alive and whole: refresh leases before they end,
/// remake lost replicas from live ones, drop dead mappings.
#[derive(clap::Args)]
#[command(
    after_help = "Each cycle, for every exNode (files, or every *.xnd under a directory, new
ones included): probe every allocation; extend the leases with less than
--margin left; give each block with fewer live replicas than its copy count
new ones, copied depot to depot from a live replica (--depot or the L-Bone
choose where, never beside a replica of the same block); drop mappings that
are gone for good, and those of unreachable depots once their block has its
copies again. A block with no live replica is reported LOST with its bytes;
the keeper never makes a replica from anything but a live one. An exNode is
rewritten atomically, and not at all if it changed while the cycle ran.

EXAMPLES:
  lors keep --once --depot d4:6714,d5:6714 data/     # from cron: exit 1 if anything is lost
  lors keep --every 1h --lease 30d data/ run42.xnd   # a service (see examples/lors-keep.service)
  lors keep --once -c 3 --json run42.xnd"
)]
pub struct Args {
    /// The exNodes: files, or directories whose `*.xnd` files (at any
    /// depth) are kept.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|DIR", required = true)]
    exnodes: Vec<ExnodeRef>,
    /// One cycle, then exit: 1 when any byte is lost or any lease or copy
    /// could not be made.
    #[arg(long)]
    once: bool,
    /// Time from the start of one cycle to the start of the next.
    #[arg(long, value_parser = super::duration_arg, default_value = "1h")]
    every: Duration,
    /// Live replicas each block keeps [default: the exNode's own copy
    /// count (recorded at upload, else what its blocks have)].
    #[arg(short, long, value_parser = clap::value_parser!(u64).range(1..=16))]
    copies: Option<u64>,
    /// What a refresh sets: a lease from now (`30d`), or `max` for as long
    /// as each depot allows.
    #[arg(long, default_value = "max", value_name = "DURATION|max")]
    lease: String,
    /// Refresh an allocation with less than this left [default: the larger
    /// of twice --every and a tenth of --lease (a day for max)].
    #[arg(long, value_parser = super::duration_arg)]
    margin: Option<Duration>,
    #[command(flatten)]
    targets: super::Targets,
    #[command(flatten)]
    new_lease: super::LeaseOpts,
    #[command(flatten)]
    net: super::NetOpts,
    #[command(flatten)]
    report: ReportOpts,
}

/// What a run found, over its cycles' last.
#[derive(Default, serde::Serialize)]
struct Totals {
    exnodes: usize,
    refreshed: usize,
    not_refreshed: usize,
    healed: usize,
    trimmed: usize,
    lost_bytes: u64,
    short_blocks: usize,
    failed: usize,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let lease = match a.lease.as_str() {
        "max" => Lease::Max,
        d => Lease::To(
            super::duration_arg(d).map_err(|e| crate::UsageError(format!("--lease {d}: {e}")))?,
        ),
    };
    let tenth = match lease {
        Lease::To(d) => d / 10,
        _ => Duration::from_secs(86_400),
    };
    let margin = a.margin.unwrap_or((a.every * 2).max(tenth));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (stop, _signal) = super::stop_on_signal(&rt);
    loop {
        let began = std::time::Instant::now();
        let totals = one_cycle(&a, &rt, lease, margin, &stop)?;
        let stopped = *stop.borrow();
        if a.once || stopped {
            if stopped {
                eprintln!("lors: keep stopped; every exNode is as the last finished cycle left it");
                return Ok(());
            }
            anyhow::ensure!(
                totals.lost_bytes == 0
                    && totals.failed == 0
                    && totals.not_refreshed == 0
                    && totals.short_blocks == 0,
                "not everything is kept: {} bytes lost, {} leases not extended, {} blocks short of copies, {} exNodes not kept",
                totals.lost_bytes,
                totals.not_refreshed,
                totals.short_blocks,
                totals.failed
            );
            return Ok(());
        }
        // Until the next cycle, or a signal.
        let mut stop = stop.clone();
        let next = a.every.saturating_sub(began.elapsed());
        let signalled = rt.block_on(async {
            tokio::select! {
                () = tokio::time::sleep(next) => false,
                _ = stop.wait_for(|s| *s) => true,
            }
        });
        if signalled {
            eprintln!("lors: keep stopped between cycles");
            return Ok(());
        }
    }
}

/// The exNode files `r` names.
fn files_of(r: &ExnodeRef) -> anyhow::Result<Vec<PathBuf>> {
    if !r.path.is_dir() {
        return Ok(vec![r.path.clone()]);
    }
    let mut out = Vec::new();
    super::stat::xnd_files(&r.path, &mut out)?;
    Ok(out)
}

/// One cycle over every exNode.
fn one_cycle(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    lease: Lease,
    margin: Duration,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Totals> {
    let mut totals = Totals::default();
    let json = a.report.json;
    for r in &a.exnodes {
        let flags = a.new_lease.layer(a.targets.layer());
        let s = super::settings(&a.net, flags, Some(r))?;
        let pool = Arc::new(Pool::new(s.client()));
        for path in files_of(r)? {
            if *stop.borrow() {
                return Ok(totals);
            }
            totals.exnodes += 1;
            let name = path.display().to_string();
            let policy = Policy {
                copies: a.copies.map(|c| c as usize),
                lease,
                margin,
                copy: CopyOptions {
                    duration: s.duration,
                    reliability: s.reliability,
                    stop: Some(stop.clone()),
                },
            };
            match keep_one(a, rt, &path, &s, &policy, &pool) {
                Ok(Some(k)) => {
                    totals.refreshed += k.refreshed;
                    totals.not_refreshed += k.not_refreshed.len();
                    totals.healed += k.healed;
                    totals.trimmed += k.trimmed;
                    totals.lost_bytes += k.lost.iter().map(|(s, e)| e - s).sum::<u64>();
                    totals.short_blocks += k.short.len();
                    report(&name, &k, json, a.report.quiet)?;
                }
                Ok(None) => return Ok(totals), // stopped mid-cycle
                Err(e) => {
                    totals.failed += 1;
                    match json {
                        true => super::outln!(
                            "{}",
                            super::json_line(
                                &serde_json::json!({"event": "failed", "file": name, "error": format!("{e:#}")})
                            )?
                        ),
                        false => eprintln!("lors: {name}: not kept: {e:#}"),
                    }
                }
            }
        }
    }
    if json {
        super::outln!(
            "{}",
            super::json_line(&serde_json::json!({"event": "cycle", "totals": &totals}))?
        );
    } else if !a.report.quiet {
        eprintln!(
            "lors: cycle done: {} exNodes, {} leases extended, {} new replicas, {} mappings dropped{}",
            totals.exnodes,
            totals.refreshed,
            totals.healed,
            totals.trimmed,
            if totals.lost_bytes > 0 {
                format!(", {} bytes LOST", totals.lost_bytes)
            } else {
                String::new()
            }
        );
    }
    Ok(totals)
}

/// Keeps one exNode; `None` when a signal stopped it (nothing changed).
fn keep_one(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    path: &Path,
    s: &lors::settings::Settings,
    policy: &Policy,
    pool: &Arc<Pool>,
) -> anyhow::Result<Option<Kept>> {
    let before =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let x = lors::xnd::load(path)?;
    let copies = policy
        .copies
        .or_else(|| lors::manage::copies_policy(&x))
        .unwrap_or(1);
    // Where new replicas may go; asked for each exNode, as its blocks'
    // holders differ. Without any, a cycle that needs none still runs.
    let (depots, unplaced) = match a.targets.find(rt, &x, s, copies, true) {
        Ok(f) => (f.depots, None),
        Err(e) => (Vec::new(), Some(format!("{e:#}"))),
    };
    let mut k = match rt.block_on(lors::keep::cycle(&x, &depots, policy, pool)) {
        Ok(k) => k,
        Err(lors::Error::Interrupted { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if k.heal_error.is_some() && depots.is_empty() {
        k.heal_error = unplaced;
    }
    if k.changed {
        // A second writer (augment, trim, another keeper) may have changed
        // the file meanwhile: its change stands, and this cycle's copies
        // are freed; the next cycle starts from the new file.
        if std::fs::read(path).ok().as_deref() != Some(&before[..]) {
            let made = &k.exnode.mappings[k.exnode.mappings.len() - k.healed..];
            rt.block_on(lors::keep::release(made, pool));
            anyhow::bail!("it changed while it was kept: left to the next cycle");
        }
        lors::xnd::save(path, &k.exnode)?;
    }
    Ok(Some(k))
}

/// What one exNode's cycle did, as a line (or a JSON event).
fn report(name: &str, k: &Kept, json: bool, quiet: bool) -> anyhow::Result<()> {
    if json {
        super::outln!(
            "{}",
            super::json_line(&serde_json::json!({
                "event": "kept",
                "file": name,
                "copies": k.copies,
                "refreshed": k.refreshed,
                "not_refreshed": k.not_refreshed.iter().map(|(i, e)| serde_json::json!({"mapping": i, "error": e})).collect::<Vec<_>>(),
                "healed": k.healed,
                "trimmed": k.trimmed,
                "lost": k.lost,
                "short": k.short,
                "heal_error": k.heal_error,
            }))?
        );
        return Ok(());
    }
    let mut did = Vec::new();
    if k.refreshed > 0 {
        did.push(format!("{} leases extended", k.refreshed));
    }
    if k.healed > 0 {
        did.push(format!("{} new replicas", k.healed));
    }
    if k.trimmed > 0 {
        did.push(format!("{} dead mappings dropped", k.trimmed));
    }
    if !did.is_empty() && !quiet {
        super::outln!("{name}: {}", did.join(", "));
    }
    for (i, e) in &k.not_refreshed {
        eprintln!("lors: {name}: mapping {i}: lease not extended: {e}");
    }
    for (s, e) in &k.short {
        eprintln!(
            "lors: {name}: bytes {s}..{e} are short of {} live copies{}",
            k.copies,
            k.heal_error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
    }
    for (s, e) in &k.lost {
        eprintln!("lors: {name}: LOST: bytes {s}..{e} have no live replica");
    }
    Ok(())
}
