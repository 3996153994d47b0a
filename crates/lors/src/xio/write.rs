//! The write pipeline: writes gather in a buffer, a full buffer is stored
//! by [`crate::upload`] while the next fills (at most [`MAX_INFLIGHT`] at
//! once), and the stored blocks' mappings replace what they overwrite
//! ([`super::ranges`]).

use std::io::{self, ErrorKind};
use std::sync::Arc;
use std::time::SystemTime;

use lors_exnode::Mapping;
use lors_exnode::model::Hole;
use tokio::task::JoinHandle;

use super::errno::lors_error;
use super::{DEFAULT_BUFFER, File, ranges, runtime};
use crate::NoProgress;
use crate::upload::{UploadOptions, Uploaded, upload};

/// Buffers being stored at once by one writer: memory is at most this many
/// buffers plus the one filling.
const MAX_INFLIGHT: usize = 4;

/// The largest file xio makes or grows to: 2^53 bytes (8 PiB), the
/// largest offset a reader holding exNode offsets in doubles reads
/// exactly. Past it, `EFBIG`, as a local file system says past its own.
pub const MAX_FILE_SIZE: u64 = 1 << 53;

fn efbig() -> io::Error {
    io::Error::from_raw_os_error(libc::EFBIG)
}

/// A buffer being stored: `len` bytes at `off`.
pub(super) struct Flush {
    pub(super) off: u64,
    pub(super) len: u64,
    pub(super) task: JoinHandle<crate::Result<Uploaded>>,
}

