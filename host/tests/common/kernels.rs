//! Hand-written PTX kernels the GPU tests launch beside the library's: a late writer, and a
//! holder that occupies multiprocessors until a release kernel (or a timeout) lets it go.

use cust::event::{Event, EventFlags, EventStatus};
use cust::launch;
use cust::memory::{DeviceBuffer, DeviceCopy};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags, StreamWaitEventFlags};
use cust::sys;

/// `late_copy(src, dst, words, spin_ns)`: lets the next grid in its stream start at once
/// (`griddepcontrol.launch_dependents`), spins for `spin_ns` nanoseconds, then copies `words`
/// 32-bit words from `src` to `dst` (grid-stride).
///
/// `hold(flag, record, timeout_ns)`: thread 0 of each block records its start time, spins
/// until the u32 at `flag` is nonzero or `timeout_ns` have passed, then records its end time
/// and whether it timed out (`record` holds three u64 per block: start, end, timed out).
///
/// `release(flag, when)`: records the time at `when`, then sets the u32 at `flag` to 1.
///
/// `spin(spin_ns)`: one thread spins until `%globaltimer` has advanced `spin_ns` nanoseconds.
pub const TEST_KERNELS_PTX: &str = ".version 7.8
.target sm_90
.address_size 64

.visible .entry late_copy(
\t.param .u64 late_copy_src,
\t.param .u64 late_copy_dst,
\t.param .u64 late_copy_words,
\t.param .u64 late_copy_spin_ns
)
{
\t.reg .pred \t%p<3>;
\t.reg .b32 \t%r<6>;
\t.reg .b64 \t%rd<16>;

\tgriddepcontrol.launch_dependents;
\tld.param.u64 \t%rd1, [late_copy_src];
\tld.param.u64 \t%rd2, [late_copy_dst];
\tld.param.u64 \t%rd3, [late_copy_words];
\tld.param.u64 \t%rd4, [late_copy_spin_ns];
\tcvta.to.global.u64 \t%rd1, %rd1;
\tcvta.to.global.u64 \t%rd2, %rd2;
\tmov.u64 \t%rd5, %globaltimer;
\tadd.u64 \t%rd6, %rd5, %rd4;
$SPIN:
\tmov.u64 \t%rd7, %globaltimer;
\tsetp.lt.u64 \t%p1, %rd7, %rd6;
\t@%p1 bra \t$SPIN;
\tmov.u32 \t%r1, %ctaid.x;
\tmov.u32 \t%r2, %ntid.x;
\tmov.u32 \t%r3, %tid.x;
\tmov.u32 \t%r4, %nctaid.x;
\tmul.wide.u32 \t%rd8, %r1, %r2;
\tcvt.u64.u32 \t%rd9, %r3;
\tadd.u64 \t%rd8, %rd8, %rd9;
\tmul.wide.u32 \t%rd10, %r4, %r2;
$COPY:
\tsetp.ge.u64 \t%p2, %rd8, %rd3;
\t@%p2 bra \t$DONE;
\tshl.b64 \t%rd11, %rd8, 2;
\tadd.u64 \t%rd12, %rd1, %rd11;
\tld.global.b32 \t%r5, [%rd12];
\tadd.u64 \t%rd13, %rd2, %rd11;
\tst.global.b32 \t[%rd13], %r5;
\tadd.u64 \t%rd8, %rd8, %rd10;
\tbra.uni \t$COPY;
$DONE:
\tret;
}

.visible .entry hold(
\t.param .u64 hold_flag,
\t.param .u64 hold_record,
\t.param .u64 hold_timeout_ns
)
{
\t.reg .pred \t%p<4>;
\t.reg .b32 \t%r<4>;
\t.reg .b64 \t%rd<12>;

\tmov.u32 \t%r1, %tid.x;
\tsetp.ne.u32 \t%p1, %r1, 0;
\t@%p1 bra \t$HOLD_DONE;
\tld.param.u64 \t%rd1, [hold_flag];
\tld.param.u64 \t%rd2, [hold_record];
\tld.param.u64 \t%rd3, [hold_timeout_ns];
\tcvta.to.global.u64 \t%rd1, %rd1;
\tcvta.to.global.u64 \t%rd2, %rd2;
\tmov.u32 \t%r2, %ctaid.x;
\tmul.wide.u32 \t%rd4, %r2, 24;
\tadd.u64 \t%rd2, %rd2, %rd4;
\tmov.u64 \t%rd5, %globaltimer;
\tst.global.u64 \t[%rd2], %rd5;
\tadd.u64 \t%rd6, %rd5, %rd3;
$HOLD_SPIN:
\tld.volatile.global.u32 \t%r3, [%rd1];
\tsetp.ne.u32 \t%p2, %r3, 0;
\t@%p2 bra \t$HOLD_RELEASED;
\tmov.u64 \t%rd7, %globaltimer;
\tsetp.lt.u64 \t%p3, %rd7, %rd6;
\t@%p3 bra \t$HOLD_SPIN;
\tmov.u64 \t%rd8, 1;
\tst.global.u64 \t[%rd2+16], %rd8;
$HOLD_RELEASED:
\tmov.u64 \t%rd9, %globaltimer;
\tst.global.u64 \t[%rd2+8], %rd9;
$HOLD_DONE:
\tret;
}

