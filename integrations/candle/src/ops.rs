//! The candle operations: forward (softmax, log-softmax) with or without a mask tensor,
//! log-sum-exp, the backward pass, and the in-place forward. Each CUDA implementation turns
//! candle's storage and layout into the library's rows and calls it on the tensor's stream;
//! each CPU implementation computes the library's f64 reference.

use candle_core::backend::{BackendDevice, BackendStorage};
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::CudaStream;
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, D, DType, DeviceLocation, InplaceOp1, Layout,
    Result, Shape as CandleShape, Tensor, bail,
};
use half::{bf16, f16};
use softmax::reference::{Scores, backward_f64};
use softmax::{MaskedRows, Operation, Options, RowsMut, Values, ValuesMut};

use crate::instance::with_softmax;
use crate::rows::Rows;
use crate::{Mask, SoftmaxOptions};

/// Which mask tensor a call carries (as its second argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MaskKind {
    Additive,
    Allowed,
}

/// The options every kernel call of one operation shares, without the tensors.
#[derive(Clone, Copy, Debug)]
struct Scoring {
    scale: f32,
    causal: bool,
    masked_rows: MaskedRows,
    mask: Option<MaskKind>,
}

impl Scoring {
    fn of(options: &SoftmaxOptions) -> Self {
        Scoring {
            scale: options.scale,
            causal: options.causal,
            masked_rows: options.masked_rows,
            mask: options.mask.as_ref().map(|m| match m {
                Mask::Additive(_) => MaskKind::Additive,
                Mask::Allowed(_) => MaskKind::Allowed,
            }),
        }
    }

    /// The library's options, with `mask`.
    fn options<'a>(&self, mask: Option<softmax::Mask<'a>>) -> Options<'a> {
        let mut options = Options::new()
            .scale(self.scale)
            .masked_rows(self.masked_rows);
        if self.causal {
            options = options.causal();
        }
        match mask {
            Some(mask) => options.mask(mask),
            None => options,
        }
    }
}

/// The device ordinal of a CUDA device.
pub(crate) fn ordinal(device: &CudaDevice) -> Result<usize> {
    match device.location() {
        DeviceLocation::Cuda { gpu_id } => Ok(gpu_id),
        other => bail!("softmax-candle: expected a CUDA device, got {other:?}"),
    }
}

/// The element types the library takes.
fn check_dtype(what: &str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => Ok(()),
        other => bail!("softmax-candle: {what} must be f32, bf16 or f16, got {other:?}"),
    }
}

/// Calls `$call!(I, O)` with the Rust element types of the input and output dtypes.
macro_rules! dispatch {
    ($input:expr, $output:expr, $call:ident) => {
        match ($input, $output) {
            (DType::F32, DType::F32) => $call!(f32, f32),
            (DType::F32, DType::BF16) => $call!(f32, bf16),
            (DType::F32, DType::F16) => $call!(f32, f16),
            (DType::BF16, DType::F32) => $call!(bf16, f32),
            (DType::BF16, DType::BF16) => $call!(bf16, bf16),
            (DType::BF16, DType::F16) => $call!(bf16, f16),
            (DType::F16, DType::F32) => $call!(f16, f32),
            (DType::F16, DType::BF16) => $call!(f16, bf16),
            (DType::F16, DType::F16) => $call!(f16, f16),
            (input, output) => bail!(
                "softmax-candle: element types {input:?} in, {output:?} out are not f32, bf16 or f16"
            ),
        }
    };
}

/// Calls `$call!(T)` with the Rust element type of `$dtype`, f32, bf16 or f16; any other
/// type fails with `$message`, a format string given that type.
macro_rules! dispatch_float {
    ($dtype:expr, $call:ident, $message:literal) => {
        match $dtype {
            DType::F32 => $call!(f32),
            DType::BF16 => $call!(bf16),
            DType::F16 => $call!(f16),
            other => bail!($message, other),
        }
    };
}
pub(crate) use dispatch_float;

