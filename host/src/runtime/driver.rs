//! Opening a device and reading what the library and the benchmark need to know about it.

use cust::context::Context;
use cust::device::{Device, DeviceAttribute};
use cust::error::CudaError;
use cust::sys;
use std::ffi::{c_char, c_int, c_void};
use std::marker::PhantomData;

use crate::error::{CudaContext, Error, Result, cuda_message};
use crate::plan::{Launch, Scheduling};

/// Facts about the device a [`crate::Softmax`] runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "tune-cache", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub name: String,
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    /// Dynamic shared memory one block may opt in to.
    pub max_shared_per_block: u32,
    pub l2_bytes: u32,
    pub total_memory_bytes: usize,
    /// Peak clocks the driver reports, in MHz.
    pub sm_clock_mhz: u32,
    pub memory_clock_mhz: u32,
    /// The memory bus's width in bits (0 in runs saved before it was recorded).
    #[cfg_attr(feature = "tune-cache", serde(default))]
    pub memory_bus_bits: u32,
    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub driver_version: i32,
    pub supports_cooperative_launch: bool,
}

impl DeviceInfo {
    /// A short lowercase name for file names, e.g. `nvidia-h200`.
    pub fn slug(&self) -> String {
        let slug: String = self
            .name
            .to_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        slug.split('-')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("-")
    }
}

/// Initializes the driver and retains the primary context of device `ordinal`, making it
/// current on this thread until the returned scope ends (it stays current where no context
/// was); also says how many devices the machine has. A machine without a GPU or driver gives
/// [`Error::NoDevice`].
pub(crate) fn open(ordinal: u32) -> Result<(Context, DeviceInfo, u32, ContextScope)> {
    cust::init(cust::CudaFlags::empty()).map_err(|e| no_device(e, "cuInit failed"))?;
    let previous = ContextScope::restoring(current_context()?);
    let count = Device::num_devices().map_err(|e| no_device(e, "cannot count devices"))?;
    if ordinal >= count {
        return Err(Error::NoDevice {
            reason: format!("device {ordinal} requested but {count} present"),
        });
    }
    let device = Device::get_device(ordinal).during("opening the device")?;
    let context = Context::new(device).during("creating the device context")?;
    let info = read_info(ordinal, device)?;
    Ok((context, info, count, previous))
}

fn no_device(error: CudaError, what: &str) -> Error {
    Error::NoDevice {
        reason: format!("{what}: {}", cuda_message(&error)),
    }
}

fn read_info(ordinal: u32, device: Device) -> Result<DeviceInfo> {
    let attribute = |a: DeviceAttribute| {
        device
            .get_attribute(a)
            .during("reading device attributes")
            .map(|v| v as u32)
    };
    let mut driver_version = 0;
    // SAFETY: writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) };
    Ok(DeviceInfo {
        ordinal,
        name: device.name().during("reading the device name")?,
        compute_capability: (
            attribute(DeviceAttribute::ComputeCapabilityMajor)?,
            attribute(DeviceAttribute::ComputeCapabilityMinor)?,
        ),
        multiprocessors: attribute(DeviceAttribute::MultiprocessorCount)?,
        max_shared_per_block: raw_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )? as u32,
        l2_bytes: attribute(DeviceAttribute::L2CacheSize)?,
        total_memory_bytes: device.total_memory().during("reading the memory size")?,
        sm_clock_mhz: attribute(DeviceAttribute::ClockRate)? / 1000,
        memory_clock_mhz: attribute(DeviceAttribute::MemoryClockRate)? / 1000,
        memory_bus_bits: attribute(DeviceAttribute::GlobalMemoryBusWidth)?,
        driver_version,
        supports_cooperative_launch: raw_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
        )? != 0,
    })
}

/// Attributes cust's enum does not list.
fn raw_attribute(device: Device, attribute: sys::CUdevice_attribute) -> Result<i32> {
    let mut value = 0;
    // SAFETY: writes one int through a valid pointer; the device handle is valid.
    let status = unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device.as_raw()) };
    check(status, "reading device attributes")?;
    Ok(value)
}

