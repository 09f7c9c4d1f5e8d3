//! Device memory some launches use besides the caller's buffers, grown on demand.

use cust::context::CurrentContext;
use cust::memory::{DeviceBuffer, DeviceCopy};
use cust::sys;

use crate::device::check;
use crate::error::{CudaContext, Result};
use crate::launch::WorkspaceAddresses;
use crate::plan::WorkspaceNeeds;

/// Most blocks of one kernel a multiprocessor can hold (Hopper: 32): the initial workspace
/// covers any sliced launch that keeps its blocks resident, as the plans do; launches that
/// need more grow it.
const MAX_RESIDENT_BLOCKS_PER_SM: usize = 32;

/// The workspace's buffers, every element four bytes (floats or barrier words).
#[derive(Debug)]
pub(crate) struct Workspace {
    /// The unfused variant's row maxima then row sums (`2 · rows`).
    row_stats: DeviceBuffer<u32>,
    /// Two floats per block of a launch whose blocks exchange statistics.
    partials: DeviceBuffer<u32>,
    /// Two words per row of a sliced launch, then row-slices' flags of blocks that left (one
    /// per block), zeroed when allocated; a finished launch leaves them at rest (zero) again.
    barriers: DeviceBuffer<u32>,
    /// Per-row, per-slice states (two floats each) of operations on rows too wide for one
    /// launch.
    states: DeviceBuffer<u32>,
    /// Buffers a growth replaced. They live as long as the instance: work already enqueued,
    /// and graphs captured before the growth, still use them.
    retired: Vec<DeviceBuffer<u32>>,
}

impl Workspace {
    /// Workspace for any sliced launch whose blocks are resident on `multiprocessors`, zeroed
    /// before this returns (so that work on any stream sees it at rest).
    pub fn new(multiprocessors: u32) -> Result<Self> {
        let resident = multiprocessors as usize * MAX_RESIDENT_BLOCKS_PER_SM;
        let zeroed = |len| DeviceBuffer::zeroed(len).during("allocating workspace");
        let workspace = Workspace {
            row_stats: zeroed(2)?,
            partials: zeroed(2 * resident)?,
            barriers: zeroed(3 * resident)?,
            states: zeroed(2)?,
            retired: Vec::new(),
        };
        // `zeroed` enqueues its memset on the legacy default stream, which non-blocking
        // streams (the caller's) are not ordered after.
        CurrentContext::synchronize().during("zeroing the workspace")?;
        Ok(workspace)
    }

    /// Whether `needs` fits what is allocated.
    pub fn fits(&self, needs: WorkspaceNeeds) -> bool {
        self.row_stats.len() >= needs.row_stats
            && self.partials.len() >= needs.partials
            && self.barriers.len() >= needs.barrier_words
            && self.states.len() >= 2 * needs.states
    }

    /// Replaces every buffer shorter than `needs` asks by one zeroed on `stream`, where the
    /// work that uses it next is enqueued; the replaced buffers are kept (see `retired`), so
    /// nothing waits.
    pub fn grow(&mut self, needs: WorkspaceNeeds, stream: sys::CUstream) -> Result<()> {
        let wanted = [
            needs.row_stats,
            needs.partials,
            needs.barrier_words,
            2 * needs.states,
        ];
        let buffers = [
            &mut self.row_stats,
            &mut self.partials,
            &mut self.barriers,
            &mut self.states,
        ];
        for (buffer, len) in buffers.into_iter().zip(wanted) {
            if buffer.len() < len {
                let grown = zeroed_on(len, stream)?;
                self.retired.push(std::mem::replace(buffer, grown));
            }
        }
        Ok(())
    }

    pub fn addresses(&self) -> WorkspaceAddresses {
        let address = |b: &DeviceBuffer<u32>| b.as_device_ptr().as_raw();
        WorkspaceAddresses {
            row_stats: address(&self.row_stats),
            partials: address(&self.partials),
            barriers: address(&self.barriers),
            states: address(&self.states),
        }
    }
}

/// A buffer of `len` words, zeroed by a memset enqueued on `stream`.
fn zeroed_on<T: DeviceCopy>(len: usize, stream: sys::CUstream) -> Result<DeviceBuffer<T>> {
    // SAFETY: the words are zeroed on `stream` before any work enqueued there after this
    // reads them, and every launch that uses the workspace is enqueued on the stream its
    // call targets (ordered after this call's).
    let buffer =
        unsafe { DeviceBuffer::<T>::uninitialized(len) }.during("growing the workspace")?;
    let words = len * size_of::<T>() / 4;
    // SAFETY: the memset writes `words` words inside the buffer just allocated.
    let status =
        unsafe { sys::cuMemsetD32Async(buffer.as_device_ptr().as_raw(), 0, words, stream) };
    check(status, "zeroing the workspace")?;
    Ok(buffer)
}
