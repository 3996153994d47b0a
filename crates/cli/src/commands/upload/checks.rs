//! What `lors upload` checks and derives from its flags before anything
//! is stored: the end-to-end encoding, the output, the block size.

use anyhow::Context as _;
use lors::xndrc::Xndrc;
use lors_exnode::functions::Codec;

use super::Args;
use crate::UsageError;

/// The end-to-end encoding the flags ask for.
pub(super) fn chain(a: &Args, rc: &Xndrc) -> anyhow::Result<Option<Codec>> {
    let e2e = lors::upload::E2e {
        none: a.no_e2e,
        checksum: a.checksum.clone(),
        compress: a.compress,
        zlib: a.zlib,
        encrypt: a.encrypt.clone(),
        block_size: a.e2e_block_size,
    };
    e2e.codec(rc).map_err(|e| UsageError(e).into())
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
