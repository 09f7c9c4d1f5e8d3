//! The README's library examples as one program that runs: every call shown there, on small
//! shapes, each result checked (row sums, the f64 reference, or another path to the same
//! numbers). `cargo run -p host --release --example tour` on a machine with a GPU; without
//! one it stops at the first call with the typed error.

use softmax::cust::memory::{CopyDestination, DeviceBuffer};
use softmax::cust::stream::{Stream, StreamFlags};
use softmax::half::bf16;
use softmax::reference::softmax_f64;
use softmax::{
    Element, Mask, MaskedRows, Operation, Options, RowState, Rows, RowsMut, Shape, Softmax, Variant,
};

type Outcome = Result<(), Box<dyn std::error::Error>>;

/// Deterministic scores in about [-4, 4).
fn scores(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 8000) as f32 / 1000.0 - 4.0)
        .collect()
}

fn to_host<T: softmax::cust::memory::DeviceCopy + Default + Clone>(
    buffer: &DeviceBuffer<T>,
) -> Result<Vec<T>, Box<dyn std::error::Error>> {
    let mut host = vec![T::default(); buffer.len()];
    buffer.copy_to(&mut host[..])?;
    Ok(host)
}

/// A device buffer of `len` zeros.
fn zeros(len: usize) -> Result<DeviceBuffer<f32>, Box<dyn std::error::Error>> {
    Ok(DeviceBuffer::from_slice(&vec![0.0f32; len])?)
}

/// `op` of contiguous rows of any input type with `options`, into a new f32 buffer.
fn forward_to_f32<I: Element>(
    softmax: &mut Softmax,
    op: Operation,
    input: &DeviceBuffer<I>,
    shape: Shape,
    options: &Options,
) -> Result<DeviceBuffer<f32>, Box<dyn std::error::Error>> {
    let mut output = zeros(shape.len())?;
    softmax.forward(
        op,
        Rows::new(input, shape)?,
        RowsMut::new(&mut output, shape)?,
        options,
    )?;
    Ok(output)
}

/// Whether the first `cols` values of every row (rows `stride` apart) sum to `total` within
/// `tolerance`.
fn rows_sum_to(total: f32, values: &[f32], cols: usize, stride: usize, tolerance: f32) -> bool {
    values
        .chunks(stride)
        .all(|row| (row[..cols].iter().sum::<f32>() - total).abs() <= tolerance)
}

fn check(what: &str, ok: bool) -> Outcome {
    println!("{what}: {}", if ok { "ok" } else { "WRONG" });
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: result out of tolerance").into())
    }
}

