//! One block per row with a shared-memory tree reduction (the first seed's CUDA kernel).
//! The same kernel serves the fixed-128-thread variant and the autotuned one: threads per
//! block is a launch parameter.

use crate::launch::entry_name;
use crate::launch::softmax::{SoftmaxParams, with_softmax_param_fields};
use crate::primitives::device::{
    DeviceExp2, block_dim, block_idx, dynamic_shared_f32, sync_threads, thread_idx,
};
use crate::primitives::entry::softmax_entry;
use crate::primitives::online::OnlineStats;

/// Tree reduction of one value per thread through `shared` (`block_dim()` floats), halving
/// the live slots each round. Returns the block's result to every thread.
///
/// # Safety
/// All threads of the block call it from uniform control flow; `block_dim()` is a power of
/// two and `shared` holds `block_dim()` floats.
#[inline(always)]
unsafe fn tree_reduce(shared: *mut f32, value: f32, combine: impl Fn(f32, f32) -> f32) -> f32 {
    let tid = thread_idx() as usize;
    // SAFETY (whole function): tid < block_dim() and tid + stride < block_dim().
    unsafe { shared.add(tid).write(value) };
    sync_threads();
    let mut stride = block_dim() as usize / 2;
    while stride > 0 {
        if tid < stride {
            unsafe {
                let merged = combine(shared.add(tid).read(), shared.add(tid + stride).read());
                shared.add(tid).write(merged);
            }
        }
        sync_threads();
        stride /= 2;
    }
    let result = unsafe { shared.read() };
    // Every thread must read slot 0 before the next reduction overwrites it.
    sync_threads();
    result
}

/// Three strided passes over the row (maximum, sum of exponentials, normalize): 12 bytes of
/// traffic per element.
///
/// # Safety
/// Of `params`: `input` and `output` each point to `rows · cols` floats (distinct buffers);
/// `cols > 0`. Launch `rows` blocks of a power-of-two number of threads in 32..=1024, with
/// `block_dim · 4` bytes of dynamic shared memory.
#[inline(always)]
unsafe fn softmax_block_per_row_smem(params: &SoftmaxParams) {
    let (input, output) = (
        params.input.cast::<f32>(),
        params.output.cast::<f32>().cast_mut(),
    );
    let cols = params.cols;
    let shared = dynamic_shared_f32();
    let start = block_idx() as usize * cols as usize;
    // SAFETY: one block per row, so the row's `cols` floats lie inside both buffers.
    let (x, y) = unsafe { (input.add(start), output.add(start)) };
    let columns = (thread_idx() as usize..cols as usize).step_by(block_dim() as usize);

    let mut local_max = f32::NEG_INFINITY;
    for col in columns.clone() {
        // SAFETY: col < cols.
        local_max = local_max.max(unsafe { x.add(col).read() });
    }
    // SAFETY: uniform control flow; the launch provides `block_dim` floats of shared memory.
    let max = unsafe { tree_reduce(shared, local_max, f32::max) };

    let mut local_sum = 0.0;
    for col in columns.clone() {
        // SAFETY: col < cols.
        local_sum += OnlineStats::exp_relative::<DeviceExp2>(unsafe { x.add(col).read() }, max);
    }
    // SAFETY: as above.
    let sum = unsafe { tree_reduce(shared, local_sum, |a, b| a + b) };

    let inv_sum = 1.0 / sum;
    for col in columns {
        // SAFETY: col < cols.
        unsafe {
            let e = OnlineStats::exp_relative::<DeviceExp2>(x.add(col).read(), max);
            y.add(col).write(e * inv_sum);
        }
    }
}

with_softmax_param_fields!(
    softmax_entry,
    [],
    (entry_name!(seed block_per_row_smem)),
    (|params| softmax_block_per_row_smem(&params))
);
