//! What the host and the kernels share to launch a kernel: block sizes, shared-memory
//! layouts, instance tables, kernel names and parameter structs. Compiled on both sides; it
//! holds no device code and generates no entry points (each kernel family generates its own
//! from the instance lists here, so what the host plans with is what the PTX holds).

pub mod ops;
pub mod softmax;

/// Threads in a warp.
pub const WARP_SIZE: u32 = 32;

/// Smallest and largest threads per block a block-level reduction accepts.
pub const MIN_BLOCK_THREADS: u32 = WARP_SIZE;
pub const MAX_BLOCK_THREADS: u32 = 1024;

/// Floats at the start of dynamic shared memory that block reductions use: one running
/// maximum and one running sum per warp.
pub const REDUCTION_SCRATCH_FLOATS: u32 = 2 * (MAX_BLOCK_THREADS / WARP_SIZE);

/// Floats a block whose row is a thread-block cluster reserves after the reduction scratch for
/// the statistics it publishes to the cluster (two used; four keep what follows 16-byte
/// aligned).
pub const CLUSTER_STATS_FLOATS: u32 = 4;

/// Most blocks in a cluster that holds a row: Hopper's largest, which is above the portable 8
/// and so needs the function attribute that allows non-portable sizes (set when loading).
pub const MAX_CLUSTER_BLOCKS: u32 = 16;

/// Words before a launch's barrier words in the workspace: the first counts the row-slices
/// blocks that left their slices (tests read it); the rest keep the barrier words at the
/// 128-byte alignment of the allocation.
pub const BARRIER_HEADER_WORDS: usize = 32;
