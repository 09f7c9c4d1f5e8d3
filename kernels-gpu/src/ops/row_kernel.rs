//! What an operation kernel does to one row, apart from how threads share the row: read a
//! pack of columns (applying scale and masks), reduce the packs to a [`Partial`] result,
//! and write a pack of outputs from the row's result. [`Forward`] and [`MaskedForward`] are
//! softmax, log-softmax and log-sum-exp; [`Backward`] their gradients. The layouts in [`crate::ops::op_templates`] run
//! either.

use core::marker::PhantomData;

use crate::launch::ops::{DType, RowOpParams, RowState, op};
use crate::primitives::device::{
    DeviceExp2, block_dim, exp2_approx, log2_approx, reciprocal_approx, thread_idx,
};
use crate::primitives::element::{Element, load, store_as};
use crate::primitives::online::{LOG2_E, OnlineStats};
use crate::primitives::reduce::{
    Max, Partial, Sum, block_reduce, group_max, group_reduce, group_sum,
};
use crate::primitives::row_part::unaligned_head;

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

    /// This thread's result over its packs; may rewrite the packs into what
    /// [`RowKernel::write`] needs (the forward softmax keeps the exponentials).
    fn partial<const PACKS: usize>(&self, packs: &mut [Self::Values; PACKS]) -> Self::Stats;

    /// The row's result over each aligned group of `LANES` lanes (every lane of the group
    /// gets it) and this thread's own partial result. All 32 lanes call it.
    #[inline(always)]
    fn group_partial<const PACKS: usize, const LANES: u32>(
        &self,
        packs: &mut [Self::Values; PACKS],
    ) -> (Self::Stats, Self::Stats) {
        let mine = self.partial(packs);
        (group_reduce::<Self::Stats, LANES>(mine), mine)
    }

    /// The result over the whole block (every thread gets it) and this thread's own partial
    /// result.
    ///
    /// # Safety
    /// As [`block_reduce`]: all threads of the block, uniform control flow.
    #[inline(always)]
    unsafe fn block_partial<const PACKS: usize>(
        &self,
        packs: &mut [Self::Values; PACKS],
        scratch: *mut f32,
    ) -> (Self::Stats, Self::Stats) {
        let mine = self.partial(packs);
        // SAFETY: forwarded from the contract.
        (unsafe { block_reduce(mine, scratch) }, mine)
    }

    /// The per-row constants of this thread's writes, from the row's result and this
    /// thread's own partial result.
    fn finish(&self, row: Self::Stats, mine: Self::Stats) -> Self::Finished;

    /// Writes the outputs of the pack at `col`: all of them, or with `run = Some(count)` the
    /// first `count`, one at a time (a row's unaligned end, read by
    /// [`PeelableRow::load_run`]).
    ///
    /// # Safety
    /// As [`RowKernel::load`], or for a run as [`PeelableRow::load_run`].
    unsafe fn write(
        &self,
        col: usize,
        run: Option<usize>,
        values: Self::Values,
        row: Self::Finished,
    );

    /// Per-row outputs; called by one thread of the row.
    ///
    /// # Safety
    /// As [`RowKernel::for_row`].
    unsafe fn write_row(&self, row: Self::Stats);
}

/// A row kernel that can also read a row's unaligned ends one element at a time (its
/// [`RowKernel::write`] writes them back with `run`), for rows that need not start on a
/// 16-byte boundary (see [`crate::primitives::row_part`]). The masked forward is not one: its mask rows
/// are laid out independently of the input's.
pub trait PeelableRow<const PACK: usize>: RowKernel<PACK> {
    /// Elements of the row's input before its first 16-byte boundary.
    fn head(&self) -> usize;

    /// `count` (< `PACK`) elements from column `start`, read one at a time into a pack whose
    /// other slots are padding.
    ///
    /// # Safety
    /// `start..start + count` lies in the row.
    unsafe fn load_run(&self, start: usize, count: usize) -> Self::Values;
}

