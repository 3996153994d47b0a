//! `lors upload`: store a file on depots as an exNode.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use lors::Pool;
use lors::upload::{Control, UploadOptions, upload, upload_file_with};
use lors::uri::ExnodeRef;
use lors::xndrc::Xndrc;
use lors_exnode::functions::{Chain, Codec, LegacyChain, LegacyKind, Step};

use super::{block_size_arg, nonzero_block_size_arg};
use crate::UsageError;
use crate::report::{ReportOpts, Reporter, Unit};
use lors::settings::Layer;

/// Store a file on IBP depots, striped and replicated; write its exNode.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors upload --depot d1:6714 --depot d2:6714 -c 2 -b 10M -o run42.xnd run42.dat
  tar c data/ | lors upload --depot d1:6714 -c 1 -o data.tar.xnd -
  lors upload --depot d1:6714 -c 1 -f video.mp4          # writes video.mp4.xnd
  lors upload --depot d1:6714 -c 1 -z -e aes -o s.xnd secret.tar   # compress + encrypt
  lors upload --depot d1:6714 -c 1 -k md5 -o old.xnd f   # readable by LoRS 0.82 tools
  lors upload --depot d1:6714 -c 1 --zlib -o z.xnd f      # LoRS zlib + MD5, ditto

Every e2e block is checksummed with BLAKE3 unless -n or -k none (MD5 with --zlib).")]
pub struct Args {
    /// Most bytes per second moved in all, over every connection (e.g.
    /// `10M` = 10 MiB/s), as rclone's --bwlimit [default: no limit].
    #[arg(long, value_name = "RATE", value_parser = super::nonzero_size_arg)]
    bwlimit: Option<u64>,
    /// File to upload; `-` reads standard input.
    file: PathBuf,
    /// Where the exNode goes, as with -o (`lors upload FILE OUT.xnd`).
    #[arg(value_name = "OUT.xnd", conflicts_with_all = ["output", "auto_name"], value_parser = super::exnode_arg)]
    dest: Option<ExnodeRef>,
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
    /// Block (allocation) size, e.g. 10M [default: bs=, else
    /// LORS_BLOCKSIZE, else DATA_BLOCKSIZE, else 10M].
    #[arg(short = 'b', long = "block-size", value_parser = nonzero_block_size_arg)]
    block_size: Option<u64>,
    /// Blocks transferred at once [default: threads=, else LORS_THREADS,
    /// else THREADS, else 8].
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
    /// Replace an existing exNode file (its allocations are not freed).
    #[arg(long)]
    force: bool,
    /// Allow blocks smaller than 64 KiB (every block is an allocation on a
    /// depot: tiny blocks make millions of them).
    #[arg(long)]
    small_blocks: bool,
    #[command(flatten)]
    report: ReportOpts,
}

/// The end-to-end encoding the flags ask for.
fn chain(a: &Args, rc: &Xndrc) -> anyhow::Result<Option<Codec>> {
    if a.no_e2e {
        return Ok(None);
    }
    let block_size = a.e2e_block_size.or(rc.e2e_block_size).unwrap_or(1 << 20);
    if block_size == 0 || block_size > lors_exnode::functions::MAX_E2E_BLOCK {
        return Err(UsageError("-E must be between 1 byte and 256 MiB".into()).into());
    }
    if a.zlib {
        let mut kinds = vec![LegacyKind::Zlib];
        match a.checksum.as_deref() {
            None | Some("md5") => kinds.push(LegacyKind::Checksum),
            Some("none") => {}
            Some(_) => {
                return Err(UsageError(
                    "--zlib writes the LoRS format with the 64-bit LoRS MD5: use -k md5 or -k none"
                        .into(),
                )
                .into());
            }
        }
        return Ok(Some(Codec::Legacy(LegacyChain::new(block_size, kinds))));
    }
    let mut steps = Vec::new();
    if a.compress {
        steps.push(Step::Zstd { level: 3 });
    }
    match a.encrypt.as_deref() {
        Some("aes") => steps.push(Step::Aes256Gcm {
            key: Step::random_key()?,
        }),
        Some(_) => steps.push(Step::ChaCha20Poly1305 {
            key: Step::random_key()?,
        }),
        None => {}
    }
    match a.checksum.as_deref() {
        None | Some("blake3") => steps.push(Step::Blake3),
        Some("md5") => steps.push(Step::Md5),
        Some("md5-rfc1321") => steps.push(Step::Md5Rfc1321),
        _ => {}
    }
    if steps.is_empty() {
        return Ok(None);
    }
    Ok(Some(Codec::Native(Chain { block_size, steps })))
}

