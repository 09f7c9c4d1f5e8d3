//! Production fallback for rows too wide for registers: each row is cut into `slices`
//! contiguous slices and each slice goes to one block, which keeps it in shared memory (when
//! it fits), so the input is read once; otherwise the second pass re-reads it (from L2 when
//! the tensor fits there). 16-byte access as in [`RowSlice`]. With one slice per row this is a block-per-row kernel; with several, the blocks
//! of a row exchange their online statistics through global memory behind a per-row barrier,
//! which needs every block resident at once: the host launches it cooperatively.

use crate::device::{DeviceExp2, block_dim, block_idx, dynamic_shared_f32, thread_idx};
use crate::launch::{LOADS_IN_FLIGHT, REDUCTION_SCRATCH_FLOATS};
use crate::memory::{load_pack, store_pack};
use crate::online::OnlineStats;
use crate::reduce::block_stats;
use crate::row_exchange::exchange_row_stats;
use crate::row_slice::RowSlice;

/// # Safety
/// `input` and `output` each point to `rows · cols` floats (distinct buffers), `cols > 0`,
/// both 4-byte aligned; when `PACK == 4` they are equally misaligned modulo 16 bytes.
/// `slices · slice_packs · PACK ≥ cols - 3`. Launch `rows · slices` blocks of whole warps (at
/// least 8 threads, at most 1024) with `(REDUCTION_SCRATCH_FLOATS + cached · slice_packs ·
/// PACK) · 4` bytes of dynamic shared memory, where `cached` is 0 or 1. When `slices > 1`:
/// `partials` holds `2 · rows · slices` floats, `barriers` holds `2 · rows` words zeroed when
/// allocated and used by one launch at a time, and all blocks are resident together
/// (cooperative launch).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn softmax_row_slices<const PACK: usize>(
    input: *const f32,
    output: *mut f32,
    cols: u32,
    slices: u32,
    slice_packs: u32,
    cached: u32,
    partials: *mut f32,
    barriers: *mut u32,
) {
    let shared = dynamic_shared_f32();
    // SAFETY: the launch provides the scratch followed by the cache when cached.
    let cache = unsafe { shared.add(REDUCTION_SCRATCH_FLOATS as usize) };
    let (cols, slices) = (cols as usize, slices as usize);
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    let threads = block_dim() as usize;
    let tid = thread_idx() as usize;
    let cached = cached != 0;
    // SAFETY: row < rows, so the row's `cols` floats lie inside both buffers.
    let (x, y) = unsafe { (input.add(row * cols), output.add(row * cols)) };
    let part = RowSlice::new::<PACK>(x, cols, slice, slices, slice_packs as usize);
    let column = |pack: usize| part.row_head + pack * PACK;
    let cached_at = |pack: usize| (pack - part.first) * PACK;

    let edge_column = part.edge_column(tid);
    // SAFETY: edge columns are inside the row.
    let edge = edge_column.map_or(f32::NEG_INFINITY, |c| unsafe { x.add(c).read() });
    let mut stats = OnlineStats::EMPTY;
    stats.push::<DeviceExp2>(edge);
    let mut batch = part.first + tid;
    while batch < part.end {
        // Issue several independent loads before the first use.
        let mut values = [[0.0; PACK]; LOADS_IN_FLIGHT as usize];
        for k in 0..LOADS_IN_FLIGHT as usize {
            let pack = batch + k * threads;
            if pack < part.end {
                // SAFETY: the pack lies in the row's aligned body.
                values[k] = unsafe { load_pack::<PACK>(x.add(column(pack))) };
            }
        }
        for k in 0..LOADS_IN_FLIGHT as usize {
            let pack = batch + k * threads;
            if pack < part.end {
                if cached {
                    // SAFETY: pack - first < slice_packs: inside the cache.
                    unsafe { store_pack::<PACK>(cache.add(cached_at(pack)), values[k]) };
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
        row_stats = unsafe { exchange_row_stats(row_stats, shared, partials, barriers, row, slices) };
    }

    let inv_sum = 1.0 / row_stats.sum();
    let normalize = |v: f32| OnlineStats::exp_relative::<DeviceExp2>(v, row_stats.max) * inv_sum;
    for pack in (part.first + tid..part.end).step_by(threads) {
        // SAFETY: the packs this thread read (and cached) in the first pass.
        unsafe {
            let values = if cached {
                load_pack::<PACK>(cache.add(cached_at(pack)))
            } else {
                load_pack::<PACK>(x.add(column(pack)))
            };
            store_pack::<PACK>(y.add(column(pack)), values.map(normalize));
        }
    }
    if let Some(c) = edge_column {
        // SAFETY: as for the edge load.
        unsafe { y.add(c).write(normalize(edge)) };
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
            slice_packs: u32,
            cached: u32,
            partials: *mut f32,
            barriers: *mut u32,
        ) {
            // SAFETY: forwarded from this entry's contract.
            unsafe {
                softmax_row_slices::<$pack>(
                    input, output, cols, slices, slice_packs, cached, partials, barriers,
                )
            }
        }
    };
}

row_slices_entry!(softmax_row_slices_p4, 4);
row_slices_entry!(softmax_row_slices_p1, 1);