/// Stores `outputs` as `dtype` (a [`DType`] as `u32`) at column `col` of the row at `base`:
/// the whole pack, or with `run = Some(count)` its first `count` elements one at a time.
///
/// # Safety
/// As [`store_as`] for the pack, or for each element of the run.
#[inline(always)]
unsafe fn store_outputs<const PACK: usize>(
    dtype: u32,
    base: u64,
    col: usize,
    run: Option<usize>,
    outputs: [f32; PACK],
) {
    match run {
        // SAFETY: forwarded from the contract.
        None => unsafe { store_as::<PACK>(dtype, base, col, outputs) },
        Some(count) => {
            for (k, &output) in outputs.iter().enumerate() {
                if k < count {
                    // SAFETY: element `col + k` lies in the run.
                    unsafe { store_as::<1>(dtype, base, col + k, [output]) };
                }
            }
        }
    }
}

/// Row `row`'s scale: `scale · row_scale[row]`, or `scale` without a row-scale buffer.
///
/// # Safety
/// `row < params.rows`; a row-scale buffer, if given, holds `rows` floats.
#[inline(always)]
unsafe fn row_scale(p: &RowOpParams, row: usize) -> f32 {
    let row_scale = if p.row_scale == 0 {
        1.0
    } else {
        // SAFETY: forwarded from the contract.
        unsafe { (p.row_scale as *const f32).add(row).read() }
    };
    p.scale * row_scale
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
    // SAFETY: forwarded from the contract.
    unsafe { store_slice_state(params, row, params.state_slot as usize, stats) };
}

/// Stores `stats` as the row's state in slot `slot`.
///
/// # Safety
/// `params.states` holds `rows · (slot + 1)` [`RowState`]s at least, and `row < rows`.
#[inline(always)]
pub unsafe fn store_slice_state<S: Partial>(
    params: &RowOpParams,
    row: usize,
    slot: usize,
    stats: S,
) {
    let [max, sum] = stats.to_floats();
    let slot = slot * params.rows as usize + row;
    // SAFETY: forwarded from the contract.
    unsafe {
        (params.states as *mut RowState)
            .add(slot)
            .write(RowState { max, sum })
    };
}

/// The state of `row` stored in slot `slot`.
///
/// # Safety
/// `params.states` holds `rows · (slot + 1)` [`RowState`]s at least, and `row < rows`.
#[inline(always)]
unsafe fn stored_state<S: Partial>(params: &RowOpParams, row: usize, slot: usize) -> S {
    let slot = slot * params.rows as usize + row;
    // SAFETY: forwarded from the contract.
    let state = unsafe { (params.states as *const RowState).add(slot).read() };
    S::from_floats([state.max, state.sum])
}

/// Merges the `state_slots` stored states of `row`, one after another (a group's lanes each
/// merge all of a caller's few slots).
///
/// # Safety
/// As [`store_state`].
#[inline(always)]
pub unsafe fn merged_states<S: Partial>(params: &RowOpParams, row: usize) -> S {
    let mut merged = S::EMPTY;
    for slot in 0..params.state_slots as usize {
        // SAFETY: forwarded from the contract.
        merged = merged.merge(unsafe { stored_state(params, row, slot) });
    }
    merged
}

/// Merges the `state_slots` stored states of `row` with the whole block: each thread reads
/// every `block_dim`-th slot and a block reduction merges theirs. A split launch leaves one
/// slot per slice (dozens); merged one after another by every thread, their dependent reads
/// took longer than the slice's own work.
///
/// # Safety
/// As [`store_state`]; called by every thread of the block from uniform control flow, with
/// `scratch` as for [`block_reduce`].
#[inline(always)]
pub unsafe fn block_merged_states<S: Partial>(
    params: &RowOpParams,
    row: usize,
    scratch: *mut f32,
) -> S {
    let mut merged = S::EMPTY;
    let slots = params.state_slots as usize;
    for slot in (thread_idx() as usize..slots).step_by(block_dim() as usize) {
        // SAFETY: forwarded from the contract.
        merged = merged.merge(unsafe { stored_state(params, row, slot) });
    }
    // SAFETY: forwarded from the contract.
    unsafe { block_reduce(merged, scratch) }
}

/// Whether the row's scores are all -inf. The maximum skips NaN, so a row of NaN and -inf
/// also has a maximum of -inf; its NaN sum tells it apart (it is NaN, not masked).
#[inline(always)]
fn masked_everywhere(row: OnlineStats) -> bool {
    row.max == f32::NEG_INFINITY && row.sum() == 0.0
}

/// `ln x` from the special-function unit's `log2`.
#[inline(always)]
fn ln(x: f32) -> f32 {
    log2_approx(x) * core::f32::consts::LN_2
}

