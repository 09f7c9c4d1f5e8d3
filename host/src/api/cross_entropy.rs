//! Cross-entropy over logits and one target per row, forward and backward fused, with the
//! options of `torch.nn.functional.cross_entropy` (ignore index, label smoothing, class
//! weights, reductions) and those of LLM training (z-loss, logit softcap), over vocabulary
//! shards too. The gradient may be written over the logits.

use cust::memory::{DeviceBuffer, DeviceSlice};
pub use kernels_gpu::launch::cross_entropy::CrossEntropyState;
use kernels_gpu::launch::cross_entropy::{CrossEntropyParams, cross_entropy_mode};
use kernels_gpu::launch::ops::DType;

use super::Softmax;
use super::call::{Frame, Span, check_per_row, check_shapes};
use super::options::Options;
use super::views::{Rows, RowsMut, Values, ValuesMut};
use crate::error::{Error, Result};
use crate::plan::{Layout, Request};
pub use crate::reference::Reduction;
use crate::runtime::CallBuffers;
use crate::shape::Shape;

/// The targets of a cross-entropy call: one class index per row, `i32` or `i64`.
#[derive(Clone, Copy, Debug)]
pub enum Targets<'a> {
    I32(Values<'a, i32>),
    I64(Values<'a, i64>),
}

impl Targets<'_> {
    fn len(&self) -> usize {
        match self {
            Targets::I32(v) => v.len,
            Targets::I64(v) => v.len,
        }
    }
}

macro_rules! targets_from {
    ($($ty:ty => $variant:ident),+) => {$(
        impl<'a> From<&'a DeviceSlice<$ty>> for Targets<'a> {
            fn from(data: &'a DeviceSlice<$ty>) -> Self {
                Targets::$variant(Values::new(data))
            }
        }
        impl<'a> From<&'a DeviceBuffer<$ty>> for Targets<'a> {
            fn from(data: &'a DeviceBuffer<$ty>) -> Self {
                Targets::$variant(Values::new(data))
            }
        }
        impl<'a> From<Values<'a, $ty>> for Targets<'a> {
            fn from(values: Values<'a, $ty>) -> Self {
                Targets::$variant(values)
            }
        }
    )+};
}

targets_from!(i32 => I32, i64 => I64);

/// Merges the states of two disjoint shards of a row's vocabulary (as the kernels do): the
/// softmax statistics as [`merge_row_states`](super::views::merge_row_states), the target
/// logits and the smoothing sums added.
pub fn merge_cross_entropy_states(a: CrossEntropyState, b: CrossEntropyState) -> CrossEntropyState {
    CrossEntropyState {
        row: super::views::merge_row_states(a.row, b.row),
        target_logit: a.target_logit + b.target_logit,
        smoothing: a.smoothing + b.smoothing,
    }
}

/// The gradient of the loss the backward call starts from: a value, or values in device
/// memory (one for a reduced loss, one per row for [`Reduction::None`]).
#[derive(Clone, Copy, Debug)]
pub enum Upstream<'a> {
    Value(f32),
    Device(Values<'a, f32>),
}

/// The options of a cross-entropy call. Defaults as torch's: ignore index -100, no label
/// smoothing, the mean over the rows not ignored; no z-loss, no softcap, no class weights,
/// the whole vocabulary.
#[derive(Clone, Copy, Debug)]
pub struct CrossEntropyOptions<'a> {
    pub(crate) ignore_index: Option<i64>,
    pub(crate) label_smoothing: f32,
    pub(crate) z_loss: f32,
    pub(crate) softcap: Option<f32>,
    pub(crate) reduction: Reduction,
    pub(crate) weight: Option<Values<'a, f32>>,
    pub(crate) shard: Option<(usize, usize)>,
    pub(crate) merged: Option<Values<'a, CrossEntropyState>>,
}

