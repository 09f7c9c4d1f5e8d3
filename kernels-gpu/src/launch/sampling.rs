//! The sampling kernels' launch definitions: the parameter struct the host fills and the
//! device reads, what a vocabulary shard publishes, the shared-memory layout, and the entries.

use super::ops::{DType, RowState};
use super::{REDUCTION_SCRATCH_FLOATS, write_entry_name};

/// Threads per block of the sampling row kernel (a block per row).
pub const SAMPLING_THREADS: u32 = 512;

/// Bins of the histogram over `max − z` that places a row's top-k and top-p cuts: one per
/// thread of the block.
pub const SAMPLING_BINS: u32 = SAMPLING_THREADS;

/// Most columns the histogram's cut bins may hold for the exact cut to be found by sorting
/// them in shared memory (more take the bisection over the whole row).
pub const SAMPLING_CANDIDATES: u32 = 4096;

/// Words of the block's control area in shared memory (the cuts and counters it shares).
pub const SAMPLING_CONTROL_WORDS: u32 = 64;

/// The largest top-k the candidate path serves: each slice of a row keeps its best `k`
/// columns, and the row's cut is placed among those (top-p after top-k, and min-p, keep a
/// prefix of the top-k).
pub const TOP_K_CANDIDATES: u32 = 128;

/// Columns per slice of the candidate path, each held in shared memory as 32-bit keys (in the
/// space of the row kernel's candidates).
pub const TOP_K_SLICE_COLS: u32 = 2 * SAMPLING_CANDIDATES;

/// Words the candidate path's slices gather into, in shared memory after the candidates (a
/// quarter of a slice): the ranks of the keys at least the slice's bound (two words each), or
/// where those are more, the first radix digit's chosen bin for the later digits (a slice whose
/// bin holds more reads all its keys in every pass).
pub const TOP_K_GATHERED_KEYS: u32 = TOP_K_SLICE_COLS / 4;

/// Bytes of dynamic shared memory each block of the candidate path gets: the sampling
/// blocks', then the gathered keys.
pub const TOP_K_SHARED_BYTES: u32 = sampling_shared_bytes(4 * TOP_K_GATHERED_KEYS);

/// Bytes of dynamic shared memory each block of the candidate path's merge gets: the sampling
/// blocks', then half as many ranks again as the candidates, which the merge of the slices'
/// lists alternates with.
pub const TOP_K_MERGE_SHARED_BYTES: u32 = sampling_shared_bytes(4 * SAMPLING_CANDIDATES);

/// Slices a row of the candidate path may have: their candidates, `k` each, are merged
/// together in shared memory ([`SAMPLING_CANDIDATES`] at most).
pub const TOP_K_MAX_SLICES: u32 = SAMPLING_CANDIDATES / TOP_K_CANDIDATES;

/// What one slice of the candidate path leaves for the row's merge: its row state (after the
/// temperature), its count of NaN and `+inf` values, and how many candidates it kept.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SliceTop {
    pub row: RowState,
    pub bad: f32,
    pub kept: u32,
}

/// Words of workspace before a slice's ranks: its [`SliceTop`] (8-byte aligned).
pub const SLICE_TOP_HEADER_WORDS: u32 = 4;

/// Words of workspace one slice of the candidate path uses: its [`SliceTop`], then
/// [`TOP_K_CANDIDATES`] ranks of two words.
pub const SLICE_TOP_WORDS: u32 = SLICE_TOP_HEADER_WORDS + 2 * TOP_K_CANDIDATES;

/// The token written for a row that has no token: a NaN or `+inf` value of the logit plus bias
/// over the temperature, no finite one, or a per-row parameter out of range (its
/// log-probabilities are NaN).
pub const NO_TOKEN: u32 = u32::MAX;

/// Bytes of dynamic shared memory a sampling launch gives each block: the reduction scratch,
/// the control words, the histogram (a count and a mass per bin), the candidates (8 bytes
/// each), then, when `cached_bytes` is not 0, the row itself.
pub const fn sampling_shared_bytes(cached_bytes: u32) -> u32 {
    (REDUCTION_SCRATCH_FLOATS + SAMPLING_CONTROL_WORDS + 2 * SAMPLING_BINS) * 4
        + SAMPLING_CANDIDATES * 8
        + cached_bytes
}

