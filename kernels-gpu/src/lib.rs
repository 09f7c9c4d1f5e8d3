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

pub mod launch;
pub mod online;

#[cfg(target_arch = "nvptx64")]
mod device;
#[cfg(target_arch = "nvptx64")]
mod memory;
#[cfg(target_arch = "nvptx64")]
mod reduce;

#[cfg(target_arch = "nvptx64")]
mod block_per_row_smem;
#[cfg(target_arch = "nvptx64")]
mod block_registers;
#[cfg(target_arch = "nvptx64")]
mod row_exchange;
#[cfg(target_arch = "nvptx64")]
mod row_slice;
#[cfg(target_arch = "nvptx64")]
mod row_slices;
#[cfg(target_arch = "nvptx64")]
mod rows_in_registers;
#[cfg(target_arch = "nvptx64")]
mod split_rows;
#[cfg(target_arch = "nvptx64")]
mod thread_per_row;
#[cfg(target_arch = "nvptx64")]
mod unfused;
#[cfg(target_arch = "nvptx64")]
mod warp_per_row;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; the host sees a launch failure instead of a hang.
    unsafe { core::arch::nvptx::trap() }
}