/// The ordinal of the device whose memory holds `address`.
pub(crate) fn pointer_device(address: u64) -> Result<u32> {
    let mut ordinal: c_int = -1;
    // SAFETY: the attribute is one int written through a valid pointer; the driver answers
    // with an error for addresses it does not know.
    let status = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut c_int).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            address,
        )
    };
    check(status, "asking which device holds a buffer")?;
    Ok(ordinal.max(0) as u32)
}

/// Turns the status of a raw driver call into a result.
pub(crate) fn check(status: sys::CUresult, during: &'static str) -> Result<()> {
    check_code(status as c_int, during)
}

/// [`check`] for a status as the driver's plain integer: calls that cust's bindings do not
/// declare may return codes newer than its `CUresult` enum holds (which no enum value may).
pub(crate) fn check_code(code: c_int, during: &'static str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string, or leaves it null (and
    // returns an error) for a code it does not know.
    unsafe { error_name(code, &mut name) };
    let name = if name.is_null() {
        "unknown error".to_owned()
    } else {
        // SAFETY: a non-null result is a NUL-terminated static string owned by the driver.
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    Err(Error::CudaStatus {
        during,
        code: code as u32,
        name,
    })
}

// cust_raw declares `cuGetErrorName` with its `CUresult` enum, which cannot carry a code newer
// than the bindings; the C function takes a plain int.
#[allow(clashing_extern_declarations)]
unsafe extern "C" {
    #[link_name = "cuGetErrorName"]
    fn error_name(code: c_int, name: *mut *const c_char) -> c_int;
}

/// Devices the unit tests plan and report for.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::DeviceInfo;

    /// The H200 the results were measured on.
    pub(crate) fn h200() -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            multiprocessors: 132,
            max_shared_per_block: 232_448,
            l2_bytes: 60 << 20,
            total_memory_bytes: 140 << 30,
            sm_clock_mhz: 1980,
            memory_clock_mhz: 3201,
            memory_bus_bits: 6144,
            driver_version: 13000,
            supports_cooperative_launch: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_structs_have_the_driver_layout() {
        // cuda.h (12.x): CUlaunchAttribute is 72 bytes, 8-aligned, its value at offset 8;
        // CUlaunchConfig has hStream at 32, attrs at 40, numAttrs at 48 (56 bytes).
        assert_eq!(
            (
                std::mem::size_of::<LaunchAttribute>(),
                std::mem::align_of::<LaunchAttribute>()
            ),
            (72, 8)
        );
        assert_eq!(std::mem::offset_of!(LaunchAttribute, value), 8);
        assert_eq!(std::mem::offset_of!(LaunchConfig, stream), 32);
        assert_eq!(std::mem::offset_of!(LaunchConfig, attributes), 40);
        assert_eq!(std::mem::offset_of!(LaunchConfig, attribute_count), 48);
        assert_eq!(std::mem::size_of::<LaunchConfig>(), 56);
    }

    #[test]
    fn statuses_newer_than_custs_enum_keep_their_driver_name() {
        // cuGetErrorName needs no initialized driver, so this runs without a GPU.
        match check_code(912, "launching a kernel") {
            Err(Error::CudaStatus { code, name, .. }) => {
                assert_eq!(code, 912);
                assert_eq!(name, "CUDA_ERROR_INVALID_CLUSTER_SIZE");
            }
            other => panic!("912 gave {other:?}"),
        }
        assert!(check_code(0, "anything").is_ok());
    }
}

/// Waits for everything enqueued on `stream` so far.
pub(crate) fn synchronize_stream(stream: sys::CUstream) -> Result<()> {
    // SAFETY: a stream of the current context, valid for the call.
    check(
        unsafe { sys::cuStreamSynchronize(stream) },
        "waiting for the stream",
    )
}

/// Writes `count` copies of the 32-bit word `bits` from `address`, enqueued on `stream`.
///
/// # Safety
/// `address` holds `count` words of device memory of the current context's device, which
/// nothing else uses until the fill completes.
pub(crate) unsafe fn fill_words(
    address: u64,
    bits: u32,
    count: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: forwarded.
    let status = unsafe { sys::cuMemsetD32Async(address, bits, count, stream) };
    check(status, "writing a loss")
}

