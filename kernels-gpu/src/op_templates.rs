//! How threads share rows in the operation kernels: a group of up to 32 lanes per row
//! ([`op_rows`]), or a block per row or per slice of a row ([`op_block`]). Either keeps its
//! packs in registers between the reduction and the writes, so each input is read once. The
//! entries are generated at the bottom, one set per input type behind that type's feature,
//! from the same instance lists as [`crate::row_ops`]'s tables.

use crate::device::{block_dim, block_idx, dynamic_shared_f32, thread_idx};
use crate::element::{Bf16, F16};
use crate::row_exchange::exchange_row_stats;
use crate::row_kernel::{
    Backward, Forward, MaskedForward, RowKernel, merged_states, store_slice_state, store_state,
};
use crate::row_ops::{RowOpParams, mode};
use crate::row_part::{END_SLOTS, Piece, RowPart};

/// What slot `j` of `part` holds; `may_be_end`: whether `j` can be one of the row's ends (a
/// constant after unrolling, so the one-element code exists only where it can run).
#[inline(always)]
fn piece<const PACK: usize>(part: &RowPart, j: usize, may_be_end: bool) -> Piece {
    if may_be_end {
        part.piece::<PACK>(j)
    } else {
        part.body_piece::<PACK>(j)
    }
}

/// Loads slot `j` of `part` (padding where the slot holds nothing).
///
/// # Safety
/// The part lies in the kernel's row, laid out as the operation contract says.
#[inline(always)]
unsafe fn load_piece<K: RowKernel<PACK>, const PACK: usize>(
    kernel: &K,
    part: &RowPart,
    j: usize,
    may_be_end: bool,
) -> K::Values {
    // SAFETY (both arms): the part's pieces lie in the row; packs are aligned.
    match piece::<PACK>(part, j, may_be_end) {
        Piece::Pack(col) => unsafe { kernel.load(col) },
        Piece::Run { start, count } => unsafe { kernel.load_run(start, count) },
        Piece::Nothing => K::PAD,
    }
}

/// Writes slot `j` of `part` (nothing where the slot holds nothing).
///
/// # Safety
/// As [`load_piece`].
#[inline(always)]
unsafe fn write_piece<K: RowKernel<PACK>, const PACK: usize>(
    kernel: &K,
    part: &RowPart,
    j: usize,
    may_be_end: bool,
    values: K::Values,
    row: K::Finished,
) {
    // SAFETY (both arms): as for the loads.
    match piece::<PACK>(part, j, may_be_end) {
        Piece::Pack(col) => unsafe { kernel.write(col, values, row) },
        Piece::Run { start, count } => unsafe { kernel.write_run(start, count, values, row) },
        Piece::Nothing => {}
    }
}

/// This thread's slots `thread, thread + threads, …` of `part`, loaded.
///
/// # Safety
/// As [`load_piece`].
#[inline(always)]
unsafe fn load_part<K: RowKernel<PACK>, const PACK: usize, const PACKS: usize>(
    kernel: &K,
    part: &RowPart,
    threads: usize,
    thread: usize,
) -> [K::Values; PACKS] {
    let mut values = [K::PAD; PACKS];
    // The packs that may hold the row's ends get their own loop: with the one-element code
    // in every iteration LLVM would not unroll the loop (and would keep `values` in local
    // memory).
    let end_packs = (END_SLOTS as usize).div_ceil(threads).min(PACKS);
    for pack in 0..end_packs {
        // SAFETY: forwarded from the contract.
        values[pack] =
            unsafe { load_piece::<K, PACK>(kernel, part, pack * threads + thread, true) };
    }
    for pack in end_packs..PACKS {
        // SAFETY: forwarded from the contract.
        values[pack] =
            unsafe { load_piece::<K, PACK>(kernel, part, pack * threads + thread, false) };
    }
    values
}

