//! The main job: every variant on every shape, beside a device-to-device copy of the same
//! tensor measured in the same run, with the peers (PyTorch, Triton) when they are available.
//!
//! Bytes are counted the same way for everyone: the input read once plus the output written
//! once (`2 · rows · cols · 4` for f32 softmax), so GB/s and % of copy compare across variants
//! and peers. With `--op` and `--dtype` other than f32 softmax, `auto` runs through the
//! operation API ([`Softmax::forward`], [`Softmax::backward`]) beside the copy and the peers;
//! backward moves `3 · rows · cols · bytes` (reads y and dy, writes dx), and its % of copy is
//! its GB/s over the copy's (copy-equivalent bandwidth).
//!
//! Two timing modes ([`Timing`]): *isolated* flushes the L2 before each launch and times that
//! launch alone; *back-to-back* times about 0.5 ms of consecutive launches. Each contender's
//! % of copy is taken against the copy timed in the same mode. Isolated runs also time the
//! floor: a one-thread kernel that loads one word and stores it, the least any launch costs.

mod chart;
pub mod coldstart;
mod operation;
pub mod overhead;
mod peers;
mod report;
mod timing;

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub use report::Report;
use timing::Contender;

use crate::DType;
use crate::Softmax;
use crate::error::Result;
use crate::shape::Shape;
use crate::variant::Variant;

/// Row widths of the seeds' sweep: 32, 64, …, 16384.
pub const SEED_SWEEP_WIDTHS: std::ops::RangeInclusive<u32> = 5..=14;

/// Bytes per tensor in the seeds' sweep (about 200 MB).
pub const SEED_SWEEP_TENSOR_BYTES: usize = 200 << 20;

/// What the benchmark times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BenchOp {
    /// Forward softmax (with `--dtype f32`: every variant).
    #[default]
    Softmax,
    /// Forward log-softmax.
    LogSoftmax,
    /// The softmax gradient `dx = y ⊙ (dy − Σ dy⊙y)` from the forward output and `dy`.
    Backward,
}

impl BenchOp {
    pub const NAMES: [&str; 3] = ["softmax", "log-softmax", "backward"];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::Softmax => "softmax",
            BenchOp::LogSoftmax => "log-softmax",
            BenchOp::Backward => "backward",
        }
    }

    /// Tensors one call reads or writes, each `rows × cols` elements: input and output
    /// forward; y, dy and dx backward.
    pub fn tensors(self) -> u64 {
        match self {
            BenchOp::Softmax | BenchOp::LogSoftmax => 2,
            BenchOp::Backward => 3,
        }
    }
}

impl std::fmt::Display for BenchOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BenchOp {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text.trim() {
            "softmax" => Ok(BenchOp::Softmax),
            "log-softmax" => Ok(BenchOp::LogSoftmax),
            "backward" => Ok(BenchOp::Backward),
            _ => Err(format!(
                "unknown op `{text}`: expected softmax, log-softmax or backward"
            )),
        }
    }
}

/// How a sample is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Timing {
    /// The L2 flushed before each launch, and that one launch alone between two events: what
    /// a call costs when its input comes from device memory and nothing overlaps it.
    Isolated,
    /// About 0.5 ms of consecutive launches between two events, inputs rotating over buffers
    /// of 4× the L2: throughput, with the gaps between launches included.
    BackToBack,
}

impl Timing {
    /// Both modes, in the order tables show them.
    pub const ALL: [Timing; 2] = [Timing::Isolated, Timing::BackToBack];

    /// The name on the command line, in CSV files and in JSON reports.
    pub fn name(self) -> &'static str {
        match self {
            Timing::Isolated => "isolated",
            Timing::BackToBack => "back-to-back",
        }
    }
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Timing {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        Timing::ALL
            .into_iter()
            .find(|t| t.name() == text.trim())
            .ok_or_else(|| format!("unknown timing `{text}`: expected isolated or back-to-back"))
    }
}

/// The timing of measurements saved before there were two modes: back-to-back.
fn timing_of_older_reports() -> Timing {
    Timing::BackToBack
}

