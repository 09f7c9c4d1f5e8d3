//! The forward row kernels: softmax, log-softmax and log-sum-exp of the scores, without masks
//! ([`Forward`], which also reads rows that need not start on a 16-byte boundary) or with them
//! ([`MaskedForward`]).

use crate::launch::ops::{DType, OP_BLOCK_KEPT, RowOpParams, op};
use crate::primitives::device::{DeviceExp2, exp2_approx, log2_approx, reciprocal_approx};
use crate::primitives::element::Element;
use crate::primitives::memory::load_global;
use crate::primitives::online::{LOG2_E, OnlineStats};
use crate::primitives::reduce::{Max, Sum, block_reduce, group_max, group_sum};
use crate::primitives::row_part::unaligned_head;

use super::row_kernel::{
    PeelableRow, RowKernel, output_dtype, row_scale, row_start, store_outputs,
};

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
/// `zero` when the row is masked everywhere and the caller asked for zeros there. With
/// `kept`, the thread's packs hold what [`Forward`] keeps, relative to the maximum the thread
/// reduced to: a softmax write is `e · factor`, a log-softmax write `t + log_offset`.
#[derive(Clone, Copy)]
pub struct ForwardFinished {
    max: f32,
    inv_sum: f32,
    factor: f32,
    ln_sum: f32,
    zero: bool,
    kept: bool,
    log_offset: f32,
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

