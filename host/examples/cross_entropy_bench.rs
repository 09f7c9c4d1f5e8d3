//! Times the fused cross-entropy (loss and gradient, into a buffer and in place) at training
//! shapes, isolated as the benchmark times (the L2 evicted by a memset of twice its size
//! before each sample, one call between two events), beside a device-to-device copy of the
//! logits: the bytes the fused call must move (the logits read once, the gradient written
//! once) are the copy's, and the softmax of the same logits (`softmax-rs-softmax`) moves the
//! same bytes. Prints one CSV line per shape, type and contender:
//! `rows,cols,dtype,contender,median_us,pct_of_copy,extra_bytes`, where `extra_bytes` counts
//! the gradient's buffer (into a buffer) and the reduced loss's workspace (the rows' losses and
//! two totals), not the 20 bytes a block that plans whose blocks exchange through memory add
//! (docs/performance-log.md gives those). Each shape's plan (the kernels the fused calls
//! launch) goes to standard error.
//!
//! `cargo run --release -p host --example cross_entropy_bench [ROWSxCOLS,...]`

#[path = "common/timing.rs"]
mod timing;

use cust::memory::{DeviceBuffer, DeviceCopy};
use softmax::half::bf16;
use softmax::{
    CrossEntropyOptions, CrossEntropyOutputs, Element, Operation, Options, Rows, RowsMut, Shape,
    Softmax, Upstream,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shapes = timing::shapes_from_args(vec![
        (4096, 128256),
        (8192, 32000),
        (16384, 151936),
        (2048, 262144),
    ]);
    let mut softmax = Softmax::new()?;
    let mut flush = timing::l2_flush(&softmax)?;
    println!("rows,cols,dtype,contender,median_us,pct_of_copy,extra_bytes");
    for &(rows, cols) in &shapes {
        run::<bf16>(&mut softmax, &mut flush, rows, cols)?;
        run::<f32>(&mut softmax, &mut flush, rows, cols)?;
    }
    Ok(())
}

fn run<T: Element + DeviceCopy>(
    softmax: &mut Softmax,
    flush: &mut DeviceBuffer<u32>,
    rows: usize,
    cols: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let shape = Shape::new(rows, cols)?;
    let values: Vec<T> = (0..shape.len())
        .map(|i| T::from_f32(((i * 7919) % 2001) as f32 / 200.0 - 5.0))
        .collect();
    let mut logits = DeviceBuffer::from_slice(&values)?;
    let mut gradient = DeviceBuffer::from_slice(&values)?;
    let targets: Vec<i64> = (0..rows).map(|r| ((r * 104_729) % cols) as i64).collect();
    let targets = DeviceBuffer::from_slice(&targets)?;
    let mut loss = DeviceBuffer::from_slice(&[0.0f32])?;
    let ce = CrossEntropyOptions::new();
    let stream = softmax.stream().as_inner();
    let bytes = shape.len() * size_of::<T>();
    let copy = timing::time(softmax, flush, |_| {
        // SAFETY: two live buffers of `bytes`, distinct, on the instance's stream.
        let status = unsafe {
            cust::sys::cuMemcpyDtoDAsync_v2(
                gradient.as_device_ptr().as_raw(),
                logits.as_device_ptr().as_raw(),
                bytes,
                stream,
            )
        };
        if status != cust::sys::CUresult::CUDA_SUCCESS {
            return Err(format!("copy: {status:?}").into());
        }
        Ok(())
    })?;
    let into = timing::time(softmax, flush, |s| {
        s.cross_entropy_backward(
            Rows::new(&logits, shape)?,
            &targets,
            CrossEntropyOutputs::new().loss(&mut loss),
            RowsMut::new(&mut gradient, shape)?,
            Upstream::Value(1.0),
            &ce,
            &Options::new(),
        )?;
        Ok(())
    })?;
    let in_place = timing::time(softmax, flush, |s| {
        s.cross_entropy_backward_in_place(
            RowsMut::new(&mut logits, shape)?,
            &targets,
            CrossEntropyOutputs::new().loss(&mut loss),
            Upstream::Value(1.0),
            &ce,
            &Options::new(),
        )?;
        Ok(())
    })?;
    // The softmax of a tensor of this shape (the logits buffer, which the in-place calls above
    // turned into gradients: the time does not depend on the values), the same bytes moved:
    // what the family's forward reaches on this shape.
    let forward = timing::time(softmax, flush, |s| {
        s.forward(
            Operation::Softmax,
            Rows::new(&logits, shape)?,
            RowsMut::new(&mut gradient, shape)?,
            &Options::new(),
        )?;
        Ok(())
    })?;
    let dtype = if size_of::<T>() == 2 { "bf16" } else { "f32" };
    // What the fused calls launched (the in-place call plans as the call into a buffer on
    // these compact rows), to standard error beside the table.
    match softmax.cross_entropy_plan::<T>(shape, &ce) {
        Ok(plan) => eprintln!("{rows}×{cols} {dtype}: {}", plan.join(", then ")),
        Err(error) => eprintln!("{rows}×{cols} {dtype}: no plan to show ({error})"),
    }
    let workspace = 4 * (rows + 2);
    for (contender, us, extra) in [
        ("copy", copy, 0),
        ("softmax-rs", into, bytes + workspace),
        ("softmax-rs-in-place", in_place, workspace),
        ("softmax-rs-softmax", forward, bytes),
    ] {
        println!(
            "{rows},{cols},{dtype},{contender},{us:.2},{:.1},{extra}",
            100.0 * copy / us
        );
    }
    Ok(())
}
