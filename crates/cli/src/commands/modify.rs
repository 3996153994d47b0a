//! `lors modify`: strip capabilities for sharing.

use lors::uri::ExnodeRef;

use crate::exit::UsageError;

/// Write a copy of an exNode without some capabilities, to share it safely.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  lors modify -w --strip-manage -o share.xnd run42.xnd   # read-only copy to hand out")]
pub struct Args {
    /// The exNode.
    #[arg(value_parser = super::exnode_arg, value_name = "FILE.xnd|lors://…")]
    exnode: ExnodeRef,
    /// Remove read capabilities.
    #[arg(short = 'r', long = "strip-read")]
    read: bool,
    /// Remove write capabilities.
    #[arg(short = 'w', long = "strip-write")]
    write: bool,
    /// Remove manage capabilities.
    #[arg(long = "strip-manage")]
    manage: bool,
    /// Where to write the modified copy.
    #[arg(short, long, value_name = "NEW.xnd", required = true, value_parser = super::exnode_arg)]
    output: ExnodeRef,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if !(a.read || a.write || a.manage) {
        return Err(UsageError("say which capabilities to strip: -r, -w and/or -m".into()).into());
    }
    let x = lors::xnd::load(&a.exnode.path)?;
    let y = lors::manage::modify(&x, a.read, a.write, a.manage);
    Ok(lors::xnd::save(&a.output.path, &y)?)
}
