//! `lors bench fit`, `report` and `predict`: a results directory read,
//! fitted and printed.

use std::path::Path;

use lors_bench::analysis::{self, Curve};
use lors_bench::lab::{Meta, read_meta, write_atomic};
use lors_bench::sweep::{self, Config, Point};
use lors_ibp::units::Bytes;
use serde::Serialize;

use super::{DirArgs, PredictArgs};
use crate::commands::outln;
use crate::exit::UsageError;

pub(super) fn print_points(points: &[Point]) -> anyhow::Result<()> {
    const MIB: f64 = (1u64 << 20) as f64;
    outln!(
        "{:>10} {:>8} {:>7} {:>16} {:>12} {:>13}",
        "size",
        "parallel",
        "streams",
        "per file MiB/s",
        "± error",
        "total MiB/s"
    );
    for p in points {
        outln!(
            "{:>10} {:>8} {:>7} {:>16.2} {:>12} {:>13.2}",
            format!("{:#}", Bytes(p.config.size)),
            p.config.parallel,
            p.config.streams,
            p.mean / MIB,
            p.error
                .map_or_else(|| "–".into(), |e| format!("{:.2}", e / MIB)),
            p.total / MIB
        );
    }
    if let Some(t) = sweep::mean_total(points) {
        outln!(
            "total throughput, mean over configurations: {:.2} MiB/s",
            t / MIB
        );
    }
    Ok(())
}

/// The runs of a results directory, reduced and fitted.
fn load(dir: &Path) -> anyhow::Result<(Option<Meta>, Vec<Point>, Vec<Curve>)> {
    let runs = sweep::read_runs(&dir.join("runs.csv"))?;
    if runs.is_empty() {
        return Err(UsageError(format!(
            "{} holds no runs: run `lors bench sweep -o {}` first",
            dir.display(),
            dir.display()
        ))
        .into());
    }
    let meta = read_meta(dir);
    let points = sweep::summarize(&runs);
    let curves = analysis::curves(&points);
    Ok((meta, points, curves))
}

#[derive(Serialize)]
struct Fits<'a> {
    points: &'a [Point],
    curves: &'a [Curve],
    table: Vec<analysis::TableRow>,
    mean_total: Option<f64>,
}

pub(super) fn fit(d: &DirArgs) -> anyhow::Result<()> {
    let (_, points, curves) = load(&d.dir)?;
    let fits = Fits {
        points: &points,
        curves: &curves,
        table: analysis::table(&curves),
        mean_total: sweep::mean_total(&points),
    };
    let json = serde_json::to_vec_pretty(&fits)?;
    write_atomic(&d.dir.join("fits.json"), &json)?;
    if d.json {
        outln!("{}", String::from_utf8_lossy(&json));
        return Ok(());
    }
    if curves.is_empty() {
        outln!(
            "no curves to fit: vary a variable over {} values or more",
            analysis::MIN_CURVE_POINTS
        );
        return Ok(());
    }
    outln!(
        "{:<9} {:<10} {:<26} {:>7} {:>8} {:>8}",
        "variable",
        "model",
        "function",
        "curves",
        "mean R²",
        "adjusted"
    );
    for r in &fits.table {
        outln!(
            "{:<9} {:<10} {:<26} {:>7} {:>8.4} {:>8}",
            r.var.name(),
            r.model.name(),
            r.model.formula(),
            format!("{}/{}", r.curves, r.of),
            r.mean_r2,
            r.mean_adj_r2
                .map_or_else(|| "–".into(), |v| format!("{v:.4}"))
        );
    }
    outln!();
    for c in &curves {
        match c.best() {
            Some(f) => {
                let params: Vec<String> = f
                    .params
                    .iter()
                    .zip(["a", "b", "c", "d"])
                    .map(|(v, n)| format!("{n}={v:.4e}"))
                    .collect();
                outln!(
                    "throughput vs {} at {}: {} R² {:.4} ({})",
                    c.var.name(),
                    c.describe_fixed(),
                    f.model,
                    f.r2,
                    params.join(" ")
                );
            }
            None => outln!(
                "throughput vs {} at {}: no model fits",
                c.var.name(),
                c.describe_fixed()
            ),
        }
    }
    outln!("written: {}", d.dir.join("fits.json").display());
    Ok(())
}

pub(super) fn report(d: &DirArgs) -> anyhow::Result<()> {
    let (meta, points, curves) = load(&d.dir)?;
    let mut rows: Vec<(String, String)> = Vec::new();
    if let Some(m) = &meta {
        rows.push((
            "scenario".into(),
            format!("{:?}: {}", m.scenario, m.target).to_lowercase(),
        ));
        rows.push(("mover".into(), m.command.join(" ")));
        rows.push(("lors".into(), m.lors_version.clone()));
        rows.push((
            "host".into(),
            format!(
                "{} ({}; {} CPUs, {}; Linux {})",
                m.host, m.cpu, m.cpus, m.memory, m.kernel
            ),
        ));
        rows.push(("started".into(), crate::commands::utc(m.started)));
        let p = &m.plan;
        rows.push((
            "plan".into(),
            format!(
                "sizes {}; parallel {:?}; streams {:?}; {} repetitions",
                p.sizes
                    .iter()
                    .map(|&s| format!("{:#}", Bytes(s)))
                    .collect::<Vec<_>>()
                    .join(", "),
                p.parallel,
                p.streams,
                p.reps
            ),
        ));
    }
    let html = lors_bench::report::html("lors bench report", &rows, &points, &curves);
    let out = d.dir.join("report.html");
    write_atomic(&out, html.as_bytes())?;
    for var in analysis::Var::ALL {
        let along: Vec<&Curve> = curves.iter().filter(|c| c.var == var).collect();
        if !along.is_empty() {
            write_atomic(
                &d.dir.join(format!("plot-{}.svg", var.name())),
                lors_bench::report::svg(var, &along).as_bytes(),
            )?;
        }
    }
    if d.json {
        outln!(
            "{}",
            serde_json::json!({ "report": out, "curves": curves.len() })
        );
    } else {
        outln!("written: {} ({} curves)", out.display(), curves.len());
    }
    Ok(())
}

pub(super) fn predict(p: &PredictArgs) -> anyhow::Result<()> {
    let (_, _, curves) = load(&p.dir)?;
    let q = Config {
        size: p.size,
        parallel: usize::from(p.parallel),
        streams: usize::from(p.streams),
    };
    let pred = analysis::predict(&curves, q).map_err(|e| anyhow::anyhow!("{e}"))?;
    if p.json {
        outln!("{}", serde_json::to_string_pretty(&pred)?);
    } else {
        outln!("{pred}");
    }
    Ok(())
}
