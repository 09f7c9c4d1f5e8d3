//! The CPU reference in `f64`: the test oracle, and a fallback users can compare with.
//!
//! Every function here is total: it never panics. Inputs shorter than their shape say give the
//! rows they hold; comparisons of results and references of different lengths count every
//! element missing on one side as a mismatch, so they fail rather than pass.

use std::sync::{Mutex, PoisonError};

/// Softmax of each row of a row-major `rows × cols` matrix, computed in `f64`: as many rows
/// as `input` holds, at most `rows` (none when `cols` is 0).
///
/// Special values follow `torch.softmax`: a row with a NaN or a `+inf` is all NaN (the
/// maximum and the sum propagate them), a row that is entirely `-inf` is all NaN
/// (`-inf - (-inf)` is NaN), and a `-inf` entry in any other row gives 0.
pub fn softmax_f64(input: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    // The unscaled, unmasked scores: the same operations in the same order.
    Scores::default().forward(false, input, rows, cols)
}

/// A run of whole rows of [`by_rows`]' output: the first row's index, and the rows.
type RowRun<'a, T> = (usize, &'a mut [T]);

/// Work (values read, roughly) from which [`by_rows`] spreads its rows over threads.
const PARALLEL_WORK: usize = 1 << 20;

/// `rows` rows of `width` values each, row `r` written by `fill(r, row)` into a row of
/// defaults, each row costing about `row_cost`: on the machine's threads once the rows cost
/// at least [`PARALLEL_WORK`] in all, else on this one ([`by_rows_on`]).
fn by_rows<T, F>(rows: usize, width: usize, row_cost: usize, fill: F) -> Vec<T>
where
    T: Copy + Default + Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let threads = if rows.saturating_mul(row_cost) < PARALLEL_WORK {
        1
    } else {
        std::thread::available_parallelism().map_or(1, usize::from)
    };
    by_rows_on(threads, rows, width, fill)
}

/// [`by_rows`] on `threads` threads, each taking runs of whole rows. Each row is computed
/// alone, so the values are the same on any number. This thread takes runs too, so a thread
/// the system refuses only leaves more to the others.
fn by_rows_on<T, F>(threads: usize, rows: usize, width: usize, fill: F) -> Vec<T>
where
    T: Copy + Default + Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let mut output = vec![T::default(); rows * width];
    if width == 0 {
        return output;
    }
    if threads < 2 || rows < 2 {
        for (r, row) in output.chunks_exact_mut(width).enumerate() {
            fill(r, row);
        }
        return output;
    }
    let run = rows.div_ceil(threads);
    let runs: Vec<Mutex<Option<RowRun<'_, T>>>> = output
        .chunks_mut(run * width)
        .enumerate()
        .map(|(k, part)| Mutex::new(Some((k * run, part))))
        .collect();
    let (runs, fill) = (&runs, &fill);
    let take_runs = move || {
        for slot in runs {
            let taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some((first, part)) = taken {
                for (i, row) in part.chunks_exact_mut(width).enumerate() {
                    fill(first + i, row);
                }
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads.min(runs.len()) {
            // A refused thread's runs are taken by the rest.
            let _ = std::thread::Builder::new().spawn_scoped(scope, take_runs);
        }
        take_runs();
    });
    output
}

/// The whole rows of `cols` elements that `len` elements hold, at most `rows` (all `rows` when
/// a row has no elements).
fn held_rows(len: usize, rows: usize, cols: usize) -> usize {
    len.checked_div(cols).map_or(rows, |held| rows.min(held))
}

/// A row's maximum (NaN-propagating) and `Σ e^(s − max)` (the sum over `e^s` where every
/// score is `-inf`).
fn row_state(scores: &[f64]) -> (f64, f64) {
    let max = scores
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, nan_propagating_max);
    let shift = if max == f64::NEG_INFINITY { 0.0 } else { max };
    (max, scores.iter().map(|s| (s - shift).exp()).sum())
}

