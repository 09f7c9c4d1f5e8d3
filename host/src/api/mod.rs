//! The public API: the handle ([`Softmax`]), the views every call takes whatever its buffers
//! are ([`Rows`], [`RowsMut`], [`Values`], [`ValuesMut`]), the options with the stream
//! ([`Options`], [`CallStream`]), and the one call description (`call`) every operation goes
//! through on its way to the runtime.

mod call;
mod cross_entropy;
#[cfg(feature = "cudarc")]
mod cudarc;
mod inspect;
mod operations;
mod options;
mod place;
mod reserve;
mod sampling;
mod softmax;
mod tune;
mod views;

pub use cross_entropy::{
    CrossEntropyOptions, CrossEntropyOutputs, CrossEntropyState, Reduction, Targets, Upstream,
    merge_cross_entropy_states,
};
#[cfg(feature = "cudarc")]
pub use cudarc::{CudarcElement, CudarcType};
pub use options::{CallStream, Options};
pub use reserve::CallKind;
pub use sampling::{
    NO_TOKEN, PerRow, SamplingOptions, SamplingOutputs, ShardDraw, merge_shard_draws,
    shard_draw_token,
};
pub use softmax::Softmax;
pub use views::{
    DType, Element, Mask, MaskedRows, Operation, RowState, Rows, RowsMut, Value, Values, ValuesMut,
    merge_row_states,
};
