//! `lors keep`: keep exNodes' data alive and whole, once (cron) or as a
//! service.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lors::keep::{Cursor, Scrub};
use lors::manage::Lease;
use lors::uri::ExnodeRef;
use lors_ibp::units::Secs;

use crate::report::ReportOpts;

mod cycle;
mod files;
mod metrics;
mod say;

use cycle::one_cycle;
use metrics::Metrics;

/// Keep exNodes' data alive and whole: refresh leases before they end,
/// remake lost replicas from live ones, drop dead mappings.
#[derive(clap::Args)]
#[command(
    after_help = "Each cycle, for every exNode (files, or every *.xnd under a directory, new
ones included): probe every allocation; extend the leases with less than
--margin left; give each block with fewer live replicas than its copy count
new ones, copied depot to depot from a live replica (--depot or the L-Bone
choose where, never beside a replica of the same block) — a replica whose
depot does not answer counts for --grace first; drop mappings that are gone
for good, and those of depots silent past the grace once their block has
its copies again (freed when the depot answers); with --scrub-rate, read back and check the next replicas in
turn, replacing a corrupt one. A block with no live replica is reported LOST with its bytes;
the keeper never makes a replica from anything but a live one. An exNode is
rewritten atomically, and not at all if it changed while the cycle ran.

EXAMPLES:
  lors keep --once --depot d4:6714,d5:6714 data/     # from cron: exit 1 if anything is lost
  lors keep --every 1h --lease 30d data/ run42.xnd   # a service (see examples/lors-keep.service)
  lors keep --once -c 3 --json run42.xnd
  lors keep --every 1h --scrub-rate 1200K --state scrub.json data/   # each replica checked weekly"
)]
pub struct Args {
    /// The exNodes: files, or directories whose `*.xnd` files (at any
    /// depth) are kept.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|DIR", required = true)]
    exnodes: Vec<ExnodeRef>,
    /// One cycle, then exit: 1 when any byte is lost or any lease or copy
    /// could not be made.
    #[arg(long)]
    once: bool,
    /// Time from the start of one cycle to the start of the next.
    #[arg(long, value_parser = super::duration_arg, default_value = "1h")]
    every: Duration,
    /// How long a depot may not answer before its replicas are made again
    /// elsewhere (`0`: at once). A restart or a pause is not a loss; the
    /// copies made past it are freed on the old depot when it answers
    /// again.
    #[arg(long, value_parser = super::duration_arg, default_value = "15m", value_name = "DURATION")]
    grace: Duration,
    /// Live replicas each block keeps [default: the exNode's own copy
    /// count (recorded at upload, else what its blocks have)].
    #[arg(short, long, value_parser = clap::value_parser!(u64).range(1..=16))]
    copies: Option<u64>,
    /// What a refresh sets: a lease from now (`30d`), or `max` for as long
    /// as each depot allows.
    #[arg(long, default_value = "max", value_name = "DURATION|max")]
    lease: String,
    /// Refresh an allocation with less than this left [default: the larger
    /// of twice --every and a tenth of --lease (a day for max)].
    #[arg(long, value_parser = super::duration_arg)]
    margin: Option<Duration>,
    /// Read back and check this many stored bytes per second (e.g. `10M`):
    /// each cycle verifies the next replicas in turn, its share being the
    /// rate times --every (or the time since the last cycle began, when
    /// cycles run longer), so the whole data set is checked over
    /// (size / rate) seconds. A corrupt replica is replaced from a good one
    /// and freed [default: no scrub].
    #[arg(long, value_name = "RATE", value_parser = super::nonzero_size_arg)]
    scrub_rate: Option<u64>,
    /// The longest one exNode's turn in a cycle may take: probes,
    /// refreshes, the scrub's reads, new copies. Past it the file is left
    /// to the next cycle, so no file or depot can hold up the others
    /// [default: the longer of --every and 10 minutes].
    #[arg(long, value_parser = super::duration_arg, value_name = "DURATION")]
    file_deadline: Option<Duration>,
    /// Where the scrub's place is kept between runs (a restart, the next
    /// `--once`, resumes from it) [default: none: each run starts over].
    #[arg(long, value_name = "FILE")]
    state: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (GET /metrics): what the
    /// cycles did, and what the last one found.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    #[command(flatten)]
    targets: super::Targets,
    #[command(flatten)]
    new_lease: super::LeaseOpts,
    #[command(flatten)]
    net: super::NetOpts,
    #[command(flatten)]
    report: ReportOpts,
}

