//! Cross-entropy of logits against one target per row, forward and backward fused: a block
//! per row reads the row once for its statistics (the softmax maximum and sum of the
//! softcapped logits, the target's logit, the weighted sum label smoothing needs), writes the
//! row's loss and log-sum-exp, then writes the gradient of the loss with respect to the
//! logits (in place over them, if asked), from the row kept in shared memory where it fits,
//! else read again. A shard of the vocabulary writes its statistics instead
//! (`cross_entropy_mode::STATES`), or reads every shard's and writes its slice of the
//! gradient (`FROM_STATES`). Two one-block launches go with it: a prologue that sums the
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

use crate::launch::REDUCTION_SCRATCH_FLOATS;
use crate::launch::cross_entropy::{CrossEntropyParams, CrossEntropyState, cross_entropy_mode};
use crate::launch::ops::RowState;
use crate::primitives::device::{
    DeviceExp2, Vector4, block_dim, block_idx, dynamic_shared_f32, exp2_approx, log2_approx,
    thread_idx,
};
use crate::primitives::element::{Element, store_as};
use crate::primitives::online::{LOG2_E, OnlineStats};
use crate::primitives::reduce::{Partial, block_reduce};

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

/// Two plain sums carried through one block reduction: the target's logit (held by one
/// thread, 0 in the others) and the weighted sum of the logits.
#[derive(Clone, Copy)]
struct Sums {
    target: f32,
    smoothing: f32,
}

impl Partial for Sums {
    const EMPTY: Self = Sums {
        target: 0.0,
        smoothing: 0.0,
    };
    const FLOATS: usize = 2;

    #[inline(always)]
    fn merge(self, other: Self) -> Self {
        Sums {
            target: self.target + other.target,
            smoothing: self.smoothing + other.smoothing,
        }
    }

    #[inline(always)]
    fn to_floats(self) -> [f32; 2] {
        [self.target, self.smoothing]
    }

    #[inline(always)]
    fn from_floats([target, smoothing]: [f32; 2]) -> Self {
        Sums { target, smoothing }
    }
}

/// What a row's target says: the target's column in this shard (if it falls there), whether
/// the row is ignored, whether the target is outside the vocabulary.
#[derive(Clone, Copy)]
struct Target {
    global: i64,
    ignored: bool,
    invalid: bool,
}

impl Target {
    /// # Safety
    /// `row < p.rows`, and the targets buffer holds `p.rows` integers of `p.target_bytes`.
    #[inline(always)]
    unsafe fn of(p: &CrossEntropyParams, row: usize) -> Self {
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

    /// The target's column in this shard, if it lies there.
    #[inline(always)]
    fn local(&self, p: &CrossEntropyParams) -> Option<usize> {
        let local = self.global - p.column_offset as i64;
        (!self.ignored && local >= 0 && (local as u64) < u64::from(p.cols))
            .then_some(local as usize)
    }
}

/// One row of logits as this block reads it: softcapped, `PACK` columns per access.
struct Row<E, const PACK: usize> {
    x: *const E,
    cols: usize,
    /// Where the row is kept in shared memory, used only where `cached` (a pointer that is
    /// never null: a shared-memory pointer compared with null is not what it seems once
    /// LLVM has inferred its address space).
    cache: *mut E,
    cached: bool,
    softcap: f32,
    inv_softcap: f32,
}

impl<E: Element, const PACK: usize> Row<E, PACK> {
    #[inline(always)]
    fn z(&self, v: f32) -> f32 {
        if self.softcap > 0.0 {
            self.softcap * tanh(v * self.inv_softcap)
        } else {
            v
        }
    }