/// What a sampling launch does.
pub mod sampling_mode {
    /// The whole row is here: filters, draw, token and log-probabilities.
    pub const FULL: u32 = 0;
    /// A shard of the vocabulary, temperature only: its best score and its row statistics
    /// into a [`super::ShardDraw`] per row.
    pub const SHARD: u32 = 1;
}

/// What one vocabulary shard knows of a row's draw: the best score among its chunks of four
/// columns (`score`: the chunk's largest logit after temperature, plus the log of its
/// weights' sum, plus its Gumbel noise; greedy shards, the largest logit), the global index of
/// the column picked in that chunk (`token`) and its logit after temperature (`logit`), and
/// the softmax statistics of its logits after temperature (`row`). The
/// shards' draws merge by the largest score (the lower token among equals), and by the row
/// states' merge.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShardDraw {
    pub score: f32,
    pub token: u32,
    pub logit: f32,
    pub row: RowState,
}

// SAFETY: plain numbers, no pointers: any bit pattern is valid on either side.
#[cfg(feature = "host")]
unsafe impl cust_core::DeviceCopy for ShardDraw {}

/// Everything a sampling kernel reads, one struct shared by the host and the device.
///
/// # Safety (the contract of every sampling entry)
/// - `logits` holds `rows` rows of `cols` elements of the module's type, row `r` at element
///   `r · logits_stride`; where `aligned`, every row starts on a 16-byte boundary.
/// - `bias`, when not 0, holds `cols` f32 per row at `bias_stride` floats (0: one row that
///   every row adds).
/// - `temperatures`, `top_ps`, `min_ps` (f32) and `top_ks` (u32), when not 0, hold one value
///   per row.
/// - `random` holds two u64: the seed, then the offset; the advance entry, and the merge entry
///   where `advance` is 1, add 1 to the offset (their only write to it; the merge's slices
///   have finished, and it reads nothing of the state), every other entry only reads them.
/// - `tokens` (u32), `logprobs` and `raw_logprobs` (f32), when not 0, hold one value per row;
///   `probabilities`, when not 0, `rows` rows of `cols` f32 at `probabilities_stride`.
/// - `draws` (mode `SHARD`, and the merge entry) holds `slices` [`ShardDraw`]s per row.
/// - `column_offset` and, with `slices` above 1, `slice_cols` are multiples of 4: a
///   temperature-only draw's chunks of four global columns are never split between shards or
///   slices (split, two parts would share a chunk's noise and the draw would not be exact).
/// - Every output (and `slice_tops`) is disjoint from every input and from the other outputs.
/// - The launch is `rows` blocks of [`SAMPLING_THREADS`] threads with
///   [`sampling_shared_bytes`]`(c)` bytes of dynamic shared memory, where `c` is `cols ·`
///   the element's bytes when `cached` is 1, else 0, in `slices` blocks per row, each slice a
///   temperature-only draw (mode `SHARD`). The merge entry is any grid of blocks of whole
///   warps (a warp per row); the advance entry one thread.
/// - The draw entries ([`SamplingKind::Draws`]) serve only greedy and temperature-only calls:
///   `top_ks`, `top_ps`, `min_ps` and `probabilities` are 0, `top_k` 0, `top_p` 1, `min_p` 0
///   and `cached` 0.
/// - The candidate path ([`SamplingKind::TopSlices`], then [`SamplingKind::TopMerge`]) serves
///   calls with one top-k for every row, `1 ≤ top_k ≤` [`TOP_K_CANDIDATES`], in mode `FULL`
///   with `top_ks`, `probabilities` and `column_offset` 0; `slices = ⌈cols /` [`TOP_K_SLICE_COLS`]`⌉ ≤`
///   [`TOP_K_MAX_SLICES`] and `slice_cols =` [`TOP_K_SLICE_COLS`]; `slice_tops` holds
///   [`SLICE_TOP_WORDS`] words per slice of every row, 8-byte aligned. The slices' launch is
///   `rows · slices` blocks of [`SAMPLING_THREADS`] threads with [`TOP_K_SHARED_BYTES`]
///   bytes, the merge's `rows` blocks of [`SAMPLING_THREADS`] threads with
///   [`TOP_K_MERGE_SHARED_BYTES`] bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingParams {
    pub logits: u64,
    pub logits_stride: u64,
    pub bias: u64,
    pub bias_stride: u64,
    pub temperatures: u64,
    pub top_ks: u64,
    pub top_ps: u64,
    pub min_ps: u64,
    pub random: u64,
    pub tokens: u64,
    pub logprobs: u64,
    pub raw_logprobs: u64,
    pub probabilities: u64,
    pub probabilities_stride: u64,
    pub draws: u64,
    /// The global column of this shard's first column (0 unsharded, a multiple of 4): the
    /// noise is keyed by global indices (chunks of four columns for a temperature alone).
    pub column_offset: u64,
    pub rows: u32,
    pub cols: u32,
    /// The temperature of every row where `temperatures` is 0 (0: greedy).
    pub temperature: f32,
    /// The top-k of every row where `top_ks` is 0 (0: none).
    pub top_k: u32,
    /// The top-p of every row where `top_ps` is 0 (1: none).
    pub top_p: f32,
    /// The min-p of every row where `min_ps` is 0 (0: none).
    pub min_p: f32,
    /// Whether `probabilities` receives log-probabilities (`-inf` where dropped).
    pub probabilities_log: u32,
    pub mode: u32,
    /// Whether each block keeps its row in shared memory between its passes.
    pub cached: u32,
    /// Whether every row starts on a 16-byte boundary (read in 16-byte packs; else one
    /// element at a time).
    pub aligned: u32,
    /// Blocks per row: in mode `SHARD`, block `b` draws over columns `s·slice_cols..` of row
    /// `b / slices`, `s = b % slices`, into draw `b`, and the merge entry then writes the
    /// rows' outputs from the `slices` draws of each; in the candidate path's first launch
    /// (mode `FULL`, one slice or more), block `b` selects slice `s`'s candidates.
    pub slices: u32,
    /// Columns per slice where `slices` is above 1, and in the candidate path (a multiple
    /// of 8).
    pub slice_cols: u32,
    /// The candidate path's workspace: [`SLICE_TOP_WORDS`] words per slice of each row.
    pub slice_tops: u64,
    /// Whether the merge entry also adds 1 to the random offset (it is the call's last launch,
    /// and no block of it reads the random state).
    pub advance: u32,
}

