//! GPU tests of the operation API: every operation × input type × output type against the
//! f64 reference on the foundation's shape list, the options (scales, masks, causal, fully
//! masked rows), strides and in-place, the partial-state API, bad input, and a fuzz run of
//! random shapes, types, offsets and pitches. Without a CUDA
//! device each test is reported as skipped, with the reason, and the run passes.
//!
//! Tolerances are set by the output type: f32 1e-5, f16 2e-3, bf16 1.5e-2 (one step of the
//! output type is 2^-10 and 2^-7 relative at worst). f32 outputs are held to a relative L2
//! over the finite reference values; 16-bit outputs row by row, each element and each softmax
//! row's sum ([`common::check_rows`]), and 16-bit gradients row by row, so that no bad row
//! hides in a norm over the whole tensor. Inputs are rounded to their type first and the
//! reference reads the rounded values.

mod common;

use common::text;

use common::{RowValues, as_written, check_rows, download, random_matrix, rounded, upload};
use cust::memory::{CopyDestination, DeviceBuffer};
use rand::Rng;
use rand::rngs::StdRng;
use softmax::half::{bf16, f16};
use softmax::reference::{
    Deviation, Scores, backward_f64, deviation, floored_value_deviation, value_deviation,
};
use softmax::{
    DType, Element, Error, Mask, MaskedRows, Operation, Options, RowState, Rows, RowsMut, Shape,
    Softmax, merge_row_states,
};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[
    (
        "ops_every_operation_and_type_pair_on_the_shape_list",
        every_operation_and_type_pair,
    ),
    ("ops_largest_foundation_shapes", largest_foundation_shapes),
    ("ops_special_values_follow_pytorch", special_values),
    ("ops_scales_masks_and_causal", scales_masks_and_causal),
    ("ops_strides_and_in_place", strides_and_in_place),
    (
        "ops_pitched_rows_misaligned_alike",
        pitched_rows_misaligned_alike,
    ),
    (
        "ops_peeled_rows_at_each_block_capacity",
        peeled_rows_at_block_capacity,
    ),
    (
        "ops_wide_16_bit_rows_in_row_slices",
        wide_16_bit_rows_in_row_slices,
    ),
    ("ops_few_wide_rows_in_slices", few_wide_rows_in_slices),
    ("ops_partial_states_merge_across_slices", partial_states),
    ("ops_bad_input_is_refused", bad_input_is_refused),
    ("ops_fuzz_ten_thousand_random_cases", fuzz),
];

const COLS: [usize; 10] = [1, 2, 31, 32, 33, 127, 1000, 4097, 16384, 65537];
const ROWS: [usize; 3] = [1, 3, 1000];

fn main() -> std::process::ExitCode {
    common::run_harness(TESTS)
}

fn tolerance(output: DType) -> f64 {
    match output {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::Bf16 => 1.5e-2,
    }
}

/// The tolerance of a forward result whose scores reach `±score_bound`. The kernels take
/// `e^(x − max)` as `2^t` with `t = (x − max)·log2 e` rounded to f32, an error of up to
/// ~|t|·2^-24 (|t| ≤ 2·score_bound·log2 e) that becomes a relative error of the exponential:
/// f32 outputs get `score_bound · log2 e · 2^-22` where that exceeds their usual tolerance
/// (scores of ±90: 3.4e-5).
fn forward_tolerance(output: DType, score_bound: f32) -> f64 {
    let exponent_rounding = f64::from(score_bound) * std::f64::consts::LOG2_E * 2f64.powi(-22);
    tolerance(output).max(exponent_rounding)
}

/// A buffer of `len` NaNs of type `T`: anything left unwritten stays NaN.
fn poisoned<T: Element>(len: usize) -> Result<DeviceBuffer<T>, String> {
    upload::<T>(&vec![f32::NAN; len])
}

/// Counts checks for a test's summary line.
#[derive(Default)]
struct Tally {
    runs: usize,
    worst: f64,
}

impl Tally {
    fn record(&mut self, what: &str, deviation: Deviation, tolerance: f64) -> Result<(), String> {
        if !deviation.within(tolerance) {
            return Err(format!("{what}: {deviation:?} (tolerance {tolerance:.0e})"));
        }
        self.runs += 1;
        self.worst = self.worst.max(deviation.relative_l2 / tolerance);
        Ok(())
    }

    /// Records the outcome of [`check_rows`] (the worst error as a fraction of the tolerance).
    fn record_rows(&mut self, what: &str, checked: Result<f64, String>) -> Result<(), String> {
        let worst = checked.map_err(|why| format!("{what}: {why}"))?;
        self.runs += 1;
        self.worst = self.worst.max(worst);
        Ok(())
    }

    fn summary(&self) -> String {
        format!(
            "{} runs matched the reference (worst error {:.2} of its tolerance)",
            self.runs, self.worst
        )
    }
}

/// Runs a forward operation from `I` to `O` and compares with `expected`.
fn check_forward<I: Element, O: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    op: Operation,
    x: &[f32],
    expected: &[f64],
    shape: Shape,
    options: &Options<'_>,
) -> Result<(), String> {
    let (what, actual) = run_forward::<I, O>(softmax, op, x, shape, options)?;
    let tolerance = tolerance(O::DTYPE);
    record_forward::<O>(tally, &what, op, &actual, expected, shape.cols(), tolerance)
}

/// Records a forward result written as `O` against the reference `expected` (unrounded): a
/// 16-bit output row by row ([`check_rows`]), an f32 one element by element over the tensor
/// (rows masked everywhere may rightly sum to 0).
fn record_forward<O: Element>(
    tally: &mut Tally,
    what: &str,
    op: Operation,
    actual: &[f32],
    expected: &[f64],
    cols: usize,
    tolerance: f64,
) -> Result<(), String> {
    let written = as_written::<O>(expected);
    if O::DTYPE == DType::F32 {
        return tally.record(what, value_deviation(actual, &written), tolerance);
    }
    let values = match op {
        Operation::Softmax => RowValues::Probabilities,
        Operation::LogSoftmax => RowValues::LogProbabilities,
    };
    let checked = check_rows(actual, &written, cols, values, O::DTYPE, tolerance);
    tally.record_rows(what, checked)
}

/// Runs a forward operation from `I` to `O` into a poisoned output: what ran, and the output.
fn run_forward<I: Element, O: Element>(
    softmax: &mut Softmax,
    op: Operation,
    x: &[f32],
    shape: Shape,
    options: &Options<'_>,
) -> Result<(String, Vec<f32>), String> {
    let input = upload::<I>(x)?;
    let mut output = poisoned::<O>(shape.len())?;
    let what = format!("{op:?} {:?}->{:?} {shape}", I::DTYPE, O::DTYPE);
    softmax
        .forward(
            op,
            Rows::new(&input, shape).map_err(text)?,
            RowsMut::new(&mut output, shape).map_err(text)?,
            options,
        )
        .map_err(|e| format!("{what}: {e}"))?;
    softmax.synchronize().map_err(text)?;
    Ok((what, download(&output)?))
}

/// Runs a backward operation from `T` to `O` and compares with `expected`.
#[allow(clippy::too_many_arguments)]
fn check_backward<T: Element, O: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    op: Operation,
    y: &[f32],
    dy: &[f32],
    expected: &[f64],
    shape: Shape,
    options: &Options<'_>,
) -> Result<(), String> {
    let (y_device, dy_device) = (upload::<T>(y)?, upload::<T>(dy)?);
    let mut dx = poisoned::<O>(shape.len())?;
    let what = format!("backward {op:?} {:?}->{:?} {shape}", T::DTYPE, O::DTYPE);
    softmax
        .backward(
            op,
            Rows::new(&y_device, shape).map_err(text)?,
            Rows::new(&dy_device, shape).map_err(text)?,
            RowsMut::new(&mut dx, shape).map_err(text)?,
            options,
        )
        .map_err(|e| format!("{what}: {e}"))?;
    softmax.synchronize().map_err(text)?;
    let cols = shape.cols();
    record_gradient::<O>(tally, &what, op, (y, dy), &download(&dx)?, expected, cols)
}