    /// The `N` raw logits from column `col` (`N` is `PACK`, or 1 for the row's last
    /// columns), from global memory (kept in the cache when there is one) or, in the second
    /// pass, from the cache.
    ///
    /// # Safety
    /// `col + N ≤ cols`; with `N > 1`, `col` is a multiple of `N` and the row starts on a
    /// 16-byte boundary; where `cached`, the cache holds `cols` elements.
    #[inline(always)]
    unsafe fn load<const N: usize>(&self, col: usize, from_cache: bool) -> [f32; N] {
        // SAFETY: forwarded; the cache is shared memory, read through generic loads (the
        // global loads of `load_packed` would not reach it).
        unsafe {
            if from_cache {
                return E::widen_all(&cached_words::<E, N>(self.cache.add(col)));
            }
            let words = E::load_packed::<N>(self.x.add(col));
            if self.cached {
                copy_words::<E, N>(self.cache.add(col), &words);
            }
            E::widen_all(&words)
        }
    }
}

/// A pack kept by [`copy_words`], as `load_packed` returns it.
///
/// # Safety
/// `at` holds `N` elements of `E` in shared memory that [`copy_words`] wrote, aligned for
/// `N` of them.
#[inline(always)]
unsafe fn cached_words<E: Element, const N: usize>(at: *const E) -> [u32; N] {
    let mut words = [0u32; N];
    // SAFETY: forwarded; the same widths `copy_words` stored.
    unsafe {
        match N * size_of::<E>() {
            16 => {
                let Vector4(vector) = at.cast::<Vector4<u32>>().read();
                for i in 0..N.min(4) {
                    words[i] = vector[i];
                }
            }
            4 => words[0] = at.cast::<u32>().read(),
            2 => words[0] = u32::from(at.cast::<u16>().read()),
            _ => {}
        }
    }
    words
}

/// Stores a pack as it was read, in shared memory.
///
/// # Safety
/// `at` holds `N` elements of `E` in shared memory, aligned for `N` of them.
#[inline(always)]
unsafe fn copy_words<E: Element, const N: usize>(at: *mut E, words: &[u32; N]) {
    let bytes = N * size_of::<E>();
    // SAFETY: forwarded; a pack of `N` elements read as `N` words holds them in its first
    // `bytes / 4` words (or the low half of one word for a single 16-bit element).
    unsafe {
        match bytes {
            16 => at
                .cast::<[u32; 4]>()
                .write([words[0], words[1], words[2], words[3]]),
            4 => at.cast::<u32>().write(words[0]),
            2 => at.cast::<u16>().write(words[0] as u16),
            _ => {}
        }
    }
}

/// The cross-entropy of row `block_idx` (see the module's documentation).
///
/// # Safety
/// The contract of [`CrossEntropyParams`].
#[inline(always)]
pub(crate) unsafe fn cross_entropy_row<E: Element, const PACK: usize>(p: &CrossEntropyParams) {
    let row = block_idx() as usize;
    let threads = block_dim() as usize;
    let first = thread_idx() as usize * PACK;
    let step = threads * PACK;
    let scratch = dynamic_shared_f32();
    // SAFETY: the launch gives the scratch, then the cache when `cached` (the pointer is
    // only formed otherwise, never used).
    let cache = unsafe { scratch.add(REDUCTION_SCRATCH_FLOATS as usize).cast::<E>() };
    let softcap = p.softcap;
    let line = Row::<E, PACK> {
        // SAFETY: row `row` of the logits (contract).
        x: unsafe { (p.logits as *const E).add(row * p.logits_stride as usize) },
        cols: p.cols as usize,
        cache,
        cached: p.cached != 0,
        softcap,
        inv_softcap: if softcap > 0.0 { 1.0 / softcap } else { 0.0 },
    };
    // SAFETY: `row < rows` (one block per row).
    let target = unsafe { Target::of(p, row) };
    let local_target = target.local(p);
    let smoothing = p.label_smoothing != 0.0;
    let weight = p.weight as *const f32;

    // The statistics pass: whole packs, then the row's last `cols % PACK` columns (every
    // column where the row is not aligned), one at a time (the second pass gives each thread the same columns, so in place it reads each
    // logit before it writes that column's gradient).
    let mut stats = OnlineStats::EMPTY;
    let mut sums = Sums::EMPTY;
    // Rows that do not start on a 16-byte boundary are read one column at a time.
    let whole = if p.aligned != 0 {
        line.cols - line.cols % PACK
    } else {
        0
    };
    let visit = |sums: &mut Sums, z: f32, col: usize| {
        if smoothing {
            let w = if weight.is_null() {
                1.0
            } else {
                // SAFETY: the weights hold the whole vocabulary.
                unsafe { weight.add(p.column_offset as usize + col).read() }
            };
            sums.smoothing += w * z;
        }
        if local_target == Some(col) {
            sums.target = z;
        }
    };
    let mut col = first;
    while col < whole {
        // SAFETY: a whole pack of the row at a multiple of `PACK`.
        let raw = unsafe { line.load::<PACK>(col, false) };
        let mut z = [0.0; PACK];
        let mut batch_max = f32::NEG_INFINITY;
        for i in 0..PACK {
            z[i] = line.z(raw[i]);
            batch_max = batch_max.max(z[i]);
            visit(&mut sums, z[i], col + i);
        }
        stats.push_batch::<DeviceExp2>(batch_max, PACK, |i| z[i]);
        col += step;
    }
    let mut col = whole + thread_idx() as usize;
    while col < line.cols {
        // SAFETY: one column of the row.
        let [raw] = unsafe { line.load::<1>(col, false) };
        let z = line.z(raw);
        visit(&mut sums, z, col);
        stats.push::<DeviceExp2>(z);
        col += threads;
    }
    // SAFETY: every thread of the block, uniform control flow.
    let (stats, sums) = unsafe { (block_reduce(stats, scratch), block_reduce(sums, scratch)) };

    let (stats, sums) = match p.mode {
        cross_entropy_mode::STATES => {
            if thread_idx() == 0 {
                let state = CrossEntropyState {
                    row: RowState {
                        max: stats.max,
                        sum: stats.sum(),
                    },
                    target_logit: sums.target,
                    smoothing: sums.smoothing,
                };
                // SAFETY: the states hold one per row.
                unsafe { (p.states as *mut CrossEntropyState).add(row).write(state) };
            }
            return;
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

    let lse = OnlineStats::exponent_origin(stats.max)
        + log2_approx(stats.sum()) * core::f32::consts::LN_2;
    let vocab = p.vocab as f32;
    // SAFETY: `totals` holds the divisor and the weights' sum when not null.
    let (divisor, weight_sum) = if p.totals == 0 {
        (p.rows as f32, vocab)
    } else {
        unsafe {
            (
                (p.totals as *const f32).read(),
                (p.totals as *const f32).add(1).read(),
            )
        }
    };
    let target_weight = match (weight.is_null(), target.ignored || target.invalid) {
        (_, true) => 0.0,
        (true, false) => 1.0,
        // SAFETY: a target inside the vocabulary indexes the weights.
        (false, false) => unsafe { weight.add(target.global as usize).read() },
    };
    let eps = p.label_smoothing;
    if thread_idx() == 0 {
        let loss = if target.ignored {
            0.0
        } else if target.invalid {
            f32::NAN
        } else {
            let nll = lse - sums.target;
            let mut loss = (1.0 - eps) * target_weight * nll + p.z_loss * lse * lse;
            if smoothing {
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
    if p.gradient == 0 {
        return;
    }

    // The gradient pass.
    let upstream = if p.upstream == 0 {
        p.upstream_value
    } else {
        let index = if p.upstream_per_row != 0 { row } else { 0 };
        // SAFETY: one value, or one per row.
        unsafe { (p.upstream as *const f32).add(index).read() }
    };
    let scale = if p.mean != 0 {
        upstream / divisor
    } else {
        upstream
    };
    let smoothed = if smoothing {
        eps * weight_sum / vocab
    } else {
        0.0
    };
    let p_factor = (1.0 - eps) * target_weight + smoothed + 2.0 * p.z_loss * lse;
    let onehot = (1.0 - eps) * target_weight;
    let smoothing_per_class = eps / vocab;
    let nan = target.invalid;
    // SAFETY: row `row` of the gradient (contract).
    let y =
        p.gradient + (row as u64 * p.gradient_stride) * u64::from(dtype_bytes(p.gradient_dtype));
    let from_cache = line.cached;
    let gradient_of = |raw: f32, col: usize| {
        if target.ignored {
            return 0.0;
        }
        let z = line.z(raw);
        let probability = exp2_approx((z - lse) * LOG2_E);
        let mut dz = probability * p_factor;
        if local_target == Some(col) {
            dz -= onehot;
        }
        if smoothing {
            let w = if weight.is_null() {
                1.0
            } else {
                // SAFETY: the weights hold the whole vocabulary.
                unsafe { weight.add(p.column_offset as usize + col).read() }
            };
            dz -= smoothing_per_class * w;
        }
        if softcap > 0.0 {
            let t = z * line.inv_softcap;
            dz *= 1.0 - t * t;
        }
        if nan { f32::NAN } else { scale * dz }
    };
    let mut col = first;
    while col < whole {
        // SAFETY: as in the first pass; the cache, if any, holds what this thread kept there.
        let raw = unsafe { line.load::<PACK>(col, from_cache) };
        let mut out = [0.0f32; PACK];
        for i in 0..PACK {
            out[i] = gradient_of(raw[i], col + i);
        }
        // SAFETY: the gradient row holds `cols` elements, aligned as the logits' (contract).
        unsafe { store_as::<PACK>(p.gradient_dtype, y, col, out) };
        col += step;
    }
    let mut col = whole + thread_idx() as usize;
    while col < line.cols {
        // SAFETY: as above, for one column.
        let [raw] = unsafe { line.load::<1>(col, from_cache) };
        // SAFETY: as above.
        unsafe { store_as::<1>(p.gradient_dtype, y, col, [gradient_of(raw, col)]) };
        col += threads;
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

cross_entropy_entries! {
    "ops-f32": f32, "f32", 4;
    "ops-bf16": crate::primitives::element::Bf16, "bf16", 8;
    "ops-f16": crate::primitives::element::F16, "f16", 8;
}
