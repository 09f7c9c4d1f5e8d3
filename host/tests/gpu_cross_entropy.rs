//! GPU tests of cross-entropy against the f64 reference: every option alone and combined, in
//! f32, bf16 and f16, i32 and i64 targets, the gradient into a buffer and in place, ignored
//! rows and a batch of them only, targets out of range, strided and unaligned rows, upstream
//! gradients on the device, vocabulary shards (2, 3 and 8 on one GPU) against the unsharded
//! call, the special values of docs/numerics.md, and bad input. Without a CUDA device each test is reported as skipped.
//!
//! Losses are checked row by row (absolute error at most `1e-5 · max(1, |loss|)` for f32
//! logits, `1e-4 · …` for 16-bit ones, whose inputs are rounded first and read rounded by the
//! reference too); gradients by their relative L2 over the tensor and row by row (f32 `1e-4`,
//! 16-bit outputs `1.5e-2`), with NaN exactly where the reference has NaN.

mod common;

use std::time::Duration;

use common::kernels::Holder;
use common::{download, rounded, shape, text, upload};

use cust::memory::{CopyDestination, DeviceBuffer};
use rand::Rng;
use rand::rngs::StdRng;
use softmax::half::{bf16, f16};
use softmax::reference::{CrossEntropyReference, Reduction, cross_entropy_f64, value_deviation};
use softmax::{
    CrossEntropyOptions, CrossEntropyOutputs, CrossEntropyState, DType, Element, Error, Options,
    Rows, RowsMut, Softmax, Targets, Upstream, Values,
};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[
    ("ce_every_option_and_type", every_option_and_type),
    (
        "ce_block_entries_every_slicing",
        block_entries_every_slicing,
    ),
    (
        "ce_row_slices_are_exact_when_blocks_leave_their_slices",
        leaving_blocks,
    ),
    ("ce_in_place_equals_out_of_place", in_place),
    (
        "ce_ignored_and_out_of_range_targets",
        ignored_and_out_of_range,
    ),
    ("ce_strided_and_unaligned_rows", strided_and_unaligned),
    ("ce_targets_where_the_work_changes_hands", targets_at_edges),
    ("ce_upstream_gradients_on_the_device", upstream_on_device),
    ("ce_vocabulary_shards_match_the_whole", shards),
    ("ce_captured_in_a_graph", captured),
    ("ce_bad_input_is_refused", bad_input),
    ("ce_special_values_follow_the_reference", special_values),
];

fn main() -> std::process::ExitCode {
    common::run_harness(TESTS)
}

/// One case's options, for the library and the reference.
#[derive(Clone, Copy, Debug)]
struct Case {
    ignore: Option<i64>,
    smoothing: f32,
    z_loss: f32,
    softcap: Option<f32>,
    reduction: Reduction,
    weighted: bool,
}

impl Case {
    const PLAIN: Case = Case {
        ignore: Some(-100),
        smoothing: 0.0,
        z_loss: 0.0,
        softcap: None,
        reduction: Reduction::Mean,
        weighted: false,
    };

    fn all() -> Vec<Case> {
        let p = Case::PLAIN;
        vec![
            p,
            Case {
                reduction: Reduction::None,
                ..p
            },
            Case {
                reduction: Reduction::Sum,
                ..p
            },
            Case { ignore: None, ..p },
            Case {
                smoothing: 0.1,
                ..p
            },
            Case { z_loss: 1e-4, ..p },
            Case {
                softcap: Some(30.0),
                ..p
            },
            Case {
                weighted: true,
                ..p
            },
            Case {
                ignore: Some(-100),
                smoothing: 0.2,
                z_loss: 1e-3,
                softcap: Some(15.0),
                reduction: Reduction::Mean,
                weighted: true,
            },
            Case {
                smoothing: 0.05,
                weighted: true,
                reduction: Reduction::None,
                ..p
            },
            Case {
                smoothing: 0.1,
                reduction: Reduction::Sum,
                ..p
            },
            Case {
                smoothing: 0.1,
                weighted: true,
                reduction: Reduction::Sum,
                ..p
            },
        ]
    }

    fn reference<'a>(&self, weight: &'a [f32]) -> CrossEntropyReference<'a> {
        CrossEntropyReference {
            ignore_index: self.ignore,
            label_smoothing: f64::from(self.smoothing),
            z_loss: f64::from(self.z_loss),
            softcap: self.softcap.map_or(0.0, f64::from),
            reduction: self.reduction,
            weight: self.weighted.then_some(weight),
        }
    }

    fn options<'a>(&self, weight: &'a DeviceBuffer<f32>) -> CrossEntropyOptions<'a> {
        let mut options = CrossEntropyOptions::new()
            .ignore_index(self.ignore)
            .label_smoothing(self.smoothing)
            .z_loss(self.z_loss)
            .reduction(self.reduction);
        if let Some(cap) = self.softcap {
            options = options.softcap(cap);
        }
        if self.weighted {
            options = options.weight(weight);
        }
        options
    }
}

/// Targets for `rows` rows of `cols` classes, every fifth row ignored (where `ignore`).
fn targets(rng: &mut StdRng, rows: usize, cols: usize, ignore: Option<i64>) -> Vec<i64> {
    (0..rows)
        .map(|r| match ignore {
            Some(index) if r % 5 == 4 => index,
            _ => rng.random_range(0..cols as i64),
        })
        .collect()
}

fn loss_tolerance(dtype: DType) -> f64 {
    if dtype == DType::F32 { 1e-5 } else { 1e-4 }
}

fn gradient_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 4e-3,
        DType::Bf16 => 1.5e-2,
    }
}

/// Checks losses (`what`) against the reference's, each within the tolerance: NaN where the
/// reference has NaN, the same infinity where it has one.
fn check_losses(
    what: &str,
    actual: &[f32],
    expected: &[f64],
    tolerance: f64,
) -> Result<(), String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "{what}: {} losses where {} were expected",
            actual.len(),
            expected.len()
        ));
    }
    for (r, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let a = f64::from(a);
        let ok = if e.is_nan() {
            a.is_nan()
        } else if e.is_infinite() {
            a == e
        } else {
            (a - e).abs() <= tolerance * e.abs().max(1.0)
        };
        if !ok {
            return Err(format!(
                "{what}: loss {r} is {a} where the reference has {e}"
            ));
        }
    }
    Ok(())
}

