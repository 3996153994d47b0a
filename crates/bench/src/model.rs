//! The candidate model functions of "Simulations of Distributed Systems in a Computing Centre" §III: the sum (eq. 5) and the
//! difference (eq. 6) of two exponentials, one exponential, a power law, a
//! gaussian and polynomials of degree 1–3 (the MATLAB toolbox's `exp2`,
//! `exp1`, `power2`, `gauss1`, `poly1`–`poly3`).

use serde::{Deserialize, Serialize};

/// A model function `f(x; θ)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    /// `a·e^(−b·x) + c·e^(−d·x)`, a, b, c, d > 0 ("Simulations of Distributed Systems in a Computing Centre" eq. 5).
    Exp2Sum,
    /// `a·e^(−b·x) − c·e^(−d·x)`, a, b, c, d > 0 ("Simulations of Distributed Systems in a Computing Centre" eq. 6).
    Exp2Diff,
    /// `a·e^(b·x)`, a > 0.
    Exp1,
    /// `a·x^b + c`, for x > 0.
    Power2,
    /// `a·e^(−((x−b)/c)²)`, a, c > 0.
    Gauss1,
    /// `p0 + p1·x`.
    Poly1,
    /// `p0 + p1·x + p2·x²`.
    Poly2,
    /// `p0 + p1·x + p2·x² + p3·x³`.
    Poly3,
}

/// Whether a parameter is fitted as `e^φ` (kept positive) or as itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Domain {
    Positive,
    Free,
}

impl Model {
    /// Every candidate, in the order a tie in R² is broken (fewer
    /// parameters, then the seed's own models first).
    pub const ALL: [Model; 8] = [
        Model::Poly1,
        Model::Exp1,
        Model::Power2,
        Model::Gauss1,
        Model::Poly2,
        Model::Exp2Sum,
        Model::Exp2Diff,
        Model::Poly3,
    ];

