//! The runtime: everything that talks to the driver. It loads the kernel modules, keeps the
//! plans the planner made for this device, owns the workspaces, and enqueues a plan's
//! launches on a stream. It knows nothing of the public views: the API hands it a request, a
//! shape, a layout and the call's device addresses.
//!
//! Layers below it: `plan` (pure) and the shared vocabulary (`shape`, `variant`, `error`).

pub(crate) mod driver;
pub(crate) mod launch;
mod module_cache;
pub(crate) mod modules;
mod plans;
pub mod tune;
mod workspace;

use std::rc::Rc;
use std::time::Duration;

use cust::sys;
use kernels_gpu::launch::cross_entropy::CrossEntropyParams;
use kernels_gpu::launch::ops::RowOpParams;
use kernels_gpu::launch::sampling::SamplingParams;

use self::driver::DeviceInfo;
use self::launch::{Bindings, WorkspaceAddresses};
use self::module_cache::Modules;
use self::modules::{KernelBuild, ModuleId};
use self::plans::PlanCache;
pub(crate) use self::plans::{PlanKey, Prepared};
use self::workspace::Workspaces;
use crate::error::{Error, Result};
use crate::plan::{Layout, Request, WorkspaceNeeds};
use crate::shape::Shape;

/// How long a row-slices block waits for the rest of its row before it leaves its slice to
/// the row's last block. A row's blocks all start within microseconds when nothing else runs
/// (the plan keeps them resident), so only blocks kept from starting (by other streams'
/// kernels holding their places) make a waiter leave; the leaver frees its place for them.
const ROW_BARRIER_PATIENCE: Duration = Duration::from_micros(200);

/// The device addresses one call binds, and its family's parameters (for operation and
/// cross-entropy plans).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CallBuffers {
    pub input: u64,
    pub output: u64,
    pub operation: RowOpParams,
    pub cross_entropy: CrossEntropyParams,
    pub sampling: SamplingParams,
}

/// One device's loaded kernels, plans and workspaces (its context current whenever any
/// method here runs: the API's calls make it so).
#[derive(Debug)]
pub(crate) struct Runtime {
    modules: Modules,
    workspaces: Workspaces,
    plans: PlanCache,
    pub info: DeviceInfo,
    /// Whether the machine has other devices, whose buffers calls must refuse.
    several_devices: bool,
    /// [`ROW_BARRIER_PATIENCE`], unless a test changed it.
    pub patience_ns: u64,
}

impl Runtime {
    /// Loads `build`'s softmax module and makes the first workspace, for `stream` (the
    /// device's context current).
    pub fn open(
        info: DeviceInfo,
        devices: u32,
        build: KernelBuild,
        stream: sys::CUstream,
    ) -> Result<Self> {
        let modules = Modules::open(build, info.compute_capability, info.max_shared_per_block)?;
        let workspaces = Workspaces::new(info.multiprocessors, stream)?;
        Ok(Runtime {
            modules,
            workspaces,
            plans: PlanCache::default(),
            info,
            several_devices: devices > 1,
            patience_ns: ROW_BARRIER_PATIENCE.as_nanos() as u64,
        })
    }

    pub fn build(&self) -> KernelBuild {
        self.modules.build
    }

    /// The plan for `request` on `shape` laid out as `layout`, made once. Making one loads
    /// kernels and queries the driver, which a stream being captured into a graph cannot
    /// take: then it is [`Error::NotReserved`].
    pub fn prepared(
        &mut self,
        request: Request,
        shape: Shape,
        layout: Layout,
        stream: sys::CUstream,
    ) -> Result<Rc<Prepared>> {
        let key = (request, shape, layout);
        if let Some(prepared) = self.plans.get(&key) {
            return Ok(prepared);
        }
        refuse_while_capturing(
            stream,
            "planning a call (loading kernels, querying occupancy)",
        )?;
        match request {
            Request::Variant(_) => {}
            Request::PlainSoftmax { dtype: input, .. }
            | Request::Operation { input, .. }
            | Request::CrossEntropy { input, .. }
            | Request::Sampling { input, .. } => {
                self.modules.load(ModuleId::Operations(input))?;
            }
        }
        self.plans.make(key, &self.info, &self.modules)
    }

