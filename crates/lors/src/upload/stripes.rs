//! Erasure-coded uploads: a stripe of `k` data blocks is read, encoded on
//! a blocking thread (each block's e2e functions, then the parity over the
//! stored bytes) and its `k + m` blocks stored at once, each on a depot of
//! its own. Stripes are pipelined: while one is stored the next is read
//! and encoded, so encoding runs at the network's pace.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use lors_exnode::erasure::{Erasure, Scheme, shard_len};
use lors_exnode::functions::stored_digest;
use lors_exnode::{Function, Mapping, Metadata};
use tokio::io::AsyncRead;
use tokio::sync::Semaphore;

use super::{
    Control, Data, Input, Job, Stop, UploadOptions, Uploaded, Uploader, joined, mapping, next_slot,
};
use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::progress::Progress;

/// A block's e2e record: its e2e block size, function and stored digest.
type E2e = Option<(u64, Option<Function>, Option<Metadata>)>;

/// Uploads `input` as stripes of `scheme`. An interrupt or a failure
/// releases every block stored: a stripe is only of use whole, and an
/// erasure-coded upload starts over rather than resumes.
pub(super) async fn run<R: AsyncRead + Unpin>(
    mut input: Input<R>,
    size: Option<u64>,
    opts: &UploadOptions,
    scheme: Scheme,
    pool: Arc<Pool>,
    progress: Arc<dyn Progress>,
    control: Control,
) -> Result<Uploaded> {
    let usable = {
        let mut a = opts.depots.clone();
        a.sort();
        a.dedup();
        a.len()
    };
    if usable > 0 && usable < scheme.blocks() {
        return Err(Error::NotEnoughDepotsForStripe {
            scheme,
            depots: usable,
        });
    }
    let shared = Uploader::new(opts, pool, progress.clone(), &control)?;
    progress.start(size);
    let bs = usize::try_from(opts.block_size.max(1)).unwrap_or(usize::MAX);
    // Three stripes at least: one read and encoded while the others are
    // stored, so the links do not wait for the encoder.
    let slots = Arc::new(Semaphore::new((opts.threads / scheme.blocks()).max(2) + 1));
    let mut tasks = tokio::task::JoinSet::new();
    let mut results: Vec<(usize, Vec<Mapping>)> = Vec::new();
    let (mut offset, mut stripe) = (0u64, 0usize);
    let mut stop = Stop::default();
    loop {
        let Some(permit) = next_slot(&slots, &control, &mut tasks, &mut results, &mut stop).await
        else {
            break;
        };
        let (blocks, end) = match read_stripe(&mut input, offset, bs, scheme.data).await {
            Ok(r) => r,
            Err(e) => {
                stop.failure = Some(e);
                break;
            }
        };
        if blocks.is_empty() {
            break;
        }
        let start = offset;
        offset += blocks.iter().map(|b| b.len() as u64).sum::<u64>();
        let sh = shared.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let out = sh.store_stripe(stripe, start, blocks, scheme).await?;
            Ok::<_, Error>((stripe, out))
        });
        stripe += 1;
        if end {
            break;
        }
    }
    // An erasure-coded upload is not resumed: stopped, it keeps nothing.
    let results = super::end_blocks(&shared, tasks, &control, stop, results, false).await?;
    let mut x = shared.exnode_of(results);
    let (parity, data) = std::mem::take(&mut x.mappings)
        .into_iter()
        .partition(|m| m.shard().is_some_and(|(_, i)| i >= scheme.data));
    (x.mappings, x.parity) = (data, parity);
    let e = Erasure {
        scheme,
        block_size: opts.block_size.max(1),
        size: offset,
    };
    for m in e.metadata() {
        x.set_meta(m);
    }
    shared.finished(x).await
}

/// Up to `k` blocks of at most `bs` bytes from `offset` on, in memory, and
/// whether the input ended.
async fn read_stripe<R: AsyncRead + Unpin>(
    input: &mut Input<R>,
    mut offset: u64,
    bs: usize,
    k: usize,
) -> Result<(Vec<Vec<u8>>, bool)> {
    let mut blocks = Vec::with_capacity(k);
    while blocks.len() < k {
        let Some(data) = input.next(offset, bs as u64).await? else {
            return Ok((blocks, true));
        };
        let block = match data {
            Data::Mem(b) => b,
            Data::Range(f, pos, len) => tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt as _;
                let mut b = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
                f.read_exact_at(&mut b, pos).map(|()| b)
            })
            .await
            .map_err(|e| Error::io("reading input", std::io::Error::other(e.to_string())))?
            .map_err(|e| Error::io("reading input", e))?,
        };
        let short = block.len() < bs;
        offset += block.len() as u64;
        blocks.push(block);
        if short {
            return Ok((blocks, true));
        }
    }
    Ok((blocks, false))
}

