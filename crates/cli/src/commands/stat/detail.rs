//! `lors stat FILE.xnd`: one exNode in detail.

use std::collections::BTreeMap;

use lors::manage::Probe;
use lors::uri::ExnodeRef;

use super::{Args, Stripes, StripesJson};

/// One exNode in detail.
pub(super) fn detail(a: &Args, r: &ExnodeRef) -> anyhow::Result<()> {
    let s = crate::commands::settings(&a.net, Default::default(), Some(r))?;
    let x = lors::xnd::load(&r.path)?;
    // What a download would refuse is reported, and fails, here too.
    lors::plan::check_exnode(&x)?;
    let probes = crate::commands::probe_all(&x, &s)?;
    let blocks = x.blocks();
    let live = |i: usize| probes[i].is_live();
    let replicas: Vec<usize> = blocks
        .values()
        .map(|v| v.iter().filter(|&&i| live(i)).count())
        .collect();
    let min_live = replicas.iter().copied().min().unwrap_or(0);
    let lost = replicas.iter().filter(|&&r| r == 0).count();
    let stripes = Stripes::of(&x, &probes)?;
    let mut per_depot: BTreeMap<String, usize> = BTreeMap::new();
    for m in x.allocations() {
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
        .allocations()
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
            holes: x.hole_bytes(),
            mappings: x.mappings.len(),
            blocks: blocks.len(),
            min_live_replicas: min_live,
            blocks_lost: lost,
            states: &states,
            unreachable_depots: &down,
            soonest_expiry_s: soonest,
            erasure: stripes.as_ref().map(Stripes::json),
            depots: per_depot
                .iter()
                .map(|(depot, n)| DepotMappings {
                    depot,
                    mappings: *n,
                })
                .collect(),
        };
        crate::commands::outln!("{}", crate::commands::json_line(&summary)?);
    } else {
        crate::commands::outln!("file:      {}", x.filename().unwrap_or("(no name)"));
        crate::commands::outln!("size:      {}", size(&x));
        if let Some(st) = &stripes {
            st.print()?;
        } else {
            crate::commands::outln!(
                "blocks:    {} ({} mappings)",
                blocks.len(),
                x.mappings.len()
            );
        }
        if stripes.is_none() {
            crate::commands::outln!(
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
        }
        crate::commands::outln!(
            "mappings:  {}",
            states
                .iter()
                .map(|(s, n)| format!("{n} {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !down.is_empty() {
            crate::commands::outln!("unreachable depots: {}", down.join(", "));
        }
        if let Some(s) = soonest {
            crate::commands::outln!(
                "expires:   first allocation in {s} s ({:.1} h); extend with `lors refresh`",
                s as f64 / 3600.0
            );
        }
        for (d, n) in &per_depot {
            crate::commands::outln!("depot:     {d} — {n} mappings");
        }
    }
    crate::commands::unreadable(&x, &probes)
}

/// `N bytes`, and the bytes of them in holes.
fn size(x: &lors_exnode::ExNode) -> String {
    match x.hole_bytes() {
        0 => format!("{} bytes", x.logical_size()),
        h => format!(
            "{} bytes ({h} of them in {} holes, not stored: zeros)",
            x.logical_size(),
            x.holes.len()
        ),
    }
}

/// `--json`: the exNode's health in one object.
#[derive(serde::Serialize)]
struct Summary<'a> {
    filename: &'a str,
    size: u64,
    /// Bytes of `size` in holes (a sparse file's zeros, not stored).
    holes: u64,
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
    /// An erasure-coded file's stripes.
    #[serde(skip_serializing_if = "Option::is_none")]
    erasure: Option<StripesJson>,
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