/// Which timing modes a run measures (`--timing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TimingModes {
    /// Isolated only.
    Isolated,
    /// Back-to-back only.
    BackToBack,
    /// Both, each contender in each mode.
    #[default]
    Both,
}

impl TimingModes {
    pub const ALL: [TimingModes; 3] = [
        TimingModes::Isolated,
        TimingModes::BackToBack,
        TimingModes::Both,
    ];

    /// The command-line names, in the order of [`TimingModes::ALL`].
    pub const NAMES: [&str; 3] = [
        Self::ALL[0].name(),
        Self::ALL[1].name(),
        Self::ALL[2].name(),
    ];

    /// The command-line name.
    pub const fn name(self) -> &'static str {
        match self {
            TimingModes::Isolated => "isolated",
            TimingModes::BackToBack => "back-to-back",
            TimingModes::Both => "both",
        }
    }

    /// The modes measured, in the order they run.
    pub fn timings(self) -> &'static [Timing] {
        match self {
            TimingModes::Isolated => &[Timing::Isolated],
            TimingModes::BackToBack => &[Timing::BackToBack],
            TimingModes::Both => &[Timing::BackToBack, Timing::Isolated],
        }
    }
}

impl std::fmt::Display for TimingModes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TimingModes {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        TimingModes::ALL
            .into_iter()
            .find(|m| m.name() == text.trim())
            .ok_or_else(|| {
                format!("unknown timing `{text}`: expected isolated, back-to-back or both")
            })
    }
}

/// The variant name of the floor's measurements.
pub const FLOOR_VARIANT: &str = "floor";

/// Parses an element type as the command line spells it: `f32`, `bf16` or `f16`.
pub fn parse_dtype(text: &str) -> std::result::Result<DType, String> {
    DType::ALL
        .into_iter()
        .find(|d| d.name() == text.trim())
        .ok_or_else(|| format!("unknown dtype `{text}`: expected f32, bf16 or f16"))
}

/// Whether `op` and `dtype` are the default run (f32 softmax, every variant), whose files
/// keep their historical names.
pub fn is_default_run(op: BenchOp, dtype: DType) -> bool {
    op == BenchOp::Softmax && dtype == DType::F32
}

/// The seeds' sweep: widths 32…16384 with rows chosen for about 200 MB per f32 tensor.
pub fn seed_sweep_shapes() -> Vec<Shape> {
    seed_sweep_shapes_for(DType::F32)
}

/// The seeds' sweep for `dtype`: about 200 MB per input tensor of that type.
pub fn seed_sweep_shapes_for(dtype: DType) -> Vec<Shape> {
    SEED_SWEEP_WIDTHS
        .map(|log2| {
            let cols = 1usize << log2;
            shape(sweep_rows(dtype, cols), cols)
        })
        .collect()
}

/// Rows of a `cols`-wide tensor of `dtype` holding about [`SEED_SWEEP_TENSOR_BYTES`].
fn sweep_rows(dtype: DType, cols: usize) -> usize {
    SEED_SWEEP_TENSOR_BYTES / (dtype.bytes() as usize * cols)
}

/// LLM-vocabulary rows and the odd widths the production kernels are held to.
pub fn llm_shapes() -> Vec<Shape> {
    [
        (1, 32000),
        (1, 128256),
        (8, 128256),
        (32, 151936),
        (64, 151936),
        (128, 50257),
        (16, 262144),
        (1, 1048576),
        (4096, 1000),
        (65536, 100),
        (3, 100003),
    ]
    .into_iter()
    .map(|(rows, cols)| shape(rows, cols))
    .collect()
}

/// Widths every 64 columns across each dispatch boundary, at about 200 MB per tensor: a cliff
/// between neighbours shows up here.
pub fn boundary_shapes() -> Vec<Shape> {
    boundary_shapes_for(DType::F32)
}

/// [`boundary_shapes`] at about 200 MB per input tensor of `dtype`.
pub fn boundary_shapes_for(dtype: DType) -> Vec<Shape> {
    [960..=1152, 1984..=2176, 4032..=4224, 8128..=8320]
        .into_iter()
        .flat_map(|range| range.step_by(64))
        .map(|cols| shape(sweep_rows(dtype, cols), cols))
        .collect()
}

