//! The public entry point: a device, its loaded kernels, a stream and preallocated workspace.
//!
//! Every public call follows one pipeline: make the context current, check the caller's
//! buffers, build a [`Request`] and the call's bindings, plan the request once per shape and
//! layout (`crate::plan`), size the workspace, and enqueue the plan's launches
//! (`crate::launch`). The f32 `run` and the operations (`softmax/operations.rs`) differ only in
//! what they check and what they request.

mod operations;
mod raw;
mod reserve;

pub use raw::RawRows;
pub use reserve::CallKind;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::time::Duration;

use cust::context::{Context, CurrentContext};
use cust::event::{Event, EventFlags};
use cust::memory::{CopyDestination, DeviceBuffer, DeviceSlice};
use cust::stream::{Stream, StreamFlags};
use cust::sys;
use kernels_gpu::launch::ops::RowOpParams;
use kernels_gpu::launch::softmax::BLOCK_SMEM_AUTOTUNE_CANDIDATES;

use crate::autotune::{TuneCache, TuneKey};
use crate::device::{self, ContextScope, DeviceInfo};
use crate::error::{CudaContext, Error, Result};
use crate::launch::{self, Bindings, WorkspaceAddresses};
use crate::module::{KernelBuild, KernelImage, LoadedModule, ModuleId};
use crate::plan::{self, DeviceLimits, Entry, Launch, Layout, Request, WorkspaceNeeds};
use crate::shape::Shape;
use crate::variant::Variant;
use crate::views::{Element, Operation, Options, RowState, Rows, RowsMut};
use crate::workspace::Workspaces;

/// Plans kept before the cache starts over (reserved plans aside, which are always kept): a
/// process that sees ever new shapes keeps a bounded amount of memory, and one that reuses a
/// few shapes never replans them.
const PLAN_CACHE_LIMIT: usize = 4096;

/// How long a row-slices block waits for the rest of its row before it leaves its slice to
/// the row's last block. A row's blocks all start within microseconds when nothing else runs
/// (the plan keeps them resident), so only blocks kept from starting (by other streams'
/// kernels holding their places) make a waiter leave; the leaver frees its place for them.
const ROW_BARRIER_PATIENCE: Duration = Duration::from_micros(200);

/// The environment variable naming a tune cache file that `Variant::Auto` reads (see
/// [`Softmax::with_tune_cache`]); without it, or set empty, `Auto` uses the built-in dispatch
/// alone.
pub const TUNE_CACHE_ENV: &str = "SOFTMAX_TUNE_CACHE";

/// Row-wise softmax on one CUDA device.
///
/// Owns a stream: [`Softmax::run`] only enqueues work on it, so results (and errors raised
/// while kernels run) appear after [`Softmax::synchronize`]. Owns the workspaces some plans
/// need (one per stream it is called on), so it takes `&mut self`; calls on other streams
/// ([`Softmax::on`]) are correct in any interleaving. It is `Send`; threads that work
/// concurrently each create their own (they share the device's primary context). Every call
/// leaves the caller's current context as it found it.
#[derive(Debug)]
pub struct Softmax {
    modules: Modules,
    workspaces: Workspaces,
    plans: HashMap<PlanKey, Rc<Prepared>, BuildHasherDefault<KeyHasher>>,
    /// Plans `reserve` made: kept whatever the cache holds otherwise.
    reserved: HashSet<PlanKey>,
    /// Threads per block the autotuned block-per-row variant chose, per shape.
    autotuned: HashMap<Shape, u32>,
    /// Shapes and layouts whose tuned choice cannot run them: `Auto` uses the built-in rule.
    untunable: HashSet<(Shape, Layout)>,
    tune_cache: TuneCache,
    /// The device name tuned choices are kept under ([`tuned_device_name`]), fixed with the
    /// device and the kernel build when the instance is made.
    tune_device: String,
    /// [`ROW_BARRIER_PATIENCE`], unless a test changed it.
    patience_ns: u64,
    stream: Stream,
    /// Whether the machine has other devices, whose buffers calls must refuse.
    several_devices: bool,
    /// The caller's stream for the call in progress ([`Softmax::on`], the raw calls), else
    /// `stream`.
    caller_stream: Option<sys::CUstream>,
    info: DeviceInfo,
    /// Dropped after everything above, which lives in this context.
    context: Context,
    /// Dropped last: puts back the context that was current when the instance was dropped.
    dropped_from: DropScope,
}

/// The context current where a [`Softmax`] is dropped, made current again once its resources
/// are freed in its own.
#[derive(Debug, Default)]
struct DropScope(Option<ContextScope>);

