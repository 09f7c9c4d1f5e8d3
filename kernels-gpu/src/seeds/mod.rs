//! The seed baselines: the textbook variants of the project's two source worklogs, kept as
//! references for the production kernels (the `softmax` PTX module).

mod block_per_row_smem;
mod thread_per_row;
mod unfused;
mod warp_per_row;
