//! Sampling with one small top-k for every row (at most [`TOP_K_CANDIDATES`]), in two
//! launches that read the row once:
//! 1. a block per slice of [`TOP_K_SLICE_COLS`] columns keeps its slice's keys (the order
//!    keys of the logits, [`order_key`]) in shared memory, bounds its `k`-th best key from
//!    below by its threads' largest keys ([`bound_of_notes`]), orders the keys at least the
//!    bound by counting (the sampler's order: larger logits first, the lower column among
//!    equals; a radix select over every key takes the best where equal keys make them too
//!    many), and leaves its best `k` ranks, in order, and its row state in the workspace;
//! 2. a block per row merges its slices' sorted candidates, which hold the row's top-k, and
//!    places top-p (over the top-k's mass) and min-p among them, draws with the Gumbel noise of
//!    the row kernel (keyed by the column), and writes the token and its log-probabilities.
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
    thread_idx, warp_ballot, warp_max_u32,
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

/// Launch 1: the best `top_k` columns of this block's slice, sorted (the sampler's order), and
/// its row state.
///
/// Few keys are compared: every thread notes the largest key it read, and those notes bound
/// the slice's `top_k`-th largest key from below ([`bound_of_notes`]), so the slice's best
/// `top_k` are among the keys at least the bound, which are few unless many keys are equal.
/// Those are gathered and placed in order ([`place_best`]); where they are too many for the
/// gathered space, the radix select over every key of the slice takes its best instead.
///
/// # Safety
/// The contract of [`SamplingParams`] for the candidate path.
#[inline(always)]
pub(crate) unsafe fn sample_top_slice<E: Element, const PACK: usize>(p: &SamplingParams) {
    let (row, start, cols) = slice_of(p);
    let (shared, after) = Shared::new();
    // The slice's keys, in the row kernel's candidate space (`TOP_K_SLICE_COLS` words) at
    // `key_slot`, and the gathered keys or ranks after them (`TOP_K_GATHERED_KEYS` words).
    let keys = shared.candidates.cast::<u32>();
    let gathered = after.cast::<u32>();
    let t = thread_idx() as usize;
    let threads = block_dim() as usize;
    if t == 0 {
        // SAFETY: a control word, added to atomically after the barriers below.
        unsafe { shared.set(control::PASSED, 0) };
    }
    // SAFETY: `row < rows`; the slice's columns (contract).
    let src = unsafe { RowSource::<E>::of::<PACK>(p, row, start, cols, core::ptr::null_mut()) };
    // SAFETY: `row < rows`.
    let inv_t = unsafe { Filters::inv_temperature_of(p, row) };
    let mut stats = OnlineStats::EMPTY;
    let mut extremes = Extremes::EMPTY;
    let mut note = 0u32;
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
                note = note.max(key);
                keys.add(key_slot::<PACK>(first + i)).write(key);
            }
            stats.push_batch::<DeviceExp2>(pack_max, PACK, |i| zs[i]);
        })
    };
    // The slots of the last pack's columns past the slice hold no key.
    let padded = cols.next_multiple_of(PACK);
    if t < padded - cols {
        // SAFETY: a key slot of the last pack, which no column's thread writes.
        unsafe { keys.add(key_slot::<PACK>(cols + t)).write(0) };
    }
    // SAFETY: every thread, uniform control flow (the reductions' barriers also order the
    // keys' writes before their reads).
    let (stats, extremes) = unsafe {
        (
            block_reduce(stats, shared.scratch),
            block_reduce(extremes, shared.scratch),
        )
    };
    // Threads with a column at least (packs, or columns where the row is read one at a time),
    // in whole warps.
    let units = if src.packs > 0 { src.packs } else { cols };
    let full_warps = units.min(threads) / WARP_SIZE as usize;
    // SAFETY: every thread, uniform control flow.
    let bound = unsafe { bound_of_notes(&shared, note, p.top_k, full_warps) };
    let ranks = gathered.cast::<u64>();
    let capacity = TOP_K_GATHERED_KEYS / 2;
    let mut a = t as u32;
    while a < padded as u32 {
        // SAFETY: a key slot of the slice (read by consecutive threads: no bank conflicts);
        // the counter; a gathered rank's slot below `capacity`.
        unsafe {
            let key = keys.add(a as usize).read();
            if key >= bound {
                let slot = shared_fetch_add_u32(shared.at(control::PASSED), 1);
                if slot < capacity {
                    let col = src.first_column as u32 + key_slot::<PACK>(a as usize) as u32;
                    ranks.add(slot as usize).write(rank_of(key, col));
                }
            }
        }
        a += threads as u32;
    }
    sync_threads();
    // SAFETY: written before the barrier.
    let passed = unsafe { shared.word(control::PASSED) };
    let found = if passed <= capacity {
        passed as usize
    } else {
        // Too many keys equal the bound: the radix select over the slice's keys, and its best
        // `top_k` gathered into the same space.
        // SAFETY: every thread, uniform control flow; the keys written.
        unsafe { gather_best::<E, PACK>(&shared, keys, gathered, padded, &src, p.top_k) }
    };
    let slice_top =
        (p.slice_tops as *mut u32).wrapping_add(block_idx() as usize * SLICE_TOP_WORDS as usize);
    let best = slice_top
        .wrapping_add(SLICE_TOP_HEADER_WORDS as usize)
        .cast::<u64>();
    // SAFETY: every thread, uniform control flow; `found` ranks gathered before a barrier; the
    // slice's ranks hold `TOP_K_CANDIDATES ≥ top_k` (contract).
    unsafe { place_best(ranks, found, p.top_k, best) };
    if t == 0 {
        let top = SliceTop {
            row: RowState {
                max: stats.max,
                sum: stats.sum(),
            },
            bad: extremes.bad,
            kept: found.min(p.top_k as usize) as u32,
        };
        // SAFETY: this slice's state (contract).
        unsafe { slice_top.cast::<SliceTop>().write(top) };
    }
}

