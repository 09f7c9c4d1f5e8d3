//! The f32 softmax variants' launch definitions (the `softmax` PTX module's seeds and
//! production kernels, and the row-slices entries of every element type): block sizes, the
//! instance tables and the kernel names the host launches by.

use super::{MAX_BLOCK_THREADS, WARP_SIZE, entry_name, write_entry_name};
use crate::launch::ops::DType;

/// A device address in a [`SoftmaxParams`] buffer field: on the device an untyped pointer
/// (the kernel says the element type), on the host the address as an integer; 8 bytes on both.
/// Pointers on the device because each field is also one kernel parameter, and the compiler
/// knows pointer parameters of a kernel address global memory: the kernels' plain loads and
/// stores through them are then global-memory ones (`ld.global`), which they would not be
/// through an integer or a struct passed whole.
#[cfg(target_arch = "nvptx64")]
pub type DeviceAddress = *const core::ffi::c_void;
/// A device address in a [`SoftmaxParams`] buffer field (a pointer on the device).
#[cfg(not(target_arch = "nvptx64"))]
pub type DeviceAddress = u64;

/// The fields of [`SoftmaxParams`], written once: passes them to `$callback!` after the given
/// arguments, as `field: type` with their documentation. The struct and the parameter list of
/// every entry that takes it (`primitives::entry::softmax_entry!`) are both made from it.
macro_rules! with_softmax_param_fields {
    ($callback:ident $(, $argument:tt)*) => {
        $callback!(
            $($argument,)*
            /// The input rows: `rows · cols` elements of the entry's type, row-major.
            input: $crate::launch::softmax::DeviceAddress,
            /// The output rows, as `input` (a distinct buffer); the unfused variant's
            /// element-wise kernels also work in place in it.
            output: $crate::launch::softmax::DeviceAddress,
            /// The unfused variant's row maxima: `rows` floats.
            row_max: $crate::launch::softmax::DeviceAddress,
            /// The unfused variant's row sums: `rows` floats.
            row_sum: $crate::launch::softmax::DeviceAddress,
            /// Two floats per block of a sliced launch: the statistics its blocks exchange.
            partials: $crate::launch::softmax::DeviceAddress,
            /// The barrier words of a sliced launch (each family says how many), zeroed when
            /// allocated and used by one launch at a time.
            barriers: $crate::launch::softmax::DeviceAddress,
            /// How long a row-slices block waits for its row before leaving its slice, in ns.
            patience_ns: u64,
            /// The elements of the unfused variant's element-wise passes (`rows · cols`).
            len: u64,
            rows: u32,
            cols: u32,
            /// Blocks sharing one row (1 = a block per row).
            slices: u32,
            /// Packs of a row each slice holds.
            slice_packs: u32,
            /// 1 when each block keeps its slice in shared memory between the two passes,
            /// else 0.
            cached: u32,
            /// Rows of the first wave a row-slices launch holds back in turn, and for how
            /// long each (`primitives::row_exchange::stagger_first_wave`); 0: none. Only the
            /// row-slices entries read them.
            stagger_rows: u32,
            /// Nanoseconds each of those rows waits beyond the row before it.
            stagger_ns: u32,
        );
    };
}

// The device build makes the entries' parameter lists from it too (row slices are in every
// module but the f32 operations').
#[cfg(all(target_arch = "nvptx64", not(kernels_module = "ops-f32")))]
pub(crate) use with_softmax_param_fields;

