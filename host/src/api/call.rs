//! The one call description. Every public call, whatever its buffers are (cust slices, raw
//! addresses, cudarc buffers) and whatever stream it runs on, goes through here: a [`Frame`]
//! turns its views into [`Span`]s (device addresses, how far each reaches) on the call's
//! stream, the checks run on spans, and a [`Call`] turns spans and options into the one
//! [`RowOpParams`] the kernels take, its layout and its request to the planner.

use std::marker::PhantomData;

use cust::sys;
use kernels_gpu::launch::ops::{DType, Direction, RowOpParams, mode};

#[cfg(feature = "cudarc")]
use super::options::StreamKind;
use super::options::{CallStream, Options};
use super::views::{
    Mask, MaskedRows, Operation, Place, PlaceMut, Rows, RowsMut, Value, Values, ValuesMut,
};
use crate::error::{Error, Result};
use crate::plan::operations::{self, Operand};
use crate::plan::{Layout, OperationMode, Request};
use crate::shape::Shape;

/// One buffer of a call: where it starts, how far it reaches, its row stride. Views become
/// spans as soon as they are resolved, so that an in-place call (one buffer read and written)
/// never holds two references to one slice.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub what: &'static str,
    pub operand: Operand,
    pub bytes: u64,
    pub shape: Shape,
    pub stride: usize,
    pub dtype: DType,
}

impl Span {
    /// A view of `shape` at `stride` elements of `dtype`, from `address`.
    pub fn rows(
        what: &'static str,
        address: u64,
        dtype: DType,
        shape: Shape,
        stride: usize,
    ) -> Self {
        let element_bytes = dtype.bytes();
        // Saturating: an absurd stride makes a span that meets everything, which is refused,
        // rather than one that wraps.
        let elements = match (shape.rows(), shape.cols()) {
            (0, _) | (_, 0) => 0,
            (rows, cols) => (rows as u64 - 1)
                .saturating_mul(stride as u64)
                .saturating_add(cols as u64),
        };
        Span {
            what,
            operand: Operand {
                address,
                stride_bytes: (stride as u64).saturating_mul(u64::from(element_bytes)),
                element_bytes,
            },
            bytes: elements.saturating_mul(u64::from(element_bytes)),
            shape,
            stride,
            dtype,
        }
    }

    /// `len` contiguous values of `element_bytes` each, from `address`.
    pub fn values(what: &'static str, address: u64, element_bytes: u32, len: usize) -> Self {
        Span {
            what,
            operand: Operand {
                address,
                stride_bytes: 0,
                element_bytes,
            },
            bytes: (len as u64).saturating_mul(u64::from(element_bytes)),
            shape: Shape::EMPTY,
            stride: 0,
            dtype: DType::F32,
        }
    }

    /// The same span, named `what`.
    pub fn named(self, what: &'static str) -> Self {
        Span { what, ..self }
    }

    fn range(&self) -> (u64, u64) {
        (self.operand.address, self.bytes)
    }

    /// The same elements viewed the same way.
    pub fn same_view(&self, other: &Span) -> bool {
        self.operand.address == other.operand.address
            && self.operand.stride_bytes == other.operand.stride_bytes
            && self.operand.element_bytes == other.operand.element_bytes
            && self.bytes == other.bytes
    }

    /// Whether its rows can be read in 16-byte packs: the first starts on a 16-byte boundary,
    /// and so does every other.
    pub fn packs_aligned(&self) -> bool {
        self.operand.address.is_multiple_of(16) && self.operand.stride_bytes.is_multiple_of(16)
    }

    /// Values per element of a per-row buffer.
    pub fn len(&self) -> usize {
        (self.bytes / u64::from(self.operand.element_bytes.max(1))) as usize
    }
}

/// The spans of the options' device buffers (per-row scales, masks), which a call reads.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OptionSpans {
    pub row_scale: Option<Span>,
    pub additive_mask: Option<Span>,
    pub allowed_mask: Option<Span>,
}

impl OptionSpans {
    pub fn iter(&self) -> impl Iterator<Item = Span> {
        [self.row_scale, self.additive_mask, self.allowed_mask]
            .into_iter()
            .flatten()
    }
}

/// A call in progress: its stream, and what resolving its views on that stream took
/// (cudarc's guards and error slot).
pub(crate) struct Frame<'r> {
    pub stream: sys::CUstream,
    #[cfg(feature = "cudarc")]
    cudarc: Option<super::cudarc::CudarcCall<'r>>,
    borrowed: PhantomData<&'r ()>,
}

impl<'r> Frame<'r> {
    /// A call on `stream` (`instance` is the instance's own stream) of device `ordinal`.
    #[cfg_attr(not(feature = "cudarc"), allow(unused_variables))]
    pub fn begin(stream: CallStream<'r>, instance: sys::CUstream, ordinal: u32) -> Result<Self> {
        Ok(Frame {
            stream: stream.handle(instance),
            #[cfg(feature = "cudarc")]
            cudarc: match stream.0 {
                StreamKind::Cudarc(stream) => {
                    Some(super::cudarc::CudarcCall::begin(stream, ordinal)?)
                }
                _ => None,
            },
            borrowed: PhantomData,
        })
    }

