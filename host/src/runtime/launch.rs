//! The one launch path: a planned [`Launch`] and the buffers of a call ([`Bindings`]) become
//! the entry's one parameter (its family's `#[repr(C)]` struct, shared with the kernels), and
//! one driver launch on a stream.

use std::ffi::c_void;

use cust::sys;
use kernels_gpu::launch::cross_entropy::CrossEntropyParams;
use kernels_gpu::launch::ops::{RowOpParams, mode};
use kernels_gpu::launch::sampling::{SamplingEntry, SamplingKind, SamplingParams, sampling_mode};
use kernels_gpu::launch::softmax::SoftmaxParams;

use super::driver;
use crate::error::Result;
use crate::plan::{Entry, Launch, OperationPass, Params, Scheduling, Slicing};

/// Device addresses of the workspace a launch may use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkspaceAddresses {
    /// The unfused variant's row maxima, then its row sums (`2 · rows` floats).
    pub row_stats: u64,
    pub partials: u64,
    pub barriers: u64,
    pub states: u64,
}

impl WorkspaceAddresses {
    /// No workspace: the addresses of a plan whose launches use none.
    pub const NONE: Self = WorkspaceAddresses {
        row_stats: 0,
        partials: 0,
        barriers: 0,
        states: 0,
    };
}

/// What one call binds to its plan's launches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bindings<'a> {
    pub input: u64,
    pub output: u64,
    pub rows: u32,
    /// The call's parameters, for operation entries (ignored by the others).
    pub operation: &'a RowOpParams,
    /// The call's parameters, for cross-entropy entries (ignored by the others).
    pub cross_entropy: &'a CrossEntropyParams,
    /// The call's parameters, for sampling entries (ignored by the others).
    pub sampling: &'a SamplingParams,
    pub workspace: WorkspaceAddresses,
    /// How long a row-slices block waits for its row before leaving its slice, in ns.
    pub patience_ns: u64,
    /// Whether the loaded kernels wait for the previous grid first (the sm_90 build), so an
    /// ordinary launch may overlap that grid's tail. The sm_80 build has no such wait.
    pub programmatic_overlap: bool,
}

/// Enqueues `launch` of `function` (its entry's handle) on `stream`.
///
/// # Safety
/// `launch` comes from the planner for the call `bindings` describe: its shape, its element
/// types and the layout of its buffers; every buffer named in `bindings` (and in its operation
/// parameters) holds what that call needs; the workspace is at least what
/// `plan::workspace_needs` asks for the launch's plan; `function` is the handle of
/// `launch.entry` in a module loaded in the context current on this thread, which owns
/// `stream`.
pub(crate) unsafe fn enqueue(
    function: sys::CUfunction,
    launch: &Launch,
    bindings: &Bindings<'_>,
    stream: sys::CUstream,
) -> Result<()> {
    let mut params = KernelParams::of(launch, bindings);
    let mut pointers = params.argument_pointers();
    // SAFETY: the caller vouches for the launch, its buffers and `function`; the pointers
    // point into `params`, its family's struct laid out as the entry's parameters, which
    // outlives the call (the driver copies the values).
    unsafe {
        driver::launch(
            function,
            launch,
            pointers.as_mut_ptr(),
            stream,
            bindings.programmatic_overlap,
        )
    }
}

/// What an entry takes: its family's struct. An operation entry takes its `RowOpParams` as
/// one parameter; the other entries take each field of their `SoftmaxParams` as a parameter
/// of its own, in field order (kernels-gpu's `softmax_entry!`).
#[derive(Clone, Copy, Debug)]
enum KernelParams {
    Softmax(SoftmaxParams),
    Operation(RowOpParams),
    CrossEntropy(CrossEntropyParams),
    Sampling(SamplingParams),
}

