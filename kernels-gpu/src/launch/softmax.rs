//! The f32 softmax variants' launch definitions (the `softmax` PTX module's seeds and
//! production kernels, and the row-slices entries of every element type): block sizes, the
//! instance tables and the kernel names the host launches by.

/// Threads per block for the one-thread-per-row variants.
pub const THREAD_PER_ROW_BLOCK: u32 = 128;

/// Warps per block for the one-warp-per-row variant: each warp owns one row.
pub const WARP_PER_ROW_WARPS_PER_BLOCK: u32 = 4;

/// Threads per block of the seed's block-per-row kernel when the caller does not choose.
pub const BLOCK_SMEM_DEFAULT_THREADS: u32 = 128;

/// Threads per block tried by the autotuned block-per-row variant (the seed's candidates).
pub const BLOCK_SMEM_AUTOTUNE_CANDIDATES: [u32; 4] = [128, 256, 512, 1024];

/// Threads per block of the unfused variant's element-wise kernels.
pub const ELEMENTWISE_BLOCK: u32 = 256;

/// Threads per block of the rows-in-registers kernels; rows per block = this / group width.
pub const REGISTER_ROWS_BLOCK: u32 = 128;

/// Declares the rows-in-registers instances once: the table the host dispatches from and,
/// when building for the GPU, one `ptx-kernel` entry per row of it, named as
/// [`RegisterKernelName`] spells it.
macro_rules! register_instances {
    ($(#[$doc:meta])* $table:ident, pack $pack:literal: $(($lanes:literal, $packs:literal)),+ $(,)?) => {
        $(#[$doc])*
        pub const $table: &[(u32, u32)] = &[$(($lanes, $packs)),+];
        $(
            #[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
            const _: () = {
                /// # Safety
                /// See [`crate::production::rows_in_registers::softmax_rows_in_registers`].
                #[unsafe(export_name = concat!(
                    "softmax_rows_in_registers_p", $pack, "_l", $lanes, "_n", $packs
                ))]
                unsafe extern "ptx-kernel" fn entry(
                    input: *const f32,
                    output: *mut f32,
                    rows: u32,
                    cols: u32,
                ) {
                    crate::primitives::device::await_previous_grid();
                    // SAFETY: forwarded from this entry's contract.
                    unsafe {
                        crate::production::rows_in_registers::softmax_rows_in_registers::<$pack, $lanes, $packs>(
                            input, output, rows, cols,
                        )
                    }
                }
            };
        )+
    };
}

register_instances! {
    /// The 16-byte rows-in-registers kernels, as `(lanes per row, packs per lane)`: an instance
    /// holds rows up to `lanes · packs · 4` columns.
    REGISTER_VECTOR_INSTANCES, pack 4:
    (1, 1), (2, 1), (4, 1), (8, 1), (16, 1),
    (32, 1), (32, 2), (32, 3), (32, 4), (32, 5), (32, 6), (32, 7), (32, 8),
    (32, 9), (32, 10), (32, 11), (32, 12), (32, 13), (32, 14), (32, 15), (32, 16),
}

register_instances! {
    /// The 4-byte instances, for rows whose width or address rules out 16-byte access: an
    /// instance holds rows up to `lanes · packs` columns.
    REGISTER_SCALAR_INSTANCES, pack 1:
    (1, 1), (2, 1), (4, 1), (8, 1), (16, 1),
    (32, 1), (32, 2), (32, 3), (32, 4), (32, 6), (32, 8), (32, 12), (32, 16),
    (32, 20), (32, 24), (32, 28), (32, 32),
}

/// One block-registers `ptx-kernel` entry for each packs count, at one block size.
macro_rules! block_register_entries {
    ($pack:literal, $threads:literal, [$($packs:literal),+]) => {
        $(
            #[cfg(all(target_arch = "nvptx64", feature = "softmax"))]
            const _: () = {
                /// # Safety
                /// See [`crate::production::block_registers::softmax_block_registers`].
                #[unsafe(export_name = concat!(
                    "softmax_block_registers_p", $pack, "_t", $threads, "_n", $packs
                ))]
                unsafe extern "ptx-kernel" fn entry(
                    input: *const f32,
                    output: *mut f32,
                    cols: u32,
                    slices: u32,
                    slice_packs: u32,
                    partials: *mut f32,
                    barriers: *mut u32,
                ) {
                    crate::primitives::device::await_previous_grid();
                    // SAFETY: forwarded from this entry's contract.
                    unsafe {
                        crate::production::block_registers::softmax_block_registers::<$pack, $threads, $packs>(
                            input, output, cols, slices, slice_packs, partials, barriers,
                        )
                    }
                }
            };
        )+
    };
}