/// Writes, for each of `rows` rows, `words` 32-bit words at the row's place in a per-row
/// buffer at `address`: `-inf`, then zeros (the identity state; a log-sum-exp of `-inf`).
///
/// # Safety
/// `address` holds `rows · words` words of device memory of the current context's device,
/// which nothing else uses until the fill, enqueued on `stream`, completes.
pub(crate) unsafe fn fill_identity_states(
    address: u64,
    rows: usize,
    words: usize,
    stream: sys::CUstream,
) -> Result<()> {
    const NEG_INFINITY_BITS: u32 = 0xff80_0000;
    let pitch = 4 * words;
    // SAFETY: both fills stay inside the buffer (forwarded contract) and are ordered on the
    // stream.
    let status = unsafe {
        let mut status = sys::cuMemsetD32Async(address, 0, rows * words, stream);
        if status == sys::CUresult::CUDA_SUCCESS {
            status = sys::cuMemsetD2D32Async(address, pitch, NEG_INFINITY_BITS, 1, rows, stream);
        }
        status
    };
    check(status, "writing identity states")
}

/// Whether `stream` is being captured into a graph.
pub(crate) fn is_capturing(stream: sys::CUstream) -> Result<bool> {
    Ok(capture_id(stream)?.is_some())
}

/// The id of the capture `stream` takes part in (one id for every stream forked into it), or
/// `None` when it is not being captured.
pub(crate) fn capture_id(stream: sys::CUstream) -> Result<Option<u64>> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    // SAFETY: the stream belongs to the current context; the status and id are written
    // through valid pointers, the optional outputs are null.
    let result = unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    check(result, "asking whether the stream is capturing")?;
    Ok((status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
}

/// The context current on this thread (null when none is).
pub(crate) fn current_context() -> Result<sys::CUcontext> {
    let mut context = std::ptr::null_mut();
    // SAFETY: writes one handle through a valid pointer.
    let status = unsafe { sys::cuCtxGetCurrent(&mut context) };
    check(status, "reading the current context")?;
    Ok(context)
}

/// The context that was current before a call made its own current, put back when this is
/// dropped (also while unwinding): every call leaves the caller's current context as it was.
/// On a thread with no context current, the call's own stays current (as `cust::quick_init`
/// leaves one), so the caller can make buffers there afterwards.
#[derive(Debug)]
#[must_use = "the scope puts the caller's context back when dropped: bind it for the call"]
pub(crate) struct ContextScope {
    /// What to put back; `None` when the call found its own context current already.
    previous: Option<sys::CUcontext>,
}

impl ContextScope {
    /// Makes `context` current for the scope's life.
    pub(crate) fn enter(context: sys::CUcontext) -> Result<Self> {
        let previous = current_context()?;
        if previous == context {
            return Ok(ContextScope { previous: None });
        }
        // SAFETY: `context` is a live context handle owned by the caller.
        let status = unsafe { sys::cuCtxSetCurrent(context) };
        check(status, "making the context current")?;
        Ok(ContextScope::restoring(previous))
    }

    /// A scope that puts `previous` back (nothing, when it is null) when dropped.
    pub(crate) fn restoring(previous: sys::CUcontext) -> Self {
        ContextScope {
            previous: (!previous.is_null()).then_some(previous),
        }
    }
}

impl Drop for ContextScope {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: `previous` was current on this thread when the scope began; a context
            // the caller destroyed meanwhile makes this fail, which leaves nothing worse.
            let _ = unsafe { sys::cuCtxSetCurrent(previous) };
        }
    }
}

/// A driver event without timing, destroyed with its owner: what orders uses of one buffer
/// across streams.
#[derive(Debug)]
pub(crate) struct OrderEvent(pub sys::CUevent);

impl OrderEvent {
    pub fn new() -> Result<Self> {
        let mut event = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer; the context is current.
        let status = unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        };
        check(status, "creating an event")?;
        Ok(OrderEvent(event))
    }
}