// SAFETY: the raw function handles inside the loaded modules and plans are driver objects that
// any thread may use once the owning context is current, and every method that touches the
// device makes `context` current first (dropping too). Nothing is shared between instances
// except the driver's primary context, which the driver synchronizes itself.
unsafe impl Send for Softmax {}

impl Drop for Softmax {
    fn drop(&mut self) {
        // The modules and buffers dropped after this free themselves in this instance's
        // context, once the work that may still use them (on this instance's stream or the
        // caller's) has finished; then `dropped_from` puts the caller's context back.
        if let Ok(scope) = ContextScope::enter(self.context.as_raw()) {
            let _ = CurrentContext::synchronize();
            self.dropped_from.0 = Some(scope);
        }
    }
}

type PlanKey = (Request, Shape, Layout);

/// The device name tuned choices are kept under: choices tuned with one kernel build are not
/// the other's, so a build other than the device's own keys its choices apart
/// (`nvidia-h200-sm_80`).
fn tuned_device_name(device: &DeviceInfo, build: KernelBuild) -> String {
    if KernelBuild::native_for(device).ok() == Some(build) {
        device.slug()
    } else {
        format!("{}-{build}", device.slug())
    }
}

/// The plan cache's hasher. Every call looks its plan up, and a key is a handful of small
/// integers from the library itself, so SipHash's resistance to chosen keys buys nothing:
/// each word is folded in with a rotate, an xor and a multiply by an odd constant.
#[derive(Default)]
struct KeyHasher(u64);

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.add(value.into());
    }

    fn write_u32(&mut self, value: u32) {
        self.add(value.into());
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }
}

/// A plan made once: its launches, each entry's handle, and what they need of the workspace.
#[derive(Debug)]
struct Prepared {
    launches: Vec<Launch>,
    functions: Vec<sys::CUfunction>,
    needs: WorkspaceNeeds,
}

/// The kernel modules of one build, the softmax module loaded with the instance and each
/// operation module (by input type) on first use.
#[derive(Debug)]
struct Modules {
    softmax: LoadedModule,
    operations: [Option<LoadedModule>; 3],
    max_shared_per_block: u32,
    build: KernelBuild,
    compute_capability: (u32, u32),
}

impl Modules {
    fn get(&self, id: ModuleId) -> Option<&LoadedModule> {
        match id {
            ModuleId::Softmax => Some(&self.softmax),
            ModuleId::Operations(input) => self.operations[input as usize].as_ref(),
        }
    }

    /// Loads `id` of `build` as the image a device of `compute_capability` takes.
    fn load_one(
        id: ModuleId,
        build: KernelBuild,
        compute_capability: (u32, u32),
        max_shared_per_block: u32,
    ) -> Result<LoadedModule> {
        let image = id.image_for(build, compute_capability);
        LoadedModule::load(id, build, image, max_shared_per_block)
    }

    /// Loads `id` unless it is loaded (the context must be current).
    fn load(&mut self, id: ModuleId) -> Result<()> {
        if let ModuleId::Operations(input) = id
            && self.operations[input as usize].is_none()
        {
            let loaded = Self::load_one(
                id,
                self.build,
                self.compute_capability,
                self.max_shared_per_block,
            )?;
            self.operations[input as usize] = Some(loaded);
        }
        Ok(())
    }
}

/// The device's limits as the planner sees them, from occupancy queries on the loaded
/// modules. A failed query is remembered (and answered 0, which rules the configuration out),
/// so that the plan is refused rather than degraded.
struct Limits<'a> {
    info: &'a DeviceInfo,
    modules: &'a Modules,
    failure: RefCell<Option<Error>>,
}

impl Limits<'_> {
    fn answer(&self, result: Result<u32>) -> u32 {
        result.unwrap_or_else(|error| {
            self.failure.borrow_mut().get_or_insert(error);
            0
        })
    }

    fn module(&self, entry: Entry) -> Result<&LoadedModule> {
        self.modules
            .get(entry.module())
            .ok_or_else(|| Error::ModuleNotLoaded {
                entry: entry.to_string(),
            })
    }
}

impl DeviceLimits for Limits<'_> {
    fn multiprocessors(&self) -> u32 {
        self.info.multiprocessors
    }

    fn max_shared_per_block(&self) -> u32 {
        self.info.max_shared_per_block
    }

    fn blocks_per_sm(&self, entry: Entry, threads: u32, shared_bytes: u32) -> u32 {
        let result = self
            .module(entry)
            .and_then(|m| m.blocks_per_sm(entry, threads, shared_bytes));
        self.answer(result)
    }

    fn cooperative_launch(&self) -> bool {
        self.info.supports_cooperative_launch
    }

    fn thread_block_clusters(&self) -> bool {
        self.modules.build.hopper_features()
    }

    fn active_clusters(&self, entry: Entry, threads: u32, shared_bytes: u32, cluster: u32) -> u32 {
        let result = self
            .module(entry)
            .and_then(|m| m.active_clusters(entry, threads, shared_bytes, cluster));
        self.answer(result)
    }
}