/// Writes this thread's slots of `part` (as [`load_part`] loaded them).
///
/// # Safety
/// As [`load_piece`].
#[inline(always)]
unsafe fn write_part<K: RowKernel<PACK>, const PACK: usize, const PACKS: usize>(
    kernel: &K,
    part: &RowPart,
    threads: usize,
    thread: usize,
    values: &[K::Values; PACKS],
    row: K::Finished,
) {
    let end_packs = (END_SLOTS as usize).div_ceil(threads).min(PACKS);
    for pack in 0..end_packs {
        let j = pack * threads + thread;
        // SAFETY: forwarded from the contract.
        unsafe { write_piece::<K, PACK>(kernel, part, j, true, values[pack], row) };
    }
    for pack in end_packs..PACKS {
        let j = pack * threads + thread;
        // SAFETY: forwarded from the contract.
        unsafe { write_piece::<K, PACK>(kernel, part, j, false, values[pack], row) };
    }
}

/// Rows of at most `LANES · PACKS · PACK` columns, each held by a group of `LANES` lanes.
///
/// # Safety
/// The operation contract: every buffer named in `p` holds its rows at its stride (mask rows
/// `cols` long), `cols > 0`, and when `PACK > 1` either
/// - every row start is aligned to `PACK` elements of its buffer (16 bytes at most) and `cols`
///   is a multiple of `PACK`, with `LANES · PACKS · PACK ≥ cols`; or
/// - no mask buffer is given, every buffer starts 16-byte aligned, all rows have the same
///   stride in elements (so every buffer's rows are misaligned alike), and
///   `LANES · PACKS ≥ cols / PACK + END_SLOTS` (see [`crate::row_part`]);
///
/// with `PACK == 1`, `LANES · PACKS ≥ cols`. Blocks of whole warps, `LANES` divides 32, and
/// `ceil(rows / (block_dim / LANES))` blocks. In-place operation (output = input) is allowed:
/// each element is read before it is written, by the same thread.
#[inline(always)]
pub unsafe fn op_rows<
    K: RowKernel<PACK>,
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
    // The whole row is one part; lane `lane` holds its slots `lane, lane + LANES, …`.
    let part = RowPart::new::<PACK>(cols, kernel.head(), 0, cols);
    let mut values = if live {
        // SAFETY: the part lies in the row, laid out per the contract.
        unsafe { load_part::<K, PACK, PACKS>(&kernel, &part, LANES as usize, lane) }
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
    unsafe {
        write_part::<K, PACK, PACKS>(&kernel, &part, LANES as usize, lane, &values, finished)
    };
    if lane == 0 {
        // SAFETY: row < rows.
        unsafe { kernel.write_row(stats) };
    }
}

/// A row, or one of `slices` slices of `slice_packs` packs of it, held by a block of
/// `THREADS` threads with up to `PACKS` packs each.
///
/// # Safety
/// The operation contract of [`op_rows`], with `THREADS · PACKS ≥ slice_packs` (plus
/// `END_SLOTS` for rows laid out the second way) and `slices · slice_packs · PACK ≥ cols`. Launch
/// `rows · slices` blocks of `THREADS` threads with `REDUCTION_SCRATCH_FLOATS · 4` bytes of
/// dynamic shared memory. When `slices > 1`: `partials` holds two floats per block,
/// `barriers` two words per row zeroed when allocated and used by one launch at a time, and
/// every block is resident at once (cooperative launch), except in mode `SLICE_STATES`,
/// where each block only stores its slice's state, and `APPLY_STATES`. In-place operation is allowed: each
/// thread reads its packs before it writes them, and no thread reads another's.
#[inline(always)]
pub unsafe fn op_block<
    K: RowKernel<PACK>,
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
    let part = RowPart::new::<PACK>(
        p.cols as usize,
        kernel.head(),
        slice,
        p.slice_packs as usize,
    );
    // SAFETY: the part lies in the row, laid out per the contract.
    let mut values = unsafe { load_part::<K, PACK, PACKS>(&kernel, &part, THREADS, tid) };
    let scratch = dynamic_shared_f32();
    let (stats, mine) = if p.mode == mode::APPLY_STATES {
        // SAFETY: the states buffer holds the row's slots (contract of that mode).
        (
            unsafe { merged_states(p, row) },
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
    unsafe { write_part::<K, PACK, PACKS>(&kernel, &part, THREADS, tid, &values, finished) };
    if leader {
        // SAFETY: row < rows.
        unsafe { kernel.write_row(stats) };
    }
}

/// Forward, masked forward and backward group-per-row entries for one input type and pack width.
macro_rules! op_rows_entries {
    ($feature:literal, $input:ty, $name:literal, $pack:literal, [$(($lanes:literal, $packs:literal)),+]) => {$(
        #[cfg(feature = $feature)]
        const _: () = {
            /// # Safety
            /// See [`op_rows`].
            #[unsafe(export_name = concat!("op_rows_fwd_", $name, "_p", $pack, "_l", $lanes, "_n", $packs))]
            unsafe extern "ptx-kernel" fn forward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_rows::<Forward<$input>, $pack, $lanes, $packs>(&params) }
            }

            /// # Safety
            /// See [`op_rows`].
            #[unsafe(export_name = concat!("op_rows_mfwd_", $name, "_p", $pack, "_l", $lanes, "_n", $packs))]
            unsafe extern "ptx-kernel" fn masked_forward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_rows::<MaskedForward<$input>, $pack, $lanes, $packs>(&params) }
            }

            /// # Safety
            /// See [`op_rows`].
            #[unsafe(export_name = concat!("op_rows_bwd_", $name, "_p", $pack, "_l", $lanes, "_n", $packs))]
            unsafe extern "ptx-kernel" fn backward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_rows::<Backward<$input>, $pack, $lanes, $packs>(&params) }
            }
        };
    )+};
}

