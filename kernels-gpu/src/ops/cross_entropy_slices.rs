//! Cross-entropy over row slices (`cross_entropy_slices_*`): each row is cut into `slices`
//! slices of 16-byte packs, a block each, which keeps its slice in shared memory between the
//! statistics pass and the gradient's write, as the softmax's row slices keep theirs
//! ([`SliceShare`]). The blocks of a row exchange their statistics through global memory in
//! an ordinary launch, so rows run in waves as blocks free their places; a block that waits
//! too long for its row leaves its slice to the row's last block, which writes it from the
//! logits (never written before that, in place too). The loss, the log-sum-exp and the
//! gradient are those of the block entries ([`CrossEntropyRow`], whose module documents
//! them); the thread that holds the target's column writes the loss, and whichever block
//! writes a row's first slice writes what the row has besides (its log-sum-exp; the loss of a
//! row without a target column).

use crate::launch::REDUCTION_SCRATCH_FLOATS;
use crate::launch::cross_entropy::CrossEntropyParams;
use crate::primitives::device::{block_idx, dynamic_shared_f32, thread_idx};
use crate::primitives::element::Element;
use crate::primitives::online::OnlineStats;
use crate::primitives::reduce::block_reduce;
use crate::primitives::row_exchange::{
    RowExchange, exchange_row_stats_or_leave, stagger_first_wave, take_left_slice,
};
use crate::primitives::slice_share::SliceShare;

use super::cross_entropy_block::CrossEntropyRow;
use super::row_kernel::RowKernel;

/// The cross-entropy of the slice of block `block_idx = row · slices + slice` (see the
/// module's documentation).
///
/// # Safety
/// The contract of [`CrossEntropyParams`] with `aligned` and `cols` a multiple of `PACK` (16
/// bytes of the module's type), in mode `FULL`, without label smoothing or a softcap and over
/// the whole vocabulary (`column_offset` 0, `vocab` = `cols`), for a launch of `rows ·
/// slices` blocks of whole warps, at most 1024 threads, with `slices · slice_packs · PACK ≥
/// cols` and `REDUCTION_SCRATCH_FLOATS · 4 + cached · slice_packs · 16` bytes of dynamic
/// shared memory (`cached` 0 or 1). Where `slices` is more than 1: `partials` holds two
/// floats per block, `barriers` `2 · rows + rows · slices` words zeroed when allocated, used
/// by one launch at a time and preceded by
/// [`BARRIER_HEADER_WORDS`](crate::launch::BARRIER_HEADER_WORDS) more, and `slices` is at most
/// [`MAX_PARTICIPANTS`](crate::primitives::barrier_word::MAX_PARTICIPANTS). The blocks need
/// not be resident together. In place, each thread reads its packs before it writes them,
/// and no thread reads a pack another writes. Rows below `stagger_rows` start `row ·
/// stagger_ns` ns late ([`stagger_first_wave`]); any values of the two are safe.
#[inline(always)]
pub unsafe fn cross_entropy_slices<In: Element, const PACK: usize>(p: &CrossEntropyParams) {
    let slices = p.slices.max(1) as usize;
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    stagger_first_wave(row as u32, p.stagger_rows, p.stagger_ns);
    // SAFETY: `row < rows` (`slices` blocks per row).
    let kernel = unsafe { <CrossEntropyRow<In> as RowKernel<PACK>>::for_row(p, row) };
    let share = |slice: usize| {
        // SAFETY: the row holds `cols` elements from its start, which is 16-byte aligned with
        // `cols` a multiple of `PACK`: no element lies outside the packs. `slice < slices`,
        // and `slices · slice_packs · PACK ≥ cols` (the contract).
        unsafe {
            SliceShare::<In, PACK>::of_row(
                kernel.logits(),
                p.cols as usize,
                slices,
                p.slice_packs as usize,
                slice,
            )
        }
    };
    let shared = dynamic_shared_f32();
    // SAFETY: the launch provides the scratch followed by the cache when `cached`.
    let cache = (p.cached != 0)
        .then(|| unsafe { shared.add(REDUCTION_SCRATCH_FLOATS as usize).cast::<u8>() });
    let mine = share(slice);
    // SAFETY: the cache holds the slice's packs (contract); uniform control flow.
    let block_stats = unsafe { block_reduce(mine.stats(cache), shared) };
    let (row_stats, leavers) = if slices == 1 {
        (block_stats, 0)
    } else {
        // SAFETY: forwarded from the contract for sliced launches.
        let exchange = unsafe {
            exchange_row_stats_or_leave(
                block_stats,
                shared,
                p.partials as *mut f32,
                p.barriers as *mut u32,
                row,
                slices,
                p.patience_ns,
            )
        };
        match exchange {
            RowExchange::Merged { row_stats, leavers } => (row_stats, leavers),
            RowExchange::Left => return,
        }
    };
    // The row's finished constants, the same for every slice this block writes.
    let finished =
        <CrossEntropyRow<In> as RowKernel<PACK>>::finish::<1>(&kernel, row_stats, row_stats);
    // SAFETY: the packs this thread read (and cached) in the first pass.
    unsafe { write_slice(&kernel, &mine, cache, (row_stats, finished), slice == 0) };
    // The row's last block writes the slices whose blocks left, reading them again.
    for _ in 0..leavers {
        // SAFETY: the last block of its row, with `leavers` flags to take; uniform control
        // flow (`leavers` came to every thread through the block barrier). The slice left
        // was never written, so its logits are still there in place.
        unsafe {
            let left = take_left_slice(shared, p.barriers as *mut u32, row, slices);
            write_slice(
                &kernel,
                &share(left),
                None,
                (row_stats, finished),
                left == 0,
            );
        }
    }
}

/// Writes the gradient (and the loss, where it holds the target's column) of this thread's
/// packs of `share`, and, where `first` (the row's first slice), what the row has besides,
/// from the row's merged statistics and the constants `finish` derived from them.
///
/// # Safety
/// As [`SliceShare::visit_packs`], with the row's statistics merged.
#[inline(always)]
unsafe fn write_slice<In: Element, const PACK: usize>(
    kernel: &CrossEntropyRow<In>,
    share: &SliceShare<In, PACK>,
    cache: Option<*mut u8>,
    (row_stats, finished): (
        OnlineStats,
        <CrossEntropyRow<In> as RowKernel<PACK>>::Finished,
    ),
    first: bool,
) {
    // SAFETY: forwarded; each write is to the columns of the pack read.
    unsafe {
        share.visit_packs(cache, |column, words| {
            <CrossEntropyRow<In> as RowKernel<PACK>>::write(kernel, column, None, words, finished)
        })
    };
    if first && thread_idx() == 0 {
        // SAFETY: `for_row` pointed the row's outputs at this row.
        unsafe { <CrossEntropyRow<In> as RowKernel<PACK>>::write_row(kernel, row_stats) };
    }
}

/// The row-slices entry of each operation module's input type, 16-byte packs only
/// (`cross_entropy_slices_bf16`).
macro_rules! cross_entropy_slices_entries {
    ($($module:literal: $element:ty, $name:literal, $pack:literal;)+) => {$(
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(cross_entropy_slices $name),
            (params: CrossEntropyParams) => cross_entropy_slices::<$element, $pack>(&params)
        );
    )+};
}

super::with_operation_types!(cross_entropy_slices_entries);
