//! The operation kernels' launch definitions (softmax and log-softmax forward with options,
//! their backward passes, per-row log-sum-exp and partial statistics, for f32, bf16 and f16
//! data): the parameter block both sides share, the instance tables the host plans from and
//! the kernel names it launches by.
//!
//! Every operation kernel takes one [`RowOpParams`] by value. The input element type is a
//! compile-time parameter (it fixes the width of a 16-byte pack); the output type, the
//! operation and every option are runtime fields, uniform across the launch.

use super::{MAX_BLOCK_THREADS, WARP_SIZE, write_entry_name};

/// An element type of the data a kernel reads or writes.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32 = 0,
    Bf16 = 1,
    F16 = 2,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::Bf16, DType::F16];

    pub const fn bytes(self) -> u32 {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }

    /// Lower-case name, as kernel names and the command line spell it.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }

    /// Elements of this type in one 16-byte pack.
    pub const fn vector_pack(self) -> u32 {
        16 / self.bytes()
    }
}

/// What a forward kernel writes per element, or which backward pass it computes.
pub mod op {
    /// `y = e^(x - max) / Σ e^(x - max)`; backward `dx = y ⊙ (dy − Σ dy⊙y)`.
    pub const SOFTMAX: u32 = 0;
    /// `y = x - max - ln Σ e^(x - max)`; backward `dx = dy − e^y ⊙ Σ dy`.
    pub const LOG_SOFTMAX: u32 = 1;
}

/// Which part of the computation a launch does.
pub mod mode {
    /// Reduce each row, then write the outputs (elements and/or per-row log-sum-exp).
    pub const FULL: u32 = 0;
    /// Reduce each row and store its [`RowState`](super::RowState) in slot `state_slot` of `states`; write
    /// nothing else.
    pub const STATES: u32 = 1;
    /// Merge the `state_slots` states stored for each row instead of reducing, then write the
    /// outputs as [`FULL`] does.
    pub const APPLY_STATES: u32 = 2;
    /// Block kernels: each block stores the state of its own slice of its row in slot
    /// `slice`, and writes nothing else. With [`APPLY_STATES`] over `slices` slots after it,
    /// this is the two-launch form of a sliced row, which needs no block to wait for another.
    pub const SLICE_STATES: u32 = 3;
}

/// The statistics of (part of) a row: its maximum and `Σ e^(x - max)` for a forward pass, or
/// the backward pass's sum in `sum` (with `max` unused). Stored per row and slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct RowState {
    pub max: f32,
    pub sum: f32,
}

// SAFETY: two floats, no pointers: any bit pattern is valid on either side.
#[cfg(feature = "host")]
unsafe impl cust_core::DeviceCopy for RowState {}

/// Everything an operation kernel needs, passed by value (one kernel parameter). Pointers are
/// device addresses (0 = absent); strides count elements of the buffer they belong to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RowOpParams {
    /// `x` (forward) or `y` (backward), of the kernel's input type.
    pub input: u64,
    pub input_stride: u64,
    /// `dy` (backward only), of the kernel's input type.
    pub grad: u64,
    pub grad_stride: u64,
    /// The element output (`y`, `log y` or `dx`), of type `output_dtype`; 0 = not written.
    pub output: u64,
    pub output_stride: u64,
    /// f32 per row multiplying the scores (after `scale`); 0 = none.
    pub row_scale: u64,
    /// f32 added to the scaled scores; row `r` uses mask row `r % mask_rows`. 0 = none.
    pub additive_mask: u64,
    /// One byte per element: 0 masks the element out (as `-inf`), anything else keeps it.
    /// Row `r` uses mask row `r % mask_rows`. 0 = none.
    pub allowed_mask: u64,
    /// Elements between consecutive mask rows (both masks).
    pub mask_stride: u64,
    /// f32 per row: the row's log-sum-exp (after scale and masks); 0 = not written.
    pub log_sum_exp: u64,
    /// [`RowState`]s: `state_slots` slots of `rows` states each, slot-major (see [`mode`]).
    pub states: u64,
    /// Two floats per block (cooperative slices exchange their statistics through them).
    pub partials: u64,
    /// Two words per row, zeroed once (the cooperative slices' barrier).
    pub barriers: u64,
    pub rows: u32,
    pub cols: u32,
    pub mask_rows: u32,
    /// 0 = no causal mask; otherwise column `c` of row `r` is masked when
    /// `c > r % causal_period` (square score blocks stacked along the rows).
    pub causal_period: u32,
    /// Multiplies every score (1 / temperature) in the forward pass, and the gradient in the
    /// backward pass.
    pub scale: f32,
    /// [`op`]
    pub op: u32,
    /// [`DType`] of the element output, as `u32`.
    pub output_dtype: u32,
    /// [`mode`]
    pub mode: u32,
    pub state_slot: u32,
    pub state_slots: u32,
    /// Rows that are masked everywhere (maximum `-inf`): 0 writes NaN as PyTorch does, 1 writes
    /// a zero probability (log-softmax and log-sum-exp: `-inf`).
    pub masked_rows_zero: u32,
    /// Blocks sharing one row (block kernels; the rest of the row's slice geometry follows).
    pub slices: u32,
    /// Packs of a row each slice holds.
    pub slice_packs: u32,
}