/// The values of `rows` in a CPU storage, widened to f32, row after row.
pub(crate) fn cpu_rows(storage: &CpuStorage, rows: &Rows) -> Result<Vec<f32>> {
    fn gather<T: Copy>(data: &[T], rows: &Rows, widen: impl Fn(T) -> f32) -> Vec<f32> {
        let (count, cols) = (rows.shape.rows(), rows.shape.cols());
        (0..count)
            .flat_map(|r| {
                let start = rows.offset + r * rows.stride;
                data[start..start + cols].iter().map(|&v| widen(v))
            })
            .collect()
    }
    Ok(match storage {
        CpuStorage::F32(data) => gather(data, rows, |v| v),
        CpuStorage::BF16(data) => gather(data, rows, bf16::to_f32),
        CpuStorage::F16(data) => gather(data, rows, f16::to_f32),
        other => bail!(
            "softmax-candle: element type {:?} is not f32, bf16 or f16",
            other.dtype()
        ),
    })
}

/// `values` (f64) as a CPU storage of `dtype`.
pub(crate) fn cpu_storage(values: &[f64], dtype: DType) -> Result<CpuStorage> {
    Ok(match dtype {
        DType::F32 => CpuStorage::F32(values.iter().map(|&v| v as f32).collect()),
        DType::BF16 => CpuStorage::BF16(values.iter().map(|&v| bf16::from_f64(v)).collect()),
        DType::F16 => CpuStorage::F16(values.iter().map(|&v| f16::from_f64(v)).collect()),
        other => bail!("softmax-candle: output type {other:?} is not f32, bf16 or f16"),
    })
}

/// A contiguous CPU mask as the reference takes it.
enum CpuMask {
    Additive(Vec<f32>),
    Allowed(Vec<u8>),
}

impl CpuMask {
    fn of(storage: &CpuStorage, layout: &Layout) -> Result<Self> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("softmax-candle: the mask must be contiguous");
        };
        Ok(match storage {
            CpuStorage::F32(data) => CpuMask::Additive(data[start..end].to_vec()),
            CpuStorage::U8(data) => CpuMask::Allowed(data[start..end].to_vec()),
            other => bail!("softmax-candle: a mask of {:?}", other.dtype()),
        })
    }
}

impl Scoring {
    /// The reference's score transform for these options and `mask`.
    fn scores<'a>(&self, mask: Option<&'a CpuMask>) -> Scores<'a> {
        Scores {
            scale: self.scale,
            additive_mask: match mask {
                Some(CpuMask::Additive(m)) => Some(m),
                _ => None,
            },
            allowed_mask: match mask {
                Some(CpuMask::Allowed(m)) => Some(m),
                _ => None,
            },
            causal: self.causal,
            zero_masked_rows: self.masked_rows == MaskedRows::Zero,
            ..Scores::default()
        }
    }

    /// Runs `call` with the library's options for these scores on `stream` (the call's own)
    /// and, where the call carries one, the mask tensor's values (contiguous), which the call
    /// reads through cudarc's bookkeeping on that stream: ordered after the mask's writes,
    /// its read recorded after the launches, a failure of either reported as the call's.
    fn with_options<R>(
        &self,
        mask: Option<(&CudaStorage, &Layout)>,
        stream: &Arc<CudaStream>,
        call: impl FnOnce(&Options<'_>) -> Result<R>,
    ) -> Result<R> {
        let Some((storage, layout)) = mask else {
            return call(&self.options(None).on(stream));
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("softmax-candle: the mask must be contiguous");
        };
        match self.mask {
            Some(MaskKind::Additive) => {
                let values = storage.as_cuda_slice::<f32>()?.slice(start..end);
                let mask = softmax::Mask::Additive(Values::cudarc(&values));
                call(&self.options(Some(mask)).on(stream))
            }
            Some(MaskKind::Allowed) => {
                let values = storage.as_cuda_slice::<u8>()?.slice(start..end);
                let mask = softmax::Mask::Allowed(Values::cudarc(&values));
                call(&self.options(Some(mask)).on(stream))
            }
            None => bail!("softmax-candle: a mask tensor without a mask kind"),
        }
    }
}

/// Softmax or log-softmax of the last dimension.
#[derive(Clone, Copy, Debug)]
struct Forward {
    operation: Operation,
    scoring: Scoring,
    output: DType,
}

