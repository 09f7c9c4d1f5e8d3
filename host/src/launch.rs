//! The one launch path: a planned [`Launch`] and the buffers of a call ([`Bindings`]) become
//! the entry's one parameter (its family's `#[repr(C)]` struct, shared with the kernels), and
//! one driver launch on a stream.

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;

use cust::sys;
use kernels_gpu::launch::ops::{RowOpParams, mode};
use kernels_gpu::launch::softmax::SoftmaxParams;

use crate::device::check_code;
use crate::error::Result;
use crate::plan::{Launch, OperationPass, Params, Scheduling, Slicing};

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
        launch_raw(
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
}

impl KernelParams {
    /// The parameter struct of `launch` for the call `bindings` describe.
    fn of(launch: &Launch, bindings: &Bindings<'_>) -> Self {
        let b = bindings;
        let w = b.workspace;
        let softmax = |rows: u32, cols: u32, slicing: Slicing, cached: bool, len: u64| {
            KernelParams::Softmax(SoftmaxParams {
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
            })
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
            }
            | Params::RowCluster {
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
        }
    }
}

/// The driver launch of `launch`'s grid with `params`, allowed to overlap the previous grid's
/// tail where `overlap` says the entry waits for it.
///
/// # Safety
/// `params` points to the entry's argument pointers, one per parameter, whose values
/// satisfy the kernel's `# Safety` contract for this grid; `function` and `stream` belong to the current context;
/// `overlap` only where `function` starts with `griddepcontrol.wait`.
unsafe fn launch_raw(
    function: sys::CUfunction,
    launch: &Launch,
    params: *mut *mut c_void,
    stream: sys::CUstream,
    overlap: bool,
) -> Result<()> {
    // SAFETY: forwarded from this function's contract; the configuration and its attribute
    // array outlive the launch call, during which the driver reads them.
    let status = unsafe {
        match launch.scheduling {
            // No programmatic overlap: a cooperative grid must find every block a place at
            // once, so it starts after the previous grid left (measured: allowing overlap
            // here gained nothing).
            Scheduling::Cooperative => sys::cuLaunchCooperativeKernel(
                function,
                launch.grid,
                1,
                1,
                launch.block,
                1,
                1,
                launch.shared_bytes,
                stream,
                params,
            ) as c_int,
            // Every entry of the sm_90 build starts with `griddepcontrol.wait` (kernels-gpu's
            // contract), so the grid may start once every block of the previous kernel in the
            // stream has exited, before that kernel's completion is signalled.
            Scheduling::Ordinary | Scheduling::Clusters(_) => {
                let cluster = match launch.scheduling {
                    Scheduling::Clusters(blocks) => blocks,
                    _ => 1,
                };
                let mut attributes = [
                    launch_attribute(LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &[cluster, 1, 1]),
                    launch_attribute(LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, &[1]),
                ];
                let first = if cluster > 1 { 0 } else { 1 };
                let last = if overlap { 2 } else { 1 };
                let config = LaunchConfig::new(
                    launch.grid,
                    launch.block,
                    launch.shared_bytes,
                    stream,
                    &mut attributes[first..last.max(first)],
                );
                cuLaunchKernelEx(&config, function, params, std::ptr::null_mut())
            }
        }
    };
    check_code(status, "launching a kernel")
}

/// `CUlaunchAttribute` of the CUDA 12 driver API (`cuda.h`): an id, padding to 8 bytes, and a
/// 64-byte value union (8-byte aligned: some members are pointers); for the cluster dimension
/// the value starts with x, y and z, for programmatic stream serialization it is one int.
#[repr(C, align(8))]
pub(crate) struct LaunchAttribute {
    id: u32,
    pad: [u8; 4],
    value: [u32; 16],
}

/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`.
pub(crate) const LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: with a nonzero value, the grid may
/// start once every block of the previous kernel in the stream has exited, before that kernel's
/// completion is signalled (programmatic dependent launch).
const LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;

/// `CUlaunchConfig` of the CUDA 12 driver API, borrowing its attribute array for `'a` (so the
/// configuration cannot outlive the attributes the driver reads through it).
#[repr(C)]
pub(crate) struct LaunchConfig<'a> {
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    stream: sys::CUstream,
    attributes: *mut LaunchAttribute,
    attribute_count: u32,
    borrowed: PhantomData<&'a mut [LaunchAttribute]>,
}

impl<'a> LaunchConfig<'a> {
    /// `grid` blocks of `block` threads along x on `stream`, with `attributes`.
    pub(crate) fn new(
        grid: u32,
        block: u32,
        shared_bytes: u32,
        stream: sys::CUstream,
        attributes: &'a mut [LaunchAttribute],
    ) -> Self {
        LaunchConfig {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes,
            stream,
            attributes: attributes.as_mut_ptr(),
            attribute_count: attributes.len() as u32,
            borrowed: PhantomData,
        }
    }
}

// A CUDA 12 driver call that cust 0.3.2's bindings predate; the driver library the crate links
// (a CUDA 12 or later driver) exports it. It returns a plain int: its cluster errors (e.g. 912,
// `CUDA_ERROR_INVALID_CLUSTER_SIZE`) are newer than cust's `CUresult` enum.
unsafe extern "C" {
    /// The extensible launch, here with the programmatic-overlap and cluster attributes.
    fn cuLaunchKernelEx(
        config: *const LaunchConfig<'_>,
        function: sys::CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> c_int;
}

/// A launch attribute whose value starts with `values` (an int, or a cluster's x, y and z).
pub(crate) fn launch_attribute(id: u32, values: &[u32]) -> LaunchAttribute {
    let mut value = [0; 16];
    value[..values.len()].copy_from_slice(values);
    LaunchAttribute {
        id,
        pad: [0; 4],
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_structs_have_the_driver_layout() {
        // cuda.h (12.x): CUlaunchAttribute is 72 bytes, 8-aligned, its value at offset 8;
        // CUlaunchConfig has hStream at 32, attrs at 40, numAttrs at 48 (56 bytes).
        assert_eq!(
            (
                std::mem::size_of::<LaunchAttribute>(),
                std::mem::align_of::<LaunchAttribute>()
            ),
            (72, 8)
        );
        assert_eq!(std::mem::offset_of!(LaunchAttribute, value), 8);
        assert_eq!(std::mem::offset_of!(LaunchConfig, stream), 32);
        assert_eq!(std::mem::offset_of!(LaunchConfig, attributes), 40);
        assert_eq!(std::mem::offset_of!(LaunchConfig, attribute_count), 48);
        assert_eq!(std::mem::size_of::<LaunchConfig>(), 56);
    }

    #[test]
    fn softmax_arguments_point_at_each_field_in_order() {
        let softmax = SoftmaxParams {
            input: 7,
            cols: 3,
            cached: 1,
            ..SoftmaxParams::default()
        };
        let mut params = KernelParams::Softmax(softmax);
        let pointers = params.argument_pointers();
        // SAFETY: the pointers point into `params`, alive and unmoved, at fields of these
        // types: `input` first, `cols` tenth, `cached` last.
        unsafe {
            assert_eq!(*pointers[0].cast::<u64>(), 7);
            assert_eq!(*pointers[9].cast::<u32>(), 3);
            assert_eq!(*pointers[SoftmaxParams::FIELDS - 1].cast::<u32>(), 1);
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