/// The struct, and on the host the driver's argument array for it.
macro_rules! softmax_params_struct {
    ($($(#[$doc:meta])* $field:ident: $type:ty,)+) => {
        /// Everything a kernel of the f32 softmax families (the seeds, rows in registers,
        /// block registers, row slices of every element type, row clusters) takes. The host
        /// fills every field for every launch; each kernel reads the ones its `# Safety`
        /// contract names, under that contract. An entry takes the fields as its parameters,
        /// one each in this order (see [`DeviceAddress`]), and rebuilds the struct from them.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[cfg_attr(not(target_arch = "nvptx64"), derive(Default))]
        pub struct SoftmaxParams {
            $($(#[$doc])* pub $field: $type,)+
        }

        impl SoftmaxParams {
            /// Kernel parameters of an entry that takes these fields: one per field.
            pub const FIELDS: usize = [$(stringify!($field)),+].len();

            /// The driver's argument array: a pointer to each field, in parameter order
            /// (valid while `self` stays put).
            #[cfg(not(target_arch = "nvptx64"))]
            pub fn argument_pointers(&mut self) -> [*mut core::ffi::c_void; Self::FIELDS] {
                [$((&mut self.$field as *mut $type).cast()),+]
            }
        }
    };
}

with_softmax_param_fields!(softmax_params_struct);

/// The seeds' entries, one name each.
pub mod seed_entries {
    use super::entry_name;

    pub const UNFUSED_ROW_MAX: &str = entry_name!(seed unfused_row_max);
    pub const UNFUSED_SUBTRACT: &str = entry_name!(seed unfused_subtract);
    pub const UNFUSED_EXP: &str = entry_name!(seed unfused_exp);
    pub const UNFUSED_ROW_SUM: &str = entry_name!(seed unfused_row_sum);
    pub const UNFUSED_DIVIDE: &str = entry_name!(seed unfused_divide);
    pub const THREAD_PER_ROW_NAIVE: &str = entry_name!(seed thread_per_row_naive);
    pub const THREAD_PER_ROW_ONLINE: &str = entry_name!(seed thread_per_row_online);
    pub const WARP_PER_ROW_ONLINE: &str = entry_name!(seed warp_per_row_online);
    pub const BLOCK_PER_ROW_SMEM: &str = entry_name!(seed block_per_row_smem);
}

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

/// Floats in one vector pack of the vectorized kernels (16 bytes).
pub const VECTOR_PACK: u32 = 4;

/// The rows-in-registers instances, written once: passes them to `$callback!` after the
/// given arguments, as `vector <pack>: [(lanes, packs), …], scalar <pack>: […]`. The tables
/// below and the family's entries (`production::rows_in_registers`) are both made from it,
/// so what the host dispatches from is what the PTX holds.
macro_rules! with_register_instances {
    ($callback:ident $(, $argument:tt)*) => {
        $callback!(
            $($argument,)*
            vector 4: [
                (1, 1), (2, 1), (4, 1), (8, 1), (16, 1),
                (32, 1), (32, 2), (32, 3), (32, 4), (32, 5), (32, 6), (32, 7), (32, 8),
                (32, 9), (32, 10), (32, 11), (32, 12), (32, 13), (32, 14), (32, 15), (32, 16)
            ],
            scalar 1: [
                (1, 1), (2, 1), (4, 1), (8, 1), (16, 1),
                (32, 1), (32, 2), (32, 3), (32, 4), (32, 6), (32, 8), (32, 12), (32, 16),
                (32, 20), (32, 24), (32, 28), (32, 32)
            ]
        );
    };
}

// The softmax module's build generates the entries from it too.
#[cfg(all(target_arch = "nvptx64", kernels_module = "softmax"))]
pub(crate) use with_register_instances;

/// The rows-in-registers tables the host dispatches from.
macro_rules! register_tables {
    (
        vector $vector_pack:literal: [$($vector:tt),+],
        scalar $scalar_pack:literal: [$($scalar:tt),+]
    ) => {
        /// The 16-byte rows-in-registers kernels, as `(lanes per row, packs per lane)`: an
        /// instance holds rows up to `lanes · packs · 4` columns.
        pub const REGISTER_VECTOR_INSTANCES: &[(u32, u32)] = &[$($vector),+];

        /// The 4-byte instances, for rows whose width or address rules out 16-byte access: an
        /// instance holds rows up to `lanes · packs` columns.
        pub const REGISTER_SCALAR_INSTANCES: &[(u32, u32)] = &[$($scalar),+];

        const _: () = assert!($vector_pack == VECTOR_PACK && $scalar_pack == 1);
    };
}

with_register_instances!(register_tables);

/// Every group of a rows-in-registers instance is a power of two of lanes within a warp.
const _: () = {
    let tables = [REGISTER_VECTOR_INSTANCES, REGISTER_SCALAR_INSTANCES];
    let mut t = 0;
    while t < tables.len() {
        let mut i = 0;
        while i < tables[t].len() {
            let lanes = tables[t][i].0;
            assert!(lanes.is_power_of_two() && lanes <= WARP_SIZE);
            i += 1;
        }
        t += 1;
    }
};

/// A rows-in-registers entry: pack width (1 or [`VECTOR_PACK`]), lanes per row and packs per
/// lane. Its `Display` is the PTX entry name (`softmax_rows_in_registers_p4_l32_n8`), the same
/// spelling the family generates its entries with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegisterKernelName {
    pub pack: u32,
    pub lanes: u32,
    pub packs: u32,
}

impl core::fmt::Display for RegisterKernelName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write_entry_name!(f, rows_in_registers(self.pack)(self.lanes)(self.packs))
    }
}

/// The block-registers instances, written once: passes them to `$callback!` after the given
/// arguments, as `vector <pack>: threads […], packs […], scalar <pack>: …`; every (threads,
/// packs) pair of a layout's two lists is an instance, and every packs count an entry (the
/// block size is a launch parameter). The tables below and the family's entries
/// (`production::block_registers`) are both made from it.
macro_rules! with_block_register_instances {
    ($callback:ident $(, $argument:tt)*) => {
        $callback!(
            $($argument,)*
            vector 4: threads [128, 256, 512, 1024],
                packs [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16],
            scalar 1: threads [256, 1024], packs [4, 8, 16, 32]
        );
    };
}

// The softmax module's build generates the entries from it too.
#[cfg(all(target_arch = "nvptx64", kernels_module = "softmax"))]
pub(crate) use with_block_register_instances;

/// The block-registers tables the host plans from.
macro_rules! block_register_tables {
    (
        vector $vector_pack:literal: threads $vector_threads:tt, packs $vector_packs:tt,
        scalar $scalar_pack:literal: threads $scalar_threads:tt, packs $scalar_packs:tt
    ) => {
        /// The 16-byte block-registers kernels: a block of `threads` holds `threads · packs ·
        /// 4` floats of a row (plus up to 3 leading and 3 trailing ones). The packs are a
        /// compile-time constant (the registers a thread holds them in), the threads the
        /// launch's block size.
        pub const BLOCK_REGISTER_VECTOR_THREADS: &[u32] = &$vector_threads;
        /// The packs per thread of [`BLOCK_REGISTER_VECTOR_THREADS`]' kernels.
        pub const BLOCK_REGISTER_VECTOR_PACKS: &[u32] = &$vector_packs;

        /// The 4-byte block-registers kernels, for input and output misaligned differently
        /// modulo 16 bytes.
        pub const BLOCK_REGISTER_SCALAR_THREADS: &[u32] = &$scalar_threads;
        /// The packs per thread of [`BLOCK_REGISTER_SCALAR_THREADS`]' kernels.
        pub const BLOCK_REGISTER_SCALAR_PACKS: &[u32] = &$scalar_packs;

        const _: () = assert!($vector_pack == VECTOR_PACK && $scalar_pack == 1);
    };
}

with_block_register_instances!(block_register_tables);

/// Every block-registers block is whole warps, at most [`MAX_BLOCK_THREADS`].
const _: () = {
    let tables = [BLOCK_REGISTER_VECTOR_THREADS, BLOCK_REGISTER_SCALAR_THREADS];
    let mut t = 0;
    while t < tables.len() {
        let mut i = 0;
        while i < tables[t].len() {
            let threads = tables[t][i];
            assert!(threads.is_multiple_of(WARP_SIZE) && threads <= MAX_BLOCK_THREADS);
            i += 1;
        }
        t += 1;
    }
};

/// A block-registers instance: pack width, threads per block and packs per thread. Its
/// `Display` is the PTX entry name, which every block size of one pack width and packs count
/// shares (`softmax_block_registers_p4_n8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRegisterInstance {
    pub pack: u32,
    pub threads: u32,
    pub packs: u32,
}