impl Default for CrossEntropyOptions<'_> {
    fn default() -> Self {
        CrossEntropyOptions {
            ignore_index: Some(-100),
            label_smoothing: 0.0,
            z_loss: 0.0,
            softcap: None,
            reduction: Reduction::Mean,
            weight: None,
            shard: None,
            merged: None,
        }
    }
}

impl<'a> CrossEntropyOptions<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rows whose target is `index` have loss 0 and gradient 0, and do not count in the mean
    /// (`None`: every target is a class).
    pub fn ignore_index(mut self, index: Option<i64>) -> Self {
        self.ignore_index = index;
        self
    }

    /// Label smoothing `ε` in `[0, 1]`, as torch's `label_smoothing`.
    pub fn label_smoothing(mut self, epsilon: f32) -> Self {
        self.label_smoothing = epsilon;
        self
    }

    /// Adds `scale · lse²` to each row's loss (the z-loss of PaLM; Liger's `lse_square_scale`).
    pub fn z_loss(mut self, scale: f32) -> Self {
        self.z_loss = scale;
        self
    }

    /// Caps the logits softly first: `z = cap · tanh(x / cap)` (Gemma 2's logit softcapping),
    /// `cap` finite and > 0.
    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }

    /// One weight per class of the whole vocabulary, as torch's `weight`.
    pub fn weight(mut self, weight: impl Into<Values<'a, f32>>) -> Self {
        self.weight = Some(weight.into());
        self
    }

    /// The logits are the columns `offset..offset + cols` of a vocabulary of `vocab` classes
    /// (a tensor-parallel shard): targets, weights and label smoothing are over the whole
    /// vocabulary. A shard's own call is [`Softmax::cross_entropy_states`]; the loss and the
    /// shard's gradient need every shard's states ([`CrossEntropyOptions::merged`]).
    pub fn shard(mut self, offset: usize, vocab: usize) -> Self {
        self.shard = Some((offset, vocab));
        self
    }

    /// The states of every shard of the vocabulary (`k` runs of one per row, the outputs of
    /// `k` [`Softmax::cross_entropy_states`] calls laid end to end), merged per row: the loss
    /// and the gradient are then those of the whole vocabulary.
    pub fn merged(mut self, states: impl Into<Values<'a, CrossEntropyState>>) -> Self {
        self.merged = Some(states.into());
        self
    }

    /// Checks the options (and the call's, of which cross-entropy takes only the stream)
    /// against logits of `shape`; the vocabulary and the shard's offset.
    pub(super) fn check(&self, shape: Shape, call: &Options<'_>) -> Result<(u64, u64)> {
        if !call.is_plain() || call.variant != crate::variant::Variant::Auto {
            return Err(Error::CrossEntropyOption {
                why: "of the call's options, cross-entropy takes only the stream (scales, masks \
                      and variants belong to softmax)"
                    .into(),
            });
        }
        let refuse = |why: String| Error::CrossEntropyOption { why };
        if !(0.0..=1.0).contains(&self.label_smoothing) {
            return Err(refuse(format!(
                "label smoothing must lie in [0, 1], got {}",
                self.label_smoothing
            )));
        }
        if !(self.z_loss >= 0.0 && self.z_loss.is_finite()) {
            return Err(refuse(format!(
                "the z-loss scale must be finite and ≥ 0, got {}",
                self.z_loss
            )));
        }
        if let Some(cap) = self.softcap
            && !(cap > 0.0 && cap.is_finite())
        {
            return Err(refuse(format!(
                "the softcap must be finite and > 0, got {cap}"
            )));
        }
        let (offset, vocab) = self.shard.unwrap_or((0, shape.cols()));
        if offset
            .checked_add(shape.cols())
            .is_none_or(|end| end > vocab)
        {
            return Err(refuse(format!(
                "a shard of {} columns at {offset} does not fit a vocabulary of {vocab}",
                shape.cols()
            )));
        }
        if vocab == 0 && shape.rows() > 0 {
            return Err(refuse("a vocabulary needs at least one class".into()));
        }
        if let Some(weight) = self.weight
            && weight.len != vocab
        {
            return Err(refuse(format!(
                "{} class weights for a vocabulary of {vocab} classes",
                weight.len
            )));
        }
        Ok((offset as u64, vocab as u64))
    }
}