/// What every forward kernel knows of its row: where the outputs go, the operation, the
/// scale `k = scale · row_scale` of the scores, and what a fully masked row gives.
struct ForwardRow {
    y: u64,
    output_dtype: u32,
    log: bool,
    zero_masked_rows: bool,
    scale: f32,
    log_sum_exp: *mut f32,
}

/// What the forward writes need: softmax computes `e^(k·v − max)·inv_sum` (or, with the
/// exponentials kept, `e · factor`); `max` is the rounded product `x·k` of the row's largest
/// element, as the writes round each score (never fused with what follows), so the exponent
/// is exactly 0 there; log-softmax `(k·v − max) − ln sum` (the difference first, as PyTorch:
/// `k·v − (max + ln sum)` rounds away ~|max|·2^-24);
/// `zero` when the row is masked everywhere and the caller asked for zeros there.
#[derive(Clone, Copy)]
pub struct ForwardFinished {
    max: f32,
    inv_sum: f32,
    factor: f32,
    ln_sum: f32,
    zero: bool,
}

impl ForwardRow {
    /// # Safety
    /// As [`RowKernel::for_row`].
    #[inline(always)]
    unsafe fn new(p: &RowOpParams, row: usize) -> Self {
        // SAFETY: forwarded.
        let scale = unsafe { row_scale(p, row) };
        ForwardRow {
            y: if p.output == 0 {
                0
            } else {
                row_start(p.output, row, p.output_stride, output_dtype(p))
            },
            output_dtype: p.output_dtype,
            log: p.op == op::LOG_SOFTMAX,
            zero_masked_rows: p.masked_rows_zero != 0,
            scale,
            log_sum_exp: if p.log_sum_exp == 0 {
                core::ptr::null_mut()
            } else {
                // SAFETY: the log-sum-exp buffer holds `rows` floats.
                unsafe { (p.log_sum_exp as *mut f32).add(row) }
            },
        }
    }

    /// `row` is in score units; `mine` is this thread's maximum (score units) that its kept
    /// exponentials are relative to, if it kept them.
    #[inline(always)]
    fn finish(&self, row: OnlineStats, mine_max: f32) -> ForwardFinished {
        let sum = row.sum();
        let inv_sum = reciprocal_approx(sum);
        ForwardFinished {
            max: row.max,
            inv_sum,
            factor: OnlineStats::exp_relative::<DeviceExp2>(mine_max, row.max) * inv_sum,
            // Only log-softmax writes read it. Computed for softmax rows too, it took the
            // 8-pack blocks from 64 to 72 registers (ptxas 12.9).
            ln_sum: if self.log { ln(sum) } else { 0.0 },
            zero: self.zero_masked_rows && masked_everywhere(row),
        }
    }

    /// Writes one pack of outputs; `probability(i)` and `log_probability(i)` give element
    /// `i`'s value for softmax and log-softmax.
    ///
    /// # Safety
    /// As [`RowKernel::write`].
    #[inline(always)]
    unsafe fn store<const PACK: usize>(
        &self,
        col: usize,
        run: Option<usize>,
        row: ForwardFinished,
        probability: impl Fn(usize) -> f32,
        log_probability: impl Fn(usize) -> f32,
    ) {
        if self.y == 0 {
            return;
        }
        // The branches are uniform and taken once per pack, each arm a straight run of
        // arithmetic (inside the loop, LLVM branched on them per element).
        let mut outputs = [0.0; PACK];
        if row.zero {
            outputs = [if self.log { f32::NEG_INFINITY } else { 0.0 }; PACK];
        } else if self.log {
            for (i, output) in outputs.iter_mut().enumerate() {
                *output = log_probability(i);
            }
        } else {
            for (i, output) in outputs.iter_mut().enumerate() {
                *output = probability(i);
            }
        }
        // SAFETY: the caller guarantees the pack lies in the row; the output row is aligned
        // like the input's.
        unsafe { store_outputs::<PACK>(self.output_dtype, self.y, col, run, outputs) };
    }

    /// # Safety
    /// As [`RowKernel::write_row`].
    #[inline(always)]
    unsafe fn write_row(&self, row: OnlineStats) {
        if !self.log_sum_exp.is_null() {
            let value = if masked_everywhere(row) {
                f32::NEG_INFINITY
            } else {
                row.max + ln(row.sum())
            };
            // SAFETY: `new` pointed it at this row's float.
            unsafe { self.log_sum_exp.write(value) };
        }
    }
}

