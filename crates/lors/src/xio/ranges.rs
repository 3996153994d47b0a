//! Range surgery on an exNode's mappings, pure: what a write, an overwrite
//! or a truncation does to the list of mappings, with no depot in sight.
//! [`super::File`] does the I/O around these; the tests below hold them to
//! a `Vec<u8>` model.
//!
//! A raw mapping can be cut anywhere (its allocation's bytes are the
//! file's). An encoded one (an end-to-end function: checksums, compression,
//! encryption) cannot: a write or truncation that cuts through it stores
//! its surviving bytes again, whole.

use std::io;

use lors_exnode::Mapping;

/// The first encoded mapping `[off, end)` cuts through (covers in part),
/// as its range.
pub(super) fn encoded_cut(mappings: &[Mapping], off: u64, end: u64) -> Option<(u64, u64)> {
    mappings
        .iter()
        .filter(|m| m.function.is_some())
        .filter(|m| m.exnode_offset < end && m.logical_end() > off)
        .find(|m| m.exnode_offset < off || m.logical_end() > end)
        .map(|m| (m.exnode_offset, m.logical_end()))
}

/// Grows the write of `data` at `off` to cover `cut` whole, reading the
/// bytes it adds with `read` (offset, buffer to fill).
pub(super) fn cover(
    (a, b): (u64, u64),
    off: &mut u64,
    data: &mut Vec<u8>,
    mut read: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    if a < *off {
        let mut head = vec![0u8; (*off - a) as usize];
        read(a, &mut head)?;
        head.append(data);
        *data = head;
        *off = a;
    }
    let end = *off + data.len() as u64;
    if b > end {
        let mut tail = vec![0u8; (b - end) as usize];
        read(end, &mut tail)?;
        data.extend_from_slice(&tail);
    }
    Ok(())
}

/// New mappings for `[off, off+len)` supersede what was there: mappings
/// inside go (returned), raw ones across an edge keep their parts outside
/// over the same allocation. The list stays sorted by offset.
///
/// Encoded mappings must not be cut: [`encoded_cut`] and [`cover`] widen a
/// write first.
pub(super) fn merge(
    mappings: &mut Vec<Mapping>,
    off: u64,
    len: u64,
    new: Vec<Mapping>,
) -> Vec<Mapping> {
    let end = off + len;
    let mut kept = Vec::with_capacity(mappings.len() + new.len());
    let mut dropped = Vec::new();
    for m in std::mem::take(mappings) {
        let (ms, me) = (m.exnode_offset, m.logical_end());
        if me <= off || ms >= end {
            kept.push(m);
        } else if ms >= off && me <= end {
            dropped.push(m);
        } else {
            if ms < off {
                let mut l = m.clone();
                l.logical_length = off - ms;
                kept.push(l);
            }
            if me > end {
                let mut r = m;
                r.alloc_offset += end - ms;
                r.exnode_offset = end;
                r.logical_length = me - end;
                kept.push(r);
            }
        }
    }
    kept.extend(new);
    kept.sort_by_key(|m| m.exnode_offset);
    *mappings = kept;
    dropped
}

/// The ranges `[start, len)` of the encoded mappings a truncation to `len`
/// cuts through: their bytes below `len` are to be read first and stored
/// again after [`truncate`].
pub(super) fn encoded_heads(mappings: &[Mapping], len: u64) -> Vec<(u64, u64)> {
    let mut heads: Vec<(u64, u64)> = mappings
        .iter()
        .filter(|m| m.function.is_some() && m.exnode_offset < len && m.logical_end() > len)
        .map(|m| (m.exnode_offset, len))
        .collect();
    heads.sort_unstable();
    heads.dedup();
    heads
}

/// Cuts the mappings at `len`: raw ones across it are shortened, the rest
/// past it (and encoded ones across it) go, returned.
pub(super) fn truncate(mappings: &mut Vec<Mapping>, len: u64) -> Vec<Mapping> {
    let mut dropped = Vec::new();
    mappings.retain_mut(|m| {
        if m.logical_end() <= len {
            true
        } else if m.exnode_offset < len && m.function.is_none() {
            m.logical_length = len - m.exnode_offset;
            true
        } else {
            dropped.push(m.clone());
            false
        }
    });
    dropped
}

