//! Shared by the GPU test binaries (each uses part of it): a harness that reports skipped
//! tests when there is no GPU (and fails them when one is required), seeded random inputs,
//! and checks against the reference.
#![allow(dead_code)]

pub mod kernels;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

use cust::memory::{CopyDestination, DeviceBuffer};
use cust::stream::Stream;
use cust::sys;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softmax::half::{bf16, f16};
use softmax::reference::{Deviation, deviation};
use softmax::{DType, Element, Error, Shape, Softmax, Variant};

/// An error as the tests report it: its text.
pub fn text<E: std::fmt::Display>(error: E) -> String {
    error.to_string()
}

/// A shape the test knows to be valid.
pub fn shape(rows: usize, cols: usize) -> Shape {
    Shape::new(rows, cols).expect("a shape")
}

/// Set (to anything but `0` or nothing) on a machine that has a GPU: there, a missing device
/// fails every GPU test instead of skipping it, so a broken driver cannot pass as "no GPU".
pub const REQUIRE_GPU: &str = "SOFTMAX_REQUIRE_GPU";

/// Whether [`REQUIRE_GPU`] is set.
pub fn gpu_required() -> bool {
    std::env::var_os(REQUIRE_GPU).is_some_and(|value| !value.is_empty() && value != "0")
}

/// A test: gets the device and a seeded generator, returns a one-line summary or a failure.
pub type Test = (
    &'static str,
    fn(&mut Softmax, &mut StdRng) -> Result<String, String>,
);

