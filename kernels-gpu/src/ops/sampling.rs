//! Sampling one token from each row of logits: temperature, then top-k, top-p and min-p,
//! then a draw, with the token's log-probability under the filtered and the unfiltered
//! distributions. A block per row.
//!
//! The draw is Gumbel-max: the token is the kept column whose logit over the temperature
//! plus its Gumbel noise (`−ln E`, `E` an exponential variate from Philox keyed by the seed,
//! the offset, the row and the global column) is largest, which draws each kept column with
//! its filtered probability. A column whose logit is more than the noise's bound below the
//! best score drawn so far cannot win, so it draws no noise. Rows with a temperature alone
//! draw over chunks of four columns instead ([`Chunk`]): Gumbel-max picks a chunk with its
//! weight, then a uniform number a column within it, for a quarter of the noise.
//!
//! The filters keep a prefix of the row in the sampler's order (larger logits first, the
//! lower column first among equals: [`rank`]), so they come down to one cut, a rank: a
//! column is kept when its rank is at least the cut's and, with min-p, its probability at
//! least `min_p` times the largest. The cut is placed in three steps:
//! 1. a histogram of the columns over `max − z` (a bin per thread, over the row's range) counts
//!    columns and sums their weights `e^(z − max)` per bin; its prefix sums place the top-k
//!    cut in one bin and bound the top-p cut to a range of bins;
//! 2. the columns of those bins (at most [`SAMPLING_CANDIDATES`]) are gathered in shared
//!    memory and sorted by rank, and their running weights give the exact cuts;
//! 3. where those bins hold more columns, a bisection over ranks, a pass per step.
//!
//! Passes: greedy and temperature-only rows read their row once; min-p adds a pass; top-k or
//! top-p add three (the histogram, the gathering, the draw). Each pass reads the row from shared
//! memory where the launch keeps it there (`cached`), else from global memory again.

use crate::launch::ops::RowState;
use crate::launch::sampling::{
    NO_TOKEN, SAMPLING_BINS, SAMPLING_CANDIDATES, SAMPLING_CONTROL_WORDS, SAMPLING_THREADS,
    SamplingParams, ShardDraw, sampling_mode,
};
use crate::launch::{REDUCTION_SCRATCH_FLOATS, WARP_SIZE};
use crate::primitives::device::{
    DeviceExp2, block_dim, block_idx, dynamic_shared_f32, exp2_approx, grid_dim, log2_approx,
    shared_add_f32, shared_fetch_add_u32, shared_max_u32, shared_min_u32, shfl_idx_u32,
    shfl_up_u32, sync_threads, sync_warp, thread_idx, warp_ballot,
};
use crate::primitives::draw::{GUMBEL_NOISE_BOUND, exponential_of, rank, value_of_rank};
use crate::primitives::element::{Element, cached_words, copy_words};
use crate::primitives::online::{LOG2_E, OnlineStats};
use crate::primitives::philox::{draw_words, uniform_open};
use crate::primitives::reduce::{Partial, Sum, block_reduce, group_reduce, two_sums};

const LN_2: f32 = core::f32::consts::LN_2;

/// How far below the row's largest `z` the histogram reaches: a column further down weighs
/// less than the smallest f32 (`e^-104`), and falls in the last bin.
const WEIGHT_RANGE: f32 = 104.0;

/// Sorted candidates per thread, at most.
const PER_THREAD: usize = (SAMPLING_CANDIDATES / SAMPLING_THREADS) as usize;

/// The words of the block's control area.
pub(super) mod control {
    /// The top-k cut's bin, and the columns before it, in it, and their weight before it.
    pub const TOP_K_BIN: usize = 0;
    pub const TOP_K_BEFORE: usize = 1;
    pub const TOP_K_IN: usize = 2;
    pub const TOP_K_MASS_BEFORE: usize = 3;
    /// The last bin that holds a column.
    pub const LAST_BIN: usize = 5;
    /// The bin where the running weight crosses the top-p target (lowered atomically), the
    /// columns before the gathered range, and the columns through its end.
    pub const LOW_BIN: usize = 6;
    pub const LOW_BEFORE: usize = 7;
    pub const HIGH_END: usize = 8;
    /// Columns gathered so far.
    pub const GATHERED: usize = 10;
    /// The top-k kept weight, and the top-p cut's place among the sorted candidates.
    pub const TOP_K_MASS: usize = 11;
    pub const TOP_P_PLACE: usize = 12;
    /// Keys of a candidate-path slice at least its bound, and the bound.
    pub const PASSED: usize = 13;
    pub const BOUND: usize = 14;
}

/// One row's filters, from the call's values or its per-row arrays.
#[derive(Clone, Copy)]
pub(super) struct Filters {
    pub(super) inv_temperature: f32,
    pub(super) greedy: bool,
    pub(super) top_k: u32,
    pub(super) top_p: f32,
    pub(super) min_p: f32,
    pub(super) valid: bool,
}

impl Filters {
    /// # Safety
    /// `row < rows`; the per-row arrays as the contract gives them.
    #[inline(always)]
    pub(super) unsafe fn of(p: &SamplingParams, row: usize) -> Self {
        // SAFETY: one value per row where the array is given (contract).
        let (temperature, top_k, top_p, min_p) = unsafe {
            (
                per_row(p.temperatures, row, p.temperature),
                if p.top_ks == 0 {
                    p.top_k
                } else {
                    (p.top_ks as *const u32).add(row).read()
                },
                per_row(p.top_ps, row, p.top_p),
                per_row(p.min_ps, row, p.min_p),
            )
        };
        // Every comparison with a NaN is false.
        let valid = (0.0..f32::INFINITY).contains(&temperature)
            && top_p > 0.0
            && top_p <= 1.0
            && (0.0..=1.0).contains(&min_p);
        let greedy = temperature == 0.0;
        Filters {
            inv_temperature: inverse_temperature(temperature),
            greedy,
            top_k,
            top_p,
            min_p,
            valid,
        }
    }

    /// Row `row`'s inverse temperature alone, for kernels that read no other per-row filter.
    ///
    /// # Safety
    /// As [`Filters::of`].
    #[inline(always)]
    pub(super) unsafe fn inv_temperature_of(p: &SamplingParams, row: usize) -> f32 {
        // SAFETY: forwarded from the contract.
        inverse_temperature(unsafe { per_row(p.temperatures, row, p.temperature) })
    }

    /// Whether a cut by rank is needed (top-k or top-p).
    #[inline(always)]
    fn cuts(&self) -> bool {
        self.top_k != 0 || self.top_p < 1.0
    }
}

/// The factor logits are scaled by: 1 / `temperature`, and 1 for greedy rows (temperature 0),
/// whose draw is the plain argmax.
#[inline(always)]
fn inverse_temperature(temperature: f32) -> f32 {
    if temperature == 0.0 {
        1.0
    } else {
        1.0 / temperature
    }
}

/// # Safety
/// `values`, when not 0, holds a float for row `row`.
#[inline(always)]
unsafe fn per_row(values: u64, row: usize, all: f32) -> f32 {
    if values == 0 {
        all
    } else {
        // SAFETY: forwarded from the contract.
        unsafe { (values as *const f32).add(row).read() }
    }
}

