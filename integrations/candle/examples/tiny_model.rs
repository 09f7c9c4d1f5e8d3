//! A tiny candle language model whose attention scores (softmax with a causal mask and a
//! scale) and LM head (log-softmax, then the NLL loss) go through softmax-candle, trained for
//! one step beside the same model on candle's own ops: the losses and every gradient match,
//! and the time of a forward and backward pass is printed for both.
//!
//! `cargo run --release --example tiny_model` (needs a CUDA GPU).

use std::time::Instant;

use candle_core::{D, DType, Device, IndexOp, Tensor, Var};
use softmax_candle::SoftmaxOptions;

const VOCAB: usize = 32_000;
const WIDTH: usize = 256;
const HEADS: usize = 4;
const LENGTH: usize = 128;
const BATCH: usize = 4;

/// The model's parameters.
struct Model {
    embedding: Var,
    query: Var,
    key: Var,
    value: Var,
    head: Var,
}

impl Model {
    fn new(device: &Device) -> candle_core::Result<Self> {
        let var = |rows, cols, scale: f64| {
            Var::from_tensor(&(Tensor::randn(0f32, 1.0, (rows, cols), device)? * scale)?)
        };
        let per_width = 1.0 / (WIDTH as f64).sqrt();
        Ok(Model {
            embedding: var(VOCAB, WIDTH, 1.0)?,
            query: var(WIDTH, WIDTH, per_width)?,
            key: var(WIDTH, WIDTH, per_width)?,
            value: var(WIDTH, WIDTH, per_width)?,
            head: var(WIDTH, VOCAB, per_width)?,
        })
    }

    fn vars(&self) -> [(&'static str, &Var); 5] {
        [
            ("embedding", &self.embedding),
            ("query", &self.query),
            ("key", &self.key),
            ("value", &self.value),
            ("head", &self.head),
        ]
    }

    /// The mean NLL of predicting `targets` from `tokens` (both `BATCH × LENGTH`), with the
    /// softmax family from softmax-candle (`ours`) or from candle's own ops.
    fn loss(&self, tokens: &Tensor, targets: &Tensor, ours: bool) -> candle_core::Result<Tensor> {
        let head_width = WIDTH / HEADS;
        let x = self
            .embedding
            .as_tensor()
            .index_select(&tokens.flatten_all()?, 0)?;
        let split = |w: &Var| -> candle_core::Result<Tensor> {
            x.matmul(w.as_tensor())?
                .reshape((BATCH, LENGTH, HEADS, head_width))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (split(&self.query)?, split(&self.key)?, split(&self.value)?);
        // Scores of every head: BATCH × HEADS × LENGTH × LENGTH, rows of causal blocks.
        let scores = q.matmul(&k.t()?)?;
        let scale = 1.0 / (head_width as f64).sqrt();
        let attention = if ours {
            softmax_candle::softmax(
                &scores,
                &SoftmaxOptions::softmax().scale(scale as f32).causal(),
            )?
        } else {
            let future: Vec<f32> = (0..LENGTH * LENGTH)
                .map(|i| {
                    if i % LENGTH > i / LENGTH {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            let future = Tensor::from_vec(future, (LENGTH, LENGTH), scores.device())?;
            candle_nn::ops::softmax(&(scores * scale)?.broadcast_add(&future)?, D::Minus1)?
        };
        let context = attention
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((BATCH * LENGTH, WIDTH))?;
        let logits = context.matmul(self.head.as_tensor())?;
        let log_probabilities = if ours {
            softmax_candle::log_softmax_last_dim(&logits)?
        } else {
            candle_nn::ops::log_softmax(&logits, D::Minus1)?
        };
        let picked = log_probabilities.gather(&targets.flatten_all()?.unsqueeze(1)?, 1)?;
        picked.mean_all()?.neg()
    }
}

/// The median wall time of `step` (which synchronizes) over `runs` runs after one warm-up.
fn median_ms(
    runs: usize,
    mut step: impl FnMut() -> candle_core::Result<()>,
) -> candle_core::Result<f64> {
    step()?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        step()?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[runs / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::new_cuda(0)?;
    let model = Model::new(&device)?;
    let tokens = Tensor::rand(0f32, VOCAB as f32, (BATCH, LENGTH), &device)?
        .floor()?
        .to_dtype(DType::U32)?;
    let targets = Tensor::rand(0f32, VOCAB as f32, (BATCH, LENGTH), &device)?
        .floor()?
        .to_dtype(DType::U32)?;
    let ours = model.loss(&tokens, &targets, true)?;
    let theirs = model.loss(&tokens, &targets, false)?;
    let (l_ours, l_theirs) = (ours.to_scalar::<f32>()?, theirs.to_scalar::<f32>()?);
    println!("loss: softmax-candle {l_ours:.6}, candle {l_theirs:.6}");
    let mut failures = Vec::new();
    if (l_ours - l_theirs).abs() > 1e-4 * l_theirs.abs() {
        failures.push(format!("loss {l_ours} against {l_theirs}"));
    }
    let (g_ours, g_theirs) = (ours.backward()?, theirs.backward()?);
    for (name, var) in model.vars() {
        let (Some(a), Some(b)) = (g_ours.get(var.as_tensor()), g_theirs.get(var.as_tensor()))
        else {
            failures.push(format!("no gradient for {name}"));
            continue;
        };
        let scale = b
            .abs()?
            .max_keepdim(0)?
            .max_keepdim(1)?
            .i((0, 0))?
            .to_scalar::<f32>()?;
        let difference = (a - b)?
            .abs()?
            .max_keepdim(0)?
            .max_keepdim(1)?
            .i((0, 0))?
            .to_scalar::<f32>()?;
        let relative = difference / scale.max(1e-30);
        println!("gradient of {name}: largest difference {relative:.2e} of its largest value");
        if relative > 1e-3 {
            failures.push(format!("gradient of {name} off by {relative:e}"));
        }
    }
    let Device::Cuda(cuda) = &device else {
        unreachable!("made as a CUDA device")
    };
    let stream = cuda.cuda_stream();
    for (label, use_ours) in [("softmax-candle", true), ("candle", false)] {
        let ms = median_ms(20, || {
            let loss = model.loss(&tokens, &targets, use_ours)?;
            let grads = loss.backward()?;
            drop(grads);
            stream.synchronize().map_err(candle_core::Error::wrap)
        })?;
        println!("forward + backward, {label}: {ms:.3} ms (median of 20)");
    }
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    println!("the model on softmax-candle matches candle's own ops in loss and every gradient");
    Ok(())
}