/// The device addresses one call binds, and its operation parameters (for operation plans).
#[derive(Clone, Copy, Debug, Default)]
struct CallBuffers {
    input: u64,
    output: u64,
    operation: RowOpParams,
}

impl Softmax {
    /// Opens the first CUDA device.
    pub fn new() -> Result<Self> {
        Self::on_device(0)
    }

    /// Opens CUDA device `ordinal`, loads the kernels and allocates the workspace.
    ///
    /// `Variant::Auto` uses the built-in dispatch, the same on every machine, unless the
    /// environment variable [`TUNE_CACHE_ENV`] names a tune cache file or
    /// [`Softmax::with_tune_cache`] gives one.
    ///
    /// The kernel build is the device's native one ([`KernelBuild::native_for`]) unless the
    /// environment variable [`KERNEL_BUILD_ENV`](crate::KERNEL_BUILD_ENV) names another (`sm_80` on a Hopper GPU runs
    /// the Ampere build there); see [`Softmax::with_kernel_build`].
    pub fn on_device(ordinal: u32) -> Result<Self> {
        Self::with_kernel_build(ordinal, KernelBuild::from_env()?)
    }

    /// [`Softmax::on_device`] with the kernel build chosen: `None` is the device's native
    /// build. A device below compute capability 8.0, or [`KernelBuild::Sm90`] below 9.0, is
    /// [`Error::UnsupportedDevice`].
    pub fn with_kernel_build(ordinal: u32, build: Option<KernelBuild>) -> Result<Self> {
        // Puts back a context that was current before (leaving the device's primary context
        // current on a thread that had none, so buffers can be made there next).
        let (context, info, devices, _previous) = device::open(ordinal)?;
        let tune_cache = TuneCache::open(crate::autotune::path_from_env())?;
        let build = match build {
            Some(build) => build.checked_for(&info)?,
            None => KernelBuild::native_for(&info)?,
        };
        let softmax = Modules::load_one(
            ModuleId::Softmax,
            build,
            info.compute_capability,
            info.max_shared_per_block,
        )?;
        // A blocking stream: its work waits for what came before it on the legacy default
        // stream, where cust's synchronous calls run. A pageable host-to-device copy
        // (`DeviceBuffer::from_slice`, `copy_from`) may return before its DMA lands; a
        // non-blocking stream would let a launch read inputs half copied.
        let stream = Stream::new(StreamFlags::DEFAULT, None).during("creating a stream")?;
        let workspaces = Workspaces::new(info.multiprocessors, stream.as_inner())?;
        Ok(Softmax {
            modules: Modules {
                softmax,
                operations: [None, None, None],
                max_shared_per_block: info.max_shared_per_block,
                build,
                compute_capability: info.compute_capability,
            },
            workspaces,
            plans: HashMap::default(),
            reserved: HashSet::new(),
            autotuned: HashMap::new(),
            untunable: HashSet::new(),
            tune_cache,
            tune_device: tuned_device_name(&info, build),
            patience_ns: ROW_BARRIER_PATIENCE.as_nanos() as u64,
            stream,
            several_devices: devices > 1,
            caller_stream: None,
            info,
            context,
            dropped_from: DropScope::default(),
        })
    }

    /// The device this instance runs on.
    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// The kernel build this instance runs.
    pub fn kernel_build(&self) -> KernelBuild {
        self.modules.build
    }

    /// What the softmax module loaded as on this device (a cubin, or PTX the driver
    /// compiled); the operation modules load the same kind of image.
    pub fn kernel_image(&self) -> KernelImage {
        ModuleId::Softmax.image_for(self.modules.build, self.info.compute_capability)
    }

    /// Testing hook: how long a block of a row cut into slices waits for the row's other
    /// blocks before it leaves its slice to the row's last block (default 200 µs). Zero
    /// makes nearly every block leave, which exercises that path; results stay exact, only
    /// slower.
    #[doc(hidden)]
    pub fn set_row_barrier_patience(&mut self, patience: Duration) {
        self.patience_ns = u64::try_from(patience.as_nanos()).unwrap_or(u64::MAX);
    }