/// Softmax, log-softmax and log-sum-exp of the scores `x · scale · row_scale`, without
/// masks. Packs stay in registers as loaded (two 16-bit elements per register, so a block
/// keeps twice the bf16 data in flight), widened each time they are used.
pub struct Forward<In> {
    x: *const In,
    row: ForwardRow,
}

impl<In: Element> Forward<In> {
    #[inline(always)]
    fn local_max<const PACK: usize, const PACKS: usize>(
        &self,
        packs: &[[u32; PACK]; PACKS],
    ) -> f32 {
        let mut max = f32::NEG_INFINITY;
        for pack in packs {
            for i in 0..PACK {
                max = max.max(In::widen(pack, i));
            }
        }
        max
    }

    /// `Σ 2^((v − max)·k·log2 e)` over the packs. A maximum of -inf (nothing but -inf) is
    /// taken as 0 so -inf gives 0, not NaN.
    #[inline(always)]
    fn exponential_sum<const PACK: usize, const PACKS: usize>(
        &self,
        packs: &[[u32; PACK]; PACKS],
        max: f32,
    ) -> f32 {
        let slope = self.row.scale * LOG2_E;
        // In input units, `k` applied after the subtraction (as in `exp_relative`).
        let max = OnlineStats::exponent_origin(max);
        let mut sum = 0.0;
        for pack in packs {
            for i in 0..PACK {
                sum += exp2_approx((In::widen(pack, i) - max) * slope);
            }
        }
        sum
    }
}

impl<In: Element, const PACK: usize> RowKernel<PACK> for Forward<In> {
    type Values = [u32; PACK];
    type Stats = OnlineStats;
    type Finished = ForwardFinished;
    const PAD: [u32; PACK] = [In::NEG_INF_WORD; PACK];

    #[inline(always)]
    unsafe fn for_row(p: &RowOpParams, row: usize) -> Self {
        Forward {
            x: row_start(p.input, row, p.input_stride, In::DTYPE) as *const In,
            // SAFETY: forwarded.
            row: unsafe { ForwardRow::new(p, row) },
        }
    }

    #[inline(always)]
    unsafe fn load(&self, col: usize) -> [u32; PACK] {
        // SAFETY: the caller guarantees the pack lies in the row, aligned as the layout says.
        unsafe { In::load_packed::<PACK>(self.x.add(col)) }
    }

    #[inline(always)]
    fn partial<const PACKS: usize>(&self, packs: &mut [[u32; PACK]; PACKS]) -> OnlineStats {
        let max = self.local_max(packs);
        // In score units: the scale is positive, so it maps the maximum to the maximum.
        OnlineStats::new(max * self.row.scale, self.exponential_sum(packs, max))
    }

    /// Within a group the maximum is reduced first, so each lane takes its exponentials
    /// relative to the row's maximum and only the sums need a second reduction.
    #[inline(always)]
    fn group_partial<const PACKS: usize, const LANES: u32>(
        &self,
        packs: &mut [[u32; PACK]; PACKS],
    ) -> (OnlineStats, OnlineStats) {
        let max = group_max::<LANES>(self.local_max(packs));
        let mine = self.exponential_sum(packs, max);
        let max = max * self.row.scale;
        (
            OnlineStats::new(max, group_sum::<LANES>(mine)),
            OnlineStats::new(max, mine),
        )
    }

    /// The same two steps across a block: two one-float reductions cost fewer instructions
    /// than one reduction of (maximum, sum) pairs, whose every merge takes two exponentials.
    #[inline(always)]
    unsafe fn block_partial<const PACKS: usize>(
        &self,
        packs: &mut [[u32; PACK]; PACKS],
        scratch: *mut f32,
    ) -> (OnlineStats, OnlineStats) {
        // SAFETY (both): forwarded from the contract.
        let Max(max) = unsafe { block_reduce(Max(self.local_max(packs)), scratch) };
        let mine = self.exponential_sum(packs, max);
        let Sum(sum) = unsafe { block_reduce(Sum(mine), scratch) };
        let max = max * self.row.scale;
        (OnlineStats::new(max, sum), OnlineStats::new(max, mine))
    }

