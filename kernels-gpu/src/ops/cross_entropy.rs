//! Cross-entropy of logits against one target per row, forward and backward fused: a block
//! per row, or a thread-block cluster of blocks each holding a slice of it, reads the row
//! once for its statistics (the softmax maximum and sum of the softcapped logits, the
//! target's logit, the weighted sum label smoothing needs), writes the row's loss and
//! log-sum-exp, then writes the gradient of the loss with respect to the logits (in place
//! over them, if asked), from the row kept in shared memory where it fits, else read again.
//! A shard of the vocabulary writes its statistics instead (`cross_entropy_mode::STATES`), or
//! reads every shard's and writes its slice of the gradient (`FROM_STATES`). Two one-block launches go with it: a prologue that sums the
//! weights of the rows' targets (the mean's divisor) and the class weights, and an epilogue
//! that reduces the rows' losses.
//!
//! With `z = c · tanh(x / c)` (or `z = x`), `lse = ln Σ e^z`, `p = e^(z − lse)`, label
//! smoothing `ε`, z-loss scale `λ`, class weights `w` (1 without), `W = Σ w` and `V` the
//! vocabulary: a row's loss is `(1 − ε)·w[t]·(lse − z[t]) + (ε/V)·(W·lse − Σ w·z) + λ·lse²`,
//! and its gradient `g · (p·((1 − ε)·w[t] + ε·W/V + 2λ·lse) − (1 − ε)·w[t]·[c = t] −
//! ε·w[c]/V) · (1 − (z/c)²)`, `g` the upstream gradient (over the mean's divisor for a
//! mean). An ignored row has loss 0 and gradient 0; a target outside the vocabulary gives
//! NaN for both.

use crate::launch::cross_entropy::{CrossEntropyParams, CrossEntropyState, cross_entropy_mode};
use crate::launch::ops::DType;
use crate::launch::ops::RowState;
use crate::launch::{CLUSTER_STATS_FLOATS, REDUCTION_SCRATCH_FLOATS};
use crate::primitives::device::{
    DeviceExp2, block_dim, block_idx, dynamic_shared_f32, exp2_approx, fused_multiply_add,
    log2_approx, thread_idx,
};
use crate::primitives::element::{Bf16, Element, F16, cached_words, copy_words, store_as};
use crate::primitives::memory::{
    ReadOncePolicy, commit_async_copies, copy_async_16, wait_async_copies,
};
use crate::primitives::online::{CompensatedSum, Exp2, LOG2_E, OnlineStats};
use crate::primitives::reduce::{Partial, block_reduce, two_sums};
use crate::primitives::row_exchange::leave_row_cluster;
#[cfg(not(kernels_sm80))]
use crate::primitives::row_exchange::row_is_cluster;

/// `tanh(y)`: a short series near 0, where `1 − 2/(e^2y + 1)` would cancel, else that. Out
/// of line: only softcapped calls take it, and inlined into every pack it would double the
/// entries' code.
#[inline(never)]
fn tanh(y: f32) -> f32 {
    let a = y.abs();
    if a < 0.125 {
        let y2 = y * y;
        y * (1.0 + y2 * (-1.0 / 3.0 + y2 * (2.0 / 15.0 + y2 * (-17.0 / 315.0))))
    } else {
        let e = exp2_approx(2.0 * a * LOG2_E);
        let t = 1.0 - 2.0 / (e + 1.0);
        if y < 0.0 { -t } else { t }
    }
}

// The four floats a block publishes to its cluster fit the room every clustered block keeps.
const _: () = assert!(CLUSTER_STATS_FLOATS >= 4);
// The cache after the scratch and the published floats starts on a 16-byte boundary (the
// asynchronous copies' and the packs' alignment).
const _: () = assert!((REDUCTION_SCRATCH_FLOATS + CLUSTER_STATS_FLOATS) % 4 == 0);

/// Packs a thread loads before it uses the first.
const LOADS_IN_FLIGHT: usize = 2;

two_sums! {
    /// Two plain sums carried through one block reduction: the target's logit (held by one
    /// thread, 0 in the others) and the weighted sum of the logits.
    struct Sums { target, smoothing }
}

/// What a row's target says: the target's column in this shard (if it falls there), whether
/// the row is ignored, whether the target is outside the vocabulary.
#[derive(Clone, Copy)]
pub(super) struct Target {
    pub(super) global: i64,
    pub(super) ignored: bool,
    pub(super) invalid: bool,
}

impl Target {
    /// # Safety
    /// `row < p.rows`, and the targets buffer holds `p.rows` integers of `p.target_bytes`.
    #[inline(always)]
    pub(super) unsafe fn of(p: &CrossEntropyParams, row: usize) -> Self {
        // SAFETY: forwarded.
        let global = unsafe {
            if p.target_bytes == 8 {
                (p.targets as *const i64).add(row).read()
            } else {
                i64::from((p.targets as *const i32).add(row).read())
            }
        };
        let ignored = p.has_ignore_index != 0 && global == p.ignore_index;
        Target {
            global,
            ignored,
            invalid: !ignored && (global < 0 || global as u64 >= p.vocab),
        }
    }