/// Records a gradient written as `O` against the reference `expected`, as
/// [`backward_deviation`] measures it, at 4 times the output type's tolerance: an f32 one over
/// the whole tensor, a 16-bit one each row on its own (a gradient cancels towards zero, so no
/// element can be held to an error relative to itself; a row is held to its own terms).
fn record_gradient<O: Element>(
    tally: &mut Tally,
    what: &str,
    op: Operation,
    (y, dy): (&[f32], &[f32]),
    actual: &[f32],
    expected: &[f64],
    cols: usize,
) -> Result<(), String> {
    let tolerance = tolerance(O::DTYPE) * 4.0;
    if O::DTYPE == DType::F32 {
        let deviation = backward_deviation(op, y, dy, actual, expected);
        return tally.record(what, deviation, tolerance);
    }
    let rows = y
        .chunks(cols)
        .zip(dy.chunks(cols))
        .zip(actual.chunks(cols).zip(expected.chunks(cols)));
    let mut worst = 0.0_f64;
    for (row, ((y, dy), (actual, expected))) in rows.enumerate() {
        let deviation = backward_deviation(op, y, dy, actual, expected);
        if !deviation.within(tolerance) {
            return Err(format!(
                "{what}, row {row}: {deviation:?} (tolerance {tolerance:.0e})"
            ));
        }
        worst = worst.max(deviation.relative_l2 / tolerance);
    }
    tally.record_rows(what, Ok(worst))
}

/// [`value_deviation`] of a gradient, relative to the size of the terms (`y·dy` for softmax,
/// `dy` for log-softmax) when that is larger than the gradient: dx cancels to near zero when
/// dy is nearly constant along a row (exactly 0 in a single column), and f32 rounding of the
/// terms is all that is left.
fn backward_deviation(
    op: Operation,
    y: &[f32],
    dy: &[f32],
    actual: &[f32],
    expected: &[f64],
) -> Deviation {
    let terms = y.iter().zip(dy).map(|(&y, &dy)| match op {
        Operation::Softmax => f64::from(y * dy),
        Operation::LogSoftmax => f64::from(dy),
    });
    relative_to_terms(value_deviation(actual, expected), expected, norm(terms))
}

/// `‖values‖₂` over the finite ones.
fn norm(values: impl IntoIterator<Item = f64>) -> f64 {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .map(|v| v * v)
        .sum::<f64>()
        .sqrt()
}

/// `deviation` (of `expected`) measured against `max(‖expected‖, terms_norm)`: the error of a
/// result that cancels to near zero is the rounding of the terms it came from.
fn relative_to_terms(deviation: Deviation, expected: &[f64], terms_norm: f64) -> Deviation {
    let expected_norm = norm(expected.iter().copied());
    // `value_deviation` gives the absolute error when the reference is all zeros.
    let error_norm = if expected_norm > 0.0 {
        deviation.relative_l2 * expected_norm
    } else {
        deviation.relative_l2
    };
    let scale = expected_norm.max(terms_norm);
    Deviation {
        relative_l2: if scale > 0.0 {
            error_norm / scale
        } else {
            error_norm
        },
        ..deviation
    }
}

fn check_log_sum_exp<I: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    x: &[f32],
    expected: &[f64],
    shape: Shape,
    options: &Options<'_>,
) -> Result<(), String> {
    let (what, actual) = run_log_sum_exp::<I>(softmax, x, shape, options)?;
    // Each value is `max + ln Σ`, rounded in the magnitude of those terms: a row whose two
    // terms nearly cancel is judged against 1, not against its small result.
    tally.record(&what, floored_value_deviation(&actual, expected, 1.0), 1e-5)
}

/// Runs log-sum-exp on `I` input into a poisoned buffer: what ran, and one value per row.
fn run_log_sum_exp<I: Element>(
    softmax: &mut Softmax,
    x: &[f32],
    shape: Shape,
    options: &Options<'_>,
) -> Result<(String, Vec<f32>), String> {
    let input = upload::<I>(x)?;
    let mut lse = DeviceBuffer::from_slice(&vec![f32::NAN; shape.rows()]).map_err(text)?;
    let what = format!("log-sum-exp {:?} {shape}", I::DTYPE);
    softmax
        .log_sum_exp(Rows::new(&input, shape).map_err(text)?, &mut lse, options)
        .map_err(|e| format!("{what}: {e}"))?;
    softmax.synchronize().map_err(text)?;
    let mut actual = vec![0.0; shape.rows()];
    lse.copy_to(&mut actual[..]).map_err(text)?;
    Ok((what, actual))
}

/// Every operation with input type `I`, into each output type, on one shape.
fn every_operation_for<I: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    rng: &mut StdRng,
    shape: Shape,
) -> Result<(), String> {
    let options = Options::new();
    let x = rounded::<I>(&random_matrix(rng, shape, 8.0));
    let scores = Scores::default();
    for op in [Operation::Softmax, Operation::LogSoftmax] {
        let expected = scores.forward(op == Operation::LogSoftmax, &x, shape.rows(), shape.cols());
        check_forward::<I, f32>(softmax, tally, op, &x, &expected, shape, &options)?;
        check_forward::<I, bf16>(softmax, tally, op, &x, &expected, shape, &options)?;
        check_forward::<I, f16>(softmax, tally, op, &x, &expected, shape, &options)?;

        // Backward from this operation's own output and a random incoming gradient.
        let y: Vec<f32> = rounded::<I>(&expected.iter().map(|&v| v as f32).collect::<Vec<_>>());
        let dy = rounded::<I>(&random_matrix(rng, shape, 1.0));
        let log = op == Operation::LogSoftmax;
        let dx = backward_f64(log, &y, &dy, shape.cols(), &vec![1.0; shape.rows()]);
        check_backward::<I, f32>(softmax, tally, op, &y, &dy, &dx, shape, &options)?;
        check_backward::<I, bf16>(softmax, tally, op, &y, &dy, &dx, shape, &options)?;
        check_backward::<I, f16>(softmax, tally, op, &y, &dy, &dx, shape, &options)?;
    }
    let lse = scores.log_sum_exp(&x, shape.rows(), shape.cols());
    check_log_sum_exp::<I>(softmax, tally, &x, &lse, shape, &options)
}

/// Special values through the forward operations, every input type and the kernels' paths
/// (rows in registers, whole-row blocks, cooperative slices, peeled ends; unmasked, and
/// masked with every element allowed and fully masked rows asked to give zeros), against the
/// f64 reference, which follows PyTorch: a row with a NaN or a +inf is NaN, so is a row of
/// -inf only (unless zeros were asked for); -inf entries give 0; scores near ±3e38 are as
/// exact as any others, also under a scale of 0.5 that brings both ends in range. f16 inputs hold the huge values as ±inf, as the reference (fed the
/// rounded inputs) does too. Each row is compared on its own.
fn special_values(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    for cols in [1, 33, 1000, 4097, 100_003] {
        let x = common::special_rows(rng, cols);
        let shape = Shape::new(common::SPECIAL_ROWS, cols).unwrap();
        special_values_for::<f32>(softmax, &mut tally, &x, shape)?;
        special_values_for::<bf16>(softmax, &mut tally, &x, shape)?;
        special_values_for::<f16>(softmax, &mut tally, &x, shape)?;
    }
    Ok(tally.summary())
}