    #[inline(always)]
    fn finish(&self, row: OnlineStats, mine: OnlineStats) -> ForwardFinished {
        self.row.finish(row, mine.max)
    }

    #[inline(always)]
    unsafe fn write(
        &self,
        col: usize,
        run: Option<usize>,
        pack: [u32; PACK],
        row: ForwardFinished,
    ) {
        let score = |i: usize| In::widen(&pack, i) * self.row.scale;
        // SAFETY: forwarded from the caller.
        unsafe {
            self.row.store::<PACK>(
                col,
                run,
                row,
                |i| OnlineStats::exp_relative::<DeviceExp2>(score(i), row.max) * row.inv_sum,
                |i| (score(i) - row.max) - row.ln_sum,
            )
        }
    }

    #[inline(always)]
    unsafe fn write_row(&self, row: OnlineStats) {
        // SAFETY: forwarded.
        unsafe { self.row.write_row(row) }
    }
}

/// Softmax, log-softmax and log-sum-exp of `x · scale · row_scale + masks`: the scores are
/// formed in f32 as each pack is loaded (scale, additive mask, boolean mask, causal mask),
/// and softmax keeps their exponentials in place of them.
pub struct MaskedForward<In> {
    x: *const In,
    row: ForwardRow,
    additive_mask: *const f32,
    allowed_mask: *const u8,
    /// Last unmasked column under the causal mask (`usize::MAX`: none).
    causal_last: usize,
}

impl<In: Element, const PACK: usize> RowKernel<PACK> for MaskedForward<In> {
    type Values = [f32; PACK];
    type Stats = OnlineStats;
    type Finished = ForwardFinished;
    const PAD: [f32; PACK] = [f32::NEG_INFINITY; PACK];

    #[inline(always)]
    unsafe fn for_row(p: &RowOpParams, row: usize) -> Self {
        let mask_offset = if p.mask_rows == 0 {
            0
        } else {
            (row % p.mask_rows as usize) * p.mask_stride as usize
        };
        MaskedForward {
            x: row_start(p.input, row, p.input_stride, In::DTYPE) as *const In,
            // SAFETY: forwarded.
            row: unsafe { ForwardRow::new(p, row) },
            additive_mask: if p.additive_mask == 0 {
                core::ptr::null()
            } else {
                row_start(p.additive_mask, mask_offset, 1, DType::F32) as *const f32
            },
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
        }
    }

    #[inline(always)]
    unsafe fn load(&self, col: usize) -> [f32; PACK] {
        // SAFETY: the caller guarantees the pack lies in the row, aligned as the layout says.
        let mut values = unsafe { In::load_f32::<PACK>(self.x.add(col)) };
        for value in values.iter_mut() {
            *value *= self.row.scale;
        }
        if !self.additive_mask.is_null() {
            // SAFETY: mask rows have `cols` elements, aligned like the input's.
            let mask = unsafe { f32::load_f32::<PACK>(self.additive_mask.add(col)) };
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
        if col + PACK - 1 > self.causal_last {
            for (k, value) in values.iter_mut().enumerate() {
                if col + k > self.causal_last {
                    *value = f32::NEG_INFINITY;
                }
            }
        }
        values
    }

    /// The scores' maximum, then their exponentials relative to it, kept for softmax.
    #[inline(always)]
    fn partial<const PACKS: usize>(&self, packs: &mut [[f32; PACK]; PACKS]) -> OnlineStats {
        let mut max = f32::NEG_INFINITY;
        for pack in packs.iter() {
            for &value in pack {
                max = max.max(value);
            }
        }
        let mut sum = 0.0;
        for pack in packs.iter_mut() {
            for value in pack.iter_mut() {
                let e = OnlineStats::exp_relative::<DeviceExp2>(*value, max);
                sum += e;
                if !self.row.log {
                    *value = e;
                }
            }
        }
        OnlineStats::new(max, sum)
    }

    #[inline(always)]
    fn finish(&self, row: OnlineStats, mine: OnlineStats) -> ForwardFinished {
        self.row.finish(row, mine.max)
    }

    #[inline(always)]
    unsafe fn write(
        &self,
        col: usize,
        run: Option<usize>,
        values: [f32; PACK],
        row: ForwardFinished,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.row.store::<PACK>(
                col,
                run,
                row,
                |i| values[i] * row.factor,
                |i| (values[i] - row.max) - row.ln_sum,
            )
        }
    }

