//! The block operation kernels: a block holds a row, or one slice of it, in registers between
//! the reduction and the writes, so each input is read once; the blocks of a sliced row
//! exchange their statistics (through distributed shared memory when they form one
//! thread-block cluster, else through global memory in one cooperative launch) or store them
//! for a later launch. Its entries are generated at the bottom, one set per input type behind
//! that type's module cfg, from the instance lists the host's tables come from
//! ([`crate::launch::ops`]).

use crate::launch::ops::{RowOpParams, mode, with_op_instances};
use crate::launch::{REDUCTION_SCRATCH_FLOATS, WARP_SIZE};
use crate::primitives::device::{block_dim, block_idx, dynamic_shared_f32, recomputed, thread_idx};
#[cfg(kernels_module = "ops-bf16")]
use crate::primitives::element::Bf16;
#[cfg(kernels_module = "ops-f16")]
use crate::primitives::element::F16;
use crate::primitives::row_exchange::{
    arrive_at_row_cluster, exchange_cluster_pushed, exchange_row_stats, row_is_cluster,
};
use crate::primitives::row_part::Share;

use super::backward::Backward;
use super::forward::{Forward, KeptForward, MaskedForward};
use super::op_entries;
use super::row_kernel::RowKernel;
use super::slots::{Aligned, PeeledApart, Slots};
use super::states::{block_merged_states, store_slice_state, store_state};

/// A row, or one of `slices` slices of `slice_packs` packs of it, held by a block of
/// `threads = block_dim` threads with up to `PACKS` packs each (the block size is a launch
/// parameter, so one entry serves every block size).
///
/// # Safety
/// The operation contract of [`op_rows`](super::rows::op_rows): its buffers, and the
/// layout's conditions on rows ([`Aligned`]; [`PeeledApart`] as
/// [`Peeled`](super::slots::Peeled) there) but not its capacity bound on `cols`. Instead `slices ·
/// slice_packs ≥ cols / PACK` (the body's packs) and `threads · PACKS ≥ slice_packs`; for
/// [`PeeledApart`] rows `threads · (PACKS - 1) ≥ slice_packs` and `threads ≥ END_SLOTS` (the
/// last slot of threads 0 and 1 holds the row's ends, in slice 0). Launch `rows · slices`
/// blocks of whole warps, at most 1024 threads, with `REDUCTION_SCRATCH_FLOATS · 4` bytes of
/// dynamic shared memory. When `slices > 1`, in modes `FULL` and `STATES`, either the launch
/// is in thread-block clusters of `slices` blocks (the sm_90 build; `slices` at most
/// [`MAX_CLUSTER_BLOCKS`](crate::launch::MAX_CLUSTER_BLOCKS)), each block with
/// `(REDUCTION_SCRATCH_FLOATS + pushed_cluster_floats(threads, slices)) · 4` bytes of dynamic
/// shared memory ([`pushed_cluster_floats`](crate::launch::pushed_cluster_floats); the
/// clusters need not all be resident at once: they may run in waves), or
/// `partials` holds two floats per block, `barriers` two words per row zeroed when allocated
/// and used by one launch at a time, and every block is resident at once (cooperative
/// launch). In mode `SLICE_STATES` each block only stores its slice's state, and
/// `APPLY_STATES` merges stored states: neither exchanges statistics, and a launch of either
/// in clusters leaves its clusters unused. In-place operation is
/// allowed: each thread reads its packs before it writes them, and no thread reads another's.
#[inline(always)]
pub unsafe fn op_block<
    K: RowKernel<PACK, Params = RowOpParams>,
    L: Slots<K, PACK>,
    const PACK: usize,
    const PACKS: usize,
