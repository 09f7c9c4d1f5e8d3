//! What an operation kernel does to one row, apart from how threads share the row: read a
//! pack of columns (applying scale and masks), reduce the packs to a [`Partial`] result,
//! and write a pack of outputs from the row's result. [`Forward`] is softmax, log-softmax and
//! log-sum-exp; [`Backward`] their gradients. The layouts in [`crate::op_templates`] run
//! either.

use core::marker::PhantomData;

use crate::device::{DeviceExp2, exp2_approx, log2_approx};
use crate::element::{Element, load, load_f32, store_as};
use crate::online::{LOG2_E, OnlineStats};
use crate::reduce::{Partial, Sum};
use crate::row_ops::{DType, RowOpParams, RowState, op};

/// One row's work, with `PACK` columns per load.
pub trait RowKernel<const PACK: usize>: Sized {
    /// What one pack of columns keeps in registers between the reduction and the writes.
    type Values: Copy;
    type Stats: Partial;
    /// Per-row constants the writes need, derived once from the row's result.
    type Finished: Copy;
    /// The values of a pack past the row's end: neutral for the reduction.
    const PAD: Self::Values;

    /// # Safety
    /// `row < params.rows`, and `params` satisfies the operation kernels' contract.
    unsafe fn for_row(params: &RowOpParams, row: usize) -> Self;

    /// # Safety
    /// `col..col + PACK` lies in the row and is aligned as the launch's layout promises.
    unsafe fn load(&self, col: usize) -> Self::Values;

    /// This thread's result over its packs.
    fn partial<const PACKS: usize>(&self, packs: &[Self::Values; PACKS]) -> Self::Stats;

    fn finish(&self, row: Self::Stats) -> Self::Finished;

    /// # Safety
    /// As [`RowKernel::load`].
    unsafe fn write(&self, col: usize, values: Self::Values, row: Self::Finished);

    /// Per-row outputs; called by one thread of the row.
    ///
    /// # Safety
    /// As [`RowKernel::for_row`].
    unsafe fn write_row(&self, row: Self::Stats);
}

/// Element address of row `row` of a buffer with `stride` elements per row.
#[inline(always)]
fn row_start(base: u64, row: usize, stride: u64, dtype: DType) -> u64 {
    base + row as u64 * stride * dtype.bytes() as u64
}

/// Stores `stats` as the row's state in slot `params.state_slot`: slots are consecutive runs
/// of `rows` states (slot-major, as states gathered from several slices or devices lie).
///
/// # Safety
/// `params.states` holds `rows · state_slots` [`RowState`]s and `row < rows`.
#[inline(always)]
pub unsafe fn store_state<S: Partial>(params: &RowOpParams, row: usize, stats: S) {
    let [max, sum] = stats.to_floats();
    let slot = params.state_slot as usize * params.rows as usize + row;
    // SAFETY: forwarded from the contract.
    unsafe {
        (params.states as *mut RowState)
            .add(slot)
            .write(RowState { max, sum })
    };
}

/// Merges the `state_slots` stored states of `row`.
///
/// # Safety
/// As [`store_state`].
#[inline(always)]
pub unsafe fn merged_states<S: Partial>(params: &RowOpParams, row: usize) -> S {
    let rows = params.rows as usize;
    let mut merged = S::EMPTY;
    for slot in 0..params.state_slots as usize {
        // SAFETY: forwarded from the contract.
        let state = unsafe {
            (params.states as *const RowState)
                .add(slot * rows + row)
                .read()
        };
        merged = merged.merge(S::from_floats([state.max, state.sum]));
    }
    merged
}

/// `ln x` from the special-function unit's `log2`.
#[inline(always)]
fn ln(x: f32) -> f32 {
    log2_approx(x) * core::f32::consts::LN_2
}

/// Softmax, log-softmax and log-sum-exp of `x · scale · row_scale + masks`.
pub struct Forward<In> {
    x: *const In,
    y: u64,
    output_dtype: u32,
    log: bool,
    zero_masked_rows: bool,
    scale: f32,
    additive_mask: *const f32,
    allowed_mask: *const u8,
    /// Last unmasked column of the full row under the causal mask (`usize::MAX`: none).
    causal_last: usize,
    first_column: usize,
    log_sum_exp: *mut f32,
}

