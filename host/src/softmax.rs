//! The public entry point: a device, its loaded kernels, a stream and preallocated workspace.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use bytemuck::Zeroable;
use cust::context::{Context, CurrentContext};
use cust::event::{Event, EventFlags};
use cust::memory::{CopyDestination, DeviceBuffer, DeviceCopy, DeviceSlice};
use cust::stream::{Stream, StreamFlags};
use kernels_gpu::launch::softmax::BLOCK_SMEM_AUTOTUNE_CANDIDATES;

use crate::autotune::{self, TuneCache, TuneKey};
use crate::device::{self, DeviceInfo};
use crate::error::{CudaContext, Result};
use crate::kernels::Kernels;
use crate::plan::{self, Arg, DeviceLimits, Launch, Layout};
use crate::shape::Shape;
use crate::variant::Variant;
use kernels_gpu::launch::ops::{DType, Direction, PackLayout, RowState};

#[path = "operations.rs"]
mod operations;

/// Plans kept per cache before it starts over: a process that sees ever new shapes keeps a
/// bounded amount of memory, and one that reuses a few shapes never replans them.
const PLAN_CACHE_LIMIT: usize = 4096;

/// Most blocks of one kernel a multiprocessor can hold (Hopper: 32): the initial workspace
/// covers any sliced launch that keeps its blocks resident, as the plans do (two barrier words
/// per row and row-slices' one flag per block, at most three words per block; the launches
/// grow the workspace if a device ever holds more).
const MAX_RESIDENT_BLOCKS_PER_SM: usize = 32;

/// How long a row-slices block waits for the rest of its row before it leaves its slice to
/// the row's last block. A row's blocks all start within microseconds when nothing else runs
/// (the plan keeps them resident), so only blocks kept from starting (by other streams'
/// kernels holding their places) make a waiter leave; the leaver frees its place for them.
const ROW_BARRIER_PATIENCE: Duration = Duration::from_micros(200);

/// Row-wise softmax on one CUDA device.
///
/// Owns a stream: [`Softmax::run`] only enqueues work on it, so results (and errors raised
/// while kernels run) appear after [`Softmax::synchronize`]. Owns the workspace some
/// variants need, so it takes `&mut self`: one `Softmax` serves one stream of work at a time.
/// It is `Send`; threads that work concurrently each create their own (they share the
/// device's primary context).
#[derive(Debug)]
pub struct Softmax {
    kernels: Kernels,
    workspace: Workspace,
    autotuned: HashMap<Shape, u32>,
    plans: HashMap<(Variant, Shape, Layout), Arc<[Launch]>>,
    /// The operation modules, by input type, loaded on first use.
    op_kernels: [Option<Kernels>; 3],
    op_plans: HashMap<OpPlanKey, Option<operations::PlannedOp>>,
    /// Where 16-bit softmax runs row-slices (`operations::Softmax::row_slices_plan`).
    row_slice_plans: HashMap<RowSlicePlanKey, Option<Arc<Launch>>>,
    tune_cache: TuneCache,
    /// [`ROW_BARRIER_PATIENCE`], unless a test changed it.
    row_barrier_patience_ns: u64,
    stream: Stream,
    info: DeviceInfo,
    /// Dropped last: everything above lives in this context.
    context: Context,
}

// SAFETY: the raw function handles inside `Kernels` are driver objects that any thread may
// use once the owning context is current, and every method that touches the device makes
// `context` current first. Nothing is shared between instances except the driver's primary
// context, which the driver synchronizes itself.
unsafe impl Send for Softmax {}

/// Direction, input type, rows, cols and how 16-byte packs fit.
type OpPlanKey = (Direction, DType, u32, u32, PackLayout);

/// Element type, shape, how the operation kernels' packs fit, and whether input and output
/// are misaligned alike.
type RowSlicePlanKey = (DType, Shape, PackLayout, bool);

#[derive(Debug)]
struct Workspace {
    /// The unfused variant's row maxima then row sums (`2 · rows`, grown on demand).
    row_stats: DeviceBuffer<f32>,
    /// Two floats per block of a sliced launch (grown on demand).
    partials: DeviceBuffer<f32>,
    /// Two words per row of a sliced launch, then row-slices' flags of blocks that left (one
    /// per block), zeroed when allocated; a finished launch leaves them reusable.
    barriers: DeviceBuffer<u32>,
    /// Per-row, per-chunk states of operations on rows too wide for one launch.
    states: DeviceBuffer<RowState>,
}

