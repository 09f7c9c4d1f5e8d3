//! Tuning: which variant `Auto` runs where [`Softmax::tune`] timed the candidates (kept in a
//! tune cache file), and the block size the autotuned block-per-row variant chose.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use cust::event::{Event, EventFlags};
use cust::memory::DeviceSlice;
use kernels_gpu::launch::softmax::BLOCK_SMEM_AUTOTUNE_CANDIDATES;

use super::Softmax;
use super::views::address;
use crate::error::{CudaContext, Error, Result};
use crate::plan::{self, Layout, Request};
use crate::runtime::driver::{self, DeviceInfo};
use crate::runtime::modules::KernelBuild;
use crate::runtime::tune::{TuneCache, TuneKey, path_from_env};
use crate::runtime::{CallBuffers, Prepared};
use crate::shape::Shape;
use crate::variant::Variant;

/// What an instance knows of tuning.
#[derive(Debug)]
pub(crate) struct TuneState {
    cache: TuneCache,
    /// The device name tuned choices are kept under ([`tuned_device_name`]), fixed with the
    /// device and the kernel build when the instance is made.
    device: String,
    /// Threads per block the autotuned block-per-row variant chose, per shape.
    autotuned: HashMap<Shape, u32>,
    /// Shapes and layouts whose tuned choice cannot run them: `Auto` uses the built-in rule.
    untunable: HashSet<(Shape, Layout)>,
}

impl TuneState {
    /// The tune cache [`TUNE_CACHE_ENV`](crate::runtime::tune::TUNE_CACHE_ENV) names, if any, for `device` running `build`.
    pub fn new(device: &DeviceInfo, build: KernelBuild) -> Result<Self> {
        Ok(TuneState {
            cache: TuneCache::open(path_from_env())?,
            device: tuned_device_name(device, build),
            autotuned: HashMap::new(),
            untunable: HashSet::new(),
        })
    }

    /// The tuned choice for `shape` laid out as `layout`, if there is one.
    pub fn choice(&self, shape: Shape, layout: Layout) -> Option<Variant> {
        self.cache.get(&self.key(shape, layout))
    }

    fn key(&self, shape: Shape, layout: Layout) -> TuneKey {
        let aligned = layout == Layout::Aligned;
        TuneKey::for_layout(&self.device, shape, aligned, layout != Layout::Elements)
    }
}

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

impl Softmax {
    /// The plan `variant` runs on `shape` laid out as `layout`; for `Auto`, a tuned choice
    /// when [`Softmax::tune`] recorded one for the device and rounded shape and it can run
    /// this shape, else the built-in dispatch.
    pub(super) fn variant_plan(
        &mut self,
        variant: Variant,
        shape: Shape,
        layout: Layout,
    ) -> Result<Rc<Prepared>> {
        if variant == Variant::Auto
            && !self.tuning.cache.is_empty()
            && !self.tuning.untunable.contains(&(shape, layout))
            && let Some(tuned) = self.tuning.choice(shape, layout)
        {
            match self.prepared(Request::Variant(tuned), shape, layout) {
                Ok(prepared) => return Ok(prepared),
                // The tuned choice cannot run this shape of its bucket: the built-in rule,
                // from now on.
                Err(Error::Unsupported { .. }) => {
                    self.tuning.untunable.insert((shape, layout));
                }
                Err(other) => return Err(other),
            }
        }
        self.prepared(Request::Variant(variant), shape, layout)
    }

    /// `variant`, with the autotuned block-per-row variant's block size chosen (timed on
    /// these buffers the first time a shape is seen).
    pub(super) fn resolve_variant(
        &mut self,
        variant: Variant,
        shape: Shape,
        input: u64,
        output: u64,
    ) -> Result<Variant> {
        Ok(match variant {
            Variant::BlockPerRowAutotuned => Variant::BlockPerRowSmem {
                threads_per_block: self.tune_block_threads(shape, input, output)?,
            },
            other => other,
        })
    }

    /// Threads per block the autotuned block-per-row variant chose for `shape`, once it has.
    pub fn tuned_threads(&self, shape: Shape) -> Option<u32> {
        self.tuning.autotuned.get(&shape).copied()
    }

    /// Threads per block for the autotuned block-per-row variant: the seed's candidates timed
    /// on this shape with the caller's buffers, the fastest kept for later calls.
    fn tune_block_threads(&mut self, shape: Shape, input: u64, output: u64) -> Result<u32> {
        if let Some(&threads) = self.tuning.autotuned.get(&shape) {
            return Ok(threads);
        }
        let stream = self.target_stream();
        crate::runtime::refuse_while_capturing(stream, "tuning the block size")?;
        let timed = BLOCK_SMEM_AUTOTUNE_CANDIDATES.map(|threads_per_block| {
            let variant = Variant::BlockPerRowSmem { threads_per_block };
            (variant, threads_per_block)
        });
        // Timing waits for its own results anyway: it runs on this instance's stream (where
        // its events are), after everything the call's stream holds.
        driver::synchronize_stream(stream)?;
        let threads = self.with_stream(self.stream().as_inner(), |s| {
            s.fastest(&timed, shape, input, output)
        })?;
        self.tuning.autotuned.insert(shape, threads);
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
        self.runtime
            .check_on_device(&[("input", input), ("output", output)])?;
        super::call::check_disjoint("output", (output, bytes), "input", (input, bytes))?;
        let layout = plan::pair_layout(input, output, shape.cols());
        let candidates: Vec<(Variant, Variant)> = Variant::PRODUCTION
            .into_iter()
            .filter(|&v| self.prepared(Request::Variant(v), shape, layout).is_ok())
            .map(|v| (v, v))
            .collect();
        let best = self.fastest(&candidates, shape, input, output)?;
        let key = self.tuning.key(shape, layout);
        self.tuning.cache.insert(key, best);
        self.tuning.cache.save()?;
        Ok(best)
    }

    /// Uses `path` as the tune cache that `Variant::Auto` reads and [`Softmax::tune`] writes
    /// (`None`: in memory only, nothing read). Without this, the file named by
    /// [`TUNE_CACHE_ENV`](crate::runtime::tune::TUNE_CACHE_ENV) if set and not empty, else none. A path a save could not
    /// write is [`Error::Io`] here.
    pub fn with_tune_cache(mut self, path: Option<std::path::PathBuf>) -> Result<Self> {
        self.tuning.cache = TuneCache::open(path)?;
        Ok(self)
    }

    /// The tuned choice `reserve` must also prepare for `shape` laid out as `layout`.
    pub(super) fn tuned_choice(&self, shape: Shape, layout: Layout) -> Option<Variant> {
        self.tuning.choice(shape, layout)
    }

    /// The fastest of `candidates` (each a variant and what to answer for it) on this shape
    /// and these buffers: each warmed up, then the best of five timed launches, on the
    /// instance's stream.
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
                start.record(self.stream()).during("recording an event")?;
                // SAFETY: the callers checked both buffers against the shape, on this device
                // and distinct; the plan is the candidate's for this shape and layout.
                unsafe { self.enqueue(&prepared, shape, &buffers)? };
                stop.record(self.stream()).during("recording an event")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuned_choices_of_a_forced_build_are_kept_apart() {
        let mut h200 = crate::runtime::driver::fixtures::h200();
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
}
