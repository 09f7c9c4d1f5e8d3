//! softmax-candle against candle's own softmax (`candle_nn::ops::softmax_last_dim`, fused) and
//! log-softmax (`candle_nn::ops::log_softmax`, composed of five ops), f32 and bf16, on the
//! seeds' sweep (about 200 MB per f32 tensor) and the LLM shapes, beside a device-to-device
//! copy of the same tensor, in one run. Each launch is timed alone between two events on the
//! tensor's stream, after the L2 is flushed; the median of the samples is reported.
//!
//! `cargo run --release --example bench -- [OUT.csv]` prints a table and writes a CSV.

use std::fmt::Write as _;

use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::{D, DType, Device, Tensor};

const WARMUP: usize = 3;
const SAMPLES: usize = 25;
/// Bytes written before each sample: far more than the H200's 60 MB L2.
const FLUSH_BYTES: usize = 512 << 20;

/// The seeds' widths, about 200 MB per f32 tensor (the rows follow), then the LLM shapes.
fn shapes() -> Vec<(usize, usize)> {
    let seed = [32, 128, 512, 1024, 4096, 8192, 16384].map(|cols| ((200 << 20) / 4 / cols, cols));
    let llm = [
        (1, 128_256),
        (8, 128_256),
        (32, 151_936),
        (64, 151_936),
        (16, 262_144),
        (128, 50_257),
        (4096, 32_000),
        (65_536, 100),
    ];
    seed.into_iter().chain(llm).collect()
}

type Step = Box<dyn Fn(&Tensor) -> candle_core::Result<Tensor>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1);
    let device = Device::new_cuda(0)?;
    let Device::Cuda(cuda) = &device else {
        unreachable!("made as a CUDA device")
    };
    let stream = cuda.cuda_stream();
    let mut flush = stream.alloc_zeros::<u8>(FLUSH_BYTES)?;
    let time = |step: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>,
                x: &Tensor,
                flush: &mut candle_core::cuda_backend::cudarc::driver::CudaSlice<u8>|
     -> Result<f64, Box<dyn std::error::Error>> {
        let mut samples = Vec::with_capacity(SAMPLES);
        for sample in 0..WARMUP + SAMPLES {
            stream.memset_zeros(flush)?;
            let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            let y = step(x)?;
            let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            end.synchronize()?;
            drop(y);
            if sample >= WARMUP {
                samples.push(f64::from(start.elapsed_ms(&end)?) * 1e3);
            }
        }
        samples.sort_by(f64::total_cmp);
        Ok(samples[samples.len() / 2])
    };
    let steps: Vec<(&str, &str, Step)> = vec![
        ("softmax", "copy", Box::new(|x: &Tensor| x.copy())),
        (
            "softmax",
            "softmax-candle",
            Box::new(softmax_candle::softmax_last_dim),
        ),
        (
            "softmax",
            "candle",
            Box::new(candle_nn::ops::softmax_last_dim),
        ),
        (
            "log-softmax",
            "softmax-candle",
            Box::new(softmax_candle::log_softmax_last_dim),
        ),
        (
            "log-softmax",
            "candle",
            Box::new(|x: &Tensor| candle_nn::ops::log_softmax(x, D::Minus1)),
        ),
    ];
    let mut csv = String::from("dtype,rows,cols,op,impl,us,copy_us,pct_of_copy\n");
    println!(
        "{:<6} {:>14} {:<12} {:>9} {:>14} {:>9} {:>9} {:>9}",
        "dtype", "shape", "op", "copy µs", "softmax-candle", "% copy", "candle", "speedup"
    );
    for dtype in [DType::F32, DType::BF16] {
        for (rows, cols) in shapes() {
            let x = Tensor::randn(0f32, 2.0, (rows, cols), &device)?.to_dtype(dtype)?;
            let mut times = Vec::new();
            for (op, name, step) in &steps {
                times.push((*op, *name, time(step.as_ref(), &x, &mut flush)?));
            }
            let copy = times[0].2;
            for op in ["softmax", "log-softmax"] {
                let of = |name: &str| {
                    times
                        .iter()
                        .find(|(o, n, _)| *o == op && *n == name)
                        .map(|t| t.2)
                        .expect("timed")
                };
                let (ours, theirs) = (of("softmax-candle"), of("candle"));
                println!(
                    "{:<6} {:>14} {:<12} {:>9.1} {:>14.1} {:>8.1}% {:>9.1} {:>8.2}x",
                    format!("{dtype:?}"),
                    format!("{rows}x{cols}"),
                    op,
                    copy,
                    ours,
                    100.0 * copy / ours,
                    theirs,
                    theirs / ours
                );
                for (name, us) in [("softmax-candle", ours), ("candle", theirs)] {
                    writeln!(
                        csv,
                        "{dtype:?},{rows},{cols},{op},{name},{us:.2},{copy:.2},{:.1}",
                        100.0 * copy / us
                    )?;
                }
            }
        }
    }
    if let Some(path) = out {
        std::fs::write(&path, csv)?;
        println!("wrote {path}");
    }
    Ok(())
}
