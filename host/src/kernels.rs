//! The embedded PTX modules: each loaded once, when first needed, every entry looked up once,
//! launched raw.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;

use cust::module::Module;
use cust::stream::Stream;
use cust::sys;

use crate::device::{check, check_code};
use crate::error::{CudaContext, Error, Result};
use crate::plan::{self, Launch};
use kernels_gpu::launch::ops::{DType, OpKernelName};
use kernels_gpu::launch::softmax::RowSlicesKernelName;

/// The f32 softmax variants' PTX, built from `kernels-gpu` by `build.rs`.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/softmax.ptx"));

/// The operation kernels' PTX for one input type.
pub fn op_ptx(input: DType) -> &'static str {
    match input {
        DType::F32 => include_str!(concat!(env!("OUT_DIR"), "/ops-f32.ptx")),
        DType::Bf16 => include_str!(concat!(env!("OUT_DIR"), "/ops-bf16.ptx")),
        DType::F16 => include_str!(concat!(env!("OUT_DIR"), "/ops-f16.ptx")),
    }
}

/// One loaded module and a handle for each entry.
#[derive(Debug)]
pub(crate) struct Kernels {
    functions: HashMap<String, sys::CUfunction>,
    /// Keeps the functions valid; dropped after them.
    _module: Module,
}

impl Kernels {
    /// Loads the softmax variants' module.
    pub fn load_softmax(max_shared_per_block: u32, thread_block_clusters: bool) -> Result<Self> {
        let kernels = Self::load(PTX, plan::all_kernel_names())?;
        for name in [
            "softmax_row_slices_p4",
            "softmax_row_slices_p1",
            "softmax_row_cluster_p4",
            "softmax_row_cluster_p1",
        ] {
            kernels.allow_shared_bytes(name, max_shared_per_block)?;
        }
        if thread_block_clusters {
            for name in ["softmax_row_cluster_p4", "softmax_row_cluster_p1"] {
                kernels.allow_non_portable_clusters(name)?;
            }
        }
        Ok(kernels)
    }

    /// Loads the operation kernels of one input type, and for 16-bit types the row-slices
    /// entries of that type.
    pub fn load_ops(input: DType, max_shared_per_block: u32) -> Result<Self> {
        let kernels = Self::load(op_ptx(input), op_module_entries(input))?;
        for name in row_slices_entries(input) {
            kernels.allow_shared_bytes(&name, max_shared_per_block)?;
        }
        Ok(kernels)
    }

    /// Loads `ptx` (the driver compiles it for the device) and resolves every entry of
    /// `names`: a missing entry is an error now rather than at the first launch.
    fn load(ptx: &str, names: impl IntoIterator<Item = String>) -> Result<Self> {
        let module = Module::from_ptx(ptx, &[]).during("loading a PTX module")?;
        let mut functions = HashMap::new();
        for name in names {
            let function = module.get_function(&name).map_err(|source| Error::Cuda {
                during: "looking up a kernel entry in the PTX module",
                source,
            })?;
            functions.insert(name, function.to_raw());
        }
        Ok(Kernels {
            functions,
            _module: module,
        })
    }

    /// Lets `name` launch in clusters above the portable size of 8 blocks.
    fn allow_non_portable_clusters(&self, name: &str) -> Result<()> {
        self.set_attribute(
            name,
            FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            1,
            "allowing non-portable cluster sizes",
        )
    }

    /// Lets `name` use up to `bytes` of dynamic shared memory (the opt-in limit).
    fn allow_shared_bytes(&self, name: &str, bytes: u32) -> Result<()> {
        self.set_attribute(
            name,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as c_int,
            bytes as c_int,
            "raising a kernel's shared-memory limit",
        )
    }

    /// `cuFuncSetAttribute` on `name`, with the attribute as the driver's plain int.
    fn set_attribute(
        &self,
        name: &str,
        attribute: c_int,
        value: c_int,
        during: &'static str,
    ) -> Result<()> {
        // SAFETY: the handle comes from the loaded module; both attributes set here take an
        // int value.
        let status = unsafe { set_function_attribute(self.function(name), attribute, value) };
        check_code(status, during)
    }

