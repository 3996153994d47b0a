//! One cycle of `lors keep` over every exNode, and what it says.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lors::Pool;
use lors::keep::{Kept, Places, Policy, Probed, Scrub, Totals};
use lors::manage::{CopyOptions, Lease};

use super::{Args, files, say};

/// One cycle over every exNode.
pub(super) fn one_cycle(
    a: &Args,
    rt: &tokio::runtime::Runtime,
    lease: Lease,
    margin: Duration,
    stop: &tokio::sync::watch::Receiver<bool>,
    scrub: &mut Scrub,
) -> anyhow::Result<Totals> {
    let mut totals = Totals::default();
    let json = a.report.json;
    let all = files::of_cycle(a, scrub)?;
    // New replicas this cycle has put on each depot: the next exNode's go
    // to the least used first, so a cycle that heals many small exNodes
    // (each placing only a copy or two) spreads them instead of giving all
    // to the first depot listed.
    let mut placed: std::collections::HashMap<String, usize> = Default::default();
    let mut probed = Probed::none();
    for (n, (path, s)) in all.iter().enumerate() {
        let pool = Arc::new(Pool::new(s.client()));
        if *stop.borrow() {
            return Ok(totals);
        }
        if n % PROBE_BATCH == 0 {
            let batch = &all[n..all.len().min(n + PROBE_BATCH)];
            probed = probe_batch(rt, batch, &pool);
        }
        let path = path.clone();
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
            grace: a.grace,
        };
        let first = match n {
            0 if scrub.cursor.file == path => scrub.cursor.mapping,
            _ => 0,
        };
        // A file that is no exNode (empty, damaged, hostile) is said and
        // passed over before anything else: no lock, no depot.
        if let Err(e) = lors::xnd::load(&path)
            .map_err(anyhow::Error::from)
            .and_then(|x| {
                lors::plan::check_exnode(&x)?;
                Ok(())
            })
        {
            say::failed(&mut totals, &name, &e, json)?;
            continue;
        }
        // One writer per exNode: a file another lors command (a user's
        // route, a second keeper) is changing waits for the next cycle.
        let session = match rt.block_on(lors::commit::Session::begin(&path, &pool, Duration::ZERO))
        {
            Ok(s) => Ok(s),
            Err(lors::Error::Busy { holder, .. }) => {
                say::busy(&mut totals, &name, holder, json)?;
                continue;
            }
            // No lock or journal can be written beside it (a read-only
            // directory): its leases are kept all the same, and nothing
            // new is made that no journal could name.
            Err(e) => Err(format!("{e:#}")),
        };
        let no_place = session.as_ref().err().cloned();
        let kept = keep_one(
            a,
            rt,
            &path,
            s,
            &policy,
            &pool,
            scrub,
            first,
            &mut placed,
            no_place,
            &probed,
        );
        let kept = match session {
            Ok(session) => crate::commands::ended(kept, rt.block_on(session.end(&pool))),
            Err(_) => kept,
        };
        match kept {
            Ok(Some(k)) => {
                totals.add(&k);
                say::kept(&name, &k, json, a.report.quiet)?;
            }
            Ok(None) => {
                // Stopped mid-cycle.
                totals.exnodes += 1;
                return Ok(totals);
            }
            Err(e) => say::failed(&mut totals, &name, &e, json)?,
        }
    }
    say::cycle_done(&totals, json, a.report.quiet)?;
    Ok(totals)
}

/// ExNodes probed together: a depot that does not answer costs one stall
/// for the batch, not one per file (the probes stay this fresh).
const PROBE_BATCH: usize = 256;

/// The probes of `batch`'s exNodes, taken at once; those that do not load
/// are left to their own turn, which says why.
fn probe_batch(
    rt: &tokio::runtime::Runtime,
    batch: &[(std::path::PathBuf, Arc<lors::settings::Settings>)],
    pool: &Arc<Pool>,
) -> Probed {
    let xs: Vec<lors_exnode::ExNode> = (batch.iter())
        .filter_map(|(p, _)| lors::xnd::load(p).ok())
        .collect();
    let refs: Vec<&lors_exnode::ExNode> = xs.iter().collect();
    rt.block_on(Probed::of(&refs, pool))
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
    no_place: Option<String>,
    probed: &Probed,
) -> anyhow::Result<Option<Kept>> {
    let before = lors::xnd::read_regular(path, lors::xnd::MAX_XND_BYTES)?;
    let x = lors_exnode::xml::parse(&before)
        .map_err(|e| anyhow::anyhow!("parsing exNode {}: {e}", path.display()))?;
    let checked = scrub.plan(&x, path, first);
    let copies = policy.copies.or_else(|| x.copies_policy()).unwrap_or(1);
    // Where new replicas may go: asked for each exNode that needs one (its
    // blocks' holders differ), and only then.
    let used = &*placed;
    let places = match no_place {
        Some(why) => Places::given_none(format!("no new copies: {why}")),
        None => Places::new(|| {
            let x = &x;
            Box::pin(async move {
                let mut depots = (a.targets.query(x, s, copies, true).await)
                    .map_err(|e| format!("{e:#}"))?
                    .depots;
                // Stable: among depots as used, the directory's ranking stands.
                depots.sort_by_key(|d| used.get(d).copied().unwrap_or(0));
                Ok(depots)
            })
        }),
    };
    // However the depots behave, one file's turn ends: what it began is
    // dropped (copies in flight are freed by the session's end, from its
    // journal) and the file waits for the next cycle.
    let deadline = a.file_deadline();
    let run = lors::keep::cycle(&x, &places, policy, pool, &checked, probed);
    let mut k = match rt.block_on(async { tokio::time::timeout(deadline, run).await }) {
        Ok(Ok(k)) => k,
        Ok(Err(lors::Error::Interrupted { .. })) => return Ok(None),
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => anyhow::bail!(
            "not done within {} (--file-deadline): left to the next cycle",
            lors_ibp::units::Secs(deadline.as_secs())
        ),
    };
    // Mappings as `lors ls` numbers them.
    let numbering = x.numbering();
    for (i, _) in k.corrupt.iter_mut().chain(k.not_refreshed.iter_mut()) {
        *i = numbering.number(*i);
    }
    drop(places);
    if k.changed {
        for d in rt.block_on(lors::keep::save_kept(path, &before, &k, pool))? {
            *placed.entry(d).or_default() += 1;
        }
    }
    Ok(Some(k))
}
