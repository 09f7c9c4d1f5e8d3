//! How threads share rows in the operation kernels: a group of up to 32 lanes per row
//! ([`op_rows`]), or a block per row or per slice of a row ([`op_block`]). Either keeps its
//! packs in registers between the reduction and the writes, so each input is read once. The
//! entries are generated at the bottom, one set per input type behind that type's feature,
//! from the same instance lists as [`crate::row_ops`]'s tables.

use crate::device::{block_dim, block_idx, dynamic_shared_f32, thread_idx};
use crate::element::{Bf16, F16};
use crate::row_exchange::exchange_row_stats;
use crate::row_kernel::{
    Backward, Forward, MaskedForward, RowKernel, merged_states, store_slice_state, store_state,
};
use crate::row_ops::{RowOpParams, mode};

/// Rows of at most `LANES · PACKS · PACK` columns, each held by a group of `LANES` lanes.
///
/// # Safety
/// The operation contract: every buffer named in `p` holds its rows at its stride (mask rows
/// `cols` long), `0 < cols ≤ LANES · PACKS · PACK`, and when `PACK > 1`, `cols` is a
/// multiple of `PACK` and every row start is aligned to `PACK` elements of its buffer (16
/// bytes at most). Blocks of whole warps, `LANES` divides 32, and
/// `ceil(rows / (block_dim / LANES))` blocks. In-place operation (output = input) is allowed:
/// each element is read before it is written, by the same thread.
#[inline(always)]
pub unsafe fn op_rows<
    K: RowKernel<PACK>,
    const PACK: usize,
    const LANES: u32,
    const PACKS: usize,
>(
    p: &RowOpParams,
) {
    let lane = (thread_idx() % LANES) as usize;
    let row = (block_idx() * (block_dim() / LANES) + thread_idx() / LANES) as usize;
    let live = row < p.rows as usize;
    let cols = p.cols as usize;
    let column = |pack: usize| (pack * LANES as usize + lane) * PACK;
    // Lanes past the last row keep running on the last row's pointers with padding values
    // (the shuffles need all 32); they load, store and write nothing.
    // SAFETY: the clamped row is < rows.
    let kernel = unsafe { K::for_row(p, row.min(p.rows as usize - 1)) };

    let mut values = [K::PAD; PACKS];
    for pack in 0..PACKS {
        if live && column(pack) < cols {
            // SAFETY: column(pack) + PACK ≤ cols, aligned per the contract.
            values[pack] = unsafe { kernel.load(column(pack)) };
        }
    }
    let (group, mine) = kernel.group_partial::<PACKS, LANES>(&mut values);
    let stats = if p.mode == mode::APPLY_STATES {
        // SAFETY: the states buffer holds the row's slots (contract of that mode).
        unsafe { merged_states(p, row.min(p.rows as usize - 1)) }
    } else {
        group
    };
    if !live {
        return;
    }
    if p.mode == mode::STATES {
        if lane == 0 {
            // SAFETY: as above.
            unsafe { store_state(p, row, stats) };
        }
        return;
    }
    let finished = kernel.finish(stats, mine);
    for pack in 0..PACKS {
        if column(pack) < cols {
            // SAFETY: as for the loads.
            unsafe { kernel.write(column(pack), values[pack], finished) };
        }
    }
    if lane == 0 {
        // SAFETY: row < rows.
        unsafe { kernel.write_row(stats) };
    }
}

/// A row, or one of `slices` slices of `slice_packs` packs of it, held by a block of
/// `THREADS` threads with up to `PACKS` packs each.
///
/// # Safety
/// The operation contract of [`op_rows`], with `cols` a multiple of `PACK`,
/// `THREADS · PACKS ≥ slice_packs` and `slices · slice_packs · PACK ≥ cols`. Launch
/// `rows · slices` blocks of `THREADS` threads with `REDUCTION_SCRATCH_FLOATS · 4` bytes of
/// dynamic shared memory. When `slices > 1`: `partials` holds two floats per block,
/// `barriers` two words per row zeroed when allocated and used by one launch at a time, and
/// every block is resident at once (cooperative launch), except in mode `SLICE_STATES`,
/// where each block only stores its slice's state, and `APPLY_STATES`. In-place operation is allowed: each
/// thread reads its packs before it writes them, and no thread reads another's.
#[inline(always)]
pub unsafe fn op_block<
    K: RowKernel<PACK>,
    const PACK: usize,
    const THREADS: usize,
    const PACKS: usize,