/// Checks a gradient against the reference: over the tensor and row by row. A row's gradient
/// is a difference of terms (the target's probability against its one-hot share) of about
/// `floor` (the upstream gradient over the mean's divisor, times the target's weight); where
/// they cancel (a target with nearly all the probability), rounding is relative to them, not
/// to the difference, so the deviation may reach the tolerance of `floor` per row.
fn check_gradient(
    what: &str,
    actual: &[f32],
    expected: &[f64],
    cols: usize,
    tolerance: f64,
    floor: f64,
) -> Result<f64, String> {
    let within = |a: &[f32], e: &[f64], tolerance: f64, floor: f64| {
        let deviation = value_deviation(a, e);
        // NaN where the reference has NaN is a match (value_deviation counts the others).
        let pairs = || {
            a.iter()
                .map(|&a| f64::from(a))
                .zip(e.iter().copied())
                .filter(|(a, e)| !(a.is_nan() && e.is_nan()))
        };
        let norm = pairs().map(|(_, e)| e * e).sum::<f64>().sqrt();
        let error = pairs().map(|(a, e)| (a - e).powi(2)).sum::<f64>().sqrt();
        let ok = deviation.within(tolerance)
            || (deviation.nan_mismatches == 0 && error <= tolerance * norm.max(floor));
        (ok, deviation)
    };
    let rows = actual.len().checked_div(cols).unwrap_or(0);
    let (ok, whole) = within(actual, expected, tolerance, floor * (rows as f64).sqrt());
    if !ok {
        return Err(format!("{what}: gradient {whole:?}"));
    }
    let mut worst = whole.relative_l2;
    for (r, (a, e)) in actual.chunks(cols).zip(expected.chunks(cols)).enumerate() {
        let (ok, row) = within(a, e, tolerance * 2.0, floor);
        let small = e.iter().all(|v| v.abs() < 1e-30);
        if !small && !ok {
            return Err(format!("{what}: gradient row {r} {row:?}"));
        }
        worst = worst.max(if small { 0.0 } else { row.relative_l2 });
    }
    Ok(worst)
}

/// Runs one case on logits of `T` through the fused call (gradient into a buffer of `T`) and
/// compares with the reference.
fn run_case<T: Element>(
    softmax: &mut Softmax,
    rng: &mut StdRng,
    case: Case,
    rows: usize,
    cols: usize,
    wide_targets: bool,
) -> Result<f64, String> {
    run_case_beside::<T>(softmax, rng, case, (rows, cols), wide_targets, None)
        .map(|(worst, _)| worst)
}

/// [`run_case`], its fused call launched while `holder` (if given) holds all but a few
/// multiprocessors: the call's blocks cannot all be resident at once. Also returns how many
/// of that call's blocks left their slices.
fn run_case_beside<T: Element>(
    softmax: &mut Softmax,
    rng: &mut StdRng,
    case: Case,
    (rows, cols): (usize, usize),
    wide_targets: bool,
    holder: Option<&Holder>,
) -> Result<(f64, u64), String> {
    let s = shape(rows, cols);
    let values = rounded::<T>(&common::random_matrix(rng, s, 6.0));
    let weight_values: Vec<f32> = (0..cols).map(|_| rng.random_range(0.25..2.0)).collect();
    let target_values = targets(rng, rows, cols, case.ignore);
    let reference = cross_entropy_f64(
        &values,
        rows,
        cols,
        &target_values,
        &case.reference(&weight_values),
    );
    let logits = upload::<T>(&values)?;
    let weight = DeviceBuffer::from_slice(&weight_values).map_err(text)?;
    let narrow: Vec<i32> = target_values.iter().map(|&t| t as i32).collect();
    let targets32 = DeviceBuffer::from_slice(&narrow).map_err(text)?;
    let targets64 = DeviceBuffer::from_slice(&target_values).map_err(text)?;
    let targets: Targets<'_> = if wide_targets {
        (&targets64).into()
    } else {
        (&targets32).into()
    };
    let reduced = case.reduction != Reduction::None;
    let mut loss = common::poisoned(if reduced { 1 } else { rows })?;
    let mut lse = common::poisoned(rows)?;
    let mut gradient = upload::<T>(&vec![f32::NAN; rows * cols])?;
    let ce = case.options(&weight);
    let left = beside(softmax, holder, |softmax| {
        softmax.cross_entropy_backward(
            Rows::new(&logits, s)?,
            targets,
            CrossEntropyOutputs::new().loss(&mut loss).lse(&mut lse),
            RowsMut::new(&mut gradient, s)?,
            Upstream::Value(1.0),
            &ce,
            &Options::new(),
        )
    })?;
    let what = format!("{case:?} {:?} {rows}×{cols}", T::DTYPE);
    let losses = download(&loss)?;
    let expected_losses = if reduced {
        vec![reference.reduced]
    } else {
        reference.losses.clone()
    };
    check_losses(&what, &losses, &expected_losses, loss_tolerance(T::DTYPE))?;
    check_losses(
        &format!("{what} lse"),
        &download(&lse)?,
        &reference.lse,
        loss_tolerance(T::DTYPE),
    )?;
    // The forward-only call gives the same losses.
    let mut forward_loss = common::poisoned(if reduced { 1 } else { rows })?;
    softmax
        .cross_entropy(
            Rows::new(&logits, s).map_err(text)?,
            if wide_targets {
                Targets::from(&targets64)
            } else {
                Targets::from(&targets32)
            },
            CrossEntropyOutputs::new().loss(&mut forward_loss),
            &ce,
            &Options::new(),
        )
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    check_losses(
        &format!("{what} forward"),
        &download(&forward_loss)?,
        &expected_losses,
        loss_tolerance(T::DTYPE),
    )?;
    let expected: Vec<f64> = common::as_written::<T>(&reference.gradient);
    let scale = if case.reduction == Reduction::Mean {
        1.0 / reference.denominator
    } else {
        1.0
    };
    let largest_weight = if case.weighted { 2.0 } else { 1.0 };
    let worst = check_gradient(
        &what,
        &download(&gradient)?,
        &expected,
        cols,
        gradient_tolerance(T::DTYPE),
        scale * largest_weight,
    )?;
    Ok((worst, left))
}

