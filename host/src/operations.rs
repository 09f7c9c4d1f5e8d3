//! The operation API of [`Softmax`]: forward (softmax, log-softmax, log-sum-exp) with scales,
//! masks and strides, backward, and the partial-state API, for f32, bf16 and f16 data.
//!
//! Each public method checks every buffer against the shape, then fills one
//! [`RowOpParams`] and enqueues it on the planned kernel. Rows too many or too wide to keep
//! resident run in two launches over slices: each slice's [`RowState`] into the workspace,
//! then a pass that merges a row's states and writes.

use std::ffi::c_void;
use std::sync::Arc;

use cust::context::CurrentContext;
use cust::memory::{DeviceBuffer, DeviceSlice};
use kernels_gpu::launch::ops::{DType, Direction, PackLayout, RowOpParams, RowState, mode};

use super::Softmax;
use crate::error::{CudaContext, Error, Result};
use crate::kernels::Kernels;
use crate::op_plan::{OpLaunch, plan_op};
use crate::ops::{Element, Mask, MaskedRows, Operation, Options, Rows, RowsMut};
use crate::plan::{Launch, row_slices_launch};
use crate::shape::Shape;
use crate::variant::Variant;

/// Smallest 16-bit tensor whose softmax takes row-slices where the operation kernels would
/// slice its rows. On the H200 (bench/NOTES.md, session 12), bf16, % of copy, operation
/// kernels → row-slices: 8×128256 (2 MB) 66 → 55 and 1×1048576 (2 MB) even; 16×262144 (8.4 MB)
/// 61 → 65, 32×151936 (9.7 MB) 63 → 63.5, 128×50257 80 → 84, 64×151936 56 → 74. The cut lies
/// between, not measured closer.
const SIXTEEN_BIT_ROW_SLICES_FROM_BYTES: usize = 4 << 20;

/// Device address and row stride of one buffer an operation touches: for the alignment
/// check, and for the parameters of the buffer it writes.
#[derive(Clone, Copy)]
struct Operand {
    address: u64,
    stride_bytes: u64,
    element_bytes: u32,
}

impl Operand {
    fn of<T: cust::memory::DeviceCopy>(data: &DeviceSlice<T>, stride: usize) -> Self {
        Operand {
            address: data.as_device_ptr().as_raw(),
            stride_bytes: (stride * size_of::<T>()) as u64,
            element_bytes: size_of::<T>() as u32,
        }
    }
}

/// How 16-byte packs of `input` fit the operands of a `direction` call: every row of every
/// operand aligned for its share of a pack and `cols` a multiple of it
/// ([`PackLayout::Aligned`]); or, where the direction has peeled entries (no masks), every
/// operand 16-byte aligned with one row stride in elements, so that rows are misaligned alike
/// ([`PackLayout::Peeled`]); else one element at a time.
fn pack_layout(
    input: DType,
    direction: Direction,
    cols: usize,
    operands: &[Operand],
) -> PackLayout {
    let pack = input.vector_pack();
    let aligned = cols.is_multiple_of(pack as usize)
        && operands.iter().all(|o| {
            let align = u64::from((pack * o.element_bytes).min(16));
            o.address.is_multiple_of(align) && o.stride_bytes.is_multiple_of(align)
        });
    let stride = |o: &Operand| o.stride_bytes / u64::from(o.element_bytes);
    let peelable = PackLayout::Peeled.serves(direction)
        && operands
            .iter()
            .all(|o| o.address.is_multiple_of(16) && stride(o) == stride(&operands[0]));
    if aligned {
        PackLayout::Aligned
    } else if peelable {
        PackLayout::Peeled
    } else {
        PackLayout::Elements
    }
}

/// A plan as the benchmark reports it: the entry, and for rows cut into `slices` the slices
/// per row and whether they meet in one cooperative launch or in two launches (`split`).
fn plan_label(kernel: &str, slices: u32, split: bool) -> String {
    match (slices, split) {
        (1, _) => kernel.to_owned(),
        (_, true) => format!("{kernel} ({slices} slices per row, 2 launches)"),
        (_, false) => format!("{kernel} ({slices} slices per row, cooperative)"),
    }
}

