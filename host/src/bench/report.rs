//! The benchmark's table, CSV, JSON and charts.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{
    BenchOp, FLOOR_VARIANT, Measurement, Outcome, Timing, chart, is_default_run, parse_dtype,
};
use crate::DType;
use crate::DeviceInfo;
use crate::error::{Error, Result};
use crate::shape::Shape;

/// Everything one benchmark run measured, with where and when.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub device: DeviceInfo,
    /// UTC, ISO 8601.
    pub date: String,
    /// The commit the binary was built from.
    pub git_commit: String,
    /// What was timed: `softmax`, `log-softmax` or `backward` (absent in older reports:
    /// softmax).
    #[serde(default = "default_op")]
    pub op: String,
    /// The element type of every tensor: `f32`, `bf16` or `f16` (absent in older reports:
    /// f32).
    #[serde(default = "default_dtype")]
    pub dtype: String,
    /// The library's kernels as loaded, e.g. `sm_90 cubin` or `sm_80 PTX (compiled by the
    /// driver)` (empty in older reports: not recorded).
    #[serde(default)]
    pub kernels: String,
    pub measurements: Vec<Measurement>,
}

fn default_op() -> String {
    BenchOp::Softmax.name().into()
}

fn default_dtype() -> String {
    DType::F32.name().into()
}

impl Report {
    pub fn new(
        device: DeviceInfo,
        op: BenchOp,
        dtype: DType,
        measurements: Vec<Measurement>,
    ) -> Self {
        Report {
            device,
            date: utc_now(),
            git_commit: env!("SOFTMAX_GIT_COMMIT").into(),
            op: op.name().into(),
            dtype: dtype.name().into(),
            kernels: String::new(),
            measurements,
        }
    }

    /// The operation measured (softmax when the report names none this build knows).
    pub fn bench_op(&self) -> BenchOp {
        self.op.parse().unwrap_or_default()
    }

    /// The element type measured (f32 when the report names none this build knows).
    pub fn bench_dtype(&self) -> DType {
        parse_dtype(&self.dtype).unwrap_or(DType::F32)
    }

    /// The start of every file name this report writes: `<device-slug>` for f32 softmax
    /// (`nvidia-h200`), `<device-slug>-<op>-<dtype>` otherwise (`nvidia-h200-backward-f32`).
    pub fn file_stem(&self) -> String {
        let (op, dtype) = (self.bench_op(), self.bench_dtype());
        if is_default_run(op, dtype) {
            self.device.slug()
        } else {
            format!("{}-{}-{}", self.device.slug(), op.name(), dtype.name())
        }
    }

    /// How the table and charts name what was measured: `f32` for the default run, else e.g.
    /// `bf16 log-softmax`.
    fn what(&self) -> String {
        let (op, dtype) = (self.bench_op(), self.bench_dtype());
        if is_default_run(op, dtype) {
            dtype.name().into()
        } else {
            format!("{} {}", dtype.name(), op.name())
        }
    }

    /// Shapes in the order they were measured.
    pub fn shapes(&self) -> Vec<Shape> {
        let mut shapes: Vec<Shape> = Vec::new();
        for shape in self.measurements.iter().filter_map(|m| m.shape().ok()) {
            if !shapes.contains(&shape) {
                shapes.push(shape);
            }
        }
        shapes
    }

    /// The timing mode that headlines this report (charts, quoted numbers): isolated where it
    /// was measured, else back-to-back (all that older reports hold).
    pub fn headline_timing(&self) -> Timing {
        if self
            .measurements
            .iter()
            .any(|m| m.timing == Timing::Isolated)
        {
            Timing::Isolated
        } else {
            Timing::BackToBack
        }
    }

