//! Device memory some launches use besides the caller's buffers (barrier words, published
//! partials, row states), grown on demand: one workspace per stream that calls use, so that
//! calls on different streams never share one, and ordering through events wherever one
//! workspace serves several streams (more streams than workspaces, or graphs).
//!
//! - A stream's first workspace-using call gives it a workspace of its own (up to
//!   [`MAX_LANES`]). Its later calls are ordered by the stream itself: no event, no wait.
//! - Past [`MAX_LANES`] streams, a new stream shares an existing workspace. The first time a
//!   workspace is shared, the device is synchronized once (its earlier uses may sit on a
//!   stream that no longer exists); from then on every use of it waits for the previous one
//!   through an event and records its own.
//! - Calls captured into a graph use one workspace of their own, made by
//!   [`Workspaces::reserve`], never used by direct calls. The first use in a capture waits for
//!   the last use of earlier graphs (an external event wait node), every use records its own
//!   (an external event record node), so replays on any stream are ordered with each other;
//!   and each later use in the same capture waits for the one before it through an event
//!   recorded inside the capture, so calls captured on parallel branches (streams forked into
//!   one capture) are ordered in the graph too.
//!
//! Streams are told apart by the driver's stream id, unique for the life of the process, so a
//! stream handle reused after its stream was destroyed is a new stream here.

use std::collections::HashMap;

use cust::memory::{DeviceBuffer, DeviceCopy};
use cust::sys;

use kernels_gpu::launch::BARRIER_HEADER_WORDS;

use super::driver;
use super::launch::WorkspaceAddresses;
use crate::error::{CudaContext, Error, Result};
use crate::plan::WorkspaceNeeds;

/// Most blocks of one kernel a multiprocessor can hold (Hopper: 32): a new workspace covers
/// any sliced launch that keeps its blocks resident, as the plans do; launches that need more
/// grow it.
const MAX_RESIDENT_BLOCKS_PER_SM: usize = 32;

/// Workspaces for direct calls; a stream beyond this many shares one.
const MAX_LANES: usize = 8;

/// Streams remembered; past this many the map starts over (streams then share workspaces,
/// which stays correct: see the module comment).
const MAX_STREAMS_REMEMBERED: usize = 1024;

/// One workspace's buffers, every element four bytes (floats or barrier words).
#[derive(Debug)]
struct Workspace {
    /// The unfused variant's row maxima then row sums (`2 · rows`).
    row_stats: DeviceBuffer<u32>,
    /// Two floats per block of a launch whose blocks exchange statistics.
    partials: DeviceBuffer<u32>,
    /// A header whose first word counts the row-slices blocks that left their slices, then
    /// two words per row of a sliced launch, then row-slices' flags of blocks that left (one per block), zeroed when
    /// allocated; a finished launch leaves the words and flags at rest (zero) again.
    barriers: DeviceBuffer<u32>,
    /// Per-row, per-slice states (two floats each) of operations on rows too wide for one
    /// launch.
    states: DeviceBuffer<u32>,
    /// Buffers a growth replaced. They live as long as the instance: work already enqueued,
    /// and graphs captured before the growth, still use them.
    retired: Vec<DeviceBuffer<u32>>,
}

/// The words each buffer of a workspace for `needs` holds, in the order of [`Workspace`].
fn words(needs: WorkspaceNeeds) -> [usize; 4] {
    [
        needs.row_stats.max(2),
        needs.partials.max(2),
        needs.barrier_words + BARRIER_HEADER_WORDS,
        (2 * needs.states).max(2),
    ]
}

impl Workspace {
    /// A workspace for `needs`, zeroed by memsets enqueued on `stream`.
    fn new(needs: WorkspaceNeeds, stream: sys::CUstream) -> Result<Self> {
        let [row_stats, partials, barriers, states] = words(needs);
        Ok(Workspace {
            row_stats: zeroed_on(row_stats, stream)?,
            partials: zeroed_on(partials, stream)?,
            barriers: zeroed_on(barriers, stream)?,
            states: zeroed_on(states, stream)?,
            retired: Vec::new(),
        })
    }

    fn fits(&self, needs: WorkspaceNeeds) -> bool {
        let lens = [
            self.row_stats.len(),
            self.partials.len(),
            self.barriers.len(),
            self.states.len(),
        ];
        lens.iter()
            .zip(words(needs))
            .all(|(&len, wanted)| len >= wanted)
    }

    /// Replaces every buffer shorter than `needs` asks by one zeroed on `stream`, where the
    /// work that uses it next is enqueued; the replaced buffers are kept (see `retired`), so
    /// nothing waits.
    fn grow(&mut self, needs: WorkspaceNeeds, stream: sys::CUstream) -> Result<()> {
        let buffers = [
            &mut self.row_stats,
            &mut self.partials,
            &mut self.barriers,
            &mut self.states,
        ];
        for (buffer, len) in buffers.into_iter().zip(words(needs)) {
            if buffer.len() < len {
                let grown = zeroed_on(len, stream)?;
                self.retired.push(std::mem::replace(buffer, grown));
            }
        }
        Ok(())
    }