fn main() -> Outcome {
    let mut softmax = Softmax::new()?; // first GPU; Error::NoDevice without one

    // f32 softmax, the automatic variant, against the f64 reference.
    let shape = Shape::new(4096, 1000)?;
    let x = scores(shape.len(), 1);
    let input = DeviceBuffer::from_slice(&x)?;
    let mut output = zeros(shape.len())?;
    softmax.run(Variant::Auto, &input, &mut output, shape)?;
    softmax.synchronize()?;
    let expected = softmax_f64(&x, shape.rows(), shape.cols());
    let worst = to_host(&output)?
        .iter()
        .zip(&expected)
        .map(|(&y, &e)| (f64::from(y) - e).abs())
        .fold(0.0, f64::max);
    check(
        "f32 softmax 4096x1000 matches the f64 reference",
        worst < 1e-6,
    )?;
    let y = softmax.run_host(Variant::Auto, &[1.0, 2.0, 3.0], Shape::new(1, 3)?)?;
    check(
        "softmax of [1, 2, 3] from host slices",
        (y[2] - 0.665_240_9).abs() < 1e-6,
    )?;

    // bf16 logits in, f32 probabilities out, at temperature 0.7.
    let shape = Shape::new(8, 128_256)?;
    let logits: Vec<bf16> = scores(shape.len(), 2)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let logits = DeviceBuffer::from_slice(&logits)?;
    let options = Options::new().temperature(0.7);
    let probs = forward_to_f32(&mut softmax, Operation::Softmax, &logits, shape, &options)?;
    softmax.synchronize()?;
    let probs_host = to_host(&probs)?;
    check(
        "bf16 -> f32 softmax rows sum to 1",
        rows_sum_to(1.0, &probs_host, shape.cols(), shape.cols(), 1e-3),
    )?;

    // Per-row log-sum-exp of the same logits agrees with the probabilities: p = e^(x/t - lse).
    let mut lse = zeros(shape.rows())?;
    softmax.log_sum_exp(Rows::new(&logits, shape)?, &mut lse, &options)?;
    softmax.synchronize()?;
    let first_logit = to_host(&logits)?[0].to_f32();
    let lse_host = to_host(&lse)?;
    let predicted = (first_logit / 0.7 - lse_host[0]).exp();
    check(
        "log-sum-exp agrees with softmax",
        (predicted - probs_host[0]).abs() <= 1e-3 * probs_host[0].max(1e-6),
    )?;

    // Log-softmax of a strided view (1000 columns in rows 4096 apart), in place.
    let (rows, cols, pitch) = (16, 1000, 4096);
    let shape = Shape::new(rows, cols)?;
    let mut scores_buffer = DeviceBuffer::from_slice(&scores(rows * pitch, 3))?;
    softmax.forward_in_place(
        Operation::LogSoftmax,
        RowsMut::strided(&mut scores_buffer, shape, pitch)?,
        &Options::new(),
    )?;
    softmax.synchronize()?;
    let exp_rows: Vec<f32> = to_host(&scores_buffer)?.iter().map(|v| v.exp()).collect();
    check(
        "strided in-place log-softmax: e^y sums to 1",
        rows_sum_to(1.0, &exp_rows, cols, pitch, 1e-4),
    )?;

    // Attention scores: scale, one additive mask row for every row, zeros for fully masked rows.
    let shape = Shape::new(64, 256)?;
    let s = DeviceBuffer::from_slice(&scores(shape.len(), 4))?;
    let mask_row: Vec<f32> = (0..shape.cols())
        .map(|c| if c % 3 == 0 { f32::NEG_INFINITY } else { 0.0 })
        .collect();
    let mask_row = DeviceBuffer::from_slice(&mask_row)?;
    let opts = Options::new()
        .scale(0.125)
        .mask(Mask::additive(&mask_row))
        .masked_rows(MaskedRows::Zero);
    let p = forward_to_f32(&mut softmax, Operation::Softmax, &s, shape, &opts)?;
    softmax.synchronize()?;
    let p_host = to_host(&p)?;
    let masked_are_zero = p_host
        .iter()
        .enumerate()
        .all(|(i, &v)| i % shape.cols() % 3 != 0 || v == 0.0);
    check(
        "masked softmax: masked columns 0, rows sum to 1",
        masked_are_zero && rows_sum_to(1.0, &p_host, shape.cols(), shape.cols(), 1e-4),
    )?;

    // Causal square blocks (4 heads x 64 queries, 64 keys), a boolean mask, per-row scales.
    let shape = Shape::new(4 * 64, 64)?;
    let keep = DeviceBuffer::from_slice(&vec![1u8; 64 * 64])?;
    let inverse_temperatures = DeviceBuffer::from_slice(&vec![0.5f32; shape.rows()])?;
    let s = DeviceBuffer::from_slice(&scores(shape.len(), 5))?;
    let opts = Options::new()
        .causal()
        .mask(Mask::allowed(&keep))
        .row_scale(&inverse_temperatures);
    let p = forward_to_f32(&mut softmax, Operation::Softmax, &s, shape, &opts)?;
    softmax.synchronize()?;
    let p_host = to_host(&p)?;
    let causal = p_host.iter().enumerate().all(|(i, &v)| {
        let (row, col) = (i / 64, i % 64);
        col <= row % 64 || v == 0.0
    });
    check(
        "causal softmax: nothing above the diagonal",
        causal && rows_sum_to(1.0, &p_host, 64, 64, 1e-4),
    )?;

    // Backward of softmax: every row of dx sums to 0; in place over dy for log-softmax.
    let shape = Shape::new(32, 1000)?;
    let x = DeviceBuffer::from_slice(&scores(shape.len(), 6))?;
    let y = forward_to_f32(&mut softmax, Operation::Softmax, &x, shape, &Options::new())?;
    let dy = DeviceBuffer::from_slice(&scores(shape.len(), 7))?;
    let mut dx = zeros(shape.len())?;
    softmax.backward(
        Operation::Softmax,
        Rows::new(&y, shape)?,
        Rows::new(&dy, shape)?,
        RowsMut::new(&mut dx, shape)?,
        &Options::new(),
    )?;
    softmax.synchronize()?;
    let dx_host = to_host(&dx)?;
    check(
        "softmax backward: rows of dx sum to 0",
        rows_sum_to(0.0, &dx_host, shape.cols(), shape.cols(), 1e-4),
    )?;
    let log_y = forward_to_f32(
        &mut softmax,
        Operation::LogSoftmax,
        &x,
        shape,
        &Options::new(),
    )?;
    let mut grad = DeviceBuffer::from_slice(&vec![1.0f32; shape.len()])?;
    softmax.backward_in_place(
        Operation::LogSoftmax,
        Rows::new(&log_y, shape)?,
        RowsMut::new(&mut grad, shape)?,
        &Options::new(),
    )?;
    softmax.synchronize()?;
    // dy = 1 everywhere: dx = 1 - cols * e^y, which sums to 0 over a row.
    let grad_host = to_host(&grad)?;
    check(
        "log-softmax backward in place: rows of dx sum to 0",
        rows_sum_to(0.0, &grad_host, shape.cols(), shape.cols(), 1e-2),
    )?;

    // Partial states: a vocabulary split into two column slices, merged, then one slice
    // normalized as if the whole row had been seen.
    let (rows, cols, split) = (4, 50_000, 30_000);
    let whole = Shape::new(rows, cols)?;
    let logits = DeviceBuffer::from_slice(&scores(whole.len(), 8))?;
    let states = DeviceBuffer::from_slice(&vec![RowState::default(); 2 * rows])?;
    for (slot, (first, width)) in [(0, split), (split, cols - split)].into_iter().enumerate() {
        let columns = logits.index(first..);
        let view = Rows::strided(&columns, Shape::new(rows, width)?, cols)?;
        softmax.row_states(
            view,
            &mut states.index(slot * rows..(slot + 1) * rows),
            &Options::new(),
        )?;
    }
    let first_slice = Shape::new(rows, split)?;
    let mut out = zeros(rows * split)?;
    softmax.normalize_with_states(
        Operation::Softmax,
        Rows::strided(&logits, first_slice, cols)?,
        &states,
        RowsMut::new(&mut out, first_slice)?,
        &Options::new(),
    )?;
    let direct = forward_to_f32(
        &mut softmax,
        Operation::Softmax,
        &logits,
        whole,
        &Options::new(),
    )?;
    softmax.synchronize()?;
    let (out, direct) = (to_host(&out)?, to_host(&direct)?);
    let same = (0..rows).all(|r| {
        (0..split).all(|c| {
            (out[r * split + c] - direct[r * cols + c]).abs() <= 1e-6 + 1e-4 * direct[r * cols + c]
        })
    });
    check(
        "slice normalized with merged states = whole-row softmax",
        same,
    )?;
    let host_states = to_host(&states)?;
    let merged = softmax::merge_row_states(host_states[0], host_states[rows]);
    check(
        "host merge of row 0's two states is finite",
        merged.max.is_finite() && merged.sum > 1.0,
    )?;

    // A call on a stream of the caller's returns while its kernels still read and write the
    // buffers: synchronize that stream (or order later work after it with an event) before
    // reading the output, writing the input or freeing either. cust's copies run on the legacy
    // default stream, which a non-blocking stream is not ordered with.
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let shape = Shape::new(16, 262_144)?;
    let x = scores(shape.len(), 5);
    let input = DeviceBuffer::from_slice(&x)?;
    let mut output = zeros(shape.len())?;
    softmax.synchronize()?; // the pageable upload above has landed
    softmax.forward(
        Operation::Softmax,
        Rows::new(&input, shape)?,
        RowsMut::new(&mut output, shape)?,
        &Options::new().on(&stream),
    )?;
    stream.synchronize()?; // before the output is read and the buffers dropped
    let output = to_host(&output)?;
    check(
        "a call on the caller's stream, read after the stream is synchronized",
        rows_sum_to(1.0, &output, shape.cols(), shape.cols(), 1e-3),
    )?;
    Ok(())
}