.visible .entry release(
\t.param .u64 release_flag,
\t.param .u64 release_when
)
{
\t.reg .b32 \t%r<2>;
\t.reg .b64 \t%rd<5>;

\tld.param.u64 \t%rd1, [release_flag];
\tld.param.u64 \t%rd2, [release_when];
\tcvta.to.global.u64 \t%rd1, %rd1;
\tcvta.to.global.u64 \t%rd2, %rd2;
\tmov.u64 \t%rd3, %globaltimer;
\tst.global.u64 \t[%rd2], %rd3;
\tmembar.gl;
\tmov.u32 \t%r1, 1;
\tst.volatile.global.u32 \t[%rd1], %r1;
\tret;
}

.visible .entry spin(
\t.param .u64 spin_spin_ns
)
{
\t.reg .pred \t%p<2>;
\t.reg .b64 \t%rd<5>;

\tld.param.u64 \t%rd1, [spin_spin_ns];
\tmov.u64 \t%rd2, %globaltimer;
\tadd.u64 \t%rd3, %rd2, %rd1;
$SPIN_WAIT:
\tmov.u64 \t%rd4, %globaltimer;
\tsetp.lt.u64 \t%p1, %rd4, %rd3;
\t@%p1 bra \t$SPIN_WAIT;
\tret;
}
";

/// Loads [`TEST_KERNELS_PTX`] and lets `hold` take `hold_shared_bytes` of dynamic shared
/// memory (enough to keep other kernels' blocks off a multiprocessor it holds).
///
/// Every function is looked up here, once. With the driver's lazy loading (the default), a
/// function is loaded into the context the first time it is looked up, and that load waits
/// for the kernels running on the device: a `release` first looked up while the holders spin
/// would wait for them, and they for it.
pub fn load(hold_shared_bytes: u32) -> Result<Module, String> {
    let module = Module::from_ptx(TEST_KERNELS_PTX, &[]).map_err(|e| e.to_string())?;
    for name in ["late_copy", "release", "spin"] {
        module
            .get_function(name)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    let hold = module.get_function("hold").map_err(|e| e.to_string())?;
    // SAFETY: a valid function handle; the attribute takes an int.
    let status = unsafe {
        sys::cuFuncSetAttribute(
            hold.to_raw(),
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            hold_shared_bytes as i32,
        )
    };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("raising hold's shared-memory limit: {status:?}"));
    }
    Ok(module)
}

/// How long `late_copy` spins before it writes.
pub const LATE_WRITE_NS: u64 = 100_000;

/// Enqueues `late_copy` of `source` into `destination` on `stream`: it lets the next grid
/// start at once and writes [`LATE_WRITE_NS`] later.
pub fn write_late<T: DeviceCopy>(
    module: &Module,
    stream: &Stream,
    source: &DeviceBuffer<T>,
    destination: &DeviceBuffer<T>,
) -> Result<(), String> {
    let words = (source.len() * size_of::<T>() / 4) as u64;
    // SAFETY: `late_copy` reads `words` 32-bit words of `source` and writes as many of
    // `destination`, two distinct buffers of that many bytes.
    unsafe {
        launch!(module.late_copy<<<132, 256, 0, stream>>>(
            source.as_device_ptr(),
            destination.as_device_ptr(),
            words,
            LATE_WRITE_NS
        ))
    }
    .map_err(|e| format!("launching late_copy: {e}"))
}

/// A kernel on its own stream that holds all but a few multiprocessors for a while (each of
/// its blocks takes a multiprocessor's whole shared memory), so that the work beside it
/// trickles through the rest: a row's blocks cannot all be resident at once, and several
/// streams' blocks interleave.
pub struct Holder {
    module: Module,
    pub stream: Stream,
    pub blocks: u32,
    shared_bytes: u32,
}

impl Holder {
    /// A holder of all but `free` multiprocessors of `device`.
    ///
    /// The holders run once, for no time, before it returns: a first launch can pay for
    /// setting the kernel up (its shared-memory configuration, any loading left), and holders
    /// that took their places only after the work beside them had finished would hold
    /// nothing back.
    pub fn new(device: &softmax::DeviceInfo, free: u32) -> Result<Self, String> {
        let holder = Holder {
            module: load(device.max_shared_per_block)?,
            stream: Stream::new(cust::stream::StreamFlags::NON_BLOCKING, None)
                .map_err(|e| e.to_string())?,
            blocks: device.multiprocessors.saturating_sub(free),
            shared_bytes: device.max_shared_per_block,
        };
        let warm = holder.hold(std::time::Duration::ZERO)?;
        if let Err(error) = holder.stream.synchronize() {
            // The holders may still run: their buffers stay allocated.
            std::mem::forget(warm);
            return Err(format!("warming the holders: {error}"));
        }
        drop(warm);
        Ok(holder)
    }

