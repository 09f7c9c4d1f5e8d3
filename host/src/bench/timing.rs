//! Buffers, correctness check and event timing for one shape, in both timing modes.
//!
//! Back-to-back: when the tensor is small next to the L2 cache, launches rotate over several
//! input/output pairs so that every measurement reads device memory, not the cache.
//! Isolated: a memset of a buffer twice the L2 evicts everything before each launch, which
//! then runs alone between two events; the floor kernel ([`FLOOR_PTX`]) is timed the same way.
//! `bench/peers.py` times the peers the same way in both modes.

use std::time::{Duration, Instant};

use cust::event::{Event, EventFlags};
use cust::memory::{AsyncCopyDestination, CopyDestination, DeviceBuffer, DeviceSlice};
use cust::module::Module;
use cust::stream::Stream;
use cust::sys;
use rand::Rng;
use rand::rngs::SmallRng;

use super::{BenchConfig, Outcome, Timing, random_values};
use crate::Softmax;
use crate::error::{CudaContext, Error, Result};
use crate::reference::{deviation, softmax_f64};
use crate::shape::Shape;
use crate::variant::Variant;

/// Input and output pairs for a shape: at least this many times the L2 between them.
pub(super) const WORKING_SET_OVER_L2: usize = 4;
/// Floats between the starts of consecutive pairs' tensors (keeps every start 256-byte aligned).
const SLOT_ALIGN_FLOATS: usize = 64;
/// Rows compared with the reference per verification.
const VERIFIED_ROWS: usize = 8;

/// The rows a verification compares: the first, the last and random others.
pub(super) fn verified_rows(shape: Shape, rng: &mut SmallRng) -> Vec<usize> {
    let mut rows: Vec<usize> = vec![0, shape.rows() - 1];
    rows.extend((0..VERIFIED_ROWS - 2).map(|_| rng.random_range(0..shape.rows())));
    rows
}

/// A contender's launch result: refusing the shape makes it "n/a", any other error fails it.
pub(super) fn launched(result: Result<()>) -> std::result::Result<(), Outcome> {
    match result {
        Err(Error::Unsupported { why, .. }) => Err(Outcome::Unsupported(why)),
        Err(error) => Err(Outcome::Failed(error.to_string())),
        Ok(()) => Ok(()),
    }
}
/// The tolerance of the GPU tests: relative L2 error and row-sum error.
const TOLERANCE: f64 = 1e-5;
/// Each back-to-back sample runs consecutive launches for about this long.
const SAMPLE_MS: f64 = 0.5;
/// Time one measurement may take before it is cut to fewer samples.
const MEASUREMENT_BUDGET_MS: f64 = 1500.0;
/// Warm-up time per shape (shared by its contenders), and a bound on launches per contender.
const WARMUP_MS: f64 = 30.0;
const MAX_WARMUP_LAUNCHES: usize = 5000;
/// Launches slower than this skip the warm-up (a thread-per-row kernel on a 1M-wide row).
const SLOW_LAUNCH_MS: f64 = 20.0;
/// At least this many samples, however slow the launch.
const MIN_SAMPLES: usize = 3;

pub(super) struct Pools {
    shape: Shape,
    input: DeviceBuffer<f32>,
    output: DeviceBuffer<f32>,
    host_slot0: Vec<f32>,
    slots: usize,
    stride: usize,
}

impl Pools {
    pub fn new(shape: Shape, l2_bytes: usize, rng: &mut SmallRng) -> Result<Self> {
        let stride = shape.len().next_multiple_of(SLOT_ALIGN_FLOATS);
        let pair_bytes = 2 * stride * 4;
        let slots = (WORKING_SET_OVER_L2 * l2_bytes).div_ceil(pair_bytes).max(1);
        let values = random_values(rng, stride * slots);
        let input = DeviceBuffer::from_slice(&values).during("allocating benchmark inputs")?;
        // SAFETY: f32 accepts any bits; every output slot is written before it is read.
        let output = unsafe { DeviceBuffer::uninitialized(stride * slots) }
            .during("allocating benchmark outputs")?;
        let host_slot0 = values[..shape.len()].to_vec();
        Ok(Pools {
            shape,
            input,
            output,
            host_slot0,
            slots,
            stride,
        })
    }