impl Drop for OrderEvent {
    fn drop(&mut self) {
        // SAFETY: the event was created by `new` and is destroyed once; the driver keeps it
        // alive for work still pending on it.
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// Records `event` after the work enqueued on `stream` so far.
pub(crate) fn record(event: sys::CUevent, stream: sys::CUstream) -> Result<()> {
    // SAFETY: a live event and a stream of the current context.
    let status = unsafe { sys::cuEventRecord(event, stream) };
    check(status, "recording the workspace's use")
}

/// Adds an external event record node for `event` to the graph `stream` is capturing.
pub(crate) fn record_external(event: sys::CUevent, stream: sys::CUstream) -> Result<()> {
    // SAFETY: a live event and a stream of the current context, capturing, where the external
    // flag is valid.
    let status = unsafe {
        sys::cuEventRecordWithFlags(
            event,
            stream,
            sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
        )
    };
    check(status, "recording the workspace's use")
}

/// Makes `stream` wait for the work `event` last recorded.
pub(crate) fn wait(
    stream: sys::CUstream,
    event: sys::CUevent,
    flags: sys::CUevent_wait_flags,
) -> Result<()> {
    // SAFETY: a live event and a stream of the current context.
    let status = unsafe { sys::cuStreamWaitEvent(stream, event, flags as u32) };
    check(
        status,
        "ordering the stream after the workspace's previous use",
    )
}

/// The driver's id of `stream`, unique for the life of the process.
pub(crate) fn stream_id(stream: sys::CUstream) -> Result<u64> {
    let mut id = 0u64;
    // SAFETY: writes one integer through a valid pointer; the stream is of the current context
    // (or a special handle, which the driver resolves).
    let status = unsafe { cuStreamGetId(stream, &mut id) };
    check_code(status, "reading the stream's id")?;
    Ok(id)
}

// A CUDA 12.0 driver call that cust 0.3.2's bindings predate; the driver library the crate
// links (CUDA 12 or later) exports it.
unsafe extern "C" {
    fn cuStreamGetId(stream: sys::CUstream, id: *mut u64) -> c_int;
}

/// Zeroes `words` 32-bit words from `address`, enqueued on `stream`.
///
/// # Safety
/// `address` holds `words` words of device memory of the current context's device.
pub(crate) unsafe fn zero_words(address: u64, words: usize, stream: sys::CUstream) -> Result<()> {
    // SAFETY: forwarded.
    let status = unsafe { sys::cuMemsetD32Async(address, 0, words, stream) };
    check(status, "zeroing the workspace")
}

/// The driver launch of `launch`'s grid with `params`, allowed to overlap the previous grid's
/// tail where `overlap` says the entry waits for it.
///
/// # Safety
/// `params` points to the entry's argument pointers, one per parameter, whose values
/// satisfy the kernel's `# Safety` contract for this grid; `function` and `stream` belong to the current context;
/// `overlap` only where `function` starts with `griddepcontrol.wait`.
pub(crate) unsafe fn launch(
    function: sys::CUfunction,
    launch: &Launch,
    params: *mut *mut c_void,
    stream: sys::CUstream,
    overlap: bool,
) -> Result<()> {
    // SAFETY: forwarded from this function's contract; the configuration and its attribute
    // array outlive the launch call, during which the driver reads them.
    let status = unsafe {
        match launch.scheduling {
            // No programmatic overlap: a cooperative grid must find every block a place at
            // once, so it starts after the previous grid left (measured: allowing overlap
            // here gained nothing).
            Scheduling::Cooperative => sys::cuLaunchCooperativeKernel(
                function,
                launch.grid,
                1,
                1,
                launch.block,
                1,
                1,
                launch.shared_bytes,
                stream,
                params,
            ) as c_int,
            // Every entry of the sm_90 build starts with `griddepcontrol.wait` (kernels-gpu's
            // contract), so the grid may start once every block of the previous kernel in the
            // stream has exited, before that kernel's completion is signalled.
            Scheduling::Ordinary | Scheduling::Clusters(_) => {
                let cluster = match launch.scheduling {
                    Scheduling::Clusters(blocks) => blocks,
                    _ => 1,
                };
                let mut attributes = [
                    launch_attribute(LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &[cluster, 1, 1]),
                    launch_attribute(LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, &[1]),
                ];
                let first = if cluster > 1 { 0 } else { 1 };
                let last = if overlap { 2 } else { 1 };
                let config = LaunchConfig::new(
                    launch.grid,
                    launch.block,
                    launch.shared_bytes,
                    stream,
                    &mut attributes[first..last.max(first)],
                );
                cuLaunchKernelEx(&config, function, params, std::ptr::null_mut())
            }
        }
    };
    check_code(status, "launching a kernel")
}

/// `CUlaunchAttribute` of the CUDA 12 driver API (`cuda.h`): an id, padding to 8 bytes, and a
/// 64-byte value union (8-byte aligned: some members are pointers); for the cluster dimension
/// the value starts with x, y and z, for programmatic stream serialization it is one int.
#[repr(C, align(8))]
pub(crate) struct LaunchAttribute {
    id: u32,
    pad: [u8; 4],
    value: [u32; 16],
}

/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`.
pub(crate) const LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: with a nonzero value, the grid may
/// start once every block of the previous kernel in the stream has exited, before that kernel's
/// completion is signalled (programmatic dependent launch).
const LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;

/// `CUlaunchConfig` of the CUDA 12 driver API, borrowing its attribute array for `'a` (so the
/// configuration cannot outlive the attributes the driver reads through it).
#[repr(C)]
pub(crate) struct LaunchConfig<'a> {
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    stream: sys::CUstream,
    attributes: *mut LaunchAttribute,
    attribute_count: u32,
    borrowed: PhantomData<&'a mut [LaunchAttribute]>,
}

impl<'a> LaunchConfig<'a> {
    /// `grid` blocks of `block` threads along x on `stream`, with `attributes`.
    pub(crate) fn new(
        grid: u32,
        block: u32,
        shared_bytes: u32,
        stream: sys::CUstream,
        attributes: &'a mut [LaunchAttribute],
    ) -> Self {
        LaunchConfig {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes,
            stream,
            attributes: attributes.as_mut_ptr(),
            attribute_count: attributes.len() as u32,
            borrowed: PhantomData,
        }
    }
}

// A CUDA 12 driver call that cust 0.3.2's bindings predate; the driver library the crate links
// (a CUDA 12 or later driver) exports it. It returns a plain int: its cluster errors (e.g. 912,
// `CUDA_ERROR_INVALID_CLUSTER_SIZE`) are newer than cust's `CUresult` enum.
unsafe extern "C" {
    /// The extensible launch, here with the programmatic-overlap and cluster attributes.
    fn cuLaunchKernelEx(
        config: *const LaunchConfig<'_>,
        function: sys::CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> c_int;
}

/// A launch attribute whose value starts with `values` (an int, or a cluster's x, y and z).
pub(crate) fn launch_attribute(id: u32, values: &[u32]) -> LaunchAttribute {
    let mut value = [0; 16];
    value[..values.len()].copy_from_slice(values);
    LaunchAttribute {
        id,
        pad: [0; 4],
        value,
    }
}

/// Blocks of `function` resident per multiprocessor at this block size and dynamic shared
/// memory.
pub(crate) fn blocks_per_sm(
    function: sys::CUfunction,
    threads: u32,
    shared_bytes: u32,
) -> Result<u32> {
    let mut blocks = 0;
    // SAFETY: valid function handle and out-pointer.
    let status = unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut blocks,
            function,
            threads as i32,
            shared_bytes as usize,
        )
    };
    check(status, "querying occupancy")?;
    Ok(blocks.max(0) as u32)
}

/// Clusters of `cluster` blocks of `function` (with this block size and dynamic shared
/// memory) that can be active on the device at once; 0 when not even one can be scheduled
/// (`cuOccupancyMaxActiveClusters`).
pub(crate) fn active_clusters(
    function: sys::CUfunction,
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
    let status = unsafe { cuOccupancyMaxActiveClusters(&mut clusters, function, &config) };
    check_code(status, "querying cluster occupancy")?;
    Ok(clusters.max(0) as u32)
}

/// `cuFuncSetAttribute` on `function`, with the attribute as the driver's plain int.
pub(crate) fn set_attribute(
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
pub(crate) const FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: c_int = 14;

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
