//! Fitting the candidate models to a curve by weighted least squares
//! (Levenberg–Marquardt, from the `levenberg-marquardt` crate) and ranking
//! them by R² ("Simulations of Distributed Systems in a Computing Centre" eq. 4).
//!
//! The fit works on data scaled to about 1 (x by its largest value, y by
//! its largest), with positive parameters fitted as `e^φ`, from a few
//! starting points per model; the parameters are reported unscaled. The
//! covariance of the fitted parameters (`s²·(JᵀWJ)⁻¹`, `s²` the reduced
//! weighted residual) gives the uncertainty of a prediction by the delta
//! method.

use levenberg_marquardt::{LeastSquaresProblem, LevenbergMarquardt};
use nalgebra::{DMatrix, DVector, Dyn, Owned};
use serde::{Deserialize, Serialize};

use crate::model::{Domain, Model};
use crate::stats::r_squared;

/// Why a model could not be fitted to a curve.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FitError {
    /// Fewer points than the model has parameters, plus one.
    #[error("{model} needs at least {need} points, the curve has {have}")]
    TooFewPoints {
        /// The model.
        model: Model,
        /// Points it needs.
        need: usize,
        /// Points given.
        have: usize,
    },
    /// The model is not defined on the curve's x values (a power law at 0).
    #[error("{0} is not defined at every x of the curve")]
    Domain(Model),
    /// No starting point converged to finite values.
    #[error("{0} did not converge")]
    NoConvergence(Model),
    /// The observations do not vary, so R² is undefined.
    #[error("the curve is flat: R² is undefined")]
    Flat,
}

/// A model fitted to one curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    /// The model.
    pub model: Model,
    /// Its parameters `a, b, …` in the curve's units.
    pub params: Vec<f64>,
    /// Weighted R² (eq. 4).
    pub r2: f64,
    /// Points fitted.
    pub points: usize,
    /// The x and y scales the fit worked in.
    scale: (f64, f64),
    /// The fitted parameters as the optimizer saw them (scaled, `ln` of the
    /// positive ones).
    free: Vec<f64>,
    /// Their covariance, row-major; absent when the curve has no spare
    /// points or the problem is degenerate.
    cov: Option<Vec<f64>>,
}

impl Fit {
    /// R² adjusted for the number of parameters, `1 − (1 − R²)(n − 1)/(n −
    /// p)`: a 4-parameter model through 5 points nearly interpolates them,
    /// and this says so. `None` when the fit has no spare points.
    pub fn adjusted_r2(&self) -> Option<f64> {
        let (n, p) = (self.points as f64, self.params.len() as f64);
        (n > p).then(|| 1.0 - (1.0 - self.r2) * (n - 1.0) / (n - p))
    }

    /// The fitted curve at `x`.
    pub fn eval(&self, x: f64) -> f64 {
        self.model.eval(&self.params, x)
    }

    /// The fitted curve at `x` and its standard error from the parameters'
    /// covariance (delta method), when known.
    pub fn eval_with_error(&self, x: f64) -> (f64, Option<f64>) {
        let y = self.eval(x);
        let Some(cov) = &self.cov else {
            return (y, None);
        };
        let (xs, ys) = self.scale;
        let g = free_gradient(self.model, &self.free, x / xs);
        let n = g.len();
        let mut var = 0.0;
        for i in 0..n {
            for j in 0..n {
                var += g[i] * cov[i * n + j] * g[j];
            }
        }
        (y, Some(ys * var.max(0.0).sqrt()))
    }
}

/// Natural (scaled) parameters from free ones.
fn natural(model: Model, free: &[f64]) -> Vec<f64> {
    free.iter()
        .zip(model.domains())
        .map(|(&v, d)| if *d == Domain::Positive { v.exp() } else { v })
        .collect()
}

/// `∂f/∂φ` at a scaled `x`.
fn free_gradient(model: Model, free: &[f64], x: f64) -> Vec<f64> {
    let p = natural(model, free);
    let mut g = vec![0.0; p.len()];
    model.gradient(&p, x, &mut g);
    for ((gi, d), pi) in g.iter_mut().zip(model.domains()).zip(&p) {
        if *d == Domain::Positive {
            *gi *= pi;
        }
    }
    g
}

