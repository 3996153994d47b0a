//! One module per subcommand, plus what they share.

pub mod augment;
pub mod bench;
pub mod copies;
pub mod demo;
pub mod depot;
pub mod disseminate;
pub mod download;
pub mod keep;
pub mod lbone;
pub mod ls;
pub mod modify;
pub mod mount;
pub mod refresh;
pub mod route;
pub mod share;
pub mod shell;
pub mod stat;
pub mod trim;
pub mod upload;
pub mod verify;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use lors::job::Refused;
use lors::job::edit::Edit;
use lors::settings::{Layer, Settings};
use lors_exnode::ExNode;

use crate::exit::UsageError;

/// `println!` that returns an error instead of panicking when standard output
/// is gone (`lors stat x | head -1`); `main` turns a broken pipe into a quiet
/// exit, as `cat` gets.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
            .map_err(|e| anyhow::Error::new(e).context("writing to standard output"))?
    }};
}
pub(crate) use outln;

/// Writes `bytes` to standard output (a closed pipe is reported as such).
pub fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| anyhow::Error::new(e).context("writing to standard output"))
}

/// Parses `10M`-style sizes for clap.
pub fn size_arg(s: &str) -> Result<u64, String> {
    lors_ibp::units::parse_size(s)
}

/// [`size_arg`] for sizes that cannot be zero (a memory bound, a file
/// size to predict for).
pub fn nonzero_size_arg(s: &str) -> Result<u64, String> {
    lors_ibp::units::parse_nonzero_size(s)
}

/// Parses block sizes for clap: a bare number is megabytes, as in a
/// `lors://…?bs=` URI (see [`lors_ibp::units::parse_block_size`]).
pub fn block_size_arg(s: &str) -> Result<u64, String> {
    lors_ibp::units::parse_block_size(s)
}

/// [`block_size_arg`] for a block size proper: at least one byte.
pub fn nonzero_block_size_arg(s: &str) -> Result<u64, String> {
    nonzero(block_size_arg(s)?)
}

fn nonzero(n: u64) -> Result<u64, String> {
    if n == 0 {
        return Err("give at least 1 byte (0 would mean nothing to do)".into());
    }
    Ok(n)
}

/// A Unix time as `YYYY-MM-DD HH:MM UTC`.
pub fn utc(unix: u64) -> String {
    let t = date(unix);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// A Unix time as a UTC date and time (the latest one there is, for a
/// time past it).
pub fn date(unix: u64) -> time::OffsetDateTime {
    i64::try_from(unix)
        .ok()
        .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
        .unwrap_or(time::PrimitiveDateTime::MAX.assume_utc())
}

/// `--bwlimit`, for the commands that move data.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct Bwlimit {
    /// Most bytes per second moved in all, over every connection (e.g.
    /// `10M` = 10 MiB/s), as rclone's --bwlimit [default: no limit].
    #[arg(long = "bwlimit", value_name = "RATE", value_parser = nonzero_size_arg)]
    rate: Option<u64>,
}

impl Bwlimit {
    /// A connection pool held to the limit.
    pub fn pool(self, cfg: lors_ibp::ClientConfig) -> lors::Pool {
        lors::Pool::new(cfg).with_limit(self.rate)
    }
}

/// How a command's runtime runs its tasks: on the command's thread (it
/// waits on depots in turn) or on a pool of workers (it moves data).
pub enum Threads {
    /// The current thread.
    One,
    /// A worker per core.
    Many,
}

/// The async runtime a command runs on.
pub fn runtime(threads: Threads) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread(),
        Threads::Many => tokio::runtime::Builder::new_multi_thread(),
    };
    b.enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))
}

/// Parses `2h`-style durations for clap.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    lors_ibp::units::parse_duration(s)
}

/// Probes every mapping of `x` (what its depots report), all at once, each
/// under the timeout policy of `s`.
pub fn probe_all(x: &ExNode, s: &Settings) -> anyhow::Result<Vec<lors::manage::Probe>> {
    let rt = runtime(Threads::One)?;
    Ok(rt.block_on(async { lors::manage::probe_all(x, &lors::Pool::new(s.client())).await }))
}

