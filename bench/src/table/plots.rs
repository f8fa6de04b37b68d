//! The plots of `bench table`, written as SVG: end-to-end latency CDF and throughput
//! against offered load.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// One engine's curve.
pub struct Series<'a> {
    pub name: &'a str,
    pub points: Vec<(f64, f64)>,
}

const COLOURS: [RGBColor; 4] = [
    RGBColor(200, 60, 40),
    RGBColor(30, 110, 200),
    RGBColor(40, 150, 60),
    RGBColor(120, 120, 120),
];

/// The empirical CDF of `latencies` over `requests` requests: the fraction of all
/// requests complete within each latency (requests that never completed keep the curve
/// below 1).
pub fn cdf(latencies: &[f64], requests: usize) -> Vec<(f64, f64)> {
    let mut v = latencies.to_vec();
    v.sort_by(f64::total_cmp);
    v.iter()
        .enumerate()
        .map(|(i, &t)| (t, (i + 1) as f64 / requests.max(1) as f64))
        .collect()
}

/// Draws `series` (points from [`cdf`]) on a log-scaled latency axis.
pub fn latency_cdf(path: &Path, title: &str, series: &[Series<'_>]) -> Result<()> {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let lo = match xs.clone().fold(f64::INFINITY, f64::min) {
        // No request completed: an empty chart over a default range.
        lo if lo.is_finite() => lo.max(1e-3),
        _ => 0.1,
    };
    let hi = xs.fold(0.0, f64::max).max(lo * 10.0);
    let root = canvas(path)?;
    let mut chart = frame(&root, title)
        .build_cartesian_2d((lo / 1.5..hi * 1.5).log_scale(), 0.0..1.0)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("end-to-end latency, seconds (log scale)")
        .y_desc("fraction of requests completed")
        .draw()
        .map_err(plot_error)?;
    lines(&mut chart, series, false)?;
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// Draws throughput (tokens per minute) against offered load (percent of capacity).
pub fn throughput_vs_load(path: &Path, title: &str, series: &[Series<'_>]) -> Result<()> {
    let points = series.iter().flat_map(|s| s.points.iter());
    let x_hi = points.clone().map(|p| p.0).fold(0.0, f64::max) * 1.05;
    let y_hi = points.map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let root = canvas(path)?;
    let mut chart = frame(&root, title)
        .build_cartesian_2d(0.0..x_hi.max(1.0), 0.0..y_hi.max(1.0))
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("offered load, % of Fornax's measured capacity")
        .y_desc("generated tokens per minute")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(plot_error)?;
    lines(&mut chart, series, true)?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// An 800 x 500 white SVG canvas at `path`.
fn canvas(path: &Path) -> Result<DrawingArea<SVGBackend<'_>, Shift>> {
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    Ok(root)
}

/// A chart on `root` with its title and room for the axis labels.
fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70);
    builder
}

/// Draws each series as a labelled line in its colour, with a dot at each point when
/// `markers`.
fn lines<'a, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    series: &[Series<'_>],
    markers: bool,
) -> Result<()> {
    for (s, colour) in series.iter().zip(COLOURS) {
        let style = colour.stroke_width(2);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(plot_error)?
            .label(s.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        if markers {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
                .map_err(plot_error)?;
        }
    }
    Ok(())
}

fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    at: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)
}

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw the plot: {e}")
}