    /// Testing hook: how many blocks of row-slices launches have left their slices to their
    /// rows' last blocks so far on this instance (waits for the device first). Tests read it
    /// to prove that the leaving path ran.
    #[doc(hidden)]
    pub fn blocks_that_left(&self) -> Result<u64> {
        let _context = self.enter()?;
        CurrentContext::synchronize().during("waiting for the device")?;
        self.workspaces.blocks_that_left()
    }

    /// The stream every launch is enqueued on, unless a call is issued on another
    /// ([`Softmax::on`]).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Issues the calls made through the returned handle on `stream`, a stream of this
    /// device's primary context that the caller owns, instead of the instance's: each call's
    /// work is ordered after what was enqueued on `stream` before it and before what is
    /// enqueued after it, and nothing waits for it. (The first call on a new element type
    /// loads a module, which waits for the device; [`Softmax::reserve`] does that ahead of
    /// time.) Calls on any number of streams through one instance are correct in any
    /// interleaving: each stream gets a workspace of its own (docs/library.md, "One instance,
    /// many streams").
    ///
    /// The call returns while its kernels still use the buffers: synchronize `stream` (or
    /// order later work after it with an event) before reading the outputs, writing the
    /// inputs again or dropping either. cust's copies run on the legacy default stream, which
    /// a non-blocking stream is not ordered with.
    pub fn on<'a>(&'a mut self, stream: &'a Stream) -> OnStream<'a> {
        OnStream {
            softmax: self,
            stream: stream.as_inner(),
            borrowed: std::marker::PhantomData,
        }
    }

    /// Runs `call` with its work enqueued on `stream`.
    ///
    /// The instance's own stream is put back however `call` ends, unwinding included.
    fn with_stream<T>(&mut self, stream: sys::CUstream, call: impl FnOnce(&mut Self) -> T) -> T {
        let outer = self.caller_stream.replace(stream);
        let scope = StreamScope {
            softmax: self,
            outer,
        };
        call(&mut *scope.softmax)
    }

    /// Where the call in progress enqueues its work.
    fn target_stream(&self) -> sys::CUstream {
        self.caller_stream.unwrap_or_else(|| self.stream.as_inner())
    }

    /// Refuses to do `what` (allocate, load a module, plan, wait) while the target stream is
    /// being captured into a graph, which such work would break.
    fn refuse_while_capturing(&self, what: &'static str) -> Result<()> {
        if device::is_capturing(self.target_stream())? {
            return Err(Error::NotReserved { what });
        }
        Ok(())
    }

    /// Waits for everything enqueued so far on this instance's own stream (work issued on the
    /// caller's stream is the caller's to wait for); reports errors raised while kernels ran.
    pub fn synchronize(&self) -> Result<()> {
        let _context = self.enter()?;
        self.stream.synchronize().during("waiting for the stream")
    }

    /// Makes this instance's context current on the calling thread until the returned scope
    /// ends, which puts the caller's back: the first step of every call that touches the
    /// device.
    pub(crate) fn enter(&self) -> Result<ContextScope> {
        ContextScope::enter(self.context.as_raw())
    }

    /// Enqueues the softmax of each row of `input` (row-major `shape`) into `output`.
    ///
    /// Checks everything before launching anything: buffer lengths against the shape, the
    /// variant's parameters, whether the variant can run the shape, that the buffers are on
    /// this device and do not overlap. Empty shapes succeed without a launch. Pointers need
    /// no particular alignment: 16-byte accesses are used where both allow them.
    pub fn run(
        &mut self,
        variant: Variant,
        input: &DeviceSlice<f32>,
        output: &mut DeviceSlice<f32>,
        shape: Shape,
    ) -> Result<()> {
        let _context = self.enter()?;
        shape.check_lengths(input.len(), output.len())?;
        variant.validate()?;
        if shape.is_empty() {
            return Ok(());
        }
        let (input, output) = (address(input), address(&*output));
        let bytes = shape.len() as u64 * 4;
        self.check_on_device(&[("input", input), ("output", output)])?;
        check_disjoint("output", (output, bytes), "input", (input, bytes))?;
        let layout = plan::pair_layout(input, output, shape.cols());
        let variant = match variant {
            Variant::BlockPerRowAutotuned => Variant::BlockPerRowSmem {
                threads_per_block: self.tune_block_threads(shape, input, output)?,
            },
            other => other,
        };
        let prepared = self.variant_plan(variant, shape, layout)?;
        let buffers = CallBuffers {
            input,
            output,
            ..CallBuffers::default()
        };
        // SAFETY: `check_lengths` proved both buffers hold rows × cols floats of this device,
        // distinct; the plan is the planner's for this variant, shape and layout (16-byte
        // entries only where the layout allows them).
        unsafe { self.enqueue(&prepared, shape, &buffers) }
    }

