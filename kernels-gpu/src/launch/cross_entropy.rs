//! The cross-entropy kernels' launch definitions: the one parameter struct the host fills
//! and the device reads, its modes, and the state a vocabulary shard publishes.

use super::ops::{DType, RowState};
use super::write_entry_name;

/// Threads per block of the cross-entropy row kernels (a block per row, or per slice of one).
pub const CROSS_ENTROPY_THREADS: u32 = 512;

/// What a cross-entropy launch does.
pub mod cross_entropy_mode {
    /// The whole row is here: loss, log-sum-exp and (with a gradient buffer) the gradient.
    pub const FULL: u32 = 0;
    /// A shard of the vocabulary: write its [`super::CrossEntropyState`] per row, nothing else.
    pub const STATES: u32 = 1;
    /// A shard whose states (`slots` runs, every shard's) are merged first: loss,
    /// log-sum-exp and the shard's gradient, as if the whole row were here.
    pub const FROM_STATES: u32 = 2;
}

/// What one vocabulary shard knows of a row: the softmax statistics of its (softcapped)
/// logits, the target's logit where the target falls in the shard (0 elsewhere), and the
/// weighted sum of its logits that label smoothing needs (`Σ w[c]·z[c]`, 0 without label
/// smoothing). Shards merge as the softmax states do on `row`, and by plain sums of the
/// other two.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CrossEntropyState {
    pub row: RowState,
    pub target_logit: f32,
    pub smoothing: f32,
}

// SAFETY: four floats, no pointers: any bit pattern is valid on either side.
#[cfg(feature = "host")]
unsafe impl cust_core::DeviceCopy for CrossEntropyState {}

/// Everything a cross-entropy kernel reads, one struct shared by the host and the device.
///
/// # Safety (the contract of every cross-entropy entry)
/// - `logits` holds `rows` rows of `cols` elements of the module's type, row `r` at element
///   `r · logits_stride`; where `aligned`, every row (of the gradient too) starts on a
///   16-byte boundary.
/// - `targets` holds `rows` integers of `target_bytes` (4 or 8) bytes each.
/// - `weight`, when not 0, holds one f32 per class of the whole vocabulary (`vocab`).
/// - `totals`, when not 0, holds two f32: the mean's divisor and `Σ weight` (written by the
///   prologue launch before this one reads them).
/// - `gradient`, when not 0, holds `rows` rows of `cols` elements of `gradient_dtype` at
///   `gradient_stride`; it is exactly `logits` (in place) or disjoint from every input.
/// - `losses` and `lse`, when not 0, hold one f32 per row; `upstream`, when not 0, one f32
///   (`upstream_per_row` 0) or one per row.
/// - `states` (modes `STATES` and `FROM_STATES`) holds `slots · rows` [`CrossEntropyState`]s,
///   run `s` for shard `s` (`STATES` writes one run: `slots` is 1).
/// - The row kernel's launch (`cross_entropy_<type>`) is `rows · slices` blocks of
///   [`CROSS_ENTROPY_THREADS`] threads, in clusters
///   of `slices` blocks where `slices` is more than 1 (at most
///   [`MAX_CLUSTER_BLOCKS`](super::MAX_CLUSTER_BLOCKS), only where `aligned`, never in the
///   sm_80 build), with `(REDUCTION_SCRATCH_FLOATS + CLUSTER_STATS_FLOATS) · 4` bytes of
///   dynamic shared memory, plus, when `cached` is 1, what a slice keeps: `⌈packs / slices⌉ ·
///   PACK + cols − packs · PACK` elements of the module's type, where `PACK` is 16 bytes of
///   them and `packs` is `cols / PACK` where `aligned`, else 0.
/// - `aligned` is 0 where [`CrossEntropyParams::elementwise_math`].
/// - The block entries (`op_block_xent_*`) and the row-slices entries
///   (`cross_entropy_slices_*`) have their own launch contracts (`ops::cross_entropy_block`,
///   `ops::cross_entropy_slices`), for calls that [`CrossEntropyParams::takes_block_entries`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CrossEntropyParams {
    pub logits: u64,
    pub logits_stride: u64,
    pub targets: u64,
    pub ignore_index: i64,
    pub weight: u64,
    pub totals: u64,
    pub gradient: u64,
    pub gradient_stride: u64,
    pub losses: u64,
    pub lse: u64,
    pub upstream: u64,
    pub states: u64,
    /// The reduced loss (one f32), written by the epilogue launch.
    pub reduced: u64,
    /// Two floats per block and two words per row, zeroed once: the statistics a cooperative
    /// launch of the block entries (`op_block_xent_*`) exchanges through global memory; for
    /// the row-slices entries also a flag per block, after a header (the row-slices contract,
    /// `cross_entropy_slices_*`).
    pub partials: u64,
    pub barriers: u64,
    /// How long a block of the row-slices entries (`cross_entropy_slices_*`) waits for its
    /// row's other blocks before it leaves its slice to the row's last block.
    pub patience_ns: u64,
    /// The global column of this shard's first column (0 unsharded).
    pub column_offset: u64,
    /// Columns of the whole vocabulary (`cols` unsharded).
    pub vocab: u64,
    pub rows: u32,
    pub cols: u32,
    pub target_bytes: u32,
    pub has_ignore_index: u32,
    pub label_smoothing: f32,
    pub z_loss: f32,
    /// 0: no softcap; else `z = softcap · tanh(x / softcap)`.
    pub softcap: f32,
    /// The upstream gradient when `upstream` is 0.
    pub upstream_value: f32,
    pub upstream_per_row: u32,
    /// Divide the gradient by the mean's divisor (`totals[0]`).
    pub mean: u32,
    pub gradient_dtype: u32,
    pub mode: u32,
    pub slots: u32,
    /// Whether each block keeps its packs in shared memory between the two passes.
    pub cached: u32,
    /// Blocks per row (above 1: for the row kernel a thread-block cluster; for the block
    /// entries a cluster or the slices of one cooperative launch; for the row-slices entries
    /// the slices of an ordinary launch).
    pub slices: u32,
    /// Packs of a row each slice holds (the block entries, `op_block_xent_*`; the others
    /// share a row's packs evenly among its slices).
    pub slice_packs: u32,
    /// Whether every row of the logits and the gradient starts on a 16-byte boundary (read
    /// in 16-byte packs; else one element at a time).
    pub aligned: u32,
    /// Rows of the first wave the row-slices entries (`cross_entropy_slices_*`) hold back in
    /// turn, and for how long each (`primitives::row_exchange::stagger_first_wave`); 0:
    /// none. The other entries do not read them.
    pub stagger_rows: u32,
    /// Nanoseconds each of those rows waits beyond the row before it.
    pub stagger_ns: u32,
}

