//! Production kernel for wide rows: each row is cut into `slices` contiguous slices and each
//! slice goes to one block, which keeps it in shared memory (when it fits), so the input is
//! read once. With one slice per row this is a block-per-row kernel; with several, the blocks
//! of a row exchange their online statistics through global memory behind a per-row barrier,
//! which needs every block resident at once: the host launches it cooperatively.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::device::{
    DeviceExp2, block_dim, block_idx, dynamic_shared_f32, fence_device, sleep_briefly, thread_idx,
};
use crate::launch::{LOADS_IN_FLIGHT, REDUCTION_SCRATCH_FLOATS, WARP_SIZE};
use crate::memory::{load_pack, store_pack};
use crate::online::OnlineStats;
use crate::reduce::{block_stats, warp_stats};

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

/// # Safety
/// `input` and `output` each point to `rows · cols` floats (distinct buffers), `cols > 0`;
/// when `PACK == 4`, `cols` is a multiple of 4 and both pointers are 16-byte aligned.
/// `slice_cols` is a multiple of `PACK` with `slices · slice_cols ≥ cols`. Launch
/// `rows · slices` blocks of whole warps (at most 1024 threads) with
/// `(REDUCTION_SCRATCH_FLOATS + cached · slice_cols) · 4` bytes of dynamic shared memory,
/// where `cached` is 0 or 1. When `slices > 1`: `partials` holds `2 · rows · slices` floats,
/// `barriers` holds `2 · rows` words zeroed when allocated and only used by this kernel, one
/// launch at a time, and all blocks are resident together (cooperative launch).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn softmax_row_slices<const PACK: usize>(
    input: *const f32,
    output: *mut f32,
    cols: u32,
    slices: u32,
    slice_cols: u32,
    cached: u32,
    partials: *mut f32,
    barriers: *mut u32,
) {
    let shared = dynamic_shared_f32();
    // SAFETY: the launch provides the scratch followed by `slice_cols` floats when cached.
    let cache = unsafe { shared.add(REDUCTION_SCRATCH_FLOATS as usize) };
    let row = (block_idx() / slices) as usize;
    let slice = (block_idx() % slices) as usize;
    let first = slice * slice_cols as usize;
    let last = (first + slice_cols as usize).min(cols as usize);
    let start = row * cols as usize + first;
    let packs = last.saturating_sub(first) / PACK;
    let threads = block_dim() as usize;
    let tid = thread_idx() as usize;
    let cached = cached != 0;

    let mut stats = OnlineStats::EMPTY;
    let mut batch = tid;
    while batch < packs {
        // Issue several independent loads before the first use.
        let mut values = [[0.0; PACK]; LOADS_IN_FLIGHT as usize];
        for k in 0..LOADS_IN_FLIGHT as usize {
            let pack = batch + k * threads;
            if pack < packs {
                // SAFETY: pack < packs, so the PACK floats lie inside this row's slice.
                values[k] = unsafe { load_pack::<PACK>(input.add(start + pack * PACK)) };
            }
        }
        for k in 0..LOADS_IN_FLIGHT as usize {
            let pack = batch + k * threads;
            if pack < packs {
                if cached {
                    // SAFETY: pack · PACK < slice_cols, inside the cache.
                    unsafe { store_pack::<PACK>(cache.add(pack * PACK), values[k]) };
                }
                for i in 0..PACK {
                    stats.push::<DeviceExp2>(values[k][i]);
                }
            }
        }
        batch += LOADS_IN_FLIGHT as usize * threads;
    }
    // SAFETY: uniform control flow; the scratch is at the start of shared memory.
    let mut row_stats = unsafe { block_stats(stats, shared) };

    if slices > 1 {
        if tid == 0 {
            // SAFETY: block_idx < rows · slices, row < rows: inside both buffers.
            unsafe {
                partials.add(2 * block_idx() as usize).write_volatile(row_stats.max);
                partials.add(2 * block_idx() as usize + 1).write_volatile(row_stats.sum());
                row_barrier(barriers.add(2 * row), barriers.add(2 * row + 1), slices);
            }
        }
        crate::device::sync_threads();
        let mut mine = OnlineStats::EMPTY;
        let lane = tid % WARP_SIZE as usize;
        for other in (lane..slices as usize).step_by(WARP_SIZE as usize) {
            let index = 2 * (row * slices as usize + other);
            // SAFETY: every block of this row wrote its pair before the barrier released.
            let theirs = unsafe {
                OnlineStats::new(partials.add(index).read_volatile(), partials.add(index + 1).read_volatile())
            };
            mine = mine.merge::<DeviceExp2>(theirs);
        }
        row_stats = warp_stats(mine);
    }

    let inv_sum = 1.0 / row_stats.sum();
    for pack in (tid..packs).step_by(threads) {
        // SAFETY: the same packs this thread read (and cached) in the first pass.
        unsafe {
            let x = if cached {
                load_pack::<PACK>(cache.add(pack * PACK))
            } else {
                load_pack::<PACK>(input.add(start + pack * PACK))
            };
            let y = x.map(|v| OnlineStats::exp_relative::<DeviceExp2>(v, row_stats.max) * inv_sum);
            store_pack::<PACK>(output.add(start + pack * PACK), y);
        }
    }
}

macro_rules! row_slices_entry {
    ($name:ident, $pack:literal) => {
        /// # Safety
        /// See `softmax_row_slices` with `PACK =` the suffix of the name.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            input: *const f32,
            output: *mut f32,
            cols: u32,
            slices: u32,
            slice_cols: u32,
            cached: u32,
            partials: *mut f32,
            barriers: *mut u32,
        ) {
            // SAFETY: forwarded from this entry's contract.
            unsafe {
                softmax_row_slices::<$pack>(
                    input, output, cols, slices, slice_cols, cached, partials, barriers,
                )
            }
        }
    };
}

row_slices_entry!(softmax_row_slices_p4, 4);
row_slices_entry!(softmax_row_slices_p1, 1);