    /// The plan `variant` runs on `shape` laid out as `layout`; for `Auto`, a tuned choice
    /// when [`Softmax::tune`] recorded one for the device and rounded shape and it can run
    /// this shape, else the built-in dispatch.
    fn variant_plan(
        &mut self,
        variant: Variant,
        shape: Shape,
        layout: Layout,
    ) -> Result<Rc<Prepared>> {
        if variant == Variant::Auto
            && !self.tune_cache.is_empty()
            && !self.untunable.contains(&(shape, layout))
            && let Some(tuned) = self.tune_cache.get(&self.tune_key(shape, layout))
        {
            match self.prepared(Request::Variant(tuned), shape, layout) {
                Ok(prepared) => return Ok(prepared),
                // The tuned choice cannot run this shape of its bucket: the built-in rule,
                // from now on.
                Err(Error::Unsupported { .. }) => {
                    self.untunable.insert((shape, layout));
                }
                Err(other) => return Err(other),
            }
        }
        self.prepared(Request::Variant(variant), shape, layout)
    }

    fn tune_key(&self, shape: Shape, layout: Layout) -> TuneKey {
        let aligned = layout == Layout::Aligned;
        TuneKey::for_layout(
            &self.tune_device,
            shape,
            aligned,
            layout != Layout::Elements,
        )
    }

    /// Convenience over host memory: copies `input` to the device, runs, waits, copies back.
    pub fn run_host(&mut self, variant: Variant, input: &[f32], shape: Shape) -> Result<Vec<f32>> {
        let _context = self.enter()?;
        shape.check_lengths(input.len(), shape.len())?;
        if shape.is_empty() {
            return Ok(Vec::new());
        }
        let device_input =
            DeviceBuffer::from_slice(input).during("copying the input to the device")?;
        // SAFETY: f32 has no invalid bit patterns and every element is written before it is read.
        let mut device_output =
            unsafe { DeviceBuffer::uninitialized(shape.len()) }.during("allocating the output")?;
        self.run(variant, &device_input, &mut device_output, shape)?;
        self.synchronize()?;
        let mut output = vec![0.0; shape.len()];
        device_output
            .copy_to(&mut output[..])
            .during("copying the output to the host")?;
        Ok(output)
    }

    /// Threads per block the autotuned block-per-row variant chose for `shape`, once it has.
    pub fn tuned_threads(&self, shape: Shape) -> Option<u32> {
        self.autotuned.get(&shape).copied()
    }