fn check_shapes(input: Shape, output: Shape, what: &'static str) -> Result<()> {
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

/// A plan and the launch it makes, built once with the plan (kernel name included) so that
/// enqueueing formats nothing.
#[derive(Clone, Debug)]
pub(super) struct PlannedOp {
    launch: OpLaunch,
    raw: Arc<Launch>,
}

impl PlannedOp {
    fn new(launch: OpLaunch) -> Self {
        let raw = Launch {
            kernel: launch.kernel.to_string(),
            grid: launch.grid,
            block: launch.block(),
            shared_bytes: launch.shared_bytes(),
            cooperative: launch.slices > 1 && !launch.split,
            cluster: 1,
            args: Vec::new(),
        };
        PlannedOp {
            launch,
            raw: Arc::new(raw),
        }
    }
}

/// One checked operation, ready to enqueue.
struct Call {
    direction: Direction,
    input: DType,
    shape: Shape,
    layout: PackLayout,
    params: RowOpParams,
}

impl Call {
    /// Writes the element outputs into `output`, as `dtype`.
    fn writing(mut self, output: Operand, dtype: DType) -> Self {
        self.params.output = output.address;
        self.params.output_stride = output.stride_bytes / u64::from(output.element_bytes);
        self.params.output_dtype = dtype as u32;
        self
    }

    fn operation(mut self, op: Operation) -> Self {
        self.params.op = op.code();
        self
    }
}

impl Softmax {
    /// Enqueues softmax or log-softmax of each row of `input · scale + mask` into `output`.
    ///
    /// Input and output element types are independent (bf16 in, f32 out included); both may
    /// be strided. Every buffer is checked before anything is launched; empty shapes launch
    /// nothing. f32 softmax without options on contiguous rows runs [`Variant::Auto`].
    pub fn forward<I: Element, O: Element>(
        &mut self,
        op: Operation,
        input: Rows<'_, I>,
        output: RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Result<()> {
        check_shapes(input.shape, output.shape, "output")?;
        options.check(input.shape)?;
        if input.shape.is_empty() {
            return Ok(());
        }
        let contiguous = input.stride == input.shape.cols() && output.stride == output.shape.cols();
        let plain = options.row_scale.is_none()
            && options.mask.is_none()
            && !options.causal
            && options.scale == 1.0
            && options.masked_rows == MaskedRows::Nan;
        let f32_softmax =
            I::DTYPE == DType::F32 && O::DTYPE == DType::F32 && op == Operation::Softmax;
        let (input_address, output_address) = (
            input.data.as_device_ptr().as_raw(),
            output.data.as_device_ptr().as_raw(),
        );
        if f32_softmax && contiguous && plain {
            return self.run_addresses(Variant::Auto, input_address, output_address, input.shape);
        }
        if I::DTYPE == O::DTYPE && op == Operation::Softmax && contiguous && plain {
            let operands = [
                Operand::of(input.data, input.stride),
                Operand::of(output.data, output.stride),
            ];
            if let Some(launch) = self.row_slices_plan(I::DTYPE, input.shape, &operands)? {
                CurrentContext::set_current(&self.context).during("making the context current")?;
                // The row-slices launch takes both (the plan keeps its blocks resident).
                self.reserve_partials(2 * launch.grid as usize)?;
                self.reserve_barriers(launch.grid as usize)?;
                let kernels = self.op_kernels[I::DTYPE as usize]
                    .as_ref()
                    .expect("planning loaded the module");
                // SAFETY: `Rows::new`/`RowsMut::new` (or `strided`) proved each buffer holds
                // its view, and `contiguous` makes each view rows × cols elements of one type
                // with no gaps; the buffers are distinct, since `output` is borrowed mutably
                // while `input` is borrowed (in-place calls never come here). The plan is
                // `row_slices_launch`'s for this shape, type and alignment (16-byte packs only
                // where both buffers are misaligned alike), with its blocks all resident when
                // sliced; `reserve_partials` and `reserve_barriers` sized the workspace.
                return unsafe {
                    self.enqueue_in(kernels, &launch, input_address, output_address, input.shape)
                };
            }
        }
        let call = self.forward_call(op, &input, &output, options);
        self.enqueue_call(call)
    }

    /// [`Softmax::forward`] with the output written over the input.
    pub fn forward_in_place<T: Element>(
        &mut self,
        op: Operation,
        data: RowsMut<'_, T>,
        options: &Options<'_>,
    ) -> Result<()> {
        options.check(data.shape)?;
        if data.shape.is_empty() {
            return Ok(());
        }
        let output = Operand::of(data.data, data.stride);
        let input = Rows {
            data: &*data.data,
            shape: data.shape,
            stride: data.stride,
        };
        let call = self
            .reading(Direction::Forward, &input, options, [])
            .operation(op)
            .writing(output, T::DTYPE);
        self.enqueue_call(call)
    }

    /// Enqueues the log-sum-exp of each row of `input · scale + mask` into `lse` (one f32
    /// per row; `-inf` for a row masked everywhere).
    pub fn log_sum_exp<I: Element>(
        &mut self,
        input: Rows<'_, I>,
        lse: &mut DeviceSlice<f32>,
        options: &Options<'_>,
    ) -> Result<()> {
        let Some(mut call) = self.per_row_call(&input, lse.len(), "log-sum-exp output", options)?
        else {
            return Ok(());
        };
        call.params.log_sum_exp = lse.as_device_ptr().as_raw();
        self.enqueue_call(call)
    }

    /// Enqueues the gradient of softmax (`dx = y ⊙ (dy − Σ dy⊙y)`) or log-softmax
    /// (`dx = dy − e^y ⊙ Σ dy`) from the forward output `y` and the incoming gradient `dy`,
    /// times the options' scales. Masks and causality are forward options: masked elements
    /// already have `y = 0` (`-inf` for log-softmax), so they are refused here.
    pub fn backward<T: Element, O: Element>(
        &mut self,
        op: Operation,
        y: Rows<'_, T>,
        dy: Rows<'_, T>,
        dx: RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Result<()> {
        check_shapes(y.shape, dy.shape, "gradient")?;
        check_shapes(y.shape, dx.shape, "gradient output")?;
        let dx = Operand::of(dx.data, dx.stride);
        self.backward_call::<T>(op, &y, &dy, dx, O::DTYPE, options)
    }

    /// [`Softmax::backward`] with `dx` written over `dy`.
    pub fn backward_in_place<T: Element>(
        &mut self,
        op: Operation,
        y: Rows<'_, T>,
        dy: RowsMut<'_, T>,
        options: &Options<'_>,
    ) -> Result<()> {
        check_shapes(y.shape, dy.shape, "gradient")?;
        let dx = Operand::of(dy.data, dy.stride);
        let gradient = Rows {
            data: &*dy.data,
            shape: dy.shape,
            stride: dy.stride,
        };
        self.backward_call::<T>(op, &y, &gradient, dx, T::DTYPE, options)
    }

    fn backward_call<T: Element>(
        &mut self,
        op: Operation,
        y: &Rows<'_, T>,
        dy: &Rows<'_, T>,
        dx: Operand,
        dx_dtype: DType,
        options: &Options<'_>,
    ) -> Result<()> {
        options.check(y.shape)?;
        if options.mask.is_some() || options.causal {
            return Err(Error::Unsupported {
                variant: "backward".into(),
                rows: y.shape.rows(),
                cols: y.shape.cols(),
                why: "masks and causal masking are forward options (masked elements already have y = 0)".into(),
            });
        }
        if y.shape.is_empty() {
            return Ok(());
        }
        let mut call = self
            .reading(
                Direction::Backward,
                y,
                options,
                [Operand::of(dy.data, dy.stride), dx],
            )
            .operation(op)
            .writing(dx, dx_dtype);
        call.params.grad = dy.data.as_device_ptr().as_raw();
        call.params.grad_stride = dy.stride as u64;
        self.enqueue_call(call)
    }

    /// Enqueues the [`RowState`] (maximum and `Σ e^(x − max)` of `x · scale + mask`) of each
    /// row of `input` into `states`, one per row: the statistics of one slice of columns
    /// (split vocabularies, tensor parallelism). Merge the slices' states with
    /// [`crate::merge_row_states`] (host) or by passing them all to
    /// [`Softmax::normalize_with_states`].
    pub fn row_states<I: Element>(
        &mut self,
        input: Rows<'_, I>,
        states: &mut DeviceSlice<RowState>,
        options: &Options<'_>,
    ) -> Result<()> {
        let Some(mut call) = self.per_row_call(&input, states.len(), "row states", options)? else {
            return Ok(());
        };
        call.params.mode = mode::STATES;
        call.params.states = states.as_device_ptr().as_raw();
        self.enqueue_call(call)
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
        check_shapes(input.shape, output.shape, "output")?;
        options.check(input.shape)?;
        let rows = input.shape.rows();
        if rows > 0 && (states.is_empty() || !states.len().is_multiple_of(rows)) {
            return Err(Error::PerRowLength {
                what: "row states",
                len: states.len(),
                rows,
                expected: rows,
            });
        }
        if input.shape.is_empty() {
            return Ok(());
        }
        let mut call = self.forward_call(op, &input, &output, options);
        call.params.mode = mode::APPLY_STATES;
        call.params.states = states.as_device_ptr().as_raw();
        call.params.state_slots = (states.len() / rows) as u32;
        self.enqueue_call(call)
    }

    /// A forward call that writes one value per row (log-sum-exp, row states) into a buffer
    /// of `per_row_len`, after the checks both make; `None` for an empty shape.
    fn per_row_call<I: Element>(
        &self,
        input: &Rows<'_, I>,
        per_row_len: usize,
        what: &'static str,
        options: &Options<'_>,
    ) -> Result<Option<Call>> {
        options.check(input.shape)?;
        check_per_row(per_row_len, input.shape.rows(), what)?;
        if input.shape.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.reading(Direction::Forward, input, options, [])))
    }

    /// The call writing `op` of `input`'s rows into `output`.
    fn forward_call<I: Element, O: Element>(
        &self,
        op: Operation,
        input: &Rows<'_, I>,
        output: &RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Call {
        let y = Operand::of(output.data, output.stride);
        self.reading(Direction::Forward, input, options, [y])
            .operation(op)
            .writing(y, O::DTYPE)
    }

    /// A call that reads `input`; `others` are the other buffers it touches, for the
    /// alignment check.
    fn reading<I: Element>(
        &self,
        direction: Direction,
        input: &Rows<'_, I>,
        options: &Options<'_>,
        others: impl IntoIterator<Item = Operand>,
    ) -> Call {
        let operands = std::iter::once(Operand::of(input.data, input.stride)).chain(others);
        let mut call = self.call::<I>(direction, input.shape, options, operands);
        call.params.input = input.data.as_device_ptr().as_raw();
        call.params.input_stride = input.stride as u64;
        call
    }

    /// The parameters every operation shares: shape, options, and whether 16-byte packs fit
    /// all of `operands` (plus the mask).
    fn call<I: Element>(
        &self,
        direction: Direction,
        shape: Shape,
        options: &Options<'_>,
        operands: impl IntoIterator<Item = Operand>,
    ) -> Call {
        let mut params = RowOpParams {
            rows: shape.rows() as u32,
            cols: shape.cols() as u32,
            scale: options.scale,
            row_scale: options.row_scale.map_or(0, |s| s.as_device_ptr().as_raw()),
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
        let mut operands: Vec<Operand> = operands.into_iter().collect();
        if let Some(mask) = options.mask {
            params.mask_rows = (mask.len() / shape.cols()) as u32;
            match mask {
                Mask::Additive(m) => {
                    params.additive_mask = m.as_device_ptr().as_raw();
                    operands.push(Operand::of(m, shape.cols()));
                }
                Mask::Allowed(m) => {
                    params.allowed_mask = m.as_device_ptr().as_raw();
                    operands.push(Operand::of(m, shape.cols()));
                }
            }
        }
        let masked = options.mask.is_some() || options.causal;
        let direction = match direction {
            Direction::Forward if masked => Direction::MaskedForward,
            other => other,
        };
        Call {
            direction,
            input: I::DTYPE,
            shape,
            layout: pack_layout(I::DTYPE, direction, shape.cols(), &operands),
            params,
        }
    }

    /// Where softmax without options over contiguous rows of a 16-bit type runs the
    /// row-slices kernel of that type, as f32's `auto` does: where the operation kernels would
    /// cut rows into slices, on tensors of at least [`SIXTEEN_BIT_ROW_SLICES_FROM_BYTES`], and
    /// only where row-slices caches its slices (reads the input once). `None`: the operation
    /// kernels. Planned once per type, shape and alignment of the input and output `operands`.
    fn row_slices_plan(
        &mut self,
        dtype: DType,
        shape: Shape,
        [input, output]: &[Operand; 2],
    ) -> Result<Option<Arc<Launch>>> {
        let layout = pack_layout(dtype, Direction::Forward, shape.cols(), &[*input, *output]);
        // 16-byte packs wherever both rows are misaligned alike.
        let peelable = input.address.abs_diff(output.address).is_multiple_of(16);
        let key = (dtype, shape, layout, peelable);
        if let Some(plan) = self.row_slice_plans.get(&key) {
            return Ok(plan.clone());
        }
        let (rows, cols) = (shape.rows() as u32, shape.cols() as u32);
        let operations_slice = self
            .op_plan(Direction::Forward, dtype, rows, cols, layout)?
            .is_some_and(|plan| plan.launch.slices > 1);
        let large = shape.len() * dtype.bytes() as usize >= SIXTEEN_BIT_ROW_SLICES_FROM_BYTES;
        let plan = if operations_slice && large {
            let limits = super::Limits {
                info: &self.info,
                kernels: self.op_kernels[dtype as usize]
                    .as_ref()
                    .expect("op_plan loaded the module"),
            };
            match row_slices_launch(shape, dtype, peelable, &limits) {
                (launch, true) => Some(Arc::new(launch)),
                _ => None,
            }
        } else {
            None
        };
        if self.row_slice_plans.len() >= super::PLAN_CACHE_LIMIT {
            self.row_slice_plans.clear();
        }
        self.row_slice_plans.insert(key, plan.clone());
        Ok(plan)
    }

    /// The cached plan for rows of `cols` columns (`None`: no block instance launches).
    fn op_plan(
        &mut self,
        direction: Direction,
        input: DType,
        rows: u32,
        cols: u32,
        layout: PackLayout,
    ) -> Result<Option<PlannedOp>> {
        let key = (direction, input, rows, cols, layout);
        if let Some(plan) = self.op_plans.get(&key) {
            return Ok(plan.clone());
        }
        self.op_kernels(input)?;
        let limits = super::Limits {
            info: &self.info,
            kernels: self.op_kernels[input as usize]
                .as_ref()
                .expect("loaded above"),
        };
        let plan = plan_op(direction, input, rows, cols, layout, &limits).map(PlannedOp::new);
        if self.op_plans.len() >= super::PLAN_CACHE_LIMIT {
            self.op_plans.clear();
        }
        self.op_plans.insert(key, plan.clone());
        Ok(plan)
    }

    /// What a call of `direction` on `shape` over compact `buffers` launches, for the
    /// benchmark's report: the entry, and for sliced rows the slices per row and whether they
    /// meet in one cooperative launch or in two launches.
    pub(crate) fn op_plan_label<T: Element>(
        &mut self,
        operation: Operation,
        direction: Direction,
        shape: Shape,
        buffers: &[&DeviceSlice<T>],
    ) -> Result<String> {
        if let ([input, output], Direction::Forward, Operation::Softmax) =
            (buffers, direction, operation)
            && T::DTYPE != DType::F32
        {
            let operands = [input, output].map(|buffer| Operand::of(buffer, shape.cols()));
            if let Some(launch) = self.row_slices_plan(T::DTYPE, shape, &operands)? {
                let slices = launch.grid / shape.rows() as u32;
                return Ok(match slices {
                    1 => launch.kernel.clone(),
                    _ => format!("{} ({slices} slices per row)", launch.kernel),
                });
            }
        }
        // The layout exactly as a call without options over these buffers finds it.
        let operands = buffers
            .iter()
            .map(|buffer| Operand::of(buffer, shape.cols()));
        let call = self.call::<T>(direction, shape, &Options::new(), operands);
        let (rows, cols) = (shape.rows() as u32, shape.cols() as u32);
        Ok(
            match self.op_plan(call.direction, call.input, rows, cols, call.layout)? {
                None => "no kernel launches".into(),
                Some(PlannedOp { launch, .. }) => {
                    plan_label(&launch.kernel.to_string(), launch.slices, launch.split)
                }
            },
        )
    }

    /// The operation module of `input`, loaded on first use.
    fn op_kernels(&mut self, input: DType) -> Result<&Kernels> {
        let slot = &mut self.op_kernels[input as usize];
        if slot.is_none() {
            CurrentContext::set_current(&self.context).during("making the context current")?;
            *slot = Some(Kernels::load_ops(input, self.info.max_shared_per_block)?);
        }
        Ok(slot.as_ref().expect("loaded above"))
    }

    /// Enqueues a checked call: one launch, or for a split plan the slices' states into the
    /// workspace and then the writing pass that merges them.
    fn enqueue_call(&mut self, call: Call) -> Result<()> {
        CurrentContext::set_current(&self.context).during("making the context current")?;
        let (rows, cols) = (call.shape.rows() as u32, call.shape.cols() as u32);
        let plan = self
            .op_plan(call.direction, call.input, rows, cols, call.layout)?
            .ok_or_else(|| Error::Unsupported {
                variant: "operation".into(),
                rows: call.shape.rows(),
                cols: call.shape.cols(),
                why: "no operation kernel can launch on this device".into(),
            })?;
        let mut params = call.params;
        let launch = plan.launch;
        // A split plan is for rows too many and too wide to keep resident: no launch reduces
        // a whole row, so a row's states (STATES) cannot be stored in one pass.
        if launch.split && params.mode == mode::STATES {
            return Err(Error::Unsupported {
                variant: "row_states".into(),
                rows: call.shape.rows(),
                cols: call.shape.cols(),
                why: "the slice is too wide to reduce in one launch here (too many rows to keep resident at this width): split it into narrower slices and merge their states".into(),
            });
        }
        if launch.split && params.mode == mode::FULL {
            self.reserve_states(call.shape.rows() * launch.slices as usize)?;
            params.states = self.workspace.states.as_device_ptr().as_raw();
            params.state_slots = launch.slices;
            let statistics = RowOpParams {
                mode: mode::SLICE_STATES,
                ..params
            };
            self.launch_op(call.input, &plan, statistics)?;
            params.mode = mode::APPLY_STATES;
        }
        self.launch_op(call.input, &plan, params)
    }

    fn launch_op(&mut self, input: DType, plan: &PlannedOp, mut params: RowOpParams) -> Result<()> {
        let launch = plan.launch;
        params.slices = launch.slices;
        params.slice_packs = launch.slice_packs;
        if plan.raw.cooperative {
            self.reserve_partials(2 * launch.grid as usize)?;
            self.reserve_barriers(launch.grid as usize)?;
            params.partials = self.workspace.partials.as_device_ptr().as_raw();
            params.barriers = self.workspace.barriers.as_device_ptr().as_raw();
        }
        let mut argument: *mut c_void = (&mut params as *mut RowOpParams).cast();
        let kernels = self.op_kernels[input as usize]
            .as_ref()
            .expect("planning loaded the module");
        // SAFETY: every public operation checked each buffer named in `params` against the
        // shape and strides (views, masks, per-row buffers); `pack_layout` allowed 16-byte
        // packs only where every row of every operand is aligned for them, or where every
        // operand starts 16-byte aligned with one row stride and no mask buffer (rows
        // misaligned alike, their ends read one element at a time); the plan chose an
        // instance that holds the row (or slice) and, for cooperative launches, keeps every
        // block resident, with the workspace sized for its partials and barriers, and for
        // split ones for the slices' states. `params` outlives the call, which copies it.
        unsafe { kernels.launch(&plan.raw, std::slice::from_mut(&mut argument), &self.stream) }
    }

    fn reserve_states(&mut self, states: usize) -> Result<()> {
        if self.workspace.states.len() < states {
            self.synchronize()?;
            // SAFETY: any bit pattern is a valid pair of floats, and each state is stored by
            // the statistics pass before the writing pass reads it.
            self.workspace.states =
                unsafe { DeviceBuffer::uninitialized(states) }.during("growing the workspace")?;
        }
        Ok(())
    }
}
