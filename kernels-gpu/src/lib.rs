//! Row-wise softmax kernels, written in Rust and compiled to PTX by rustc's NVPTX backend.
//!
//! The crate is built twice: for the host as an `rlib`, so the launcher shares the constants
//! and the online-softmax statistics defined here, and for `nvptx64-nvidia-cuda` as a
//! `cdylib`, which gives the PTX that `host/build.rs` embeds. Everything that only makes sense
//! on the device sits behind `cfg(target_arch = "nvptx64")`.
//!
//! Every kernel computes, for each row `x` of a row-major `rows × cols` matrix,
//! `y_i = exp(x_i - max(x)) / Σ_j exp(x_j - max(x))` in `f32`, with the exponential evaluated as
//! `2^((x_i - max) · log2 e)`. Special values follow `torch.softmax`: a row holding a NaN or a
//! `+inf` is all NaN, a row that is entirely `-inf` is all NaN, and a `-inf` entry in any other
//! row gives 0.
//!
//! Every entry starts by waiting for the previous grid in its stream (`griddepcontrol.wait`)
//! before any branch or global memory access: the host launches non-cooperative grids with
//! programmatic overlap (programmatic dependent launch), so a grid may start once every block
//! of the kernel before it has exited, before that kernel's completion is signalled.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        abi_ptx,
        asm_experimental_arch,
        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem,
        stdarch_nvptx
    )
)]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]
// Each PTX module is built from one feature's kernels, so helpers another module uses are
// unused in it.
#![cfg_attr(
    all(
        target_arch = "nvptx64",
        not(all(
            feature = "softmax",
            feature = "ops-f32",
            feature = "ops-bf16",
            feature = "ops-f16"
        ))
    ),
    allow(dead_code, unused_imports)
)]

pub mod barrier_word;
pub mod launch;
pub mod online;
#[macro_use]
pub mod row_ops;
pub mod row_part;

#[cfg(target_arch = "nvptx64")]
mod device;
#[cfg(target_arch = "nvptx64")]
mod reduce;
#[cfg(target_arch = "nvptx64")]
mod row_exchange;

/// The f32 softmax variants (the seeds and the production kernels): the `softmax` module.
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod block_per_row_smem;
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod block_registers;
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod memory;
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod row_cluster;
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod rows_in_registers;
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod split_rows;
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod thread_per_row;
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod unfused;
#[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
mod warp_per_row;

/// The operation kernels (any dtype, options, backward): one module per input type; and
/// row-slices, whose f32 entries are in the softmax module and its 16-bit ones in theirs.
#[cfg(target_arch = "nvptx64")]
mod element;
#[cfg(target_arch = "nvptx64")]
mod op_templates;
#[cfg(target_arch = "nvptx64")]
mod row_kernel;
#[cfg(target_arch = "nvptx64")]
mod row_slice;
#[cfg(target_arch = "nvptx64")]
mod row_slices;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; the host sees a launch failure instead of a hang.
    unsafe { core::arch::nvptx::trap() }
}