/// The error `ls` and `stat` end with when part of the file has no live
/// replica, after printing their report.
pub fn unreadable(x: &ExNode, probes: &[lors::manage::Probe]) -> anyhow::Result<()> {
    let live: Vec<bool> = probes.iter().map(lors::manage::Probe::is_live).collect();
    let gaps = lors_exnode::erasure::unreadable(x, &live)?;
    if let Some(code) = &gaps.stripes {
        if let (Some(first), Some(bytes)) = (code.lost.first(), gaps.bytes.first()) {
            anyhow::bail!(
                "{} of {} stripes have fewer than the {} live blocks they need (first: stripe {first}, bytes {}..{}): the file cannot be downloaded whole; see the state of each mapping above",
                code.lost.len(),
                code.of,
                code.scheme.data,
                bytes.start,
                bytes.end
            );
        }
        return Ok(());
    }
    let gaps = gaps.bytes;
    if gaps.is_empty() {
        return Ok(());
    }
    let bytes: u64 = gaps.iter().map(|r| r.end - r.start).sum();
    let shown: Vec<String> = gaps
        .iter()
        .take(3)
        .map(|r| format!("{}..{}", r.start, r.end))
        .collect();
    anyhow::bail!(
        "{bytes} of {} bytes have no live replica (bytes {}{}): the file cannot be downloaded whole; see the state of each mapping above",
        x.logical_size(),
        shown.join(", "),
        if gaps.len() > 3 { ", …" } else { "" }
    )
}

/// L-Bone options shared by the tools.
#[derive(clap::Args, Clone, Default)]
pub struct LboneOpts {
    /// L-Bone to ask for depots: a host (legacy protocol, port -P), an
    /// http://HOST:PORT URL of `lors lbone`, or HOST:PORT (HTTP if it
    /// answers HTTP there, else legacy). Repeat it (or give a comma list)
    /// for instances to fail over between: the first that answers is used,
    /// the next asked at once when one is down or after a second of silence
    /// [default: the HOST of a lors:// URI, else LBONE_SERVER].
    #[arg(
        short = 'H',
        long = "lbone",
        value_name = "HOST|URL",
        help_heading = "L-Bone"
    )]
    pub lbone: Vec<String>,
    /// Port of a legacy L-Bone [default: LBONE_PORT, else 6767].
    #[arg(
        short = 'P',
        long = "lbone-port",
        value_name = "PORT",
        help_heading = "L-Bone"
    )]
    pub lbone_port: Option<u16>,
    /// Verify https:// L-Bones against the CA certificates in this PEM file
    /// instead of the system's.
    #[arg(
        long = "ca-file",
        value_name = "PEM",
        env = "LORS_CA_FILE",
        help_heading = "L-Bone",
        value_parser = trusted_ca
    )]
    pub ca_file: Option<std::path::PathBuf>,
}

/// How many depots, and where: the L-Bone query options of upload, augment
/// and route.
#[derive(clap::Args, Clone, Default)]
pub struct PlaceOpts {
    /// Location hint for the L-Bone (`city= Knoxville`, `state= TN`,
    /// `country= US`, `zip= 37996`, `airport= TYS`) [default:
    /// LORS_LOCATION, else LOCATION in ~/.xndrc]. Without --max-depots, the
    /// data goes to the depots that best match it, one per copy.
    #[arg(short = 'l', long, value_name = "HINT", help_heading = "L-Bone")]
    pub location: Option<String>,
    /// Depots to ask the L-Bone for [default: LORS_MAXDEPOTS, else MAXDEPOTS
    /// in ~/.xndrc, else one per copy with -l, else 4 (at least the
    /// copies)].
    #[arg(long = "max-depots", value_name = "N", help_heading = "L-Bone")]
    pub max_depots: Option<usize>,
}

/// Where a command's data may go: its `--depot` values, else the L-Bone and
/// `~/.xndrc` lists its settings name.
pub struct Placement<'a> {
    pub depots: &'a [String],
    pub settings: &'a Settings,
}

impl Placement<'_> {
    /// Depots for `copies` of allocations of `bytes` for the settings'
    /// lease: the `--depot` values, else as
    /// [`lors::directory::find_depots`] finds them, leaving out `exclude`.
    /// The error says which options would give some.
    pub fn find(
        &self,
        rt: &tokio::runtime::Runtime,
        copies: usize,
        bytes: u64,
        exclude: Vec<String>,
    ) -> anyhow::Result<lors::directory::Found> {
        rt.block_on(self.query(copies, bytes, exclude))
    }

    /// [`Placement::find`], in a task.
    pub async fn query(
        &self,
        copies: usize,
        bytes: u64,
        exclude: Vec<String>,
    ) -> anyhow::Result<lors::directory::Found> {
        use lors::directory::DirectoryError;
        let s = self.settings;
        let named = s.directory().await;
        s.find_depots(self.depots, named, copies, bytes, exclude)
            .await
            .map_err(|e| match e {
                DirectoryError::NoSource => UsageError(
                    "no depots: give --depot HOST[:PORT] (repeatable), an L-Bone (-H HOST|URL or LBONE_SERVER), or DEPOT lines in ~/.xndrc".into(),
                )
                .into(),
                e => anyhow::Error::new(e),
            })
    }
}