/// `max` that returns NaN when either side is NaN, as `torch.max` does.
fn nan_propagating_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// How far a result is from the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deviation {
    /// `‖actual − expected‖₂ / ‖expected‖₂` over the elements where the reference is finite.
    pub relative_l2: f64,
    /// The largest `|Σ row − 1|` over rows whose reference is finite.
    pub worst_row_sum: f64,
    /// Elements whose NaN-ness differs from the reference (includes never-written outputs
    /// when the output was poisoned with NaN).
    pub nan_mismatches: usize,
}

impl Deviation {
    /// Whether the result passes at tolerance `tolerance` for both error measures.
    pub fn within(&self, tolerance: f64) -> bool {
        self.nan_mismatches == 0 && self.relative_l2 < tolerance && self.worst_row_sum < tolerance
    }
}

/// Compares a `rows × cols` result with the reference (elements present on one side only
/// count as NaN mismatches).
pub fn deviation(actual: &[f32], expected: &[f64], cols: usize) -> Deviation {
    let (mut diff, mut norm, mut worst_row_sum) = (0.0, 0.0, 0.0_f64);
    let mut nan_mismatches = actual.len().abs_diff(expected.len());
    for (row_actual, row_expected) in actual.chunks(cols.max(1)).zip(expected.chunks(cols.max(1))) {
        let mut row_sum = 0.0;
        let mut row_finite = true;
        for (&a, &e) in row_actual.iter().zip(row_expected) {
            let a = f64::from(a);
            if a.is_nan() != e.is_nan() {
                nan_mismatches += 1;
            }
            if e.is_finite() {
                diff += (a - e) * (a - e);
                norm += e * e;
                row_sum += a;
            } else {
                row_finite = false;
            }
        }
        if row_finite {
            worst_row_sum = worst_row_sum.max((row_sum - 1.0).abs());
        }
    }
    let relative_l2 = if norm > 0.0 {
        (diff / norm).sqrt()
    } else {
        diff.sqrt()
    };
    Deviation {
        relative_l2,
        worst_row_sum,
        nan_mismatches,
    }
}

/// The score transform of the forward operations, for the reference: `x · scale ·
/// row_scale[r] + additive[r % k]`, with `allowed[r % k] == 0` and (when `causal`) columns
/// past `r % cols` masked to `-inf`. Masks hold `k × cols` values. (The library refuses a
/// mask of any other length, or a per-row scale without one value per row; here the values
/// such buffers lack mask nothing and scale by 1.)
#[derive(Clone, Copy, Debug)]
pub struct Scores<'a> {
    pub scale: f32,
    pub row_scale: Option<&'a [f32]>,
    pub additive_mask: Option<&'a [f32]>,
    pub allowed_mask: Option<&'a [u8]>,
    pub causal: bool,
    /// Rows masked everywhere give zero probability (log: `-inf`) instead of NaN.
    pub zero_masked_rows: bool,
}

impl Default for Scores<'_> {
    fn default() -> Self {
        Scores {
            scale: 1.0,
            row_scale: None,
            additive_mask: None,
            allowed_mask: None,
            causal: false,
            zero_masked_rows: false,
        }
    }
}

