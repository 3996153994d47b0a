//! The ceiling of FUSE on this machine: one file of SIZE bytes served from
//! memory (no depot, no network, no copy on our side), so a reader through
//! it measures what the kernel's FUSE path alone allows. `bench/xio.py`
//! reads it beside `lors mount`.
//!
//!     cargo run --release -p lors-fuse --example ceiling -- MOUNTPOINT SIZE
//!     dd if=MOUNTPOINT/file of=/dev/null bs=4k; umount MOUNTPOINT

use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request,
};

struct Ceiling {
    size: u64,
    data: Vec<u8>,
}

impl Ceiling {
    fn attr(&self, ino: u64) -> FileAttr {
        let dir = ino == 1;
        FileAttr {
            ino: INodeNo(ino),
            size: if dir { 0 } else { self.size },
            blocks: self.size.div_ceil(512),
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind: if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if dir { 0o755 } else { 0o444 },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        }
    }
}

impl Filesystem for Ceiling {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // As lors mount asks.
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == 1 && name == "file" {
            reply.entry(&Duration::from_secs(60), &self.attr(2), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&Duration::from_secs(60), &self.attr(ino.0));
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let n = u64::from(size).min(self.size.saturating_sub(offset)) as usize;
        // Any window of the buffer will do: start in its first half, so a
        // request (never near 16 MiB) always fits.
        let at = (offset % (self.data.len() as u64 / 2)) as usize;
        let n = n.min(self.data.len() - at);
        reply.data(&self.data[at..at + n]);
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mnt), Some(size)) = (args.get(1), args.get(2).and_then(|s| s.parse().ok())) else {
        eprintln!("usage: ceiling MOUNTPOINT SIZE_BYTES");
        std::process::exit(2);
    };
    let fs = Ceiling {
        size,
        // Larger than any request the kernel sends.
        data: vec![7u8; 32 << 20],
    };
    let mut cfg = Config::default();
    cfg.n_threads = Some(4);
    // As lors mount: the same threads, the same kernel settings.
    let session = fuser::spawn_mount(fs, mnt, &cfg)?;
    if let Err(e) =
        lors_fuse::raise_readahead(std::path::Path::new(mnt), lors_fuse::KERNEL_READAHEAD_KB)
    {
        eprintln!("kernel read-ahead left at its default: {e}");
    }
    session.join()
}