/// A peeled row's two ends, the head and the tail: the slots a group needs beyond its body
/// packs, and the threads of a block that hold one end each in their extra slot.
pub const END_SLOTS: u32 = 2;

/// Threads per block of the group-per-row operation kernels.
pub const OP_ROWS_BLOCK: u32 = 128;

/// The operation kernels' instance lists, written once: passes them to `$callback!` after
/// the given arguments, as `packs: [widths]` (packs per thread, then the lanes per row or
/// threads per block it runs with). The tables below and the families' entries (`ops::rows`,
/// `ops::block`) are both made from it, so what the host plans with is what the PTX holds.
/// A block entry serves every block size of its packs count (a launch parameter); a group
/// entry is one (lanes, packs) pair, its width a compile-time constant (see `ops::op_entries`).
///
/// Every entry is unrolled over its packs, so the lists are as short as the planner allows.
/// The plain forward and the backward of aligned rows (the benchmarked calls) keep a group
/// for every width up to 2048 bf16 columns and three packs counts of blocks; unaligned rows
/// two groups, the masked forward two, single elements (rows that rule out 16-byte access)
/// one of 32 lanes; both one packs count of blocks, whose block size covers the widths
/// between (single elements keep 8 packs: rows up to 8192 columns in one block, as row states
/// need where the rows cannot stay resident). The planner takes the narrowest group that
/// holds a row, else a block. The plain forward's 8-pack blocks also have kept twins
/// (`block_kept`, [`OpInstance::kept`]), taken only where every block of a launch stays
/// resident with them.
macro_rules! with_op_instances {
    ($callback:ident $(, $argument:tt)*) => {
        $callback!(
            $($argument,)*
            rows_vector [2: [2, 4, 8, 16, 32], 4: [32], 8: [32]],
            rows_peeled [2: [8, 32]],
            rows_masked [2: [8, 32]],
            rows_scalar [1: [32]],
            block_vector [2: [128, 256], 4: [128, 256, 512, 1024], 8: [128, 256, 512, 1024]],
            block_kept [8: [128, 256, 512]],
            block_masked [4: [32, 64, 128, 256, 512, 1024]],
            block_scalar [8: [32, 64, 128, 256, 512, 1024]]
        );
    };
}

