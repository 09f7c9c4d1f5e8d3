//! What the host and the kernels share to launch a kernel: block sizes, shared-memory
//! layouts, instance tables, kernel names and parameter structs. Compiled on both sides; it
//! holds no device code and generates no entry points (each kernel family generates its own
//! from the instance lists here, so what the host plans with is what the PTX holds).

pub mod cross_entropy;
pub mod ops;
pub mod sampling;
pub mod softmax;

/// Every kernel entry's name, spelled here once for each family: the name's literal parts
/// and the given values, in order. The device exports each entry as [`entry_name!`] makes it
/// (`concat!`), and the host's name types (`RegisterKernelName`, `OpInstance`, …) write theirs
/// with [`write_entry_name!`] through the same arm, so the two cannot disagree.
/// docs/entries.md lists every entry (a host test keeps it current).
macro_rules! entry_name_pieces {
    ($to:tt; seed $name:ident) => {
        $crate::launch::entry_name_pieces!(@emit $to "softmax_", stringify!($name))
    };
    ($to:tt; rows_in_registers $pack:tt $lanes:tt $packs:tt) => {
        $crate::launch::entry_name_pieces!(
            @emit $to "softmax_rows_in_registers_p", $pack, "_l", $lanes, "_n", $packs
        )
    };
    ($to:tt; block_registers $pack:tt $packs:tt) => {
        $crate::launch::entry_name_pieces!(
            @emit $to "softmax_block_registers_p", $pack, "_n", $packs
        )
    };
    ($to:tt; row_slices_f32 $pack:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "softmax_row_slices_p", $pack)
    };
    ($to:tt; row_slices $input:tt $pack:tt) => {
        $crate::launch::entry_name_pieces!(
            @emit $to "softmax_row_slices_", $input, "_p", $pack
        )
    };
    ($to:tt; row_cluster $pack:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "softmax_row_cluster_p", $pack)
    };
    ($to:tt; op_rows $direction:tt $input:tt $pack:tt $layout:tt $lanes:tt $packs:tt) => {
        $crate::launch::entry_name_pieces!(
            @emit $to "op_rows_", $direction, "_", $input, "_p", $pack, $layout, "_l", $lanes,
            "_n", $packs
        )
    };
    ($to:tt; op_block $direction:tt $input:tt $pack:tt $layout:tt $packs:tt) => {
        $crate::launch::entry_name_pieces!(
            @emit $to "op_block_", $direction, "_", $input, "_p", $pack, $layout, "_n", $packs
        )
    };
    ($to:tt; cross_entropy $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "cross_entropy_", $input)
    };
    ($to:tt; cross_entropy_slices $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "cross_entropy_slices_", $input)
    };
    ($to:tt; cross_entropy_totals $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "cross_entropy_totals_", $input)
    };
    ($to:tt; cross_entropy_reduce $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "cross_entropy_reduce_", $input)
    };
    ($to:tt; sample $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "sample_", $input)
    };
    ($to:tt; sample_draw $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "sample_draw_", $input)
    };
    ($to:tt; sample_top $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "sample_top_", $input)
    };
    ($to:tt; sample_top_merge $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "sample_top_merge_", $input)
    };
    ($to:tt; sample_merge $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "sample_merge_", $input)
    };
    ($to:tt; sample_advance $input:tt) => {
        $crate::launch::entry_name_pieces!(@emit $to "sample_advance_", $input)
    };
    (@emit [literal] $($piece:expr),+) => {
        concat!($($piece),+)
    };
    (@emit [write $f:expr] $($piece:expr),+) => {{
        let f: &mut core::fmt::Formatter<'_> = $f;
        $(core::fmt::Display::fmt(&$piece, f)?;)+
        Ok(())
    }};
}

/// An entry's name as a string literal, from literal pieces: `entry_name!(row_cluster 4)` is
/// `"softmax_row_cluster_p4"` (the forms are [`entry_name_pieces!`]'s).
macro_rules! entry_name {
    ($($family:tt)+) => {
        $crate::launch::entry_name_pieces!([literal]; $($family)+)
    };
}

/// Writes an entry's name to the formatter `$f` from runtime pieces (each one token: a
/// literal or a parenthesized expression) through the same arm of [`entry_name_pieces!`] as
/// [`entry_name!`]; evaluates to `core::fmt::Result`.
macro_rules! write_entry_name {
    ($f:expr, $($family:tt)+) => {
        $crate::launch::entry_name_pieces!([write $f]; $($family)+)
    };
}

pub(crate) use {entry_name, entry_name_pieces, write_entry_name};

/// Threads in a warp.
pub const WARP_SIZE: u32 = 32;

/// Smallest and largest threads per block a block-level reduction accepts.
pub const MIN_BLOCK_THREADS: u32 = WARP_SIZE;
pub const MAX_BLOCK_THREADS: u32 = 1024;

/// Floats at the start of dynamic shared memory that block reductions use: one running
/// maximum and one running sum per warp.
pub const REDUCTION_SCRATCH_FLOATS: u32 = 2 * (MAX_BLOCK_THREADS / WARP_SIZE);

/// Floats a block whose row is a thread-block cluster reserves after the reduction scratch for
/// what it publishes to the cluster: the statistics (two floats), or for cross-entropy the
/// statistics and two sums (four, which also keep what follows 16-byte aligned).
pub const CLUSTER_STATS_FLOATS: u32 = 4;

/// Floats a block of the operation kernels whose row is a thread-block cluster of `slices`
/// blocks of `threads` threads reserves after the reduction scratch: every warp of every block
/// of the cluster pushes its statistics (two floats) into every block's slots.
pub const fn pushed_cluster_floats(threads: u32, slices: u32) -> u32 {
    2 * threads.div_ceil(WARP_SIZE) * slices
}

/// Most blocks in a cluster that holds a row: Hopper's largest, which is above the portable 8
/// and so needs the function attribute that allows non-portable sizes (set when loading).
pub const MAX_CLUSTER_BLOCKS: u32 = 16;

// The cluster exchanges reach every block of a cluster from one warp, a block a lane.
const _: () = assert!(MAX_CLUSTER_BLOCKS <= WARP_SIZE);

/// Words before a launch's barrier words in the workspace: the first counts the row-slices
/// blocks that left their slices (tests read it); the rest keep the barrier words at the
/// 128-byte alignment of the allocation.
pub const BARRIER_HEADER_WORDS: usize = 32;
