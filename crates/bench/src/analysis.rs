//! From a sweep's points to curves (throughput against one variable with
//! the other two fixed), their ranked fits, the fit table ("Simulations of Distributed Systems in a Computing Centre" Table
//! III) and predictions of sustainable transfers per minute.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fit::{Fit, rank};
use crate::model::Model;
use crate::sweep::{Config, Point};
use lors_ibp::units::Bytes;

const MIB: f64 = (1u64 << 20) as f64;

/// A swept variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Var {
    /// File size, fitted in MiB.
    Size,
    /// Files moved in parallel.
    Parallel,
    /// Streams per file.
    Streams,
}

impl Var {
    /// All three, in the order reports show them.
    pub const ALL: [Var; 3] = [Var::Size, Var::Parallel, Var::Streams];

    /// The axis label.
    pub fn label(self) -> &'static str {
        match self {
            Var::Size => "file size (MiB)",
            Var::Parallel => "files in parallel",
            Var::Streams => "streams per file",
        }
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Var::Size => "size",
            Var::Parallel => "parallel",
            Var::Streams => "streams",
        }
    }

    /// The value of this variable in a configuration, in fit units.
    pub fn of(self, c: Config) -> f64 {
        match self {
            Var::Size => c.size as f64 / MIB,
            Var::Parallel => c.parallel as f64,
            Var::Streams => c.streams as f64,
        }
    }

    /// The configuration with this variable blanked: the key of its curve.
    fn blank(self, c: Config) -> Config {
        match self {
            Var::Size => Config { size: 0, ..c },
            Var::Parallel => Config { parallel: 0, ..c },
            Var::Streams => Config { streams: 0, ..c },
        }
    }
}

/// Throughput per file against one variable, the others fixed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// The variable on the x axis.
    pub var: Var,
    /// The fixed values (the varied one is 0).
    pub fixed: Config,
    /// x values, in [`Var::of`] units, increasing.
    pub x: Vec<f64>,
    /// Mean throughput per file, MiB/s.
    pub y: Vec<f64>,
    /// Its error, MiB/s (0 where unknown).
    pub sigma: Vec<f64>,
    /// Every model that could be fitted, best R² first.
    pub fits: Vec<Fit>,
}

impl Curve {
    /// What is held fixed, e.g. `4 parallel, 1 stream`.
    pub fn describe_fixed(&self) -> String {
        let c = self.fixed;
        let streams = format!(
            "{} stream{}",
            c.streams,
            if c.streams == 1 { "" } else { "s" }
        );
        match self.var {
            Var::Size => format!("{} parallel, {streams}", c.parallel),
            Var::Parallel => format!("{:#}, {streams}", Bytes(c.size)),
            Var::Streams => format!("{:#}, {} parallel", Bytes(c.size), c.parallel),
        }
    }

    /// The best fit, if any model could be fitted.
    pub fn best(&self) -> Option<&Fit> {
        self.fits.first()
    }

    fn range(&self) -> (f64, f64) {
        (self.x[0], self.x[self.x.len() - 1])
    }
}

/// Fewest distinct x values that make a curve worth fitting.
pub const MIN_CURVE_POINTS: usize = 3;

/// Groups points into curves along each variable that was varied over at
/// least [`MIN_CURVE_POINTS`] values, and fits every candidate model.
pub fn curves(points: &[Point]) -> Vec<Curve> {
    let mut out = Vec::new();
    for var in Var::ALL {
        let mut groups: BTreeMap<Config, Vec<&Point>> = BTreeMap::new();
        for p in points {
            groups.entry(var.blank(p.config)).or_default().push(p);
        }
        for (fixed, mut ps) in groups {
            if ps.len() < MIN_CURVE_POINTS {
                continue;
            }
            ps.sort_by(|a, b| var.of(a.config).total_cmp(&var.of(b.config)));
            let x: Vec<f64> = ps.iter().map(|p| var.of(p.config)).collect();
            let y: Vec<f64> = ps.iter().map(|p| p.mean / MIB).collect();
            let sigma: Vec<f64> = ps.iter().map(|p| p.error.unwrap_or(0.0) / MIB).collect();
            let fits = rank(&x, &y, &sigma);
            out.push(Curve {
                var,
                fixed,
                x,
                y,
                sigma,
                fits,
            });
        }
    }
    out
}