impl Args {
    /// One exNode's turn at most ([`Args::file_deadline`]'s default).
    fn file_deadline(&self) -> Duration {
        (self.file_deadline).unwrap_or_else(|| self.every.max(Duration::from_secs(600)))
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let lease = match a.lease.as_str() {
        "max" => Lease::Max,
        d => Lease::To(
            super::duration_arg(d)
                .map_err(|e| crate::exit::UsageError(format!("--lease {d}: {e}")))?,
        ),
    };
    if a.every < Duration::from_secs(1) {
        return Err(crate::exit::UsageError(
            "--every must be at least 1s: each cycle probes every allocation".into(),
        )
        .into());
    }
    if a.file_deadline.is_some_and(|d| d < Duration::from_secs(1)) {
        return Err(crate::exit::UsageError(
            "--file-deadline must be at least 1s: each exNode's turn probes every allocation"
                .into(),
        )
        .into());
    }
    if let Lease::To(d) = lease
        && d <= a.every
    {
        return Err(crate::exit::UsageError(format!(
            "--lease {} is not longer than --every {}: leases would end between cycles",
            a.lease,
            Secs(a.every.as_secs())
        ))
        .into());
    }
    let tenth = match lease {
        Lease::To(d) => d / 10,
        _ => Duration::from_secs(86_400),
    };
    let margin = a.margin.unwrap_or((a.every * 2).max(tenth));
    let rt = super::runtime(super::Threads::Many)?;
    let (stop, _signal) = super::stop_on_signal(&rt);
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = a.metrics {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))?;
        let m = metrics.clone();
        rt.spawn(lors_http::metrics::serve_metrics(
            listener,
            move || m.render(),
            stop.clone(),
        ));
    }
    let mut cursor = Cursor::load(a.state.as_deref());
    let mut last: Option<std::time::Instant> = None;
    loop {
        let began = std::time::Instant::now();
        // The scrub reads its rate times the time since the last cycle
        // began: --every, or more when cycles run longer than that, so the
        // rate holds over wall time either way.
        let span = last.map_or(a.every, |t| began.duration_since(t).max(a.every));
        last = Some(began);
        let mut scrub = Scrub {
            budget: a.scrub_rate.map_or(0, |r| {
                let bytes = u128::from(r) * span.as_millis() / 1000;
                u64::try_from(bytes).unwrap_or(u64::MAX)
            }),
            cursor: cursor.clone(),
        };
        let totals = one_cycle(&a, &rt, lease, margin, &stop, &mut scrub)?;
        metrics.cycle(&totals, began.elapsed());
        cursor = scrub.cursor;
        cursor.save(a.state.as_deref()).map_err(|e| {
            let state = a
                .state
                .as_deref()
                .unwrap_or(std::path::Path::new(""))
                .display();
            anyhow::anyhow!("writing the scrub state {state}: {e}")
        })?;
        let stopped = *stop.borrow();
        if a.once || stopped {
            if stopped {
                eprintln!("lors: keep stopped; every exNode is as the last finished cycle left it");
                return Ok(());
            }
            anyhow::ensure!(
                totals.all_kept(),
                "not everything is kept: {} bytes lost, {} leases not extended, {} blocks short of copies or stripes below their margin, {} exNodes not kept",
                totals.lost_bytes,
                totals.not_refreshed,
                totals.short_blocks,
                totals.failed
            );
            return Ok(());
        }
        // Until the next cycle, or a signal.
        let mut stop = stop.clone();
        let next = a.every.saturating_sub(began.elapsed());
        let signalled = rt.block_on(async {
            tokio::select! {
                () = tokio::time::sleep(next) => false,
                _ = stop.wait_for(|s| *s) => true,
            }
        });
        if signalled {
            eprintln!("lors: keep stopped between cycles");
            return Ok(());
        }
    }
}