    /// The short name used on the command line and in files.
    pub fn name(self) -> &'static str {
        match self {
            Model::Exp2Sum => "exp2-sum",
            Model::Exp2Diff => "exp2-diff",
            Model::Exp1 => "exp1",
            Model::Power2 => "power2",
            Model::Gauss1 => "gauss1",
            Model::Poly1 => "poly1",
            Model::Poly2 => "poly2",
            Model::Poly3 => "poly3",
        }
    }

    /// The formula, for tables.
    pub fn formula(self) -> &'static str {
        match self {
            Model::Exp2Sum => "a·e^(−b·x) + c·e^(−d·x)",
            Model::Exp2Diff => "a·e^(−b·x) − c·e^(−d·x)",
            Model::Exp1 => "a·e^(b·x)",
            Model::Power2 => "a·x^b + c",
            Model::Gauss1 => "a·e^(−((x−b)/c)²)",
            Model::Poly1 => "a + b·x",
            Model::Poly2 => "a + b·x + c·x²",
            Model::Poly3 => "a + b·x + c·x² + d·x³",
        }
    }

    /// Whether the model is a polynomial (which no prediction extrapolates
    /// with).
    pub fn is_polynomial(self) -> bool {
        matches!(self, Model::Poly1 | Model::Poly2 | Model::Poly3)
    }

    /// Number of parameters (`a`, `b`, … in [`Model::formula`]).
    pub fn params(self) -> usize {
        self.domains().len()
    }

    pub(crate) fn domains(self) -> &'static [Domain] {
        use Domain::{Free, Positive};
        match self {
            Model::Exp2Sum | Model::Exp2Diff => &[Positive; 4],
            Model::Exp1 => &[Positive, Free],
            Model::Power2 => &[Free, Free, Free],
            Model::Gauss1 => &[Positive, Free, Positive],
            Model::Poly1 => &[Free; 2],
            Model::Poly2 => &[Free; 3],
            Model::Poly3 => &[Free; 4],
        }
    }

    /// Whether the model is defined for every `x` of a curve.
    pub(crate) fn accepts(self, xs: &[f64]) -> bool {
        self != Model::Power2 || xs.iter().all(|&x| x > 0.0)
    }

    /// `f(x; θ)`.
    ///
    /// ```
    /// use lors_bench::model::Model;
    /// assert_eq!(Model::Poly2.eval(&[1.0, 2.0, 3.0], 2.0), 17.0);
    /// ```
    pub fn eval(self, p: &[f64], x: f64) -> f64 {
        match self {
            Model::Exp2Sum => p[0] * (-p[1] * x).exp() + p[2] * (-p[3] * x).exp(),
            Model::Exp2Diff => p[0] * (-p[1] * x).exp() - p[2] * (-p[3] * x).exp(),
            Model::Exp1 => p[0] * (p[1] * x).exp(),
            Model::Power2 => p[0] * x.powf(p[1]) + p[2],
            Model::Gauss1 => p[0] * (-((x - p[1]) / p[2]).powi(2)).exp(),
            Model::Poly1 | Model::Poly2 | Model::Poly3 => {
                p.iter().rev().fold(0.0, |acc, c| acc * x + c)
            }
        }
    }

    /// `∂f/∂θ` at `x`, into `g` (one entry per parameter).
    pub(crate) fn gradient(self, p: &[f64], x: f64, g: &mut [f64]) {
        match self {
            Model::Exp2Sum | Model::Exp2Diff => {
                let s = if self == Model::Exp2Sum { 1.0 } else { -1.0 };
                let (e1, e2) = ((-p[1] * x).exp(), (-p[3] * x).exp());
                g.copy_from_slice(&[e1, -p[0] * x * e1, s * e2, -s * p[2] * x * e2]);
            }
            Model::Exp1 => {
                let e = (p[1] * x).exp();
                g.copy_from_slice(&[e, p[0] * x * e]);
            }
            Model::Power2 => {
                let xb = x.powf(p[1]);
                g.copy_from_slice(&[xb, p[0] * xb * x.ln(), 1.0]);
            }
            Model::Gauss1 => {
                let u = (x - p[1]) / p[2];
                let e = (-u * u).exp();
                g.copy_from_slice(&[e, p[0] * e * 2.0 * u / p[2], p[0] * e * 2.0 * u * u / p[2]]);
            }
            Model::Poly1 | Model::Poly2 | Model::Poly3 => {
                let mut xi = 1.0;
                for gi in g.iter_mut() {
                    *gi = xi;
                    xi *= x;
                }
            }
        }
    }

    /// The parameters in units of `x·xs` and `y·ys` of those fitted to
    /// `x` and `y` (the fit works on data scaled to about 1).
    pub(crate) fn unscale(self, p: &[f64], xs: f64, ys: f64) -> Vec<f64> {
        match self {
            Model::Exp2Sum | Model::Exp2Diff => vec![p[0] * ys, p[1] / xs, p[2] * ys, p[3] / xs],
            Model::Exp1 => vec![p[0] * ys, p[1] / xs],
            Model::Power2 => vec![p[0] * ys * xs.powf(-p[1]), p[1], p[2] * ys],
            Model::Gauss1 => vec![p[0] * ys, p[1] * xs, p[2] * xs],
            Model::Poly1 | Model::Poly2 | Model::Poly3 => p
                .iter()
                .enumerate()
                .map(|(k, c)| c * ys / xs.powi(k as i32))
                .collect(),
        }
    }

    /// Starting points for a curve scaled to about 1 (the fit tries each and
    /// keeps the best): exponentials are only found from a start near their
    /// rates.
    pub(crate) fn starts(self, x: &[f64], y: &[f64]) -> Vec<Vec<f64>> {
        let first = y.first().copied().unwrap_or(1.0);
        let last = y.last().copied().unwrap_or(1.0);
        let top = y.iter().copied().fold(f64::MIN, f64::max);
        let at_top = x[y.iter().position(|&v| v == top).unwrap_or(0)];
        let pos = |v: f64| v.abs().max(0.05);
        match self {
            Model::Exp2Sum => [
                (30.0, 0.3),
                (10.0, 0.1),
                (3.0, 0.03),
                (30.0, 0.01),
                (100.0, 1.0),
                (3.0, 0.3),
            ]
            .iter()
            .map(|&(b, d)| vec![pos(first - last), b, pos(last), d])
            .collect(),
            Model::Exp2Diff => [
                (0.01, 3.0),
                (0.01, 30.0),
                (0.1, 10.0),
                (0.3, 100.0),
                (0.01, 300.0),
            ]
            .iter()
            .flat_map(|&(b, d)| {
                [
                    vec![pos(top), b, pos(top), d],
                    vec![pos(top), b, pos(top - first), d],
                ]
            })
            .collect(),
            Model::Exp1 => [-3.0, -0.3, 0.3, 1.0]
                .iter()
                .map(|&b| vec![pos(first), b])
                .collect(),
            Model::Power2 => [-1.0, -0.3, 0.3, 1.0]
                .iter()
                .map(|&b| vec![top - last, b, last])
                .collect(),
            Model::Gauss1 => [0.3, 1.0, 3.0]
                .iter()
                .map(|&c| vec![pos(top), at_top, c])
                .collect(),
            Model::Poly1 | Model::Poly2 | Model::Poly3 => vec![vec![0.0; self.params()]],
        }
    }
}