impl Forward {
    fn name(&self) -> &'static str {
        match self.operation {
            Operation::LogSoftmax => "softmax-rs-log-softmax",
            _ => "softmax-rs-softmax",
        }
    }

    fn cpu(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
        mask: Option<&CpuMask>,
    ) -> Result<(CpuStorage, CandleShape)> {
        let rows = Rows::of(layout)?;
        let x = cpu_rows(storage, &rows)?;
        let log = self.operation == Operation::LogSoftmax;
        let y = self
            .scoring
            .scores(mask)
            .forward(log, &x, rows.shape.rows(), rows.shape.cols());
        Ok((cpu_storage(&y, self.output)?, layout.shape().clone()))
    }

    fn cuda(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
        mask: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, CandleShape)> {
        let rows = Rows::of(layout)?;
        let device = storage.device().clone();
        let stream = device.cuda_stream();
        macro_rules! call {
            ($i:ty, $o:ty) => {{
                let input = storage.as_cuda_slice::<$i>()?;
                // SAFETY: every element is written by the call before anything reads it.
                let mut output = unsafe { device.alloc::<$o>(rows.shape.len())? };
                self.scoring.with_options(mask, &stream, |options| {
                    with_softmax(ordinal(&device)?, |softmax| {
                        softmax.forward(
                            self.operation,
                            rows.view_of(&input.slice(rows.range()))?,
                            RowsMut::cudarc(&mut output, rows.shape)?,
                            options,
                        )
                    })
                })?;
                <$o as CudaDType>::wrap_cuda_slice(output, device.clone())
            }};
        }
        let output = dispatch!(storage.dtype(), self.output, call);
        Ok((output, layout.shape().clone()))
    }

    /// The gradient of the scores from the forward output `y` and its gradient `dy`, as
    /// `arg`'s type.
    fn gradient(&self, arg: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let backward = Backward {
            operation: self.operation,
            scale: self.scoring.scale,
            output: arg.dtype(),
        };
        y.apply_op2_no_bwd(&dy.contiguous()?, &backward)
    }
}

impl CustomOp1 for Forward {
    fn name(&self) -> &'static str {
        Forward::name(self)
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, CandleShape)> {
        self.cpu(storage, layout, None)
    }

    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> Result<(CudaStorage, CandleShape)> {
        self.cuda(storage, layout, None)
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        self.gradient(arg, res, grad_res).map(Some)
    }
}

impl CustomOp2 for Forward {
    fn name(&self) -> &'static str {
        Forward::name(self)
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
        mask: &CpuStorage,
        mask_layout: &Layout,
    ) -> Result<(CpuStorage, CandleShape)> {
        self.cpu(storage, layout, Some(&CpuMask::of(mask, mask_layout)?))
    }

    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
        mask: &CudaStorage,
        mask_layout: &Layout,
    ) -> Result<(CudaStorage, CandleShape)> {
        self.cuda(storage, layout, Some((mask, mask_layout)))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _mask: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(self.gradient(arg, res, grad_res)?), None))
    }
}

impl InplaceOp1 for Forward {
    fn name(&self) -> &'static str {
        Forward::name(self)
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let rows = Rows::of(layout)?;
        let (written, _) = self.cpu(storage, layout, None)?;
        let (cols, stride) = (rows.shape.cols(), rows.stride);
        macro_rules! scatter {
            ($into:expr, $from:expr) => {
                for (r, row) in $from.chunks(cols.max(1)).enumerate() {
                    let start = rows.offset + r * stride;
                    $into[start..start + cols].copy_from_slice(row);
                }
            };
        }
        match (storage, written) {
            (CpuStorage::F32(into), CpuStorage::F32(from)) => scatter!(into, from),
            (CpuStorage::BF16(into), CpuStorage::BF16(from)) => scatter!(into, from),
            (CpuStorage::F16(into), CpuStorage::F16(from)) => scatter!(into, from),
            (into, _) => bail!("softmax-candle: element type {:?} in place", into.dtype()),
        }
        Ok(())
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> Result<()> {
        let rows = Rows::of(layout)?;
        let device = storage.device().clone();
        let stream = device.cuda_stream();
        let options = self.scoring.options(None).on(&stream);
        macro_rules! call {
            ($t:ty) => {{
                let data = storage.as_cuda_slice_mut::<$t>()?;
                let mut data = data.slice_mut(rows.range());
                with_softmax(ordinal(&device)?, |softmax| {
                    let view = RowsMut::cudarc_strided(&mut data, rows.shape, rows.stride)?;
                    softmax.forward_in_place(self.operation, view, &options)
                })
            }};
        }
        dispatch_float!(
            storage.dtype(),
            call,
            "softmax-candle: element type {:?} in place"
        )
    }
}

