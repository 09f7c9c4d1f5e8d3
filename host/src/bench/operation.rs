//! `bench --op log-softmax|backward` and `--dtype bf16|f16`: `auto` through the operation API
//! ([`Softmax::forward`], [`Softmax::backward`]) beside a device-to-device copy of the input
//! tensor, on buffers of the benchmark's element type, checked against an f64 reference
//! before it is timed.
//!
//! The references for log-softmax and the softmax gradient are private here: the library's
//! `reference` module has only `softmax_f64`.

use cust::memory::{AsyncCopyDestination, CopyDestination, DeviceBuffer, DeviceSlice};
use indicatif::{ProgressBar, ProgressStyle};
use kernels_gpu::launch::ops::Direction;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::timing::{self, Launcher, WORKING_SET_OVER_L2};
use super::{
    BenchConfig, BenchOp, Measurement, Outcome, reference_measurements, timed_outcome,
    traffic_bytes,
};
use crate::error::{CudaContext, Error, Result};
use crate::{DType, Element, Operation, Options, Rows, RowsMut};

use crate::Softmax;
use crate::reference::softmax_f64;
use crate::shape::Shape;

/// The element types benchmarked: those of the API, which are plain bits (so that the output
/// can be poisoned with a memset).
pub(super) trait Bench: Element + bytemuck::Pod {}

impl<T: Element + bytemuck::Pod> Bench for T {}

/// Bytes between the starts of consecutive slots' tensors (every start 256-byte aligned).
const SLOT_ALIGN_BYTES: usize = 256;

/// The check's tolerance for results of type `dtype`: per element `|a − e| ≤ tol · (|e| +
/// max |e| of the row)` and relative L2 error of each row ≤ tol (both plus the type's
/// smallest step near zero), against the reference rounded to `dtype`.
pub(super) fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::Bf16 => 2e-2,
        DType::F16 => 2e-3,
    }
}

/// The smallest magnitude `dtype` resolves near zero in the kernels' results: f32 and bf16
/// results below the smallest normal f32 are flushed to zero; f16 keeps its subnormals,
/// `2^-24` apart.
fn floor(dtype: DType) -> f64 {
    match dtype {
        DType::F32 | DType::Bf16 => f64::from(f32::MIN_POSITIVE),
        DType::F16 => 2f64.powi(-24),
    }
}

/// What the timing loop launches here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpContender {
    /// A device-to-device copy of the input tensor (read + write of one tensor).
    Copy,
    /// `auto` through the operation API.
    Ours,
}

/// Input (x forward, y backward), gradient (dy, backward only) and output tensors for one
/// shape, `slots` of each so that the working set is at least 4× the L2 cache.
struct OpPools<T: Bench> {
    op: BenchOp,
    shape: Shape,
    input: DeviceBuffer<T>,
    grad: Option<DeviceBuffer<T>>,
    output: DeviceBuffer<T>,
    host_input: Vec<T>,
    host_grad: Vec<T>,
    slots: usize,
    stride: usize,
}

impl<T: Bench> OpPools<T> {
    fn new(op: BenchOp, shape: Shape, l2_bytes: usize, rng: &mut SmallRng) -> Result<Self> {
        let bytes = size_of::<T>();
        let stride = shape.len().next_multiple_of(SLOT_ALIGN_BYTES / bytes);
        let set_bytes = op.tensors() as usize * stride * bytes;
        let slots = (WORKING_SET_OVER_L2 * l2_bytes).div_ceil(set_bytes).max(1);
        let (input, grad) = match op {
            BenchOp::Softmax | BenchOp::LogSoftmax => {
                (uniform::<T>(rng, stride * slots, 8.0), None)
            }
            BenchOp::Backward => {
                let y = softmax_outputs::<T>(rng, shape, stride, slots);
                (y, Some(uniform::<T>(rng, stride * slots, 1.0)))
            }
        };
        let host_input = input[..shape.len()].to_vec();
        let host_grad = grad
            .as_ref()
            .map_or_else(Vec::new, |g| g[..shape.len()].to_vec());
        let input = DeviceBuffer::from_slice(&input).during("allocating benchmark inputs")?;
        let grad = match grad {
            Some(values) => {
                Some(DeviceBuffer::from_slice(&values).during("allocating benchmark gradients")?)
            }
            None => None,
        };
        // SAFETY: f32, bf16 and f16 accept any bits; every output slot is written before it
        // is read (verification poisons slot 0 first).
        let output = unsafe { DeviceBuffer::uninitialized(stride * slots) }
            .during("allocating benchmark outputs")?;
        Ok(OpPools {
            op,
            shape,
            input,
            grad,
            output,
            host_input,
            host_grad,
            slots,
            stride,
        })
    }

