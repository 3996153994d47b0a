//! Erasure-coded downloads around a dead, hung or slow depot with every
//! `-t` from 1 to 32, at 4+2 and 6+3: each finishes, byte-exact, well
//! within its deadline. A `-t` cap once let the rebuilds take every slot
//! while the reads they asked of the depots' own connections waited for
//! one: a download that never ended.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::util::*;

/// Every `-t` tried.
const THREADS: std::ops::RangeInclusive<usize> = 1..=32;

/// Downloads run at once (each its own `lors` process).
const AT_ONCE: usize = 4;

/// Far beyond what any of these downloads takes (a second or a few): a
/// download that reaches it is hung.
const DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn ec_4_2_downloads_around_a_dead_hung_or_slow_depot_with_any_threads() {
    matrix(4, 2);
}

#[test]
fn ec_6_3_downloads_around_a_dead_hung_or_slow_depot_with_any_threads() {
    matrix(6, 3);
}

fn matrix(k: usize, m: usize) {
    let dir = tempdir();
    let mut ds = depots(k + m, dir.path());
    // Five full stripes of 64 KiB blocks and a short sixth.
    let data = pattern(5 * k * (64 << 10) + 12_345, 7);
    let all: Vec<&DepotProc> = ds.iter().collect();
    let scheme = format!("{k}+{m}");
    let xnd = upload(
        &all,
        dir.path(),
        "f",
        &data,
        &["--ec", &scheme, "-b", "64K"],
    );
    let x = lors::xnd::load(&xnd).unwrap();
    // The depot of the first data block: every fault costs data blocks.
    let victim = (ds.iter())
        .position(|d| Some(&d.addr) == x.mappings[0].depot().as_ref())
        .unwrap();
    {
        let _slow = Slow::start(&ds[victim]);
        every_threads(&xnd, &data, dir.path(), &format!("{scheme}, slow"));
    }
    ds[victim].signal("STOP");
    every_threads(&xnd, &data, dir.path(), &format!("{scheme}, hung"));
    ds[victim].signal("CONT");
    ds[victim].kill9();
    every_threads(&xnd, &data, dir.path(), &format!("{scheme}, dead"));
}

/// Downloads `xnd` with each `-t` of [`THREADS`], [`AT_ONCE`] at a time;
/// fails with every download that did not end byte-exact in time.
fn every_threads(xnd: &Path, data: &[u8], dir: &Path, what: &str) {
    let all: Vec<usize> = THREADS.collect();
    let mut failures = Vec::new();
    for batch in all.chunks(AT_ONCE) {
        std::thread::scope(|s| {
            let runs: Vec<_> = (batch.iter())
                .map(|&t| s.spawn(move || (t, one(xnd, data, dir, t))))
                .collect();
            for r in runs {
                let (t, r) = r.join().unwrap();
                if let Err(e) = r {
                    failures.push(format!("-t {t}: {e}"));
                }
            }
        });
    }
    assert!(failures.is_empty(), "{what}: {failures:#?}");
}

fn one(xnd: &Path, data: &[u8], dir: &Path, t: usize) -> Result<(), String> {
    let out = dir.join(format!("out-{t}"));
    let _ = std::fs::remove_file(&out);
    let threads = t.to_string();
    let args = [
        "download",
        "-q",
        "--stall",
        "1s",
        "-t",
        &threads,
        "-o",
        out.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ];
    match lors_within(&args, DEADLINE) {
        None => Err(format!("still running after {DEADLINE:?}")),
        Some((false, err)) => Err(err),
        Some((true, _)) if std::fs::read(&out).ok().as_deref() != Some(data) => {
            Err("the output differs from the file uploaded".into())
        }
        Some((true, _)) => Ok(()),
    }
}

/// A depot that answers a tenth of the time: stopped 90 ms, running 10,
/// until dropped.
struct Slow {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pid: String,
}

impl Slow {
    fn start(d: &DepotProc) -> Slow {
        let stop = Arc::new(AtomicBool::new(false));
        let pid = d.pid().to_string();
        let thread = {
            let (stop, pid) = (stop.clone(), pid.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    signal(&pid, "STOP");
                    std::thread::sleep(Duration::from_millis(90));
                    signal(&pid, "CONT");
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        Slow {
            stop,
            thread: Some(thread),
            pid,
        }
    }
}

impl Drop for Slow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        signal(&self.pid, "CONT");
    }
}

fn signal(pid: &str, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{sig}"), pid])
        .status();
}
