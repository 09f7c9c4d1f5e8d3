//! GPU tests of sampling against the f64 reference's filtered distribution: chi-square tests
//! of the draws (about 10⁶ per case, each filter alone and combined, f32 and bf16, with a bias
//! and with ties at the cuts; with a top-k per row in a large batch for the row kernel and one
//! top-k in a batch of 128 rows for the candidate path), the log-probabilities, the written distribution,
//! greedy rows, rows without a token, reproducibility and independence from the batch, wide rows (kept in
//! shared memory and not), the bisection of rows whose cut bins hold too many columns, a
//! captured graph replayed 100 times, vocabulary shards against the whole row, the candidate
//! path of a small top-k against the row kernel, and bad input.
//! Without a CUDA device each test is reported as skipped.
//!
//! The chi-square tests reject at significance 10⁻⁴ per case (Wilson–Hilferty's approximation
//! of the critical value), over the columns the reference keeps; a draw of a column the
//! reference drops fails at once.

mod common;

use common::{rounded, shape, text, upload};

use cust::memory::{CopyDestination, DeviceBuffer};
use rand::Rng;
use rand::rngs::StdRng;
use softmax::half::bf16;
use softmax::reference::{SamplingReference, filtered_distribution_f64, gumbel_draw_f64};
use softmax::{
    CallKind, DType, Element, Error, NO_TOKEN, Options, PerRow, Rows, RowsMut, SamplingOptions,
    SamplingOutputs, Shape, ShardDraw, Softmax, Values, merge_shard_draws, shard_draw_token,
};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[
    (
        "sampling_draws_follow_the_filtered_distribution",
        chi_square,
    ),
    ("sampling_bisects_rows_of_many_ties", bisection),
    (
        "sampling_log_probabilities_and_distribution",
        log_probabilities,
    ),
    ("sampling_greedy_is_the_first_argmax", greedy),
    ("sampling_rows_without_a_token", without_a_token),
    ("sampling_is_reproducible_and_row_independent", reproducible),
    ("sampling_captured_in_a_graph", captured),
    ("sampling_shards_match_the_whole", shards),
    (
        "sampling_small_top_k_candidates_match_the_row_kernel",
        candidates,
    ),
    ("sampling_bad_input_is_refused", bad_input),
];

fn main() -> std::process::ExitCode {
    common::run_harness(TESTS)
}

/// One case's filters, for the library and the reference.
#[derive(Clone, Copy, Debug)]
struct Filters {
    temperature: f32,
    top_k: Option<u32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
}

impl Filters {
    const fn temperature(t: f32) -> Self {
        Filters {
            temperature: t,
            top_k: None,
            top_p: None,
            min_p: None,
        }
    }

    fn options(&self) -> SamplingOptions<'static> {
        let mut o = SamplingOptions::new().temperature(self.temperature);
        if let Some(k) = self.top_k {
            o = o.top_k(k);
        }
        if let Some(p) = self.top_p {
            o = o.top_p(p);
        }
        if let Some(p) = self.min_p {
            o = o.min_p(p);
        }
        o
    }

    fn reference(&self) -> SamplingReference {
        SamplingReference {
            temperature: f64::from(self.temperature),
            top_k: self.top_k.map(|k| k as usize),
            top_p: self.top_p.map(f64::from),
            min_p: self.min_p.map(f64::from),
        }
    }
}