fn every_option_and_type(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let shapes = [
        (1, 1),
        (3, 7),
        (64, 1000),
        (33, 32000),
        (8, 50257),
        (4, 128256),
        (2, 262144),
    ];
    let mut runs = 0;
    let mut worst: f64 = 0.0;
    for (i, case) in Case::all().into_iter().enumerate() {
        for (j, &(rows, cols)) in shapes.iter().enumerate() {
            let wide = (i + j) % 2 == 0;
            worst = worst.max(run_case::<f32>(softmax, rng, case, rows, cols, wide)?);
            worst = worst.max(run_case::<bf16>(softmax, rng, case, rows, cols, !wide)?);
            if j % 2 == 0 {
                worst = worst.max(run_case::<f16>(softmax, rng, case, rows, cols, wide)?);
            }
            runs += 3;
        }
    }
    Ok(format!(
        "{runs} fused calls (loss, lse, gradient) and their forward-only twins, every option alone and combined, f32/bf16/f16, i32/i64 targets: worst gradient relative L2 {worst:.2e}"
    ))
}

/// The calls the block entries and the row-slices entries take (aligned rows, no label
/// smoothing), over each way their planner cuts rows: whole rows, clusters in waves, clusters
/// of few rows and one cooperative launch, and row slices in waves of rows (the wider rows in
/// waves: bf16 200×128256, f16 200×128256, f32 160×262144), against the reference.
fn block_entries_every_slicing(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let p = Case::PLAIN;
    let cases = [
        p,
        Case {
            weighted: true,
            z_loss: 1e-3,
            reduction: Reduction::None,
            ..p
        },
        Case {
            ignore: None,
            reduction: Reduction::Sum,
            ..p
        },
    ];
    let mut runs = 0;
    let mut worst: f64 = 0.0;
    for (i, case) in cases.into_iter().enumerate() {
        let wide = i % 2 == 0;
        let bf16_shapes = [
            (1100, 32000),
            (200, 128256),
            (64, 262144),
            (1, 32000),
            (5, 100000),
        ];
        for (rows, cols) in bf16_shapes {
            worst = worst.max(run_case::<bf16>(softmax, rng, case, rows, cols, wide)?);
            runs += 1;
        }
        for (rows, cols) in [(160, 262144), (300, 32000), (2, 128256)] {
            worst = worst.max(run_case::<f32>(softmax, rng, case, rows, cols, !wide)?);
            runs += 1;
        }
        for (rows, cols) in [(40, 151936), (200, 128256)] {
            worst = worst.max(run_case::<f16>(softmax, rng, case, rows, cols, wide)?);
            runs += 1;
        }
    }
    Ok(format!(
        "{runs} fused calls and their forward-only twins on rows whole, in clusters in waves, in clusters, in one cooperative launch and in row slices in waves: worst gradient relative L2 {worst:.2e}"
    ))
}

/// Makes `call` on `softmax` and waits for it, while `holder` (if given) holds all but a few
/// multiprocessors; returns how many of the call's blocks left their slices (0 without a
/// holder, which alone makes them leave: the count is not read then).
fn beside(
    softmax: &mut Softmax,
    holder: Option<&Holder>,
    call: impl FnOnce(&mut Softmax) -> Result<(), Error>,
) -> Result<u64, String> {
    let Some(holder) = holder else {
        call(softmax).map_err(text)?;
        softmax.synchronize().map_err(text)?;
        return Ok(0);
    };
    let before = softmax.blocks_that_left().map_err(text)?;
    let held = holder.hold(HOLD)?;
    let called = call(softmax).and_then(|()| softmax.synchronize());
    // The holder's buffers are released only once its kernel is done, whatever the call did.
    let waited = holder.stream.synchronize();
    drop(held);
    called.map_err(text)?;
    waited.map_err(text)?;
    Ok(softmax
        .blocks_that_left()
        .map_err(text)?
        .saturating_sub(before))
}

/// How long the holder of [`leaving_blocks`] keeps its multiprocessors.
const HOLD: Duration = Duration::from_millis(20);

/// The row-slices entries on an instance whose blocks wait no time for their rows, each fused
/// call launched beside a kernel that holds all but four multiprocessors (on an idle GPU a
/// row's blocks all arrive within the timer's resolution, and none would leave): blocks leave
/// their slices to their rows' last blocks, which write them from the logits, never yet
/// written. The results must be exact as ever, and the device's count of blocks that left
/// must grow at every call (so the leaving path ran, and the call took the row-slices
/// entries).
fn leaving_blocks(_softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut impatient = Softmax::new().map_err(text)?;
    impatient.set_row_barrier_patience(Duration::ZERO);
    let holder = Holder::new(impatient.device(), 4)?;
    let p = Case::PLAIN;
    let cases = [
        Case {
            reduction: Reduction::None,
            z_loss: 1e-3,
            ..p
        },
        Case {
            weighted: true,
            ..p
        },
    ];
    let (mut calls, mut blocks_left, mut worst) = (0, 0, 0.0f64);
    for case in cases {
        for (dtype, rows, cols) in [
            (DType::Bf16, 200, 128256),
            (DType::F32, 160, 262144),
            (DType::F16, 200, 128256),
        ] {
            // A first call loads the module and sizes the workspace: one that waited for the
            // device would start after the holder let go.
            let run = |softmax: &mut Softmax, rng: &mut StdRng, holder| match dtype {
                DType::Bf16 => {
                    run_case_beside::<bf16>(softmax, rng, case, (rows, cols), true, holder)
                }
                DType::F16 => {
                    run_case_beside::<f16>(softmax, rng, case, (rows, cols), true, holder)
                }
                _ => run_case_beside::<f32>(softmax, rng, case, (rows, cols), false, holder),
            };
            run(&mut impatient, rng, None)?;
            let (gradient_error, left) = run(&mut impatient, rng, Some(&holder))?;
            if left == 0 {
                return Err(format!(
                    "{case:?} {dtype:?} {rows}×{cols}: no block left its slice"
                ));
            }
            worst = worst.max(gradient_error);
            blocks_left += left;
            calls += 1;
        }
    }
    // In place, the slices left are read again from the logits, which no block has written.
    in_place_matches_apart(&mut impatient, rng, (200, 128256), 0.0, None)?;
    let left = in_place_matches_apart(&mut impatient, rng, (200, 128256), 0.0, Some(&holder))?;
    if left == 0 {
        return Err("bf16 200×128256 in place: no block left its slice".into());
    }
    blocks_left += left;
    Ok(format!(
        "{calls} fused calls in row slices with zero patience beside {} held multiprocessors \
         matched the reference (worst gradient relative L2 {worst:.2e}), and one in place \
         matched the gradient written apart; {blocks_left} blocks left their slices in those \
         {} calls, some in each",
        holder.blocks,
        calls + 1
    ))
}

