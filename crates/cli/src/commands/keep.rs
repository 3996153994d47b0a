//! `lors keep`: keep exNodes' data alive and whole, once (cron) or as a
//! service.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use lors::Pool;
use lors::keep::{Kept, Policy};
use lors::manage::{CopyOptions, Lease};
use lors::uri::ExnodeRef;
use lors_http::metrics::prometheus_client::metrics::{counter::Counter, gauge::Gauge};

use crate::report::ReportOpts;
use lors_ibp::units::Secs;

/// Keep exNodes' data alive and whole: refresh leases before they end,
/// remake lost replicas from live ones, drop dead mappings.
#[derive(clap::Args)]
#[command(
    after_help = "Each cycle, for every exNode (files, or every *.xnd under a directory, new
ones included): probe every allocation; extend the leases with less than
--margin left; give each block with fewer live replicas than its copy count
new ones, copied depot to depot from a live replica (--depot or the L-Bone
choose where, never beside a replica of the same block); drop mappings that
are gone for good, and those of unreachable depots once their block has its
copies again; with --scrub-rate, read back and check the next replicas in
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

/// Where the scrub goes on: the exNode and its first mapping not yet
/// checked.
#[derive(Default, Clone, serde::Serialize, serde::Deserialize)]
struct Cursor {
    file: PathBuf,
    mapping: usize,
}

impl Cursor {
    fn load(path: Option<&Path>) -> Cursor {
        path.and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Written whole or not at all (a temporary file renamed).
    fn save(&self, path: Option<&Path>) -> anyhow::Result<()> {
        let Some(path) = path else { return Ok(()) };
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(self)?)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| anyhow::anyhow!("writing the scrub state {}: {e}", path.display()))
    }
}

/// The scrub's share of one cycle: bytes left, and where it is.
struct Scrub {
    budget: u64,
    cursor: Cursor,
}