/// The instance tables the host plans from.
macro_rules! op_tables {
    (
        rows_vector $rows_vector:tt,
        rows_peeled $rows_peeled:tt,
        rows_masked $rows_masked:tt,
        rows_scalar $rows_scalar:tt,
        block_vector $block_vector:tt,
        block_kept $block_kept:tt,
        block_masked $block_masked:tt,
        block_scalar $block_scalar:tt
    ) => {
        /// `(packs per lane, lanes per row)` of the group-per-row operation kernels with
        /// 16-byte packs of the input type, for aligned rows but the masked forward: rows up
        /// to `lanes · packs · pack`.
        pub const OP_ROWS_VECTOR: OpTable = op_tables!(@table $rows_vector);

        /// The same for peeled rows (whose two ends take two slots of the group).
        pub const OP_ROWS_PEELED: OpTable = op_tables!(@table $rows_peeled);

        /// The same for the masked forward.
        pub const OP_ROWS_MASKED: OpTable = op_tables!(@table $rows_masked);

        /// The same with one element per pack, for layouts that rule out 16-byte access.
        pub const OP_ROWS_SCALAR: OpTable = op_tables!(@table $rows_scalar);

        /// `(packs per thread, threads)` of the block operation kernels (one block per row,
        /// or per slice of a row) with 16-byte packs, but the masked forward. A block of 1024
        /// threads gets at most 64 registers per thread, so the planner checks with the
        /// driver that an instance can launch at all.
        pub const OP_BLOCK_VECTOR: OpTable = op_tables!(@table $block_vector);

        /// The forward blocks of [`OP_BLOCK_VECTOR`] with a kept twin ([`OpInstance::kept`]),
        /// aligned and peeled: every element's exponential (or difference) held in f32 for
        /// the writes, for launches of few blocks a multiprocessor.
        pub const OP_BLOCK_KEPT: OpTable = op_tables!(@table $block_kept);

        /// The same for the masked forward.
        pub const OP_BLOCK_MASKED: OpTable = op_tables!(@table $block_masked);

        /// The same with one element per pack.
        pub const OP_BLOCK_SCALAR: OpTable = op_tables!(@table $block_scalar);
    };
    (@table [$($packs:literal: [$($width:literal),+]),+]) => {
        &[$(($packs, &[$($width),+])),+]
    };
}

/// An instance table: `(packs per thread, the widths that entry runs with)`.
pub type OpTable = &'static [(u32, &'static [u32])];

/// The group table of a direction with block entries only.
const NO_GROUPS: OpTable = &[];

// The operation modules' builds generate the entries from it too.
#[cfg(all(target_arch = "nvptx64", not(kernels_module = "softmax")))]
pub(crate) use with_op_instances;

with_op_instances!(op_tables);

/// Whether every (width, packs) pair of `table` is one its family can launch with at least
/// `min_slots` slots, and one [`table_instances`] lists: every width is a power of two; a group
/// is at most a warp; a block is whole warps, at most [`MAX_BLOCK_THREADS`], and at least
/// `END_SLOTS` threads (a peeled row's ends take one slot each of the first `END_SLOTS`
/// threads of a block).
const fn launchable(table: OpTable, groups: bool, min_slots: u32) -> bool {
    let mut i = 0;
    while i < table.len() {
        let (packs, widths) = table[i];
        let mut j = 0;
        while j < widths.len() {
            let width = widths[j];
            let shape_ok = if groups {
                width <= WARP_SIZE
            } else {
                width.is_multiple_of(WARP_SIZE) && width <= MAX_BLOCK_THREADS && width >= END_SLOTS
            };
            if !width.is_power_of_two() || !shape_ok || packs * width < min_slots {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
}

// A peeled row's two ends take two slots of its group: every peeled group has them (the family
// generates an entry for each).
const _: () = {
    assert!(launchable(OP_ROWS_VECTOR, true, 1));
    assert!(launchable(OP_ROWS_PEELED, true, END_SLOTS));
    assert!(launchable(OP_ROWS_MASKED, true, 1));
    assert!(launchable(OP_ROWS_SCALAR, true, 1));
    assert!(launchable(OP_BLOCK_VECTOR, false, 1));
    assert!(launchable(OP_BLOCK_KEPT, false, 1));
    assert!(launchable(OP_BLOCK_MASKED, false, 1));
    assert!(launchable(OP_BLOCK_SCALAR, false, 1));
};

/// What an operation kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Forward without masks (the scale is folded into the exponent).
    Forward,
    /// Forward with an additive or boolean mask, or the causal mask.
    MaskedForward,
    Backward,
    /// Cross-entropy's loss and gradient (`ops::cross_entropy_block`): block entries of
    /// aligned rows only, which take a
    /// [`CrossEntropyParams`](super::cross_entropy::CrossEntropyParams), not a [`RowOpParams`].
    CrossEntropy,
}

impl Direction {
    pub const ALL: [Direction; 4] = [
        Direction::Forward,
        Direction::MaskedForward,
        Direction::Backward,
        Direction::CrossEntropy,
    ];

    const fn tag(self) -> &'static str {
        match self {
            Direction::Forward => "fwd",
            Direction::MaskedForward => "mfwd",
            Direction::Backward => "bwd",
            Direction::CrossEntropy => "xent",
        }
    }
}

/// The two ways threads share rows in the operation kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKernelShape {
    /// `lanes` threads (≤ 32) per row, `OP_ROWS_BLOCK / lanes` rows per block.
    Rows { lanes: u32 },
    /// One block of `threads` per row or slice of a row.
    Block { threads: u32 },
}