/// Where a block reads its row: global memory (with the bias added), and the row kept in
/// shared memory when the launch caches it.
pub(super) struct RowSource<E> {
    pub(super) x: *const E,
    /// The global column of the first column (a shard's or a slice's offset): the noise's key
    /// and the token's number.
    pub(super) first_column: u64,
    pub(super) bias: *const f32,
    pub(super) cache: *mut E,
    pub(super) cols: usize,
    pub(super) packs: usize,
}

impl<E: Element> RowSource<E> {
    /// Row `row` of the call's logits (and bias) from column `start`, `cols` of them, in
    /// 16-byte packs of `PACK` where the call's rows are aligned for them; column `start` is
    /// global column `column_offset + start`.
    ///
    /// # Safety
    /// `row < rows` and `start + cols ≤ cols` of the call (contract).
    #[inline(always)]
    pub(super) unsafe fn of<const PACK: usize>(
        p: &SamplingParams,
        row: usize,
        start: usize,
        cols: usize,
        cache: *mut E,
    ) -> Self {
        RowSource {
            // SAFETY: row `row` of the logits from column `start` (contract).
            x: unsafe { (p.logits as *const E).add(row * p.logits_stride as usize + start) },
            bias: if p.bias == 0 {
                core::ptr::null()
            } else {
                // SAFETY: the bias's row (contract).
                unsafe { (p.bias as *const f32).add(row * p.bias_stride as usize + start) }
            },
            first_column: p.column_offset + start as u64,
            cache,
            cols,
            packs: if p.aligned != 0 { cols / PACK } else { 0 },
        }
    }

    /// Calls `visit(first column, values, count)` for this thread's columns (16-byte packs
    /// of `PACK`, every `block_dim`-th, then the columns after the packs in runs of up to
    /// `TAIL` (at most `PACK`), also every `block_dim`-th), columns in increasing order;
    /// `first` is a multiple of `TAIL`. `fill`: this is the first pass, which keeps what it
    /// reads in the cache (if any); later passes read the cache. A run of one column gives
    /// the visit a known `count` of 1 there; a longer one, a `count` known only at run time.
    ///
    /// # Safety
    /// The row as the contract gives it; after a filling pass, a barrier before the next.
    #[inline(always)]
    pub(super) unsafe fn visit<const PACK: usize, const TAIL: usize>(
        &self,
        fill: bool,
        mut visit: impl FnMut(usize, &[f32; PACK], usize),
    ) {
        const { assert!(TAIL >= 1 && TAIL <= PACK) };
        let threads = block_dim() as usize;
        let cached = !self.cache.is_null();
        // SAFETY (both closures): `at` starts a pack of the row, 16-byte aligned (contract);
        // the cache holds the row.
        let read = |at: usize| unsafe {
            if cached && !fill {
                cached_words::<E, PACK>(self.cache.add(at))
            } else {
                E::load_packed::<PACK>(self.x.add(at))
            }
        };
        let mut visit_words = |at: usize, words: &[u32; PACK]| {
            // SAFETY: as above; the bias holds the row's columns.
            let mut values = unsafe {
                if cached && fill {
                    copy_words::<E, PACK>(self.cache.add(at), words);
                }
                E::widen_all(words)
            };
            // SAFETY: as above.
            unsafe { self.add_bias(at, &mut values, PACK) };
            visit(at, &values, PACK);
        };
        let mut pack = thread_idx() as usize;
        // Two packs read before the first is used (one in flight per thread leaves a block
        // at a fraction of a multiprocessor's share of the bandwidth).
        while pack < self.packs {
            let second = pack + threads;
            let both = second < self.packs;
            let a = read(pack * PACK);
            let b = if both { read(second * PACK) } else { a };
            // One call site, so the visit is inlined once and the loop unrolled after.
            for u in 0..2 {
                if u == 0 || both {
                    let at = if u == 0 { pack } else { second } * PACK;
                    visit_words(at, if u == 0 { &a } else { &b });
                }
            }
            pack += 2 * threads;
        }
        // The columns after the packs, `TAIL` consecutive ones a thread, read one at a time.
        let mut at = self.packs * PACK + thread_idx() as usize * TAIL;
        while at < self.cols {
            let count = if TAIL == 1 {
                1
            } else {
                (self.cols - at).min(TAIL)
            };
            // SAFETY: one column of the row.
            let read_one = |col: usize| unsafe {
                let words = if cached && !fill {
                    cached_words::<E, 1>(self.cache.add(col))
                } else {
                    E::load_packed::<1>(self.x.add(col))
                };
                if cached && fill {
                    copy_words::<E, 1>(self.cache.add(col), &words);
                }
                E::widen_all(&words)[0]
            };
            let mut values = [f32::NEG_INFINITY; PACK];
            // Indices, not an iterator: the loop unrolls, and the values stay in registers.
            #[allow(clippy::needless_range_loop)]
            for i in 0..TAIL {
                if i < count {
                    values[i] = read_one(at + i);
                }
            }
            // SAFETY: as above.
            unsafe { self.add_bias(at, &mut values, count) };
            visit(at, &values, count);
            at += threads * TAIL;
        }
    }

    /// # Safety
    /// `at..at + count` are columns of the row.
    #[inline(always)]
    unsafe fn add_bias<const PACK: usize>(
        &self,
        at: usize,
        values: &mut [f32; PACK],
        count: usize,
    ) {
        if !self.bias.is_null() {
            for (i, value) in values.iter_mut().enumerate() {
                if i >= count {
                    continue;
                }
                // SAFETY: forwarded from the contract.
                *value += unsafe { self.bias.add(at + i).read() };
            }
        }
    }

    /// Column `col`'s logit with its bias, read from global memory.
    ///
    /// # Safety
    /// `col` is a column of the row.
    #[inline(always)]
    unsafe fn value_at(&self, col: usize) -> f32 {
        let mut values = [0.0f32; 1];
        // SAFETY: forwarded from the contract.
        unsafe {
            values[0] = E::widen_all(&E::load_packed::<1>(self.x.add(col)))[0];
            self.add_bias(col, &mut values, 1);
        }
        values[0]
    }
}

/// The best of a set of (value, column) pairs: the largest value, the lower column among
/// equals.
#[derive(Clone, Copy)]
pub(super) struct Best {
    pub(super) value: f32,
    pub(super) col: u32,
}

impl Best {
    #[inline(always)]
    pub(super) fn offer(&mut self, value: f32, col: u32) {
        if value > self.value || (value == self.value && col < self.col) {
            *self = Best { value, col };
        }
    }
}

impl Partial for Best {
    const EMPTY: Self = Best {
        value: f32::NEG_INFINITY,
        col: u32::MAX,
    };
    const FLOATS: usize = 2;

    #[inline(always)]
    fn merge(mut self, other: Self) -> Self {
        self.offer(other.value, other.col);
        self
    }

    #[inline(always)]
    fn to_floats(self) -> [f32; 2] {
        [self.value, f32::from_bits(self.col)]
    }

    #[inline(always)]
    fn from_floats([value, col]: [f32; 2]) -> Self {
        Best {
            value,
            col: col.to_bits(),
        }
    }
}

/// What makes a row unusable (a count of NaN and `+inf` values after the temperature), and
/// its smallest finite value, negated (so that both merge by a plain operation).
#[derive(Clone, Copy)]
pub(super) struct Extremes {
    pub(super) bad: f32,
    pub(super) negated_low: f32,
}

impl Partial for Extremes {
    const EMPTY: Self = Extremes {
        bad: 0.0,
        negated_low: f32::NEG_INFINITY,
    };
    const FLOATS: usize = 2;