/// One row of the fit table: a model's mean R² over a variable's curves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableRow {
    /// The variable.
    pub var: Var,
    /// The model.
    pub model: Model,
    /// Curves along the variable it was fitted to.
    pub curves: usize,
    /// Curves along the variable.
    pub of: usize,
    /// Mean R² over those curves.
    pub mean_r2: f64,
    /// Mean adjusted R² over those curves (see [`Fit::adjusted_r2`]).
    pub mean_adj_r2: Option<f64>,
}

/// Seed 002 Table III: per variable, every model's mean R² over the curves,
/// models fitted to every curve first, then by mean R².
pub fn table(curves: &[Curve]) -> Vec<TableRow> {
    let mut rows = Vec::new();
    for var in Var::ALL {
        let along: Vec<&Curve> = curves.iter().filter(|c| c.var == var).collect();
        let mut mine: Vec<TableRow> = Model::ALL
            .iter()
            .filter_map(|&model| {
                let fits: Vec<&Fit> = along
                    .iter()
                    .filter_map(|c| c.fits.iter().find(|f| f.model == model))
                    .collect();
                let n = fits.len() as f64;
                let adj: Option<Vec<f64>> = fits.iter().map(|f| f.adjusted_r2()).collect();
                (!fits.is_empty()).then(|| TableRow {
                    var,
                    model,
                    curves: fits.len(),
                    of: along.len(),
                    mean_r2: fits.iter().map(|f| f.r2).sum::<f64>() / n,
                    mean_adj_r2: adj.map(|a| a.iter().sum::<f64>() / n),
                })
            })
            .collect();
        mine.sort_by(|a, b| {
            b.curves
                .cmp(&a.curves)
                .then(b.mean_r2.total_cmp(&a.mean_r2))
        });
        rows.extend(mine);
    }
    rows
}

/// How many transfers per minute a setup sustains at one configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// The configuration asked about.
    pub config: Config,
    /// Transfers completed per minute.
    pub per_minute: f64,
    /// Its standard error from the fit, when the fit has spare points.
    pub error: Option<f64>,
    /// Throughput per file the fit gives, MiB/s.
    pub throughput: f64,
    /// The fitted model.
    pub model: Model,
    /// Its R².
    pub r2: f64,
    /// The curve the answer comes from, e.g. `throughput vs size at 4
    /// parallel, 1 stream`.
    pub curve: String,
    /// When the question lies outside the measured range: which range.
    pub outside: Option<String>,
}

impl std::fmt::Display for Prediction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.config;
        let pm = |v: f64| {
            if v >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        };
        write!(f, "this setup sustains {}", pm(self.per_minute))?;
        if let Some(e) = self.error {
            write!(f, " ± {}", pm(e))?;
        }
        write!(
            f,
            " transfers/min of {:#} files with {} in parallel ({} stream{} each; {} fit of {}, R² {:.3})",
            Bytes(c.size),
            c.parallel,
            c.streams,
            if c.streams == 1 { "" } else { "s" },
            self.model,
            self.curve,
            self.r2
        )?;
        if let Some(o) = &self.outside {
            write!(
                f,
                "\nwarning: outside the measured range ({o}): the figure above is an extrapolation"
            )?;
        }
        Ok(())
    }
}

/// Errors of [`predict`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PredictError {
    /// No fitted curve passes through the configuration.
    #[error(
        "no fitted curve passes through {size}, {parallel} parallel, {streams} stream(s): \
         measured sizes {sizes}, parallel {parallels}, streams {streamss} \
         (a curve needs {MIN_CURVE_POINTS} values of its variable)"
    )]
    NoCurve {
        /// Size asked.
        size: String,
        /// Parallel files asked.
        parallel: usize,
        /// Streams asked.
        streams: usize,
        /// Sizes measured.
        sizes: String,
        /// Parallel counts measured.
        parallels: String,
        /// Streams measured.
        streamss: String,
    },
    /// The best fit gives no positive throughput there.
    #[error(
        "the fits of {curve} give no positive throughput there (the best, {model}, gives {throughput:.3} MiB/s): outside what they describe"
    )]
    NonPositive {
        /// The model.
        model: Model,
        /// The curve.
        curve: String,
        /// What it gives.
        throughput: f64,
    },
}

/// Whether the curve's measured range holds the question.
fn covers(c: &Curve, q: Config) -> bool {
    let (lo, hi) = c.range();
    let v = c.var.of(q);
    v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9)
}

