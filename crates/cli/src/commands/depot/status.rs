//! `lors depot --status HOST[:PORT]`: what a running depot's resources
//! hold, asked over IBP (STATUS), as any client may ask it.

use std::fmt::Write as _;

use anyhow::Context as _;
use lors_ibp::units::Bytes;
use lors_ibp::{ClientConfig, Connection};

/// Prints one line per resource: its size, what is allocated on it (hard
/// and soft), what is left, and its longest lease.
pub(super) fn show(addr: &str, password: &str) -> anyhow::Result<()> {
    let rt = super::super::runtime(super::super::Threads::One)?;
    let cfg = ClientConfig::with_io_timeout(std::time::Duration::from_secs(30));
    let rows = rt.block_on(async {
        let mut c = Connection::connect(addr, &cfg)
            .await
            .with_context(|| format!("connecting to the depot {addr}"))?;
        let rids = c.resources().await.context("asking for the resources")?;
        let mut rows = Vec::new();
        for rid in rids {
            let b = c
                .status(&rid, password)
                .await
                .with_context(|| format!("asking for resource {rid}"))?;
            rows.push(b);
        }
        anyhow::Ok(rows)
    })?;
    let mut out = format!(
        "{:<6} {:>11} {:>11} {:>6} {:>11} {:>11} {:>9}\n",
        "RID", "SIZE", "USED", "USED%", "HARD USED", "FREE", "MAX LEASE"
    );
    for b in &rows {
        let pct = if b.config_total == 0 {
            0.0
        } else {
            b.used_total as f64 * 100.0 / b.config_total as f64
        };
        let _ = writeln!(
            out,
            "{:<6} {:>11} {:>11} {:>5.1}% {:>11} {:>11} {:>8}d",
            b.rid,
            Bytes(b.config_total).to_string(),
            Bytes(b.used_total).to_string(),
            pct,
            Bytes(b.used_hard).to_string(),
            Bytes(b.free_total).to_string(),
            b.max_duration / 86_400
        );
    }
    print!("{out}");
    Ok(())
}
