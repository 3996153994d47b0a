//! The HTML report: what was measured and on what, the points, the fit
//! table, and one SVG plot per variable (points with error bars, each
//! curve's best fit). Self-contained: no scripts, no external files.

use std::fmt::Write as _;

use crate::analysis::{Curve, TableRow, Var, table};
use crate::sweep::{Point, mean_total};
use lors_ibp::units::Bytes;

const MIB: f64 = (1u64 << 20) as f64;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Escapes text for HTML and SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// About `n` round tick values covering `[lo, hi]`.
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= n as f64)
        .unwrap_or(10.0 * mag);
    let (first, last) = (
        (lo / step - 1e-9).ceil() as i64,
        (hi / step + 1e-9).floor() as i64,
    );
    (first..=last).map(|k| k as f64 * step).collect()
}

fn num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}").trim_end_matches('0').to_string()
    }
}

/// One plot: throughput per file against `var`, every curve along it.
/// Sizes spanning more than a factor of 20 go on a log axis.
pub fn svg(var: Var, curves: &[&Curve]) -> String {
    let f = Frame::new(var, curves);
    let mut s = String::new();
    let (w, h) = (f.w, f.h);
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    f.axes(&mut s, var);
    for (i, c) in curves.iter().enumerate() {
        f.curve(&mut s, i, c);
    }
    s.push_str("</svg>");
    s
}

/// A plot's geometry: its size and margins, the plotting area, the axes'
/// ranges, and whether x is on a log scale.
struct Frame {
    w: f64,
    h: f64,
    ml: f64,
    mt: f64,
    pw: f64,
    ph: f64,
    log: bool,
    xmin: f64,
    xmax: f64,
    xl: f64,
    xh: f64,
    ymax: f64,
}

impl Frame {
    fn new(var: Var, curves: &[&Curve]) -> Frame {
        // Tall enough for the legend: two lines per curve.
        let h = (440.0f64).max(40.0 + 30.0 * curves.len() as f64);
        let (w, ml, mr, mt, mb) = (720.0, 70.0, 200.0, 20.0, 50.0);
        let xs = curves.iter().flat_map(|c| c.x.iter().copied());
        let (xmin, xmax) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        let log = var == Var::Size && xmin > 0.0 && xmax / xmin > 20.0;
        let ymax = (curves.iter())
            .flat_map(|c| c.y.iter().zip(&c.sigma).map(|(y, s)| y + s))
            .fold(0.0f64, f64::max)
            * 1.08;
        let (xl, xh) = if log {
            (xmin.log10(), xmax.log10())
        } else {
            (0.0f64.min(xmin), xmax)
        };
        let xh = if xh > xl { xh } else { xl + 1.0 };
        Frame {
            w,
            h,
            ml,
            mt,
            pw: w - ml - mr,
            ph: h - mt - mb,
            log,
            xmin,
            xmax,
            xl,
            xh,
            ymax,
        }
    }

    fn px(&self, x: f64) -> f64 {
        let x = if self.log { x.log10() } else { x };
        self.ml + self.pw * (x - self.xl) / (self.xh - self.xl)
    }

    fn py(&self, y: f64) -> f64 {
        self.mt + self.ph * (1.0 - y / self.ymax.max(f64::MIN_POSITIVE))
    }

    /// The x ticks: 1, 2, 5 per decade on a log axis.
    fn xticks(&self) -> Vec<f64> {
        if !self.log {
            return ticks(self.xl, self.xh, 8);
        }
        let mut v = Vec::new();
        let mut d = 10f64.powf(self.xl.floor());
        while d <= self.xmax * 1.0001 {
            for m in [1.0, 2.0, 5.0] {
                if d * m >= self.xmin * 0.9999 && d * m <= self.xmax * 1.0001 {
                    v.push(d * m);
                }
            }
            d *= 10.0;
        }
        v
    }