    #[inline(always)]
    unsafe fn write_row(&self, row: OnlineStats) {
        // SAFETY: forwarded.
        unsafe { self.row.write_row(row) }
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
    /// `y` and `dy` as loaded (see [`Element::load_packed`]), widened when used.
    type Values = ([u32; PACK], [u32; PACK]);
    type Stats = Sum;
    type Finished = f32;
    const PAD: Self::Values = ([0; PACK], [0; PACK]);

    #[inline(always)]
    unsafe fn for_row(p: &RowOpParams, row: usize) -> Self {
        // SAFETY: forwarded.
        let scale = unsafe { row_scale(p, row) };
        Backward {
            y: row_start(p.input, row, p.input_stride, In::DTYPE) as *const In,
            dy: row_start(p.grad, row, p.grad_stride, In::DTYPE) as *const In,
            dx: row_start(p.output, row, p.output_stride, output_dtype(p)),
            output_dtype: p.output_dtype,
            log: p.op == op::LOG_SOFTMAX,
            scale,
            _input: PhantomData,
        }
    }

    #[inline(always)]
    unsafe fn load(&self, col: usize) -> Self::Values {
        // SAFETY: the caller guarantees the pack lies in both rows, aligned.
        unsafe {
            (
                In::load_packed::<PACK>(self.y.add(col)),
                In::load_packed::<PACK>(self.dy.add(col)),
            )
        }
    }

    #[inline(always)]
    fn partial<const PACKS: usize>(&self, packs: &mut [Self::Values; PACKS]) -> Sum {
        // Log-softmax needs Σ dy; softmax Σ dy·y. The branch is uniform, taken once.
        let mut sum = 0.0;
        if self.log {
            for (_, dy) in packs.iter() {
                for k in 0..PACK {
                    sum += In::widen(dy, k);
                }
            }
        } else {
            for (y, dy) in packs.iter() {
                for k in 0..PACK {
                    sum += In::widen(dy, k) * In::widen(y, k);
                }
            }
        }
        Sum(sum)
    }

    #[inline(always)]
    fn finish(&self, row: Sum, _mine: Sum) -> f32 {
        row.0
    }

    #[inline(always)]
    unsafe fn write(&self, col: usize, run: Option<usize>, (y, dy): Self::Values, sum: f32) {
        let (y, dy) = (|k| In::widen(&y, k), |k| In::widen(&dy, k));
        // Uniform branch, once per pack (see `ForwardRow::store`).
        let mut dx = [0.0; PACK];
        if self.log {
            for (k, dx) in dx.iter_mut().enumerate() {
                *dx = self.scale * (dy(k) - exp2_approx(y(k) * LOG2_E) * sum);
            }
        } else {
            for (k, dx) in dx.iter_mut().enumerate() {
                *dx = self.scale * (y(k) * (dy(k) - sum));
            }
        }
        // SAFETY: the caller guarantees the pack lies in the row, aligned.
        unsafe { store_outputs::<PACK>(self.output_dtype, self.dx, col, run, dx) };
    }

    #[inline(always)]
    unsafe fn write_row(&self, _row: Sum) {}
}

impl<In: Element, const PACK: usize> PeelableRow<PACK> for Forward<In> {
    #[inline(always)]
    fn head(&self) -> usize {
        unaligned_head(self.x as usize, size_of::<In>(), PACK)
    }

    #[inline(always)]
    unsafe fn load_run(&self, start: usize, count: usize) -> [u32; PACK] {
        // SAFETY: the caller guarantees the run lies in the row.
        unsafe { In::load_packed_run::<PACK>(self.x.add(start), count, In::NEG_INF_WORD) }
    }
}

impl<In: Element, const PACK: usize> PeelableRow<PACK> for Backward<In> {
    #[inline(always)]
    fn head(&self) -> usize {
        unaligned_head(self.y as usize, size_of::<In>(), PACK)
    }

    #[inline(always)]
    unsafe fn load_run(&self, start: usize, count: usize) -> Self::Values {
        // SAFETY: the caller guarantees the run lies in both rows.
        unsafe {
            (
                In::load_packed_run::<PACK>(self.y.add(start), count, 0),
                In::load_packed_run::<PACK>(self.dy.add(start), count, 0),
            )
        }
    }
}
