//! `lors stat`: a summary of an exNode and its health, or a line each for
//! many.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lors::manage::Probe;
use lors::uri::ExnodeRef;
use lors_ibp::units::{Bytes, Secs};

/// Summarize an exNode: size, blocks, replicas, depots, leases, problems;
/// or many exNodes (several files, directories), a line each.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors stat run42.xnd                      # one file in detail
  lors stat data/                          # every *.xnd under data/, a line each
  lors stat --expiring 7d data/ || alert   # what expires within a week, is under its
                                           # copy count or has lost bytes (exit 1 if lost)")]
pub struct Args {
    /// The exNodes: files, or directories whose `*.xnd` files (at any
    /// depth) are summarized a line each.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|DIR|lors://…", required = true)]
    exnodes: Vec<ExnodeRef>,
    /// Only the exNodes with an allocation that expires within this long,
    /// and those under their copy count or with lost bytes.
    #[arg(long, value_parser = super::duration_arg, value_name = "DURATION")]
    expiring: Option<Duration>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    net: super::NetOpts,
}

/// The line-per-exNode listing, for `lors ls` given several exNodes, a
/// directory or `--expiring`.
pub(crate) fn listing(
    exnodes: Vec<ExnodeRef>,
    expiring: Option<Duration>,
    json: bool,
    net: super::NetOpts,
) -> anyhow::Result<()> {
    many(&Args {
        exnodes,
        expiring,
        json,
        net,
    })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match a.exnodes.as_slice() {
        [one] if a.expiring.is_none() && !one.path.is_dir() => detail(&a, one),
        _ => many(&a),
    }
}

/// One exNode in detail.
fn detail(a: &Args, r: &ExnodeRef) -> anyhow::Result<()> {
    let s = super::settings(&a.net, Default::default(), Some(r))?;
    let x = lors::xnd::load(&r.path)?;
    let probes = super::probe_all(&x, &s)?;
    let blocks = lors::manage::blocks(&x);
    let live = |i: usize| probes[i].is_live();
    let replicas: Vec<usize> = blocks
        .values()
        .map(|v| v.iter().filter(|&&i| live(i)).count())
        .collect();
    let min_live = replicas.iter().copied().min().unwrap_or(0);
    let lost = replicas.iter().filter(|&&r| r == 0).count();
    let mut per_depot: BTreeMap<String, usize> = BTreeMap::new();
    for m in &x.mappings {
        *per_depot.entry(m.depot().unwrap_or_default()).or_default() += 1;
    }
    let soonest = probes
        .iter()
        .filter_map(|p| match p {
            Probe::Live(p) => Some(p.seconds_left),
            _ => None,
        })
        .min();
    // How many mappings are in each state, in a fixed order.
    let mut states: Vec<(&str, usize)> = Vec::new();
    for st in [
        "live",
        "expired",
        "refused",
        "unreachable",
        "no answer",
        "failed",
    ] {
        let n = probes.iter().filter(|p| p.state() == st).count();
        if n > 0 {
            states.push((st, n));
        }
    }
    let mut down: Vec<String> = x
        .mappings
        .iter()
        .zip(&probes)
        .filter(|(_, p)| matches!(p, Probe::Unreachable(_) | Probe::NoAnswer(_)))
        .filter_map(|(m, _)| m.depot())
        .collect();
    down.sort();
    down.dedup();
    if a.json {
        let summary = Summary {
            filename: x.filename().unwrap_or(""),
            size: x.logical_size(),
            mappings: x.mappings.len(),
            blocks: blocks.len(),
            min_live_replicas: min_live,
            blocks_lost: lost,
            states: &states,
            unreachable_depots: &down,
            soonest_expiry_s: soonest,
            depots: per_depot
                .iter()
                .map(|(depot, n)| DepotMappings {
                    depot,
                    mappings: *n,
                })
                .collect(),
        };
        super::outln!("{}", super::json_line(&summary)?);
    } else {
        super::outln!("file:      {}", x.filename().unwrap_or("(no name)"));
        super::outln!("size:      {} bytes", x.logical_size());
        super::outln!(
            "blocks:    {} ({} mappings)",
            blocks.len(),
            x.mappings.len()
        );
        super::outln!(
            "replicas:  at least {min_live} reachable per block{}",
            if lost > 0 {
                format!(
                    ", {lost} block{} with none",
                    if lost == 1 { "" } else { "s" }
                )
            } else {
                String::new()
            }
        );
        super::outln!(
            "mappings:  {}",
            states
                .iter()
                .map(|(s, n)| format!("{n} {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !down.is_empty() {
            super::outln!("unreachable depots: {}", down.join(", "));
        }
        if let Some(s) = soonest {
            super::outln!(
                "expires:   first allocation in {s} s ({:.1} h); extend with `lors refresh`",
                s as f64 / 3600.0
            );
        }
        for (d, n) in &per_depot {
            super::outln!("depot:     {d} — {n} mappings");
        }
    }
    super::unreadable(&x, &probes)
}

/// Most exNodes one run lists: a directory tree larger than this is a
/// mistake (or an attack) rather than a data set to probe file by file.
const MAX_FILES: usize = 100_000;

/// The `*.xnd` files under `dir`, at any depth, in name order.
pub(crate) fn xnd_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("reading directory {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        // Not followed: a link loop would never end.
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            xnd_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "xnd") {
            out.push(p);
        }
        anyhow::ensure!(
            out.len() <= MAX_FILES,
            "more than {MAX_FILES} exNodes under {}: name fewer at once",
            dir.display()
        );
    }
    Ok(())
}