    fn slot(&mut self, index: usize) -> (DeviceSlice<f32>, DeviceSlice<f32>) {
        let start = (index % self.slots) * self.stride;
        let range = start..start + self.shape.len();
        (self.input.index(range.clone()), self.output.index(range))
    }

    /// Runs `variant` once on a poisoned output and compares sampled rows with the reference.
    pub fn verify(
        &mut self,
        softmax: &mut Softmax,
        variant: Variant,
        rng: &mut SmallRng,
    ) -> std::result::Result<(), Outcome> {
        let shape = self.shape;
        let (input, mut output) = self.slot(0);
        let failed = |e: Error| Outcome::Failed(e.to_string());
        output
            .set_32(f32::NAN.to_bits())
            .during("poisoning the output")
            .map_err(failed)?;
        launched(softmax.run(variant, &input, &mut output, shape))?;
        softmax.synchronize().map_err(failed)?;
        for row in verified_rows(shape, rng) {
            let range = row * shape.cols()..(row + 1) * shape.cols();
            let mut actual = vec![0.0f32; shape.cols()];
            output
                .index(range.clone())
                .copy_to(&mut actual[..])
                .during("reading a result row")
                .map_err(failed)?;
            let expected = softmax_f64(&self.host_slot0[range], 1, shape.cols());
            let deviation = deviation(&actual, &expected, shape.cols());
            if !deviation.within(TOLERANCE) {
                return Err(Outcome::Failed(format!("row {row}: {deviation:?}")));
            }
        }
        Ok(())
    }
}

impl Launcher for Pools {
    type Contender = Contender;

    fn launch(&mut self, softmax: &mut Softmax, contender: Contender, slot: usize) -> Result<()> {
        let shape = self.shape;
        let (input, mut output) = self.slot(slot);
        match contender {
            // SAFETY: both slices are live device memory of equal length, in disjoint pools.
            Contender::Copy => unsafe { output.async_copy_from(&input, softmax.stream()) }
                .during("copying device to device"),
            Contender::Variant(variant) => softmax.run(variant, &input, &mut output, shape),
        }
    }
}

/// What a measurement launches: the roofline copy or a softmax variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Contender {
    Copy,
    Variant(Variant),
}

/// Buffers that the timing loop launches contenders on, rotating over their slots.
pub(super) trait Launcher {
    type Contender: Copy;

    /// Enqueues one launch of `contender` on slot `slot` (taken modulo the slots there are).
    fn launch(
        &mut self,
        softmax: &mut Softmax,
        contender: Self::Contender,
        slot: usize,
    ) -> Result<()>;
}

/// The floor kernel's entry: the name the report gives as the floor's kernel.
pub(super) const FLOOR_ENTRY: &str = "floor_load_store";

/// `floor_load_store(source, target)`: one thread loads the 32-bit word at `source` (past
/// L1, from L2 or device memory) and stores it at `target`. Launched on one thread after an
/// L2 flush, it costs what any launch costs at least: the launch itself and one round trip
/// to device memory. PTX ISA 7.0 for sm_80, the oldest target the library runs on.
pub(super) const FLOOR_PTX: &str = ".version 7.0
.target sm_80
.address_size 64

.visible .entry floor_load_store(
\t.param .u64 floor_load_store_source,
\t.param .u64 floor_load_store_target
)
{
\t.reg .b32 \t%r<2>;
\t.reg .b64 \t%rd<5>;

\tld.param.u64 \t%rd1, [floor_load_store_source];
\tld.param.u64 \t%rd2, [floor_load_store_target];
\tcvta.to.global.u64 \t%rd3, %rd1;
\tcvta.to.global.u64 \t%rd4, %rd2;
\tld.global.cg.u32 \t%r1, [%rd3];
\tst.global.u32 \t[%rd4], %r1;
\tret;
}
";