fn special_values_for<I: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    x: &[f32],
    shape: Shape,
) -> Result<(), String> {
    let x = rounded::<I>(x);
    let allowed = vec![1u8; shape.len()];
    let allowed_device = DeviceBuffer::from_slice(&allowed).map_err(text)?;
    let cases = [
        (Options::new(), Scores::default()),
        // A scale below 1 brings both ends of ±3e38 rows in range: differences taken after
        // scaling stay finite.
        (
            Options::new().scale(0.5),
            Scores {
                scale: 0.5,
                ..Scores::default()
            },
        ),
        (
            Options::new()
                .mask(Mask::allowed(&allowed_device))
                .masked_rows(MaskedRows::Zero),
            Scores {
                allowed_mask: Some(&allowed),
                zero_masked_rows: true,
                ..Scores::default()
            },
        ),
    ];
    for (options, scores) in &cases {
        for op in [Operation::Softmax, Operation::LogSoftmax] {
            let (rows, cols) = (shape.rows(), shape.cols());
            let expected = scores.forward(op == Operation::LogSoftmax, &x, rows, cols);
            let (what, actual) = run_forward::<I, f32>(softmax, op, &x, shape, options)?;
            record_rows(tally, &what, &actual, &expected, shape)?;
            let (what, actual) = run_forward::<I, bf16>(softmax, op, &x, shape, options)?;
            let tolerance = tolerance(DType::Bf16);
            record_forward::<bf16>(tally, &what, op, &actual, &expected, cols, tolerance)?;
        }
        let lse = scores.log_sum_exp(&x, shape.rows(), shape.cols());
        let (what, actual) = run_log_sum_exp::<I>(softmax, &x, shape, options)?;
        let one_per_row = Shape::new(shape.rows(), 1).unwrap();
        record_rows(tally, &what, &actual, &lse, one_per_row)?;
    }
    Ok(())
}

/// Records each row's deviation of an f32 output from `expected` (as written in f32), on its
/// own, so that rows of ±3e38 log-probabilities do not drown the errors of the others in one
/// norm.
fn record_rows(
    tally: &mut Tally,
    what: &str,
    actual: &[f32],
    expected: &[f64],
    shape: Shape,
) -> Result<(), String> {
    let (expected, cols) = (as_written::<f32>(expected), shape.cols());
    for (row, (actual, expected)) in actual.chunks(cols).zip(expected.chunks(cols)).enumerate() {
        let deviation = value_deviation(actual, expected);
        tally.record(
            &format!("{what}, row {row}"),
            deviation,
            tolerance(DType::F32),
        )?;
    }
    Ok(())
}

fn every_operation_and_type_pair(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    for cols in COLS {
        for rows in ROWS {
            // The two largest tensors (16M and 65M elements) have their own, lighter test.
            if rows * cols > LARGEST_FOUNDATION_ELEMENTS {
                continue;
            }
            let shape = Shape::new(rows, cols).unwrap();
            every_operation_for::<f32>(softmax, &mut tally, rng, shape)?;
            every_operation_for::<bf16>(softmax, &mut tally, rng, shape)?;
            every_operation_for::<f16>(softmax, &mut tally, rng, shape)?;
        }
    }
    // Wide rows: the cooperative slices; clusters in waves (the forward passes of 600×70000
    // but the 16-bit softmax without options, which keeps a whole row a block, and its
    // log-sum-exp); the two launches over slices for rows too many and too wide to
    // keep resident (the gradient of 600×70000; at 64×300000 and 16×1048576 the log-softmax
    // of f32 and bf16, f32's softmax taking row-cluster at 64×300000); and the 16-bit softmax
    // of those two in row-slices in waves of rows.
    for (rows, cols) in [
        (8, 128256),
        (1, 1_048_576),
        (600, 70000),
        (64, 300_000),
        (16, 1_048_576),
    ] {
        let shape = Shape::new(rows, cols).unwrap();
        let x = random_matrix(rng, shape, 8.0);
        for op in [Operation::Softmax, Operation::LogSoftmax] {
            let log = op == Operation::LogSoftmax;
            let x32 = rounded::<f32>(&x);
            let expected = Scores::default().forward(log, &x32, rows, cols);
            check_forward::<f32, f32>(
                softmax,
                &mut tally,
                op,
                &x32,
                &expected,
                shape,
                &Options::new(),
            )?;
            let x16 = rounded::<bf16>(&x);
            let expected = Scores::default().forward(log, &x16, rows, cols);
            check_forward::<bf16, bf16>(
                softmax,
                &mut tally,
                op,
                &x16,
                &expected,
                shape,
                &Options::new(),
            )?;
            let y: Vec<f32> = expected.iter().map(|&v| v as f32).collect();
            let dy = random_matrix(rng, shape, 1.0);
            let dx = backward_f64(log, &y, &dy, cols, &vec![1.0; rows]);
            check_backward::<f32, f32>(
                softmax,
                &mut tally,
                op,
                &y,
                &dy,
                &dx,
                shape,
                &Options::new(),
            )?;
        }
        let lse = Scores::default().log_sum_exp(&rounded::<f32>(&x), rows, cols);
        check_log_sum_exp::<f32>(softmax, &mut tally, &x, &lse, shape, &Options::new())?;
    }
    Ok(tally.summary())
}

/// Odd widths one element short of a power of two, where the block instances' aligned
/// capacities lie (the narrowest may plan as groups), the 151,935-wide LLM row, 600 rows of
/// 70,001 (too many and too wide to keep resident: the forward passes in clusters in waves,
/// the gradient in two launches, whose second merges the slices' states) and 64 rows of
/// 140,001 (the f32 log-softmax in two launches too, the f32 softmax in clusters in waves): the rows are peeled, and a block
/// holds their head and tail in one more slot of its first two threads. Few rows (cooperative slices) and many (a block per row),
/// softmax and log-softmax forward and the softmax gradient, bf16 and f32.
fn peeled_rows_at_block_capacity(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    let shapes = [1023, 2047, 4095, 8191, 16383]
        .into_iter()
        .flat_map(|cols| [(3, cols), (300, cols)])
        .chain([(32, 151_935), (600, 70_001), (64, 140_001)]);
    for (rows, cols) in shapes {
        let shape = Shape::new(rows, cols).unwrap();
        let x = random_matrix(rng, shape, 8.0);
        let dy = random_matrix(rng, shape, 1.0);
        for op in [Operation::Softmax, Operation::LogSoftmax] {
            let log = op == Operation::LogSoftmax;
            let x16 = rounded::<bf16>(&x);
            let expected = Scores::default().forward(log, &x16, rows, cols);
            let options = Options::new();
            check_forward::<bf16, bf16>(softmax, &mut tally, op, &x16, &expected, shape, &options)?;
            let expected = Scores::default().forward(log, &x, rows, cols);
            check_forward::<f32, f32>(softmax, &mut tally, op, &x, &expected, shape, &options)?;
            let y = rounded::<bf16>(&expected.iter().map(|&v| v as f32).collect::<Vec<_>>());
            let dy16 = rounded::<bf16>(&dy);
            let dx = backward_f64(log, &y, &dy16, cols, &vec![1.0; rows]);
            check_backward::<bf16, bf16>(softmax, &mut tally, op, &y, &dy16, &dx, shape, &options)?;
        }
    }
    Ok(tally.summary())
}

/// Few wide rows cut into slices whose blocks exchange their statistics: within one
/// thread-block cluster where a row has at most 16 slices (the sm_90 build: one row of 16000
/// f32 or 32000 16-bit columns, 3 odd rows with peeled ends, 4 rows, 16 rows of 32000 and
/// 50257 16-bit columns in clusters of 13–16 on more blocks than multiprocessors), through
/// global memory in a cooperative launch where it has more (one and 8 rows of 128256) or
/// without clusters (the sm_80 build); 16 rows of 8192 16-bit columns whole, a 256-thread block
/// each; every operation and output type for each input type, as on the shape list.
fn few_wide_rows_in_slices(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    for (rows, cols) in [
        (1, 16000),
        (1, 32000),
        (3, 30001),
        (4, 32000),
        (1, 128_256),
        (8, 128_256),
        (16, 8000),
        (16, 8192),
        (16, 32000),
        (16, 50257),
    ] {
        let shape = Shape::new(rows, cols).unwrap();
        every_operation_for::<f32>(softmax, &mut tally, rng, shape)?;
        every_operation_for::<bf16>(softmax, &mut tally, rng, shape)?;
        every_operation_for::<f16>(softmax, &mut tally, rng, shape)?;
    }
    Ok(tally.summary())
}