/// Of the `dropped` mappings, those whose allocation no mapping left reads:
/// to release once the exNode that no longer names them is saved.
pub(super) fn unused(mappings: &[Mapping], dropped: Vec<Mapping>) -> Vec<Mapping> {
    dropped
        .into_iter()
        .filter(|d| {
            !mappings
                .iter()
                .any(|k| k.read.is_some() && k.read == d.read)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use lors_exnode::Function;
    use lors_ibp::caps::{CapKind, Capability, Key};
    use proptest::prelude::*;

    use super::*;

    /// Depots in memory: allocations by id, and the file as an exNode over
    /// them, changed only through the functions above (as `File` does).
    #[derive(Default)]
    struct Model {
        allocs: HashMap<u64, Vec<u8>>,
        mappings: Vec<Mapping>,
        size: u64,
        released: Vec<u64>,
    }

    fn id(m: &Mapping) -> u64 {
        m.read.as_ref().map_or(0, |c| c.typekey.parse().unwrap())
    }

    impl Model {
        /// A new allocation holding `data`, mapped at `off` in blocks of
        /// `block` bytes (one mapping, encoded, when `encoded`).
        fn store(&mut self, off: u64, data: Vec<u8>, block: u64, encoded: bool) -> Vec<Mapping> {
            let n = self.allocs.len() as u64 + 1;
            let cap = Capability::new("h", 1, "0", Key::new("k").unwrap(), n, CapKind::Read);
            let len = data.len() as u64;
            self.allocs.insert(n, data);
            let step = if encoded { len } else { block };
            (0..len)
                .step_by(step.max(1) as usize)
                .map(|at| Mapping {
                    exnode_offset: off + at,
                    logical_length: step.min(len - at),
                    alloc_offset: at,
                    alloc_length: step.min(len - at),
                    function: encoded.then(|| Function {
                        name: "checksum".into(),
                        ..Function::default()
                    }),
                    read: Some(cap.clone()),
                    ..Mapping::default()
                })
                .collect()
        }

        fn read(&self, off: u64, out: &mut [u8]) -> io::Result<()> {
            for (i, b) in out.iter_mut().enumerate() {
                let at = off + i as u64;
                let m = (self.mappings.iter())
                    .find(|m| m.exnode_offset <= at && at < m.logical_end())
                    .ok_or_else(|| io::Error::other(format!("a hole at {at}")))?;
                // An encoded block decodes only whole.
                if m.function.is_some() && m.logical_length != m.alloc_length {
                    return Err(io::Error::other(format!("an encoded mapping cut at {at}")));
                }
                *b = self.allocs[&id(m)][(m.alloc_offset + at - m.exnode_offset) as usize];
            }
            Ok(())
        }

        fn write(&mut self, off: u64, data: &[u8], block: u64) {
            if off > self.size {
                let gap = vec![0; (off - self.size) as usize];
                self.write(self.size, &gap, block);
            }
            let (mut off, mut data) = (off, data.to_vec());
            while let Some(cut) = encoded_cut(&self.mappings, off, off + data.len() as u64) {
                cover(cut, &mut off, &mut data, |a, out| self.read(a, out)).unwrap();
            }
            let len = data.len() as u64;
            self.size = self.size.max(off + len);
            let new = self.store(off, data, block, false);
            let dropped = merge(&mut self.mappings, off, len, new);
            self.retire(dropped);
        }

        fn set_len(&mut self, len: u64, block: u64) {
            if len >= self.size {
                let zeros = vec![0; (len - self.size) as usize];
                return self.write(self.size, &zeros, block);
            }
            let saved: Vec<(u64, Vec<u8>)> = encoded_heads(&self.mappings, len)
                .into_iter()
                .map(|(a, b)| {
                    let mut v = vec![0; (b - a) as usize];
                    self.read(a, &mut v).unwrap();
                    (a, v)
                })
                .collect();
            let dropped = truncate(&mut self.mappings, len);
            self.retire(dropped);
            self.size = len;
            for (a, v) in saved {
                self.write(a, &v, block);
            }
        }

        fn retire(&mut self, dropped: Vec<Mapping>) {
            let gone = unused(&self.mappings, dropped);
            self.released.extend(gone.iter().map(id));
        }

        fn bytes(&self) -> Vec<u8> {
            let mut v = vec![0; self.size as usize];
            self.read(0, &mut v).unwrap();
            v
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, Vec<u8>),
        SetLen(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..120, proptest::collection::vec(any::<u8>(), 1..50))
                .prop_map(|(o, d)| Op::Write(o, d)),
            1 => (0u64..150).prop_map(Op::SetLen),
        ]
    }

    proptest! {
        /// Any sequence of writes, overwrites and truncations, on a file
        /// that starts as raw or encoded blocks, reads back as the same
        /// sequence on a `Vec<u8>` does; the mappings never overlap, and no
        /// allocation a mapping still reads is released.
        #[test]
        fn mappings_follow_a_vec_model(
            first in proptest::collection::vec(any::<u8>(), 0..80),
            encoded in any::<bool>(),
            block in 1u64..20,
            ops in proptest::collection::vec(op(), 0..25),
        ) {
            let mut m = Model::default();
            if !first.is_empty() {
                m.size = first.len() as u64;
                m.mappings = m.store(0, first.clone(), 16, encoded);
            }
            let mut want = first;
            for op in ops {
                match op {
                    Op::Write(off, data) => {
                        m.write(off, &data, block);
                        let end = off as usize + data.len();
                        if want.len() < end {
                            want.resize(end, 0);
                        }
                        want[off as usize..end].copy_from_slice(&data);
                    }
                    Op::SetLen(len) => {
                        m.set_len(len, block);
                        want.resize(len as usize, 0);
                    }
                }
                prop_assert_eq!(m.bytes(), want.clone());
                for w in m.mappings.windows(2) {
                    prop_assert!(w[0].logical_end() <= w[1].exnode_offset, "{:?}", w);
                }
                for m2 in &m.mappings {
                    prop_assert!(!m.released.contains(&id(m2)), "released but read");
                }
            }
        }
    }

    #[test]
    fn a_write_inside_an_encoded_block_covers_it_whole() {
        let mut m = Model::default();
        m.mappings = m.store(0, (0..30).collect(), 16, true);
        m.size = 30;
        let (mut off, mut data) = (10, vec![9; 5]);
        let cut = encoded_cut(&m.mappings, off, 15).unwrap();
        assert_eq!(cut, (0, 30));
        cover(cut, &mut off, &mut data, |a, out| m.read(a, out)).unwrap();
        assert_eq!(off, 0);
        assert_eq!(data.len(), 30);
        assert_eq!(&data[10..15], &[9; 5]);
        assert_eq!((data[9], data[29]), (9, 29), "the bytes around are read");
        assert_eq!(encoded_cut(&m.mappings, 0, 30), None);
    }
}
