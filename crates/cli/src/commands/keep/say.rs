//! What `lors keep` says of each exNode and of each cycle: lines on
//! standard error, or JSON events on standard output.

use lors::keep::{Kept, Totals};

/// Files not kept that a cycle names on standard error (JSON names all).
const SAID_FAILURES: usize = 100;

/// Says (among the first [`SAID_FAILURES`]; JSON says all) why an exNode
/// was not kept.
pub(super) fn failed(
    totals: &Totals,
    name: &str,
    e: &lors::keep::FileError,
    json: bool,
) -> anyhow::Result<()> {
    let e = in_words(e);
    match json {
        true => crate::commands::outln!(
            "{}",
            crate::commands::json_line(
                &serde_json::json!({"event": "failed", "file": name, "error": e})
            )?
        ),
        false if totals.failed <= SAID_FAILURES => eprintln!("lors: {name}: not kept: {e}"),
        false => {}
    }
    Ok(())
}

/// A file's failure and its causes, the deadline named by the option
/// that sets it.
fn in_words(e: &lors::keep::FileError) -> String {
    match e {
        lors::keep::FileError::Deadline(d) => format!(
            "not done within {} (--file-deadline): left to the next cycle",
            lors_ibp::units::Secs(d.as_secs())
        ),
        e => lors::error::chain(e),
    }
}

/// Says that another lors command holds an exNode.
pub(super) fn busy(name: &str, holder: Option<u32>, json: bool) -> anyhow::Result<()> {
    let who = holder.map(|p| format!(" (pid {p})")).unwrap_or_default();
    match json {
        true => crate::commands::outln!(
            "{}",
            crate::commands::json_line(
                &serde_json::json!({"event": "busy", "file": name, "holder": holder})
            )?
        ),
        false => eprintln!(
            "lors: {name}: another lors command{who} is changing it: left to the next cycle"
        ),
    }
    Ok(())
}

/// The cycle's totals.
pub(super) fn cycle_done(totals: &Totals, json: bool, quiet: bool) -> anyhow::Result<()> {
    if totals.failed > SAID_FAILURES && !json {
        eprintln!(
            "lors: … and {} more exNodes not kept (--json lists each)",
            totals.failed - SAID_FAILURES
        );
    }
    if json {
        crate::commands::outln!(
            "{}",
            crate::commands::json_line(&serde_json::json!({"event": "cycle", "totals": totals}))?
        );
    } else if !quiet {
        eprintln!(
            "lors: cycle done: {} exNodes, {} leases extended, {} new replicas, {} blocks remade, {} mappings dropped{}",
            totals.exnodes,
            totals.refreshed,
            totals.healed,
            totals.remade,
            totals.trimmed,
            if totals.lost_bytes > 0 {
                format!(", {} bytes LOST", totals.lost_bytes)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// What one exNode's cycle did, as a line (or a JSON event).
pub(super) fn kept(name: &str, k: &Kept, json: bool, quiet: bool) -> anyhow::Result<()> {
    if json {
        crate::commands::outln!(
            "{}",
            crate::commands::json_line(&serde_json::json!({
                "event": "kept",
                "file": name,
                "copies": k.copies,
                "refreshed": k.refreshed,
                "not_refreshed": k.not_refreshed.iter().map(|(i, e)| serde_json::json!({"mapping": i, "error": e.text})).collect::<Vec<_>>(),
                "healed": k.healed,
                "stripes_short": k.stripes.as_ref().map(|(_, v)| v.iter().map(|s| serde_json::json!({"stripe": s.stripe, "start": s.bytes.start, "end": s.bytes.end, "margin": s.margin, "why": s.why.to_string()})).collect::<Vec<_>>()),
                "trimmed": k.trimmed,
                "lost": pairs(&k.lost),
                "short": pairs(&k.short),
                "heal_error": k.heal_error.as_ref().map(ToString::to_string),
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
    match (&k.stripes, k.healed) {
        (_, 0) => {}
        (Some(_), n) => did.push(format!("{n} blocks remade")),
        (None, n) => did.push(format!("{n} new replicas")),
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
    if let Some((code, short)) = &k.stripes {
        for s in short {
            let (a, b) = (s.bytes.start, s.bytes.end);
            let state = match s.margin {
                m if m < 0 => "cannot be read".to_string(),
                0 => "is at margin 0 (one more loss makes it unreadable)".to_string(),
                m => format!("can lose {m} more of its {} blocks", code.blocks()),
            };
            eprintln!(
                "lors: {name}: stripe {} (bytes {a}..{b}) {state}; not made whole: {}",
                s.stripe, s.why
            );
        }
    }
    for std::ops::Range { start: s, end: e } in k.short.iter().filter(|_| k.stripes.is_none()) {
        eprintln!(
            "lors: {name}: bytes {s}..{e} are short of {} live copies{}",
            k.copies,
            k.heal_error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
    }
    for std::ops::Range { start: s, end: e } in &k.lost {
        eprintln!("lors: {name}: LOST: bytes {s}..{e} have no live replica");
    }
    Ok(())
}

/// Byte ranges as `--json` has always written them: `[start, end]` pairs.
fn pairs(ranges: &[std::ops::Range<u64>]) -> Vec<[u64; 2]> {
    ranges.iter().map(|r| [r.start, r.end]).collect()
}
