//! Dissemination ("DDMG: A Data Dissemination Mechanism for Grid Environments", DDMG): one file to many sites, each ending with
//! a full replica, in about the time of one transfer. The client stores
//! distinct blocks at the sites and the sites copy what they lack from each
//! other, depot to depot (SEND), as the sans-I/O [`sched`] decides: pulled
//! block by block, so a slow site takes less and a failing one is dropped
//! without holding up the others.
//!
//! The input is a local file (the client is the source) or an exNode (its
//! replicas are the sources, and the client moves no data). Blocks a site
//! already holds in the input exNode are not copied again, so running a
//! dissemination again on its own output completes what is missing.
//!
//! ```no_run
//! # async fn f() -> lors::Result<()> {
//! use std::sync::Arc;
//! use lors::dissem::{Input, Options, disseminate};
//! use lors::{NoProgress, Pool};
//!
//! let sites = vec!["d1.example.org:6714".to_string(), "d2.example.org:6714".to_string()];
//! let pool = Arc::new(Pool::new(Default::default()));
//! let input = Input::File("run42.dat".into());
//! let out = disseminate(input, &sites, &Options::default(), pool, Arc::new(NoProgress)).await?;
//! assert!(out.sites.iter().all(|s| s.complete));
//! lors::xnd::save("run42.xnd".as_ref(), &out.exnode).unwrap();
//! # Ok(()) }
//! ```

mod distance;
pub mod sched;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lors_exnode::{ExNode, Mapping};
use lors_ibp::proto::Reliability;
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::progress::{Event, Progress};
use sched::{Blame, BlockId, Note, Sched, Source, Transfer};

/// What to disseminate.
#[derive(Debug, Clone)]
pub enum Input {
    /// A local file: the client sends each block about once.
    File(PathBuf),
    /// An exNode: its replicas are the sources; its blocks already on a
    /// destination site count as delivered there.
    ExNode(ExNode),
}

/// Dissemination settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Block size for a file input (an exNode keeps its blocks); `None`:
    /// [`block_size_for`]. Smaller blocks start the relaying sooner; each
    /// is an allocation per site.
    pub block_size: Option<u64>,
    /// Lease of the new allocations.
    pub duration: Duration,
    /// Hard or soft storage.
    pub reliability: Reliability,
    /// File name recorded in the exNode of a file input.
    pub filename: String,
    /// The least time a copy may take before it is given up (it may take
    /// longer: eight times the typical copy of its size) — unless it makes
    /// no progress while the other sites' copies finish: then it is given
    /// up at [`crate::stall`]'s pace (a few typical copies, at least 2 s).
    pub stall: Duration,
    /// The scheduler's settings (slots, failures, unicast).
    pub sched: sched::Config,
    /// Fit the slots (and a file's block size, when `block_size` is
    /// `None`) to the sites' round trips, measured before the first copy
    /// (see `distance`): slots were not given.
    pub fit_distance: bool,
    /// Turns `true` when the run should stop (an interrupt): every site
    /// not yet complete is given up as a failing one is — its copies in
    /// flight end (or are cut off after [`crate::stall::RELEASE_WAIT`]),
    /// what it got is released — and the outcome names the complete ones.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            block_size: None,
            duration: Duration::from_secs(86_400),
            reliability: Reliability::Hard,
            filename: String::new(),
            stall: Duration::from_secs(60),
            sched: sched::Config::default(),
            fit_distance: true,
            stop: None,
        }
    }
}

/// The block size a file of `size` bytes is cut into for `sites` sites:
/// about 16 blocks per site, so relaying starts after a small part of the
/// file and every site has blocks to give, as a power of two from 256 KiB
/// to 8 MiB (fewer, larger allocations for large files).
///
/// ```
/// use lors::dissem::block_size_for;
/// assert_eq!(block_size_for(48 << 20, 8), 512 << 10);
/// assert_eq!(block_size_for(1 << 40, 4), 8 << 20);
/// assert_eq!(block_size_for(1000, 2), 256 << 10);
/// ```
pub fn block_size_for(size: u64, sites: usize) -> u64 {
    let per = size / (16 * sites.max(1) as u64);
    per.next_power_of_two().clamp(256 << 10, 8 << 20)
}