impl Scores<'_> {
    /// Row `r`'s scores in f64 (the caller keeps `r` among the rows `input` holds).
    fn row(&self, input: &[f32], r: usize, cols: usize) -> Vec<f64> {
        let row_scale = self.row_scale.and_then(|s| s.get(r)).copied();
        let scale = f64::from(self.scale) * row_scale.map_or(1.0, f64::from);
        // Element `c` of mask row `r % k`, for a mask of `k` whole rows.
        let at = |len: usize, c: usize| {
            let mask_rows = len / cols.max(1);
            (mask_rows > 0).then(|| (r % mask_rows) * cols + c)
        };
        (0..cols)
            .map(|c| {
                let mut score = f64::from(input[r * cols + c]) * scale;
                if let Some(mask) = self.additive_mask {
                    score += at(mask.len(), c).map_or(0.0, |i| f64::from(mask[i]));
                }
                let allowed = self
                    .allowed_mask
                    .is_none_or(|mask| at(mask.len(), c).is_none_or(|i| mask[i] != 0));
                if !allowed || (self.causal && c > r % cols) {
                    score = f64::NEG_INFINITY;
                }
                score
            })
            .collect()
    }

    /// Row maximum (NaN-propagating) and `Σ e^(s − max)` of each row's scores, for as many
    /// rows as `input` holds, at most `rows`.
    pub fn states(&self, input: &[f32], rows: usize, cols: usize) -> Vec<(f64, f64)> {
        by_rows(held_rows(input.len(), rows, cols), 1, cols, |r, state| {
            state[0] = row_state(&self.row(input, r, cols));
        })
    }

    /// Softmax (or log-softmax, when `log`) of each row's scores.
    pub fn forward(&self, log: bool, input: &[f32], rows: usize, cols: usize) -> Vec<f64> {
        if cols == 0 {
            return Vec::new();
        }
        by_rows(held_rows(input.len(), rows, cols), cols, cols, |r, out| {
            let scores = self.row(input, r, cols);
            let (max, sum) = row_state(&scores);
            if max == f64::NEG_INFINITY {
                out.fill(match (self.zero_masked_rows, log) {
                    (true, false) => 0.0,
                    (true, true) => f64::NEG_INFINITY,
                    (false, _) => f64::NAN,
                });
            } else {
                for (o, s) in out.iter_mut().zip(scores) {
                    *o = if log {
                        s - max - sum.ln()
                    } else {
                        (s - max).exp() / sum
                    };
                }
            }
        })
    }

    /// Log-sum-exp of each row's scores (`-inf` for a row masked everywhere).
    pub fn log_sum_exp(&self, input: &[f32], rows: usize, cols: usize) -> Vec<f64> {
        self.states(input, rows, cols)
            .into_iter()
            .map(|(max, sum)| {
                if max == f64::NEG_INFINITY {
                    f64::NEG_INFINITY
                } else {
                    max + sum.ln()
                }
            })
            .collect()
    }
}

/// Gradient of softmax (`dx = y ⊙ (dy − Σ dy⊙y)`) or, when `log`, of log-softmax
/// (`dx = dy − e^y ⊙ Σ dy`) for each row, times `scale[r]`: for the rows `y`, `dy` and `scale`
/// all hold (none when `cols` is 0).
pub fn backward_f64(log: bool, y: &[f32], dy: &[f32], cols: usize, scale: &[f64]) -> Vec<f64> {
    if cols == 0 {
        return Vec::new();
    }
    let rows = (y.len() / cols).min(dy.len() / cols).min(scale.len());
    by_rows(rows, cols, cols, |r, dx| {
        let (y, dy) = (&y[r * cols..(r + 1) * cols], &dy[r * cols..(r + 1) * cols]);
        let pairs = || {
            y.iter()
                .zip(dy)
                .map(|(&y, &dy)| (f64::from(y), f64::from(dy)))
        };
        let sum: f64 = if log {
            pairs().map(|(_, dy)| dy).sum()
        } else {
            pairs().map(|(y, dy)| y * dy).sum()
        };
        for (dx, (y, dy)) in dx.iter_mut().zip(pairs()) {
            *dx = scale[r]
                * if log {
                    dy - y.exp() * sum
                } else {
                    y * (dy - sum)
                };
        }
    })
}

/// How far `actual` is from `expected` element by element (no row-sum check: for
/// log-softmax, log-sum-exp and gradients): relative L2 over finite references, and a
/// mismatch for every element whose reference is NaN or infinite and that differs.
pub fn value_deviation(actual: &[f32], expected: &[f64]) -> Deviation {
    floored_value_deviation(actual, expected, 0.0)
}

