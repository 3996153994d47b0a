//! `lors ls`: list an exNode's mappings, probing each depot.

use std::fmt::Write as _;

use lors::manage::Probe;
use lors::uri::ExnodeRef;

/// List the mappings of an exNode: offsets, depots, capabilities, leases.
#[derive(clap::Args)]
#[command(
    after_help = "Rows are numbered and ordered as lors_ls does (by offset; replicas as LoRS
orders them), the numbers `lors trim -m` takes.
Row format (as lors_ls): index, flags (H/S/? reliability, r/w/m caps held,
a = byte array), read refcount, offset, length, depot, expiry.

Given several exNodes, a directory or --expiring, it lists a line per exNode
as `lors stat` does.

EXAMPLES:
  lors ls run42.xnd
  lors ls --json run42.xnd | jq '.mappings[] | select(.error != null)'
  lors ls --expiring 7d data/     # what expires within a week, is short or lost"
)]
pub struct Args {
    /// The exNode (or several, or directories: a line each).
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|DIR|lors://…", required = true)]
    exnodes: Vec<ExnodeRef>,
    /// A line per exNode with an allocation that expires within this long,
    /// or under its copy count, or with lost bytes (as `lors stat
    /// --expiring`; exit 1 when any byte is lost).
    #[arg(long, value_parser = super::duration_arg, value_name = "DURATION")]
    expiring: Option<std::time::Duration>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    net: super::NetOpts,
    /// Do not contact depots (no refcounts or expiry).
    #[arg(long)]
    offline: bool,
}

/// `ctime()`-style UTC text, as the original lors_ls prints expiries.
fn ctime(unix: u64) -> String {
    let t = super::date(unix);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        &t.weekday().to_string()[..3],
        &t.month().to_string()[..3],
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.year()
    )
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let exnode = match a.exnodes.as_slice() {
        [one] if a.expiring.is_none() && !one.path.is_dir() => one.clone(),
        _ => return super::stat::listing(a.exnodes, a.expiring, a.json, a.net),
    };
    let s = super::settings(&a.net, Default::default(), Some(&exnode))?;
    let x = lors::xnd::load(&exnode.path)?;
    let probes: Vec<Probe> = if a.offline {
        x.allocations()
            .map(|_| Probe::Failed("not probed".to_string()))
            .collect()
    } else {
        super::probe_all(&x, &s)?
    };
    let now = lors_ibp::units::unix_now();
    // Rows are numbered and ordered as lors_ls does, so `lors trim -m N` and
    // `lors_trim -m N` name the same mapping.
    let s = if a.json {
        json(&x, &probes, a.offline, now)?
    } else {
        table(&exnode, &x, &probes, a.offline, now)
    };
    if !s.is_empty() {
        super::outln!("{}", s.trim_end_matches('\n'));
    }
    if a.offline {
        return Ok(());
    }
    super::unreadable(&x, &probes)
}

/// The listing as one JSON line.
fn json(
    x: &lors_exnode::ExNode,
    probes: &[Probe],
    offline: bool,
    now: u64,
) -> anyhow::Result<String> {
    let numbering = x.numbering();
    let mut s = String::new();
    let mappings = numbering
        .in_order()
        .enumerate()
        .map(|(index, i)| {
            let m = x.allocation(i).expect("numbered allocations exist");
            let live = match &probes[i] {
                Probe::Live(p) => Some(p),
                _ => None,
            };
            Row {
                index,
                exnode_offset: m.exnode_offset,
                logical_length: m.logical_length,
                alloc_offset: m.alloc_offset,
                alloc_length: m.alloc_length,
                depot: m.depot().unwrap_or_default(),
                read: m.read.is_some(),
                write: m.write.is_some(),
                manage: m.manage.is_some(),
                function: m.function.as_ref().map(|f| f.name.as_str()),
                state: match (&probes[i], offline) {
                    (Probe::Live(_), _) => "live",
                    (_, true) => "not probed",
                    (p, false) => p.state(),
                },
                reliability: live.map(|p| if p.reliability == 2 { "hard" } else { "soft" }),
                read_refs: live.map(|p| p.read_refs),
                stored: live.map(|p| p.size),
                max_size: live.map(|p| p.max_size),
                expires: live
                    .map(|p| now.saturating_add(u64::try_from(p.seconds_left).unwrap_or(0))),
                error: live.is_none().then(|| probes[i].reason()),
                stripe: m.shard().map(|(s, _)| s),
                block: m.shard().map(|(_, b)| b),
                parity: i >= x.mappings.len(),
            }
        })
        .collect();
    let listing = Listing {
        filename: x.filename().unwrap_or(""),
        size: x.logical_size(),
        ec: (lors_exnode::erasure::Erasure::of(x).ok().flatten()).map(|e| e.scheme.to_string()),
        mappings,
    };
    s.push_str(&super::json_line(&listing)?);
    s.push('\n');
    Ok(s)
}

