//! The group-per-row operation kernels: a group of up to 32 lanes holds a row in registers
//! between the reduction and the writes, so each input is read once. Its entries are generated
//! at the bottom, one set per input type behind that type's module cfg, from the instance lists
//! the host's tables come from ([`crate::launch::ops`]).

use crate::launch::ops::{RowOpParams, mode, with_op_instances};
use crate::primitives::device::{block_dim, block_idx, thread_idx};
#[cfg(kernels_module = "ops-bf16")]
use crate::primitives::element::Bf16;
#[cfg(kernels_module = "ops-f16")]
use crate::primitives::element::F16;
use crate::primitives::row_part::Share;

use super::backward::Backward;
use super::forward::{Forward, MaskedForward};
use super::op_entries;
use super::row_kernel::RowKernel;
use super::slots::{Aligned, Peeled, Slots};
use super::states::{merged_states, store_state};

/// Rows of at most `LANES · PACKS` slots, each held by a group of `LANES` lanes.
///
/// # Safety
/// The operation contract: every buffer named in `p` holds its rows at its stride (mask rows
/// `cols` long), `cols > 0`, and the rows are laid out as `L` requires:
/// - [`Aligned`]: when `PACK > 1`, every row start is aligned to `PACK` elements of its
///   buffer (16 bytes at most) and `cols` is a multiple of `PACK`; `LANES · PACKS · PACK ≥
///   cols`;
/// - [`Peeled`]: every buffer starts 16-byte aligned, all rows have the same stride in
///   elements (so every buffer's rows are misaligned alike) and `cols ≥ PACK` (so each row's
///   head ends on a 16-byte boundary); `LANES · PACKS ≥ cols / PACK + END_SLOTS` (see
///   [`crate::primitives::row_part`]).
///
/// Blocks of whole warps, `LANES` divides 32, and
/// `ceil(rows / (block_dim / LANES))` blocks. In-place operation (output = input) is allowed:
/// each element is read before it is written, by the same thread.
#[inline(always)]
pub unsafe fn op_rows<
    K: RowKernel<PACK, Params = RowOpParams>,
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
    let finished = kernel.finish::<PACKS>(stats, mine);
    // SAFETY: as for the loads.
    unsafe { L::write::<PACKS>(&kernel, share, LANES as usize, lane, &values, finished) };
    if lane == 0 {
        // SAFETY: row < rows.
        unsafe { kernel.write_row(stats) };
    }
}

/// Every group entry of one input type, from the instance lists of [`with_op_instances`]: each
/// layout ([`Aligned`] with 16-byte packs, the masked forward's apart, and with single
/// elements; [`Peeled`]) and its directions. A peeled row's ends take two slots; `launch::ops`
/// asserts that every peeled group has them.
macro_rules! rows_entries_for {
    (
        $module:literal, $input:ty, $name:literal, $vector:literal,
        rows_vector $rows_vector:tt,
        rows_peeled $rows_peeled:tt,
        rows_masked $rows_masked:tt,
        rows_scalar $rows_scalar:tt,
        block_vector $block_vector:tt,
        block_kept $block_kept:tt,
        block_masked $block_masked:tt,
        block_scalar $block_scalar:tt
    ) => {
        op_entries!(
            @lanes ($module, $input, $name),
            op_rows,
            (Aligned, 0),
            $vector,
            "",
            [("fwd", Forward), ("bwd", Backward)],
            $rows_vector
        );
        op_entries!(
            @lanes ($module, $input, $name),
            op_rows,
            (Aligned, 0),
            $vector,
            "",
            [("mfwd", MaskedForward)],
            $rows_masked
        );
        op_entries!(
            @lanes ($module, $input, $name),
            op_rows,
            (Aligned, 0),
            1,
            "",
            [("fwd", Forward), ("mfwd", MaskedForward), ("bwd", Backward)],
            $rows_scalar
        );
        op_entries!(
            @lanes ($module, $input, $name),
            op_rows,
            (Peeled, 0),
            $vector,
            "peeled",
            [("fwd", Forward), ("bwd", Backward)],
            $rows_peeled
        );
    };
}

with_op_instances!(rows_entries_for, "ops-f32", f32, "f32", 4);
with_op_instances!(rows_entries_for, "ops-bf16", Bf16, "bf16", 8);
with_op_instances!(rows_entries_for, "ops-f16", F16, "f16", 8);
