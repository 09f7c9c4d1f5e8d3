//! Buffers, correctness check and event timing for one shape.
//!
//! When the tensor is small next to the L2 cache, launches rotate over several input/output
//! pairs so that every measurement reads device memory, not the cache; `bench/peers.py`
//! times the peers the same way.

use cust::event::{Event, EventFlags};
use cust::memory::{AsyncCopyDestination, CopyDestination, DeviceBuffer, DeviceSlice};
use rand::Rng;
use rand::rngs::SmallRng;

use super::{BenchConfig, Outcome, random_values};
use crate::error::{CudaContext, Error, Result};
use crate::reference::{deviation, softmax_f64};
use crate::shape::Shape;
use crate::softmax::Softmax;
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
/// Each timed sample runs back-to-back launches for about this long.
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

/// Median milliseconds per launch of each contender. All are warmed up, then timed in
/// rounds, one sample of each per round, so that clock and cache conditions are shared
/// instead of favouring whoever runs last. A sample is the mean of back-to-back launches
/// (about [`SAMPLE_MS`]); slow contenders take fewer samples (at least [`MIN_SAMPLES`]).
pub(super) fn time_interleaved<L: Launcher>(
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
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect())
}
