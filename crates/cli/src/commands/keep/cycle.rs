//! One cycle of `lors keep` over every exNode, and what it says.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lors::Pool;
use lors::keep::{Cursor, Kept, Policy, Scrub, Totals};
use lors::manage::{CopyOptions, Lease};
use lors::uri::ExnodeRef;

use super::Args;

/// The exNode files `r` names.
fn files_of(r: &ExnodeRef) -> anyhow::Result<Vec<PathBuf>> {
    if !r.path.is_dir() {
        return Ok(vec![r.path.clone()]);
    }
    let mut out = Vec::new();
    crate::commands::stat::xnd_files(&r.path, &mut out)?;
    Ok(out)
}

/// One cycle over every exNode.
pub(super) fn one_cycle(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    lease: Lease,
    margin: Duration,
    stop: &tokio::sync::watch::Receiver<bool>,
    scrub: &mut Scrub,
) -> anyhow::Result<Totals> {
    let mut totals = Totals::default();
    let json = a.report.json;
    // Every exNode, each with its settings; the cycle starts at the
    // scrub's place, so the budget goes to the replicas checked longest ago.
    let mut all = Vec::new();
    for r in &a.exnodes {
        let flags = a.new_lease.layer(a.targets.layer());
        let s = Arc::new(crate::commands::settings(&a.net, flags, Some(r))?);
        all.extend(files_of(r)?.into_iter().map(|p| (p, s.clone())));
    }
    // New replicas this cycle has put on each depot: the next exNode's go
    // to the least used first, so a cycle that heals many small exNodes
    // (each placing only a copy or two) spreads them instead of giving all
    // to the first depot listed.
    let mut placed: std::collections::HashMap<String, usize> = Default::default();
    let at = all.iter().position(|(p, _)| *p == scrub.cursor.file);
    match at {
        Some(k) => all.rotate_left(k),
        None => scrub.cursor = Cursor::default(),
    }
    for (n, (path, s)) in all.into_iter().enumerate() {
        let pool = Arc::new(Pool::new(s.client()));
        if *stop.borrow() {
            return Ok(totals);
        }
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
        let first = match n {
            0 if scrub.cursor.file == path => scrub.cursor.mapping,
            _ => 0,
        };
        match keep_one(a, rt, &path, &s, &policy, &pool, scrub, first, &mut placed) {
            Ok(Some(k)) => {
                totals.add(&k);
                report(&name, &k, json, a.report.quiet)?;
            }
            Ok(None) => {
                // Stopped mid-cycle.
                totals.exnodes += 1;
                return Ok(totals);
            }
            Err(e) => {
                totals.exnodes += 1;
                totals.failed += 1;
                match json {
                    true => crate::commands::outln!(
                        "{}",
                        crate::commands::json_line(
                            &serde_json::json!({"event": "failed", "file": name, "error": format!("{e:#}")})
                        )?
                    ),
                    false => eprintln!("lors: {name}: not kept: {e:#}"),
                }
            }
        }
    }
    if json {
        crate::commands::outln!(
            "{}",
            crate::commands::json_line(&serde_json::json!({"event": "cycle", "totals": &totals}))?
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

/// Keeps one exNode, scrubbing its mappings from `first` on as far as the
/// budget goes; `None` when a signal stopped it (nothing changed).
#[allow(clippy::too_many_arguments)]
fn keep_one(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    path: &Path,
    s: &lors::settings::Settings,
    policy: &Policy,
    pool: &Arc<Pool>,
    scrub: &mut Scrub,
    first: usize,
    placed: &mut std::collections::HashMap<String, usize>,
) -> anyhow::Result<Option<Kept>> {
    let before =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let x = lors::xnd::load(path)?;
    let checked = scrub.plan(&x, path, first);
    let copies = policy
        .copies
        .or_else(|| lors::manage::copies_policy(&x))
        .unwrap_or(1);
    // Where new replicas may go; asked for each exNode, as its blocks'
    // holders differ. Without any, a cycle that needs none still runs.
    let (mut depots, unplaced) = match a.targets.find(rt, &x, s, copies, true) {
        Ok(f) => (f.depots, None),
        Err(e) => (Vec::new(), Some(format!("{e:#}"))),
    };
    // Stable: among depots as used, the directory's ranking stands.
    depots.sort_by_key(|d| placed.get(d).copied().unwrap_or(0));
    let mut k = match rt.block_on(lors::keep::cycle(&x, &depots, policy, pool, &checked)) {
        Ok(k) => k,
        Err(lors::Error::Interrupted { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if k.heal_error.is_some() && depots.is_empty() {
        k.heal_error = unplaced;
    }
    // Mappings as `lors ls` numbers them.
    let numbering = x.numbering();
    for (i, _) in k.corrupt.iter_mut().chain(k.not_refreshed.iter_mut()) {
        *i = numbering.number(*i);
    }
    if k.changed {
        for d in rt.block_on(lors::keep::save_kept(path, &before, &k, pool))? {
            *placed.entry(d).or_default() += 1;
        }
    }
    Ok(Some(k))
}

/// What one exNode's cycle did, as a line (or a JSON event).
fn report(name: &str, k: &Kept, json: bool, quiet: bool) -> anyhow::Result<()> {
    if json {
        crate::commands::outln!(
            "{}",
            crate::commands::json_line(&serde_json::json!({
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
                "scrubbed_bytes": k.scrubbed,
                "corrupt": k.corrupt.iter().map(|(i, e)| serde_json::json!({"mapping": i, "error": e})).collect::<Vec<_>>(),
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
    if !k.corrupt.is_empty() {
        did.push(format!(
            "{} corrupt replicas replaced",
            k.dropped_corrupt.len()
        ));
    }
    if !did.is_empty() && !quiet {
        crate::commands::outln!("{name}: {}", did.join(", "));
    }
    for (i, e) in &k.corrupt {
        eprintln!("lors: {name}: mapping {i} is corrupt: {e}");
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