    #[inline(always)]
    fn merge(self, other: Self) -> Self {
        Extremes {
            bad: self.bad + other.bad,
            negated_low: self.negated_low.max(other.negated_low),
        }
    }

    #[inline(always)]
    fn to_floats(self) -> [f32; 2] {
        [self.bad, self.negated_low]
    }

    #[inline(always)]
    fn from_floats([bad, negated_low]: [f32; 2]) -> Self {
        Extremes { bad, negated_low }
    }
}

two_sums! {
    /// A count of columns and their weight.
    struct Tally { count, mass }
}

/// The Gumbel noise of a row's columns, four columns per Philox call, the last call's words
/// kept.
struct Noise {
    seed: u64,
    offset: u64,
    row: u32,
    column_offset: u64,
    group: u64,
    words: [u32; 4],
}

impl Noise {
    #[inline(always)]
    fn gumbel(&mut self, col: usize) -> f32 {
        let global = self.column_offset + col as u64;
        let group = global / 4;
        if group != self.group {
            self.words = draw_words(self.seed, self.offset, self.row, group as u32);
            self.group = group;
        }
        gumbel_of(word_of_column(&self.words, global))
    }

    /// Offers column `col`, whose logit over the temperature is `z`, to the draw.
    #[inline(always)]
    fn offer(&mut self, best: &mut Best, z: f32, col: usize) {
        // A `-inf` logit never passes.
        if z + GUMBEL_NOISE_BOUND > best.value {
            let score = z + self.gumbel(col);
            best.offer(score, col as u32);
        }
    }

    /// Offers global chunk `global_chunk` (see [`Chunk`]), whose first column is `first`, to the
    /// draw of a temperature-only row. The chunk takes its words from Philox call
    /// `global_chunk / 2` (the first two words for an even chunk, the last two for an odd one),
    /// kept in `words` for the next chunk: the first's Gumbel noise `G` gives the chunk's
    /// score `max + ln(sum) + G`, and where that is the best so far, the second picks its
    /// column. A chunk whose largest `z` is too far below the best to win draws nothing.
    #[inline(always)]
    fn offer_chunk(
        &self,
        best: &mut Best,
        chunk: &Chunk,
        global_chunk: u64,
        first: usize,
        words: &mut ([u32; 4], u64),
    ) {
        if chunk.max + CHUNK_NOISE_BOUND <= best.value {
            return;
        }
        let pair = global_chunk / 2;
        if words.1 != pair {
            *words = (
                draw_words(self.seed, self.offset, self.row, pair as u32),
                pair,
            );
        }
        let (noise_word, pick_word) = if global_chunk % 2 == 0 {
            (words.0[0], words.0[1])
        } else {
            (words.0[2], words.0[3])
        };
        let score = chunk.max + ln(chunk.sum) + gumbel_of(noise_word);
        if score >= best.value {
            let col = first + chunk.pick(uniform_open(pick_word));
            best.offer(score, col as u32);
        }
    }
}

/// How far above its largest `z` a chunk's score can reach: the noise's bound and the log of
/// four columns' weights (at most 4 relative to the largest), rounded up.
const CHUNK_NOISE_BOUND: f32 = GUMBEL_NOISE_BOUND + 1.4;

/// Four consecutive columns from a multiple of 4 globally, the unit of a temperature-only
/// row's draw, whose weight is the sum of theirs. Gumbel-max over the chunks draws a chunk
/// with its share of the row's weight, and a uniform number then picks a column within it in
/// proportion to its weight: together they draw each column with its probability, for one
/// Philox call per two chunks (a 16-bit pack's two; an f32 pack holds one chunk, which takes
/// a call of its own) and three logarithms per chunk, where noise per column takes a call per
/// four columns and two logarithms per column. Everything depends on the chunk's
/// own values alone, so the draw is the same however a row is split between threads, blocks
/// and shards.
pub(super) struct Chunk {
    /// Each column's `e^(z − max)` (0 for a `-inf`).
    weights: [f32; 4],
    /// The largest `z` (`-inf` for a chunk of `-inf`s) and the sum of the weights.
    max: f32,
    sum: f32,
}

impl Chunk {
    /// The chunk of columns `4j..4j + 4` of a pack's `z`s (`-inf` past the row's end).
    #[inline(always)]
    pub(super) fn of<const PACK: usize>(zs: &[f32; PACK], j: usize) -> Self {
        let z = [zs[4 * j], zs[4 * j + 1], zs[4 * j + 2], zs[4 * j + 3]];
        let max = z[0].max(z[1]).max(z[2].max(z[3]));
        let weights = z.map(|z| OnlineStats::exp_relative::<DeviceExp2>(z, max));
        let sum = weights[0] + weights[1] + weights[2] + weights[3];
        Chunk { weights, max, sum }
    }

    /// The column (0 to 3) that `u`, uniform in (0, 1), picks in proportion to the weights:
    /// the first whose running weight passes `u` times the chunk's, summed in the order of
    /// [`Chunk::of`]; where rounding leaves none, the last column of positive weight.
    #[inline(always)]
    fn pick(&self, u: f32) -> usize {
        let target = u * self.sum;
        let mut running = 0.0;
        let (mut picked, mut last) = (4, 0);
        for (i, &weight) in self.weights.iter().enumerate() {
            running += weight;
            if weight > 0.0 {
                last = i;
                if picked == 4 && target < running {
                    picked = i;
                }
            }
        }
        if picked == 4 { last } else { picked }
    }
}

/// The call's random state: its seed and offset.
///
/// # Safety
/// `p.random` holds the two words (contract).
#[inline(always)]
pub(super) unsafe fn random_state(p: &SamplingParams) -> (u64, u64) {
    let random = p.random as *const u64;
    // SAFETY: forwarded from the contract.
    unsafe { (random.read(), random.add(1).read()) }
}

/// Global column `global`'s 32 random bits among `words`, its group of four's Philox words.
#[inline(always)]
pub(super) fn word_of_column(words: &[u32; 4], global: u64) -> u32 {
    // A match, not an index: an indexed array would be kept in local memory.
    match global % 4 {
        0 => words[0],
        1 => words[1],
        2 => words[2],
        _ => words[3],
    }
}

/// A column's Gumbel noise from its 32 random bits.
#[inline(always)]
pub(super) fn gumbel_of(bits: u32) -> f32 {
    -log2_approx(exponential_of(bits)) * LN_2
}

/// The row's weight function: `e^(z − max)` for `z = value / temperature`.
#[derive(Clone, Copy)]
pub(super) struct Weights {
    pub(super) inv_temperature: f32,
    pub(super) max: f32,
}

impl Weights {
    #[inline(always)]
    pub(super) fn z(&self, value: f32) -> f32 {
        value * self.inv_temperature
    }

    #[inline(always)]
    pub(super) fn of(&self, value: f32) -> f32 {
        exp2_approx((self.z(value) - self.max) * LOG2_E)
    }
}

/// `ln(x)` to the accuracy the log-probabilities need.
#[inline(always)]
pub(super) fn ln(x: f32) -> f32 {
    log2_approx(x) * LN_2
}

