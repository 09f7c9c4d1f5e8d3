//! Sampling a token from each row of logits on the device: temperature (0 is greedy), top-k,
//! top-p and min-p, an additive bias, a random state in device memory that the call advances
//! there (so a captured graph draws new numbers at every replay), the token's
//! log-probabilities, and vocabulary shards for temperature sampling.

pub use kernels_gpu::launch::sampling::{NO_TOKEN, ShardDraw};
use kernels_gpu::launch::sampling::{SamplingParams, TOP_K_CANDIDATES, sampling_mode};

use super::Softmax;
use super::call::{Frame, Span, check_per_row, check_shapes};
use super::options::Options;
use super::views::{DType, Rows, RowsMut, Value, Values, ValuesMut, merge_row_states};
use crate::error::{Error, Result};
use crate::plan::{Layout, Request, SamplingWork};
use crate::runtime::CallBuffers;

/// A parameter of every row (`All`) or one per row in device memory (`Each`).
#[derive(Clone, Copy, Debug)]
pub enum PerRow<'a, T> {
    All(T),
    Each(Values<'a, T>),
}

impl<T> From<T> for PerRow<'_, T> {
    fn from(value: T) -> Self {
        PerRow::All(value)
    }
}

/// The filters and random state of a sampling call. A row's logits (plus its bias) are
/// divided by its temperature; then top-k keeps its `k` most probable columns, top-p the
/// fewest of those, most probable first, whose probability (renormalized over the top-k)
/// reaches `p`, and min-p those whose probability is at least `min_p` times the largest; the
/// lower column goes first among equal logits. Temperature 0 is greedy: the largest logit,
/// the lowest column among equals.
///
/// Values for every row are checked before any launch (typed errors). Per-row values on the
/// device cannot be: there `top_k` 0 means no top-k, `top_p` 1 no top-p and `min_p` 0 no
/// min-p, and a row whose temperature is negative, infinite or NaN, whose `top_p` is outside
/// (0, 1] or whose `min_p` is outside [0, 1] gets [`NO_TOKEN`] and NaN log-probabilities.
#[derive(Clone, Copy, Debug)]
pub struct SamplingOptions<'a> {
    temperature: PerRow<'a, f32>,
    top_k: Option<PerRow<'a, u32>>,
    top_p: Option<PerRow<'a, f32>>,
    min_p: Option<PerRow<'a, f32>>,
    bias: Option<Rows<'a>>,
    advance: bool,
}

impl Default for SamplingOptions<'_> {
    fn default() -> Self {
        SamplingOptions {
            temperature: PerRow::All(1.0),
            top_k: None,
            top_p: None,
            min_p: None,
            bias: None,
            advance: true,
        }
    }
}

impl<'a> SamplingOptions<'a> {
    /// Temperature 1, no filter, the offset advanced.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn temperature(mut self, temperature: impl Into<PerRow<'a, f32>>) -> Self {
        self.temperature = temperature.into();
        self
    }

    pub fn top_k(mut self, k: impl Into<PerRow<'a, u32>>) -> Self {
        self.top_k = Some(k.into());
        self
    }

    pub fn top_p(mut self, p: impl Into<PerRow<'a, f32>>) -> Self {
        self.top_p = Some(p.into());
        self
    }

    pub fn min_p(mut self, p: impl Into<PerRow<'a, f32>>) -> Self {
        self.min_p = Some(p.into());
        self
    }

    /// An f32 bias added to the logits before the temperature: one row for every row, or
    /// one per row (`-inf` bans a column).
    pub fn bias(mut self, bias: Rows<'a>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Whether the call adds 1 to the random offset after its draws (on by default; turn it
    /// off to draw the same numbers again, or for every shard of one draw but the last).
    pub fn advance(mut self, advance: bool) -> Self {
        self.advance = advance;
        self
    }

    /// The parameters' checks and the scalar values of the kernel's parameters.
    fn check(&self, rows: usize) -> Result<SamplingParams> {
        let bad = |why: String| Err(Error::SamplingOption { why });
        let mut params = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            ..SamplingParams::default()
        };
        match self.temperature {
            PerRow::All(t) if !(0.0..f32::INFINITY).contains(&t) => {
                return bad(format!(
                    "the temperature must be finite and at least 0, got {t}"
                ));
            }
            PerRow::All(t) => params.temperature = t,
            PerRow::Each(v) => check_per_row(v.len, rows, "temperatures")?,
        }
        match self.top_k {
            Some(PerRow::All(0)) => return bad("top-k must be at least 1".into()),
            Some(PerRow::All(k)) => params.top_k = k,
            Some(PerRow::Each(v)) => check_per_row(v.len, rows, "top-k values")?,
            None => {}
        }
        match self.top_p {
            Some(PerRow::All(p)) if !(p > 0.0 && p <= 1.0) => {
                return bad(format!("top-p must be in (0, 1], got {p}"));
            }
            Some(PerRow::All(p)) => params.top_p = p,
            Some(PerRow::Each(v)) => check_per_row(v.len, rows, "top-p values")?,
            None => {}
        }
        match self.min_p {
            Some(PerRow::All(p)) if !(0.0..=1.0).contains(&p) => {
                return bad(format!("min-p must be in [0, 1], got {p}"));
            }
            Some(PerRow::All(p)) => params.min_p = p,
            Some(PerRow::Each(v)) => check_per_row(v.len, rows, "min-p values")?,
            None => {}
        }
        Ok(params)
    }
}