impl KernelParams {
    /// The parameter struct of `launch` for the call `bindings` describe.
    fn of(launch: &Launch, bindings: &Bindings<'_>) -> Self {
        let b = bindings;
        let w = b.workspace;
        let softmax_params =
            |rows: u32, cols: u32, slicing: Slicing, cached: bool, len: u64| SoftmaxParams {
                input: b.input,
                output: b.output,
                row_max: w.row_stats,
                row_sum: w.row_stats + 4 * u64::from(b.rows),
                partials: w.partials,
                barriers: w.barriers,
                patience_ns: b.patience_ns,
                len,
                rows,
                cols,
                slices: slicing.slices,
                slice_packs: slicing.slice_packs,
                cached: cached.into(),
                stagger_rows: 0,
                stagger_ns: 0,
            };
        let softmax = |rows: u32, cols: u32, slicing: Slicing, cached: bool, len: u64| {
            KernelParams::Softmax(softmax_params(rows, cols, slicing, cached, len))
        };
        let whole_rows = Slicing {
            slices: 1,
            slice_packs: 0,
        };
        match launch.params {
            Params::Rows { rows, cols } => softmax(rows, cols, whole_rows, false, 0),
            Params::BlockPerRow { cols } => softmax(b.rows, cols, whole_rows, false, 0),
            Params::Unfused { rows, cols, len } => softmax(rows, cols, whole_rows, false, len),
            Params::BlockRegisters { cols, slicing } => softmax(b.rows, cols, slicing, false, 0),
            Params::RowSlices {
                cols,
                slicing,
                cached,
                stagger,
            } => KernelParams::Softmax(SoftmaxParams {
                stagger_rows: stagger.rows,
                stagger_ns: stagger.ns,
                ..softmax_params(b.rows, cols, slicing, cached, 0)
            }),
            Params::RowCluster {
                cols,
                slicing,
                cached,
            } => softmax(b.rows, cols, slicing, cached, 0),
            Params::Operation { pass, slicing } => {
                let mut params = RowOpParams {
                    slices: slicing.slices,
                    slice_packs: slicing.slice_packs,
                    ..*b.operation
                };
                if launch.scheduling == Scheduling::Cooperative {
                    params.partials = w.partials;
                    params.barriers = w.barriers;
                }
                match pass {
                    OperationPass::Call => {}
                    OperationPass::SliceStatesToWorkspace | OperationPass::ApplyWorkspaceStates => {
                        params.states = w.states;
                        params.state_slots = slicing.slices;
                        params.mode = match pass {
                            OperationPass::SliceStatesToWorkspace => mode::SLICE_STATES,
                            _ => mode::APPLY_STATES,
                        };
                    }
                }
                KernelParams::Operation(params)
            }
            Params::CrossEntropy {
                rows,
                slices,
                slice_packs,
                cached,
                aligned,
                exchange,
                workspace,
                totals,
                stagger,
            } => {
                let mut params = *b.cross_entropy;
                params.stagger_rows = stagger.rows;
                params.stagger_ns = stagger.ns;
                params.slices = slices;
                params.slice_packs = slice_packs;
                params.cached = cached.into();
                params.aligned = aligned.into();
                if exchange {
                    params.partials = w.partials;
                    params.barriers = w.barriers;
                    params.patience_ns = b.patience_ns;
                }
                // The losses a reduced call does not keep, then the totals, live in the
                // workspace.
                if workspace {
                    if params.losses == 0 {
                        params.losses = w.row_stats;
                    }
                    if totals {
                        params.totals = w.row_stats + 4 * u64::from(rows);
                    }
                }
                KernelParams::CrossEntropy(params)
            }
            Params::Sampling {
                cached,
                aligned,
                slices,
                slice_cols,
                candidates,
                advances,
                ..
            } => {
                let mut params = *b.sampling;
                params.cached = cached.into();
                params.aligned = aligned.into();
                params.advance = advances.into();
                if candidates {
                    // The slices' candidates and states go through the workspace.
                    params.slices = slices;
                    params.slice_cols = slice_cols;
                    params.slice_tops = w.row_stats;
                } else if slices > 1 {
                    // The slices draw into the workspace; the merge writes the outputs.
                    params.slices = slices;
                    params.slice_cols = slice_cols;
                    params.draws = w.row_stats;
                    if let Entry::Sampling(SamplingEntry {
                        kind: SamplingKind::Rows | SamplingKind::Draws,
                        ..
                    }) = launch.entry
                    {
                        params.mode = sampling_mode::SHARD;
                        params.tokens = 0;
                        params.logprobs = 0;
                        params.raw_logprobs = 0;
                    }
                }
                KernelParams::Sampling(params)
            }
        }
    }

    /// The driver's argument array: one pointer per entry parameter, into `self` (which must
    /// stay put while they are used); null past the entry's last parameter.
    fn argument_pointers(&mut self) -> [*mut c_void; SoftmaxParams::FIELDS] {
        match self {
            KernelParams::Softmax(params) => params.argument_pointers(),
            KernelParams::Operation(params) => {
                let mut pointers = [std::ptr::null_mut(); SoftmaxParams::FIELDS];
                pointers[0] = (params as *mut RowOpParams).cast();
                pointers
            }
            KernelParams::CrossEntropy(params) => {
                let mut pointers = [std::ptr::null_mut(); SoftmaxParams::FIELDS];
                pointers[0] = (params as *mut CrossEntropyParams).cast();
                pointers
            }
            KernelParams::Sampling(params) => {
                let mut pointers = [std::ptr::null_mut(); SoftmaxParams::FIELDS];
                pointers[0] = (params as *mut SamplingParams).cast();
                pointers
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_arguments_point_at_each_field_in_order() {
        let softmax = SoftmaxParams {
            input: 7,
            cols: 3,
            cached: 1,
            stagger_ns: 11,
            ..SoftmaxParams::default()
        };
        let mut params = KernelParams::Softmax(softmax);
        let pointers = params.argument_pointers();
        // SAFETY: the pointers point into `params`, alive and unmoved, at fields of these
        // types: `input` first, `cols` tenth, `cached` third from last, `stagger_ns` last.
        unsafe {
            assert_eq!(*pointers[0].cast::<u64>(), 7);
            assert_eq!(*pointers[9].cast::<u32>(), 3);
            assert_eq!(*pointers[SoftmaxParams::FIELDS - 3].cast::<u32>(), 1);
            assert_eq!(*pointers[SoftmaxParams::FIELDS - 1].cast::<u32>(), 11);
        }
    }

    #[test]
    fn an_operation_argument_is_its_struct() {
        let operation = RowOpParams {
            cols: 5,
            ..RowOpParams::default()
        };
        let mut params = KernelParams::Operation(operation);
        let pointers = params.argument_pointers();
        // SAFETY: the first pointer points into `params`, alive and unmoved, at a
        // `RowOpParams`.
        assert_eq!(unsafe { *pointers[0].cast::<RowOpParams>() }, operation);
        assert!(pointers[1].is_null());
    }
}