/// The gradient of softmax or log-softmax with respect to the (unscaled) scores, from the
/// forward output and its gradient (both contiguous, of one type).
#[derive(Clone, Copy, Debug)]
struct Backward {
    operation: Operation,
    scale: f32,
    output: DType,
}

impl CustomOp2 for Backward {
    fn name(&self) -> &'static str {
        "softmax-rs-backward"
    }

    fn cpu_fwd(
        &self,
        y: &CpuStorage,
        y_layout: &Layout,
        dy: &CpuStorage,
        dy_layout: &Layout,
    ) -> Result<(CpuStorage, CandleShape)> {
        let (rows, dy_rows) = (Rows::of(y_layout)?, Rows::of(dy_layout)?);
        let (y, dy) = (cpu_rows(y, &rows)?, cpu_rows(dy, &dy_rows)?);
        let log = self.operation == Operation::LogSoftmax;
        let scale = vec![f64::from(self.scale); rows.shape.rows()];
        let dx = backward_f64(log, &y, &dy, rows.shape.cols(), &scale);
        Ok((cpu_storage(&dx, self.output)?, y_layout.shape().clone()))
    }

    fn cuda_fwd(
        &self,
        y: &CudaStorage,
        y_layout: &Layout,
        dy: &CudaStorage,
        dy_layout: &Layout,
    ) -> Result<(CudaStorage, CandleShape)> {
        let (rows, dy_rows) = (Rows::of(y_layout)?, Rows::of(dy_layout)?);
        if !rows.contiguous() || !dy_rows.contiguous() || y.dtype() != dy.dtype() {
            bail!("softmax-candle: the backward pass takes contiguous y and dy of one type");
        }
        let device = y.device().clone();
        let stream = device.cuda_stream();
        let options = Options::new().scale(self.scale).on(&stream);
        macro_rules! call {
            ($t:ty, $o:ty) => {{
                let (y_slice, dy_slice) = (y.as_cuda_slice::<$t>()?, dy.as_cuda_slice::<$t>()?);
                // SAFETY: every element is written by the call before anything reads it.
                let mut dx = unsafe { device.alloc::<$o>(rows.shape.len())? };
                with_softmax(ordinal(&device)?, |softmax| {
                    softmax.backward(
                        self.operation,
                        rows.view_of(&y_slice.slice(rows.range()))?,
                        dy_rows.view_of(&dy_slice.slice(dy_rows.range()))?,
                        RowsMut::cudarc(&mut dx, rows.shape)?,
                        &options,
                    )
                })?;
                <$o as CudaDType>::wrap_cuda_slice(dx, device.clone())
            }};
        }
        let dx = dispatch!(y.dtype(), self.output, call);
        Ok((dx, y_layout.shape().clone()))
    }
}

/// `ln Σ e^s` of each row's scores, as f32, the last dimension dropped.
#[derive(Clone, Copy, Debug)]
struct LogSumExp {
    scoring: Scoring,
}

impl LogSumExp {
    fn shape(layout: &Layout) -> CandleShape {
        let dims = layout.dims();
        CandleShape::from_dims(&dims[..dims.len().saturating_sub(1)])
    }

    fn cpu(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
        mask: Option<&CpuMask>,
    ) -> Result<(CpuStorage, CandleShape)> {
        let rows = Rows::of(layout)?;
        let x = cpu_rows(storage, &rows)?;
        let lse = self
            .scoring
            .scores(mask)
            .log_sum_exp(&x, rows.shape.rows(), rows.shape.cols());
        Ok((cpu_storage(&lse, DType::F32)?, Self::shape(layout)))
    }