    /// The address of a buffer the call reads.
    #[cfg_attr(not(feature = "cudarc"), allow(unused_variables))]
    fn read(&mut self, what: &'static str, place: Place<'r>) -> Result<u64> {
        match place {
            Place::Address(address, _) => Ok(address),
            #[cfg(feature = "cudarc")]
            Place::Cudarc(data) => match &mut self.cudarc {
                Some(call) => Ok(call.read(data)),
                None => Err(Error::CudarcStreamNeeded { what }),
            },
        }
    }

    /// The address of a buffer the call writes.
    #[cfg_attr(not(feature = "cudarc"), allow(unused_variables))]
    fn write(&mut self, what: &'static str, place: &'r mut PlaceMut<'_>) -> Result<u64> {
        match place {
            PlaceMut::Address(address, _) => Ok(*address),
            #[cfg(feature = "cudarc")]
            PlaceMut::Cudarc(data) => match &mut self.cudarc {
                Some(call) => Ok(call.write(data)),
                None => Err(Error::CudarcStreamNeeded { what }),
            },
        }
    }

    pub fn rows(&mut self, what: &'static str, view: &Rows<'r>) -> Result<Span> {
        let address = self.read(what, view.place)?;
        Ok(Span::rows(
            what,
            address,
            view.dtype,
            view.shape,
            view.stride,
        ))
    }

    pub fn rows_mut(&mut self, what: &'static str, view: &'r mut RowsMut<'_>) -> Result<Span> {
        let (dtype, shape, stride) = (view.dtype, view.shape, view.stride);
        let address = self.write(what, &mut view.place)?;
        Ok(Span::rows(what, address, dtype, shape, stride))
    }

    pub fn values<T: Value>(&mut self, what: &'static str, view: &Values<'r, T>) -> Result<Span> {
        let address = self.read(what, view.place)?;
        Ok(Span::values(what, address, size_of::<T>() as u32, view.len))
    }

    pub fn values_mut<T: Value>(
        &mut self,
        what: &'static str,
        view: &'r mut ValuesMut<'_, T>,
    ) -> Result<Span> {
        let len = view.len;
        let address = self.write(what, &mut view.place)?;
        Ok(Span::values(what, address, size_of::<T>() as u32, len))
    }

    /// The spans of the options' buffers.
    pub fn options(&mut self, options: &Options<'r>) -> Result<OptionSpans> {
        let mut spans = OptionSpans::default();
        if let Some(scales) = &options.row_scale {
            spans.row_scale = Some(self.values("row scale", scales)?);
        }
        match &options.mask {
            Some(Mask::Additive(mask)) => spans.additive_mask = Some(self.values("mask", mask)?),
            Some(Mask::Allowed(mask)) => spans.allowed_mask = Some(self.values("mask", mask)?),
            None => {}
        }
        Ok(spans)
    }

    /// Reports a failure of the waits resolving the views asked for.
    pub fn check_waits(&self) -> Result<()> {
        #[cfg(feature = "cudarc")]
        if let Some(call) = &self.cudarc {
            return call.check_waits();
        }
        Ok(())
    }

    /// Ends the call after its launches: records the buffers' use where their owner tracks
    /// it, and reports a failure of those records.
    pub fn finish(self) -> Result<()> {
        #[cfg(feature = "cudarc")]
        if let Some(call) = self.cudarc {
            return call.finish();
        }
        Ok(())
    }
}

/// Refuses `output` where it meets any of `inputs`; `in_place` names the one input it may be
/// exactly (the same view), for operations that can run in place.
pub(crate) fn check_output(output: &Span, inputs: &[Span], in_place: Option<&Span>) -> Result<()> {
    for input in inputs {
        if in_place.is_some_and(|allowed| allowed.same_view(input) && output.same_view(input)) {
            continue;
        }
        check_disjoint(output.what, output.range(), input.what, input.range())?;
    }
    Ok(())
}

/// Refuses an output whose bytes `[start, start + len)` meet those of an input.
pub(crate) fn check_disjoint(
    output_name: &'static str,
    (output, output_len): (u64, u64),
    input_name: &'static str,
    (input, input_len): (u64, u64),
) -> Result<()> {
    let meet =
        output < input.saturating_add(input_len) && input < output.saturating_add(output_len);
    if meet && output_len > 0 && input_len > 0 {
        return Err(Error::Overlap {
            output: output_name,
            input: input_name,
        });
    }
    Ok(())
}

/// Refuses `output` (named `what`) unless its shape is `input`'s.
pub(crate) fn check_shapes(input: Shape, output: Shape, what: &'static str) -> Result<()> {
    if input != output {
        return Err(Error::ShapeMismatch {
            what,
            expected: (input.rows(), input.cols()),
            actual: (output.rows(), output.cols()),
        });
    }
    Ok(())
}

