//! Capability URLs on arbitrary text: no panic, and accepted ones print back
//! to a URL that parses to the same capability.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lors_ibp::Capability;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cap) = Capability::parse(text) {
        let url = cap.to_url();
        assert_eq!(Capability::parse(&url), Ok(cap));
    }
});