>(
    p: &RowOpParams,
) {
    let slices = p.slices as usize;
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    let tid = thread_idx() as usize;
    let row_packs = p.cols as usize / PACK;
    let first = slice * p.slice_packs as usize;
    let end = (first + p.slice_packs as usize).min(row_packs);
    let pack_of = |i: usize| first + i * THREADS + tid;
    // SAFETY: row < rows.
    let kernel = unsafe { K::for_row(p, row) };

    let mut values = [K::PAD; PACKS];
    for i in 0..PACKS {
        if pack_of(i) < end {
            // SAFETY: the pack lies in the row, aligned per the contract.
            values[i] = unsafe { kernel.load(pack_of(i) * PACK) };
        }
    }
    let scratch = dynamic_shared_f32();
    let (stats, mine) = if p.mode == mode::APPLY_STATES {
        // SAFETY: the states buffer holds the row's slots (contract of that mode).
        (
            unsafe { merged_states(p, row) },
            kernel.partial(&mut values),
        )
    } else {
        // SAFETY: uniform control flow; the launch provides the scratch.
        let (block, mine) = unsafe { kernel.block_partial(&mut values, scratch) };
        if p.mode == mode::SLICE_STATES {
            if tid == 0 {
                // SAFETY: the states buffer holds `slices` slots of `rows` states.
                unsafe { store_slice_state(p, row, slice, block) };
            }
            return;
        }
        let row_stats = if slices > 1 {
            // SAFETY: forwarded from the contract for sliced launches.
            unsafe {
                exchange_row_stats(
                    block,
                    scratch,
                    p.partials as *mut f32,
                    p.barriers as *mut u32,
                    row,
                    slices,
                )
            }
        } else {
            block
        };
        (row_stats, mine)
    };
    let leader = tid == 0 && slice == 0;
    if p.mode == mode::STATES {
        if leader {
            // SAFETY: as above.
            unsafe { store_state(p, row, stats) };
        }
        return;
    }
    let finished = kernel.finish(stats, mine);
    for i in 0..PACKS {
        if pack_of(i) < end {
            // SAFETY: as for the loads.
            unsafe { kernel.write(pack_of(i) * PACK, values[i], finished) };
        }
    }
    if leader {
        // SAFETY: row < rows.
        unsafe { kernel.write_row(stats) };
    }
}

/// Forward, masked forward and backward group-per-row entries for one input type and pack width.
macro_rules! op_rows_entries {
    ($feature:literal, $input:ty, $name:literal, $pack:literal, [$(($lanes:literal, $packs:literal)),+]) => {$(
        #[cfg(feature = $feature)]
        const _: () = {
            /// # Safety
            /// See [`op_rows`].
            #[unsafe(export_name = concat!("op_rows_fwd_", $name, "_p", $pack, "_l", $lanes, "_n", $packs))]
            unsafe extern "ptx-kernel" fn forward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_rows::<Forward<$input>, $pack, $lanes, $packs>(&params) }
            }

            /// # Safety
            /// See [`op_rows`].
            #[unsafe(export_name = concat!("op_rows_mfwd_", $name, "_p", $pack, "_l", $lanes, "_n", $packs))]
            unsafe extern "ptx-kernel" fn masked_forward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_rows::<MaskedForward<$input>, $pack, $lanes, $packs>(&params) }
            }

            /// # Safety
            /// See [`op_rows`].
            #[unsafe(export_name = concat!("op_rows_bwd_", $name, "_p", $pack, "_l", $lanes, "_n", $packs))]
            unsafe extern "ptx-kernel" fn backward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_rows::<Backward<$input>, $pack, $lanes, $packs>(&params) }
            }
        };
    )+};
}

/// Forward, masked forward and backward block entries for one input type and pack width.
macro_rules! op_block_entries {
    ($feature:literal, $input:ty, $name:literal, $pack:literal, [$(($threads:literal, $packs:literal)),+]) => {$(
        #[cfg(feature = $feature)]
        const _: () = {
            /// # Safety
            /// See [`op_block`].
            #[unsafe(export_name = concat!("op_block_fwd_", $name, "_p", $pack, "_t", $threads, "_n", $packs))]
            unsafe extern "ptx-kernel" fn forward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_block::<Forward<$input>, $pack, $threads, $packs>(&params) }
            }

            /// # Safety
            /// See [`op_block`].
            #[unsafe(export_name = concat!("op_block_mfwd_", $name, "_p", $pack, "_t", $threads, "_n", $packs))]
            unsafe extern "ptx-kernel" fn masked_forward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_block::<MaskedForward<$input>, $pack, $threads, $packs>(&params) }
            }

            /// # Safety
            /// See [`op_block`].
            #[unsafe(export_name = concat!("op_block_bwd_", $name, "_p", $pack, "_t", $threads, "_n", $packs))]
            unsafe extern "ptx-kernel" fn backward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_block::<Backward<$input>, $pack, $threads, $packs>(&params) }
            }
        };
    )+};
}

/// Every operation entry of one input type, from the instance lists of
/// `crate::row_ops::with_op_instances` (the host's tables come from the same lists).
macro_rules! op_entries_for {
    (
        $feature:literal, $input:ty, $name:literal, $vector:literal,
        rows_vector [$($rows_vector:tt),+],
        rows_scalar [$($rows_scalar:tt),+],
        block_vector [$($block_vector:tt),+],
        block_scalar [$($block_scalar:tt),+]
    ) => {
        op_rows_entries!($feature, $input, $name, $vector, [$($rows_vector),+]);
        op_rows_entries!($feature, $input, $name, 1, [$($rows_scalar),+]);
        op_block_entries!($feature, $input, $name, $vector, [$($block_vector),+]);
        op_block_entries!($feature, $input, $name, 1, [$($block_scalar),+]);
    };
}

with_op_instances!(op_entries_for, "ops-f32", f32, "f32", 4);
with_op_instances!(op_entries_for, "ops-bf16", Bf16, "bf16", 8);
with_op_instances!(op_entries_for, "ops-f16", F16, "f16", 8);