    fn addresses(&self) -> WorkspaceAddresses {
        let address = |b: &DeviceBuffer<u32>| b.as_device_ptr().as_raw();
        WorkspaceAddresses {
            row_stats: address(&self.row_stats),
            partials: address(&self.partials),
            // The header (the count of blocks that left) comes first: launches see the words
            // after it.
            barriers: address(&self.barriers) + 4 * BARRIER_HEADER_WORDS as u64,
            states: address(&self.states),
        }
    }
}

/// A workspace and, once it serves several streams (or graphs), the event that orders its
/// uses.
#[derive(Debug)]
struct Lane {
    workspace: Workspace,
    order: Option<driver::OrderEvent>,
}

/// How a use of a lane ends: nothing to record, an event to record, or (in a graph being
/// captured) the capture's own event and an external event record node.
#[derive(Clone, Copy, Debug)]
enum Record {
    Nothing,
    Event(sys::CUevent),
    Captured {
        inside: sys::CUevent,
        external: sys::CUevent,
    },
}

/// The workspace of captured calls: its lane (whose event orders graphs against each other,
/// through external nodes), the event that orders its uses inside one capture, and which
/// capture recorded that last.
#[derive(Debug)]
struct GraphLane {
    lane: Lane,
    inside: driver::OrderEvent,
    capture: Option<u64>,
}

/// A workspace acquired for one call: its addresses, and what to do once the call's launches
/// are enqueued ([`Workspaces::release`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Acquired {
    pub addresses: WorkspaceAddresses,
    record: Record,
}

/// Every workspace of one instance.
#[derive(Debug)]
pub(crate) struct Workspaces {
    lanes: Vec<Lane>,
    /// The workspace of calls being captured into graphs, made by [`Workspaces::reserve`].
    captured: Option<GraphLane>,
    /// Which lane each stream (by the driver's stream id) uses.
    by_stream: HashMap<u64, usize>,
    /// What every new workspace holds at least: the resident blocks, and what `reserve` asked.
    minimum: WorkspaceNeeds,
    /// The instance's own stream and its id, which lane 0 serves.
    home: (sys::CUstream, u64),
    /// The lane the next stream past [`MAX_LANES`] shares.
    next_shared: usize,
}

impl Workspaces {
    /// Workspaces of an instance whose own stream is `stream`, with one for that stream zeroed
    /// before this returns (so that work on any stream sees it at rest).
    pub fn new(multiprocessors: u32, stream: sys::CUstream) -> Result<Self> {
        let resident = multiprocessors as usize * MAX_RESIDENT_BLOCKS_PER_SM;
        let minimum = WorkspaceNeeds {
            partials: 2 * resident,
            barrier_words: 3 * resident,
            ..WorkspaceNeeds::default()
        };
        let workspace = Workspace::new(minimum, stream)?;
        driver::synchronize_stream(stream)?;
        let id = driver::stream_id(stream)?;
        Ok(Workspaces {
            lanes: vec![Lane {
                workspace,
                order: None,
            }],
            captured: None,
            by_stream: HashMap::from([(id, 0)]),
            minimum,
            home: (stream, id),
            next_shared: 0,
        })
    }

    /// Sizes every workspace, the graphs' included (made here if there is none yet), for
    /// `needs`, zeroing what grows on `stream`, and makes `needs` the least every later
    /// workspace starts with. The caller waits for `stream` before any call uses them.
    pub fn reserve(&mut self, needs: WorkspaceNeeds, stream: sys::CUstream) -> Result<()> {
        self.minimum = self.minimum.max(needs);
        let minimum = self.minimum;
        if self.captured.is_none() {
            self.captured = Some(GraphLane {
                lane: Lane {
                    workspace: Workspace::new(minimum, stream)?,
                    order: Some(driver::OrderEvent::new()?),
                },
                inside: driver::OrderEvent::new()?,
                capture: None,
            });
        }
        let graph = self.captured.as_mut().map(|g| &mut g.lane);
        for lane in self.lanes.iter_mut().chain(graph) {
            if !lane.workspace.fits(minimum) {
                lane.workspace.grow(minimum, stream)?;
            }
        }
        Ok(())
    }