    /// The frame, grid, ticks and axis labels.
    fn axes(&self, s: &mut String, var: Var) {
        let (ml, mt, pw, ph) = (self.ml, self.mt, self.pw, self.ph);
        let _ = write!(
            s,
            r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        for t in self.xticks() {
            let x = self.px(t);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
                mt,
                mt + ph,
                mt + ph + 16.0,
                num(t)
            );
        }
        for t in ticks(0.0, self.ymax, 6) {
            let y = self.py(t);
            let _ = write!(
                s,
                r##"<line x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                ml + pw,
                ml - 6.0,
                y + 4.0,
                num(t)
            );
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}{}</text><text transform="translate(16 {}) rotate(-90)" text-anchor="middle">throughput per file (MiB/s)</text>"#,
            ml + pw / 2.0,
            self.h - 12.0,
            var.label(),
            if self.log { ", log scale" } else { "" },
            mt + ph / 2.0
        );
    }

    /// Curve `i`: its best fit, its points with error bars, its legend.
    fn curve(&self, s: &mut String, i: usize, c: &Curve) {
        let color = COLORS[i % COLORS.len()];
        // Past the palette, curves are told apart by dashes.
        let dash = if i >= COLORS.len() {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        if let Some(f) = c.best() {
            let (a, b) = (c.x[0], c.x[c.x.len() - 1]);
            let pts: Vec<String> = (0..=100)
                .map(|k| {
                    let t = k as f64 / 100.0;
                    let x = if self.log {
                        10f64.powf(a.log10() + t * (b.log10() - a.log10()))
                    } else {
                        a + t * (b - a)
                    };
                    let y = f.eval(x).clamp(0.0, self.ymax);
                    format!("{:.1},{:.1}", self.px(x), self.py(y))
                })
                .collect();
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{}"/>"#,
                pts.join(" ")
            );
        }
        for ((&x, &y), &e) in c.x.iter().zip(&c.y).zip(&c.sigma) {
            let (cx, cy) = (self.px(x), self.py(y));
            if e > 0.0 {
                let _ = write!(
                    s,
                    r#"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="{color}"/>"#,
                    self.py((y - e).max(0.0)),
                    self.py(y + e)
                );
            }
            let _ = write!(
                s,
                r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="3" fill="{color}"/>"#
            );
        }
        let ly = self.mt + 14.0 + 30.0 * i as f64;
        let lx = self.ml + self.pw;
        let fit = (c.best())
            .map(|f| format!("{} R² {:.3}", f.model, f.r2))
            .unwrap_or_else(|| "no fit".into());
        let _ = write!(
            s,
            r##"<line x1="{}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{:.1}">{}</text><text x="{}" y="{:.1}" fill="#555">{}</text>"##,
            lx + 6.0,
            ly - 4.0,
            lx + 20.0,
            ly - 4.0,
            lx + 24.0,
            ly,
            esc(&c.describe_fixed()),
            lx + 24.0,
            ly + 14.0,
            esc(&fit)
        );
    }
}

/// The whole report. `meta` is shown as a table of key and value;
/// `commands` are the command lines that reproduce it.
pub fn html(title: &str, meta: &[(String, String)], points: &[Point], curves: &[Curve]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>\
         body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}\
         th{{background:#f3f3f3}}td.l,th.l{{text-align:left}}code{{background:#f5f5f5}}</style></head><body>\n<h1>{t}</h1>\n",
        t = esc(title)
    );
    h.push_str("<h2>Set-up</h2>\n<table>");
    for (k, v) in meta {
        let _ = write!(
            h,
            "<tr><th class=\"l\">{}</th><td class=\"l\">{}</td></tr>",
            esc(k),
            esc(v)
        );
    }
    h.push_str("</table>\n");
    let rows = table(curves);
    summary(&mut h, points, &rows);
    throughput(&mut h, points);
    fits(&mut h, &rows);
    per_variable(&mut h, curves);
    if curves.is_empty() {
        let _ = writeln!(
            h,
            "<p>No curves: a variable needs {} values or more to be fitted.</p>",
            crate::analysis::MIN_CURVE_POINTS
        );
    }
    h.push_str("</body></html>\n");
    h
}

/// The summary: the totals, and the best model for each variable.
fn summary(h: &mut String, points: &[Point], rows: &[TableRow]) {
    h.push_str("<h2>Summary</h2>\n<ul>");
    if let Some(t) = mean_total(points) {
        let _ = write!(
            h,
            "<li>Total throughput, mean over all configurations: <b>{:.2} MiB/s</b>.</li>",
            t / MIB
        );
    }
    if let Some(top) = points.iter().max_by(|a, b| a.total.total_cmp(&b.total)) {
        let _ = write!(
            h,
            "<li>Highest total: <b>{:.2} MiB/s</b> with {} files of {:#} in parallel, {} stream(s) each.</li>",
            top.total / MIB,
            top.config.parallel,
            Bytes(top.config.size),
            top.config.streams
        );
    }
    for var in Var::ALL {
        let all: Vec<&TableRow> = rows
            .iter()
            .filter(|r| r.var == var && r.curves == r.of)
            .collect();
        let Some(r) = all.first() else { continue };
        let adj = |r: &TableRow| {
            r.mean_adj_r2
                .map_or_else(|| "–".into(), |v| format!("{v:.3}"))
        };
        let _ = write!(
            h,
            "<li>Throughput per file vs {}: best by R², <code>{}</code> ({}), mean R² {:.3} (adjusted {}) over {} curves",
            var.name(),
            r.model,
            esc(r.model.formula()),
            r.mean_r2,
            adj(r),
            r.of
        );
        let by_adj = all.iter().max_by(|a, b| {
            a.mean_adj_r2
                .unwrap_or(f64::MIN)
                .total_cmp(&b.mean_adj_r2.unwrap_or(f64::MIN))
        });
        if let Some(b) = by_adj.filter(|b| b.model != r.model && b.mean_adj_r2.is_some()) {
            let _ = write!(h, "; by adjusted R², <code>{}</code> ({})", b.model, adj(b));
        }
        h.push_str(".</li>");
    }
    h.push_str("</ul>\n");
}