/// Softmax over few wide rows of a 16-bit type runs row-slices, as f32's `auto` does: cached
/// slices that exchange their statistics (32×151936, 16×262144, and 8×300001 with peeled
/// ends), a cached row per block in one wave (128×50257), and a cached row per block over
/// many rows (600×70001, which the operation kernels read in clusters in waves where packs
/// serve, as they do 256×65536); 16 bytes at a time, and one element at a time with the input one
/// element off the output's alignment; bf16 and f16. Then the special values (12 rows of
/// 200003, 4.8 MB: NaN, ±inf, rows of -inf only, ±3e38, …) through the same kernels, whose
/// batch maximum is taken on packed pairs. Each row is compared on its own.
fn wide_16_bit_rows_in_row_slices(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    let random = [
        (32, 151_936),
        (16, 262_144),
        (8, 300_001),
        (128, 50_257),
        (600, 70_001),
        (256, 65_536),
    ]
    .map(|(rows, cols)| {
        let shape = Shape::new(rows, cols).unwrap();
        (random_matrix(rng, shape, 8.0), shape)
    });
    let special = Shape::new(common::SPECIAL_ROWS, 200_003).unwrap();
    let cases = random
        .into_iter()
        .chain([(common::special_rows(rng, special.cols()), special)]);
    for (x, shape) in cases {
        for input_offset in [0, 1] {
            wide_16_bit_softmax::<bf16>(softmax, &mut tally, &x, shape, input_offset)?;
            wide_16_bit_softmax::<f16>(softmax, &mut tally, &x, shape, input_offset)?;
        }
    }
    Ok(tally.summary())
}

/// Softmax from `T` to `T` with the input `input_offset` elements into its buffer.
fn wide_16_bit_softmax<T: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    x: &[f32],
    shape: Shape,
    input_offset: usize,
) -> Result<(), String> {
    let x = rounded::<T>(x);
    let expected = Scores::default().forward(false, &x, shape.rows(), shape.cols());
    let mut placed = vec![0.0; input_offset];
    placed.extend_from_slice(&x);
    let input = upload::<T>(&placed)?;
    let mut output = poisoned::<T>(shape.len())?;
    let what = format!(
        "Softmax {:?} {shape}, input {input_offset} element(s) into its buffer",
        T::DTYPE
    );
    softmax
        .forward(
            Operation::Softmax,
            Rows::new(&input.index(input_offset..), shape).map_err(text)?,
            RowsMut::new(&mut output, shape).map_err(text)?,
            &Options::new(),
        )
        .map_err(|e| format!("{what}: {e}"))?;
    softmax.synchronize().map_err(text)?;
    let (actual, cols) = (download(&output)?, shape.cols());
    let op = Operation::Softmax;
    record_forward::<T>(
        tally,
        &what,
        op,
        &actual,
        &expected,
        cols,
        tolerance(T::DTYPE),
    )
}

/// Scales, per-row scales, both masks (one row for all, and per row), causal blocks and
/// both choices for fully masked rows, forward and log-sum-exp, f32 and bf16, on narrow,
/// block-wide, sliced and chunked rows.
/// Tensors above this many elements on the shape list are left to
/// [`largest_foundation_shapes`].
const LARGEST_FOUNDATION_ELEMENTS: usize = 5_000_000;

/// The shape list's two largest tensors (1000 × 16384 and 1000 × 65537, an odd width) for
/// each input type: softmax and log-softmax forward, unmasked and masked, and the softmax
/// gradient, each kernel family once (every type pair would take minutes of CPU reference).
fn largest_foundation_shapes(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    fn one_type<T: Element>(
        softmax: &mut Softmax,
        tally: &mut Tally,
        rng: &mut StdRng,
        shape: Shape,
    ) -> Result<(), String> {
        let (rows, cols) = (shape.rows(), shape.cols());
        let x = rounded::<T>(&random_matrix(rng, shape, 8.0));
        let softmax_y = Scores::default().forward(false, &x, rows, cols);
        check_forward::<T, T>(
            softmax,
            tally,
            Operation::Softmax,
            &x,
            &softmax_y,
            shape,
            &Options::new(),
        )?;
        let log_y = Scores::default().forward(true, &x, rows, cols);
        check_forward::<T, f32>(
            softmax,
            tally,
            Operation::LogSoftmax,
            &x,
            &log_y,
            shape,
            &Options::new(),
        )?;
        let additive: Vec<f32> = (0..cols).map(|_| rng.random_range(-2.0..2.0)).collect();
        let additive_device = DeviceBuffer::from_slice(&additive).map_err(text)?;
        let masked = Scores {
            additive_mask: Some(&additive),
            ..Scores::default()
        };
        check_forward::<T, T>(
            softmax,
            tally,
            Operation::Softmax,
            &x,
            &masked.forward(false, &x, rows, cols),
            shape,
            &Options::new().mask(Mask::additive(&additive_device)),
        )?;
        let y = rounded::<T>(&softmax_y.iter().map(|&v| v as f32).collect::<Vec<_>>());
        let dy = rounded::<T>(&random_matrix(rng, shape, 1.0));
        let dx = backward_f64(false, &y, &dy, cols, &vec![1.0; rows]);
        check_backward::<T, T>(
            softmax,
            tally,
            Operation::Softmax,
            &y,
            &dy,
            &dx,
            shape,
            &Options::new(),
        )
    }

    let mut tally = Tally::default();
    for cols in COLS {
        for rows in ROWS {
            if rows * cols <= LARGEST_FOUNDATION_ELEMENTS {
                continue;
            }
            let shape = Shape::new(rows, cols).unwrap();
            one_type::<f32>(softmax, &mut tally, rng, shape)?;
            one_type::<bf16>(softmax, &mut tally, rng, shape)?;
            one_type::<f16>(softmax, &mut tally, rng, shape)?;
        }
    }
    Ok(tally.summary())
}

