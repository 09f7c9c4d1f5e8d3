//! How threads share rows in the operation kernels: a group of up to 32 lanes per row
//! ([`op_rows`]), or a block per row or per slice of a row ([`op_block`]). Either keeps its
//! packs in registers between the reduction and the writes, so each input is read once.
//! Where a thread's packs lie is the launch's [`PackLayout`](crate::launch::ops::PackLayout),
//! a type parameter ([`Aligned`]; for unaligned rows [`Peeled`] in groups, [`PeeledApart`] in
//! blocks). The entries are generated at the bottom, one
//! set per input type behind that type's feature, from the same instance lists as
//! [`crate::launch::ops`]'s tables.

use crate::launch::ops::END_SLOTS;
use crate::launch::ops::with_op_instances;
use crate::launch::ops::{RowOpParams, mode};
use crate::ops::row_kernel::{
    Backward, Forward, MaskedForward, PeelableRow, RowKernel, block_merged_states, merged_states,
    store_slice_state, store_state,
};
use crate::primitives::device::{block_dim, block_idx, dynamic_shared_f32, thread_idx};
use crate::primitives::element::{Bf16, F16};
use crate::primitives::entry::kernel_entry;
use crate::primitives::row_exchange::exchange_row_stats;
use crate::primitives::row_part::{Piece, RowPart, Share};

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
        let slot = |i: usize| i * threads + thread;
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
        let slot = |i: usize| i * threads + thread;
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
            // SAFETY (every arm): the part's pieces lie in the row; packs are aligned.
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
        let slot = |i: usize| i * threads + thread;
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
        let slot = |i: usize| i * threads + thread;
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

/// Rows of at most `LANES · PACKS` slots, each held by a group of `LANES` lanes.
///
/// # Safety
/// The operation contract: every buffer named in `p` holds its rows at its stride (mask rows
/// `cols` long), `cols > 0`, and the rows are laid out as `L` requires:
/// - [`Aligned`]: when `PACK > 1`, every row start is aligned to `PACK` elements of its
///   buffer (16 bytes at most) and `cols` is a multiple of `PACK`; `LANES · PACKS · PACK ≥
///   cols`;
/// - [`Peeled`]: every buffer starts 16-byte aligned and all rows have the same stride in
///   elements (so every buffer's rows are misaligned alike); `LANES · PACKS ≥ cols / PACK +
///   END_SLOTS` (see [`crate::primitives::row_part`]).
///
/// Blocks of whole warps, `LANES` divides 32, and
/// `ceil(rows / (block_dim / LANES))` blocks. In-place operation (output = input) is allowed:
/// each element is read before it is written, by the same thread.
#[inline(always)]
pub unsafe fn op_rows<
    K: RowKernel<PACK>,
    L: Slots<K, PACK>,
    const PACK: usize,
    const LANES: u32,
    const PACKS: usize,
>(
    p: &RowOpParams,
) {
    let lane = (thread_idx() % LANES) as usize;
    let row = (block_idx() * (block_dim() / LANES) + thread_idx() / LANES) as usize;
    let live = row < p.rows as usize;
    let cols = p.cols as usize;
    // Lanes past the last row keep running on the last row's pointers with padding values
    // (the shuffles need all 32); they load, store and write nothing.
    // SAFETY: the clamped row is < rows.
    let kernel = unsafe { K::for_row(p, row.min(p.rows as usize - 1)) };
    // The whole row is the group's share; lane `lane` holds its slots `lane, lane + LANES, …`.
    let share = Share {
        cols,
        slice: 0,
        slice_packs: cols,
    };
    let mut values = if live {
        // SAFETY: the share lies in the row, laid out per the contract.
        unsafe { L::load::<PACKS>(&kernel, share, LANES as usize, lane) }
    } else {
        [K::PAD; PACKS]
    };
    let (group, mine) = kernel.group_partial::<PACKS, LANES>(&mut values);
    let stats = if p.mode == mode::APPLY_STATES {
        // SAFETY: the states buffer holds the row's slots (contract of that mode).
        unsafe { merged_states(p, row.min(p.rows as usize - 1)) }
    } else {
        group
    };
    if !live {
        return;
    }
    if p.mode == mode::STATES {
        if lane == 0 {
            // SAFETY: as above.
            unsafe { store_state(p, row, stats) };
        }
        return;
    }
    let finished = kernel.finish(stats, mine);
    // SAFETY: as for the loads.
    unsafe { L::write::<PACKS>(&kernel, share, LANES as usize, lane, &values, finished) };
    if lane == 0 {
        // SAFETY: row < rows.
        unsafe { kernel.write_row(stats) };
    }
}

