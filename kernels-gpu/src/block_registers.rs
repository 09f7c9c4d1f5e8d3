//! Production kernel for wide rows: a block holds a row, or a slice of one, in registers
//! (`PACKS` packs per thread), so the input is read once and the output written once.
//!
//! With `PACK == 4` any width and any 4-byte aligned row is read with 16-byte accesses: up to
//! three leading floats before the first 16-byte boundary and up to three trailing ones are
//! held as one extra scalar by a few threads. When a row is cut into several slices (few
//! rows, wide rows: LLM vocabularies), the blocks of a row exchange their statistics through
//! global memory behind a per-row barrier; the host launches that case cooperatively so every
//! block is resident.

use crate::device::{DeviceExp2, block_dim, block_idx, dynamic_shared_f32, thread_idx};
use crate::memory::{load_pack, store_pack};
use crate::online::OnlineStats;
use crate::reduce::block_stats;
use crate::row_exchange::exchange_row_stats;

/// Threads that hold the trailing floats of a row: `TAIL_THREAD..TAIL_THREAD + 3`.
const TAIL_THREAD: usize = 4;

/// Where one block's share of a row lies.
struct RowSlice {
    /// Floats before the row's first 16-byte aligned address (0 when `PACK == 1`).
    row_head: usize,
    /// Packs of the aligned body this block handles: `first..end`.
    first: usize,
    end: usize,
    /// Leading floats this block holds (the row's head, in the first slice only).
    head: usize,
    /// Trailing floats this block holds (the row's tail, in the last slice only) and where
    /// they start.
    tail: usize,
    tail_start: usize,
}

impl RowSlice {
    #[inline(always)]
    fn new<const PACK: usize>(row: *const f32, cols: usize, slice: usize, slices: usize, slice_packs: usize) -> Self {
        let row_head = if PACK == 1 { 0 } else { ((16 - row as usize % 16) % 16 / 4).min(cols) };
        let body_packs = (cols - row_head) / PACK;
        let first = (slice * slice_packs).min(body_packs);
        let end = (first + slice_packs).min(body_packs);
        let tail_start = row_head + body_packs * PACK;
        Self {
            row_head,
            first,
            end,
            head: if slice == 0 { row_head } else { 0 },
            tail: if slice + 1 == slices { cols - tail_start } else { 0 },
            tail_start,
        }
    }

    /// The float outside the aligned body that this thread holds, if any.
    #[inline(always)]
    fn edge_column(&self, tid: usize) -> Option<usize> {
        if tid < self.head {
            Some(tid)
        } else if (TAIL_THREAD..TAIL_THREAD + self.tail).contains(&tid) {
            Some(self.tail_start + tid - TAIL_THREAD)
        } else {
            None
        }
    }
}

/// # Safety
/// `input` and `output` each point to `rows · cols` floats (distinct buffers), `cols > 0`,
/// both 4-byte aligned; when `PACK == 4` they are equally misaligned modulo 16 bytes. Launch
/// `rows · slices` blocks of whole warps, at least 8 threads and at most 1024, with
/// `REDUCTION_SCRATCH_FLOATS · 4` bytes of dynamic shared memory, and
/// `block_dim · PACKS ≥ slice_packs`, `slices · slice_packs · PACK ≥ cols - 3`. When
/// `slices > 1`: `partials` holds `2 · rows · slices` floats, `barriers` holds `2 · rows`
/// words zeroed when allocated and used by one launch at a time, and every block is resident
/// at once (cooperative launch).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub unsafe fn softmax_block_registers<const PACK: usize, const PACKS: usize>(
    input: *const f32,
    output: *mut f32,
    cols: u32,
    slices: u32,
    slice_packs: u32,
    partials: *mut f32,
    barriers: *mut u32,
) {
    let (cols, slices) = (cols as usize, slices as usize);
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    let threads = block_dim() as usize;
    let tid = thread_idx() as usize;
    // SAFETY: row < rows, so the row's `cols` floats lie inside both buffers.
    let (x, y) = unsafe { (input.add(row * cols), output.add(row * cols)) };
    let part = RowSlice::new::<PACK>(x, cols, slice, slices, slice_packs as usize);
    let column = |pack: usize| part.row_head + pack * PACK;

    let mut values = [[f32::NEG_INFINITY; PACK]; PACKS];
    for p in 0..PACKS {
        let pack = part.first + p * threads + tid;
        if pack < part.end {
            // SAFETY: the pack lies in the row's aligned body, 16-byte aligned when PACK is 4.
            values[p] = unsafe { load_pack::<PACK>(x.add(column(pack))) };
        }
    }
    let edge_column = part.edge_column(tid);
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

    // SAFETY: uniform control flow; the launch provides the reduction scratch.
    let mut row_stats = unsafe { block_stats(local, dynamic_shared_f32()) };
    if slices > 1 {
        // SAFETY: forwarded from this kernel's contract for sliced launches.
        row_stats = unsafe { exchange_row_stats(row_stats, partials, barriers, row, slices) };
    }
    // e^(x - local_max) · e^(local_max - max) / sum = e^(x - max) / sum.
    let scale = OnlineStats::exp_relative::<DeviceExp2>(local_max, row_stats.max) / row_stats.sum();

    for p in 0..PACKS {
        let pack = part.first + p * threads + tid;
        if pack < part.end {
            for k in 0..PACK {
                values[p][k] *= scale;
            }
            // SAFETY: as for the loads.
            unsafe { store_pack::<PACK>(y.add(column(pack)), values[p]) };
        }
    }
    if let Some(c) = edge_column {
        // SAFETY: as for the edge load.
        unsafe { y.add(c).write(edge * scale) };
    }
}