    /// The weight of the row's class: 0 where the row is ignored or its target lies outside
    /// the vocabulary, 1 without class weights.
    ///
    /// # Safety
    /// The contract of [`CrossEntropyParams`] for `weight`.
    #[inline(always)]
    pub(super) unsafe fn weight(&self, p: &CrossEntropyParams) -> f32 {
        match (p.weight == 0, self.ignored || self.invalid) {
            (_, true) => 0.0,
            (true, false) => 1.0,
            // SAFETY: a target inside the vocabulary indexes the weights.
            (false, false) => unsafe { (p.weight as *const f32).add(self.global as usize).read() },
        }
    }

    /// What row `row`'s gradient is multiplied by: the upstream gradient, over the mean's
    /// divisor for a mean; NaN where the target lies outside the vocabulary.
    ///
    /// # Safety
    /// The contract of [`CrossEntropyParams`] for `upstream` and `totals`; `row < rows`.
    #[inline(always)]
    pub(super) unsafe fn gradient_scale(&self, p: &CrossEntropyParams, row: usize) -> f32 {
        let upstream = if p.upstream == 0 {
            p.upstream_value
        } else {
            let index = if p.upstream_per_row != 0 { row } else { 0 };
            // SAFETY: one value, or one per row.
            unsafe { (p.upstream as *const f32).add(index).read() }
        };
        let scale = if p.mean != 0 {
            // SAFETY: forwarded.
            upstream / unsafe { totals(p) }.0
        } else {
            upstream
        };
        if self.invalid { f32::NAN } else { scale }
    }

    /// The target's column in this shard, if it lies there.
    #[inline(always)]
    pub(super) fn local(&self, p: &CrossEntropyParams) -> Option<usize> {
        let local = self.global - p.column_offset as i64;
        (!self.ignored && local >= 0 && (local as u64) < u64::from(p.cols))
            .then_some(local as usize)
    }
}

/// `ln Σ e^x` of a row from its statistics.
#[inline(always)]
pub(super) fn log_sum_exp(stats: OnlineStats) -> f32 {
    OnlineStats::exponent_origin(stats.max) + log2_approx(stats.sum()) * core::f32::consts::LN_2
}

/// The mean's divisor and the class weights' sum: the prologue's, or without it the rows and
/// the vocabulary.
///
/// # Safety
/// The contract of [`CrossEntropyParams`] for `totals`.
#[inline(always)]
unsafe fn totals(p: &CrossEntropyParams) -> (f32, f32) {
    if p.totals == 0 {
        (p.rows as f32, p.vocab as f32)
    } else {
        // SAFETY: `totals` holds the divisor and the weights' sum (contract).
        unsafe {
            (
                (p.totals as *const f32).read(),
                (p.totals as *const f32).add(1).read(),
            )
        }
    }
}

/// What a row's elementwise math needs before its statistics are known: the target's column
/// in this shard, the label smoothing and class weights, the softcap.
#[derive(Clone, Copy)]
struct Terms {
    local_target: Option<usize>,
    smoothing: bool,
    /// The class weights from this shard's first column (read only where `p.weight` is not 0).
    weight: *const f32,
    softcap: f32,
    inv_softcap: f32,
}

impl Terms {
    #[inline(always)]
    fn new(p: &CrossEntropyParams, target: &Target) -> Self {
        let weight = p.weight as *const f32;
        Terms {
            local_target: target.local(p),
            smoothing: p.label_smoothing != 0.0,
            weight: weight.wrapping_add(p.column_offset as usize),
            softcap: p.softcap,
            inv_softcap: if p.softcap > 0.0 {
                1.0 / p.softcap
            } else {
                0.0
            },
        }
    }

    /// The softcapped logit (the raw one where `GENERAL` is false: the packed passes, which
    /// softcapped calls do not take).
    #[inline(always)]
    fn z<const GENERAL: bool>(&self, raw: f32) -> f32 {
        if GENERAL && self.softcap > 0.0 {
            self.softcap * tanh(raw * self.inv_softcap)
        } else {
            raw
        }
    }

    /// The weight of column `col` (1 without weights).
    #[inline(always)]
    fn class_weight(&self, p: &CrossEntropyParams, col: usize) -> f32 {
        if p.weight == 0 {
            1.0
        } else {
            // SAFETY: the weights hold the whole vocabulary, this shard's columns among them.
            unsafe { self.weight.add(col).read() }
        }
    }

    /// Adds column `col`'s softcapped logit `z` to the target's and the smoothing's sums.
    #[inline(always)]
    fn visit(&self, p: &CrossEntropyParams, sums: &mut Sums, z: f32, col: usize) {
        if self.smoothing {
            sums.smoothing += self.class_weight(p, col) * z;
        }
        if self.local_target == Some(col) {
            sums.target = z;
        }
    }
}

