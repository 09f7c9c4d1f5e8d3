//! Device memory some launches use besides the caller's buffers, grown on demand.

use bytemuck::Zeroable;
use cust::memory::{DeviceBuffer, DeviceCopy};

use crate::error::{CudaContext, Result};
use crate::launch::WorkspaceAddresses;
use crate::plan::WorkspaceNeeds;

/// Most blocks of one kernel a multiprocessor can hold (Hopper: 32): the initial workspace
/// covers any sliced launch that keeps its blocks resident, as the plans do; launches that
/// need more grow it.
const MAX_RESIDENT_BLOCKS_PER_SM: usize = 32;

#[derive(Debug)]
pub(crate) struct Workspace {
    /// The unfused variant's row maxima then row sums (`2 · rows`).
    row_stats: DeviceBuffer<f32>,
    /// Two floats per block of a launch whose blocks exchange statistics.
    partials: DeviceBuffer<f32>,
    /// Two words per row of a sliced launch, then row-slices' flags of blocks that left (one
    /// per block), zeroed when allocated; a finished launch leaves them at rest (zero) again.
    barriers: DeviceBuffer<u32>,
    /// Per-row, per-slice states (two floats each) of operations on rows too wide for one
    /// launch.
    states: DeviceBuffer<f32>,
}

impl Workspace {
    /// Workspace for any sliced launch whose blocks are resident on `multiprocessors`.
    pub fn new(multiprocessors: u32) -> Result<Self> {
        let resident = multiprocessors as usize * MAX_RESIDENT_BLOCKS_PER_SM;
        Ok(Workspace {
            row_stats: zeroed(2)?,
            partials: zeroed(2 * resident)?,
            barriers: zeroed(3 * resident)?,
            states: zeroed(2)?,
        })
    }

    /// Whether `needs` fits what is allocated.
    pub fn fits(&self, needs: WorkspaceNeeds) -> bool {
        self.row_stats.len() >= needs.row_stats
            && self.partials.len() >= needs.partials
            && self.barriers.len() >= needs.barrier_words
            && self.states.len() >= 2 * needs.states
    }

    /// Replaces every buffer shorter than `needs` asks; the caller waits first for the work
    /// that may use them.
    pub fn grow(&mut self, needs: WorkspaceNeeds) -> Result<()> {
        grow(&mut self.row_stats, needs.row_stats)?;
        grow(&mut self.partials, needs.partials)?;
        grow(&mut self.barriers, needs.barrier_words)?;
        grow(&mut self.states, 2 * needs.states)
    }

    pub fn addresses(&self) -> WorkspaceAddresses {
        WorkspaceAddresses {
            row_stats: self.row_stats.as_device_ptr().as_raw(),
            partials: self.partials.as_device_ptr().as_raw(),
            barriers: self.barriers.as_device_ptr().as_raw(),
            states: self.states.as_device_ptr().as_raw(),
        }
    }
}

fn zeroed<T: DeviceCopy + Zeroable>(len: usize) -> Result<DeviceBuffer<T>> {
    DeviceBuffer::zeroed(len).during("allocating workspace")
}

/// Replaces `buffer` by a zeroed one of `len` elements when it is shorter.
fn grow<T: DeviceCopy + Zeroable>(buffer: &mut DeviceBuffer<T>, len: usize) -> Result<()> {
    if buffer.len() < len {
        *buffer = zeroed(len)?;
    }
    Ok(())
}
