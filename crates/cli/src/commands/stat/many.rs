//! `lors stat DIR` (or several exNodes): a line each.

use lors::manage::Probe;
use lors_ibp::units::{Bytes, Secs};

use super::{Args, MAX_FILES, Walk, xnd_files};

/// Many exNodes, a line each.
pub(super) fn many(a: &Args) -> anyhow::Result<()> {
    let rt = crate::commands::runtime(crate::commands::Threads::One)?;
    let mut total = Totals::default();
    for r in &a.exnodes {
        let s = crate::commands::settings(&a.net, Default::default(), Some(r))?;
        let pool = lors::Pool::new(s.client());
        let mut files = Vec::new();
        if r.path.is_dir() {
            let mut w = Walk::default();
            xnd_files(&r.path, &mut w, MAX_FILES)?;
            anyhow::ensure!(
                !w.truncated,
                "more than {MAX_FILES} exNodes under {}: name fewer at once",
                r.path.display()
            );
            for (p, why) in &w.skipped {
                eprintln!("lors: {}: skipped: {why}", p.display());
            }
            files = w.files;
        } else {
            files.push(r.path.clone());
        }
        // Probed a batch at a time: a depot that does not answer costs one
        // timeout per batch, not one per exNode.
        for batch in files.chunks(PROBE_BATCH) {
            let loaded: Vec<(String, anyhow::Result<lors_exnode::ExNode>)> = (batch.iter())
                .map(|path| {
                    let x = lors::xnd::load(path)
                        .map_err(anyhow::Error::from)
                        .and_then(|x| Ok(lors::plan::check_exnode(&x).map(|()| x)?));
                    (path.display().to_string(), x)
                })
                .collect();
            let xs: Vec<&lors_exnode::ExNode> =
                loaded.iter().filter_map(|(_, x)| x.as_ref().ok()).collect();
            let mut probes = rt
                .block_on(lors::manage::probe_many(&xs, &pool))
                .into_iter();
            for (name, x) in &loaded {
                total.files += 1;
                match x {
                    Ok(x) => {
                        let probes = probes.next().unwrap_or_default();
                        line(a, &mut total, &Health::of(x, &probes, name)?)?;
                    }
                    Err(e) => {
                        total.unreadable += 1;
                        match a.json {
                            true => crate::commands::outln!(
                                "{}",
                                crate::commands::json_line(
                                    &serde_json::json!({"file": name, "error": format!("{e:#}")})
                                )?
                            ),
                            false => crate::commands::outln!("{name}: cannot be read: {e:#}"),
                        }
                    }
                }
            }
        }
    }
    if a.json {
        crate::commands::outln!("{}", crate::commands::json_line(&total)?);
    } else {
        let within = a
            .expiring
            .map(|d| format!("{} expire within {}, ", total.expiring, Secs(d.as_secs())))
            .unwrap_or_default();
        crate::commands::outln!(
            "{} exNodes: {within}{} under their copy count or parity margin, {} with lost bytes{}",
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

/// Files probed at once ([`lors::manage::probe_many`]).
const PROBE_BATCH: usize = 256;

/// Counts `h` in `total` and prints its line, unless `--expiring` leaves
/// out a healthy file that does not expire soon.
fn line(a: &Args, total: &mut Totals, h: &Health) -> anyhow::Result<()> {
    let expiring = match (a.expiring, h.soonest_expiry_s) {
        (Some(within), Some(s)) => u64::try_from(s).unwrap_or(0) <= within.as_secs(),
        _ => false,
    };
    let under = h.under();
    total.expiring += usize::from(expiring);
    total.under += usize::from(under && h.lost_bytes == 0);
    total.lost += usize::from(h.lost_bytes > 0);
    if a.expiring.is_some() && !expiring && !under {
        return Ok(());
    }
    if a.json {
        crate::commands::outln!("{}", crate::commands::json_line(h)?);
        return Ok(());
    }
    let mut line = match &h.erasure {
        Some(e) => {
            let margin = match e.min_margin {
                m if m >= 0 => format!("every stripe can lose {m} more of its {}", e.blocks),
                _ => format!("{} stripes unreadable", e.lost.len()),
            };
            format!(
                "{}: {}, {} stripes ({}), {margin}",
                h.file,
                Bytes(h.size),
                e.stripes,
                e.code
            )
        }
        None => format!(
            "{}: {}, {} blocks, {} of {} copies",
            h.file,
            Bytes(h.size),
            h.blocks,
            h.min_live_replicas,
            h.copies
        ),
    };
    if let Some(s) = h.soonest_expiry_s {
        line += &format!(", expires in {}", Secs(u64::try_from(s).unwrap_or(0)));
    }
    if h.lost_bytes > 0 {
        line += &format!("; LOST {} bytes", h.lost_bytes);
    } else if under && h.erasure.is_some() {
        line += "; below its full margin (`lors augment --repair`)";
    } else if under {
        line += "; under its copy count (`lors augment`)";
    }
    crate::commands::outln!("{line}");
    Ok(())
}

/// One exNode's health, a line of `stat` over many.
#[derive(serde::Serialize)]
struct Health<'a> {
    file: &'a str,
    size: u64,
    blocks: usize,
    /// Of a file kept by copies: the fewest live replicas any block has.
    min_live_replicas: usize,
    /// The copies its policy asks for (`lors_copies`, else what its blocks
    /// have); 1 for an erasure-coded file.
    copies: usize,
    soonest_expiry_s: Option<i64>,
    /// Bytes no live replica holds, or in stripes too few blocks are left
    /// of to read.
    lost_bytes: u64,
    /// An erasure-coded file's stripes: its redundancy is their margin.
    #[serde(skip_serializing_if = "Option::is_none")]
    erasure: Option<super::StripesJson>,
}

impl<'a> Health<'a> {
    fn of(x: &lors_exnode::ExNode, probes: &[Probe], file: &'a str) -> anyhow::Result<Self> {
        let live: Vec<bool> = probes.iter().map(Probe::is_live).collect();
        let blocks = x.blocks();
        let soonest_expiry_s = (probes.iter())
            .filter_map(|p| match p {
                Probe::Live(p) => Some(p.seconds_left),
                _ => None,
            })
            .min();
        if let Some(st) = super::Stripes::of(x, probes)? {
            let lost_bytes = (st.margins.iter())
                .filter(|m| m.margin < 0)
                .map(|m| m.bytes.end - m.bytes.start)
                .sum();
            return Ok(Health {
                file,
                size: x.logical_size(),
                blocks: x.allocations().count(),
                min_live_replicas: usize::from(lost_bytes == 0),
                copies: 1,
                soonest_expiry_s,
                lost_bytes,
                erasure: Some(st.json()),
            });
        }
        let copies = x.copies_policy().unwrap_or(1);
        Ok(Health {
            file,
            size: x.logical_size(),
            blocks: blocks.len(),
            // (A file of no block, an empty one, is short of nothing.)
            min_live_replicas: (blocks.values())
                .map(|v| v.iter().filter(|&&i| live[i]).count())
                .min()
                .unwrap_or(copies),
            copies,
            soonest_expiry_s,
            lost_bytes: (x.uncovered(&live).iter()).map(|r| r.end - r.start).sum(),
            erasure: None,
        })
    }

    /// Less redundant than it should be: under its copy count, or a stripe
    /// below its full margin.
    fn under(&self) -> bool {
        match &self.erasure {
            Some(e) => e.min_margin < e.full_margin,
            None => self.min_live_replicas < self.copies,
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