/// A row's gradient once its log-sum-exp is known (see the module's documentation).
#[derive(Clone, Copy)]
struct Gradient {
    terms: Terms,
    lse: f32,
    /// The target's softcapped logit (where the target is in this shard).
    target_logit: f32,
    /// What the probability is multiplied by.
    p_factor: f32,
    /// Taken off at the target's column.
    onehot: f32,
    /// Taken off every column, times its class weight (label smoothing; 0 without).
    smoothing_per_class: f32,
    /// The upstream gradient (over the mean's divisor); NaN for a target out of range.
    scale: f32,
    /// `scale · p_factor` and `scale · smoothing_per_class`: the packed passes' gradient is
    /// one multiply-add of the probability.
    scaled_p_factor: f32,
    scaled_smoothing: f32,
    /// The row's gradient is 0.
    ignored: bool,
}

impl Gradient {
    /// The gradient at column `col` of a row not ignored, but for the target's one-hot term:
    /// the value at every column but the target's, whose raw logit is `raw`. Where `GENERAL`
    /// is false (the packed passes, which calls with a softcap or with both class weights and
    /// label smoothing do not take), without a branch.
    #[inline(always)]
    fn off_target<const GENERAL: bool>(&self, p: &CrossEntropyParams, raw: f32, col: usize) -> f32 {
        let z = self.terms.z::<GENERAL>(raw);
        self.of_logit::<GENERAL>(p, z, col, 0.0)
    }

    /// The gradient at the target's column `col`.
    #[inline(always)]
    fn at_target(&self, p: &CrossEntropyParams, col: usize) -> f32 {
        self.of_logit::<true>(p, self.target_logit, col, self.onehot)
    }

    /// The gradient at column `col` of a row not ignored, from its softcapped logit `z`, with
    /// `onehot` taken off.
    #[inline(always)]
    fn of_logit<const GENERAL: bool>(
        &self,
        p: &CrossEntropyParams,
        z: f32,
        col: usize,
        onehot: f32,
    ) -> f32 {
        let terms = &self.terms;
        // The difference first: it is exact where `z` and `lse` are close, whatever their size.
        let probability = exp2_approx((z - self.lse) * LOG2_E);
        if !GENERAL {
            return fused_multiply_add(probability, self.scaled_p_factor, -self.scaled_smoothing);
        }
        let mut dz = probability * self.p_factor - onehot;
        if terms.smoothing {
            dz -= self.smoothing_per_class * terms.class_weight(p, col);
        }
        if terms.softcap > 0.0 {
            let t = z * terms.inv_softcap;
            dz *= 1.0 - t * t;
        }
        self.scale * dz
    }

    /// The gradient at any column `col`, whose raw logit is `raw`.
    #[inline(always)]
    fn at(&self, p: &CrossEntropyParams, raw: f32, col: usize) -> f32 {
        if self.ignored {
            0.0
        } else if self.terms.local_target == Some(col) {
            self.at_target(p, col)
        } else {
            self.off_target::<true>(p, raw, col)
        }
    }
}

/// Adds a batch of [`LOADS_IN_FLIGHT`] packs to the statistics and, where `smoothing`, the
/// (unweighted) smoothing's sum: those where `holds` is true hold columns, the others `-inf`
/// words.
#[inline(always)]
fn push_packs<E: Element, const PACK: usize>(
    words: &[[u32; PACK]; LOADS_IN_FLIGHT],
    holds: [bool; LOADS_IN_FLIGHT],
    smoothing: bool,
    stats: &mut OnlineStats,
    sums: &mut Sums,
) {
    // `-inf` packs leave the maximum as it is.
    let batch_max = words
        .iter()
        .fold(f32::NEG_INFINITY, |max, pack| max.max(E::pack_max(pack)));
    for (k, pack_words) in words.iter().enumerate() {
        if smoothing && holds[k] {
            for i in 0..PACK {
                // Unweighted: the packed passes' calls.
                sums.smoothing += E::widen(pack_words, i);
            }
        }
    }
    stats.push_batch::<DeviceExp2>(batch_max, LOADS_IN_FLIGHT * PACK, |i| {
        E::widen(&words[i / PACK], i % PACK)
    });
}

/// The statistics pass over packs `first..end` of a row at `x` (pack `k` holds columns
/// `k·PACK..(k + 1)·PACK`) of a call without softcap or weighted label smoothing, this
/// thread's every `block_dim`-th, the row read from global memory again by the gradient pass:
/// [`LOADS_IN_FLIGHT`] loads issued before the first is used. The statistics and (where
/// `smoothing`) the unweighted smoothing's sum; not the target's logit, which one thread
/// reads on its own.
///
/// # Safety
/// The packs lie in the row, which starts on a 16-byte boundary.
#[inline(always)]
unsafe fn stats_of_packs<E: Element, const PACK: usize>(
    x: *const E,
    (first, end): (usize, usize),
    smoothing: bool,
    stats: &mut OnlineStats,
    sums: &mut Sums,
) {
    let threads = block_dim() as usize;
    let mut batch = first + thread_idx() as usize;
    while batch < end {
        let mut words = [[E::NEG_INF_WORD; PACK]; LOADS_IN_FLIGHT];
        let mut holds = [false; LOADS_IN_FLIGHT];
        for (k, pack_words) in words.iter_mut().enumerate() {
            let pack = batch + k * threads;
            if pack < end {
                // SAFETY: the pack lies in the row (contract).
                *pack_words = unsafe { E::load_packed::<PACK>(x.add(pack * PACK)) };
                holds[k] = true;
            }
        }
        push_packs::<E, PACK>(&words, holds, smoothing, stats, sums);
        batch += LOADS_IN_FLIGHT * threads;
    }
}

