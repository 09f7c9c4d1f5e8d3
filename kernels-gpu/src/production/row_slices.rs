//! Production fallback for rows too wide for registers: each row is cut into `slices` contiguous
//! slices and each slice goes to one block, which keeps it in shared memory (when it fits), so the
//! input is read once; otherwise the second pass re-reads it (from L2 when the tensor fits there).
//! 16-byte access as in [`EdgePerThreadSlice`]. With one slice per row this is a block-per-row
//! kernel; with several, the blocks of a row exchange their online statistics through global memory
//! behind a per-row barrier. The launch is an ordinary one (so it takes the programmatic overlap
//! with the kernel before it), and its blocks need not be resident together: a block whose row is
//! still incomplete after a patience (blocks of other kernels holding the places its row's other
//! blocks need) leaves, and the row's last block writes the slice it left, reading it again. One
//! template for every element type (f32 in the softmax module, bf16 and f16 in their operation
//! modules): math in f32, the cache holds the elements as they were read.

use crate::launch::softmax::{LOADS_IN_FLIGHT, SoftmaxParams, with_softmax_param_fields};
use crate::launch::{REDUCTION_SCRATCH_FLOATS, entry_name};
use crate::primitives::device::{
    DeviceExp2, Vector4, block_dim, block_idx, dynamic_shared_f32, thread_idx,
};
use crate::primitives::element::Element;
use crate::primitives::entry::softmax_entry;
use crate::primitives::online::OnlineStats;
use crate::primitives::reduce::block_reduce;
use crate::primitives::row_exchange::{RowExchange, exchange_row_stats_or_leave, take_left_slice};
use crate::primitives::row_part::EdgePerThreadSlice;

/// # Safety
/// Of `params`: `input` and `output` each point to `rows · cols` elements (distinct buffers), `cols > 0`;
/// when `PACK > 1` (16-byte packs) they are equally misaligned modulo 16 bytes.
/// `slices · slice_packs · PACK ≥ cols - (PACK - 1)`. Launch `rows · slices` blocks of whole
/// warps (at most 1024 threads) with `REDUCTION_SCRATCH_FLOATS · 4 + cached · slice_packs ·
/// PACK · size_of::<E>()` bytes of dynamic shared memory, where `cached` is 0 or 1. When
/// `slices > 1`: `partials` holds `2 · rows · slices` floats, `barriers` holds
/// `2 · rows + rows · slices` words zeroed when allocated and used by one launch at a time,
/// preceded by `BARRIER_HEADER_WORDS` words whose first counts the blocks that left (kept, not
/// reset), and `slices` ≤ `barrier_word::MAX_PARTICIPANTS`. The blocks need not be resident together:
/// a block whose row is still incomplete after `patience_ns` leaves its slice to the row's
/// last block.
#[inline(always)]
unsafe fn softmax_row_slices<E: Element, const PACK: usize>(params: &SoftmaxParams) {
    let (input, output) = (
        params.input.cast::<E>(),
        params.output.cast::<E>().cast_mut(),
    );
    let (cols, slices, slice_packs) = (params.cols, params.slices, params.slice_packs);
    let cached = params.cached;
    let (partials, barriers) = (
        params.partials.cast::<f32>().cast_mut(),
        params.barriers.cast::<u32>().cast_mut(),
    );
    let patience_ns = params.patience_ns;
    let shared = dynamic_shared_f32();
    // SAFETY: the launch provides the scratch followed by the cache when cached.
    let cache = (cached != 0)
        .then(|| unsafe { shared.add(REDUCTION_SCRATCH_FLOATS as usize).cast::<u8>() });
    // SAFETY: forwarded from this kernel's contract.
    let share =
        unsafe { SliceSoftmax::<E, PACK>::of_block(input, output, cols, slices, slice_packs) };
    // SAFETY: as above; uniform control flow.
    let block_stats = unsafe { block_reduce(share.stats(cache), shared) };
    if share.slices == 1 {
        // SAFETY: as above.
        unsafe { share.write_normalized(cache, block_stats) };
        return;
    }
    // SAFETY: forwarded from this kernel's contract for sliced launches.
    let exchange = unsafe {
        exchange_row_stats_or_leave(
            block_stats,
            shared,
            partials,
            barriers,
            share.row,
            share.slices,
            patience_ns,
        )
    };
    let RowExchange::Merged { row_stats, leavers } = exchange else {
        return;
    };
    // SAFETY: as above.
    unsafe { share.write_normalized(cache, row_stats) };
    // The row's last block writes the slices whose blocks left, reading them again.
    for _ in 0..leavers {
        // SAFETY: the last block of its row, with `leavers` flags to take; uniform control
        // flow (`leavers` came to every thread through the block barrier).
        unsafe {
            let slice = take_left_slice(shared, barriers, share.row, share.slices);
            SliceSoftmax::<E, PACK>::of_slice(
                input,
                output,
                cols,
                share.slices,
                slice_packs as usize,
                share.row,
                slice,
            )
            .write_normalized(None, row_stats);
        }
    }
}