/// Exclusive prefix sums across the block, in thread order, of `count` and `mass`, and the
/// block's totals: `(count before, mass before, count total, mass total)`. Each warp scans
/// its lanes, then every warp scans the warps' totals (a lane a warp), so no thread walks
/// them one by one; the masses are added in the order of those two scans.
///
/// # Safety
/// As [`block_reduce`], with the same scratch.
#[inline(always)]
pub(super) unsafe fn block_exclusive_scan(
    count: u32,
    mass: f32,
    scratch: *mut f32,
) -> (u32, f32, u32, f32) {
    let lane = thread_idx() % WARP_SIZE;
    let warp = thread_idx() / WARP_SIZE;
    let warps = block_dim() / WARP_SIZE;
    let (c, m) = warp_inclusive_scan(count, mass);
    // Exclusive within the warp: the inclusive sum of the lane below.
    let (mut before_c, mut before_m) = shuffled((c, m), |v| shfl_up_u32(v, 1));
    if lane == 0 {
        before_c = 0;
        before_m = 0.0;
    }
    if lane == WARP_SIZE - 1 {
        // SAFETY: `warp < 32`; the scratch holds 32 floats then 32 more.
        unsafe {
            scratch.add(warp as usize).write(f32::from_bits(c));
            scratch.add((WARP_SIZE + warp) as usize).write(m);
        }
    }
    sync_threads();
    let (warp_c, warp_m) = if lane < warps {
        // SAFETY: written before the barrier.
        unsafe {
            (
                scratch.add(lane as usize).read().to_bits(),
                scratch.add((WARP_SIZE + lane) as usize).read(),
            )
        }
    } else {
        (0, 0.0)
    };
    let (through_c, through_m) = warp_inclusive_scan(warp_c, warp_m);
    // The warps before this one: the inclusive sum at lane `warp − 1`; the block's: at the
    // last warp's lane.
    let below = warp.max(1) - 1;
    let (below_c, below_m) = shuffled((through_c, through_m), |v| shfl_idx_u32(v, below));
    if warp > 0 {
        before_c += below_c;
        before_m += below_m;
    }
    let (total_c, total_m) = shuffled((through_c, through_m), |v| shfl_idx_u32(v, warps - 1));
    sync_threads();
    (before_c, before_m, total_c, total_m)
}

/// Inclusive prefix sums across the warp, in lane order, of `count` and `mass`.
#[inline(always)]
fn warp_inclusive_scan(count: u32, mass: f32) -> (u32, f32) {
    let lane = thread_idx() % WARP_SIZE;
    let (mut c, mut m) = (count, mass);
    let mut delta = 1;
    while delta < WARP_SIZE {
        let (their_c, their_m) = shuffled((c, m), |v| shfl_up_u32(v, delta));
        if lane >= delta {
            c += their_c;
            m += their_m;
        }
        delta *= 2;
    }
    (c, m)
}

/// A count and a mass, each through the same warp shuffle `shuffle` (the mass as its bits).
#[inline(always)]
fn shuffled((count, mass): (u32, f32), shuffle: impl Fn(u32) -> u32) -> (u32, f32) {
    (shuffle(count), f32::from_bits(shuffle(mass.to_bits())))
}

/// The shared memory of a sampling block: the scratch, the control words, the histogram, the
/// candidates, the cache.
pub(super) struct Shared {
    pub(super) scratch: *mut f32,
    control: *mut u32,
    pub(super) counts: *mut u32,
    masses: *mut f32,
    pub(super) candidates: *mut u64,
}

impl Shared {
    #[inline(always)]
    pub(super) fn new() -> (Self, *mut u8) {
        let scratch = dynamic_shared_f32();
        // SAFETY: offsets inside the launch's dynamic shared memory (contract).
        unsafe {
            let control = scratch.add(REDUCTION_SCRATCH_FLOATS as usize).cast::<u32>();
            let counts = control.add(SAMPLING_CONTROL_WORDS as usize);
            let masses = counts.add(SAMPLING_BINS as usize).cast::<f32>();
            let candidates = masses.add(SAMPLING_BINS as usize).cast::<u64>();
            let cache = candidates.add(SAMPLING_CANDIDATES as usize).cast::<u8>();
            (
                Shared {
                    scratch,
                    control,
                    counts,
                    masses,
                    candidates,
                },
                cache,
            )
        }
    }

    #[inline(always)]
    pub(super) unsafe fn word(&self, index: usize) -> u32 {
        // SAFETY: a control word.
        unsafe { self.control.add(index).read_volatile() }
    }

    #[inline(always)]
    pub(super) unsafe fn set(&self, index: usize, value: u32) {
        // SAFETY: a control word.
        unsafe { self.control.add(index).write_volatile(value) }
    }

    #[inline(always)]
    pub(super) fn at(&self, index: usize) -> *mut u32 {
        self.control.wrapping_add(index)
    }
}