struct Problem<'a> {
    model: Model,
    x: &'a [f64],
    y: &'a [f64],
    sqrt_w: &'a [f64],
    free: DVector<f64>,
}

impl LeastSquaresProblem<f64, Dyn, Dyn> for Problem<'_> {
    type ResidualStorage = Owned<f64, Dyn>;
    type JacobianStorage = Owned<f64, Dyn, Dyn>;
    type ParameterStorage = Owned<f64, Dyn>;

    fn set_params(&mut self, p: &DVector<f64>) {
        self.free.copy_from(p);
    }

    fn params(&self) -> DVector<f64> {
        self.free.clone()
    }

    fn residuals(&self) -> Option<DVector<f64>> {
        let p = natural(self.model, self.free.as_slice());
        let r = DVector::from_iterator(
            self.x.len(),
            self.x
                .iter()
                .zip(self.y)
                .zip(self.sqrt_w)
                .map(|((&x, &y), &s)| s * (self.model.eval(&p, x) - y)),
        );
        r.iter().all(|v| v.is_finite()).then_some(r)
    }

    fn jacobian(&self) -> Option<DMatrix<f64>> {
        let n = self.free.len();
        let mut j = DMatrix::zeros(self.x.len(), n);
        for (i, (&x, &s)) in self.x.iter().zip(self.sqrt_w).enumerate() {
            for (k, g) in free_gradient(self.model, self.free.as_slice(), x)
                .into_iter()
                .enumerate()
            {
                j[(i, k)] = s * g;
            }
        }
        j.iter().all(|v| v.is_finite()).then_some(j)
    }
}

/// Fits `model` to points `(x, y)` with standard errors `sigma` (weights
/// `1/σ²`; all equal when any is missing or zero).
///
/// ```
/// use lors_bench::{fit::fit, model::Model};
/// let x: Vec<f64> = (1..=8).map(f64::from).collect();
/// let y: Vec<f64> = x.iter().map(|x| 3.0 + 2.0 * x).collect();
/// let f = fit(Model::Poly1, &x, &y, &[]).unwrap();
/// assert!((f.params[1] - 2.0).abs() < 1e-6 && f.r2 > 0.999_999);
/// ```
pub fn fit(model: Model, x: &[f64], y: &[f64], sigma: &[f64]) -> Result<Fit, FitError> {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let need = model.params() + 1;
    if n < need {
        return Err(FitError::TooFewPoints {
            model,
            need,
            have: n,
        });
    }
    if !model.accepts(x) {
        return Err(FitError::Domain(model));
    }
    let w = weights(sigma, n);
    let xs = x
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs()))
        .max(f64::MIN_POSITIVE);
    let ys = y
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs()))
        .max(f64::MIN_POSITIVE);
    let sx: Vec<f64> = x.iter().map(|v| v / xs).collect();
    let sy: Vec<f64> = y.iter().map(|v| v / ys).collect();
    let sqrt_w: Vec<f64> = w.iter().map(|v| v.sqrt()).collect();
    let to_free = |p: &[f64]| -> Vec<f64> {
        p.iter()
            .zip(model.domains())
            .map(|(&v, d)| {
                if *d == Domain::Positive {
                    v.max(1e-9).ln()
                } else {
                    v
                }
            })
            .collect()
    };
    let mut best: Option<(f64, Vec<f64>)> = None;
    for start in model.starts(&sx, &sy) {
        let problem = Problem {
            model,
            x: &sx,
            y: &sy,
            sqrt_w: &sqrt_w,
            free: DVector::from_vec(to_free(&start)),
        };
        let (done, report) = LevenbergMarquardt::new()
            .with_patience(200)
            .minimize(problem);
        let cost = report.objective_function;
        let free = done.free.as_slice().to_vec();
        if cost.is_finite()
            && free.iter().all(|v| v.is_finite())
            && best.as_ref().is_none_or(|(c, _)| cost < *c)
        {
            best = Some((cost, free));
        }
    }
    let (cost, free) = best.ok_or(FitError::NoConvergence(model))?;
    let p = natural(model, &free);
    let fitted: Vec<f64> = sx.iter().map(|&v| model.eval(&p, v)).collect();
    let r2 = r_squared(&sy, &fitted, &w).ok_or(FitError::Flat)?;
    let cov = covariance(model, &free, &sx, &sqrt_w, 2.0 * cost, n);
    Ok(Fit {
        model,
        params: model.unscale(&p, xs, ys),
        r2,
        points: n,
        scale: (xs, ys),
        free,
        cov,
    })
}

