//! The embedded PTX modules (one enum names them all) and, for a loaded module, a handle for
//! each of its entries, looked up once, and the occupancy queries the planner asks of them.

use std::collections::HashMap;
use std::ffi::c_int;

use cust::module::Module;
use cust::sys;
use kernels_gpu::launch::ops::DType;

use crate::device::{check, check_code};
use crate::error::{CudaContext, Error, Result};
use crate::launch::{LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, LaunchConfig, launch_attribute};
use crate::plan::{self, Entry};

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

/// One PTX module the library embeds: `kernels-gpu` built with one feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ModuleId {
    /// The f32 softmax variants (the seeds and the production kernels).
    Softmax,
    /// The operation kernels of one input type, and that type's row-slices entries when it is
    /// a 16-bit type.
    Operations(DType),
}

impl ModuleId {
    pub fn ptx(self) -> &'static str {
        match self {
            ModuleId::Softmax => PTX,
            ModuleId::Operations(input) => op_ptx(input),
        }
    }

    /// Every entry a plan can name in this module.
    pub fn entries(self) -> Vec<Entry> {
        match self {
            ModuleId::Softmax => plan::softmax_module_entries(),
            ModuleId::Operations(input) => plan::operation_module_entries(input),
        }
    }
}

impl Entry {
    /// The module that holds this entry.
    pub(crate) fn module(self) -> ModuleId {
        match self {
            Entry::RowSlices(name) if name.dtype != DType::F32 => ModuleId::Operations(name.dtype),
            Entry::Operation(name) => ModuleId::Operations(name.input),
            _ => ModuleId::Softmax,
        }
    }

    /// Entries that may take more dynamic shared memory than the default 48 KiB.
    fn takes_large_shared_memory(self) -> bool {
        matches!(self, Entry::RowSlices(_) | Entry::RowCluster { .. })
    }
}

/// One loaded module and a handle for each entry.
#[derive(Debug)]
pub(crate) struct LoadedModule {
    functions: HashMap<Entry, sys::CUfunction>,
    /// Keeps the functions valid; dropped after them.
    _module: Module,
}

impl LoadedModule {
    /// Loads `id` (the driver compiles its PTX for the current context's device), resolves
    /// every entry (a missing one is an error now rather than at the first launch) and lets
    /// the entries that need it use `max_shared_per_block` bytes of dynamic shared memory
    /// and, where the device has them, clusters above the portable 8 blocks.
    pub fn load(id: ModuleId, max_shared_per_block: u32, clusters: bool) -> Result<Self> {
        let module = Module::from_ptx(id.ptx(), &[]).during("loading a PTX module")?;
        let mut functions = HashMap::new();
        for entry in id.entries() {
            let function = module
                .get_function(entry.to_string())
                .during("looking up a kernel entry in the PTX module")?;
            functions.insert(entry, function.to_raw());
        }
        let loaded = LoadedModule {
            functions,
            _module: module,
        };
        for (&entry, &function) in &loaded.functions {
            if entry.takes_large_shared_memory() {
                set_attribute(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                        as c_int,
                    max_shared_per_block as c_int,
                    "raising a kernel's shared-memory limit",
                )?;
            }
            if clusters && matches!(entry, Entry::RowCluster { .. }) {
                set_attribute(
                    function,
                    FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                    1,
                    "allowing non-portable cluster sizes",
                )?;
            }
        }
        Ok(loaded)
    }

    /// The handle of `entry` (an error, not a panic, if the module does not hold it).
    pub fn function(&self, entry: Entry) -> Result<sys::CUfunction> {
        self.functions
            .get(&entry)
            .copied()
            .ok_or_else(|| Error::Unsupported {
                variant: entry.to_string(),
                rows: 0,
                cols: 0,
                why: "the kernel entry is not in its module".into(),
            })
    }

    /// Blocks of `entry` resident per multiprocessor at this block size and shared memory.
    pub fn blocks_per_sm(&self, entry: Entry, threads: u32, shared_bytes: u32) -> Result<u32> {
        let mut blocks = 0;
        // SAFETY: valid function handle and out-pointer.
        let status = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                self.function(entry)?,
                threads as i32,
                shared_bytes as usize,
            )
        };
        check(status, "querying occupancy")?;
        Ok(blocks.max(0) as u32)
    }

    /// Clusters of `cluster` blocks of `entry` (with this block size and dynamic shared
    /// memory) that can be active on the device at once; 0 when not even one can be
    /// scheduled (`cuOccupancyMaxActiveClusters`).
    pub fn active_clusters(
        &self,
        entry: Entry,
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
            unsafe { cuOccupancyMaxActiveClusters(&mut clusters, self.function(entry)?, &config) };
        check_code(status, "querying cluster occupancy")?;
        Ok(clusters.max(0) as u32)
    }
}

/// `cuFuncSetAttribute` on `function`, with the attribute as the driver's plain int.
fn set_attribute(
    function: sys::CUfunction,
    attribute: c_int,
    value: c_int,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the handle comes from a loaded module; every attribute set here takes an int.
    let status = unsafe { set_function_attribute(function, attribute, value) };
    check_code(status, during)
}

/// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED` (CUDA 12; not in cust's enum).
const FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: c_int = 14;

// cust_raw declares `cuFuncSetAttribute` with its attribute enum, which stops before the
// cluster attributes; the C function takes a plain int (every attribute goes through this).
#[allow(clashing_extern_declarations)]
unsafe extern "C" {
    #[link_name = "cuFuncSetAttribute"]
    fn set_function_attribute(function: sys::CUfunction, attribute: c_int, value: c_int) -> c_int;
}

// A CUDA 12 driver call that cust 0.3.2's bindings predate; it returns a plain int (its cluster
// errors are newer than cust's `CUresult` enum).
unsafe extern "C" {
    /// Clusters of the configuration's size that can be active at once.
    fn cuOccupancyMaxActiveClusters(
        clusters: *mut c_int,
        function: sys::CUfunction,
        config: *const LaunchConfig<'_>,
    ) -> c_int;
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn every_entry_belongs_to_the_module_that_lists_it() {
        for module in [ModuleId::Softmax]
            .into_iter()
            .chain(DType::ALL.map(ModuleId::Operations))
        {
            for entry in module.entries() {
                assert_eq!(entry.module(), module, "{entry}");
            }
        }
    }

    #[test]
    fn every_entry_awaits_the_previous_grid_before_anything_else() {
        // Launches other than cooperative ones allow programmatic overlap with the previous
        // kernel in the stream; that is only sound if each kernel waits before it reads or
        // writes memory. So every entry the host loads must execute the wait unconditionally,
        // in its first block, before any branch or memory access.
        let modules = [ModuleId::Softmax]
            .into_iter()
            .chain(DType::ALL.map(ModuleId::Operations));
        for module in modules {
            let (names, faults) = entries_and_faults(module.ptx());
            let loaded: Vec<String> = module.entries().iter().map(Entry::to_string).collect();
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