impl CrossEntropyParams {
    /// Whether every element's math takes a branch, a call or a load of its own (a softcap,
    /// or class weights with label smoothing): such calls are read one element at a time,
    /// never `aligned` (the packed passes leave those out).
    #[inline(always)]
    pub fn elementwise_math(&self) -> bool {
        self.softcap > 0.0 || (self.weight != 0 && self.label_smoothing != 0.0)
    }

    /// Whether the block entries (`op_block_xent_*`) compute this call: the whole vocabulary
    /// in mode `FULL`, no label smoothing, no softcap (the layout's alignment aside).
    #[inline(always)]
    pub fn takes_block_entries(&self) -> bool {
        self.mode == cross_entropy_mode::FULL
            && self.column_offset == 0
            && self.vocab == u64::from(self.cols)
            && self.label_smoothing == 0.0
            && self.softcap == 0.0
    }
}

/// What a cross-entropy entry does: the rows, a block or a cluster each (`Rows`), the rows
/// cut into slices kept in shared memory whose blocks exchange through global memory
/// (`Slices`), the one-block prologue (`Totals`), the one-block epilogue (`Reduce`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrossEntropyKind {
    Rows,
    Slices,
    Totals,
    Reduce,
}

/// A cross-entropy entry of the operation module of `dtype`. Its `Display` is the PTX entry
/// name: `cross_entropy_bf16`, `cross_entropy_slices_bf16`, `cross_entropy_totals_bf16`,
/// `cross_entropy_reduce_bf16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropyEntry {
    pub dtype: DType,
    pub kind: CrossEntropyKind,
}

impl CrossEntropyEntry {
    /// Every cross-entropy entry of `dtype`'s module.
    pub fn all(dtype: DType) -> [Self; 4] {
        [
            CrossEntropyKind::Rows,
            CrossEntropyKind::Slices,
            CrossEntropyKind::Totals,
            CrossEntropyKind::Reduce,
        ]
        .map(|kind| CrossEntropyEntry { dtype, kind })
    }
}

impl core::fmt::Display for CrossEntropyEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let input = self.dtype.name();
        match self.kind {
            CrossEntropyKind::Rows => write_entry_name!(f, cross_entropy(input)),
            CrossEntropyKind::Slices => write_entry_name!(f, cross_entropy_slices(input)),
            CrossEntropyKind::Totals => write_entry_name!(f, cross_entropy_totals(input)),
            CrossEntropyKind::Reduce => write_entry_name!(f, cross_entropy_reduce(input)),
        }
    }
}