/// A lower bound of the slice's `k`-th largest key from every thread's largest (`note`),
/// at least 1: with `c = ⌈k / full_warps⌉`, each of the first `full_warps` warps (whose every
/// thread read a column) finds its `c`-th largest note, and the bound is the `⌈k / c⌉`-th
/// largest of those, so that at least `⌈k / c⌉ · c ≥ k` notes, each a key, are at least it.
/// Where `c` would pass a warp's width, the slice holds fewer than 32 keys a warp of `k`, and
/// every key not 0 passes.
///
/// # Safety
/// Every thread of the block, uniform control flow, at most `WARP_SIZE` warps; the
/// histogram's first words free until a barrier after the call.
#[inline(always)]
unsafe fn bound_of_notes(shared: &Shared, note: u32, k: u32, full_warps: usize) -> u32 {
    let per_warp = k.div_ceil(full_warps.max(1) as u32);
    if full_warps == 0 || per_warp > WARP_SIZE {
        return 1;
    }
    let lane = thread_idx() % WARP_SIZE;
    let warp = thread_idx() / WARP_SIZE;
    let warp_best = nth_largest_in_warp(note, per_warp, lane);
    if lane == 0 {
        // SAFETY: warp `warp`'s word of the histogram, read after the barrier.
        unsafe { shared.counts.add(warp as usize).write(warp_best) };
    }
    sync_threads();
    if warp == 0 {
        let mine = if (lane as usize) < full_warps {
            // SAFETY: written before the barrier.
            unsafe { shared.counts.add(lane as usize).read() }
        } else {
            0
        };
        let bound = nth_largest_in_warp(mine, k.div_ceil(per_warp), lane).max(1);
        if lane == 0 {
            // SAFETY: a control word, read after the barrier.
            unsafe { shared.set(control::BOUND, bound) };
        }
    }
    sync_threads();
    // SAFETY: written before the barrier.
    unsafe { shared.word(control::BOUND) }
}

/// The `n`-th largest of the warp's values (`1 ≤ n ≤ WARP_SIZE`, the same in every lane), in
/// every lane: the warp's largest, `n` times, each time taken from the first lane holding it
/// (values are at least 0, which a taken value becomes).
#[inline(always)]
fn nth_largest_in_warp(value: u32, n: u32, lane: u32) -> u32 {
    let mut value = value;
    let mut largest = 0;
    for _ in 0..n {
        largest = warp_max_u32(value);
        if warp_ballot(value == largest).trailing_zeros() == lane {
            value = 0;
        }
    }
    largest
}