fn in_place(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    // Label smoothing takes the row kernel; without it, the block entries, and at 300×128256
    // the row-slices entries in waves.
    let shapes = [
        (16, 32000, 0.1),
        (4, 151936, 0.1),
        (64, 1000, 0.1),
        (16, 32000, 0.0),
        (300, 128256, 0.0),
        (64, 1000, 0.0),
    ];
    for &(rows, cols, smoothing) in &shapes {
        in_place_matches_apart(softmax, rng, (rows, cols), smoothing, None)?;
    }
    Ok(format!(
        "{} bf16 calls (the row kernel, the block entries and the row-slices entries): the gradient written over the logits is bit for bit the one written apart",
        shapes.len()
    ))
}

/// Whether the bf16 gradient and loss written over the logits are bit for bit those written
/// apart, each call launched while `holder` (if given) holds all but a few multiprocessors;
/// returns how many blocks of the in-place call left their slices.
fn in_place_matches_apart(
    softmax: &mut Softmax,
    rng: &mut StdRng,
    (rows, cols): (usize, usize),
    smoothing: f32,
    holder: Option<&Holder>,
) -> Result<u64, String> {
    let s = shape(rows, cols);
    let values = rounded::<bf16>(&common::random_matrix(rng, s, 6.0));
    let target_values = targets(rng, rows, cols, Some(-100));
    let t = DeviceBuffer::from_slice(&target_values).map_err(text)?;
    let ce = CrossEntropyOptions::new()
        .label_smoothing(smoothing)
        .z_loss(1e-4);
    let logits = upload::<bf16>(&values)?;
    let mut apart = upload::<bf16>(&vec![f32::NAN; rows * cols])?;
    let mut loss_apart = common::poisoned(1)?;
    let mut in_place = upload::<bf16>(&values)?;
    let mut loss = common::poisoned(1)?;
    beside(softmax, holder, |softmax| {
        softmax.cross_entropy_backward(
            Rows::new(&logits, s)?,
            &t,
            CrossEntropyOutputs::new().loss(&mut loss_apart),
            RowsMut::new(&mut apart, s)?,
            Upstream::Value(0.5),
            &ce,
            &Options::new(),
        )
    })?;
    let left = beside(softmax, holder, |softmax| {
        softmax.cross_entropy_backward_in_place(
            RowsMut::new(&mut in_place, s)?,
            &t,
            CrossEntropyOutputs::new().loss(&mut loss),
            Upstream::Value(0.5),
            &ce,
            &Options::new(),
        )
    })?;
    let (a, b) = (download(&apart)?, download(&in_place)?);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    if bits(&a) != bits(&b) {
        return Err(format!(
            "{rows}×{cols}: the in-place gradient differs from the one written apart"
        ));
    }
    if download(&loss)?[0].to_bits() != download(&loss_apart)?[0].to_bits() {
        return Err(format!("{rows}×{cols}: the in-place loss differs"));
    }
    Ok(left)
}

fn ignored_and_out_of_range(softmax: &mut Softmax, _rng: &mut StdRng) -> Outcome {
    let s = shape(4, 1000);
    let values: Vec<f32> = (0..s.len()).map(|i| (i % 13) as f32 * 0.3).collect();
    let logits = upload::<f32>(&values)?;
    // Every row ignored: the mean is NaN (as torch's), the gradient 0.
    let all_ignored = DeviceBuffer::from_slice(&[-100i64; 4]).map_err(text)?;
    let mut loss = common::poisoned(1)?;
    let mut gradient = common::poisoned(s.len())?;
    softmax
        .cross_entropy_backward(
            Rows::new(&logits, s).map_err(text)?,
            &all_ignored,
            CrossEntropyOutputs::new().loss(&mut loss),
            RowsMut::new(&mut gradient, s).map_err(text)?,
            Upstream::Value(1.0),
            &CrossEntropyOptions::new(),
            &Options::new(),
        )
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    let (l, g) = (download(&loss)?, download(&gradient)?);
    if !l[0].is_nan() || g.iter().any(|&v| v != 0.0) {
        return Err(format!(
            "all ignored: loss {} and a gradient not all zero",
            l[0]
        ));
    }
    // A target past the vocabulary and a negative one (not the ignore index): NaN in those
    // rows only.
    let bad = DeviceBuffer::from_slice(&[3i64, 1000, -7, 999]).map_err(text)?;
    let mut losses = common::poisoned(4)?;
    let mut gradient = common::poisoned(s.len())?;
    softmax
        .cross_entropy_backward(
            Rows::new(&logits, s).map_err(text)?,
            &bad,
            CrossEntropyOutputs::new().loss(&mut losses),
            RowsMut::new(&mut gradient, s).map_err(text)?,
            Upstream::Value(1.0),
            &CrossEntropyOptions::new().reduction(Reduction::None),
            &Options::new(),
        )
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    let (l, g) = (download(&losses)?, download(&gradient)?);
    let nan_rows: Vec<bool> = l.iter().map(|v| v.is_nan()).collect();
    if nan_rows != [false, true, true, false] {
        return Err(format!("out-of-range targets: losses {l:?}"));
    }
    for (r, row) in g.chunks(1000).enumerate() {
        if row.iter().all(|v| v.is_nan()) != nan_rows[r]
            || (!nan_rows[r] && row.iter().any(|v| v.is_nan()))
        {
            return Err(format!("out-of-range targets: gradient row {r}"));
        }
    }
    Ok("a batch of ignored rows gives a NaN mean and a zero gradient; targets out of range give NaN in their rows only".into())
}