    /// Input, gradient (the input again when there is none) and output of slot `index`.
    fn slot(&self, index: usize) -> (DeviceSlice<T>, DeviceSlice<T>, DeviceSlice<T>) {
        let start = (index % self.slots) * self.stride;
        let range = start..start + self.shape.len();
        let input = self.input.index(range.clone());
        let grad = self.grad.as_ref().map_or(input, |g| g.index(range.clone()));
        (input, grad, self.output.index(range))
    }

    /// One call of the operation through the public API, on the given slices.
    fn call(
        &self,
        softmax: &mut Softmax,
        input: &DeviceSlice<T>,
        grad: &DeviceSlice<T>,
        output: &mut DeviceSlice<T>,
    ) -> Result<()> {
        let shape = self.shape;
        let options = Options::new();
        match self.op {
            BenchOp::Softmax | BenchOp::LogSoftmax => softmax.forward(
                forward_operation(self.op),
                Rows::new(input, shape)?,
                RowsMut::new(output, shape)?,
                &options,
            ),
            BenchOp::Backward => softmax.backward(
                Operation::Softmax,
                Rows::new(input, shape)?,
                Rows::new(grad, shape)?,
                RowsMut::new(output, shape)?,
                &options,
            ),
        }
    }

    /// Runs the operation once on slot 0 into an output poisoned with NaN, and compares
    /// sampled rows with the f64 reference computed from the same (rounded) inputs.
    fn verify(
        &self,
        softmax: &mut Softmax,
        rng: &mut SmallRng,
    ) -> std::result::Result<(), Outcome> {
        let shape = self.shape;
        let (input, grad, mut output) = self.slot(0);
        let failed = |e: Error| Outcome::Failed(e.to_string());
        poison(&mut output).map_err(failed)?;
        timing::launched(self.call(softmax, &input, &grad, &mut output))?;
        softmax.synchronize().map_err(failed)?;
        for row in timing::verified_rows(shape, rng) {
            let range = row * shape.cols()..(row + 1) * shape.cols();
            let mut actual = vec![T::from_f32(0.0); shape.cols()];
            output
                .index(range.clone())
                .copy_to(&mut actual[..])
                .during("reading a result row")
                .map_err(failed)?;
            let input = to_f32(&self.host_input[range.clone()]);
            let expected = match self.op {
                BenchOp::Softmax => softmax_f64(&input, 1, shape.cols()),
                BenchOp::LogSoftmax => log_softmax_row_f64(&input),
                BenchOp::Backward => {
                    softmax_backward_row_f64(&input, &to_f32(&self.host_grad[range]))
                }
            };
            check_row(&actual, &expected, tolerance(T::DTYPE))
                .map_err(|why| Outcome::Failed(format!("row {row}: {why}")))?;
        }
        Ok(())
    }
}

impl<T: Bench> Launcher for OpPools<T> {
    type Contender = OpContender;

    fn launch(&mut self, softmax: &mut Softmax, contender: OpContender, slot: usize) -> Result<()> {
        let (input, grad, mut output) = self.slot(slot);
        match contender {
            // SAFETY: both slices are live device memory of equal length, in disjoint pools.
            OpContender::Copy => unsafe { output.async_copy_from(&input, softmax.stream()) }
                .during("copying device to device"),
            OpContender::Ours => self.call(softmax, &input, &grad, &mut output),
        }
    }
}

fn forward_operation(op: BenchOp) -> Operation {
    match op {
        BenchOp::LogSoftmax => Operation::LogSoftmax,
        BenchOp::Softmax | BenchOp::Backward => Operation::Softmax,
    }
}

/// The kernel `auto` launches for `op` on the pools' first slot.
fn planned_kernel<T: Bench>(
    softmax: &mut Softmax,
    op: BenchOp,
    pools: &OpPools<T>,
) -> Result<String> {
    let (input, grad, output) = pools.slot(0);
    let (direction, buffers) = match op {
        BenchOp::Softmax | BenchOp::LogSoftmax => (Direction::Forward, vec![&input, &output]),
        BenchOp::Backward => (Direction::Backward, vec![&input, &grad, &output]),
    };
    softmax.op_plan_label(forward_operation(op), direction, pools.shape, &buffers)
}

/// How the report names the call `auto` makes (in the kernels column).
fn api_call(op: BenchOp, dtype: DType) -> String {
    let t = dtype.name();
    match op {
        BenchOp::Softmax => format!("Softmax::forward::<{t}, {t}>(Operation::Softmax)"),
        BenchOp::LogSoftmax => format!("Softmax::forward::<{t}, {t}>(Operation::LogSoftmax)"),
        BenchOp::Backward => format!("Softmax::backward::<{t}, {t}>(Operation::Softmax)"),
    }
}