/// The flush buffer holds this many times the L2 ...
const FLUSH_OVER_L2: usize = 2;
/// ... and at least this many bytes (for a device that reports a tiny or no L2).
const FLUSH_MIN_BYTES: usize = 16 << 20;
/// Bytes between the floor kernel's source and target words (separate cache lines).
const FLOOR_WORD_GAP_BYTES: usize = 256;

/// What isolated timing needs for a whole run: the buffer whose memset evicts the L2 before
/// each launch, and the floor kernel with the words it reads and writes.
pub(super) struct Isolation {
    flush: DeviceBuffer<u32>,
    /// The floor kernel, looked up once: cust's `launch!` would look it up by name at every
    /// launch, between the start event and the launch it times.
    floor_function: sys::CUfunction,
    /// Keeps `floor_function` valid; dropped after it.
    _floor_module: Module,
    /// The floor's source word at index 0 and its target word [`FLOOR_WORD_GAP_BYTES`] on.
    floor_words: DeviceBuffer<u32>,
}

impl Isolation {
    /// Allocates a flush buffer of [`FLUSH_OVER_L2`] times `l2_bytes` and loads the floor
    /// kernel, in the current context.
    pub fn new(l2_bytes: usize) -> Result<Self> {
        let flush_words = (FLUSH_OVER_L2 * l2_bytes).max(FLUSH_MIN_BYTES) / 4;
        // SAFETY: u32 accepts any bits; the buffer is only ever written (by the flush).
        let flush = unsafe { DeviceBuffer::uninitialized(flush_words) }
            .during("allocating the L2 flush buffer")?;
        let floor_words = DeviceBuffer::from_slice(&[0u32; 2 * FLOOR_WORD_GAP_BYTES / 4])
            .during("allocating the floor kernel's words")?;
        let floor_module =
            Module::from_ptx(FLOOR_PTX, &[]).during("loading the floor kernel's PTX")?;
        let floor_function = floor_module
            .get_function(FLOOR_ENTRY)
            .during("looking up the floor kernel")?
            .to_raw();
        Ok(Isolation {
            flush,
            floor_function,
            _floor_module: floor_module,
            floor_words,
        })
    }

    /// Enqueues the memset that evicts the L2: it writes twice the cache's size, so what the
    /// cache held before (inputs, outputs, the floor's words) is gone from it afterwards.
    fn flush_l2(&mut self, stream: &Stream) -> Result<()> {
        // SAFETY: a live buffer of u32, so 4-byte aligned and a whole number of words; nothing
        // reads it.
        unsafe { self.flush.set_32_async(0, stream) }.during("flushing the L2")
    }

