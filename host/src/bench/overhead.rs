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

use crate::error::Result;
use crate::shape::Shape;
use crate::softmax::Softmax;
use crate::variant::Variant;
use crate::views::{Operation, Options, Rows, RowsMut};

/// Calls per timed batch: well under the driver's queue of pending launches.
const BATCH: usize = 200;
/// Timed batches per call kind (the median is reported).
const BATCHES: usize = 50;
/// Calls before timing: plans made, modules loaded, workspace sized.
const WARMUP: usize = 1000;

/// The median CPU time per call, in microseconds, of each call kind: f32 `run(Auto)`, bf16
/// `forward` (softmax), and f32 log-softmax `forward` at a temperature with a per-row scale.
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
    Ok(results)
}

/// Median microseconds per call of `call` over [`BATCHES`] batches of [`BATCH`] calls.
fn per_call(
    softmax: &mut Softmax,
    mut call: impl FnMut(&mut Softmax) -> Result<()>,
) -> Result<f64> {
    for _ in 0..WARMUP {
        call(softmax)?;
    }
    softmax.synchronize()?;
    let mut batches = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let started = Instant::now();
        for _ in 0..BATCH {
            call(softmax)?;
        }
        batches.push(started.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
        softmax.synchronize()?;
    }
    Ok(median(batches))
}
