//! Sampling with one small top-k for every row (at most [`TOP_K_CANDIDATES`]), in two
//! launches that read the row once:
//! 1. a block per slice of [`TOP_K_SLICE_COLS`] columns keeps its slice's keys (the order
//!    keys of the logits, [`order_key`]) in shared memory, selects its best `k` columns by a
//!    radix select over those keys (the sampler's order: larger logits first, the lower column
//!    among equals), and leaves their ranks and its row state in the workspace;
//! 2. a block per row sorts its slices' candidates, which hold the row's top-k, and places
//!    top-p (over the top-k's mass) and min-p among them, draws with the Gumbel noise of the
//!    row kernel (keyed by the column), and writes the token and its log-probabilities.
//!
//! Both filters keep a prefix of the top-k in the sampler's order, so the kept columns, their
//! noise and the token are the row kernel's; only the order of the sums that place the top-p
//! cut differs (docs/numerics.md).

use super::sampling::{
    Best, Extremes, Filters, RowSource, Shared, Weights, bitonic_sort_descending,
    block_exclusive_scan, control, gumbel_of, ln, random_state, word_of_column, write_outputs,
};
use crate::launch::WARP_SIZE;
use crate::launch::ops::RowState;
use crate::launch::sampling::{
    NO_TOKEN, SLICE_TOP_HEADER_WORDS, SLICE_TOP_WORDS, SamplingParams, SliceTop,
    TOP_K_GATHERED_KEYS,
};
use crate::primitives::device::{
    DeviceExp2, block_dim, block_idx, shared_fetch_add_u32, shared_min_u32, sync_threads,
    thread_idx,
};
use crate::primitives::draw::{order_key, value_of_rank};
use crate::primitives::element::Element;
use crate::primitives::online::OnlineStats;
use crate::primitives::philox::draw_words;
use crate::primitives::reduce::{Partial, Sum, block_reduce};

/// Bins of one digit of the radix select (eight bits of a key).
const DIGIT_BINS: usize = 256;

/// The slice `(row, first column)` of block `block_idx`, and its columns.
#[inline(always)]
fn slice_of(p: &SamplingParams) -> (usize, usize, usize) {
    let slices = p.slices.max(1) as usize;
    let (row, slice) = (block_idx() as usize / slices, block_idx() as usize % slices);
    let start = slice * p.slice_cols as usize;
    let cols = (p.cols as usize)
        .saturating_sub(start)
        .min(p.slice_cols as usize);
    (row, start, cols)
}