    /// Enqueues the floor kernel on one thread.
    fn launch_floor(&self, stream: &Stream) -> Result<()> {
        let source = self.floor_words.as_device_ptr();
        let target = self
            .floor_words
            .index(FLOOR_WORD_GAP_BYTES / 4..)
            .as_device_ptr();
        let mut params = [source, target].map(|p| p.as_raw());
        let mut pointers = params
            .each_mut()
            .map(|p| (p as *mut u64).cast::<std::ffi::c_void>());
        // SAFETY: the function lives as long as its module, which `self` holds; it takes two
        // pointers, reads the word at `source` and writes the word at `target`, two distinct
        // words of a live buffer; the argument array outlives the call, which copies it.
        let status = unsafe {
            sys::cuLaunchKernel(
                self.floor_function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream.as_inner(),
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        match status {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            status => Err(crate::Error::CudaStatus {
                during: "launching the floor kernel",
                code: status as u32,
                name: format!("{status:?}"),
            }),
        }
    }
}

/// The medians of one timing mode: one per contender, in order, and the floor's (isolated
/// timing only).
pub(super) struct Medians {
    pub contenders: Vec<f64>,
    pub floor: Option<f64>,
}

/// Times contenders in either mode; holds what isolated timing needs, set up on its first use
/// and kept for the rest of the run.
#[derive(Default)]
pub(super) struct Timer {
    isolation: Option<Isolation>,
}

impl Timer {
    /// Median milliseconds per launch of each contender in `timing` (see [`time_isolated`]
    /// and [`time_back_to_back`]); isolated timing also times the floor.
    pub fn measure<L: Launcher>(
        &mut self,
        timing: Timing,
        pools: &mut L,
        softmax: &mut Softmax,
        contenders: &[L::Contender],
        config: &BenchConfig,
    ) -> Result<Medians> {
        match timing {
            Timing::BackToBack => Ok(Medians {
                contenders: time_back_to_back(pools, softmax, contenders, config)?,
                floor: None,
            }),
            Timing::Isolated => {
                let isolation = match &mut self.isolation {
                    Some(isolation) => isolation,
                    empty => empty.insert(Isolation::new(softmax.device().l2_bytes as usize)?),
                };
                let mut medians = time_isolated(pools, softmax, contenders, isolation, config)?;
                let floor = medians.pop();
                Ok(Medians {
                    contenders: medians,
                    floor,
                })
            }
        }
    }
}

/// What an isolated sample launches: a contender on the pools, or the floor kernel.
#[derive(Clone, Copy)]
enum Alone<C> {
    Contender(C),
    Floor,
}

/// Median milliseconds of one launch of each contender, then of the floor kernel (last),
/// each launched alone on a flushed L2: a sample enqueues the flush, an event, the one launch
/// and another event, and is the time between the events. Each is warmed up the same way
/// (at least `warmup` samples and a share of [`WARMUP_MS`], unless a launch takes
/// [`SLOW_LAUNCH_MS`]), then all are timed in interleaved rounds, `iters` samples each (fewer
/// for slow launches, at least [`MIN_SAMPLES`]), a round enqueued before it is waited for.
fn time_isolated<L: Launcher>(
    pools: &mut L,
    softmax: &mut Softmax,
    contenders: &[L::Contender],
    isolation: &mut Isolation,
    config: &BenchConfig,
) -> Result<Vec<f64>> {
    let launches: Vec<Alone<L::Contender>> = contenders
        .iter()
        .map(|&c| Alone::Contender(c))
        .chain(std::iter::once(Alone::Floor))
        .collect();
    let new_event = || Event::new(EventFlags::DEFAULT).during("creating an event");
    let mut events = Vec::with_capacity(launches.len());
    for _ in &launches {
        events.push((new_event()?, new_event()?));
    }
    let mut next = 0;
    // Enqueues one sample of launch `i`: flush, start event, the launch, stop event.
    let mut enqueue = |pools: &mut L, softmax: &mut Softmax, i: usize| -> Result<()> {
        isolation.flush_l2(softmax.stream())?;
        let (start, stop) = &events[i];
        start
            .record(softmax.stream())
            .during("recording an event")?;
        match launches[i] {
            Alone::Contender(contender) => pools.launch(softmax, contender, next)?,
            Alone::Floor => isolation.launch_floor(softmax.stream())?,
        }
        next += 1;
        stop.record(softmax.stream()).during("recording an event")
    };
    let elapsed = |i: usize| -> Result<f64> {
        let (start, stop) = &events[i];
        stop.synchronize().during("waiting for a timed launch")?;
        Ok(f64::from(
            stop.elapsed_time_f32(start).during("reading events")?,
        ))
    };
    let warmup_share = Duration::from_secs_f64(WARMUP_MS * 1e-3 / launches.len() as f64);
    let mut samples = Vec::with_capacity(launches.len());
    for i in 0..launches.len() {
        enqueue(pools, softmax, i)?;
        let mut estimate = elapsed(i)?;
        if estimate < SLOW_LAUNCH_MS {
            let started = Instant::now();
            let mut count = 0;
            while count < MAX_WARMUP_LAUNCHES
                && (count < config.warmup || started.elapsed() < warmup_share)
            {
                enqueue(pools, softmax, i)?;
                estimate = elapsed(i)?;
                count += 1;
            }
        }
        let affordable = (MEASUREMENT_BUDGET_MS / estimate.max(1e-4)) as usize;
        samples.push(config.iters.min(affordable).max(MIN_SAMPLES));
    }
    let rounds = samples.iter().copied().max().unwrap_or(0);
    let mut times = vec![Vec::new(); launches.len()];
    for round in 0..rounds {
        let taking: Vec<usize> = (0..launches.len())
            .filter(|&i| round < samples[i])
            .collect();
        // Each launch has its own events, so a whole round is enqueued before it is read.
        for &i in &taking {
            enqueue(pools, softmax, i)?;
        }
        for &i in &taking {
            times[i].push(elapsed(i)?);
        }
    }
    Ok(times.into_iter().map(median).collect())
}

/// The median of samples (the upper one of an even count); NaN for none.
pub(super) fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Median milliseconds per launch of each contender. All are warmed up, then timed in
/// rounds, one sample of each per round, so that clock and cache conditions are shared
/// instead of favouring whoever runs last. A sample is the mean of back-to-back launches
/// (about [`SAMPLE_MS`]); slow contenders take fewer samples (at least [`MIN_SAMPLES`]).
fn time_back_to_back<L: Launcher>(
    pools: &mut L,
    softmax: &mut Softmax,
    contenders: &[L::Contender],
    config: &BenchConfig,
) -> Result<Vec<f64>> {
    let new_event = || Event::new(EventFlags::DEFAULT).during("creating an event");
    let (start, stop) = (new_event()?, new_event()?);
    let mut next = 0;
    let mut timed = |pools: &mut L,
                     softmax: &mut Softmax,
                     contender: L::Contender,
                     launches: usize|
     -> Result<f64> {
        start
            .record(softmax.stream())
            .during("recording an event")?;
        for _ in 0..launches {
            pools.launch(softmax, contender, next)?;
            next += 1;
        }
        stop.record(softmax.stream()).during("recording an event")?;
        stop.synchronize().during("waiting for timed launches")?;
        Ok(f64::from(stop.elapsed_time_f32(&start).during("reading events")?) / launches as f64)
    };
    let mut plans = Vec::with_capacity(contenders.len());
    for &contender in contenders {
        // The first launch tells whether warming up is affordable: at least `warmup`
        // launches and a share of WARMUP_MS of back-to-back work (idle clocks ramp up).
        let first = timed(pools, softmax, contender, 1)?;
        let estimate = if first < SLOW_LAUNCH_MS {
            let share = WARMUP_MS / contenders.len() as f64;
            let launches = config
                .warmup
                .max((share / first.max(1e-3)).ceil() as usize)
                .min(MAX_WARMUP_LAUNCHES);
            timed(pools, softmax, contender, launches)?;
            timed(pools, softmax, contender, 1)?.max(1e-4)
        } else {
            first
        };
        let per_sample = (SAMPLE_MS / estimate).ceil().clamp(1.0, 1000.0) as usize;
        let affordable = (MEASUREMENT_BUDGET_MS / (estimate * per_sample as f64)) as usize;
        plans.push((per_sample, config.iters.min(affordable).max(MIN_SAMPLES)));
    }
    let rounds = plans.iter().map(|&(_, samples)| samples).max().unwrap_or(0);
    let mut times = vec![Vec::new(); contenders.len()];
    for round in 0..rounds {
        for (i, &contender) in contenders.iter().enumerate() {
            let (per_sample, samples) = plans[i];
            if round < samples {
                times[i].push(timed(pools, softmax, contender, per_sample)?);
            }
        }
    }
    Ok(times.into_iter().map(median).collect())
}
