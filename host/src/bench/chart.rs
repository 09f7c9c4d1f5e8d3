//! Roofline-style charts (PNG and SVG): one for the seeds' width sweep (GB/s, with the copy
//! drawn across) and one for the LLM and odd shapes (% of the copy of the same tensor, since
//! their copies run at very different speeds). The legend sits beside the plot.
//!
//! Charts show one timing mode, the report's headline ([`Report::headline_timing`]): isolated
//! where it was measured, else back-to-back. The floor is left out (its GB/s on large tensors
//! would dwarf every line); it is in the table and the CSV.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{BenchOp, FLOOR_VARIANT, Outcome, Report, Timing, seed_sweep_shapes_for};
use crate::error::{Error, Result};
use crate::shape::Shape;

/// The font every label is drawn with, embedded so charts render on machines without fonts
/// (DejaVu Sans, Bitstream Vera license: `assets/DejaVuSans-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Distinct, saturated colours; the copy is always black.
const PALETTE: [RGBColor; 16] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 128),
    RGBColor(128, 0, 0),
    RGBColor(0, 128, 128),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(197, 176, 213),
];

const SIZE: (u32, u32) = (1400, 760);
const LEGEND_WIDTH: u32 = 270;

/// What the y axis shows.
#[derive(Clone, Copy)]
enum Metric {
    GigabytesPerSecond,
    PercentOfCopy,
}

/// One chart: an x position and tick label per shape.
struct ChartSpec {
    title: String,
    x_label: &'static str,
    metric: Metric,
    points: Vec<(Shape, f64, String)>,
}

