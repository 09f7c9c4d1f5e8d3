//! The operations: forward (softmax, log-softmax, log-sum-exp) with scales, masks and
//! strides, backward, and the partial-state API, for f32, bf16 and f16 data, over views of
//! any kind of buffer and on any stream.
//!
//! Each public method resolves its views on the call's stream (`call::Frame`), checks every
//! buffer against the shape, the device and the others, then fills one [`Call`] and goes
//! through the one pipeline: a [`Request`] (the operation kernels, or for plain softmax the
//! dispatch that may pick the f32 softmax kernels), planned once, enqueued with the call's
//! buffers.

use kernels_gpu::launch::ops::{DType, Direction, RowState, mode};

use super::Softmax;
use super::call::{
    Call, Frame, OptionSpans, Span, check_dtype, check_output, check_per_row, check_shapes,
};
use super::options::Options;
use super::views::{Operation, Rows, RowsMut, Value, Values, ValuesMut};
use crate::error::{Error, Result};
use crate::plan::{self, Request};
use crate::runtime::CallBuffers;
use crate::variant::Variant;

/// What a per-row call writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowOutput {
    LogSumExp,
    States,
}

impl RowOutput {
    fn name(self) -> &'static str {
        match self {
            RowOutput::LogSumExp => "log-sum-exp output",
            RowOutput::States => "row states",
        }
    }
}

impl Softmax {
    /// Enqueues softmax or log-softmax of each row of `input · scale + mask` into `output`.
    ///
    /// Input and output element types are independent (bf16 in, f32 out included); both may
    /// be strided. Every buffer is checked before anything is launched; empty shapes launch
    /// nothing. An output that is exactly the input (same address, stride and element size,
    /// which only raw views can express; see [`Softmax::forward_in_place`]) is computed in
    /// place; one that overlaps it otherwise is refused. (The check compares the ranges of
    /// bytes the views reach, so two disjoint views interleaved in one buffer, such as column
    /// halves of a matrix at the same stride, are refused too.) f32 softmax without options
    /// on contiguous rows runs the options' [`Variant`] ([`Variant::Auto`] by default).
    pub fn forward(
        &mut self,
        op: Operation,
        input: Rows<'_>,
        mut output: RowsMut<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(input.shape, output.shape, "output")?;
        let mut frame = self.frame(options)?;
        let x = frame.rows("input", &input)?;
        let y = frame.rows_mut("output", &mut output)?;
        self.launch_framed(frame, options, |s, buffers| {
            s.forward_spans(op, x, y, options, buffers)
        })
    }

    /// [`Softmax::forward`] with the output written over the input.
    pub fn forward_in_place(
        &mut self,
        op: Operation,
        mut data: RowsMut<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        let mut frame = self.frame(options)?;
        let x = frame.rows_mut("input", &mut data)?;
        let y = x.named("output");
        self.launch_framed(frame, options, |s, buffers| {
            s.forward_spans(op, x, y, options, buffers)
        })
    }

