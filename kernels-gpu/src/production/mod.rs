//! The production f32 softmax kernels (the `softmax` PTX module): rows in registers for
//! narrow rows, a block's registers for wide ones, and for rows too wide for one block,
//! slices of a row in several blocks (row slices, row clusters). Row slices is one
//! template for every element type: its bf16 and f16 entries are in those types' operation
//! modules.

#[cfg(kernels_module = "softmax")]
mod block_registers;
// Thread-block clusters and distributed shared memory exist from sm_90 on; the sm_80 build
// (`kernels_sm80`, set by ptx-builder) leaves the family out and the host never plans it there.
#[cfg(all(kernels_module = "softmax", not(kernels_sm80)))]
mod row_cluster;
mod row_slices;
#[cfg(kernels_module = "softmax")]
mod rows_in_registers;
mod slice_softmax;
