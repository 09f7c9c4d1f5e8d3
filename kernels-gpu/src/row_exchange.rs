//! Combining the statistics of the blocks that share a row: each block publishes its own,
//! then, after the row's barrier (one cooperative launch) or in a later kernel, every block
//! of the row merges all of them.

use crate::barrier_word;
use crate::device::{
    block_dim, block_idx, fetch_add_acq_rel_gpu, load_acquire_gpu, sleep_briefly, sync_threads,
    thread_idx,
};
use crate::reduce::{Partial, block_reduce};

/// Waits until `participants` blocks have arrived at this row's barrier (the word's
/// arithmetic is in [`barrier_word`]). Called by one thread per block; `leader` is true for
/// exactly one of the row's blocks.
///
/// # Safety
/// `word` is this row's word of the barrier buffer, zeroed when it was allocated and only
/// touched by launches that ran to completion; all `participants` blocks are resident
/// (cooperative launch).
unsafe fn row_barrier(word: *mut u32, participants: u32, leader: bool) {
    let arrival = barrier_word::arrival(participants, leader);
    // SAFETY: the word is valid, 4-byte aligned and only accessed atomically or by acquiring
    // loads. The addition releases this block's partial statistics (written before it) and,
    // for the last block, acquires the others'; the others acquire them by the load that sees
    // the flip. GPU scope: the host never looks at the word during the launch.
    unsafe {
        let before = fetch_add_acq_rel_gpu(word, arrival);
        // The last block to arrive knows it from its own addition.
        if !barrier_word::has_flipped(before, before.wrapping_add(arrival)) {
            while !barrier_word::has_flipped(before, load_acquire_gpu(word)) {
                sleep_briefly();
            }
        }
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
            // The row's first word is its barrier; the second is unused. Addressed as one
            // word per row (and the leader found as `block % slices == 0`), the same code took
            // the 8-pack forward blocks from 64 to 72 registers (ptxas 12.9).
            row_barrier(
                barriers.add(2 * row),
                slices as u32,
                block_idx() as usize == row * slices,
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
        // SAFETY: published by an earlier kernel, or before the row's barrier, whose acquire
        // (passed on to every thread by the block barrier after it) makes the writes visible
        // here; the reads are volatile as well, so they never come from the L1.
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