/// The device's limits as the planner sees them.
struct Limits<'a> {
    info: &'a DeviceInfo,
    kernels: &'a Kernels,
}

impl DeviceLimits for Limits<'_> {
    fn multiprocessors(&self) -> u32 {
        self.info.multiprocessors
    }

    fn max_shared_per_block(&self) -> u32 {
        self.info.max_shared_per_block
    }

    fn blocks_per_sm(&self, kernel: &str, threads: u32, shared_bytes: u32) -> u32 {
        // A failed occupancy query rules the configuration out; the planner falls back.
        self.kernels
            .blocks_per_sm(kernel, threads, shared_bytes)
            .unwrap_or(0)
    }

    fn cooperative_launch(&self) -> bool {
        self.info.supports_cooperative_launch
    }

    fn thread_block_clusters(&self) -> bool {
        self.info.has_thread_block_clusters()
    }

    fn active_clusters(&self, kernel: &str, threads: u32, shared_bytes: u32, cluster: u32) -> u32 {
        // A failed query rules the configuration out, as for `blocks_per_sm`.
        self.kernels
            .active_clusters(kernel, threads, shared_bytes, cluster)
            .unwrap_or(0)
    }
}

impl Softmax {
    /// Opens the first CUDA device.
    pub fn new() -> Result<Self> {
        Self::on_device(0)
    }

    /// Opens CUDA device `ordinal`, loads the kernels and allocates the workspace.
    pub fn on_device(ordinal: u32) -> Result<Self> {
        let (context, _device, info) = device::open(ordinal)?;
        let kernels =
            Kernels::load_softmax(info.max_shared_per_block, info.has_thread_block_clusters())?;
        // A blocking stream: its work waits for what came before it on the legacy default
        // stream, where cust's synchronous calls run. A pageable host-to-device copy
        // (`DeviceBuffer::from_slice`, `copy_from`) may return before its DMA lands, and
        // `DeviceBuffer::zeroed` below only enqueues its memset; a non-blocking stream would
        // let a launch read inputs half copied, or a barrier word the memset then clears.
        let stream = Stream::new(StreamFlags::DEFAULT, None).during("creating a stream")?;
        let resident = info.multiprocessors as usize * MAX_RESIDENT_BLOCKS_PER_SM;
        let workspace = Workspace {
            row_stats: DeviceBuffer::zeroed(2).during("allocating workspace")?,
            partials: DeviceBuffer::zeroed(2 * resident).during("allocating workspace")?,
            barriers: DeviceBuffer::zeroed(3 * resident).during("allocating workspace")?,
            // SAFETY: any bit pattern is a valid pair of floats; states are stored before
            // they are read.
            states: unsafe { DeviceBuffer::uninitialized(1) }.during("allocating workspace")?,
        };
        Ok(Softmax {
            kernels,
            workspace,
            autotuned: HashMap::new(),
            plans: HashMap::new(),
            op_kernels: [None, None, None],
            op_plans: HashMap::new(),
            row_slice_plans: HashMap::new(),
            tune_cache: TuneCache::open(autotune::default_path()),
            row_barrier_patience_ns: ROW_BARRIER_PATIENCE.as_nanos() as u64,
            stream,
            info,
            context,
        })
    }

    /// The device this instance runs on.
    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// Testing hook: how long a block of a row cut into slices waits for the row's other
    /// blocks before it leaves its slice to the row's last block (default 200 µs). Zero
    /// makes nearly every block leave, which exercises that path; results stay exact, only
    /// slower.
    #[doc(hidden)]
    pub fn set_row_barrier_patience(&mut self, patience: Duration) {
        self.row_barrier_patience_ns = u64::try_from(patience.as_nanos()).unwrap_or(u64::MAX);
    }