/// Samples row `block_idx` (see the module's documentation) and writes its outputs: the
/// token, its log-probabilities, the filtered distribution where asked (mode `FULL`), or
/// the row's [`ShardDraw`] (mode `SHARD`). Without `FILTERS` (the draw entries) only
/// greedy and temperature-only rows are drawn: the code of the filters is not compiled, so
/// the entry needs fewer registers.
///
/// # Safety
/// The contract of [`SamplingParams`]; without `FILTERS`, that of its draw entries.
#[inline(always)]
pub(crate) unsafe fn sample_row<E: Element, const PACK: usize, const FILTERS: bool>(
    p: &SamplingParams,
) {
    // Whole chunks of four columns in every pack.
    const { assert!(PACK % 4 == 0) };
    let slices = p.slices.max(1) as usize;
    let (row, slice) = (block_idx() as usize / slices, block_idx() as usize % slices);
    // This block's columns: the row, or its slice (whose first column keeps 16-byte packs
    // aligned: `slice_cols` is a multiple of 8).
    let (start, cols) = if slices > 1 {
        let start = slice * p.slice_cols as usize;
        (
            start,
            (p.cols as usize)
                .saturating_sub(start)
                .min(p.slice_cols as usize),
        )
    } else {
        (0, p.cols as usize)
    };
    let (shared, cache) = Shared::new();
    let cache = if FILTERS && p.cached != 0 {
        cache.cast::<E>()
    } else {
        core::ptr::null_mut()
    };
    // SAFETY: `row < rows`; the block's columns.
    let src = unsafe { RowSource::<E>::of::<PACK>(p, row, start, cols, cache) };
    // SAFETY: `row < rows`.
    let filters = unsafe { Filters::of(p, row) };
    // SAFETY: the random state (contract).
    let (seed, offset) = unsafe { random_state(p) };
    let mut noise = Noise {
        seed,
        offset,
        row: row as u32,
        column_offset: src.first_column,
        group: u64::MAX,
        words: [0; 4],
    };
    let inv_t = filters.inv_temperature;
    // Temperature alone: the draw happens in the first pass.
    let draws_at_once = !filters.greedy && (!FILTERS || (!filters.cuts() && filters.min_p == 0.0));

    // Pass 1: the statistics, the largest logit, the smallest finite one, the bad values.
    let mut stats = OnlineStats::EMPTY;
    let mut top = Best::EMPTY;
    let mut extremes = Extremes::EMPTY;
    let mut best = Best::EMPTY;
    // SAFETY: the row (contract); the first pass fills the cache.
    unsafe {
        src.visit::<PACK, 4>(true, |first, values, count| {
            let mut zs = [f32::NEG_INFINITY; PACK];
            for i in 0..PACK {
                if i >= count {
                    continue;
                }
                let z = values[i] * inv_t;
                zs[i] = z;
                // Selections, not branches: NaN and `+inf` (the only values not below
                // `+inf`) are counted, and every value above `-inf` lowers the floor that
                // only the filters' histogram reads.
                extremes.bad += if z < f32::INFINITY { 0.0 } else { 1.0 };
                if FILTERS {
                    let negated = if z > f32::NEG_INFINITY {
                        -z
                    } else {
                        f32::NEG_INFINITY
                    };
                    extremes.negated_low = extremes.negated_low.max(negated);
                }
            }
            let mut pack_max = f32::NEG_INFINITY;
            let mut words = ([0u32; 4], u64::MAX);
            for j in 0..PACK / 4 {
                let chunk = Chunk::of(&zs, j);
                stats.push_part::<DeviceExp2>(chunk.max, chunk.sum);
                pack_max = pack_max.max(chunk.max);
                if draws_at_once && chunk.max > f32::NEG_INFINITY {
                    // `first` is a multiple of 4 columns from a multiple of 4 globally.
                    let global_chunk = (noise.column_offset + first as u64) / 4 + j as u64;
                    noise.offer_chunk(&mut best, &chunk, global_chunk, first + 4 * j, &mut words);
                }
            }
            // The largest `z` with its lowest column: a thread's packs come in increasing
            // columns, so only a strictly larger maximum moves it.
            if pack_max > top.value {
                let i = zs.iter().position(|&z| z == pack_max).unwrap_or(0);
                top = Best {
                    value: pack_max,
                    col: (first + i) as u32,
                };
            }
        })
    };
    // SAFETY: every thread of the block, uniform control flow.
    let (stats, top, extremes) = unsafe {
        (
            block_reduce(stats, shared.scratch),
            block_reduce(top, shared.scratch),
            block_reduce(extremes, shared.scratch),
        )
    };
    let z_max = stats.max;
    let sum = stats.sum();
    if filters.valid
        && extremes.bad == 0.0
        && z_max == f32::NEG_INFINITY
        && p.mode == sampling_mode::SHARD
    {
        // A shard or slice without a finite logit offers nothing to the merge.
        if thread_idx() == 0 {
            let draw = ShardDraw {
                score: f32::NEG_INFINITY,
                token: NO_TOKEN,
                logit: f32::NEG_INFINITY,
                row: RowState {
                    max: f32::NEG_INFINITY,
                    sum: 0.0,
                },
            };
            // SAFETY: one draw per block (contract).
            unsafe {
                (p.draws as *mut ShardDraw)
                    .add(block_idx() as usize)
                    .write(draw)
            };
        }
        return;
    }
    if !filters.valid || extremes.bad > 0.0 || z_max == f32::NEG_INFINITY {
        // SAFETY: the outputs of row `row`.
        unsafe { finish(p, &src, row, None, f32::NAN, f32::NAN, |_, _| f32::NAN) };
        return;
    }
    if filters.greedy && p.mode == sampling_mode::SHARD {
        // A greedy shard's best is its largest logit, which merges as the draws do.
        if thread_idx() == 0 {
            let draw = ShardDraw {
                score: z_max,
                token: (src.first_column + u64::from(top.col)) as u32,
                logit: z_max,
                row: RowState { max: z_max, sum },
            };
            // SAFETY: one draw per row (contract).
            unsafe {
                (p.draws as *mut ShardDraw)
                    .add(block_idx() as usize)
                    .write(draw)
            };
        }
        return;
    }
    if filters.greedy {
        let token = top.col;
        let raw = -ln(sum);
        let log = p.probabilities_log != 0;
        // SAFETY: as above.
        unsafe {
            finish(
                p,
                &src,
                row,
                Some((token, z_max)),
                0.0,
                raw,
                |col, _| match (col == token as usize, log) {
                    (true, true) => 0.0,
                    (true, false) => 1.0,
                    (false, true) => f32::NEG_INFINITY,
                    (false, false) => 0.0,
                },
            )
        };
        return;
    }
    let weights = Weights {
        inv_temperature: inv_t,
        max: z_max,
    };
    if draws_at_once || !FILTERS {
        // SAFETY: every thread, uniform control flow.
        let best = unsafe { block_reduce(best, shared.scratch) };
        // SAFETY: the outputs of row `row`; `best.col` is a column of the row.
        unsafe { finish_draw(p, &src, row, weights, best, sum, sum, 0, filters.min_p) };
        return;
    }

    // The cut, by rank: every column at least as early as it survives top-k and top-p.
    let cut = if filters.cuts() {
        // SAFETY: every thread, uniform control flow; the row as above.
        unsafe {
            place_cut::<E, PACK>(
                &src,
                &shared,
                &filters,
                weights,
                z_max + extremes.negated_low,
            )
        }
    } else {
        0
    };

    // The draw over the kept columns.
    let min_p = filters.min_p;
    let mut kept = Sum::EMPTY;
    // SAFETY: the row; the cache was filled before the barriers of the reductions above.
    unsafe {
        src.visit::<PACK, 1>(false, |first, values, count| {
            for (i, &value) in values.iter().enumerate() {
                if i >= count {
                    continue;
                }
                let col = first + i;
                if value > f32::NEG_INFINITY && rank(value, col as u32) >= cut {
                    let w = weights.of(value);
                    if w >= min_p {
                        kept.0 += w;
                        noise.offer(&mut best, weights.z(value), col);
                    }
                }
            }
        })
    };
    // SAFETY: every thread, uniform control flow.
    let (kept, best) = unsafe {
        (
            block_reduce(kept, shared.scratch),
            block_reduce(best, shared.scratch),
        )
    };
    // SAFETY: the outputs of row `row`; `best.col` is a column of the row.
    unsafe { finish_draw(p, &src, row, weights, best, kept.0, sum, cut, min_p) };
}

/// Writes a drawn row's outputs: the token `best.col` (or its [`ShardDraw`]), its
/// log-probabilities given the kept weight and the row's, and the filtered distribution
/// where asked (`cut` and `min_p` say which columns were kept).
///
/// # Safety
/// The outputs of row `row` (contract); `best.col` a column of the row; every thread of the
/// block.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn finish_draw<E: Element>(
    p: &SamplingParams,
    src: &RowSource<E>,
    row: usize,
    weights: Weights,
    best: Best,
    kept: f32,
    sum: f32,
    cut: u64,
    min_p: f32,
) {
    let token = best.col;
    if token as usize >= src.cols {
        // No column was kept (which the filters never leave): no token.
        // SAFETY: forwarded.
        unsafe { finish(p, src, row, None, f32::NAN, f32::NAN, |_, _| f32::NAN) };
        return;
    }
    // SAFETY: `token` is a column of the row.
    let z = weights.z(unsafe { src.value_at(token as usize) });
    if p.mode == sampling_mode::SHARD {
        if thread_idx() == 0 {
            let draw = ShardDraw {
                score: best.value,
                token: (src.first_column + u64::from(token)) as u32,
                logit: z,
                row: RowState {
                    max: weights.max,
                    sum,
                },
            };
            // SAFETY: one draw per row (contract).
            unsafe {
                (p.draws as *mut ShardDraw)
                    .add(block_idx() as usize)
                    .write(draw)
            };
        }
        return;
    }
    let ln_kept = ln(kept);
    let log = p.probabilities_log != 0;
    // SAFETY: forwarded.
    unsafe {
        finish(
            p,
            src,
            row,
            Some((token, z)),
            (z - weights.max) - ln_kept,
            (z - weights.max) - ln(sum),
            |col, value| {
                let w = weights.of(value);
                let kept_here =
                    value > f32::NEG_INFINITY && rank(value, col as u32) >= cut && w >= min_p;
                match (kept_here, log) {
                    (true, true) => (weights.z(value) - weights.max) - ln_kept,
                    (true, false) => w / kept,
                    (false, true) => f32::NEG_INFINITY,
                    (false, false) => 0.0,
                }
            },
        )
    };
}