/// Groups of copies in which a thread starts its share of a kept slice: it computes on the
/// first group while the later ones are still in flight.
const COPY_GROUPS: usize = 4;

/// As [`stats_of_packs`], for a slice kept in shared memory, pack `k` at
/// `cache + (k − first)·PACK`: each thread starts copying all its packs at once (in
/// [`COPY_GROUPS`] groups, without passing through registers, so that the whole slice is in
/// flight), takes the maximum of its packs as each group lands (on packed pairs for 16-bit
/// data), then sums their exponentials relative to it from the cache: no rescaling, one
/// exponential per element. A thread reads only the packs it copied, which the gradient pass
/// reads (and in place overwrites) again.
///
/// # Safety
/// As [`stats_of_packs`]; `cache` holds `(end − first)·PACK` elements of shared memory,
/// 16-byte aligned, and the packs are 16 bytes.
#[inline(always)]
unsafe fn stats_of_kept_packs<E: Element, const PACK: usize>(
    x: *const E,
    (first, end): (usize, usize),
    cache: *mut E,
    smoothing: bool,
    stats: &mut OnlineStats,
    sums: &mut Sums,
) {
    let threads = block_dim() as usize;
    let thread = thread_idx() as usize;
    let count = end - first;
    let mine = if thread < count {
        (count - thread).div_ceil(threads)
    } else {
        0
    };
    let per_group = mine.div_ceil(COPY_GROUPS);
    // Each copy is one 16-byte pack.
    const { assert!(PACK * size_of::<E>() == 16) };
    // This thread's `j`-th pack in the cache.
    let kept = |j: usize| cache.wrapping_add((thread + j * threads) * PACK);
    let policy = ReadOncePolicy::evict_first();
    for group in 0..COPY_GROUPS {
        for j in group * per_group..((group + 1) * per_group).min(mine) {
            // SAFETY: a 16-byte pack of the row (contract) and its place in the cache, which
            // only this thread touches until the gradient pass; the row is not written before
            // then (in place, this thread writes this pack's gradient after the copy landed).
            unsafe {
                copy_async_16(
                    kept(j).cast(),
                    x.add((first + thread + j * threads) * PACK).cast(),
                    policy,
                )
            };
        }
        commit_async_copies();
    }
    const _: () = assert!(COPY_GROUPS == 4);
    // `-inf` where this thread has no pack, which leaves the maximum to the other threads.
    let mut max = f32::NEG_INFINITY;
    for group in 0..COPY_GROUPS {
        match group {
            0 => wait_async_copies::<3>(),
            1 => wait_async_copies::<2>(),
            2 => wait_async_copies::<1>(),
            _ => wait_async_copies::<0>(),
        }
        for j in group * per_group..((group + 1) * per_group).min(mine) {
            // SAFETY: a pack this thread copied, in a group that has landed.
            max = max.max(E::pack_max(&unsafe { cached_words::<E, PACK>(kept(j)) }));
        }
    }
    // SAFETY: this thread's `mine` packs, landed.
    let sum = unsafe {
        if smoothing {
            kept_sum::<E, PACK, true>(kept, mine, max, sums)
        } else {
            kept_sum::<E, PACK, false>(kept, mine, max, sums)
        }
    };
    // Only `-inf` (or nothing) seen: the sum is 0 whatever `max` is.
    *stats = stats.merge::<DeviceExp2>(OnlineStats { max, sum });
}

/// The sum of `e^(x − max)` over the `mine` packs at `kept(0..mine)` in shared memory (and,
/// where `SMOOTHING`, their unweighted sum added to `sums.smoothing`): the second half of
/// [`stats_of_kept_packs`], one loop for each `SMOOTHING` so that the loop without smoothing
/// computes nothing for it.
///
/// # Safety
/// `kept(j)` for `j < mine` is a pack of this block's shared memory, 16-byte aligned, that
/// this thread's copies filled and that have landed.
#[inline(always)]
unsafe fn kept_sum<E: Element, const PACK: usize, const SMOOTHING: bool>(
    kept: impl Fn(usize) -> *mut E,
    mine: usize,
    max: f32,
    sums: &mut Sums,
) -> CompensatedSum {
    let origin = OnlineStats::exponent_origin(max);
    let mut sum = CompensatedSum::ZERO;
    // A 32-bit count: a thread holds far fewer packs.
    for j in 0..mine as u32 {
        // SAFETY: forwarded.
        let words = unsafe { cached_words::<E, PACK>(kept(j as usize)) };
        let mut pack_sum = 0.0;
        for i in 0..PACK {
            let value = E::widen(&words, i);
            pack_sum += DeviceExp2::exp2((value - origin) * LOG2_E);
            if SMOOTHING {
                // Unweighted: the packed passes' calls.
                sums.smoothing += value;
            }
        }
        sum.add(pack_sum);
    }
    sum
}