/// The grid's widths: common vocabularies (Llama 2, GPT-2, Llama 3, Qwen 2, Gemma), powers of
/// two, a megacolumn row and an odd width.
pub const GRID_COLS: [usize; 9] = [
    1000, 4096, 32000, 50257, 100003, 128256, 151936, 262144, 1048576,
];

/// The grid's largest input tensor: rows double while the tensor stays within this.
pub const GRID_TENSOR_BYTES: usize = 2 << 30;

/// The grid: for each of [`GRID_COLS`], rows 1, 2, 4, … while the input tensor of `dtype`
/// stays within [`GRID_TENSOR_BYTES`] (65536 rows and beyond for the narrow widths), widths
/// in order.
pub fn grid_shapes_for(dtype: DType) -> Vec<Shape> {
    let element = dtype.bytes() as usize;
    GRID_COLS
        .into_iter()
        .flat_map(|cols| {
            std::iter::successors(Some(1usize), |rows| rows.checked_mul(2))
                .take_while(move |rows| rows * cols * element <= GRID_TENSOR_BYTES)
                .map(move |rows| shape(rows, cols))
        })
        .collect()
}

/// A few shapes for a smoke run.
pub fn quick_shapes() -> Vec<Shape> {
    [(51200, 1024), (3200, 16384), (8, 128256), (3, 100003)]
        .into_iter()
        .map(|(r, c)| shape(r, c))
        .collect()
}

fn shape(rows: usize, cols: usize) -> Shape {
    Shape::new(rows, cols).expect("built-in shapes are valid")
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub shapes: Vec<Shape>,
    pub variants: Vec<Variant>,
    /// Timed samples per measurement (fewer for launches that take long).
    pub iters: usize,
    /// Launches before timing starts.
    pub warmup: usize,
    pub out_dir: PathBuf,
    pub device: u32,
    /// Run `bench/peers.py` (PyTorch and Triton) on the same shapes and show them beside.
    pub peers: bool,
    /// What is timed. Anything but f32 softmax times `auto` through the operation API
    /// (`variants` is then ignored).
    pub op: BenchOp,
    /// Element type of every tensor (input and output alike).
    pub dtype: DType,
    /// The timing modes measured.
    pub timing: TimingModes,
}

/// The result of one variant on one shape.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Measurement {
    pub variant: String,
    pub dtype: String,
    pub rows: usize,
    pub cols: usize,
    /// The kernels that ran (for `auto`, what it chose).
    pub kernels: Vec<String>,
    pub outcome: Outcome,
    /// How the samples were timed (absent in older reports: back-to-back).
    #[serde(default = "timing_of_older_reports")]
    pub timing: Timing,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Timed {
        median_ms: f64,
        gbps: f64,
        pct_of_copy: f64,
    },
    /// The variant gave a wrong result and was not timed.
    Failed(String),
    /// The variant refused the shape (for example rows too wide for registers).
    Unsupported(String),
}

impl Measurement {
    /// What one contender gave on one shape, element type and timing mode in this run.
    fn of(
        variant: impl Into<String>,
        dtype: DType,
        shape: Shape,
        kernels: Vec<String>,
        outcome: Outcome,
        timing: Timing,
    ) -> Self {
        Measurement {
            variant: variant.into(),
            dtype: dtype.name().into(),
            rows: shape.rows(),
            cols: shape.cols(),
            kernels,
            outcome,
            timing,
        }
    }

    /// The shape measured; an error for a saved report whose rows and columns no shape has.
    pub fn shape(&self) -> Result<Shape> {
        Shape::new(self.rows, self.cols)
    }

