//! How the transfer commands tell people (and scripts) what is happening:
//! bars on a terminal (a total with rate and ETA, one line per active
//! depot), plain periodic lines with `--progress` when stderr is a log, or
//! line-delimited JSON events with `--json`. Log lines from `tracing` go
//! through [`LogWriter`], which lifts the bars out of the way first.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use lors::progress::Event;
use lors_ibp::ewma::Ewma;
use lors_ibp::units::Bytes;

/// The bars being drawn, if any: log lines must not cut through them.
static BARS: Mutex<Option<MultiProgress>> = Mutex::new(None);

fn bars_slot() -> MutexGuard<'static, Option<MultiProgress>> {
    BARS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the bars off the screen (before an error message).
pub fn clear() {
    if let Some(mp) = bars_slot().take() {
        let _ = mp.clear();
    }
}

/// Writes a line to stderr above the bars (or plainly when none are drawn).
pub(crate) fn eprint_line(line: &str) {
    let bars = bars_slot().clone();
    match bars {
        Some(mp) if !mp.is_hidden() => {
            let _ = mp.println(line);
        }
        _ => eprintln!("{line}"),
    }
}

/// The `tracing` writer: stderr, with the bars suspended around each write.
#[derive(Clone, Copy, Default)]
pub struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let bars = bars_slot().clone();
        match bars {
            Some(mp) => mp.suspend(|| std::io::stderr().write_all(buf)),
            None => std::io::stderr().write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;
    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}

/// The progress options of the transfer commands.
#[derive(clap::Args, Clone, Default)]
pub struct ReportOpts {
    /// No progress display.
    #[arg(short, long)]
    pub quiet: bool,
    /// Plain progress lines on stderr every second, also when stderr is
    /// not a terminal (logs, CI); a terminal gets bars without it.
    #[arg(long, conflicts_with = "quiet")]
    pub progress: bool,
    /// Line-delimited JSON events on stdout (stderr when the data goes to
    /// stdout): start, progress every second, retry, failover, stalled,
    /// recovered, and done with the summary.
    #[arg(long)]
    pub json: bool,
}

