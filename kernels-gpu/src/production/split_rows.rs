//! Production kernels for few, wide rows, in two ordinary launches: the first computes the
//! statistics of each slice of each row, the second merges a row's statistics and writes its
//! slices. The second pass re-reads the input, from L2 when the tensor fits there, so device
//! memory still sees about one read and one write; no block waits for another, so nothing
//! needs to be resident at once.

use crate::primitives::device::dynamic_shared_f32;
use crate::primitives::entry::kernel_entry;
use crate::primitives::reduce::block_reduce;
use crate::primitives::row_exchange::{merge_row_stats, publish_block_stats};
use crate::production::row_slices::SliceSoftmax;

/// Pass one: the statistics of each block's share, into `partials`.
///
/// # Safety
/// The row-slices contract without the cache (see `softmax_row_slices`), with `partials`
/// holding `2 · rows · slices` floats.
#[inline(always)]
unsafe fn split_stats<const PACK: usize>(
    input: *const f32,
    cols: u32,
    slices: u32,
    slice_packs: u32,
    partials: *mut f32,
) {
    let scratch = dynamic_shared_f32();
    // SAFETY: forwarded; the output is not touched in this pass.
    let share = unsafe {
        SliceSoftmax::<f32, PACK>::of_block(input, core::ptr::null_mut(), cols, slices, slice_packs)
    };
    // SAFETY: uniform control flow; the launch provides the scratch; no cache.
    let stats = unsafe { block_reduce(share.stats(None), scratch) };
    if crate::primitives::device::thread_idx() == 0 {
        // SAFETY: forwarded from the contract.
        unsafe { publish_block_stats(stats, partials) };
    }
}

/// Pass two: merges each row's statistics and writes every share.
///
/// # Safety
/// As [`split_stats`] with the same shape and slicing, launched after it on the same stream.
#[inline(always)]
unsafe fn split_normalize<const PACK: usize>(
    input: *const f32,
    output: *mut f32,
    cols: u32,
    slices: u32,
    slice_packs: u32,
    partials: *const f32,
) {
    let scratch = dynamic_shared_f32();
    // SAFETY: forwarded from the contract.
    unsafe {
        let share = SliceSoftmax::<f32, PACK>::of_block(input, output, cols, slices, slice_packs);
        let row_stats = merge_row_stats(scratch, partials, share.row, share.slices);
        share.write_normalized(None, row_stats);
    }
}

macro_rules! split_entries {
    ($($pack:literal),+) => {$(
        kernel_entry!(
            export concat!("softmax_split_stats_p", $pack),
            (input: *const f32, cols: u32, slices: u32, slice_packs: u32, partials: *mut f32)
                => split_stats::<$pack>(input, cols, slices, slice_packs, partials)
        );
        kernel_entry!(
            export concat!("softmax_split_normalize_p", $pack),
            (
                input: *const f32,
                output: *mut f32,
                cols: u32,
                slices: u32,
                slice_packs: u32,
                partials: *const f32,
            ) => split_normalize::<$pack>(input, output, cols, slices, slice_packs, partials)
        );
    )+};
}

split_entries!(4, 1);
