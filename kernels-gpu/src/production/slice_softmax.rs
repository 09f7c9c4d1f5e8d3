//! The softmax of one block's share of a row in the row-slices layout
//! ([`SliceShare`]): row slices and row clusters take their statistics from the share, merge
//! them across the row's blocks, then write the normalized share.

use crate::primitives::device::{DeviceExp2, block_idx};
use crate::primitives::element::Element;
use crate::primitives::online::OnlineStats;
use crate::primitives::slice_share::SliceShare;

/// Block `row · slices + slice`'s share of a row, written at the same columns of the output.
pub(crate) struct SliceSoftmax<E, const PACK: usize> {
    share: SliceShare<E, PACK>,
    y: *mut E,
    pub row: usize,
    pub slices: usize,
}

impl<E: Element, const PACK: usize> SliceSoftmax<E, PACK> {
    /// The share of block `block_idx()`: row `block / slices`, slice `block % slices`.
    ///
    /// # Safety
    /// The row-slices contract: `cols > 0`, both buffers hold `rows · cols` elements, `rows ·
    /// slices` blocks, `slices · slice_packs · PACK ≥ cols - (PACK - 1)`, equal misalignment
    /// when `PACK > 1`.
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
        // SAFETY: row < rows, so the row's `cols` elements lie inside both buffers.
        let (x, y) = unsafe { (input.add(row * cols), output.add(row * cols)) };
        SliceSoftmax {
            // SAFETY: forwarded.
            share: unsafe { SliceShare::of_row(x, cols, slices, slice_packs, slice) },
            y,
            row,
            slices,
        }
    }

    /// This thread's online statistics of its share, storing its packs into `cache` when
    /// given ([`SliceShare::stats`]).
    ///
    /// # Safety
    /// As [`SliceShare::stats`].
    #[inline(always)]
    pub unsafe fn stats(&self, cache: Option<*mut u8>) -> OnlineStats {
        // SAFETY: forwarded.
        unsafe { self.share.stats(cache) }
    }

    /// Writes the softmax of this thread's packs of the share (and its edge element), reading
    /// them from `cache` when given, else from the input again.
    ///
    /// # Safety
    /// As [`SliceShare::stats`], with the same `cache`, after it.
    #[inline(always)]
    pub unsafe fn write_normalized(&self, cache: Option<*mut u8>, row_stats: OnlineStats) {
        let inv_sum = 1.0 / row_stats.sum();
        let normalize =
            |v: f32| OnlineStats::exp_relative::<DeviceExp2>(v, row_stats.max) * inv_sum;
        // SAFETY: forwarded from the contract; each store is to the columns read.
        unsafe {
            self.share.visit_packs(cache, |column, words| {
                E::store_f32(self.y.add(column), E::widen_all(&words).map(normalize));
            });
            self.share
                .visit_edge(|column, value| E::store_f32(self.y.add(column), [normalize(value)]));
        }
    }
}