/// The softmax of one block's share of a row: where the share lies, the element outside the
/// aligned body this thread holds, and the two passes over it (statistics, normalized
/// writes), which row slices and row clusters share. (The operation kernels'
/// `row_part::Share` only says which slice of a row a group or block holds.)
pub(crate) struct SliceSoftmax<E, const PACK: usize> {
    x: *const E,
    y: *mut E,
    part: EdgePerThreadSlice,
    edge_column: Option<usize>,
    pub row: usize,
    pub slices: usize,
}

impl<E: Element, const PACK: usize> SliceSoftmax<E, PACK> {
    /// Bytes of a pack, as read and as cached: 16, or one element of 4 or 2 bytes.
    const PACK_BYTES: usize = {
        let bytes = PACK * size_of::<E>();
        assert!(
            bytes == 16 || (PACK == 1 && (bytes == 4 || bytes == 2)),
            "a pack is 16 bytes or one element"
        );
        bytes
    };

    /// The share of block `block_idx()`: row `block / slices`, slice `block % slices`.
    ///
    /// # Safety
    /// The row-slices contract: both buffers hold `rows · cols` elements, `rows · slices`
    /// blocks, `slices · slice_packs · PACK ≥ cols - (PACK - 1)`, equal misalignment when
    /// `PACK > 1`.
    #[inline(always)]
    pub unsafe fn of_block(
        input: *const E,
        output: *mut E,
        cols: u32,
        slices: u32,
        slice_packs: u32,
    ) -> Self {
        let (slices, slice_packs) = (slices as usize, slice_packs as usize);
        let block = block_idx() as usize;
        // SAFETY: forwarded; block < rows · slices.
        unsafe {
            Self::of_slice(
                input,
                output,
                cols,
                slices,
                slice_packs,
                block / slices,
                block % slices,
            )
        }
    }