/// How one site fared.
#[derive(Debug, Clone)]
pub struct SiteReport {
    /// The site's depot (`host:port`).
    pub depot: String,
    /// It holds a full replica, named in the exNode.
    pub complete: bool,
    /// Bytes it received in this run.
    pub received: u64,
    /// Bytes it sent to other sites.
    pub relayed: u64,
    /// When it completed, from the start.
    pub finished: Option<Duration>,
    /// Why it did not complete.
    pub error: Option<String>,
}

/// A finished dissemination.
#[derive(Debug)]
pub struct Outcome {
    /// The input's mappings (for an exNode) and one full replica per
    /// completed site.
    pub exnode: ExNode,
    /// Per site, in the order given.
    pub sites: Vec<SiteReport>,
    /// Bytes the client sent (its egress; about the file size).
    pub source_bytes: u64,
    /// Bytes copied site to site or from the input's replicas.
    pub relayed_bytes: u64,
    /// Time taken.
    pub elapsed: Duration,
    /// Allocations of incomplete sites that could not be released (their
    /// depot did not answer): record them, or they hold space until their
    /// lease ends.
    pub unreleased: ExNode,
}

/// One block of the file and where its copies come from.
struct Block {
    /// What a new replica's mapping looks like (without capabilities); its
    /// logical range is the block's.
    template: Mapping,
    /// The origins holding it, each with the mapping to copy from.
    from_origin: Vec<(usize, Mapping)>,
}

impl Block {
    fn offset(&self) -> u64 {
        self.template.exnode_offset
    }

    fn len(&self) -> u64 {
        self.template.logical_length
    }

    fn origin(&self, o: usize) -> &Mapping {
        let (_, m) = (self.from_origin.iter())
            .find(|(x, _)| *x == o)
            .expect("the scheduler names an origin that holds the block");
        m
    }
}

/// The blocks and their sources.
struct Layout {
    blocks: Vec<Block>,
    /// Origin depots by index.
    origin_depots: Vec<String>,
    /// Copies the sites hold already: (site, block, mapping).
    preheld: Vec<(usize, BlockId, Mapping)>,
    file: Option<Arc<std::fs::File>>,
}

fn layout(input: &Input, sites: &[String], block_size: Option<u64>) -> Result<Layout> {
    match input {
        Input::File(path) => {
            let f = std::fs::File::open(path)
                .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
            let size = f
                .metadata()
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?
                .len();
            let bs = block_size
                .unwrap_or_else(|| block_size_for(size, sites.len()))
                .max(1);
            let blocks = (0..size.div_ceil(bs))
                .map(|i| {
                    let offset = i * bs;
                    let len = bs.min(size - offset);
                    Block {
                        template: Mapping {
                            exnode_offset: offset,
                            logical_length: len,
                            alloc_length: len,
                            ..Mapping::default()
                        },
                        from_origin: Vec::new(),
                    }
                })
                .collect();
            Ok(Layout {
                blocks,
                origin_depots: Vec::new(),
                preheld: Vec::new(),
                file: Some(Arc::new(f)),
            })
        }
        Input::ExNode(x) => exnode_layout(x, sites),
    }
}

/// Cuts an exNode into blocks that tile it once: where replicas are cut
/// differently, the range with the most readable replicas at each point.
fn exnode_layout(x: &ExNode, sites: &[String]) -> Result<Layout> {
    let ranges = x.blocks();
    let size = x.logical_size();
    let mut blocks = Vec::new();
    let mut origin_depots: Vec<String> = Vec::new();
    let mut preheld = Vec::new();
    let mut pos = 0;
    while pos < size {
        if let Some(h) = x.hole_at(pos) {
            pos = h.end();
            continue;
        }
        let readable = |idx: &Vec<usize>| {
            idx.iter()
                .filter(|&&i| x.mappings[i].read.is_some())
                .count()
        };
        let Some(((offset, len), idx)) = ranges
            .range((pos, 0)..(pos, u64::MAX))
            .filter(|((_, len), idx)| *len > 0 && readable(idx) > 0)
            .max_by_key(|((_, len), idx)| (readable(idx), *len))
        else {
            return Err(Error::Unreadable {
                offset: pos,
                end: size,
                last: "no readable replica starts here: the exNode has a hole, or its replicas are cut in ways that do not line up".into(),
            });
        };
        let b = blocks.len();
        let mut from_origin: Vec<(usize, Mapping)> = Vec::new();
        for &i in idx {
            let m = &x.mappings[i];
            let Some(depot) = m.depot() else { continue };
            if let Some(s) = sites.iter().position(|s| *s == depot) {
                if m.read.is_some() && !preheld.iter().any(|&(ps, pb, _)| ps == s && pb == b) {
                    preheld.push((s, b, m.clone()));
                }
                continue;
            }
            if m.read.is_none() {
                continue;
            }
            let o = match origin_depots.iter().position(|d| *d == depot) {
                Some(o) => o,
                None => {
                    origin_depots.push(depot);
                    origin_depots.len() - 1
                }
            };
            if from_origin.iter().all(|(x, _)| *x != o) {
                from_origin.push((o, m.clone()));
            }
        }
        let model = &x.mappings[idx[0]];
        blocks.push(Block {
            template: Mapping {
                alloc_offset: 0,
                read: None,
                write: None,
                manage: None,
                ..model.clone()
            },
            from_origin,
        });
        pos = offset + len;
    }
    Ok(Layout {
        blocks,
        origin_depots,
        preheld,
        file: None,
    })
}

