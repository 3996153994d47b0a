//! `lors share`: hand out read access that can be taken back.

use std::path::PathBuf;
use std::time::Duration;

use lors::Pool;
use lors::share::{Options, Revoked};
use lors::uri::ExnodeRef;

use crate::exit::UsageError;
use lors_ibp::units::Secs;

/// Write an exNode that reads a file (or a range of it) through IBP
/// aliases: revocable, time-limited, read-only.
#[derive(clap::Args)]
#[command(
    after_help = "The shared exNode names, for each replica, an IBP alias of the allocation:
a read key of its own that reaches only the shared bytes and ends with its
lease. It holds no write or manage key of yours; whoever has it can read,
nothing else. `--revoke` deletes the aliases (it needs your exNode's manage
keys): the next read through the shared exNode fails with \"access revoked
or expired\", while yours goes on working. Keep the shared exNode: it holds
(sealed) what revoking needs.

Aliases are an extension of the ACCRE depot (and of this one): against a
depot without them (LoRS 0.82 era) share says so; `lors modify -w
--strip-manage` then gives read-only access that cannot be revoked.

EXAMPLES:
  lors share --expires 7d -o for-alice.xnd run42.xnd
  lors share --range 0:1G -o first-gig.xnd run42.xnd
  lors share --revoke for-alice.xnd --owner run42.xnd
  lors share --renew for-alice.xnd --owner run42.xnd --expires 30d"
)]
pub struct Args {
    /// The owner's exNode, to share from.
    #[arg(
        value_parser = super::exnode_arg,
        value_name = "OWNER.xnd|lors://…",
        required_unless_present_any = ["revoke", "renew"],
        conflicts_with_all = ["revoke", "renew"]
    )]
    exnode: Option<ExnodeRef>,
    /// Write the shared exNode here.
    #[arg(
        short,
        long,
        value_name = "SHARED.xnd",
        value_parser = super::exnode_arg,
        required_unless_present_any = ["revoke", "renew"]
    )]
    output: Option<ExnodeRef>,
    /// How long the share works [default: as long as the owner's leases
    /// have left now; a later refresh of them does not extend it].
    #[arg(long, value_name = "DURATION", value_parser = super::duration_arg)]
    expires: Option<Duration>,
    /// Share only LEN bytes from OFF (`0:1G`, `512M:512M`): the shared
    /// file is those bytes.
    #[arg(long, value_name = "OFF:LEN", value_parser = range_arg, conflicts_with_all = ["revoke", "renew"])]
    range: Option<(u64, u64)>,
    /// Delete the aliases a shared exNode names: it stops working at once.
    #[arg(
        long,
        value_name = "SHARED.xnd",
        requires = "owner",
        conflicts_with = "renew"
    )]
    revoke: Option<PathBuf>,
    /// Extend a share's aliases to --expires from now (or to the end of the
    /// owner's leases).
    #[arg(long, value_name = "SHARED.xnd", requires = "owner")]
    renew: Option<PathBuf>,
    /// The exNode the share was made from (its manage keys revoke it).
    #[arg(long, value_name = "OWNER.xnd")]
    owner: Option<PathBuf>,
    #[command(flatten)]
    net: super::NetOpts,
    /// No messages.
    #[arg(short, long)]
    quiet: bool,
}

/// `OFF:LEN`, each a size with an optional unit.
fn range_arg(s: &str) -> Result<(u64, u64), String> {
    let (off, len) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected OFF:LEN, e.g. 0:1G"))?;
    Ok((super::size_arg(off)?, super::nonzero_size_arg(len)?))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let rt = super::runtime(super::Threads::One)?;
    let expires = a.expires.map(|d| d.as_secs().max(1));
    if let (Some(shared), Some(owner)) = (a.revoke.as_ref().or(a.renew.as_ref()), &a.owner) {
        let s = super::settings(&a.net, Default::default(), None)?;
        let pool = Pool::new(s.client());
        let y = lors::xnd::load(shared)?;
        let x = lors::xnd::load(owner)?;
        let name = shared.display();
        let r = match a.renew {
            None => rt.block_on(lors::share::revoke(&y, &x, &pool))?,
            Some(_) => rt.block_on(lors::share::extend(&y, &x, expires.unwrap_or(0), &pool))?,
        };
        let verb = if a.renew.is_some() {
            "renewed"
        } else {
            "revoked"
        };
        return report(&name.to_string(), verb, &r, expires, a.quiet);
    }
    let (Some(src), Some(out)) = (a.exnode, a.output) else {
        return Err(UsageError("give the owner's exNode and -o SHARED.xnd".into()).into());
    };
    if out.path == src.path {
        return Err(UsageError(
            "-o names the owner's exNode: the share goes to a file of its own".into(),
        )
        .into());
    }
    let s = super::settings(&a.net, Default::default(), Some(&src))?;
    let x = lors::xnd::load(&src.path)?;
    let opts = Options {
        expires,
        range: a.range,
    };
    let made = rt.block_on(lors::share::share(&x, &opts, &Pool::new(s.client())))?;
    lors::xnd::save(&out.path, &made.exnode)?;
    if !a.quiet {
        let code = lors_exnode::erasure::Erasure::of(&made.exnode)?;
        for lors::share::LeftOut { bytes, depot, why } in &made.skipped {
            let (from, to) = (bytes.start, bytes.end);
            match code {
                Some(_) => eprintln!(
                    "lors: warning: the block on {depot} is not in the share ({why}); its stripe is rebuilt from the others when read"
                ),
                None => eprintln!(
                    "lors: warning: bytes {from}..{to}: the replica on {depot} is not in the share ({why}); other replicas are"
                ),
            }
        }
        let what = match code {
            Some(e) => format!(
                "{} of {} blocks, {} code",
                made.exnode
                    .allocations()
                    .filter(|m| m.read.is_some())
                    .count(),
                made.exnode.allocations().count(),
                e.scheme
            ),
            None => format!("{} replicas", made.exnode.mappings.len()),
        };
        let left = made.expires_at.saturating_sub(lors_ibp::units::unix_now());
        eprintln!(
            "lors: shared {} bytes of {} as {} ({what}, read-only) until {} ({}); revoke with: lors share --revoke {} --owner {}",
            made.exnode.logical_size(),
            src.path.display(),
            out.path.display(),
            super::utc(made.expires_at),
            Secs(left),
            out.path.display(),
            src.path.display(),
        );
    }
    Ok(())
}

/// Says what a revoke or renew did; an error if any alias was left as it
/// was.
fn report(
    name: &str,
    verb: &str,
    r: &Revoked,
    expires: Option<u64>,
    quiet: bool,
) -> anyhow::Result<()> {
    for lors::share::LeftOut { bytes, depot, why } in &r.failed {
        eprintln!("lors: bytes {bytes:?} on {depot}: not {verb}: {why}");
    }
    if !quiet {
        let gone = match r.gone {
            0 => String::new(),
            n => format!(", {n} already gone (revoked or expired)"),
        };
        let until = match (verb, expires) {
            ("renewed", Some(s)) => format!(" for {}", Secs(s)),
            ("renewed", None) => " to the end of the owner's leases".into(),
            _ => String::new(),
        };
        eprintln!("lors: {name}: {} aliases {verb}{until}{gone}", r.done);
    }
    if r.failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!(
            "{} of the share's aliases were not {verb}: run the same command again once their depots answer",
            r.failed.len()
        )
    }
}
