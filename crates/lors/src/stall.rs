//! When a depot that makes no progress is *stalled* — hung (a stopped
//! process, a path that black-holes packets) rather than slow — so its work
//! can move to other depots instead of waiting out the network timeout.
//!
//! The rule is the same everywhere: a depot is stalled once it has made no
//! progress for [`FACTOR`] times the typical time of one unit of work (a
//! piece, a probe, a copy) as the depots taking part measure it, never
//! sooner than [`FLOOR`], and only while some other depot makes progress or
//! waits to help — a wide-area path that is merely slow keeps its work.
//! Before anything has been timed the wait is the command's own limit
//! (`--stall`, or the network timeout).
//!
//! ```
//! use std::time::Duration;
//! use lors::stall::Typical;
//!
//! let mut t = Typical::default();
//! let cap = Duration::from_secs(60);
//! assert_eq!(t.stall_after(cap), cap); // nothing timed yet
//! t.record(Duration::from_millis(100));
//! assert_eq!(t.stall_after(cap), lors::stall::FLOOR);
//! t.record(Duration::from_secs(5));
//! // A slow one moves the typical time an eighth of the way: 0.71 s.
//! assert_eq!(t.stall_after(cap), Duration::from_secs_f64(0.7125 * 4.0));
//! ```

use lors_ibp::ewma::Ewma;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// No progress for this many times the typical unit of work is a stall ...
pub const FACTOR: f64 = 4.0;

/// ... but never sooner than this: a wide-area path's hiccup (a lost
/// segment's retransmission, a slow start after idle) is not a hung depot.
pub const FLOOR: Duration = Duration::from_secs(2);

/// How long releasing an allocation (a DECR) may take before it is left
/// to its lease: a command that gives up, or is interrupted, does not wait
/// out the network timeout on a hung depot to tidy up.
pub const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// The typical time of one unit of work: a moving average, the first
/// sample taken as it is and later ones moving it by an eighth, so it
/// follows a path that speeds up or slows down without one sample swinging
/// it.
#[derive(Debug, Clone, Copy)]
pub struct Typical {
    secs: Ewma,
    samples: u32,
}

impl Default for Typical {
    fn default() -> Self {
        Typical {
            secs: Ewma::new(1.0 / 8.0),
            samples: 0,
        }
    }
}

impl Typical {
    /// Adds one timed unit of work.
    pub fn record(&mut self, took: Duration) {
        self.record_per(took, 1);
    }

    /// Adds `units` of work (bytes, say) that took `took` together.
    pub fn record_per(&mut self, took: Duration, units: u64) {
        self.secs.add(took.as_secs_f64() / units.max(1) as f64);
        self.samples = self.samples.saturating_add(1);
    }

    /// Whether anything has been timed.
    pub fn known(&self) -> bool {
        self.samples > 0
    }

    /// How many times work was timed.
    pub fn samples(&self) -> u32 {
        self.samples
    }

    /// The typical seconds one unit takes (0 while nothing is timed).
    pub fn per_unit(&self) -> f64 {
        self.secs.get().unwrap_or(0.0)
    }

    /// How long no progress is a stall, at most `cap`: [`FACTOR`] times the
    /// typical time, at least [`FLOOR`]; `cap` while nothing is timed.
    pub fn stall_after(&self, cap: Duration) -> Duration {
        self.stall_after_for(1, cap)
    }

    /// [`Typical::stall_after`] for a piece of work of `units` units.
    pub fn stall_after_for(&self, units: u64, cap: Duration) -> Duration {
        if !self.known() {
            return cap;
        }
        scaled(self.per_unit() * units as f64, cap)
    }
}

/// [`FACTOR`] times `secs`, at least [`FLOOR`], at most `cap`.
pub fn scaled(secs: f64, cap: Duration) -> Duration {
    Duration::try_from_secs_f64(secs * FACTOR)
        .unwrap_or(cap)
        .max(FLOOR)
        .min(cap)
}

/// What a watched depot command is, for its typical time.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A command with a small reply (ALLOCATE, DECR, PROBE).
    Op,
    /// This many bytes moved (STORE, SEND): timed per byte.
    Bytes(u64),
}