/// Writes the best `k` of the `found` distinct ranks at `ranks` (shared memory) to `best`,
/// largest first: each rank's place is the number of ranks above it (counted by the thread
/// that holds it; every thread reads the same rank at once), or where there are more ranks
/// than threads, their order after a sort.
///
/// # Safety
/// Every thread of the block, uniform control flow; `found ≤ TOP_K_GATHERED_KEYS / 2` ranks at
/// `ranks` written before a barrier, nothing else touching them; `best` holds `k` ranks.
#[inline(always)]
unsafe fn place_best(ranks: *mut u64, found: usize, k: u32, best: *mut u64) {
    let t = thread_idx() as usize;
    let threads = block_dim() as usize;
    if found <= threads {
        if t < found {
            // SAFETY: a gathered rank.
            let rank = unsafe { ranks.add(t).read() };
            let mut above = 0u32;
            let mut j = 0u32;
            while j < found as u32 {
                // SAFETY: a gathered rank.
                above += u32::from(unsafe { ranks.add(j as usize).read() } > rank);
                j += 1;
            }
            if above < k {
                // SAFETY: one of the `k` places, this rank's alone (the ranks are distinct).
                unsafe { best.add(above as usize).write(rank) };
            }
        }
        return;
    }
    let sorted = found.next_power_of_two();
    let mut j = found + t;
    while j < sorted {
        // SAFETY: a gathered slot (`sorted ≤ TOP_K_GATHERED_KEYS / 2`); padding below every
        // column's rank.
        unsafe { ranks.add(j).write(0) };
        j += threads;
    }
    sync_threads();
    // SAFETY: `sorted` ranks in shared memory; every thread (`SAMPLING_THREADS`, a multiple
    // of `WARP_SIZE`).
    unsafe { bitonic_sort_descending(ranks, sorted) };
    if t < k as usize {
        // SAFETY: a sorted rank, and one of the `k` places.
        unsafe { best.add(t).write(ranks.add(t).read()) };
    }
}

/// Where a slice keeps column `c`'s key: in its pack's words, the columns within the pack
/// permuted by the pack's place, so that a warp's stores of the same column of consecutive
/// packs fall in distinct banks (as do its reads of consecutive slots). The permutation is
/// its own inverse: `key_slot` of a slot is its column.
#[inline(always)]
fn key_slot<const PACK: usize>(c: usize) -> usize {
    const { assert!(PACK.is_power_of_two() && PACK <= WARP_SIZE as usize) };
    let pack = c / PACK;
    let turn = (pack / (WARP_SIZE as usize / PACK)) % PACK;
    pack * PACK + ((c % PACK) ^ turn)
}

/// A column's rank in the sampler's order: its key, then the lower column first.
#[inline(always)]
fn rank_of(key: u32, col: u32) -> u64 {
    (u64::from(key) << 32) | u64::from(!col)
}

