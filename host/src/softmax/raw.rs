//! The floor any other CUDA library can call: the operations over raw device addresses, a raw
//! `CUstream`, shapes, row strides and element types given at run time.

use cust::sys;
use kernels_gpu::launch::ops::{DType, RowState};

use super::Softmax;
use super::operations::{Span, check_shapes};
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::views::{Operation, Options};

/// Rows of one element type in device memory, by address: row `r` starts at element
/// `r · stride` from `address` (`stride ≥ cols`; contiguous rows have `stride == cols`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRows {
    /// A `CUdeviceptr` (the device address of the first element).
    pub address: u64,
    pub dtype: DType,
    pub shape: Shape,
    pub stride: usize,
}

impl RawRows {
    /// Contiguous rows.
    pub fn new(address: u64, dtype: DType, shape: Shape) -> Self {
        RawRows {
            address,
            dtype,
            shape,
            stride: shape.cols(),
        }
    }

    /// The view's span, once its stride and the alignment of its address are checked.
    fn span(&self, what: &'static str) -> Result<Span> {
        let align = u64::from(self.dtype.bytes());
        if !self.address.is_multiple_of(align) {
            return Err(Error::Misaligned {
                what,
                address: self.address,
                align,
            });
        }
        if self.stride < self.shape.cols() {
            return Err(Error::Stride {
                what,
                stride: self.stride,
                cols: self.shape.cols(),
            });
        }
        let span = Span::raw(
            what,
            self.address,
            self.dtype.bytes(),
            self.shape,
            self.stride,
        );
        Ok(span)
    }
}

/// A per-row buffer (log-sum-exp, row states) of `rows` elements of `element_bytes` each,
/// once its address is checked to be aligned for them.
fn per_row(what: &'static str, address: u64, element_bytes: u32, rows: usize) -> Result<Span> {
    let align = u64::from(element_bytes);
    if !address.is_multiple_of(align) {
        return Err(Error::Misaligned {
            what,
            address,
            align,
        });
    }
    Ok(Span::raw(what, address, element_bytes, Shape::EMPTY, 0).covering(rows))
}

/// # Safety (every function here)
///
/// The library checks what it can see: shapes, strides, element types, that every view's
/// address is aligned for its type, that every address is device memory of this instance's
/// device (on a machine with several devices), and that outputs do not overlap inputs. The
/// caller guarantees the rest:
/// - each view's buffer holds its elements, `(rows − 1) · stride + cols` of its type from its
///   address (per-row buffers: one element per row), and stays allocated until the work
///   enqueued on `stream` has completed;
/// - nothing else writes the inputs, or reads or writes the outputs, while that work runs,
///   unless it is ordered before or after it (on `stream`, or with events);
/// - `stream` is a stream of this device's primary context (or null, the legacy default
///   stream), valid for the duration of the call;
/// - the buffers named in `options` follow the same rules.
///
/// The work is enqueued on `stream` without waiting, except as [`Softmax::on`] describes for
/// a call that first needs to load kernels or grow the workspace.
impl Softmax {
    /// [`Softmax::forward`] over raw views.
    ///
    /// # Safety
    /// See the safety section of this `impl` block.
    pub unsafe fn forward_raw(
        &mut self,
        op: Operation,
        input: RawRows,
        output: RawRows,
        options: &Options<'_>,
        stream: sys::CUstream,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(input.shape, output.shape, "output")?;
        let x = input.span("input")?;
        let y = output.span("output")?;
        self.with_stream(stream, |s| {
            s.forward_spans(op, (x, input.dtype), (y, output.dtype), options)
        })
    }

    /// [`Softmax::backward`] over raw views (`dx` may be exactly `dy`: in place).
    ///
    /// # Safety
    /// See the safety section of this `impl` block.
    pub unsafe fn backward_raw(
        &mut self,
        op: Operation,
        y: RawRows,
        dy: RawRows,
        dx: RawRows,
        options: &Options<'_>,
        stream: sys::CUstream,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(y.shape, dy.shape, "gradient")?;
        check_shapes(y.shape, dx.shape, "gradient output")?;
        if dy.dtype != y.dtype {
            return Err(Error::ElementTypeMismatch {
                what: "gradient",
                expected: y.dtype,
                actual: dy.dtype,
            });
        }
        let spans = (y.span("forward output")?, dy.span("gradient")?, y.dtype);
        let dx_span = dx.span("gradient output")?;
        self.with_stream(stream, |s| {
            s.backward_spans(op, spans, (dx_span, dx.dtype), options)
        })
    }

    /// [`Softmax::log_sum_exp`] into `lse`, one f32 per row.
    ///
    /// # Safety
    /// See the safety section of this `impl` block.
    pub unsafe fn log_sum_exp_raw(
        &mut self,
        input: RawRows,
        lse: u64,
        options: &Options<'_>,
        stream: sys::CUstream,
    ) -> Result<()> {
        let _context = self.enter()?;
        let x = input.span("input")?;
        let lse = per_row("log-sum-exp output", lse, 4, input.shape.rows())?;
        self.with_stream(stream, |s| {
            s.per_row_spans(x, input.dtype, lse, RowOutput::LogSumExp, options)
        })
    }

    /// [`Softmax::row_states`] into `states`, one [`RowState`] per row.
    ///
    /// # Safety
    /// See the safety section of this `impl` block.
    pub unsafe fn row_states_raw(
        &mut self,
        input: RawRows,
        states: u64,
        options: &Options<'_>,
        stream: sys::CUstream,
    ) -> Result<()> {
        let _context = self.enter()?;
        let x = input.span("input")?;
        let size = size_of::<RowState>() as u32;
        let states = per_row("row states", states, size, input.shape.rows())?;
        self.with_stream(stream, |s| {
            s.per_row_spans(x, input.dtype, states, RowOutput::States, options)
        })
    }

    /// [`Softmax::normalize_with_states`] with `slots` runs of one [`RowState`] per row at
    /// `states`.
    ///
    /// # Safety
    /// See the safety section of this `impl` block.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn normalize_with_states_raw(
        &mut self,
        op: Operation,
        input: RawRows,
        states: u64,
        slots: usize,
        output: RawRows,
        options: &Options<'_>,
        stream: sys::CUstream,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(input.shape, output.shape, "output")?;
        let x = input.span("input")?;
        let y = output.span("output")?;
        let rows = input.shape.rows();
        let size = size_of::<RowState>() as u32;
        let states = per_row("row states", states, size, rows.saturating_mul(slots))?;
        self.with_stream(stream, |s| {
            s.normalize_spans(op, (x, input.dtype), states, (y, output.dtype), options)
        })
    }
}

/// What a per-row call writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RowOutput {
    LogSumExp,
    States,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_views_must_be_aligned_and_cover_their_rows() {
        let shape = Shape::new(2, 8).unwrap();
        let view = |address, dtype, stride| RawRows {
            address,
            dtype,
            shape,
            stride,
        };
        assert!(view(256, DType::F32, 8).span("input").is_ok());
        assert!(view(258, DType::Bf16, 8).span("input").is_ok());
        assert!(matches!(
            view(258, DType::F32, 8).span("input"),
            Err(Error::Misaligned { align: 4, .. })
        ));
        assert!(matches!(
            view(257, DType::F16, 8).span("input"),
            Err(Error::Misaligned { align: 2, .. })
        ));
        assert!(matches!(
            view(256, DType::F32, 7).span("input"),
            Err(Error::Stride { .. })
        ));
        assert!(per_row("row states", 260, 8, 2).is_err());
        assert!(per_row("log-sum-exp output", 260, 4, 2).is_ok());
    }
}