/// [`value_deviation`] with every finite reference counted in the norm as at least `floor`
/// in magnitude: for results whose rounding is absolute in the magnitude of the terms that
/// formed them rather than in their own, such as a log-sum-exp `max + ln Σ` near 0 from
/// terms of opposite sign.
pub fn floored_value_deviation(actual: &[f32], expected: &[f64], floor: f64) -> Deviation {
    let (mut diff, mut norm) = (0.0, 0.0);
    let mut nan_mismatches = actual.len().abs_diff(expected.len());
    for (&a, &e) in actual.iter().zip(expected) {
        let a = f64::from(a);
        if e.is_finite() {
            if !a.is_finite() {
                nan_mismatches += 1;
            }
            diff += (a - e) * (a - e);
            norm += e.abs().max(floor).powi(2);
        } else if !(a == e || (a.is_nan() && e.is_nan())) {
            nan_mismatches += 1;
        }
    }
    Deviation {
        relative_l2: if norm > 0.0 {
            (diff / norm).sqrt()
        } else {
            diff.sqrt()
        },
        worst_row_sum: 0.0,
        nan_mismatches,
    }
}

/// How losses are reduced over the rows, as `torch.nn.functional.cross_entropy` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// One loss per row (0 for an ignored row).
    None,
    /// The sum of the rows' losses.
    Sum,
    /// The sum divided by the summed weights of the rows not ignored (their count without
    /// class weights); NaN when every row is ignored, as in torch.
    #[default]
    Mean,
}

/// The cross-entropy options, for the reference. `weight` holds one weight per class
/// (column); `softcap` is 0 for none.
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossEntropyReference<'a> {
    pub ignore_index: Option<i64>,
    pub label_smoothing: f64,
    pub z_loss: f64,
    pub softcap: f64,
    pub reduction: Reduction,
    pub weight: Option<&'a [f32]>,
}

/// What [`cross_entropy_f64`] computes.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEntropyResult {
    /// Each row's loss (0 where ignored; NaN where the target is out of range).
    pub losses: Vec<f64>,
    /// Each row's log-sum-exp of its (softcapped) logits.
    pub lse: Vec<f64>,
    /// The reduced loss: the losses' sum, or their sum over `denominator` (mean); for
    /// [`Reduction::None`], the sum.
    pub reduced: f64,
    /// The mean's divisor: the weights of the targets of the rows not ignored, summed.
    pub denominator: f64,
    /// The gradient of the reduced loss (of each row's loss for [`Reduction::None`]) with
    /// respect to the logits, before any upstream gradient.
    pub gradient: Vec<f64>,
}