/// Refuses a per-row buffer of `len` values for `rows` rows.
pub(crate) fn check_per_row(len: usize, rows: usize, what: &'static str) -> Result<()> {
    if len != rows {
        return Err(Error::PerRowLength {
            what,
            len,
            rows,
            expected: rows,
        });
    }
    Ok(())
}

/// Refuses `actual` unless it is `expected` (the element type `what` must share).
pub(crate) fn check_dtype(what: &'static str, expected: DType, actual: DType) -> Result<()> {
    if expected != actual {
        return Err(Error::ElementTypeMismatch {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

/// One checked operation call, ready to plan and enqueue.
pub(crate) struct Call {
    pub direction: Direction,
    pub input: DType,
    pub shape: Shape,
    /// Every buffer the kernels touch: the layout is the one all of them allow.
    operands: Operands,
    pub params: RowOpParams,
}

/// The buffers of one call (at most four: input, mask or gradient, output), kept inline so
/// that a call allocates nothing.
#[derive(Clone, Copy)]
struct Operands {
    items: [Operand; 4],
    len: usize,
}

impl Operands {
    fn of(first: Operand) -> Self {
        Operands {
            items: [first; 4],
            len: 1,
        }
    }

    fn push(&mut self, operand: Operand) {
        self.items[self.len] = operand;
        self.len += 1;
    }

    fn as_slice(&self) -> &[Operand] {
        &self.items[..self.len]
    }
}

impl Call {
    /// A call reading `input` with `options` (whose buffers are `buffers`).
    pub fn reading(
        direction: Direction,
        input: &Span,
        options: &Options<'_>,
        buffers: &OptionSpans,
    ) -> Call {
        let shape = input.shape;
        let mut params = RowOpParams {
            input: input.operand.address,
            input_stride: input.stride as u64,
            rows: shape.rows() as u32,
            cols: shape.cols() as u32,
            scale: options.scale,
            row_scale: buffers.row_scale.map_or(0, |s| s.operand.address),
            mask_stride: shape.cols() as u64,
            causal_period: if options.causal {
                shape.cols() as u32
            } else {
                0
            },
            masked_rows_zero: (options.masked_rows == MaskedRows::Zero) as u32,
            mode: mode::FULL,
            state_slots: 1,
            slices: 1,
            ..RowOpParams::default()
        };
        let mut operands = Operands::of(input.operand);
        if let Some(mask) = options.mask {
            params.mask_rows = (mask.len() / shape.cols()) as u32;
            let (span, address) = match (buffers.additive_mask, buffers.allowed_mask) {
                (Some(m), _) => (m, &mut params.additive_mask),
                (_, Some(m)) => (m, &mut params.allowed_mask),
                (None, None) => unreachable!("a mask's span is resolved with the options"),
            };
            *address = span.operand.address;
            // The mask is read as rows of the data's width.
            let element_bytes = span.operand.element_bytes;
            operands.push(Operand {
                address: span.operand.address,
                stride_bytes: (shape.cols() as u64).saturating_mul(u64::from(element_bytes)),
                element_bytes,
            });
        }
        let masked = options.mask.is_some() || options.causal;
        let direction = match direction {
            Direction::Forward if masked => Direction::MaskedForward,
            other => other,
        };
        Call {
            direction,
            input: input.dtype,
            shape,
            operands,
            params,
        }
    }

    /// Writes the element outputs into `output`.
    pub fn writing(mut self, output: &Span) -> Self {
        self.params.output = output.operand.address;
        self.params.output_stride = output.stride as u64;
        self.params.output_dtype = output.dtype as u32;
        self.operands.push(output.operand);
        self
    }

    pub fn operation(mut self, op: Operation) -> Self {
        self.params.op = op.code();
        self
    }

    /// Reads the incoming gradient from `dy` (backward).
    pub fn with_gradient(mut self, dy: &Span) -> Self {
        self.operands.push(dy.operand);
        self.params.grad = dy.operand.address;
        self.params.grad_stride = dy.stride as u64;
        self
    }

    fn mode(&self) -> OperationMode {
        match self.params.mode {
            mode::STATES => OperationMode::States,
            mode::APPLY_STATES => OperationMode::ApplyStates,
            _ => OperationMode::Full,
        }
    }

    pub fn layout(&self) -> Layout {
        operations::layout(
            self.input,
            self.direction,
            self.shape.cols(),
            self.operands.as_slice(),
        )
    }

    pub fn request(&self) -> Request {
        Request::Operation {
            direction: self.direction,
            input: self.input,
            mode: self.mode(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_that_meet_are_refused() {
        assert!(check_disjoint("output", (0, 16), "input", (16, 16)).is_ok());
        assert!(check_disjoint("output", (16, 16), "input", (0, 16)).is_ok());
        assert!(check_disjoint("output", (8, 16), "input", (0, 16)).is_err());
        assert!(check_disjoint("output", (0, 64), "input", (16, 4)).is_err());
        assert!(check_disjoint("output", (0, 16), "input", (0, 16)).is_err());
        assert!(check_disjoint("output", (0, 0), "input", (0, 16)).is_ok());
    }
}
