//! Cross-entropy of logits (the last dimension) against one class index per row, with its
//! gradient through candle's autograd: the forward computes the loss, the backward the fused
//! kernel's gradient of it, times the incoming gradient (read on the device).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaDType;
use candle_core::{
    CpuStorage, CudaStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape as CandleShape,
    Tensor, bail,
};
use half::{bf16, f16};
use softmax::reference::{CrossEntropyReference, cross_entropy_f64};
use softmax::{
    CrossEntropyOutputs, Options, Reduction, RowsMut, Targets, Upstream, Values, ValuesMut,
};

use crate::instance::with_softmax;
use crate::ops::{cpu_rows, cpu_storage, dispatch_float, ordinal};
use crate::rows::Rows;

/// The options of [`crate::cross_entropy`], as `torch.nn.functional.cross_entropy`'s (ignore
/// index -100, no label smoothing, the mean over the rows not ignored) plus a z-loss scale
/// and a logit softcap.
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    pub(crate) ignore_index: Option<i64>,
    pub(crate) label_smoothing: f32,
    pub(crate) z_loss: f32,
    pub(crate) softcap: Option<f32>,
    pub(crate) reduction: Reduction,
    pub(crate) weight: Option<Tensor>,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            ignore_index: Some(-100),
            label_smoothing: 0.0,
            z_loss: 0.0,
            softcap: None,
            reduction: Reduction::Mean,
            weight: None,
        }
    }
}

impl CrossEntropyOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn ignore_index(mut self, index: Option<i64>) -> Self {
        self.ignore_index = index;
        self
    }

    pub fn label_smoothing(mut self, epsilon: f32) -> Self {
        self.label_smoothing = epsilon;
        self
    }

    pub fn z_loss(mut self, scale: f32) -> Self {
        self.z_loss = scale;
        self
    }

    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }

    /// One f32 weight per class (a tensor of the vocabulary's length).
    pub fn weight(mut self, weight: Tensor) -> Self {
        self.weight = Some(weight);
        self
    }

    /// The library's options, with the class weights at `weight`.
    fn library<'a>(&self, weight: Option<Values<'a, f32>>) -> softmax::CrossEntropyOptions<'a> {
        let mut options = softmax::CrossEntropyOptions::new()
            .ignore_index(self.ignore_index)
            .label_smoothing(self.label_smoothing)
            .z_loss(self.z_loss)
            .reduction(self.reduction);
        if let Some(cap) = self.softcap {
            options = options.softcap(cap);
        }
        if let Some(weight) = weight {
            options = options.weight(weight);
        }
        options
    }
}

/// The op: the loss of (logits, targets[, weight]), or with `gradient`, the gradient of the
/// loss times the upstream gradient (its last argument).
#[derive(Clone, Debug)]
struct CrossEntropy {
    options: CrossEntropyOptions,
}

/// The targets of CPU storage, as i64 (u32 read as i32, as the kernels read them).
fn cpu_targets(storage: &CpuStorage, layout: &Layout) -> Result<Vec<i64>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("softmax-candle: the targets must be contiguous");
    };
    Ok(match storage {
        CpuStorage::U32(t) => t[start..end].iter().map(|&v| i64::from(v as i32)).collect(),
        CpuStorage::I64(t) => t[start..end].to_vec(),
        other => bail!(
            "softmax-candle: targets of {:?} (u32 or i64)",
            other.dtype()
        ),
    })
}

fn cpu_weight(storage: &CpuStorage, layout: &Layout) -> Result<Vec<f32>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("softmax-candle: the class weights must be contiguous");
    };
    match storage {
        CpuStorage::F32(w) => Ok(w[start..end].to_vec()),
        other => bail!("softmax-candle: class weights of {:?} (f32)", other.dtype()),
    }
}