/// Runs `tests` (those whose name contains the first argument, if any) and exits non-zero if
/// one fails, or if the filter matches none. Without a device, reports each as skipped with the reason and exits zero, or,
/// when [`REQUIRE_GPU`] is set, as failed, exiting non-zero.
pub fn run_harness(tests: &[Test]) -> ExitCode {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let selected: Vec<&Test> = tests
        .iter()
        .filter(|(name, _)| name.contains(&filter))
        .collect();
    if selected.is_empty() {
        println!("no test matches the filter {filter:?}");
        println!("\ntest result: 0 passed, 1 failed");
        return ExitCode::FAILURE;
    }
    let seed = std::env::var("SOFTMAX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let mut softmax = match Softmax::new() {
        Ok(softmax) => softmax,
        Err(Error::NoDevice { reason }) => {
            let names: Vec<&str> = selected.iter().map(|(name, _)| *name).collect();
            return without_a_device(&names, &reason, gpu_required());
        }
        Err(error) => {
            eprintln!("opening the GPU failed for another reason than its absence: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "device: {}, kernels: {} (seed {seed}; replay with SOFTMAX_TEST_SEED={seed})",
        softmax.device().name,
        softmax.kernel_image()
    );
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in selected {
        let started = std::time::Instant::now();
        let mut rng = StdRng::seed_from_u64(seed);
        let outcome = catch_unwind(AssertUnwindSafe(|| test(&mut softmax, &mut rng)))
            .unwrap_or_else(|panic| {
                Err(format!(
                    "panicked: {:?}",
                    panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or(panic.downcast_ref::<&str>().copied())
                ))
            });
        let seconds = started.elapsed().as_secs_f64();
        match outcome {
            Ok(summary) => {
                passed += 1;
                println!("test {name} ... ok ({seconds:.1} s): {summary}");
            }
            Err(why) => {
                failed += 1;
                println!("test {name} ... FAILED ({seconds:.1} s): {why} [seed {seed}]");
            }
        }
    }
    println!("\ntest result: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The verdict without a device: every test skipped (exit 0), or, when a GPU is `required`,
/// every test failed (exit 1) with the reason on stderr.
fn without_a_device(names: &[&str], reason: &str, required: bool) -> ExitCode {
    let verdict = if required { "FAILED" } else { "skipped" };
    for name in names {
        println!("test {name} ... {verdict}: no CUDA device ({reason})");
    }
    if !required {
        println!(
            "\ntest result: 0 passed, 0 failed, {} skipped (no GPU)",
            names.len()
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "\ntest result: 0 passed, {} failed (no GPU, and {REQUIRE_GPU} is set)",
        names.len()
    );
    eprintln!(
        "{REQUIRE_GPU} is set but there is no CUDA device ({reason}): the GPU tests fail \
         rather than pass without running"
    );
    ExitCode::FAILURE
}

/// Uniform random values in `[-magnitude, magnitude]`.
pub fn random_matrix(rng: &mut StdRng, shape: Shape, magnitude: f32) -> Vec<f32> {
    (0..shape.len())
        .map(|_| rng.random_range(-magnitude..=magnitude))
        .collect()
}

/// A device buffer of `len` NaNs: anything a kernel leaves unwritten stays NaN.
pub fn poisoned(len: usize) -> Result<DeviceBuffer<f32>, String> {
    DeviceBuffer::from_slice(&vec![f32::NAN; len]).map_err(|e| e.to_string())
}

/// Why a variant failed a check.
#[derive(Debug)]
pub enum Failure {
    Refused(Error),
    Wrong(Deviation),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(error) => write!(f, "refused: {error}"),
            Failure::Wrong(deviation) => write!(f, "wrong result: {deviation:?}"),
        }
    }
}

/// Counts checks for a test's summary line.
#[derive(Default)]
pub struct Check {
    pub passed: usize,
    pub refused: usize,
    pub worst: f64,
}

impl Check {
    /// Runs `variant` on `input` into a poisoned output and compares with `expected`.
    pub fn variant(
        &mut self,
        softmax: &mut Softmax,
        variant: Variant,
        input: &[f32],
        expected: &[f64],
        shape: Shape,
        tolerance: f64,
    ) -> Result<(), Failure> {
        let cuda = |e: cust::error::CudaError| {
            Failure::Refused(Error::NoDevice {
                reason: e.to_string(),
            })
        };
        let device_input = DeviceBuffer::from_slice(input).map_err(cuda)?;
        let mut device_output =
            DeviceBuffer::from_slice(&vec![f32::NAN; shape.len()]).map_err(cuda)?;
        softmax
            .run(variant, &device_input, &mut device_output, shape)
            .map_err(Failure::Refused)?;
        softmax.synchronize().map_err(Failure::Refused)?;
        let mut output = vec![0.0; shape.len()];
        device_output.copy_to(&mut output[..]).map_err(cuda)?;
        let deviation = deviation(&output, expected, shape.cols());
        if !deviation.within(tolerance) {
            return Err(Failure::Wrong(deviation));
        }
        self.worst = self
            .worst
            .max(deviation.relative_l2)
            .max(deviation.worst_row_sum);
        self.passed += 1;
        Ok(())
    }

    pub fn summary(&self) -> String {
        format!(
            "{} runs matched the reference (worst error {:.1e}), {} refused as unsupported",
            self.passed, self.worst, self.refused
        )
    }
}

/// `expected` rounded to the output type `O`: what an exact kernel writes. Compared with the
/// unrounded values, f16's subnormal spacing (6e-8) alone is a relative error of ~0.4% on
/// softmax rows of 250,000 columns, whose values are ~4e-6.
pub fn as_written<O: Element>(expected: &[f64]) -> Vec<f64> {
    expected
        .iter()
        .map(|&e| {
            if e.is_finite() {
                f64::from(O::from_f32(e as f32).to_f32())
            } else {
                e
            }
        })
        .collect()
}

/// What the rows of an output hold, for [`check_rows`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowValues {
    /// Softmax probabilities: each element relative to its reference value, or, below the
    /// output type's smallest normal number, to that number (there the type's spacing is
    /// absolute: f16 subnormals are 6e-8 apart); and each row's sum against the sum of the
    /// reference as written (not 1: rounded to f16, a row of 200,003 equal subnormals sums to
    /// 1.0014). Element by element, a row of subnormals can be off by up to the tolerance
    /// times the smallest normal number in every element; the sum catches that.
    Probabilities,
    /// Log-probabilities: each element relative to its reference value, or, below 1 in
    /// magnitude, absolutely (near 0 what is left is the rounding of the scores).
    LogProbabilities,
}

/// The smallest positive normal number of `dtype`.
pub fn smallest_normal(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f64::from(f32::MIN_POSITIVE),
        DType::Bf16 => f64::from(bf16::MIN_POSITIVE.to_f32()),
        DType::F16 => f64::from(f16::MIN_POSITIVE.to_f32()),
    }
}

/// Checks each row of a `cols`-wide output of type `dtype` on its own against `expected` (the
/// reference as written in that type, see [`as_written`]), so that no row can hide in a norm
/// over the whole tensor: every element within `tolerance` (as [`RowValues`] measures it), a
/// non-finite reference matched exactly, and each probability row's sum within `tolerance`
/// of the reference's. Returns the worst error as a fraction of `tolerance`.
pub fn check_rows(
    actual: &[f32],
    expected: &[f64],
    cols: usize,
    values: RowValues,
    dtype: DType,
    tolerance: f64,
) -> Result<f64, String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "{} values for a reference of {}",
            actual.len(),
            expected.len()
        ));
    }
    let floor = match values {
        RowValues::Probabilities => smallest_normal(dtype),
        RowValues::LogProbabilities => 1.0,
    };
    let mut worst = 0.0_f64;
    let rows = actual.chunks(cols.max(1)).zip(expected.chunks(cols.max(1)));
    for (row, (actual, expected)) in rows.enumerate() {
        for (col, (&a, &e)) in actual.iter().zip(expected).enumerate() {
            let a = f64::from(a);
            // The kernels flush f32 results below the smallest normal to zero (documented):
            // such a value and a reference at most that small (rounded to the output type, a
            // reference just below it can become it) agree.
            let flushed = f64::from(f32::MIN_POSITIVE);
            let error = if a.abs() < flushed && e.abs() <= 1.01 * flushed {
                0.0
            } else if e.is_finite() && a.is_finite() {
                (a - e).abs() / e.abs().max(floor)
            } else if a == e || (a.is_nan() && e.is_nan()) {
                0.0
            } else {
                f64::INFINITY
            };
            if error > tolerance {
                return Err(format!(
                    "row {row}, column {col}: {a:e} where the reference is {e:e} (error \
                     {error:.1e} > {tolerance:.0e})"
                ));
            }
            worst = worst.max(error / tolerance);
        }
        if values == RowValues::Probabilities && expected.iter().all(|e| e.is_finite()) {
            let got: f64 = actual.iter().map(|&a| f64::from(a)).sum();
            let wanted: f64 = expected.iter().sum();
            let error = (got - wanted).abs();
            if error.is_nan() || error > tolerance {
                return Err(format!(
                    "row {row} sums to {got} where the reference sums to {wanted} (error \
                     {error:.1e} > {tolerance:.0e})"
                ));
            }
            worst = worst.max(error / tolerance);
        }
    }
    Ok(worst)
}