/// [`Settings::directory`] on `rt`.
pub fn directory(
    rt: &tokio::runtime::Runtime,
    s: &Settings,
) -> Option<lors_lbone::client::Directory> {
    rt.block_on(s.directory())
}

/// The lease and kind of the allocations upload, augment and route make.
#[derive(clap::Args, Clone, Default)]
pub struct LeaseOpts {
    /// Lease of new allocations, e.g. 2h, 7d [default: duration= of a
    /// lors:// URI, else LORS_DURATION, else DURATION in ~/.xndrc, else 1d].
    #[arg(short, long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// Soft (revocable) storage instead of hard [default: STORAGE_TYPE in
    /// ~/.xndrc, else hard].
    #[arg(short = 's', long)]
    pub soft: bool,
}

impl LeaseOpts {
    /// What these options set, over `lower`.
    pub fn layer(&self, lower: Layer) -> Layer {
        Layer {
            duration: self.duration,
            hard: self.soft.then_some(false),
            ..Layer::default()
        }
        .or(lower)
    }
}

/// The network and settings-file options every command that talks to
/// depots has.
#[derive(clap::Args, Clone, Default)]
pub struct NetOpts {
    /// Give a depot up after this long without progress (no byte moved, no
    /// reply) [default: timeout= of a lors:// URI, else LORS_TIMEOUT, else
    /// TIMEOUT in ~/.xndrc, else 60s].
    #[arg(short = 'T', long, value_name = "DURATION", value_parser = duration_arg, help_heading = "Settings")]
    pub timeout: Option<Duration>,
    /// Settings file [default: ~/.xndrc].
    #[arg(long, value_name = "FILE", help_heading = "Settings")]
    pub xndrc: Option<PathBuf>,
}