/// Sends the input to every site in `sites` (depots, `host:port`); see the
/// module documentation. Fails only when nothing can start (no sites, an
/// unreadable file); sites that fail are reported in [`Outcome::sites`].
pub async fn disseminate(
    input: Input,
    sites: &[String],
    opts: &Options,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
) -> Result<Outcome> {
    if sites.is_empty() {
        return Err(Error::NoDepots);
    }
    let t0 = Instant::now();
    let mut fitted;
    let opts = if opts.fit_distance {
        fitted = opts.clone();
        let rtts = pool.round_trips(sites, crate::pool::MEASURE_WAIT).await;
        if distance::fit(&mut fitted.sched, &rtts) {
            tracing::debug!(
                slots = fitted.sched.in_slots,
                client = fitted.sched.client_slots,
                "sites at distance"
            );
            if let (None, Input::File(p)) = (fitted.block_size, &input) {
                let size = std::fs::metadata(p).map_or(0, |m| m.len());
                let bs = block_size_for(size, sites.len());
                fitted.block_size = Some(distance::block_size(bs, size, fitted.sched.in_slots));
            }
        }
        &fitted
    } else {
        opts
    };
    let lay = layout(&input, sites, opts.block_size)?;
    let lens: Vec<u64> = lay.blocks.iter().map(Block::len).collect();
    let pre: Vec<(usize, BlockId)> = lay.preheld.iter().map(|&(s, b, _)| (s, b)).collect();
    let origins: Vec<Vec<usize>> = (lay.blocks.iter())
        .map(|b| b.from_origin.iter().map(|&(o, _)| o).collect())
        .collect();
    let origins = matches!(input, Input::ExNode(_)).then_some(&origins[..]);
    let sched = Sched::new(lens, sites.len(), Some(opts.sched.clone()), origins, &pre);
    let mut run = Spread::new(sched, lay, sites, opts, pool, progress, t0);
    let mut stop = opts.stop.clone();
    loop {
        if stop.as_ref().is_some_and(|st| *st.borrow()) {
            stop = None; // once
            run.interrupt();
        }
        run.start_copies();
        let Some(joined) = run.next_done(stop.clone()).await else {
            break;
        };
        let (t, r) = match joined {
            Ok(Some(done)) => done,
            Ok(None) => continue,
            Err(e) if e.is_cancelled() => continue,
            Err(e) => return Err(Error::io("a copy task", std::io::Error::other(e))),
        };
        run.take(t, r).await;
    }
    Ok(run.finish(&input).await)
}

/// A dissemination under way: the scheduler, what each site holds, the
/// copies running, and what each site did.
struct Spread<'a> {
    s: Sched,
    lay: Arc<Layout>,
    sites: &'a [String],
    opts: &'a Options,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
    t0: Instant,
    /// Per site and block: the mapping it holds, and whether this run
    /// made it.
    held: Vec<HashMap<BlockId, (Mapping, bool)>>,
    reports: Vec<SiteReport>,
    /// A hung site's copies are given up at the pace of the others
    /// (crate::stall), not after the full per-copy deadline.
    watch: Arc<crate::stall::Watcher>,
    set: JoinSet<(Transfer, Copied)>,
    tasks: HashMap<u64, tokio::task::AbortHandle>,
    void_since: Option<tokio::time::Instant>,
    relayed_bytes: u64,
    /// Allocations of failed copies that could not be released.
    stranded: Vec<Mapping>,
}

