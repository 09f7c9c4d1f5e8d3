//! Row-wise softmax kernels, written in Rust and compiled to PTX by rustc's NVPTX backend.
//!
//! The crate is built twice: for the host as an `rlib`, so the launcher shares [`launch`] and
//! the pure arithmetic of [`primitives`] (online statistics, barrier words, row geometry), and
//! for `nvptx64-nvidia-cuda` as a `cdylib`, which gives the PTX that `host/build.rs` embeds.
//! Everything that only makes sense on the device sits behind `cfg(target_arch = "nvptx64")`.
//!
//! Layers, each importing only those before it: `launch` (host-shared definitions, no device
//! code, no entries), `primitives` (building blocks, no entries), then the kernel families,
//! which import the two but not each other's folders: `seeds`, `production`, `ops`. Each
//! family generates its own entries with `primitives::entry::kernel_entry!`, from the
//! instance lists in `launch` where the host has tables of them.
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

/// What the host and the kernels share: constants, instance tables, kernel names,
/// parameters. No device code, no entries.
pub mod launch;
/// The building blocks: intrinsics, memory, element types, reductions, statistics.
pub mod primitives;

/// The seed baselines (the `softmax` module).
#[cfg(all(target_arch = "nvptx64", kernels_module = "softmax"))]
mod seeds;

/// The production f32 softmax kernels (the `softmax` module; row slices also in the 16-bit
/// operation modules).
#[cfg(all(target_arch = "nvptx64", not(kernels_module = "ops-f32")))]
mod production;

/// The operation kernels: one module per input type.
#[cfg(all(target_arch = "nvptx64", not(kernels_module = "softmax")))]
mod ops;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; the host sees a launch failure instead of a hang.
    unsafe { core::arch::nvptx::trap() }
}
