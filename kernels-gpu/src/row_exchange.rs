//! Combining the statistics of the blocks that share a row: each block publishes its own,
//! then, after the row's barrier (one cooperative launch) or in a later kernel, every block
//! of the row merges all of them.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::device::{block_dim, block_idx, fence_device, sleep_briefly, sync_threads, thread_idx};
use crate::reduce::{Partial, block_reduce};

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
            // Acquire the other blocks' statistics, and release them with the new generation.
            // The reset needs no ordering: the next launch on this row starts after this one
            // ends.
            fence_device();
            AtomicU32::from_ptr(generation).fetch_add(1, Ordering::Relaxed);
            counter.write_volatile(0);
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
/// of [`block_reduce`].
#[inline(always)]
pub unsafe fn exchange_row_stats<S: Partial>(
    block: S,
    scratch: *mut f32,
    partials: *mut f32,
    barriers: *mut u32,
    row: usize,
    slices: usize,
) -> S {
    if thread_idx() == 0 {
        // SAFETY: block_idx < rows · slices and row < rows: inside both buffers.
        unsafe {
            publish_block_stats(block, partials);
            row_barrier(
                barriers.add(2 * row),
                barriers.add(2 * row + 1),
                slices as u32,
            );
        }
    }
    sync_threads();
    // SAFETY: forwarded; the barrier has released, so every block of the row has published.
    unsafe { merge_row_stats(scratch, partials, row, slices) }
}

/// Writes this block's statistics to its two floats of `partials`.
///
/// # Safety
/// `partials` holds two floats per block of the launch.
#[inline(always)]
pub unsafe fn publish_block_stats<S: Partial>(block: S, partials: *mut f32) {
    let [first, second] = block.to_floats();
    let mine = partials.wrapping_add(2 * block_idx() as usize);
    // SAFETY: forwarded from the contract.
    unsafe {
        mine.write_volatile(first);
        if S::FLOATS > 1 {
            mine.add(1).write_volatile(second);
        }
    }
}

/// Merges the published statistics of the `slices` blocks of `row`; every thread gets the
/// row's statistics. Every thread reads at most a few (one when slices ≤ threads), so the
/// reads go out in parallel, and a block reduction merges them.
///
/// # Safety
/// Called by every thread of the block from uniform control flow, after every block of the
/// row published (a barrier, or an earlier kernel); `scratch` as for [`block_reduce`].
#[inline(always)]
pub unsafe fn merge_row_stats<S: Partial>(
    scratch: *mut f32,
    partials: *const f32,
    row: usize,
    slices: usize,
) -> S {
    let mut merged = S::EMPTY;
    for other in (thread_idx() as usize..slices).step_by(block_dim() as usize) {
        let index = 2 * (row * slices + other);
        // SAFETY: published before; volatile reads bypass the multiprocessor's L1, which
        // another row's reads may have filled.
        let theirs = unsafe {
            [
                partials.add(index).read_volatile(),
                if S::FLOATS > 1 {
                    partials.add(index + 1).read_volatile()
                } else {
                    0.0
                },
            ]
        };
        merged = merged.merge(S::from_floats(theirs));
    }
    // SAFETY: uniform control flow; forwarded scratch.
    unsafe { block_reduce(merged, scratch) }
}