    /// The stream every launch is enqueued on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Waits for everything enqueued so far; reports errors raised while kernels ran.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().during("waiting for the stream")
    }

    /// Enqueues the softmax of each row of `input` (row-major `shape`) into `output`.
    ///
    /// Checks everything before launching anything: buffer lengths against the shape, the
    /// variant's parameters, whether the variant can run the shape. Empty shapes succeed
    /// without a launch. Pointers need no particular alignment: 16-byte accesses are used
    /// only when both are 16-byte aligned and `cols` is a multiple of 4.
    pub fn run(
        &mut self,
        variant: Variant,
        input: &DeviceSlice<f32>,
        output: &mut DeviceSlice<f32>,
        shape: Shape,
    ) -> Result<()> {
        shape.check_lengths(input.len(), output.len())?;
        variant.validate()?;
        if shape.is_empty() {
            return Ok(());
        }
        self.run_addresses(
            variant,
            input.as_device_ptr().as_raw(),
            output.as_device_ptr().as_raw(),
            shape,
        )
    }

    /// [`Softmax::run`] after its checks, on device addresses.
    fn run_addresses(
        &mut self,
        variant: Variant,
        input_address: u64,
        output_address: u64,
        shape: Shape,
    ) -> Result<()> {
        CurrentContext::set_current(&self.context).during("making the context current")?;
        let layout = Layout::of(input_address, output_address, shape.cols());
        let variant = match variant {
            Variant::BlockPerRowAutotuned => {
                let threads_per_block =
                    self.tune_block_threads(shape, input_address, output_address)?;
                Variant::BlockPerRowSmem { threads_per_block }
            }
            Variant::Auto => self.tuned_auto(shape, layout),
            other => other,
        };
        let launches = self.planned(variant, shape, layout)?;
        if launches
            .iter()
            .any(|l| l.kernel.starts_with("softmax_unfused"))
        {
            self.reserve_row_stats(shape.rows())?;
        }
        self.reserve_partials(2 * plan::largest_grid_taking(&launches, Arg::Partials))?;
        self.reserve_barriers(plan::largest_grid_taking(&launches, Arg::Barriers))?;
        for launch in launches.iter() {
            // SAFETY: `shape.check_lengths` proved both buffers hold rows × cols floats; the
            // plan chose the grid, block and shared memory each kernel's contract asks for
            // this shape and layout (16-byte entries only for aligned layouts); the workspace
            // buffers are sized for any plan (`reserve_row_stats` for the unfused one).
            unsafe { self.enqueue(launch, input_address, output_address, shape)? };
        }
        Ok(())
    }

    /// Convenience over host memory: copies `input` to the device, runs, waits, copies back.
    pub fn run_host(&mut self, variant: Variant, input: &[f32], shape: Shape) -> Result<Vec<f32>> {
        shape.check_lengths(input.len(), shape.len())?;
        if shape.is_empty() {
            return Ok(Vec::new());
        }
        CurrentContext::set_current(&self.context).during("making the context current")?;
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
    pub fn kernels_for(&self, variant: Variant, shape: Shape) -> Result<Vec<String>> {
        let variant = match variant {
            Variant::BlockPerRowAutotuned => match self.autotuned.get(&shape) {
                Some(&threads_per_block) => Variant::BlockPerRowSmem { threads_per_block },
                None => {
                    return Ok(vec![
                        "softmax_block_per_row_smem (not tuned yet)".to_owned(),
                    ]);
                }
            },
            Variant::Auto => self.tuned_auto(shape, Layout::of(0, 0, shape.cols())),
            other => other,
        };
        let layout = Layout::of(0, 0, shape.cols());
        Ok(self
            .plan(variant, shape, layout)?
            .into_iter()
            .map(|l| l.kernel)
            .collect())
    }

    /// The plan for this variant, shape and layout, made once: planning queries the driver
    /// for occupancy, which costs more host time than a short kernel runs.
    fn planned(&mut self, variant: Variant, shape: Shape, layout: Layout) -> Result<Arc<[Launch]>> {
        if let Some(launches) = self.plans.get(&(variant, shape, layout)) {
            return Ok(Arc::clone(launches));
        }
        let launches: Arc<[Launch]> = self.plan(variant, shape, layout)?.into();
        if self.plans.len() >= PLAN_CACHE_LIMIT {
            self.plans.clear();
        }
        self.plans
            .insert((variant, shape, layout), Arc::clone(&launches));
        Ok(launches)
    }

    fn plan(&self, variant: Variant, shape: Shape, layout: Layout) -> Result<Vec<Launch>> {
        plan::plan(
            variant,
            shape,
            layout,
            &Limits {
                info: &self.info,
                kernels: &self.kernels,
            },
        )
    }

    /// Grows the partial-statistics workspace (split rows over many rows need more than the
    /// resident-block bound it starts with).
    fn reserve_partials(&mut self, floats: usize) -> Result<()> {
        grow_zeroed(&self.stream, &mut self.workspace.partials, floats)
    }

    /// Barrier words (zeroed: a word at rest) for sliced launches of `blocks` blocks: two
    /// per row and row-slices' flag per block, at most three per block.
    fn reserve_barriers(&mut self, blocks: usize) -> Result<()> {
        grow_zeroed(&self.stream, &mut self.workspace.barriers, 3 * blocks)
    }

    fn reserve_row_stats(&mut self, rows: usize) -> Result<()> {
        grow_zeroed(&self.stream, &mut self.workspace.row_stats, 2 * rows)
    }

    /// Threads per block for the autotuned block-per-row variant: the seed's candidates timed
    /// on this shape with the caller's buffers, the fastest kept for later calls.
    fn tune_block_threads(&mut self, shape: Shape, input: u64, output: u64) -> Result<u32> {
        if let Some(&threads) = self.autotuned.get(&shape) {
            return Ok(threads);
        }
        let candidates = BLOCK_SMEM_AUTOTUNE_CANDIDATES
            .map(|threads_per_block| Variant::BlockPerRowSmem { threads_per_block });
        let Variant::BlockPerRowSmem { threads_per_block } =
            self.fastest(&candidates, shape, input, output)?
        else {
            unreachable!("every candidate is a block-per-row variant")
        };
        self.autotuned.insert(shape, threads_per_block);
        Ok(threads_per_block)
    }

    /// What `Variant::Auto` runs for this shape and layout: a tuned choice when
    /// [`Softmax::tune`] recorded one for the device and rounded shape, else the heuristic.
    fn tuned_auto(&self, shape: Shape, layout: Layout) -> Variant {
        let key = TuneKey::new(&self.info.slug(), shape, layout.vector_peelable);
        self.tune_cache.get(&key).unwrap_or(Variant::Auto)
    }

    /// Times the production variants that can run `shape` on these buffers (overwriting the
    /// output), and makes the fastest what `Variant::Auto` runs for this device and rounded
    /// shape from now on, saving it to the tune cache file. `Auto` never tunes by itself:
    /// call this (or `host tune --shapes …`) ahead of the calls that matter.
    pub fn tune(
        &mut self,
        input: &DeviceSlice<f32>,
        output: &mut DeviceSlice<f32>,
        shape: Shape,
    ) -> Result<Variant> {
        shape.check_lengths(input.len(), output.len())?;
        if shape.is_empty() {
            return Ok(Variant::Auto);
        }
        CurrentContext::set_current(&self.context).during("making the context current")?;
        let (input, output) = (
            input.as_device_ptr().as_raw(),
            output.as_device_ptr().as_raw(),
        );
        let layout = Layout::of(input, output, shape.cols());
        let candidates: Vec<Variant> = [
            Variant::RowsInRegisters,
            Variant::BlockRegisters,
            Variant::RowSlices,
            Variant::SplitRows,
            Variant::RowCluster,
        ]
        .into_iter()
        .filter(|&variant| self.plan(variant, shape, layout).is_ok())
        .collect();
        let best = self.fastest(&candidates, shape, input, output)?;
        self.tune_cache.insert(
            TuneKey::new(&self.info.slug(), shape, layout.vector_peelable),
            best,
        );
        self.tune_cache.save()?;
        Ok(best)
    }

    /// Uses `path` (or nothing: in memory only) as the tune cache instead of the default
    /// (`$SOFTMAX_TUNE_CACHE`, else the user's cache directory).
    pub fn with_tune_cache(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.tune_cache = TuneCache::open(path);
        self
    }

    /// The fastest of `candidates` on this shape and these buffers: each warmed up, then the
    /// best of five timed launches.
    fn fastest(
        &mut self,
        candidates: &[Variant],
        shape: Shape,
        input: u64,
        output: u64,
    ) -> Result<Variant> {
        let layout = Layout::of(input, output, shape.cols());
        let (start, stop) = (
            Event::new(EventFlags::DEFAULT),
            Event::new(EventFlags::DEFAULT),
        );
        let (start, stop) = (
            start.during("creating an event")?,
            stop.during("creating an event")?,
        );
        let mut best = (f32::INFINITY, candidates[0]);
        for &candidate in candidates {
            let launches = self.planned(candidate, shape, layout)?;
            for round in 0..6 {
                start.record(&self.stream).during("recording an event")?;
                for launch in launches.iter() {
                    // SAFETY: as in `run`: the callers checked the shape against both buffers.
                    unsafe { self.enqueue(launch, input, output, shape)? };
                }
                stop.record(&self.stream).during("recording an event")?;
                stop.synchronize().during("timing a tuning candidate")?;
                let elapsed = stop.elapsed_time_f32(&start).during("reading an event")?;
                // Round 0 is the warm-up.
                if round > 0 && elapsed < best.0 {
                    best = (elapsed, candidate);
                }
            }
        }
        Ok(best.1)
    }

    /// Resolves the launch's arguments to values and enqueues it.
    ///
    /// # Safety
    /// `input` and `output` are device addresses of `shape.len()` floats each, and `launch`
    /// comes from `plan` for this shape and these addresses.
    unsafe fn enqueue(&self, launch: &Launch, input: u64, output: u64, shape: Shape) -> Result<()> {
        // SAFETY: forwarded; the plan's kernels are the softmax module's.
        unsafe { self.enqueue_in(&self.kernels, launch, input, output, shape) }
    }

    /// Resolves the launch's arguments to values and enqueues it on an entry of `kernels`.
    ///
    /// # Safety
    /// `launch` is a plan for an entry of `kernels` (from `plan`, or `row_slices_launch` for a
    /// 16-bit type) made for this shape and these addresses, and `input` and `output` are
    /// device addresses of `shape.len()` elements of that entry's type each.
    unsafe fn enqueue_in(
        &self,
        kernels: &Kernels,
        launch: &Launch,
        input: u64,
        output: u64,
        shape: Shape,
    ) -> Result<()> {
        let row_stats = self.workspace.row_stats.as_device_ptr().as_raw();
        let mut values: Vec<ParamValue> = launch
            .args
            .iter()
            .map(|arg| match *arg {
                Arg::Input => ParamValue::U64(input),
                Arg::Output => ParamValue::U64(output),
                Arg::RowMax => ParamValue::U64(row_stats),
                Arg::RowSum => ParamValue::U64(row_stats + 4 * shape.rows() as u64),
                Arg::Partials => ParamValue::U64(self.workspace.partials.as_device_ptr().as_raw()),
                Arg::Barriers => ParamValue::U64(self.workspace.barriers.as_device_ptr().as_raw()),
                Arg::Patience => ParamValue::U64(self.row_barrier_patience_ns),
                Arg::U32(v) => ParamValue::U32(v),
                Arg::U64(v) => ParamValue::U64(v),
            })
            .collect();
        let mut params: Vec<*mut c_void> = values.iter_mut().map(ParamValue::as_param).collect();
        // SAFETY: forwarded from this function's contract; `params` outlives the call.
        unsafe { kernels.launch(launch, &mut params, &self.stream) }
    }
}

/// Replaces `buffer` by a zeroed one of `len` elements when it is shorter, once the work
/// enqueued on `stream` (which may use it) has finished.
fn grow_zeroed<T: DeviceCopy + Zeroable>(
    stream: &Stream,
    buffer: &mut DeviceBuffer<T>,
    len: usize,
) -> Result<()> {
    if buffer.len() < len {
        stream.synchronize().during("waiting for the stream")?;
        *buffer = DeviceBuffer::zeroed(len).during("growing the workspace")?;
    }
    Ok(())
}

/// Storage for one kernel parameter; the driver reads it through a pointer.
enum ParamValue {
    U32(u32),
    U64(u64),
}

impl ParamValue {
    fn as_param(&mut self) -> *mut c_void {
        match self {
            ParamValue::U32(v) => (v as *mut u32).cast(),
            ParamValue::U64(v) => (v as *mut u64).cast(),
        }
    }
}