/// Fills `output` with NaN of its type, so that an element never written fails the check.
fn poison<T: Bench>(output: &mut DeviceSlice<T>) -> Result<()> {
    match T::DTYPE {
        DType::F32 => output.set_32(f32::NAN.to_bits()),
        DType::Bf16 => output.set_16(half::bf16::NAN.to_bits()),
        DType::F16 => output.set_16(half::f16::NAN.to_bits()),
    }
    .during("poisoning the output")
}

/// `len` values uniform in `[-bound, bound]`, rounded to `T`.
fn uniform<T: Element>(rng: &mut SmallRng, len: usize, bound: f32) -> Vec<T> {
    (0..len)
        .map(|_| T::from_f32(rng.random_range(-bound..bound)))
        .collect()
}

/// `slots` tensors of real softmax outputs (of logits uniform in [-8, 8]), rounded to `T`,
/// `stride` elements apart (the gap between tensors is zero).
fn softmax_outputs<T: Element>(
    rng: &mut SmallRng,
    shape: Shape,
    stride: usize,
    slots: usize,
) -> Vec<T> {
    let mut values = Vec::with_capacity(stride * slots);
    let mut row = vec![0.0f32; shape.cols()];
    for _ in 0..slots {
        for _ in 0..shape.rows() {
            row.iter_mut()
                .for_each(|x| *x = rng.random_range(-8.0..8.0));
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter_mut().for_each(|x| *x = (*x - max).exp());
            let sum: f64 = row.iter().map(|&e| f64::from(e)).sum();
            let inverse = (1.0 / sum) as f32;
            values.extend(row.iter().map(|&e| T::from_f32(e * inverse)));
        }
        values.resize(values.len() + stride - shape.len(), T::from_f32(0.0));
    }
    values
}

fn to_f32<T: Element>(values: &[T]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}

/// Log-softmax of one row in f64: `x − max − ln Σ e^(x − max)`.
fn log_softmax_row_f64(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .map(|&x| f64::from(x))
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    let log_sum = sum.ln();
    row.iter().map(|&x| f64::from(x) - max - log_sum).collect()
}

/// The softmax gradient of one row in f64: `dx = y ⊙ (dy − Σ dy⊙y)`.
fn softmax_backward_row_f64(y: &[f32], dy: &[f32]) -> Vec<f64> {
    let dot: f64 = y
        .iter()
        .zip(dy)
        .map(|(&y, &dy)| f64::from(y) * f64::from(dy))
        .sum();
    y.iter()
        .zip(dy)
        .map(|(&y, &dy)| f64::from(y) * (f64::from(dy) - dot))
        .collect()
}

/// Compares one result row with the f64 reference rounded to `T` (the best `T` can hold):
/// NaN where and only where the reference has one; every element within
/// `tol · (|e| + max |e|) + floor(T)`; relative L2 error of the row within `tol` (plus the
/// same floor per element).
fn check_row<T: Element>(
    actual: &[T],
    expected: &[f64],
    tolerance: f64,
) -> std::result::Result<(), String> {
    let rounded: Vec<f64> = expected
        .iter()
        .map(|&e| f64::from(T::from_f32(e as f32).to_f32()))
        .collect();
    let scale = rounded
        .iter()
        .filter(|e| e.is_finite())
        .fold(0.0, |m: f64, e| m.max(e.abs()));
    let (mut diff, mut norm) = (0.0, 0.0);
    for (column, (a, &e)) in actual.iter().zip(&rounded).enumerate() {
        let a = f64::from(a.to_f32());
        if a.is_nan() || e.is_nan() || !e.is_finite() {
            if a.is_nan() != e.is_nan() || (!e.is_nan() && a != e) {
                return Err(format!("column {column}: {a} where the reference is {e}"));
            }
            continue;
        }
        let bound = tolerance * (e.abs() + scale) + floor(T::DTYPE);
        if (a - e).abs() > bound {
            return Err(format!(
                "column {column}: {a} where the reference is {e} (allowed ±{bound:.2e})"
            ));
        }
        diff += (a - e) * (a - e);
        norm += e * e;
    }
    // Relative L2 error, with the same floor per element as above (f16 subnormals).
    let allowed = tolerance * norm.sqrt() + floor(T::DTYPE) * (actual.len() as f64).sqrt();
    if diff.sqrt() > allowed {
        let relative_l2 = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
        return Err(format!(
            "relative L2 error {relative_l2:.2e} above {tolerance:.0e}"
        ));
    }
    Ok(())
}

