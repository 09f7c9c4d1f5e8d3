//! bf16 softmax of cudarc buffers on a cudarc stream, checked against the f64 reference.
//! Without a GPU it prints the error and exits non-zero.

use cudarc::driver::CudaContext;
use half::bf16;
use softmax::reference::softmax_f64;
use softmax::{Operation, Options, Rows, RowsMut, Shape, Softmax};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut softmax = Softmax::new()?;
    let context = CudaContext::new(0)?;
    let stream = context.new_stream()?;
    let shape = Shape::new(16, 32_000)?;
    let logits: Vec<bf16> = (0..shape.len())
        .map(|i| bf16::from_f32(((i * 7919) % 1000) as f32 / 100.0 - 5.0))
        .collect();
    let input = stream.clone_htod(&logits)?;
    let mut output = stream.alloc_zeros::<bf16>(shape.len())?;
    softmax.forward(
        Operation::Softmax,
        Rows::cudarc(&input, shape)?,
        RowsMut::cudarc(&mut output, shape)?,
        &Options::new().on(&stream),
    )?;
    let probabilities = stream.clone_dtoh(&output)?;
    let exact: Vec<f32> = logits.iter().map(|v| v.to_f32()).collect();
    let expected = softmax_f64(&exact, shape.rows(), shape.cols());
    // bf16 keeps 8 bits: each output is within half an ulp of the exact value.
    let worst = probabilities
        .iter()
        .zip(&expected)
        .map(|(&got, &want)| (f64::from(got.to_f32()) - want).abs() / want.max(1e-30))
        .fold(0.0, f64::max);
    println!(
        "bf16 softmax of {shape} in cudarc buffers: largest relative error {worst:.2e} ({})",
        softmax.device().name
    );
    if worst > 1.0 / 128.0 {
        return Err(format!("largest relative error {worst} is above 2^-7").into());
    }
    Ok(())
}