/// What the operation counts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Allocations,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Allocations => "allocations",
        }
    }

    fn amount(self, n: u64) -> String {
        match self {
            Unit::Bytes => Bytes(n).to_string(),
            Unit::Allocations => n.to_string(),
        }
    }

    fn rate(self, per_s: f64) -> String {
        match self {
            Unit::Bytes => format!("{}/s", Bytes(per_s as u64)),
            Unit::Allocations => format!("{per_s:.0}/s"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Quiet,
    Bars,
    Plain,
    Json { to_stderr: bool },
}

/// One depot's share.
struct Depot {
    done: u64,
    /// `done` at the previous tick, for the rate.
    seen: u64,
    /// Recent rate (units/s), smoothed over ticks: about a 3-second memory
    /// at one tick a second.
    rate: Ewma,
    state: &'static str,
}

impl Default for Depot {
    fn default() -> Depot {
        Depot {
            done: 0,
            seen: 0,
            rate: Ewma::new(0.3),
            state: "",
        }
    }
}

struct State {
    total: Option<u64>,
    done: u64,
    started: Instant,
    last_tick: Instant,
    depots: BTreeMap<String, Depot>,
    stopped: bool,
    /// Retries and give-ups said once each (by their line), and how many
    /// more of the same were not: a depot that refuses every piece of a
    /// large file gives one line, not thousands.
    retries_said: std::collections::HashSet<String>,
    retries_unsaid: u64,
}

/// Progress for one command; a [`lors::Progress`].
pub struct Reporter {
    op: &'static str,
    unit: Unit,
    mode: Mode,
    state: Mutex<State>,
    wake: Condvar,
    /// The drawer and its lines (the total, then one per depot).
    bars: Option<(MultiProgress, Mutex<Vec<ProgressBar>>)>,
    ticker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Depot lines shown at most under the total; the rest are summed up.
const MAX_DEPOT_LINES: usize = 8;

impl Reporter {
    /// A reporter for `op` (`download`, `upload`, …) as `opts` ask;
    /// `data_on_stdout` sends JSON events to stderr instead.
    pub fn new(op: &'static str, unit: Unit, opts: &ReportOpts, data_on_stdout: bool) -> Arc<Self> {
        // Bars move the cursor: not on a terminal that cannot (TERM unset
        // or dumb), which gets what a log gets.
        let tty = std::io::stderr().is_terminal()
            && std::env::var("TERM").is_ok_and(|t| !t.is_empty() && t != "dumb");
        let mode = if opts.json {
            Mode::Json {
                to_stderr: data_on_stdout,
            }
        } else if opts.quiet {
            Mode::Quiet
        } else if tty && !opts.progress {
            Mode::Bars
        } else if opts.progress {
            Mode::Plain
        } else {
            Mode::Quiet
        };
        let bars = (mode == Mode::Bars).then(|| {
            let mp = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(4));
            *bars_slot() = Some(mp.clone());
            (mp, Mutex::new(Vec::new()))
        });
        let now = Instant::now();
        let r = Arc::new(Reporter {
            op,
            unit,
            mode,
            state: Mutex::new(State {
                total: None,
                done: 0,
                started: now,
                last_tick: now,
                depots: BTreeMap::new(),
                stopped: false,
                retries_said: Default::default(),
                retries_unsaid: 0,
            }),
            wake: Condvar::new(),
            bars,
            ticker: Mutex::new(None),
        });
        let every = match mode {
            Mode::Quiet => None,
            Mode::Bars => Some(Duration::from_millis(250)),
            Mode::Plain | Mode::Json { .. } => Some(Duration::from_secs(1)),
        };
        if let Some(every) = every {
            let weak = Arc::downgrade(&r);
            let handle = std::thread::spawn(move || {
                while let Some(r) = weak.upgrade() {
                    let g = r.lock();
                    let (g, _) = r
                        .wake
                        .wait_timeout_while(g, every, |s| !s.stopped)
                        .unwrap_or_else(|e| e.into_inner());
                    if g.stopped {
                        return;
                    }
                    drop(g);
                    r.tick();
                }
            });
            *r.ticker.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        }
        r
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Updates rates and draws (bars), prints (plain) or emits (JSON).
    fn tick(&self) {
        let mut s = self.lock();
        let now = Instant::now();
        let dt = now.duration_since(s.last_tick).as_secs_f64().max(1e-3);
        s.last_tick = now;
        for d in s.depots.values_mut() {
            let inst = (d.done - d.seen) as f64 / dt;
            d.seen = d.done;
            d.rate.add(inst);
        }
        match self.mode {
            Mode::Quiet => {}
            Mode::Bars => self.draw(&s),
            Mode::Plain => {
                let line = format!("lors: {}", self.total_line(&s, usize::MAX));
                drop(s);
                eprintln!("{line}");
            }
            Mode::Json { .. } => {
                let elapsed = s.started.elapsed().as_secs_f64();
                let rate = s.done as f64 / elapsed.max(1e-3);
                let line = json(&ProgressEvent {
                    event: "progress",
                    done: s.done,
                    total: s.total,
                    rate: rate.round(),
                    eta_s: eta(s.total, s.done, rate).map(|d| d.as_secs()),
                    elapsed_s: (elapsed * 1000.0).round() / 1000.0,
                    depots: s
                        .depots
                        .iter()
                        .map(|(name, d)| DepotJson {
                            depot: name,
                            done: d.done,
                            rate: d.rate.get().unwrap_or(0.0).round(),
                            state: d.state,
                        })
                        .collect(),
                });
                drop(s);
                self.emit(&line);
            }
        }
    }

    /// `download [######--------]  45% 1.2 GiB/2.7 GiB 80.0 MiB/s ETA 0:19`
    /// in at most `width` columns.
    fn total_line(&self, s: &State, width: usize) -> String {
        let line = render(
            self.op,
            self.unit,
            s.done,
            s.total,
            s.started.elapsed(),
            s.depots.len(),
        );
        fit(&line, width)
    }

    fn draw(&self, s: &State) {
        let Some((mp, lines)) = &self.bars else {
            return;
        };
        // One column spare: a line exactly as wide as the terminal wraps on some.
        let width = console::Term::stderr()
            .size_checked()
            .map_or(80, |(_, w)| usize::from(w))
            .max(20)
            - 1;
        let mut text = vec![self.total_line(s, width)];
        let mut depots: Vec<(&String, &Depot)> = s.depots.iter().collect();
        let rate = |d: &Depot| d.rate.get().unwrap_or(0.0);
        depots.sort_by(|a, b| rate(b.1).total_cmp(&rate(a.1)).then(a.0.cmp(b.0)));
        // Pairs of depots (a route's `A → B`) get the room two names take.
        let col = (depots.iter().map(|(n, _)| n.chars().count()).max())
            .unwrap_or(0)
            .clamp(24, 44);
        for (name, d) in depots.iter().take(MAX_DEPOT_LINES) {
            let line = format!(
                "  {:<col$} {:>11} {:>13}  {}",
                fit(name, col),
                self.unit.amount(d.done),
                self.unit.rate(rate(d)),
                d.state
            );
            text.push(fit(line.trim_end(), width));
        }
        if depots.len() > MAX_DEPOT_LINES {
            text.push(format!(
                "  … and {} more depots",
                depots.len() - MAX_DEPOT_LINES
            ));
        }
        let mut lines = lines.lock().unwrap_or_else(|e| e.into_inner());
        while lines.len() < text.len() {
            let style = ProgressStyle::with_template("{msg}").expect("a valid template");
            lines.push(mp.add(ProgressBar::new(0).with_style(style)));
        }
        for (bar, t) in lines.iter().zip(text) {
            bar.set_message(t);
        }
    }

    fn emit(&self, line: &str) {
        match self.mode {
            Mode::Json { to_stderr: true } => eprintln!("{line}"),
            Mode::Json { to_stderr: false } => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}").and_then(|()| out.flush());
            }
            _ => {}
        }
    }

    /// Stops the display: bars are cleared, a plain log gets its last line.
    /// Safe to call more than once.
    pub fn finish(&self) {
        let mut s = self.lock();
        if s.stopped {
            return;
        }
        s.stopped = true;
        self.wake.notify_all();
        drop(s);
        if let Some(h) = self.ticker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        if let Some((mp, lines)) = &self.bars {
            for l in lines.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                l.finish_and_clear();
            }
            let _ = mp.clear();
            *bars_slot() = None;
        }
        if self.mode == Mode::Plain {
            let s = self.lock();
            eprintln!("lors: {}", self.total_line(&s, usize::MAX));
        }
        let unsaid = self.lock().retries_unsaid;
        if unsaid > 0 && !matches!(self.mode, Mode::Json { .. }) {
            eprintln!("lors: and {unsaid} more lines like those above");
        }
    }

    /// With `--json`, the `done` event: `summary`'s fields after
    /// `"event":"done"`.
    pub fn done<T: serde::Serialize>(&self, summary: &T) {
        self.finish();
        if let Mode::Json { .. } = self.mode {
            let s = self.lock();
            let (done, total) = (s.done, s.total);
            drop(s);
            self.emit(&json(&Done {
                event: "done",
                op: self.op,
                done,
                total,
                summary,
            }));
        }
    }

    /// Whether events go out as JSON (then the command prints no JSON of
    /// its own).
    /// Units done per depot (or per pair of depots, `A → B`, for a copy
    /// between them), by name.
    pub fn tallies(&self) -> Vec<(String, u64)> {
        let s = self.lock();
        (s.depots.iter())
            .filter(|(_, d)| d.done > 0)
            .map(|(n, d)| (n.clone(), d.done))
            .collect()
    }

    pub fn is_json(&self) -> bool {
        matches!(self.mode, Mode::Json { .. })
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if self.bars.is_some() {
            *bars_slot() = None;
        }
    }
}