/// Refuses, before anything is stored, an output that would overwrite an
/// exNode (unless `force`) or that cannot be written.
pub(crate) fn check_output(out: &std::path::Path, force: bool) -> anyhow::Result<()> {
    if !force && std::fs::symlink_metadata(out).is_ok() {
        return Err(UsageError(format!(
            "{} already exists and may hold the only capabilities to its data: choose another -o, or give --force to replace it",
            out.display()
        ))
        .into());
    }
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = out
        .file_name()
        .context("the exNode path has no file name")?;
    let probe = dir.join(format!(
        ".{}.probe{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .with_context(|| {
            format!(
                "cannot write the exNode in {}; nothing was uploaded",
                dir.display()
            )
        })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Smallest block (allocation) size taken without `--small-blocks`.
const MIN_BLOCK: u64 = 64 << 10;

/// Refuses a block size that would turn a file into a flood of allocations
/// (`-b 10K` on an 800 MB file is 80,000 allocations).
fn check_block_size(
    bs: u64,
    allowed: bool,
    input: Option<&std::path::PathBuf>,
) -> anyhow::Result<()> {
    if bs >= MIN_BLOCK || allowed {
        return Ok(());
    }
    let count = input
        .and_then(|f| std::fs::metadata(f).ok())
        .map(|m| {
            format!(
                " ({} allocations for this file)",
                m.len().div_ceil(bs.max(1))
            )
        })
        .unwrap_or_default();
    Err(UsageError(format!(
        "block size {bs} bytes is below the 64 KiB minimum: every block is an allocation{count}. Use -b 10M (the default), or --small-blocks if you mean it"
    ))
    .into())
}

/// The error of a failed upload, after saying what it left on the depots:
/// allocations it could not release are recorded in `OUT.partial`.
fn failed(e: lors::Error, out: &std::path::Path) -> anyhow::Error {
    let lors::Error::Abandoned {
        cause,
        released,
        stranded,
    } = e
    else {
        return e.into();
    };
    if stranded.mappings.is_empty() {
        eprintln!(
            "lors: the {released} allocations already made were released; nothing is left on the depots"
        );
    } else {
        record_unreleased(
            &stranded,
            &format!("released {released} allocations already made; "),
            out,
        );
    }
    (*cause).into()
}

/// `OUT.partial`: where an upload that could not finish records what it
/// left on the depots.
fn partial_path(out: &std::path::Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// The metadata item that makes an `OUT.partial` a record an upload can
/// resume from, and its value: the input (size, modification time) and
/// the settings that decide the blocks.
const RESUME_META: &str = "lors_resume";

/// Per-mapping metadata of an allocation cut off mid-block: its bytes are
/// incomplete, it is recorded only so it can be freed.
const INCOMPLETE_META: &str = "lors_incomplete";

fn resume_identity(m: &std::fs::Metadata, block: u64, copies: usize, e2e: bool) -> String {
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    format!(
        "size={} mtime={}.{:09} block={block} copies={copies} e2e={e2e}",
        m.len(),
        mtime.as_secs(),
        mtime.subsec_nanos()
    )
}

/// The blocks an interrupted run of this same upload stored, from its
/// record in `partial`; none when there is no record. A record of another
/// input or other settings is refused rather than overwritten: it names
/// allocations nothing else does.
fn resumable(
    partial: &std::path::Path,
    identity: &str,
) -> anyhow::Result<Vec<lors_exnode::Mapping>> {
    if std::fs::symlink_metadata(partial).is_err() {
        return Ok(Vec::new());
    }
    let x = lors::xnd::load(partial)?;
    let recorded = match x.meta(RESUME_META) {
        Some(lors_exnode::Value::String(s)) => s.clone(),
        // A record of allocations a failed upload could not release.
        _ => return Ok(Vec::new()),
    };
    if recorded != identity {
        return Err(UsageError(format!(
            "{} records an interrupted upload of another version of this file or with other settings ({recorded}; now {identity}): run it with those again to resume, or free what it names with `lors trim --decrement --allow-holes {}` and delete it",
            partial.display(),
            depot_flags(&x, partial)
        ))
        .into());
    }
    Ok(x.mappings
        .into_iter()
        .filter(|m| !m.metadata.iter().any(|d| d.name == INCOMPLETE_META))
        .collect())
}

/// `--depot A --depot B … PATH`: the trim arguments that free every
/// allocation `x` (saved at `path`) names.
fn depot_flags(x: &lors_exnode::ExNode, path: &std::path::Path) -> String {
    let mut depots: Vec<String> = x.mappings.iter().filter_map(|m| m.depot()).collect();
    depots.sort();
    depots.dedup();
    let mut s: Vec<String> = depots.iter().map(|d| format!("--depot {d}")).collect();
    s.push(path.display().to_string());
    s.join(" ")
}

/// After an interrupt (or the failure of a resumed upload): records the
/// stored blocks (and allocations cut off that could not be released) in
/// `partial`, and says how to resume or free them.
fn record_partial(
    how: &str,
    stored: &lors_exnode::ExNode,
    released: usize,
    stranded: &lors_exnode::ExNode,
    identity: Option<&str>,
    partial: &std::path::Path,
) {
    crate::report::clear();
    let mut rec = stored.clone();
    for m in &stranded.mappings {
        let mut m = m.clone();
        m.metadata
            .push(lors_exnode::Metadata::string(INCOMPLETE_META, "1"));
        rec.mappings.push(m);
    }
    if let Some(id) = identity {
        rec.set_meta(lors_exnode::Metadata::string(RESUME_META, id));
    }
    let blocks: std::collections::BTreeSet<u64> =
        stored.mappings.iter().map(|m| m.exnode_offset).collect();
    let cut = if released > 0 {
        format!("; the {released} allocations of blocks in flight were released")
    } else {
        String::new()
    };
    if rec.mappings.is_empty() {
        let _ = std::fs::remove_file(partial);
        eprintln!("lors: upload {how}: nothing is left on the depots{cut}");
        return;
    }
    let resume = if identity.is_some() && !stored.mappings.is_empty() {
        "; run the same command again to resume"
    } else {
        ""
    };
    match lors::xnd::save(partial, &rec) {
        Ok(()) => eprintln!(
            "lors: upload {how}: {} stored blocks{} are recorded in {}{resume}, or free them with `lors trim --decrement --allow-holes {}`{cut}",
            blocks.len(),
            if stranded.mappings.is_empty() {
                String::new()
            } else {
                format!(
                    " and {} allocations that could not be released",
                    stranded.mappings.len()
                )
            },
            partial.display(),
            depot_flags(&rec, partial),
        ),
        Err(w) => eprintln!(
            "lors: upload {how}; what it stored could not be recorded ({w:#}): it expires with its lease{cut}"
        ),
    }
}

/// The outcome of an augment or route run under [`super::stop_on_signal`]:
/// interrupted, the exNode is unchanged, the replicas made were released
/// (those that could not be are recorded beside `out`), and the error
/// carries the signal's exit status.
pub(crate) fn copies_outcome<T>(
    what: &str,
    r: lors::Result<T>,
    out: &std::path::Path,
    signal: &std::sync::atomic::AtomicU8,
) -> anyhow::Result<T> {
    let Err(lors::Error::Interrupted {
        released, stranded, ..
    }) = r
    else {
        return Ok(r?);
    };
    crate::report::clear();
    let said = format!("{what} interrupted: the exNode is unchanged; ");
    if stranded.mappings.is_empty() {
        eprintln!("lors: {said}the {released} replicas made were released");
    } else {
        record_unreleased(
            &stranded,
            &format!("{said}released {released} replicas made; "),
            out,
        );
    }
    Err(super::interrupted(signal))
}

/// Writes the allocations in `stranded` (on depots that could not be
/// reached to release them) to `OUT.partial` and says how to free them.
pub(crate) fn record_unreleased(stranded: &lors_exnode::ExNode, said: &str, out: &std::path::Path) {
    let partial = partial_path(out);
    let mut depots: Vec<String> = stranded.mappings.iter().filter_map(|m| m.depot()).collect();
    depots.sort();
    depots.dedup();
    let n = stranded.mappings.len();
    match lors::xnd::save(&partial, stranded) {
        Ok(()) => eprintln!(
            "lors: {said}{n} on unreachable depots ({}) are named in {}: free them with `lors trim --decrement --allow-holes {} {}` once the depots are back (else they expire with their lease)",
            depots.join(", "),
            partial.display(),
            depots
                .iter()
                .map(|d| format!("--depot {d}"))
                .collect::<Vec<_>>()
                .join(" "),
            partial.display()
        ),
        Err(w) => eprintln!(
            "lors: {said}{n} on unreachable depots ({}) could not be recorded ({w:#}); they expire with their lease",
            depots.join(", ")
        ),
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let stdin = a.file.as_os_str() == "-";
    let output = a.output.clone().or_else(|| a.dest.clone());
    let uri = match (&output, a.auto_name) {
        (Some(o), _) => o.clone(),
        (None, true) if !stdin => {
            let mut s = a.file.clone().into_os_string();
            s.push(".xnd");
            ExnodeRef {
                path: PathBuf::from(s),
                ..ExnodeRef::default()
            }
        }
        _ => {
            return Err(UsageError(
                "say where the exNode goes: -o OUT.xnd (or -f to write FILE.xnd)".into(),
            )
            .into());
        }
    };
    let out = uri.path.clone();
    check_output(&out, a.force)?;
    let flags = Layer {
        copies: a.copies,
        block_size: a.block_size,
        threads: a.threads,
        ..a.lease.layer(a.place.layer(a.lbone.layer()))
    };
    let s = super::settings(&a.net, flags, Some(&uri))?;
    let e2e = chain(&a, &s.rc)?;
    let copies = s.copies.unwrap_or(3);
    let filename = if stdin {
        out.file_stem()
            .map_or_else(|| "stdin".into(), |s| s.to_string_lossy().into_owned())
    } else {
        a.file
            .file_name()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    };
    let rt = super::runtime(super::Threads::Many)?;
    let block_size = s.block_size.unwrap_or(10 << 20);
    check_block_size(block_size, a.small_blocks, (!stdin).then_some(&a.file))?;
    // Room for the e2e overhead on top of the block.
    let bytes = block_size + block_size / 64 + (64 << 10);
    let found = super::Placement {
        depots: &a.depots,
        settings: &s,
    }
    .find(&rt, copies, bytes, Vec::new())?;
    let (depots, directory) = (found.depots, found.directory);
    let opts = UploadOptions {
        depots,
        block_size,
        copies,
        threads: s.threads.unwrap_or(8),
        duration: s.duration,
        reliability: s.reliability,
        filename,
        e2e,
    };
    let cfg = s.client();
    let started = std::time::Instant::now();
    let pool = Arc::new(Pool::new(cfg).with_limit(a.bwlimit));
    let input = (!stdin)
        .then(|| {
            std::fs::File::open(&a.file).with_context(|| format!("opening {}", a.file.display()))
        })
        .transpose()?;
    let meta = input.as_ref().and_then(|f| f.metadata().ok());
    // What identifies this upload in a record for resuming it.
    let identity = meta
        .as_ref()
        .filter(|m| m.is_file())
        .map(|m| resume_identity(m, block_size, copies, opts.e2e.is_some()));
    let partial = partial_path(&out);
    let done = match &identity {
        Some(id) => resumable(&partial, id)?,
        None => Vec::new(),
    };
    if !done.is_empty() && !a.report.quiet {
        let blocks: std::collections::BTreeSet<u64> =
            done.iter().map(|m| m.exnode_offset).collect();
        eprintln!(
            "lors: resuming the upload recorded in {}: {} blocks already stored are not sent again",
            partial.display(),
            blocks.len()
        );
    }
    let progress = Reporter::new("upload", Unit::Bytes, &a.report, false);
    // SIGINT/SIGTERM: the upload stops, releases what it cut off and
    // records what it stored.
    let (stop_rx, signal) = super::stop_on_signal(&rt);
    let control = Control {
        stop: Some(stop_rx),
        done: done.clone(),
    };
    let x = rt.block_on(async {
        let pool = pool.clone();
        match input {
            None => upload(tokio::io::stdin(), None, &opts, pool, progress.clone()).await,
            Some(f) => {
                if meta.as_ref().is_some_and(std::fs::Metadata::is_file) {
                    upload_file_with(f, &opts, pool, progress.clone(), control).await
                } else {
                    // A pipe or device: read it as a stream.
                    let size = meta.as_ref().map(|m| m.len()).filter(|&n| n > 0);
                    let f = tokio::fs::File::from_std(f);
                    upload(f, size, &opts, pool, progress.clone()).await
                }
            }
        }
    });
    progress.finish();
    let x = match x {
        Ok(up) => {
            if !up.unreleased.mappings.is_empty() {
                record_unreleased(
                    &up.unreleased,
                    "the upload succeeded, but of the allocations of attempts that failed, ",
                    &out,
                );
            }
            up.exnode
        }
        Err(lors::Error::Interrupted {
            stored,
            released,
            stranded,
        }) => {
            let how = "interrupted";
            record_partial(
                how,
                &stored,
                released,
                &stranded,
                identity.as_deref(),
                &partial,
            );
            return Err(super::interrupted(&signal));
        }
        // A resumed upload that fails keeps the record of what it resumed
        // from (those allocations are named nowhere else).
        Err(lors::Error::Abandoned {
            cause,
            released,
            stranded,
        }) if !done.is_empty() => {
            let kept = lors_exnode::ExNode {
                mappings: done,
                ..Default::default()
            };
            record_partial(
                "failed",
                &kept,
                released,
                &stranded,
                identity.as_deref(),
                &partial,
            );
            return Err((*cause).into());
        }
        Err(e) => return Err(failed(e, &out)),
    };
    if let Err(e) = lors::xnd::save(&out, &x) {
        // Without its exNode nobody can reach the data: free it now.
        let kept = rt.block_on(pool.release_all(x.mappings.clone())).len();
        let freed = x.mappings.len() - kept;
        return Err(anyhow::Error::new(e).context(format!(
            "the upload finished but its exNode could not be written; {freed} of {} allocations were released",
            x.mappings.len()
        )));
    }
    if !done.is_empty() {
        // Its blocks are in the exNode now.
        let _ = std::fs::remove_file(&partial);
    }
    let mut per_depot: std::collections::BTreeMap<String, u64> = Default::default();
    for m in &x.mappings {
        if let Some(d) = m.depot() {
            *per_depot.entry(d).or_default() += m.alloc_length;
        }
    }
    let per_depot: Vec<(String, u64)> = per_depot.into_iter().collect();
    rt.block_on(lors::directory::report_rates(
        directory.as_ref(),
        &per_depot,
        started.elapsed(),
    ));
    let size = x.logical_size();
    let secs = started.elapsed().as_secs_f64();
    if progress.is_json() {
        let mib_per_s = size as f64 / 1048576.0 / secs.max(1e-9);
        progress.done(&Report {
            exnode: &out.display().to_string(),
            size,
            mappings: x.mappings.len(),
            copies,
            seconds: super::json_secs(started.elapsed()),
            mib_per_s: (mib_per_s * 10.0).round() / 10.0,
        });
    } else if !a.report.quiet {
        eprintln!(
            "lors: uploaded {} bytes as {} mappings ({} copies) in {:.2}s, {:.1} MiB/s -> {}",
            size,
            x.mappings.len(),
            copies,
            secs,
            size as f64 / 1048576.0 / secs.max(1e-9),
            out.display()
        );
    }
    Ok(())
}

/// `--json`: what an upload made.
#[derive(serde::Serialize)]
struct Report<'a> {
    exnode: &'a str,
    size: u64,
    mappings: usize,
    copies: usize,
    seconds: f64,
    mib_per_s: f64,
}
