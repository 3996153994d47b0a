//! Bandwidth forecasts per (client network, depot), in the spirit of the
//! Network Weather Service: several simple predictors run side by side on
//! the measurement series, each accumulates its absolute error, and the
//! forecast is the prediction of whichever has erred least so far.

use serde::{Deserialize, Serialize};

/// Weight of the newest measurement in the exponential average.
const ALPHA: f64 = 0.3;

/// The state kept per (client network, depot).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Forecaster {
    /// Measurements seen.
    pub n: u64,
    /// Last measurement (predictor 1).
    pub last: f64,
    /// Running mean (predictor 2).
    pub mean: f64,
    /// Exponentially weighted average (predictor 3).
    pub ewma: f64,
    /// Accumulated absolute error of each predictor.
    pub err: [f64; 3],
}

impl Forecaster {
    /// Folds in a measurement (bytes/s; 0 = unreachable).
    ///
    /// ```
    /// use lors_lbone::forecast::Forecaster;
    /// let mut f = Forecaster::default();
    /// for x in [100.0, 100.0, 100.0, 10.0] {
    ///     f.update(x);
    /// }
    /// assert!(f.predict().unwrap() < 100.0);
    /// ```
    pub fn update(&mut self, x: f64) {
        let x = if x.is_finite() { x.max(0.0) } else { 0.0 };
        if self.n > 0 {
            for (e, p) in self.err.iter_mut().zip([self.last, self.mean, self.ewma]) {
                *e += (p - x).abs();
            }
            self.mean += (x - self.mean) / (self.n + 1) as f64;
            self.ewma = lors_ibp::ewma::blend(ALPHA, self.ewma, x);
        } else {
            self.mean = x;
            self.ewma = x;
        }
        self.last = x;
        self.n += 1;
    }

    /// The forecast, once there is a measurement.
    pub fn predict(&self) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let preds = [self.last, self.mean, self.ewma];
        let best = (0..3)
            .min_by(|&a, &b| self.err[a].total_cmp(&self.err[b]))
            .unwrap_or(0);
        Some(preds[best])
    }
}

/// The client network a peer address belongs to: the /24 for IPv4, the /48
/// for IPv6 (rates from one site are alike).
pub fn client_net(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.0/24", o[0], o[1], o[2])
        }
        std::net::IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return client_net(std::net::IpAddr::V4(v4));
            }
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}::/48", s[0], s[1], s[2])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_series_forecasts_its_level_and_a_shift_is_followed() {
        let mut f = Forecaster::default();
        assert_eq!(f.predict(), None);
        for _ in 0..10 {
            f.update(50.0);
        }
        assert_eq!(f.predict(), Some(50.0));
        // A lasting shift: the last-value predictor wins within a few samples.
        for _ in 0..10 {
            f.update(10.0);
        }
        let p = f.predict().unwrap();
        assert!((p - 10.0).abs() < 1.0, "{p}");
    }

    #[test]
    fn noisy_series_prefers_an_average() {
        let mut f = Forecaster::default();
        for i in 0..100 {
            f.update(if i % 2 == 0 { 80.0 } else { 120.0 });
        }
        let p = f.predict().unwrap();
        assert!((p - 100.0).abs() < 15.0, "{p}");
        f.update(f64::NAN);
        assert!(f.predict().unwrap().is_finite());
    }

    #[test]
    fn networks() {
        assert_eq!(client_net("10.1.2.3".parse().unwrap()), "10.1.2.0/24");
        assert_eq!(
            client_net("2001:db8:1:2::5".parse().unwrap()),
            "2001:db8:1::/48"
        );
        assert_eq!(
            client_net("::ffff:10.1.2.3".parse().unwrap()),
            "10.1.2.0/24"
        );
    }
}
