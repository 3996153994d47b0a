//! exNode XML from untrusted files: no panic, bounded work, and what parses
//! is written back and parses to the same model. Each mapping's function
//! chain (ours or the LoRS ones, with hostile arguments) then decodes the
//! input bytes as if a depot had returned them: errors, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lors_exnode::functions::Codec;
use lors_exnode::xml;

fuzz_target!(|data: &[u8]| {
    let limits = xml::Limits { max_bytes: 1 << 16, ..xml::Limits::default() };
    if let Ok(x) = xml::parse_with(data, &limits) {
        let text = xml::write(&x);
        let again = xml::parse(text.as_bytes()).expect("our own output must parse");
        assert_eq!(again, x);
        for m in &x.mappings {
            if let Ok(Some(codec)) = Codec::from_mapping(m) {
                let _ = codec.decode(data, m.logical_length.min(1 << 20));
            }
        }
    }
});
