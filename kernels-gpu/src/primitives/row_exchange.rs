//! Combining the statistics of the blocks that share a row: each block publishes its own,
//! then, after the row's barrier (one cooperative launch) or in a later kernel, every block
//! of the row merges all of them. Where a row's blocks form one thread-block cluster (sm_90),
//! they meet at the cluster's hardware barrier instead: each block publishes in its own shared
//! memory and the others read it ([`exchange_cluster_stats`]: block registers, row-cluster,
//! cross-entropy), or every warp stores its statistics into every block's shared memory
//! ([`exchange_cluster_pushed`]: the operation kernels).

use crate::primitives::barrier_word;
use crate::primitives::device::{
    block_dim, block_idx, compare_exchange_acq_rel_gpu, fetch_add_acq_rel_gpu, global_timer_ns,
    grid_dim, load_acquire_gpu, reduce_add_release_gpu, sleep_briefly, sync_threads, thread_idx,
};
use crate::primitives::reduce::{Partial, block_reduce};
#[cfg(not(kernels_sm80))]
use crate::{
    launch::WARP_SIZE,
    primitives::device::{
        cluster_arrive, cluster_block_rank, cluster_blocks, cluster_shared_of, cluster_wait,
    },
    primitives::reduce::group_reduce,
};

/// Holds back the rows of a launch's first wave in turn, so that the rows after them, which
/// start as those finish, do not all read, exchange and write at the same moment: row `row`
/// waits `row · ns_per_row` nanoseconds from its block's start where `row <
/// first_wave_rows`, and starts at once otherwise (`ns_per_row` 0: never waits). Every thread
/// of a block calls it with the same arguments; it touches no memory.
#[inline(always)]
pub fn stagger_first_wave(row: u32, first_wave_rows: u32, ns_per_row: u32) {
    if row < first_wave_rows && ns_per_row != 0 {
        let until = global_timer_ns() + u64::from(row) * u64::from(ns_per_row);
        while global_timer_ns() < until {
            sleep_briefly();
        }
    }
}

/// Waits until `participants` blocks have arrived at this row's barrier (the cooperative
/// protocol of [`barrier_word`]). Called by one thread per block; `leader` is true for
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

/// How one block left the row's barrier.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BarrierExit {
    /// Every block of the row arrived: the block goes on with the row's statistics.
    Released,
    /// This block's arrival completed the row; `leavers` blocks had arrived and left, so
    /// this block writes their slices too.
    Last { leavers: u32 },
    /// The row was still incomplete after the block's patience ran out: it left, and the
    /// row's last block writes its slice.
    Left,
}