fn scales_masks_and_causal(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    for (rows, cols) in [(12, 3), (64, 1000), (32, 8192), (4, 100_000), (600, 70000)] {
        let shape = Shape::new(rows, cols).unwrap();
        let x = rounded::<bf16>(&random_matrix(rng, shape, 8.0));
        let row_scale: Vec<f32> = (0..rows).map(|_| rng.random_range(0.25..4.0)).collect();
        let row_scale_device = DeviceBuffer::from_slice(&row_scale).map_err(text)?;
        let additive: Vec<f32> = (0..cols)
            .map(|_| {
                if rng.random_bool(0.2) {
                    f32::NEG_INFINITY
                } else {
                    rng.random_range(-2.0..2.0)
                }
            })
            .collect();
        let additive_device = DeviceBuffer::from_slice(&additive).map_err(text)?;
        // Per-row boolean mask; every third row is masked everywhere.
        let allowed: Vec<u8> = (0..shape.len())
            .map(|i| u8::from((i / cols) % 3 != 0 && rng.random_bool(0.7)))
            .collect();
        let allowed_device = DeviceBuffer::from_slice(&allowed).map_err(text)?;

        let mut cases: Vec<(Options, Scores)> = vec![
            (
                Options::new().temperature(0.7),
                Scores {
                    scale: 1.0 / 0.7,
                    ..Scores::default()
                },
            ),
            (
                Options::new().scale(0.125).row_scale(&row_scale_device),
                Scores {
                    scale: 0.125,
                    row_scale: Some(&row_scale),
                    ..Scores::default()
                },
            ),
            (
                Options::new().mask(Mask::additive(&additive_device)),
                Scores {
                    additive_mask: Some(&additive),
                    ..Scores::default()
                },
            ),
        ];
        for (masked_rows, zero) in [(MaskedRows::Nan, false), (MaskedRows::Zero, true)] {
            cases.push((
                Options::new()
                    .mask(Mask::allowed(&allowed_device))
                    .masked_rows(masked_rows),
                Scores {
                    allowed_mask: Some(&allowed),
                    zero_masked_rows: zero,
                    ..Scores::default()
                },
            ));
        }
        if rows.is_multiple_of(cols) {
            cases.push((
                Options::new().causal(),
                Scores {
                    causal: true,
                    ..Scores::default()
                },
            ));
        }
        for (options, scores) in &cases {
            for op in [Operation::Softmax, Operation::LogSoftmax] {
                let expected = scores.forward(op == Operation::LogSoftmax, &x, rows, cols);
                check_forward::<f32, f32>(softmax, &mut tally, op, &x, &expected, shape, options)?;
                check_forward::<bf16, bf16>(
                    softmax, &mut tally, op, &x, &expected, shape, options,
                )?;
            }
            let lse = scores.log_sum_exp(&x, rows, cols);
            check_log_sum_exp::<bf16>(softmax, &mut tally, &x, &lse, shape, options)?;
        }
        // Backward takes the scales: dx is the gradient with respect to the unscaled scores.
        let y: Vec<f32> = Scores::default()
            .forward(false, &x, rows, cols)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let dy = random_matrix(rng, shape, 1.0);
        let scale: Vec<f64> = row_scale.iter().map(|&s| 0.5 * f64::from(s)).collect();
        let dx = backward_f64(false, &y, &dy, cols, &scale);
        let options = Options::new().scale(0.5).row_scale(&row_scale_device);
        check_backward::<f32, f32>(
            softmax,
            &mut tally,
            Operation::Softmax,
            &y,
            &dy,
            &dx,
            shape,
            &options,
        )?;
    }
    // Causal square blocks: 3 heads of 64 queries, and 2 heads of 1000.
    for (heads, len) in [(3, 64), (2, 1000)] {
        let shape = Shape::new(heads * len, len).unwrap();
        let x = random_matrix(rng, shape, 8.0);
        let scores = Scores {
            causal: true,
            ..Scores::default()
        };
        let expected = scores.forward(false, &x, shape.rows(), shape.cols());
        check_forward::<f32, f32>(
            softmax,
            &mut tally,
            Operation::Softmax,
            &x,
            &expected,
            shape,
            &Options::new().causal(),
        )?;
    }
    // An input row that is -inf everywhere, with `MaskedRows::Zero` and no mask: zeros (log:
    // -inf) on every path, the plain contiguous f32 softmax included.
    let shape = Shape::new(4, 8).unwrap();
    let mut x = vec![0.5f32; shape.len()];
    x[8..16].fill(f32::NEG_INFINITY);
    let zero = Scores {
        zero_masked_rows: true,
        ..Scores::default()
    };
    let options = Options::new().masked_rows(MaskedRows::Zero);
    for op in [Operation::Softmax, Operation::LogSoftmax] {
        let expected = zero.forward(op == Operation::LogSoftmax, &x, shape.rows(), shape.cols());
        check_forward::<f32, f32>(softmax, &mut tally, op, &x, &expected, shape, &options)?;
        check_forward::<bf16, bf16>(softmax, &mut tally, op, &x, &expected, shape, &options)?;
    }
    // The same on few wide rows, where the planner takes the kept twins of the 8-pack blocks
    // (aligned and peeled): a row of -inf, and a row of -3e38 that a scale of 2 takes to -inf
    // (its differences from a maximum of -inf are NaN, never written).
    for (rows, cols) in [(16, 128_256), (16, 100_003)] {
        let shape = Shape::new(rows, cols).unwrap();
        let mut x = random_matrix(rng, shape, 8.0);
        x[cols..2 * cols].fill(f32::NEG_INFINITY);
        x[5 * cols..6 * cols].fill(-3e38);
        let x = rounded::<bf16>(&x);
        let zero = Scores {
            scale: 2.0,
            zero_masked_rows: true,
            ..Scores::default()
        };
        let options = Options::new().scale(2.0).masked_rows(MaskedRows::Zero);
        for op in [Operation::Softmax, Operation::LogSoftmax] {
            let log = op == Operation::LogSoftmax;
            let mut expected = zero.forward(log, &x, rows, cols);
            // Scores are f32: that row's are -inf everywhere (the f64 reference's are finite).
            expected[5 * cols..6 * cols].fill(if log { f64::NEG_INFINITY } else { 0.0 });
            check_forward::<bf16, bf16>(softmax, &mut tally, op, &x, &expected, shape, &options)?;
            check_forward::<bf16, f32>(softmax, &mut tally, op, &x, &expected, shape, &options)?;
        }
    }
    Ok(tally.summary())
}

/// Pitched input and output (aligned pitches take 16-byte packs, odd ones single elements),
/// untouched gaps between rows, and in-place forward and backward.
fn strides_and_in_place(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    let mut gaps_checked = 0;
    for (rows, cols) in [(5, 1), (33, 31), (64, 1000), (7, 4096), (3, 100_000)] {
        let shape = Shape::new(rows, cols).unwrap();
        let x = random_matrix(rng, shape, 8.0);
        for (in_pitch, out_pitch) in [(cols + 8, cols + 16), (cols + 5, cols + 3)] {
            let mut padded = vec![7.0f32; rows * in_pitch];
            for r in 0..rows {
                padded[r * in_pitch..r * in_pitch + cols]
                    .copy_from_slice(&x[r * cols..(r + 1) * cols]);
            }
            let x16 = rounded::<bf16>(&padded);
            let input = upload::<bf16>(&x16)?;
            let mut output = poisoned::<f32>(rows * out_pitch)?;
            softmax
                .forward(
                    Operation::Softmax,
                    Rows::strided(&input, shape, in_pitch).map_err(text)?,
                    RowsMut::strided(&mut output, shape, out_pitch).map_err(text)?,
                    &Options::new(),
                )
                .map_err(|e| format!("strided {shape} pitches {in_pitch}/{out_pitch}: {e}"))?;
            softmax.synchronize().map_err(text)?;
            let all = download(&output)?;
            let mut packed = Vec::with_capacity(shape.len());
            for r in 0..rows {
                packed.extend_from_slice(&all[r * out_pitch..r * out_pitch + cols]);
                let gap = &all[r * out_pitch + cols..((r + 1) * out_pitch).min(all.len())];
                if !gap.iter().all(|v| v.is_nan()) {
                    return Err(format!("{shape}: the gap after row {r} was written"));
                }
                gaps_checked += 1;
            }
            let compact: Vec<f32> = (0..rows)
                .flat_map(|r| x16[r * in_pitch..r * in_pitch + cols].iter().copied())
                .collect();
            let expected = Scores::default().forward(false, &compact, rows, cols);
            tally.record(
                &format!("strided {shape} pitches {in_pitch}/{out_pitch}"),
                deviation(&packed, &expected, cols),
                tolerance(DType::F32),
            )?;
        }

        // In place: forward log-softmax, then its backward over the gradient buffer.
        let mut data = upload::<f32>(&x)?;
        softmax
            .forward_in_place(
                Operation::LogSoftmax,
                RowsMut::new(&mut data, shape).map_err(text)?,
                &Options::new(),
            )
            .map_err(text)?;
        softmax.synchronize().map_err(text)?;
        let y = download(&data)?;
        let expected = Scores::default().forward(true, &x, rows, cols);
        tally.record(
            &format!("in-place log-softmax {shape}"),
            value_deviation(&y, &expected),
            1e-5,
        )?;
        let dy = random_matrix(rng, shape, 1.0);
        let mut gradient = upload::<f32>(&dy)?;
        softmax
            .backward_in_place(
                Operation::LogSoftmax,
                Rows::new(&data, shape).map_err(text)?,
                RowsMut::new(&mut gradient, shape).map_err(text)?,
                &Options::new(),
            )
            .map_err(text)?;
        softmax.synchronize().map_err(text)?;
        let dx = backward_f64(true, &y, &dy, cols, &vec![1.0; rows]);
        let deviation =
            backward_deviation(Operation::LogSoftmax, &y, &dy, &download(&gradient)?, &dx);
        tally.record(&format!("in-place backward {shape}"), deviation, 4e-5)?;
    }
    Ok(format!(
        "{}; {gaps_checked} row gaps left untouched",
        tally.summary()
    ))
}

