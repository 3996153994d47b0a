//! The statistics of "Simulations of Distributed Systems in a Computing Centre" §II-D: the mean throughput of one file and its
//! error from repeated timings (eq. 1), the weighted mean over files moved in
//! parallel and its error (eqs. 2–3), and the weighted R² of a fit (eq. 4).
//!
//! Two printed equations are read as they were evidently meant, and the
//! tests pin the reading down with hand-computed values:
//!
//! - Eq. 3 as printed, `√(k Σ μᵢ²/σᵢ²) / √(Σ 1/σᵢ²)`, does not shrink when
//!   the files agree and for one file gives `μ/√(R−1)` whatever the scatter.
//!   We use the error of the inverse-variance weighted mean it is built
//!   around, with the seed's `k = 1/(R−1)` turning each file's standard
//!   deviation (of `R` timings) into the error of its mean:
//!   `σ_f = √(k / Σ 1/σᵢ²)`.
//! - Eq. 4 prints `SSE = Σ wᵢ (ŷᵢ − ȳ)²`, the regression sum of squares; with
//!   `R² = 1 − SSE/SST` that only works for the residual sum `Σ wᵢ (yᵢ − ŷᵢ)²`,
//!   which is what MATLAB's toolbox (the seed's reference 22) computes.

use serde::{Deserialize, Serialize};

/// Mean and population standard deviation (divisor `n`) of a sample; the
/// seed's `k = 1/(R−1)` then gives the error of the mean (eq. 3).
///
/// ```
/// let (m, sd) = lors_bench::stats::mean_sd(&[1.0, 3.0]).unwrap();
/// assert_eq!((m, sd), (2.0, 1.0));
/// ```
pub fn mean_sd(xs: &[f64]) -> Option<(f64, f64)> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    Some((mean, var.sqrt()))
}

/// One file's repeated timings, reduced (eq. 1).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileStat {
    /// Repetitions timed.
    pub reps: usize,
    /// Mean time of one transfer, seconds (`μ_time`).
    pub mean_time: f64,
    /// Standard deviation of the times, seconds (`σ_time`).
    pub sd_time: f64,
    /// `size / μ_time`, bytes per second.
    pub throughput: f64,
    /// `size / μ_time² · σ_time` (eq. 1), bytes per second.
    pub sd_throughput: f64,
}

/// Eq. 1: the mean throughput of a file of `bytes` moved in each of `times`
/// seconds, and its standard deviation.
///
/// ```
/// let f = lors_bench::stats::file_stat(100.0, &[1.0, 3.0]).unwrap();
/// assert_eq!(f.throughput, 50.0); // 100 bytes / 2 s
/// assert_eq!(f.sd_throughput, 25.0); // 100 / 2² · 1
/// ```
pub fn file_stat(bytes: f64, times: &[f64]) -> Option<FileStat> {
    let (mean_time, sd_time) = mean_sd(times)?;
    if mean_time <= 0.0 {
        return None;
    }
    Some(FileStat {
        reps: times.len(),
        mean_time,
        sd_time,
        throughput: bytes / mean_time,
        sd_throughput: bytes / (mean_time * mean_time) * sd_time,
    })
}

/// The throughput per file of one configuration: eqs. 2–3 over its files.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Combined {
    /// Weighted mean throughput per file (`μ_f`, eq. 2), bytes per second.
    pub mean: f64,
    /// Its error (`σ_f`, eq. 3 as read above), bytes per second; `None` with
    /// fewer than two repetitions.
    pub error: Option<f64>,
}

/// Eqs. 2–3: the inverse-variance weighted mean of the files' throughputs
/// and its error. A file whose timings did not vary at all is given a tiny
/// spread (a millionth of its throughput) rather than an infinite weight.
///
/// ```
/// use lors_bench::stats::{combine, file_stat};
/// let a = file_stat(100.0, &[1.0, 3.0]).unwrap(); // 50 ± 25 B/s
/// let b = file_stat(100.0, &[1.0, 3.0]).unwrap();
/// let c = combine(&[a, b]).unwrap();
/// assert_eq!(c.mean, 50.0);
/// // k = 1/(2−1); σ_f = √(1 / (2/25²)) = 25/√2
/// assert!((c.error.unwrap() - 25.0 / 2f64.sqrt()).abs() < 1e-9);
/// ```
pub fn combine(files: &[FileStat]) -> Option<Combined> {
    if files.is_empty() {
        return None;
    }
    let weight = |f: &FileStat| {
        let sd = f
            .sd_throughput
            .max(f.throughput * 1e-6)
            .max(f64::MIN_POSITIVE);
        1.0 / (sd * sd)
    };
    let sum_w: f64 = files.iter().map(weight).sum();
    let mean = files.iter().map(|f| weight(f) * f.throughput).sum::<f64>() / sum_w;
    let reps = files.iter().map(|f| f.reps).min().unwrap_or(0);
    let error = (reps >= 2).then(|| {
        let k = 1.0 / (reps as f64 - 1.0);
        (k / sum_w).sqrt()
    });
    Some(Combined { mean, error })
}