/// Where a sampling call writes: the token of each row (u32, [`NO_TOKEN`] for a row without
/// one), its log-probability under the filtered distribution and under the unfiltered one
/// (the softmax of the logits plus bias over the temperature; over the logits plus bias for
/// a greedy row), one f32 per row each, and the filtered distribution (f32 rows of the
/// logits' shape: probabilities, or log-probabilities with `-inf` where dropped).
#[derive(Debug, Default)]
pub struct SamplingOutputs<'a> {
    tokens: Option<ValuesMut<'a, u32>>,
    logprobs: Option<ValuesMut<'a, f32>>,
    raw_logprobs: Option<ValuesMut<'a, f32>>,
    distribution: Option<(RowsMut<'a>, bool)>,
}

impl<'a> SamplingOutputs<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn tokens(mut self, tokens: impl Into<ValuesMut<'a, u32>>) -> Self {
        self.tokens = Some(tokens.into());
        self
    }

    /// The chosen token's log-probability under the filtered distribution.
    pub fn logprobs(mut self, logprobs: impl Into<ValuesMut<'a, f32>>) -> Self {
        self.logprobs = Some(logprobs.into());
        self
    }

    /// The chosen token's log-probability under the unfiltered distribution.
    pub fn raw_logprobs(mut self, logprobs: impl Into<ValuesMut<'a, f32>>) -> Self {
        self.raw_logprobs = Some(logprobs.into());
        self
    }

    /// The filtered distribution, as probabilities (`log` false) or log-probabilities.
    pub fn distribution(mut self, rows: RowsMut<'a>, log: bool) -> Self {
        self.distribution = Some((rows, log));
        self
    }
}

/// Merges the draws of two disjoint shards of a row's vocabulary: the larger score (the
/// lower token among equals), the row statistics merged. A shard without a token (NaN score)
/// makes the merge have none.
pub fn merge_shard_draws(a: ShardDraw, b: ShardDraw) -> ShardDraw {
    if a.score.is_nan() || b.score.is_nan() {
        return ShardDraw {
            score: f32::NAN,
            token: NO_TOKEN,
            logit: f32::NAN,
            row: merge_row_states(a.row, b.row),
        };
    }
    let winner = if b.score > a.score || (b.score == a.score && b.token < a.token) {
        b
    } else {
        a
    };
    ShardDraw {
        row: merge_row_states(a.row, b.row),
        ..winner
    }
}

/// The token of a draw merged over every shard, and its log-probability (filtered and
/// unfiltered are one: temperature sampling keeps every column).
pub fn shard_draw_token(draw: ShardDraw) -> (u32, f32) {
    if draw.score.is_nan() || draw.token == NO_TOKEN {
        return (NO_TOKEN, f32::NAN);
    }
    (draw.token, draw.logit - draw.row.max - draw.row.sum.ln())
}