/// Launch 1: the best `top_k` columns of this block's slice, and its row state.
///
/// # Safety
/// The contract of [`SamplingParams`] for the candidate path.
#[inline(always)]
pub(crate) unsafe fn sample_top_slice<E: Element, const PACK: usize>(p: &SamplingParams) {
    let (row, start, cols) = slice_of(p);
    let (shared, after) = Shared::new();
    // The slice's keys, in the row kernel's candidate space (`TOP_K_SLICE_COLS` words), and
    // the radix select's gathered keys after them (`TOP_K_GATHERED_KEYS` words).
    let keys = shared.candidates.cast::<u32>();
    let gathered = after.cast::<u32>();
    // SAFETY: `row < rows`; the slice's columns (contract).
    let src = unsafe { RowSource::<E>::of::<PACK>(p, row, start, cols, core::ptr::null_mut()) };
    // SAFETY: `row < rows`.
    let inv_t = unsafe { Filters::inv_temperature_of(p, row) };
    let mut stats = OnlineStats::EMPTY;
    let mut extremes = Extremes::EMPTY;
    // SAFETY: the row (contract); each key slot written by the thread of its column.
    unsafe {
        src.visit::<PACK, 1>(false, |first, values, count| {
            let mut zs = [f32::NEG_INFINITY; PACK];
            let mut pack_max = f32::NEG_INFINITY;
            for i in 0..PACK {
                if i >= count {
                    continue;
                }
                let value = values[i];
                let z = value * inv_t;
                zs[i] = z;
                pack_max = pack_max.max(z);
                if z.is_nan() || z == f32::INFINITY {
                    extremes.bad += 1.0;
                }
                // 0 is below every logit's key: a `-inf` logit is never a candidate.
                let key = if value > f32::NEG_INFINITY {
                    order_key(value + 0.0)
                } else {
                    0
                };
                keys.add(first + i).write(key);
            }
            stats.push_batch::<DeviceExp2>(pack_max, PACK, |i| zs[i]);
        })
    };
    // SAFETY: every thread, uniform control flow (the reductions' barriers also order the
    // keys' writes before their reads).
    let (stats, extremes) = unsafe {
        (
            block_reduce(stats, shared.scratch),
            block_reduce(extremes, shared.scratch),
        )
    };
    // SAFETY: every thread, uniform control flow; the keys written.
    let (threshold, ties_wanted, all) = unsafe { select(&shared, keys, gathered, cols, p.top_k) };
    // Emit: every key above the threshold, and the first `ties_wanted` keys equal to it in
    // column order (a thread's columns are a run, the runs in thread order).
    let t = thread_idx() as usize;
    let per = cols.div_ceil(block_dim() as usize);
    let (low, high) = ((t * per).min(cols), ((t + 1) * per).min(cols));
    let mut ties = 0;
    if !all {
        for c in low..high {
            // SAFETY: a key of the slice.
            ties += u32::from(unsafe { keys.add(c).read() } == threshold);
        }
    }
    // SAFETY: every thread, uniform control flow.
    let (mut tie, _, _, _) = unsafe { block_exclusive_scan(ties, 0.0, shared.scratch) };
    if t == 0 {
        // SAFETY: a control word, read (atomically) after the barrier.
        unsafe { shared.set(control::GATHERED, 0) };
    }
    sync_threads();
    let slice_top =
        (p.slice_tops as *mut u32).wrapping_add(block_idx() as usize * SLICE_TOP_WORDS as usize);
    let ranks = slice_top
        .wrapping_add(SLICE_TOP_HEADER_WORDS as usize)
        .cast::<u64>();
    for c in low..high {
        // SAFETY: a key of the slice.
        let key = unsafe { keys.add(c).read() };
        let take = if all {
            key != 0
        } else if key == threshold {
            tie += 1;
            tie <= ties_wanted
        } else {
            key > threshold
        };
        if take {
            // SAFETY: the slot counter; at most `top_k` columns are taken, and the slice's
            // candidates hold `TOP_K_CANDIDATES ≥ top_k` ranks (contract).
            unsafe {
                let slot = shared_fetch_add_u32(shared.at(control::GATHERED), 1);
                let col = src.first_column as u32 + c as u32;
                ranks
                    .add(slot as usize)
                    .write((u64::from(key) << 32) | u64::from(!col));
            }
        }
    }
    sync_threads();
    if t == 0 {
        let top = SliceTop {
            row: RowState {
                max: stats.max,
                sum: stats.sum(),
            },
            bad: extremes.bad,
            // SAFETY: written before the barrier.
            kept: unsafe { shared.word(control::GATHERED) },
        };
        // SAFETY: this slice's state (contract).
        unsafe { slice_top.cast::<SliceTop>().write(top) };
    }
}

