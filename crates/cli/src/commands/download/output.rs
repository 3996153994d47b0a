//! Where `lors download` writes: the output a file's data goes to.

use std::path::PathBuf;

use lors::uri::ExnodeRef;

use super::Args;
use crate::exit::UsageError;

/// Where the data goes: `-o` (a directory takes the recorded name), or
/// the recorded name with `-f`. A recorded name is the exNode's word, not
/// the user's: it never replaces a file that is there (a `run42.xnd`
/// holding the only copy of its capabilities, a `.bashrc`); and no output
/// is ever the exNode being read.
pub(super) fn output(
    a: &Args,
    x: &lors_exnode::ExNode,
    exnode: &ExnodeRef,
    dest: Option<PathBuf>,
) -> anyhow::Result<PathBuf> {
    let recorded = || -> Result<PathBuf, UsageError> {
        x.filename()
            .filter(|f| !f.is_empty() && !f.contains('/') && *f != "." && *f != "..")
            .map(PathBuf::from)
            .ok_or_else(|| UsageError("the exNode records no usable file name; use -o FILE".into()))
    };
    let output = a.output.clone().or(dest);
    let (out, named_by_exnode) = match (&output, a.auto_name) {
        (Some(o), _)
            if o.as_os_str() != "-"
                && (o.is_dir() || o.as_os_str().to_string_lossy().ends_with('/')) =>
        {
            if !o.is_dir() {
                return Err(UsageError(format!("{} is not a directory", o.display())).into());
            }
            (o.join(recorded()?), true)
        }
        (Some(o), _) => (o.clone(), false),
        (None, true) => (recorded()?, true),
        (None, false) => {
            return Err(UsageError(
                "say where the data goes: -o OUT (or -o - for stdout, -f for the recorded name)"
                    .into(),
            )
            .into());
        }
    };
    if named_by_exnode && !a.skip_existing && std::fs::symlink_metadata(&out).is_ok() {
        return Err(UsageError(format!(
            "{} is there already, and the name comes from the exNode: it is not replaced. Name the output with -o {} to replace it, or -o another path",
            out.display(),
            out.display()
        ))
        .into());
    }
    if out.as_os_str() != "-" && same_file(&out, &exnode.path) {
        return Err(UsageError(format!(
            "{} is the exNode being read: writing the data there would destroy it; name another output with -o",
            out.display()
        ))
        .into());
    }
    Ok(out)
}

/// Whether `a` and `b` name one file (both there, same device and inode).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}
