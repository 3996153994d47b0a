//! What `lors upload` checks and derives from its flags before anything
//! is stored: the end-to-end encoding, the output, the block size.

use anyhow::Context as _;
use lors::xndrc::Xndrc;
use lors_exnode::functions::{Chain, Codec, LegacyChain, LegacyKind, Step};

use super::Args;
use crate::UsageError;

/// The end-to-end encoding the flags ask for.
pub(super) fn chain(a: &Args, rc: &Xndrc) -> anyhow::Result<Option<Codec>> {
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
pub(super) fn check_block_size(
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