/// The `k`-th largest of the first `n` keys at `keys` (0 keys excluded), by a radix select
/// over their four bytes, highest first: `(threshold, ties wanted, all)`, where the best `k`
/// are the keys above `threshold` and the first `ties wanted` equal to it; `all` where at
/// most `k` keys are not 0 (then every one of them). After the first byte, the keys of its
/// chosen bin are gathered at `gathered` where they fit ([`TOP_K_GATHERED_KEYS`]), and the
/// later passes read only them.
///
/// # Safety
/// Every thread of the block, uniform control flow; the keys written before a barrier; the
/// shared histogram, the control words and `gathered` free.
#[inline(always)]
unsafe fn select(
    shared: &Shared,
    keys: *const u32,
    gathered: *mut u32,
    n: usize,
    k: u32,
) -> (u32, u32, bool) {
    let t = thread_idx() as usize;
    let threads = block_dim() as usize;
    let (mut prefix, mut mask, mut want) = (0u32, 0u32, k);
    // The keys a pass reads: the slice's, then the first byte's bin where it fits.
    let (mut source, mut len) = (keys, n);
    if t == 0 {
        // SAFETY: a control word, added to atomically after the barriers below.
        unsafe { shared.set(control::GATHERED, 0) };
    }
    // The digits from the highest (a loop over a counter: an array of them would be kept in
    // local memory).
    let mut digit = 32u32;
    while digit > 0 {
        digit -= 8;
        if t < DIGIT_BINS {
            // SAFETY: bin `t` of the histogram.
            unsafe { shared.counts.add(t).write(0) };
        }
        sync_threads();
        let mut c = t;
        while c < len {
            // SAFETY: a key; a bin, added to atomically.
            unsafe {
                let key = source.add(c).read();
                if in_prefix(key, mask, prefix) {
                    let bin = ((key >> digit) as usize) & (DIGIT_BINS - 1);
                    shared_fetch_add_u32(shared.counts.add(bin), 1);
                }
            }
            c += threads;
        }
        sync_threads();
        // Thread `t` holds bin `255 − t`: the scan counts the keys in the bins above.
        let count = if t < DIGIT_BINS {
            // SAFETY: a bin, written before the barrier.
            unsafe { shared.counts.add(DIGIT_BINS - 1 - t).read() }
        } else {
            0
        };
        // SAFETY: every thread, uniform control flow.
        let (above, _, total, _) = unsafe { block_exclusive_scan(count, 0.0, shared.scratch) };
        if digit == 24 && total <= want {
            return (0, 0, true);
        }
        if t < DIGIT_BINS && above < want && want <= above + count {
            // SAFETY: control words, written by the one thread whose bin holds the k-th key.
            unsafe {
                shared.set(control::TOP_K_BIN, (DIGIT_BINS - 1 - t) as u32);
                shared.set(control::TOP_K_BEFORE, above);
                shared.set(control::TOP_K_IN, count);
            }
        }
        sync_threads();
        // SAFETY: written before the barrier; rewritten only after two more.
        let (bin, above, in_bin) = unsafe {
            (
                shared.word(control::TOP_K_BIN),
                shared.word(control::TOP_K_BEFORE),
                shared.word(control::TOP_K_IN) as usize,
            )
        };
        prefix |= bin << digit;
        mask |= 0xFF << digit;
        want -= above;
        if digit == 24 && in_bin <= TOP_K_GATHERED_KEYS as usize {
            // Gather the chosen bin's keys (the next pass's barrier orders them before it).
            let mut c = t;
            while c < n {
                // SAFETY: a key; a gathered slot: `in_bin` keys match, at most
                // `TOP_K_GATHERED_KEYS`, and the counter counts them from 0.
                unsafe {
                    let key = keys.add(c).read();
                    if in_prefix(key, mask, prefix) {
                        let slot = shared_fetch_add_u32(shared.at(control::GATHERED), 1);
                        gathered.add(slot as usize).write(key);
                    }
                }
                c += threads;
            }
            (source, len) = (gathered.cast_const(), in_bin);
        }
    }
    (prefix, want, false)
}

/// Whether `key` counts in a pass of [`select`] whose chosen bins so far are `prefix` under
/// `mask`: a key not 0 (no `-inf` logit) that begins with them.
#[inline(always)]
fn in_prefix(key: u32, mask: u32, prefix: u32) -> bool {
    key != 0 && key & mask == prefix
}

