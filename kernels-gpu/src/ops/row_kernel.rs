//! What an operation kernel does to one row, apart from how threads share the row: read a
//! pack of columns (applying scale and masks), reduce the packs to a [`Partial`] result,
//! and write a pack of outputs from the row's result. The directions implement it
//! ([`super::forward`]: softmax, log-softmax and log-sum-exp; [`super::backward`]: their
//! gradients); the families ([`super::rows`], [`super::block`]) run any of them, through the
//! slot layouts of [`super::slots`]. This file holds what both directions share.

use crate::launch::ops::{DType, RowOpParams};
use crate::primitives::element::store_as;
use crate::primitives::reduce::{Partial, block_reduce, group_reduce};

/// One row's work, with `PACK` columns per load.
pub trait RowKernel<const PACK: usize>: Sized {
    /// The launch's one parameter: [`RowOpParams`] for the operation directions, the
    /// cross-entropy's own for its block entries.
    type Params;
    /// What one pack of columns keeps in registers between the reduction and the writes.
    type Values: Copy;
    type Stats: Partial;
    /// Per-row constants the writes need, derived once from the row's result.
    type Finished: Copy;
    /// The values of a pack past the row's end: neutral for the reduction.
    const PAD: Self::Values;

    /// # Safety
    /// `row < params.rows`, and `params` satisfies its kernels' contract.
    unsafe fn for_row(params: &Self::Params, row: usize) -> Self;

    /// # Safety
    /// `col..col + PACK` lies in the row and is aligned as the launch's layout promises.
    unsafe fn load(&self, col: usize) -> Self::Values;

    /// This thread's result over its packs; may rewrite the packs into what
    /// [`RowKernel::write`] needs (a narrow forward thread keeps its exponentials or
    /// differences; the reductions below may too).
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
    /// thread's own partial result over its `PACKS` packs (the `PACKS` its reduction took,
    /// which decides what the reduction kept in the packs).
    fn finish<const PACKS: usize>(&self, row: Self::Stats, mine: Self::Stats) -> Self::Finished;

    /// Writes the outputs of the pack at `col`: all of them, or with `run = Some(count)` the
    /// first `count` (a row's unaligned end, read by [`PeelableRow::load_run`]), as
    /// [`store_outputs`] stores them.
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

/// A row kernel that can also read a row's unaligned ends as runs shorter than a pack (its
/// [`RowKernel::write`] writes them back with `run`), for rows that need not start on a 16-byte
/// boundary (see [`crate::primitives::row_part`]). The masked forward is not one: its mask rows are
/// laid out independently of the input's.
pub trait PeelableRow<const PACK: usize>: RowKernel<PACK> {
    /// Elements of the row's input before its first 16-byte boundary.
    fn head(&self) -> usize;

    /// `count` (< `PACK`) elements from column `start` into a pack whose other slots are
    /// padding: half a pack in one access, any other run one element at a time.
    ///
    /// # Safety
    /// `start..start + count` lies in the row; a run of half a pack lies at addresses aligned
    /// to its size in every buffer of the row. A row's unaligned ends are, under the
    /// [`Peeled`](super::slots::Peeled) contract: rows at least a pack long have a head that
    /// ends on a 16-byte boundary and a tail that starts on one, and every buffer's rows are
    /// misaligned alike, so such a run starts at an element index that is a multiple of its
    /// length in each of them. (A row shorter than a pack may end before its first boundary;
    /// the contract leaves such rows to single elements.)
    unsafe fn load_run(&self, start: usize, count: usize) -> Self::Values;
}

/// Stores `outputs` as `dtype` (a [`DType`] as `u32`) at column `col` of the row at `base`:
/// the whole pack, or with `run = Some(count)` its first `count` elements, as one access when
/// they are half the pack, else one at a time.
///
/// # Safety
/// As [`store_as`] for the pack, or for each element of the run; a run of half the pack lies
/// at addresses aligned to its size (as [`PeelableRow::load_run`] requires).
#[inline(always)]
pub(super) unsafe fn store_outputs<const PACK: usize>(
    dtype: u32,
    base: u64,
    col: usize,
    run: Option<usize>,
    outputs: [f32; PACK],
) {
    // The half pack in its two sizes (a store of `PACK / 2` cannot be named generically):
    // 16-byte packs are 8 16-bit or 4 f32 input elements, as `Element::load_packed_runs`
    // reads them.
    // SAFETY (every arm): forwarded from the contract.
    match run {
        None => unsafe { store_as::<PACK>(dtype, base, col, outputs) },
        Some(4) if PACK == 8 => unsafe {
            store_as::<4>(dtype, base, col, core::array::from_fn(|i| outputs[i]))
        },
        Some(2) if PACK == 4 => unsafe {
            store_as::<2>(dtype, base, col, core::array::from_fn(|i| outputs[i]))
        },
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
pub(super) unsafe fn row_scale(p: &RowOpParams, row: usize) -> f32 {
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
pub(super) fn row_start(base: u64, row: usize, stride: u64, dtype: DType) -> u64 {
    base + row as u64 * stride * dtype.bytes() as u64
}

/// The output element type of a launch.
#[inline(always)]
pub(super) fn output_dtype(p: &RowOpParams) -> DType {
    match p.output_dtype {
        1 => DType::Bf16,
        2 => DType::F16,
        _ => DType::F32,
    }
}
