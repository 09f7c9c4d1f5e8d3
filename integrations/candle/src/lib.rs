//! softmax-rs for candle: the library's kernels as candle tensor operations.
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use softmax_candle::{Mask, SoftmaxOptions};
//!
//! let device = Device::new_cuda(0)?;
//! let logits = Tensor::randn(0f32, 1.0, (8, 128_256), &device)?.to_dtype(DType::BF16)?;
//! let probabilities = softmax_candle::softmax_last_dim(&logits)?;
//! let log_probabilities = softmax_candle::log_softmax_last_dim(&logits)?;
//! // bf16 in, f32 out, at temperature 0.7, in one launch.
//! let options = SoftmaxOptions::softmax().temperature(0.7).output_dtype(DType::F32);
//! let sampled_from = softmax_candle::softmax(&logits, &options)?;
//! // Attention scores: scaled, causal (rows = heads × L, columns = L).
//! let scores = Tensor::randn(0f32, 1.0, (2, 4, 64, 64), &device)?;
//! let attention = softmax_candle::softmax(&scores, &SoftmaxOptions::softmax().scale(0.125).causal())?;
//! # let _ = (probabilities, log_probabilities, sampled_from, attention, Mask::Allowed);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! - Every operation runs over the last dimension, on f32, bf16 and f16 tensors, computing in
//!   f32. Rows may be strided (a narrowed last dimension, say) as long as the last dimension is
//!   contiguous and the leading dimensions collapse into one row stride; other layouts are a
//!   clear error, never a silent copy.
//! - Gradients flow through candle's autograd ([`candle_core::CustomOp1::bwd`]) with the
//!   library's backward kernels; the in-place forms take no gradient.
//! - Work runs on the tensor's candle stream (the per-thread default stream of
//!   `Device::new_cuda`, or the stream of `Device::new_cuda_with_stream`), through one
//!   [`softmax::Softmax`] per device and thread that this crate keeps.
//! - CPU tensors are computed by the library's f64 reference (slow, exact: for tests).

mod cross_entropy;
mod instance;
mod ops;
mod rows;
mod sampling;

use candle_core::{DType, Result, Tensor};

pub use cross_entropy::{CrossEntropyOptions, cross_entropy};
pub use sampling::{Sampler, SamplingParams, sample};
pub use softmax::{MaskedRows, Operation, Reduction};

/// A mask applied to the scaled scores before normalizing, as a tensor of `k × cols` values
/// (any shape holding them, contiguous) with `k` dividing the rows: row `r` uses mask row
/// `r % k`. One mask row for every row, one per query of stacked attention heads, or one per
/// row.
#[derive(Clone, Debug)]
pub enum Mask {
    /// Added to the scaled scores (`-inf` masks an element out); converted to f32.
    Additive(Tensor),
    /// Elements whose value is 0 are masked out; converted to u8.
    Allowed(Tensor),
}

/// What a call computes, and with which options.
#[derive(Clone, Debug)]
pub struct SoftmaxOptions {
    pub(crate) operation: Operation,
    pub(crate) scale: f32,
    pub(crate) mask: Option<Mask>,
    pub(crate) causal: bool,
    pub(crate) masked_rows: MaskedRows,
    pub(crate) output_dtype: Option<DType>,
}

impl SoftmaxOptions {
    /// Softmax, no options.
    pub fn softmax() -> Self {
        SoftmaxOptions {
            operation: Operation::Softmax,
            scale: 1.0,
            mask: None,
            causal: false,
            masked_rows: MaskedRows::Nan,
            output_dtype: None,
        }
    }

    /// Log-softmax, no options.
    pub fn log_softmax() -> Self {
        SoftmaxOptions {
            operation: Operation::LogSoftmax,
            ..Self::softmax()
        }
    }

    /// Multiplies every score by `scale` (finite, above 0).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = scale;
        self
    }

    /// Divides every score by `temperature` (finite, above 0).
    pub fn temperature(self, temperature: f32) -> Self {
        self.scale(1.0 / temperature)
    }

    /// Adds or applies `mask` after scaling.
    pub fn mask(mut self, mask: Mask) -> Self {
        self.mask = Some(mask);
        self
    }

    /// Masks column `c` of row `r` when `c > r % cols`: square score blocks stacked along the
    /// rows (rows must be a multiple of the last dimension).
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    /// What a row masked everywhere gives: NaN (the default, as PyTorch) or zero probability.
    pub fn masked_rows(mut self, masked_rows: MaskedRows) -> Self {
        self.masked_rows = masked_rows;
        self
    }

    /// The output's element type (f32, bf16 or f16); the input's by default.
    pub fn output_dtype(mut self, dtype: DType) -> Self {
        self.output_dtype = Some(dtype);
        self
    }
}

impl Default for SoftmaxOptions {
    fn default() -> Self {
        Self::softmax()
    }
}

/// Softmax over the last dimension.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    softmax(x, &SoftmaxOptions::softmax())
}

/// Log-softmax over the last dimension.
pub fn log_softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    softmax(x, &SoftmaxOptions::log_softmax())
}

/// `ln Σ e^x` over the last dimension, as f32 (the last dimension dropped).
pub fn log_sum_exp(x: &Tensor) -> Result<Tensor> {
    log_sum_exp_with(x, &SoftmaxOptions::softmax())
}

/// Softmax or log-softmax over the last dimension with `options`, with a gradient.
pub fn softmax(x: &Tensor, options: &SoftmaxOptions) -> Result<Tensor> {
    ops::forward(x, options)
}

/// Log-sum-exp over the last dimension of the scores `options` describe (its scale, mask
/// and causality; the operation is ignored), with a gradient: f32, the last dimension dropped.
pub fn log_sum_exp_with(x: &Tensor, options: &SoftmaxOptions) -> Result<Tensor> {
    ops::log_sum_exp(x, options)
}

/// [`softmax`] written over `x` (the output has `x`'s type), without a gradient.
pub fn softmax_in_place(x: &Tensor, options: &SoftmaxOptions) -> Result<()> {
    ops::forward_in_place(x, options)
}
