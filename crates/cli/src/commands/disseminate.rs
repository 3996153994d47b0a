//! `lors disseminate`: one file to many sites, each ending with a full
//! replica; the sites relay to each other ("DDMG: A Data Dissemination Mechanism for Grid Environments").

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use lors::dissem::{Input, Options, disseminate};

use crate::exit::UsageError;
use crate::report::{ReportOpts, Reporter, Unit};
use lors_ibp::units::Bytes;

/// Send a file (or an exNode's data) to many depots at once: each ends with
/// a full replica, in about the time of one transfer.
#[derive(clap::Args)]
#[command(
    after_help = "The client sends each block about once; the sites copy what they lack from
each other, depot to depot, as their links free up: a slow site takes less,
and a site that keeps failing is dropped without holding up the others.

EXAMPLES:
  lors disseminate run42.dat --to d1:6714,d2:6714,d3:6714,d4:6714 -o run42.xnd
  lors disseminate run42.xnd --to d5,d6                  # relayed from run42's depots
  lors disseminate run42.xnd --to d1,d2,d3,d4            # again: completes what is missing
  lors disseminate run42.dat --to d1,d2 --unicast        # baseline: the client sends all"
)]
pub struct Args {
    #[command(flatten)]
    bwlimit: super::Bwlimit,
    /// A local file, or an exNode whose replicas are the sources.
    #[arg(value_name = "FILE|FILE.xnd")]
    input: PathBuf,
    /// Destination depots, HOST or HOST:PORT, comma-separated or repeated: one
    /// full replica on each.
    #[arg(long, required = true, value_delimiter = ',', value_name = "HOST[:PORT],…", value_parser = super::depot_arg)]
    to: Vec<String>,
    /// The exNode to write [default: FILE.xnd for a file, the input exNode
    /// itself for an exNode].
    #[arg(short, long, value_name = "OUT.xnd")]
    output: Option<PathBuf>,
    /// Block size for a file [default: about 16 blocks per site, 256K to
    /// 8M]: smaller blocks start relaying sooner; each is an allocation on
    /// every site.
    #[arg(short = 'b', long, value_parser = super::nonzero_block_size_arg)]
    block_size: Option<u64>,
    /// Give up a copy that takes longer than this (or eight times a
    /// typical copy of its size, if more); three in a row drop the site.
    #[arg(long, default_value = "60s", value_parser = super::duration_arg)]
    stall: std::time::Duration,
    /// Copies each site receives and sends at once [default: 6, more for
    /// far sites: one per 2 ms of the longest round trip between two of
    /// them (taken as the sum of theirs to the client), up to 128; the
    /// file is then cut into four blocks per slot, not below 256K].
    #[arg(long, value_name = "N")]
    slots: Option<usize>,
    /// Baseline: the client sends the whole file to every site, no relays.
    #[arg(long)]
    unicast: bool,
    /// Replace an existing exNode file other than the input (its
    /// allocations are not freed).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    lease: super::LeaseOpts,
    #[command(flatten)]
    net: super::NetOpts,
    #[command(flatten)]
    report: ReportOpts,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let to = &a.to;
    let mut seen = std::collections::HashSet::new();
    if let Some(d) = to.iter().find(|d| !seen.insert(*d)) {
        return Err(UsageError(format!("--to names {d} twice: each site is one depot")).into());
    }
    let is_xnd = a.input.extension().is_some_and(|e| e == "xnd");
    let s = super::settings(&a.net, a.lease.layer(Default::default()), None)?;
    let (input, out) = if is_xnd {
        // An erasure-coded file's data blocks are its sources; each site
        // ends with a whole copy of the data, beside the code's blocks.
        let x = lors::xnd::load(&a.input)?;
        (
            Input::ExNode(x),
            a.output.clone().unwrap_or_else(|| a.input.clone()),
        )
    } else {
        let meta = std::fs::metadata(&a.input)
            .with_context(|| format!("reading {}", a.input.display()))?;
        if !meta.is_file() {
            return Err(UsageError(format!("{} is not a file", a.input.display())).into());
        }
        let mut out = a.input.clone().into_os_string();
        out.push(".xnd");
        (
            Input::File(a.input.clone()),
            a.output.clone().unwrap_or_else(|| out.into()),
        )
    };
    // Another exNode in the way may hold the only capabilities to its
    // data; the input itself is rewritten with its mappings kept.
    if out != a.input {
        super::check_output(&out, a.force)?;
    }
    let filename = (a.input.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut opts = Options {
        block_size: a.block_size,
        duration: s.duration,
        reliability: s.reliability,
        filename,
        stall: a.stall,
        ..Options::default()
    };
    let slots = a.slots.unwrap_or(opts.sched.in_slots).max(1);
    opts.fit_distance = a.slots.is_none();
    opts.sched.in_slots = slots;
    opts.sched.out_slots = slots;
    if a.unicast {
        opts.sched.relay = false;
        opts.sched.client_slots = slots * to.len();
    }
    let progress = Reporter::new("disseminate", Unit::Bytes, &a.report, false);
    let rt = super::runtime(super::Threads::Many)?;
    let (stop, signal) = super::stop_on_signal(&rt);
    opts.stop = Some(stop);
    let from = match &input {
        Input::ExNode(x) => Some(x.clone()),
        Input::File(_) => None,
    };
    let pool = Arc::new(a.bwlimit.pool(s.client()));
    let done = rt.block_on(disseminate(
        input,
        to,
        &opts,
        pool.clone(),
        progress.clone(),
    ))?;
    progress.finish();
    let complete = done.sites.iter().filter(|r| r.complete).count();
    if complete > 0 {
        // A failed save releases the copies made: nothing would name them.
        rt.block_on(lors::job::save_new(
            &out,
            &done.exnode,
            from.as_ref(),
            &pool,
        ))?;
    }
    if !done.unreleased.mappings.is_empty() {
        crate::left::say_left(
            "copies on sites that did not complete could not be released: ",
            &lors::job::unreleased(&out, &done.unreleased, 0),
        );
    }
    say(&a, &progress, &done, complete, &out);
    if complete < done.sites.len() {
        // Each site with its reason, so a user knows whether to wait, retry
        // or pick another depot.
        let failed: Vec<String> = (done.sites.iter())
            .filter(|r| !r.complete)
            .map(|r| match &r.error {
                Some(why) => format!("{}: {why}", r.depot),
                None => r.depot.clone(),
            })
            .collect();
        let missing = format!(
            "{} of {} sites did not get a full replica ({}); run the same command on {} to complete them",
            failed.len(),
            done.sites.len(),
            failed.join("; "),
            if complete > 0 {
                out.display().to_string()
            } else {
                a.input.display().to_string()
            }
        );
        if signal.load(std::sync::atomic::Ordering::SeqCst) != 0 {
            // Said as for failed sites; the exit status says why.
            eprintln!("lors: disseminate interrupted (what they got was released): {missing}");
            return Err(super::interrupted(&signal));
        }
        anyhow::bail!(missing);
    }
    Ok(())
}

/// What a dissemination did, per site and in all: lines, or `--json`.
fn say(
    a: &Args,
    progress: &Reporter,
    done: &lors::dissem::Outcome,
    complete: usize,
    out: &std::path::Path,
) {
    let secs = done.elapsed.as_secs_f64();
    if progress.is_json() {
        progress.done(&Summary {
            exnode: (complete > 0).then(|| out.display().to_string()),
            seconds: super::json_secs(done.elapsed),
            source_bytes: done.source_bytes,
            relayed_bytes: done.relayed_bytes,
            sites: (done.sites.iter())
                .map(|r| SiteLine {
                    depot: &r.depot,
                    complete: r.complete,
                    received: r.received,
                    relayed: r.relayed,
                    seconds: r.finished.map(super::json_secs),
                    error: r.error.as_deref(),
                })
                .collect(),
        });
    } else if !a.report.quiet {
        for r in &done.sites {
            match (&r.error, r.finished) {
                (None, Some(t)) => eprintln!(
                    "lors: {}: complete in {:.2}s (received {}, relayed {})",
                    r.depot,
                    t.as_secs_f64(),
                    Bytes(r.received),
                    Bytes(r.relayed)
                ),
                (None, None) if r.complete => {
                    eprintln!("lors: {}: complete (held everything already)", r.depot)
                }
                (e, _) => eprintln!(
                    "lors: {}: FAILED: {}",
                    r.depot,
                    e.as_deref().unwrap_or("did not complete")
                ),
            }
        }
        eprintln!(
            "lors: {complete} of {} sites hold a full replica after {secs:.2}s; the source sent {}, the sites relayed {}{}",
            done.sites.len(),
            Bytes(done.source_bytes),
            Bytes(done.relayed_bytes),
            if complete > 0 {
                format!(" -> {}", out.display())
            } else {
                String::new()
            }
        );
    }
}

/// `--json`: how a dissemination went.
#[derive(serde::Serialize)]
struct Summary<'a> {
    exnode: Option<String>,
    seconds: f64,
    source_bytes: u64,
    relayed_bytes: u64,
    sites: Vec<SiteLine<'a>>,
}

#[derive(serde::Serialize)]
struct SiteLine<'a> {
    depot: &'a str,
    complete: bool,
    received: u64,
    relayed: u64,
    seconds: Option<f64>,
    error: Option<&'a str>,
}
