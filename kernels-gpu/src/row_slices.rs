//! Production kernel for wide rows: each row is cut into `slices` contiguous slices and each
//! slice goes to one block, which keeps it in shared memory (when it fits), so the input is
//! read once. With one slice per row this is a block-per-row kernel; with several, the blocks
//! of a row exchange their online statistics through global memory behind a per-row barrier,
//! which needs every block resident at once: the host launches it cooperatively.

use crate::device::{DeviceExp2, block_dim, block_idx, dynamic_shared_f32, thread_idx};
use crate::launch::{LOADS_IN_FLIGHT, REDUCTION_SCRATCH_FLOATS};
use crate::memory::{load_pack, store_pack};
use crate::online::OnlineStats;
use crate::reduce::block_stats;
use crate::row_exchange::exchange_row_stats;

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
        // SAFETY: forwarded from this kernel's contract for sliced launches.
        row_stats = unsafe { exchange_row_stats(row_stats, partials, barriers, row, slices as usize) };
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
