//! Times sampling at decode shapes, isolated as the benchmark times (see `common/timing.rs`),
//! beside this library's softmax of the same logits (into logits of the same type): greedy,
//! temperature alone, and top-k 50 with top-p 0.9, at temperature 1 (the peers take none).
//! Prints one CSV line per shape, type and contender: `rows,cols,dtype,contender,median_us`.
//!
//! `cargo run --release -p host --example sampling_bench [ROWSxCOLS,...]`

#[path = "common/timing.rs"]
mod timing;

use cust::memory::{DeviceBuffer, DeviceCopy};
use softmax::half::bf16;
use softmax::{
    Element, Operation, Options, Rows, RowsMut, SamplingOptions, SamplingOutputs, Shape, Softmax,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shapes = timing::shapes_from_args(
        [1, 16, 64, 256]
            .into_iter()
            .flat_map(|rows| [32000, 128256, 262144].map(|cols| (rows, cols)))
            .collect(),
    );
    let mut softmax = Softmax::new()?;
    let mut flush = timing::l2_flush(&softmax)?;
    println!("rows,cols,dtype,contender,median_us");
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
    // Logits like a decoder's: a few tokens well above a broad bulk.
    let values: Vec<T> = (0..shape.len())
        .map(|i| {
            let bulk = ((i * 7919) % 2001) as f32 / 400.0 - 2.5;
            let head = if (i * 104_729) % 997 == 0 { 6.0 } else { 0.0 };
            T::from_f32(bulk + head)
        })
        .collect();
    let logits = DeviceBuffer::from_slice(&values)?;
    let mut out = DeviceBuffer::from_slice(&values)?;
    let mut random = DeviceBuffer::from_slice(&[1u64, 0])?;
    let mut tokens = DeviceBuffer::from_slice(&vec![0u32; rows])?;
    let softmax_us = timing::time(softmax, flush, |s| {
        s.forward(
            Operation::Softmax,
            Rows::new(&logits, shape)?,
            RowsMut::new(&mut out, shape)?,
            &Options::new(),
        )?;
        Ok(())
    })?;
    let dtype = if size_of::<T>() == 2 { "bf16" } else { "f32" };
    println!("{rows},{cols},{dtype},softmax-rs-softmax,{softmax_us:.2}");
    for (contender, options) in [
        ("greedy", SamplingOptions::new().temperature(0.0)),
        ("temperature", SamplingOptions::new()),
        ("top-k-top-p", SamplingOptions::new().top_k(50).top_p(0.9)),
    ] {
        let us = timing::time(softmax, flush, |s| {
            s.sample(
                Rows::new(&logits, shape)?,
                &mut random,
                SamplingOutputs::new().tokens(&mut tokens),
                &options,
                &Options::new(),
            )?;
            Ok(())
        })?;
        println!("{rows},{cols},{dtype},softmax-rs-{contender},{us:.2}");
    }
    Ok(())
}