/// The table of mean throughput per configuration.
fn throughput(h: &mut String, points: &[Point]) {
    h.push_str("<h2>Throughput</h2>\n<p>Mean throughput per file (<i>Simulations of Distributed Systems in a Computing Centre</i>, eqs. 1–3) and the total of the files moved in parallel.</p>\n<table><tr><th>size</th><th>parallel</th><th>streams</th><th>repetitions</th><th>per file (MiB/s)</th><th>± error</th><th>total (MiB/s)</th></tr>");
    for p in points {
        let reps = p.files.iter().map(|f| f.reps).min().unwrap_or(0);
        let _ = write!(
            h,
            "<tr><td>{:#}</td><td>{}</td><td>{}</td><td>{reps}</td><td>{:.2}</td><td>{}</td><td>{:.2}</td></tr>",
            Bytes(p.config.size),
            p.config.parallel,
            p.config.streams,
            p.mean / MIB,
            p.error
                .map(|e| format!("{:.2}", e / MIB))
                .unwrap_or_else(|| "–".into()),
            p.total / MIB
        );
    }
    h.push_str("</table>\n");
    if let Some(t) = mean_total(points) {
        let _ = writeln!(
            h,
            "<p>Total throughput, mean over all configurations (<i>Simulations of Distributed Systems in a Computing Centre</i>, Table IV): <b>{:.2} MiB/s</b>.</p>",
            t / MIB
        );
    }
}

/// The table of every model's mean R² per variable.
fn fits(h: &mut String, rows: &[TableRow]) {
    h.push_str("<h2>Fits</h2>\n<p>Every model fitted to every curve by weighted least squares; mean R² (eq. 4) over a variable's curves, best first (<i>Simulations of Distributed Systems in a Computing Centre</i>, Table III). The adjusted R² charges each parameter: a model with nearly as many parameters as a curve has points fits any shape, and only the adjusted figure shows it.</p>\n<table><tr><th class=\"l\">variable</th><th class=\"l\">model</th><th class=\"l\">function</th><th>curves fitted</th><th>mean R²</th><th>mean adjusted R²</th></tr>");
    for r in rows {
        let _ = write!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{} of {}</td><td>{:.4}</td><td>{}</td></tr>",
            r.var.name(),
            r.model,
            esc(r.model.formula()),
            r.curves,
            r.of,
            r.mean_r2,
            r.mean_adj_r2
                .map_or_else(|| "–".into(), |v| format!("{v:.4}"))
        );
    }
    h.push_str("</table>\n");
}

/// Per variable: its plot and each curve's best model.
fn per_variable(h: &mut String, curves: &[Curve]) {
    for var in Var::ALL {
        let along: Vec<&Curve> = curves.iter().filter(|c| c.var == var).collect();
        if along.is_empty() {
            continue;
        }
        let _ = writeln!(
            h,
            "<h2>Throughput vs {}</h2>\n<figure>{}</figure>",
            var.name(),
            svg(var, &along)
        );
        h.push_str("<table><tr><th class=\"l\">curve</th><th class=\"l\">best model</th><th class=\"l\">parameters</th><th>R²</th></tr>");
        for c in &along {
            let (model, params, r2) = match c.best() {
                Some(f) => (
                    f.model.to_string(),
                    f.params
                        .iter()
                        .zip(["a", "b", "c", "d"])
                        .map(|(v, n)| format!("{n} = {v:.4e}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    format!("{:.4}", f.r2),
                ),
                None => ("–".into(), "too few points".into(), "–".into()),
            };
            let _ = write!(
                h,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{r2}</td></tr>",
                esc(&c.describe_fixed()),
                esc(&model),
                esc(&params)
            );
        }
        h.push_str("</table>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_ticks() {
        assert_eq!(ticks(0.0, 10.0, 5), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(0.0, 0.9, 5);
        assert_eq!(t.len(), 5);
        assert!((t[3] - 0.6).abs() < 1e-12 && num(t[3]) == "0.6");
        assert_eq!(esc("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
    }
}