impl CrossEntropy {
    fn reference<'a>(&self, weight: Option<&'a [f32]>) -> CrossEntropyReference<'a> {
        CrossEntropyReference {
            ignore_index: self.options.ignore_index,
            label_smoothing: f64::from(self.options.label_smoothing),
            z_loss: f64::from(self.options.z_loss),
            softcap: self.options.softcap.map_or(0.0, f64::from),
            reduction: self.options.reduction,
            weight,
        }
    }

    fn loss_shape(&self, rows: usize) -> CandleShape {
        match self.options.reduction {
            Reduction::None => CandleShape::from_dims(&[rows]),
            _ => CandleShape::from_dims(&[]),
        }
    }

    fn cpu(
        &self,
        logits: (&CpuStorage, &Layout),
        targets: (&CpuStorage, &Layout),
        weight: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, CandleShape)> {
        let rows = Rows::of(logits.1)?;
        let x = cpu_rows(logits.0, &rows)?;
        let t = cpu_targets(targets.0, targets.1)?;
        let w = weight.map(|(s, l)| cpu_weight(s, l)).transpose()?;
        let (r, c) = (rows.shape.rows(), rows.shape.cols());
        let result = cross_entropy_f64(&x, r, c, &t, &self.reference(w.as_deref()));
        let loss = match self.options.reduction {
            Reduction::None => result.losses,
            _ => vec![result.reduced],
        };
        Ok((cpu_storage(&loss, DType::F32)?, self.loss_shape(r)))
    }

    fn cuda(
        &self,
        logits: (&CudaStorage, &Layout),
        targets: (&CudaStorage, &Layout),
        weight: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, CandleShape)> {
        let rows = Rows::of(logits.1)?;
        let device = logits.0.device().clone();
        let stream = device.cuda_stream();
        let loss_len = match self.options.reduction {
            Reduction::None => rows.shape.rows(),
            _ => 1,
        };
        // SAFETY: every element is written by the call before anything reads it.
        let mut loss = unsafe { device.alloc::<f32>(loss_len)? };
        let options = Options::new().on(&stream);
        macro_rules! call {
            ($t:ty) => {{
                let input = logits.0.as_cuda_slice::<$t>()?;
                with_targets(targets, |targets| {
                    with_weight(weight, |weight| {
                        with_softmax(ordinal(&device)?, |softmax| {
                            softmax.cross_entropy(
                                rows.view_of(&input.slice(rows.range()))?,
                                targets,
                                CrossEntropyOutputs::new().loss(ValuesMut::cudarc(&mut loss)),
                                &self.options.library(weight),
                                &options,
                            )
                        })
                    })
                })?
            }};
        }
        dispatch_float!(
            logits.0.dtype(),
            call,
            "softmax-candle: logits of {:?} (f32, bf16 or f16)"
        );
        Ok((
            CudaStorage::wrap_cuda_slice(loss, device),
            self.loss_shape(rows.shape.rows()),
        ))
    }
}

/// Runs `call` with the targets' view (u32 read as i32; i64), contiguous.
fn with_targets<R>(
    (storage, layout): (&CudaStorage, &Layout),
    call: impl FnOnce(Targets<'_>) -> Result<R>,
) -> Result<R> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("softmax-candle: the targets must be contiguous");
    };
    match storage.dtype() {
        DType::U32 => {
            let slice = storage.as_cuda_slice::<u32>()?.slice(start..end);
            // u32 class indices below 2^31 are the same bits as i32 (the ignore index -100
            // included, as u32's 2^32 - 100).
            // SAFETY: i32 and u32 share their size and every bit pattern.
            let view = unsafe { slice.transmute::<i32>(end - start) }
                .ok_or_else(|| candle_core::Error::Msg("softmax-candle: targets as i32".into()))?;
            call(Targets::I32(Values::cudarc(&view)))
        }
        DType::I64 => {
            let slice = storage.as_cuda_slice::<i64>()?.slice(start..end);
            call(Targets::I64(Values::cudarc(&slice)))
        }
        other => bail!("softmax-candle: targets of {other:?} (u32 or i64)"),
    }
}

/// Runs `call` with the class weights' view, if any (f32, contiguous).
fn with_weight<R>(
    weight: Option<(&CudaStorage, &Layout)>,
    call: impl FnOnce(Option<Values<'_, f32>>) -> Result<R>,
) -> Result<R> {
    let Some((storage, layout)) = weight else {
        return call(None);
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("softmax-candle: the class weights must be contiguous");
    };
    let slice = storage.as_cuda_slice::<f32>()?.slice(start..end);
    call(Some(Values::cudarc(&slice)))
}

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "softmax-rs-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, CandleShape)> {
        self.cpu((s1, l1), (s2, l2), None)
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, CandleShape)> {
        self.cuda((s1, l1), (s2, l2), None)
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _loss: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let gradient = Gradient {
            options: self.options.clone(),
        };
        let upstream = grad.to_dtype(DType::F32)?.contiguous()?;
        Ok((
            Some(gradient.apply(logits, targets, &upstream, None)?),
            None,
        ))
    }
}

impl CustomOp3 for CrossEntropy {
    fn name(&self) -> &'static str {
        "softmax-rs-cross-entropy-weighted"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, CandleShape)> {
        self.cpu((s1, l1), (s2, l2), Some((s3, l3)))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, CandleShape)> {
        self.cuda((s1, l1), (s2, l2), Some((s3, l3)))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        weight: &Tensor,
        _loss: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let gradient = Gradient {
            options: self.options.clone(),
        };
        let upstream = grad.to_dtype(DType::F32)?.contiguous()?;
        Ok((
            Some(gradient.apply(logits, targets, &upstream, Some(weight))?),
            None,
            None,
        ))
    }
}

/// The gradient of the loss with respect to the logits, times the upstream gradient: the
/// fused kernel's, as the logits' type.
#[derive(Clone, Debug)]
struct Gradient {
    options: CrossEntropyOptions,
}