/// When one stream's work in a concurrency test finished, in milliseconds after a start event
/// common to every stream: its first launch (with its copies), and its last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub first: f64,
    pub last: f64,
}

/// Whether streams' launches overlapped in time. `alone` holds how long each stream's work
/// took by itself (from its start to its last event); `together`, each stream's span when all
/// of them started at one common event. They overlapped if each stream's first launch finished
/// before every other stream's last one (no stream waited for another to drain), and all of
/// them finished within `ratio` of the time they take one after the other (the GPU ran them
/// side by side, not in turns: launches taken in turns take as long as one after the other).
pub fn overlapped(alone: &[f64], together: &[Span], ratio: f64) -> Result<String, String> {
    for (i, a) in together.iter().enumerate() {
        for (j, b) in together.iter().enumerate() {
            if i != j && a.first >= b.last {
                return Err(format!(
                    "stream {i}'s first launch finished at {:.3} ms, after stream {j}'s last at \
                     {:.3} ms: the streams ran one after the other",
                    a.first, b.last
                ));
            }
        }
    }
    let one_after_another: f64 = alone.iter().sum();
    let all_done = together.iter().map(|s| s.last).fold(0.0, f64::max);
    if all_done.is_nan() || all_done >= ratio * one_after_another {
        return Err(format!(
            "together the streams finished at {all_done:.3} ms; alone they took {alone:.3?} ms, \
             {one_after_another:.3} ms one after the other: their launches did not overlap \
             (wanted under {ratio} of that)"
        ));
    }
    Ok(format!(
        "{} streams together took {all_done:.2} ms, {:.0}% of the {one_after_another:.2} ms \
         they take one after the other",
        together.len(),
        100.0 * all_done / one_after_another
    ))
}