/// Eq. 4: the weighted R² of predictions `fit` for observations `y` with
/// weights `w` (`1 − SSE/SST`; 1 is a perfect fit, 0 no better than the
/// weighted mean). `None` when the observations do not vary.
///
/// ```
/// let r2 = lors_bench::stats::r_squared(&[1.0, 2.0, 4.0], &[1.0, 2.0, 3.0], &[1.0; 3]).unwrap();
/// // ȳ = 7/3; SST = 14/3; SSE = 1
/// assert!((r2 - (1.0 - 3.0 / 14.0)).abs() < 1e-12);
/// ```
pub fn r_squared(y: &[f64], fit: &[f64], w: &[f64]) -> Option<f64> {
    let sum_w: f64 = w.iter().sum();
    if y.is_empty() || sum_w <= 0.0 {
        return None;
    }
    let ybar = y.iter().zip(w).map(|(y, w)| y * w).sum::<f64>() / sum_w;
    let sst: f64 = y.iter().zip(w).map(|(y, w)| w * (y - ybar).powi(2)).sum();
    let sse: f64 = y
        .iter()
        .zip(fit)
        .zip(w)
        .map(|((y, f), w)| w * (y - f).powi(2))
        .sum();
    (sst > 0.0).then(|| 1.0 - sse / sst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn one_file_by_hand() {
        // 1 MB moved in 2, 2.5 and 3 s: μ = 2.5, σ = √((0.25+0+0.25)/3).
        let f = file_stat(1e6, &[2.0, 2.5, 3.0]).unwrap();
        let sd = (0.5f64 / 3.0).sqrt();
        assert!(close(f.mean_time, 2.5));
        assert!(close(f.sd_time, sd));
        assert!(close(f.throughput, 400_000.0));
        assert!(close(f.sd_throughput, 1e6 / 6.25 * sd));
        // One file: μ_f is its throughput, σ_f the error of its mean, σ/√(R−1).
        let c = combine(&[f]).unwrap();
        assert!(close(c.mean, 400_000.0));
        assert!(close(c.error.unwrap(), f.sd_throughput / 2f64.sqrt()));
    }

    #[test]
    fn parallel_files_by_hand() {
        // File 1: 100 ± 10 B/s; file 2: 200 ± 20 B/s (reps = 5, so k = 1/4).
        let f = |mu: f64, sd: f64| FileStat {
            reps: 5,
            mean_time: 1.0,
            sd_time: 0.0,
            throughput: mu,
            sd_throughput: sd,
        };
        let c = combine(&[f(100.0, 10.0), f(200.0, 20.0)]).unwrap();
        // Weights 1/100 and 1/400: μ_f = (1 + 0.5) / (0.0125) = 120.
        assert!(close(c.mean, 120.0));
        // σ_f = √((1/4) / 0.0125) = √20.
        assert!(close(c.error.unwrap(), 20f64.sqrt()));
    }

    #[test]
    fn no_error_from_one_repetition_and_no_infinite_weights() {
        let f = file_stat(10.0, &[2.0]).unwrap();
        assert_eq!(f.sd_throughput, 0.0);
        let c = combine(&[f, file_stat(10.0, &[1.0]).unwrap()]).unwrap();
        assert!(c.error.is_none());
        assert!(c.mean.is_finite() && (5.0..=10.0).contains(&c.mean));
        assert!(file_stat(10.0, &[]).is_none());
        assert!(file_stat(10.0, &[0.0]).is_none());
    }

    #[test]
    fn weighted_r_squared_by_hand() {
        // Weights 1, 1, 2: ȳ = (1 + 2 + 8)/4 = 2.75.
        let y = [1.0, 2.0, 4.0];
        let fit = [1.5, 2.0, 3.5];
        let w = [1.0, 1.0, 2.0];
        let sst = 1.75f64.powi(2) + 0.75f64.powi(2) + 2.0 * 1.25f64.powi(2);
        let sse = 0.25 + 0.0 + 2.0 * 0.25;
        assert!(close(r_squared(&y, &fit, &w).unwrap(), 1.0 - sse / sst));
        assert!(r_squared(&[2.0, 2.0], &[2.0, 2.0], &[1.0, 1.0]).is_none());
    }
}