impl lors::Progress for Reporter {
    fn start(&self, total: Option<u64>) {
        let mut s = self.lock();
        s.total = total;
        s.started = Instant::now();
        drop(s);
        if let Mode::Json { .. } = self.mode {
            self.emit(&json(&Start {
                event: "start",
                op: self.op,
                unit: self.unit.name(),
                total,
            }));
        }
    }

    fn advance(&self, depot: &str, n: u64) {
        let mut s = self.lock();
        s.done += n;
        match s.depots.get_mut(depot) {
            Some(d) => d.done += n,
            None => {
                s.depots.insert(
                    depot.to_owned(),
                    Depot {
                        done: n,
                        ..Depot::default()
                    },
                );
            }
        }
    }

    fn event(&self, e: &Event) {
        {
            let mut s = self.lock();
            let d = s.depots.entry(e.depot().to_owned()).or_default();
            d.state = match e {
                Event::Retry { .. } | Event::Again { .. } => d.state,
                Event::Failover { .. } => "given up",
                Event::Stalled { .. } => "stalled",
                Event::Recovered { .. } => "",
            };
        }
        match self.mode {
            Mode::Json { .. } => self.emit(&json(&EventJson {
                event: e.kind(),
                depot: e.depot(),
                why: match e {
                    Event::Retry { why, .. }
                    | Event::Again { why, .. }
                    | Event::Failover { why, .. } => Some(why),
                    _ => None,
                },
                silent_s: match e {
                    Event::Stalled { silent, .. } => Some(silent.as_secs()),
                    _ => None,
                },
            })),
            _ => {
                let line = format!("lors: {e}");
                // The jobs of a batch each give a hung depot up: one line.
                if matches!(
                    e,
                    Event::Retry { .. } | Event::Again { .. } | Event::Failover { .. }
                ) {
                    let mut s = self.lock();
                    if !s.retries_said.insert(line.clone()) {
                        s.retries_unsaid += 1;
                        return;
                    }
                }
                eprint_line(&line);
            }
        }
    }
}

#[derive(serde::Serialize)]
struct Start<'a> {
    event: &'a str,
    op: &'a str,
    unit: &'a str,
    total: Option<u64>,
}

