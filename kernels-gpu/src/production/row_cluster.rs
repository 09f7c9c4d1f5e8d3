//! Production for few wide rows on Hopper: each row is cut into `slices` slices, one per block of a
//! thread-block cluster of `slices` blocks. Each block reads its slice once (caching it in shared
//! memory when it fits, as [`crate::production::row_slices`] does), publishes its statistics in its
//! own shared memory, and after the cluster's hardware barrier every block reads all of them
//! through distributed shared memory. No global workspace, no atomics, no cooperative launch:
//! clusters are scheduled independently, so any number of rows works.

use super::slice_softmax::SliceSoftmax;
use crate::launch::softmax::{SoftmaxParams, with_softmax_param_fields};
use crate::launch::{CLUSTER_STATS_FLOATS, REDUCTION_SCRATCH_FLOATS, entry_name};
use crate::primitives::device::{cluster_wait, dynamic_shared_f32};
use crate::primitives::entry::softmax_entry;
use crate::primitives::reduce::block_reduce;
use crate::primitives::row_exchange::{exchange_cluster_stats, row_is_cluster};

/// # Safety
/// Of `params`: `input` and `output` each point to `rows · cols` floats (distinct buffers), `cols > 0`,
/// both 4-byte aligned; when `PACK == 4` they are equally misaligned modulo 16 bytes.
/// `slices · slice_packs · PACK ≥ cols - 3`. Launch `rows · slices` blocks in clusters of
/// `slices` blocks along x (so a cluster is one row; `slices` at most
/// [`MAX_CLUSTER_BLOCKS`](crate::launch::MAX_CLUSTER_BLOCKS)), blocks of whole warps (at least 8
/// threads, at most 1024), with `(REDUCTION_SCRATCH_FLOATS + CLUSTER_STATS_FLOATS + cached ·
/// slice_packs · PACK) · 4` bytes of dynamic shared memory, where `cached` is 0 or 1.
#[inline(always)]
unsafe fn softmax_row_cluster<const PACK: usize>(params: &SoftmaxParams) {
    let (input, output) = (
        params.input.cast::<f32>(),
        params.output.cast::<f32>().cast_mut(),
    );
    let (cols, slices, slice_packs) = (params.cols, params.slices, params.slice_packs);
    let cached = params.cached;
    // A launch whose clusters are not the row's slices stops here.
    if !row_is_cluster(slices) && slices > 1 {
        // SAFETY: aborts the kernel.
        unsafe { core::arch::nvptx::trap() };
    }
    let shared = dynamic_shared_f32();
    // Shared memory: the reduction scratch, this block's published statistics (padded so
    // the cache stays 16-byte aligned), then the cache.
    // SAFETY: the launch provides all three.
    let (published, cache) = unsafe {
        let published = shared.add(REDUCTION_SCRATCH_FLOATS as usize);
        let cache = published.add(CLUSTER_STATS_FLOATS as usize);
        (published, (cached != 0).then_some(cache.cast::<u8>()))
    };
    // SAFETY: forwarded from this kernel's contract: block `row · slices + rank` holds slice
    // `rank` of `row`.
    let share =
        unsafe { SliceSoftmax::<f32, PACK>::of_block(input, output, cols, slices, slice_packs) };
    // SAFETY: uniform control flow; the scratch is the launch's.
    let block_stats = unsafe { block_reduce(share.stats(cache), shared) };
    // SAFETY: every block of the cluster runs this from uniform control flow; `published`
    // is reserved for it in every block, and every thread waits on the cluster's barrier
    // below before exiting.
    let row_stats = unsafe { exchange_cluster_stats(block_stats, published, slices) };
    // SAFETY: the share and cache its statistics were taken from.
    unsafe { share.write_normalized(cache, row_stats) };
    // No block exits (releasing its shared memory) before every block has read the others'.
    cluster_wait();
}

macro_rules! row_cluster_entries {
    ($($pack:literal),+) => {$(
        with_softmax_param_fields!(
            softmax_entry,
            [],
            (entry_name!(row_cluster $pack)),
            (|params| softmax_row_cluster::<$pack>(&params))
        );
    )+};
}

row_cluster_entries!(4, 1);
