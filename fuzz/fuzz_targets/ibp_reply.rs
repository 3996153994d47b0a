//! The client's reply parser on arbitrary bytes, for every reply shape and
//! for a v1.4 STATUS body: it must never panic, whatever it accepts must
//! survive encode → parse unchanged (the depot's encoding is what the client
//! reads), and an encoded reply is one line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lors_ibp::proto::{Reply, Shape, StatusBody};

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    for shape in Shape::ALL {
        let Ok(reply) = Reply::parse(shape, &line) else {
            continue;
        };
        let wire = reply.encode();
        assert!(wire.ends_with('\n'), "{wire:?}");
        assert_eq!(wire.matches('\n').count(), 1, "one line: {wire:?}");
        let again = Reply::parse(shape, &wire).expect("our own encoding must parse");
        assert_eq!(again, reply, "round trip changed the reply ({shape:?})");
        assert_eq!(again.encode(), wire, "encoding is canonical");
    }
    if let Ok(body) = StatusBody::parse(&line) {
        let wire = body.encode();
        assert_eq!(wire.matches('\n').count(), 1, "one line: {wire:?}");
        let again = StatusBody::parse(&wire).expect("our own STATUS body must parse");
        assert_eq!(again, body, "round trip changed the STATUS body");
        assert_eq!(again.encode(), wire, "encoding is canonical");
    }
});
