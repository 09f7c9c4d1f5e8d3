//! Calls over cudarc's buffers and streams (feature `cudarc`): the path of a program whose
//! device memory is cudarc's, as candle's CUDA storage is. cudarc and cust share the device's
//! primary context, so a [`Softmax`] and a cudarc `CudaContext` on one device see the same
//! memory; the work is enqueued on the caller's cudarc stream, after the waits cudarc's own
//! bookkeeping asks for.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use kernels_gpu::launch::ops::DType;

use crate::Softmax;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::softmax::RawRows;
use crate::views::{Operation, Options};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half2::bf16 {}
    impl Sealed for half2::f16 {}
}

/// An element type of cudarc buffers the operations take: `f32`, and half 2's `bf16` and
/// `f16` (the types cudarc's `f16` feature implements).
pub trait CudarcElement: DeviceRepr + sealed::Sealed {
    const DTYPE: DType;
}

impl CudarcElement for f32 {
    const DTYPE: DType = DType::F32;
}

impl CudarcElement for half2::bf16 {
    const DTYPE: DType = DType::Bf16;
}

impl CudarcElement for half2::f16 {
    const DTYPE: DType = DType::F16;
}

/// Refuses a buffer that does not hold `shape`'s elements.
fn check_len(what: &'static str, len: usize, shape: Shape) -> Result<()> {
    if len != shape.len() {
        return Err(Error::PerRowLength {
            what,
            len,
            rows: shape.rows(),
            expected: shape.len(),
        });
    }
    Ok(())
}

impl Softmax {
    /// Refuses a cudarc stream of another device.
    fn check_cudarc_stream(&self, stream: &CudaStream) -> Result<()> {
        let ordinal = stream.context().ordinal() as u32;
        if ordinal != self.device().ordinal {
            return Err(Error::WrongDevice {
                what: "the cudarc stream",
                device: ordinal,
                expected: self.device().ordinal,
            });
        }
        Ok(())
    }

    /// Reports an error cudarc recorded while ordering `stream` after its buffers' earlier
    /// writes (it records such errors on the context rather than returning them).
    fn check_cudarc_waits(stream: &CudaStream) -> Result<()> {
        stream
            .context()
            .check_err()
            .map_err(|error| Error::CudaStatus {
                during: "ordering the stream after cudarc's earlier writes",
                code: error.0 as u32,
                name: format!("{error:?}"),
            })
    }

    /// [`Softmax::forward`] of contiguous rows (`shape`) held in cudarc buffers (a
    /// `CudaSlice`, `CudaView` or `CudaViewMut`), enqueued on `stream`.
    pub fn forward_cudarc<I: CudarcElement, O: CudarcElement>(
        &mut self,
        op: Operation,
        input: &impl DevicePtr<I>,
        output: &mut impl DevicePtrMut<O>,
        shape: Shape,
        options: &Options<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        self.check_cudarc_stream(stream)?;
        check_len("input", input.len(), shape)?;
        check_len("output", output.len(), shape)?;
        // The guards record this use on `stream` when dropped, after the launches.
        let (x, _x_read) = input.device_ptr(stream);
        let (y, _y_written) = output.device_ptr_mut(stream);
        Self::check_cudarc_waits(stream)?;
        // SAFETY: cudarc's buffers hold `shape.len()` elements of their types (checked) and
        // stay allocated while borrowed, which outlasts the call; cudarc made `stream` wait
        // for their earlier writes, and its guards order later uses after this work; the
        // stream is of this device (checked), whose primary context both libraries use;
        // `output` is borrowed mutably, so it is not `input`.
        unsafe {
            self.forward_raw(
                op,
                RawRows::new(x, I::DTYPE, shape),
                RawRows::new(y, O::DTYPE, shape),
                options,
                stream.cu_stream().cast(),
            )
        }
    }

    /// [`Softmax::backward`] of contiguous rows held in cudarc buffers, on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_cudarc<T: CudarcElement, O: CudarcElement>(
        &mut self,
        op: Operation,
        y: &impl DevicePtr<T>,
        dy: &impl DevicePtr<T>,
        dx: &mut impl DevicePtrMut<O>,
        shape: Shape,
        options: &Options<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        self.check_cudarc_stream(stream)?;
        check_len("forward output", y.len(), shape)?;
        check_len("gradient", dy.len(), shape)?;
        check_len("gradient output", dx.len(), shape)?;
        let (y, _y_read) = y.device_ptr(stream);
        let (dy, _dy_read) = dy.device_ptr(stream);
        let (dx, _dx_written) = dx.device_ptr_mut(stream);
        Self::check_cudarc_waits(stream)?;
        // SAFETY: as in `forward_cudarc`, for the three buffers.
        unsafe {
            self.backward_raw(
                op,
                RawRows::new(y, T::DTYPE, shape),
                RawRows::new(dy, T::DTYPE, shape),
                RawRows::new(dx, O::DTYPE, shape),
                options,
                stream.cu_stream().cast(),
            )
        }
    }

    /// [`Softmax::log_sum_exp`] of contiguous rows held in a cudarc buffer into a cudarc
    /// buffer of one f32 per row, on `stream`.
    pub fn log_sum_exp_cudarc<I: CudarcElement>(
        &mut self,
        input: &impl DevicePtr<I>,
        lse: &mut impl DevicePtrMut<f32>,
        shape: Shape,
        options: &Options<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        self.check_cudarc_stream(stream)?;
        check_len("input", input.len(), shape)?;
        if lse.len() != shape.rows() {
            return Err(Error::PerRowLength {
                what: "log-sum-exp output",
                len: lse.len(),
                rows: shape.rows(),
                expected: shape.rows(),
            });
        }
        let (x, _x_read) = input.device_ptr(stream);
        let (lse, _lse_written) = lse.device_ptr_mut(stream);
        Self::check_cudarc_waits(stream)?;
        // SAFETY: as in `forward_cudarc`; `lse` holds one f32 per row (checked).
        unsafe {
            self.log_sum_exp_raw(
                RawRows::new(x, I::DTYPE, shape),
                lse,
                options,
                stream.cu_stream().cast(),
            )
        }
    }
}