/// Runs `auto` through the operation API and the copy on every shape, then the peers, and
/// writes the report.
pub(super) fn run<T: Bench>(config: &BenchConfig) -> Result<super::Report> {
    let mut softmax = Softmax::on_device(config.device)?;
    let device = softmax.device().clone();
    let (op, dtype) = (config.op, T::DTYPE);
    let progress = ProgressBar::new(config.shapes.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("valid template"),
    );
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let mut timer = timing::Timer::default();
    let mut measurements = Vec::new();
    for &shape in &config.shapes {
        let mut pools = OpPools::<T>::new(op, shape, device.l2_bytes as usize, &mut rng)?;
        progress.set_message(format!("{shape} {op} {}: checking auto", dtype.name()));
        let verdict = pools.verify(&mut softmax, &mut rng);
        let contenders: &[OpContender] = if verdict.is_ok() {
            &[OpContender::Copy, OpContender::Ours]
        } else {
            &[OpContender::Copy]
        };
        // The plan is only a label here: not having one does not stop the run.
        let plan =
            planned_kernel(&mut softmax, op, &pools).unwrap_or_else(|e| format!("(no plan: {e})"));
        let kernels = format!("{}: {plan}", api_call(op, dtype));
        let copy_bytes = traffic_bytes(BenchOp::Softmax, dtype, shape);
        let op_bytes = traffic_bytes(op, dtype, shape);
        for &timing in config.timing.timings() {
            progress.set_message(format!("{shape} {op} {}: timing, {timing}", dtype.name()));
            let medians = timer.measure(timing, &mut pools, &mut softmax, contenders, config)?;
            let (copy_gbps, references) =
                reference_measurements(shape, dtype, timing, &medians, copy_bytes, op_bytes);
            measurements.extend(references);
            let outcome = match &verdict {
                Ok(()) => timed_outcome(op_bytes, medians.contenders[1], copy_gbps),
                Err(outcome) => outcome.clone(),
            };
            measurements.push(Measurement::of(
                "auto",
                dtype,
                shape,
                vec![kernels.clone()],
                outcome,
                timing,
            ));
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    super::finish(config, &softmax, measurements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_of_log_softmax_and_backward() {
        let row = [1.0f32, 2.0, 3.0];
        let softmax = softmax_f64(&row, 1, 3);
        let log = log_softmax_row_f64(&row);
        for (l, s) in log.iter().zip(&softmax) {
            assert!((l.exp() - s).abs() < 1e-15);
        }
        let y: Vec<f32> = softmax.iter().map(|&p| p as f32).collect();
        let dy = [0.5f32, -1.0, 0.25];
        let dx = softmax_backward_row_f64(&y, &dy);
        // The gradient of softmax sums to zero when y sums to one.
        assert!(dx.iter().sum::<f64>().abs() < 1e-7);
        // dy constant along the row gives no gradient.
        assert!(
            softmax_backward_row_f64(&y, &[2.0; 3])
                .iter()
                .all(|d| d.abs() < 1e-7)
        );
    }

    #[test]
    fn the_check_allows_rounding_and_refuses_errors() {
        let expected = [0.1, 0.2, 0.3, 0.4];
        let bf16: Vec<half::bf16> = expected.iter().map(|&e| half::bf16::from_f64(e)).collect();
        assert!(check_row(&bf16, &expected, tolerance(DType::Bf16)).is_ok());
        let mut wrong = bf16.clone();
        wrong[2] = half::bf16::from_f32(0.35);
        assert!(check_row(&wrong, &expected, tolerance(DType::Bf16)).is_err());
        let mut nan = bf16;
        nan[0] = half::bf16::NAN;
        assert!(check_row(&nan, &expected, tolerance(DType::Bf16)).is_err());
        // f16 subnormals: one step off at 1e-6 is within the floor.
        let tiny = [1e-6, 2e-6];
        let f16: Vec<half::f16> = tiny
            .iter()
            .map(|&e| half::f16::from_f64(e + 2f64.powi(-24)))
            .collect();
        assert!(check_row(&f16, &tiny, tolerance(DType::F16)).is_ok());
        let f32s = [0.1f32 * (1.0 + 1e-4), 0.2, 0.3, 0.4];
        assert!(check_row(&f32s, &expected, tolerance(DType::F32)).is_err());
    }

    #[test]
    fn backward_inputs_are_softmax_rows() {
        let mut rng = SmallRng::seed_from_u64(1);
        let shape = Shape::new(3, 5).unwrap();
        let y = softmax_outputs::<half::bf16>(&mut rng, shape, 16, 2);
        assert_eq!(y.len(), 32);
        for slot in 0..2 {
            for row in y[slot * 16..slot * 16 + 15].chunks(5) {
                let sum: f32 = row.iter().map(|v| v.to_f32()).sum();
                assert!((sum - 1.0).abs() < 2e-2, "{sum}");
            }
            assert_eq!(y[slot * 16 + 15].to_f32(), 0.0);
        }
    }
}