/// What the forward writes need of the row: its maximum, `1 / sum`, `ln sum`, and whether
/// the row is masked everywhere and the caller asked for zeros there.
#[derive(Clone, Copy)]
pub struct ForwardFinished {
    max: f32,
    inv_sum: f32,
    ln_sum: f32,
    zero: bool,
}

impl<In: Element, const PACK: usize> RowKernel<PACK> for Forward<In> {
    type Values = [f32; PACK];
    type Stats = OnlineStats;
    type Finished = ForwardFinished;
    const PAD: [f32; PACK] = [f32::NEG_INFINITY; PACK];

    #[inline(always)]
    unsafe fn for_row(p: &RowOpParams, row: usize) -> Self {
        let mask_row = if p.mask_rows == 0 {
            0
        } else {
            row % p.mask_rows as usize
        };
        let mask_offset = mask_row * p.mask_stride as usize;
        let row_scale = if p.row_scale == 0 {
            1.0
        } else {
            // SAFETY: the row-scale buffer holds `rows` floats.
            unsafe { (p.row_scale as *const f32).add(row).read() }
        };
        let optional = |base: u64, offset: usize| {
            (base != 0).then_some(row_start(base, offset, 1, DType::F32))
        };
        Forward {
            x: row_start(p.input, row, p.input_stride, In::DTYPE) as *const In,
            y: if p.output == 0 {
                0
            } else {
                row_start(p.output, row, p.output_stride, output_dtype(p))
            },
            output_dtype: p.output_dtype,
            log: p.op == op::LOG_SOFTMAX,
            zero_masked_rows: p.masked_rows_zero != 0,
            scale: p.scale * row_scale,
            additive_mask: optional(p.additive_mask, mask_offset)
                .map_or(core::ptr::null(), |a| a as *const f32),
            allowed_mask: if p.allowed_mask == 0 {
                core::ptr::null()
            } else {
                (p.allowed_mask + mask_offset as u64) as *const u8
            },
            causal_last: if p.causal_period == 0 {
                usize::MAX
            } else {
                row % p.causal_period as usize
            },
            first_column: p.first_column as usize,
            log_sum_exp: if p.log_sum_exp == 0 {
                core::ptr::null_mut()
            } else {
                // SAFETY: the log-sum-exp buffer holds `rows` floats.
                unsafe { (p.log_sum_exp as *mut f32).add(row) }
            },
        }
    }

    #[inline(always)]
    unsafe fn load(&self, col: usize) -> [f32; PACK] {
        // SAFETY: the caller guarantees the pack lies in the row, aligned as the layout says.
        let mut values = unsafe { load_f32::<In, PACK>(self.x as u64, col) };
        for value in values.iter_mut() {
            *value *= self.scale;
        }
        if !self.additive_mask.is_null() {
            // SAFETY: mask rows have `cols` elements, aligned like the input's.
            let mask = unsafe { load::<f32, PACK>(self.additive_mask.add(col)) };
            for k in 0..PACK {
                values[k] += mask[k];
            }
        }
        if !self.allowed_mask.is_null() {
            // SAFETY: as above.
            let allowed = unsafe { load::<u8, PACK>(self.allowed_mask.add(col)) };
            for k in 0..PACK {
                if allowed[k] == 0 {
                    values[k] = f32::NEG_INFINITY;
                }
            }
        }
        let first = self.first_column + col;
        if first + PACK - 1 > self.causal_last {
            for (k, value) in values.iter_mut().enumerate() {
                if first + k > self.causal_last {
                    *value = f32::NEG_INFINITY;
                }
            }
        }
        values
    }

    #[inline(always)]
    fn partial<const PACKS: usize>(&self, packs: &[[f32; PACK]; PACKS]) -> OnlineStats {
        let mut max = f32::NEG_INFINITY;
        for pack in packs {
            for &value in pack {
                max = max.max(value);
            }
        }
        let mut sum = 0.0;
        for pack in packs {
            for &value in pack {
                sum += OnlineStats::exp_relative::<DeviceExp2>(value, max);
            }
        }
        OnlineStats::new(max, sum)
    }

    #[inline(always)]
    fn finish(&self, row: OnlineStats) -> ForwardFinished {
        let sum = row.sum();
        ForwardFinished {
            max: row.max,
            inv_sum: 1.0 / sum,
            ln_sum: ln(sum),
            zero: self.zero_masked_rows && row.max == f32::NEG_INFINITY,
        }
    }