/// Writes row `row`'s token (`NO_TOKEN` without one) and log-probabilities (thread 0), and,
/// where the call asks for them, its filtered probabilities, `probability(col, logit)` for
/// each column (every thread).
///
/// # Safety
/// The outputs of row `row` (contract); every thread of the block.
#[inline(always)]
unsafe fn finish<E: Element>(
    p: &SamplingParams,
    src: &RowSource<E>,
    row: usize,
    token: Option<(u32, f32)>,
    logprob: f32,
    raw_logprob: f32,
    probability: impl Fn(usize, f32) -> f32,
) {
    if thread_idx() == 0 {
        // SAFETY: one value per row in each output that is given.
        unsafe {
            if p.mode == sampling_mode::SHARD {
                let draw = ShardDraw {
                    score: f32::NAN,
                    token: NO_TOKEN,
                    logit: f32::NAN,
                    row: RowState {
                        max: f32::NAN,
                        sum: f32::NAN,
                    },
                };
                (p.draws as *mut ShardDraw)
                    .add(block_idx() as usize)
                    .write(draw);
            }
            let id = token.map_or(NO_TOKEN, |(t, _)| t);
            write_outputs(p, row, id, logprob, raw_logprob);
        }
    }
    if p.probabilities != 0 {
        let out = (p.probabilities as *mut f32).wrapping_add(row * p.probabilities_stride as usize);
        let threads = block_dim() as usize;
        let mut col = thread_idx() as usize;
        while col < p.cols as usize {
            // The logit read again from global memory (these reads are the last).
            let value = if token.is_some() {
                // SAFETY: a column of the row.
                unsafe { src.value_at(col) }
            } else {
                f32::NAN
            };
            let q = if token.is_some() {
                probability(col, value)
            } else {
                f32::NAN
            };
            // SAFETY: a column of the probabilities' row (contract).
            unsafe { out.add(col).write(q) };
            col += threads;
        }
    }
}

/// Writes row `row`'s token and log-probabilities, where the call asks for them.
///
/// # Safety
/// The outputs of row `row` (contract).
#[inline(always)]
pub(super) unsafe fn write_outputs(
    p: &SamplingParams,
    row: usize,
    token: u32,
    logprob: f32,
    raw: f32,
) {
    // SAFETY: one value per row in each output that is given.
    unsafe {
        if p.tokens != 0 {
            (p.tokens as *mut u32).add(row).write(token);
        }
        if p.logprobs != 0 {
            (p.logprobs as *mut f32).add(row).write(logprob);
        }
        if p.raw_logprobs != 0 {
            (p.raw_logprobs as *mut f32).add(row).write(raw);
        }
    }
}