/// Targets on the columns where a row's work changes hands, in rows cut into clusters,
/// computed in place at a pitch that keeps every row 16-byte aligned: the first and last
/// columns, a slice's first column, the last column of a pack a thread reaches on a later
/// step, the columns after the last whole pack; ignored and out-of-range rows among them.
fn targets_at_edges(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut checked = Vec::new();
    // With label smoothing, the row kernel: bf16 6×50257 runs in twelve slices of 524 packs
    // of 8 (column 4192 starts the second; thread 11 reaches pack 523 on its second load);
    // f32 5×131075 in sixteen slices of 2048 packs of 4 (thread 511 reaches pack 2047 on its
    // second step). Without it, the row kernel still for rows that end in part of a pack
    // (aligned rows of 50257 columns: the last in the tail), and the block entries over rows of
    // whole packs, cut into slices (of 4096 or 8192 columns, or others) that these targets'
    // columns start or end.
    let cases: [(DType, usize, usize, f32, &[i64]); 5] = [
        (
            DType::Bf16,
            50257,
            50264,
            0.1,
            &[50256, 0, 4192, 4191, -100, 50262],
        ),
        (
            DType::F32,
            131075,
            131076,
            0.1,
            &[8191, 131074, 131072, 8192, -100],
        ),
        (
            DType::Bf16,
            50257,
            50264,
            0.0,
            &[50256, 0, 4192, 50255, -100, 50249],
        ),
        (
            DType::Bf16,
            65536,
            65544,
            0.0,
            &[65535, 0, 4096, 4095, 8192, 8191, -100, 65528, 16384],
        ),
        (
            DType::F32,
            131072,
            131076,
            0.0,
            &[8191, 131071, 4096, 8192, -100, 4095, 16383],
        ),
    ];
    for (dtype, cols, pitch, smoothing, target_values) in cases {
        let rows = target_values.len();
        let s = shape(rows, cols);
        let dense = common::random_matrix(rng, s, 6.0);
        let dense = match dtype {
            DType::Bf16 => rounded::<bf16>(&dense),
            _ => dense,
        };
        let mut padded = vec![0.0f32; (rows - 1) * pitch + cols];
        for r in 0..rows {
            padded[r * pitch..r * pitch + cols].copy_from_slice(&dense[r * cols..(r + 1) * cols]);
        }
        let case = Case {
            smoothing,
            z_loss: 1e-4,
            reduction: Reduction::None,
            ..Case::PLAIN
        };
        let reference = cross_entropy_f64(&dense, rows, cols, target_values, &case.reference(&[]));
        let t = DeviceBuffer::from_slice(target_values).map_err(text)?;
        let mut losses = common::poisoned(rows)?;
        let ce = CrossEntropyOptions::new()
            .label_smoothing(smoothing)
            .z_loss(1e-4)
            .reduction(Reduction::None);
        let gradient = match dtype {
            DType::Bf16 => {
                let mut logits = upload::<bf16>(&padded)?;
                softmax
                    .cross_entropy_backward_in_place(
                        RowsMut::strided(&mut logits, s, pitch).map_err(text)?,
                        &t,
                        CrossEntropyOutputs::new().loss(&mut losses),
                        Upstream::Value(1.0),
                        &ce,
                        &Options::new(),
                    )
                    .map_err(text)?;
                softmax.synchronize().map_err(text)?;
                download(&logits)?
            }
            _ => {
                let mut logits = DeviceBuffer::from_slice(&padded).map_err(text)?;
                softmax
                    .cross_entropy_backward_in_place(
                        RowsMut::strided(&mut logits, s, pitch).map_err(text)?,
                        &t,
                        CrossEntropyOutputs::new().loss(&mut losses),
                        Upstream::Value(1.0),
                        &ce,
                        &Options::new(),
                    )
                    .map_err(text)?;
                softmax.synchronize().map_err(text)?;
                download(&logits)?
            }
        };
        let what =
            format!("{dtype:?} {rows}×{cols} at a pitch of {pitch}, targets {target_values:?}");
        check_losses(
            &what,
            &download(&losses)?,
            &reference.losses,
            loss_tolerance(dtype),
        )?;
        let dense_gradient: Vec<f32> = (0..rows)
            .flat_map(|r| gradient[r * pitch..r * pitch + cols].iter().copied())
            .collect();
        let expected = match dtype {
            DType::Bf16 => common::as_written::<bf16>(&reference.gradient),
            _ => reference.gradient.clone(),
        };
        check_gradient(
            &what,
            &dense_gradient,
            &expected,
            cols,
            gradient_tolerance(dtype),
            1.0,
        )?;
        checked.push(format!("{dtype:?} {rows}×{cols}"));
    }
    Ok(format!(
        "{}: in place, in slices, every edge target's loss and gradient as the reference's",
        checked.join(", ")
    ))
}

/// The special values of docs/numerics.md through each way a row is read: the block entries
/// holding a whole row (4096 columns) or slices of one (f32 131076, bf16 262144 columns), and
/// the row kernel reading one element at a time (f32 1001 columns, rows not 16-byte aligned). Rows: `-inf`
/// vocabulary padding at the end; all `-inf`; a `+inf`; a NaN in the last column; the
/// target's logit `-inf`; only NaN and `-inf`; one value 100 above the rest, at the target.
fn special_values(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut checked = Vec::new();
    for (dtype, cols) in [
        (DType::F32, 4096),
        (DType::Bf16, 4096),
        (DType::F32, 131076),
        (DType::Bf16, 262144),
        (DType::F32, 1001),
    ] {
        match dtype {
            DType::Bf16 => special_rows::<bf16>(softmax, rng, cols)?,
            _ => special_rows::<f32>(softmax, rng, cols)?,
        }
        checked.push(format!("{dtype:?} 7×{cols}"));
    }
    Ok(format!(
        "{}: -inf padding, all -inf, +inf, NaN, a -inf target, NaN among -inf and a dominant \
         target, losses, log-sum-exps and gradients as the reference's",
        checked.join(", ")
    ))
}

