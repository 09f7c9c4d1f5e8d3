//! Reductions across lanes (butterfly shuffles: every lane ends with the result, so no
//! broadcast step is needed) and across the warps of a block (through shared memory).

use crate::device::{DeviceExp2, block_dim, shfl_xor_f32, sync_threads, thread_idx};
use crate::launch::WARP_SIZE;
use crate::online::OnlineStats;

/// Maximum over each aligned group of `LANES` lanes (a power of two up to 32); every lane of a
/// group gets its group's result. All 32 lanes must call it.
#[inline(always)]
pub fn group_max<const LANES: u32>(mut value: f32) -> f32 {
    let mut offset = LANES / 2;
    while offset > 0 {
        value = value.max(shfl_xor_f32(value, offset));
        offset /= 2;
    }
    value
}

/// Sum over each aligned group of `LANES` lanes, like [`group_max`].
#[inline(always)]
pub fn group_sum<const LANES: u32>(mut value: f32) -> f32 {
    let mut offset = LANES / 2;
    while offset > 0 {
        value += shfl_xor_f32(value, offset);
        offset /= 2;
    }
    value
}

/// Merges the online statistics of all 32 lanes; every lane gets the warp's statistics.
#[inline(always)]
pub fn warp_stats(mut stats: OnlineStats) -> OnlineStats {
    let mut offset = WARP_SIZE / 2;
    while offset > 0 {
        let other = OnlineStats::new(
            shfl_xor_f32(stats.max, offset),
            shfl_xor_f32(stats.sum(), offset),
        );
        stats = stats.merge::<DeviceExp2>(other);
        offset /= 2;
    }
    stats
}

/// Merges the online statistics of every thread of the block; every thread gets the result.
///
/// # Safety
/// Called by all threads of the block from uniform control flow, with a block of whole warps
/// (at most 1024 threads). `scratch` points to [`crate::launch::REDUCTION_SCRATCH_FLOATS`]
/// floats of shared memory that nothing else uses during the call.
#[inline(always)]
pub unsafe fn block_stats(stats: OnlineStats, scratch: *mut f32) -> OnlineStats {
    let warps = block_dim() / WARP_SIZE;
    let warp = thread_idx() / WARP_SIZE;
    let lane = thread_idx() % WARP_SIZE;
    let per_warp = warp_stats(stats);
    if lane == 0 {
        // SAFETY: `warp < 32`, and the scratch holds 32 maxima followed by 32 sums.
        unsafe {
            scratch.add(warp as usize).write(per_warp.max);
            scratch
                .add((WARP_SIZE + warp) as usize)
                .write(per_warp.sum());
        }
    }
    sync_threads();
    let mine = if lane < warps {
        // SAFETY: as above; slot `lane` was written before the barrier.
        unsafe {
            OnlineStats::new(
                scratch.add(lane as usize).read(),
                scratch.add((WARP_SIZE + lane) as usize).read(),
            )
        }
    } else {
        OnlineStats::EMPTY
    };
    let block = warp_stats(mine);
    // Nobody may overwrite the scratch (a later reduction) before every warp has read it.
    sync_threads();
    block
}