    /// One table per shape, a section per timing mode measured (isolated first), each with
    /// variant, ms, GB/s, % of copy, speed-up over the slowest of its section and kernels.
    /// The floor has no speed-up.
    pub fn table(&self) -> String {
        let mut text = String::new();
        for shape in self.shapes() {
            let _ = writeln!(
                text,
                "\n{shape} {} ({:.1} MB per tensor)",
                self.what(),
                shape.len() as f64 * f64::from(self.bench_dtype().bytes()) * 1e-6
            );
            for timing in Timing::ALL {
                let rows: Vec<&Measurement> = self
                    .measurements
                    .iter()
                    .filter(|m| m.timing == timing && m.shape().ok() == Some(shape))
                    .collect();
                if rows.is_empty() {
                    continue;
                }
                write_section(&mut text, timing, &rows);
            }
        }
        text
    }

    /// `variant,dtype,rows,cols,median_ms,gbps,pct_of_copy,timing`, one line per timed
    /// measurement.
    pub fn csv(&self) -> String {
        let mut text = String::from("variant,dtype,rows,cols,median_ms,gbps,pct_of_copy,timing\n");
        for m in &self.measurements {
            if let Outcome::Timed {
                median_ms,
                gbps,
                pct_of_copy,
            } = m.outcome
            {
                let _ = writeln!(
                    text,
                    "{},{},{},{},{median_ms:.6},{gbps:.2},{pct_of_copy:.2},{}",
                    m.variant, m.dtype, m.rows, m.cols, m.timing
                );
            }
        }
        text
    }

    /// Reads a report written by [`Report::write`] (its `.json`), refusing one whose
    /// measurements name a shape that does not exist or a timing that is not a finite,
    /// non-negative number.
    pub fn load(json: &Path) -> Result<Self> {
        let io = |e: std::io::Error| Error::Io {
            what: format!("reading {}", json.display()),
            source: e,
        };
        let text = std::fs::read_to_string(json).map_err(io)?;
        let report: Report =
            serde_json::from_str(&text).map_err(|e| io(std::io::Error::other(e)))?;
        for (i, m) in report.measurements.iter().enumerate() {
            if let Some(defect) = m.defect() {
                let what = format!(
                    "measurement {i} ({} {}x{}): {defect}",
                    m.variant, m.rows, m.cols
                );
                return Err(io(std::io::Error::other(what)));
            }
        }
        Ok(report)
    }

    /// Draws the charts of this report into `dir` (PNG and SVG).
    pub fn draw_charts(&self, dir: &Path) -> Result<()> {
        chart::draw_all(self, dir)
    }

    /// Writes `<file stem>.csv`, `.json` and the charts into `dir` (see [`Report::file_stem`]).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let io = |e: std::io::Error| Error::Io {
            what: format!("writing results to {}", dir.display()),
            source: e,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let stem = dir.join(self.file_stem());
        std::fs::write(stem.with_extension("csv"), self.csv()).map_err(io)?;
        let json = serde_json::to_string_pretty(self).map_err(|e| io(std::io::Error::other(e)))?;
        std::fs::write(stem.with_extension("json"), json).map_err(io)?;
        chart::draw_all(self, dir)
    }
}

