//! `lors-wan`: a wire with distance between two TAP devices, for the
//! network lab on a kernel without `netem`.
//!
//! It creates the TAP devices `A` and `B` in its network namespace and
//! prints `ready` on standard output; the caller moves them where they
//! belong (`ip link set A netns HOST`: the open descriptors keep working)
//! and brings them up. Every Ethernet frame read from one is written to
//! the other after the one-way delay of its direction, plus a jitter drawn
//! uniformly in `[0, jitter]`, unless the loss draw drops it. Frames leave
//! in the order they came (a late frame holds back those behind it, as on
//! a wire), unless `--reorder` lets jitter reorder them. The queue of each
//! direction holds at most `--queue` bytes (a router's buffer: beyond it
//! frames are dropped at the tail). Rates stay with the lab's `tbf`
//! qdiscs on the devices.
//!
//! ```text
//! lors-wan --tap wa1 --tap wb1 --delay 94ms --loss 0.1 &   # 188 ms RTT through this wire alone
//! ```

use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod args;
mod tap;

use args::Args;

/// A frame waiting for its time.
struct Due {
    at: Instant,
    seq: u64,
    frame: Vec<u8>,
}

impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    // The earliest first out of a max-heap.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// One direction's queue: frames by the time they leave.
#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Due>,
    bytes: usize,
    closed: bool,
}

/// A small, fast generator for the loss and jitter draws (xorshift64*).
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Counters of one direction, printed at exit.
#[derive(Default)]
struct Counts {
    frames: u64,
    lost: u64,
    dropped: u64,
}

fn direction(
    mut from: File,
    mut to: File,
    delay: Duration,
    a: &Args,
    seed: u64,
) -> std::thread::JoinHandle<Counts> {
    let q = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
    let (jitter, loss, reorder, cap) = (a.jitter, a.loss / 100.0, a.reorder, a.queue);
    let writer = {
        let q = q.clone();
        std::thread::spawn(move || {
            let (m, cv) = &*q;
            let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let now = Instant::now();
                match g.heap.peek() {
                    Some(d) if d.at <= now => {
                        let d = g.heap.pop().expect("peeked");
                        g.bytes -= d.frame.len();
                        drop(g);
                        // A frame the device refuses (down, moved) is lost.
                        let _ = to.write(&d.frame);
                        g = m.lock().unwrap_or_else(|e| e.into_inner());
                    }
                    Some(d) => {
                        let wait = d.at - now;
                        g = cv
                            .wait_timeout(g, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                    None if g.closed => return,
                    None => g = cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                }
            }
        })
    };
    std::thread::spawn(move || {
        let mut draw = Draw(seed | 1);
        let mut counts = Counts::default();
        let mut last = Instant::now();
        let mut buf = vec![0u8; 1 << 16];
        let mut seq = 0u64;
        let (m, cv) = &*q;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            counts.frames += 1;
            if loss > 0.0 && draw.next() < loss {
                counts.lost += 1;
                continue;
            }
            let extra = jitter.mul_f64(if jitter.is_zero() { 0.0 } else { draw.next() });
            let mut at = Instant::now() + delay + extra;
            if !reorder {
                at = at.max(last);
                last = at;
            }
            seq += 1;
            let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
            if g.bytes + n > cap {
                counts.dropped += 1;
                continue;
            }
            g.bytes += n;
            // The writer sleeps until its earliest frame's time: woken only
            // when this one goes before that (frames come in order, so
            // mostly when the queue was empty), not once per frame.
            let first = g.heap.peek().is_none_or(|d| at < d.at);
            g.heap.push(Due {
                at,
                seq,
                frame: buf[..n].to_vec(),
            });
            drop(g);
            if first {
                cv.notify_one();
            }
        }
        m.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        cv.notify_one();
        let _ = writer.join();
        counts
    })
}

fn main() {
    let a = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lors-wan: {e}\n\n{}", args::USAGE);
            std::process::exit(2);
        }
    };
    let (ta, tb) = match (tap::open(&a.taps.0), tap::open(&a.taps.1)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!(
                "lors-wan: creating the TAP devices: {e} (needs CAP_NET_ADMIN and /dev/net/tun)"
            );
            std::process::exit(1);
        }
    };
    tap::precise_timers();
    let clone = |f: &File| f.try_clone().expect("a TAP descriptor clones");
    let seed = a.seed ^ (ta.as_raw_fd() as u64).rotate_left(17);
    let ab = direction(clone(&ta), clone(&tb), a.delay_ab, &a, seed);
    let ba = direction(tb, ta, a.delay_ba, &a, seed.rotate_left(29) ^ 0x9e37_79b9);
    println!("ready");
    let _ = std::io::stdout().flush();
    // Runs until killed; the counts are for a caller that closes the
    // devices (deleting them ends the reads).
    let (x, y) = (ab.join(), ba.join());
    if let (Ok(x), Ok(y)) = (x, y) {
        eprintln!(
            "lors-wan: {} -> {}: {} frames, {} lost, {} dropped at the queue; back: {} frames, {} lost, {} dropped",
            a.taps.0, a.taps.1, x.frames, x.lost, x.dropped, y.frames, y.lost, y.dropped
        );
    }
}