/// Places the cut (module documentation, steps 1 to 3): the rank from which on every column
/// survives top-k and top-p. `range` is the row's largest finite `z` minus its smallest.
///
/// # Safety
/// Every thread of the block, uniform control flow; the row as the contract gives it, the
/// cache filled.
#[inline(always)]
unsafe fn place_cut<E: Element, const PACK: usize>(
    src: &RowSource<E>,
    shared: &Shared,
    filters: &Filters,
    weights: Weights,
    range: f32,
) -> u64 {
    let bins = SAMPLING_BINS;
    let range = range.min(WEIGHT_RANGE);
    let scale = if range > 0.0 {
        bins as f32 / range
    } else {
        0.0
    };
    let bin_of =
        |value: f32| -> u32 { (((weights.max - weights.z(value)) * scale) as u32).min(bins - 1) };
    let b = thread_idx();
    // SAFETY: the histogram's bin `b`, one per thread; the control words.
    unsafe {
        shared.counts.add(b as usize).write(0);
        shared.masses.add(b as usize).write(0.0);
        if b == 0 {
            shared.set(control::LAST_BIN, 0);
            shared.set(control::LOW_BIN, bins);
            shared.set(control::GATHERED, 0);
        }
    }
    sync_threads();
    // Step 1: the histogram.
    // SAFETY: the row; the histogram's words, only atomically until the barrier.
    unsafe {
        src.visit::<PACK, 1>(false, |_, values, count| {
            for (i, &value) in values.iter().enumerate() {
                if i >= count {
                    continue;
                }
                if value > f32::NEG_INFINITY {
                    let bin = bin_of(value) as usize;
                    shared_fetch_add_u32(shared.counts.add(bin), 1);
                    shared_add_f32(shared.masses.add(bin), weights.of(value));
                }
            }
        })
    };
    sync_threads();
    // SAFETY: bin `b`, written before the barrier.
    let (count, mass) = unsafe {
        (
            shared.counts.add(b as usize).read(),
            shared.masses.add(b as usize).read(),
        )
    };
    // SAFETY: every thread, uniform control flow.
    let (before, mass_before, total, total_mass) =
        unsafe { block_exclusive_scan(count, mass, shared.scratch) };
    let top_k = filters.top_k != 0 && filters.top_k < total;
    let top_p = filters.top_p < 1.0;
    // SAFETY: control words, each written by the one thread whose bin matches, read after
    // the barrier.
    unsafe {
        if count > 0 {
            shared_max_u32(shared.at(control::LAST_BIN), b);
        }
        if top_k && before < filters.top_k && filters.top_k <= before + count {
            shared.set(control::TOP_K_BIN, b);
            shared.set(control::TOP_K_BEFORE, before);
            shared.set(control::TOP_K_IN, count);
            shared.set(control::TOP_K_MASS_BEFORE, mass_before.to_bits());
        }
    }
    sync_threads();
    if !top_k && !top_p {
        // A top-k of at least the row's finite columns keeps them all.
        return 0;
    }
    // SAFETY: written before the barrier.
    let (top_k_bin, mass_at_least) = unsafe {
        if top_k {
            (
                shared.word(control::TOP_K_BIN),
                f32::from_bits(shared.word(control::TOP_K_MASS_BEFORE)),
            )
        } else {
            (0, total_mass)
        }
    };
    // The top-p cut lies at or before the top-k cut's bin, at or after the bin where the
    // running weight reaches `top_p` of the least weight top-k can keep (without top-k, in
    // that bin).
    let low_target = filters.top_p * mass_at_least;
    if top_p && low_target > 0.0 && mass_before < low_target && low_target <= mass_before + mass {
        // SAFETY: a control word, lowered atomically.
        unsafe { shared_min_u32(shared.at(control::LOW_BIN), b) };
    }
    sync_threads();
    // SAFETY: written before the barrier.
    let (crossing, last_bin) = unsafe {
        (
            shared.word(control::LOW_BIN),
            shared.word(control::LAST_BIN),
        )
    };
    let crossing_bin = if !top_p {
        top_k_bin
    } else if low_target <= 0.0 {
        0
    } else if crossing == bins {
        // Rounding kept the running weight below the target: the last bin that counts.
        if top_k { top_k_bin } else { last_bin }
    } else if top_k {
        crossing.min(top_k_bin)
    } else {
        crossing
    };
    // The bins' weights are float sums in no fixed order, so the crossing may sit a bin from
    // the exact one: the range takes a bin more on either side (the exact sums below decide).
    let low_bin = if top_p {
        crossing_bin.saturating_sub(1)
    } else {
        crossing_bin
    };
    let high_bin = if top_k {
        top_k_bin
    } else {
        (crossing_bin + 1).min(last_bin)
    };
    // SAFETY: control words, each written by one thread, read after the barrier.
    unsafe {
        if b == low_bin {
            shared.set(control::LOW_BEFORE, before);
        }
        if b == high_bin {
            shared.set(control::HIGH_END, before + count);
        }
    }
    sync_threads();
    // SAFETY: written before the barrier.
    let (low_before, high_end) = unsafe {
        (
            shared.word(control::LOW_BEFORE),
            shared.word(control::HIGH_END),
        )
    };
    let candidates = high_end - low_before;
    if candidates > SAMPLING_CANDIDATES {
        // SAFETY: forwarded.
        return unsafe { bisect_cut::<E, PACK>(src, shared, filters, weights, top_k) };
    }
    // Step 2: gather the range's columns and sort them by rank, earliest first; sum the
    // weight before the range and the row's in a fixed order (each thread its columns, then
    // the block's tree), so that the cut does not depend on the order of the atomics.
    let mut masses = Tally::EMPTY;
    // SAFETY: the row; the gathered count and the candidates, written atomically (slots
    // below the count the histogram gave).
    unsafe {
        src.visit::<PACK, 1>(false, |first, values, count| {
            for (i, &value) in values.iter().enumerate() {
                if i >= count {
                    continue;
                }
                if value > f32::NEG_INFINITY {
                    let bin = bin_of(value);
                    let w = weights.of(value);
                    masses.mass += w;
                    if bin < low_bin {
                        masses.count += w;
                    }
                    if bin >= low_bin && bin <= high_bin {
                        let slot = shared_fetch_add_u32(shared.at(control::GATHERED), 1);
                        if slot < SAMPLING_CANDIDATES {
                            shared
                                .candidates
                                .add(slot as usize)
                                .write(rank(value, (first + i) as u32));
                        }
                    }
                }
            }
        })
    };
    // SAFETY: every thread, uniform control flow (its barriers also order the gathering).
    let masses = unsafe { block_reduce(masses, shared.scratch) };
    // The tally's count carried the weight before the range.
    let (low_mass_before, row_mass) = (masses.count, masses.mass);
    let n = candidates as usize;
    let sorted = n.next_power_of_two().max(1);
    let threads = block_dim() as usize;
    let mut i = thread_idx() as usize + n;
    while i < sorted {
        // SAFETY: a candidate slot; padding ranks below every column's.
        unsafe { shared.candidates.add(i).write(0) };
        i += threads;
    }
    sync_threads();
    // SAFETY: the candidates, `sorted` of them, every thread of the block (`SAMPLING_THREADS`,
    // a multiple of `WARP_SIZE`).
    unsafe { bitonic_sort_descending(shared.candidates, sorted) };
    // The running weight of the sorted candidates: this thread's run of `per` of them.
    let per = sorted.div_ceil(threads);
    let start = thread_idx() as usize * per;
    let mut run_mass = 0.0;
    for k in 0..PER_THREAD {
        let j = start + k;
        if k >= per || j >= n {
            continue;
        }
        // SAFETY: a sorted candidate.
        run_mass += weights.of(value_of_rank(unsafe { shared.candidates.add(j).read() }));
    }
    // SAFETY: every thread, uniform control flow.
    let (_, run_before, _, _) = unsafe { block_exclusive_scan(0, run_mass, shared.scratch) };
    let top_k_place = if top_k {
        (filters.top_k - low_before) as usize
    } else {
        n
    };
    // The cumulative weight through each of this thread's candidates, from what came before
    // them: `visit(j, weight through j)`.
    let base = low_mass_before + run_before;
    #[inline(always)]
    fn walk(
        (candidates, start, per, n): (*const u64, usize, usize, usize),
        weights: Weights,
        base: f32,
        mut visit: impl FnMut(usize, f32),
    ) {
        let mut running = base;
        for k in 0..PER_THREAD {
            let j = start + k;
            if k >= per || j >= n {
                continue;
            }
            // SAFETY: a sorted candidate (the caller's).
            running += weights.of(value_of_rank(unsafe { candidates.add(j).read() }));
            visit(j, running);
        }
    }
    let run = (shared.candidates.cast_const(), start, per, n);
    if thread_idx() == 0 {
        // SAFETY: a control word, read after the barrier.
        unsafe { shared.set(control::TOP_P_PLACE, top_k_place as u32) };
    }
    walk(run, weights, base, |j, running| {
        if j + 1 == top_k_place {
            // SAFETY: a control word, read after the barrier.
            unsafe { shared.set(control::TOP_K_MASS, running.to_bits()) };
        }
    });
    sync_threads();
    let place = if top_p {
        // SAFETY: written before the barrier.
        let kept = if top_k {
            f32::from_bits(unsafe { shared.word(control::TOP_K_MASS) })
        } else {
            row_mass
        };
        let target = filters.top_p * kept;
        walk(run, weights, base, |j, running| {
            if j < top_k_place && running >= target {
                // SAFETY: a control word, lowered atomically.
                unsafe { shared_min_u32(shared.at(control::TOP_P_PLACE), (j + 1) as u32) };
            }
        });
        sync_threads();
        // SAFETY: written before the barrier.
        unsafe { shared.word(control::TOP_P_PLACE) as usize }
    } else {
        top_k_place
    };
    // SAFETY: a sorted candidate (`1 ≤ place ≤ n`).
    let cut = unsafe { shared.candidates.add(place - 1).read() };
    // Nobody may reuse the candidates or control words before every thread read them.
    sync_threads();
    cut
}

/// Sorts `len` (a power of two) ranks at `keys` in shared memory, largest first: a bitonic
/// network, where thread `i` of a step compares pairs `i`, `i + threads`, …. In a step of
/// stride at most a warp's width, a warp's pairs lie in runs of `2 · WARP_SIZE` keys that only
/// it touches, in every such step alike, so two such steps in a row need only the warp's
/// barrier.
///
/// # Safety
/// Every thread of the block, uniform control flow, a multiple of `WARP_SIZE` threads; `keys`
/// holds `len` ranks in shared memory that nothing else touches meanwhile.
#[inline(always)]
pub(super) unsafe fn bitonic_sort_descending(keys: *mut u64, len: usize) {
    let threads = block_dim() as usize;
    let warp_local = |stride: usize| stride <= WARP_SIZE as usize;
    let mut size = 2;
    while size <= len {
        let mut stride = size / 2;
        while stride > 0 {
            let mut i = thread_idx() as usize;
            while i < len / 2 {
                let low = 2 * stride * (i / stride) + i % stride;
                let high = low + stride;
                let descending = low & size == 0;
                // SAFETY: `low < high < len`; each pair belongs to one thread in this step.
                unsafe {
                    let (a, b) = (keys.add(low).read(), keys.add(high).read());
                    if (a < b) == descending && a != b {
                        keys.add(low).write(b);
                        keys.add(high).write(a);
                    }
                }
                i += threads;
            }
            // The next step's stride: half this one, or the next size's first.
            let next = if stride > 1 { stride / 2 } else { size };
            let last = stride == 1 && size == len;
            if !last && warp_local(stride) && warp_local(next) {
                sync_warp();
            } else {
                sync_threads();
            }
            stride /= 2;
        }
        size *= 2;
    }
}

