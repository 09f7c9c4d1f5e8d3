//! One thread per row, as in both seeds: rows run in parallel, each row is walked serially,
//! and neighbouring threads read addresses `cols` floats apart (uncoalesced).

use crate::launch::entry_name;
use crate::launch::softmax::{SoftmaxParams, with_softmax_param_fields};
use crate::primitives::device::{DeviceExp2, block_dim, block_idx, thread_idx};
use crate::primitives::entry::softmax_entry;
use crate::primitives::online::{CompensatedSum, OnlineStats};

/// The input and output rows of this thread, or `None` past the last row.
///
/// # Safety
/// Both buffers hold `rows · cols` floats.
#[inline(always)]
unsafe fn this_threads_row(
    input: *const f32,
    output: *mut f32,
    rows: u32,
    cols: u32,
) -> Option<(*const f32, *mut f32)> {
    let row = block_idx() * block_dim() + thread_idx();
    let start = row as usize * cols as usize;
    // SAFETY: row < rows, so the row's `cols` floats lie inside both buffers.
    (row < rows).then(|| unsafe { (input.add(start), output.add(start)) })
}

/// Three passes per row: maximum, then `e^(x - max)` written to the output while summing,
/// then the output re-read and scaled. Traffic: 16 bytes per element.
///
/// # Safety
/// Of `params`: `input` and `output` each point to `rows · cols` floats (distinct buffers);
/// `cols > 0`. Launch with any 1-D block and enough threads in the grid to cover `rows`.
#[inline(always)]
unsafe fn softmax_thread_per_row_naive(params: &SoftmaxParams) {
    let (input, output) = (
        params.input.cast::<f32>(),
        params.output.cast::<f32>().cast_mut(),
    );
    let (rows, cols) = (params.rows, params.cols);
    // SAFETY: forwarded from this kernel's contract.
    let Some((x, y)) = (unsafe { this_threads_row(input, output, rows, cols) }) else {
        return;
    };
    let mut max = f32::NEG_INFINITY;
    for col in 0..cols as usize {
        // SAFETY: col < cols.
        max = max.max(unsafe { x.add(col).read() });
    }
    let mut sum = CompensatedSum::ZERO;
    for col in 0..cols as usize {
        // SAFETY: col < cols.
        unsafe {
            let e = OnlineStats::exp_relative::<DeviceExp2>(x.add(col).read(), max);
            y.add(col).write(e);
            sum.add(e);
        }
    }
    let inv_sum = 1.0 / sum.value();
    for col in 0..cols as usize {
        // SAFETY: col < cols.
        unsafe { y.add(col).write(y.add(col).read() * inv_sum) };
    }
}

/// Two passes per row: the online maximum and sum in one pass, then normalize from the input.
/// Traffic: 12 bytes per element.
///
/// # Safety
/// As [`softmax_thread_per_row_naive`].
#[inline(always)]
unsafe fn softmax_thread_per_row_online(params: &SoftmaxParams) {
    let (input, output) = (
        params.input.cast::<f32>(),
        params.output.cast::<f32>().cast_mut(),
    );
    let (rows, cols) = (params.rows, params.cols);
    // SAFETY: forwarded from this kernel's contract.
    let Some((x, y)) = (unsafe { this_threads_row(input, output, rows, cols) }) else {
        return;
    };
    let mut stats = OnlineStats::EMPTY;
    for col in 0..cols as usize {
        // SAFETY: col < cols.
        stats.push::<DeviceExp2>(unsafe { x.add(col).read() });
    }
    let inv_sum = 1.0 / stats.sum();
    for col in 0..cols as usize {
        // SAFETY: col < cols.
        unsafe {
            let e = OnlineStats::exp_relative::<DeviceExp2>(x.add(col).read(), stats.max);
            y.add(col).write(e * inv_sum);
        }
    }
}

with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed thread_per_row_naive)),
    (|params| softmax_thread_per_row_naive(&params))
);
with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed thread_per_row_online)),
    (|params| softmax_thread_per_row_online(&params))
);