/// The critical value of the chi-square distribution with `df` degrees of freedom at
/// significance 10⁻⁴ (Wilson–Hilferty).
fn chi_square_critical(df: usize) -> f64 {
    let z = 3.719; // the standard normal's 1 − 10⁻⁴ quantile
    let d = df as f64;
    let a = 2.0 / (9.0 * d);
    d * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Checks token counts against the distribution `p`: no draw where `p` is 0, and the
/// chi-square statistic below the critical value. Returns the statistic and its critical
/// value.
fn check_counts(counts: &[u64], p: &[f64], what: &str) -> Result<(f64, f64), String> {
    let total: u64 = counts.iter().sum();
    let mut statistic = 0.0;
    let mut support = 0;
    for (c, (&n, &q)) in counts.iter().zip(p).enumerate() {
        if q == 0.0 {
            if n > 0 {
                return Err(format!(
                    "{what}: column {c} drawn {n} times, its probability is 0"
                ));
            }
            continue;
        }
        support += 1;
        let expected = q * total as f64;
        statistic += (n as f64 - expected).powi(2) / expected;
    }
    if support <= 1 {
        return Ok((0.0, 0.0));
    }
    let critical = chi_square_critical(support - 1);
    if statistic > critical {
        return Err(format!(
            "{what}: chi-square {statistic:.1} above {critical:.1} ({} columns kept, {total} draws)",
            support
        ));
    }
    Ok((statistic, critical))
}

/// Draws `calls` batches of `rows` rows of the same logits (the offset advanced on the
/// device between calls) and counts the tokens.
#[allow(clippy::too_many_arguments)]
fn draw_counts<T: Element>(
    softmax: &mut Softmax,
    logits: &[f32],
    bias: Option<&[f32]>,
    rows: usize,
    calls: usize,
    filters: &Filters,
    seed: u64,
) -> Result<Vec<u64>, String> {
    let cols = logits.len();
    let batch: Vec<f32> = logits.iter().copied().cycle().take(rows * cols).collect();
    let x = upload::<T>(&batch)?;
    let bias_buffer = bias
        .map(DeviceBuffer::from_slice)
        .transpose()
        .map_err(text)?;
    let mut random = DeviceBuffer::from_slice(&[seed, 0u64]).map_err(text)?;
    let mut tokens = DeviceBuffer::from_slice(&vec![0u32; rows]).map_err(text)?;
    let mut counts = vec![0u64; cols];
    // The large batch gives its top-k per row (the row kernel; one for all rows takes the
    // candidate path at any batch size).
    let per_row_k = filters
        .top_k
        .filter(|_| rows >= 65536)
        .map(|k| DeviceBuffer::from_slice(&vec![k; rows]))
        .transpose()
        .map_err(text)?;
    let mut options = filters.options();
    if let Some(ks) = &per_row_k {
        options = options.top_k(PerRow::Each(Values::new(ks)));
    }
    if let Some(b) = &bias_buffer {
        options = options.bias(Rows::new(b, shape(1, cols)).map_err(text)?);
    }
    for _ in 0..calls {
        let host = draw_tokens(
            softmax,
            Rows::new(&x, shape(rows, cols)).map_err(text)?,
            &mut random,
            &mut tokens,
            &options,
        )?;
        for t in host {
            let t = t as usize;
            if t >= cols {
                return Err(format!("token {t} outside {cols} columns"));
            }
            counts[t] += 1;
        }
    }
    let mut state = [0u64; 2];
    random.copy_to(&mut state[..]).map_err(text)?;
    if state != [seed, calls as u64] {
        return Err(format!(
            "the random state ended at {state:?} after {calls} calls"
        ));
    }
    Ok(counts)
}

fn chi_square(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let cols = 24;
    let mut logits: Vec<f32> = (0..cols).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    // Ties where top-k and top-p cut: three equal logits at the top, three in the middle.
    logits[3] = logits[1];
    logits[7] = logits[1];
    logits[10] = 0.25;
    logits[11] = 0.25;
    logits[15] = 0.25;
    let mut bias = vec![0.0f32; cols];
    bias[2] = f32::NEG_INFINITY;
    bias[5] = 1.5;
    let cases = [
        Filters::temperature(1.0),
        Filters::temperature(0.6),
        Filters {
            top_k: Some(5),
            ..Filters::temperature(1.0)
        },
        Filters {
            top_k: Some(2),
            ..Filters::temperature(1.3)
        },
        Filters {
            top_p: Some(0.7),
            ..Filters::temperature(1.0)
        },
        Filters {
            min_p: Some(0.15),
            ..Filters::temperature(0.9)
        },
        Filters {
            top_k: Some(12),
            top_p: Some(0.9),
            min_p: Some(0.05),
            temperature: 0.8,
        },
    ];
    // 2^20 draws a case: as many rows as give every multiprocessor a block, with a top-k per
    // row (the row kernel), and a batch of 128 rows, whose one top-k of at most 128 takes the
    // candidate path.
    let batches = [(65536, 16), (128, 8192)];
    let mut worst: f64 = 0.0;
    let mut count = 0;
    for dtype in [DType::F32, DType::Bf16] {
        let seen = match dtype {
            DType::Bf16 => rounded::<bf16>(&logits),
            _ => logits.clone(),
        };
        for (i, filters) in cases.iter().enumerate() {
            for (with_bias, &(rows, calls)) in [false, true]
                .into_iter()
                .flat_map(|b| batches.iter().map(move |r| (b, r)))
            {
                if with_bias && i % 2 == 1 || rows < 65536 && filters.top_k.is_none() {
                    continue;
                }
                let reference_logits: Vec<f32> = if with_bias {
                    seen.iter().zip(&bias).map(|(x, b)| x + b).collect()
                } else {
                    seen.clone()
                };
                let p = filtered_distribution_f64(&reference_logits, &filters.reference());
                let b = with_bias.then_some(&bias[..]);
                let seed = 1000 + i as u64;
                let counts = match dtype {
                    DType::Bf16 => {
                        draw_counts::<bf16>(softmax, &logits, b, rows, calls, filters, seed)?
                    }
                    _ => draw_counts::<f32>(softmax, &logits, b, rows, calls, filters, seed)?,
                };
                let what = format!("{dtype:?} {filters:?} bias {with_bias} rows {rows}");
                let (statistic, critical) = check_counts(&counts, &p, &what)?;
                if critical > 0.0 {
                    worst = worst.max(statistic / critical);
                }
                count += 1;
            }
        }
    }
    Ok(format!(
        "{count} cases of {} draws each: every chi-square below its critical value at 1e-4 \
         (the largest at {:.2} of it)",
        batches[0].0 * batches[0].1,
        worst
    ))
}

fn bisection(softmax: &mut Softmax, _rng: &mut StdRng) -> Outcome {
    // A flat row of 8192 equal logits: every column in one histogram bin, more than the
    // candidates' room, so the cut is bisected; top-k keeps the first 5000 columns.
    let cols = 8192;
    let logits = vec![1.0f32; cols];
    let filters = Filters {
        top_k: Some(5000),
        ..Filters::temperature(1.0)
    };
    let p = filtered_distribution_f64(&logits, &filters.reference());
    let counts = draw_counts::<f32>(softmax, &logits, None, 2048, 128, &filters, 7)?;
    let (statistic, critical) = check_counts(&counts, &p, "flat row, top-k 5000")?;
    let top_p = Filters {
        top_p: Some(0.25),
        ..Filters::temperature(1.0)
    };
    let p = filtered_distribution_f64(&logits, &top_p.reference());
    let counts = draw_counts::<f32>(softmax, &logits, None, 2048, 64, &top_p, 8)?;
    let (s2, c2) = check_counts(&counts, &p, "flat row, top-p 0.25")?;
    Ok(format!(
        "flat rows bisected: top-k chi-square {statistic:.0} (critical {critical:.0}), top-p \
         {s2:.0} (critical {c2:.0})"
    ))
}

/// Tokens, filtered and unfiltered log-probabilities, and the written distribution.
type Sampled = (Vec<u32>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Samples `logits` (`rows × cols`, as `T`) with `filters` and returns the tokens, both
/// log-probabilities and the written distribution.
fn sample_all<T: Element>(
    softmax: &mut Softmax,
    logits: &[f32],
    s: Shape,
    filters: &Filters,
    seed: u64,
) -> Result<Sampled, String> {
    let x = upload::<T>(logits)?;
    let rows = s.rows();
    let mut random = DeviceBuffer::from_slice(&[seed, 3u64]).map_err(text)?;
    let mut tokens = DeviceBuffer::from_slice(&vec![0u32; rows]).map_err(text)?;
    let mut logprobs = common::poisoned(rows)?;
    let mut raw = common::poisoned(rows)?;
    let mut distribution = common::poisoned(s.len())?;
    softmax
        .sample(
            Rows::new(&x, s).map_err(text)?,
            &mut random,
            SamplingOutputs::new()
                .tokens(&mut tokens)
                .logprobs(&mut logprobs)
                .raw_logprobs(&mut raw)
                .distribution(RowsMut::new(&mut distribution, s).map_err(text)?, false),
            &filters.options(),
            &Options::new(),
        )
        .map_err(text)?;
    let mut host_tokens = vec![0u32; rows];
    tokens.copy_to(&mut host_tokens[..]).map_err(text)?;
    Ok((
        host_tokens,
        common::download(&logprobs)?,
        common::download(&raw)?,
        common::download(&distribution)?,
    ))
}

/// The log-softmax of `row / temperature` at `col`, in f64.
fn raw_logprob(row: &[f32], temperature: f64, col: usize) -> f64 {
    let z: Vec<f64> = row.iter().map(|&v| f64::from(v) / temperature).collect();
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    z[col] - lse
}

fn log_probabilities(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    // Top-k and top-p cutting in the first bins; top-p alone; a large top-k whose top-p
    // crossing comes bins before it.
    let filter_sets = [
        Filters {
            top_k: Some(50),
            top_p: Some(0.9),
            temperature: 0.8,
            min_p: None,
        },
        Filters {
            top_p: Some(0.7),
            ..Filters::temperature(1.0)
        },
        Filters {
            top_k: Some(2000),
            top_p: Some(0.5),
            ..Filters::temperature(1.0)
        },
    ];
    let mut checked = Vec::new();
    // Kept in shared memory (f32 3×32000, bf16 3×50257), read again from global memory (bf16
    // 4×128256, f32 2×262144); unaligned rows (bf16 of 50257 columns).
    let cases: [(DType, usize, usize); 4] = [
        (DType::Bf16, 4, 128_256),
        (DType::F32, 3, 32_000),
        (DType::F32, 2, 262_144),
        (DType::Bf16, 3, 50_257),
    ];
    for ((dtype, rows, cols), filters) in cases
        .into_iter()
        .flat_map(|case| filter_sets.iter().map(move |f| (case, *f)))
    {
        let s = shape(rows, cols);
        let values = common::random_matrix(rng, s, 8.0);
        let (seen, (tokens, logprobs, raw, distribution)) = match dtype {
            DType::Bf16 => (
                rounded::<bf16>(&values),
                sample_all::<bf16>(softmax, &values, s, &filters, 5)?,
            ),
            _ => (
                values.clone(),
                sample_all::<f32>(softmax, &values, s, &filters, 5)?,
            ),
        };
        let mut worst: f64 = 0.0;
        for r in 0..rows {
            let row = &seen[r * cols..(r + 1) * cols];
            let p = filtered_distribution_f64(row, &filters.reference());
            let t = tokens[r] as usize;
            if t >= cols || p[t] == 0.0 {
                return Err(format!(
                    "{dtype:?} {rows}×{cols} {filters:?} row {r}: token {t} is not kept"
                ));
            }
            let expected = p[t].ln();
            let e_raw = raw_logprob(row, f64::from(filters.temperature), t);
            let errors = [
                (f64::from(logprobs[r]) - expected).abs(),
                (f64::from(raw[r]) - e_raw).abs() / e_raw.abs().max(1.0),
            ];
            for (c, &q) in p.iter().enumerate() {
                let got = f64::from(distribution[r * cols + c]);
                worst = worst.max((got - q).abs());
            }
            let bound = 2e-5 * 1.0f64.max(expected.abs());
            if errors[0] > bound || errors[1] > 2e-5 {
                return Err(format!(
                    "{dtype:?} {rows}×{cols} row {r}: log-probabilities {} and {} against {expected} \
                     and {e_raw}",
                    logprobs[r], raw[r]
                ));
            }
        }
        if worst > 1e-5 {
            return Err(format!(
                "{dtype:?} {rows}×{cols} {filters:?}: the distribution differs from the reference \
                 by {worst:.2e}"
            ));
        }
        checked.push(format!("{dtype:?} {rows}×{cols} {filters:?}"));
    }
    Ok(format!(
        "tokens kept, log-probabilities and distribution as the reference: {}",
        checked.join(", ")
    ))
}

fn greedy(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let (rows, cols) = (16, 5000);
    let s = shape(rows, cols);
    let mut values = common::random_matrix(rng, s, 4.0);
    for r in 0..rows {
        // The largest logit twice (or more), the first at a random column.
        let first = rng.random_range(0..cols - 10);
        let top = 9.0 + r as f32;
        values[r * cols + first] = top;
        values[r * cols + first + 1 + r % 7] = top;
        values[r * cols + cols - 1] = top;
    }
    for dtype in [DType::F32, DType::Bf16] {
        let filters = Filters {
            top_k: Some(3),
            ..Filters::temperature(0.0)
        };
        let (seen, (tokens, logprobs, raw, _)) = match dtype {
            DType::Bf16 => (
                rounded::<bf16>(&values),
                sample_all::<bf16>(softmax, &values, s, &filters, 9)?,
            ),
            _ => (
                values.clone(),
                sample_all::<f32>(softmax, &values, s, &filters, 9)?,
            ),
        };
        for r in 0..rows {
            let row = &seen[r * cols..(r + 1) * cols];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let first = row.iter().position(|&v| v == max).unwrap();
            if tokens[r] as usize != first || logprobs[r] != 0.0 {
                return Err(format!(
                    "{dtype:?} row {r}: token {} (log-probability {}), the first maximum is {first}",
                    tokens[r], logprobs[r]
                ));
            }
            let e = raw_logprob(row, 1.0, first);
            if (f64::from(raw[r]) - e).abs() > 2e-5 * e.abs().max(1.0) {
                return Err(format!(
                    "{dtype:?} row {r}: raw log-probability {} against {e}",
                    raw[r]
                ));
            }
        }
    }
    // Tokens alone take the draw entry: its rows sliced (4 rows) and whole (300), bf16 of an
    // odd width, so the rows after the first are read through the runs after the packs.
    for draw_rows in [4usize, 300] {
        let cols = 5001;
        let s = shape(draw_rows, cols);
        let mut values = common::random_matrix(rng, s, 4.0);
        for r in 0..draw_rows {
            let first = rng.random_range(0..cols - 10);
            let top = 9.0 + (r % 50) as f32;
            values[r * cols + first] = top;
            values[r * cols + first + 1 + r % 7] = top;
            values[r * cols + cols - 1] = top;
        }
        let values = rounded::<bf16>(&values);
        let x = upload::<bf16>(&values)?;
        let mut random = DeviceBuffer::from_slice(&[3u64, 0]).map_err(text)?;
        let mut tokens = DeviceBuffer::from_slice(&vec![0u32; draw_rows]).map_err(text)?;
        let drawn = draw_tokens(
            softmax,
            Rows::new(&x, s).map_err(text)?,
            &mut random,
            &mut tokens,
            &SamplingOptions::new().temperature(0.0),
        )?;
        for (r, &token) in drawn.iter().enumerate() {
            let row = &values[r * cols..(r + 1) * cols];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let first = row.iter().position(|&v| v == max).unwrap();
            if token as usize != first {
                return Err(format!(
                    "draw entry, {draw_rows}×{cols} bf16 row {r}: token {token}, the first \
                     maximum is {first}"
                ));
            }
        }
    }
    Ok(format!(
        "greedy is the first maximum on {rows} rows with ties, f32 and bf16, and through the \
         draw entry on 4 and 300 bf16 rows of 5001 columns"
    ))
}

fn without_a_token(softmax: &mut Softmax, _rng: &mut StdRng) -> Outcome {
    let cols = 300;
    let mut values = vec![0.5f32; 6 * cols];
    values[3] = f32::NAN;
    values[cols + 7] = f32::INFINITY;
    values[2 * cols..3 * cols].fill(f32::NEG_INFINITY);
    values[3 * cols..4 * cols].fill(f32::NEG_INFINITY);
    values[3 * cols + 123] = -4.0;
    let s = shape(6, cols);
    let x = upload::<f32>(&values)?;
    // Per-row parameters: row 4 has a NaN temperature, row 5 a top-p of 0.
    let temperatures =
        DeviceBuffer::from_slice(&[1.0f32, 1.0, 1.0, 1.0, f32::NAN, 1.0]).map_err(text)?;
    let top_ps = DeviceBuffer::from_slice(&[1.0f32, 1.0, 1.0, 0.5, 1.0, 0.0]).map_err(text)?;
    let mut random = DeviceBuffer::from_slice(&[1u64, 0]).map_err(text)?;
    let mut tokens = DeviceBuffer::from_slice(&[0u32; 6]).map_err(text)?;
    let mut logprobs = common::poisoned(6)?;
    softmax
        .sample(
            Rows::new(&x, s).map_err(text)?,
            &mut random,
            SamplingOutputs::new()
                .tokens(&mut tokens)
                .logprobs(&mut logprobs),
            &SamplingOptions::new()
                .temperature(PerRow::Each(Values::new(&temperatures)))
                .top_p(PerRow::Each(Values::new(&top_ps))),
            &Options::new(),
        )
        .map_err(text)?;
    let mut got = [0u32; 6];
    tokens.copy_to(&mut got[..]).map_err(text)?;
    let logprobs = common::download(&logprobs)?;
    let expected = [NO_TOKEN, NO_TOKEN, NO_TOKEN, 123, NO_TOKEN, NO_TOKEN];
    if got != expected {
        return Err(format!("tokens {got:?}, expected {expected:?}"));
    }
    for (r, &t) in expected.iter().enumerate() {
        if (t == NO_TOKEN) != logprobs[r].is_nan() {
            return Err(format!("row {r}: log-probability {}", logprobs[r]));
        }
    }
    Ok("NaN, +inf, all -inf and bad per-row parameters give NO_TOKEN and NaN; one finite logit is drawn".into())
}

/// The tokens of one call on `values` (`rows × cols` f32) at `seed` and `offset`, temperature
/// `t` and top-k 40, without advancing.
fn tokens_of(
    softmax: &mut Softmax,
    values: &[f32],
    s: Shape,
    seed: u64,
    offset: u64,
) -> Result<Vec<u32>, String> {
    let x = upload::<f32>(values)?;
    let mut random = DeviceBuffer::from_slice(&[seed, offset]).map_err(text)?;
    let mut tokens = DeviceBuffer::from_slice(&vec![0u32; s.rows()]).map_err(text)?;
    draw_tokens(
        softmax,
        Rows::new(&x, s).map_err(text)?,
        &mut random,
        &mut tokens,
        &SamplingOptions::new()
            .temperature(1.2)
            .top_k(40)
            .advance(false),
    )
}

/// One call's tokens of `logits` with `random` and `options`, drawn into `tokens` and read
/// back.
fn draw_tokens(
    softmax: &mut Softmax,
    logits: Rows<'_>,
    random: &mut DeviceBuffer<u64>,
    tokens: &mut DeviceBuffer<u32>,
    options: &SamplingOptions<'_>,
) -> Result<Vec<u32>, String> {
    softmax
        .sample(
            logits,
            random,
            SamplingOutputs::new().tokens(&mut *tokens),
            options,
            &Options::new(),
        )
        .map_err(text)?;
    let mut host = vec![0u32; tokens.len()];
    tokens.copy_to(&mut host[..]).map_err(text)?;
    Ok(host)
}

fn reproducible(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let cols = 32000;
    let small = shape(8, cols);
    let large = shape(32, cols);
    let mut values = common::random_matrix(rng, large, 2.0);
    let first = tokens_of(softmax, &values[..small.len()], small, 42, 10)?;
    let again = tokens_of(softmax, &values[..small.len()], small, 42, 10)?;
    if first != again {
        return Err("the same seed and offset drew different tokens".into());
    }
    // The same first rows in a larger batch whose other rows differ.
    for v in &mut values[small.len()..] {
        *v = -*v;
    }
    let batch = tokens_of(softmax, &values, large, 42, 10)?;
    if batch[..8] != first[..] {
        return Err("a row's token changed with the other rows of its batch".into());
    }
    let next = tokens_of(softmax, &values[..small.len()], small, 42, 11)?;
    let other_seed = tokens_of(softmax, &values[..small.len()], small, 43, 10)?;
    let same = |a: &[u32]| a.iter().zip(&first).filter(|(x, y)| x == y).count();
    if same(&next) == 8 || same(&other_seed) == 8 {
        return Err("another offset or seed drew the same 8 tokens".into());
    }
    Ok(format!(
        "same seed and offset, same tokens; rows independent of the batch; another offset kept \
         {} of 8, another seed {} of 8",
        same(&next),
        same(&other_seed)
    ))
}

fn captured(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    use cust::stream::{Stream, StreamFlags};
    let (rows, cols) = (8, 32000);
    let s = shape(rows, cols);
    softmax
        .reserve(&[(CallKind::Sampling { input: DType::Bf16 }, s)])
        .map_err(text)?;
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).map_err(text)?;
    let values = rounded::<bf16>(&common::random_matrix(rng, s, 3.0));
    let x = upload::<bf16>(&values)?;
    let start = 1000u64;
    let mut random = DeviceBuffer::from_slice(&[77u64, start]).map_err(text)?;
    let mut tokens = DeviceBuffer::from_slice(&vec![0u32; rows]).map_err(text)?;
    let options = SamplingOptions::new()
        .temperature(0.9)
        .top_k(64)
        .top_p(0.95);
    common::begin_capture(&stream)?;
    let call = softmax.sample(
        Rows::new(&x, s).map_err(text)?,
        &mut random,
        SamplingOutputs::new().tokens(&mut tokens),
        &options,
        &Options::new().on(&stream),
    );
    let exec = common::end_capture(&stream);
    call.map_err(|e| format!("the reserved call during capture: {e}"))?;
    let exec = exec?;
    let replays = 100;
    let mut seen = Vec::new();
    for replay in 0..replays {
        // SAFETY: an executable graph of this context, launched on one of its streams.
        let status = unsafe { cust::sys::cuGraphLaunch(exec, stream.as_inner()) };
        if status != cust::sys::CUresult::CUDA_SUCCESS {
            return Err(format!("replay {replay}: {status:?}"));
        }
        stream.synchronize().map_err(text)?;
        let mut host = vec![0u32; rows];
        tokens.copy_to(&mut host[..]).map_err(text)?;
        seen.push(host);
    }
    // SAFETY: the executable graph is not used again.
    unsafe { cust::sys::cuGraphExecDestroy(exec) };
    let mut state = [0u64; 2];
    random.copy_to(&mut state[..]).map_err(text)?;
    if state != [77, start + replays as u64] {
        return Err(format!(
            "the random state after {replays} replays: {state:?}"
        ));
    }
    let distinct = {
        let mut all = seen.clone();
        all.sort();
        all.dedup();
        all.len()
    };
    if distinct < replays / 2 {
        return Err(format!(
            "only {distinct} distinct draws in {replays} replays"
        ));
    }
    for (replay, host) in seen.iter().enumerate() {
        let mut direct_random =
            DeviceBuffer::from_slice(&[77u64, start + replay as u64]).map_err(text)?;
        let mut direct = DeviceBuffer::from_slice(&vec![0u32; rows]).map_err(text)?;
        softmax
            .sample(
                Rows::new(&x, s).map_err(text)?,
                &mut direct_random,
                SamplingOutputs::new().tokens(&mut direct),
                &options.advance(false),
                &Options::new(),
            )
            .map_err(text)?;
        let mut expected = vec![0u32; rows];
        direct.copy_to(&mut expected[..]).map_err(text)?;
        if &expected != host {
            return Err(format!(
                "replay {replay} differs from the direct call at its offset"
            ));
        }
    }
    Ok(format!(
        "{replays} replays: the offset advanced {replays} times, {distinct} distinct draws, each \
         the direct call's at its offset"
    ))
}

fn shards(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    // f32 rows of 16-byte packs; bf16 rows of an odd width, so no row but the first is
    // aligned for packs and the whole row goes through the runs after the packs, with a
    // shard starting at 4 mod 8 columns (a pack's chunks then take two Philox calls).
    let aligned = shards_of::<f32>(softmax, rng, 50_000)?;
    let odd = shards_of::<bf16>(softmax, rng, 50_001)?;
    Ok(format!("{aligned}; {odd}"))
}

/// Temperature-only draws of 6 rows of `cols` columns (`T`): the whole rows (sliced; once more
/// advancing the offset, which the merge then advances once), the same rows in a batch of 300
/// (unsliced), the f64 reference's draws, and 1, 2, 3 and 8 shards merged, all the same
/// tokens.
fn shards_of<T: Element>(softmax: &mut Softmax, rng: &mut StdRng, cols: usize) -> Outcome {
    let rows = 6;
    let s = shape(rows, cols);
    let values = rounded::<T>(&common::random_matrix(rng, s, 3.0));
    let temperature = 0.9;
    let options = SamplingOptions::new()
        .temperature(temperature)
        .advance(false);
    // The whole row, through the full call.
    let x = upload::<T>(&values)?;
    let mut random = DeviceBuffer::from_slice(&[5u64, 9]).map_err(text)?;
    let mut tokens = DeviceBuffer::from_slice(&vec![0u32; rows]).map_err(text)?;
    let mut logprobs = common::poisoned(rows)?;
    softmax
        .sample(
            Rows::new(&x, s).map_err(text)?,
            &mut random,
            SamplingOutputs::new()
                .tokens(&mut tokens)
                .logprobs(&mut logprobs),
            &options,
            &Options::new(),
        )
        .map_err(text)?;
    let mut whole = vec![0u32; rows];
    tokens.copy_to(&mut whole[..]).map_err(text)?;
    let whole_logprobs = common::download(&logprobs)?;
    let dtype = T::DTYPE;
    // The same call advancing the offset: the merge of the sliced draws advances it once,
    // after the slices drew at the offset it had.
    let mut advancing = DeviceBuffer::from_slice(&[5u64, 9]).map_err(text)?;
    let again = draw_tokens(
        softmax,
        Rows::new(&x, s).map_err(text)?,
        &mut advancing,
        &mut tokens,
        &SamplingOptions::new().temperature(temperature),
    )?;
    let mut state = [0u64; 2];
    advancing.copy_to(&mut state[..]).map_err(text)?;
    if state != [5, 10] || again != whole {
        return Err(format!(
            "{dtype:?}: an advancing call left the state at {state:?} (expected [5, 10]) and \
             drew {again:?} (expected {whole:?})"
        ));
    }
    // The same rows at the top of a batch of 300 (enough rows that they are not sliced).
    let batch_rows = 300;
    let mut batch = values.clone();
    batch.extend(rounded::<T>(&common::random_matrix(
        rng,
        shape(batch_rows - rows, cols),
        3.0,
    )));
    let xb = upload::<T>(&batch)?;
    let mut batch_tokens = DeviceBuffer::from_slice(&vec![0u32; batch_rows]).map_err(text)?;
    let unsliced = draw_tokens(
        softmax,
        Rows::new(&xb, shape(batch_rows, cols)).map_err(text)?,
        &mut random,
        &mut batch_tokens,
        &options,
    )?;
    if unsliced[..rows] != whole[..] {
        return Err(format!(
            "{dtype:?}: rows drawn in slices {whole:?}, in a batch of {batch_rows} {:?}",
            &unsliced[..rows]
        ));
    }
    // The f64 reference's draw of each whole row gives the same tokens.
    let reference = SamplingReference {
        temperature: f64::from(temperature),
        top_k: None,
        top_p: None,
        min_p: None,
    };
    for r in 0..rows {
        let row = &values[r * cols..(r + 1) * cols];
        let distribution = filtered_distribution_f64(row, &reference);
        let token = gumbel_draw_f64(&distribution, &reference, 5, 9, r as u32, 0);
        if token != whole[r] {
            return Err(format!(
                "{dtype:?} row {r}: the device drew {}, the f64 reference {token}",
                whole[r]
            ));
        }
    }
    let mut offsets = Vec::new();
    for count in [1usize, 2, 3, 8] {
        // Shards start at multiples of 4 columns (3 shards of 50000: 16664, 16668, 16668).
        let bounds: Vec<usize> = (0..=count)
            .map(|i| {
                if i == count {
                    cols
                } else {
                    i * cols / count / 4 * 4
                }
            })
            .collect();
        offsets.extend(bounds[1..count].iter().copied());
        let mut merged: Vec<Option<ShardDraw>> = vec![None; rows];
        for pair in bounds.windows(2) {
            let (from, to) = (pair[0], pair[1]);
            let width = to - from;
            let part: Vec<f32> = (0..rows)
                .flat_map(|r| values[r * cols + from..r * cols + to].iter().copied())
                .collect();
            let shard = upload::<T>(&part)?;
            let mut draws =
                DeviceBuffer::from_slice(&vec![ShardDraw::default(); rows]).map_err(text)?;
            softmax
                .sample_shard(
                    Rows::new(&shard, shape(rows, width)).map_err(text)?,
                    from,
                    &mut random,
                    &mut draws,
                    &options,
                    &Options::new(),
                )
                .map_err(text)?;
            let mut host = vec![ShardDraw::default(); rows];
            draws.copy_to(&mut host[..]).map_err(text)?;
            for (m, d) in merged.iter_mut().zip(host) {
                *m = Some(m.map_or(d, |m| merge_shard_draws(m, d)));
            }
        }
        for r in 0..rows {
            let (token, logprob) = shard_draw_token(merged[r].unwrap());
            if token != whole[r] || (logprob - whole_logprobs[r]).abs() > 1e-4 {
                return Err(format!(
                    "{dtype:?}, {count} shards, row {r}: token {token} (log-probability \
                     {logprob}), the whole row's {} ({})",
                    whole[r], whole_logprobs[r]
                ));
            }
        }
    }
    if !offsets.iter().any(|o| o % 8 == 4) {
        return Err(format!(
            "{dtype:?}: no shard starts at 4 mod 8 columns: {offsets:?}"
        ));
    }
    Ok(format!(
        "{dtype:?}: 1, 2, 3 and 8 shards of {rows}×{cols} draw the whole row's tokens, which \
         are the f64 reference's"
    ))
}

/// A call's tokens, log-probabilities and raw log-probabilities.
type Drawn = (Vec<u32>, Vec<f32>, Vec<f32>);

/// One call's tokens, log-probabilities and raw log-probabilities of `logits` (`T`) with
/// `options` at seed 11, offset 4.
fn tokens_and_logprobs<T: Element>(
    softmax: &mut Softmax,
    logits: &[f32],
    s: Shape,
    options: &SamplingOptions<'_>,
) -> Result<Drawn, String> {
    let x = upload::<T>(logits)?;
    let rows = s.rows();
    let mut random = DeviceBuffer::from_slice(&[11u64, 4]).map_err(text)?;
    let mut tokens = DeviceBuffer::from_slice(&vec![0u32; rows]).map_err(text)?;
    let mut logprobs = common::poisoned(rows)?;
    let mut raw = common::poisoned(rows)?;
    softmax
        .sample(
            Rows::new(&x, s).map_err(text)?,
            &mut random,
            SamplingOutputs::new()
                .tokens(&mut tokens)
                .logprobs(&mut logprobs)
                .raw_logprobs(&mut raw),
            options,
            &Options::new(),
        )
        .map_err(text)?;
    let mut host = vec![0u32; rows];
    tokens.copy_to(&mut host[..]).map_err(text)?;
    Ok((host, common::download(&logprobs)?, common::download(&raw)?))
}

/// A top-k of at most 128 for every row takes the candidate path (slices of 8192 columns, their
/// best `k` merged); the same top-k given per row takes the row kernel. Both keep the same
/// columns and draw them with the same noise: the same tokens, and log-probabilities within
/// the sums' rounding. Rows with ties across the cut, a row of equal values, rows with fewer
/// finite columns than `k`, a NaN row, greedy, top-p and min-p after the top-k; one slice, several, a partial
/// last slice, unaligned rows; f32 and bf16.
fn candidates(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut calls = 0;
    let mut worst: f64 = 0.0;
    for (rows, cols) in [(5, 100), (3, 8192), (4, 8193), (3, 50_257), (2, 262_144)] {
        let s = shape(rows, cols);
        let mut logits = common::random_matrix(rng, s, 4.0);
        // Row 1: coarse values, many ties at any cut.
        for v in &mut logits[cols..2 * cols] {
            *v = (*v * 2.0).round() * 0.5;
        }
        // Row 2 (where there is one after): 10 finite columns, fewer than most top-k.
        if rows > 2 {
            for (c, v) in logits[2 * cols..3 * cols].iter_mut().enumerate() {
                if c % (cols / 10).max(1) != 3 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        // The last row of the three-row shapes: a NaN, which leaves no token.
        if rows == 3 {
            logits[2 * cols + cols / 2] = f32::NAN;
        }
        // The last row of the four-row shape: every value equal, so that a slice has more keys
        // at its bound than it gathers (the radix select over the slice's keys places the cut).
        if rows == 4 {
            logits[3 * cols..].fill(0.25);
        }
        let per_row = |k: u32| DeviceBuffer::from_slice(&vec![k; rows]).map_err(text);
        for (k, top_p, min_p, temperature) in [
            (1, None, None, 1.0),
            (50, None, None, 0.7),
            (50, Some(0.9), None, 1.0),
            (128, Some(0.8), Some(0.02), 1.3),
            (20, Some(0.5), None, 0.0),
        ] {
            let ks = per_row(k)?;
            fn with(
                o: SamplingOptions<'_>,
                (temperature, top_p, min_p): (f32, Option<f32>, Option<f32>),
            ) -> SamplingOptions<'_> {
                let mut o = o.temperature(temperature).advance(false);
                if let Some(p) = top_p {
                    o = o.top_p(p);
                }
                if let Some(p) = min_p {
                    o = o.min_p(p);
                }
                o
            }
            let rest = (temperature, top_p, min_p);
            let fast = with(SamplingOptions::new().top_k(k), rest);
            let rows_kernel = with(
                SamplingOptions::new().top_k(PerRow::Each(Values::new(&ks))),
                rest,
            );
            for dtype in [DType::F32, DType::Bf16] {
                let (a, b) = both_paths(softmax, dtype, &logits, s, (&fast, &rows_kernel))?;
                let what = format!(
                    "{dtype:?} {rows}×{cols} k {k} top-p {top_p:?} min-p {min_p:?} t {temperature}"
                );
                same_draws(&a, &b, &what, &mut worst)?;
                if rows == 3 && a.0[2] != NO_TOKEN {
                    return Err(format!("{what}: the NaN row drew {}", a.0[2]));
                }
                calls += 1;
            }
        }
    }
    // Per-row temperatures and top-p with the one top-k, a row whose top-p is out of range
    // (no token), and a bias across the slices (bans and boosts).
    let s = shape(4, 50_257);
    let logits = common::random_matrix(rng, s, 3.0);
    let temperatures = DeviceBuffer::from_slice(&[0.6f32, 1.0, 1.7, 0.9]).map_err(text)?;
    let top_ps = DeviceBuffer::from_slice(&[0.9f32, 0.0, 0.5, 1.0]).map_err(text)?;
    let ks = DeviceBuffer::from_slice(&[40u32; 4]).map_err(text)?;
    let bias: Vec<f32> = (0..50_257)
        .map(|c| match c % 997 {
            0 => f32::NEG_INFINITY,
            1 => 3.0,
            _ => 0.0,
        })
        .collect();
    let bias = DeviceBuffer::from_slice(&bias).map_err(text)?;
    let with = |o: SamplingOptions<'static>| -> Result<SamplingOptions<'_>, String> {
        Ok(o.temperature(PerRow::Each(Values::new(&temperatures)))
            .top_p(PerRow::Each(Values::new(&top_ps)))
            .bias(Rows::new(&bias, shape(1, 50_257)).map_err(text)?)
            .advance(false))
    };
    let fast = with(SamplingOptions::new().top_k(40))?;
    let rows_kernel = with(SamplingOptions::new())?.top_k(PerRow::Each(Values::new(&ks)));
    for dtype in [DType::F32, DType::Bf16] {
        let (a, b) = both_paths(softmax, dtype, &logits, s, (&fast, &rows_kernel))?;
        let what = format!("{dtype:?} 4×50257, per-row temperatures and top-p, a bias");
        same_draws(&a, &b, &what, &mut worst)?;
        if a.0[1] != NO_TOKEN || a.0.iter().any(|&t| t != NO_TOKEN && t % 997 == 0) {
            return Err(format!(
                "{what}: tokens {:?} (row 1 has top-p 0; columns 997·n are banned)",
                a.0
            ));
        }
        calls += 1;
    }
    Ok(format!(
        "{calls} calls: the candidate path drew the row kernel's tokens; log-probabilities \
         within {worst:.1e} (relative, at least 1)"
    ))
}

/// The draws of `logits` as `dtype` through the candidate path's options, then the row
/// kernel's.
fn both_paths(
    softmax: &mut Softmax,
    dtype: DType,
    logits: &[f32],
    s: Shape,
    (fast, rows_kernel): (&SamplingOptions<'_>, &SamplingOptions<'_>),
) -> Result<(Drawn, Drawn), String> {
    match dtype {
        DType::Bf16 => Ok((
            tokens_and_logprobs::<bf16>(softmax, logits, s, fast)?,
            tokens_and_logprobs::<bf16>(softmax, logits, s, rows_kernel)?,
        )),
        _ => Ok((
            tokens_and_logprobs::<f32>(softmax, logits, s, fast)?,
            tokens_and_logprobs::<f32>(softmax, logits, s, rows_kernel)?,
        )),
    }
}

/// Whether two calls drew the same tokens, with log-probabilities (filtered and raw) within
/// `2e-5·max(1, |log p|)` of each other (NaN where the other is); the largest such gap so
/// far in `worst`.
fn same_draws(a: &Drawn, b: &Drawn, what: &str, worst: &mut f64) -> Result<(), String> {
    if a.0 != b.0 {
        return Err(format!(
            "{what}: tokens {:?}, the row kernel's {:?}",
            a.0, b.0
        ));
    }
    for r in 0..a.0.len() {
        for (x, y) in [(a.1[r], b.1[r]), (a.2[r], b.2[r])] {
            let gap = f64::from((x - y).abs()) / f64::from(y.abs()).max(1.0);
            if x.is_nan() != y.is_nan() || (!x.is_nan() && gap > 2e-5) {
                return Err(format!(
                    "{what}, row {r}: log-probability {x}, the row kernel's {y}"
                ));
            }
            if !x.is_nan() {
                *worst = worst.max(gap);
            }
        }
    }
    Ok(())
}

fn bad_input(softmax: &mut Softmax, _rng: &mut StdRng) -> Outcome {
    let s = shape(2, 100);
    let x = upload::<f32>(&[0.0; 200])?;
    let mut random = DeviceBuffer::from_slice(&[1u64, 0]).map_err(text)?;
    let mut short = DeviceBuffer::from_slice(&[1u64, 0, 0]).map_err(text)?;
    let mut tokens = DeviceBuffer::from_slice(&[0u32; 2]).map_err(text)?;
    let mut one_token = DeviceBuffer::from_slice(&[0u32; 1]).map_err(text)?;
    let bias16 = upload::<bf16>(&[0.0; 100])?;
    let mut refused = 0;
    let mut expect = |what: &str, result: softmax::Result<()>| -> Result<(), String> {
        match result {
            Err(Error::SamplingOption { .. } | Error::PerRowLength { .. }) => {
                refused += 1;
                Ok(())
            }
            other => Err(format!("{what}: {other:?}")),
        }
    };
    let o = Options::new();
    for (what, options) in [
        (
            "a negative temperature",
            SamplingOptions::new().temperature(-1.0),
        ),
        (
            "a NaN temperature",
            SamplingOptions::new().temperature(f32::NAN),
        ),
        ("top-k 0", SamplingOptions::new().top_k(0)),
        ("top-p 0", SamplingOptions::new().top_p(0.0)),
        ("top-p 1.5", SamplingOptions::new().top_p(1.5)),
        ("min-p 2", SamplingOptions::new().min_p(2.0)),
        (
            "an f16 bias",
            SamplingOptions::new().bias(Rows::new(&bias16, shape(1, 100)).map_err(text)?),
        ),
    ] {
        let result = softmax.sample(
            Rows::new(&x, s).map_err(text)?,
            &mut random,
            SamplingOutputs::new().tokens(&mut tokens),
            &options,
            &o,
        );
        expect(what, result)?;
    }
    expect(
        "a random state of three words",
        softmax.sample(
            Rows::new(&x, s).map_err(text)?,
            &mut short,
            SamplingOutputs::new().tokens(&mut tokens),
            &SamplingOptions::new(),
            &o,
        ),
    )?;
    expect(
        "one token for two rows",
        softmax.sample(
            Rows::new(&x, s).map_err(text)?,
            &mut random,
            SamplingOutputs::new().tokens(&mut one_token),
            &SamplingOptions::new(),
            &o,
        ),
    )?;
    let mut draws = DeviceBuffer::from_slice(&[ShardDraw::default(); 2]).map_err(text)?;
    expect(
        "a shard with top-k",
        softmax.sample_shard(
            Rows::new(&x, s).map_err(text)?,
            0,
            &mut random,
            &mut draws,
            &SamplingOptions::new().top_k(3),
            &o,
        ),
    )?;
    expect(
        "a shard starting inside a chunk of four columns",
        softmax.sample_shard(
            Rows::new(&x, s).map_err(text)?,
            6,
            &mut random,
            &mut draws,
            &SamplingOptions::new(),
            &o,
        ),
    )?;
    Ok(format!("{refused} bad calls refused with typed errors"))
}
