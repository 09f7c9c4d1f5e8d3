//! Where a thread's packs of a row lie in the operation kernels: the launch's
//! [`PackLayout`](crate::launch::ops::PackLayout), a type parameter of both families
//! ([`Aligned`]; for unaligned rows [`Peeled`] in groups, [`PeeledApart`] in blocks).

use crate::launch::ops::END_SLOTS;
use crate::primitives::row_part::{PackPart, Piece, RowSpan, Share};

use super::row_kernel::{PeelableRow, RowKernel};

/// Where the slots of a share lie: thread `thread` of the `threads` sharing it holds slots
/// `thread, thread + threads, …`, `PACKS` of them.
pub trait Slots<K: RowKernel<PACK>, const PACK: usize> {
    /// This thread's slots, loaded (padding where a slot holds nothing).
    ///
    /// # Safety
    /// The share lies in the kernel's row, laid out as the implementing layout requires.
    unsafe fn load<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
    ) -> [K::Values; PACKS];

    /// Writes this thread's slots, as [`Slots::load`] loaded them.
    ///
    /// # Safety
    /// As [`Slots::load`].
    unsafe fn write<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
        values: &[K::Values; PACKS],
        row: K::Finished,
    );
}

/// Slot `i` of thread `thread` of the `threads` sharing a share: `i · threads + thread`.
/// Computed in 32 bits (slots are below `PACKS · 1024`): with the block size a launch
/// parameter, 64-bit slots took the block kernels up to 34 more registers.
#[inline(always)]
fn slot(i: usize, threads: usize, thread: usize) -> usize {
    ((i * threads) as u32 + thread as u32) as usize
}

/// Rows laid out as [`PackLayout::Aligned`](crate::launch::ops::PackLayout::Aligned) (or as
/// `Elements`, with `PACK == 1`): slot `j` of a share is its pack `j`.
pub struct Aligned;

impl<K: RowKernel<PACK>, const PACK: usize> Slots<K, PACK> for Aligned {
    #[inline(always)]
    unsafe fn load<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
    ) -> [K::Values; PACKS] {
        // Slot `i` holds pack `first + slot(i)` if `slot(i) < count`: comparing the slot
        // rather than the pack let ptxas keep 8-pack blocks in 72 registers instead of 96.
        let (first, count) = share.aligned_packs::<PACK>();
        let slot = |i: usize| slot(i, threads, thread);
        let mut values = [K::PAD; PACKS];
        for i in 0..PACKS {
            if slot(i) < count {
                // SAFETY: the pack lies in the row, aligned per the layout.
                values[i] = unsafe { kernel.load((first + slot(i)) * PACK) };
            }
        }
        values
    }

    #[inline(always)]
    unsafe fn write<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
        values: &[K::Values; PACKS],
        row: K::Finished,
    ) {
        let (first, count) = share.aligned_packs::<PACK>();
        let slot = |i: usize| slot(i, threads, thread);
        for i in 0..PACKS {
            if slot(i) < count {
                // SAFETY: as for the loads.
                unsafe { kernel.write((first + slot(i)) * PACK, None, values[i], row) };
            }
        }
    }
}

/// Rows laid out as [`PackLayout::Peeled`](crate::launch::ops::PackLayout::Peeled), held by a
/// group: slot `j` of the row is pack `j` of its [`RowSpan`], the aligned packs that span it.
/// The first and last reach past the row's ends: they load whole, their outside elements
/// padded, and only their elements in the row are written. Where the last pack would read
/// past the end of the buffers (the last row's), its elements are read one at a time.
pub struct Peeled;

