//! Combining the statistics of the blocks that share a row (a sliced launch): each block
//! publishes its own, waits at the row's barrier, then merges all of them.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::device::{DeviceExp2, block_dim, block_idx, fence_device, sleep_briefly, sync_threads, thread_idx};
use crate::online::OnlineStats;
use crate::reduce::block_stats;

/// Waits until `participants` blocks have arrived at this row's barrier. Called by one thread
/// per block. The barrier resets itself, so it is reusable by the next launch without a memset.
///
/// # Safety
/// `counter` and `generation` are this row's two words of the barrier buffer, zeroed once when
/// it was allocated; all `participants` blocks are resident (cooperative launch).
unsafe fn row_barrier(counter: *mut u32, generation: *mut u32, participants: u32) {
    // SAFETY: both words are valid, 4-byte aligned and only accessed atomically or volatile.
    unsafe {
        let entered = generation.read_volatile();
        // Release: this block's partial statistics are visible before its arrival is.
        fence_device();
        let arrived = AtomicU32::from_ptr(counter).fetch_add(1, Ordering::Relaxed);
        if arrived + 1 == participants {
            counter.write_volatile(0);
            fence_device();
            AtomicU32::from_ptr(generation).fetch_add(1, Ordering::Relaxed);
        } else {
            while generation.read_volatile() == entered {
                sleep_briefly();
            }
        }
        // Acquire: the other blocks' statistics are read after their arrival.
        fence_device();
    }
}

/// Publishes this block's statistics of its slice of `row`, waits for the row's other
/// blocks, and returns the statistics of the whole row to every thread.
///
/// # Safety
/// Called by every thread of the block from uniform control flow. The launch has `slices`
/// blocks per row, consecutive in block index and all resident at once (cooperative launch);
/// `partials` holds two floats per block of the launch, `barriers` two words per row, zeroed
/// when allocated and used by one launch at a time; `scratch` is the block-reduction scratch
/// of [`block_stats`].
#[inline(always)]
pub unsafe fn exchange_row_stats(
    block: OnlineStats,
    scratch: *mut f32,
    partials: *mut f32,
    barriers: *mut u32,
    row: usize,
    slices: usize,
) -> OnlineStats {
    if thread_idx() == 0 {
        // SAFETY: block_idx < rows · slices and row < rows: inside both buffers.
        unsafe {
            partials.add(2 * block_idx() as usize).write_volatile(block.max);
            partials.add(2 * block_idx() as usize + 1).write_volatile(block.sum());
            row_barrier(barriers.add(2 * row), barriers.add(2 * row + 1), slices as u32);
        }
    }
    sync_threads();
    // Every thread reads at most a few blocks' statistics (one when slices ≤ threads), so the
    // reads of a row go out in parallel; a block reduction merges them.
    let mut merged = OnlineStats::EMPTY;
    for other in (thread_idx() as usize..slices).step_by(block_dim() as usize) {
        let index = 2 * (row * slices + other);
        // SAFETY: every block of this row wrote its pair before the barrier released; volatile
        // reads bypass the multiprocessor's L1, which another row's reads may have filled.
        let theirs = unsafe { OnlineStats::new(partials.add(index).read_volatile(), partials.add(index + 1).read_volatile()) };
        merged = merged.merge::<DeviceExp2>(theirs);
    }
    // SAFETY: uniform control flow; the scratch is at the start of shared memory.
    unsafe { block_stats(merged, scratch) }
}
