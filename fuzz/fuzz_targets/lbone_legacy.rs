//! The L-Bone's untrusted inputs: 512-byte legacy queries and replies, the
//! HTTP API's query strings and registration bodies. No panic; what parses
//! re-encodes to an equal request; a registration that validates holds
//! every field within its bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lors_lbone::{api, legacy, model, rank};

fuzz_target!(|data: &[u8]| {
    let mut msg = [0u8; legacy::MESSAGE_LEN];
    let n = data.len().min(legacy::MESSAGE_LEN);
    msg[..n].copy_from_slice(&data[..n]);
    if let Ok(req) = legacy::parse_request(&msg) {
        if let legacy::LegacyRequest::Depots { location, .. } = &req {
            let _ = rank::parse_hint(location);
            // What we understood, re-encoded, reads back the same (for
            // printable hints that fit the message).
            if location.len() <= 400 && location.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
                assert_eq!(legacy::parse_request(&legacy::encode_request(&req)), Ok(req.clone()));
            }
        }
    }
    let _ = legacy::parse_depots_reply(data);
    // HTTP itself is hyper's; the query string is ours.
    if let Ok(params) = std::str::from_utf8(data).map_err(drop).and_then(|q| api::params(q).map_err(drop)) {
        let _ = api::query_from(&params);
    }
    if let Ok(reg) = serde_json::from_slice::<model::Registration>(data)
        && reg.validate().is_ok()
    {
        assert!(reg.resources.len() <= model::MAX_RESOURCES);
        for r in &reg.resources {
            assert!(r.types.len() <= model::MAX_TYPES);
            assert!(r.types.iter().all(|t| t.len() <= model::MAX_TYPE));
        }
    }
});