/// The gradient pass over the packs the statistics pass visited: read from `cache` when given
/// (where [`stats_of_kept_packs`] kept them), else from the row again (after
/// [`stats_of_packs`]), written to the gradient row at `y` (of element type `dtype`); the
/// target's column without its one-hot term, which the thread that wrote it writes again
/// after.
///
/// # Safety
/// After that pass, with the same packs and cache (each thread's copies landed), the contract
/// of [`stats_of_packs`] or [`stats_of_kept_packs`]; the gradient row holds the row's columns,
/// aligned as the logits.
#[inline(always)]
unsafe fn gradient_of_packs<E: Element, const PACK: usize>(
    p: &CrossEntropyParams,
    x: *const E,
    gradient: &Gradient,
    span: (usize, usize),
    cache: Option<*mut E>,
    (y, dtype): (u64, u32),
) {
    // One test of the gradient's type for the pass, not one a pack.
    // SAFETY (each): forwarded, the gradient row taken as elements of its type.
    unsafe {
        if dtype == DType::Bf16 as u32 {
            gradient_of_packs_as::<E, Bf16, PACK>(p, x, gradient, span, cache, y as *mut Bf16)
        } else if dtype == DType::F16 as u32 {
            gradient_of_packs_as::<E, F16, PACK>(p, x, gradient, span, cache, y as *mut F16)
        } else {
            gradient_of_packs_as::<E, f32, PACK>(p, x, gradient, span, cache, y as *mut f32)
        }
    }
}

/// [`gradient_of_packs`] into a gradient row `y` of `O`.
///
/// # Safety
/// As [`gradient_of_packs`].
#[inline(always)]
unsafe fn gradient_of_packs_as<E: Element, O: Element, const PACK: usize>(
    p: &CrossEntropyParams,
    x: *const E,
    gradient: &Gradient,
    (first, end): (usize, usize),
    cache: Option<*mut E>,
    y: *mut O,
) {
    let threads = block_dim() as usize;
    let mut batch = first + thread_idx() as usize;
    if gradient.ignored {
        while batch < end {
            // SAFETY: the gradient row holds the pack's columns (contract); in place, this
            // thread read them in the first pass.
            unsafe { O::store_f32(y.add(batch * PACK), [0.0f32; PACK]) };
            batch += threads;
        }
        return;
    }
    while batch < end {
        let mut words = [[0u32; PACK]; LOADS_IN_FLIGHT];
        for (k, pack_words) in words.iter_mut().enumerate() {
            let pack = batch + k * threads;
            if pack < end {
                // SAFETY: the pack this thread read (and kept) in the first pass.
                *pack_words = unsafe {
                    match cache {
                        Some(cache) => cached_words::<E, PACK>(cache.add((pack - first) * PACK)),
                        None => E::load_packed_last_use::<PACK>(x.add(pack * PACK)),
                    }
                };
            }
        }
        for (k, pack_words) in words.iter().enumerate() {
            let pack = batch + k * threads;
            if pack < end {
                let out: [f32; PACK] = core::array::from_fn(|i| {
                    gradient.off_target::<false>(p, E::widen(pack_words, i), pack * PACK + i)
                });
                // SAFETY: the gradient row holds the pack's columns (contract). In place, this
                // thread read them just above.
                unsafe { O::store_f32(y.add(pack * PACK), out) };
            }
        }
        batch += LOADS_IN_FLIGHT * threads;
    }
}

/// Publishes this block's statistics and sums in its shared memory at `published` (four
/// floats), and returns the row's, merged over the `slices` blocks of its thread-block
/// cluster, to every thread (as [`exchange_cluster_stats`] does for statistics alone; the
/// caller then calls [`leave_row_cluster`]).
///
/// # Safety
/// That of [`exchange_cluster_stats`], with four floats at `published`.
///
/// [`exchange_cluster_stats`]: crate::primitives::row_exchange::exchange_cluster_stats
#[cfg(not(kernels_sm80))]
#[inline(always)]
unsafe fn exchange_in_cluster(
    stats: OnlineStats,
    sums: Sums,
    published: *mut f32,
    slices: u32,
) -> (OnlineStats, Sums) {
    use crate::launch::WARP_SIZE;
    use crate::primitives::device::{cluster_arrive, cluster_shared_of, cluster_wait};
    use crate::primitives::reduce::group_reduce;
    if thread_idx() == 0 {
        // SAFETY: the four floats are this block's (contract).
        unsafe {
            published.write(stats.max);
            published.add(1).write(stats.sum());
            published.add(2).write(sums.target);
            published.add(3).write(sums.smoothing);
        }
    }
    // Release then acquire: every block of the row has published once this thread passes.
    cluster_arrive();
    cluster_wait();
    let lane = thread_idx() % WARP_SIZE;
    let (theirs, their_sums) = if lane < slices {
        let theirs = cluster_shared_of(published, lane);
        // SAFETY: block `lane` of the cluster published there before the barrier, and its
        // shared memory stays allocated until this thread has arrived again.
        unsafe {
            (
                OnlineStats::new(theirs.read(), theirs.add(1).read()),
                Sums {
                    target: theirs.add(2).read(),
                    smoothing: theirs.add(3).read(),
                },
            )
        }
    } else {
        (OnlineStats::EMPTY, Sums::EMPTY)
    };
    let row = (
        group_reduce::<OnlineStats, WARP_SIZE>(theirs),
        group_reduce::<Sums, WARP_SIZE>(their_sums),
    );
    cluster_arrive();
    row
}

