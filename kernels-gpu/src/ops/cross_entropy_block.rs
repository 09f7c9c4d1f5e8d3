//! Cross-entropy in the block family's registers (`op_block_xent_*`): a block holds its row,
//! or one slice of it beside the other blocks of the row (a thread-block cluster, or a
//! cooperative launch), in registers from the read to the gradient's write, as the operation kernels hold softmax rows ([`super::block`]), and writes
//! the loss, the log-sum-exp and the gradient of the loss with respect to the logits (in
//! place over them, if asked). It serves the calls the packed passes of
//! [`super::cross_entropy`] serve without label smoothing, over the whole vocabulary, on rows
//! aligned for 16-byte packs; those passes keep every other call.
//!
//! With `lse = ln Σ e^x`, `p = e^(x − lse)`, class weight `w` of the target `t` (1 without
//! weights), z-loss scale `λ` and `g` the upstream gradient (over the mean's divisor for a
//! mean): a row's loss is `w·(lse − x[t]) + λ·lse²`, its gradient `g·(p·(w + 2λ·lse) −
//! w·[c = t])`. An ignored row has loss 0 and gradient 0; a target outside the vocabulary
//! gives NaN for both. The thread that holds the target's column writes the row's loss (it
//! holds the target's logit, which in place no other thread may read once the gradient is
//! being written); the row's first thread writes it where the row has no such column.

use core::marker::PhantomData;

use crate::launch::cross_entropy::CrossEntropyParams;
use crate::launch::ops::with_op_instances;
use crate::primitives::device::{
    block_dim, block_idx, dynamic_shared_f32, exp2_approx, recomputed, thread_idx,
};
#[cfg(kernels_module = "ops-bf16")]
use crate::primitives::element::Bf16;
use crate::primitives::element::Element;
#[cfg(kernels_module = "ops-f16")]
use crate::primitives::element::F16;
use crate::primitives::online::{LOG2_E, OnlineStats};
use crate::primitives::reduce::{Max, Sum, block_reduce};
use crate::primitives::row_exchange::{
    exchange_sliced_row_stats, leave_row_cluster, row_is_cluster,
};
use crate::primitives::row_part::Share;

use super::cross_entropy::{Target, gradient_row, log_sum_exp};
use super::forward::{packs_max, sum_of_exponentials};
use super::row_kernel::{RowKernel, row_start, store_outputs};
use super::slots::{Aligned, Slots};

/// One row's cross-entropy as a [`RowKernel`] (see the module's documentation).
pub struct CrossEntropyRow<In> {
    x: *const In,
    /// The gradient row (0: none), of `gradient_dtype`.
    y: u64,
    gradient_dtype: u32,
    /// The target's column; `usize::MAX` where the row has none (ignored, or outside the
    /// vocabulary).
    target_column: usize,
    target: Target,
    /// The target class's weight (0 where the row has no target).
    weight: f32,
    z_loss: f32,
    /// The gradient's factor (see [`Target::gradient_scale`]).
    scale: f32,
    /// The row's loss and log-sum-exp, where the call keeps them (null otherwise).
    loss: *mut f32,
    lse: *mut f32,
    _input: PhantomData<In>,
}

/// What the writes need once the row's statistics are known.
#[derive(Clone, Copy)]
pub struct CrossEntropyFinished {
    lse: f32,
    /// What the probability is multiplied by off the target's column: `g·(w + 2λ·lse)`.
    scaled_p_factor: f32,
    /// `w + 2λ·lse`.
    p_factor: f32,
}

impl<In: Element> CrossEntropyRow<In> {
    /// The row's logits.
    pub(super) fn logits(&self) -> *const In {
        self.x
    }

    /// `e^(x − lse)`, the difference first: exact where `x` and `lse` are close, whatever
    /// their size.
    #[inline(always)]
    fn probability(x: f32, lse: f32) -> f32 {
        exp2_approx((x - lse) * LOG2_E)
    }

    /// The row's loss, from the target's logit.
    #[inline(always)]
    fn loss(&self, lse: f32, target_logit: f32) -> f32 {
        self.weight * (lse - target_logit) + self.z_loss * lse * lse
    }
}

impl<In: Element, const PACK: usize> RowKernel<PACK> for CrossEntropyRow<In> {
    type Params = CrossEntropyParams;
    /// The pack as loaded (see [`Element::load_packed`]), widened when used: the gradient
    /// pass needs the logits themselves, not their exponentials, for the target's loss.
    type Values = [u32; PACK];
    type Stats = OnlineStats;
    type Finished = CrossEntropyFinished;
    const PAD: [u32; PACK] = [In::NEG_INF_WORD; PACK];