/// Input and output rows at one pitch that is not a multiple of a pack, so that every row is
/// misaligned like every other and the peeled kernels run: rows half a pack long whose head
/// would end before their first 16-byte boundary (row 3 of 4 bf16 columns at a pitch of 6
/// spans bytes 36 to 44, short of 48), rows with an end of exactly half a pack (read and written in
/// one access), and wider ones. Softmax forward and its gradient, f32 and bf16 input, into the
/// input's type and the other one; every gap between rows left untouched.
fn pitched_rows_misaligned_alike(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    let mut gaps_checked = 0;
    for (cols, pitch) in [
        (2, 3),
        (4, 5),
        (4, 6),
        (6, 7),
        (12, 14),
        (100, 102),
        (102, 103),
    ] {
        let shape = Shape::new(8, cols).unwrap();
        gaps_checked += pitched_pair::<f32, f32>(softmax, &mut tally, rng, shape, pitch)?;
        gaps_checked += pitched_pair::<f32, bf16>(softmax, &mut tally, rng, shape, pitch)?;
        gaps_checked += pitched_pair::<bf16, bf16>(softmax, &mut tally, rng, shape, pitch)?;
        gaps_checked += pitched_pair::<bf16, f32>(softmax, &mut tally, rng, shape, pitch)?;
    }
    Ok(format!(
        "{}; {gaps_checked} row gaps left untouched",
        tally.summary()
    ))
}

/// One forward and one backward of [`pitched_rows_misaligned_alike`] from `I` to `O`, every
/// buffer at `pitch` elements per row: the number of row gaps checked.
fn pitched_pair<I: Element, O: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    rng: &mut StdRng,
    shape: Shape,
    pitch: usize,
) -> Result<usize, String> {
    let (rows, cols) = (shape.rows(), shape.cols());
    let spread = |values: &[f32]| {
        let mut padded = vec![7.0f32; rows * pitch];
        for (r, row) in values.chunks(cols).enumerate() {
            padded[r * pitch..r * pitch + cols].copy_from_slice(row);
        }
        padded
    };
    let gather = |padded: &[f32]| -> Result<Vec<f32>, String> {
        let mut packed = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            packed.extend_from_slice(&padded[r * pitch..r * pitch + cols]);
            let gap = &padded[r * pitch + cols..((r + 1) * pitch).min(padded.len())];
            if !gap.iter().all(|v| v.is_nan()) {
                return Err(format!(
                    "{shape} at pitch {pitch}: the gap after row {r} was written"
                ));
            }
        }
        Ok(packed)
    };
    let what = |direction: &str| {
        format!(
            "{direction} {:?}->{:?} {shape} pitch {pitch}",
            I::DTYPE,
            O::DTYPE
        )
    };

    let x = rounded::<I>(&random_matrix(rng, shape, 8.0));
    let input = upload::<I>(&spread(&x))?;
    let mut y = poisoned::<O>(rows * pitch)?;
    softmax
        .forward(
            Operation::Softmax,
            Rows::strided(&input, shape, pitch).map_err(text)?,
            RowsMut::strided(&mut y, shape, pitch).map_err(text)?,
            &Options::new(),
        )
        .map_err(|e| format!("{}: {e}", what("forward")))?;
    softmax
        .synchronize()
        .map_err(|e| format!("{}: {e}", what("forward")))?;
    let actual = gather(&download(&y)?)?;
    let expected = Scores::default().forward(false, &x, rows, cols);
    let tolerance = tolerance(O::DTYPE);
    record_forward::<O>(
        tally,
        &what("forward"),
        Operation::Softmax,
        &actual,
        &expected,
        cols,
        tolerance,
    )?;

    let probabilities = rounded::<I>(&actual);
    let dy = rounded::<I>(&random_matrix(rng, shape, 1.0));
    let (y_in, dy_in) = (
        upload::<I>(&spread(&probabilities))?,
        upload::<I>(&spread(&dy))?,
    );
    let mut dx = poisoned::<O>(rows * pitch)?;
    softmax
        .backward(
            Operation::Softmax,
            Rows::strided(&y_in, shape, pitch).map_err(text)?,
            Rows::strided(&dy_in, shape, pitch).map_err(text)?,
            RowsMut::strided(&mut dx, shape, pitch).map_err(text)?,
            &Options::new(),
        )
        .map_err(|e| format!("{}: {e}", what("backward")))?;
    softmax
        .synchronize()
        .map_err(|e| format!("{}: {e}", what("backward")))?;
    let actual = gather(&download(&dx)?)?;
    let expected = backward_f64(false, &probabilities, &dy, cols, &vec![1.0; rows]);
    record_gradient::<O>(
        tally,
        &what("backward"),
        Operation::Softmax,
        (&probabilities, &dy),
        &actual,
        &expected,
        cols,
    )?;
    Ok(2 * rows)
}

/// Column slices' states merged on the host equal the whole row's statistics, and each
/// slice normalized with all slices' states equals the softmax (and the log-softmax) of the
/// whole row.
fn partial_states(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    for (rows, cols, slices) in [(3, 100, 4), (64, 1000, 3), (8, 128256, 4), (2, 262144, 2)] {
        let shape = Shape::new(rows, cols).unwrap();
        let x = random_matrix(rng, shape, 8.0);
        let input = upload::<f32>(&x)?;
        let width = cols.div_ceil(slices);
        let bounds: Vec<(usize, usize)> = (0..cols)
            .step_by(width)
            .map(|first| (first, width.min(cols - first)))
            .collect();
        let states = DeviceBuffer::from_slice(&vec![RowState::default(); rows * bounds.len()])
            .map_err(text)?;
        for (slot, &(first, width)) in bounds.iter().enumerate() {
            let slice_shape = Shape::new(rows, width).unwrap();
            let columns = input.index(first..);
            let view = Rows::strided(&columns, slice_shape, cols).map_err(text)?;
            let mut slot_states = states.index(slot * rows..(slot + 1) * rows);
            softmax
                .row_states(view, &mut slot_states, &Options::new())
                .map_err(text)?;
        }
        softmax.synchronize().map_err(text)?;
        let mut host_states = vec![RowState::default(); rows * bounds.len()];
        states.copy_to(&mut host_states[..]).map_err(text)?;
        let whole = Scores::default().states(&x, rows, cols);
        for (r, &(max, sum)) in whole.iter().enumerate() {
            let merged = (0..bounds.len())
                .map(|slot| host_states[slot * rows + r])
                .fold(
                    RowState {
                        max: f32::NEG_INFINITY,
                        sum: 0.0,
                    },
                    merge_row_states,
                );
            let error =
                (f64::from(merged.sum) * (f64::from(merged.max) - max).exp() - sum).abs() / sum;
            if error > 1e-5 {
                return Err(format!(
                    "{shape} row {r}: merged states {merged:?}, reference ({max}, {sum})"
                ));
            }
        }
        // Each slice's maximum differs from its row's: the writes take the merged states'.
        for op in [Operation::Softmax, Operation::LogSoftmax] {
            let output = poisoned::<f32>(shape.len())?;
            for &(first, width) in &bounds {
                let slice_shape = Shape::new(rows, width).unwrap();
                let (columns, mut written) = (input.index(first..), output.index(first..));
                softmax
                    .normalize_with_states(
                        op,
                        Rows::strided(&columns, slice_shape, cols).map_err(text)?,
                        &states,
                        RowsMut::strided(&mut written, slice_shape, cols).map_err(text)?,
                        &Options::new(),
                    )
                    .map_err(text)?;
            }
            softmax.synchronize().map_err(text)?;
            let log = op == Operation::LogSoftmax;
            let expected = Scores::default().forward(log, &x, rows, cols);
            let actual = download(&output)?;
            // Log-probabilities have no row sum to check: their values only.
            let checked = if log {
                value_deviation(&actual, &expected)
            } else {
                deviation(&actual, &expected, cols)
            };
            tally.record(
                &format!("{op:?} {shape} in {} slices", bounds.len()),
                checked,
                1e-5,
            )?;
        }
    }
    Ok(tally.summary())
}

