//! Production kernel for wide rows: a block holds a row, or a slice of one, in registers
//! (`PACKS` packs per thread), so the input is read once and the output written once.
//!
//! With `PACK == 4` any width and any 4-byte aligned row is read with 16-byte accesses (see
//! [`EdgePerThreadSlice`] for the few floats around the aligned body). When a row is cut into
//! several slices (few rows, wide rows: LLM vocabularies; or batches of rows no whole-row block
//! keeps two to a multiprocessor), the blocks of a row exchange their statistics within their
//! thread-block cluster where the planner forms one (sm_90, at most 16 slices; the clusters may
//! run in waves), else through global memory behind a per-row barrier, in a cooperative launch so
//! every block is resident. Its entries are generated at the bottom from the instance list in
//! [`crate::launch::softmax`], the one the host's tables come from.

use crate::launch::entry_name;
use crate::launch::softmax::{
    SoftmaxParams, with_block_register_instances, with_softmax_param_fields,
};
use crate::primitives::device::{
    DeviceExp2, block_dim, block_idx, dynamic_shared_f32, recomputed, thread_idx,
};
use crate::primitives::entry::softmax_entry;
use crate::primitives::memory::{load_pack_plain, store_pack_plain};
use crate::primitives::online::OnlineStats;
use crate::primitives::reduce::block_reduce;
use crate::primitives::row_exchange::{
    exchange_sliced_row_stats, leave_row_cluster, row_is_cluster,
};
use crate::primitives::row_part::EdgePerThreadSlice;

/// # Safety
/// Of `params`: `input` and `output` each point to `rows · cols` floats (distinct buffers),
/// `cols > 0`, both 4-byte aligned; when `PACK == 4` they are equally misaligned modulo 16
/// bytes. Launch
/// `rows · slices` blocks of `threads` threads (whole warps, up to 1024), with
/// `REDUCTION_SCRATCH_FLOATS · 4` bytes of dynamic shared memory (more in clusters, below),
/// and `threads · PACKS ≥ slice_packs`, `slices · slice_packs · PACK ≥ cols - 3`. When
/// `slices > 1`, either the launch is in thread-block clusters of `slices` blocks (the sm_90
/// build; at most [`MAX_CLUSTER_BLOCKS`](crate::launch::MAX_CLUSTER_BLOCKS)) with
/// `(REDUCTION_SCRATCH_FLOATS + CLUSTER_STATS_FLOATS) · 4` bytes of dynamic shared memory, or
/// `partials` holds `2 · rows · slices` floats, `barriers` holds `2 · rows` words zeroed when
/// allocated and used by one launch at a time, and every block is resident at once
/// (cooperative launch).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub unsafe fn softmax_block_registers<const PACK: usize, const PACKS: usize>(
    params: &SoftmaxParams,
) {
    let (input, output) = (
        params.input.cast::<f32>(),
        params.output.cast::<f32>().cast_mut(),
    );
    let (cols, slices, slice_packs) = (params.cols, params.slices, params.slice_packs);
    let (partials, barriers) = (
        params.partials.cast::<f32>().cast_mut(),
        params.barriers.cast::<u32>().cast_mut(),
    );
    let (cols, slices) = (cols as usize, slices as usize);
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    let threads = block_dim() as usize;
    let tid = thread_idx() as usize;
    // SAFETY: row < rows, so the row's `cols` floats lie inside both buffers.
    let (x, y) = unsafe { (input.add(row * cols), output.add(row * cols)) };
    let part = EdgePerThreadSlice::new::<PACK, _>(x, cols, slice, slices, slice_packs as usize);
    let column = |pack: usize| part.row_head + pack * PACK;

    let mut values = [[f32::NEG_INFINITY; PACK]; PACKS];
    for p in 0..PACKS {
        let pack = part.first + p * threads + tid;
        if pack < part.end {
            // SAFETY: the pack lies in the row's aligned body, 16-byte aligned when PACK is 4.
            values[p] = unsafe { load_pack_plain::<PACK>(x.add(column(pack))) };
        }
    }
    let edge_column = part.edge_column::<PACK>(tid);
    // SAFETY: edge columns are inside the row.
    let mut edge = edge_column.map_or(f32::NEG_INFINITY, |c| unsafe { x.add(c).read() });

    let mut local_max = edge;
    for p in 0..PACKS {
        for k in 0..PACK {
            local_max = local_max.max(values[p][k]);
        }
    }
    let mut local = OnlineStats::new(local_max, 0.0);
    for p in 0..PACKS {
        for k in 0..PACK {
            values[p][k] = OnlineStats::exp_relative::<DeviceExp2>(values[p][k], local_max);
            local.sum.add(values[p][k]);
        }
    }
    edge = OnlineStats::exp_relative::<DeviceExp2>(edge, local_max);
    local.sum.add(edge);

    let scratch = dynamic_shared_f32();
    // SAFETY: uniform control flow; the launch provides the reduction scratch.
    let mut row_stats = unsafe { block_reduce(local, scratch) };
    // A sliced row whose blocks form one thread-block cluster exchanges its statistics
    // through distributed shared memory (sm_90); otherwise through global memory.
    let clustered = slices > 1 && row_is_cluster(slices as u32);
    if slices > 1 {
        // SAFETY: forwarded from this kernel's contract for sliced launches.
        row_stats = unsafe {
            exchange_sliced_row_stats(
                row_stats, scratch, partials, barriers, row, slices, clustered,
            )
        };
    }
    // e^(x - local_max) · e^(local_max - max) / sum = e^(x - max) / sum.
    let scale = OnlineStats::exp_relative::<DeviceExp2>(local_max, row_stats.max) / row_stats.sum();

    // The write addresses are computed anew rather than kept from the loads across the
    // reduction (one register pair per pack): with it the widest entry takes fewer registers
    // than each compile-time block size did (performance log: "Fewer, leaner kernel entries").
    let threads = recomputed(threads as u32) as usize;
    for p in 0..PACKS {
        let pack = part.first + p * threads + tid;
        if pack < part.end {
            for k in 0..PACK {
                values[p][k] *= scale;
            }
            // SAFETY: as for the loads.
            unsafe { store_pack_plain::<PACK>(y.add(column(pack)), values[p]) };
        }
    }
    if let Some(c) = edge_column {
        // SAFETY: as for the edge load.
        unsafe { y.add(c).write(edge * scale) };
    }
    leave_row_cluster(clustered);
}

/// One entry per packs count of each layout, named by [`entry_name!`]
/// (`softmax_block_registers_p<pack>_n<packs>`), as
/// [`crate::launch::softmax::BlockRegisterInstance`] writes it (the threads are the launch's
/// block size).
macro_rules! block_register_entries {
    ($($layout:ident $pack:literal: threads $threads:tt, packs [$($packs:literal),+]),+) => {$($(
        with_softmax_param_fields!(
            softmax_entry,
            [],
            (entry_name!(block_registers $pack $packs)),
            (|params| softmax_block_registers::<$pack, $packs>(&params))
        );
    )+)+};
}

with_block_register_instances!(block_register_entries);
