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
//! The crate is layered, each layer importing only those below it:
//! - `api`: the handle, the views of any kind of buffer, the options with the stream, and the
//!   one call description every operation goes through;
//! - `runtime`: everything that talks to the driver (modules, the plan cache, launches,
//!   workspaces, the tune cache);
//! - `plan`: pure, tested on the CPU against a model H200: a request, a shape and a layout
//!   become typed launches;
//! - the vocabulary every layer shares: `shape`, `variant`, `error`.
//!
//! `reference` (the f64 CPU oracle) stands apart, and `bench` and the `host` binary sit above
//! the public API.

mod api;
#[cfg(feature = "bench")]
pub mod bench;
mod error;
mod plan;
pub mod reference;
mod runtime;
mod shape;
mod variant;

pub use api::{
    CallKind, CallStream, CrossEntropyOptions, CrossEntropyOutputs, CrossEntropyState, DType,
    Element, Mask, MaskedRows, NO_TOKEN, Operation, Options, PerRow, Reduction, RowState, Rows,
    RowsMut, SamplingOptions, SamplingOutputs, ShardDraw, Softmax, Targets, Upstream, Value,
    Values, ValuesMut, merge_cross_entropy_states, merge_row_states, merge_shard_draws,
    shard_draw_token,
};
#[cfg(feature = "cudarc")]
pub use api::{CudarcElement, CudarcType};
pub use error::{CudaDriverError, Error, Result};
pub use runtime::driver::DeviceInfo;
pub use runtime::modules::{KERNEL_BUILD_ENV, KernelBuild, KernelImage};
pub use runtime::tune as autotune;
pub use runtime::tune::TUNE_CACHE_ENV;
pub use shape::Shape;
pub use variant::Variant;

/// cust, re-exported so users build device buffers with the same version the API takes.
pub use cust;
/// half, re-exported: its `bf16` and `f16` are the 16-bit element types the API takes.
pub use half;