impl std::fmt::Display for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Model {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Model::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Model::ALL.iter().map(|m| m.name()).collect();
                format!("unknown model {s:?} (one of {})", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The analytic gradients agree with finite differences.
    #[test]
    fn gradients_match_finite_differences() {
        let params: [(Model, &[f64]); 8] = [
            (Model::Exp2Sum, &[2.0, 1.5, 0.7, 0.1]),
            (Model::Exp2Diff, &[2.0, 0.1, 1.2, 3.0]),
            (Model::Exp1, &[1.3, -0.4]),
            (Model::Power2, &[1.3, -0.4, 0.2]),
            (Model::Gauss1, &[1.3, 0.4, 0.8]),
            (Model::Poly1, &[1.0, 2.0]),
            (Model::Poly2, &[1.0, 2.0, -1.0]),
            (Model::Poly3, &[1.0, 2.0, -1.0, 0.5]),
        ];
        for (m, p) in params {
            for x in [0.3, 1.0, 2.5] {
                let mut g = vec![0.0; m.params()];
                m.gradient(p, x, &mut g);
                for k in 0..p.len() {
                    let h = 1e-6;
                    let (mut hi, mut lo) = (p.to_vec(), p.to_vec());
                    hi[k] += h;
                    lo[k] -= h;
                    let fd = (m.eval(&hi, x) - m.eval(&lo, x)) / (2.0 * h);
                    assert!(
                        (fd - g[k]).abs() < 1e-5 * fd.abs().max(1.0),
                        "{m} ∂/∂p{k} at {x}: {fd} vs {}",
                        g[k]
                    );
                }
            }
        }
    }

    /// Parameters fitted on scaled data describe the same curve unscaled.
    #[test]
    fn unscaled_parameters_give_the_same_curve() {
        let (xs, ys) = (64.0, 250.0);
        for m in Model::ALL {
            let p: Vec<f64> = match m {
                Model::Gauss1 => vec![0.8, 0.5, 0.3],
                _ => [0.9, 0.7, 0.4, 2.0][..m.params()].to_vec(),
            };
            let q = m.unscale(&p, xs, ys);
            for x in [0.1, 0.5, 1.0] {
                let (a, b) = (ys * m.eval(&p, x), m.eval(&q, x * xs));
                assert!((a - b).abs() < 1e-9 * a.abs().max(1.0), "{m}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for m in Model::ALL {
            assert_eq!(m.name().parse::<Model>().unwrap(), m);
        }
        assert!("exp3".parse::<Model>().unwrap_err().contains("exp2-sum"));
    }
}
