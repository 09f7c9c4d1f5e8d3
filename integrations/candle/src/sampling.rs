//! Sampling a token from each row of logits (the last dimension) on the device: temperature
//! (0 is greedy), top-k, top-p and min-p, drawn by the library's sampler with its random state
//! kept in a candle tensor.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor, bail,
};
use half::{bf16, f16};
use softmax::reference::{SamplingReference, filtered_distribution_f64, gumbel_draw_f64};
use softmax::{Options, SamplingOptions, SamplingOutputs, ValuesMut};

use crate::instance::with_softmax;
use crate::ops::{cpu_rows, dispatch_float, ordinal};
use crate::rows::Rows;

/// The filters of a draw and its random state: the seed, and the offset of the draw (each
/// call of [`Sampler::sample`] takes the next).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: Option<u32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub seed: u64,
    pub offset: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            seed: 0,
            offset: 0,
        }
    }
}

impl SamplingParams {
    /// The library's checks, on every device (the CPU path included).
    fn check(&self) -> Result<()> {
        let t = self.temperature;
        if !(0.0..f32::INFINITY).contains(&t) {
            bail!("softmax-candle: the temperature must be finite and at least 0, got {t}");
        }
        if self.top_k == Some(0) {
            bail!("softmax-candle: top-k must be at least 1");
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            bail!("softmax-candle: top-p must be in (0, 1], got {p}");
        }
        if let Some(p) = self.min_p
            && !(0.0..=1.0).contains(&p)
        {
            bail!("softmax-candle: min-p must be in [0, 1], got {p}");
        }
        Ok(())
    }

    fn library(&self) -> SamplingOptions<'static> {
        let mut options = SamplingOptions::new()
            .temperature(self.temperature)
            .advance(false);
        if let Some(k) = self.top_k {
            options = options.top_k(k);
        }
        if let Some(p) = self.top_p {
            options = options.top_p(p);
        }
        if let Some(p) = self.min_p {
            options = options.min_p(p);
        }
        options
    }
}

/// One token per row of `logits` (f32, bf16 or f16 on a CUDA device, the last dimension the
/// vocabulary), as a u32 tensor of the leading dimensions: drawn with `params`' filters at its
/// seed and offset (the same seed and offset give the same tokens). A row without a token (a
/// NaN or `+inf` logit, or none finite) gets `softmax::NO_TOKEN`. CPU tensors are drawn from
/// the f64 reference's filtered distribution with the same noise.
pub fn sample(logits: &Tensor, params: &SamplingParams) -> Result<Tensor> {
    params.check()?;
    let state = Tensor::new(&[params.seed as i64, params.offset as i64], logits.device())?;
    logits.apply_op2_no_bwd(&state, &Sample { params: *params })
}

/// A sampler that keeps its random state on the device and advances it at every draw, as a
/// decode loop uses one.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    state: Tensor,
    step: Tensor,
}

impl Sampler {
    /// A sampler with `params`' filters, starting at its seed and offset, on `device`.
    pub fn new(params: SamplingParams, device: &Device) -> Result<Self> {
        params.check()?;
        Ok(Sampler {
            params,
            state: Tensor::new(&[params.seed as i64, params.offset as i64], device)?,
            step: Tensor::new(&[0i64, 1], device)?,
        })
    }

    /// The tokens of `logits` (see [`sample`]) at the sampler's offset, which then advances.
    pub fn sample(&mut self, logits: &Tensor) -> Result<Tensor> {
        let tokens = logits.apply_op2_no_bwd(
            &self.state,
            &Sample {
                params: self.params,
            },
        )?;
        self.state = self.state.add(&self.step)?;
        Ok(tokens)
    }
}

/// The op: (logits, random state as two i64) → tokens.
#[derive(Clone, Debug)]
struct Sample {
    params: SamplingParams,
}

/// The random state's two words, from a contiguous i64 tensor of two.
fn cpu_state(storage: &CpuStorage, layout: &Layout) -> Result<(u64, u64)> {
    match (storage, layout.contiguous_offsets()) {
        (CpuStorage::I64(v), Some((start, end))) if end - start == 2 => {
            Ok((v[start] as u64, v[start + 1] as u64))
        }
        _ => bail!("softmax-candle: the random state is a contiguous i64 tensor of two"),
    }
}

impl CustomOp2 for Sample {
    fn name(&self) -> &'static str {
        "softmax-rs-sample"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let rows = Rows::of(l1)?;
        let x = cpu_rows(s1, &rows)?;
        let (seed, offset) = cpu_state(s2, l2)?;
        let p = &self.params;
        let reference = SamplingReference {
            temperature: f64::from(p.temperature),
            top_k: p.top_k.map(|k| k as usize),
            top_p: p.top_p.map(f64::from),
            min_p: p.min_p.map(f64::from),
        };
        let cols = rows.shape.cols();
        let tokens: Vec<u32> = x
            .chunks(cols.max(1))
            .take(rows.shape.rows())
            .enumerate()
            .map(|(r, row)| {
                let distribution = filtered_distribution_f64(row, &reference);
                gumbel_draw_f64(&distribution, &reference, seed, offset, r as u32, 0)
            })
            .collect();
        Ok((CpuStorage::U32(tokens), token_shape(l1)))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let rows = Rows::of(l1)?;
        let device = s1.device().clone();
        let stream = device.cuda_stream();
        let Some((start, end)) = l2.contiguous_offsets().filter(|(s, e)| e - s == 2) else {
            bail!("softmax-candle: the random state is a contiguous i64 tensor of two");
        };
        if s2.dtype() != DType::I64 {
            bail!(
                "softmax-candle: the random state is i64, got {:?}",
                s2.dtype()
            );
        }
        let state = s2.as_cuda_slice::<i64>()?.slice(start..end);
        // The library takes its state mutably (it may advance it): a copy, not advanced.
        let mut random = unsafe { device.alloc::<u64>(2)? };
        let state_bits = unsafe { state.transmute::<u64>(2) }
            .ok_or_else(|| candle_core::Error::Msg("softmax-candle: the state as u64".into()))?;
        stream
            .memcpy_dtod(&state_bits, &mut random)
            .map_err(candle_core::Error::wrap)?;
        let mut tokens = unsafe { device.alloc::<u32>(rows.shape.rows())? };
        let options = Options::new().on(&stream);
        let sampling = self.params.library();
        macro_rules! call {
            ($t:ty) => {{
                let input = s1.as_cuda_slice::<$t>()?;
                with_softmax(ordinal(&device)?, |softmax| {
                    softmax.sample(
                        rows.view_of(&input.slice(rows.range()))?,
                        ValuesMut::cudarc(&mut random),
                        SamplingOutputs::new().tokens(ValuesMut::cudarc(&mut tokens)),
                        &sampling,
                        &options,
                    )
                })?
            }};
        }
        dispatch_float!(
            s1.dtype(),
            call,
            "softmax-candle: logits of {:?} (f32, bf16 or f16)"
        );
        Ok((
            CudaStorage::wrap_cuda_slice(tokens, device),
            token_shape(l1),
        ))
    }
}

/// The leading dimensions of the logits: one token per row.
fn token_shape(layout: &Layout) -> Shape {
    let dims = layout.dims();
    Shape::from_dims(&dims[..dims.len().saturating_sub(1)])
}
