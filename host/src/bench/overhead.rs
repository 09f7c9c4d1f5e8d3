//! Host overhead: the CPU time one call takes to check its arguments, find its cached plan and
//! enqueue its launches, for the calls a model makes most.
//!
//! Calls are issued in batches small enough that the driver's launch queue never fills (a
//! full queue would make the loop wait for the GPU and count kernel time as host time); the
//! stream is drained between batches, outside the timed part. The shape is tiny, so the GPU
//! keeps up. The figure is the median over batches of a batch's wall time per call.

use std::time::Instant;

use super::coldstart::upload;
use super::timing::median;

use crate::Softmax;
use crate::error::{CudaContext, Result};
use crate::shape::Shape;
use crate::variant::Variant;
use crate::{Operation, Options, Rows, RowsMut};

/// Calls per timed batch: well under the driver's queue of pending launches.
const BATCH: usize = 200;
/// Timed batches per call kind (the median is reported).
const BATCHES: usize = 50;
/// Calls before timing: plans made, modules loaded, workspace sized.
const WARMUP: usize = 1000;

/// The median CPU time per call, in microseconds, of each call kind: f32 `run(Auto)`, bf16
/// `forward` (softmax), and f32 log-softmax `forward` at a temperature with a per-row scale,
/// all on a tiny shape (rows in registers, no workspace); then f32 `run(Auto)` on one row cut
/// into slices, whose blocks exchange through the workspace, on the instance's stream and on
/// a stream of the caller's.
pub fn measure(ordinal: u32) -> Result<Vec<(&'static str, f64)>> {
    let mut softmax = Softmax::on_device(ordinal)?;
    let shape = Shape::new(4, 256)?;
    let input = upload(&vec![0.25f32; shape.len()])?;
    let mut output = upload(&vec![0.0f32; shape.len()])?;
    let input16 = upload(&vec![half::bf16::from_f32(0.25); shape.len()])?;
    let mut output16 = upload(&vec![half::bf16::ZERO; shape.len()])?;
    let row_scale = upload(&vec![0.5f32; shape.rows()])?;
    let mut results = Vec::new();

    let run = per_call(&mut softmax, |s| {
        s.run(Variant::Auto, &input, &mut output, shape)
    })?;
    results.push(("f32 run(Auto)", run));

    let bf16 = per_call(&mut softmax, |s| {
        s.forward(
            Operation::Softmax,
            Rows::new(&input16, shape)?,
            RowsMut::new(&mut output16, shape)?,
            &Options::new(),
        )
    })?;
    results.push(("bf16 forward (softmax)", bf16));

    let options = Options::new().temperature(0.7).row_scale(&row_scale);
    let operation = per_call(&mut softmax, |s| {
        s.forward(
            Operation::LogSoftmax,
            Rows::new(&input, shape)?,
            RowsMut::new(&mut output, shape)?,
            &options,
        )
    })?;
    results.push((
        "f32 forward (log-softmax, temperature, row scale)",
        operation,
    ));

    let sliced = Shape::new(1, 128_256)?;
    let wide_input = upload(&vec![0.25f32; sliced.len()])?;
    let mut wide_output = upload(&vec![0.0f32; sliced.len()])?;
    let run = per_call(&mut softmax, |s| {
        s.run(Variant::Auto, &wide_input, &mut wide_output, sliced)
    })?;
    results.push(("f32 run(Auto), one sliced row (workspace)", run));
    let stream = cust::stream::Stream::new(cust::stream::StreamFlags::NON_BLOCKING, None)
        .during("creating a stream")?;
    let on_stream = per_call_on(&mut softmax, Some(&stream), |s| {
        let options = Options::new().on(&stream);
        let input = Rows::new(&wide_input, sliced)?;
        let output = RowsMut::new(&mut wide_output, sliced)?;
        s.forward(Operation::Softmax, input, output, &options)
    })?;
    results.push((
        "f32 run(Auto), one sliced row (workspace), caller's stream",
        on_stream,
    ));
    Ok(results)
}

/// Median microseconds per call of `call` over [`BATCHES`] batches of [`BATCH`] calls.
fn per_call(softmax: &mut Softmax, call: impl FnMut(&mut Softmax) -> Result<()>) -> Result<f64> {
    per_call_on(softmax, None, call)
}

/// [`per_call`] for calls issued on `stream` (else the instance's), which is drained between
/// batches too.
fn per_call_on(
    softmax: &mut Softmax,
    stream: Option<&cust::stream::Stream>,
    mut call: impl FnMut(&mut Softmax) -> Result<()>,
) -> Result<f64> {
    let drain = |softmax: &Softmax| {
        softmax.synchronize()?;
        stream.map_or(Ok(()), |s| s.synchronize().during("waiting for the stream"))
    };
    for _ in 0..WARMUP {
        call(softmax)?;
    }
    drain(softmax)?;
    let mut batches = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let started = Instant::now();
        for _ in 0..BATCH {
            call(softmax)?;
        }
        batches.push(started.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
        drain(softmax)?;
    }
    Ok(median(batches))
}