impl File {
    /// Changes the logical size (`ftruncate(2)`): shrinking drops mappings
    /// past the end (an encoded block cut in two is stored again up to the
    /// new end); growing appends zeros. The position does not move.
    pub fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.check_writable()?;
        if len > MAX_FILE_SIZE {
            return Err(efbig());
        }
        self.drain()?;
        if len > self.size {
            self.grow(len);
            self.touch();
            return Ok(());
        }
        if len == self.size {
            // truncate(2) to the same size still marks the file changed.
            self.touch();
            return Ok(());
        }
        // Encoded mappings cannot be cut: keep the bytes below `len` of each
        // one cut through, to store again.
        let mut saved = Vec::new();
        for (a, b) in ranges::encoded_heads(&self.x.mappings, len) {
            let mut v = vec![0u8; (b - a) as usize];
            self.read_exact_at(a, &mut v)?;
            saved.push((a, v));
        }
        let dropped = ranges::truncate(&mut self.x.mappings, len);
        self.x.fill_holes(len, u64::MAX);
        self.retire(dropped);
        self.size = len;
        self.touch();
        for (a, v) in saved {
            self.put(a, &v)?;
        }
        self.drain()
    }

    /// Old mappings out of the exNode: their allocations go once the exNode
    /// is saved, unless a remaining mapping still reads them.
    fn retire(&mut self, dropped: Vec<Mapping>) {
        let unused = ranges::unused(&self.x.mappings, dropped);
        self.to_release.extend(unused);
    }

    /// The L-Bone of the settings, resolved once for both the depots new
    /// blocks go to and the read-ahead's last-resort list.
    pub(super) fn directory(&mut self) -> Option<lors_lbone::client::Directory> {
        let s = &self.settings;
        self.lbone
            .get_or_insert_with(|| runtime().block_on(s.directory()))
            .clone()
    }

    /// Where new blocks go: given, else found as the tools find them.
    fn depots(&mut self) -> io::Result<Vec<String>> {
        if let Some(d) = &self.depots {
            return Ok(d.clone());
        }
        let named = self.directory();
        let s = &self.settings;
        let copies = self.copies;
        let bytes = s.block_size.unwrap_or(DEFAULT_BUFFER as u64);
        let found = runtime()
            .block_on(s.find_depots(&[], named, copies, bytes, Vec::new()))
            .map_err(|e| {
                let e = io::Error::new(
                    ErrorKind::StorageFull,
                    format!("no depots for the {copies} copies of each block this file keeps: {e}"),
                );
                tracing::error!(file = %self.path.display(), "write refused: {e}");
                e
            })?;
        self.depots = Some(found.depots.clone());
        Ok(found.depots)
    }

    /// Starts storing the buffer.
    fn submit(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut data = std::mem::take(&mut self.buf);
        let mut off = self.buf_off;
        self.widen(&mut off, &mut data)?;
        while self.inflight.len() >= MAX_INFLIGHT {
            self.reap()?;
        }
        let mut depots = self.depots()?;
        // Each buffer starts its choice at another depot, as an upload's
        // blocks do: with more depots than copies, every depot gets its
        // share (each store picks the least busy, the first on a tie).
        if !depots.is_empty() {
            let turn = (off / self.buf_cap.max(1) as u64) as usize % depots.len();
            depots.rotate_left(turn);
        }
        // The settings' upload, but blocks of one buffer, the file's own
        // copies, no stripes, and nothing fitted to the distance: a buffer
        // is one block.
        let opts = UploadOptions {
            block_size: self.settings.block_size.unwrap_or(DEFAULT_BUFFER as u64),
            copies: self.copies,
            erasure: None,
            sparse: false,
            auto_threads: false,
            auto_block_size: false,
            ..UploadOptions::from_settings(&self.settings, depots, String::new(), self.e2e.clone())
        };
        let pool = self.pool.clone();
        let len = data.len() as u64;
        let task = runtime().spawn(async move {
            let r = upload(&data[..], Some(len), &opts, pool, Arc::new(NoProgress)).await;
            drop(data);
            r
        });
        self.inflight.push_back(Flush { off, len, task });
        self.buf = Vec::with_capacity(self.buf_cap);
        Ok(())
    }

    /// Grows `[off, off+len)` over every encoded mapping it cuts through
    /// (a write re-encodes and stores each of those whole), reading the
    /// bytes it adds.
    fn widen(&mut self, off: &mut u64, data: &mut Vec<u8>) -> io::Result<()> {
        while let Some(cut) = ranges::encoded_cut(&self.x.mappings, *off, *off + data.len() as u64)
        {
            // Earlier stores may hold those bytes: they must be in `x` first.
            self.reap_all()?;
            ranges::cover(cut, off, data, |at, out| self.read_exact_at(at, out))?;
        }
        Ok(())
    }

    /// Waits for the oldest store and puts its mappings in the exNode.
    fn reap(&mut self) -> io::Result<()> {
        let Some(f) = self.inflight.pop_front() else {
            return Ok(());
        };
        let done = runtime()
            .block_on(f.task)
            .map_err(|e| io::Error::other(format!("storing: {e}")))
            .and_then(|r| r.map_err(lors_error));
        match done {
            Ok(up) => {
                if !up.unreleased.mappings.is_empty() {
                    tracing::warn!(
                        count = up.unreleased.mappings.len(),
                        "allocations of failed attempts could not be released; they expire with their lease"
                    );
                }
                let mut new = up.exnode.mappings;
                for m in &mut new {
                    m.exnode_offset += f.off;
                }
                self.unsaved.extend(new.iter().cloned());
                self.merge(f.off, f.len, new);
                Ok(())
            }
            Err(e) => {
                // Never fewer copies than the file keeps: the write fails,
                // and says why where a mount's user looks.
                tracing::error!(
                    file = %self.path.display(),
                    copies = self.copies,
                    "write failed: {e}"
                );
                self.broken.get_or_insert_with(|| e.to_string());
                Err(e)
            }
        }
    }

    fn reap_all(&mut self) -> io::Result<()> {
        let mut first = None;
        while !self.inflight.is_empty() {
            if let Err(e) = self.reap() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Stores the buffer and waits for every store.
    pub(super) fn drain(&mut self) -> io::Result<()> {
        self.check_broken()?;
        self.submit()?;
        self.reap_all()?;
        self.check_broken()
    }

    fn check_broken(&self) -> io::Result<()> {
        match &self.broken {
            Some(why) => Err(io::Error::other(format!(
                "{}: data written since the last sync could not be stored ({why}); the saved exNode is unchanged",
                self.path.display()
            ))),
            None => Ok(()),
        }
    }

    /// New mappings for `[off, off+len)` supersede what was there.
    fn merge(&mut self, off: u64, len: u64, new: Vec<Mapping>) {
        let dropped = ranges::merge(&mut self.x.mappings, off, len, new);
        self.x.fill_holes(off, off.saturating_add(len));
        self.retire(dropped);
        self.changed();
    }

    /// Writes at the position (at the end with `append`).
    pub(super) fn write_here(&mut self, data: &[u8]) -> io::Result<usize> {
        self.check_writable()?;
        self.check_broken()?;
        if self.append {
            self.pos = self.size;
        }
        self.put(self.pos, data)?;
        self.pos += data.len() as u64;
        Ok(data.len())
    }

    /// Buffers `data` for `off`: a buffer that is full, or that `off` does
    /// not continue, is stored first. A hole before `off` is stored as the
    /// zeros POSIX reads there.
    fn put(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > MAX_FILE_SIZE)
        {
            return Err(efbig());
        }
        if off > self.size {
            self.grow(off);
        }
        if !self.buf.is_empty() && off != self.buf_off + self.buf.len() as u64 {
            self.submit()?;
        }
        if self.buf.is_empty() {
            self.buf_off = off;
        }
        let mut rest = data;
        while !rest.is_empty() {
            let k = (self.buf_cap - self.buf.len()).min(rest.len());
            self.buf.extend_from_slice(&rest[..k]);
            rest = &rest[k..];
            if self.buf.len() >= self.buf_cap {
                let next = self.buf_off + self.buf.len() as u64;
                self.submit()?;
                self.buf_off = next;
            }
        }
        self.size = self.size.max(off + data.len() as u64);
        self.dirty = true;
        self.modified = Some(SystemTime::now());
        self.times_set = false;
        Ok(())
    }

    /// Grows the file to `len` (past its size) with a hole: zeros that
    /// reads give and no depot stores, as a local file system's sparse
    /// files (`truncate -s 1G` costs nothing). Buffered and in-flight
    /// writes all end at or before the size, so the hole starts past them.
    fn grow(&mut self, len: u64) {
        let start = self.size;
        match self.x.holes.last_mut() {
            Some(h) if h.end() == start => h.length += len - start,
            _ => self.x.holes.push(Hole {
                offset: start,
                length: len - start,
            }),
        }
        self.size = len;
        // Readers must know of the hole: the bytes before a write past the
        // end are zeros, not the end of the file.
        self.changed();
    }
}
