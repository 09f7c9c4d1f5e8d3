//! Production kernel for narrow rows: a group of `LANES` lanes (1 to 32) owns a row, which
//! stays in registers between the reductions, so the input is read once and the output
//! written once: 8 bytes of traffic per element. A warp holds `32 / LANES` rows at once.
//! Its entries are generated at the bottom from the instance list in
//! [`crate::launch::softmax`], the one the host's tables come from.

use crate::launch::entry_name;
use crate::launch::softmax::{SoftmaxParams, with_register_instances, with_softmax_param_fields};
use crate::primitives::device::{DeviceExp2, block_dim, block_idx, thread_idx};
use crate::primitives::entry::softmax_entry;
use crate::primitives::memory::{load_pack_plain, store_pack_plain};
use crate::primitives::online::OnlineStats;
use crate::primitives::reduce::{group_max, group_sum};

/// Softmax of rows of at most `LANES · PACKS · PACK` columns, each held by `LANES` lanes.
///
/// # Safety
/// Of `params`: `input` and `output` each point to `rows · cols` floats (distinct buffers), with
/// `0 < cols ≤ LANES · PACKS · PACK`. When `PACK == 4`, `cols` is a multiple of 4 and both
/// pointers are 16-byte aligned. The block is whole warps and `LANES` divides 32; launch
/// `ceil(rows / (block_dim / LANES))` blocks.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub unsafe fn softmax_rows_in_registers<const PACK: usize, const LANES: u32, const PACKS: usize>(
    params: &SoftmaxParams,
) {
    let (input, output) = (
        params.input.cast::<f32>(),
        params.output.cast::<f32>().cast_mut(),
    );
    let (rows, cols) = (params.rows, params.cols);
    let lane_in_row = (thread_idx() % LANES) as usize;
    let row = block_idx() * (block_dim() / LANES) + thread_idx() / LANES;
    // Lanes past the last row keep running with -inf padding: the shuffles need all 32.
    let live = row < rows;
    let start = row as usize * cols as usize;
    let cols = cols as usize;
    let column = |pack: usize| (pack * LANES as usize + lane_in_row) * PACK;

    // Index loops with constant trip counts: LLVM unrolls them fully, so `values` stays in
    // registers (iterator adaptors such as `flatten` left it in local memory).
    let mut values = [[f32::NEG_INFINITY; PACK]; PACKS];
    for pack in 0..PACKS {
        if live && column(pack) < cols {
            // SAFETY: column(pack) + PACK ≤ cols (cols is a multiple of PACK when PACK is 4),
            // row < rows, and the alignment contract covers the 16-byte case.
            values[pack] = unsafe { load_pack_plain::<PACK>(input.add(start + column(pack))) };
        }
    }

    let mut local_max = f32::NEG_INFINITY;
    for pack in 0..PACKS {
        for k in 0..PACK {
            local_max = local_max.max(values[pack][k]);
        }
    }
    let max = group_max::<LANES>(local_max);
    let mut local_sum = 0.0;
    for pack in 0..PACKS {
        for k in 0..PACK {
            values[pack][k] = OnlineStats::exp_relative::<DeviceExp2>(values[pack][k], max);
            local_sum += values[pack][k];
        }
    }
    let inv_sum = 1.0 / group_sum::<LANES>(local_sum);

    for pack in 0..PACKS {
        if live && column(pack) < cols {
            for k in 0..PACK {
                values[pack][k] *= inv_sum;
            }
            // SAFETY: as for the loads.
            unsafe { store_pack_plain::<PACK>(output.add(start + column(pack)), values[pack]) };
        }
    }
}

/// One entry per instance, named by [`entry_name!`] (`softmax_rows_in_registers_p<pack>_l<lanes>_n<packs>`),
/// as [`crate::launch::softmax::RegisterKernelName`] writes it.
macro_rules! register_entries {
    ($($layout:ident $pack:literal: [$(($lanes:literal, $packs:literal)),+]),+) => {$($(
        with_softmax_param_fields!(
            softmax_entry,
            [],
            (entry_name!(rows_in_registers $pack $lanes $packs)),
            (|params| softmax_rows_in_registers::<$pack, $lanes, $packs>(&params))
        );
    )+)+};
}

with_register_instances!(register_entries);