impl Softmax {
    /// Samples a token from each row of `logits` (bf16, f16 or f32, strided rows) with
    /// `sampling`'s filters, into `outputs`. `random` holds two u64 on the device, the seed
    /// then the offset: a row's draws depend only on them, the row's index and its logits,
    /// and the call adds 1 to the offset on the device after drawing (unless
    /// [`SamplingOptions::advance`] is off).
    pub fn sample<'r>(
        &mut self,
        logits: Rows<'_>,
        random: impl Into<ValuesMut<'r, u64>>,
        outputs: SamplingOutputs<'_>,
        sampling: &SamplingOptions<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        self.sample_call(
            logits,
            random.into(),
            Target::Full(outputs),
            sampling,
            options,
        )
    }

    /// A vocabulary shard's part of a temperature-only draw (no top-k, top-p or min-p; a
    /// temperature above 0): for each row, its best score (over chunks of four columns), the
    /// global index of the column it picks and its row statistics, into `draws` (one
    /// [`ShardDraw`] per row). Columns are numbered from `column_offset`, their noise keyed by
    /// their global chunks, so the draws
    /// merged over every shard ([`merge_shard_draws`], on the host or after an all-gather)
    /// give the token the unsharded call draws with the same seed and offset. A shard starts
    /// at a multiple of 4 columns (the draw's chunks of four columns are not split); the last
    /// may have any width. Advance the offset with the last shard only.
    pub fn sample_shard<'r>(
        &mut self,
        shard: Rows<'_>,
        column_offset: usize,
        random: impl Into<ValuesMut<'r, u64>>,
        draws: impl Into<ValuesMut<'r, ShardDraw>>,
        sampling: &SamplingOptions<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        if sampling.top_k.is_some() || sampling.top_p.is_some() || sampling.min_p.is_some() {
            return Err(Error::SamplingOption {
                why: "a shard draws with a temperature alone (top-k, top-p and min-p need the \
                      whole row)"
                    .into(),
            });
        }
        if let PerRow::All(t) = sampling.temperature
            && t == 0.0
        {
            return Err(Error::SamplingOption {
                why: "a shard draws with a temperature above 0 (greedy shards merge by their \
                      largest logit: use row states or log-sum-exp)"
                    .into(),
            });
        }
        if column_offset % 4 != 0 {
            return Err(Error::SamplingOption {
                why: format!(
                    "a shard starts at a multiple of 4 columns (a temperature-only draw picks \
                     among chunks of four global columns), got column {column_offset}"
                ),
            });
        }
        let column_offset = u64::try_from(column_offset)
            .ok()
            .filter(|&c| c + shard.shape.cols() as u64 <= u64::from(u32::MAX))
            .ok_or_else(|| Error::SamplingOption {
                why: "a shard's global columns must fit 32 bits".into(),
            })?;
        self.sample_call(
            shard,
            random.into(),
            Target::Shard(draws.into(), column_offset),
            sampling,
            options,
        )
    }

    fn sample_call(
        &mut self,
        logits: Rows<'_>,
        mut random: ValuesMut<'_, u64>,
        target: Target<'_>,
        sampling: &SamplingOptions<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        if !options.is_plain() || options.variant != crate::variant::Variant::Auto {
            return Err(Error::SamplingOption {
                why: "of the call's options, sampling takes only the stream (scales, masks and \
                      variants belong to softmax; a bias in SamplingOptions bans columns)"
                    .into(),
            });
        }
        let shape = logits.shape;
        let rows = shape.rows();
        let mut params = sampling.check(rows)?;
        if random.len != 2 {
            return Err(Error::SamplingOption {
                why: format!(
                    "the random state is two u64 (seed, offset), got {}",
                    random.len
                ),
            });
        }
        if let Some(bias) = &sampling.bias {
            if bias.dtype != DType::F32 {
                return Err(Error::SamplingOption {
                    why: format!("the bias is f32, got {:?}", bias.dtype),
                });
            }
            if bias.shape.cols() != shape.cols()
                || (bias.shape.rows() != 1 && bias.shape.rows() != rows)
            {
                return Err(Error::SamplingOption {
                    why: format!(
                        "the bias has one row or one per row of {} columns, got {}×{}",
                        shape.cols(),
                        bias.shape.rows(),
                        bias.shape.cols()
                    ),
                });
            }
        }
        let mut target = target;
        let mut frame = self.frame(options)?;
        let x = frame.rows("logits", &logits)?;
        let mut reads = vec![x];
        let temperature = Some(sampling.temperature);
        params.temperatures = per_row_array(&mut frame, "temperatures", temperature, &mut reads)?;
        params.top_ks = per_row_array(&mut frame, "top-k values", sampling.top_k, &mut reads)?;
        params.top_ps = per_row_array(&mut frame, "top-p values", sampling.top_p, &mut reads)?;
        params.min_ps = per_row_array(&mut frame, "min-p values", sampling.min_p, &mut reads)?;
        if let Some(bias) = &sampling.bias {
            let span = frame.rows("bias", bias)?;
            params.bias = span.operand.address;
            params.bias_stride = if bias.shape.rows() == 1 {
                0
            } else {
                span.stride as u64
            };
            reads.push(span);
        }
        let random_span = frame.values_mut("random state", &mut random)?;
        params.random = random_span.operand.address;
        let mut writes = vec![random_span];
        match &mut target {
            Target::Full(outputs) => {
                params.mode = sampling_mode::FULL;
                if let Some(tokens) = &mut outputs.tokens {
                    check_per_row(tokens.len, rows, "tokens")?;
                    let span = frame.values_mut("tokens", tokens)?;
                    params.tokens = span.operand.address;
                    writes.push(span);
                }
                if let Some(logprobs) = &mut outputs.logprobs {
                    check_per_row(logprobs.len, rows, "log-probabilities")?;
                    let span = frame.values_mut("log-probabilities", logprobs)?;
                    params.logprobs = span.operand.address;
                    writes.push(span);
                }
                if let Some(logprobs) = &mut outputs.raw_logprobs {
                    check_per_row(logprobs.len, rows, "unfiltered log-probabilities")?;
                    let span = frame.values_mut("unfiltered log-probabilities", logprobs)?;
                    params.raw_logprobs = span.operand.address;
                    writes.push(span);
                }
                if let Some((view, log)) = &mut outputs.distribution {
                    check_shapes(shape, view.shape, "filtered distribution")?;
                    if view.dtype != DType::F32 {
                        return Err(Error::SamplingOption {
                            why: format!("the filtered distribution is f32, got {:?}", view.dtype),
                        });
                    }
                    let log = *log;
                    let span = frame.rows_mut("filtered distribution", view)?;
                    params.probabilities = span.operand.address;
                    params.probabilities_stride = span.stride as u64;
                    params.probabilities_log = u32::from(log);
                    writes.push(span);
                }
            }
            Target::Shard(draws, column_offset) => {
                params.mode = sampling_mode::SHARD;
                params.column_offset = *column_offset;
                check_per_row(draws.len, rows, "shard draws")?;
                let span = frame.values_mut("shard draws", draws)?;
                params.draws = span.operand.address;
                writes.push(span);
            }
        }
        frame.check_waits()?;
        params.logits = x.operand.address;
        params.logits_stride = x.stride as u64;
        params.rows = rows as u32;
        params.cols = u32::try_from(shape.cols()).unwrap_or(u32::MAX);
        let stream = frame.stream;
        let advance = sampling.advance;
        // One small top-k for every row, nothing written per column: the candidate path.
        // Greedy or temperature alone: the draw kernel, whose rows may be drawn in slices
        // where they are the whole vocabulary.
        let small_top_k = matches!(sampling.top_k, Some(PerRow::All(k)) if k <= TOP_K_CANDIDATES);
        let work = if params.probabilities == 0 && params.mode == sampling_mode::FULL && small_top_k
        {
            SamplingWork::TopK
        } else if params.probabilities != 0
            || sampling.top_k.is_some()
            || sampling.top_p.is_some()
            || sampling.min_p.is_some()
        {
            SamplingWork::Filtered
        } else if params.mode == sampling_mode::FULL {
            SamplingWork::Sliceable
        } else {
            SamplingWork::Drawn
        };
        let done = self.with_stream(stream, |softmax| {
            softmax.enqueue_sampling(params, &x, &writes, &reads, (advance, work))
        });
        done.and(frame.finish())
    }

    /// Checks a sampling call's buffers (on this device; every output apart from every input
    /// and from the others) and enqueues its plan.
    fn enqueue_sampling(
        &mut self,
        params: SamplingParams,
        x: &Span,
        writes: &[Span],
        reads: &[Span],
        (advance, work): (bool, SamplingWork),
    ) -> Result<()> {
        self.check_call_buffers(reads, writes, None)?;
        let shape = x.shape;
        if shape.rows() == 0 {
            return Ok(());
        }
        let layout = if x.packs_aligned() {
            Layout::Aligned
        } else {
            Layout::Elements
        };
        let request = Request::Sampling {
            input: x.dtype,
            advance,
            work,
        };
        let prepared = self.prepared(request, shape, layout)?;
        let buffers = CallBuffers {
            sampling: params,
            ..CallBuffers::default()
        };
        // SAFETY: every buffer named in `params` was checked against the shape (the logits'
        // view, the bias's rows, one value per row in each per-row array and output, the
        // distribution's rows, two words of random state), on this device; outputs apart from
        // inputs and from each other; the layout allows 16-byte packs only where every row of
        // the logits starts 16-byte aligned.
        unsafe { self.enqueue(&prepared, shape, &buffers) }
    }
}

/// The device address of the per-row array of `value`, its span added to `reads`; 0 where
/// `value` is one for all rows (or absent).
fn per_row_array<'r, T: Value>(
    frame: &mut Frame<'r>,
    what: &'static str,
    value: Option<PerRow<'r, T>>,
    reads: &mut Vec<Span>,
) -> Result<u64> {
    let Some(PerRow::Each(values)) = value else {
        return Ok(0);
    };
    let span = frame.values(what, &values)?;
    let address = span.operand.address;
    reads.push(span);
    Ok(address)
}

/// What a sampling call writes: the full outputs, or a shard's draws (with its first global
/// column).
enum Target<'a> {
    Full(SamplingOutputs<'a>),
    Shard(ValuesMut<'a, ShardDraw>, u64),
}
