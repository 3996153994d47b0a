//! Reed-Solomon encode and decode speed, one core, beside a `memcpy` of
//! the same bytes: `cargo bench -p lors-exnode --bench erasure`.
//!
//! Encode: a stripe's k data blocks to its m parity blocks. Decode: the
//! worst case, m data blocks lost and rebuilt from the rest and the
//! parity (one of them handed out, as a read of it does). Figures are
//! GiB/s of the stripe's data (k blocks) per second; `memcpy` copies those
//! k blocks once.
//! `LORS_BENCH_BLOCK` sets the block size (default 1 MiB).

use std::time::{Duration, Instant};

use lors_exnode::erasure::Scheme;

fn main() {
    let block: usize = std::env::var("LORS_BENCH_BLOCK")
        .ok()
        .and_then(|v| lors_ibp::units::parse_size(&v).ok())
        .map_or(1 << 20, |v| v as usize)
        .next_multiple_of(2);
    println!(
        "Reed-Solomon (leopard16, reed-solomon-simd) on one core, {} KiB blocks; GiB/s of stripe data",
        block >> 10
    );
    println!(
        "{:<6} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "code", "memcpy", "encode", "decode", "enc/cpy", "dec/cpy"
    );
    for (k, m) in [(4, 2), (6, 3), (10, 4)] {
        let s = Scheme { data: k, parity: m };
        let data: Vec<Vec<u8>> = (0..k)
            .map(|i| (0..block).map(|j| (j * 31 + i * 7) as u8).collect())
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let bytes = (k * block) as f64;
        let mut into = vec![vec![0u8; block]; k];
        let copy = rate(bytes, || {
            for (to, from) in into.iter_mut().zip(&refs) {
                to.copy_from_slice(from);
            }
            std::hint::black_box(&into);
        });
        let parity = s.encode(&refs, block).unwrap();
        let enc = rate(bytes, || {
            std::hint::black_box(s.encode(&refs, block).unwrap());
        });
        // m data blocks lost: the rest and every parity block.
        let have: Vec<(usize, &[u8])> = (m..k)
            .map(|i| (i, refs[i]))
            .chain(
                parity
                    .iter()
                    .enumerate()
                    .map(|(j, p)| (k + j, p.as_slice())),
            )
            .collect();
        assert_eq!(s.recover(&have, block).unwrap(), data);
        // What a read of a lost block does: that block, copied once.
        let dec = rate(bytes, || {
            std::hint::black_box(s.recover_one(&have, block, 0).unwrap());
        });
        println!(
            "{:<6} {:>10.2} {:>10.2} {:>10.2} {:>9.2} {:>9.2}",
            s.to_string(),
            copy,
            enc,
            dec,
            enc / copy,
            dec / copy
        );
    }
}

/// GiB/s of `bytes` per run of `f`, the median of runs over about a second.
fn rate(bytes: f64, mut f: impl FnMut()) -> f64 {
    f();
    let mut runs = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) || runs.len() < 5 {
        let t = Instant::now();
        f();
        runs.push(bytes / t.elapsed().as_secs_f64() / (1u64 << 30) as f64);
    }
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}