/// How an operation kernel's rows meet 16-byte packs; each layout has its own entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackLayout {
    /// One element per access.
    Elements,
    /// Every row of every buffer starts on a pack, and `cols` is a multiple of the pack.
    Aligned,
    /// Every buffer starts 16-byte aligned and all share one row stride in elements, so rows are
    /// misaligned alike, and rows are at least a pack long: each row's unaligned head and tail
    /// are read one element at a time (in one access when exactly half a pack), the rest in
    /// packs (see [`crate::primitives::row_part`]). Forward and backward only: mask rows are
    /// laid out independently of the input's.
    Peeled,
}

impl PackLayout {
    /// Elements per access for `input`.
    pub const fn pack(self, input: DType) -> u32 {
        match self {
            PackLayout::Elements => 1,
            PackLayout::Aligned | PackLayout::Peeled => input.vector_pack(),
        }
    }

    /// Slots a row's head and tail take: none for whole packs or single elements, two when
    /// peeled.
    pub const fn end_slots(self) -> u32 {
        match self {
            PackLayout::Peeled => END_SLOTS,
            PackLayout::Elements | PackLayout::Aligned => 0,
        }
    }

    /// Whether the layout has entries for `direction`.
    pub const fn serves(self, direction: Direction) -> bool {
        match direction {
            Direction::MaskedForward => !matches!(self, PackLayout::Peeled),
            Direction::CrossEntropy => matches!(self, PackLayout::Aligned),
            Direction::Forward | Direction::Backward => true,
        }
    }
}

/// One planned operation instance: an entry and the group or block width it runs with. Its
/// `Display` is the PTX entry name, the spelling the families generate
/// (`op_rows_fwd_bf16_p8_l32_n4`, `op_block_fwd_f32_p4_n8`, `op_rows_bwd_f16_p8peeled_l8_n2`):
/// a group's lanes are part of its entry, a block's size is not (every block size of one
/// entry's packs count launches that entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpInstance {
    pub direction: Direction,
    pub input: DType,
    pub layout: PackLayout,
    pub shape: OpKernelShape,
    pub packs: u32,
    /// Whether the entry keeps every element's exponential (softmax) or difference
    /// (log-softmax) in f32 from the reduction to the writes, where the others widen and
    /// recompute them: fewer instructions an element, and for 16-bit inputs twice the
    /// registers for its packs. Forward blocks of [`OP_BLOCK_KEPT`] only, the twins of packed
    /// ones ([`OpInstance::kept_twin`]).
    pub kept: bool,
}

/// `(width, packs)` pairs of one table, widest last and, for one width, fewest packs first:
/// the order the planner breaks ties in. Walks the widths in doubling steps: every width is a
/// power of two ([`launchable`] checks it).
fn table_instances(table: OpTable) -> impl Iterator<Item = (u32, u32)> + Clone {
    (0..=MAX_BLOCK_THREADS.trailing_zeros()).flat_map(move |log2| {
        let width = 1 << log2;
        table
            .iter()
            .filter(move |(_, widths)| widths.contains(&width))
            .map(move |&(packs, _)| (width, packs))
    })
}

impl OpInstance {
    /// Threads of one row's group (or block).
    pub fn threads_per_row(&self) -> u32 {
        match self.shape {
            OpKernelShape::Rows { lanes } => lanes,
            OpKernelShape::Block { threads } => threads,
        }
    }