/// Cross-entropy of `rows × cols` logits against one target per row, in f64: with `z = cap ·
/// tanh(x / cap)` (or `z = x` without a softcap), `lse = ln Σ e^z`, a row's loss is
/// `(1 − ε) · w[t] · (lse − z[t]) + (ε / V) · Σ_i w[i] · (lse − z[i]) + λ · lse²` (`ε` the label
/// smoothing, `λ` the z-loss scale, `V = cols`, `w = 1` without class weights), 0 for a row
/// whose target is the ignore index, and NaN for a target outside `0..cols`.
pub fn cross_entropy_f64(
    logits: &[f32],
    rows: usize,
    cols: usize,
    targets: &[i64],
    options: &CrossEntropyReference<'_>,
) -> CrossEntropyResult {
    let weight = |c: usize| options.weight.map_or(1.0, |w| f64::from(w[c]));
    let eps = options.label_smoothing;
    let vocab = cols as f64;
    let total_weight: f64 = (0..cols).map(weight).sum();
    // Terms whose coefficient is 0 are left out, not multiplied by 0 (an infinite `lse`).
    let z_loss_of = |x: f64| {
        if options.z_loss > 0.0 {
            options.z_loss * x
        } else {
            0.0
        }
    };
    // Each row alone: its log-sum-exp, loss and the coefficients of its gradient.
    let per_row = by_rows(rows, 1, cols, |r, part: &mut [CrossEntropyRow]| {
        let x = &logits[r * cols..(r + 1) * cols];
        let z: Vec<f64> = x
            .iter()
            .map(|&v| {
                let v = f64::from(v);
                if options.softcap > 0.0 {
                    options.softcap * (v / options.softcap).tanh()
                } else {
                    v
                }
            })
            .collect();
        let max = z
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, nan_propagating_max);
        let lse = if max == f64::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            max + z.iter().map(|s| (s - max).exp()).sum::<f64>().ln()
        };
        let target = targets[r];
        part[0] = if options.ignore_index == Some(target) {
            CrossEntropyRow {
                lse,
                loss: 0.0,
                coefficients: None,
                counted_weight: None,
            }
        } else if target < 0 || target as usize >= cols {
            CrossEntropyRow {
                lse,
                loss: f64::NAN,
                coefficients: Some((f64::NAN, 0, f64::NAN)),
                counted_weight: None,
            }
        } else {
            let t = target as usize;
            let w_t = weight(t);
            // Terms whose coefficient is 0 are left out, not multiplied by 0: without label
            // smoothing a `-inf` logit (vocabulary padding) leaves the loss finite, as in torch.
            let smoothing = if eps > 0.0 {
                let smooth: f64 = (0..cols).map(|c| weight(c) * (lse - z[c])).sum();
                eps / vocab * smooth
            } else {
                0.0
            };
            CrossEntropyRow {
                lse,
                loss: (1.0 - eps) * w_t * (lse - z[t]) + smoothing + z_loss_of(lse * lse),
                coefficients: Some((w_t, t, lse)),
                counted_weight: Some(w_t),
            }
        };
    });
    let mut result = CrossEntropyResult {
        losses: per_row.iter().map(|row| row.loss).collect(),
        lse: per_row.iter().map(|row| row.lse).collect(),
        reduced: 0.0,
        // From +0, as before the rows were threaded (an empty `sum` is -0).
        denominator: per_row
            .iter()
            .filter_map(|row| row.counted_weight)
            .fold(0.0, |sum, weight| sum + weight),
        gradient: Vec::new(),
    };
    result.reduced = result.losses.iter().sum();
    let scale = match options.reduction {
        Reduction::Mean => {
            result.reduced /= result.denominator;
            1.0 / result.denominator
        }
        Reduction::Sum | Reduction::None => 1.0,
    };
    result.gradient = by_rows(rows, cols, cols, |r, gradient| {
        let x = &logits[r * cols..(r + 1) * cols];
        let Some((w_t, t, lse)) = per_row[r].coefficients else {
            return;
        };
        let p_factor = (1.0 - eps) * w_t + eps * total_weight / vocab + z_loss_of(2.0 * lse);
        for (c, (&v, g)) in x.iter().zip(gradient.iter_mut()).enumerate() {
            let v = f64::from(v);
            let (z, dz_dx) = if options.softcap > 0.0 {
                let tanh = (v / options.softcap).tanh();
                (options.softcap * tanh, 1.0 - tanh * tanh)
            } else {
                (v, 1.0)
            };
            let p = (z - lse).exp();
            let onehot = if c == t { (1.0 - eps) * w_t } else { 0.0 };
            let dz = p * p_factor - onehot - eps * weight(c) / vocab;
            *g = scale * dz * dz_dx;
        }
    });
    result
}

/// One row of [`cross_entropy_f64`]: its log-sum-exp and loss; for a row not ignored, the
/// target's weight, the target and the log-sum-exp its gradient is formed with (NaN for a
/// target out of range); and for a row with a target in range, its weight in the mean's
/// divisor.
#[derive(Clone, Copy, Debug, Default)]
struct CrossEntropyRow {
    lse: f64,
    loss: f64,
    coefficients: Option<(f64, usize, f64)>,
    counted_weight: Option<f64>,
}

/// One row's sampling filters, as the sampler applies them: logits over `temperature`, then
/// the `top_k` most probable columns, then the smallest prefix of those (most probable first)
/// whose renormalized mass reaches `top_p`, then the columns whose probability is at least
/// `min_p` times the largest. Ties in probability rank the lower column first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingReference {
    /// 0 is greedy: the largest logit (the lowest column among equals) with probability 1.
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
}

