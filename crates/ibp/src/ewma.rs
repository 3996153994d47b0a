//! The one exponentially weighted moving average of the workspace: transfer
//! rates, per-byte times and bandwidth forecasts are all smoothed by it.

/// An exponentially weighted moving average: a new sample weighs `weight`,
/// the past `1 - weight`; the first sample is taken as it is.
///
/// ```
/// use lors_ibp::ewma::Ewma;
/// let mut rate = Ewma::new(0.3);
/// assert_eq!(rate.get(), None);
/// rate.add(100.0);
/// assert_eq!(rate.add(200.0), 130.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ewma {
    weight: f64,
    value: Option<f64>,
}

impl Ewma {
    /// An average in which each new sample weighs `weight` (0 to 1).
    pub const fn new(weight: f64) -> Ewma {
        Ewma {
            weight,
            value: None,
        }
    }

    /// Folds in `x`; the average now.
    pub fn add(&mut self, x: f64) -> f64 {
        let v = match self.value {
            Some(old) => blend(self.weight, old, x),
            None => x,
        };
        self.value = Some(v);
        v
    }

    /// The average, once there is a sample.
    pub fn get(&self) -> Option<f64> {
        self.value
    }
}

/// `old` moved toward `new` by `weight`: one step of an [`Ewma`], for state
/// kept as a plain number (a stored forecast).
pub fn blend(weight: f64, old: f64, new: f64) -> f64 {
    weight * new + (1.0 - weight) * old
}