/// Watches the depot commands of one operation run in parallel (an upload,
/// an augment): the typical small command and byte moved, and when any
/// command last finished. A command is stalled once it has taken the stall
/// time for its kind while others finished; while nothing finishes it waits
/// on, up to the network timeout `cap`.
///
/// A command is not given up on time alone: once it has taken half the
/// stall time, each depot it involves is asked for its version on a fresh
/// connection, with half the stall time (at least a second) to answer. A
/// depot that answers is slow, not hung (a site on a narrow link, a copy
/// behind many others): the command waits another stall time. One that
/// does not answer is hung, and the command ends at the stall time.
///
/// A command that stalls before any other finished (the first commands of
/// an operation, all sent to the hung depot) has no pace to be judged by:
/// it is judged after twice [`FLOOR`], and only when a control — another
/// depot the operation uses ([`Watcher::know`]) — answers while the
/// suspect does not. A network that answers nobody keeps every command
/// waiting, up to the network timeout.
#[derive(Debug)]
pub struct Watcher {
    cap: Duration,
    client: lors_ibp::ClientConfig,
    pace: Mutex<Pace>,
    /// Depots found hung: every other command waiting on one ends at once.
    hung: Mutex<std::collections::HashSet<String>>,
    /// Each depot's last liveness check: when it ended and whether the
    /// depot answered. Commands in flight together (a hundred blocks to a
    /// far depot) reach their check together: one asks, the others take
    /// its answer, rather than a hundred fresh connections that a depot's
    /// per-client cap refuses as if it were hung.
    checked: tokio::sync::Mutex<std::collections::HashMap<String, (Instant, bool)>>,
}

#[derive(Debug)]
struct Pace {
    ops: Typical,
    bytes: Typical,
    last_done: Instant,
    /// Depots this operation uses or heard from: controls for a liveness
    /// check made before any other command finished.
    known: Vec<String>,
}

/// Most depots kept as controls.
const CONTROLS: usize = 64;

