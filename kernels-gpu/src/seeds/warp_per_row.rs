//! One warp per row with online statistics per lane, merged by butterfly shuffles (the second
//! seed's final kernel). Lane `l` reads columns `l, l + 32, …`: every access is coalesced.

use crate::launch::softmax::{SoftmaxParams, with_softmax_param_fields};
use crate::launch::{WARP_SIZE, entry_name};
use crate::primitives::device::{DeviceExp2, block_dim, block_idx, thread_idx};
use crate::primitives::entry::softmax_entry;
use crate::primitives::online::OnlineStats;
use crate::primitives::reduce::group_reduce;

/// # Safety
/// Of `params`: `input` and `output` each point to `rows · cols` floats (distinct buffers);
/// `cols > 0`. Launch with a block of whole warps and `ceil(rows / warps per block)` blocks.
#[inline(always)]
unsafe fn softmax_warp_per_row_online(params: &SoftmaxParams) {
    let (input, output) = (
        params.input.cast::<f32>(),
        params.output.cast::<f32>().cast_mut(),
    );
    let (rows, cols) = (params.rows, params.cols);
    let warps_per_block = block_dim() / WARP_SIZE;
    let row = block_idx() * warps_per_block + thread_idx() / WARP_SIZE;
    // The whole warp leaves together, so the shuffles below always see 32 lanes.
    if row >= rows {
        return;
    }
    let lane = (thread_idx() % WARP_SIZE) as usize;
    let start = row as usize * cols as usize;
    // SAFETY: row < rows, so the row's `cols` floats lie inside both buffers.
    let (x, y) = unsafe { (input.add(start), output.add(start)) };
    let mut stats = OnlineStats::EMPTY;
    for col in (lane..cols as usize).step_by(WARP_SIZE as usize) {
        // SAFETY: col < cols.
        stats.push::<DeviceExp2>(unsafe { x.add(col).read() });
    }
    let row_stats = group_reduce::<_, WARP_SIZE>(stats);
    let inv_sum = 1.0 / row_stats.sum();
    for col in (lane..cols as usize).step_by(WARP_SIZE as usize) {
        // SAFETY: col < cols.
        unsafe {
            let e = OnlineStats::exp_relative::<DeviceExp2>(x.add(col).read(), row_stats.max);
            y.add(col).write(e * inv_sum);
        }
    }
}

with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed warp_per_row_online)),
    (|params| softmax_warp_per_row_online(&params))
);