    #[inline(always)]
    unsafe fn write(&self, col: usize, values: [f32; PACK], row: ForwardFinished) {
        if self.y == 0 {
            return;
        }
        let outputs = if row.zero {
            [if self.log { f32::NEG_INFINITY } else { 0.0 }; PACK]
        } else if self.log {
            values.map(|v| v - row.max - row.ln_sum)
        } else {
            values.map(|v| OnlineStats::exp_relative::<DeviceExp2>(v, row.max) * row.inv_sum)
        };
        // SAFETY: the caller guarantees the pack lies in the row; the output row is aligned
        // like the input's.
        unsafe { store_as::<PACK>(self.output_dtype, self.y, col, outputs) };
    }

    #[inline(always)]
    unsafe fn write_row(&self, row: OnlineStats) {
        if !self.log_sum_exp.is_null() {
            let value = if row.max == f32::NEG_INFINITY {
                f32::NEG_INFINITY
            } else {
                row.max + ln(row.sum())
            };
            // SAFETY: `for_row` pointed it at this row's float.
            unsafe { self.log_sum_exp.write(value) };
        }
    }
}

/// The output element type of a launch.
#[inline(always)]
fn output_dtype(p: &RowOpParams) -> DType {
    match p.output_dtype {
        1 => DType::Bf16,
        2 => DType::F16,
        _ => DType::F32,
    }
}

/// Gradients: softmax `dx = y ⊙ (dy − Σ dy⊙y)`, log-softmax `dx = dy − e^y ⊙ Σ dy`, each
/// times `scale · row_scale` (the gradient with respect to the unscaled scores).
pub struct Backward<In> {
    y: *const In,
    dy: *const In,
    dx: u64,
    output_dtype: u32,
    log: bool,
    scale: f32,
    _input: PhantomData<In>,
}

impl<In: Element, const PACK: usize> RowKernel<PACK> for Backward<In> {
    type Values = ([f32; PACK], [f32; PACK]);
    type Stats = Sum;
    type Finished = f32;
    const PAD: Self::Values = ([0.0; PACK], [0.0; PACK]);

    #[inline(always)]
    unsafe fn for_row(p: &RowOpParams, row: usize) -> Self {
        let row_scale = if p.row_scale == 0 {
            1.0
        } else {
            // SAFETY: the row-scale buffer holds `rows` floats.
            unsafe { (p.row_scale as *const f32).add(row).read() }
        };
        Backward {
            y: row_start(p.input, row, p.input_stride, In::DTYPE) as *const In,
            dy: row_start(p.grad, row, p.grad_stride, In::DTYPE) as *const In,
            dx: row_start(p.output, row, p.output_stride, output_dtype(p)),
            output_dtype: p.output_dtype,
            log: p.op == op::LOG_SOFTMAX,
            scale: p.scale * row_scale,
            _input: PhantomData,
        }
    }

    #[inline(always)]
    unsafe fn load(&self, col: usize) -> Self::Values {
        // SAFETY: the caller guarantees the pack lies in both rows, aligned.
        unsafe {
            (
                load_f32::<In, PACK>(self.y as u64, col),
                load_f32::<In, PACK>(self.dy as u64, col),
            )
        }
    }

    #[inline(always)]
    fn partial<const PACKS: usize>(&self, packs: &[Self::Values; PACKS]) -> Sum {
        let mut sum = 0.0;
        for (y, dy) in packs {
            for k in 0..PACK {
                // Log-softmax needs Σ dy; softmax Σ dy·y. The branch is uniform.
                sum += if self.log { dy[k] } else { dy[k] * y[k] };
            }
        }
        Sum(sum)
    }

    #[inline(always)]
    fn finish(&self, row: Sum) -> f32 {
        row.0
    }

    #[inline(always)]
    unsafe fn write(&self, col: usize, (y, dy): Self::Values, sum: f32) {
        let mut dx = [0.0; PACK];
        for k in 0..PACK {
            dx[k] = self.scale
                * if self.log {
                    dy[k] - exp2_approx(y[k] * LOG2_E) * sum
                } else {
                    y[k] * (dy[k] - sum)
                };
        }
        // SAFETY: the caller guarantees the pack lies in the row, aligned.
        unsafe { store_as::<PACK>(self.output_dtype, self.dx, col, dx) };
    }

    #[inline(always)]
    unsafe fn write_row(&self, _row: Sum) {}
}