    /// `row` is in score units; `mine_max` is the maximum (score units) this thread reduced
    /// to (its group's or block's, or its own), which what it kept is relative to, if it kept
    /// anything (`kept`).
    #[inline(always)]
    fn finish(&self, row: OnlineStats, mine_max: f32, kept: bool) -> ForwardFinished {
        let sum = row.sum();
        let inv_sum = reciprocal_approx(sum);
        // Only log-softmax writes read these. Computed for softmax rows too, `ln_sum` took
        // the 8-pack blocks to more registers.
        let (ln_sum, log_offset) = if self.log {
            let ln_sum = ln(sum);
            // Kept differences are relative to the maximum this thread reduced to (its
            // group's or block's, which is the row's unless the row is sliced or its states
            // come from elsewhere): `t + (mine − max) − ln sum`, which is PyTorch's
            // `(x·k − max) − ln sum` exactly where the two maxima agree.
            let shift =
                OnlineStats::exponent_origin(mine_max) - OnlineStats::exponent_origin(row.max);
            (ln_sum, shift - ln_sum)
        } else {
            (0.0, 0.0)
        };
        let factor = OnlineStats::exp_relative::<DeviceExp2>(mine_max, row.max) * inv_sum;
        let zero = self.zero_masked_rows && masked_everywhere(row);
        // A softmax row masked everywhere keeps exponentials of 0 (each relative to the
        // exponent origin, never NaN): a factor of 0 writes the 0 it asks for, with no choice
        // per element. Log-softmax keeps the choice: a kept difference `x·k − max·k` is NaN
        // where a score overflowed to -inf in a row whose maximum is -inf.
        let (factor, zero) = if kept && zero && !self.log {
            (0.0, false)
        } else {
            (factor, zero)
        };
        ForwardFinished {
            max: row.max,
            inv_sum,
            factor,
            ln_sum,
            zero,
            kept,
            log_offset,
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

/// The largest element of the packs (as loaded: see [`Element::load_packed`]).
#[inline(always)]
pub(super) fn packs_max<In: Element, const PACK: usize, const PACKS: usize>(
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

/// `Σ 2^((v − origin)·slope)` over the elements `v` of the packs (as loaded).
#[inline(always)]
pub(super) fn sum_of_exponentials<In: Element, const PACK: usize, const PACKS: usize>(
    packs: &[[u32; PACK]; PACKS],
    origin: f32,
    slope: f32,
) -> f32 {
    let mut sum = 0.0;
    for pack in packs {
        for i in 0..PACK {
            sum += exp2_approx((In::widen(pack, i) - origin) * slope);
        }
    }
    sum
}

/// Softmax, log-softmax and log-sum-exp of the scores `x · scale · row_scale`, without
/// masks. Packs stay in registers as loaded (two 16-bit elements per register, so a block
/// keeps twice the bf16 data in flight), widened each time they are used; a thread of at most
/// `KEPT` elements ([`KEPT_ELEMENTS`]; [`EVERY_ELEMENT_KEPT`] in the kept blocks) keeps, in
/// their place, what its writes need instead.
pub struct Forward<In, const KEPT: usize = KEPT_ELEMENTS> {
    x: *const In,
    row: ForwardRow,
}

/// The forward kernel of the kept block entries
/// ([`OpInstance::kept`](crate::launch::ops::OpInstance::kept)), which keeps every element a
/// thread holds.
pub type KeptForward<In> = Forward<In, EVERY_ELEMENT_KEPT>;

/// The most elements a thread holds for it to keep, from the reduction to the writes, each
/// element's exponential (softmax) or difference `t = x·k − max·k` from its maximum
/// (log-softmax), as f32 bits in place of its pack (a 16-bit pack's words have room for
/// them). Rows this narrow can be bound by instruction issue rather than by memory (bf16
/// 65536×96 on the H200 was: 0.76 warp instructions issued per scheduler and cycle, in Nsight
/// Compute), and keeping them spares each write a widening, a product, a subtraction and, for
/// softmax, an exponential. Wider threads recompute them, so that 16-bit packs stay two
/// elements to a register.
const KEPT_ELEMENTS: usize = 16;

/// [`KEPT_ELEMENTS`] of the kept block entries: every element of the largest instance (9 slots
/// of 8 for the peeled 8-pack blocks). A launch of few blocks runs few warps a
/// multiprocessor, so it is bound by issuing its instructions (bf16 64×32000 in clusters of
/// 8-pack threads: 24 instructions a thread per element at 8 warps a multiprocessor, in
/// Nsight Compute); the registers this takes (bf16 8 packs: 56 → 96) would halve a block's
/// residency where many rows want it.
const EVERY_ELEMENT_KEPT: usize = 72;

// Every kept block instance keeps all it holds: its packs of the widest pack (16-bit
// elements) and a peeled row's end slot; otherwise its entry would be its packed twin again.
const _: () = {
    let widest = DType::Bf16.vector_pack() as usize;
    let mut i = 0;
    while i < OP_BLOCK_KEPT.len() {
        assert!((OP_BLOCK_KEPT[i].0 as usize + 1) * widest <= EVERY_ELEMENT_KEPT);
        i += 1;
    }
};

impl<In: Element, const KEPT: usize> Forward<In, KEPT> {
    /// Whether a thread of `PACKS` packs keeps its elements' values (`KEPT`).
    #[inline(always)]
    const fn keeps<const PACK: usize, const PACKS: usize>() -> bool {
        PACK * PACKS <= KEPT
    }

    /// `Σ 2^((v − max)·k·log2 e)` over the packs, keeping each element's term (softmax) or
    /// its `v·k − max·k` (log-softmax) in its place where [`Self::keeps`]. A maximum of -inf
    /// (nothing but -inf) is taken as 0 so -inf gives 0, not NaN.
    #[inline(always)]
    fn exponential_sum<const PACK: usize, const PACKS: usize>(
        &self,
        packs: &mut [[u32; PACK]; PACKS],
        max: f32,
    ) -> f32 {
        let scale = self.row.scale;
        let slope = scale * LOG2_E;
        // In input units; for the exponentials `k` is applied after the subtraction (as in
        // `exp_relative`).
        let max = OnlineStats::exponent_origin(max);
        let mut sum = 0.0;
        // One loop per case rather than a choice per element: the branches are uniform.
        if !Self::keeps::<PACK, PACKS>() {
            sum = sum_of_exponentials::<In, PACK, PACKS>(packs, max, slope);
        } else if self.row.log {
            // The scores' difference `x·k − max·k`, as the writes that recompute it take it
            // (`(x − max)·k` overflows where `k < 1` brings both ends of ±3e38 in range).
            let origin = max * scale;
            for pack in packs.iter_mut() {
                let mut kept = [0.0f32; PACK];
                for (i, t) in kept.iter_mut().enumerate() {
                    *t = In::widen(pack, i) * scale - origin;
                    sum += exp2_approx(*t * LOG2_E);
                }
                for (i, t) in kept.iter().enumerate() {
                    pack[i] = t.to_bits();
                }
            }
        } else {
            for pack in packs.iter_mut() {
                let mut kept = [0.0f32; PACK];
                for (i, e) in kept.iter_mut().enumerate() {
                    *e = exp2_approx((In::widen(pack, i) - max) * slope);
                    sum += *e;
                }
                for (i, e) in kept.iter().enumerate() {
                    pack[i] = e.to_bits();
                }
            }
        }
        sum
    }
}

impl<In: Element, const PACK: usize, const KEPT: usize> RowKernel<PACK> for Forward<In, KEPT> {
    type Params = RowOpParams;
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
        let max = packs_max::<In, PACK, PACKS>(packs);
        // In score units: the scale is positive, so it maps the maximum to the maximum.
        OnlineStats::new(max * self.row.scale, self.exponential_sum(packs, max))
    }

    /// Within a group the maximum is reduced first, so each lane takes its exponentials
    /// relative to the group's maximum and only the sums need a second reduction.
    #[inline(always)]
    fn group_partial<const PACKS: usize, const LANES: u32>(
        &self,
        packs: &mut [[u32; PACK]; PACKS],
    ) -> (OnlineStats, OnlineStats) {
        let max = group_max::<LANES>(packs_max::<In, PACK, PACKS>(packs));
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
        let Max(max) = unsafe { block_reduce(Max(packs_max::<In, PACK, PACKS>(packs)), scratch) };
        let mine = self.exponential_sum(packs, max);
        let Sum(sum) = unsafe { block_reduce(Sum(mine), scratch) };
        let max = max * self.row.scale;
        (OnlineStats::new(max, sum), OnlineStats::new(max, mine))
    }

    #[inline(always)]
    fn finish<const PACKS: usize>(&self, row: OnlineStats, mine: OnlineStats) -> ForwardFinished {
        self.row.finish(row, mine.max, Self::keeps::<PACK, PACKS>())
    }

    #[inline(always)]
    unsafe fn write(
        &self,
        col: usize,
        run: Option<usize>,
        pack: [u32; PACK],
        row: ForwardFinished,
    ) {
        if self.row.y == 0 {
            return;
        }
        // The outputs first, each case a straight run of arithmetic, then one store: with a
        // store per case, LLVM left a peeled group's writes out of line (in local memory).
        let score = |i: usize| In::widen(&pack, i) * self.row.scale;
        let kept = |i: usize| f32::from_bits(pack[i]);
        // Uniform branches, one loop each (inside the loop, LLVM branched per element).
        let mut outputs = [0.0; PACK];
        if row.kept && self.row.log {
            for (i, output) in outputs.iter_mut().enumerate() {
                *output = kept(i) + row.log_offset;
            }
        } else if row.kept {
            for (i, output) in outputs.iter_mut().enumerate() {
                *output = kept(i) * row.factor;
            }
        } else if self.row.log {
            for (i, output) in outputs.iter_mut().enumerate() {
                *output = (score(i) - row.max) - row.ln_sum;
            }
        } else {
            for (i, output) in outputs.iter_mut().enumerate() {
                *output = OnlineStats::exp_relative::<DeviceExp2>(score(i), row.max) * row.inv_sum;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            self.row
                .store::<PACK>(col, run, row, |i| outputs[i], |i| outputs[i])
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
    type Params = RowOpParams;
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
            let allowed = unsafe { load_global::<u8, PACK>(self.allowed_mask.add(col)) };
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
    fn finish<const PACKS: usize>(&self, row: OnlineStats, mine: OnlineStats) -> ForwardFinished {
        self.row.finish(row, mine.max, false)
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

impl<In: Element, const PACK: usize, const KEPT: usize> PeelableRow<PACK> for Forward<In, KEPT> {
    #[inline(always)]
    fn head(&self) -> usize {
        unaligned_head(self.x as usize, size_of::<In>(), PACK)
    }

    #[inline(always)]
    unsafe fn load_run(&self, start: usize, count: usize) -> [u32; PACK] {
        // SAFETY: the caller guarantees the run lies in the row, aligned as `load_run` asks.
        let [pack] = unsafe {
            In::load_packed_runs::<PACK, 1>([self.x.add(start)], count, [In::NEG_INF_WORD])
        };
        pack
    }
}
