//! The handle: a device, its runtime (loaded kernels, plans, workspaces), its own stream and
//! the tuning state. Every public call follows one pipeline: make the context current,
//! resolve the views on the call's stream and check them (`api::call`), describe the call,
//! plan it once per shape and layout (`crate::plan`, through the runtime's cache), and
//! enqueue the plan's launches (`crate::runtime`).

use std::rc::Rc;
use std::time::Duration;

use cust::context::{Context, CurrentContext};
use cust::memory::{CopyDestination, DeviceBuffer, DeviceSlice};
use cust::stream::{Stream, StreamFlags};
use cust::sys;

use super::call::{Frame, Span, check_output};
use super::options::Options;
use super::tune::TuneState;
use super::views::{Operation, Rows, RowsMut};
use crate::error::{CudaContext, Result};
use crate::plan::{Layout, Request};
use crate::runtime::driver::{self, ContextScope, DeviceInfo};
use crate::runtime::modules::{KernelBuild, KernelImage, ModuleId};
use crate::runtime::{CallBuffers, Prepared, Runtime};
use crate::shape::Shape;
use crate::variant::Variant;

/// Row-wise softmax on one CUDA device.
///
/// Owns a stream: calls only enqueue work on it (or on the stream their [`Options::on`]
/// names), so results (and errors raised while kernels run) appear after
/// [`Softmax::synchronize`]. Owns the workspaces some plans need (one per stream it is called
/// on), so it takes `&mut self`; calls on other streams are correct in any interleaving. It
/// is `Send`; threads that work concurrently each create their own (they share the device's
/// primary context). Every call leaves the caller's current context as it found it.
#[derive(Debug)]
pub struct Softmax {
    pub(super) runtime: Runtime,
    pub(super) tuning: TuneState,
    stream: Stream,
    /// The caller's stream for the call in progress, else `stream`.
    caller_stream: Option<sys::CUstream>,
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

impl Softmax {
    /// Opens the first CUDA device.
    pub fn new() -> Result<Self> {
        Self::on_device(0)
    }

    /// Opens CUDA device `ordinal`, loads the kernels and allocates the workspace.
    ///
    /// `Variant::Auto` uses the built-in dispatch, the same on every machine, unless the
    /// environment variable [`TUNE_CACHE_ENV`](crate::runtime::tune::TUNE_CACHE_ENV) names a tune cache file
    /// or [`Softmax::with_tune_cache`] gives one.
    ///
    /// The kernel build is the device's native one ([`KernelBuild::native_for`]) unless the
    /// environment variable [`KERNEL_BUILD_ENV`](crate::runtime::modules::KERNEL_BUILD_ENV) names another
    /// (`sm_80` on a Hopper GPU runs the Ampere build there); see
    /// [`Softmax::with_kernel_build`].
    pub fn on_device(ordinal: u32) -> Result<Self> {
        Self::with_kernel_build(ordinal, KernelBuild::from_env()?)
    }

    /// [`Softmax::on_device`] with the kernel build chosen: `None` is the device's native
    /// build. A device below compute capability 8.0, or [`KernelBuild::Sm90`] below 9.0, is
    /// [`Error::UnsupportedDevice`](crate::error::Error::UnsupportedDevice).
    pub fn with_kernel_build(ordinal: u32, build: Option<KernelBuild>) -> Result<Self> {
        // Puts back a context that was current before (leaving the device's primary context
        // current on a thread that had none, so buffers can be made there next).
        let (context, info, devices, _previous) = driver::open(ordinal)?;
        let build = match build {
            Some(build) => build.checked_for(&info)?,
            None => KernelBuild::native_for(&info)?,
        };
        let tuning = TuneState::new(&info, build)?;
        // A blocking stream: its work waits for what came before it on the legacy default
        // stream, where cust's synchronous calls run. A pageable host-to-device copy
        // (`DeviceBuffer::from_slice`, `copy_from`) may return before its DMA lands; a
        // non-blocking stream would let a launch read inputs half copied.
        let stream = Stream::new(StreamFlags::DEFAULT, None).during("creating a stream")?;
        let runtime = Runtime::open(info, devices, build, stream.as_inner())?;
        Ok(Softmax {
            runtime,
            tuning,
            stream,
            caller_stream: None,
            context,
            dropped_from: DropScope::default(),
        })
    }

    /// The device this instance runs on.
    pub fn device(&self) -> &DeviceInfo {
        &self.runtime.info
    }

    /// The kernel build this instance runs.
    pub fn kernel_build(&self) -> KernelBuild {
        self.runtime.build()
    }

    /// What the softmax module loaded as on this device (a cubin, or PTX the driver
    /// compiled); the operation modules load the same kind of image.
    pub fn kernel_image(&self) -> KernelImage {
        ModuleId::Softmax.image_for(self.runtime.build(), self.runtime.info.compute_capability)
    }