/// The distribution one row of `logits` is sampled from: a probability per column, 0 where
/// the filters dropped it or the logit is `-inf`, summing to 1. Empty for a row with a NaN or
/// a `+inf`, or no finite logit.
pub fn filtered_distribution_f64(logits: &[f32], filters: &SamplingReference) -> Vec<f64> {
    let cols = logits.len();
    if logits.iter().any(|v| v.is_nan() || *v == f32::INFINITY) {
        return Vec::new();
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Vec::new();
    }
    let mut probabilities = vec![0.0; cols];
    if filters.temperature == 0.0 {
        let best = (0..cols)
            .find(|&c| logits[c] == max)
            .expect("the maximum is one of the logits");
        probabilities[best] = 1.0;
        return probabilities;
    }
    let weights: Vec<f64> = logits
        .iter()
        .map(|&v| ((f64::from(v) - f64::from(max)) / filters.temperature).exp())
        .collect();
    // Most probable first, the lower column first among equals; `-inf` logits never.
    let mut order: Vec<usize> = (0..cols).filter(|&c| weights[c] > 0.0).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    let mut kept = order.len();
    if let Some(k) = filters.top_k {
        kept = kept.min(k);
    }
    if let Some(p) = filters.top_p {
        let mass: f64 = order[..kept].iter().map(|&c| weights[c]).sum();
        let mut running = 0.0;
        for (i, &c) in order[..kept].iter().enumerate() {
            running += weights[c];
            if running >= p * mass {
                kept = i + 1;
                break;
            }
        }
    }
    if let Some(m) = filters.min_p {
        let floor = m * weights[order[0]];
        kept = order[..kept]
            .iter()
            .take_while(|&&c| weights[c] >= floor)
            .count();
    }
    let kept_mass: f64 = order[..kept].iter().map(|&c| weights[c]).sum();
    for &c in &order[..kept] {
        probabilities[c] = weights[c] / kept_mass;
    }
    probabilities
}

impl SamplingReference {
    /// Whether the sampler draws this row's token over chunks of four columns
    /// ([`gumbel_draw_f64`]): a temperature above 0 and no filter that drops a column.
    pub fn draws_in_chunks(&self) -> bool {
        self.temperature > 0.0
            && self.top_k.is_none()
            && self.top_p.is_none_or(|p| p >= 1.0)
            && self.min_p.is_none_or(|m| m == 0.0)
    }
}

/// The token the sampler's noise draws from `distribution` (a row's filtered distribution,
/// as [`filtered_distribution_f64`] gives it, under `filters`) at `seed`, `offset` and `row`,
/// in f64 with the device's random words (Philox, keyed by global columns from
/// `column_offset`). `NO_TOKEN` (`u32::MAX`) for an empty distribution.
/// - Where [`SamplingReference::draws_in_chunks`]: Gumbel-max over chunks of four global
///   columns `4c..4c + 4`, each scored `ln` of its probability plus the Gumbel noise of the
///   first word it takes from Philox call `c / 2` (words 0 and 1 for an even chunk, 2 and 3
///   for an odd one); the best chunk's second word, as a uniform `u`, picks its first column
///   whose running probability passes `u` times the chunk's.
/// - Otherwise Gumbel-max over the kept columns, column `g` taking word `g % 4` of Philox
///   call `g / 4`.
///
/// # Panics
/// Where the row draws in chunks and `column_offset` is not a multiple of 4 (the sampler
/// refuses such shards).
pub fn gumbel_draw_f64(
    distribution: &[f64],
    filters: &SamplingReference,
    seed: u64,
    offset: u64,
    row: u32,
    column_offset: u64,
) -> u32 {
    use kernels_gpu::primitives::draw::exponential_of;
    use kernels_gpu::primitives::philox::{draw_words, uniform_open};
    let noise = |bits: u32| -f64::from(exponential_of(bits)).ln();
    let mut best = (f64::NEG_INFINITY, u32::MAX);
    if !filters.draws_in_chunks() {
        for (c, &q) in distribution.iter().enumerate() {
            if q > 0.0 {
                let global = column_offset + c as u64;
                let bits =
                    draw_words(seed, offset, row, (global / 4) as u32)[(global % 4) as usize];
                let score = q.ln() + noise(bits);
                if score > best.0 {
                    best = (score, c as u32);
                }
            }
        }
        return best.1;
    }
    assert!(
        column_offset % 4 == 0,
        "chunks start at multiples of 4 columns"
    );
    let mut best_chunk = None;
    for (k, chunk) in distribution.chunks(4).enumerate() {
        let mass: f64 = chunk.iter().sum();
        if mass > 0.0 {
            let global_chunk = column_offset / 4 + k as u64;
            let words = draw_words(seed, offset, row, (global_chunk / 2) as u32);
            let half = 2 * (global_chunk % 2) as usize;
            let score = mass.ln() + noise(words[half]);
            if score > best.0 {
                best = (score, u32::MAX);
                best_chunk = Some((k, mass, words[half + 1]));
            }
        }
    }
    let Some((k, mass, pick)) = best_chunk else {
        return u32::MAX;
    };
    let target = f64::from(uniform_open(pick)) * mass;
    let chunk = &distribution[4 * k..(4 * k + 4).min(distribution.len())];
    let mut running = 0.0;
    let mut last = 0;
    for (i, &q) in chunk.iter().enumerate() {
        running += q;
        if q > 0.0 {
            last = i;
            if target < running {
                return (4 * k + i) as u32;
            }
        }
    }
    (4 * k + last) as u32
}