impl<'a> Spread<'a> {
    fn new(
        s: Sched,
        lay: Layout,
        sites: &'a [String],
        opts: &'a Options,
        pool: Arc<Pool>,
        progress: Arc<dyn Progress>,
        t0: Instant,
    ) -> Self {
        let mut held: Vec<HashMap<BlockId, (Mapping, bool)>> = vec![HashMap::new(); sites.len()];
        for (site, b, m) in &lay.preheld {
            held[*site].insert(*b, (m.clone(), false));
        }
        let reports = (sites.iter())
            .map(|d| SiteReport {
                depot: d.clone(),
                complete: false,
                received: 0,
                relayed: 0,
                finished: None,
                error: None,
            })
            .collect();
        let total: u64 = (0..sites.len())
            .map(|i| {
                (lay.blocks.iter().enumerate())
                    .filter(|(b, _)| !held[i].contains_key(b))
                    .map(|(_, x)| x.len())
                    .sum::<u64>()
            })
            .sum();
        progress.start(Some(total));
        let watch = Arc::new(crate::stall::Watcher::new(opts.stall, pool.config()));
        watch.know(sites);
        Spread {
            s,
            lay: Arc::new(lay),
            sites,
            opts,
            pool,
            progress,
            t0,
            held,
            reports,
            watch,
            set: JoinSet::new(),
            tasks: HashMap::new(),
            void_since: None,
            relayed_bytes: 0,
            stranded: Vec::new(),
        }
    }

    /// Told to stop: every site not yet complete is given up.
    fn interrupt(&mut self) {
        for (site, report) in self.reports.iter_mut().enumerate() {
            if !self.s.is_complete(site) && !self.s.is_dropped(site) {
                report.error = Some("interrupted".into());
                self.s.drop_site(site);
            }
        }
    }

    /// Starts the copies the scheduler hands out now, and says what it noted.
    fn start_copies(&mut self) {
        for t in self.s.next(Instant::now()) {
            let src = match t.from {
                Source::Client => None,
                Source::Origin(o) => Some(self.lay.blocks[t.block].origin(o).clone()),
                Source::Site(h) => Some(self.held[h][&t.block].0.clone()),
            };
            let deadline = self
                .s
                .deadline(self.lay.blocks[t.block].len(), self.opts.stall);
            let (pool, lay, site) = (
                self.pool.clone(),
                self.lay.clone(),
                self.sites[t.to].clone(),
            );
            let (rel, dur) = (self.opts.reliability, self.opts.duration);
            let watch = self.watch.clone();
            let id = t.id;
            let task = self.set.spawn(async move {
                let how = (rel, dur);
                let within = (deadline, &*watch);
                let r = copy(&pool, &lay, t.block, src.as_ref(), &site, how, within).await;
                (t, r)
            });
            self.tasks.insert(id, task);
        }
        for n in self.s.take_notes() {
            let origins = &self.lay.origin_depots;
            note(
                &n,
                self.sites,
                origins,
                &mut self.reports,
                self.progress.as_ref(),
            );
        }
    }