/// Arrives at this row's barrier (the protocol with leavers of [`barrier_word`]) and waits
/// until all `participants` blocks have arrived, or at most `patience_ns` nanoseconds before
/// leaving. Called by one thread per block.
///
/// # Safety
/// `word` is this row's word of the barrier buffer, zeroed when it was allocated and only
/// touched by launches that ran to completion; `participants` ≤
/// [`barrier_word::MAX_PARTICIPANTS`].
unsafe fn patient_row_barrier(word: *mut u32, participants: u32, patience_ns: u64) -> BarrierExit {
    // SAFETY (every access): the word is valid, 4-byte aligned and only accessed atomically
    // or by acquiring loads. The arrival releases this block's partial statistics (written
    // before it) and acquires the others' for the last block; the others acquire them by the
    // load that sees the row complete (the reset is a later modification of the word, so
    // seeing it acquires them as well). GPU scope: the host never looks at the word during
    // the launch.
    let before = unsafe { fetch_add_acq_rel_gpu(word, barrier_word::ARRIVAL) };
    if barrier_word::is_last_arrival(before, participants) {
        // No block can leave any more (a leaver's swap expects an incomplete count), so
        // `before` holds every leaver. Nobody waits on the reset: waiters see the full count.
        let reset = barrier_word::reset_after_last(before, participants);
        unsafe { reduce_add_release_gpu(word, reset) };
        return BarrierExit::Last {
            leavers: barrier_word::leavers(before),
        };
    }
    let deadline = global_timer_ns().saturating_add(patience_ns);
    loop {
        let now = unsafe { load_acquire_gpu(word) };
        if barrier_word::has_released(before, now, participants) {
            return BarrierExit::Released;
        }
        if global_timer_ns() > deadline
            && unsafe { compare_exchange_acq_rel_gpu(word, now, now + barrier_word::LEAVER) } == now
        {
            return BarrierExit::Left;
        }
        sleep_briefly();
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
            // the 8-pack forward blocks to more registers.
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

/// The outcome of [`exchange_row_stats_or_leave`] for one block.
#[derive(Debug)]
pub enum RowExchange<S> {
    /// The statistics of the whole row, and how many of the row's blocks left: nonzero only
    /// for the row's last block, which then writes their slices (see [`take_left_slice`]).
    Merged { row_stats: S, leavers: u32 },
    /// The row was incomplete for `patience_ns`: this block left without writing; the row's
    /// last block writes its slice.
    Left,
}

/// [`exchange_row_stats`] for launches whose blocks need not be resident at once: a block
/// that waited `patience_ns` for its row marks its slice as left (in the flags after the
/// rows' barrier words) and leaves, so no block waits for one that cannot start. The row's
/// last block learns how many left.
///
/// # Safety
/// As for [`exchange_row_stats`], except that the blocks need not be resident together;
/// `barriers` holds `2 · rows + rows · slices` words, zeroed when allocated, and is preceded by
/// [`crate::launch::BARRIER_HEADER_WORDS`] more (the first counts the blocks that left); the
/// caller writes the slices of the blocks that left when told so.
#[inline(always)]
pub unsafe fn exchange_row_stats_or_leave<S: Partial>(
    block: S,
    scratch: *mut f32,
    partials: *mut f32,
    barriers: *mut u32,
    row: usize,
    slices: usize,
    patience_ns: u64,
) -> RowExchange<S> {
    // The barrier's exit, told to the block through the scratch: 0 released, 1 + leavers for
    // the last block, u32::MAX for a block that left.
    let exit_slot = scratch.cast::<u32>();
    if thread_idx() == 0 {
        // SAFETY: as in `exchange_row_stats`; the flags follow the rows' words.
        unsafe {
            publish_block_stats(block, partials);
            let exit = match patient_row_barrier(barriers.add(2 * row), slices as u32, patience_ns)
            {
                BarrierExit::Released => 0,
                BarrierExit::Last { leavers } => 1 + leavers,
                BarrierExit::Left => {
                    // After the swap that counted this block out: the last block waits for
                    // as many flags as the count says.
                    left_flag(barriers, slices, block_idx() as usize).write_volatile(LEFT);
                    reduce_add_release_gpu(leaver_count(barriers), 1);
                    u32::MAX
                }
            };
            exit_slot.write(exit);
        }
    }
    sync_threads();
    // SAFETY: written by thread 0 before the block barrier.
    let exit = unsafe { exit_slot.read() };
    // Nobody reuses the scratch (the merge's reduction) before every thread has read it.
    sync_threads();
    if exit == u32::MAX {
        return RowExchange::Left;
    }
    RowExchange::Merged {
        // SAFETY: forwarded; the barrier has released.
        row_stats: unsafe { merge_row_stats(scratch, partials, row, slices) },
        leavers: exit.saturating_sub(1),
    }
}

/// The first word of the header before a launch's barrier words: a running count of the
/// blocks that left their slices, in every launch on this workspace, which tests read to prove
/// the path ran.
fn leaver_count(barriers: *mut u32) -> *mut u32 {
    barriers.wrapping_sub(crate::launch::BARRIER_HEADER_WORDS)
}

/// A flag's value once its block left; zero otherwise (a barrier word at rest, which a flag's
/// slot may have been in a launch of other rows, has zero low bits, never this value).
const LEFT: u32 = 1;

/// The flag of block `block` of a launch of `slices` blocks per row: after the launch's
/// `2 · rows` barrier words.
fn left_flag(barriers: *mut u32, slices: usize, block: usize) -> *mut u32 {
    let rows = grid_dim() as usize / slices;
    barriers.wrapping_add(2 * rows + block)
}

/// For the row's last block: waits until one of the row's slices (blocks `row · slices` to
/// `row · slices + slices - 1`) is flagged as left, clears its flag and returns its slice
/// index to every thread. Call it once per leaver.
///
/// # Safety
/// Called by every thread of the block from uniform control flow, by the last block of `row`
/// with at least one leaver not yet taken; `barriers` and `scratch` as for
/// [`exchange_row_stats_or_leave`].
#[inline(always)]
pub unsafe fn take_left_slice(
    scratch: *mut f32,
    barriers: *mut u32,
    row: usize,
    slices: usize,
) -> usize {
    let slot = scratch.cast::<u32>();
    if thread_idx() == 0 {
        let taken = 'search: loop {
            for slice in 0..slices {
                let flag = left_flag(barriers, slices, row * slices + slice);
                // SAFETY: the flags lie inside the buffer; volatile, so never from the L1. The
                // leaver's flag follows its swap, which precedes this block's arrival.
                if unsafe { flag.read_volatile() } == LEFT {
                    unsafe { flag.write_volatile(0) };
                    break 'search slice;
                }
            }
            sleep_briefly();
        };
        // SAFETY: the scratch holds at least one word.
        unsafe { slot.write(taken as u32) };
    }
    sync_threads();
    // SAFETY: written by thread 0 before the block barrier.
    let taken = unsafe { slot.read() } as usize;
    sync_threads();
    taken
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

/// Whether this block's row exchanges its statistics within the block's thread-block cluster
/// (a launch in clusters of `slices` blocks, one row each) rather than through global memory.
/// A launch in clusters of another size would read or write shared memory of blocks that are
/// not the row's: it stops there (the host sees a launch failure).
#[cfg(not(kernels_sm80))]
#[inline(always)]
pub fn row_is_cluster(slices: u32) -> bool {
    let blocks = cluster_blocks();
    if blocks > 1 && blocks != slices {
        // SAFETY: aborts the kernel.
        unsafe { core::arch::nvptx::trap() };
    }
    blocks > 1
}

/// The sm_80 build has no clusters: every sliced row exchanges through global memory.
#[cfg(kernels_sm80)]
#[inline(always)]
pub fn row_is_cluster(_slices: u32) -> bool {
    false
}

/// Publishes this block's statistics in its own shared memory at `published`, waits at the
/// cluster's barrier, and returns the row's statistics to every thread: each warp reads every
/// block's (one per lane, through distributed shared memory) and merges them with shuffles,
/// so no block barrier follows. It then arrives at the cluster's barrier again (this thread is
/// done reading the others' shared memory); the caller waits on that barrier
/// ([`cluster_wait`]) before the block exits, after its writes, so no block's shared memory is
/// released while another may still read it.
///
/// # Safety
/// Called by every thread of the block from uniform control flow, in a launch whose clusters
/// are rows of `slices` blocks ([`row_is_cluster`]), at most a warp's lanes (every launch
/// keeps to [`MAX_CLUSTER_BLOCKS`](crate::launch::MAX_CLUSTER_BLOCKS), 16); `published`
/// points to two floats of this block's shared memory, at the same offset in every block,
/// that nothing else uses until the caller's [`cluster_wait`], which every thread calls once
/// before exiting.
#[cfg(not(kernels_sm80))]
#[inline(always)]
pub unsafe fn exchange_cluster_stats<S: Partial>(block: S, published: *mut f32, slices: u32) -> S {
    if thread_idx() == 0 {
        let [first, second] = block.to_floats();
        // SAFETY: the two floats are this block's (contract).
        unsafe {
            published.write(first);
            published.add(1).write(second);
        }
    }
    // Release then acquire: every block of the row has published once this thread passes.
    cluster_arrive();
    cluster_wait();
    let lane = thread_idx() % WARP_SIZE;
    let theirs = if lane < slices {
        let theirs = cluster_shared_of(published, lane);
        // SAFETY: block `lane` of the cluster published there before the barrier, and its
        // shared memory stays allocated until this thread has arrived again.
        unsafe { S::from_floats([theirs.read(), theirs.add(1).read()]) }
    } else {
        S::EMPTY
    };
    let row = group_reduce::<S, WARP_SIZE>(theirs);
    cluster_arrive();
    row
}

/// The first step of a block whose row is a thread-block cluster that exchanges through
/// [`exchange_cluster_pushed`]: every thread arrives at the cluster's barrier, with nothing to
/// order yet (before its loads), so that the exchange can tell when every block has started.
/// The sm_80 build has no clusters: nothing.
#[inline(always)]
pub fn arrive_at_row_cluster() {
    #[cfg(not(kernels_sm80))]
    cluster_arrive();
}

/// The exchange of a sliced row's statistics within its thread-block cluster, pushed: every
/// warp stores its own statistics (`warp`, the same in each lane) into `slots` of every block
/// of the cluster, at its block's rank and its warp, then the cluster meets at its barrier once
/// and every warp merges all the slots of its own block, one entry per lane at a time, with
/// shuffles. No block reduction comes first and nothing is read remotely, so no block needs to
/// wait for the others before it exits: each block's slots were complete, and no other block
/// touches them, once it passed the barrier.
///
/// # Safety
/// Called by every thread of the block from uniform control flow, in a launch whose clusters
/// are rows of `slices` blocks ([`row_is_cluster`]; at most a warp's lanes: every launch keeps
/// to [`MAX_CLUSTER_BLOCKS`](crate::launch::MAX_CLUSTER_BLOCKS)); every thread of the block
/// arrived at the cluster's barrier once before ([`arrive_at_row_cluster`]), at a point with
/// no memory access to order (before any load), and does not use the barrier otherwise. `slots` points to
/// [`pushed_cluster_floats`](crate::launch::pushed_cluster_floats) floats of this block's
/// shared memory, at the same offset in every block, that nothing else uses.
#[cfg(not(kernels_sm80))]
#[inline(always)]
pub unsafe fn exchange_cluster_pushed<S: Partial>(warp: S, slots: *mut f32, slices: u32) -> S {
    let warps = block_dim().div_ceil(WARP_SIZE);
    let (warp_index, lane) = (thread_idx() / WARP_SIZE, thread_idx() % WARP_SIZE);
    // Every block of the cluster has started (and its shared memory is there) once every
    // thread passes this wait: each arrived before its loads.
    cluster_wait();
    if lane < slices {
        let entry = 2 * (cluster_block_rank() * warps + warp_index) as usize;
        let [first, second] = warp.to_floats();
        // SAFETY: `entry` lies in the slots (rank < slices, warp < warps), which block `lane`
        // of the cluster holds at the same offset; only this warp of this block stores there.
        unsafe {
            let theirs = cluster_shared_of(slots.add(entry), lane).cast_mut();
            theirs.write(first);
            // A constant condition: a one-float partial stores once.
            if S::FLOATS > 1 {
                theirs.add(1).write(second);
            }
        }
    }
    // Release then acquire: every warp of the cluster has stored into this block's slots once
    // this thread passes.
    cluster_arrive();
    cluster_wait();
    let mut merged = S::EMPTY;
    let mut entry = lane;
    while entry < warps * slices {
        // SAFETY: within the slots, all stored before the barrier.
        let theirs = unsafe {
            let at = slots.add(2 * entry as usize);
            [
                at.read(),
                if S::FLOATS > 1 { at.add(1).read() } else { 0.0 },
            ]
        };
        merged = merged.merge(S::from_floats(theirs));
        entry += WARP_SIZE;
    }
    group_reduce::<S, WARP_SIZE>(merged)
}

/// The sm_80 build has no clusters, so no row is one ([`row_is_cluster`] is `false`): never
/// called there; it stops the kernel if it is.
///
/// # Safety
/// None beyond stopping the kernel.
#[cfg(kernels_sm80)]
#[inline(always)]
pub unsafe fn exchange_cluster_pushed<S: Partial>(_warp: S, _slots: *mut f32, _slices: u32) -> S {
    // SAFETY: aborts the kernel.
    unsafe { core::arch::nvptx::trap() }
}

/// The exchange of a sliced row's statistics, in whichever way the launch allows: within the
/// thread-block cluster when the row is one ([`exchange_cluster_stats`], publishing after the
/// reduction scratch), else through global memory ([`exchange_row_stats`]). `clustered` is
/// [`row_is_cluster`]'s answer; the caller then calls [`leave_row_cluster`] with it once
/// before exiting.
///
/// # Safety
/// That of [`exchange_cluster_stats`] when `clustered`, with
/// [`CLUSTER_STATS_FLOATS`](crate::launch::CLUSTER_STATS_FLOATS) floats of shared memory after
/// the scratch; else that of [`exchange_row_stats`].
#[inline(always)]
pub unsafe fn exchange_sliced_row_stats<S: Partial>(
    block: S,
    scratch: *mut f32,
    partials: *mut f32,
    barriers: *mut u32,
    row: usize,
    slices: usize,
    clustered: bool,
) -> S {
    #[cfg(not(kernels_sm80))]
    if clustered {
        // SAFETY: forwarded; the published floats follow the scratch.
        return unsafe {
            exchange_cluster_stats(
                block,
                scratch.add(crate::launch::REDUCTION_SCRATCH_FLOATS as usize),
                slices as u32,
            )
        };
    }
    #[cfg(kernels_sm80)]
    let _ = clustered;
    // SAFETY: forwarded.
    unsafe { exchange_row_stats(block, scratch, partials, barriers, row, slices) }
}

/// The last step of a block whose row exchanged within its cluster (`clustered`): waits until
/// every block of the cluster has read the others' shared memory, so none exits (releasing its
/// own) before. Nothing otherwise. Every thread calls it once, after its writes.
#[inline(always)]
pub fn leave_row_cluster(clustered: bool) {
    #[cfg(not(kernels_sm80))]
    if clustered {
        cluster_wait();
    }
    #[cfg(kernels_sm80)]
    let _ = clustered;
}