#[cfg(test)]
mod cross_entropy_tests {
    use super::*;

    /// The reduced loss of `logits` with one logit moved by `delta`.
    fn loss_at(
        logits: &[f32],
        index: usize,
        delta: f32,
        rows: usize,
        cols: usize,
        targets: &[i64],
        options: &CrossEntropyReference<'_>,
    ) -> f64 {
        let mut moved = logits.to_vec();
        moved[index] += delta;
        cross_entropy_f64(&moved, rows, cols, targets, options).reduced
    }

    #[test]
    fn the_gradient_is_the_derivative_of_the_reduced_loss() {
        let (rows, cols) = (3, 7);
        let logits: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.7)
            .collect();
        let targets = [2, -100, 6];
        let weight: Vec<f32> = (0..cols).map(|c| 0.5 + c as f32 * 0.25).collect();
        let choices = [
            CrossEntropyReference::default(),
            CrossEntropyReference {
                ignore_index: Some(-100),
                label_smoothing: 0.1,
                z_loss: 1e-2,
                softcap: 3.0,
                reduction: Reduction::Mean,
                weight: Some(&weight),
            },
            CrossEntropyReference {
                ignore_index: Some(-100),
                reduction: Reduction::Sum,
                label_smoothing: 0.2,
                ..CrossEntropyReference::default()
            },
        ];
        for options in choices {
            let targets: Vec<i64> = targets
                .iter()
                .map(|&t| {
                    if options.ignore_index.is_none() && t < 0 {
                        1
                    } else {
                        t
                    }
                })
                .collect();
            let result = cross_entropy_f64(&logits, rows, cols, &targets, &options);
            for (i, &analytic) in result.gradient.iter().enumerate() {
                let h = 1e-3;
                let numeric = (loss_at(&logits, i, h, rows, cols, &targets, &options)
                    - loss_at(&logits, i, -h, rows, cols, &targets, &options))
                    / (2.0 * f64::from(h));
                assert!(
                    (numeric - analytic).abs() < 1e-4,
                    "{options:?}: element {i}: {analytic} against {numeric}"
                );
            }
        }
    }

    #[test]
    fn ignored_rows_out_of_range_targets_and_an_all_ignored_mean() {
        let logits = [1.0, 2.0, 3.0, 0.0, 0.0, 0.0];
        let options = CrossEntropyReference {
            ignore_index: Some(-1),
            ..CrossEntropyReference::default()
        };
        let result = cross_entropy_f64(&logits, 2, 3, &[-1, -1], &options);
        assert_eq!(result.losses, [0.0, 0.0]);
        assert!(result.reduced.is_nan(), "torch's mean of no rows is NaN");
        assert!(result.gradient.iter().all(|&g| g == 0.0));
        let result = cross_entropy_f64(&logits, 2, 3, &[3, 0], &options);
        assert!(result.losses[0].is_nan() && result.gradient[..3].iter().all(|g| g.is_nan()));
        let expected = (3.0f64).ln();
        assert!((result.losses[1] - expected).abs() < 1e-12);
    }
}