    #[inline(always)]
    unsafe fn for_row(p: &CrossEntropyParams, row: usize) -> Self {
        // SAFETY: `row < rows` (contract).
        let target = unsafe { Target::of(p, row) };
        let per_row = |base: u64| {
            if base == 0 {
                core::ptr::null_mut()
            } else {
                (base as *mut f32).wrapping_add(row)
            }
        };
        CrossEntropyRow {
            x: row_start(p.logits, row, p.logits_stride, In::DTYPE) as *const In,
            y: gradient_row(p, row),
            gradient_dtype: p.gradient_dtype,
            target_column: target.local(p).unwrap_or(usize::MAX),
            // SAFETY (both): forwarded.
            weight: unsafe { target.weight(p) },
            scale: unsafe { target.gradient_scale(p, row) },
            target,
            z_loss: p.z_loss,
            loss: per_row(p.losses),
            lse: per_row(p.lse),
            _input: PhantomData,
        }
    }

    #[inline(always)]
    unsafe fn load(&self, col: usize) -> [u32; PACK] {
        // SAFETY: the caller guarantees the pack lies in the row, 16-byte aligned.
        unsafe { In::load_packed::<PACK>(self.x.add(col)) }
    }

    #[inline(always)]
    fn partial<const PACKS: usize>(&self, packs: &mut [[u32; PACK]; PACKS]) -> OnlineStats {
        let max = packs_max::<In, PACK, PACKS>(packs);
        let origin = OnlineStats::exponent_origin(max);
        OnlineStats::new(
            max,
            sum_of_exponentials::<In, PACK, PACKS>(packs, origin, LOG2_E),
        )
    }

    /// The maximum across the block first, then each thread's exponentials relative to it:
    /// two one-float reductions (as the forward's).
    #[inline(always)]
    unsafe fn block_partial<const PACKS: usize>(
        &self,
        packs: &mut [[u32; PACK]; PACKS],
        scratch: *mut f32,
    ) -> (OnlineStats, OnlineStats) {
        // SAFETY (both): forwarded from the contract.
        let Max(max) = unsafe { block_reduce(Max(packs_max::<In, PACK, PACKS>(packs)), scratch) };
        let origin = OnlineStats::exponent_origin(max);
        let mine = sum_of_exponentials::<In, PACK, PACKS>(packs, origin, LOG2_E);
        let Sum(sum) = unsafe { block_reduce(Sum(mine), scratch) };
        (OnlineStats::new(max, sum), OnlineStats::new(max, mine))
    }

    #[inline(always)]
    fn finish<const PACKS: usize>(&self, row: OnlineStats, _: OnlineStats) -> CrossEntropyFinished {
        let lse = log_sum_exp(row);
        let p_factor = self.weight + 2.0 * self.z_loss * lse;
        CrossEntropyFinished {
            lse,
            scaled_p_factor: self.scale * p_factor,
            p_factor,
        }
    }

    #[inline(always)]
    unsafe fn write(
        &self,
        col: usize,
        run: Option<usize>,
        pack: [u32; PACK],
        row: CrossEntropyFinished,
    ) {
        // The target's place in this pack, if it lies there (one test a pack).
        let at = self.target_column.wrapping_sub(col);
        let holds_target = at < PACK;
        if holds_target && !self.loss.is_null() {
            let logit = (0..PACK).fold(
                0.0,
                |logit, i| {
                    if i == at { In::widen(&pack, i) } else { logit }
                },
            );
            // SAFETY: `for_row` pointed it at this row's float.
            unsafe { self.loss.write(self.loss(row.lse, logit)) };
        }
        if self.y == 0 {
            return;
        }
        let mut outputs = [0.0; PACK];
        if !self.target.ignored {
            for (i, output) in outputs.iter_mut().enumerate() {
                *output = Self::probability(In::widen(&pack, i), row.lse) * row.scaled_p_factor;
            }
            if holds_target {
                for (i, output) in outputs.iter_mut().enumerate() {
                    if i == at {
                        let p = Self::probability(In::widen(&pack, i), row.lse);
                        *output = self.scale * (p * row.p_factor - self.weight);
                    }
                }
            }
        }
        // SAFETY: the caller guarantees the pack lies in the row; the gradient row is aligned
        // as the logits' (contract).
        unsafe { store_outputs::<PACK>(self.gradient_dtype, self.y, col, run, outputs) };
    }

    #[inline(always)]
    unsafe fn write_row(&self, row: OnlineStats) {
        let lse = log_sum_exp(row);
        // SAFETY (both): `for_row` pointed them at this row's float.
        if !self.lse.is_null() {
            unsafe { self.lse.write(lse) };
        }
        if self.target_column == usize::MAX && !self.loss.is_null() {
            let loss = if self.target.invalid { f32::NAN } else { 0.0 };
            unsafe { self.loss.write(loss) };
        }
    }
}