/// Forward, masked forward and backward block entries for one input type and pack width.
macro_rules! op_block_entries {
    ($feature:literal, $input:ty, $name:literal, $pack:literal, [$(($threads:literal, $packs:literal)),+]) => {$(
        #[cfg(feature = $feature)]
        const _: () = {
            /// # Safety
            /// See [`op_block`].
            #[unsafe(export_name = concat!("op_block_fwd_", $name, "_p", $pack, "_t", $threads, "_n", $packs))]
            unsafe extern "ptx-kernel" fn forward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_block::<Forward<$input>, $pack, $threads, $packs>(&params) }
            }

            /// # Safety
            /// See [`op_block`].
            #[unsafe(export_name = concat!("op_block_mfwd_", $name, "_p", $pack, "_t", $threads, "_n", $packs))]
            unsafe extern "ptx-kernel" fn masked_forward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_block::<MaskedForward<$input>, $pack, $threads, $packs>(&params) }
            }

            /// # Safety
            /// See [`op_block`].
            #[unsafe(export_name = concat!("op_block_bwd_", $name, "_p", $pack, "_t", $threads, "_n", $packs))]
            unsafe extern "ptx-kernel" fn backward(params: RowOpParams) {
                // SAFETY: forwarded from this entry's contract.
                unsafe { op_block::<Backward<$input>, $pack, $threads, $packs>(&params) }
            }
        };
    )+};
}

/// Every operation entry of one input type, from the instance lists of
/// `crate::row_ops::with_op_instances` (the host's tables come from the same lists).
macro_rules! op_entries_for {
    (
        $feature:literal, $input:ty, $name:literal, $vector:literal,
        rows_vector [$($rows_vector:tt),+],
        rows_scalar [$($rows_scalar:tt),+],
        block_vector [$($block_vector:tt),+],
        block_scalar [$($block_scalar:tt),+]
    ) => {
        op_rows_entries!($feature, $input, $name, $vector, [$($rows_vector),+]);
        op_rows_entries!($feature, $input, $name, 1, [$($rows_scalar),+]);
        op_block_entries!($feature, $input, $name, $vector, [$($block_vector),+]);
        op_block_entries!($feature, $input, $name, 1, [$($block_scalar),+]);
    };
}

with_op_instances!(op_entries_for, "ops-f32", f32, "f32", 4);
with_op_instances!(op_entries_for, "ops-bf16", Bf16, "bf16", 8);
with_op_instances!(op_entries_for, "ops-f16", F16, "f16", 8);
