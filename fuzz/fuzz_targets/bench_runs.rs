//! A results directory's `runs.csv` (shared sweeps come from others): no
//! panic; every run parsed is whole, and the statistics take any of them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lors_bench::sweep::{CSV_HEADER, parse_runs};

fuzz_target!(|data: &[u8]| {
    let text = format!("{CSV_HEADER}\n{}", String::from_utf8_lossy(data));
    let Ok(runs) = parse_runs(&text, "runs.csv") else { return };
    for r in &runs {
        assert!(r.file < r.config.parallel && r.seconds > 0.0 && r.seconds.is_finite());
    }
    let _ = lors_bench::sweep::summarize(&runs);
});
