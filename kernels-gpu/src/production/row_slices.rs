//! Production fallback for rows too wide for registers: each row is cut into `slices` contiguous
//! slices and each slice goes to one block, which keeps it in shared memory (when it fits), so the
//! input is read once; otherwise the second pass re-reads it (from L2 when the tensor fits there).
//! 16-byte access as in [`EdgePerThreadSlice`]. With one slice per row this is a block-per-row
//! kernel; with several, the blocks of a row exchange their online statistics through global memory
//! behind a per-row barrier. The launch is an ordinary one (so it takes the programmatic overlap
//! with the kernel before it), and its blocks need not be resident together: a block whose row is
//! still incomplete after a patience (blocks of other kernels holding the places its row's other
//! blocks need) leaves, and the row's last block writes the slice it left, reading it again. One
//! template for every element type (f32 in the softmax module, bf16 and f16 in their operation
//! modules): math in f32, the cache holds the elements as they were read.

use super::slice_softmax::SliceSoftmax;
use crate::launch::softmax::{SoftmaxParams, with_softmax_param_fields};
use crate::launch::{REDUCTION_SCRATCH_FLOATS, entry_name};
use crate::primitives::device::dynamic_shared_f32;
use crate::primitives::element::Element;
use crate::primitives::entry::softmax_entry;
use crate::primitives::reduce::block_reduce;
use crate::primitives::row_exchange::{
    RowExchange, exchange_row_stats_or_leave, stagger_first_wave, take_left_slice,
};

/// # Safety
/// Of `params`: `input` and `output` each point to `rows · cols` elements (distinct buffers), `cols > 0`;
/// when `PACK > 1` (16-byte packs) they are equally misaligned modulo 16 bytes.
/// `slices · slice_packs · PACK ≥ cols - (PACK - 1)`. Launch `rows · slices` blocks of whole
/// warps (at most 1024 threads) with `REDUCTION_SCRATCH_FLOATS · 4 + cached · slice_packs ·
/// PACK · size_of::<E>()` bytes of dynamic shared memory, where `cached` is 0 or 1. When
/// `slices > 1`: `partials` holds `2 · rows · slices` floats, `barriers` holds
/// `2 · rows + rows · slices` words zeroed when allocated and used by one launch at a time,
/// preceded by `BARRIER_HEADER_WORDS` words whose first counts the blocks that left (kept, not
/// reset), and `slices` ≤ `barrier_word::MAX_PARTICIPANTS`. The blocks need not be resident together:
/// a block whose row is still incomplete after `patience_ns` leaves its slice to the row's
/// last block. Rows below `stagger_rows` start `row · stagger_ns` ns late
/// ([`stagger_first_wave`]); any values of the two are safe.
#[inline(always)]
unsafe fn softmax_row_slices<E: Element, const PACK: usize>(params: &SoftmaxParams) {
    let (input, output) = (
        params.input.cast::<E>(),
        params.output.cast::<E>().cast_mut(),
    );
    let (cols, slices, slice_packs) = (params.cols, params.slices, params.slice_packs);
    let cached = params.cached;
    let (partials, barriers) = (
        params.partials.cast::<f32>().cast_mut(),
        params.barriers.cast::<u32>().cast_mut(),
    );
    let patience_ns = params.patience_ns;
    let shared = dynamic_shared_f32();
    // SAFETY: the launch provides the scratch followed by the cache when cached.
    let cache = (cached != 0)
        .then(|| unsafe { shared.add(REDUCTION_SCRATCH_FLOATS as usize).cast::<u8>() });
    // SAFETY: forwarded from this kernel's contract.
    let share =
        unsafe { SliceSoftmax::<E, PACK>::of_block(input, output, cols, slices, slice_packs) };
    stagger_first_wave(share.row as u32, params.stagger_rows, params.stagger_ns);
    // SAFETY: as above; uniform control flow.
    let block_stats = unsafe { block_reduce(share.stats(cache), shared) };
    if share.slices == 1 {
        // SAFETY: as above.
        unsafe { share.write_normalized(cache, block_stats) };
        return;
    }
    // SAFETY: forwarded from this kernel's contract for sliced launches.
    let exchange = unsafe {
        exchange_row_stats_or_leave(
            block_stats,
            shared,
            partials,
            barriers,
            share.row,
            share.slices,
            patience_ns,
        )
    };
    let RowExchange::Merged { row_stats, leavers } = exchange else {
        return;
    };
    // SAFETY: as above.
    unsafe { share.write_normalized(cache, row_stats) };
    // The row's last block writes the slices whose blocks left, reading them again.
    for _ in 0..leavers {
        // SAFETY: the last block of its row, with `leavers` flags to take; uniform control
        // flow (`leavers` came to every thread through the block barrier).
        unsafe {
            let slice = take_left_slice(shared, barriers, share.row, share.slices);
            SliceSoftmax::<E, PACK>::of_slice(
                input,
                output,
                cols,
                share.slices,
                slice_packs as usize,
                share.row,
                slice,
            )
            .write_normalized(None, row_stats);
        }
    }
}

/// One entry per element type and pack width, behind the `kernels_module` cfg of the PTX
/// module that holds it, named by [`entry_name!`] (`softmax_row_slices[_<type>]_p<pack>`) as
/// [`crate::launch::softmax::RowSlicesKernelName`] writes it.
macro_rules! row_slices_entries {
    ($($module:literal: $element:ty, ($($name:tt)+);)+) => {$(
        with_softmax_param_fields!(
            softmax_entry,
            [#[cfg(kernels_module = $module)]],
            (entry_name!($($name)+)),
            (|params| softmax_row_slices::<$element, { entry_pack!($($name)+) }>(&params))
        );
    )+};
}

/// The pack of a row-slices entry's name: its last piece.
macro_rules! entry_pack {
    (row_slices_f32 $pack:literal) => {
        $pack
    };
    (row_slices $input:literal $pack:literal) => {
        $pack
    };
}

row_slices_entries! {
    "softmax": f32, (row_slices_f32 4);
    "softmax": f32, (row_slices_f32 1);
    "ops-bf16": crate::primitives::element::Bf16, (row_slices "bf16" 8);
    "ops-bf16": crate::primitives::element::Bf16, (row_slices "bf16" 1);
    "ops-f16": crate::primitives::element::F16, (row_slices "f16" 8);
    "ops-f16": crate::primitives::element::F16, (row_slices "f16" 1);
}
