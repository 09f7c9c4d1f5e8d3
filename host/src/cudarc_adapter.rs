//! Calls over cudarc's buffers and streams (feature `cudarc`): the path of a program whose
//! device memory is cudarc's, as candle's CUDA storage is. cudarc and cust share the device's
//! primary context, so a [`Softmax`] and a cudarc `CudaContext` on one device see the same
//! memory; the work is enqueued on the caller's cudarc stream, after the waits cudarc's own
//! bookkeeping asks for.
//!
//! cudarc keeps the failures of its bookkeeping (the waits a buffer's use asks for, the events
//! its guards record afterwards) in one error slot per context rather than returning them. A
//! call here sets aside what the slot held before it (another operation's failure, which stays
//! there for its owner), reports only what its own bookkeeping put there, and checks the
//! guards' records after its launches.

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError};
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

/// cudarc's error slot during one call: what it held before is set aside and put back when this
/// drops, so that the call reports only the failures its own bookkeeping records.
struct OwnErrors<'a> {
    context: &'a CudaContext,
    earlier: Option<DriverError>,
}

impl<'a> OwnErrors<'a> {
    fn set_aside(stream: &'a CudaStream) -> Self {
        let context = stream.context();
        OwnErrors {
            context,
            earlier: context.check_err().err(),
        }
    }

    /// A failure cudarc recorded since the slot was set aside (or last checked), as this
    /// call's error.
    fn check(&self, during: &'static str) -> Result<()> {
        self.context.check_err().map_err(|error| Error::CudaStatus {
            during,
            code: error.0 as u32,
            name: format!("{error:?}"),
        })
    }
}

impl Drop for OwnErrors<'_> {
    fn drop(&mut self) {
        if let Some(earlier) = self.earlier.take() {
            self.context.record_err::<()>(Err(earlier));
        }
    }
}

/// What the guards' waits and records are checked as.
const WAITS: &str = "ordering the stream after cudarc's earlier uses of the buffers";
const RECORDS: &str = "recording the buffers' use on cudarc's events";

/// Rows in a cudarc buffer: `shape`, row `r` starting at element `r · stride` (`stride ≥
/// cols`; contiguous rows have `stride == cols`), as the strided calls take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudarcRows {
    pub shape: Shape,
    pub stride: usize,
}

impl CudarcRows {
    /// Contiguous rows.
    pub fn new(shape: Shape) -> Self {
        CudarcRows {
            shape,
            stride: shape.cols(),
        }
    }

    /// Rows `stride` elements apart.
    pub fn strided(shape: Shape, stride: usize) -> Self {
        CudarcRows { shape, stride }
    }

    /// The raw view of these rows at `address`.
    fn raw(self, address: u64, dtype: DType) -> RawRows {
        RawRows {
            address,
            dtype,
            shape: self.shape,
            stride: self.stride,
        }
    }

    /// Refuses a buffer of `len` elements that ends before the last row does (the raw call
    /// checks the stride itself).
    fn check(self, what: &'static str, len: usize) -> Result<()> {
        let needed = match (self.shape.rows(), self.shape.cols()) {
            (0, _) | (_, 0) => 0,
            (rows, cols) => (rows - 1).saturating_mul(self.stride).saturating_add(cols),
        };
        if len < needed {
            return Err(Error::ViewLength {
                what,
                len,
                needed,
                rows: self.shape.rows(),
                cols: self.shape.cols(),
                stride: self.stride,
            });
        }
        Ok(())
    }
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

    /// The frame of every call here: this instance's context current, `stream` checked to be
    /// of this device, cudarc's error slot set aside. `call` takes the buffers' pointers
    /// (whose guards record their use on `stream` when dropped, after the launches), checks
    /// the waits those asked for ([`WAITS`]), and launches; the guards' records are checked
    /// after it.
    fn through_cudarc(
        &mut self,
        stream: &CudaStream,
        call: impl FnOnce(&mut Self, &OwnErrors<'_>) -> Result<()>,
    ) -> Result<()> {
        let _context = self.enter()?;
        self.check_cudarc_stream(stream)?;
        let errors = OwnErrors::set_aside(stream);
        let launched = call(self, &errors);
        launched.and(errors.check(RECORDS))
    }

    /// [`Softmax::forward`] of contiguous rows (`shape`) held in cudarc buffers (a
    /// `CudaSlice`, `CudaView` or `CudaViewMut`) of exactly `shape`'s elements, enqueued on
    /// `stream`.
    pub fn forward_cudarc<I: CudarcElement, O: CudarcElement>(
        &mut self,
        op: Operation,
        input: &impl DevicePtr<I>,
        output: &mut impl DevicePtrMut<O>,
        shape: Shape,
        options: &Options<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        check_len("input", input.len(), shape)?;
        check_len("output", output.len(), shape)?;
        let rows = CudarcRows::new(shape);
        self.forward_cudarc_strided(op, input, rows, output, rows, options, stream)
    }

    /// [`Softmax::forward_cudarc`] over strided rows: each buffer holds its rows as its
    /// [`CudarcRows`] say (the two views of one shape), and may be longer.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_cudarc_strided<I: CudarcElement, O: CudarcElement>(
        &mut self,
        op: Operation,
        input: &impl DevicePtr<I>,
        input_rows: CudarcRows,
        output: &mut impl DevicePtrMut<O>,
        output_rows: CudarcRows,
        options: &Options<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        input_rows.check("input", input.len())?;
        output_rows.check("output", output.len())?;
        self.through_cudarc(stream, |softmax, errors| {
            let (x, _x_read) = input.device_ptr(stream);
            let (y, _y_written) = output.device_ptr_mut(stream);
            errors.check(WAITS)?;
            // SAFETY: cudarc's buffers hold their views (checked) and stay allocated while
            // borrowed, which outlasts the call; cudarc made `stream` wait for their earlier
            // uses, and its guards order later uses after this work; the stream is of this
            // device (checked), whose primary context both libraries use; `output` is borrowed
            // mutably, so it is not `input`.
            unsafe {
                softmax.forward_raw(
                    op,
                    input_rows.raw(x, I::DTYPE),
                    output_rows.raw(y, O::DTYPE),
                    options,
                    stream.cu_stream().cast(),
                )
            }
        })
    }

