//! `lors depot --status HOST[:PORT]`: what a running depot's resources
//! hold, asked over IBP (STATUS), as any client may ask it.

use std::fmt::Write as _;

use anyhow::Context as _;
use lors_ibp::ClientConfig;
use lors_ibp::units::Bytes;

/// Prints one line per resource: its size, what is allocated on it (hard
/// and soft), what is left, and its longest lease.
pub(super) fn show(addr: &str, password: &str) -> anyhow::Result<()> {
    let rt = super::super::runtime(super::super::Threads::One)?;
    let cfg = ClientConfig::with_io_timeout(std::time::Duration::from_secs(30));
    let pool = lors::Pool::new(cfg);
    let rows = (rt.block_on(pool.depot_status(addr, password)))
        .with_context(|| format!("asking the depot {addr} for its resources"))?;
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
