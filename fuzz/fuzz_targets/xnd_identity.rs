//! The `lors_file` metadata an exNode carries (`DEV:INO:LINE:PATH`, what
//! tells a copy made with cp or rsync from its original) comes with
//! exNodes from anywhere: any text, through the XML writer and parser and
//! into the check that follows its path, gives an answer and never panics
//! or reads past the exNode size limit (a FIFO or device path is refused
//! without a read).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lors_exnode::{ExNode, Metadata, xml};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut x = ExNode::default();
    x.set_meta(Metadata::string(lors::xnd::IDENTITY_META, text));
    let Ok(x) = xml::parse(xml::write(&x).as_bytes()) else { return };
    let here = std::env::current_exe().expect("the fuzz binary's path");
    let _ = lors::xnd::outside_copy(&here, &x);
});