/// The cross-entropy of a row (see the module's documentation), or of one of the `slices`
/// slices of `slice_packs` packs of it (`block_idx = row · slices + slice`), held by a block
/// of `threads = block_dim` threads with up to `PACKS` packs each.
///
/// # Safety
/// The contract of [`CrossEntropyParams`] with `aligned` and `cols` a multiple of `PACK`, in
/// mode `FULL`, without label smoothing or a softcap and over the whole vocabulary
/// (`column_offset` 0, `vocab` = `cols`), for a
/// launch of `rows · slices` blocks of whole warps, at most 1024 threads: `slices ·
/// slice_packs ≥ cols / PACK` and `threads · PACKS ≥ slice_packs`, with
/// `REDUCTION_SCRATCH_FLOATS · 4` bytes of dynamic shared memory. Where `slices` is more than
/// 1, either the launch is in thread-block clusters of `slices` blocks (the sm_90 build; at
/// most [`MAX_CLUSTER_BLOCKS`](crate::launch::MAX_CLUSTER_BLOCKS)), each block with
/// `(REDUCTION_SCRATCH_FLOATS + CLUSTER_STATS_FLOATS) · 4` bytes, or `partials` holds two
/// floats per block, `barriers` two words per row zeroed when allocated and used by one launch
/// at a time, and every block is resident at once (cooperative launch). In place, each thread
/// reads its packs before it writes them, and no thread reads another's.
#[inline(always)]
pub unsafe fn cross_entropy_block<In: Element, const PACK: usize, const PACKS: usize>(
    p: &CrossEntropyParams,
) {
    let slices = p.slices.max(1) as usize;
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    let tid = thread_idx() as usize;
    let threads = block_dim() as usize;
    // SAFETY: `row < rows`.
    let kernel = unsafe { <CrossEntropyRow<In> as RowKernel<PACK>>::for_row(p, row) };
    let share = Share {
        cols: p.cols as usize,
        slice,
        slice_packs: p.slice_packs as usize,
    };
    // SAFETY: the share lies in the row, which starts on a 16-byte boundary.
    let mut values = unsafe {
        <Aligned as Slots<CrossEntropyRow<In>, PACK>>::load::<PACKS>(&kernel, share, threads, tid)
    };
    let scratch = dynamic_shared_f32();
    // SAFETY: uniform control flow; the launch provides the scratch.
    let (block, mine) = unsafe {
        <CrossEntropyRow<In> as RowKernel<PACK>>::block_partial(&kernel, &mut values, scratch)
    };
    let clustered = slices > 1 && row_is_cluster(p.slices);
    let stats = if slices > 1 {
        // SAFETY: forwarded from the contract for sliced launches; `leave_row_cluster` below.
        unsafe {
            exchange_sliced_row_stats(
                block,
                scratch,
                p.partials as *mut f32,
                p.barriers as *mut u32,
                row,
                slices,
                clustered,
            )
        }
    } else {
        block
    };
    let finished = <CrossEntropyRow<In> as RowKernel<PACK>>::finish::<PACKS>(&kernel, stats, mine);
    // The write addresses computed anew, as the operation kernels do.
    let (threads, tid) = (
        recomputed(threads as u32) as usize,
        recomputed(tid as u32) as usize,
    );
    // SAFETY: as for the loads; in place, each thread writes only the packs it read.
    unsafe {
        <Aligned as Slots<CrossEntropyRow<In>, PACK>>::write::<PACKS>(
            &kernel, share, threads, tid, &values, finished,
        )
    };
    if tid == 0 && slice == 0 {
        // SAFETY: `row < rows`.
        unsafe { <CrossEntropyRow<In> as RowKernel<PACK>>::write_row(&kernel, stats) };
    }
    leave_row_cluster(clustered);
}

/// The block entries of one input type, one per packs count of the block table of
/// [`with_op_instances`] (the block size is the launch's), named as the operation kernels'
/// (`op_block_xent_bf16_p8_n8`).
macro_rules! cross_entropy_block_entries {
    (
        $module:literal, $input:ty, $name:literal, $pack:literal,
        rows_vector $rows_vector:tt,
        rows_peeled $rows_peeled:tt,
        rows_masked $rows_masked:tt,
        rows_scalar $rows_scalar:tt,
        block_vector [$($packs:literal: $widths:tt),+],
        block_kept $block_kept:tt,
        block_masked $block_masked:tt,
        block_scalar $block_scalar:tt
    ) => {$(
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(op_block "xent" $name $pack "" $packs),
            (params: CrossEntropyParams)
                => cross_entropy_block::<$input, $pack, $packs>(&params)
        );
    )+};
}

with_op_instances!(cross_entropy_block_entries, "ops-f32", f32, "f32", 4);
with_op_instances!(cross_entropy_block_entries, "ops-bf16", Bf16, "bf16", 8);
with_op_instances!(cross_entropy_block_entries, "ops-f16", F16, "f16", 8);