#[derive(serde::Serialize)]
struct ProgressEvent<'a> {
    event: &'a str,
    done: u64,
    total: Option<u64>,
    /// Units per second since the start.
    rate: f64,
    eta_s: Option<u64>,
    elapsed_s: f64,
    depots: Vec<DepotJson<'a>>,
}

#[derive(serde::Serialize)]
struct DepotJson<'a> {
    depot: &'a str,
    done: u64,
    /// Recent units per second.
    rate: f64,
    #[serde(skip_serializing_if = "str::is_empty")]
    state: &'a str,
}

#[derive(serde::Serialize)]
struct EventJson<'a> {
    event: &'a str,
    depot: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    silent_s: Option<u64>,
}

#[derive(serde::Serialize)]
struct Done<'a, T> {
    event: &'a str,
    op: &'a str,
    /// Units done, as the progress events count them.
    done: u64,
    total: Option<u64>,
    #[serde(flatten)]
    summary: &'a T,
}

/// One event line. Our event structs always serialize; should one not,
/// the stream still gets a line saying so.
fn json<T: serde::Serialize>(v: &T) -> String {
    crate::commands::json_line(v)
        .unwrap_or_else(|e| format!("{{\"event\":\"error\",\"why\":{:?}}}", e.to_string()))
}

/// Time left at `rate` units/s.
fn eta(total: Option<u64>, done: u64, rate: f64) -> Option<Duration> {
    let t = total?;
    (rate > 0.0).then(|| Duration::from_secs_f64(t.saturating_sub(done) as f64 / rate))
}

/// The total line: `WHAT [######--------]  45% 1.2 GiB/2.7 GiB 812.0 MiB/s ETA 0:02`
/// (no bar or ETA when the total is unknown), with the depot count.
fn render(
    what: &str,
    unit: Unit,
    done: u64,
    total: Option<u64>,
    elapsed: Duration,
    depots: usize,
) -> String {
    const WIDTH: usize = 14;
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-3);
    let per_s = unit.rate(rate);
    let on = match depots {
        0 => String::new(),
        1 => " 1 depot".into(),
        n => format!(" {n} depots"),
    };
    match total {
        Some(t) if t > 0 => {
            let frac = (done as f64 / t as f64).clamp(0.0, 1.0);
            let fill = (frac * WIDTH as f64).round() as usize;
            let eta = match eta(total, done, rate) {
                Some(left) => {
                    let s = left.as_secs();
                    format!("{}:{:02}", s / 60, s % 60)
                }
                None => "?".into(),
            };
            format!(
                "{what} [{}{}] {:>3.0}% {}/{} {per_s} ETA {eta}{on}",
                "#".repeat(fill),
                "-".repeat(WIDTH - fill),
                frac * 100.0,
                unit.amount(done),
                unit.amount(t),
            )
        }
        _ => format!("{what} {} {per_s}{on}", unit.amount(done)),
    }
}

/// `s` cut to `width` characters (an ellipsis marks the cut).
fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// One progress for many transfers side by side (a batch of files): each
/// adds to it, none restarts it (the batch starts it with every file's
/// size).
pub struct Shared(pub Arc<Reporter>);

impl lors::Progress for Shared {
    fn advance(&self, depot: &str, n: u64) {
        lors::Progress::advance(&*self.0, depot, n);
    }

    fn event(&self, e: &Event) {
        lors::Progress::event(&*self.0, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_line_shows_bar_percent_sizes_rate_eta_and_depots() {
        let l = render(
            "download",
            Unit::Bytes,
            512 << 20,
            Some(1 << 30),
            Duration::from_secs(2),
            3,
        );
        assert_eq!(
            l,
            "download [#######-------]  50% 512.0 MiB/1.0 GiB 256.0 MiB/s ETA 0:02 3 depots"
        );
        assert!(l.chars().count() <= 80, "{} columns", l.chars().count());
        assert_eq!(
            render(
                "upload",
                Unit::Bytes,
                3 << 10,
                None,
                Duration::from_secs(1),
                0
            ),
            "upload 3.0 KiB 3.0 KiB/s"
        );
        assert_eq!(
            render(
                "refresh",
                Unit::Allocations,
                5,
                Some(10),
                Duration::from_secs(1),
                1
            ),
            "refresh [#######-------]  50% 5/10 5/s ETA 0:01 1 depot"
        );
        assert_eq!(Bytes(999).to_string(), "999 B");
    }

    #[test]
    fn lines_never_wrap() {
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
        let long = render(
            "download",
            Unit::Bytes,
            u64::MAX / 3,
            Some(u64::MAX / 2),
            Duration::from_secs(1),
            1000,
        );
        assert_eq!(fit(&long, 79).chars().count(), 79);
    }
}