/// What a sampling entry does: the rows with every filter, a block each (`Rows`); greedy
/// and temperature-only rows, a block each or a block per slice (`Draws`); the merge of each
/// row's slices into its outputs (`Merge`); a small top-k's candidates, a block per slice of a
/// row (`TopSlices`), and the row's cut and draw among them (`TopMerge`); or the one-thread
/// epilogue that advances the random offset (`Advance`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SamplingKind {
    Rows,
    Draws,
    Merge,
    TopSlices,
    TopMerge,
    Advance,
}

/// A sampling entry of the operation module of `dtype`. Its `Display` is the PTX entry
/// name: `sample_bf16`, `sample_draw_bf16`, `sample_merge_bf16`, `sample_top_bf16`,
/// `sample_top_merge_bf16`, `sample_advance_bf16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SamplingEntry {
    pub dtype: DType,
    pub kind: SamplingKind,
}

impl SamplingEntry {
    /// Every sampling entry of `dtype`'s module.
    pub fn all(dtype: DType) -> [Self; 6] {
        [
            SamplingKind::Rows,
            SamplingKind::Draws,
            SamplingKind::Merge,
            SamplingKind::TopSlices,
            SamplingKind::TopMerge,
            SamplingKind::Advance,
        ]
        .map(|kind| SamplingEntry { dtype, kind })
    }
}

impl core::fmt::Display for SamplingEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let input = self.dtype.name();
        match self.kind {
            SamplingKind::Rows => write_entry_name!(f, sample(input)),
            SamplingKind::Draws => write_entry_name!(f, sample_draw(input)),
            SamplingKind::Merge => write_entry_name!(f, sample_merge(input)),
            SamplingKind::TopSlices => write_entry_name!(f, sample_top(input)),
            SamplingKind::TopMerge => write_entry_name!(f, sample_top_merge(input)),
            SamplingKind::Advance => write_entry_name!(f, sample_advance(input)),
        }
    }
}