>(
    p: &RowOpParams,
) {
    let slices = p.slices as usize;
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    let tid = thread_idx() as usize;
    let threads = block_dim() as usize;
    // A sliced row whose blocks form one thread-block cluster exchanges its statistics
    // through distributed shared memory (sm_90); otherwise through global memory.
    // (The two-launch modes never run in clusters.) Its blocks arrive at the cluster's
    // barrier before any load (the row's constants included: the arrival's release would
    // wait for them): the exchange waits there until every block has started.
    let clustered = p.slices > 1
        && p.mode != mode::SLICE_STATES
        && p.mode != mode::APPLY_STATES
        && row_is_cluster(p.slices);
    if clustered {
        arrive_at_row_cluster();
    }
    // SAFETY: row < rows.
    let kernel = unsafe { K::for_row(p, row) };
    let share = Share {
        cols: p.cols as usize,
        slice,
        slice_packs: p.slice_packs as usize,
    };
    // SAFETY: the share lies in the row, laid out per the contract.
    let mut values = unsafe { L::load::<PACKS>(&kernel, share, threads, tid) };
    let scratch = dynamic_shared_f32();
    let (stats, mine) = if p.mode == mode::APPLY_STATES {
        // SAFETY: the states buffer holds the row's slots (contract of that mode); uniform
        // control flow; the launch provides the scratch.
        (
            unsafe { block_merged_states(p, row, scratch) },
            kernel.partial(&mut values),
        )
    } else if clustered {
        // Each warp's statistics go to every block of the cluster; no block reduction.
        let (warp, mine) = kernel.group_partial::<PACKS, WARP_SIZE>(&mut values);
        // SAFETY: every thread arrived at the cluster's barrier before its loads; the
        // slots follow the scratch (contract for launches in clusters).
        let row_stats = unsafe {
            exchange_cluster_pushed(
                warp,
                scratch.add(REDUCTION_SCRATCH_FLOATS as usize),
                p.slices,
            )
        };
        (row_stats, mine)
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
            // SAFETY: forwarded from the contract for cooperative sliced launches.
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
    let finished = kernel.finish::<PACKS>(stats, mine);
    // The write addresses are computed anew rather than kept from the loads across the
    // reduction (one register pair per pack).
    let (threads, tid) = (
        recomputed(threads as u32) as usize,
        recomputed(tid as u32) as usize,
    );
    // SAFETY: as for the loads.
    unsafe { L::write::<PACKS>(&kernel, share, threads, tid, &values, finished) };
    if leader {
        // SAFETY: row < rows.
        unsafe { kernel.write_row(stats) };
    }
}

/// Every block entry of one input type, from the instance lists of [`with_op_instances`]:
/// each layout ([`Aligned`] with 16-byte packs, the masked forward's apart, and with single
/// elements; [`PeeledApart`], whose instances hold one more slot per thread for the row's
/// ends) and its directions.
macro_rules! block_entries_for {
    (
        $module:literal, $input:ty, $name:literal, $vector:literal,
        rows_vector $rows_vector:tt,
        rows_peeled $rows_peeled:tt,
        rows_masked $rows_masked:tt,
        rows_scalar $rows_scalar:tt,
        block_vector $block_vector:tt,
        block_kept $block_kept:tt,
        block_masked $block_masked:tt,
        block_scalar $block_scalar:tt
    ) => {
        op_entries!(
            ($module, $input, $name),
            op_block,
            (Aligned, 0),
            $vector,
            "",
            [("fwd", Forward), ("bwd", Backward)],
            $block_vector
        );
        op_entries!(
            ($module, $input, $name),
            op_block,
            (Aligned, 0),
            $vector,
            "",
            [("mfwd", MaskedForward)],
            $block_masked
        );
        op_entries!(
            ($module, $input, $name),
            op_block,
            (Aligned, 0),
            1,
            "",
            [("fwd", Forward), ("mfwd", MaskedForward), ("bwd", Backward)],
            $block_scalar
        );
        op_entries!(
            ($module, $input, $name),
            op_block,
            (PeeledApart, 1),
            $vector,
            "peeled",
            [("fwd", Forward), ("bwd", Backward)],
            $block_vector
        );
        op_entries!(
            ($module, $input, $name),
            op_block,
            (Aligned, 0),
            $vector,
            "kept",
            [("fwd", KeptForward)],
            $block_kept
        );
        op_entries!(
            ($module, $input, $name),
            op_block,
            (PeeledApart, 1),
            $vector,
            "peeledkept",
            [("fwd", KeptForward)],
            $block_kept
        );
    };
}

with_op_instances!(block_entries_for, "ops-f32", f32, "f32", 4);
with_op_instances!(block_entries_for, "ops-bf16", Bf16, "bf16", 8);
with_op_instances!(block_entries_for, "ops-f16", F16, "f16", 8);
