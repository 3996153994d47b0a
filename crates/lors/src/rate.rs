//! `--bwlimit`: one token bucket over every connection of a command, as
//! rclone's and aria2's limits are.
//!
//! Data is paid for a piece (or block) at a time before it moves: a piece
//! larger than the bucket puts it in debt, and whoever comes next waits the
//! debt off, so the rate holds over any stretch longer than a few pieces.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lors::rate::Limiter;
//! let l = Limiter::new(10 << 20); // 10 MiB/s
//! l.take(1 << 20).await;          // within the first burst: no wait
//! # }
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A shared byte-rate limit.
#[derive(Debug)]
pub struct Limiter {
    /// Bytes per second.
    rate: f64,
    /// Most tokens saved up while idle: a tenth of a second's worth.
    burst: f64,
    /// Tokens now (negative: debt) and when they were counted.
    state: Mutex<(f64, Instant)>,
}

impl Limiter {
    /// A limit of `bytes_per_sec` (at least 1).
    pub fn new(bytes_per_sec: u64) -> Self {
        let rate = bytes_per_sec.max(1) as f64;
        let burst = rate / 10.0;
        Limiter {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits until `n` more bytes may move, and counts them.
    pub async fn take(&self, n: u64) {
        let wait = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let earned = now.saturating_duration_since(st.1).as_secs_f64() * self.rate;
            st.0 = (st.0 + earned).min(self.burst) - n as f64;
            st.1 = now;
            if st.0 < 0.0 {
                Duration::from_secs_f64(-st.0 / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}