fn expect_error(
    what: &str,
    result: softmax::Result<()>,
    wanted: fn(&Error) -> bool,
) -> Result<(), String> {
    match result {
        Err(error) if wanted(&error) => Ok(()),
        other => Err(format!("{what}: got {other:?}")),
    }
}

fn bad_input_is_refused(softmax: &mut Softmax, _rng: &mut StdRng) -> Outcome {
    let shape = Shape::new(4, 8).unwrap();
    let input = upload::<f32>(&[1.0; 32])?;
    let mut output = poisoned::<bf16>(32)?;
    let short_mask = DeviceBuffer::from_slice(&[0.0f32; 12]).map_err(text)?;
    let row_scale = DeviceBuffer::from_slice(&[1.0f32; 3]).map_err(text)?;
    let mut lse = DeviceBuffer::from_slice(&[0.0f32; 3]).map_err(text)?;
    let mut checked = 0;
    let mut expect = |what: &str, result, wanted| {
        checked += 1;
        expect_error(what, result, wanted)
    };
    expect(
        "stride below cols",
        Rows::strided(&input, shape, 7).map(|_| ()),
        |e| matches!(e, Error::Stride { .. }),
    )?;
    expect(
        "view past the buffer",
        Rows::strided(&input, shape, 9).map(|_| ()),
        |e| matches!(e, Error::ViewLength { .. }),
    )?;
    expect(
        "contiguous view of the wrong length",
        Rows::new(&input.index(..31), shape).map(|_| ()),
        |e| matches!(e, Error::InputLength { .. }),
    )?;
    let run = |softmax: &mut Softmax, output: &mut DeviceBuffer<bf16>, options: &Options| {
        softmax.forward(
            Operation::Softmax,
            Rows::new(&input, shape)?,
            RowsMut::new(output, shape)?,
            options,
        )
    };
    for temperature in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        expect(
            "bad temperature",
            run(
                softmax,
                &mut output,
                &Options::new().temperature(temperature),
            ),
            |e| matches!(e, Error::Scale(_)),
        )?;
    }
    expect(
        "mask of the wrong length",
        run(
            softmax,
            &mut output,
            &Options::new().mask(Mask::additive(&short_mask)),
        ),
        |e| matches!(e, Error::MaskLength { .. }),
    )?;
    expect(
        "row scale of the wrong length",
        run(softmax, &mut output, &Options::new().row_scale(&row_scale)),
        |e| matches!(e, Error::RowScaleLength { .. }),
    )?;
    expect(
        "causal on a shape that is not square blocks",
        run(softmax, &mut output, &Options::new().causal()),
        |e| matches!(e, Error::Causal { .. }),
    )?;
    expect(
        "log-sum-exp buffer of the wrong length",
        softmax.log_sum_exp(
            Rows::new(&input, shape).map_err(text)?,
            &mut lse,
            &Options::new(),
        ),
        |e| matches!(e, Error::PerRowLength { .. }),
    )?;
    let other_shape = Shape::new(8, 4).unwrap();
    expect(
        "output of another shape",
        softmax.forward(
            Operation::Softmax,
            Rows::new(&input, shape).map_err(text)?,
            RowsMut::new(&mut output, other_shape).map_err(text)?,
            &Options::new(),
        ),
        |e| matches!(e, Error::ShapeMismatch { .. }),
    )?;
    let mask = DeviceBuffer::from_slice(&[0.0f32; 8]).map_err(text)?;
    let y = upload::<bf16>(&[0.125; 32])?;
    expect(
        "a mask in the backward pass",
        softmax.backward(
            Operation::Softmax,
            Rows::new(&y, shape).map_err(text)?,
            Rows::new(&y, shape).map_err(text)?,
            RowsMut::new(&mut output, shape).map_err(text)?,
            &Options::new().mask(Mask::additive(&mask)),
        ),
        |e| matches!(e, Error::Unsupported { .. }),
    )?;
    // Rows too many and too wide to keep resident: their states would need two launches.
    let wide = Shape::new(600, 200_000).unwrap();
    let wide_input = DeviceBuffer::<f32>::zeroed(wide.len()).map_err(text)?;
    let mut states =
        DeviceBuffer::from_slice(&vec![RowState::default(); wide.rows()]).map_err(text)?;
    // Unmasked and masked: the two plan with different kernels.
    let allowed = DeviceBuffer::from_slice(&vec![1u8; wide.cols()]).map_err(text)?;
    for options in [Options::new(), Options::new().mask(Mask::allowed(&allowed))] {
        expect(
            "row states of rows too many and too wide to keep resident",
            softmax.row_states(
                Rows::new(&wide_input, wide).map_err(text)?,
                &mut states,
                &options,
            ),
            |e| matches!(e, Error::Unsupported { .. }),
        )?;
    }
    softmax.synchronize().map_err(text)?;
    if !download(&output)?.iter().all(|v| v.is_nan()) {
        return Err("a refused call wrote to the output".into());
    }
    let mut host_states = vec![RowState { max: 1.0, sum: 1.0 }; wide.rows()];
    states.copy_to(&mut host_states[..]).map_err(text)?;
    if host_states.iter().any(|s| *s != RowState::default()) {
        return Err("a refused row_states call wrote states".into());
    }
    Ok(format!(
        "{checked} bad calls refused with their typed errors, nothing written"
    ))
}

/// Random cases in the fuzz run (as many as the f32 variants' fuzz in `gpu_stress`).
const FUZZ_CASES: usize = 10_000;

/// A random shape: mostly narrow to medium rows, sometimes a few very wide rows or a column.
fn fuzz_shape(rng: &mut StdRng) -> Shape {
    let (rows, cols) = match rng.random_range(0..10) {
        0 => (rng.random_range(1..=4), rng.random_range(1..=300_000)),
        1 => (rng.random_range(1..=2000), rng.random_range(1..=3)),
        2 => (1, rng.random_range(1..=5000)),
        _ => (rng.random_range(1..=64), rng.random_range(1..=5000)),
    };
    Shape::new(rows, cols).unwrap()
}

/// Where one buffer of a fuzz case lies: its first row `offset` elements into the allocation
/// (so its start may be misaligned) and its rows `pitch` elements apart.
#[derive(Clone, Copy, Debug)]
struct Placement {
    offset: usize,
    pitch: usize,
}

impl Placement {
    /// Half the time at the start of its allocation; a third of the time with a pitch wider
    /// than the row.
    fn random(rng: &mut StdRng, cols: usize) -> Self {
        Placement {
            offset: if rng.random_bool(0.5) {
                0
            } else {
                rng.random_range(1..8)
            },
            pitch: if rng.random_ratio(1, 3) {
                cols + rng.random_range(1..=9)
            } else {
                cols
            },
        }
    }

    fn allocation(&self, shape: Shape) -> usize {
        self.offset + shape.rows() * self.pitch
    }

