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

/// A file to upload and where its exNode goes.
pub(super) struct Target {
    pub(super) file: PathBuf,
    pub(super) out: ExnodeRef,
}

impl Target {
    /// The input is standard input.
    pub(super) fn stdin(&self) -> bool {
        self.file.as_os_str() == "-"
    }
}

/// The files to upload and their exNodes: `FILE OUT.xnd`, `-o OUT.xnd
/// FILE`, `-f FILE...` (each `FILE.xnd`) or `-o DIR FILE...`. Refused
/// before anything is stored: a directory, standard input among other
/// files, two files whose exNodes would be one path.
pub(super) fn targets(a: &Args) -> anyhow::Result<Vec<Target>> {
    let mut files = a.files.clone();
    let mut dest = a.output.clone();
    if files.len() == 2 && dest.is_none() && !a.auto_name {
        let d = files.pop().unwrap_or_default();
        dest = Some(legacy_dest(&files[0], &d)?);
    } else if files.len() == 2
        && files[1].as_os_str() != "-"
        && files[1].symlink_metadata().is_err()
    {
        return Err(UsageError(format!(
            "the exNode {} cannot be used with {}: name it once (lors upload FILE OUT.xnd, or -o OUT.xnd FILE)",
            files[1].display(),
            if a.auto_name { "-f" } else { "-o" }
        ))
        .into());
    }
    if files.len() > 1 {
        if files.iter().any(|f| f.as_os_str() == "-") {
            return Err(UsageError(
                "standard input (-) is uploaded on its own, not among other files".into(),
            )
            .into());
        }
        match &dest {
            Some(o) if !o.path.is_dir() => {
                return Err(UsageError(format!(
                    "{} files: -o names the directory their exNodes go in (each FILE.xnd), and {} is not one",
                    files.len(),
                    o.path.display()
                ))
                .into());
            }
            None if !a.auto_name => {
                return Err(UsageError(format!(
                    "say where the exNodes of {} files go: -f (FILE.xnd beside each) or -o DIR",
                    files.len()
                ))
                .into());
            }
            _ => {}
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        let t = target(file, dest.clone(), a.auto_name)?;
        if !seen.insert(t.out.path.clone()) {
            return Err(UsageError(format!(
                "two files would have the same exNode {}: upload them into different directories (-o DIR)",
                t.out.path.display()
            ))
            .into());
        }
        out.push(t);
    }
    Ok(out)
}

/// The second word of `lors upload FILE OUT.xnd`. A file that is there
/// and is neither named `.xnd` nor an exNode was meant as a second file
/// to upload, not as an exNode to replace.
fn legacy_dest(file: &std::path::Path, d: &std::path::Path) -> anyhow::Result<ExnodeRef> {
    let xnd_named = d.extension().is_some_and(|e| e == "xnd");
    if !xnd_named && d.is_file() && lors::xnd::load(d).is_err() {
        return Err(UsageError(format!(
            "{} is a file, not an exNode: to upload it beside {}, add -f (each FILE.xnd) or -o DIR",
            d.display(),
            file.display()
        ))
        .into());
    }
    super::super::exnode_arg(&d.to_string_lossy()).map_err(|e| UsageError(e).into())
}

/// Where `file`'s exNode goes: `-o` (into it when a directory), or
/// `FILE.xnd` with `-f`.
fn target(file: PathBuf, o: Option<ExnodeRef>, auto_name: bool) -> anyhow::Result<Target> {
    let stdin = file.as_os_str() == "-";
    if !stdin && file.is_dir() {
        return Err(UsageError(format!(
            "{} is a directory: lors upload stores one file per exNode. Upload the files in it (`lors upload -o xnds/ {}/*`), or copy the tree into a mount (`lors mount XNDS MNT; cp -r {} MNT/`)",
            file.display(),
            file.display(),
            file.display()
        ))
        .into());
    }
    let out = match (o, auto_name) {
        // A directory: the exNode goes in it, named after the file.
        (Some(mut o), _) if o.path.is_dir() && !stdin => {
            let mut name = file.file_name().unwrap_or_default().to_owned();
            name.push(".xnd");
            o.path = o.path.join(name);
            o
        }
        (Some(o), _) => o,
        (None, true) if !stdin => {
            let mut s = file.clone().into_os_string();
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
    Ok(Target { file, out })
}
