//! The first seed's naive baseline, five separate kernels as five PyTorch ops would be:
//! row maximum, subtract, exponentiate, row sum, divide. Each is a full pass over device
//! memory (32 bytes of traffic per element in all), which is what fusion saves.

use crate::launch::softmax::{SoftmaxParams, with_softmax_param_fields};
use crate::launch::{WARP_SIZE, entry_name};
use crate::primitives::device::{block_dim, block_idx, exp2_approx, grid_dim, thread_idx};
use crate::primitives::entry::softmax_entry;
use crate::primitives::online::{CompensatedSum, LOG2_E};
use crate::primitives::reduce::{group_max, group_sum};

/// Row index and the lane's first column for the warp-per-row reductions, or `None` for
/// warps past the last row.
#[inline(always)]
fn warp_row(rows: u32) -> Option<(usize, usize)> {
    let row = block_idx() * (block_dim() / WARP_SIZE) + thread_idx() / WARP_SIZE;
    (row < rows).then_some((row as usize, (thread_idx() % WARP_SIZE) as usize))
}

/// Grid-stride indices over `0..len`.
#[inline(always)]
fn grid_stride(len: u64) -> impl Iterator<Item = usize> {
    let first = block_idx() as u64 * block_dim() as u64 + thread_idx() as u64;
    let stride = grid_dim() as u64 * block_dim() as u64;
    (first..len).step_by(stride as usize).map(|i| i as usize)
}

/// `row_max[r] = max(x[r, ..])`, one warp per row.
///
/// # Safety
/// Of `params`: `input` holds `rows · cols` floats, `row_max` holds `rows`; `cols > 0`.
/// Blocks of whole warps, `ceil(rows / warps per block)` blocks.
#[inline(always)]
unsafe fn softmax_unfused_row_max(params: &SoftmaxParams) {
    let (input, row_max) = (
        params.input.cast::<f32>(),
        params.row_max.cast::<f32>().cast_mut(),
    );
    let (rows, cols) = (params.rows, params.cols);
    let Some((row, lane)) = warp_row(rows) else {
        return;
    };
    let mut max = f32::NEG_INFINITY;
    for col in (lane..cols as usize).step_by(WARP_SIZE as usize) {
        // SAFETY: row < rows and col < cols.
        max = max.max(unsafe { input.add(row * cols as usize + col).read() });
    }
    let max = group_max::<WARP_SIZE>(max);
    if lane == 0 {
        // SAFETY: row < rows.
        unsafe { row_max.add(row).write(max) };
    }
}

/// `z = x - row_max[row]`, element-wise.
///
/// # Safety
/// Of `params`: `input` and `output` hold `rows · cols` floats, `row_max` holds `rows`;
/// `cols > 0`. Any 1-D grid.
#[inline(always)]
unsafe fn softmax_unfused_subtract(params: &SoftmaxParams) {
    let (input, row_max) = (params.input.cast::<f32>(), params.row_max.cast::<f32>());
    let output = params.output.cast::<f32>().cast_mut();
    let (rows, cols) = (params.rows, params.cols);
    for i in grid_stride(rows as u64 * cols as u64) {
        // SAFETY: i < rows · cols and i / cols < rows.
        unsafe {
            output
                .add(i)
                .write(input.add(i).read() - row_max.add(i / cols as usize).read())
        };
    }
}

/// `z = e^z`, element-wise and in place.
///
/// # Safety
/// Of `params`: `output` (`data`, in place) holds `len` floats. Any 1-D grid.
#[inline(always)]
unsafe fn softmax_unfused_exp(params: &SoftmaxParams) {
    let (data, len) = (params.output.cast::<f32>().cast_mut(), params.len);
    for i in grid_stride(len) {
        // SAFETY: i < len.
        unsafe { data.add(i).write(exp2_approx(data.add(i).read() * LOG2_E)) };
    }
}

/// `row_sum[r] = Σ e[r, ..]`, one warp per row.
///
/// # Safety
/// As [`softmax_unfused_row_max`], with `output` (`data`) in place of `input` and `row_sum`
/// of `rows` floats in place of `row_max`.
#[inline(always)]
unsafe fn softmax_unfused_row_sum(params: &SoftmaxParams) {
    let (data, row_sum) = (
        params.output.cast::<f32>(),
        params.row_sum.cast::<f32>().cast_mut(),
    );
    let (rows, cols) = (params.rows, params.cols);
    let Some((row, lane)) = warp_row(rows) else {
        return;
    };
    let mut sum = CompensatedSum::ZERO;
    for col in (lane..cols as usize).step_by(WARP_SIZE as usize) {
        // SAFETY: row < rows and col < cols.
        sum.add(unsafe { data.add(row * cols as usize + col).read() });
    }
    let sum = group_sum::<WARP_SIZE>(sum.value());
    if lane == 0 {
        // SAFETY: row < rows.
        unsafe { row_sum.add(row).write(sum) };
    }
}

/// `y = e / row_sum[row]`, element-wise and in place.
///
/// # Safety
/// Of `params`: `output` (`data`, in place) holds `rows · cols` floats, `row_sum` holds
/// `rows`; `cols > 0`. Any 1-D grid.
#[inline(always)]
unsafe fn softmax_unfused_divide(params: &SoftmaxParams) {
    let (data, row_sum) = (
        params.output.cast::<f32>().cast_mut(),
        params.row_sum.cast::<f32>(),
    );
    let (rows, cols) = (params.rows, params.cols);
    for i in grid_stride(rows as u64 * cols as u64) {
        // SAFETY: i < rows · cols and i / cols < rows.
        unsafe {
            data.add(i)
                .write(data.add(i).read() / row_sum.add(i / cols as usize).read())
        };
    }
}

with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed unfused_row_max)),
    (|params| softmax_unfused_row_max(&params))
);
with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed unfused_subtract)),
    (|params| softmax_unfused_subtract(&params))
);
with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed unfused_exp)),
    (|params| softmax_unfused_exp(&params))
);
with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed unfused_row_sum)),
    (|params| softmax_unfused_row_sum(&params))
);
with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed unfused_divide)),
    (|params| softmax_unfused_divide(&params))
);