pub(super) fn draw_all(report: &Report, dir: &Path) -> Result<()> {
    static REGISTER_FONT: Once = Once::new();
    REGISTER_FONT.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
    let (op, dtype) = (report.bench_op(), report.bench_dtype());
    let sweep = seed_sweep_shapes_for(dtype);
    let measured = report.shapes();
    let device = &report.device.name;
    let what = match op {
        BenchOp::Softmax => format!("Softmax {}", dtype.name()),
        BenchOp::LogSoftmax => format!("Log-softmax {}", dtype.name()),
        BenchOp::Backward => format!("Softmax backward {}", dtype.name()),
    };
    let per_tensor = match op {
        BenchOp::Backward => "~200 MB per input tensor",
        BenchOp::Softmax | BenchOp::LogSoftmax => "~200 MB per tensor",
    };
    let seed = ChartSpec {
        title: format!("{what}, {per_tensor}, {device}"),
        x_label: "row width (columns)",
        metric: Metric::GigabytesPerSecond,
        points: measured
            .iter()
            .filter(|s| sweep.contains(s))
            .map(|&s| (s, (s.cols() as f64).log2(), s.cols().to_string()))
            .collect(),
    };
    let others = ChartSpec {
        title: format!("{what}, LLM and odd shapes, {device}"),
        x_label: "rows x cols",
        metric: Metric::PercentOfCopy,
        points: measured
            .iter()
            .filter(|s| !sweep.contains(s))
            .enumerate()
            .map(|(i, &s)| (s, i as f64, s.to_string()))
            .collect(),
    };
    for (name, spec) in [("seed-sweep", seed), ("llm-shapes", others)] {
        if spec.points.is_empty() {
            continue;
        }
        let stem = dir.join(format!("{}-{name}", report.file_stem()));
        let png = stem.with_extension("png");
        let svg = stem.with_extension("svg");
        plot(
            BitMapBackend::new(&png, SIZE).into_drawing_area(),
            &spec,
            report,
        )
        .map_err(chart_error)?;
        plot(
            SVGBackend::new(&svg, SIZE).into_drawing_area(),
            &spec,
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

/// The metric of `variant` at each of the spec's points where it was timed in `timing`.
fn series(report: &Report, spec: &ChartSpec, variant: &str, timing: Timing) -> Vec<(f64, f64)> {
    spec.points
        .iter()
        .filter_map(|(shape, x, _)| {
            let m = report.measurements.iter().find(|m| {
                m.variant == variant && m.timing == timing && m.shape().ok() == Some(*shape)
            })?;
            match (m.outcome.clone(), spec.metric) {
                (Outcome::Timed { gbps, .. }, Metric::GigabytesPerSecond) => Some((*x, gbps)),
                (Outcome::Timed { pct_of_copy, .. }, Metric::PercentOfCopy) => {
                    Some((*x, pct_of_copy))
                }
                _ => None,
            }
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
    let (plot_area, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
    let timing = report.headline_timing();
    let mut variants: Vec<&str> = vec!["copy"];
    for m in &report.measurements {
        if m.timing == timing
            && m.variant != FLOOR_VARIANT
            && !variants.contains(&m.variant.as_str())
        {
            variants.push(&m.variant);
        }
    }
    let all: Vec<Vec<(f64, f64)>> = variants
        .iter()
        .map(|v| series(report, spec, v, timing))
        .collect();
    let largest = all.iter().flatten().map(|p| p.1).fold(100.0, f64::max);
    let y_max = largest * 1.06;
    if !y_max.is_finite() {
        return Err(format!("a value of {largest:e} does not fit a chart"));
    }
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
    let backward = report.bench_op() == BenchOp::Backward;
    let y_description = match (spec.metric, backward) {
        (Metric::GigabytesPerSecond, false) => "GB/s (input read once + output written once)",
        (Metric::GigabytesPerSecond, true) => "GB/s (y and dy read once + dx written once)",
        (Metric::PercentOfCopy, false) => "% of a device-to-device copy of the same tensor",
        (Metric::PercentOfCopy, true) => "% of the GB/s of a copy of y (copy-equivalent)",
    };
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(&spec.title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(72)
        .build_cartesian_2d(x_min..x_max, 0.0..y_max)
        .map_err(error)?;
    chart
        .configure_mesh()
        .x_desc(spec.x_label)
        .y_desc(y_description)
        .x_labels(labels.len() * 2 + 1)
        .x_label_formatter(&|x| {
            labels
                .iter()
                .find(|(at, _)| (at - x).abs() < 0.26)
                .map(|(_, l)| l.clone())
                .unwrap_or_default()
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(error)?;
    let colors: Vec<RGBColor> = (0..variants.len())
        .map(|i| {
            if i == 0 {
                BLACK
            } else {
                PALETTE[(i - 1) % PALETTE.len()]
            }
        })
        .collect();
    for (i, points) in all.iter().enumerate() {
        let style = colors[i].stroke_width(if i == 0 { 3 } else { 2 });
        if i == 0 {
            chart
                .draw_series(DashedLineSeries::new(points.clone(), 10, 6, style))
                .map_err(error)?;
        } else {
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(error)?;
        }
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&p| Circle::new(p, 3, colors[i].filled())),
            )
            .map_err(error)?;
    }
    let timing_label = match timing {
        Timing::Isolated => "isolated launches (L2 flushed)",
        Timing::BackToBack => "back-to-back launches",
    };
    legend_area
        .draw(&Text::new(timing_label, (10, 30), ("sans-serif", 16)))
        .map_err(error)?;
    for (i, variant) in variants.iter().enumerate() {
        let y = 70 + 24 * i as i32;
        let label = if i == 0 { "copy (roofline)" } else { variant };
        legend_area
            .draw(&PathElement::new(
                vec![(10, y), (40, y)],
                colors[i].stroke_width(3),
            ))
            .map_err(error)?;
        legend_area
            .draw(&Text::new(
                label.to_string(),
                (50, y - 8),
                ("sans-serif", 16),
            ))
            .map_err(error)?;
    }
    root.present().map_err(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use crate::bench::{Measurement, fixtures, seed_sweep_shapes};

    fn measurement(variant: &str, shape: Shape, gbps: f64, timing: Timing) -> Measurement {
        fixtures::timed(variant, shape.rows(), shape.cols(), gbps, timing)
    }

    fn report(measurements: Vec<Measurement>) -> Report {
        Report::new(fixtures::h200(), BenchOp::Softmax, DType::F32, measurements)
    }

    #[test]
    fn charts_use_isolated_measurements_when_there_are_any() {
        let shape = seed_sweep_shapes()[0];
        let spec = ChartSpec {
            title: String::new(),
            x_label: "",
            metric: Metric::GigabytesPerSecond,
            points: vec![(shape, 5.0, String::new())],
        };
        let back_to_back = vec![
            measurement("copy", shape, 4000.0, Timing::BackToBack),
            measurement("auto", shape, 3900.0, Timing::BackToBack),
        ];
        let old = report(back_to_back.clone());
        assert_eq!(
            series(&old, &spec, "auto", old.headline_timing()),
            [(5.0, 3900.0)]
        );
        let mut both = back_to_back;
        both.extend([
            measurement("copy", shape, 3000.0, Timing::Isolated),
            measurement(FLOOR_VARIANT, shape, 90_000.0, Timing::Isolated),
            measurement("auto", shape, 2900.0, Timing::Isolated),
        ]);
        let new = report(both);
        assert_eq!(new.headline_timing(), Timing::Isolated);
        assert_eq!(
            series(&new, &spec, "auto", new.headline_timing()),
            [(5.0, 2900.0)]
        );
        let dir = std::env::temp_dir().join(format!("softmax-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        draw_all(&new, &dir).expect("charts of a run with both modes and the floor");
        assert!(dir.join("nvidia-h200-seed-sweep.svg").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