/// Declares the block-registers instances once: every (threads, packs) pair of the two lists
/// gets an entry on the GPU, named as [`BlockRegisterKernelName`] spells it, and the host
/// plans from the same two lists.
macro_rules! block_register_instances {
    ($(#[$doc:meta])* $threads_table:ident, $packs_table:ident, pack $pack:literal:
     threads [$($threads:literal),+], packs $packs:tt $(,)?) => {
        $(#[$doc])*
        pub const $threads_table: &[u32] = &[$($threads),+];
        $(#[$doc])*
        pub const $packs_table: &[u32] = &$packs;
        $(block_register_entries!($pack, $threads, $packs);)+
    };
}

block_register_instances! {
    /// The 16-byte block-registers kernels: a block of `threads` holds `threads · packs · 4`
    /// floats of a row (plus up to 3 leading and 3 trailing ones). Both are compile-time
    /// constants so pack addresses are immediate offsets from one base register.
    BLOCK_REGISTER_VECTOR_THREADS, BLOCK_REGISTER_VECTOR_PACKS, pack 4:
    threads [128, 256, 512, 1024],
    packs [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16],
}

block_register_instances! {
    /// The 4-byte block-registers kernels, for input and output misaligned differently
    /// modulo 16 bytes.
    BLOCK_REGISTER_SCALAR_THREADS, BLOCK_REGISTER_SCALAR_PACKS, pack 1:
    threads [256, 1024],
    packs [4, 8, 16, 32],
}

/// A block-registers entry: pack width, threads per block and packs per thread. Its
/// `Display` is the PTX entry name (`softmax_block_registers_p4_t512_n8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRegisterKernelName {
    pub pack: u32,
    pub threads: u32,
    pub packs: u32,
}

impl core::fmt::Display for BlockRegisterKernelName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "softmax_block_registers_p{}_t{}_n{}",
            self.pack, self.threads, self.packs
        )
    }
}

/// A row-slices entry: element type and pack width (1, or 16 bytes of elements). Its
/// `Display` is the PTX entry name: `softmax_row_slices_p4` for f32 (the softmax module),
/// `softmax_row_slices_bf16_p8` for a 16-bit type (that type's operation module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSlicesKernelName {
    pub dtype: crate::launch::ops::DType,
    pub pack: u32,
}

impl RowSlicesKernelName {
    /// The 16-byte and the one-element entry of `dtype`.
    pub fn both(dtype: crate::launch::ops::DType) -> [Self; 2] {
        [dtype.vector_pack(), 1].map(|pack| RowSlicesKernelName { dtype, pack })
    }
}

impl core::fmt::Display for RowSlicesKernelName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.dtype {
            crate::launch::ops::DType::F32 => write!(f, "softmax_row_slices_p{}", self.pack),
            other => write!(f, "softmax_row_slices_{}_p{}", other.name(), self.pack),
        }
    }
}

/// Floats in one vector pack of the vectorized kernels (16 bytes).
pub const VECTOR_PACK: u32 = 4;

/// A rows-in-registers entry: pack width (1 or [`VECTOR_PACK`]), lanes per row and packs per
/// lane. Its `Display` is the PTX entry name (`softmax_rows_in_registers_p4_l32_n8`), the same
/// spelling the kernel crate generates its entries with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterKernelName {
    pub pack: u32,
    pub lanes: u32,
    pub packs: u32,
}

impl core::fmt::Display for RegisterKernelName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "softmax_rows_in_registers_p{}_l{}_n{}",
            self.pack, self.lanes, self.packs
        )
    }
}

/// Most threads per block with which a sliced row-slices launch chooses its slices (and most
/// slices per row); the host then adds threads if that saves a round of loads. Measured on the
/// H200 (bench/NOTES.md, session 7): 256 rather than 512 lets more, shorter slices stay
/// resident; f32 32x151936 20.2 -> 18.2 us, 128x50257 23.8 -> 22.5 us.
pub const ROW_SLICE_THREADS: u32 = 256;

/// Floats a row-cluster block reserves after the reduction scratch for the statistics it
/// publishes to its cluster (two used; four keep the slice cache after them 16-byte aligned).
pub const CLUSTER_STATS_FLOATS: u32 = 4;

/// Most blocks in a row-cluster cluster: Hopper's largest, which is above the portable 8 and
/// so needs the function attribute that allows non-portable sizes (set when loading).
pub const MAX_CLUSTER_BLOCKS: u32 = 16;

/// Vector packs each thread loads before it uses any of them: the loads in flight per thread.
pub const LOADS_IN_FLIGHT: u32 = 4;