/// A stripe, encoded: each data block's stored bytes and e2e record, and
/// the parity shards with their digests.
struct Encoded {
    data: Vec<(Vec<u8>, E2e)>,
    parity: Vec<(Vec<u8>, Metadata)>,
}

impl Uploader {
    /// Encodes stripe `stripe` (data `blocks` from `start` on) and stores
    /// its blocks, each on a depot none of the others is on.
    async fn store_stripe(
        self: Arc<Self>,
        stripe: usize,
        start: u64,
        blocks: Vec<Vec<u8>>,
        scheme: Scheme,
    ) -> Result<Vec<Mapping>> {
        let lens: Vec<u64> = blocks.iter().map(|b| b.len() as u64).collect();
        let codec = self.opts.e2e.clone();
        let enc = tokio::task::spawn_blocking(move || encode(blocks, codec.as_ref(), scheme))
            .await
            .map_err(|e| Error::io("encoding a stripe", std::io::Error::other(e.to_string())))??;
        let avoid = Arc::new(Mutex::new(HashSet::new()));
        let mut stores = tokio::task::JoinSet::new();
        // Where each block's search for a depot starts: block i of stripe
        // s at depot s + i, so the data blocks (read on every download)
        // rotate over all the depots rather than always filling the first k.
        let salt0 = stripe;
        let mut at = start;
        for (i, (stored, e2e)) in enc.data.into_iter().enumerate() {
            let (sh, avoid, len) = (self.clone(), avoid.clone(), lens[i]);
            let off = at;
            at += len;
            stores.spawn(async move {
                let data = Data::Mem(stored);
                let (d, caps) =
                    (sh.on_some_depot((off, len), &data, Job::Store, &avoid, salt0 + i)).await?;
                let mut m = mapping(off, len, data.len(), &e2e, caps);
                m.metadata.extend(Erasure::block_meta(stripe as u64, i));
                if let (None, Data::Mem(b)) = (&e2e, &data) {
                    m.metadata.push(stored_digest(b));
                }
                sh.progress.advance(&sh.lock().addrs[d].clone(), len);
                Ok::<_, Error>(m)
            });
        }
        for (j, (shard, digest)) in enc.parity.into_iter().enumerate() {
            let (sh, avoid) = (self.clone(), avoid.clone());
            let i = scheme.data + j;
            stores.spawn(async move {
                let data = Data::Mem(shard);
                let len = data.len();
                let (_, caps) =
                    (sh.on_some_depot((start, len), &data, Job::Store, &avoid, salt0 + i)).await?;
                let mut m = mapping(start, len, len, &None, caps);
                m.metadata.extend(Erasure::block_meta(stripe as u64, i));
                m.metadata.push(digest);
                Ok::<_, Error>(m)
            });
        }
        let mut out = Vec::with_capacity(scheme.blocks());
        while let Some(r) = stores.join_next().await {
            // A failure ends the stripe: the blocks still being stored are
            // cut off (their allocations are in the ledger, released with
            // the rest).
            out.push(joined(r)?);
        }
        out.sort_by_key(|m| m.shard().map_or(usize::MAX, |(_, i)| i));
        Ok(out)
    }
}

/// Each data block's e2e encoding, then the parity of the stored bytes.
fn encode(
    blocks: Vec<Vec<u8>>,
    codec: Option<&lors_exnode::functions::Codec>,
    scheme: Scheme,
) -> Result<Encoded> {
    let mut data = Vec::with_capacity(blocks.len());
    for b in blocks {
        data.push(match codec {
            None => (b, None),
            Some(c) => {
                let (stored, f) = c.encode(&b).map_err(|e| {
                    Error::io("encoding a block", std::io::Error::other(e.to_string()))
                })?;
                let digest = c.needs_stored_digest().then(|| stored_digest(&stored));
                (stored, Some((c.e2e_blocksize(), f, digest)))
            }
        });
    }
    let longest = data.iter().map(|(s, _)| s.len() as u64).max().unwrap_or(0);
    let len = usize::try_from(shard_len(longest)).unwrap_or(usize::MAX);
    let refs: Vec<&[u8]> = data.iter().map(|(s, _)| s.as_slice()).collect();
    let parity = (scheme.encode(&refs, len)?.into_iter())
        .map(|p| {
            let digest = stored_digest(&p);
            (p, digest)
        })
        .collect();
    Ok(Encoded { data, parity })
}