impl Gradient {
    fn apply(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        upstream: &Tensor,
        weight: Option<&Tensor>,
    ) -> Result<Tensor> {
        let weighted = GradientWeighted {
            gradient: self.clone(),
            weight: weight.cloned(),
        };
        logits.apply_op3_no_bwd(targets, upstream, &weighted)
    }

    fn cpu(
        &self,
        logits: (&CpuStorage, &Layout),
        targets: (&CpuStorage, &Layout),
        upstream: (&CpuStorage, &Layout),
        weight: Option<&Tensor>,
    ) -> Result<(CpuStorage, CandleShape)> {
        let rows = Rows::of(logits.1)?;
        let x = cpu_rows(logits.0, &rows)?;
        let t = cpu_targets(targets.0, targets.1)?;
        let w: Option<Vec<f32>> = weight.map(|w| w.to_vec1::<f32>()).transpose()?;
        let g = cpu_weight(upstream.0, upstream.1)?;
        let (r, c) = (rows.shape.rows(), rows.shape.cols());
        let op = CrossEntropy {
            options: self.options.clone(),
        };
        let result = cross_entropy_f64(&x, r, c, &t, &op.reference(w.as_deref()));
        let gradient: Vec<f64> = result
            .gradient
            .chunks(c.max(1))
            .enumerate()
            .flat_map(|(row, values)| {
                let scale = f64::from(if g.len() == 1 { g[0] } else { g[row] });
                values.iter().map(move |v| v * scale)
            })
            .collect();
        Ok((
            cpu_storage(&gradient, logits.0.dtype())?,
            logits.1.shape().clone(),
        ))
    }

    fn cuda(
        &self,
        logits: (&CudaStorage, &Layout),
        targets: (&CudaStorage, &Layout),
        upstream: (&CudaStorage, &Layout),
        weight: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, CandleShape)> {
        let rows = Rows::of(logits.1)?;
        let device = logits.0.device().clone();
        let stream = device.cuda_stream();
        let options = Options::new().on(&stream);
        let Some((start, end)) = upstream.1.contiguous_offsets() else {
            bail!("softmax-candle: the upstream gradient must be contiguous");
        };
        let upstream = upstream.0.as_cuda_slice::<f32>()?.slice(start..end);
        macro_rules! call {
            ($t:ty) => {{
                let input = logits.0.as_cuda_slice::<$t>()?;
                // SAFETY: every element is written by the call before anything reads it.
                let mut gradient = unsafe { device.alloc::<$t>(rows.shape.len())? };
                with_targets(targets, |targets| {
                    with_weight(weight, |weight| {
                        with_softmax(ordinal(&device)?, |softmax| {
                            softmax.cross_entropy_backward(
                                rows.view_of(&input.slice(rows.range()))?,
                                targets,
                                CrossEntropyOutputs::new(),
                                RowsMut::cudarc(&mut gradient, rows.shape)?,
                                Upstream::Device(Values::cudarc(&upstream)),
                                &self.options.library(weight),
                                &options,
                            )
                        })
                    })
                })?;
                <$t as CudaDType>::wrap_cuda_slice(gradient, device.clone())
            }};
        }
        let gradient = dispatch_float!(
            logits.0.dtype(),
            call,
            "softmax-candle: logits of {:?} (f32, bf16 or f16)"
        );
        Ok((gradient, logits.1.shape().clone()))
    }
}

/// [`Gradient`] with the class weights held as a tensor (a `CustomOp3` has three arguments:
/// logits, targets and the upstream gradient).
#[derive(Clone, Debug)]
struct GradientWeighted {
    gradient: Gradient,
    weight: Option<Tensor>,
}

impl CustomOp3 for GradientWeighted {
    fn name(&self) -> &'static str {
        "softmax-rs-cross-entropy-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, CandleShape)> {
        self.gradient
            .cpu((s1, l1), (s2, l2), (s3, l3), self.weight.as_ref())
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, CandleShape)> {
        match &self.weight {
            None => self.gradient.cuda((s1, l1), (s2, l2), (s3, l3), None),
            Some(weight) => {
                let (storage, layout) = weight.storage_and_layout();
                let candle_core::Storage::Cuda(storage) = &*storage else {
                    bail!("softmax-candle: class weights on another device than the logits");
                };
                self.gradient
                    .cuda((s1, l1), (s2, l2), (s3, l3), Some((storage, layout)))
            }
        }
    }
}

/// Cross-entropy of `logits` (the last dimension, f32, bf16 or f16) against `targets` (one
/// class index per row, u32 or i64), as f32: a scalar for a reduced loss, one per row for
/// [`Reduction::None`]. Differentiable with respect to the logits.
pub fn cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    options: &CrossEntropyOptions,
) -> Result<Tensor> {
    let op = CrossEntropy {
        options: options.clone(),
    };
    match &options.weight {
        None => logits.apply_op2(targets, op),
        Some(weight) => logits.apply_op3(targets, &weight.to_dtype(DType::F32)?.contiguous()?, op),
    }
}
