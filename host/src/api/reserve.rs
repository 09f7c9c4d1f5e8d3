//! Preparing calls ahead of time, so that later calls load, plan, allocate and wait for
//! nothing, and can be captured into a CUDA graph.

use kernels_gpu::launch::ops::{DType, Direction};

use super::Softmax;
use crate::error::Result;
use crate::plan::{Layout, OperationMode, Request, SamplingWork, WorkspaceNeeds};
use crate::shape::Shape;
use crate::variant::Variant;

/// A kind of call that [`Softmax::reserve`] prepares, for one input element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallKind {
    /// f32 softmax with this variant ([`Softmax::run`], or [`Softmax::forward`] with
    /// [`Options::variant`](crate::api::Options::variant)); `Variant::Auto` covers f32 softmax without options.
    Run(Variant),
    /// [`Softmax::forward`] and [`Softmax::forward_in_place`] (softmax or log-softmax, any
    /// output type), [`Softmax::log_sum_exp`] and [`Softmax::normalize_with_states`] on
    /// this input type; `masked`: with a mask or the causal option.
    Forward { input: DType, masked: bool },
    /// [`Softmax::backward`] and [`Softmax::backward_in_place`] on this input type.
    Backward { input: DType },
    /// [`Softmax::row_states`] on this input type; `masked`: with a mask or the causal option.
    RowStates { input: DType, masked: bool },
    /// Every cross-entropy call ([`Softmax::cross_entropy`], its backward forms and
    /// [`Softmax::cross_entropy_states`]) on logits of this type, whatever its reduction.
    CrossEntropy { input: DType },
    /// Every sampling call ([`Softmax::sample`] and [`Softmax::sample_shard`]) on logits of
    /// this type.
    Sampling { input: DType },
}

/// The forward kernels' direction, with or without masks.
fn forward_direction(masked: bool) -> Direction {
    if masked {
        Direction::MaskedForward
    } else {
        Direction::Forward
    }
}

const LAYOUTS: [Layout; 3] = [Layout::Aligned, Layout::Peeled, Layout::Elements];

impl CallKind {
    /// Every request (with its layout) a call of this kind on any buffers may make.
    pub(super) fn requests(self) -> Vec<(Request, Layout)> {
        let operation = |direction, input, mode| Request::Operation {
            direction,
            input,
            mode,
        };
        let requests: Vec<Request> = match self {
            CallKind::Run(variant) => vec![Request::Variant(variant)],
            CallKind::Forward { input, masked } => {
                let direction = forward_direction(masked);
                let mut requests = vec![
                    operation(direction, input, OperationMode::Full),
                    operation(direction, input, OperationMode::ApplyStates),
                ];
                if !masked {
                    requests.push(match input {
                        DType::F32 => Request::Variant(Variant::Auto),
                        dtype => Request::PlainSoftmax {
                            dtype,
                            peelable: true,
                        },
                    });
                    if input != DType::F32 {
                        requests.push(Request::PlainSoftmax {
                            dtype: input,
                            peelable: false,
                        });
                    }
                }
                requests
            }
            CallKind::Backward { input } => {
                vec![operation(Direction::Backward, input, OperationMode::Full)]
            }
            CallKind::RowStates { input, masked } => {
                let direction = forward_direction(masked);
                vec![operation(direction, input, OperationMode::States)]
            }
            CallKind::CrossEntropy { input } => [false, true]
                .into_iter()
                .flat_map(|block_entries| {
                    [(false, false), (true, false), (false, true), (true, true)].map(
                        |(totals, reduce)| Request::CrossEntropy {
                            input,
                            totals,
                            reduce,
                            block_entries,
                        },
                    )
                })
                .collect(),
            CallKind::Sampling { input } => [false, true]
                .into_iter()
                .flat_map(|advance| {
                    SamplingWork::ALL.map(|work| Request::Sampling {
                        input,
                        advance,
                        work,
                    })
                })
                .collect(),
        };
        requests
            .into_iter()
            .flat_map(|request| LAYOUTS.map(|layout| (request, layout)))
            .filter(|&(request, layout)| match request {
                Request::Operation { direction, .. } => layout.serves(direction),
                _ => true,
            })
            .collect()
    }
}

impl Softmax {
    /// Prepares `calls` on their shapes, whatever the alignment of the buffers they will be
    /// given: loads the kernels they need, makes their plans (kept from then on, whatever
    /// other shapes later calls plan) and sizes the workspaces for all of them, the one
    /// captured calls use included. Later calls of those kinds and shapes then load, plan,
    /// allocate and wait for nothing, so they can be captured into a CUDA graph; a call that
    /// would need any of that while its stream is capturing returns
    /// [`Error::NotReserved`](crate::error::Error::NotReserved) instead. (The first call on a stream this instance has
    /// not used before allocates that stream's workspace, at the reserved size.)
    ///
    /// A variant that cannot run a shape, or a row-states call on rows too wide to reduce in
    /// one launch, is an error here as it would be in the call. It waits for the instance's
    /// stream before it returns.
    pub fn reserve(&mut self, calls: &[(CallKind, Shape)]) -> Result<()> {
        let _context = self.enter()?;
        let mut needs = WorkspaceNeeds::default();
        for &(call, shape) in calls {
            if shape.is_empty() {
                continue;
            }
            let mut requests = call.requests();
            // `Auto` runs what `tune` chose where there is a choice for this shape.
            let tuned: Vec<(Request, Layout)> = requests
                .iter()
                .filter(|(request, _)| *request == Request::Variant(Variant::Auto))
                .filter_map(|&(_, layout)| {
                    let tuned = self.tuned_choice(shape, layout)?;
                    Some((Request::Variant(tuned), layout))
                })
                .collect();
            requests.extend(tuned);
            let mut planned_any = false;
            let mut first_error = None;
            for (request, layout) in requests {
                match self.prepared(request, shape, layout) {
                    Ok(prepared) => {
                        planned_any = true;
                        needs = needs.max(prepared.needs);
                        self.runtime.keep((request, shape, layout));
                    }
                    Err(error) => {
                        first_error.get_or_insert(error);
                    }
                }
            }
            // Some layouts may have no kernel (rows-in-registers holds fewer unaligned
            // columns); the call is refused only when no layout plans.
            if let (false, Some(error)) = (planned_any, first_error) {
                return Err(error);
            }
        }
        let stream = self.stream().as_inner();
        self.runtime.reserve_workspace(needs, stream)?;
        // The growth zeroed the workspaces on this instance's stream; the reserved calls may be
        // issued on another.
        self.synchronize()
    }
}