    /// `rows` (compact) laid out in an allocation, with `fill` around them.
    fn spread(&self, rows: &[f32], shape: Shape, fill: f32) -> Vec<f32> {
        let mut all = vec![fill; self.allocation(shape)];
        for (r, row) in rows.chunks(shape.cols()).enumerate() {
            let start = self.offset + r * self.pitch;
            all[start..start + shape.cols()].copy_from_slice(row);
        }
        all
    }

    /// The rows gathered from an allocation, or an error if anything around them changed
    /// from NaN.
    fn gather(&self, all: &[f32], shape: Shape) -> Result<Vec<f32>, String> {
        let mut rows = Vec::with_capacity(shape.len());
        let mut next = 0;
        for r in 0..shape.rows() {
            let start = self.offset + r * self.pitch;
            if !all[next..start].iter().all(|v| v.is_nan()) {
                return Err(format!("{self:?}: written outside the rows before row {r}"));
            }
            rows.extend_from_slice(&all[start..start + shape.cols()]);
            next = start + shape.cols();
        }
        if !all[next..].iter().all(|v| v.is_nan()) {
            return Err(format!("{self:?}: written after the last row"));
        }
        Ok(rows)
    }
}

/// Runs `call` on a view of a NaN-poisoned output placed at `at`, waits for it, and returns
/// the rows it wrote (an error if it wrote anything else).
fn written<O: Element>(
    softmax: &mut Softmax,
    what: &str,
    at: Placement,
    shape: Shape,
    call: impl FnOnce(&mut Softmax, RowsMut<'_>) -> softmax::Result<()>,
) -> Result<Vec<f32>, String> {
    let output = poisoned::<O>(at.allocation(shape))?;
    let mut view = output.index(at.offset..);
    let rows = RowsMut::strided(&mut view, shape, at.pitch).map_err(text)?;
    call(softmax, rows).map_err(|e| format!("{what}: {e}"))?;
    softmax.synchronize().map_err(|e| format!("{what}: {e}"))?;
    at.gather(&download(&output)?, shape)
        .map_err(|e| format!("{what}: {e}"))
}

/// One forward case from `I` to `O`: softmax or log-softmax with a random scale.
fn fuzz_forward<I: Element, O: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    rng: &mut StdRng,
    shape: Shape,
) -> Result<(), String> {
    let op = [Operation::Softmax, Operation::LogSoftmax][rng.random_range(0..2)];
    let scale = [1.0, 0.5, 3.0][rng.random_range(0..3)];
    let magnitude = [1.0, 8.0, 30.0][rng.random_range(0..3)];
    let x = rounded::<I>(&random_matrix(rng, shape, magnitude));
    let (from, to) = (
        Placement::random(rng, shape.cols()),
        Placement::random(rng, shape.cols()),
    );
    let what = format!(
        "{op:?} {:?}->{:?} {shape} scale {scale}, input {from:?}, output {to:?}",
        I::DTYPE,
        O::DTYPE
    );
    let input = upload::<I>(&from.spread(&x, shape, 7.0))?;
    let input_view = input.index(from.offset..);
    let input = Rows::strided(&input_view, shape, from.pitch).map_err(text)?;
    let actual = written::<O>(softmax, &what, to, shape, |softmax, output| {
        softmax.forward(op, input, output, &Options::new().scale(scale))
    })?;
    let expected = Scores {
        scale,
        ..Scores::default()
    }
    .forward(op == Operation::LogSoftmax, &x, shape.rows(), shape.cols());
    if O::DTYPE != DType::F32 {
        let tolerance = match op {
            Operation::Softmax => forward_tolerance(O::DTYPE, magnitude * scale),
            Operation::LogSoftmax => tolerance(O::DTYPE),
        };
        return record_forward::<O>(
            tally,
            &what,
            op,
            &actual,
            &expected,
            shape.cols(),
            tolerance,
        );
    }
    let deviation = value_deviation(&actual, &as_written::<O>(&expected));
    let (deviation, tolerance) = if op == Operation::LogSoftmax {
        // `k·x − max − ln Σ` cancels to near zero in rows of one or a few columns: what is left
        // is the rounding of the scaled scores, an error additive in them (no exponential
        // amplifies it).
        let scores = x.iter().map(|&v| f64::from(v) * f64::from(scale));
        (
            relative_to_terms(deviation, &expected, norm(scores)),
            tolerance(O::DTYPE),
        )
    } else {
        (deviation, forward_tolerance(O::DTYPE, magnitude * scale))
    };
    tally.record(&what, deviation, tolerance)
}

/// One backward case from `T` to `O`, from a forward result of the reference.
fn fuzz_backward<T: Element, O: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    rng: &mut StdRng,
    shape: Shape,
) -> Result<(), String> {
    let op = [Operation::Softmax, Operation::LogSoftmax][rng.random_range(0..2)];
    let log = op == Operation::LogSoftmax;
    let x = random_matrix(rng, shape, 8.0);
    let forward = Scores::default().forward(log, &x, shape.rows(), shape.cols());
    let y = rounded::<T>(&forward.iter().map(|&v| v as f32).collect::<Vec<_>>());
    let dy = rounded::<T>(&random_matrix(rng, shape, 1.0));
    let [at_y, at_dy, at_dx] = [(); 3].map(|_| Placement::random(rng, shape.cols()));
    let what = format!(
        "backward {op:?} {:?}->{:?} {shape}, y {at_y:?}, dy {at_dy:?}, dx {at_dx:?}",
        T::DTYPE,
        O::DTYPE
    );
    let (y_device, dy_device) = (
        upload::<T>(&at_y.spread(&y, shape, 0.5))?,
        upload::<T>(&at_dy.spread(&dy, shape, 0.5))?,
    );
    let (y_view, dy_view) = (
        y_device.index(at_y.offset..),
        dy_device.index(at_dy.offset..),
    );
    let y_rows = Rows::strided(&y_view, shape, at_y.pitch).map_err(text)?;
    let dy_rows = Rows::strided(&dy_view, shape, at_dy.pitch).map_err(text)?;
    let actual = written::<O>(softmax, &what, at_dx, shape, |softmax, dx| {
        softmax.backward(op, y_rows, dy_rows, dx, &Options::new())
    })?;
    let expected = backward_f64(log, &y, &dy, shape.cols(), &vec![1.0; shape.rows()]);
    record_gradient::<O>(
        tally,
        &what,
        op,
        (&y, &dy),
        &actual,
        &expected,
        shape.cols(),
    )
}

/// One case with input type `I`: forward or backward, into a random output type.
fn fuzz_case<I: Element>(
    softmax: &mut Softmax,
    tally: &mut Tally,
    rng: &mut StdRng,
    shape: Shape,
) -> Result<(), String> {
    match (rng.random_bool(0.5), rng.random_range(0..3)) {
        (true, 0) => fuzz_forward::<I, f32>(softmax, tally, rng, shape),
        (true, 1) => fuzz_forward::<I, bf16>(softmax, tally, rng, shape),
        (true, _) => fuzz_forward::<I, f16>(softmax, tally, rng, shape),
        (false, 0) => fuzz_backward::<I, f32>(softmax, tally, rng, shape),
        (false, 1) => fuzz_backward::<I, bf16>(softmax, tally, rng, shape),
        (false, _) => fuzz_backward::<I, f16>(softmax, tally, rng, shape),
    }
}

/// Random shapes, operations, type pairs, scales, offsets and pitches, so that rows are
/// laid out aligned, peeled or element by element as chance has it. The seed replays a case.
fn fuzz(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut tally = Tally::default();
    for case in 0..FUZZ_CASES {
        let shape = fuzz_shape(rng);
        match rng.random_range(0..3) {
            0 => fuzz_case::<f32>(softmax, &mut tally, rng, shape),
            1 => fuzz_case::<bf16>(softmax, &mut tally, rng, shape),
            _ => fuzz_case::<f16>(softmax, &mut tally, rng, shape),
        }
        .map_err(|e| format!("case {case}: {e}"))?;
    }
    Ok(tally.summary())
}