    /// Elements per access.
    pub fn pack(&self) -> u32 {
        self.layout.pack(self.input)
    }

    /// Packs (slots) one group or block holds.
    pub fn slots(&self) -> u32 {
        self.threads_per_row() * self.packs
    }

    /// Slots a row's share takes beside its body packs: a peeled row's head and tail in a
    /// group, which holds them in its body's slots. A block holds them in one more slot per
    /// thread, apart from the `packs` its body fills (`ops::slots::PeeledApart`).
    pub fn end_slots(&self) -> u32 {
        match self.shape {
            OpKernelShape::Rows { .. } => self.layout.end_slots(),
            OpKernelShape::Block { .. } => 0,
        }
    }

    /// Widest aligned row (or slice) one group or block holds.
    pub fn capacity(&self) -> u32 {
        self.slots() * self.pack()
    }

    /// The instances of one direction, input type and layout: its group and block tables'
    /// (width, packs) pairs. Each holds its row's ends: [`launchable`] checks the peeled groups'
    /// slots.
    pub fn instances(
        direction: Direction,
        input: DType,
        layout: PackLayout,
    ) -> impl Iterator<Item = OpInstance> + Clone {
        let (rows, blocks) = match (layout, direction) {
            (_, Direction::CrossEntropy) => (NO_GROUPS, OP_BLOCK_VECTOR),
            (PackLayout::Elements, _) => (OP_ROWS_SCALAR, OP_BLOCK_SCALAR),
            (PackLayout::Peeled, _) => (OP_ROWS_PEELED, OP_BLOCK_VECTOR),
            (_, Direction::MaskedForward) => (OP_ROWS_MASKED, OP_BLOCK_MASKED),
            _ => (OP_ROWS_VECTOR, OP_BLOCK_VECTOR),
        };
        let rows =
            table_instances(rows).map(|(lanes, packs)| (OpKernelShape::Rows { lanes }, packs));
        let blocks = table_instances(blocks)
            .map(|(threads, packs)| (OpKernelShape::Block { threads }, packs));
        rows.chain(blocks).map(move |(shape, packs)| OpInstance {
            direction,
            input,
            layout,
            shape,
            packs,
            kept: false,
        })
    }

    /// The kept twin of this instance ([`OpInstance::kept`]), where [`OP_BLOCK_KEPT`] lists
    /// one: a forward block of aligned or peeled packs.
    pub fn kept_twin(&self) -> Option<OpInstance> {
        let OpKernelShape::Block { threads } = self.shape else {
            return None;
        };
        let listed = OP_BLOCK_KEPT
            .iter()
            .any(|&(packs, widths)| packs == self.packs && widths.contains(&threads));
        let twinned = self.direction == Direction::Forward
            && self.layout != PackLayout::Elements
            && !self.kept
            && listed;
        twinned.then_some(OpInstance {
            kept: true,
            ..*self
        })
    }

    /// Every instance of one input type: each layout, the directions it serves, and their
    /// instances.
    pub fn all_for(input: DType) -> impl Iterator<Item = OpInstance> {
        [
            PackLayout::Elements,
            PackLayout::Aligned,
            PackLayout::Peeled,
        ]
        .into_iter()
        .flat_map(move |layout| {
            Direction::ALL
                .into_iter()
                .filter(move |&direction| layout.serves(direction))
                .flat_map(move |direction| Self::instances(direction, input, layout))
                .flat_map(|instance| core::iter::once(instance).chain(instance.kept_twin()))
        })
    }
}

impl core::fmt::Display for OpInstance {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let peeled = match (self.layout == PackLayout::Peeled, self.kept) {
            (false, false) => "",
            (true, false) => "peeled",
            (false, true) => "kept",
            (true, true) => "peeledkept",
        };
        let (direction, input, pack) = (self.direction.tag(), self.input.name(), self.pack());
        match self.shape {
            OpKernelShape::Rows { lanes } => write_entry_name!(
                f,
                op_rows(direction)(input)(pack)(peeled)(lanes)(self.packs)
            ),
            OpKernelShape::Block { .. } => {
                write_entry_name!(f, op_block(direction)(input)(pack)(peeled)(self.packs))
            }
        }
    }
}
