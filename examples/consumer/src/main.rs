//! Softmax of a few rows on a stream this program owns, checked against the f64 reference.
//! Without a GPU it prints the typed error and exits non-zero.

use softmax::cust::memory::{CopyDestination, DeviceBuffer};
use softmax::cust::stream::{Stream, StreamFlags};
use softmax::reference::softmax_f64;
use softmax::{Operation, Options, Rows, RowsMut, Shape, Softmax};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut softmax = Softmax::new()?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None)?;
    let shape = Shape::new(8, 50_257)?;
    let logits: Vec<f32> = (0..shape.len())
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
        .collect();
    let input = DeviceBuffer::from_slice(&logits)?;
    let mut output = DeviceBuffer::from_slice(&vec![0.0f32; shape.len()])?;
    softmax.forward(
        Operation::Softmax,
        Rows::new(&input, shape)?,
        RowsMut::new(&mut output, shape)?,
        &Options::new().on(&stream),
    )?;
    stream.synchronize()?;
    let mut probabilities = vec![0.0f32; shape.len()];
    output.copy_to(&mut probabilities[..])?;
    let expected = softmax_f64(&logits, shape.rows(), shape.cols());
    let worst = probabilities
        .iter()
        .zip(&expected)
        .map(|(&got, &want)| (f64::from(got) - want).abs())
        .fold(0.0, f64::max);
    println!(
        "softmax of {shape} on the program's own stream: largest error {worst:.2e} ({})",
        softmax.device().name
    );
    if worst > 1e-6 {
        return Err(format!("largest error {worst} is above 1e-6").into());
    }
    Ok(())
}