impl core::fmt::Display for BlockRegisterInstance {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write_entry_name!(f, block_registers(self.pack)(self.packs))
    }
}

/// A row-slices entry: element type and pack width (1, or 16 bytes of elements). Its
/// `Display` is the PTX entry name: `softmax_row_slices_p4` for f32 (the softmax module),
/// `softmax_row_slices_bf16_p8` for a 16-bit type (that type's operation module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowSlicesKernelName {
    pub dtype: DType,
    pub pack: u32,
}

impl RowSlicesKernelName {
    /// The 16-byte and the one-element entry of `dtype`.
    pub fn both(dtype: DType) -> [Self; 2] {
        [dtype.vector_pack(), 1].map(|pack| RowSlicesKernelName { dtype, pack })
    }
}

impl core::fmt::Display for RowSlicesKernelName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.dtype {
            DType::F32 => write_entry_name!(f, row_slices_f32(self.pack)),
            other => write_entry_name!(f, row_slices(other.name())(self.pack)),
        }
    }
}

/// A row-cluster entry: its pack width (1 or [`VECTOR_PACK`]). Its `Display` is the PTX entry
/// name (`softmax_row_cluster_p4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowClusterKernelName {
    pub pack: u32,
}

impl core::fmt::Display for RowClusterKernelName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write_entry_name!(f, row_cluster(self.pack))
    }
}

/// Most threads per block with which a sliced row-slices launch chooses its slices (and most
/// slices per row); the host then adds threads if that saves a round of loads. 256 rather than
/// 512 lets more, shorter slices stay resident (performance log: "Row slices at most 256 threads
/// per block").
pub const ROW_SLICE_THREADS: u32 = 256;

/// Vector packs each thread loads before it uses any of them: the loads in flight per thread.
pub const LOADS_IN_FLIGHT: u32 = 4;