/// The listing as `lors_ls` prints it, with the reasons mappings are not live.
fn table(
    exnode: &ExnodeRef,
    x: &lors_exnode::ExNode,
    probes: &[Probe],
    offline: bool,
    now: u64,
) -> String {
    let numbering = x.numbering();
    let mut s = String::new();
    let ec = (lors_exnode::erasure::Erasure::of(x).ok().flatten())
        .map(|e| {
            format!(
                " and {} parity blocks (erasure code {})",
                x.parity.len(),
                e.scheme
            )
        })
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "{}: {} bytes, {} mappings{ec}",
        exnode.path.display(),
        x.logical_size(),
        x.mappings.len()
    );
    for (n, i) in numbering.in_order().enumerate() {
        let (m, p) = (
            x.allocation(i).expect("numbered allocations exist"),
            &probes[i],
        );
        let rel = match p {
            Probe::Live(p) if p.reliability == 2 => 'H',
            Probe::Live(p) if p.reliability == 1 => 'S',
            _ => '?',
        };
        let kind = match p {
            Probe::Live(p) if p.alloc_type == 1 => 'a',
            _ => '?',
        };
        let flags = format!(
            "{rel}{}{}{}{kind}",
            if m.read.is_some() { 'r' } else { '-' },
            if m.write.is_some() { 'w' } else { '-' },
            if m.manage.is_some() { 'm' } else { '-' }
        );
        let (refs, exp) = match p {
            Probe::Live(p) => (
                p.read_refs.to_string(),
                ctime(now.saturating_add(u64::try_from(p.seconds_left).unwrap_or(0))),
            ),
            _ if offline => ("-1".into(), "Unknown".into()),
            p => ("-1".into(), format!("Unknown ({})", p.state())),
        };
        // Parity blocks hold no file bytes: their stripe instead.
        let what = match (m.shard(), i >= x.mappings.len()) {
            (Some((st, b)), true) => format!(" [parity {b} of stripe {st}]"),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "{n:>2} {flags} {refs:>2} {:>9} {:>9} {} {exp}{what}",
            m.exnode_offset,
            m.logical_length,
            m.depot().unwrap_or_else(|| "-".into())
        );
    }
    if !offline {
        // One line per distinct reason, not per mapping: a dead depot
        // may hold thousands.
        let mut why: Vec<(String, Vec<usize>)> = Vec::new();
        for (n, i) in numbering.in_order().enumerate() {
            if probes[i].is_live() {
                continue;
            }
            let r = probes[i].reason();
            match why.iter_mut().find(|(w, _)| *w == r) {
                Some((_, v)) => v.push(n),
                None => why.push((r, vec![n])),
            }
        }
        for (r, idx) in why {
            let shown: Vec<String> = idx.iter().take(8).map(usize::to_string).collect();
            let more = if idx.len() > 8 {
                format!(" and {} more", idx.len() - 8)
            } else {
                String::new()
            };
            let _ = writeln!(s, "mapping {}{more}: {r}", shown.join(", "));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn ctime_matches_c() {
        // Reference values from `date -u -d @N "+%a %b %e %H:%M:%S %Y"`.
        assert_eq!(super::ctime(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(super::ctime(1_795_300_000), "Sat Nov 21 22:26:40 2026");
    }
}

/// `--json`: the exNode and every mapping, in `lors_ls` order.
#[derive(serde::Serialize)]
struct Listing<'a> {
    filename: &'a str,
    size: u64,
    /// The erasure code (`6+3`), for an erasure-coded file.
    #[serde(skip_serializing_if = "Option::is_none")]
    ec: Option<String>,
    mappings: Vec<Row<'a>>,
}

/// One mapping; the allocation's fields only when its probe answered.
#[derive(serde::Serialize)]
struct Row<'a> {
    index: usize,
    exnode_offset: u64,
    logical_length: u64,
    alloc_offset: u64,
    alloc_length: u64,
    depot: String,
    read: bool,
    write: bool,
    manage: bool,
    function: Option<&'a str>,
    state: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reliability: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    read_refs: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stored: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires: Option<u64>,
    error: Option<String>,
    /// An erasure-coded block's stripe and index in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    stripe: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    block: Option<usize>,
    /// A parity block (no file bytes).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    parity: bool,
}