    /// Names of the kernels `variant` would launch for `shape` on 16-byte aligned buffers.
    pub fn kernels_for(&mut self, variant: Variant, shape: Shape) -> Result<Vec<String>> {
        let _context = self.enter()?;
        if shape.is_empty() {
            return Ok(Vec::new());
        }
        let variant = match variant {
            Variant::BlockPerRowAutotuned => match self.autotuned.get(&shape) {
                Some(&threads_per_block) => Variant::BlockPerRowSmem { threads_per_block },
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
        Ok(prepared
            .launches
            .iter()
            .map(|l| l.label(&l.scheduling_details()))
            .collect())
    }

    /// The plan for `request` on `shape` laid out as `layout`, made once: planning queries
    /// the driver for occupancy, which costs more host time than a short kernel runs. A plan
    /// for which a query failed is an error and is not kept.
    fn prepared(&mut self, request: Request, shape: Shape, layout: Layout) -> Result<Rc<Prepared>> {
        let key = (request, shape, layout);
        if let Some(prepared) = self.plans.get(&key) {
            return Ok(Rc::clone(prepared));
        }
        self.refuse_while_capturing("planning a call (loading kernels, querying occupancy)")?;
        match request {
            Request::Variant(_) => {}
            Request::PlainSoftmax { dtype: input, .. } | Request::Operation { input, .. } => {
                self.modules.load(ModuleId::Operations(input))?;
            }
        }
        let limits = Limits {
            info: &self.info,
            modules: &self.modules,
            failure: RefCell::new(None),
        };
        let launches = plan::plan(request, shape, layout, &limits)?;
        if let Some(error) = limits.failure.into_inner() {
            return Err(error);
        }
        for launch in &launches {
            if launch.grid == 0 || launch.grid > plan::MAX_GRID {
                return Err(Error::ShapeTooLarge {
                    rows: shape.rows(),
                    cols: shape.cols(),
                    why: "the launch would need more blocks than a grid holds",
                });
            }
        }
        let functions = launches
            .iter()
            .map(|l| {
                let module = self.modules.get(l.entry.module());
                module.map_or_else(
                    || {
                        Err(Error::ModuleNotLoaded {
                            entry: l.entry.to_string(),
                        })
                    },
                    |m| m.function(l.entry),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let prepared = Rc::new(Prepared {
            needs: plan::workspace_needs(&launches),
            launches,
            functions,
        });
        if self.plans.len() >= PLAN_CACHE_LIMIT + self.reserved.len() {
            let reserved = &self.reserved;
            self.plans.retain(|key, _| reserved.contains(key));
        }
        self.plans.insert(key, Rc::clone(&prepared));
        Ok(prepared)
    }

    /// Sizes the workspace for `prepared` and enqueues its launches on the stream.
    ///
    /// # Safety
    /// `prepared` is the plan of the call `buffers` describes (its request, `shape` and the
    /// layout of its buffers), and every buffer named in `buffers` holds what that call
    /// needs, on this device.
    unsafe fn enqueue(
        &mut self,
        prepared: &Prepared,
        shape: Shape,
        buffers: &CallBuffers,
    ) -> Result<()> {
        let stream = self.target_stream();
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
            workspace: acquired.map_or(WorkspaceAddresses::NONE, |a| a.addresses),
            patience_ns: self.patience_ns,
            programmatic_overlap: self.modules.build.hopper_features(),
        };
        let mut enqueued = Ok(());
        for (launch, &function) in prepared.launches.iter().zip(&prepared.functions) {
            // SAFETY: forwarded from this function's contract; the workspace was acquired for
            // the plan's needs on this stream (a plan with none gets null addresses, which its
            // launches never use), and `function` is the handle of the launch's entry, loaded
            // in this instance's context (current since the call's `enter`), which owns the
            // stream.
            enqueued = unsafe { launch::enqueue(function, launch, &bindings, stream) };
            if enqueued.is_err() {
                break;
            }
        }
        // Recorded even after a failed launch: whatever was enqueued stays ordered.
        let released = acquired.map_or(Ok(()), |a| self.workspaces.release(a, stream));
        enqueued.and(released)
    }

    /// Refuses any address that is not device memory of this instance's device.
    ///
    /// On a machine with one device every device buffer is this device's, and the check (a
    /// driver query per buffer, a sizeable part of a call's host time) is skipped.
    fn check_on_device(&self, buffers: &[(&'static str, u64)]) -> Result<()> {
        if !self.several_devices {
            return Ok(());
        }
        for &(what, address) in buffers {
            let ordinal = device::pointer_device(address)
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

    /// Threads per block for the autotuned block-per-row variant: the seed's candidates timed
    /// on this shape with the caller's buffers, the fastest kept for later calls.
    fn tune_block_threads(&mut self, shape: Shape, input: u64, output: u64) -> Result<u32> {
        if let Some(&threads) = self.autotuned.get(&shape) {
            return Ok(threads);
        }
        self.refuse_while_capturing("tuning the block size")?;
        let timed = BLOCK_SMEM_AUTOTUNE_CANDIDATES.map(|threads_per_block| {
            let variant = Variant::BlockPerRowSmem { threads_per_block };
            (variant, threads_per_block)
        });
        // Timing waits for its own results anyway: it runs on this instance's stream (where
        // its events are), after everything the caller's stream holds.
        let caller = self.caller_stream.take();
        let waited = caller.map_or(Ok(()), |stream| {
            // SAFETY: the caller's stream, valid for the call.
            device::check(
                unsafe { sys::cuStreamSynchronize(stream) },
                "waiting for the stream",
            )
        });
        let threads = waited.and_then(|()| self.fastest(&timed, shape, input, output));
        self.caller_stream = caller;
        let threads = threads?;
        self.autotuned.insert(shape, threads);
        Ok(threads)
    }

    /// Times the production variants that can run `shape` on these buffers (overwriting the
    /// output), and makes the fastest what `Variant::Auto` runs for this device and rounded
    /// shape from now on, saving it to the tune cache file when there is one. `Auto` never
    /// tunes by itself: call this (or `host tune --shapes …`) ahead of the calls that matter.
    pub fn tune(
        &mut self,
        input: &DeviceSlice<f32>,
        output: &mut DeviceSlice<f32>,
        shape: Shape,
    ) -> Result<Variant> {
        let _context = self.enter()?;
        shape.check_lengths(input.len(), output.len())?;
        if shape.is_empty() {
            return Ok(Variant::Auto);
        }
        let (input, output) = (address(input), address(&*output));
        let bytes = shape.len() as u64 * 4;
        self.check_on_device(&[("input", input), ("output", output)])?;
        check_disjoint("output", (output, bytes), "input", (input, bytes))?;
        let layout = plan::pair_layout(input, output, shape.cols());
        let candidates: Vec<(Variant, Variant)> = Variant::PRODUCTION
            .into_iter()
            .filter(|&v| self.prepared(Request::Variant(v), shape, layout).is_ok())
            .map(|v| (v, v))
            .collect();
        let best = self.fastest(&candidates, shape, input, output)?;
        self.tune_cache.insert(self.tune_key(shape, layout), best);
        self.tune_cache.save()?;
        Ok(best)
    }

    /// Uses `path` as the tune cache that `Variant::Auto` reads and [`Softmax::tune`] writes
    /// (`None`: in memory only, nothing read). Without this, the file named by
    /// [`TUNE_CACHE_ENV`] if set and not empty, else none. A path a save could not write is
    /// [`Error::Io`] here.
    pub fn with_tune_cache(mut self, path: Option<std::path::PathBuf>) -> Result<Self> {
        self.tune_cache = TuneCache::open(path)?;
        Ok(self)
    }

    /// The fastest of `candidates` (each a variant and what to answer for it) on this shape
    /// and these buffers: each warmed up, then the best of five timed launches.
    fn fastest<T: Copy>(
        &mut self,
        candidates: &[(Variant, T)],
        shape: Shape,
        input: u64,
        output: u64,
    ) -> Result<T> {
        let layout = plan::pair_layout(input, output, shape.cols());
        let start = Event::new(EventFlags::DEFAULT).during("creating an event")?;
        let stop = Event::new(EventFlags::DEFAULT).during("creating an event")?;
        let mut best = None;
        let buffers = CallBuffers {
            input,
            output,
            ..CallBuffers::default()
        };
        for &(candidate, answer) in candidates {
            let prepared = self.prepared(Request::Variant(candidate), shape, layout)?;
            for round in 0..6 {
                start.record(&self.stream).during("recording an event")?;
                // SAFETY: as in `run`: the callers checked both buffers against the shape.
                unsafe { self.enqueue(&prepared, shape, &buffers)? };
                stop.record(&self.stream).during("recording an event")?;
                stop.synchronize().during("timing a tuning candidate")?;
                let elapsed = stop.elapsed_time_f32(&start).during("reading an event")?;
                // Round 0 is the warm-up.
                if round > 0 && best.is_none_or(|(time, _)| elapsed < time) {
                    best = Some((elapsed, answer));
                }
            }
        }
        best.map(|(_, answer)| answer).ok_or(Error::Unsupported {
            variant: "tune".into(),
            rows: shape.rows(),
            cols: shape.cols(),
            why: "no candidate can run this shape".into(),
        })
    }
}

/// The caller's stream set for one call ([`Softmax::with_stream`]): the stream the instance
/// had before is put back when this drops, also while unwinding.
struct StreamScope<'a> {
    softmax: &'a mut Softmax,
    outer: Option<sys::CUstream>,
}

impl Drop for StreamScope<'_> {
    fn drop(&mut self) {
        self.softmax.caller_stream = self.outer;
    }
}

/// A [`Softmax`] whose calls are issued on a stream the caller owns ([`Softmax::on`]). Each
/// method is the instance's method of the same name.
#[derive(Debug)]
pub struct OnStream<'a> {
    softmax: &'a mut Softmax,
    stream: sys::CUstream,
    borrowed: std::marker::PhantomData<&'a Stream>,
}

impl OnStream<'_> {
    /// [`Softmax::run`] on the caller's stream.
    pub fn run(
        &mut self,
        variant: Variant,
        input: &DeviceSlice<f32>,
        output: &mut DeviceSlice<f32>,
        shape: Shape,
    ) -> Result<()> {
        let stream = self.stream;
        self.softmax
            .with_stream(stream, |s| s.run(variant, input, output, shape))
    }

    /// [`Softmax::forward`] on the caller's stream.
    pub fn forward<I: Element, O: Element>(
        &mut self,
        op: Operation,
        input: Rows<'_, I>,
        output: RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Result<()> {
        let stream = self.stream;
        self.softmax
            .with_stream(stream, |s| s.forward(op, input, output, options))
    }

    /// [`Softmax::forward_in_place`] on the caller's stream.
    pub fn forward_in_place<T: Element>(
        &mut self,
        op: Operation,
        data: RowsMut<'_, T>,
        options: &Options<'_>,
    ) -> Result<()> {
        let stream = self.stream;
        self.softmax
            .with_stream(stream, |s| s.forward_in_place(op, data, options))
    }

    /// [`Softmax::log_sum_exp`] on the caller's stream.
    pub fn log_sum_exp<I: Element>(
        &mut self,
        input: Rows<'_, I>,
        lse: &mut DeviceSlice<f32>,
        options: &Options<'_>,
    ) -> Result<()> {
        let stream = self.stream;
        self.softmax
            .with_stream(stream, |s| s.log_sum_exp(input, lse, options))
    }

    /// [`Softmax::backward`] on the caller's stream.
    pub fn backward<T: Element, O: Element>(
        &mut self,
        op: Operation,
        y: Rows<'_, T>,
        dy: Rows<'_, T>,
        dx: RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Result<()> {
        let stream = self.stream;
        self.softmax
            .with_stream(stream, |s| s.backward(op, y, dy, dx, options))
    }

    /// [`Softmax::backward_in_place`] on the caller's stream.
    pub fn backward_in_place<T: Element>(
        &mut self,
        op: Operation,
        y: Rows<'_, T>,
        dy: RowsMut<'_, T>,
        options: &Options<'_>,
    ) -> Result<()> {
        let stream = self.stream;
        self.softmax
            .with_stream(stream, |s| s.backward_in_place(op, y, dy, options))
    }

    /// [`Softmax::row_states`] on the caller's stream.
    pub fn row_states<I: Element>(
        &mut self,
        input: Rows<'_, I>,
        states: &mut DeviceSlice<RowState>,
        options: &Options<'_>,
    ) -> Result<()> {
        let stream = self.stream;
        self.softmax
            .with_stream(stream, |s| s.row_states(input, states, options))
    }

    /// [`Softmax::normalize_with_states`] on the caller's stream.
    pub fn normalize_with_states<I: Element, O: Element>(
        &mut self,
        op: Operation,
        input: Rows<'_, I>,
        states: &DeviceSlice<RowState>,
        output: RowsMut<'_, O>,
        options: &Options<'_>,
    ) -> Result<()> {
        let stream = self.stream;
        self.softmax.with_stream(stream, |s| {
            s.normalize_with_states(op, input, states, output, options)
        })
    }
}

/// The device address of a slice.
fn address<T: cust::memory::DeviceCopy>(slice: &DeviceSlice<T>) -> u64 {
    slice.as_device_ptr().as_raw()
}

/// Refuses an output whose bytes `[start, start + len)` meet those of an input.
fn check_disjoint(
    output_name: &'static str,
    (output, output_len): (u64, u64),
    input_name: &'static str,
    (input, input_len): (u64, u64),
) -> Result<()> {
    let meet =
        output < input.saturating_add(input_len) && input < output.saturating_add(output_len);
    if meet && output_len > 0 && input_len > 0 {
        return Err(Error::Overlap {
            output: output_name,
            input: input_name,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_that_meet_are_refused() {
        assert!(check_disjoint("output", (0, 16), "input", (16, 16)).is_ok());
        assert!(check_disjoint("output", (16, 16), "input", (0, 16)).is_ok());
        assert!(check_disjoint("output", (8, 16), "input", (0, 16)).is_err());
        assert!(check_disjoint("output", (0, 64), "input", (16, 4)).is_err());
        assert!(check_disjoint("output", (0, 16), "input", (0, 16)).is_err());
        assert!(check_disjoint("output", (0, 0), "input", (0, 16)).is_ok());
    }

    #[test]
    fn tuned_choices_of_a_forced_build_are_kept_apart() {
        let mut h200 = crate::device::fixtures::h200();
        assert_eq!(tuned_device_name(&h200, KernelBuild::Sm90), "nvidia-h200");
        assert_eq!(
            tuned_device_name(&h200, KernelBuild::Sm80),
            "nvidia-h200-sm_80"
        );
        h200.name = "NVIDIA A100-SXM4-80GB".into();
        h200.compute_capability = (8, 0);
        assert_eq!(
            tuned_device_name(&h200, KernelBuild::Sm80),
            "nvidia-a100-sxm4-80gb"
        );
    }

    #[test]
    fn the_plan_cache_hasher_tells_keys_apart() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hasher = BuildHasherDefault::<KeyHasher>::default();
        let shapes = [
            (1, 32000),
            (32000, 1),
            (2, 16000),
            (4096, 1000),
            (1000, 4096),
        ];
        let hashes: HashSet<u64> = shapes
            .iter()
            .flat_map(|&(rows, cols)| {
                let shape = Shape::new(rows, cols).unwrap();
                [Layout::Aligned, Layout::Peeled, Layout::Elements]
                    .map(|layout| hasher.hash_one((Request::Variant(Variant::Auto), shape, layout)))
            })
            .collect();
        assert_eq!(hashes.len(), shapes.len() * 3);
    }
}
