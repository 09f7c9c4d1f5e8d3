//! The first seed's naive baseline, five separate kernels as five PyTorch ops would be:
//! row maximum, subtract, exponentiate, row sum, divide. Each is a full pass over device
//! memory (32 bytes of traffic per element in all), which is what fusion saves.

use crate::launch::WARP_SIZE;
use crate::primitives::device::{block_dim, block_idx, exp2_approx, grid_dim, thread_idx};
use crate::primitives::entry::kernel_entry;
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
/// `input` holds `rows · cols` floats, `row_max` holds `rows`; `cols > 0`. Blocks of whole
/// warps, `ceil(rows / warps per block)` blocks.
#[inline(always)]
unsafe fn softmax_unfused_row_max(input: *const f32, row_max: *mut f32, rows: u32, cols: u32) {
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
/// `input` and `output` hold `rows · cols` floats, `row_max` holds `rows`; `cols > 0`.
/// Any 1-D grid.
#[inline(always)]
unsafe fn softmax_unfused_subtract(
    input: *const f32,
    row_max: *const f32,
    output: *mut f32,
    rows: u32,
    cols: u32,
) {
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
/// `data` holds `len` floats. Any 1-D grid.
#[inline(always)]
unsafe fn softmax_unfused_exp(data: *mut f32, len: u64) {
    for i in grid_stride(len) {
        // SAFETY: i < len.
        unsafe { data.add(i).write(exp2_approx(data.add(i).read() * LOG2_E)) };
    }
}

/// `row_sum[r] = Σ e[r, ..]`, one warp per row.
///
/// # Safety
/// As [`softmax_unfused_row_max`], with `data` in place of `input` and `row_sum` of `rows`.
#[inline(always)]
unsafe fn softmax_unfused_row_sum(data: *const f32, row_sum: *mut f32, rows: u32, cols: u32) {
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
/// `data` holds `rows · cols` floats, `row_sum` holds `rows`; `cols > 0`. Any 1-D grid.
#[inline(always)]
unsafe fn softmax_unfused_divide(data: *mut f32, row_sum: *const f32, rows: u32, cols: u32) {
    for i in grid_stride(rows as u64 * cols as u64) {
        // SAFETY: i < rows · cols and i / cols < rows.
        unsafe {
            data.add(i)
                .write(data.add(i).read() / row_sum.add(i / cols as usize).read())
        };
    }
}

kernel_entry!(
    export "softmax_unfused_row_max",
    (input: *const f32, row_max: *mut f32, rows: u32, cols: u32)
        => softmax_unfused_row_max(input, row_max, rows, cols)
);
kernel_entry!(
    export "softmax_unfused_subtract",
    (input: *const f32, row_max: *const f32, output: *mut f32, rows: u32, cols: u32)
        => softmax_unfused_subtract(input, row_max, output, rows, cols)
);
kernel_entry!(
    export "softmax_unfused_exp",
    (data: *mut f32, len: u64)
        => softmax_unfused_exp(data, len)
);
kernel_entry!(
    export "softmax_unfused_row_sum",
    (data: *const f32, row_sum: *mut f32, rows: u32, cols: u32)
        => softmax_unfused_row_sum(data, row_sum, rows, cols)
);
kernel_entry!(
    export "softmax_unfused_divide",
    (data: *mut f32, row_sum: *const f32, rows: u32, cols: u32)
        => softmax_unfused_divide(data, row_sum, rows, cols)
);
