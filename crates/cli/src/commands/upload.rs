//! `lors upload`: store files on depots, each as an exNode.

use std::path::PathBuf;
use std::sync::Arc;

use lors::upload::UploadOptions;
use lors::uri::ExnodeRef;

mod batch;
mod checks;
mod store;
mod summary;

use checks::{Target, chain, check_block_size, targets};
use store::store;
use summary::{Report, summary};

use super::{block_size_arg, nonzero_block_size_arg};
use crate::report::{ReportOpts, Reporter, Unit};
use lors::settings::Layer;

/// Store a file on IBP depots, striped and replicated; write its exNode.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors upload --depot d1:6714 --depot d2:6714 -c 2 -b 10M -o run42.xnd run42.dat
  tar c data/ | lors upload --depot d1:6714 -c 1 -o data.tar.xnd -
  lors upload --depot d1:6714 -c 1 -f video.mp4          # writes video.mp4.xnd
  lors upload --depot d1:6714 -c 2 -o xnds/ run42/*.dat   # many files, side by side
  lors upload --depot d1:6714 -c 2 -o xnds/ --skip-existing run42/*.dat   # again: the rest
  lors upload --depot d1:6714 -c 1 -z -e aes -o s.xnd secret.tar   # compress + encrypt
  lors upload --depot d1:6714 -c 1 -k md5 -o old.xnd f   # readable by LoRS 0.82 tools
  lors upload --depot d1:6714 -c 1 --zlib -o z.xnd f      # LoRS zlib + MD5, ditto

Every e2e block is checksummed with BLAKE3 unless -n or -k none (MD5 with --zlib).")]
pub struct Args {
    #[command(flatten)]
    bwlimit: super::Bwlimit,
    /// Files to upload; `-` reads standard input. Two words without -o or
    /// -f are FILE OUT.xnd; more files need -f (each FILE.xnd) or -o DIR,
    /// and go side by side, sharing the blocks in flight.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    /// Files uploaded at once, of many [default: as many as the blocks in
    /// flight (-t, raised by the depots' round trips): small files far
    /// away each wait out their round trips side by side].
    #[arg(short = 'j', long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    jobs: Option<u32>,
    /// Leave out a file whose exNode is already there (from an earlier run
    /// of the same command) instead of refusing; an interrupted file is
    /// resumed either way.
    #[arg(long, conflicts_with = "force")]
    skip_existing: bool,
    /// Depot HOST or HOST:PORT (port 6714 unless given) to use (repeat, or a
    /// comma list) [default: ask the L-Bone
    /// (-H, LBONE_SERVER, a lors://HOST URI), else the DEPOT lines of
    /// ~/.xndrc, else its LBONE_SERVER lines].
    #[arg(
        long = "depot",
        value_name = "HOST[:PORT]",
        value_delimiter = ',',
        value_parser = super::depot_arg
    )]
    depots: Vec<String>,
    #[command(flatten)]
    lbone: super::LboneOpts,
    #[command(flatten)]
    place: super::PlaceOpts,
    /// Copies of each block, on distinct depots [default: copies= of the
    /// -o URI, else LORS_COPIES, else COPIES in ~/.xndrc, else 3].
    #[arg(short, long)]
    copies: Option<usize>,
    /// Erasure-code instead of copying: stripes of K data blocks and M
    /// parity blocks, each on a depot of its own; any M of a stripe's
    /// blocks may be lost (6+3: three depots, at 1.5x the space) [default:
    /// ec= of the -o URI, else LORS_EC, else EC in ~/.xndrc, else copies].
    /// `none`: copies.
    #[arg(long, value_name = "K+M", conflicts_with = "copies", value_parser = ec_arg)]
    ec: Option<EcArg>,
    /// Block (allocation) size, e.g. 10M [default: bs=, else
    /// LORS_BLOCKSIZE, else DATA_BLOCKSIZE, else 10M, smaller at distance
    /// so every connection gets four blocks].
    #[arg(short = 'b', long = "block-size", value_parser = nonzero_block_size_arg)]
    block_size: Option<u64>,
    /// Blocks transferred at once [default: threads=, else LORS_THREADS,
    /// else THREADS, else 8, plus one per 2 ms of the depots' round trips,
    /// up to 128].
    #[arg(short, long)]
    threads: Option<usize>,
    #[command(flatten)]
    lease: super::LeaseOpts,
    #[command(flatten)]
    net: super::NetOpts,
    /// No end-to-end functions: store the bytes as they are.
    #[arg(short = 'n', long = "none", conflicts_with_all = ["checksum", "compress", "encrypt", "zlib"])]
    no_e2e: bool,
    /// Checksum every e2e block: `blake3` (default), `md5` (the original
    /// LoRS format with the digest LoRS 0.82 computes on 64-bit hosts, so
    /// lors_download 0.82 reads it), or `md5-rfc1321` (the same format with
    /// standard MD5, for 32-bit LoRS builds). Downloads accept either digest.
    #[arg(short = 'k', long, value_name = "KIND", value_parser = ["blake3", "md5", "md5-rfc1321", "none"])]
    checksum: Option<String>,
    /// Compress every e2e block with zstd.
    #[arg(short = 'z', long)]
    compress: bool,
    /// Compress each block with zlib in the original LoRS format
    /// (`zlib_compress`, whole block), MD5-checksummed unless `-k none`:
    /// exNodes the LoRS 0.82 tools can download.
    #[arg(long, conflicts_with_all = ["compress", "encrypt"])]
    zlib: bool,
    /// Encrypt every e2e block: `aes` (AES-256-GCM) or `chacha`
    /// (ChaCha20-Poly1305). The key is kept in the exNode (written 0600).
    #[arg(short = 'e', long, value_name = "CIPHER", value_parser = ["aes", "chacha"])]
    encrypt: Option<String>,
    /// e2e block size: the unit checksums, compression and encryption work
    /// on [default: E2E_BLOCKSIZE, else 1M].
    #[arg(short = 'E', long = "e2e-block-size", value_parser = block_size_arg)]
    e2e_block_size: Option<u64>,
    /// Write the exNode here (a path or `lors://[LBONE]/OUT.xnd?bs=&copies=…`).
    #[arg(short, long, value_name = "OUT.xnd", conflicts_with = "auto_name", value_parser = super::exnode_arg)]
    output: Option<ExnodeRef>,
    /// Write the exNode to FILE.xnd.
    #[arg(short = 'f', long = "auto-name")]
    auto_name: bool,
    /// Replace an existing exNode file: once the new one is saved, what the
    /// old one named is released (blocks another exNode also names, as
    /// after `lors cp`, stay with it).
    #[arg(long)]
    force: bool,
    /// Allow blocks smaller than 64 KiB (every block is an allocation on a
    /// depot: tiny blocks make millions of them).
    #[arg(long)]
    small_blocks: bool,
    /// Store every byte of a sparse file, its holes as zeros, so the LoRS
    /// 0.82 tools can read it [default: holes of 1 MiB or more are
    /// recorded in the exNode and not stored].
    #[arg(long)]
    dense: bool,
    #[command(flatten)]
    report: ReportOpts,
}

/// `--ec K+M|none` (a type of its own: clap reads `Option<Option<_>>`
/// as a flag whose value may be left out).
#[derive(Clone)]
struct EcArg(Option<lors_exnode::erasure::Scheme>);

fn ec_arg(v: &str) -> Result<EcArg, String> {
    lors::uri::parse_ec(v).map(EcArg)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut targets = targets(&a)?;
    if a.skip_existing {
        targets.retain(|t| !skipped(&a, t));
        if targets.is_empty() {
            return Ok(());
        }
    }
    for t in &targets {
        super::check_output(&t.out.path, a.force)?;
    }
    let uri = &targets[0].out;
    let flags = Layer {
        copies: a.copies,
        ec: a.ec.clone().map(|e| e.0).or(a.copies.map(|_| None)),
        block_size: a.block_size,
        threads: a.threads,
        ..a.lease.layer(a.place.layer(a.lbone.layer()))
    };
    let s = super::settings(&a.net, flags, Some(uri))?;
    let rt = super::runtime(super::Threads::Many)?;
    let mut opts = UploadOptions::from_settings(&s, Vec::new(), String::new(), chain(&a, &s.rc)?);
    opts.sparse = !a.dense;
    for t in &targets {
        check_block_size(
            opts.block_size,
            a.small_blocks,
            (!t.stdin()).then_some(&t.file),
        )?;
    }
    let (spread, bytes) = opts.need();
    let mut found = super::Placement {
        depots: &a.depots,
        settings: &s,
    }
    .find(&rt, spread, bytes, Vec::new())?;
    opts.depots = std::mem::take(&mut found.depots);
    let started = std::time::Instant::now();
    let pool = Arc::new(a.bwlimit.pool(s.client()));
    if targets.len() > 1 {
        let b = batch::Batch {
            a: &a,
            rt: &rt,
            pool: &pool,
            directory: found.directory.as_ref(),
        };
        return b.run(targets, opts);
    }
    let t = &targets[0];
    opts.filename = filename(t);
    let copies = opts.copies;
    let progress = Reporter::new("upload", Unit::Bytes, &a.report, false);
    let job = lors::job::upload::Upload {
        opts,
        out: Some(t.out.path.clone()),
        force: a.force,
        slots: None,
    };
    let x = store(&a, t, &job, &rt, &pool, &progress)?.exnode;
    rt.block_on(lors::directory::report_rates(
        found.directory.as_ref(),
        &x.stored_per_depot(),
        started.elapsed(),
    ));
    summary(&a, &progress, &t.out.path, &x, copies, started.elapsed());
    Ok(())
}

/// `--skip-existing`: `t`'s exNode is there; said unless quiet.
fn skipped(a: &Args, t: &Target) -> bool {
    let there = !t.stdin() && t.out.path.exists();
    if there && !a.report.quiet && !a.report.json {
        eprintln!(
            "lors: {} is there: {} skipped",
            t.out.path.display(),
            t.file.display()
        );
    }
    there
}

/// The file's name as the exNode records it.
fn filename(t: &Target) -> String {
    if t.stdin() {
        (t.out.path.file_stem())
            .map_or_else(|| "stdin".into(), |s| s.to_string_lossy().into_owned())
    } else {
        (t.file.file_name()).map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    }
}
