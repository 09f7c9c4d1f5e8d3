//! A block's share of a row in the row-slices layout, kept in shared memory between its two
//! passes or read again: where the share lies, the element outside the aligned body a thread
//! holds, the statistics pass and the visits of the second. The softmax's row slices and row
//! clusters write its softmax (`production::slice_softmax`); the cross-entropy over row
//! slices writes its gradient through [`SliceShare::visit_packs`].

use crate::launch::softmax::LOADS_IN_FLIGHT;
use crate::primitives::device::{DeviceExp2, Vector4, block_dim, thread_idx};
use crate::primitives::element::Element;
use crate::primitives::online::OnlineStats;
use crate::primitives::row_part::EdgePerThreadSlice;

/// One block's share of a row: where it lies, the element outside the aligned body this
/// thread holds, and the two passes over it (statistics, then any visit of the packs). (The
/// operation kernels' `row_part::Share` only says which slice of a row a group or block
/// holds.)
pub(crate) struct SliceShare<E, const PACK: usize> {
    x: *const E,
    part: EdgePerThreadSlice,
    edge_column: Option<usize>,
}

impl<E: Element, const PACK: usize> SliceShare<E, PACK> {
    /// Bytes of a pack, as read and as cached: 16, or one element of 4 or 2 bytes.
    const PACK_BYTES: usize = {
        let bytes = PACK * size_of::<E>();
        assert!(
            bytes == 16 || (PACK == 1 && (bytes == 4 || bytes == 2)),
            "a pack is 16 bytes or one element"
        );
        bytes
    };

    /// Slice `slice` of `slices` (of `slice_packs` packs each) of the row of `cols`
    /// elements at `x`.
    ///
    /// # Safety
    /// The row holds `cols > 0` elements from `x`, `slice < slices` and `slices ·
    /// slice_packs · PACK ≥ cols - (PACK - 1)`.
    #[inline(always)]
    pub unsafe fn of_row(
        x: *const E,
        cols: usize,
        slices: usize,
        slice_packs: usize,
        slice: usize,
    ) -> Self {
        let part = EdgePerThreadSlice::new::<PACK, E>(x, cols, slice, slices, slice_packs);
        let edge_column = part.edge_column::<PACK>(thread_idx() as usize);
        SliceShare {
            x,
            part,
            edge_column,
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
                    // read again by the second pass, which the L2 may still serve.
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

    /// Calls `visit` with the column and the value of this thread's element outside the
    /// aligned body, where it holds one, read from the row again.
    ///
    /// # Safety
    /// As [`SliceShare::of_row`].
    // Not built in the f32 operation module: its one caller, the softmax's normalized write
    // (`production::slice_softmax`), is not built there, and the cross-entropy over row
    // slices takes rows of whole packs only, which leave no element outside the body.
    #[cfg(not(kernels_module = "ops-f32"))]
    #[inline(always)]
    pub unsafe fn visit_edge(&self, visit: impl FnOnce(usize, f32)) {
        if let Some(c) = self.edge_column {
            // SAFETY: edge columns are inside the row.
            let words = unsafe { E::load_packed::<1>(self.x.add(c)) };
            visit(c, E::widen(&words, 0));
        }
    }

    /// Calls `visit` with the first column and the words of each of this thread's packs of
    /// the share (not its edge element), in turn, reading them from `cache` when given, else
    /// from the input again.
    ///
    /// # Safety
    /// As [`SliceShare::stats`], with the same `cache`, after it.
    #[inline(always)]
    pub unsafe fn visit_packs(
        &self,
        cache: Option<*mut u8>,
        mut visit: impl FnMut(usize, [u32; PACK]),
    ) {
        for pack in
            (self.part.first + thread_idx() as usize..self.part.end).step_by(block_dim() as usize)
        {
            let column = self.column(pack);
            // SAFETY: the packs this thread read (and cached) in the first pass.
            let words = unsafe {
                match cache {
                    Some(cache) => Self::cached_pack(self.cached_at(cache, pack)),
                    None => E::load_packed_last_use::<PACK>(self.x.add(column)),
                }
            };
            visit(column, words);
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