/// What a run found, over its cycles' last.
#[derive(Default, Clone, serde::Serialize)]
struct Totals {
    exnodes: usize,
    scrubbed_bytes: u64,
    corrupt: usize,
    refreshed: usize,
    not_refreshed: usize,
    healed: usize,
    trimmed: usize,
    lost_bytes: u64,
    short_blocks: usize,
    failed: usize,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let lease = match a.lease.as_str() {
        "max" => Lease::Max,
        d => Lease::To(
            super::duration_arg(d).map_err(|e| crate::UsageError(format!("--lease {d}: {e}")))?,
        ),
    };
    if a.every < Duration::from_secs(1) {
        return Err(crate::UsageError(
            "--every must be at least 1s: each cycle probes every allocation".into(),
        )
        .into());
    }
    if let Lease::To(d) = lease
        && d <= a.every
    {
        return Err(crate::UsageError(format!(
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
        cursor.save(a.state.as_deref())?;
        let stopped = *stop.borrow();
        if a.once || stopped {
            if stopped {
                eprintln!("lors: keep stopped; every exNode is as the last finished cycle left it");
                return Ok(());
            }
            anyhow::ensure!(
                totals.lost_bytes == 0
                    && totals.failed == 0
                    && totals.not_refreshed == 0
                    && totals.short_blocks == 0,
                "not everything is kept: {} bytes lost, {} leases not extended, {} blocks short of copies, {} exNodes not kept",
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

/// The exNode files `r` names.
fn files_of(r: &ExnodeRef) -> anyhow::Result<Vec<PathBuf>> {
    if !r.path.is_dir() {
        return Ok(vec![r.path.clone()]);
    }
    let mut out = Vec::new();
    super::stat::xnd_files(&r.path, &mut out)?;
    Ok(out)
}

/// One cycle over every exNode.
fn one_cycle(
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
        let s = Arc::new(super::settings(&a.net, flags, Some(r))?);
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
        totals.exnodes += 1;
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
                totals.scrubbed_bytes += k.scrubbed;
                totals.corrupt += k.corrupt.len();
                totals.refreshed += k.refreshed;
                totals.not_refreshed += k.not_refreshed.len();
                totals.healed += k.healed;
                totals.trimmed += k.trimmed;
                totals.lost_bytes += k.lost.iter().map(|(s, e)| e - s).sum::<u64>();
                totals.short_blocks += k.short.len();
                report(&name, &k, json, a.report.quiet)?;
            }
            Ok(None) => return Ok(totals), // stopped mid-cycle
            Err(e) => {
                totals.failed += 1;
                match json {
                    true => super::outln!(
                        "{}",
                        super::json_line(
                            &serde_json::json!({"event": "failed", "file": name, "error": format!("{e:#}")})
                        )?
                    ),
                    false => eprintln!("lors: {name}: not kept: {e:#}"),
                }
            }
        }
    }
    if json {
        super::outln!(
            "{}",
            super::json_line(&serde_json::json!({"event": "cycle", "totals": &totals}))?
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
    let mut checked = Vec::new();
    let mut next = first;
    while next < x.mappings.len() && scrub.budget > 0 {
        scrub.budget = scrub.budget.saturating_sub(x.mappings[next].alloc_length);
        checked.push(next);
        next += 1;
    }
    if !checked.is_empty() || scrub.budget > 0 {
        // The place to go on from: later in this file, or the next file.
        scrub.cursor = Cursor {
            file: path.to_owned(),
            mapping: next,
        };
    }
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
        // A second writer (augment, trim, another keeper) may have changed
        // the file meanwhile: its change stands, and this cycle's copies
        // are freed; the next cycle starts from the new file.
        if std::fs::read(path).ok().as_deref() != Some(&before[..]) {
            let made = &k.exnode.mappings[k.exnode.mappings.len() - k.healed..];
            rt.block_on(lors::keep::release(made, pool));
            anyhow::bail!("it changed while it was kept: left to the next cycle");
        }
        lors::xnd::save(path, &k.exnode)?;
        let made = &k.exnode.mappings[k.exnode.mappings.len() - k.healed..];
        for d in made.iter().filter_map(|m| m.depot()) {
            *placed.entry(d).or_default() += 1;
        }
        // Named nowhere now: freed (a failure leaves them to their leases).
        rt.block_on(lors::keep::release(&k.dropped_corrupt, pool));
    }
    Ok(Some(k))
}

/// What one exNode's cycle did, as a line (or a JSON event).
fn report(name: &str, k: &Kept, json: bool, quiet: bool) -> anyhow::Result<()> {
    if json {
        super::outln!(
            "{}",
            super::json_line(&serde_json::json!({
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
        super::outln!("{name}: {}", did.join(", "));
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

/// What `--metrics` serves: counters over the run, and the last cycle's
/// findings as gauges (what is lost or short now, not ever).
struct Metrics {
    registry: lors_http::metrics::Registry,
    cycles: Counter,
    refreshed: Counter,
    healed: Counter,
    trimmed: Counter,
    scrubbed_bytes: Counter,
    corrupt: Counter,
    last_seconds: Gauge<f64, AtomicU64>,
    last_end: Gauge,
    exnodes: Gauge,
    lost_bytes: Gauge,
    short_blocks: Gauge,
    not_refreshed: Gauge,
    failed: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = lors_http::metrics::Registry::with_prefix("lors_keep");
        let m = Metrics {
            registry: Default::default(),
            cycles: Default::default(),
            refreshed: Default::default(),
            healed: Default::default(),
            trimmed: Default::default(),
            scrubbed_bytes: Default::default(),
            corrupt: Default::default(),
            last_seconds: Default::default(),
            last_end: Default::default(),
            exnodes: Default::default(),
            lost_bytes: Default::default(),
            short_blocks: Default::default(),
            not_refreshed: Default::default(),
            failed: Default::default(),
        };
        r.register("cycles", "Cycles finished", m.cycles.clone());
        r.register("leases_extended", "Leases extended", m.refreshed.clone());
        r.register(
            "replicas_made",
            "Replicas made for blocks short of copies",
            m.healed.clone(),
        );
        r.register(
            "mappings_dropped",
            "Dead or corrupt mappings dropped",
            m.trimmed.clone(),
        );
        r.register(
            "scrubbed_bytes",
            "Stored bytes read back and checked",
            m.scrubbed_bytes.clone(),
        );
        r.register(
            "corrupt_replicas",
            "Replicas the scrub found corrupt",
            m.corrupt.clone(),
        );
        r.register(
            "last_cycle_seconds",
            "How long the last cycle took",
            m.last_seconds.clone(),
        );
        r.register(
            "last_cycle_end_timestamp_seconds",
            "When the last cycle ended (Unix time)",
            m.last_end.clone(),
        );
        r.register("exnodes", "ExNodes in the last cycle", m.exnodes.clone());
        r.register(
            "lost_bytes",
            "Bytes with no live replica, as the last cycle found them",
            m.lost_bytes.clone(),
        );
        r.register(
            "short_blocks",
            "Blocks short of their copies after the last cycle",
            m.short_blocks.clone(),
        );
        r.register(
            "leases_not_extended",
            "Leases the last cycle could not extend",
            m.not_refreshed.clone(),
        );
        r.register(
            "failed_exnodes",
            "ExNodes the last cycle could not keep",
            m.failed.clone(),
        );
        Metrics { registry: r, ..m }
    }
}

impl Metrics {
    fn cycle(&self, t: &Totals, took: Duration) {
        let n = |v: usize| v as u64;
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.cycles.inc();
        self.scrubbed_bytes.inc_by(t.scrubbed_bytes);
        self.corrupt.inc_by(n(t.corrupt));
        self.refreshed.inc_by(n(t.refreshed));
        self.healed.inc_by(n(t.healed));
        self.trimmed.inc_by(n(t.trimmed));
        self.last_seconds.set(took.as_secs_f64());
        self.last_end.set(g(lors_ibp::units::unix_now()));
        self.exnodes.set(g(n(t.exnodes)));
        self.lost_bytes.set(g(t.lost_bytes));
        self.short_blocks.set(g(n(t.short_blocks)));
        self.not_refreshed.set(g(n(t.not_refreshed)));
        self.failed.set(g(n(t.failed)));
    }

    fn render(&self) -> String {
        lors_http::metrics::encode(&self.registry)
    }
}
