//! softmax-rs: row-wise softmax on NVIDIA GPUs, every kernel written in Rust.
//!
//! ```no_run
//! use softmax::{Shape, Softmax, Variant};
//!
//! let mut softmax = Softmax::new()?;
//! let shape = Shape::new(2, 3)?;
//! let y = softmax.run_host(Variant::Auto, &[1.0, 2.0, 3.0, 0.0, 0.0, f32::NEG_INFINITY], shape)?;
//! assert!((y[0..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
//! # Ok::<(), softmax::Error>(())
//! ```
//!
//! Special values follow `torch.softmax`: a row holding a NaN or a `+inf` comes out all NaN,
//! a row that is entirely `-inf` comes out all NaN, and a `-inf` entry in any other row gives 0.

//!
//! The crate is one pipeline: the public API ([`Softmax`] and the views and options in
//! `views`) checks a call and states what it computes; `plan` turns that into typed launches
//! (pure, tested on the CPU against a model H200); `launch` enqueues them on the PTX modules
//! that `module` loads, with the workspace from `workspace`.

pub mod autotune;
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "cudarc")]
mod cudarc_adapter;
mod device;
mod error;
mod launch;
mod module;
mod plan;
pub mod reference;
mod shape;
mod softmax;
mod variant;
mod views;
mod workspace;

#[cfg(feature = "cudarc")]
pub use cudarc_adapter::{CudarcElement, CudarcRows};
pub use device::DeviceInfo;
pub use error::{Error, Result};
pub use module::{KERNEL_BUILD_ENV, KernelBuild, KernelImage};
pub use shape::Shape;
pub use softmax::{CallKind, OnStream, RawRows, Softmax, TUNE_CACHE_ENV};
pub use variant::Variant;
pub use views::{
    DType, Element, Mask, MaskedRows, Operation, Options, RowState, Rows, RowsMut, merge_row_states,
};

/// cust, re-exported so users build device buffers with the same version the API takes.
pub use cust;
/// half, re-exported: its `bf16` and `f16` are the 16-bit element types the API takes.
pub use half;