    /// Testing hook: how long a block of a row cut into slices waits for the row's other
    /// blocks before it leaves its slice to the row's last block (default 200 µs). Zero
    /// makes nearly every block leave, which exercises that path; results stay exact, only
    /// slower.
    #[doc(hidden)]
    pub fn set_row_barrier_patience(&mut self, patience: Duration) {
        self.runtime.patience_ns = u64::try_from(patience.as_nanos()).unwrap_or(u64::MAX);
    }

    /// Testing hook: how many blocks of row-slices launches have left their slices to their
    /// rows' last blocks so far on this instance (waits for the device first). Tests read it
    /// to prove that the leaving path ran.
    #[doc(hidden)]
    pub fn blocks_that_left(&self) -> Result<u64> {
        let _context = self.enter()?;
        CurrentContext::synchronize().during("waiting for the device")?;
        self.runtime.blocks_that_left()
    }

    /// The stream every launch is enqueued on, unless a call's options name another
    /// ([`Options::on`]).
    pub fn stream(&self) -> &Stream {
        &self.stream
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

    /// Checks a call's buffers: every one with bytes on this device, every output apart from
    /// every input and from the other outputs, but for `in_place` (an output that may be
    /// exactly the given input where it views it exactly so).
    pub(super) fn check_call_buffers(
        &self,
        reads: &[Span],
        writes: &[Span],
        in_place: Option<(&Span, &Span)>,
    ) -> Result<()> {
        let on_device: Vec<(&'static str, u64)> = reads
            .iter()
            .chain(writes)
            .filter(|s| s.bytes > 0)
            .map(|s| (s.what, s.operand.address))
            .collect();
        self.runtime.check_on_device(&on_device)?;
        for (i, output) in writes.iter().enumerate() {
            let allowed = in_place
                .filter(|(written, _)| written.same_view(output))
                .map(|(_, read)| read);
            check_output(output, reads, allowed)?;
            check_output(output, &writes[i + 1..], None)?;
        }
        Ok(())
    }

    /// The frame of a call with `options`: its stream, and the bookkeeping of the buffers
    /// it resolves there.
    pub(super) fn frame<'r>(&self, options: &Options<'r>) -> Result<Frame<'r>> {
        Frame::begin(
            options.stream,
            self.stream.as_inner(),
            self.runtime.info.ordinal,
        )
    }

    /// Runs `call` with its work enqueued on `stream`.
    ///
    /// The instance's own stream is put back however `call` ends, unwinding included.
    pub(super) fn with_stream<T>(
        &mut self,
        stream: sys::CUstream,
        call: impl FnOnce(&mut Self) -> T,
    ) -> T {
        let outer = self.caller_stream.replace(stream);
        let scope = StreamScope {
            softmax: self,
            outer,
        };
        call(&mut *scope.softmax)
    }

    /// Where the call in progress enqueues its work.
    pub(super) fn target_stream(&self) -> sys::CUstream {
        self.caller_stream.unwrap_or_else(|| self.stream.as_inner())
    }

    /// The plan for `request` on `shape` laid out as `layout` (made once, on the stream of
    /// the call in progress).
    pub(super) fn prepared(
        &mut self,
        request: Request,
        shape: Shape,
        layout: Layout,
    ) -> Result<Rc<Prepared>> {
        let stream = self.target_stream();
        self.runtime.prepared(request, shape, layout, stream)
    }

    /// Enqueues `prepared` on the stream of the call in progress.
    ///
    /// # Safety
    /// As for [`Runtime::enqueue`].
    pub(super) unsafe fn enqueue(
        &mut self,
        prepared: &Prepared,
        shape: Shape,
        buffers: &CallBuffers,
    ) -> Result<()> {
        let stream = self.target_stream();
        // SAFETY: forwarded; the stream is the instance's own or the one the call's options
        // named, of this device's primary context.
        unsafe { self.runtime.enqueue(prepared, shape, buffers, stream) }
    }

    /// Enqueues the f32 softmax of each row of `input` (row-major `shape`) into `output`
    /// with `variant`: [`Softmax::forward`] with [`Options::variant`], for the seed baselines
    /// and production kernels one by one.
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
        // The variants have no in-place path: an output that is the input is an overlap here
        // (where `forward` would compute it in place).
        let bytes = shape.len() as u64 * 4;
        let (x, y) = (
            super::views::address(input),
            super::views::address(&*output),
        );
        super::call::check_disjoint("output", (y, bytes), "input", (x, bytes))?;
        let input = Rows::new(input, shape)?;
        let output = RowsMut::new(output, shape)?;
        let options = Options::new().variant(variant);
        self.forward(Operation::Softmax, input, output, &options)
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
