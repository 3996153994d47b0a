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
        for path in files {
            let name = path.display().to_string();
            total.files += 1;
            let x = match lors::xnd::load(&path)
                .map_err(anyhow::Error::from)
                .and_then(|x| Ok(lors::plan::check_exnode(&x).map(|()| x)?))
            {
                Ok(x) => x,
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
                crate::commands::outln!("{}", crate::commands::json_line(&h)?);
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
            crate::commands::outln!("{line}");
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