impl Watcher {
    /// A watcher whose longest wait is `cap` (the network timeout); its
    /// liveness checks connect as `client` says.
    pub fn new(cap: Duration, client: &lors_ibp::ClientConfig) -> Self {
        Watcher {
            cap,
            client: lors_ibp::ClientConfig {
                connect_timeout: FLOOR,
                io_timeout: FLOOR,
                server_timeout: client.server_timeout,
            },
            pace: Mutex::new(Pace {
                ops: Typical::default(),
                bytes: Typical::default(),
                last_done: Instant::now(),
                known: Vec::new(),
            }),
            hung: Mutex::new(std::collections::HashSet::new()),
            checked: tokio::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Makes `depots` (the ones an operation may use) known as controls: a
    /// command that stalls before any other finished is judged against
    /// them (see [`Watcher::run`]).
    pub fn know(&self, depots: &[String]) {
        let mut p = self.pace();
        for d in depots {
            if p.known.len() < CONTROLS && !p.known.contains(d) {
                p.known.push(d.clone());
            }
        }
    }

    /// Whether a command found depot `addr` hung.
    pub fn is_hung(&self, addr: &str) -> bool {
        self.hung
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(addr)
    }

    /// Up to two known depots, none of `addrs` nor hung, to tell a hung
    /// depot from a network that answers nobody.
    fn controls(&self, addrs: &[&str]) -> Vec<String> {
        let known = self.pace().known.clone();
        (known.into_iter())
            .filter(|d| !addrs.contains(&d.as_str()) && !self.is_hung(d))
            .take(2)
            .collect()
    }

    /// Whether any of `depots` answers a STATUS VERSION within `wait`.
    async fn any_answers(&self, depots: &[String], wait: Duration) -> bool {
        for d in depots {
            if self.first_silent(&[d.as_str()], wait).await.is_none() {
                return true;
            }
        }
        false
    }

    fn known_hung<'a>(&self, addrs: &[&'a str]) -> Option<&'a str> {
        let hung = self.hung.lock().unwrap_or_else(|e| e.into_inner());
        addrs.iter().copied().find(|a| hung.contains(*a))
    }

    fn pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        self.pace.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first of `addrs` that does not answer a STATUS VERSION on a
    /// fresh connection within `wait`, if any. Checks run one at a time,
    /// and a depot checked within the last `wait` is not asked again.
    async fn first_silent(&self, addrs: &[&str], wait: Duration) -> Option<String> {
        let mut checked = self.checked.lock().await;
        for a in addrs {
            let fresh = (checked.get(*a)).filter(|(at, _)| at.elapsed() < wait);
            let answered = match fresh {
                Some(&(_, answered)) => answered,
                None => {
                    let ask = async {
                        let mut c = lors_ibp::Connection::connect(a, &self.client).await?;
                        c.version().await
                    };
                    let answered = matches!(tokio::time::timeout(wait, ask).await, Ok(Ok(_)));
                    checked.insert((*a).to_owned(), (Instant::now(), answered));
                    answered
                }
            };
            if !answered {
                return Some((*a).to_owned());
            }
        }
        None
    }

    /// Runs `fut`, a command involving the depots `addrs` (the first is the
    /// one it was sent to); a stall ends it with
    /// [`lors_ibp::Error::Timeout`] naming the depot that does not answer.
    pub async fn run<T>(
        &self,
        addrs: &[&str],
        kind: Kind,
        fut: impl std::future::Future<Output = lors_ibp::Result<T>>,
    ) -> lors_ibp::Result<T> {
        let began = Instant::now();
        let mut start = began;
        tokio::pin!(fut);
        // The liveness check is begun at half the stall time, so its
        // verdict is in when the stall time is up: a hung depot costs the
        // stall time, not the stall time and the check's own wait.
        let mut check = None;
        let mut verdict: Option<Option<String>> = None;
        loop {
            let (after, others_done) = {
                let p = self.pace();
                let typical = match kind {
                    Kind::Op => p.ops,
                    Kind::Bytes(_) => p.bytes,
                };
                let after = match kind {
                    // Nothing timed: judged early, the liveness check
                    // telling a slow depot from a hung one.
                    _ if !typical.known() => (FLOOR * 2).min(self.cap),
                    Kind::Op => typical.stall_after(self.cap),
                    Kind::Bytes(n) => typical.stall_after_for(n, self.cap),
                };
                (after, p.last_done > start)
            };
            let waited = start.elapsed();
            if let Some(a) = self.known_hung(addrs) {
                return Err(stalled(a, began));
            }
            // Evidence that the network works: another command finished
            // since this one began, or a control will be asked too.
            let controls = if others_done {
                Vec::new()
            } else {
                self.controls(addrs)
            };
            let judged = others_done || !controls.is_empty();
            if judged && waited >= after / 2 && check.is_none() && verdict.is_none() {
                let wait = (after / 2).max(Duration::from_secs(1));
                check = Some(Box::pin(async move {
                    let silent = self.first_silent(addrs, wait).await?;
                    if controls.is_empty() || self.any_answers(&controls, wait).await {
                        Some(silent)
                    } else {
                        None // nobody answers: the network, not the depot
                    }
                }));
            }
            if judged && waited >= after {
                match verdict.take() {
                    Some(Some(a)) => {
                        let mut known = self.hung.lock().unwrap_or_else(|e| e.into_inner());
                        known.insert(a.clone());
                        return Err(stalled(&a, began));
                    }
                    // Slow, not hung: judged again after another stall time.
                    Some(None) => {
                        start = Instant::now();
                        continue;
                    }
                    None => {} // the check is still out
                }
            }
            // Looked at again often: a command that began before anything
            // was timed is judged by what is known now, and one waiting on
            // a depot another command found hung ends soon.
            let wait = (after.saturating_sub(waited))
                .clamp(Duration::from_millis(50), Duration::from_millis(250));
            let checked = async {
                match check.as_mut() {
                    Some(c) => c.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = tokio::time::timeout(wait, &mut fut) => if let Ok(r) = r {
                    if r.is_ok() {
                        let mut p = self.pace();
                        match kind {
                            Kind::Op => p.ops.record(began.elapsed()),
                            Kind::Bytes(n) => p.bytes.record_per(began.elapsed(), n),
                        }
                        p.last_done = Instant::now();
                        if let Some(a) = addrs.first()
                            && p.known.len() < CONTROLS
                            && !p.known.iter().any(|k| k == a)
                        {
                            p.known.push((*a).to_owned());
                        }
                    }
                    return r;
                },
                v = checked => {
                    verdict = Some(v);
                    check = None;
                }
            }
        }
    }
}

/// The error of a command given up on the hung depot `addr`.
fn stalled(addr: &str, began: Instant) -> lors_ibp::Error {
    lors_ibp::Error::Timeout {
        addr: addr.to_owned(),
        during: "a command, while the other depots answered theirs",
        secs: began.elapsed().as_secs(),
    }
}
