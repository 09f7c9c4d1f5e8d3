//! Where a thread's packs of a row lie in the operation kernels: the launch's
//! [`PackLayout`](crate::launch::ops::PackLayout), a type parameter of both families
//! ([`Aligned`]; for unaligned rows [`Peeled`] in groups, [`PeeledApart`] in blocks).

use crate::launch::ops::END_SLOTS;
use crate::primitives::row_part::{Piece, RowPart, Share};

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

    /// Writes this thread's slots, where [`Slots::load`] loaded them (their values as the
    /// reduction left them).
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
        // rather than the pack lets ptxas keep 8-pack blocks in fewer registers (performance
        // log: "Aligned-slot compare").
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
/// group: a share is a [`RowPart`], whose first part also holds the row's unaligned ends in
/// its first two slots.
pub struct Peeled;

impl Peeled {
    /// What slot `j` of `part` holds; `may_be_end`: whether `j` can be one of the row's ends
    /// (a constant after unrolling, so the one-element code exists only where it can run).
    #[inline(always)]
    fn piece<const PACK: usize>(part: &RowPart, j: usize, may_be_end: bool) -> Piece {
        if may_be_end {
            part.piece::<PACK>(j)
        } else {
            part.body_piece::<PACK>(j)
        }
    }

    /// Packs of a thread that may hold the row's ends: the slots below `END_SLOTS` fall in
    /// them. They get their own loop: with the one-element code in every iteration LLVM would
    /// not unroll the loop (and would keep the values in local memory).
    #[inline(always)]
    fn end_packs<const PACKS: usize>(threads: usize) -> usize {
        (END_SLOTS as usize).div_ceil(threads).min(PACKS)
    }
}

impl<K: PeelableRow<PACK>, const PACK: usize> Slots<K, PACK> for Peeled {
    #[inline(always)]
    unsafe fn load<const PACKS: usize>(
        kernel: &K,
        share: Share,
        threads: usize,
        thread: usize,
    ) -> [K::Values; PACKS] {
        let part = share.peeled::<PACK>(kernel.head());
        let load = |i: usize, may_be_end: bool| {
            // SAFETY (every arm): the part's pieces lie in the row; packs are aligned, and the
            // ends are a peeled row's ends, aligned as `load_run` asks (the layout's contract).
            match Self::piece::<PACK>(&part, i * threads + thread, may_be_end) {
                Piece::Pack(col) => unsafe { kernel.load(col) },
                Piece::Run { start, count } => unsafe { kernel.load_run(start, count) },
                Piece::Nothing => K::PAD,
            }
        };
        let mut values = [K::PAD; PACKS];
        let end_packs = Self::end_packs::<PACKS>(threads);
        for (i, value) in values.iter_mut().enumerate().take(end_packs) {
            *value = load(i, true);
        }
        for (i, value) in values.iter_mut().enumerate().skip(end_packs) {
            *value = load(i, false);
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
        let write = |i: usize, may_be_end: bool| {
            // SAFETY (every arm): as for the loads.
            match Self::piece::<PACK>(&part, i * threads + thread, may_be_end) {
                Piece::Pack(col) => unsafe { kernel.write(col, None, values[i], row) },
                Piece::Run { start, count } => unsafe {
                    kernel.write(start, Some(count), values[i], row)
                },
                Piece::Nothing => {}
            }
        };
        let end_packs = Self::end_packs::<PACKS>(threads);
        for i in 0..end_packs {
            write(i, true);
        }
        for i in end_packs..PACKS {
            write(i, false);
        }
    }
}

/// Rows laid out as [`PackLayout::Peeled`](crate::launch::ops::PackLayout::Peeled), held by a
/// block: a share is a [`RowPart`] whose body packs fill the first `PACKS - 1` slots of every
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
                // SAFETY: the end lies in the row, one of a peeled row's ends, aligned as
                // `load_run` asks (the layout's contract).
                values[PACKS - 1] = unsafe { kernel.load_run(start, count) };
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
                unsafe { kernel.write(start, Some(count), values[PACKS - 1], row) };
            }
        }
    }
}