    /// Launches the holders, which leave by themselves after `hold`, and gives them a moment
    /// to take their places. The returned buffers must live until the holders have finished
    /// (wait for [`Holder::stream`]).
    pub fn hold(&self, hold: std::time::Duration) -> Result<Held, String> {
        let text = |e: cust::error::CudaError| e.to_string();
        let flag = DeviceBuffer::from_slice(&[0u32]).map_err(text)?;
        let record =
            DeviceBuffer::from_slice(&vec![0u64; 3 * self.blocks as usize]).map_err(text)?;
        let stream = &self.stream;
        let module = &self.module;
        // SAFETY: `hold` reads `flag` and writes three words per block of `record`, which holds
        // as many; both live in `Held` until the holders are waited for; its dynamic shared
        // memory was allowed when the module was loaded.
        unsafe {
            launch!(module.hold<<<self.blocks, 32, self.shared_bytes, stream>>>(
                flag.as_device_ptr(),
                record.as_device_ptr(),
                hold.as_nanos() as u64
            ))
        }
        .map_err(|e| format!("launching the holders: {e}"))?;
        std::thread::sleep(std::time::Duration::from_millis(2));
        Ok(Held {
            _flag: flag,
            _record: record,
        })
    }
}

/// The buffers of holders in flight.
pub struct Held {
    _flag: DeviceBuffer<u32>,
    _record: DeviceBuffer<u64>,
}

/// Launches `spin` (one thread) on `stream` for `nanoseconds`: the work queued behind it there
/// waits that long. The stream is a raw handle, so cudarc's streams take it too.
pub fn spin(module: &Module, stream: sys::CUstream, nanoseconds: u64) -> Result<(), String> {
    let function = module.get_function("spin").map_err(|e| e.to_string())?;
    let mut argument = nanoseconds;
    let mut arguments = [(&raw mut argument).cast::<std::ffi::c_void>()];
    // SAFETY: `spin` takes one u64 and touches no memory; the stream is a live stream of the
    // current context.
    let status = unsafe {
        sys::cuLaunchKernel(
            function.to_raw(),
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            arguments.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    (status == sys::CUresult::CUDA_SUCCESS)
        .then_some(())
        .ok_or_else(|| format!("launching spin: {status:?}"))
}

/// Holds streams back until the host has enqueued all their work, so the GPU runs it as
/// fast as it can rather than as fast as the host enqueues it (and the streams' work starts
/// together): a spinning kernel on a stream of its own, then `opened`, the start every
/// stream's events are timed from.
pub struct Gate {
    module: Module,
    stream: Stream,
    pub opened: Event,
    hold_ns: u64,
}

impl Gate {
    /// A gate that holds for `hold_ns` nanoseconds each time it closes.
    pub fn new(hold_ns: u64) -> Result<Self, String> {
        let text = |e: cust::error::CudaError| e.to_string();
        Ok(Gate {
            module: load(0)?,
            stream: Stream::new(StreamFlags::NON_BLOCKING, None).map_err(text)?,
            opened: Event::new(EventFlags::DEFAULT).map_err(text)?,
            hold_ns,
        })
    }

    /// Closes the gate for its hold, then records `opened`.
    pub fn close(&self) -> Result<(), String> {
        spin(&self.module, self.stream.as_inner(), self.hold_ns)
            .map_err(|e| format!("the gate: {e}"))?;
        self.opened
            .record(&self.stream)
            .map_err(|e| format!("recording the gate: {e}"))
    }

    /// Makes `stream`'s later work wait until the gate opens.
    pub fn hold(&self, stream: &Stream) -> Result<(), String> {
        let text = |e: cust::error::CudaError| format!("holding a stream at the gate: {e}");
        let opened = Event::new(EventFlags::DISABLE_TIMING).map_err(text)?;
        opened.record(&self.stream).map_err(text)?;
        stream
            .wait_event(opened, StreamWaitEventFlags::DEFAULT)
            .map_err(text)
    }

    /// An error if the gate opened before the host finished enqueueing: then the timings
    /// would measure the host.
    pub fn still_closed(&self) -> Result<(), String> {
        match self.opened.query().map_err(|e| e.to_string())? {
            EventStatus::NotReady => Ok(()),
            EventStatus::Ready => Err(format!(
                "enqueueing took longer than the gate's {} ms",
                self.hold_ns / 1_000_000
            )),
        }
    }
}
