//! `lors mount`: a directory of exNodes as files (FUSE).

use std::path::PathBuf;

use anyhow::Context as _;
use lors::settings::Layer;

use super::{block_size_arg, nonzero_block_size_arg};
use crate::exit::UsageError;

/// Serve a directory of exNodes as ordinary files: NAME.xnd appears as NAME.
#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  mkdir -p /mnt/runs && lors mount runs/ /mnt/runs &     # runs/*.xnd as /mnt/runs/*
  ffmpeg -i /mnt/runs/video.mp4 -f null -                # reads with read-ahead
  cp results.tar /mnt/runs/                              # stores it, writes runs/results.tar.xnd
  umount /mnt/runs                                       # (or Ctrl-C) stores open files, unmounts
  lors mount --allow-other --file-mode 0644 --uid www-data runs/ /srv/runs &   # for nginx

Reads fetch blocks from the best replicas with read-ahead for sequential
readers; writes are stored in blocks of the write buffer (-B) on the depots
as it fills, and each file's exNode is written when it is closed. Errors
reach programs as errno: EIO (no replica of a block readable), ENOSPC (no
depot takes the data), EROFS (an exNode without write capabilities).")]
pub struct Args {
    /// Directory of .xnd files (new files' exNodes are written here).
    dir: PathBuf,
    /// Where to mount it (an empty directory).
    mountpoint: PathBuf,
    /// Depot HOST or HOST:PORT for new data (repeat, or a comma list) [default:
    /// ask the L-Bone, else the DEPOT lines of ~/.xndrc].
    #[arg(
        long = "depot",
        value_name = "HOST[:PORT]",
        value_delimiter = ',',
        value_parser = super::depot_arg
    )]
    depots: Vec<String>,
    #[command(flatten)]
    lbone: super::LboneOpts,
    /// Copies of each new block, on distinct depots [default: LORS_COPIES,
    /// else COPIES in ~/.xndrc, else 1].
    #[arg(short, long)]
    copies: Option<usize>,
    /// Block (allocation) size of new data [default: LORS_BLOCKSIZE, else
    /// DATA_BLOCKSIZE, else the write buffer size].
    #[arg(short = 'b', long = "block-size", value_parser = nonzero_block_size_arg)]
    block_size: Option<u64>,
    /// Write buffer per open file: written data is stored in pieces of
    /// this size ("IBP Deployment Tests and Integration with DiDaS Project"'s libxio used 10 MB).
    #[arg(short = 'B', long = "buffer", value_parser = block_size_arg, default_value = "10M")]
    buffer: u64,
    /// Read cache per open file.
    #[arg(long = "cache", value_parser = block_size_arg, default_value = "64M")]
    cache: u64,
    #[command(flatten)]
    lease: super::LeaseOpts,
    #[command(flatten)]
    net: super::NetOpts,
    /// Let other users use the mount (needs user_allow_other in
    /// /etc/fuse.conf unless run as root).
    #[arg(long)]
    allow_other: bool,
    /// Answer reads from memory instead of splicing the read-ahead's
    /// pipes into the kernel: one more copy of every byte. For comparison,
    /// or a kernel that refuses spliced replies.
    #[arg(long)]
    copy_reads: bool,
    /// Permission bits (octal) of files that record none — those written
    /// by lors upload, augment or route, or copied in — e.g. 0644 to serve
    /// them [default: the .xnd's own, owner-only]. Files created or
    /// chmod'ed through a mount keep theirs.
    #[arg(long, value_name = "MODE", value_parser = mode_arg)]
    file_mode: Option<u32>,
    /// Owner (name or number) every file shows, e.g. www-data for a web
    /// server, with --allow-other [default: the .xnd's].
    #[arg(long, value_name = "USER")]
    uid: Option<String>,
    /// Group (name or number) every file shows [default: the .xnd's].
    #[arg(long, value_name = "GROUP")]
    gid: Option<String>,
}

fn mode_arg(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not a mode: give octal permission bits, e.g. 0644"))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    // Named plainly, before FUSE is tried: its error would blame FUSE.
    for (what, dir) in [("exNode directory", &a.dir), ("mount point", &a.mountpoint)] {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(
                    UsageError(format!("the {what} {} is not a directory", dir.display())).into(),
                );
            }
            Err(e) => {
                return Err(UsageError(format!("the {what} {}: {e}", dir.display())).into());
            }
        }
    }
    let flags = Layer {
        copies: a.copies,
        block_size: a.block_size,
        ..a.lease.layer(a.lbone.layer())
    };
    let s = super::settings(&a.net, flags, None)?;
    let mut open = lors::xio::OpenOptions::new();
    open.buffer(usize::try_from(a.buffer).unwrap_or(usize::MAX))
        .cache(a.cache)
        .depots(a.depots)
        .settings(s);
    let id = |v: &Option<String>, of: fn(&str) -> std::io::Result<u32>| {
        v.as_deref()
            .map(of)
            .transpose()
            .map_err(|e| UsageError(e.to_string()))
    };
    let opts = lors_fuse::Options {
        open,
        allow_other: a.allow_other,
        copy_reads: a.copy_reads,
        file_mode: a.file_mode,
        uid: id(&a.uid, lors_fuse::uid_of)?,
        gid: id(&a.gid, lors_fuse::gid_of)?,
    };
    lors_fuse::run(&a.dir, &a.mountpoint, &opts, |m| {
        // On standard output, so a script can wait for it.
        println!(
            "lors mount: {} on {} (stop with `umount {}` or Ctrl-C)",
            a.dir.display(),
            m.display(),
            m.display()
        );
    })
    .with_context(|| {
        format!(
            "mounting {} on {} (needs /dev/fuse, and root or fusermount3 from the fuse3 package)",
            a.dir.display(),
            a.mountpoint.display()
        )
    })?;
    eprintln!("lors mount: {} unmounted", a.mountpoint.display());
    Ok(())
}