/// The answer of the curve at `q`: the fit trusted most that gives a
/// positive throughput there (no polynomial beyond the measured range),
/// with that throughput and its error.
fn answer(c: &Curve, q: Config) -> Option<(&Fit, f64, Option<f64>)> {
    let mut fits: Vec<&Fit> = c
        .fits
        .iter()
        .filter(|f| covers(c, q) || !f.model.is_polynomial())
        .collect();
    fits.sort_by(|a, b| trust(b).total_cmp(&trust(a)));
    fits.into_iter().find_map(|f| {
        let (t, e) = f.eval_with_error(c.var.of(q));
        (t > 0.0).then_some((f, t, e))
    })
}

/// How far a prediction trusts a fit: its adjusted R², which charges for
/// parameters (R² itself when the fit has no spare points).
fn trust(f: &Fit) -> f64 {
    f.adjusted_r2().unwrap_or(f.r2)
}

/// Transfers per minute at `q`, from a curve through it: along a variable
/// whose other two values were measured exactly as asked, preferring one
/// whose range holds the question. On that curve the fit trusted most
/// (adjusted R²) that gives a positive throughput answers; beyond the
/// measured range polynomials are not used (they run off to ±∞ there).
/// Each transfer takes `size / throughput`, `parallel` run at once:
/// `60 · parallel · throughput / size` per minute.
pub fn predict(curves: &[Curve], q: Config) -> Result<Prediction, PredictError> {
    let inside = |c: &Curve| covers(c, q);
    let answer = |c| answer(c, q);
    let through: Vec<&Curve> = curves
        .iter()
        .filter(|c| c.fixed == c.var.blank(q) && !c.fits.is_empty())
        .collect();
    let chosen = through
        .iter()
        .filter_map(|c| Some((*c, answer(c)?)))
        .max_by(|(a, (fa, ..)), (b, (fb, ..))| {
            inside(a)
                .cmp(&inside(b))
                .then(trust(fa).total_cmp(&trust(fb)))
        });
    if chosen.is_none()
        && let Some(c) = through.first()
    {
        let best = c.best().expect("curves with fits only");
        return Err(PredictError::NonPositive {
            model: best.model,
            curve: format!("throughput vs {} at {}", c.var.name(), c.describe_fixed()),
            throughput: best.eval(c.var.of(q)),
        });
    }
    let Some((curve, (fit, throughput, err))) = chosen else {
        let mut sizes: Vec<u64> = Vec::new();
        let mut par: Vec<usize> = Vec::new();
        let mut st: Vec<usize> = Vec::new();
        for c in curves {
            sizes.push(c.fixed.size);
            par.push(c.fixed.parallel);
            st.push(c.fixed.streams);
            for &x in &c.x {
                match c.var {
                    Var::Size => sizes.push((x * MIB).round() as u64),
                    Var::Parallel => par.push(x as usize),
                    Var::Streams => st.push(x as usize),
                }
            }
        }
        let fmt = |mut v: Vec<u64>, h: bool| {
            v.retain(|&x| x > 0);
            v.sort_unstable();
            v.dedup();
            if v.is_empty() {
                return "none".to_string();
            }
            v.iter()
                .map(|&x| {
                    if h {
                        format!("{:#}", Bytes(x))
                    } else {
                        x.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(PredictError::NoCurve {
            size: format!("{:#}", Bytes(q.size)),
            parallel: q.parallel,
            streams: q.streams,
            sizes: fmt(sizes, true),
            parallels: fmt(par.into_iter().map(|v| v as u64).collect(), false),
            streamss: fmt(st.into_iter().map(|v| v as u64).collect(), false),
        });
    };
    let what = format!(
        "throughput vs {} at {}",
        curve.var.name(),
        curve.describe_fixed()
    );
    let per = 60.0 * q.parallel as f64 / (q.size as f64 / MIB);
    let outside = (!inside(curve)).then(|| {
        let (lo, hi) = curve.range();
        match curve.var {
            Var::Size => format!(
                "sizes {:#}-{:#}",
                Bytes((lo * MIB).round() as u64),
                Bytes((hi * MIB).round() as u64)
            ),
            v => format!("{} {lo}-{hi}", v.label()),
        }
    });
    Ok(Prediction {
        config: q,
        per_minute: per * throughput,
        error: err.map(|e| per * e),
        throughput,
        model: fit.model,
        r2: fit.r2,
        curve: what,
        outside,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::FileStat;

    /// A point whose per-file throughput follows `f(size MiB, parallel)`.
    fn point(size_mib: f64, parallel: usize, f: impl Fn(f64, f64) -> f64) -> Point {
        let size = (size_mib * MIB) as u64;
        let mean = f(size_mib, parallel as f64) * MIB;
        let stat = FileStat {
            reps: 5,
            mean_time: 1.0,
            sd_time: 0.0,
            throughput: mean,
            sd_throughput: 0.01 * mean,
        };
        Point {
            config: Config {
                size,
                parallel,
                streams: 1,
            },
            files: vec![stat],
            mean,
            error: Some(0.01 * mean),
            total: mean * parallel as f64,
        }
    }

    /// 100 MiB/s shared by the parallel files, less a set-up cost of 0.1 s
    /// per transfer: per-file throughput = s / (0.1 + s·p/100).
    fn model(s: f64, p: f64) -> f64 {
        s / (0.1 + s * p / 100.0)
    }

    fn grid() -> Vec<Point> {
        let mut pts = Vec::new();
        for s in [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0] {
            for p in [1, 2, 4, 8] {
                pts.push(point(s, p, model));
            }
        }
        pts
    }

    #[test]
    fn curves_along_each_varied_variable() {
        let cs = curves(&grid());
        assert_eq!(cs.iter().filter(|c| c.var == Var::Size).count(), 4);
        assert_eq!(cs.iter().filter(|c| c.var == Var::Parallel).count(), 7);
        assert_eq!(
            cs.iter().filter(|c| c.var == Var::Streams).count(),
            0,
            "streams were not varied"
        );
        let c = cs
            .iter()
            .find(|c| c.var == Var::Size && c.fixed.parallel == 2)
            .unwrap();
        assert_eq!(c.describe_fixed(), "2 parallel, 1 stream");
        assert_eq!(c.x.first(), Some(&1.0));
        assert!(c.best().unwrap().r2 > 0.95);
        let t = table(&cs);
        assert!(t.iter().all(|r| r.var != Var::Streams));
        assert_eq!(t[0].var, Var::Size);
        assert_eq!((t[0].curves, t[0].of), (4, 4));
    }

    #[test]
    fn predicts_transfers_per_minute_and_says_when_it_extrapolates() {
        let cs = curves(&grid());
        // 16 MiB, 4 in parallel: per-file 16/(0.1+0.64) MiB/s, so each
        // transfer takes 0.74 s and 4 at once make 324 per minute.
        let p = predict(
            &cs,
            Config {
                size: 16 << 20,
                parallel: 4,
                streams: 1,
            },
        )
        .unwrap();
        let want = 60.0 * 4.0 / 0.74;
        assert!((p.per_minute - want).abs() < 0.05 * want, "{p}");
        assert!(p.outside.is_none());
        let line = p.to_string();
        assert!(
            line.starts_with("this setup sustains ")
                && line.contains("transfers/min of 16 MiB files with 4 in parallel"),
            "{line}"
        );
        // 3 in parallel was not measured, 16 MiB was: the parallel curve answers.
        let p = predict(
            &cs,
            Config {
                size: 16 << 20,
                parallel: 3,
                streams: 1,
            },
        )
        .unwrap();
        assert!(p.curve.contains("vs parallel"), "{p}");
        assert!(
            (p.per_minute - 60.0 * 3.0 / (0.1 + 0.48)).abs() < 0.1 * p.per_minute,
            "{p}"
        );
        // 256 MiB lies beyond the sizes measured.
        let p = predict(
            &cs,
            Config {
                size: 256 << 20,
                parallel: 4,
                streams: 1,
            },
        )
        .unwrap();
        assert_eq!(p.outside.as_deref(), Some("sizes 1 MiB-64 MiB"));
        assert!(!p.model.is_polynomial(), "{p}");
        // The true per-file rate there: 256/(0.1 + 10.24) MiB/s.
        let want = 60.0 * 4.0 / 10.34;
        assert!((p.per_minute - want).abs() < 0.25 * want, "{p}");
        assert!(
            p.to_string()
                .contains("warning: outside the measured range")
        );
        // Neither the size nor the parallel count was measured.
        let e = predict(
            &cs,
            Config {
                size: 3 << 20,
                parallel: 3,
                streams: 1,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("measured sizes 1 MiB, 2 MiB") && e.contains("parallel 1, 2, 4, 8"),
            "{e}"
        );
    }

    #[test]
    fn human_sizes() {
        assert_eq!(format!("{:#}", Bytes(1 << 30)), "1 GiB");
        assert_eq!(format!("{:#}", Bytes(3 << 19)), "1.5 MiB");
        assert_eq!(format!("{:#}", Bytes(100)), "100 B");
        assert_eq!(format!("{:#}", Bytes(10_000_000)), "9.537 MiB");
    }
}