    /// [`Softmax::forward_in_place`] over rows held in a cudarc buffer, on `stream`.
    pub fn forward_cudarc_in_place<T: CudarcElement>(
        &mut self,
        op: Operation,
        data: &mut impl DevicePtrMut<T>,
        rows: CudarcRows,
        options: &Options<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        rows.check("input", data.len())?;
        self.through_cudarc(stream, |softmax, errors| {
            let (x, _x_written) = data.device_ptr_mut(stream);
            errors.check(WAITS)?;
            let view = rows.raw(x, T::DTYPE);
            // SAFETY: as in `forward_cudarc_strided`; the one buffer is read and written
            // through the same view, which the call computes in place.
            unsafe { softmax.forward_raw(op, view, view, options, stream.cu_stream().cast()) }
        })
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
        check_len("forward output", y.len(), shape)?;
        check_len("gradient", dy.len(), shape)?;
        check_len("gradient output", dx.len(), shape)?;
        self.through_cudarc(stream, |softmax, errors| {
            let (y, _y_read) = y.device_ptr(stream);
            let (dy, _dy_read) = dy.device_ptr(stream);
            let (dx, _dx_written) = dx.device_ptr_mut(stream);
            errors.check(WAITS)?;
            // SAFETY: as in `forward_cudarc_strided`, for the three buffers.
            unsafe {
                softmax.backward_raw(
                    op,
                    RawRows::new(y, T::DTYPE, shape),
                    RawRows::new(dy, T::DTYPE, shape),
                    RawRows::new(dx, O::DTYPE, shape),
                    options,
                    stream.cu_stream().cast(),
                )
            }
        })
    }

    /// [`Softmax::log_sum_exp`] of contiguous rows held in a cudarc buffer of exactly
    /// `shape`'s elements into a cudarc buffer of one f32 per row, on `stream`.
    pub fn log_sum_exp_cudarc<I: CudarcElement>(
        &mut self,
        input: &impl DevicePtr<I>,
        lse: &mut impl DevicePtrMut<f32>,
        shape: Shape,
        options: &Options<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        check_len("input", input.len(), shape)?;
        self.log_sum_exp_cudarc_strided(input, CudarcRows::new(shape), lse, options, stream)
    }

    /// [`Softmax::log_sum_exp_cudarc`] over rows laid out as `rows` say (strided, or longer
    /// than the rows).
    pub fn log_sum_exp_cudarc_strided<I: CudarcElement>(
        &mut self,
        input: &impl DevicePtr<I>,
        rows: CudarcRows,
        lse: &mut impl DevicePtrMut<f32>,
        options: &Options<'_>,
        stream: &CudaStream,
    ) -> Result<()> {
        rows.check("input", input.len())?;
        if lse.len() != rows.shape.rows() {
            return Err(Error::PerRowLength {
                what: "log-sum-exp output",
                len: lse.len(),
                rows: rows.shape.rows(),
                expected: rows.shape.rows(),
            });
        }
        self.through_cudarc(stream, |softmax, errors| {
            let (x, _x_read) = input.device_ptr(stream);
            let (lse, _lse_written) = lse.device_ptr_mut(stream);
            errors.check(WAITS)?;
            // SAFETY: as in `forward_cudarc_strided`; `input` holds its view and `lse` one f32
            // per row (checked).
            unsafe {
                softmax.log_sum_exp_raw(
                    rows.raw(x, I::DTYPE),
                    lse,
                    options,
                    stream.cu_stream().cast(),
                )
            }
        })
    }
}
