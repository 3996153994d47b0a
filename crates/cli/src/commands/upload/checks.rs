//! What `lors upload` checks and derives from its flags before anything
//! is stored: the end-to-end encoding, the output, the block size.

use std::path::PathBuf;

use lors::uri::ExnodeRef;
use lors::xndrc::Xndrc;
use lors_exnode::functions::Codec;

use super::Args;
use crate::exit::UsageError;

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

/// Where the exNode goes: `-o`, or `FILE.xnd` with `-f`.
pub(super) fn output(a: &Args) -> anyhow::Result<ExnodeRef> {
    let stdin = a.file.as_os_str() == "-";
    if !stdin && a.file.is_dir() {
        return Err(UsageError(format!(
            "{} is a directory: lors upload stores one file per exNode. For a tree, copy it into a mount (`lors mount XNDS MNT; cp -r {} MNT/`), or upload each file (`for f in {}/*; do lors upload -o xnds/\"${{f##*/}}\".xnd \"$f\"; done`)",
            a.file.display(),
            a.file.display(),
            a.file.display()
        ))
        .into());
    }
    match (a.output.clone().or_else(|| a.dest.clone()), a.auto_name) {
        // A directory: the exNode goes in it, named after the file.
        (Some(mut o), _) if o.path.is_dir() && !stdin => {
            let mut name = a.file.file_name().unwrap_or_default().to_owned();
            name.push(".xnd");
            o.path = o.path.join(name);
            Ok(o)
        }
        (Some(o), _) => Ok(o),
        (None, true) if !stdin => {
            let mut s = a.file.clone().into_os_string();
            s.push(".xnd");
            Ok(ExnodeRef {
                path: PathBuf::from(s),
                ..ExnodeRef::default()
            })
        }
        _ => Err(UsageError(
            "say where the exNode goes: -o OUT.xnd (or -f to write FILE.xnd)".into(),
        )
        .into()),
    }
}
