//! The operation API of [`Softmax`]: forward (softmax, log-softmax, log-sum-exp) with scales,
//! masks and strides, backward, and the partial-state API, for f32, bf16 and f16 data.
//!
//! Each public method checks every buffer against the shape, the device and the others, then
//! fills one [`RowOpParams`] and goes through the same pipeline as `run`: a [`Request`] for
//! the operation kernels (or, for plain softmax, the dispatch that may pick the softmax
//! kernels), planned once, enqueued with the call's buffers.

use cust::memory::{DeviceCopy, DeviceSlice};
use kernels_gpu::launch::ops::{DType, Direction, RowOpParams, RowState, mode};

use super::raw::RowOutput;
use super::{CallBuffers, Softmax, address, check_disjoint};
use crate::error::{Error, Result};
use crate::plan::operations::{self, Operand};
use crate::plan::{self, Layout, OperationMode, Request};
use crate::shape::Shape;
use crate::variant::Variant;
use crate::views::{Element, Mask, MaskedRows, Operation, Options, Rows, RowsMut};

/// One buffer of a call: where it starts, how far it reaches, its row stride. Views become
/// spans as soon as they are checked, so that an in-place call (one buffer read and written)
/// never holds two references to one slice.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub what: &'static str,
    pub operand: Operand,
    pub bytes: u64,
    pub shape: Shape,
    pub stride: usize,
}

impl Span {
    /// The bytes a view of `shape` at `stride` elements covers.
    fn of<T: DeviceCopy>(
        what: &'static str,
        data: &DeviceSlice<T>,
        shape: Shape,
        stride: usize,
    ) -> Self {
        Span::raw(what, address(data), size_of::<T>() as u32, shape, stride)
    }

    /// A view of `shape` at `stride` elements of `element_bytes` each, from `address`.
    pub(super) fn raw(
        what: &'static str,
        address: u64,
        element_bytes: u32,
        shape: Shape,
        stride: usize,
    ) -> Self {
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
        }
    }

    /// A per-row buffer of `rows` elements from this span's address.
    pub(super) fn covering(self, rows: usize) -> Self {
        Span {
            bytes: (rows as u64).saturating_mul(u64::from(self.operand.element_bytes)),
            ..self
        }
    }

    /// The span of a view.
    fn of_rows<T: DeviceCopy>(what: &'static str, rows: &Rows<'_, T>) -> Self {
        Span::of(what, rows.data, rows.shape, rows.stride)
    }

    /// A whole slice.
    fn whole<T: DeviceCopy>(what: &'static str, data: &DeviceSlice<T>) -> Self {
        Span {
            bytes: (data.len() * size_of::<T>()) as u64,
            ..Span::of(what, data, Shape::EMPTY, 0)
        }
    }

    fn range(&self) -> (u64, u64) {
        (self.operand.address, self.bytes)
    }

    /// The same elements viewed the same way.
    fn same_view(&self, other: &Span) -> bool {
        self.operand.address == other.operand.address
            && self.operand.stride_bytes == other.operand.stride_bytes
            && self.operand.element_bytes == other.operand.element_bytes
            && self.bytes == other.bytes
    }
}

/// Refuses `output` where it meets any of `inputs`; `in_place` names the one input it may be
/// exactly (the same view), for operations that can run in place.
fn check_output(output: &Span, inputs: &[Span], in_place: Option<&Span>) -> Result<()> {
    for input in inputs {
        if in_place.is_some_and(|allowed| allowed.same_view(input) && output.same_view(input)) {
            continue;
        }
        check_disjoint(output.what, output.range(), input.what, input.range())?;
    }
    Ok(())
}

/// Refuses `output` (named `what`) unless its shape is `input`'s.
pub(super) fn check_shapes(input: Shape, output: Shape, what: &'static str) -> Result<()> {
    if input != output {
        return Err(Error::ShapeMismatch {
            what,
            expected: input,
            actual: output,
        });
    }
    Ok(())
}