fn special_rows<T: Element>(
    softmax: &mut Softmax,
    rng: &mut StdRng,
    cols: usize,
) -> Result<(), String> {
    let rows = 7;
    let s = shape(rows, cols);
    let mut values = common::random_matrix(rng, s, 6.0);
    let row = |r: usize| r * cols..(r + 1) * cols;
    for v in &mut values[row(0)][cols - cols / 8..] {
        *v = f32::NEG_INFINITY;
    }
    values[row(1)].fill(f32::NEG_INFINITY);
    values[cols * 2 + cols / 2] = f32::INFINITY;
    values[cols * 4 - 1] = f32::NAN;
    let minus_inf_target = cols / 3;
    values[cols * 4 + minus_inf_target] = f32::NEG_INFINITY;
    values[row(5)].fill(f32::NEG_INFINITY);
    values[cols * 5] = f32::NAN;
    values[cols * 6 + 9] = 106.0;
    let values = rounded::<T>(&values);
    let target_values = [3, 0, 1, 2, minus_inf_target as i64, 5, 9];
    let case = Case {
        reduction: Reduction::None,
        ..Case::PLAIN
    };
    let reference = cross_entropy_f64(&values, rows, cols, &target_values, &case.reference(&[]));
    let logits = upload::<T>(&values)?;
    let targets = DeviceBuffer::from_slice(&target_values).map_err(text)?;
    let mut losses = common::poisoned(rows)?;
    let mut lse = common::poisoned(rows)?;
    let mut gradient = upload::<T>(&vec![0.5; rows * cols])?;
    softmax
        .cross_entropy_backward(
            Rows::new(&logits, s).map_err(text)?,
            &targets,
            CrossEntropyOutputs::new().loss(&mut losses).lse(&mut lse),
            RowsMut::new(&mut gradient, s).map_err(text)?,
            Upstream::Value(1.0),
            &case.options(&DeviceBuffer::from_slice(&[1.0f32]).map_err(text)?),
            &Options::new(),
        )
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    let what = format!("{:?} {rows}×{cols}", T::DTYPE);
    check_losses(
        &what,
        &download(&losses)?,
        &reference.losses,
        loss_tolerance(T::DTYPE),
    )?;
    check_losses(
        &format!("{what} lse"),
        &download(&lse)?,
        &reference.lse,
        loss_tolerance(T::DTYPE),
    )?;
    let gradient = download(&gradient)?;
    // The padding's gradient is exactly 0, as a `-inf` entry's softmax is.
    if let Some(c) = (cols - cols / 8..cols).find(|&c| gradient[c] != 0.0) {
        return Err(format!(
            "{what}: padding column {c} has gradient {}",
            gradient[c]
        ));
    }
    check_gradient(
        &what,
        &gradient,
        &common::as_written::<T>(&reference.gradient),
        cols,
        gradient_tolerance(T::DTYPE),
        1.0,
    )?;
    Ok(())
}

fn strided_and_unaligned(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    // Rows of 1001 columns at a pitch of 1003 (no row starts on a 16-byte boundary after the
    // first), starting one element into the buffer.
    let (rows, cols, pitch) = (37, 1001, 1003);
    let s = shape(rows, cols);
    let dense = rounded::<bf16>(&common::random_matrix(rng, s, 6.0));
    let mut padded = vec![0.0f32; 1 + (rows - 1) * pitch + cols];
    for r in 0..rows {
        padded[1 + r * pitch..1 + r * pitch + cols]
            .copy_from_slice(&dense[r * cols..(r + 1) * cols]);
    }
    let target_values = targets(rng, rows, cols, Some(-100));
    let reference = cross_entropy_f64(
        &dense,
        rows,
        cols,
        &target_values,
        &Case::PLAIN.reference(&[]),
    );
    let logits = upload::<bf16>(&padded)?;
    let t = DeviceBuffer::from_slice(&target_values).map_err(text)?;
    let mut gradient = common::poisoned(rows * cols)?;
    let mut loss = common::poisoned(1)?;
    let view = logits.index(1..);
    softmax
        .cross_entropy_backward(
            Rows::strided(&view, s, pitch).map_err(text)?,
            &t,
            CrossEntropyOutputs::new().loss(&mut loss),
            RowsMut::new(&mut gradient, s).map_err(text)?,
            Upstream::Value(1.0),
            &CrossEntropyOptions::new(),
            &Options::new(),
        )
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    check_losses("strided", &download(&loss)?, &[reference.reduced], 1e-4)?;
    let worst = check_gradient(
        "strided",
        &download(&gradient)?,
        &reference.gradient,
        cols,
        1e-4,
        0.0,
    )?;
    Ok(format!(
        "bf16 rows at a pitch of {pitch}, one element off: f32 gradient within {worst:.1e}"
    ))
}

fn upstream_on_device(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let (rows, cols) = (12, 5000);
    let s = shape(rows, cols);
    let values = common::random_matrix(rng, s, 6.0);
    let target_values = targets(rng, rows, cols, Some(-100));
    let logits = upload::<f32>(&values)?;
    let t = DeviceBuffer::from_slice(&target_values).map_err(text)?;
    let per_row: Vec<f32> = (0..rows).map(|r| 0.25 + r as f32).collect();
    let upstream = DeviceBuffer::from_slice(&per_row).map_err(text)?;
    let mut gradient = common::poisoned(s.len())?;
    let mut losses = common::poisoned(rows)?;
    let none = CrossEntropyOptions::new().reduction(Reduction::None);
    softmax
        .cross_entropy_backward(
            Rows::new(&logits, s).map_err(text)?,
            &t,
            CrossEntropyOutputs::new().loss(&mut losses),
            RowsMut::new(&mut gradient, s).map_err(text)?,
            Upstream::Device(Values::new(&upstream)),
            &none,
            &Options::new(),
        )
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    let reference = cross_entropy_f64(
        &values,
        rows,
        cols,
        &target_values,
        &CrossEntropyReference {
            ignore_index: Some(-100),
            reduction: Reduction::None,
            ..CrossEntropyReference::default()
        },
    );
    let expected: Vec<f64> = reference
        .gradient
        .chunks(cols)
        .zip(&per_row)
        .flat_map(|(row, &g)| row.iter().map(move |v| v * f64::from(g)))
        .collect();
    check_gradient(
        "per-row upstream",
        &download(&gradient)?,
        &expected,
        cols,
        1e-4,
        0.0,
    )?;
    let scalar = DeviceBuffer::from_slice(&[3.0f32]).map_err(text)?;
    let mut mean = common::poisoned(1)?;
    softmax
        .cross_entropy_backward(
            Rows::new(&logits, s).map_err(text)?,
            &t,
            CrossEntropyOutputs::new().loss(&mut mean),
            RowsMut::new(&mut gradient, s).map_err(text)?,
            Upstream::Device(Values::new(&scalar)),
            &CrossEntropyOptions::new(),
            &Options::new(),
        )
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    let reference = cross_entropy_f64(
        &values,
        rows,
        cols,
        &target_values,
        &Case::PLAIN.reference(&[]),
    );
    let expected: Vec<f64> = reference.gradient.iter().map(|v| 3.0 * v).collect();
    check_gradient(
        "device scalar upstream",
        &download(&gradient)?,
        &expected,
        cols,
        1e-4,
        0.0,
    )?;
    Ok("per-row and scalar upstream gradients read on the device".into())
}