    /// The workspace a call on `stream` that needs `needs` uses, grown where needed (zeroed on
    /// `stream`) and ordered after its previous use on any other stream. While `stream` is
    /// being captured, the graphs' workspace, which must already fit (else
    /// [`Error::NotReserved`]). Follow with [`Workspaces::release`] once the launches are
    /// enqueued.
    pub fn acquire(&mut self, stream: sys::CUstream, needs: WorkspaceNeeds) -> Result<Acquired> {
        if let Some(capture) = driver::capture_id(stream)? {
            let Some(graph) = self
                .captured
                .as_mut()
                .filter(|g| g.lane.workspace.fits(needs))
            else {
                return Err(Error::NotReserved {
                    what: "use a workspace the call was not reserved for",
                });
            };
            let external = graph
                .lane
                .order
                .as_ref()
                .expect("the graphs' lane is ordered")
                .0;
            if graph.capture == Some(capture) {
                // An edge inside the graph from this capture's previous use.
                driver::wait(
                    stream,
                    graph.inside.0,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )?;
            } else {
                driver::wait(
                    stream,
                    external,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL,
                )?;
            }
            graph.capture = Some(capture);
            return Ok(Acquired {
                addresses: graph.lane.workspace.addresses(),
                record: Record::Captured {
                    inside: graph.inside.0,
                    external,
                },
            });
        }
        let id = if stream == self.home.0 {
            self.home.1
        } else {
            driver::stream_id(stream)?
        };
        let index = match self.by_stream.get(&id) {
            Some(&index) => index,
            None => self.assign(id, stream, needs)?,
        };
        let lane = &mut self.lanes[index];
        let record = match &lane.order {
            Some(event) => {
                driver::wait(
                    stream,
                    event.0,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )?;
                Record::Event(event.0)
            }
            None => Record::Nothing,
        };
        if !lane.workspace.fits(needs) {
            lane.workspace.grow(needs, stream)?;
        }
        Ok(Acquired {
            addresses: lane.workspace.addresses(),
            record,
        })
    }

    /// Ends a use begun by [`Workspaces::acquire`] on the same `stream`: records its event (or
    /// adds the graph's record node) after the launches. If recording fails, waits for the
    /// stream, so that the next use is ordered all the same, and reports the failure.
    pub fn release(&mut self, acquired: Acquired, stream: sys::CUstream) -> Result<()> {
        let recorded = match acquired.record {
            Record::Nothing => return Ok(()),
            Record::Event(event) => driver::record(event, stream),
            Record::Captured { inside, external } => driver::record(inside, stream)
                .and_then(|()| driver::record_external(external, stream)),
        };
        if recorded.is_err() && matches!(acquired.record, Record::Event(_)) {
            let _ = driver::synchronize_stream(stream);
        }
        recorded
    }

    /// Gives the stream `id` a lane: a new one while there are fewer than [`MAX_LANES`], else
    /// one shared with other streams, ordered from now on.
    fn assign(&mut self, id: u64, stream: sys::CUstream, needs: WorkspaceNeeds) -> Result<usize> {
        if self.by_stream.len() >= MAX_STREAMS_REMEMBERED {
            self.by_stream.clear();
            self.by_stream.insert(self.home.1, 0);
        }
        let index = if self.lanes.len() < MAX_LANES {
            let workspace = Workspace::new(self.minimum.max(needs), stream)?;
            self.lanes.push(Lane {
                workspace,
                order: None,
            });
            self.lanes.len() - 1
        } else {
            let index = self.next_shared % self.lanes.len();
            self.next_shared += 1;
            let lane = &mut self.lanes[index];
            if lane.order.is_none() {
                // Its earlier uses are ordered by a stream that may be gone: wait for them
                // once; every later use records the event the next one waits for.
                cust::context::CurrentContext::synchronize()
                    .during("sharing a workspace between streams")?;
                lane.order = Some(driver::OrderEvent::new()?);
            }
            index
        };
        self.by_stream.insert(id, index);
        Ok(index)
    }

    /// How many row-slices blocks have left their slices in launches on these workspaces
    /// (those not replaced by a growth), once the device is idle (the caller synchronizes).
    pub fn blocks_that_left(&self) -> Result<u64> {
        let mut total = 0;
        let graph = self.captured.as_ref().map(|g| &g.lane);
        for lane in self.lanes.iter().chain(graph) {
            let mut count = [0u32];
            let counter = lane.workspace.barriers.index(..1);
            cust::memory::CopyDestination::copy_to(&counter, &mut count[..])
                .during("reading the count of blocks that left")?;
            total += u64::from(count[0]);
        }
        Ok(total)
    }
}

/// A buffer of `len` words, zeroed by a memset enqueued on `stream`.
fn zeroed_on<T: DeviceCopy>(len: usize, stream: sys::CUstream) -> Result<DeviceBuffer<T>> {
    // SAFETY: the words are zeroed on `stream` before any work enqueued there after this
    // reads them, and work on other streams that uses them is ordered after this stream's
    // (the module comment).
    let buffer =
        unsafe { DeviceBuffer::<T>::uninitialized(len) }.during("growing the workspace")?;
    let words = len * size_of::<T>() / 4;
    // SAFETY: the memset writes `words` words inside the buffer just allocated.
    unsafe { driver::zero_words(buffer.as_device_ptr().as_raw(), words, stream) }?;
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_buffer_holds_what_the_needs_ask_and_the_leaver_count() {
        let needs = WorkspaceNeeds {
            row_stats: 10,
            partials: 20,
            barrier_words: 30,
            states: 4,
        };
        let header = BARRIER_HEADER_WORDS;
        assert_eq!(words(needs), [10, 20, 30 + header, 8]);
        assert_eq!(words(WorkspaceNeeds::default()), [2, 2, header, 2]);
    }
}