/// Many exNodes, a line each.
fn many(a: &Args) -> anyhow::Result<()> {
    let rt = super::runtime(super::Threads::One)?;
    let mut total = Totals::default();
    for r in &a.exnodes {
        let s = super::settings(&a.net, Default::default(), Some(r))?;
        let pool = lors::Pool::new(s.client());
        let mut files = Vec::new();
        if r.path.is_dir() {
            xnd_files(&r.path, &mut files)?;
        } else {
            files.push(r.path.clone());
        }
        for path in files {
            let name = path.display().to_string();
            total.files += 1;
            let x = match lors::xnd::load(&path) {
                Ok(x) => x,
                Err(e) => {
                    total.unreadable += 1;
                    match a.json {
                        true => super::outln!(
                            "{}",
                            super::json_line(
                                &serde_json::json!({"file": name, "error": e.to_string()})
                            )?
                        ),
                        false => super::outln!("{name}: cannot be read: {e}"),
                    }
                    continue;
                }
            };
            let probes = rt.block_on(lors::manage::probe_all(&x, &pool));
            let h = Health::of(&x, &probes, &name);
            let expiring = match (a.expiring, h.soonest_expiry_s) {
                (Some(within), Some(s)) => u64::try_from(s).unwrap_or(0) <= within.as_secs(),
                _ => false,
            };
            total.expiring += usize::from(expiring);
            total.under += usize::from(h.min_live_replicas < h.copies && h.lost_bytes == 0);
            total.lost += usize::from(h.lost_bytes > 0);
            if a.expiring.is_some() && !expiring && h.min_live_replicas >= h.copies {
                continue;
            }
            if a.json {
                super::outln!("{}", super::json_line(&h)?);
                continue;
            }
            let mut line = format!(
                "{name}: {}, {} blocks, {} of {} copies",
                Bytes(h.size),
                h.blocks,
                h.min_live_replicas,
                h.copies
            );
            if let Some(s) = h.soonest_expiry_s {
                line += &format!(", expires in {}", Secs(u64::try_from(s).unwrap_or(0)));
            }
            if h.lost_bytes > 0 {
                line += &format!("; LOST {} bytes", h.lost_bytes);
            } else if h.min_live_replicas < h.copies {
                line += "; under its copy count (`lors augment`)";
            }
            super::outln!("{line}");
        }
    }
    if a.json {
        super::outln!("{}", super::json_line(&total)?);
    } else {
        let within = a
            .expiring
            .map(|d| format!("{} expire within {}, ", total.expiring, Secs(d.as_secs())))
            .unwrap_or_default();
        super::outln!(
            "{} exNodes: {within}{} under their copy count, {} with lost bytes{}",
            total.files,
            total.under,
            total.lost,
            if total.unreadable > 0 {
                format!(", {} unreadable", total.unreadable)
            } else {
                String::new()
            }
        );
    }
    anyhow::ensure!(
        total.lost == 0 && total.unreadable == 0,
        "{} of {} exNodes have bytes with no live replica{}",
        total.lost,
        total.files,
        if total.unreadable > 0 {
            format!(" and {} cannot be read", total.unreadable)
        } else {
            String::new()
        }
    );
    Ok(())
}

/// One exNode's health, a line of `stat` over many.
#[derive(serde::Serialize)]
struct Health<'a> {
    file: &'a str,
    size: u64,
    blocks: usize,
    min_live_replicas: usize,
    /// The copies its policy asks for (`lors_copies`, else what its blocks
    /// have).
    copies: usize,
    soonest_expiry_s: Option<i64>,
    lost_bytes: u64,
}

impl<'a> Health<'a> {
    fn of(x: &lors_exnode::ExNode, probes: &[Probe], file: &'a str) -> Self {
        let live: Vec<bool> = probes.iter().map(Probe::is_live).collect();
        let blocks = lors::manage::blocks(x);
        Health {
            file,
            size: x.logical_size(),
            blocks: blocks.len(),
            min_live_replicas: (blocks.values())
                .map(|v| v.iter().filter(|&&i| live[i]).count())
                .min()
                .unwrap_or(0),
            copies: lors::manage::copies_policy(x).unwrap_or(1),
            soonest_expiry_s: (probes.iter())
                .filter_map(|p| match p {
                    Probe::Live(p) => Some(p.seconds_left),
                    _ => None,
                })
                .min(),
            lost_bytes: (lors::manage::uncovered(x, &live).iter())
                .map(|(s, e)| e - s)
                .sum(),
        }
    }
}

/// `--json` over many: the totals.
#[derive(serde::Serialize, Default)]
struct Totals {
    files: usize,
    expiring: usize,
    under: usize,
    lost: usize,
    unreadable: usize,
}

/// `--json`: the exNode's health in one object.
#[derive(serde::Serialize)]
struct Summary<'a> {
    filename: &'a str,
    size: u64,
    mappings: usize,
    blocks: usize,
    min_live_replicas: usize,
    blocks_lost: usize,
    /// Mappings per probe state, in a fixed order.
    #[serde(serialize_with = "in_order")]
    states: &'a [(&'a str, usize)],
    unreachable_depots: &'a [String],
    soonest_expiry_s: Option<i64>,
    depots: Vec<DepotMappings<'a>>,
}

/// Mappings held by one depot.
#[derive(serde::Serialize)]
struct DepotMappings<'a> {
    depot: &'a str,
    mappings: usize,
}

/// Pairs as a JSON object, keeping their order.
fn in_order<S: serde::Serializer>(pairs: &&[(&str, usize)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}