/// Weights `1/σ²` scaled to a mean of 1, or all 1.
fn weights(sigma: &[f64], n: usize) -> Vec<f64> {
    if sigma.len() != n || sigma.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return vec![1.0; n];
    }
    let w: Vec<f64> = sigma.iter().map(|s| 1.0 / (s * s)).collect();
    let mean = w.iter().sum::<f64>() / n as f64;
    w.into_iter().map(|v| v / mean).collect()
}

/// `s²·(JᵀWJ)⁻¹` in the free, scaled parameters.
fn covariance(
    model: Model,
    free: &[f64],
    x: &[f64],
    sqrt_w: &[f64],
    sse: f64,
    n: usize,
) -> Option<Vec<f64>> {
    let p = free.len();
    if n <= p {
        return None;
    }
    let mut j = DMatrix::zeros(n, p);
    for (i, (&x, &s)) in x.iter().zip(sqrt_w).enumerate() {
        for (k, g) in free_gradient(model, free, x).into_iter().enumerate() {
            j[(i, k)] = s * g;
        }
    }
    let inv = (j.transpose() * &j).try_inverse()?;
    let s2 = sse / (n - p) as f64;
    let cov: Vec<f64> = (inv * s2).transpose().as_slice().to_vec();
    cov.iter().all(|v| v.is_finite()).then_some(cov)
}