/// Where a cross-entropy call writes its losses: the loss (one value per row for
/// [`Reduction::None`], else one), and optionally each row's log-sum-exp.
#[derive(Debug, Default)]
pub struct CrossEntropyOutputs<'a> {
    pub(crate) loss: Option<ValuesMut<'a, f32>>,
    pub(crate) lse: Option<ValuesMut<'a, f32>>,
}

impl<'a> CrossEntropyOutputs<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn loss(mut self, loss: impl Into<ValuesMut<'a, f32>>) -> Self {
        self.loss = Some(loss.into());
        self
    }

    pub fn lse(mut self, lse: impl Into<ValuesMut<'a, f32>>) -> Self {
        self.lse = Some(lse.into());
        self
    }
}

/// Where a call's gradient goes.
enum Gradient<'g> {
    None,
    Into(RowsMut<'g>, Upstream<'g>),
    InPlace(Upstream<'g>),
}

impl Softmax {
    /// Enqueues the cross-entropy of `logits`' rows against `targets` (one class index per
    /// row) into `outputs`. A target outside `0..vocab` that is not the ignore index gives a
    /// NaN loss (documented in docs/numerics.md), never an out-of-bounds read.
    pub fn cross_entropy<'t>(
        &mut self,
        logits: Rows<'_>,
        targets: impl Into<Targets<'t>>,
        outputs: CrossEntropyOutputs<'_>,
        ce: &CrossEntropyOptions<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let targets = targets.into();
        self.cross_entropy_call(
            Input::Read(logits),
            targets,
            outputs,
            Gradient::None,
            ce,
            options,
        )
    }

    /// [`Softmax::cross_entropy`] and the gradient of the loss with respect to the logits,
    /// times `upstream` (the loss's gradient), into `gradient` (any element type).
    #[allow(clippy::too_many_arguments)]
    pub fn cross_entropy_backward<'t, 'g>(
        &mut self,
        logits: Rows<'_>,
        targets: impl Into<Targets<'t>>,
        outputs: CrossEntropyOutputs<'_>,
        gradient: RowsMut<'g>,
        upstream: Upstream<'g>,
        ce: &CrossEntropyOptions<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let targets = targets.into();
        let gradient = Gradient::Into(gradient, upstream);
        self.cross_entropy_call(Input::Read(logits), targets, outputs, gradient, ce, options)
    }

    /// [`Softmax::cross_entropy_backward`] with the gradient written over the logits: no
    /// second tokens × vocabulary buffer.
    pub fn cross_entropy_backward_in_place<'t, 'g>(
        &mut self,
        logits: RowsMut<'_>,
        targets: impl Into<Targets<'t>>,
        outputs: CrossEntropyOutputs<'_>,
        upstream: Upstream<'g>,
        ce: &CrossEntropyOptions<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let targets = targets.into();
        let gradient = Gradient::InPlace(upstream);
        self.cross_entropy_call(
            Input::Write(logits),
            targets,
            outputs,
            gradient,
            ce,
            options,
        )
    }

    /// A vocabulary shard's [`CrossEntropyState`] of each row into `states` (one per row):
    /// its softmax statistics, the target's logit where the target is one of its columns,
    /// and what label smoothing needs. Merge the shards' states ([`merge_cross_entropy_states`]
    /// on the host, or an all-gather of them and [`CrossEntropyOptions::merged`]).
    pub fn cross_entropy_states<'t, 's>(
        &mut self,
        shard: Rows<'_>,
        targets: impl Into<Targets<'t>>,
        states: impl Into<ValuesMut<'s, CrossEntropyState>>,
        ce: &CrossEntropyOptions<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        let targets = targets.into();
        let mut states = states.into();
        check_per_row(states.len, shard.shape.rows(), "cross-entropy states")?;
        check_per_row(targets.len(), shard.shape.rows(), "targets")?;
        let (offset, vocab) = ce.check(shard.shape, options)?;
        let mut frame = self.frame(options)?;
        let x = frame.rows("logits", &shard)?;
        let t = resolve_targets(&mut frame, &targets)?;
        let weight = ce
            .weight
            .map(|w| frame.values("class weights", &w))
            .transpose()?;
        let s = frame.values_mut("cross-entropy states", &mut states)?;
        frame.check_waits()?;
        let mut params = base_params(&x, &t, ce, offset, vocab, weight.as_ref());
        params.mode = cross_entropy_mode::STATES;
        params.states = s.operand.address;
        params.slots = 1;
        let reads: Vec<Span> = [x, t].into_iter().chain(weight).collect();
        let stream = frame.stream;
        let done = self.with_stream(stream, |softmax| {
            softmax.enqueue_cross_entropy(params, &x, &[s], &reads, None, (false, false))
        });
        done.and(frame.finish())
    }

    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_call(
        &mut self,
        mut input: Input<'_>,
        targets: Targets<'_>,
        mut outputs: CrossEntropyOutputs<'_>,
        gradient: Gradient<'_>,
        ce: &CrossEntropyOptions<'_>,
        options: &Options<'_>,
    ) -> Result<()> {
        let _context = self.enter()?;
        let shape = input.shape();
        let rows = shape.rows();
        check_per_row(targets.len(), rows, "targets")?;
        let (offset, vocab) = ce.check(shape, options)?;
        if ce.shard.is_some() && ce.merged.is_none() {
            return Err(Error::CrossEntropyOption {
                why: "a shard's loss needs every shard's states (CrossEntropyOptions::merged); \
                      its own call is cross_entropy_states"
                    .into(),
            });
        }
        let reduced = ce.reduction != Reduction::None;
        let loss_len = if reduced { 1 } else { rows };
        if let Some(loss) = &outputs.loss {
            check_per_row(loss.len, loss_len, "loss")?;
        }
        if let Some(lse) = &outputs.lse {
            check_per_row(lse.len, rows, "log-sum-exp output")?;
        }
        let (mut gradient_view, upstream, in_place) = match gradient {
            Gradient::None => (None, None, false),
            Gradient::Into(view, upstream) => {
                check_shapes(shape, view.shape, "gradient")?;
                (Some(view), Some(upstream), false)
            }
            Gradient::InPlace(upstream) => (None, Some(upstream), true),
        };
        if let Some(Upstream::Device(values)) = &upstream {
            check_per_row(values.len, loss_len, "upstream gradient")?;
        }
        if let Some(Upstream::Value(value)) = upstream
            && !value.is_finite()
        {
            return Err(Error::CrossEntropyOption {
                why: format!("the upstream gradient must be finite, got {value}"),
            });
        }
        let mut frame = self.frame(options)?;
        let x = match &mut input {
            Input::Read(view) => frame.rows("logits", view)?,
            Input::Write(view) => frame.rows_mut("logits", view)?,
        };
        let t = resolve_targets(&mut frame, &targets)?;
        let weight = ce
            .weight
            .map(|w| frame.values("class weights", &w))
            .transpose()?;
        let merged = ce
            .merged
            .map(|m| frame.values("merged states", &m))
            .transpose()?;
        let upstream_span = match upstream {
            Some(Upstream::Device(values)) => Some(frame.values("upstream gradient", &values)?),
            _ => None,
        };
        let loss = outputs
            .loss
            .as_mut()
            .map(|l| frame.values_mut("loss", l))
            .transpose()?;
        let lse = outputs
            .lse
            .as_mut()
            .map(|l| frame.values_mut("log-sum-exp output", l))
            .transpose()?;
        let gradient = match (&mut gradient_view, in_place) {
            (Some(view), _) => Some(frame.rows_mut("gradient", view)?),
            (None, true) => Some(x.named("gradient")),
            (None, false) => None,
        };
        frame.check_waits()?;
        let mut params = base_params(&x, &t, ce, offset, vocab, weight.as_ref());
        if let Some(merged) = merged {
            let slots = merged.len().checked_div(rows).unwrap_or(0);
            if rows > 0 && (slots == 0 || !merged.len().is_multiple_of(rows)) {
                return Err(Error::PerRowLength {
                    what: "merged states",
                    len: merged.len(),
                    rows,
                    expected: rows,
                });
            }
            params.states = merged.operand.address;
            params.slots = slots as u32;
        }
        match upstream {
            Some(Upstream::Value(value)) => params.upstream_value = value,
            Some(Upstream::Device(_)) => {
                params.upstream = upstream_span.map_or(0, |s| s.operand.address);
                params.upstream_per_row = u32::from(!reduced);
            }
            None => {}
        }
        params.mean = u32::from(ce.reduction == Reduction::Mean);
        if let Some(g) = &gradient {
            params.gradient = g.operand.address;
            params.gradient_stride = g.stride as u64;
            params.gradient_dtype = g.dtype as u32;
        }
        let loss_address = loss.map_or(0, |l| l.operand.address);
        if reduced {
            params.reduced = loss_address;
        } else {
            params.losses = loss_address;
        }
        params.lse = lse.map_or(0, |l| l.operand.address);
        let reads: Vec<Span> = [Some(x), Some(t), weight, merged, upstream_span]
            .into_iter()
            .flatten()
            .collect();
        let writes: Vec<Span> = [loss, lse, gradient].into_iter().flatten().collect();
        let (needs_totals, reduce) = prologue_and_epilogue(ce, loss.is_some());
        let stream = frame.stream;
        let done = self.with_stream(stream, |softmax| {
            softmax.enqueue_cross_entropy(
                params,
                &x,
                &writes,
                &reads,
                gradient.as_ref(),
                (needs_totals, reduce),
            )
        });
        done.and(frame.finish())
    }

    /// Checks a cross-entropy call's buffers (on this device; every output apart from every
    /// input and from the others, the gradient exactly the logits where it is written in
    /// place) and enqueues its plan: the prologue where `totals`, the rows, the epilogue where
    /// `reduce`.
    fn enqueue_cross_entropy(
        &mut self,
        params: CrossEntropyParams,
        x: &Span,
        writes: &[Span],
        reads: &[Span],
        gradient: Option<&Span>,
        (totals, reduce): (bool, bool),
    ) -> Result<()> {
        self.check_call_buffers(reads, writes, gradient.map(|g| (g, x)))?;
        let shape = x.shape;
        if shape.rows() == 0 {
            // No row: a sum of nothing is 0, a mean of nothing NaN (torch's).
            if reduce && params.reduced != 0 {
                let value = if params.mean != 0 { f32::NAN } else { 0.0 };
                let stream = self.target_stream();
                // SAFETY: the reduced loss is one f32 of this device (checked).
                return unsafe {
                    crate::runtime::driver::fill_words(params.reduced, value.to_bits(), 1, stream)
                };
            }
            return Ok(());
        }
        let (request, layout) = cross_entropy_request(
            x.dtype,
            x.packs_aligned() && gradient.is_none_or(Span::packs_aligned),
            &params,
            (totals, reduce),
        );
        let prepared = self.prepared(request, shape, layout)?;
        let buffers = CallBuffers {
            cross_entropy: params,
            ..CallBuffers::default()
        };
        // SAFETY: every buffer named in `params` was checked against the shape (the logits'
        // view, one target per row, one weight per class, the per-row and reduced outputs,
        // the states' runs), on this device; outputs apart from inputs and from each other,
        // the gradient exactly the logits where in place; the layout allows 16-byte packs
        // only where every row of the logits and the gradient starts 16-byte aligned.
        unsafe { self.enqueue(&prepared, shape, &buffers) }
    }
}