/// A row, or one of `slices` slices of `slice_packs` packs of it, held by a block of
/// `THREADS` threads with up to `PACKS` packs each.
///
/// # Safety
/// The operation contract of [`op_rows`]: its buffers, and the layout's conditions on rows
/// ([`Aligned`]; [`PeeledApart`] as [`Peeled`] there) but not its bound on `cols`. Instead
/// `slices · slice_packs ≥ cols / PACK` (the body's packs) and `THREADS · PACKS ≥
/// slice_packs`; for [`PeeledApart`] rows `THREADS · (PACKS - 1) ≥ slice_packs` and `THREADS ≥
/// END_SLOTS` (the last slot of threads 0 and 1 holds the row's ends, in slice 0). Launch
/// `rows · slices` blocks of `THREADS` threads with `REDUCTION_SCRATCH_FLOATS · 4` bytes of
/// dynamic shared memory. When `slices > 1`: `partials` holds two floats per block,
/// `barriers` two words per row zeroed when allocated and used by one launch at a time, and
/// every block is resident at once (cooperative launch), except in mode `SLICE_STATES`,
/// where each block only stores its slice's state, and `APPLY_STATES`. In-place operation is
/// allowed: each thread reads its packs before it writes them, and no thread reads another's.
#[inline(always)]
pub unsafe fn op_block<
    K: RowKernel<PACK>,
    L: Slots<K, PACK>,
    const PACK: usize,
    const THREADS: usize,
    const PACKS: usize,
>(
    p: &RowOpParams,
) {
    let slices = p.slices as usize;
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    let tid = thread_idx() as usize;
    // SAFETY: row < rows.
    let kernel = unsafe { K::for_row(p, row) };
    let share = Share {
        cols: p.cols as usize,
        slice,
        slice_packs: p.slice_packs as usize,
    };
    // SAFETY: the share lies in the row, laid out per the contract.
    let mut values = unsafe { L::load::<PACKS>(&kernel, share, THREADS, tid) };
    let scratch = dynamic_shared_f32();
    let (stats, mine) = if p.mode == mode::APPLY_STATES {
        // SAFETY: the states buffer holds the row's slots (contract of that mode); uniform
        // control flow; the launch provides the scratch.
        (
            unsafe { block_merged_states(p, row, scratch) },
            kernel.partial(&mut values),
        )
    } else {
        // SAFETY: uniform control flow; the launch provides the scratch.
        let (block, mine) = unsafe { kernel.block_partial(&mut values, scratch) };
        if p.mode == mode::SLICE_STATES {
            if tid == 0 {
                // SAFETY: the states buffer holds `slices` slots of `rows` states.
                unsafe { store_slice_state(p, row, slice, block) };
            }
            return;
        }
        let row_stats = if slices > 1 {
            // SAFETY: forwarded from the contract for sliced launches.
            unsafe {
                exchange_row_stats(
                    block,
                    scratch,
                    p.partials as *mut f32,
                    p.barriers as *mut u32,
                    row,
                    slices,
                )
            }
        } else {
            block
        };
        (row_stats, mine)
    };
    let leader = tid == 0 && slice == 0;
    if p.mode == mode::STATES {
        if leader {
            // SAFETY: as above.
            unsafe { store_state(p, row, stats) };
        }
        return;
    }
    let finished = kernel.finish(stats, mine);
    // SAFETY: as for the loads.
    unsafe { L::write::<PACKS>(&kernel, share, THREADS, tid, &values, finished) };
    if leader {
        // SAFETY: row < rows.
        unsafe { kernel.write_row(stats) };
    }
}

