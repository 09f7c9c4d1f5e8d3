//! Production fallback for rows too wide for registers: each row is cut into `slices`
//! contiguous slices and each slice goes to one block, which keeps it in shared memory (when
//! it fits), so the input is read once; otherwise the second pass re-reads it (from L2 when
//! the tensor fits there). 16-byte access as in [`RowSlice`]. With one slice per row this is a block-per-row kernel; with several, the blocks
//! of a row exchange their online statistics through global memory behind a per-row barrier,
//! which needs every block resident at once: the host launches it cooperatively.

use crate::device::{DeviceExp2, block_dim, block_idx, dynamic_shared_f32, thread_idx};
use crate::launch::{LOADS_IN_FLIGHT, REDUCTION_SCRATCH_FLOATS};
use crate::memory::{load_pack, load_pack_last_use, store_pack};
use crate::online::OnlineStats;
use crate::reduce::block_reduce;
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
#[allow(clippy::too_many_arguments)]
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
    let cache = (cached != 0).then(|| unsafe { shared.add(REDUCTION_SCRATCH_FLOATS as usize) });
    // SAFETY: forwarded from this kernel's contract.
    let share = unsafe { Share::<PACK>::of_block(input, output, cols, slices, slice_packs) };
    // SAFETY: as above; uniform control flow.
    let mut row_stats = unsafe { block_reduce(share.stats(cache), shared) };
    if share.slices > 1 {
        // SAFETY: forwarded from this kernel's contract for sliced launches.
        row_stats = unsafe {
            exchange_row_stats(
                row_stats,
                shared,
                partials,
                barriers,
                share.row,
                share.slices,
            )
        };
    }
    // SAFETY: as above.
    unsafe { share.write_normalized(cache, row_stats) };
}

/// One block's share of a row: where it lies, and the float outside the aligned body this
/// thread holds.
pub(crate) struct Share<const PACK: usize> {
    x: *const f32,
    y: *mut f32,
    part: RowSlice,
    edge_column: Option<usize>,
    pub row: usize,
    pub slices: usize,
}

impl<const PACK: usize> Share<PACK> {
    /// The share of block `block_idx()`: row `block / slices`, slice `block % slices`.
    ///
    /// # Safety
    /// The row-slices contract: both buffers hold `rows · cols` floats, `rows · slices`
    /// blocks, `slices · slice_packs · PACK ≥ cols - 3`, equal misalignment when PACK is 4.
    #[inline(always)]
    pub unsafe fn of_block(
        input: *const f32,
        output: *mut f32,
        cols: u32,
        slices: u32,
        slice_packs: u32,
    ) -> Self {
        let (cols, slices) = (cols as usize, slices as usize);
        let row = block_idx() as usize / slices;
        // SAFETY: row < rows, so the row's `cols` floats lie inside the input. The output may
        // be null (a pass that only reads): `wrapping_add` keeps that defined, and such a
        // pass never writes.
        let (x, y) = (
            unsafe { input.add(row * cols) },
            output.wrapping_add(row * cols),
        );
        let part = RowSlice::new::<PACK>(
            x,
            cols,
            block_idx() as usize % slices,
            slices,
            slice_packs as usize,
        );
        let edge_column = part.edge_column(thread_idx() as usize);
        Share {
            x,
            y,
            part,
            edge_column,
            row,
            slices,
        }
    }

    fn column(&self, pack: usize) -> usize {
        self.part.row_head + pack * PACK
    }

    fn cached_at(&self, pack: usize) -> usize {
        (pack - self.part.first) * PACK
    }

    /// This thread's online statistics of its packs of the share (and its edge float),
    /// storing the packs into `cache` when given.
    ///
    /// # Safety
    /// `cache`, when given, holds `slice_packs · PACK` floats of shared memory.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    pub unsafe fn stats(&self, cache: Option<*mut f32>) -> OnlineStats {
        let threads = block_dim() as usize;
        let mut stats = OnlineStats::EMPTY;
        if let Some(c) = self.edge_column {
            // SAFETY: edge columns are inside the row.
            stats.push::<DeviceExp2>(unsafe { self.x.add(c).read() });
        }
        let mut batch = self.part.first + thread_idx() as usize;
        while batch < self.part.end {
            // Issue several independent loads before the first use; packs past the end stay
            // `-inf`, which adds nothing to the statistics.
            let mut values = [[f32::NEG_INFINITY; PACK]; LOADS_IN_FLIGHT as usize];
            for k in 0..LOADS_IN_FLIGHT as usize {
                let pack = batch + k * threads;
                if pack < self.part.end {
                    let src = self.x.wrapping_add(self.column(pack));
                    // SAFETY: the pack lies in the row's aligned body. A cached share is read
                    // from global memory only here, so for the last time; an uncached one is
                    // read again by `write_normalized`, which the L2 may still serve.
                    values[k] = unsafe {
                        if cache.is_some() {
                            load_pack_last_use::<PACK>(src)
                        } else {
                            load_pack::<PACK>(src)
                        }
                    };
                }
            }
            if let Some(cache) = cache {
                for k in 0..LOADS_IN_FLIGHT as usize {
                    let pack = batch + k * threads;
                    if pack < self.part.end {
                        // SAFETY: pack - first < slice_packs: inside the cache.
                        unsafe { store_pack::<PACK>(cache.add(self.cached_at(pack)), values[k]) };
                    }
                }
            }
            stats.push_batch::<DeviceExp2, PACK, { LOADS_IN_FLIGHT as usize }>(&values);
            batch += LOADS_IN_FLIGHT as usize * threads;
        }
        stats
    }

    /// Writes the softmax of this thread's packs of the share (and its edge float), reading
    /// them from `cache` when given, else from the input again.
    ///
    /// # Safety
    /// As [`Share::stats`], with the same `cache`, after it.
    #[inline(always)]
    pub unsafe fn write_normalized(&self, cache: Option<*mut f32>, row_stats: OnlineStats) {
        let inv_sum = 1.0 / row_stats.sum();
        let normalize =
            |v: f32| OnlineStats::exp_relative::<DeviceExp2>(v, row_stats.max) * inv_sum;
        for pack in
            (self.part.first + thread_idx() as usize..self.part.end).step_by(block_dim() as usize)
        {
            // SAFETY: the packs this thread read (and cached) in the first pass.
            unsafe {
                let values = match cache {
                    Some(cache) => load_pack::<PACK>(cache.add(self.cached_at(pack))),
                    None => load_pack_last_use::<PACK>(self.x.add(self.column(pack))),
                };
                store_pack::<PACK>(self.y.add(self.column(pack)), values.map(normalize));
            }
        }
        if let Some(c) = self.edge_column {
            // SAFETY: as for the edge load.
            unsafe { self.y.add(c).write(normalize(self.x.add(c).read())) };
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
            slice_packs: u32,
            cached: u32,
            partials: *mut f32,
            barriers: *mut u32,
        ) {
            // SAFETY: forwarded from this entry's contract.
            unsafe {
                softmax_row_slices::<$pack>(
                    input,
                    output,
                    cols,
                    slices,
                    slice_packs,
                    cached,
                    partials,
                    barriers,
                )
            }
        }
    };
}

row_slices_entry!(softmax_row_slices_p4, 4);
row_slices_entry!(softmax_row_slices_p1, 1);