/// A row's statistics are known: in `STATES` mode the one thread that is `writer` writes the
/// shard's state, and nothing else is written; in `FROM_STATES` every shard's states are
/// merged first. Else `writer` writes the loss and the log-sum-exp. Returns the gradient's
/// constants (used where there is a gradient to write, never in `STATES` mode).
///
/// # Safety
/// The contract of [`CrossEntropyParams`]; `row < rows`.
#[inline(always)]
unsafe fn finish_row(
    p: &CrossEntropyParams,
    row: usize,
    target: &Target,
    terms: Terms,
    (stats, sums): (OnlineStats, Sums),
    writer: bool,
) -> Gradient {
    let (stats, sums) = match p.mode {
        cross_entropy_mode::STATES => {
            if writer {
                let state = CrossEntropyState {
                    row: RowState {
                        max: stats.max,
                        sum: stats.sum(),
                    },
                    target_logit: sums.target,
                    smoothing: if terms.smoothing { sums.smoothing } else { 0.0 },
                };
                // SAFETY: the states hold one per row.
                unsafe { (p.states as *mut CrossEntropyState).add(row).write(state) };
            }
            (stats, sums)
        }
        cross_entropy_mode::FROM_STATES => {
            let mut merged = OnlineStats::EMPTY;
            let mut total = Sums::EMPTY;
            for slot in 0..p.slots as usize {
                // SAFETY: `slots` runs of one state per row.
                let state = unsafe {
                    (p.states as *const CrossEntropyState)
                        .add(slot * p.rows as usize + row)
                        .read()
                };
                merged = merged.merge::<DeviceExp2>(OnlineStats::new(state.row.max, state.row.sum));
                total = total.merge(Sums {
                    target: state.target_logit,
                    smoothing: state.smoothing,
                });
            }
            (merged, total)
        }
        _ => (stats, sums),
    };

    let lse = log_sum_exp(stats);
    let vocab = p.vocab as f32;
    // SAFETY: forwarded.
    let (_, weight_sum) = unsafe { totals(p) };
    // SAFETY: forwarded.
    let target_weight = unsafe { target.weight(p) };
    let eps = p.label_smoothing;
    if writer && p.mode != cross_entropy_mode::STATES {
        let loss = if target.ignored {
            0.0
        } else if target.invalid {
            f32::NAN
        } else {
            let nll = lse - sums.target;
            let mut loss = (1.0 - eps) * target_weight * nll + p.z_loss * lse * lse;
            if terms.smoothing {
                loss += eps / vocab * (weight_sum * lse - sums.smoothing);
            }
            loss
        };
        // SAFETY: one f32 per row in each buffer given.
        unsafe {
            if p.losses != 0 {
                (p.losses as *mut f32).add(row).write(loss);
            }
            if p.lse != 0 {
                (p.lse as *mut f32).add(row).write(lse);
            }
        }
    }
    let smoothed = if terms.smoothing {
        eps * weight_sum / vocab
    } else {
        0.0
    };
    // SAFETY: forwarded.
    let scale = unsafe { target.gradient_scale(p, row) };
    let p_factor = (1.0 - eps) * target_weight + smoothed + 2.0 * p.z_loss * lse;
    let smoothing_per_class = if terms.smoothing { eps / vocab } else { 0.0 };
    Gradient {
        terms,
        lse,
        target_logit: sums.target,
        p_factor,
        onehot: (1.0 - eps) * target_weight,
        smoothing_per_class,
        scale,
        scaled_p_factor: scale * p_factor,
        scaled_smoothing: scale * smoothing_per_class,
        ignored: target.ignored,
    }
}