    fn cuda(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
        mask: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, CandleShape)> {
        let rows = Rows::of(layout)?;
        let device = storage.device().clone();
        let stream = device.cuda_stream();
        // SAFETY: every element is written by the call before anything reads it.
        let mut lse = unsafe { device.alloc::<f32>(rows.shape.rows())? };
        macro_rules! call {
            ($i:ty) => {{
                let input = storage.as_cuda_slice::<$i>()?;
                self.scoring.with_options(mask, &stream, |options| {
                    with_softmax(ordinal(&device)?, |softmax| {
                        softmax.log_sum_exp(
                            rows.view_of(&input.slice(rows.range()))?,
                            ValuesMut::cudarc(&mut lse),
                            options,
                        )
                    })
                })?
            }};
        }
        dispatch_float!(
            storage.dtype(),
            call,
            "softmax-candle: element type {:?} is not f32, bf16 or f16"
        );
        Ok((
            CudaStorage::wrap_cuda_slice(lse, device),
            Self::shape(layout),
        ))
    }

    /// `∂lse/∂x = softmax(x)` of the same scores (scaled: times the scale), times the
    /// incoming gradient, as `arg`'s type.
    fn gradient(&self, arg: &Tensor, mask: Option<&Tensor>, grad: &Tensor) -> Result<Tensor> {
        let forward = Forward {
            operation: Operation::Softmax,
            scoring: self.scoring,
            output: DType::F32,
        };
        let probabilities = match mask {
            Some(mask) => arg.apply_op2_no_bwd(mask, &forward)?,
            None => arg.apply_op1_no_bwd(&forward)?,
        };
        let scaled = (probabilities * f64::from(self.scoring.scale))?;
        scaled
            .broadcast_mul(&grad.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?)?
            .to_dtype(arg.dtype())
    }
}

impl CustomOp1 for LogSumExp {
    fn name(&self) -> &'static str {
        "softmax-rs-log-sum-exp"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, CandleShape)> {
        self.cpu(storage, layout, None)
    }

    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> Result<(CudaStorage, CandleShape)> {
        self.cuda(storage, layout, None)
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        self.gradient(arg, None, grad_res).map(Some)
    }
}

impl CustomOp2 for LogSumExp {
    fn name(&self) -> &'static str {
        "softmax-rs-log-sum-exp"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
        mask: &CpuStorage,
        mask_layout: &Layout,
    ) -> Result<(CpuStorage, CandleShape)> {
        self.cpu(storage, layout, Some(&CpuMask::of(mask, mask_layout)?))
    }

    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
        mask: &CudaStorage,
        mask_layout: &Layout,
    ) -> Result<(CudaStorage, CandleShape)> {
        self.cuda(storage, layout, Some((mask, mask_layout)))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        mask: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(self.gradient(arg, Some(mask), grad_res)?), None))
    }
}

/// The mask tensor of `options` in the type its kind takes, contiguous.
fn mask_tensor(options: &SoftmaxOptions) -> Result<Option<Tensor>> {
    options
        .mask
        .as_ref()
        .map(|mask| match mask {
            Mask::Additive(m) => m.to_dtype(DType::F32)?.contiguous(),
            Mask::Allowed(m) => m.to_dtype(DType::U8)?.contiguous(),
        })
        .transpose()
}

pub(crate) fn forward(x: &Tensor, options: &SoftmaxOptions) -> Result<Tensor> {
    check_dtype("the input", x.dtype())?;
    let output = options.output_dtype.unwrap_or(x.dtype());
    check_dtype("the output", output)?;
    let op = Forward {
        operation: options.operation,
        scoring: Scoring::of(options),
        output,
    };
    match mask_tensor(options)? {
        Some(mask) => x.apply_op2(&mask, op),
        None => x.apply_op1(op),
    }
}

pub(crate) fn log_sum_exp(x: &Tensor, options: &SoftmaxOptions) -> Result<Tensor> {
    check_dtype("the input", x.dtype())?;
    let op = LogSumExp {
        scoring: Scoring::of(options),
    };
    match mask_tensor(options)? {
        Some(mask) => x.apply_op2(&mask, op),
        None => x.apply_op1(op),
    }
}

pub(crate) fn forward_in_place(x: &Tensor, options: &SoftmaxOptions) -> Result<()> {
    check_dtype("the input", x.dtype())?;
    if options.mask.is_some() {
        bail!("softmax-candle: the in-place call takes no mask tensor (use `softmax`)");
    }
    if options.output_dtype.is_some_and(|d| d != x.dtype()) {
        bail!("softmax-candle: the in-place call writes the input's own type");
    }
    x.inplace_op1(&Forward {
        operation: options.operation,
        scoring: Scoring::of(options),
        output: x.dtype(),
    })
}