/// The reference softmax gradient `dx = y ⊙ (dy − Σ y⊙dy)` of each `cols`-wide row, in f64
/// from the reference probabilities `y`, and the size of each element's terms,
/// `y·(|dy| + 2·Σ y·|dy|)`, for [`check_gradient`].
pub fn softmax_gradient_reference(y: &[f64], dy: &[f32], cols: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut dx, mut terms) = (Vec::with_capacity(y.len()), Vec::with_capacity(y.len()));
    for (y, dy) in y.chunks(cols.max(1)).zip(dy.chunks(cols.max(1))) {
        let dy = dy.iter().map(|&v| f64::from(v));
        let pairs: Vec<(f64, f64)> = y.iter().copied().zip(dy).collect();
        let sum: f64 = pairs.iter().map(|(y, dy)| y * dy).sum();
        let size: f64 = pairs.iter().map(|(y, dy)| y * dy.abs()).sum();
        for (y, dy) in pairs {
            dx.push(y * (dy - sum));
            terms.push(y * (dy.abs() + 2.0 * size));
        }
    }
    (dx, terms)
}

/// Checks gradient values against [`softmax_gradient_reference`]: each within `tolerance`
/// times its terms (plus 1e-30: a probability below f32's smallest normal number may be
/// flushed to zero), NaN exactly where the reference is. A kernel's probabilities differ from
/// the reference by a relative `ε` each; that moves `dx_i` by at most `ε·y_i·(|dy_i| + 2·Σ
/// y·|dy|)`, however much `dy_i − Σ y⊙dy` cancels. Returns the worst error as a fraction of
/// what was allowed.
pub fn check_gradient(
    actual: &[f32],
    expected: &[f64],
    terms: &[f64],
    tolerance: f64,
) -> Result<f64, String> {
    if actual.len() != expected.len() || terms.len() != expected.len() {
        return Err(format!(
            "{} values for a reference of {}",
            actual.len(),
            expected.len()
        ));
    }
    let mut worst = 0.0_f64;
    for (i, ((&a, &e), &t)) in actual.iter().zip(expected).zip(terms).enumerate() {
        let (a, allowed) = (f64::from(a), tolerance * t + 1e-30);
        let error = if e.is_nan() || a.is_nan() {
            if e.is_nan() && a.is_nan() {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (a - e).abs() / allowed
        };
        if error.is_nan() || error > 1.0 {
            return Err(format!(
                "element {i}: {a:e} where the reference is {e:e} (allowed error {allowed:.1e})"
            ));
        }
        worst = worst.max(error);
    }
    Ok(worst)
}

/// Rows of the special-values test, one per pattern of [`special_rows`].
pub const SPECIAL_ROWS: usize = 12;

/// One row per pattern: plain scores of ±30; all -inf; one -inf; one NaN; one +inf; one 3e38
/// (it takes all the mass); every score scaled to ±3e38; two 3e38 (a tie, where the row has
/// two columns) and a -3e38 among plain scores; denormals only; one score 100 above the rest;
/// every score 1e4 (log-softmax `−ln cols`, exact only if the maximum is subtracted first);
/// -inf but for one NaN.
pub fn special_rows(rng: &mut StdRng, cols: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(SPECIAL_ROWS * cols);
    for pattern in 0..SPECIAL_ROWS {
        let mut row: Vec<f32> = (0..cols).map(|_| rng.random_range(-30.0..=30.0)).collect();
        let mut at = || rng.random_range(0..cols);
        match pattern {
            0 => {}
            1 => row.fill(f32::NEG_INFINITY),
            2 => row[at()] = f32::NEG_INFINITY,
            3 => row[at()] = f32::NAN,
            4 => row[at()] = f32::INFINITY,
            5 => row[at()] = 3e38,
            6 => row.iter_mut().for_each(|v| *v *= 1e37),
            7 => {
                let first = at();
                row[(first + 2) % cols] = -3e38;
                row[first] = 3e38;
                row[(first + 1) % cols] = 3e38;
            }
            8 => row.iter_mut().for_each(|v| *v *= 1e-41),
            9 => row[at()] = 130.0,
            10 => row.fill(1e4),
            _ => {
                row.fill(f32::NEG_INFINITY);
                row[at()] = f32::NAN;
            }
        }
        x.extend(row);
    }
    x
}

/// Begins capturing `stream` into a graph (global mode: what PyTorch uses by default).
pub fn begin_capture(stream: &Stream) -> Result<(), String> {
    // SAFETY: a valid stream of the current context.
    let status = unsafe {
        sys::cuStreamBeginCapture_v2(
            stream.as_inner(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        )
    };
    (status == sys::CUresult::CUDA_SUCCESS)
        .then_some(())
        .ok_or_else(|| format!("beginning a capture: {status:?}"))
}

/// Ends the capture and instantiates the graph.
pub fn end_capture(stream: &Stream) -> Result<sys::CUgraphExec, String> {
    let mut graph = std::ptr::null_mut();
    let mut exec = std::ptr::null_mut();
    // SAFETY: the stream is capturing; out-pointers are valid; the graph is destroyed once
    // instantiated (the executable graph keeps what it needs).
    unsafe {
        let status = sys::cuStreamEndCapture(stream.as_inner(), &mut graph);
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("ending the capture: {status:?}"));
        }
        let status = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0);
        sys::cuGraphDestroy(graph);
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("instantiating the graph: {status:?}"));
        }
    }
    Ok(exec)
}