/// One timing mode's part of a shape's table: a line naming the mode, a header, and a line
/// per measurement.
fn write_section(text: &mut String, timing: Timing, rows: &[&Measurement]) {
    let how = match timing {
        Timing::Isolated => "the L2 flushed before each launch, one launch per sample",
        Timing::BackToBack => "about 0.5 ms of consecutive launches per sample",
    };
    let _ = writeln!(text, "  {timing}: {how}");
    let slowest = rows
        .iter()
        .filter(|m| m.variant != FLOOR_VARIANT)
        .filter_map(|m| m.median_ms())
        .fold(0.0, f64::max);
    let _ = writeln!(
        text,
        "  {:<22} {:>10} {:>9} {:>8} {:>9}  kernels",
        "variant", "ms", "GB/s", "% copy", "speed-up"
    );
    for m in rows {
        let kernels = m.kernels.join(" + ");
        let _ = match &m.outcome {
            Outcome::Timed {
                median_ms,
                gbps,
                pct_of_copy,
            } => {
                let speed_up = if m.variant == FLOOR_VARIANT {
                    format!("{:>9}", "-")
                } else {
                    format!("{:>8.1}x", slowest / median_ms)
                };
                writeln!(
                    text,
                    "  {:<22} {:>10.4} {:>9.0} {:>7.1}% {speed_up}  {kernels}",
                    m.variant, median_ms, gbps, pct_of_copy,
                )
            }
            Outcome::Failed(why) => {
                writeln!(text, "  {:<22} FAILED (not timed): {why}", m.variant)
            }
            Outcome::Unsupported(why) => writeln!(text, "  {:<22} n/a: {why}", m.variant),
        };
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> DeviceInfo {
        crate::bench::fixtures::h200()
    }

    #[test]
    fn file_names_carry_op_and_dtype_unless_default() {
        let stem = |op, dtype| Report::new(device(), op, dtype, Vec::new()).file_stem();
        assert_eq!(stem(BenchOp::Softmax, DType::F32), "nvidia-h200");
        assert_eq!(
            stem(BenchOp::Backward, DType::F32),
            "nvidia-h200-backward-f32"
        );
        assert_eq!(
            stem(BenchOp::Softmax, DType::Bf16),
            "nvidia-h200-softmax-bf16"
        );
        assert_eq!(
            stem(BenchOp::LogSoftmax, DType::F16),
            "nvidia-h200-log-softmax-f16"
        );
    }

    #[test]
    fn reports_without_op_dtype_and_kernels_are_f32_softmax_of_unrecorded_kernels() {
        let mut report = Report::new(device(), BenchOp::Backward, DType::Bf16, Vec::new());
        report.kernels = "sm_80 PTX (compiled by the driver)".into();
        let mut json = serde_json::to_value(report).unwrap();
        assert_eq!(json["op"], "backward");
        assert_eq!(json["dtype"], "bf16");
        assert_eq!(json["kernels"], "sm_80 PTX (compiled by the driver)");
        let object = json.as_object_mut().unwrap();
        object.remove("op");
        object.remove("dtype");
        object.remove("kernels");
        let old: Report = serde_json::from_value(json).unwrap();
        assert_eq!(
            (old.bench_op(), old.bench_dtype()),
            (BenchOp::Softmax, DType::F32)
        );
        assert_eq!(old.kernels, "");
        assert_eq!(old.file_stem(), "nvidia-h200");
    }

    /// A timed measurement of 2×3 `bf16` data.
    fn timed(variant: &str, median_ms: f64, pct_of_copy: f64, timing: Timing) -> Measurement {
        Measurement {
            variant: variant.into(),
            dtype: "bf16".into(),
            rows: 2,
            cols: 3,
            kernels: vec![format!("{variant}_kernel")],
            outcome: Outcome::Timed {
                median_ms,
                gbps: 1.0,
                pct_of_copy,
            },
            timing,
        }
    }

    #[test]
    fn csv_header_and_dtype_and_timing_columns() {
        let report = Report::new(
            device(),
            BenchOp::Backward,
            DType::Bf16,
            vec![
                timed("auto", 0.5, 90.0, Timing::Isolated),
                timed("auto", 0.25, 95.0, Timing::BackToBack),
            ],
        );
        assert_eq!(
            report.csv(),
            "variant,dtype,rows,cols,median_ms,gbps,pct_of_copy,timing\n\
             auto,bf16,2,3,0.500000,1.00,90.00,isolated\n\
             auto,bf16,2,3,0.250000,1.00,95.00,back-to-back\n"
        );
    }

    #[test]
    fn timing_names_round_trip_through_json_and_text() {
        for timing in Timing::ALL {
            let json = serde_json::to_value(timing).unwrap();
            assert_eq!(json, timing.name());
            assert_eq!(serde_json::from_value::<Timing>(json).unwrap(), timing);
            assert_eq!(timing.name().parse::<Timing>(), Ok(timing));
        }
        assert!("both".parse::<Timing>().is_err());
        assert!(serde_json::from_value::<Timing>("sideways".into()).is_err());
    }

    #[test]
    fn timing_modes_parse_and_list_their_timings() {
        use crate::bench::TimingModes;
        assert_eq!(TimingModes::default(), TimingModes::Both);
        for name in TimingModes::NAMES {
            let modes: TimingModes = name.parse().unwrap();
            assert_eq!(modes.name(), name);
        }
        assert_eq!(TimingModes::Isolated.timings(), [Timing::Isolated]);
        assert_eq!(TimingModes::BackToBack.timings(), [Timing::BackToBack]);
        let both = TimingModes::Both.timings();
        assert_eq!(both.len(), 2);
        assert!(both.contains(&Timing::Isolated) && both.contains(&Timing::BackToBack));
        let refused = "isolate".parse::<TimingModes>().unwrap_err();
        assert!(
            refused.contains("expected isolated, back-to-back or both"),
            "{refused}"
        );
    }

    #[test]
    fn measurements_without_timing_are_back_to_back() {
        let report = Report::new(
            device(),
            BenchOp::Softmax,
            DType::Bf16,
            vec![timed("auto", 0.5, 90.0, Timing::Isolated)],
        );
        let mut json = serde_json::to_value(&report).unwrap();
        let first = &mut json["measurements"][0];
        assert_eq!(first["timing"], "isolated");
        first.as_object_mut().unwrap().remove("timing");
        let old: Report = serde_json::from_value(json).unwrap();
        assert_eq!(old.measurements[0].timing, Timing::BackToBack);
        assert_eq!(old.headline_timing(), Timing::BackToBack);
        assert_eq!(report.headline_timing(), Timing::Isolated);
    }

    #[test]
    fn saved_runs_from_before_the_timing_modes_load_as_back_to_back() {
        let saved = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/bench-run-softmax-bf16.json");
        let report = Report::load(&saved).expect("the saved run loads");
        assert!(!report.measurements.is_empty());
        assert!(
            report
                .measurements
                .iter()
                .all(|m| m.timing == Timing::BackToBack)
        );
        let table = report.table();
        assert!(table.contains("  back-to-back: "), "{table}");
        assert!(!table.contains("  isolated: "), "{table}");
    }

    #[test]
    fn the_table_has_a_section_per_mode_and_the_floor() {
        let report = Report::new(
            device(),
            BenchOp::Softmax,
            DType::Bf16,
            vec![
                timed("copy", 0.01, 100.0, Timing::BackToBack),
                timed("auto", 0.02, 50.0, Timing::BackToBack),
                timed("copy", 0.02, 100.0, Timing::Isolated),
                timed(FLOOR_VARIANT, 0.005, 400.0, Timing::Isolated),
                timed("auto", 0.04, 50.0, Timing::Isolated),
            ],
        );
        let table = report.table();
        let isolated = table.find("  isolated: ").expect("an isolated section");
        let back_to_back = table
            .find("  back-to-back: ")
            .expect("a back-to-back section");
        assert!(isolated < back_to_back, "isolated comes first:\n{table}");
        let line = |start: &str| {
            table
                .lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no `{start}` line in:\n{table}"))
        };
        let floor = line("  floor ");
        assert!(floor.contains("400.0%"), "{floor}");
        assert!(floor.contains("floor_kernel"), "{floor}");
        assert!(!floor.contains('x'), "the floor has no speed-up: {floor}");
        // The speed-up is over the slowest of the same mode, not counting the floor.
        let autos: Vec<&str> = table.lines().filter(|l| l.starts_with("  auto ")).collect();
        assert_eq!(autos.len(), 2, "{table}");
        assert!(autos.iter().all(|l| l.contains(" 1.0x ")), "{table}");
        assert_eq!(table.matches("  variant ").count(), 2, "{table}");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
