//! The depot's request parser on arbitrary bytes: it must never panic, and
//! whatever it accepts must survive encode → parse unchanged (the client and
//! the depot agree on every request either can produce).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lors_ibp::proto::Request;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = Request::parse(data) {
        let line = req.encode();
        let again = Request::parse(line.as_bytes()).expect("our own encoding must parse");
        assert_eq!(again, req, "round trip changed the request");
        // Encoding is canonical: a second round trip is byte-identical.
        assert_eq!(again.encode(), line);
    } else {
        // Rejections always map to an IBP status the depot can send.
        let e = Request::parse(data).unwrap_err();
        assert!(e.status().code() < 0);
    }
});