#[cfg(test)]
mod sampling_tests {
    use super::*;

    fn filters(temperature: f64) -> SamplingReference {
        SamplingReference {
            temperature,
            top_k: None,
            top_p: None,
            min_p: None,
        }
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
    }

    #[test]
    fn sampling_filters_keep_what_each_one_says_in_order() {
        // Probabilities proportional to 8, 4, 2, 1, 1 (their logarithms as logits).
        let logits: Vec<f32> = [8.0f64, 4.0, 2.0, 1.0, 1.0]
            .iter()
            .map(|w| w.ln() as f32)
            .collect();
        let with = |f: SamplingReference| filtered_distribution_f64(&logits, &f);
        let plain = filters(1.0);
        assert!(close(&with(plain), &[0.5, 0.25, 0.125, 0.0625, 0.0625]));
        let top2 = [2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0, 0.0];
        assert!(close(
            &with(SamplingReference {
                top_k: Some(2),
                ..plain
            }),
            &top2
        ));
        // 0.5 + 0.25 reaches 0.7: two kept.
        assert!(close(
            &with(SamplingReference {
                top_p: Some(0.7),
                ..plain
            }),
            &top2
        ));
        // Of the top three (8, 4, 2 of 14), 0.9 of their mass needs all three.
        let three = [8.0 / 14.0, 4.0 / 14.0, 2.0 / 14.0, 0.0, 0.0];
        let both = SamplingReference {
            top_k: Some(3),
            top_p: Some(0.9),
            ..plain
        };
        assert!(close(&with(both), &three));
        // At least a fifth of the largest: 8, 4 and 2.
        assert!(close(
            &with(SamplingReference {
                min_p: Some(0.2),
                ..plain
            }),
            &three
        ));
        // Of the two equal last columns, the lower ranks first.
        let top4 = with(SamplingReference {
            top_k: Some(4),
            ..plain
        });
        assert!(top4[3] > 0.0 && top4[4] == 0.0);
        // Temperature 2 takes the square roots of the weights.
        let w = [8f64.sqrt(), 2.0, 2f64.sqrt(), 1.0, 1.0];
        let t: f64 = w.iter().sum();
        assert!(close(&with(filters(2.0)), &w.map(|v| v / t)));
    }

    #[test]
    fn greedy_takes_the_lowest_of_equal_maxima_and_bad_rows_have_no_distribution() {
        assert_eq!(
            filtered_distribution_f64(&[1.0, 3.0, 3.0, -1.0], &filters(0.0)),
            [0.0, 1.0, 0.0, 0.0]
        );
        assert!(filtered_distribution_f64(&[1.0, f32::NAN], &filters(1.0)).is_empty());
        assert!(filtered_distribution_f64(&[f32::NEG_INFINITY; 3], &filters(1.0)).is_empty());
        let masked = filtered_distribution_f64(&[0.0, f32::NEG_INFINITY], &filters(1.0));
        assert_eq!(masked, [1.0, 0.0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row lands at its own place on any number of threads, uneven runs and rows of one
    /// value included, and more threads than rows.
    #[test]
    fn rows_on_threads_are_where_one_thread_puts_them() {
        for width in [1, 7] {
            for rows in [0, 1, 2, 10, 23] {
                let fill = |r: usize, row: &mut [u64]| {
                    for (c, value) in row.iter_mut().enumerate() {
                        *value = (r * 1000 + c) as u64;
                    }
                };
                let alone = by_rows_on(1, rows, width, fill);
                assert_eq!(alone.len(), rows * width);
                assert!(
                    alone
                        .iter()
                        .enumerate()
                        .all(|(i, &v)| { v == ((i / width) * 1000 + i % width) as u64 })
                );
                for threads in [2, 3, 7, 64] {
                    assert_eq!(by_rows_on(threads, rows, width, fill), alone);
                }
            }
        }
    }
}