    /// Enqueues the log-sum-exp of each row of `input · scale + mask` into `lse` (one f32
    /// per row; `-inf` for a row masked everywhere, or with no columns).
    pub fn log_sum_exp<'l>(
        &mut self,
        input: Rows<'_>,
        lse: impl Into<ValuesMut<'l, f32>>,
        options: &Options<'_>,
    ) -> Result<()> {
        self.per_row(input, lse.into(), RowOutput::LogSumExp, options)
    }

    /// Enqueues the gradient of softmax (`dx = y ⊙ (dy − Σ dy⊙y)`) or log-softmax
    /// (`dx = dy − e^y ⊙ Σ dy`) from the forward output `y` and the incoming gradient `dy`
    /// (of `y`'s element type), times the options' scales. Masks and causality are forward
    /// options: masked elements already have `y = 0` (`-inf` for log-softmax), so they are
    /// refused here. `dx` may be exactly `dy` (computed in place, see
    /// [`Softmax::backward_in_place`]); any other overlap with `y` or `dy` is refused.
    pub fn backward(
        &mut self,
        op: Operation,
        y: Rows<'_>,
        dy: Rows<'_>,
        mut dx: RowsMut<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(y.shape, dy.shape, "gradient")?;
        check_shapes(y.shape, dx.shape, "gradient output")?;
        check_dtype("gradient", y.dtype, dy.dtype)?;
        let mut frame = self.frame(options)?;
        let y = frame.rows("forward output", &y)?;
        let dy = frame.rows("gradient", &dy)?;
        let dx = frame.rows_mut("gradient output", &mut dx)?;
        self.launch_framed(frame, options, |s, buffers| {
            s.backward_spans(op, (y, dy), dx, options, buffers)
        })
    }

    /// [`Softmax::backward`] with `dx` written over `dy`.
    pub fn backward_in_place(
        &mut self,
        op: Operation,
        y: Rows<'_>,
        mut dy: RowsMut<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_shapes(y.shape, dy.shape, "gradient")?;
        check_dtype("gradient", y.dtype, dy.dtype)?;
        let mut frame = self.frame(options)?;
        let y = frame.rows("forward output", &y)?;
        let dy = frame.rows_mut("gradient", &mut dy)?;
        let dx = dy.named("gradient output");
        self.launch_framed(frame, options, |s, buffers| {
            s.backward_spans(op, (y, dy), dx, options, buffers)
        })
    }

    /// Enqueues the [`RowState`] (maximum and `Σ e^(x − max)` of `x · scale + mask`) of each
    /// row of `input` into `states`, one per row: the statistics of one slice of columns
    /// (split vocabularies, tensor parallelism). A slice with no columns has the identity
    /// state (`max = -inf`, `sum = 0`). Merge the slices' states with
    /// [`merge_row_states`](super::views::merge_row_states) (host) or by passing them all to
    /// [`Softmax::normalize_with_states`].
    pub fn row_states<'s>(
        &mut self,
        input: Rows<'_>,
        states: impl Into<ValuesMut<'s, RowState>>,
        options: &Options<'_>,
    ) -> Result<()> {
        self.per_row(input, states.into(), RowOutput::States, options)
    }

    /// [`Softmax::log_sum_exp`] or [`Softmax::row_states`]: one value per row into `output`.
    fn per_row<T: Value>(
        &mut self,
        input: Rows<'_>,
        mut output: ValuesMut<'_, T>,
        what: RowOutput,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        check_per_row(output.len, input.shape.rows(), what.name())?;
        let mut frame = self.frame(options)?;
        let x = frame.rows("input", &input)?;
        let output = frame.values_mut(what.name(), &mut output)?;
        self.launch_framed(frame, options, |s, buffers| {
            s.per_row_spans(x, output, what, options, buffers)
        })
    }

    /// Resolves the options' buffers in `frame`, reports a failure of the waits resolving
    /// the views asked for, runs `call` on the frame's stream, and ends the frame.
    fn launch_framed<'r>(
        &mut self,
        mut frame: Frame<'r>,
        options: &Options<'r>,
        call: impl FnOnce(&mut Self, &OptionSpans) -> Result<()>,
    ) -> Result<()> {
        let buffers = frame.options(options)?;
        frame.check_waits()?;
        let done = self.with_stream(frame.stream, |s| call(s, &buffers));
        done.and(frame.finish())
    }

    /// Enqueues softmax or log-softmax of `input`'s rows normalized with stored states:
    /// `states` holds `k ≥ 1` runs of one state per row (the outputs of `k`
    /// [`Softmax::row_states`] calls laid end to end), merged per row first. With
    /// the states of every slice of a row, this normalizes one slice as if the whole row had
    /// been seen. The options must be those the states were computed with.
    pub fn normalize_with_states<'s>(
        &mut self,
        op: Operation,
        input: Rows<'_>,
        states: impl Into<Values<'s, RowState>>,
        mut output: RowsMut<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        let states = states.into();
        check_shapes(input.shape, output.shape, "output")?;
        let mut frame = self.frame(options)?;
        let x = frame.rows("input", &input)?;
        let states = frame.values("row states", &states)?;
        let y = frame.rows_mut("output", &mut output)?;
        self.launch_framed(frame, options, |s, buffers| {
            s.normalize_spans(op, x, states, y, options, buffers)
        })
    }

    /// [`Softmax::forward`] on resolved views.
    fn forward_spans(
        &mut self,
        op: Operation,
        x: Span,
        y: Span,
        options: &Options<'_>,
        buffers: &OptionSpans,
    ) -> Result<()> {
        let shape = x.shape;
        options.check(shape)?;
        let contiguous = x.stride == shape.cols() && y.stride == shape.cols();
        let in_place = y.same_view(&x);
        let plain_softmax =
            contiguous && options.is_plain() && !in_place && op == Operation::Softmax;
        let f32_softmax = plain_softmax && x.dtype == DType::F32 && y.dtype == DType::F32;
        if options.variant != Variant::Auto && !f32_softmax {
            return Err(Error::Unsupported {
                variant: options.variant.to_string(),
                rows: shape.rows(),
                cols: shape.cols(),
                why: "a variant other than Auto runs f32 softmax of contiguous, distinct rows \
                      without other options"
                    .into(),
            });
        }
        if shape.is_empty() {
            return Ok(());
        }
        self.check_buffers(&y, [x], Some(&x), buffers)?;
        let (x_address, y_address) = (x.operand.address, y.operand.address);
        if f32_softmax {
            let layout = plan::pair_layout(x_address, y_address, shape.cols());
            let variant = self.resolve_variant(options.variant, shape, x_address, y_address)?;
            let prepared = self.variant_plan(variant, shape, layout)?;
            let buffers = CallBuffers {
                input: x_address,
                output: y_address,
                ..CallBuffers::default()
            };
            // SAFETY: the views proved each buffer holds rows × cols contiguous f32 of this
            // device, and the two do not overlap; the plan is the variant's for this shape and
            // layout.
            return unsafe { self.enqueue(&prepared, shape, &buffers) };
        }
        let call = Call::reading(Direction::Forward, &x, options, buffers)
            .operation(op)
            .writing(&y);
        if plain_softmax && x.dtype == y.dtype {
            let request = Request::PlainSoftmax {
                dtype: x.dtype,
                peelable: x_address.abs_diff(y_address).is_multiple_of(16),
            };
            return self.enqueue_call(request, &call);
        }
        self.enqueue_call(call.request(), &call)
    }

    /// [`Softmax::backward`] on resolved views.
    fn backward_spans(
        &mut self,
        op: Operation,
        (y, dy): (Span, Span),
        dx: Span,
        options: &Options<'_>,
        buffers: &OptionSpans,
    ) -> Result<()> {
        let shape = y.shape;
        options.check(shape)?;
        if options.mask.is_some() || options.causal || options.variant != Variant::Auto {
            return Err(Error::Unsupported {
                variant: "backward".into(),
                rows: shape.rows(),
                cols: shape.cols(),
                why: "masks and causal masking are forward options (masked elements already \
                      have y = 0), and variants choose f32 softmax kernels"
                    .into(),
            });
        }
        if shape.is_empty() {
            return Ok(());
        }
        self.check_buffers(&dx, [y, dy], Some(&dy), buffers)?;
        let call = Call::reading(Direction::Backward, &y, options, buffers)
            .operation(op)
            .writing(&dx)
            .with_gradient(&dy);
        self.enqueue_call(call.request(), &call)
    }

    /// [`Softmax::normalize_with_states`] on resolved views; `states` spans every run.
    fn normalize_spans(
        &mut self,
        op: Operation,
        x: Span,
        states: Span,
        y: Span,
        options: &Options<'_>,
        buffers: &OptionSpans,
    ) -> Result<()> {
        let shape = x.shape;
        options.check(shape)?;
        refuse_variant(options, shape, "normalize with states")?;
        let rows = shape.rows();
        let len = states.len();
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
        self.check_buffers(&y, [x, states], Some(&x), buffers)?;
        let mut call = Call::reading(Direction::Forward, &x, options, buffers)
            .operation(op)
            .writing(&y);
        call.params.mode = mode::APPLY_STATES;
        call.params.states = states.operand.address;
        call.params.state_slots = state_slots as u32;
        self.enqueue_call(call.request(), &call)
    }

    /// Log-sum-exp or row states of `x`'s rows into `output` (one value per row, its length
    /// checked by the caller); rows with no columns get `-inf` or the identity state.
    fn per_row_spans(
        &mut self,
        x: Span,
        output: Span,
        what: RowOutput,
        options: &Options<'_>,
        buffers: &OptionSpans,
    ) -> Result<()> {
        let shape = x.shape;
        options.check(shape)?;
        refuse_variant(options, shape, "per-row outputs")?;
        if shape.rows() == 0 {
            return Ok(());
        }
        self.check_buffers(&output, [x], None, buffers)?;
        let words = match what {
            RowOutput::LogSumExp => 1,
            RowOutput::States => 2,
        };
        if shape.cols() == 0 {
            let stream = self.target_stream();
            // SAFETY: `output` holds one value (of `words` words) per row, on this device
            // (checked); the fill is ordered on the call's stream.
            return unsafe {
                crate::runtime::driver::fill_identity_states(
                    output.operand.address,
                    shape.rows(),
                    words,
                    stream,
                )
            };
        }
        let mut call = Call::reading(Direction::Forward, &x, options, buffers);
        match what {
            RowOutput::LogSumExp => call.params.log_sum_exp = output.operand.address,
            RowOutput::States => {
                call.params.mode = mode::STATES;
                call.params.states = output.operand.address;
            }
        }
        self.enqueue_call(call.request(), &call)
    }

    /// Refuses an `output` or any of `inputs` (and the options' buffers) that is not device
    /// memory of this device, and an `output` that overlaps what the call reads (other than
    /// exactly `in_place`).
    fn check_buffers<const N: usize>(
        &self,
        output: &Span,
        inputs: [Span; N],
        in_place: Option<&Span>,
        buffers: &OptionSpans,
    ) -> Result<()> {
        let reads: Vec<Span> = buffers.iter().chain(inputs).collect();
        let on_device: Vec<(&'static str, u64)> = reads
            .iter()
            .chain([output])
            .filter(|s| s.bytes > 0)
            .map(|s| (s.what, s.operand.address))
            .collect();
        self.runtime.check_on_device(&on_device)?;
        check_output(output, &reads, in_place)
    }

    /// Plans `request` for `call` and enqueues it.
    fn enqueue_call(&mut self, request: Request, call: &Call) -> Result<()> {
        let prepared = self.prepared(request, call.shape, call.layout())?;
        let buffers = CallBuffers {
            input: call.params.input,
            output: call.params.output,
            operation: call.params,
            ..CallBuffers::default()
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
}

/// Refuses a variant other than `Auto` for a call that never runs the f32 softmax kernels.
fn refuse_variant(options: &Options<'_>, shape: crate::shape::Shape, what: &str) -> Result<()> {
    if options.variant != Variant::Auto {
        return Err(Error::Unsupported {
            variant: options.variant.to_string(),
            rows: shape.rows(),
            cols: shape.cols(),
            why: format!("variants choose f32 softmax kernels; {what} take none"),
        });
    }
    Ok(())
}