    pub fn function(&self, name: &str) -> sys::CUfunction {
        self.functions[name]
    }

    /// Blocks of `name` resident per multiprocessor at this block size and shared memory.
    pub fn blocks_per_sm(&self, name: &str, threads: u32, shared_bytes: u32) -> Result<u32> {
        let mut blocks = 0;
        // SAFETY: valid function handle and out-pointer.
        let status = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                self.function(name),
                threads as i32,
                shared_bytes as usize,
            )
        };
        check(status, "querying occupancy")?;
        Ok(blocks as u32)
    }

    /// Enqueues one launch on `stream`.
    ///
    /// # Safety
    /// `args` points to the launch's argument values, in the kernel's parameter order, and
    /// every pointer among them satisfies the kernel's `# Safety` contract for this grid.
    pub unsafe fn launch(
        &self,
        launch: &Launch,
        args: &mut [*mut c_void],
        stream: &Stream,
    ) -> Result<()> {
        debug_assert!(
            !(launch.cooperative && launch.cluster > 1),
            "a launch is cooperative or in clusters, not both"
        );
        let function = self.function(&launch.kernel);
        let params = args.as_mut_ptr();
        // SAFETY: the caller vouches for the arguments; grid and block come from the plan; the
        // configuration and its attribute array outlive the launch call, during which the
        // driver reads them.
        let status = unsafe {
            if launch.cooperative {
                // No programmatic overlap: a cooperative grid must find every block a place at
                // once, so it starts after the previous grid left (measured: allowing overlap
                // here gained nothing).
                sys::cuLaunchCooperativeKernel(
                    function,
                    launch.grid,
                    1,
                    1,
                    launch.block,
                    1,
                    1,
                    launch.shared_bytes,
                    stream.as_inner(),
                    params,
                ) as c_int
            } else {
                // Every entry starts with `griddepcontrol.wait` (kernels_gpu's contract), so the
                // grid may start once every block of the previous kernel in the stream has
                // exited, before that kernel's completion is signalled.
                let mut attributes = [
                    launch_attribute(LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, &[1]),
                    launch_attribute(LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &[launch.cluster, 1, 1]),
                ];
                let count = if launch.cluster > 1 { 2 } else { 1 };
                let config = LaunchConfig::new(
                    launch.grid,
                    launch.block,
                    launch.shared_bytes,
                    stream.as_inner(),
                    &mut attributes[..count],
                );
                cuLaunchKernelEx(&config, function, params, std::ptr::null_mut())
            }
        };
        check_code(status, "launching a kernel")
    }

    /// Clusters of `cluster` blocks of `name` (with this block size and dynamic shared
    /// memory) that can be active on the device at once; 0 when not even one can be
    /// scheduled (`cuOccupancyMaxActiveClusters`).
    pub fn active_clusters(
        &self,
        name: &str,
        threads: u32,
        shared_bytes: u32,
        cluster: u32,
    ) -> Result<u32> {
        let mut attribute = [launch_attribute(
            LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            &[cluster, 1, 1],
        )];
        let config = LaunchConfig::new(
            cluster,
            threads,
            shared_bytes,
            std::ptr::null_mut(),
            &mut attribute,
        );
        let mut clusters = 0;
        // SAFETY: valid function handle, out-pointer and configuration (which outlives the
        // call).
        let status =
            unsafe { cuOccupancyMaxActiveClusters(&mut clusters, self.function(name), &config) };
        check_code(status, "querying cluster occupancy")?;
        Ok(clusters.max(0) as u32)
    }
}

/// The row-slices entries in the operation module of `input`: those of 16-bit types (f32's
/// are in the softmax module).
fn row_slices_entries(input: DType) -> Vec<String> {
    match input {
        DType::F32 => Vec::new(),
        _ => RowSlicesKernelName::both(input)
            .map(|name| name.to_string())
            .into(),
    }
}