/// f32 softmax with `Variant::Auto` of contiguous `shape` rows, with `options` (a stream, for
/// the calls that run on the caller's): what `Softmax::run` does on the instance's stream.
pub fn run_on(
    softmax: &mut softmax::Softmax,
    options: &softmax::Options<'_>,
    input: &cust::memory::DeviceSlice<f32>,
    output: &mut cust::memory::DeviceSlice<f32>,
    shape: softmax::Shape,
) -> softmax::Result<()> {
    let x = softmax::Rows::new(input, shape)?;
    let y = softmax::RowsMut::new(output, shape)?;
    softmax.forward(softmax::Operation::Softmax, x, y, options)
}

/// `values` converted to `T` in a device buffer.
pub fn upload<T: Element>(values: &[f32]) -> Result<DeviceBuffer<T>, String> {
    let converted: Vec<T> = values.iter().map(|&v| T::from_f32(v)).collect();
    DeviceBuffer::from_slice(&converted).map_err(|e| e.to_string())
}

/// A device buffer of `T` read back, widened to f32.
pub fn download<T: Element>(buffer: &DeviceBuffer<T>) -> Result<Vec<f32>, String> {
    let mut host = vec![T::from_f32(0.0); buffer.len()];
    buffer.copy_to(&mut host[..]).map_err(|e| e.to_string())?;
    Ok(host.into_iter().map(T::to_f32).collect())
}

/// `values` rounded to `T` and back: what the kernels read.
pub fn rounded<T: Element>(values: &[f32]) -> Vec<f32> {
    values.iter().map(|&v| T::from_f32(v).to_f32()).collect()
}