/// Launch 2: row `block_idx`'s cut, draw and outputs from its slices' candidates.
///
/// # Safety
/// The contract of [`SamplingParams`] for the candidate path, after launch 1.
#[inline(always)]
pub(crate) unsafe fn sample_top_merge(p: &SamplingParams) {
    let row = block_idx() as usize;
    let slices = p.slices.max(1) as usize;
    let t = thread_idx() as usize;
    let (shared, _) = Shared::new();
    let words = SLICE_TOP_WORDS as usize;
    let tops = (p.slice_tops as *const u32).wrapping_add(row * slices * words);
    // Each slice's state, read at once (a thread a slice).
    let (mut stats, mut kept, mut bad) = (OnlineStats::EMPTY, 0, 0.0);
    if t < slices {
        // SAFETY: slice `t`'s state (contract).
        let top = unsafe { tops.add(t * words).cast::<SliceTop>().read() };
        stats = OnlineStats::new(top.row.max, top.row.sum);
        (kept, bad) = (top.kept, top.bad);
    }
    // Where each slice's candidates go among the row's (every slice's after the one before).
    // SAFETY: every thread, uniform control flow.
    let (first, _, n, bad) = unsafe { block_exclusive_scan(kept, bad, shared.scratch) };
    // SAFETY: every thread, uniform control flow.
    let stats = unsafe { block_reduce(stats, shared.scratch) };
    if t < slices {
        // SAFETY: the histogram's words, free here; read after the barrier.
        unsafe {
            shared.counts.add(2 * t).write(first);
            shared.counts.add(2 * t + 1).write(kept);
        }
    }
    sync_threads();
    // A warp a slice copies its candidates, padded to a power of two.
    let candidates = shared.candidates;
    let (lane, warp) = (t % WARP_SIZE as usize, t / WARP_SIZE as usize);
    let warps = block_dim() as usize / WARP_SIZE as usize;
    let mut s = warp;
    while s < slices {
        // SAFETY: written before the barrier.
        let (first, kept) = unsafe {
            (
                shared.counts.add(2 * s).read() as usize,
                shared.counts.add(2 * s + 1).read() as usize,
            )
        };
        let ranks = tops
            .wrapping_add(s * words + SLICE_TOP_HEADER_WORDS as usize)
            .cast::<u64>();
        let mut j = lane;
        while j < kept {
            // SAFETY: slice `s`'s ranks (contract); the row's candidates, at most
            // `TOP_K_MAX_SLICES · top_k ≤ SAMPLING_CANDIDATES`.
            unsafe { candidates.add(first + j).write(ranks.add(j).read()) };
            j += WARP_SIZE as usize;
        }
        s += warps;
    }
    let n = n as usize;
    let sorted = n.next_power_of_two().max(1);
    let mut j = n + t;
    while j < sorted {
        // SAFETY: a candidate slot; padding ranks below every column's.
        unsafe { candidates.add(j).write(0) };
        j += block_dim() as usize;
    }
    sync_threads();
    // SAFETY: the candidates, `sorted` of them, every thread of the block (`SAMPLING_THREADS`,
    // a multiple of `WARP_SIZE`).
    unsafe { bitonic_sort_descending(candidates, sorted) };
    // SAFETY: `row < rows`.
    let filters = unsafe { Filters::of(p, row) };
    let weights = Weights {
        inv_temperature: filters.inv_temperature,
        max: stats.max,
    };
    let sum = stats.sum();
    if !filters.valid || bad > 0.0 || stats.max == f32::NEG_INFINITY {
        if t == 0 {
            // SAFETY: the outputs of row `row`.
            unsafe { write_outputs(p, row, NO_TOKEN, f32::NAN, f32::NAN) };
        }
        return;
    }
    if filters.greedy {
        if t == 0 {
            // SAFETY: the first candidate is the row's largest logit, lowest column first.
            let token = !(unsafe { candidates.read() } as u32);
            // SAFETY: the outputs of row `row`.
            unsafe { write_outputs(p, row, token, 0.0, -ln(sum)) };
        }
        return;
    }
    // The top-k: the first `m` candidates, a thread each (`top_k ≤ TOP_K_CANDIDATES ≤`
    // the block's threads).
    let m = n.min(p.top_k as usize);
    let (value, col) = if t < m {
        // SAFETY: a sorted candidate.
        let rank = unsafe { candidates.add(t).read() };
        (value_of_rank(rank), !(rank as u32))
    } else {
        (f32::NEG_INFINITY, u32::MAX)
    };
    let w = if t < m { weights.of(value) } else { 0.0 };
    // SAFETY: every thread, uniform control flow.
    let (_, before, _, top_k_mass) = unsafe { block_exclusive_scan(0, w, shared.scratch) };
    if t == 0 {
        // SAFETY: a control word, lowered atomically after the barrier.
        unsafe { shared.set(control::TOP_P_PLACE, m as u32) };
    }
    sync_threads();
    if filters.top_p < 1.0 && t < m && before + w >= filters.top_p * top_k_mass {
        // SAFETY: a control word, lowered atomically.
        unsafe { shared_min_u32(shared.at(control::TOP_P_PLACE), t as u32 + 1) };
    }
    sync_threads();
    // SAFETY: written before the barrier.
    let place = unsafe { shared.word(control::TOP_P_PLACE) } as usize;
    let kept = t < place && w >= filters.min_p;
    let mut best = Best::EMPTY;
    if kept {
        // SAFETY: the random state (contract).
        let (seed, offset) = unsafe { random_state(p) };
        let words = draw_words(seed, offset, row as u32, col / 4);
        let bits = word_of_column(&words, u64::from(col));
        best.offer(weights.z(value) + gumbel_of(bits), col);
    }
    // SAFETY: every thread, uniform control flow.
    let (kept_mass, best) = unsafe {
        (
            block_reduce(Sum(if kept { w } else { 0.0 }), shared.scratch),
            block_reduce(best, shared.scratch),
        )
    };
    if kept && col == best.col {
        let z = weights.z(value) - weights.max;
        // SAFETY: the outputs of row `row`, written by the one thread holding the token.
        unsafe { write_outputs(p, row, col, z - ln(kept_mass.0), z - ln(sum)) };
    }
}

/// The candidate path's entries of one element type (16-byte packs where the rows are aligned
/// for them).
macro_rules! candidate_entries {
    ($($module:literal: $element:ty, $name:literal, $pack:literal;)+) => {$(
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(sample_top $name),
            (params: SamplingParams) => sample_top_slice::<$element, $pack>(&params)
        );
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(sample_top_merge $name),
            (params: SamplingParams) => sample_top_merge(&params)
        );
    )+};
}

super::with_operation_types!(candidate_entries);