impl<K: PeelableRow<PACK>, const PACK: usize> Slots<K, PACK> for Peeled {
    #[inline(always)]
    unsafe fn load<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
    ) -> [K::Values; PACKS] {
        let span = RowSpan::new::<PACK>(share.cols, kernel.head());
        let packs = span.packs::<PACK>();
        let last_reads_whole = span.overhang::<PACK>() <= kernel.readable_past_end();
        let slot = |i: usize| slot(i, threads, thread);
        let mut values = [K::PAD; PACKS];
        for i in 0..PACKS {
            if slot(i) < packs {
                let (col, part) = span.pack::<PACK>(slot(i));
                // SAFETY (every arm): the part lies in the row; a whole pack is aligned, and a
                // masked one lies in the buffers (the last only where they go on past it).
                values[i] = if part.is_whole::<PACK>() {
                    unsafe { kernel.load(col) }
                } else if slot(i) + 1 == packs && !last_reads_whole {
                    unsafe { kernel.load_part(col, part) }
                } else {
                    unsafe { kernel.load_masked(col, part) }
                };
            }
        }
        values
    }

    #[inline(always)]
    unsafe fn write<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
        values: &[K::Values; PACKS],
        row: K::Finished,
    ) {
        let span = RowSpan::new::<PACK>(share.cols, kernel.head());
        let packs = span.packs::<PACK>();
        let slot = |i: usize| slot(i, threads, thread);
        for i in 0..PACKS {
            if slot(i) < packs {
                let (col, part) = span.pack::<PACK>(slot(i));
                let part = (!part.is_whole::<PACK>()).then_some(part);
                // SAFETY: as for the loads.
                unsafe { kernel.write(col, part, values[i], row) };
            }
        }
    }
}

/// The first `count` elements of a pack: a row end's run.
#[inline(always)]
fn run(count: usize) -> PackPart {
    PackPart { lo: 0, hi: count }
}

/// Rows laid out as [`PackLayout::Peeled`](crate::launch::ops::PackLayout::Peeled), held by a
/// block: a share is a [`RowPart`](crate::primitives::row_part::RowPart) whose body packs fill the first `PACKS - 1` slots of every
/// thread as an aligned row's would, and whose row ends (when it holds them) take one more
/// slot, the last, of threads 0 (the head) and 1 (the tail). A row one element short of an
/// instance's aligned capacity then still fits that instance; with the ends in the body's
/// slots it took the next, larger one (bf16 16383 columns ran at a third of 16384's speed).
pub struct PeeledApart;

impl<K: PeelableRow<PACK>, const PACK: usize> Slots<K, PACK> for PeeledApart {
    #[inline(always)]
    unsafe fn load<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
    ) -> [K::Values; PACKS] {
        let part = share.peeled::<PACK>(kernel.head());
        let (first_col, count) = part.body::<PACK>();
        let slot = |i: usize| slot(i, threads, thread);
        let mut values = [K::PAD; PACKS];
        for i in 0..PACKS - 1 {
            if slot(i) < count {
                // SAFETY: the body pack lies in the row, aligned.
                values[i] = unsafe { kernel.load(first_col + slot(i) * PACK) };
            }
        }
        if thread < END_SLOTS as usize {
            if let Piece::Run { start, count } = part.end_piece(thread) {
                // SAFETY: the end lies in the row.
                values[PACKS - 1] = unsafe { kernel.load_part(start, run(count)) };
            }
        }
        values
    }

    #[inline(always)]
    unsafe fn write<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
        values: &[K::Values; PACKS],
        row: K::Finished,
    ) {
        let part = share.peeled::<PACK>(kernel.head());
        let (first_col, count) = part.body::<PACK>();
        let slot = |i: usize| slot(i, threads, thread);
        for i in 0..PACKS - 1 {
            if slot(i) < count {
                // SAFETY: as for the loads.
                unsafe { kernel.write(first_col + slot(i) * PACK, None, values[i], row) };
            }
        }
        if thread < END_SLOTS as usize {
            if let Piece::Run { start, count } = part.end_piece(thread) {
                // SAFETY: as for the loads.
                unsafe { kernel.write(start, Some(run(count)), values[PACKS - 1], row) };
            }
        }
    }
}