/// Gathers the best `k` of the slice's `n` key slots (every key above the radix select's
/// threshold, and the first ties in column order) as ranks at `gathered`: how many.
///
/// # Safety
/// Every thread of the block, uniform control flow; the keys written before a barrier, at
/// their `key_slot`; the shared histogram, the control words and `gathered` free.
#[inline(always)]
unsafe fn gather_best<E: Element, const PACK: usize>(
    shared: &Shared,
    keys: *const u32,
    gathered: *mut u32,
    n: usize,
    src: &RowSource<E>,
    k: u32,
) -> usize {
    // SAFETY: every thread, uniform control flow; the keys written.
    let (threshold, ties_wanted, all) = unsafe { select(shared, keys, gathered, n, k) };
    // Ties in column order: a thread's columns are a run, the runs in thread order.
    let t = thread_idx() as usize;
    let per = n.div_ceil(block_dim() as usize);
    let (low, high) = ((t * per).min(n), ((t + 1) * per).min(n));
    // SAFETY: a key slot of the slice.
    let key_at = |c: usize| unsafe { keys.add(key_slot::<PACK>(c)).read() };
    let mut ties = 0;
    if !all {
        for c in low..high {
            ties += u32::from(key_at(c) == threshold);
        }
    }
    // SAFETY: every thread, uniform control flow.
    let (mut tie, _, _, _) = unsafe { block_exclusive_scan(ties, 0.0, shared.scratch) };
    if t == 0 {
        // SAFETY: a control word, read (atomically) after the barrier.
        unsafe { shared.set(control::GATHERED, 0) };
    }
    sync_threads();
    let ranks = gathered.cast::<u64>();
    for c in low..high {
        let key = key_at(c);
        let take = if all {
            key != 0
        } else if key == threshold {
            tie += 1;
            tie <= ties_wanted
        } else {
            key > threshold
        };
        if take {
            // SAFETY: the slot counter; at most `k ≤ TOP_K_CANDIDATES` columns are taken,
            // fewer than the gathered space's ranks.
            unsafe {
                let slot = shared_fetch_add_u32(shared.at(control::GATHERED), 1);
                ranks
                    .add(slot as usize)
                    .write(rank_of(key, src.first_column as u32 + c as u32));
            }
        }
    }
    sync_threads();
    // SAFETY: written before the barrier.
    unsafe { shared.word(control::GATHERED) as usize }
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
    let (shared, spare) = Shared::new();
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
    // The row's candidates and its NaN and `+inf` values.
    // SAFETY: every thread, uniform control flow.
    let (_, _, n, bad) = unsafe { block_exclusive_scan(kept, bad, shared.scratch) };
    let n = n as usize;
    // SAFETY: every thread, uniform control flow.
    let stats = unsafe { block_reduce(stats, shared.scratch) };
    if t < slices {
        // SAFETY: the histogram's words, free here; read after the barrier.
        unsafe { shared.counts.add(t).write(kept) };
    }
    sync_threads();
    // Each slice's ranks, sorted (launch 1), as a list of `list` slots at `s · list`, with
    // zeros (below every column's rank) after them and in the lists past the slices.
    let candidates = shared.candidates;
    let list = (p.top_k as usize).next_power_of_two();
    let total = slices.next_power_of_two() * list;
    let mut q = t;
    while q < total {
        let (s, j) = (q / list, q % list);
        // SAFETY: written before the barrier.
        let rank = if s < slices && j < unsafe { shared.counts.add(s).read() } as usize {
            // SAFETY: slice `s`'s ranks (contract).
            unsafe {
                tops.add(s * words + SLICE_TOP_HEADER_WORDS as usize)
                    .cast::<u64>()
                    .add(j)
                    .read()
            }
        } else {
            0
        };
        // SAFETY: a candidate slot: `total ≤ TOP_K_MAX_SLICES · TOP_K_CANDIDATES ≤
        // SAMPLING_CANDIDATES` (contract).
        unsafe { candidates.add(q).write(rank) };
        q += block_dim() as usize;
    }
    sync_threads();
    // SAFETY: every thread, uniform control flow; the lists written; the merge's shared
    // memory holds `SAMPLING_CANDIDATES / 2` more ranks after the candidates (contract).
    let candidates = unsafe { merge_lists(candidates, spare.cast::<u64>(), list, total) };
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

/// Merges the sorted lists at `ranks` (each `list` slots, largest first, padded with zeros, at
/// `i · list` for `i < total / list`, a power of two of them) into one, the largest `list`
/// ranks of all, largest first, and returns where it is (`ranks` or `spare`). Pairs of lists
/// merge in rounds, from one buffer into the other, each keeping the best `list` of its two: a
/// rank's place in its pair's merge is its place in its own list plus the ranks of the other
/// list above it (at least it, for the second list's, so that equal zeros take distinct
/// places), found by bisection.
///
/// # Safety
/// Every thread of the block, uniform control flow; `ranks` holds `total` slots and `spare`
/// `total / 2`, in shared memory that nothing else touches meanwhile; ranks other than zeros
/// are distinct.
#[inline(always)]
unsafe fn merge_lists(ranks: *mut u64, spare: *mut u64, list: usize, total: usize) -> *mut u64 {
    let (mut from, mut to) = (ranks, spare);
    let mut total = total;
    while total > list {
        let mut q = thread_idx() as usize;
        while q < total {
            let (i, j) = (q / list, q % list);
            let other = from.wrapping_add((i ^ 1) * list);
            // SAFETY: rank `j` of list `i`.
            let rank = unsafe { from.add(q).read() };
            let first = i % 2 == 0;
            // The other list's ranks above `rank` (at least it, for the second list's).
            let (mut low, mut high) = (0, list);
            while low < high {
                let mid = (low + high) / 2;
                // SAFETY: a rank of the other list.
                let probe = unsafe { other.add(mid).read() };
                if probe > rank || (!first && probe == rank) {
                    low = mid + 1;
                } else {
                    high = mid;
                }
            }
            let place = j + low;
            if place < list {
                // SAFETY: a slot of the pair's merged list, `total / 2` of them, one rank's
                // alone (the places of a pair's merge are distinct).
                unsafe { to.add(i / 2 * list + place).write(rank) };
            }
            q += block_dim() as usize;
        }
        sync_threads();
        (from, to) = (to, from);
        total /= 2;
    }
    from
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