    /// Slice `slice` of row `row`, as block `row · slices + slice` of the launch holds it.
    ///
    /// # Safety
    /// As for [`SliceSoftmax::of_block`], with `row < rows` and `slice < slices`.
    #[inline(always)]
    pub unsafe fn of_slice(
        input: *const E,
        output: *mut E,
        cols: u32,
        slices: usize,
        slice_packs: usize,
        row: usize,
        slice: usize,
    ) -> Self {
        let cols = cols as usize;
        // SAFETY: row < rows, so the row's `cols` elements lie inside the input. The output
        // may be null (a pass that only reads): `wrapping_add` keeps that defined, and such a
        // pass never writes.
        let (x, y) = (
            unsafe { input.add(row * cols) },
            output.wrapping_add(row * cols),
        );
        let part = EdgePerThreadSlice::new::<PACK, E>(x, cols, slice, slices, slice_packs);
        let edge_column = part.edge_column::<PACK>(thread_idx() as usize);
        SliceSoftmax {
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

    /// Where `pack` lies in the cache.
    fn cached_at(&self, cache: *mut u8, pack: usize) -> *mut u8 {
        cache.wrapping_add((pack - self.part.first) * Self::PACK_BYTES)
    }

    /// This thread's online statistics of its packs of the share (and its edge element),
    /// storing the packs into `cache` when given.
    ///
    /// # Safety
    /// `cache`, when given, holds `slice_packs · PACK` elements of shared memory, 16-byte
    /// aligned.
    #[inline(always)]
    pub unsafe fn stats(&self, cache: Option<*mut u8>) -> OnlineStats {
        let threads = block_dim() as usize;
        let mut stats = OnlineStats::EMPTY;
        if let Some(c) = self.edge_column {
            // SAFETY: edge columns are inside the row.
            let words = unsafe { E::load_packed::<1>(self.x.add(c)) };
            stats.push::<DeviceExp2>(E::widen(&words, 0));
        }
        let mut batch = self.part.first + thread_idx() as usize;
        while batch < self.part.end {
            // Issue several independent loads before the first use; packs past the end stay
            // `-inf`, which adds nothing to the statistics.
            let mut words = [[E::NEG_INF_WORD; PACK]; LOADS_IN_FLIGHT as usize];
            for (k, pack_words) in words.iter_mut().enumerate() {
                let pack = batch + k * threads;
                if pack < self.part.end {
                    let src = self.x.wrapping_add(self.column(pack));
                    // SAFETY: the pack lies in the row's aligned body. A cached share is read
                    // from global memory only here, so for the last time; an uncached one is
                    // read again by `write_normalized`, which the L2 may still serve.
                    *pack_words = unsafe {
                        if cache.is_some() {
                            E::load_packed_last_use::<PACK>(src)
                        } else {
                            E::load_packed::<PACK>(src)
                        }
                    };
                }
            }
            if let Some(cache) = cache {
                for (k, pack_words) in words.iter().enumerate() {
                    let pack = batch + k * threads;
                    if pack < self.part.end {
                        // SAFETY: pack - first < slice_packs: inside the cache.
                        unsafe { Self::cache_pack(self.cached_at(cache, pack), pack_words) };
                    }
                }
            }
            // The maximum on the packed elements; each is widened only for its exponential,
            // so the batch stays packed in registers.
            let batch_max = words
                .iter()
                .fold(f32::NEG_INFINITY, |max, pack| max.max(E::pack_max(pack)));
            stats.push_batch::<DeviceExp2>(batch_max, PACK * words.len(), |i| {
                E::widen(&words[i / PACK], i % PACK)
            });
            batch += LOADS_IN_FLIGHT as usize * threads;
        }
        stats
    }

    /// Writes the softmax of this thread's packs of the share (and its edge element), reading
    /// them from `cache` when given, else from the input again.
    ///
    /// # Safety
    /// As [`SliceSoftmax::stats`], with the same `cache`, after it.
    #[inline(always)]
    pub unsafe fn write_normalized(&self, cache: Option<*mut u8>, row_stats: OnlineStats) {
        let inv_sum = 1.0 / row_stats.sum();
        let normalize =
            |v: f32| OnlineStats::exp_relative::<DeviceExp2>(v, row_stats.max) * inv_sum;
        for pack in
            (self.part.first + thread_idx() as usize..self.part.end).step_by(block_dim() as usize)
        {
            // SAFETY: the packs this thread read (and cached) in the first pass.
            unsafe {
                let words = match cache {
                    Some(cache) => Self::cached_pack(self.cached_at(cache, pack)),
                    None => E::load_packed_last_use::<PACK>(self.x.add(self.column(pack))),
                };
                E::store_f32(
                    self.y.add(self.column(pack)),
                    E::widen_all(&words).map(normalize),
                );
            }
        }
        if let Some(c) = self.edge_column {
            // SAFETY: as for the edge load.
            unsafe {
                let words = E::load_packed::<1>(self.x.add(c));
                E::store_f32(self.y.add(c), [normalize(E::widen(&words, 0))]);
            }
        }
    }

    /// Stores a pack's words (as [`Element::load_packed`] laid them out) at `at`.
    ///
    /// # Safety
    /// `at` is shared memory for [`Self::PACK_BYTES`] bytes, aligned to them.
    #[inline(always)]
    unsafe fn cache_pack(at: *mut u8, words: &[u32; PACK]) {
        // SAFETY (every arm): forwarded from the contract.
        unsafe {
            match Self::PACK_BYTES {
                16 => at
                    .cast::<Vector4<u32>>()
                    .write(Vector4([words[0], words[1], words[2], words[3]])),
                4 => at.cast::<u32>().write(words[0]),
                2 => at.cast::<u16>().write(words[0] as u16),
                _ => unreachable!("PACK_BYTES is 16, 4 or 2"),
            }
        }
    }

    /// The pack [`Self::cache_pack`] stored at `at`.
    ///
    /// # Safety
    /// As for [`Self::cache_pack`], after it.
    #[inline(always)]
    unsafe fn cached_pack(at: *const u8) -> [u32; PACK] {
        let mut words = [0u32; PACK];
        // SAFETY (every arm): forwarded from the contract.
        unsafe {
            match Self::PACK_BYTES {
                16 => {
                    let Vector4(vector) = at.cast::<Vector4<u32>>().read();
                    words[..4].copy_from_slice(&vector);
                }
                4 => words[0] = at.cast::<u32>().read(),
                2 => words[0] = u32::from(at.cast::<u16>().read()),
                _ => unreachable!("PACK_BYTES is 16, 4 or 2"),
            }
        }
        words
    }
}

/// One entry per element type and pack width, behind the `kernels_module` cfg of the PTX
/// module that holds it, named by [`entry_name!`] (`softmax_row_slices[_<type>]_p<pack>`) as
/// [`crate::launch::softmax::RowSlicesKernelName`] writes it.
macro_rules! row_slices_entries {
    ($($module:literal: $element:ty, ($($name:tt)+);)+) => {$(
        with_softmax_param_fields!(
            softmax_entry,
            [#[cfg(kernels_module = $module)]],
            (entry_name!($($name)+)),
            (|params| softmax_row_slices::<$element, { entry_pack!($($name)+) }>(&params))
        );
    )+};
}

/// The pack of a row-slices entry's name: its last piece.
macro_rules! entry_pack {
    (row_slices_f32 $pack:literal) => {
        $pack
    };
    (row_slices $input:literal $pack:literal) => {
        $pack
    };
}

row_slices_entries! {
    "softmax": f32, (row_slices_f32 4);
    "softmax": f32, (row_slices_f32 1);
    "ops-bf16": crate::primitives::element::Bf16, (row_slices "bf16" 8);
    "ops-bf16": crate::primitives::element::Bf16, (row_slices "bf16" 1);
    "ops-f16": crate::primitives::element::F16, (row_slices "f16" 8);
    "ops-f16": crate::primitives::element::F16, (row_slices "f16" 1);
}
