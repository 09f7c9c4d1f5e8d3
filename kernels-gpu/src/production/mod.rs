//! The production f32 softmax kernels (the `softmax` PTX module): rows in registers for
//! narrow rows, a block's registers for wide ones, and for rows too wide for one block,
//! slices of a row in several blocks (row slices, row clusters). Row slices is one
//! template for every element type: its bf16 and f16 entries are in those types' operation
//! modules.

#[cfg(feature = "softmax")]
mod block_registers;
#[cfg(feature = "softmax")]
mod row_cluster;
mod row_slices;
#[cfg(feature = "softmax")]
mod rows_in_registers;
