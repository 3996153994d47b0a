//! `lors ls`: list an exNode's mappings, probing each depot.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use lors::manage::Probe;
use lors::uri::ExnodeRef;

use super::{json_str, read_exnode};

/// List the mappings of an exNode: offsets, depots, capabilities, leases.
#[derive(clap::Args)]
#[command(
    after_help = "Rows are numbered and ordered as lors_ls does (by offset; replicas as LoRS
orders them), the numbers `lors trim -m` takes.
Row format (as lors_ls): index, flags (H/S/? reliability, r/w/m caps held,
a = byte array), read refcount, offset, length, depot, expiry.

EXAMPLES:
  lors ls run42.xnd
  lors ls --json run42.xnd | jq '.mappings[] | select(.error != null)'"
)]
pub struct Args {
    /// The exNode.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…")]
    exnode: ExnodeRef,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// Do not contact depots (no refcounts or expiry).
    #[arg(long)]
    offline: bool,
}

/// `ctime()`-style UTC text, as the original lors_ls prints expiries.
fn ctime(unix: u64) -> String {
    let days = i64::try_from(unix / 86_400).unwrap_or(0);
    let secs = unix % 86_400;
    // Civil-from-days (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let wd = (days + 4).rem_euclid(7);
    const W: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const M: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        W[wd as usize],
        M[(m - 1) as usize],
        d,
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        y
    )
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let x = read_exnode(&a.exnode.path)?;
    let probes: Vec<Probe> = if a.offline {
        x.mappings
            .iter()
            .map(|_| Probe::Failed("not probed".to_string()))
            .collect()
    } else {
        super::probe_all(&x)?
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Rows are numbered and ordered as lors_ls does, so `lors trim -m N` and
    // `lors_trim -m N` name the same mapping.
    let numbering = x.numbering();
    let mut s = String::new();
    if a.json {
        let _ = write!(
            s,
            "{{\"filename\":{},\"size\":{},\"mappings\":[",
            json_str(x.filename().unwrap_or("")),
            x.logical_size()
        );
        for (n, i) in numbering.in_order().enumerate() {
            let (m, p) = (&x.mappings[i], &probes[i]);
            if n > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                "{{\"index\":{n},\"exnode_offset\":{},\"logical_length\":{},\"alloc_offset\":{},\"alloc_length\":{},\"depot\":{},\"read\":{},\"write\":{},\"manage\":{},\"function\":{}",
                m.exnode_offset,
                m.logical_length,
                m.alloc_offset,
                m.alloc_length,
                json_str(&m.depot().unwrap_or_default()),
                m.read.is_some(),
                m.write.is_some(),
                m.manage.is_some(),
                m.function
                    .as_ref()
                    .map_or("null".to_string(), |f| json_str(&f.name)),
            );
            match p {
                Probe::Live(p) => {
                    let _ = write!(
                        s,
                        ",\"state\":\"live\",\"reliability\":{},\"read_refs\":{},\"stored\":{},\"max_size\":{},\"expires\":{},\"error\":null}}",
                        json_str(if p.reliability == 2 { "hard" } else { "soft" }),
                        p.read_refs,
                        p.size,
                        p.max_size,
                        now.saturating_add(u64::try_from(p.seconds_left).unwrap_or(0))
                    );
                }
                p => {
                    let _ = write!(
                        s,
                        ",\"state\":{},\"error\":{}}}",
                        json_str(if a.offline { "not probed" } else { p.state() }),
                        json_str(&p.reason())
                    );
                }
            }
        }
        s.push_str("]}\n");
    } else {
        let _ = writeln!(
            s,
            "{}: {} bytes, {} mappings",
            a.exnode.path.display(),
            x.logical_size(),
            x.mappings.len()
        );
        for (n, i) in numbering.in_order().enumerate() {
            let (m, p) = (&x.mappings[i], &probes[i]);
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
                _ if a.offline => ("-1".into(), "Unknown".into()),
                p => ("-1".into(), format!("Unknown ({})", p.state())),
            };
            let _ = writeln!(
                s,
                "{n:>2} {flags} {refs:>2} {:>9} {:>9} {} {exp}",
                m.exnode_offset,
                m.logical_length,
                m.depot().unwrap_or_else(|| "-".into())
            );
        }
        if !a.offline {
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
    }
    if !s.is_empty() {
        super::outln!("{}", s.trim_end_matches('\n'));
    }
    if a.offline {
        return Ok(());
    }
    super::unreadable(&x, &probes)
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
