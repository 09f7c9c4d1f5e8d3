//! Roofline-style charts (PNG and SVG): GB/s per variant with the copy drawn across, one chart
//! for the seeds' width sweep and one for the LLM shapes.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Outcome, Report, seed_sweep_shapes};
use crate::error::{Error, Result};
use crate::shape::Shape;

/// The font every label is drawn with, embedded so charts render on machines without fonts
/// (DejaVu Sans, Bitstream Vera license: `assets/DejaVuSans-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// One chart: an x position and label per shape, and GB/s per series.
struct ChartSpec {
    title: String,
    x_label: &'static str,
    /// The shapes along x, with the x coordinate of each and its tick label.
    points: Vec<(Shape, f64, String)>,
}

pub(super) fn draw_all(report: &Report, dir: &Path) -> Result<()> {
    static REGISTER_FONT: Once = Once::new();
    REGISTER_FONT.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
    let sweep = seed_sweep_shapes();
    let measured = report.shapes();
    let seed_points: Vec<(Shape, f64, String)> = measured
        .iter()
        .filter(|s| sweep.contains(s))
        .map(|&s| (s, (s.cols as f64).log2(), s.cols.to_string()))
        .collect();
    let other_points: Vec<(Shape, f64, String)> = measured
        .iter()
        .filter(|s| !sweep.contains(s))
        .enumerate()
        .map(|(i, &s)| (s, i as f64, s.to_string()))
        .collect();
    let device = &report.device.name;
    let charts = [
        (
            "seed-sweep",
            ChartSpec {
                title: format!("Softmax f32, ~200 MB per tensor, {device}"),
                x_label: "row width (columns)",
                points: seed_points,
            },
        ),
        (
            "llm-shapes",
            ChartSpec {
                title: format!("Softmax f32, LLM and odd shapes, {device}"),
                x_label: "rows x cols",
                points: other_points,
            },
        ),
    ];
    for (name, spec) in charts.iter().filter(|(_, spec)| !spec.points.is_empty()) {
        let stem = dir.join(format!("{}-{name}", report.device.slug()));
        let png = stem.with_extension("png");
        let svg = stem.with_extension("svg");
        plot(
            BitMapBackend::new(&png, (1280, 720)).into_drawing_area(),
            spec,
            report,
        )
        .map_err(chart_error)?;
        plot(
            SVGBackend::new(&svg, (1280, 720)).into_drawing_area(),
            spec,
            report,
        )
        .map_err(chart_error)?;
    }
    Ok(())
}

fn chart_error(error: impl std::fmt::Display) -> Error {
    Error::Io {
        what: "drawing a chart".into(),
        source: std::io::Error::other(error.to_string()),
    }
}

/// GB/s of `variant` at each of the spec's points where it was timed.
fn series(report: &Report, spec: &ChartSpec, variant: &str) -> Vec<(f64, f64)> {
    spec.points
        .iter()
        .filter_map(|(shape, x, _)| {
            report
                .measurements
                .iter()
                .find(|m| m.variant == variant && m.shape() == *shape)
                .and_then(|m| match m.outcome {
                    Outcome::Timed { gbps, .. } => Some((*x, gbps)),
                    _ => None,
                })
        })
        .collect()
}

fn plot<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    spec: &ChartSpec,
    report: &Report,
) -> std::result::Result<(), String> {
    let error = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(error)?;
    let mut variants: Vec<&str> = Vec::new();
    for m in &report.measurements {
        if m.variant != "copy" && !variants.contains(&m.variant.as_str()) {
            variants.push(&m.variant);
        }
    }
    let copy = series(report, spec, "copy");
    let y_max = report
        .measurements
        .iter()
        .filter_map(|m| match m.outcome {
            Outcome::Timed { gbps, .. } => Some(gbps),
            _ => None,
        })
        .fold(100.0, f64::max)
        * 1.08;
    let x_min = spec
        .points
        .iter()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        - 0.3;
    let x_max = spec
        .points
        .iter()
        .map(|p| p.1)
        .fold(f64::NEG_INFINITY, f64::max)
        + 0.3;
    let labels: Vec<(f64, String)> = spec
        .points
        .iter()
        .map(|(_, x, label)| (*x, label.clone()))
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(&spec.title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(72)
        .build_cartesian_2d(x_min..x_max, 0.0..y_max)
        .map_err(error)?;
    chart
        .configure_mesh()
        .x_desc(spec.x_label)
        .y_desc("GB/s (input read once + output written once)")
        .x_labels(labels.len() * 2 + 1)
        .x_label_formatter(&|x| {
            labels
                .iter()
                .find(|(at, _)| (at - x).abs() < 0.26)
                .map(|(_, l)| l.clone())
                .unwrap_or_default()
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(error)?;
    chart
        .draw_series(DashedLineSeries::new(
            copy.clone(),
            10,
            6,
            BLACK.stroke_width(3),
        ))
        .map_err(error)?
        .label("device-to-device copy (roofline)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3)));
    for (index, variant) in variants.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let points = series(report, spec, variant);
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(error)?
            .label(*variant)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(error)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(error)?;
    root.present().map_err(error)
}
