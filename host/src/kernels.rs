//! The embedded PTX module: loaded once, every entry looked up once, launched raw.

use std::collections::HashMap;
use std::ffi::c_void;

use cust::module::Module;
use cust::stream::Stream;
use cust::sys;

use crate::device::check;
use crate::error::{CudaContext, Error, Result};
use crate::plan::{self, Launch};

/// The PTX built from `kernels-gpu` by `build.rs`.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// The loaded module and a handle for each entry.
#[derive(Debug)]
pub(crate) struct Kernels {
    functions: HashMap<String, sys::CUfunction>,
    /// Keeps the functions valid; dropped after them.
    _module: Module,
}

impl Kernels {
    /// Loads the PTX (the driver compiles it for the device) and resolves every entry a plan
    /// can name; a missing entry is an error now rather than at the first launch.
    pub fn load(max_shared_per_block: u32) -> Result<Self> {
        let module = Module::from_ptx(PTX, &[]).during("loading the PTX module")?;
        let mut functions = HashMap::new();
        for name in plan::all_kernel_names() {
            let function = module.get_function(&name).map_err(|source| Error::Cuda {
                during: "looking up a kernel entry in the PTX module",
                source,
            })?;
            functions.insert(name, function.to_raw());
        }
        for name in ["softmax_row_slices_p4", "softmax_row_slices_p1"] {
            // SAFETY: the handle comes from the loaded module; the attribute takes an int.
            let status = unsafe {
                sys::cuFuncSetAttribute(
                    functions[name],
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    max_shared_per_block as i32,
                )
            };
            check(
                status,
                "raising the shared-memory limit of the row-slices kernel",
            )?;
        }
        Ok(Kernels {
            functions,
            _module: module,
        })
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
        let function = self.function(&launch.kernel);
        let params = args.as_mut_ptr();
        // SAFETY: the caller vouches for the arguments; grid and block come from the plan.
        let status = unsafe {
            if launch.cooperative {
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
                )
            } else {
                sys::cuLaunchKernel(
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
                    std::ptr::null_mut(),
                )
            }
        };
        check(status, "launching a kernel")
    }
}