    /// The next copy to end: `None` when none is left, `Ok(None)` when the
    /// wait ended without one (a stop, void copies cut off).
    ///
    /// Once only copies made void (their site was given up) are left, they
    /// get RELEASE_WAIT to end — a site that answers finishes them and they
    /// are released — then are cut off: a hung site would hold the command
    /// to the copy deadline. Whatever a cut-off copy allocated there, if
    /// the site ever answers, is named by no exNode and ends with its lease.
    async fn next_done(
        &mut self,
        stop: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> Option<std::result::Result<Option<(Transfer, Copied)>, tokio::task::JoinError>> {
        let all_void =
            !self.tasks.is_empty() && self.tasks.keys().all(|&id| !self.s.is_running(id));
        if !all_void {
            self.void_since = None;
        }
        let stopping = async {
            match stop {
                Some(mut st) => {
                    let _ = st.wait_for(|&v| v).await;
                }
                None => std::future::pending().await,
            }
        };
        let joined = if all_void {
            let until = *self
                .void_since
                .get_or_insert_with(|| tokio::time::Instant::now() + crate::stall::RELEASE_WAIT);
            match tokio::time::timeout_at(until, self.set.join_next()).await {
                Ok(j) => j,
                Err(_) => {
                    for (_, task) in self.tasks.drain() {
                        task.abort();
                    }
                    return Some(Ok(None));
                }
            }
        } else {
            tokio::select! {
                j = self.set.join_next() => j,
                () = stopping => return Some(Ok(None)),
            }
        };
        joined.map(|j| j.map(Some))
    }

    /// Takes in the end of copy `t`.
    async fn take(&mut self, t: Transfer, r: Copied) {
        self.tasks.remove(&t.id);
        let running = self.s.is_running(t.id);
        match r {
            Ok(m) if running => {
                self.s.done(t.id, Instant::now());
                let len = self.lay.blocks[t.block].len();
                self.reports[t.to].received += len;
                match t.from {
                    Source::Site(h) => {
                        self.reports[h].relayed += len;
                        self.relayed_bytes += len;
                    }
                    Source::Origin(_) => self.relayed_bytes += len,
                    Source::Client => {}
                }
                self.held[t.to].insert(t.block, (m, true));
                self.progress.advance(&self.sites[t.to], len);
                if self.s.is_complete(t.to) {
                    self.reports[t.to].finished = Some(self.t0.elapsed());
                }
            }
            Ok(m) => {
                // Made void by a site given up meanwhile: no exNode will
                // name it.
                let cap = m.manage.as_ref().expect("copies have every capability");
                let released =
                    tokio::time::timeout(crate::stall::RELEASE_WAIT, self.pool.release(cap)).await;
                if !matches!(released, Ok(Ok(()))) {
                    self.stranded.push(m);
                }
            }
            Err(Failed {
                blame,
                why,
                stranded,
            }) => {
                self.stranded.extend(stranded);
                if let (true, Blame::Busy { to }) = (running, blame) {
                    // Asked again, through fewer slots: the depot answered.
                    tracing::debug!(site = %self.sites[t.to], to, %why, "busy");
                    self.s.busy(t.id, to, Instant::now());
                } else if running {
                    let blamed = match (blame, t.from) {
                        (Blame::From, Source::Site(h)) => h,
                        _ => t.to,
                    };
                    self.reports[blamed].error = Some(why.clone());
                    self.progress.event(&Event::Retry {
                        depot: self.sites[t.to].clone(),
                        why: format!(
                            "copy of the block at byte {} failed: {why}",
                            self.lay.blocks[t.block].offset()
                        ),
                    });
                    let _void = self.s.failed(t.id, blame);
                }
            }
        }
    }

    /// The result: the input's mappings, then each complete site's
    /// replica; the copies of incomplete sites released.
    async fn finish(mut self, input: &Input) -> Outcome {
        let mut x = match input {
            Input::ExNode(x) => x.clone(),
            Input::File(_) => ExNode::of_file(&self.opts.filename),
        };
        let unreachable = self.s.unreachable();
        let mut release = Vec::new();
        for (i, r) in self.reports.iter_mut().enumerate() {
            let mut mine: Vec<(BlockId, (Mapping, bool))> = self.held[i].drain().collect();
            mine.sort_by_key(|(b, _)| *b);
            let made = mine
                .into_iter()
                .filter(|(_, (_, new))| *new)
                .map(|(_, (m, _))| m);
            if self.s.is_complete(i) {
                r.complete = true;
                x.mappings.extend(made);
                continue;
            }
            if r.error.is_none() {
                r.error = Some(if unreachable.is_empty() {
                    "did not complete".into()
                } else {
                    format!("{} blocks are on no depot that answers", unreachable.len())
                });
            }
            release.extend(made);
        }
        let mut unreleased = ExNode {
            holes: Vec::new(),
            parity: x.parity.clone(),
            metadata: x.metadata.clone(),
            mappings: if release.is_empty() {
                Vec::new()
            } else {
                self.pool.release_all(release).await
            },
        };
        unreleased.mappings.extend(self.stranded);
        Outcome {
            exnode: x,
            sites: self.reports,
            source_bytes: self.s.client_bytes(),
            relayed_bytes: self.relayed_bytes,
            elapsed: self.t0.elapsed(),
            unreleased,
        }
    }
}

fn note(
    n: &Note,
    sites: &[String],
    origins: &[String],
    reports: &mut [SiteReport],
    progress: &dyn Progress,
) {
    match n {
        Note::SiteDropped { site, failures } => {
            let why = reports[*site]
                .error
                .clone()
                .unwrap_or_else(|| "no reason given".into());
            reports[*site].error = Some(format!(
                "given up after {failures} failures in a row; last: {why}"
            ));
            progress.event(&Event::Failover {
                depot: sites[*site].clone(),
                why: format!("{failures} copies to it in a row failed (last: {why})"),
            });
        }
        Note::OriginDropped { origin } => progress.event(&Event::Failover {
            depot: origins[*origin].clone(),
            why: "copies from it keep failing; its blocks are read from other replicas".into(),
        }),
    }
}

/// Why a copy failed, whose fault it may be, and the allocation it made
/// but could not release (its depot did not answer).
struct Failed {
    blame: Blame,
    why: String,
    stranded: Option<Mapping>,
}

/// A copy's new mapping, or why it failed.
type Copied = std::result::Result<Mapping, Failed>;

/// One copy of block `b` onto `site`: stored from the file (`src: None`)
/// or sent depot to depot from `src`, all within `deadline` (and given up
/// sooner when `watch` finds a depot hung). The new
/// allocation is released when the copy fails.
async fn copy(
    pool: &Pool,
    lay: &Layout,
    b: BlockId,
    src: Option<&Mapping>,
    site: &str,
    (rel, dur): (Reliability, Duration),
    (deadline, watch): (Duration, &crate::stall::Watcher),
) -> Copied {
    use crate::stall::Kind;
    let block = &lay.blocks[b];
    let size = block.template.alloc_length.max(1);
    let until = tokio::time::Instant::now() + deadline;
    let late = |what: &str| format!("{what} took over {}s", deadline.as_secs());
    let failed = |blame, why| Failed {
        blame,
        why,
        stranded: None,
    };
    let at = [site];
    let alloc = watch.run(&at, Kind::Op, pool.allocate(site, rel, dur, size));
    let caps = match tokio::time::timeout_at(until, alloc).await {
        Ok(Ok(caps)) => caps,
        Ok(Err(e)) if e.is_busy() => return Err(failed(Blame::Busy { to: true }, e.to_string())),
        Ok(Err(e)) => return Err(failed(Blame::To, e.to_string())),
        Err(_) => return Err(failed(Blame::To, late("the allocation"))),
    };
    let data = async {
        match src {
            None => {
                let file = lay.file.as_ref().expect("a file input has its file");
                let store = pool.store_file(&caps.write, file, block.offset(), block.len());
                (watch.run(&[site], Kind::Bytes(block.len()), store).await).map_err(|e| {
                    let blame = match e.is_busy() {
                        true => Blame::Busy { to: true },
                        false => Blame::To,
                    };
                    (blame, e.to_string())
                })
            }
            Some(m) => {
                let read = m.read.as_ref().expect("sources are readable");
                let send = pool.send(read, &caps.write, m.alloc_offset, m.alloc_length);
                (watch
                    .run(&[&read.address(), site], Kind::Bytes(block.len()), send)
                    .await)
                    .map_err(|e| {
                        // The SEND goes to the source: not reached, gone
                        // mid-copy or talking nonsense, the source is at
                        // fault (a destination that fails makes the source
                        // answer with a status; a timeout may be either's).
                        let blame = match &e {
                            e if e.is_busy() => Blame::Busy { to: false },
                            lors_ibp::Error::Connect { .. }
                            | lors_ibp::Error::Closed { .. }
                            | lors_ibp::Error::Io { .. }
                            | lors_ibp::Error::Protocol { .. } => Blame::From,
                            _ => Blame::Both,
                        };
                        (blame, e.to_string())
                    })
            }
        }
    };
    let r = tokio::time::timeout_at(until, data)
        .await
        .unwrap_or_else(|_| Err((Blame::Both, late("the copy"))));
    let mapping = Mapping {
        read: Some(caps.read),
        write: Some(caps.write),
        manage: Some(caps.manage),
        ..block.template.clone()
    };
    let Err((blame, why)) = r else {
        return Ok(mapping);
    };
    // A depot that did not answer the copy may not answer this either:
    // bounded, and what stays is reported.
    let cap = mapping.manage.as_ref().expect("set above");
    let released = tokio::time::timeout(crate::stall::RELEASE_WAIT, pool.release(cap)).await;
    Err(Failed {
        blame,
        why,
        stranded: (!matches!(released, Ok(Ok(())))).then_some(mapping),
    })
}
