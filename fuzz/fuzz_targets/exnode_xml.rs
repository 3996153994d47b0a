//! exNode XML from untrusted files: no panic, bounded work, and what parses
//! is written back and parses to the same model. Each mapping's function
//! chain (ours or the LoRS ones, with hostile arguments) then decodes the
//! input bytes as if a depot had returned them: errors, never panics. The
//! LoRS numbering of the mappings is a permutation of them. An
//! erasure-code record is bounded by the blocks the exNode names. Holes
//! are in order, apart, and inside the file's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lors_exnode::erasure::Erasure;
use lors_exnode::functions::Codec;
use lors_exnode::xml;

fuzz_target!(|data: &[u8]| {
    let limits = xml::Limits { max_bytes: 1 << 16, ..xml::Limits::default() };
    if let Ok(x) = xml::parse_with(data, &limits) {
        let text = xml::write(&x);
        let again = xml::parse(text.as_bytes()).expect("our own output must parse");
        assert_eq!(again, x);
        let mut at = 0;
        for h in &x.holes {
            assert!(h.length > 0 && h.offset >= at);
            assert!(x.hole_at(h.offset) == Some(h));
            at = h.end();
        }
        assert!(x.hole_bytes() <= x.logical_size());
        assert!(x.holes_in(0, u64::MAX).eq(x.holes.iter().copied()));
        let numbering = x.numbering();
        let mut seen: Vec<usize> = numbering.in_order().collect();
        seen.sort_unstable();
        assert!(seen.iter().copied().eq(0..x.allocations().count()));
        for (n, i) in numbering.in_order().enumerate() {
            assert_eq!(numbering.number(i), n);
        }
        for m in &x.mappings {
            if let Ok(Some(codec)) = Codec::from_mapping(m) {
                let _ = codec.decode(data, m.logical_length.min(1 << 20));
            }
        }
        // An erasure-code record: its stripes are bounded by what the
        // exNode names, and every stripe is accounted for.
        if let Ok(Some(e)) = Erasure::of(&x) {
            let margins = e.margins(&x, |_| true);
            assert_eq!(margins.len() as u64, e.stripes());
            assert!(e.stripes() <= (x.allocations().count() as u64).max(1));
            for m in margins.iter().take(4) {
                assert!(m.blocks <= e.scheme.blocks());
                for i in 0..e.scheme.data {
                    if let Some(r) = e.data_record(&x, m.stripe, i) {
                        assert_eq!(r.exnode_offset, e.block(m.stripe, i).start);
                    }
                }
            }
        }
    }
});