/// The cross-entropy of one row (see the module's documentation), cut into `slices` blocks
/// (`block_idx = row · slices + slice`), each a thread-block cluster's block where `slices`
/// is more than 1. Where `aligned`, a slice is an even share of the row's 16-byte packs, the
/// last slice also taking the row's last `cols % PACK` columns one at a time; else one slice
/// reads every column one at a time. Each block keeps what it reads in shared memory between
/// the two passes where `cached`, else reads it again (each thread reads its own columns in
/// both passes, so in place it reads each logit before it writes that column's gradient).
///
/// # Safety
/// The contract of [`CrossEntropyParams`].
#[inline(always)]
pub(crate) unsafe fn cross_entropy_row<E: Element, const PACK: usize>(p: &CrossEntropyParams) {
    let slices = p.slices.max(1) as usize;
    let row = block_idx() as usize / slices;
    let slice = block_idx() as usize % slices;
    let threads = block_dim() as usize;
    let cols = p.cols as usize;
    let elementwise_math = p.elementwise_math();
    let packs = if p.aligned == 0 {
        0
    } else if elementwise_math {
        // SAFETY: aborts the kernel (a launch the host never makes).
        unsafe { core::arch::nvptx::trap() }
    } else {
        cols / PACK
    };
    let share = packs.div_ceil(slices);
    let first = (slice * share).min(packs);
    let span = (first, (first + share).min(packs));
    let last_slice = slice == slices - 1;
    let scratch = dynamic_shared_f32();
    // SAFETY: the launch gives the scratch, the published floats, then the cache when
    // `cached` (the pointer is only formed otherwise, never used).
    let (published, cache) = unsafe {
        let published = scratch.add(REDUCTION_SCRATCH_FLOATS as usize);
        (
            published,
            published.add(CLUSTER_STATS_FLOATS as usize).cast::<E>(),
        )
    };
    let cache = (p.cached != 0).then_some(cache);
    // SAFETY: row `row` of the logits (contract).
    let x = unsafe { (p.logits as *const E).add(row * p.logits_stride as usize) };
    // SAFETY: `row < rows` (`slices` blocks per row).
    let target = unsafe { Target::of(p, row) };
    let terms = Terms::new(p, &target);

    let mut stats = OnlineStats::EMPTY;
    let mut sums = Sums::EMPTY;
    // SAFETY: this slice's packs lie in the row; the cache holds them (contract).
    unsafe {
        match cache {
            Some(cache) => stats_of_kept_packs::<E, PACK>(
                x,
                span,
                cache,
                terms.smoothing,
                &mut stats,
                &mut sums,
            ),
            None => stats_of_packs::<E, PACK>(x, span, terms.smoothing, &mut stats, &mut sums),
        }
    };
    // The target's column where one of this block's packs holds it: the thread that visits
    // that pack reads the target's logit, and writes its gradient again after its own pass.
    let packed_target = terms
        .local_target
        .filter(|&t| (span.0..span.1).contains(&(t / PACK)));
    let owned_target =
        packed_target.filter(|&t| (t / PACK - span.0) % threads == thread_idx() as usize);
    if let Some(t) = owned_target {
        // SAFETY: a column of the row, not yet overwritten (the gradient pass comes after).
        sums.target = unsafe { E::widen_all(&E::load_packed::<1>(x.add(t))) }[0];
    }
    // The columns after the packs (every column of a row read one at a time), kept after
    // the slice's packs: column `col` at `cache + col − first·PACK`.
    let tail = (packs * PACK + thread_idx() as usize..cols).step_by(threads);
    let kept = |col: usize| cache.map(|c| c.wrapping_add(col - first * PACK));
    if last_slice {
        for col in tail.clone() {
            // SAFETY: one column of the row; the cache holds the tail after the packs.
            let z = terms.z::<true>(unsafe {
                let words = E::load_packed::<1>(x.add(col));
                if let Some(at) = kept(col) {
                    copy_words::<E, 1>(at, &words);
                }
                E::widen_all(&words)[0]
            });
            terms.visit(p, &mut sums, z, col);
            stats.push::<DeviceExp2>(z);
        }
    }
    // SAFETY: every thread of the block, uniform control flow.
    let row_sums = unsafe { (block_reduce(stats, scratch), block_reduce(sums, scratch)) };
    // A row of several blocks must be one cluster of them (else the kernel stops there).
    #[cfg(not(kernels_sm80))]
    let clustered = slices > 1 && row_is_cluster(p.slices);
    #[cfg(kernels_sm80)]
    let clustered = false;
    if slices > 1 && !clustered {
        // SAFETY: aborts the kernel (a launch the host never makes).
        unsafe { core::arch::nvptx::trap() }
    }
    #[cfg(not(kernels_sm80))]
    let row_sums = if clustered {
        // SAFETY: the launch's clusters are the rows' slices, at most 16, each block with
        // four floats after its scratch (contract); `leave_row_cluster` below.
        unsafe { exchange_in_cluster(row_sums.0, row_sums.1, published, slices as u32) }
    } else {
        row_sums
    };
    #[cfg(kernels_sm80)]
    let _ = published;
    let writer = slice == 0 && thread_idx() == 0;
    // SAFETY: `row < rows`.
    let gradient = unsafe { finish_row(p, row, &target, terms, row_sums, writer) };
    if p.mode != cross_entropy_mode::STATES && p.gradient != 0 {
        let y = gradient_row(p, row);
        // SAFETY: as in the first pass; row `row` of the gradient (contract).
        unsafe {
            gradient_of_packs::<E, PACK>(p, x, &gradient, span, cache, (y, p.gradient_dtype))
        };
        if let Some(t) = owned_target {
            // SAFETY: the target's column of the gradient row, which this thread wrote last.
            unsafe { store_as::<1>(p.gradient_dtype, y, t, [gradient.at_target(p, t)]) };
        }
        if last_slice {
            for col in tail {
                // SAFETY: as above, for one column, from the cache where it was kept there.
                unsafe {
                    let words = match kept(col) {
                        Some(at) => cached_words::<E, 1>(at),
                        None => E::load_packed::<1>(x.add(col)),
                    };
                    let [raw] = E::widen_all(&words);
                    store_as::<1>(p.gradient_dtype, y, col, [gradient.at(p, raw, col)]);
                }
            }
        }
    }
    leave_row_cluster(clustered);
}