fn shards(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut checked = Vec::new();
    for &(rows, cols, count) in &[(16, 32000, 2), (8, 50257, 3), (4, 128256, 8)] {
        let s = shape(rows, cols);
        let values = rounded::<bf16>(&common::random_matrix(rng, s, 6.0));
        let weight_values: Vec<f32> = (0..cols).map(|_| rng.random_range(0.5..1.5)).collect();
        let target_values = targets(rng, rows, cols, Some(-100));
        // Every option (the shards read one element at a time), and the options the packed
        // passes take.
        let every = Case {
            smoothing: 0.1,
            z_loss: 1e-4,
            softcap: Some(20.0),
            weighted: true,
            ..Case::PLAIN
        };
        let packed = Case {
            softcap: None,
            weighted: false,
            ..every
        };
        for case in [every, packed] {
            let reference = cross_entropy_f64(
                &values,
                rows,
                cols,
                &target_values,
                &case.reference(&weight_values),
            );
            let weight = DeviceBuffer::from_slice(&weight_values).map_err(text)?;
            let t = DeviceBuffer::from_slice(&target_values).map_err(text)?;
            // Each shard's columns, in its own buffer.
            let bounds: Vec<(usize, usize)> = (0..count)
                .map(|k| (k * cols / count, (k + 1) * cols / count))
                .collect();
            let shard_buffers = bounds
                .iter()
                .map(|&(a, b)| {
                    let part: Vec<f32> = (0..rows)
                        .flat_map(|r| values[r * cols + a..r * cols + b].iter().copied())
                        .collect();
                    upload::<bf16>(&part)
                })
                .collect::<Result<Vec<_>, String>>()?;
            let states: DeviceBuffer<CrossEntropyState> =
                DeviceBuffer::from_slice(&vec![CrossEntropyState::default(); count * rows])
                    .map_err(text)?;
            for (k, (&(a, b), buffer)) in bounds.iter().zip(&shard_buffers).enumerate() {
                let ce = case.options(&weight).shard(a, cols);
                let mut run = states.index(k * rows..(k + 1) * rows);
                softmax
                    .cross_entropy_states(
                        Rows::new(buffer, shape(rows, b - a)).map_err(text)?,
                        &t,
                        &mut run,
                        &ce,
                        &Options::new(),
                    )
                    .map_err(text)?;
            }
            let mut gradient = vec![0.0f32; rows * cols];
            let mut first_loss = None;
            for (&(a, b), buffer) in bounds.iter().zip(&shard_buffers) {
                let ce = case.options(&weight).shard(a, cols).merged(&states);
                let mut part = upload::<bf16>(&vec![f32::NAN; rows * (b - a)])?;
                let mut loss = common::poisoned(1)?;
                softmax
                    .cross_entropy_backward(
                        Rows::new(buffer, shape(rows, b - a)).map_err(text)?,
                        &t,
                        CrossEntropyOutputs::new().loss(&mut loss),
                        RowsMut::new(&mut part, shape(rows, b - a)).map_err(text)?,
                        Upstream::Value(1.0),
                        &ce,
                        &Options::new(),
                    )
                    .map_err(text)?;
                softmax.synchronize().map_err(text)?;
                let part = download(&part)?;
                for r in 0..rows {
                    gradient[r * cols + a..r * cols + b]
                        .copy_from_slice(&part[r * (b - a)..(r + 1) * (b - a)]);
                }
                let loss = download(&loss)?[0];
                if first_loss.is_some_and(|l: f32| l.to_bits() != loss.to_bits()) {
                    return Err(format!("{count} shards: the shards' losses differ"));
                }
                first_loss = Some(loss);
            }
            let what = format!("{count} shards of {rows}×{cols}, {case:?}");
            check_losses(
                &what,
                &[first_loss.unwrap_or(f32::NAN)],
                &[reference.reduced],
                1e-4,
            )?;
            let expected = common::as_written::<bf16>(&reference.gradient);
            check_gradient(&what, &gradient, &expected, cols, 1.5e-2, 0.0)?;
        }
        checked.push(format!("{count} shards of {rows}×{cols}"));
    }
    Ok(format!(
        "{} (bf16, every option, then the packed passes' options): loss and gradient as the \
         whole vocabulary's",
        checked.join(", ")
    ))
}