/// Every entry [`Kernels::load_ops`] resolves in the operation module of `input`.
fn op_module_entries(input: DType) -> impl Iterator<Item = String> {
    OpKernelName::all_for(input)
        .map(|name| name.to_string())
        .chain(row_slices_entries(input))
}

/// `CUlaunchAttribute` of the CUDA 12 driver API (`cuda.h`): an id, padding to 8 bytes, and a
/// 64-byte value union (8-byte aligned: some members are pointers); for the cluster dimension
/// the value starts with x, y and z, for programmatic stream serialization it is one int.
#[repr(C, align(8))]
struct LaunchAttribute {
    id: u32,
    pad: [u8; 4],
    value: [u32; 16],
}

/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`.
const LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: with a nonzero value, the grid may
/// start once every block of the previous kernel in the stream has exited, before that kernel's
/// completion is signalled (programmatic dependent launch).
const LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;

/// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED` (CUDA 12; not in cust's enum).
const FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: c_int = 14;

// cust_raw declares `cuFuncSetAttribute` with its attribute enum, which stops before the
// cluster attributes; the C function takes a plain int (every attribute goes through this).
#[allow(clashing_extern_declarations)]
unsafe extern "C" {
    #[link_name = "cuFuncSetAttribute"]
    fn set_function_attribute(function: sys::CUfunction, attribute: c_int, value: c_int) -> c_int;
}

/// `CUlaunchConfig` of the CUDA 12 driver API, borrowing its attribute array for `'a` (so the
/// configuration cannot outlive the attributes the driver reads through it).
#[repr(C)]
struct LaunchConfig<'a> {
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
    fn new(
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

// CUDA 12 driver calls that cust 0.3.2's bindings predate; the driver library the crate links
// (a CUDA 12 or later driver) exports them. Both return a plain int: their cluster errors (e.g.
// 912, `CUDA_ERROR_INVALID_CLUSTER_SIZE`) are newer than cust's `CUresult` enum.
unsafe extern "C" {
    /// Clusters of the configuration's size that can be active at once.
    fn cuOccupancyMaxActiveClusters(
        clusters: *mut c_int,
        function: sys::CUfunction,
        config: *const LaunchConfig<'_>,
    ) -> c_int;

    /// The extensible launch, here with the programmatic-overlap and cluster attributes.
    fn cuLaunchKernelEx(
        config: *const LaunchConfig<'_>,
        function: sys::CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> c_int;
}

/// A launch attribute whose value starts with `values` (an int, or a cluster's x, y and z).
fn launch_attribute(id: u32, values: &[u32]) -> LaunchAttribute {
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

    /// Whether a line of an entry's body may come before its `griddepcontrol.wait`: the
    /// parameter list, declarations, braces, comments, parameter loads and register arithmetic
    /// without a guard. Any label, branch, call, exit or other memory access is refused, as is
    /// anything else the list does not know (extend it when a new harmless opcode shows up).
    fn may_precede_the_wait(line: &str) -> bool {
        let line = line.trim();
        if line.is_empty()
            || line.starts_with("//")
            || line.starts_with('.')
            || line.starts_with(')')
            || line == "{"
        {
            return true;
        }
        let opcode = line.split_whitespace().next().unwrap_or("");
        let base = opcode.split('.').next().unwrap_or("");
        (opcode.starts_with("ld.param."))
            || [
                "mov", "cvta", "cvt", "shr", "shl", "and", "or", "add", "sub", "mul", "mad",
            ]
            .contains(&base)
    }

    #[test]
    fn only_parameter_loads_and_arithmetic_may_precede_the_wait() {
        assert!(may_precede_the_wait(
            "\tld.param.b64 \t%rd41, [entry_param_0];"
        ));
        assert!(may_precede_the_wait("\tcvta.to.global.u64 \t%rd1, %rd41;"));
        assert!(may_precede_the_wait("\t.reg .b32 \t%r<638>;"));
        assert!(may_precede_the_wait("\t// begin inline asm"));
        for line in [
            "\tld.global.b16 %rs1, [%rd59];",
            "\tld.u32 %r1, [%rd2];",
            "\tst.global.v4.f32 [%rd3], {%r1, %r2, %r3, %r4};",
            "\tatom.acq_rel.gpu.add.u32 %r1, [%rd2], %r3;",
            "\tcp.async.ca.shared.global [%rd1], [%rd2], 16;",
            "\tprefetch.global.L2 [%rd1];",
            "\t@%p1 bra \t$L__BB0_2;",
            "$L__BB0_2:",
            "\tcall.uni \tpanic, (param0);",
            "\tret;",
            "\t@%p1 add.s32 %r1, %r2, %r3;",
        ] {
            assert!(!may_precede_the_wait(line), "{line}");
        }
    }

    /// The entries of one PTX module (names) and, for each that does not start with the wait,
    /// why.
    fn entries_and_faults(ptx: &str) -> (Vec<String>, Vec<String>) {
        let (mut names, mut faults) = (Vec::new(), Vec::new());
        for entry in ptx.split(".entry ").skip(1) {
            let name = entry
                .split('(')
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
            let body = &entry[..entry.find("\n}").unwrap_or(entry.len())];
            let lines: Vec<&str> = body.lines().skip(1).collect();
            match lines
                .iter()
                .position(|line| line.trim() == "griddepcontrol.wait;")
            {
                None => faults.push(format!("{name} never executes griddepcontrol.wait")),
                Some(wait) => {
                    if let Some(line) = lines[..wait].iter().find(|l| !may_precede_the_wait(l)) {
                        faults.push(format!("{name}: `{}` comes before the wait", line.trim()));
                    }
                }
            }
            names.push(name);
        }
        (names, faults)
    }

    #[test]
    fn entries_that_do_not_wait_first_are_found() {
        let ptx = ".visible .entry good(\n\t.param .u64 good_param_0\n)\n{\n\t.reg .b64 %rd<3>;\n\
                   \tld.param.b64 %rd1, [good_param_0];\n\tgriddepcontrol.wait;\n\
                   \tld.global.b32 %r1, [%rd1];\n\tret;\n}\n\
                   .visible .entry late(\n\t.param .u64 late_param_0\n)\n{\n\
                   \t@%p1 bra $L__BB1_2;\n\tgriddepcontrol.wait;\n$L__BB1_2:\n\tret;\n}\n\
                   .visible .entry never(\n\t.param .u64 never_param_0\n)\n{\n\tret;\n}\n";
        let (names, faults) = entries_and_faults(ptx);
        assert_eq!(names, ["good", "late", "never"]);
        assert_eq!(faults.len(), 2, "{faults:?}");
        assert!(faults[0].starts_with("late: `@%p1 bra"), "{faults:?}");
        assert!(faults[1].starts_with("never never executes"), "{faults:?}");
    }

    #[test]
    fn every_entry_awaits_the_previous_grid_before_anything_else() {
        // Launches other than cooperative ones allow programmatic overlap with the previous
        // kernel in the stream; that is only sound if each kernel waits before it reads or
        // writes memory. So every entry the host loads must execute the wait unconditionally,
        // in its first block, before any branch or memory access.
        let modules: Vec<(&str, Vec<String>)> = [(PTX, plan::all_kernel_names())]
            .into_iter()
            .chain(
                [DType::F32, DType::Bf16, DType::F16]
                    .map(|input| (op_ptx(input), op_module_entries(input).collect())),
            )
            .collect();
        for (ptx, loaded) in modules {
            let (names, faults) = entries_and_faults(ptx);
            assert!(faults.is_empty(), "{faults:#?}");
            for name in &loaded {
                assert!(
                    names.contains(name),
                    "{name} is loaded but not in its module"
                );
            }
        }
    }
}