    /// Why this measurement cannot be shown: a shape that does not exist, or a timing that is
    /// not a finite, non-negative number (neither comes out of a run; both can be in a file).
    fn defect(&self) -> Option<String> {
        if let Err(error) = self.shape() {
            return Some(error.to_string());
        }
        let Outcome::Timed {
            median_ms,
            gbps,
            pct_of_copy,
        } = self.outcome
        else {
            return None;
        };
        [
            ("median_ms", median_ms),
            ("gbps", gbps),
            ("pct_of_copy", pct_of_copy),
        ]
        .into_iter()
        .find(|(_, value)| !(value.is_finite() && *value >= 0.0))
        .map(|(name, value)| format!("{name} is {value}, not a finite non-negative number"))
    }

    pub fn median_ms(&self) -> Option<f64> {
        match self.outcome {
            Outcome::Timed { median_ms, .. } => Some(median_ms),
            _ => None,
        }
    }
}

/// Bytes one call of `op` on `dtype` data moves at the minimum, the count every contender's
/// GB/s is computed from: each tensor read or written once (forward `2 · rows · cols · bytes`,
/// backward `3 · rows · cols · bytes`). A copy of the input moves what a forward call does.
pub fn traffic_bytes(op: BenchOp, dtype: DType, shape: Shape) -> u64 {
    op.tensors() * shape.len() as u64 * u64::from(dtype.bytes())
}

/// A timed outcome: GB/s from `bytes`, % of copy as GB/s over the copy's GB/s.
/// The rows each timing mode of a shape starts with: the copy of the input (`copy_bytes`) and,
/// timed isolated, the floor, which counts the timed call's `bytes` (its % of copy is the most
/// such a call could show). Also the copy's GB/s, which every other row's % of copy divides by.
fn reference_measurements(
    shape: Shape,
    dtype: DType,
    timing: Timing,
    medians: &timing::Medians,
    copy_bytes: u64,
    bytes: u64,
) -> (f64, Vec<Measurement>) {
    let copy_ms = medians.contenders[0];
    let copy_gbps = copy_bytes as f64 / (copy_ms * 1e-3) / 1e9;
    let measurement = |variant: &str, kernel: &str, outcome| {
        Measurement::of(variant, dtype, shape, vec![kernel.into()], outcome, timing)
    };
    let copy = measurement(
        "copy",
        "cuMemcpyDtoDAsync",
        timed_outcome(copy_bytes, copy_ms, copy_gbps),
    );
    let floor = medians.floor.map(|floor_ms| {
        measurement(
            FLOOR_VARIANT,
            timing::FLOOR_ENTRY,
            timed_outcome(bytes, floor_ms, copy_gbps),
        )
    });
    (copy_gbps, std::iter::once(copy).chain(floor).collect())
}

fn timed_outcome(bytes: u64, ms: f64, copy_gbps: f64) -> Outcome {
    let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
    Outcome::Timed {
        median_ms: ms,
        gbps,
        pct_of_copy: 100.0 * gbps / copy_gbps,
    }
}