/// The address of row `row` of the gradient (0 where the call writes none).
#[inline(always)]
pub(super) fn gradient_row(p: &CrossEntropyParams, row: usize) -> u64 {
    if p.gradient == 0 {
        0
    } else {
        p.gradient + (row as u64 * p.gradient_stride) * u64::from(dtype_bytes(p.gradient_dtype))
    }
}

/// Bytes of an element of the `DType` numbered `dtype`.
#[inline(always)]
fn dtype_bytes(dtype: u32) -> u32 {
    if dtype == 0 { 4 } else { 2 }
}

/// The prologue: `totals[0]` = the weights of the targets of the rows not ignored (their
/// count without weights; NaN-free: out-of-range targets count nothing), `totals[1]` = the
/// weights of every class (`vocab` without weights). One block.
///
/// # Safety
/// The contract of [`CrossEntropyParams`] for `targets`, `weight` and `totals` (written).
#[inline(always)]
pub(crate) unsafe fn cross_entropy_totals(p: &CrossEntropyParams) {
    let scratch = dynamic_shared_f32();
    let threads = block_dim() as usize;
    let weight = p.weight as *const f32;
    let mut sums = Sums::EMPTY;
    let mut row = thread_idx() as usize;
    while row < p.rows as usize {
        // SAFETY: `row < rows`.
        let target = unsafe { Target::of(p, row) };
        if !target.ignored && !target.invalid {
            sums.target += if weight.is_null() {
                1.0
            } else {
                // SAFETY: a target inside the vocabulary indexes the weights.
                unsafe { weight.add(target.global as usize).read() }
            };
        }
        row += threads;
    }
    if weight.is_null() {
        sums.smoothing = if thread_idx() == 0 {
            p.vocab as f32
        } else {
            0.0
        };
    } else {
        let mut class = thread_idx() as usize;
        while class < p.vocab as usize {
            // SAFETY: the weights hold the whole vocabulary.
            sums.smoothing += unsafe { weight.add(class).read() };
            class += threads;
        }
    }
    // SAFETY: every thread of the block, uniform control flow.
    let totals = unsafe { block_reduce(sums, scratch) };
    if thread_idx() == 0 {
        // SAFETY: `totals` holds two f32.
        unsafe {
            (p.totals as *mut f32).write(totals.target);
            (p.totals as *mut f32).add(1).write(totals.smoothing);
        }
    }
}

/// The epilogue: the reduced loss, the sum of the rows' losses (over `totals[0]` for a
/// mean), into `reduced`. One block.
///
/// # Safety
/// The contract of [`CrossEntropyParams`] for `losses`, `totals` and `reduced` (written).
#[inline(always)]
pub(crate) unsafe fn cross_entropy_reduce(p: &CrossEntropyParams) {
    let scratch = dynamic_shared_f32();
    let threads = block_dim() as usize;
    let mut sums = Sums::EMPTY;
    let mut row = thread_idx() as usize;
    while row < p.rows as usize {
        // SAFETY: one loss per row.
        sums.target += unsafe { (p.losses as *const f32).add(row).read() };
        row += threads;
    }
    // SAFETY: every thread of the block, uniform control flow.
    let total = unsafe { block_reduce(sums, scratch) };
    if thread_idx() == 0 {
        let loss = if p.mean != 0 {
            // SAFETY: the prologue wrote the divisor.
            total.target / unsafe { (p.totals as *const f32).read() }
        } else {
            total.target
        };
        // SAFETY: one f32.
        unsafe { (p.reduced as *mut f32).write(loss) };
    }
}

/// The cross-entropy entries of one element type: the row kernel (16-byte packs where the
/// rows are aligned for them), the prologue and the epilogue, behind the module's cfg.
macro_rules! cross_entropy_entries {
    ($($module:literal: $element:ty, $name:literal, $pack:literal;)+) => {$(
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(cross_entropy $name),
            (params: CrossEntropyParams) => cross_entropy_row::<$element, $pack>(&params)
        );
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(cross_entropy_totals $name),
            (params: CrossEntropyParams) => cross_entropy_totals(&params)
        );
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(cross_entropy_reduce $name),
            (params: CrossEntropyParams) => cross_entropy_reduce(&params)
        );
    )+};
}

super::with_operation_types!(cross_entropy_entries);