/// The logits of a call: read only, or read and overwritten with the gradient.
enum Input<'v> {
    Read(Rows<'v>),
    Write(RowsMut<'v>),
}

impl Input<'_> {
    fn shape(&self) -> Shape {
        match self {
            Input::Read(view) => view.shape,
            Input::Write(view) => view.shape,
        }
    }
}

fn resolve_targets<'r>(frame: &mut Frame<'r>, targets: &Targets<'r>) -> Result<Span> {
    match targets {
        Targets::I32(values) => frame.values("targets", values),
        Targets::I64(values) => frame.values("targets", values),
    }
}

/// The parameters every cross-entropy launch of a call shares.
fn base_params(
    x: &Span,
    targets: &Span,
    ce: &CrossEntropyOptions<'_>,
    offset: u64,
    vocab: u64,
    weight: Option<&Span>,
) -> CrossEntropyParams {
    CrossEntropyParams {
        logits: x.operand.address,
        logits_stride: x.stride as u64,
        targets: targets.operand.address,
        target_bytes: targets.operand.element_bytes,
        weight: weight.map_or(0, |w| w.operand.address),
        ..option_params(ce, x.shape, offset, vocab)
    }
}

/// The parameters `ce` sets on rows of `shape` (columns `offset..` of a vocabulary of
/// `vocab`), before any buffer is named: its mode among them.
pub(super) fn option_params(
    ce: &CrossEntropyOptions<'_>,
    shape: Shape,
    offset: u64,
    vocab: u64,
) -> CrossEntropyParams {
    CrossEntropyParams {
        ignore_index: ce.ignore_index.unwrap_or(0),
        has_ignore_index: u32::from(ce.ignore_index.is_some()),
        column_offset: offset,
        vocab,
        rows: shape.rows() as u32,
        cols: shape.cols() as u32,
        label_smoothing: ce.label_smoothing,
        z_loss: ce.z_loss,
        softcap: ce.softcap.unwrap_or(0.0),
        upstream_value: 1.0,
        // Partial states merged in from other shards finish the rows from them.
        mode: if ce.merged.is_some() {
            cross_entropy_mode::FROM_STATES
        } else {
            cross_entropy_mode::FULL
        },
        ..CrossEntropyParams::default()
    }
}

/// Whether a call with `ce` launches the one-block prologue (the mean's divisor, the class
/// weights' sum) and the epilogue (the reduced loss, where `loss` is asked for).
pub(super) fn prologue_and_epilogue(ce: &CrossEntropyOptions<'_>, loss: bool) -> (bool, bool) {
    let totals =
        ce.reduction == Reduction::Mean || (ce.weight.is_some() && ce.label_smoothing > 0.0);
    (totals, ce.reduction != Reduction::None && loss)
}

/// What a call on `input` logits with `params` plans under, the prologue and epilogue where
/// `totals` and `reduce`: its request, and its rows' layout (16-byte packs where every row of
/// the logits and of the gradient starts 16-byte aligned, `rows_aligned`, and the options
/// keep the math per row; else elements).
pub(super) fn cross_entropy_request(
    input: DType,
    rows_aligned: bool,
    params: &CrossEntropyParams,
    (totals, reduce): (bool, bool),
) -> (Request, Layout) {
    let request = Request::CrossEntropy {
        input,
        totals,
        reduce,
        block_entries: params.takes_block_entries(),
    };
    let layout = if rows_aligned && !params.elementwise_math() {
        Layout::Aligned
    } else {
        Layout::Elements
    };
    (request, layout)
}