/// Runs the benchmark and writes its results under `config.out_dir`.
pub fn run(config: &BenchConfig) -> Result<Report> {
    if !is_default_run(config.op, config.dtype) {
        return match config.dtype {
            DType::F32 => operation::run::<f32>(config),
            DType::Bf16 => operation::run::<half::bf16>(config),
            DType::F16 => operation::run::<half::f16>(config),
        };
    }
    // The benchmark's `auto` is what `host tune` chose where it ran, as in earlier runs.
    let mut softmax =
        Softmax::on_device(config.device)?.with_tune_cache(crate::autotune::default_path())?;
    let device = softmax.device().clone();
    let steps = config.shapes.len();
    let progress = ProgressBar::new(steps as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("valid template"),
    );
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let mut timer = timing::Timer::default();
    let mut measurements = Vec::new();
    for &shape in &config.shapes {
        let mut pools = timing::Pools::new(shape, device.l2_bytes as usize, &mut rng)?;
        // Correct first: a variant that fails (or refuses the shape) is reported, not timed.
        let mut verdicts = Vec::new();
        for &variant in &config.variants {
            progress.set_message(format!("{shape}: checking {variant}"));
            let verdict = pools.verify(&mut softmax, variant, &mut rng);
            let kernels = softmax.kernels_for(variant, shape).unwrap_or_default();
            verdicts.push((variant, verdict, kernels));
        }
        let contenders: Vec<Contender> = std::iter::once(Contender::Copy)
            .chain(
                verdicts
                    .iter()
                    .filter(|(_, verdict, _)| verdict.is_ok())
                    .map(|&(variant, _, _)| Contender::Variant(variant)),
            )
            .collect();
        for &timing in config.timing.timings() {
            progress.set_message(format!(
                "{shape}: timing {} contenders, {timing}",
                contenders.len()
            ));
            let medians = timer.measure(timing, &mut pools, &mut softmax, &contenders, config)?;
            let bytes = traffic_bytes(BenchOp::Softmax, DType::F32, shape);
            let (copy_gbps, references) =
                reference_measurements(shape, DType::F32, timing, &medians, bytes, bytes);
            measurements.extend(references);
            let timed = |ms: f64| timed_outcome(bytes, ms, copy_gbps);
            let mut timed_medians = medians.contenders[1..].iter();
            for (variant, verdict, kernels) in &verdicts {
                let outcome = match verdict {
                    Ok(()) => timed(
                        *timed_medians
                            .next()
                            .expect("one median per verified variant"),
                    ),
                    Err(outcome) => outcome.clone(),
                };
                measurements.push(Measurement::of(
                    variant.name(),
                    DType::F32,
                    shape,
                    kernels.clone(),
                    outcome,
                    timing,
                ));
            }
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    finish(config, &softmax, measurements)
}

/// Adds the peers (when asked for), then writes the report.
fn finish(
    config: &BenchConfig,
    softmax: &Softmax,
    mut measurements: Vec<Measurement>,
) -> Result<Report> {
    let device = softmax.device().clone();
    if config.peers {
        std::fs::create_dir_all(&config.out_dir).map_err(|source| crate::error::Error::Io {
            what: format!("creating {}", config.out_dir.display()),
            source,
        })?;
        measurements.extend(peers::run(&config.shapes, config, &measurements));
    }
    let mut report = Report::new(device, config.op, config.dtype, measurements);
    report.kernels = softmax.kernel_image().to_string();
    report.write(&config.out_dir)?;
    Ok(report)
}

/// Uniform random floats in [-8, 8].
fn random_values(rng: &mut SmallRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-8.0..8.0)).collect()
}

/// What the benchmark's unit tests build their reports from.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{Measurement, Outcome, Timing};

    pub(crate) use crate::runtime::driver::fixtures::h200;

    /// `variant` timed on f32 `rows × cols` at `gbps` in `timing` (1 ms, 100% of copy).
    pub(crate) fn timed(
        variant: &str,
        rows: usize,
        cols: usize,
        gbps: f64,
        timing: Timing,
    ) -> Measurement {
        Measurement {
            variant: variant.into(),
            dtype: "f32".into(),
            rows,
            cols,
            kernels: Vec::new(),
            outcome: Outcome::Timed {
                median_ms: 1.0,
                gbps,
                pct_of_copy: 100.0,
            },
            timing,
        }
    }
}

#[cfg(test)]
mod grid_tests {
    use super::*;

    #[test]
    fn the_grid_doubles_rows_while_a_tensor_fits_two_gib() {
        for dtype in [DType::F32, DType::Bf16] {
            let grid = grid_shapes_for(dtype);
            let element = dtype.bytes() as usize;
            for cols in GRID_COLS {
                let rows: Vec<usize> = grid
                    .iter()
                    .filter(|s| s.cols() == cols)
                    .map(|s| s.rows())
                    .collect();
                assert_eq!(rows[0], 1, "{cols}");
                assert!(
                    rows.windows(2).all(|w| w[1] == 2 * w[0]),
                    "{cols}: {rows:?}"
                );
                let last = *rows.last().expect("a width has rows");
                assert!(last * cols * element <= GRID_TENSOR_BYTES);
                assert!(2 * last * cols * element > GRID_TENSOR_BYTES, "{cols}");
            }
            // The narrow widths reach past 65536 rows.
            assert!(grid.iter().any(|s| s.cols() == 1000 && s.rows() > 65536));
        }
        assert_eq!(grid_shapes_for(DType::F32).len(), 127);
    }
}