    /// Keeps the plan of `key` whatever other shapes later calls plan.
    pub fn keep(&mut self, key: PlanKey) {
        self.plans.keep(key);
    }

    /// Grows every workspace to at least `needs` (zeroed on `stream`).
    pub fn reserve_workspace(
        &mut self,
        needs: WorkspaceNeeds,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.workspaces.reserve(needs, stream)
    }

    /// How many row-slices blocks have left their slices so far (the device idle).
    pub fn blocks_that_left(&self) -> Result<u64> {
        self.workspaces.blocks_that_left()
    }

    /// Sizes the workspace for `prepared` and enqueues its launches on `stream`.
    ///
    /// # Safety
    /// `prepared` is the plan of the call `buffers` describes (its request, `shape` and the
    /// layout of its buffers), every buffer named in `buffers` holds what that call needs, on
    /// this device, and `stream` is a stream of this device's primary context valid for the
    /// call.
    pub unsafe fn enqueue(
        &mut self,
        prepared: &Prepared,
        shape: Shape,
        buffers: &CallBuffers,
        stream: sys::CUstream,
    ) -> Result<()> {
        // Plans that use no workspace (most) touch none, and cost no driver call for it.
        let acquired = if prepared.needs.is_none() {
            None
        } else {
            Some(self.workspaces.acquire(stream, prepared.needs)?)
        };
        let bindings = Bindings {
            input: buffers.input,
            output: buffers.output,
            rows: shape.rows() as u32,
            operation: &buffers.operation,
            cross_entropy: &buffers.cross_entropy,
            sampling: &buffers.sampling,
            workspace: acquired.map_or(WorkspaceAddresses::NONE, |a| a.addresses),
            patience_ns: self.patience_ns,
            programmatic_overlap: self.modules.build.hopper_features(),
        };
        let mut enqueued = Ok(());
        for (launch, &function) in prepared.launches.iter().zip(&prepared.functions) {
            // SAFETY: forwarded from this function's contract; the workspace was acquired for
            // the plan's needs on this stream (a plan with none gets null addresses, which its
            // launches never use), and `function` is the handle of the launch's entry, loaded
            // in this device's context, current for the call.
            enqueued = unsafe { launch::enqueue(function, launch, &bindings, stream) };
            if enqueued.is_err() {
                break;
            }
        }
        // Recorded even after a failed launch: whatever was enqueued stays ordered.
        let released = acquired.map_or(Ok(()), |a| self.workspaces.release(a, stream));
        enqueued.and(released)
    }

    /// Refuses any address that is not device memory of this device.
    ///
    /// On a machine with one device every device buffer is this device's, and the check (a
    /// driver query per buffer, a sizeable part of a call's host time) is skipped.
    pub fn check_on_device(&self, buffers: &[(&'static str, u64)]) -> Result<()> {
        if !self.several_devices {
            return Ok(());
        }
        for &(what, address) in buffers {
            let ordinal = driver::pointer_device(address)
                .map_err(|_| Error::NotDeviceMemory { what, address })?;
            if ordinal != self.info.ordinal {
                return Err(Error::WrongDevice {
                    what,
                    device: ordinal,
                    expected: self.info.ordinal,
                });
            }
        }
        Ok(())
    }
}

/// Refuses to do `what` (allocate, load a module, plan, wait) while `stream` is being
/// captured into a graph, which such work would break.
pub(crate) fn refuse_while_capturing(stream: sys::CUstream, what: &'static str) -> Result<()> {
    if driver::is_capturing(stream)? {
        return Err(Error::NotReserved { what });
    }
    Ok(())
}