/// One entry per instance of a template (`op_rows` or `op_block`) for one input type, layout
/// and direction: `op_<family>_<direction>_<input>_p<pack><layout>_<letter><width>_n<packs>`,
/// holding `packs + extra` slots per thread (`extra`: the [`PeeledApart`] ends' slot).
macro_rules! op_entries {
    (
        $feature:literal, $template:ident, $family:literal, $letter:literal, $input:ty,
        $name:literal, ($layout:ident, $extra:literal), $pack:literal, $suffix:literal,
        ($direction:literal, $kernel:ident), [$(($width:literal, $packs:literal)),+]
    ) => {$(
        kernel_entry!(
            #[cfg(feature = $feature)]
            export concat!(
                "op_", $family, "_", $direction, "_", $name, "_p", $pack, $suffix, "_", $letter,
                $width, "_n", $packs
            ),
            (params: RowOpParams)
                => $template::<$kernel<$input>, $layout, $pack, $width, { $packs + $extra }>(&params)
        );
    )+};
}

/// The group and block entries of one input type and layout (each family's slot layout), for
/// each of its directions.
macro_rules! op_layout_entries {
    (
        $feature:literal, $input:ty, $name:literal, $rows_layout:tt, $block_layout:tt,
        $pack:literal, $suffix:literal, [$($direction:tt),+], $rows:tt, $blocks:tt
    ) => {$(
        op_entries!(
            $feature, op_rows, "rows", "l", $input, $name, $rows_layout, $pack, $suffix,
            $direction, $rows
        );
        op_entries!(
            $feature, op_block, "block", "t", $input, $name, $block_layout, $pack, $suffix,
            $direction, $blocks
        );
    )+};
}

/// Every operation entry of one input type, from the instance lists of
/// `crate::launch::ops::with_op_instances` (the host's tables come from the same lists and name
/// the entries the same way: [`crate::launch::ops::OpKernelName`]). The first group instance has
/// fewer slots than a peeled row's ends take, so it has no peeled entries (`row_ops` asserts
/// that it is the only one).
macro_rules! op_entries_for {
    (
        $feature:literal, $input:ty, $name:literal, $vector:literal,
        rows_vector [$one_slot:tt, $($rows_vector:tt),+],
        rows_scalar $rows_scalar:tt,
        block_vector $block_vector:tt,
        block_scalar $block_scalar:tt
    ) => {
        op_layout_entries!(
            $feature,
            $input,
            $name,
            (Aligned, 0),
            (Aligned, 0),
            $vector,
            "",
            [("fwd", Forward), ("mfwd", MaskedForward), ("bwd", Backward)],
            [$one_slot, $($rows_vector),+],
            $block_vector
        );
        op_layout_entries!(
            $feature,
            $input,
            $name,
            (Aligned, 0),
            (Aligned, 0),
            1,
            "",
            [("fwd", Forward), ("mfwd", MaskedForward), ("bwd", Backward)],
            $rows_scalar,
            $block_scalar
        );
        op_layout_entries!(
            $feature,
            $input,
            $name,
            (Peeled, 0),
            (PeeledApart, 1),
            $vector,
            "peeled",
            [("fwd", Forward), ("bwd", Backward)],
            [$($rows_vector),+],
            $block_vector
        );
    };
}

with_op_instances!(op_entries_for, "ops-f32", f32, "f32", 4);
with_op_instances!(op_entries_for, "ops-bf16", Bf16, "bf16", 8);
with_op_instances!(op_entries_for, "ops-f16", F16, "f16", 8);