fn check_per_row(len: usize, rows: usize, what: &'static str) -> Result<()> {
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

/// One checked operation call, ready to plan and enqueue.
struct Call {
    direction: Direction,
    input: DType,
    shape: Shape,
    /// Every buffer the kernels touch: the layout is the one all of them allow.
    operands: Operands,
    params: RowOpParams,
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
    /// A call reading `input` with `options`.
    fn reading(direction: Direction, input: &Span, dtype: DType, options: &Options<'_>) -> Call {
        let shape = input.shape;
        let mut params = RowOpParams {
            input: input.operand.address,
            input_stride: input.stride as u64,
            rows: shape.rows() as u32,
            cols: shape.cols() as u32,
            scale: options.scale,
            row_scale: options.row_scale.map_or(0, address),
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
            let operand = match mask {
                Mask::Additive(m) => {
                    params.additive_mask = address(m);
                    Span::of("mask", m, shape, shape.cols()).operand
                }
                Mask::Allowed(m) => {
                    params.allowed_mask = address(m);
                    Span::of("mask", m, shape, shape.cols()).operand
                }
            };
            operands.push(operand);
        }
        let masked = options.mask.is_some() || options.causal;
        let direction = match direction {
            Direction::Forward if masked => Direction::MaskedForward,
            other => other,
        };
        Call {
            direction,
            input: dtype,
            shape,
            operands,
            params,
        }
    }

    /// Writes the element outputs into `output`, as `dtype`.
    fn writing(mut self, output: &Span, dtype: DType) -> Self {
        self.params.output = output.operand.address;
        self.params.output_stride =
            output.operand.stride_bytes / u64::from(output.operand.element_bytes);
        self.params.output_dtype = dtype as u32;
        self.operands.push(output.operand);
        self
    }

    fn operation(mut self, op: Operation) -> Self {
        self.params.op = op.code();
        self
    }

    fn mode(&self) -> OperationMode {
        match self.params.mode {
            mode::STATES => OperationMode::States,
            mode::APPLY_STATES => OperationMode::ApplyStates,
            _ => OperationMode::Full,
        }
    }

    fn layout(&self) -> Layout {
        operations::layout(
            self.input,
            self.direction,
            self.shape.cols(),
            self.operands.as_slice(),
        )
    }

    fn request(&self) -> Request {
        Request::Operation {
            direction: self.direction,
            input: self.input,
            mode: self.mode(),
        }
    }
}

/// The spans of the options' device buffers (masks, per-row scales), which a call reads.
fn option_spans(options: &Options<'_>) -> Vec<Span> {
    let mut spans = Vec::new();
    if let Some(scales) = options.row_scale {
        spans.push(Span::whole("row scale", scales));
    }
    match options.mask {
        Some(Mask::Additive(m)) => spans.push(Span::whole("mask", m)),
        Some(Mask::Allowed(m)) => spans.push(Span::whole("mask", m)),
        None => {}
    }
    spans
}

impl Softmax {
    /// Enqueues softmax or log-softmax of each row of `input · scale + mask` into `output`.
    ///
    /// Input and output element types are independent (bf16 in, f32 out included); both may
    /// be strided. Every buffer is checked before anything is launched; empty shapes launch
    /// nothing. An output that is exactly the input (same address, stride and element size) is
    /// computed in place; one that overlaps it otherwise is refused. (The check compares the
    /// ranges of bytes the views reach, so two disjoint views interleaved in one buffer, such
    /// as column halves of a matrix at the same stride, are refused too.) f32 softmax without
    /// options on contiguous rows runs [`Variant::Auto`].
    pub fn forward<I: Element, O: Element>(
        &mut self,
        op: Operation,
        input: Rows<'_, I>,
        output: RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(input.shape, output.shape, "output")?;
        let x = Span::of_rows("input", &input);
        let y = Span::of("output", &*output.data, output.shape, output.stride);
        self.forward_spans(op, (x, I::DTYPE), (y, O::DTYPE), options)
    }

    /// [`Softmax::forward`] with the output written over the input.
    pub fn forward_in_place<T: Element>(
        &mut self,
        op: Operation,
        data: RowsMut<'_, T>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        let x = Span::of("input", &*data.data, data.shape, data.stride);
        let y = Span {
            what: "output",
            ..x
        };
        self.forward_spans(op, (x, T::DTYPE), (y, T::DTYPE), options)
    }

    /// [`Softmax::forward`] on checked views.
    pub(super) fn forward_spans(
        &mut self,
        op: Operation,
        (x, input): (Span, DType),
        (y, output): (Span, DType),
        options: &Options<'_>,
    ) -> Result<()> {
        let shape = x.shape;
        options.check(shape)?;
        if shape.is_empty() {
            return Ok(());
        }
        self.check_buffers(&y, [x], Some(&x), options)?;
        let in_place = y.same_view(&x);
        let contiguous = x.stride == shape.cols() && y.stride == shape.cols();
        let plain = options.row_scale.is_none()
            && options.mask.is_none()
            && !options.causal
            && options.scale == 1.0
            && options.masked_rows == MaskedRows::Nan;
        let plain_softmax = contiguous && plain && !in_place && op == Operation::Softmax;
        let (x_address, y_address) = (x.operand.address, y.operand.address);
        if plain_softmax && input == DType::F32 && output == DType::F32 {
            let layout = plan::pair_layout(x_address, y_address, shape.cols());
            let prepared = self.variant_plan(Variant::Auto, shape, layout)?;
            let buffers = CallBuffers {
                input: x_address,
                output: y_address,
                ..CallBuffers::default()
            };
            // SAFETY: the views proved each buffer holds rows × cols contiguous f32 of this
            // device, and the two do not overlap; the plan is `Auto`'s for this shape and
            // layout.
            return unsafe { self.enqueue(&prepared, shape, &buffers) };
        }
        let call = Call::reading(Direction::Forward, &x, input, options)
            .operation(op)
            .writing(&y, output);
        if plain_softmax && input == output {
            let request = Request::PlainSoftmax {
                dtype: input,
                peelable: x_address.abs_diff(y_address).is_multiple_of(16),
            };
            return self.enqueue_call(request, &call);
        }
        self.enqueue_call(call.request(), &call)
    }

    /// Enqueues the log-sum-exp of each row of `input · scale + mask` into `lse` (one f32
    /// per row; `-inf` for a row masked everywhere, or with no columns).
    pub fn log_sum_exp<I: Element>(
        &mut self,
        input: Rows<'_, I>,
        lse: &mut DeviceSlice<f32>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_per_row(lse.len(), input.shape.rows(), "log-sum-exp output")?;
        let output = Span::whole("log-sum-exp output", &*lse);
        let x = Span::of_rows("input", &input);
        self.per_row_spans(x, I::DTYPE, output, RowOutput::LogSumExp, options)
    }

    /// Enqueues the gradient of softmax (`dx = y ⊙ (dy − Σ dy⊙y)`) or log-softmax
    /// (`dx = dy − e^y ⊙ Σ dy`) from the forward output `y` and the incoming gradient `dy`,
    /// times the options' scales. Masks and causality are forward options: masked elements
    /// already have `y = 0` (`-inf` for log-softmax), so they are refused here. `dx` may be
    /// exactly `dy` (computed in place); any other overlap with `y` or `dy` is refused.
    pub fn backward<T: Element, O: Element>(
        &mut self,
        op: Operation,
        y: Rows<'_, T>,
        dy: Rows<'_, T>,
        dx: RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(y.shape, dy.shape, "gradient")?;
        check_shapes(y.shape, dx.shape, "gradient output")?;
        let y = Span::of_rows("forward output", &y);
        let dy = Span::of_rows("gradient", &dy);
        let dx = Span::of("gradient output", &*dx.data, dx.shape, dx.stride);
        self.backward_spans(op, (y, dy, T::DTYPE), (dx, O::DTYPE), options)
    }

    /// [`Softmax::backward`] with `dx` written over `dy`.
    pub fn backward_in_place<T: Element>(
        &mut self,
        op: Operation,
        y: Rows<'_, T>,
        dy: RowsMut<'_, T>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(y.shape, dy.shape, "gradient")?;
        let y = Span::of_rows("forward output", &y);
        let dy = Span::of("gradient", &*dy.data, dy.shape, dy.stride);
        let dx = Span {
            what: "gradient output",
            ..dy
        };
        self.backward_spans(op, (y, dy, T::DTYPE), (dx, T::DTYPE), options)
    }

    /// [`Softmax::backward`] on checked views.
    pub(super) fn backward_spans(
        &mut self,
        op: Operation,
        (y, dy, input): (Span, Span, DType),
        (dx, output): (Span, DType),
        options: &Options<'_>,
    ) -> Result<()> {
        let shape = y.shape;
        options.check(shape)?;
        if options.mask.is_some() || options.causal {
            return Err(Error::Unsupported {
                variant: "backward".into(),
                rows: shape.rows(),
                cols: shape.cols(),
                why: "masks and causal masking are forward options (masked elements already \
                      have y = 0)"
                    .into(),
            });
        }
        if shape.is_empty() {
            return Ok(());
        }
        self.check_buffers(&dx, [y, dy], Some(&dy), options)?;
        let mut call = Call::reading(Direction::Backward, &y, input, options)
            .operation(op)
            .writing(&dx, output);
        call.operands.push(dy.operand);
        call.params.grad = dy.operand.address;
        call.params.grad_stride = dy.stride as u64;
        self.enqueue_call(call.request(), &call)
    }

    /// Enqueues the [`RowState`] (maximum and `Σ e^(x − max)` of `x · scale + mask`) of each
    /// row of `input` into `states`, one per row: the statistics of one slice of columns
    /// (split vocabularies, tensor parallelism). A slice with no columns has the identity
    /// state (`max = -inf`, `sum = 0`). Merge the slices' states with
    /// [`crate::merge_row_states`] (host) or by passing them all to
    /// [`Softmax::normalize_with_states`].
    pub fn row_states<I: Element>(
        &mut self,
        input: Rows<'_, I>,
        states: &mut DeviceSlice<RowState>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_per_row(states.len(), input.shape.rows(), "row states")?;
        let output = Span::whole("row states", &*states);
        let x = Span::of_rows("input", &input);
        self.per_row_spans(x, I::DTYPE, output, RowOutput::States, options)
    }

    /// Enqueues softmax or log-softmax of `input`'s rows normalized with stored states:
    /// `states` holds `k ≥ 1` runs of one state per row (the outputs of `k`
    /// [`Softmax::row_states`] calls laid end to end), merged per row first. With
    /// the states of every slice of a row, this normalizes one slice as if the whole row had
    /// been seen. The options must be those the states were computed with.
    pub fn normalize_with_states<I: Element, O: Element>(
        &mut self,
        op: Operation,
        input: Rows<'_, I>,
        states: &DeviceSlice<RowState>,
        output: RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(input.shape, output.shape, "output")?;
        let x = Span::of_rows("input", &input);
        let y = Span::of("output", &*output.data, output.shape, output.stride);
        let states = Span::whole("row states", states);
        self.normalize_spans(op, (x, I::DTYPE), states, (y, O::DTYPE), options)
    }

    /// [`Softmax::normalize_with_states`] on checked views; `states` spans every run.
    pub(super) fn normalize_spans(
        &mut self,
        op: Operation,
        (x, input): (Span, DType),
        states: Span,
        (y, output): (Span, DType),
        options: &Options<'_>,
    ) -> Result<()> {
        let shape = x.shape;
        options.check(shape)?;
        let rows = shape.rows();
        let state_bytes = size_of::<RowState>() as u64;
        let len = (states.bytes / state_bytes) as usize;
        let state_slots = len.checked_div(rows).unwrap_or(1);
        let fits = rows == 0 || (len > 0 && len.is_multiple_of(rows));
        if !fits || u32::try_from(state_slots).is_err() {
            return Err(Error::PerRowLength {
                what: "row states",
                len,
                rows,
                expected: rows,
            });
        }
        if shape.is_empty() {
            return Ok(());
        }
        self.check_buffers(&y, [x, states], Some(&x), options)?;
        let mut call = Call::reading(Direction::Forward, &x, input, options)
            .operation(op)
            .writing(&y, output);
        call.params.mode = mode::APPLY_STATES;
        call.params.states = states.operand.address;
        call.params.state_slots = state_slots as u32;
        self.enqueue_call(call.request(), &call)
    }

    /// Log-sum-exp or row states of `x`'s rows into `output` (one element per row, its
    /// length checked by the caller); rows with no columns get `-inf` or the identity state.
    pub(super) fn per_row_spans(
        &mut self,
        x: Span,
        input: DType,
        output: Span,
        what: RowOutput,
        options: &Options<'_>,
    ) -> Result<()> {
        let shape = x.shape;
        options.check(shape)?;
        if shape.rows() == 0 {
            return Ok(());
        }
        self.check_buffers(&output, [x], None, options)?;
        let words = match what {
            RowOutput::LogSumExp => 1,
            RowOutput::States => 2,
        };
        if shape.cols() == 0 {
            return self.fill_per_row(output.operand.address, shape.rows(), words);
        }
        let mut call = Call::reading(Direction::Forward, &x, input, options);
        match what {
            RowOutput::LogSumExp => call.params.log_sum_exp = output.operand.address,
            RowOutput::States => {
                call.params.mode = mode::STATES;
                call.params.states = output.operand.address;
            }
        }
        self.enqueue_call(call.request(), &call)
    }

    /// Writes, for each of `rows` rows, `words` 32-bit words at the row's place in a per-row
    /// buffer at `address`: `-inf`, then zeros (the identity state; a log-sum-exp of `-inf`).
    fn fill_per_row(&mut self, address: u64, rows: usize, words: usize) -> Result<()> {
        const NEG_INFINITY_BITS: u32 = 0xff80_0000;
        let stream = self.target_stream();
        let pitch = 4 * words;
        // SAFETY: the caller checked that the buffer holds `words` words for each of `rows`
        // rows, on this device; both memsets stay inside it and are ordered on the stream.
        let status = unsafe {
            let mut status = cust::sys::cuMemsetD32Async(address, 0, rows * words, stream);
            if status == cust::sys::CUresult::CUDA_SUCCESS {
                status = cust::sys::cuMemsetD2D32Async(
                    address,
                    pitch,
                    NEG_INFINITY_BITS,
                    1,
                    rows,
                    stream,
                );
            }
            status
        };
        crate::device::check(status, "writing identity states")
    }

    /// Refuses an `output` or any of `inputs` (and the options' buffers) that is not device
    /// memory of this device, and an `output` that overlaps what the call reads (other than
    /// exactly `in_place`).
    fn check_buffers<const N: usize>(
        &self,
        output: &Span,
        inputs: [Span; N],
        in_place: Option<&Span>,
        options: &Options<'_>,
    ) -> Result<()> {
        let mut reads = option_spans(options);
        reads.extend(inputs);
        self.check_spans_on_device(&reads)?;
        self.check_spans_on_device(std::slice::from_ref(output))?;
        check_output(output, &reads, in_place)
    }

    /// Refuses any buffer that is not device memory of this instance's device.
    fn check_spans_on_device(&self, spans: &[Span]) -> Result<()> {
        if !self.several_devices {
            return Ok(());
        }
        let buffers: Vec<(&'static str, u64)> = spans
            .iter()
            .filter(|s| s.bytes > 0)
            .map(|s| (s.what, s.operand.address))
            .collect();
        self.check_on_device(&buffers)
    }

    /// Plans `request` for `call` and enqueues it.
    fn enqueue_call(&mut self, request: Request, call: &Call) -> Result<()> {
        let prepared = self.prepared(request, call.shape, call.layout())?;
        let buffers = CallBuffers {
            input: call.params.input,
            output: call.params.output,
            operation: call.params,
        };
        // SAFETY: every public operation checked each buffer named in `call.params` against
        // the shape and strides (views, masks, per-row buffers), on this device, and outputs
        // against inputs (disjoint, or exactly the same view where the kernels run in place);
        // `call.layout()` allows 16-byte packs only where every operand is aligned for them,
        // or where every operand starts 16-byte aligned with one row stride and no mask
        // buffer (rows misaligned alike, their ends read one element at a time); the plan is
        // the planner's for this request, shape and layout.
        unsafe { self.enqueue(&prepared, call.shape, &buffers) }
    }

    /// What a call of `direction` on `shape` over compact `buffers` launches, for the
    /// benchmark's report: the entry, and for sliced rows the slices per row and whether they
    /// meet in one cooperative launch, in clusters, or in two launches.
    #[cfg(feature = "bench")]
    pub(crate) fn op_plan_label<T: Element>(
        &mut self,
        operation: Operation,
        direction: Direction,
        shape: Shape,
        buffers: &[&DeviceSlice<T>],
    ) -> Result<String> {
        let _context = self.enter()?;
        let operands: Vec<Operand> = buffers
            .iter()
            .map(|b| Span::of("buffer", *b, shape, shape.cols()).operand)
            .collect();
        let layout = operations::layout(T::DTYPE, direction, shape.cols(), &operands);
        let request = match (buffers, direction, operation) {
            ([input, output], Direction::Forward, Operation::Softmax) if T::DTYPE != DType::F32 => {
                Request::PlainSoftmax {
                    dtype: T::DTYPE,
                    peelable: address(*input).abs_diff(address(*output)) % 16 == 0,
                }
            }
            _ => Request::Operation {
                direction,
                input: T::DTYPE,
                mode: OperationMode::Full,
            },
        };
        let prepared = self.prepared(request, shape, layout)?;
        let first = prepared.launches[0];
        let slices = first.grid / u32::try_from(shape.rows()).unwrap_or(u32::MAX).max(1);
        let two_launches = prepared.launches.len() > 1;
        let slicing = match (slices, two_launches) {
            (0 | 1, _) => vec![],
            (_, true) => vec![format!("{slices} slices per row"), "2 launches".into()],
            (_, false) => std::iter::once(format!("{slices} slices per row"))
                .chain(first.scheduling_details())
                .collect(),
        };
        Ok(first.label(&slicing))
    }
}