/// SIGINT/SIGTERM turn the returned flag `true` and record which (the exit
/// status a shell shows for it: 130, 143), so a command can stop, tidy up
/// and say what it left; a second signal ends the process at once.
pub fn stop_on_signal(
    rt: &tokio::runtime::Runtime,
) -> (
    tokio::sync::watch::Receiver<bool>,
    std::sync::Arc<std::sync::atomic::AtomicU8>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = tokio::sync::watch::channel(false);
    let which = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
    let w = which.clone();
    // Registered here, not in the task: a signal that comes before the
    // task first runs must still be seen, not end the process with
    // allocations made and no record of them.
    let (mut int, mut term) = {
        let _in_rt = rt.enter();
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    rt.spawn(async move {
        let mut first = true;
        loop {
            let code: u8 = tokio::select! {
                Some(()) = recv(&mut int) => 130,
                Some(()) = recv(&mut term) => 143,
            };
            if !first {
                std::process::exit(i32::from(code));
            }
            first = false;
            w.store(code, std::sync::atomic::Ordering::SeqCst);
            let _ = tx.send(true);
        }
    });
    (rx, which)
}

/// The next delivery of `sig`; never, if it could not be registered.
async fn recv(sig: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match sig {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Refuses, before anything is stored, an output that would overwrite an
/// exNode (unless `force`) or that cannot be written.
pub fn check_output(out: &std::path::Path, force: bool) -> anyhow::Result<()> {
    lors::job::check_output(out, force).map_err(refused)
}

/// A refused upload as the command line says it: a usage error where the
/// user's flags are what to change.
pub fn refused(e: Refused) -> anyhow::Error {
    match e {
        Refused::Exists(p) => UsageError(format!(
            "{} already exists and may hold the only capabilities to its data: choose another -o, or give --force to replace it",
            p.display()
        ))
        .into(),
        e @ Refused::Foreign(_) => UsageError(e.to_string()).into(),
        e => e.into(),
    }
}

/// How long a command that changes an exNode waits for another lors
/// command (a keeper's cycle, a second route) to let go of it.
pub const LOCK_WAIT: std::time::Duration = lors::job::LOCK_WAIT;

/// Starts a command that changes the exNode `x`, read from `input`, to be
/// saved at `out` ([`lors::job::edit::Edit::begin`]).
pub fn begin(
    rt: &tokio::runtime::Runtime,
    (input, x): (&std::path::Path, ExNode),
    out: &std::path::Path,
    pool: &std::sync::Arc<lors::Pool>,
) -> anyhow::Result<Edit> {
    Ok(rt.block_on(Edit::begin(Some(input), x, out, pool))?)
}

/// Saves `y` for `edit`, then releases `free` ([`Edit::save`]); says
/// what a new file beside the input could not take its own reference on.
pub fn save(
    rt: &tokio::runtime::Runtime,
    edit: &Edit,
    y: &mut ExNode,
    free: Vec<lors_exnode::Mapping>,
    pool: &std::sync::Arc<lors::Pool>,
) -> anyhow::Result<lors::job::edit::Saved> {
    let saved = rt.block_on(edit.save(y, free, pool))?;
    if let Some(input) = edit.input().filter(|_| saved.borrowed > 0) {
        eprintln!(
            "lors: {} allocations {} shares with {} could not take a reference of their own: removing {} frees them",
            saved.borrowed,
            edit.out().display(),
            input.display(),
            input.display()
        );
    }
    Ok(saved)
}

/// The note for a run whose release was skipped because it wrote a new
/// file beside its input.
pub fn input_keeps(input: &std::path::Path) {
    eprintln!(
        "lors: {} stays as it was and keeps what it names: `lors rm {}` frees what only it names",
        input.display(),
        input.display()
    );
}

/// Ends `edit` after `r`: `r`, unless ending failed where `r` did not.
pub fn end<T>(
    rt: &tokio::runtime::Runtime,
    edit: Edit,
    pool: &std::sync::Arc<lors::Pool>,
    r: anyhow::Result<T>,
) -> anyhow::Result<T> {
    ended(r, rt.block_on(edit.end(pool)))
}

/// `r`, unless ending the run it came from (`ended`: what freeing what no
/// exNode names came to) failed where `r` did not.
pub fn ended<T>(r: anyhow::Result<T>, ended: lors::Result<usize>) -> anyhow::Result<T> {
    let v = r?;
    ended.map_err(|e| anyhow::Error::from(e).context("finishing: freeing what no exNode names"))?;
    Ok(v)
}

/// The [`crate::exit::Interrupted`] error for the signal [`stop_on_signal`] saw.
pub fn interrupted(which: &std::sync::atomic::AtomicU8) -> anyhow::Error {
    let code = which.load(std::sync::atomic::Ordering::SeqCst);
    crate::exit::Interrupted(if code == 0 { 130 } else { code }).into()
}

/// A command's settings: its `flags` (with `net`'s timeout) over the
/// `uri`'s, the environment's and the settings file's
/// ([`lors::settings`]).
pub fn settings(
    net: &NetOpts,
    flags: Layer,
    uri: Option<&lors::uri::ExnodeRef>,
) -> anyhow::Result<Settings> {
    let rc = lors::xndrc::load(net.xndrc.as_deref()).map_err(UsageError)?;
    if let Some(path) = lors::xndrc::default_path(net.xndrc.as_deref()) {
        for u in &rc.unknown {
            eprintln!(
                "lors: warning: {}, {u}: unknown keyword, ignored",
                path.display()
            );
        }
    }
    let flags = Layer {
        timeout: net.timeout,
        ..flags
    };
    Settings::resolve(flags, uri, &lors::settings::Env::process(), rc)
        .map_err(|e| UsageError(e.to_string()).into())
}

/// `--ca-file`: read and trusted for the whole process as the flags are
/// parsed, so a file with no certificate stops the command at once.
fn trusted_ca(s: &str) -> Result<std::path::PathBuf, String> {
    let p = std::path::PathBuf::from(s);
    lors_http::client::trust(&p)?;
    Ok(p)
}

impl LboneOpts {
    /// What these options set.
    pub fn layer(&self) -> Layer {
        Layer {
            lbone: (!self.lbone.is_empty())
                .then(|| lors::settings::LboneAt::Named(self.lbone.join(","))),
            lbone_port: self.lbone_port,
            ..Layer::default()
        }
    }
}

impl PlaceOpts {
    /// What these options set, over `lower`.
    pub fn layer(&self, lower: Layer) -> Layer {
        Layer {
            location: self.location.clone(),
            max_depots: self.max_depots,
            ..Layer::default()
        }
        .or(lower)
    }
}

/// Where `augment` and `route` put new replicas.
#[derive(clap::Args)]
pub struct Targets {
    /// Depot HOST or HOST:PORT (port 6714 unless given) for the new replicas
    /// (repeat, or a comma list) [default: ask the L-Bone (-H, LBONE_SERVER), else the
    /// DEPOT lines of ~/.xndrc, else its LBONE_SERVER lines].
    #[arg(long = "depot", value_name = "HOST[:PORT]", value_delimiter = ',', value_parser = depot_arg)]
    pub depots: Vec<String>,
    #[command(flatten)]
    pub lbone: LboneOpts,
    #[command(flatten)]
    pub place: PlaceOpts,
}

impl Targets {
    /// What these options set.
    pub fn layer(&self) -> Layer {
        self.place.layer(self.lbone.layer())
    }

    /// Depots for `copies` new replicas of each of `x`'s blocks; see
    /// [`Placement::find`]. With `beside_held` the new replicas go beside
    /// the ones there (augment): the directory is asked for enough depots
    /// that every block finds `copies` that do not hold it yet, leaving out
    /// only depots that hold every block — each block's own holders are
    /// left out when it is copied, as with `--depot`.
    pub fn find(
        &self,
        rt: &tokio::runtime::Runtime,
        x: &ExNode,
        s: &Settings,
        copies: usize,
        beside_held: bool,
    ) -> anyhow::Result<lors::directory::Found> {
        rt.block_on(self.query(x, s, copies, beside_held))
    }

    /// [`Targets::find`], in a task.
    pub async fn query(
        &self,
        x: &ExNode,
        s: &Settings,
        copies: usize,
        beside_held: bool,
    ) -> anyhow::Result<lors::directory::Found> {
        let (held, exclude) = if beside_held {
            let holders: Vec<std::collections::BTreeSet<String>> = (x.blocks())
                .values()
                .map(|idx| idx.iter().filter_map(|&i| x.mappings[i].depot()).collect())
                .collect();
            // A depot holding every block can take none of the copies.
            let everywhere: Vec<String> = (holders.first().into_iter().flatten())
                .filter(|d| holders.iter().all(|h| h.contains(*d)))
                .cloned()
                .collect();
            let most = (holders.iter())
                .map(|h| h.iter().filter(|d| !everywhere.contains(d)).count())
                .max()
                .unwrap_or(0);
            (most, everywhere)
        } else {
            (0, Vec::new())
        };
        Placement {
            depots: &self.depots,
            settings: s,
        }
        .query(copies + held, largest_allocation(x), exclude)
        .await
    }
}

/// The largest allocation an exNode's mappings use (what a new replica of
/// its biggest block needs).
pub fn largest_allocation(x: &ExNode) -> u64 {
    x.mappings.iter().map(|m| m.alloc_length).max().unwrap_or(0)
}

/// A `--depot` value: see [`lors::directory::depot_address`].
pub fn depot_arg(s: &str) -> Result<String, String> {
    lors::directory::depot_address(s)
}

/// A secret token from the first line of `path`, for options that keep
/// secrets out of the command line (where any user's `ps` shows them).
pub fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err(crate::exit::UsageError(format!(
            "the token file {} is empty: put the token on its first line",
            path.display()
        ))
        .into());
    }
    Ok(token.to_owned())
}

/// A file argument: a path or a `lors://` URI.
pub fn exnode_arg(s: &str) -> Result<lors::uri::ExnodeRef, String> {
    lors::uri::ExnodeRef::parse(s)
}

/// One line of `--json` output: `v` as compact JSON.
pub fn json_line<T: serde::Serialize>(v: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string(v)?)
}

/// Seconds to the millisecond, as `--json` reports them.
pub fn json_secs(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        // Reference values from `date -u -d @N "+%F %H:%M"`.
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(1_795_452_539), "2026-11-23 16:48 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
    }

    #[test]
    fn depots_default_to_the_ibp_port() {
        for (given, want) in [
            ("d1.example.org", "d1.example.org:6714"),
            ("d1.example.org:6715", "d1.example.org:6715"),
            ("127.0.0.1", "127.0.0.1:6714"),
            ("[::1]", "[::1]:6714"),
            ("[::1]:7000", "[::1]:7000"),
            ("::1", "[::1]:6714"),
        ] {
            assert_eq!(depot_arg(given).as_deref(), Ok(want), "{given}");
        }
        for bad in ["", "h:", ":6714", "h:0", "h:99999", "h:x", "[::1", "[::1]x"] {
            let e = depot_arg(bad).unwrap_err();
            assert!(e.contains("give HOST or HOST:PORT"), "{bad}: {e}");
        }
    }
}