/// The count and weight of the row's finite columns of rank at least `at_least`.
///
/// # Safety
/// Every thread of the block, uniform control flow; the row, the cache filled.
#[inline(always)]
unsafe fn tally_from<E: Element, const PACK: usize>(
    src: &RowSource<E>,
    shared: &Shared,
    weights: Weights,
    at_least: u64,
) -> Tally {
    let mut tally = Tally::EMPTY;
    // SAFETY: forwarded.
    unsafe {
        src.visit::<PACK, 1>(false, |first, values, count| {
            for (i, &value) in values.iter().enumerate() {
                if i >= count {
                    continue;
                }
                if value > f32::NEG_INFINITY && rank(value, (first + i) as u32) >= at_least {
                    tally.count += 1.0;
                    tally.mass += weights.of(value);
                }
            }
        });
        block_reduce(tally, shared.scratch)
    }
}

/// The largest rank `τ ≥ low` whose columns from `τ` on pass `enough`, by bisection (a pass
/// per step).
///
/// # Safety
/// As [`tally_from`].
#[inline(always)]
unsafe fn bisect<E: Element, const PACK: usize>(
    src: &RowSource<E>,
    shared: &Shared,
    weights: Weights,
    mut low: u64,
    enough: impl Fn(Tally) -> bool,
) -> u64 {
    let mut high = u64::MAX;
    while low < high {
        let middle = low + (high - low) / 2 + 1;
        // SAFETY: forwarded.
        if enough(unsafe { tally_from::<E, PACK>(src, shared, weights, middle) }) {
            low = middle;
        } else {
            high = middle - 1;
        }
    }
    low
}

/// The cut by bisection over ranks (step 3 of the module's documentation), for rows whose
/// histogram leaves too many candidates.
///
/// # Safety
/// As [`tally_from`].
#[inline(always)]
unsafe fn bisect_cut<E: Element, const PACK: usize>(
    src: &RowSource<E>,
    shared: &Shared,
    filters: &Filters,
    weights: Weights,
    top_k: bool,
) -> u64 {
    // SAFETY: forwarded.
    unsafe {
        let k_cut = if top_k {
            let k = filters.top_k as f32;
            bisect::<E, PACK>(src, shared, weights, 0, |t| t.count >= k)
        } else {
            0
        };
        if filters.top_p >= 1.0 {
            return k_cut;
        }
        let kept = tally_from::<E, PACK>(src, shared, weights, k_cut).mass;
        let target = filters.top_p * kept;
        bisect::<E, PACK>(src, shared, weights, k_cut, |t| t.mass >= target)
    }
}

/// Writes each row's outputs from its `slices` draws (each a slice of the row, temperature
/// alone, or a shard of it): the best score's token (the lower token among equals), its
/// log-probability under the merged statistics (filtered and unfiltered are one; 0 filtered
/// for a greedy row), or `NO_TOKEN` and NaN where no slice has a token or one is broken (a NaN
/// score: NaN or `+inf` logits, or invalid filters). A warp per row, any grid
/// of whole warps: its lanes read the row's draws at once and merge them by shuffles, so a row
/// of many slices waits for one round of loads, not one per slice. Where `advance`, the
/// first thread also advances the random offset.
///
/// # Safety
/// The contract of [`SamplingParams`] for `draws` (read), the per-row arrays, and the
/// outputs; blocks of whole warps.
#[inline(always)]
pub(crate) unsafe fn sample_merge(p: &SamplingParams) {
    if p.advance != 0 && block_idx() == 0 && thread_idx() == 0 {
        // SAFETY: the random state (contract); the slices that read it have finished.
        unsafe { sample_advance(p) };
    }
    let slices = p.slices.max(1) as usize;
    let lane = thread_idx() % WARP_SIZE;
    let warps = (grid_dim() * block_dim() / WARP_SIZE) as usize;
    // Every lane of a warp has the same row: the loop and the shuffles are warp-uniform.
    let mut row = ((block_idx() * block_dim() + thread_idx()) / WARP_SIZE) as usize;
    while row < p.rows as usize {
        // SAFETY: `row < rows`; the row's draws (contract).
        let (filters, draws) = unsafe {
            (
                Filters::of(p, row),
                (p.draws as *const ShardDraw).add(row * slices),
            )
        };
        let mut best = Best::EMPTY;
        let mut logit = f32::NAN;
        let mut stats = OnlineStats::EMPTY;
        let mut broken = false;
        let mut s = lane as usize;
        while s < slices {
            // SAFETY: draw `s` of the row.
            let draw = unsafe { draws.add(s).read() };
            broken |= draw.score.is_nan();
            stats = stats.merge::<DeviceExp2>(OnlineStats::new(draw.row.max, draw.row.sum));
            let before = best.col;
            best.offer(draw.score, draw.token);
            if best.col != before {
                logit = draw.logit;
            }
            s += WARP_SIZE as usize;
        }
        let stats = group_reduce::<OnlineStats, WARP_SIZE>(stats);
        let mine = best.col;
        let best = group_reduce::<Best, WARP_SIZE>(best);
        let broken = warp_ballot(broken) != 0;
        // The draws' tokens are distinct columns: the lane whose best is the row's holds its
        // logit (any lane where no draw offered one: then it is not read).
        let owner = warp_ballot(mine == best.col)
            .trailing_zeros()
            .min(WARP_SIZE - 1);
        let logit = f32::from_bits(shfl_idx_u32(logit.to_bits(), owner));
        if lane == 0 {
            let (token, raw) = if broken || best.col == u32::MAX {
                (NO_TOKEN, f32::NAN)
            } else {
                (best.col, (logit - stats.max) - ln(stats.sum()))
            };
            let filtered = if filters.greedy && token != NO_TOKEN {
                0.0
            } else {
                raw
            };
            // SAFETY: the outputs of row `row < rows` (contract).
            unsafe { write_outputs(p, row, token, filtered, raw) };
        }
        row += warps;
    }
}

/// Adds 1 to the random offset, after every row of the call has read it. One thread.
///
/// # Safety
/// The contract of [`SamplingParams`] for `random`.
#[inline(always)]
pub(crate) unsafe fn sample_advance(p: &SamplingParams) {
    // SAFETY: the offset is the second word of the random state (contract).
    unsafe {
        let offset = (p.random as *mut u64).add(1);
        offset.write(offset.read().wrapping_add(1));
    }
}

/// The sampling entries of one element type: the row kernel (16-byte packs where the rows
/// are aligned for them), its draw-only form, the merge of sliced rows, and the advance (the
/// candidate path's are in `sampling_top_k`).
macro_rules! sampling_entries {
    ($($module:literal: $element:ty, $name:literal, $pack:literal;)+) => {$(
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(sample $name),
            (params: SamplingParams) => sample_row::<$element, $pack, true>(&params)
        );
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(sample_draw $name),
            (params: SamplingParams) => sample_row::<$element, $pack, false>(&params)
        );
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(sample_merge $name),
            (params: SamplingParams) => sample_merge(&params)
        );
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(sample_advance $name),
            (params: SamplingParams) => sample_advance(&params)
        );
    )+};
}

super::with_operation_types!(sampling_entries);
