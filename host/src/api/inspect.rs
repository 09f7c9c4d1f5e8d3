//! What the planner would launch, for people and for the benchmark's reports: the kernels of
//! a variant, the entries a kind of call plans, the label of an operation's plan, the
//! launches of a cross-entropy call.

#[cfg(feature = "bench")]
use cust::memory::DeviceSlice;
#[cfg(feature = "bench")]
use kernels_gpu::launch::ops::{DType, Direction};

use super::Softmax;
#[cfg(feature = "bench")]
use super::call::Span;
#[cfg(feature = "bench")]
use super::cross_entropy::{
    CrossEntropyOptions, cross_entropy_request, option_params, prologue_and_epilogue,
};
#[cfg(feature = "bench")]
use super::options::Options;
#[cfg(feature = "bench")]
use super::reserve::CallKind;
#[cfg(feature = "bench")]
use super::views::{Element, Operation, address};
use crate::error::Result;
use crate::plan;
#[cfg(feature = "bench")]
use crate::plan::operations::{self, Operand};
#[cfg(feature = "bench")]
use crate::plan::{OperationMode, Request};
use crate::shape::Shape;
use crate::variant::Variant;

impl Softmax {
    /// Names of the kernels `variant` would launch for `shape` on 16-byte aligned buffers.
    pub fn kernels_for(&mut self, variant: Variant, shape: Shape) -> Result<Vec<String>> {
        let _context = self.enter()?;
        if shape.is_empty() {
            return Ok(Vec::new());
        }
        let variant = match variant {
            Variant::BlockPerRowAutotuned => match self.tuned_threads(shape) {
                Some(threads_per_block) => Variant::BlockPerRowSmem { threads_per_block },
                None => {
                    return Ok(vec![
                        "softmax_block_per_row_smem (not tuned yet)".to_owned(),
                    ]);
                }
            },
            other => other,
        };
        let layout = plan::pair_layout(0, 0, shape.cols());
        let prepared = self.variant_plan(variant, shape, layout)?;
        Ok(labels(&prepared.launches))
    }

    /// The entries the plans of `call` on `shape` launch, with the block size of the entries
    /// that take it at launch, over every layout (what [`Softmax::reserve`] prepares): which
    /// instances the planner uses on this device, for pruning the instance tables (`host
    /// entries`). Plans that fail are left out.
    #[cfg(feature = "bench")]
    #[doc(hidden)]
    pub fn planned_entries(&mut self, call: CallKind, shape: Shape) -> Result<Vec<String>> {
        let _context = self.enter()?;
        let mut entries = Vec::new();
        for (request, layout) in call.requests() {
            if let Ok(prepared) = self.prepared(request, shape, layout) {
                entries.extend(prepared.launches.iter().map(|l| l.label(&[])));
            }
        }
        Ok(entries)
    }

    /// What a call of `direction` on `shape` over compact `buffers` launches, for the
    /// benchmark's report: the entry, and for sliced rows the slices per row and whether they
    /// meet in one cooperative launch, in clusters, or in two launches.
    #[cfg(feature = "bench")]
    #[doc(hidden)]
    pub fn op_plan_label<T: Element>(
        &mut self,
        operation: Operation,
        direction: Direction,
        shape: Shape,
        buffers: &[&DeviceSlice<T>],
    ) -> Result<String> {
        let _context = self.enter()?;
        let operands: Vec<Operand> = buffers
            .iter()
            .map(|b| Span::rows("buffer", address(b), T::DTYPE, shape, shape.cols()).operand)
            .collect();
        let layout = operations::layout(T::DTYPE, direction, shape.cols(), &operands);
        let request = match (buffers, direction, operation) {
            ([input, output], Direction::Forward, Operation::Softmax) if T::DTYPE != DType::F32 => {
                Request::PlainSoftmax {
                    dtype: T::DTYPE,
                    peelable: address(*input).abs_diff(address(*output)) % 16 == 0,
                }
            }
            _ => Request::Operation {
                direction,
                input: T::DTYPE,
                mode: OperationMode::Full,
            },
        };
        let prepared = self.prepared(request, shape, layout)?;
        let first = prepared.launches[0];
        let slices = first.grid / u32::try_from(shape.rows()).unwrap_or(u32::MAX).max(1);
        let two_launches = prepared.launches.len() > 1;
        let slicing = match (slices, two_launches) {
            (0 | 1, _) => vec![],
            (_, true) => vec![format!("{slices} slices per row"), "2 launches".into()],
            (_, false) => std::iter::once(format!("{slices} slices per row"))
                .chain(first.scheduling_details())
                .collect(),
        };
        Ok(first.label(&slicing))
    }

    /// What a fused call (loss and gradient) with `ce` launches on compact `T` logits of
    /// `shape` (each row starting where the one before ends, the first 16-byte aligned), its
    /// loss asked for, for the benchmark's report: each launch's entry and slicing.
    #[cfg(feature = "bench")]
    #[doc(hidden)]
    pub fn cross_entropy_plan<T: Element>(
        &mut self,
        shape: Shape,
        ce: &CrossEntropyOptions<'_>,
    ) -> Result<Vec<String>> {
        let _context = self.enter()?;
        let (offset, vocab) = ce.check(shape, &Options::new())?;
        let mut params = option_params(ce, shape, offset, vocab);
        // Whether class weights are given decides the plan, not where they are.
        params.weight = u64::from(ce.weight.is_some());
        let rows_aligned = (shape.cols() * size_of::<T>()).is_multiple_of(16);
        let (request, layout) = cross_entropy_request(
            T::DTYPE,
            rows_aligned,
            &params,
            prologue_and_epilogue(ce, true),
        );
        Ok(labels(&self.prepared(request, shape, layout)?.launches))
    }
}

/// Each launch's entry, with the slicing and scheduling it was planned with.
fn labels(launches: &[plan::Launch]) -> Vec<String> {
    launches
        .iter()
        .map(|l| l.label(&l.scheduling_details()))
        .collect()
}