/// A bad call: what it was, what it returned, and whether that is the error it should be.
type Refusal = (&'static str, softmax::Result<()>, fn(&Error) -> bool);

fn bad_input(softmax: &mut Softmax, _rng: &mut StdRng) -> Outcome {
    let s = shape(4, 100);
    let logits = upload::<f32>(&vec![0.0; s.len()])?;
    let t = DeviceBuffer::from_slice(&[0i32, 1, 2, 3]).map_err(text)?;
    let short = DeviceBuffer::from_slice(&[0i32, 1, 2]).map_err(text)?;
    let mut loss = common::poisoned(1)?;
    let mut rows_loss = common::poisoned(4)?;
    let weight = DeviceBuffer::from_slice(&[1.0f32; 99]).map_err(text)?;
    let call = |softmax: &mut Softmax,
                targets: &DeviceBuffer<i32>,
                loss: &mut DeviceBuffer<f32>,
                ce: &CrossEntropyOptions<'_>| {
        softmax.cross_entropy(
            Rows::new(&logits, s)?,
            targets,
            CrossEntropyOutputs::new().loss(loss),
            ce,
            &Options::new(),
        )
    };
    let cases: Vec<Refusal> = vec![
        (
            "targets of another length",
            call(softmax, &short, &mut loss, &CrossEntropyOptions::new()),
            |e| matches!(e, Error::PerRowLength { .. }),
        ),
        (
            "a per-row loss for a mean",
            call(softmax, &t, &mut rows_loss, &CrossEntropyOptions::new()),
            |e| matches!(e, Error::PerRowLength { .. }),
        ),
        (
            "label smoothing 1.5",
            call(
                softmax,
                &t,
                &mut loss,
                &CrossEntropyOptions::new().label_smoothing(1.5),
            ),
            |e| matches!(e, Error::CrossEntropyOption { .. }),
        ),
        (
            "a NaN z-loss",
            call(
                softmax,
                &t,
                &mut loss,
                &CrossEntropyOptions::new().z_loss(f32::NAN),
            ),
            |e| matches!(e, Error::CrossEntropyOption { .. }),
        ),
        (
            "a softcap of 0",
            call(
                softmax,
                &t,
                &mut loss,
                &CrossEntropyOptions::new().softcap(0.0),
            ),
            |e| matches!(e, Error::CrossEntropyOption { .. }),
        ),
        (
            "99 class weights for 100 classes",
            call(
                softmax,
                &t,
                &mut loss,
                &CrossEntropyOptions::new().weight(&weight),
            ),
            |e| matches!(e, Error::CrossEntropyOption { .. }),
        ),
        (
            "a shard's loss without the merged states",
            call(
                softmax,
                &t,
                &mut loss,
                &CrossEntropyOptions::new().shard(0, 120),
            ),
            |e| matches!(e, Error::CrossEntropyOption { .. }),
        ),
        (
            "a shard past its vocabulary",
            call(
                softmax,
                &t,
                &mut loss,
                &CrossEntropyOptions::new().shard(50, 120),
            ),
            |e| matches!(e, Error::CrossEntropyOption { .. }),
        ),
    ];
    let mut refused = 0;
    for (what, result, expected) in cases {
        match result {
            Err(ref error) if expected(error) => refused += 1,
            other => return Err(format!("{what}: {other:?}")),
        }
    }
    // The call's options other than the stream belong to softmax.
    let scaled = softmax.cross_entropy(
        Rows::new(&logits, s).map_err(text)?,
        &t,
        CrossEntropyOutputs::new().loss(&mut loss),
        &CrossEntropyOptions::new(),
        &Options::new().temperature(0.5),
    );
    if !matches!(scaled, Err(Error::CrossEntropyOption { .. })) {
        return Err(format!("a temperature in the call's options: {scaled:?}"));
    }
    // The gradient over the logits it reads, but not exactly them: an overlap.
    let mut both = upload::<f32>(&vec![0.0; s.len() + 1])?;
    let (head, tail) = {
        let view = both.index(..s.len());
        let address = view.as_device_ptr().as_raw();
        (address, address + 4)
    };
    // SAFETY: both views lie in `both`, which outlives the call; the call is refused before
    // any launch.
    let overlapping = unsafe {
        Rows::raw(head, DType::F32, s, 100).and_then(|x| {
            let y = RowsMut::raw(tail, DType::F32, s, 100)?;
            softmax.cross_entropy_backward(
                x,
                &t,
                CrossEntropyOutputs::new().loss(&mut loss),
                y,
                Upstream::Value(1.0),
                &CrossEntropyOptions::new(),
                &Options::new(),
            )
        })
    };
    if !matches!(overlapping, Err(Error::Overlap { .. })) {
        return Err(format!("an overlapping gradient: {overlapping:?}"));
    }
    let _ = &mut both;
    Ok(format!(
        "{} bad calls refused with typed errors before any launch",
        refused + 2
    ))
}

/// A reserved cross-entropy (the fused backward in place, the upstream gradient read on the
/// device) captured into a graph on a stream of the caller's, replayed: each replay matches a
/// direct call on the same logits, bit for bit.
fn captured(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    use cust::stream::{Stream, StreamFlags};
    use softmax::CallKind;
    // With label smoothing, the row kernel; without it on two wide rows, the block entries in
    // one cooperative launch, whose blocks exchange through the reserved workspace.
    for (rows, cols, smoothing) in [(64, 32000, 0.1), (2, 128256, 0.0)] {
        let s = shape(rows, cols);
        softmax
            .reserve(&[(CallKind::CrossEntropy { input: DType::Bf16 }, s)])
            .map_err(text)?;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).map_err(text)?;
        let target_values = targets(rng, rows, cols, Some(-100));
        let t = DeviceBuffer::from_slice(&target_values).map_err(text)?;
        let upstream = DeviceBuffer::from_slice(&[1.0f32]).map_err(text)?;
        let mut data = upload::<bf16>(&vec![0.0; rows * cols])?;
        let mut loss = common::poisoned(1)?;
        let ce = CrossEntropyOptions::new().label_smoothing(smoothing);
        common::begin_capture(&stream)?;
        let call = softmax.cross_entropy_backward_in_place(
            RowsMut::new(&mut data, s).map_err(text)?,
            &t,
            CrossEntropyOutputs::new().loss(&mut loss),
            Upstream::Device(Values::new(&upstream)),
            &ce,
            &Options::new().on(&stream),
        );
        let exec = common::end_capture(&stream);
        call.map_err(|e| format!("the reserved call during capture: {e}"))?;
        let exec = exec?;
        for replay in 0..3 {
            let values = rounded::<bf16>(&common::random_matrix(rng, s, 6.0));
            let fresh: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            data.copy_from(&fresh[..]).map_err(text)?;
            cust::context::CurrentContext::synchronize().map_err(text)?;
            // SAFETY: an executable graph of this context, launched on one of its streams.
            let status = unsafe { cust::sys::cuGraphLaunch(exec, stream.as_inner()) };
            if status != cust::sys::CUresult::CUDA_SUCCESS {
                return Err(format!("replay {replay}: {status:?}"));
            }
            stream.synchronize().map_err(text)?;
            let replayed = (download(&data)?, download(&loss)?);
            let mut direct = upload::<bf16>(&values)?;
            let mut direct_loss = common::poisoned(1)?;
            softmax
                .cross_entropy_backward_in_place(
                    RowsMut::new(&mut direct, s).map_err(text)?,
                    &t,
                    CrossEntropyOutputs::new().loss(&mut direct_loss),
                    Upstream::Value(1.0),
                    &ce,
                    &Options::new(),
                )
                .map_err(text)?;
            softmax.synchronize().map_err(text)?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            if bits(&replayed.0) != bits(&download(&direct)?)
                || bits(&replayed.1) != bits(&download(&direct_loss)?)
            {
                return Err(format!("replay {replay} differs from the direct call"));
            }
        }
        // SAFETY: the executable graph is not used again.
        unsafe { cust::sys::cuGraphExecDestroy(exec) };
    }
    Ok("reserved bf16 cross-entropy calls (the row kernel, the block entries) captured in graphs: three replays each, each bit for bit the direct call".into())
}