/// Every candidate model that can be fitted to the curve, best R² first
/// (ties to the model with fewer parameters).
pub fn rank(x: &[f64], y: &[f64], sigma: &[f64]) -> Vec<Fit> {
    let mut fits: Vec<Fit> = Model::ALL
        .iter()
        .filter_map(|&m| fit(m, x, y, sigma).ok())
        .collect();
    fits.sort_by(|a, b| b.r2.total_cmp(&a.r2));
    fits
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random normal sample (Box–Muller over a
    /// 64-bit LCG), so the tests are repeatable.
    fn noise(seed: u64, n: usize) -> Vec<f64> {
        let mut s = seed;
        let mut u = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| (-2.0 * u().ln()).sqrt() * (2.0 * std::f64::consts::PI * u()).cos())
            .collect()
    }

    fn synthetic(model: Model, p: &[f64], x: &[f64], rel: f64, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let e = noise(seed, x.len());
        let y: Vec<f64> = x
            .iter()
            .zip(&e)
            .map(|(&x, e)| model.eval(p, x) * (1.0 + rel * e))
            .collect();
        let sigma = y.iter().map(|y| rel * y.abs()).collect();
        (y, sigma)
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    /// Throughput against parallel files as in "Simulations of Distributed Systems in a Computing Centre"'s Fig. 3: a fast
    /// decay then a slow one (eq. 5). With 1 % noise the fit recovers the
    /// parameters and ranks the true model first.
    #[test]
    fn recovers_a_sum_of_exponentials_and_ranks_it_first() {
        let x: Vec<f64> = [1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 35, 40, 45]
            .map(f64::from)
            .to_vec();
        let truth = [300.0, 0.5, 80.0, 0.02];
        let (y, sigma) = synthetic(Model::Exp2Sum, &truth, &x, 0.01, 7);
        let f = fit(Model::Exp2Sum, &x, &y, &sigma).unwrap();
        assert!(f.r2 > 0.95, "R² {}", f.r2);
        // 16 points, 4 parameters: adjusted R² = 1 − (1 − R²)·15/12.
        let adj = f.adjusted_r2().unwrap();
        assert!((adj - (1.0 - (1.0 - f.r2) * 15.0 / 12.0)).abs() < 1e-12 && adj < f.r2);
        // The pair (a, b) is the fast term, whichever order the fit found.
        let mut p = f.params.clone();
        if p[1] < p[3] {
            p = vec![p[2], p[3], p[0], p[1]];
        }
        for (got, want) in p.iter().zip(truth) {
            assert!(close(*got, want, 0.15), "{:?} vs {truth:?}", f.params);
        }
        let ranked = rank(&x, &y, &sigma);
        assert_eq!(
            ranked[0].model,
            Model::Exp2Sum,
            "{:?}",
            ranked.iter().map(|f| (f.model, f.r2)).collect::<Vec<_>>()
        );
    }

    /// Throughput against file size with a per-transfer set-up cost (Fig. 6,
    /// eq. 6): a fast rise to a plateau.
    #[test]
    fn recovers_a_difference_of_exponentials_and_ranks_it_first() {
        let x = [
            0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0,
        ];
        let truth = [120.0, 0.3, 100.0, 12.0];
        let (y, sigma) = synthetic(Model::Exp2Diff, &truth, &x, 0.01, 11);
        let f = fit(Model::Exp2Diff, &x, &y, &sigma).unwrap();
        assert!(f.r2 > 0.95, "R² {}", f.r2);
        for (got, want) in f.params.iter().zip(truth) {
            assert!(close(*got, want, 0.25), "{:?} vs {truth:?}", f.params);
        }
        let ranked = rank(&x, &y, &sigma);
        assert_eq!(
            ranked[0].model,
            Model::Exp2Diff,
            "{:?}",
            ranked.iter().map(|f| (f.model, f.r2)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn recovers_the_simple_models() {
        let x: Vec<f64> = (1..=12).map(f64::from).collect();
        let cases: [(Model, &[f64]); 4] = [
            (Model::Exp1, &[50.0, -0.2]),
            (Model::Power2, &[40.0, -0.7, 5.0]),
            (Model::Gauss1, &[90.0, 6.0, 3.0]),
            (Model::Poly2, &[10.0, 4.0, -0.3]),
        ];
        for (m, truth) in cases {
            let (y, sigma) = synthetic(m, truth, &x, 0.005, 3);
            let f = fit(m, &x, &y, &sigma).unwrap();
            assert!(f.r2 > 0.95, "{m}: R² {}", f.r2);
            for (got, want) in f.params.iter().zip(truth) {
                assert!(
                    (got - want).abs() <= 0.1 * want.abs().max(1.0),
                    "{m}: {:?} vs {truth:?}",
                    f.params
                );
            }
        }
    }

    /// The prediction error grows with the noise and is about the noise
    /// divided by √(points) near the data.
    #[test]
    fn prediction_errors_follow_the_noise() {
        let x: Vec<f64> = (1..=20).map(f64::from).collect();
        let err_at = |rel: f64| {
            let (y, sigma) = synthetic(Model::Poly1, &[100.0, -2.0], &x, rel, 5);
            let f = fit(Model::Poly1, &x, &y, &sigma).unwrap();
            let (v, e) = f.eval_with_error(10.0);
            assert!(close(v, 80.0, 3.0 * rel));
            e.unwrap()
        };
        let (small, large) = (err_at(0.01), err_at(0.05));
        assert!(small > 0.0 && large > 3.0 * small, "{small} {large}");
        assert!(small < 80.0 * 0.01, "{small}");
    }

    #[test]
    fn refuses_what_it_cannot_fit() {
        let x = [1.0, 2.0, 3.0];
        assert_eq!(
            fit(Model::Exp2Sum, &x, &[3.0, 2.0, 1.0], &[]),
            Err(FitError::TooFewPoints {
                model: Model::Exp2Sum,
                need: 5,
                have: 3
            })
        );
        assert_eq!(
            fit(
                Model::Power2,
                &[0.0, 1.0, 2.0, 3.0],
                &[1.0, 2.0, 3.0, 4.0],
                &[]
            ),
            Err(FitError::Domain(Model::Power2))
        );
        assert_eq!(fit(Model::Poly1, &x, &[2.0; 3], &[]), Err(FitError::Flat));
    }
}
