//! The one planner: what a call computes ([`Request`]) on which shape and [`Layout`] → the
//! launches that compute it. Pure: it needs only the device's limits ([`DeviceLimits`]), so the
//! CPU tests check every plan against a model H200.
//!
//! A [`Launch`] names its kernel with a typed [`Entry`] and carries its arguments as typed
//! [`Params`]; the launch path (`crate::runtime::launch`) fills the entry's one parameter
//! struct from them (`SoftmaxParams` or `RowOpParams`).

pub(crate) mod cross_entropy;
pub(crate) mod operations;
pub(crate) mod sampling;
pub(crate) mod variants;

use kernels_gpu::launch::cross_entropy::CrossEntropyEntry;
use kernels_gpu::launch::ops::{DType, Direction, OpInstance, OpKernelShape};
use kernels_gpu::launch::sampling::{SLICE_TOP_WORDS, SamplingEntry, ShardDraw};

/// Floats of a [`ShardDraw`] in the workspace.
const SHARD_DRAW_FLOATS: usize = size_of::<ShardDraw>() / 4;
use kernels_gpu::launch::softmax::{
    BlockRegisterInstance, RegisterKernelName, RowClusterKernelName, RowSlicesKernelName,
    seed_entries,
};
use kernels_gpu::launch::{
    CLUSTER_STATS_FLOATS, MAX_CLUSTER_BLOCKS, REDUCTION_SCRATCH_FLOATS, pushed_cluster_floats,
};

use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::variant::Variant;

/// How the buffers of a call meet 16-byte packs (one type for every kernel family).
pub(crate) use kernels_gpu::launch::ops::PackLayout as Layout;

/// Smallest 16-bit tensor whose plain softmax takes row-slices where the operation kernels
/// would slice its rows: below it the operation kernels were faster, above it row-slices, and
/// the cut lies between the shapes measured, not measured closer (performance log: "The
/// 16-bit row-slices cut at 4 MiB").
const SIXTEEN_BIT_ROW_SLICES_FROM_BYTES: u64 = 4 << 20;

/// Most blocks a grid holds along x.
pub(crate) const MAX_GRID: u32 = i32::MAX as u32;

/// What a call computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Request {
    /// f32 softmax of contiguous rows by one variant (`Auto`: the built-in dispatch;
    /// `BlockPerRowAutotuned` must be resolved to a thread count first).
    Variant(Variant),
    /// Softmax without options of contiguous rows of one 16-bit type, same type in and out:
    /// row-slices where the operation kernels would slice the rows of a large tensor and
    /// row-slices caches its slices (in one wave, or in waves of rows), else the operation
    /// kernels; where the operation kernels' clusters in waves take the rows, those instead,
    /// unless row-slices reads the tensor once in one wave, keeps a whole row a block in a
    /// few waves, or runs its rows in waves of rows in fewer waves than the clusters.
    /// `peelable`: input and output are misaligned alike modulo 16 bytes.
    PlainSoftmax { dtype: DType, peelable: bool },
    /// The operation kernels.
    Operation {
        direction: Direction,
        input: DType,
        mode: OperationMode,
    },
    /// Cross-entropy of logits of `input`: with the prologue (`totals`: the mean's divisor,
    /// the class weights' sum) and the epilogue (`reduce`: the reduced loss) where the call
    /// needs them; `block_entries`: the call can take the block entries (no label smoothing,
    /// no softcap, the whole vocabulary).
    CrossEntropy {
        input: DType,
        totals: bool,
        reduce: bool,
        block_entries: bool,
    },
    /// Sampling from logits of `input`, with the epilogue that advances the random offset
    /// where `advance`; `work`: what its rows need of the kernels.
    Sampling {
        input: DType,
        advance: bool,
        work: SamplingWork,
    },
}

/// What a sampling call's rows need of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SamplingWork {
    /// Top-k, top-p or min-p, or the filtered distribution written: the row kernel with every
    /// filter, a block a row.
    Filtered,
    /// Greedy or temperature alone, a vocabulary shard's draw: the draw kernel, a block a row.
    Drawn,
    /// Greedy or temperature alone over the whole vocabulary: the draw kernel, the rows cut
    /// into slices that draw apart where they are too few to fill the device.
    Sliceable,
    /// One top-k of at most `TOP_K_CANDIDATES` for every row, over the whole vocabulary,
    /// nothing written per column (top-p and min-p may follow): the candidate path where the
    /// rows are narrow enough and at most one a multiprocessor, else as `Filtered`.
    TopK,
}

impl SamplingWork {
    /// Every kind, each list of requests written once.
    pub(crate) const ALL: [SamplingWork; 4] =
        [Self::Filtered, Self::Drawn, Self::Sliceable, Self::TopK];
}

/// What an operation call stores: the outputs, only the rows' states, or the outputs
/// normalized by states the caller stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum OperationMode {
    Full,
    States,
    ApplyStates,
}

/// A kernel entry of one of the PTX modules, typed. Its `Display` is the PTX entry name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Entry {
    UnfusedRowMax,
    UnfusedSubtract,
    UnfusedExp,
    UnfusedRowSum,
    UnfusedDivide,
    ThreadPerRowNaive,
    ThreadPerRowOnline,
    WarpPerRowOnline,
    BlockPerRowSmem,
    RowsInRegisters(RegisterKernelName),
    BlockRegisters(BlockRegisterInstance),
    RowSlices(RowSlicesKernelName),
    RowCluster { pack: u32 },
    Operation(OpInstance),
    CrossEntropy(CrossEntropyEntry),
    Sampling(SamplingEntry),
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::UnfusedRowMax => f.write_str(seed_entries::UNFUSED_ROW_MAX),
            Entry::UnfusedSubtract => f.write_str(seed_entries::UNFUSED_SUBTRACT),
            Entry::UnfusedExp => f.write_str(seed_entries::UNFUSED_EXP),
            Entry::UnfusedRowSum => f.write_str(seed_entries::UNFUSED_ROW_SUM),
            Entry::UnfusedDivide => f.write_str(seed_entries::UNFUSED_DIVIDE),
            Entry::ThreadPerRowNaive => f.write_str(seed_entries::THREAD_PER_ROW_NAIVE),
            Entry::ThreadPerRowOnline => f.write_str(seed_entries::THREAD_PER_ROW_ONLINE),
            Entry::WarpPerRowOnline => f.write_str(seed_entries::WARP_PER_ROW_ONLINE),
            Entry::BlockPerRowSmem => f.write_str(seed_entries::BLOCK_PER_ROW_SMEM),
            Entry::RowsInRegisters(name) => name.fmt(f),
            Entry::BlockRegisters(name) => name.fmt(f),
            Entry::RowSlices(name) => name.fmt(f),
            Entry::RowCluster { pack } => RowClusterKernelName { pack: *pack }.fmt(f),
            Entry::Operation(name) => name.fmt(f),
            Entry::CrossEntropy(name) => name.fmt(f),
            Entry::Sampling(name) => name.fmt(f),
        }
    }
}

/// How many blocks share a row, and how many packs each holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slicing {
    pub slices: u32,
    pub slice_packs: u32,
}

/// How a launch that runs its rows in waves starts its first wave: row `r < rows` waits
/// `r · ns` nanoseconds before it reads (`kernels_gpu`'s `stagger_first_wave`), so that the
/// first wave's rows do not all reach their reads, exchanges and writes at once.
/// [`Stagger::NONE`]: every row starts at once. Planned for row slices in waves (see
/// [`waves_stagger`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stagger {
    pub rows: u32,
    pub ns: u32,
}

impl Stagger {
    pub const NONE: Self = Stagger { rows: 0, ns: 0 };
}

/// Which pass of an operation a launch is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OperationPass {
    /// What the call asked for (its own mode and buffers).
    Call,
    /// The first of two launches over slices: each block stores its slice's state in the
    /// workspace.
    SliceStatesToWorkspace,
    /// The second: every block merges its row's states from the workspace and writes.
    ApplyWorkspaceStates,
}

/// A launch's arguments, typed by kernel family. Buffers (the call's and the workspace's) are
/// filled in at launch time, when `crate::launch` makes the entry's one parameter struct:
/// `SoftmaxParams` for every family but the operation kernels, which take `RowOpParams`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Params {
    /// One thread, warp or group of lanes per row.
    Rows { rows: u32, cols: u32 },
    /// A block per row.
    BlockPerRow { cols: u32 },
    /// The unfused stages (each reads the fields its kernel needs).
    Unfused { rows: u32, cols: u32, len: u64 },
    /// Block registers: the partials and barriers are the workspace's.
    BlockRegisters { cols: u32, slicing: Slicing },
    /// Row slices: the partials, barriers and patience are the workspace's and the call's.
    RowSlices {
        cols: u32,
        slicing: Slicing,
        cached: bool,
        stagger: Stagger,
    },
    /// Row clusters.
    RowCluster {
        cols: u32,
        slicing: Slicing,
        cached: bool,
    },
    /// One `RowOpParams` by value: the call's, with this pass and slicing.
    Operation {
        pass: OperationPass,
        slicing: Slicing,
    },
    /// One `CrossEntropyParams` by value: the call's, its rows cut into `slices` blocks (a
    /// cluster each, above 1, or for the block entries the slices of one cooperative launch,
    /// `slice_packs` packs each), their packs kept in shared memory or not; the per-row
    /// losses and the totals go to the workspace where the call keeps none.
    CrossEntropy {
        rows: u32,
        slices: u32,
        slice_packs: u32,
        cached: bool,
        aligned: bool,
        /// A row's blocks exchange their statistics through the workspace (the partials, the
        /// barrier words and the patience): the row-slices entries' slices and the block
        /// entries' slices of one cooperative launch; clusters exchange through shared
        /// memory, whole rows not at all.
        exchange: bool,
        /// The losses go to the workspace (a reduced loss) and, with `totals`, the totals the
        /// prologue writes follow them.
        workspace: bool,
        totals: bool,
        /// How the row-slices entries start their first wave.
        stagger: Stagger,
    },
    /// One `SamplingParams` by value: the call's, its rows kept in shared memory or not, cut
    /// into `slices` of `slice_cols` columns (their draws in the workspace) where `slices` is
    /// above 1.
    Sampling {
        cached: bool,
        aligned: bool,
        slices: u32,
        slice_cols: u32,
        rows: u32,
        /// The candidate path (a small top-k): its slices' states and ranks in the workspace.
        candidates: bool,
        /// The launch also advances the random offset (the merge of sliced draws, when it is
        /// the call's last launch).
        advances: bool,
    },
}

/// How the blocks of a launch are scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scheduling {
    /// `cuLaunchKernelEx` with programmatic overlap allowed (every entry waits for the
    /// previous grid first).
    Ordinary,
    /// `cuLaunchCooperativeKernel`: every block resident at once (the blocks of a row wait
    /// for each other).
    Cooperative,
    /// Thread-block clusters of this many blocks, with programmatic overlap allowed.
    Clusters(u32),
}

impl Scheduling {
    /// The scheduling of a launch whose rows are cut into `slices` blocks that exchange their
    /// statistics: ordinary for whole rows, else one cluster per row or a cooperative launch.
    pub(crate) fn exchanging(slices: u32, clustered: bool) -> Scheduling {
        match (slices > 1, clustered) {
            (true, true) => Scheduling::Clusters(slices),
            (true, false) => Scheduling::Cooperative,
            (false, _) => Scheduling::Ordinary,
        }
    }
}

/// Dynamic shared memory of a block whose sliced row is one thread-block cluster and which
/// publishes its statistics (block registers and cross-entropy's block entries; the operation
/// kernels push instead, [`cluster_shared_bytes`]): the reduction scratch, then the statistics
/// it publishes to the cluster.
pub(crate) const CLUSTER_SHARED_BYTES: u32 = (REDUCTION_SCRATCH_FLOATS + CLUSTER_STATS_FLOATS) * 4;

/// Dynamic shared memory of a block of `entry` (`threads` threads) whose row is a cluster of
/// `slices` blocks: the operation kernels' own blocks (not cross-entropy's) take the reduction
/// scratch and the slots every warp of the cluster pushes its statistics into
/// ([`pushed_cluster_floats`]); the others [`CLUSTER_SHARED_BYTES`].
pub(crate) fn cluster_shared_bytes(entry: Entry, threads: u32, slices: u32) -> u32 {
    match entry {
        Entry::Operation(k) if k.direction != Direction::CrossEntropy => {
            (REDUCTION_SCRATCH_FLOATS + pushed_cluster_floats(threads, slices)) * 4
        }
        _ => CLUSTER_SHARED_BYTES,
    }
}

/// Dynamic shared memory of a block-registers or operation block outside clusters: the
/// reduction scratch (in clusters, [`cluster_shared_bytes`]).
pub(crate) const BLOCK_SHARED_BYTES: u32 = REDUCTION_SCRATCH_FLOATS * 4;

/// Whether a cooperative slicing of `slices` blocks of `entry` (`threads` each) per row runs
/// as one thread-block cluster per row instead: the same blocks, exchanging their statistics
/// through distributed shared memory at the cluster's hardware barrier rather than through
/// global memory. Needs the sm_90 build, at most [`MAX_CLUSTER_BLOCKS`] slices, and a cluster
/// the driver can schedule. Clusters gained on the H200 where the cooperative rule itself
/// made at most 16 slices, on one row (for block registers' rows,
/// [`cooperative_slices_form_clusters`] narrows that); a row cut into 16 slices for
/// a cluster where the cooperative launch would take more lost up to half its speed (fewer
/// multiprocessors reading it), so only the cooperative rule's own slicing is ever clustered
/// (performance log: "One cluster per sliced row").
pub(crate) fn slices_form_clusters(
    device: &dyn DeviceLimits,
    entry: Entry,
    threads: u32,
    slices: u32,
) -> bool {
    (2..=MAX_CLUSTER_BLOCKS).contains(&slices)
        && device.thread_block_clusters()
        && device.active_clusters(
            entry,
            threads,
            cluster_shared_bytes(entry, threads, slices),
            slices,
        ) > 0
}

/// Clusters above this many blocks (the portable size; Hopper takes up to
/// [`MAX_CLUSTER_BLOCKS`]) hold a cooperative slicing only where its launch has at most one
/// block a multiprocessor ([`cooperative_slices_form_clusters`]).
pub(crate) const PORTABLE_CLUSTER_BLOCKS: u32 = 8;

/// [`slices_form_clusters`] for a cooperative slicing of `rows` rows: clusters of more than
/// [`PORTABLE_CLUSTER_BLOCKS`] blocks only where the launch (`rows · slices` blocks) has at
/// most one block a multiprocessor. On 16 rows of 32000–128256 bf16 columns, 13 and 16 slices
/// a row exchanging through global memory took 0.7–1.2 µs less than the same blocks in
/// clusters; on 1–4 rows the two were within 0.2 µs (performance log: "Few forward rows:
/// block sizes and large clusters"). Block registers, which publish their statistics in a
/// cluster, keep this rule; the operation kernels push theirs and cluster at any count of
/// blocks (performance log: "Pushed clusters of up to 16 on many blocks").
pub(crate) fn cooperative_slices_form_clusters(
    device: &dyn DeviceLimits,
    entry: Entry,
    threads: u32,
    rows: u32,
    slices: u32,
) -> bool {
    let large = slices > PORTABLE_CLUSTER_BLOCKS
        && u64::from(rows) * u64::from(slices) > u64::from(device.multiprocessors());
    !large && slices_form_clusters(device, entry, threads, slices)
}

/// Threads of the blocks that slice rows into clusters run in waves
/// ([`clusters_in_waves`]): the block size QuACK gives such rows too.
pub(crate) const WAVE_CLUSTER_THREADS: u32 = 256;

/// Whether rows that a whole-row block cannot keep two to a multiprocessor (`whole_resident`
/// blocks of the best whole-row instance, 0 when none holds the row) run as `slices` blocks of
/// `entry` (`threads` each) per row, one thread-block cluster per row, in as many waves as the
/// rows need. A cluster needs no other block resident, so its rows need not all fit at once,
/// and smaller blocks keep more of them on each multiprocessor, at different points of their
/// rows: the reads of some overlap the reductions and writes of others. Needs at least one
/// and a half waves of blocks (`rows · slices`): a second wave mostly empty lost to the plans
/// that keep every block resident (performance log: "Clusters in waves"); and the sm_90
/// build, at most [`MAX_CLUSTER_BLOCKS`] slices, and a cluster the driver can schedule.
pub(crate) fn clusters_in_waves(
    device: &dyn DeviceLimits,
    entry: Entry,
    threads: u32,
    rows: u32,
    slices: u32,
    whole_resident: u32,
) -> bool {
    let per_sm = device.blocks_per_sm(entry, threads, cluster_shared_bytes(entry, threads, slices));
    whole_resident < 2
        && slices_form_clusters(device, entry, threads, slices)
        && 2 * u64::from(rows) * u64::from(slices)
            >= 3 * u64::from(device.multiprocessors()) * u64::from(per_sm)
}

/// Whether `launch` is row-slices reading its tensor once (its slices cached in shared
/// memory) with every block resident at once. Such a plan beats clusters in waves (a cached
/// row or slice per block in one wave read 93–105% of the copy, and clusters in waves lost 7
/// to 17 points against it), so the planners keep it (performance log: "Clusters in waves").
pub(crate) fn reads_once_in_one_wave(launch: &Launch, device: &dyn DeviceLimits) -> bool {
    matches!(
        (launch.entry, launch.params),
        (Entry::RowSlices(_), Params::RowSlices { cached: true, .. })
    ) && u64::from(launch.grid) <= launch.resident_blocks(device)
}

/// f32 rows of at most this many bytes stay whole in block registers, a block each, however
/// few they are: one block reads such a row in one round of loads, where the exchange between
/// the blocks of a sliced row costs more than the reads it spreads (performance log: "Small
/// rows whole").
pub(crate) const WHOLE_SMALL_ROW_BYTES: u64 = 16 << 10;

/// The same rule for the operation kernels' forward rows, narrower: 8 KB rows (4096 bf16)
/// gained as one block each, 16 KB rows (8192 bf16) in blocks of 128 threads × 8 packs lost on
/// few rows (performance log: "Small rows whole"; for those, see
/// [`FEW_WHOLE_OPERATION_ROW_BYTES`]).
pub(crate) const WHOLE_SMALL_OPERATION_ROW_BYTES: u64 = 8 << 10;

/// Forward rows of the operation kernels above [`WHOLE_SMALL_OPERATION_ROW_BYTES`] and up to
/// this many bytes stay whole where they are at most one a multiprocessor, in a block of
/// [`FEW_WHOLE_ROW_PACKS`] packs a thread: bf16 rows of 8192 columns took 0.32–0.42 µs less
/// on 1 and 16 rows than in clusters of four 128-thread blocks, where a block of 128 threads
/// of 8 packs each had lost (performance log: "Few forward rows: block sizes and large
/// clusters").
pub(crate) const FEW_WHOLE_OPERATION_ROW_BYTES: u64 = 16 << 10;

/// Packs a thread of the blocks that keep few small rows whole
/// ([`FEW_WHOLE_OPERATION_ROW_BYTES`]).
pub(crate) const FEW_WHOLE_ROW_PACKS: u32 = 4;

/// Waves of whole cached rows (a row a block, nothing exchanged) that 16-bit plain softmax
/// keeps over clusters in waves: they read more of the copy at bf16 256–1024×100003, in two
/// to eight waves (performance log: "Row-slices in waves over clusters in waves").
const WHOLE_ROW_WAVES: u64 = 8;

/// Whether `launch` is row-slices keeping a whole row in each block in at most
/// [`WHOLE_ROW_WAVES`] waves.
fn keeps_whole_rows_in_few_waves(launch: &Launch, device: &dyn DeviceLimits) -> bool {
    matches!(
        (launch.entry, launch.params),
        (
            Entry::RowSlices(_),
            Params::RowSlices {
                cached: true,
                slicing: Slicing { slices: 1, .. },
                ..
            }
        )
    ) && u64::from(launch.grid) <= WHOLE_ROW_WAVES * launch.resident_blocks(device)
}

/// The plan of a call that clusters in waves may take, from `resident` (the plan without them),
/// `clusters` (clusters in waves, where [`clusters_in_waves`] takes the rows) and `slices`
/// (row-slices in waves of rows, where the caller offers it): `resident` where it is row-slices
/// reading the tensor once in one wave ([`reads_once_in_one_wave`]); else `slices` where it
/// runs in fewer waves than `clusters` ([`launch_waves`]); else `clusters`. Row-slices in
/// waves keeps a row's slices in shared memory, which holds more of a wave than the clusters'
/// registers; where it took fewer waves it read more of the copy in 16-bit, and in f32 with
/// clusters of more than 8 blocks (performance log: "Row-slices in waves over clusters in
/// waves").
pub(crate) fn waves_unless_read_once(
    resident: Vec<Launch>,
    clusters: Option<Launch>,
    slices: Option<Launch>,
    device: &dyn DeviceLimits,
) -> Vec<Launch> {
    match (clusters, slices) {
        _ if resident.iter().any(|l| reads_once_in_one_wave(l, device)) => resident,
        (Some(clusters), Some(slices))
            if launch_waves(&slices, device) < launch_waves(&clusters, device) =>
        {
            vec![slices]
        }
        (Some(clusters), _) => vec![clusters],
        (None, _) => resident,
    }
}

/// The share of the time the memory takes to read and write one row (at its peak) by which
/// each row of a first wave starts after the one before it, in percent: half gained on every
/// shape of the softmax's row slices measured, a whole row's time gained less or lost; the
/// cross-entropy's row slices take the same share (performance log: "The first wave held
/// back row by row").
const WAVES_STAGGER_PERCENT: u64 = 50;

/// The stagger of an ordinary launch of `rows` rows of `row_bytes` bytes each (read, then
/// written), `slices` blocks a row in turn, `resident` blocks at once, where the rows run in
/// more than one wave: each row of the first wave starts [`WAVES_STAGGER_PERCENT`] of the
/// time the memory takes to read and write one row after the row before it.
/// [`Stagger::NONE`] in one wave.
pub(crate) fn waves_stagger(
    rows: u32,
    slices: u32,
    resident: u64,
    row_bytes: u64,
    device: &dyn DeviceLimits,
) -> Stagger {
    let first_wave_rows = resident / u64::from(slices.max(1));
    let bandwidth = device.memory_bytes_per_us();
    if u64::from(rows) <= first_wave_rows || first_wave_rows == 0 || bandwidth == 0 {
        return Stagger::NONE;
    }
    let ns = WAVES_STAGGER_PERCENT * 2 * row_bytes * 1000 / (100 * bandwidth);
    Stagger {
        rows: first_wave_rows as u32,
        ns: ns.min(u64::from(u32::MAX)) as u32,
    }
}

/// Waves `launch` runs in: of clusters, by the driver's count of clusters active at once, for a
/// clustered launch; of blocks otherwise.
pub(crate) fn launch_waves(launch: &Launch, device: &dyn DeviceLimits) -> u64 {
    match launch.scheduling {
        Scheduling::Clusters(size) if size > 1 => {
            let clusters = u64::from(launch.grid / size);
            let active =
                device.active_clusters(launch.entry, launch.block, launch.shared_bytes, size);
            clusters.div_ceil(u64::from(active.max(1)))
        }
        _ => u64::from(launch.grid).div_ceil(launch.resident_blocks(device).max(1)),
    }
}

/// One kernel launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    pub entry: Entry,
    pub grid: u32,
    pub block: u32,
    pub shared_bytes: u32,
    pub scheduling: Scheduling,
    pub params: Params,
}

impl Launch {
    /// Blocks of this launch resident on the whole GPU at once.
    pub(crate) fn resident_blocks(&self, device: &dyn DeviceLimits) -> u64 {
        u64::from(device.multiprocessors())
            * u64::from(device.blocks_per_sm(self.entry, self.block, self.shared_bytes))
    }
}

/// Workspace a plan's launches use, in elements of each buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WorkspaceNeeds {
    /// The unfused variant's row maxima then row sums.
    pub row_stats: usize,
    /// Two floats per block of a launch whose blocks exchange statistics.
    pub partials: usize,
    /// Two words per row and row-slices' flag per block: at most three per block.
    pub barrier_words: usize,
    /// Per-row, per-slice states of an operation split in two launches.
    pub states: usize,
}

impl Launch {
    /// The entry with, in parentheses, the block size of the families whose entries take it at
    /// launch (one entry serves every block size) and then `details`: what the benchmark
    /// reports.
    pub(crate) fn label(&self, details: &[String]) -> String {
        let width = match self.entry {
            Entry::Operation(instance) => match instance.shape {
                OpKernelShape::Rows { .. } => None,
                OpKernelShape::Block { threads } => Some(format!("{threads} threads")),
            },
            Entry::BlockRegisters(instance) => Some(format!("{} threads", instance.threads)),
            _ => None,
        };
        let parts: Vec<&str> = width.iter().chain(details).map(String::as_str).collect();
        if parts.is_empty() {
            self.entry.to_string()
        } else {
            format!("{} ({})", self.entry, parts.join(", "))
        }
    }

    /// How the launch's blocks are scheduled, where that is not an ordinary launch: what the
    /// benchmark's labels add after the block size.
    pub(crate) fn scheduling_details(&self) -> Vec<String> {
        match self.scheduling {
            Scheduling::Cooperative => vec!["cooperative".into()],
            Scheduling::Clusters(blocks) if blocks > 1 => vec![format!("clusters of {blocks}")],
            _ => Vec::new(),
        }
    }

    /// What this launch uses of the workspace.
    pub(crate) fn needs(&self) -> WorkspaceNeeds {
        let grid = self.grid as usize;
        let exchanging = WorkspaceNeeds {
            partials: 2 * grid,
            barrier_words: 3 * grid,
            ..WorkspaceNeeds::default()
        };
        match self.params {
            Params::Unfused { rows, .. } => WorkspaceNeeds {
                row_stats: 2 * rows as usize,
                ..WorkspaceNeeds::default()
            },
            // The rows' losses, then the totals, and the exchange where the blocks of a row
            // meet through global memory.
            Params::CrossEntropy {
                rows,
                exchange,
                workspace,
                ..
            } => WorkspaceNeeds {
                row_stats: if workspace { rows as usize + 2 } else { 0 },
                ..if exchange {
                    exchanging
                } else {
                    WorkspaceNeeds::default()
                }
            },
            // The candidate path's slices' states and ranks.
            Params::Sampling {
                candidates: true,
                slices,
                rows,
                ..
            } => WorkspaceNeeds {
                row_stats: rows as usize * slices as usize * SLICE_TOP_WORDS as usize,
                ..WorkspaceNeeds::default()
            },
            // The slices' draws.
            Params::Sampling { slices, rows, .. } if slices > 1 => WorkspaceNeeds {
                row_stats: rows as usize * slices as usize * SHARD_DRAW_FLOATS,
                ..WorkspaceNeeds::default()
            },
            // A row in one slice meets no other block: no barrier, nothing published.
            Params::RowSlices { slicing, .. } if slicing.slices > 1 => exchanging,
            Params::Operation {
                pass: OperationPass::SliceStatesToWorkspace,
                ..
            } => WorkspaceNeeds {
                states: grid,
                ..WorkspaceNeeds::default()
            },
            // Sliced rows of one cooperative launch exchange through global memory; whole
            // rows need nothing, and rows in clusters exchange through shared memory.
            Params::BlockRegisters { .. } | Params::Operation { .. }
                if self.scheduling == Scheduling::Cooperative =>
            {
                exchanging
            }
            _ => WorkspaceNeeds::default(),
        }
    }
}

impl WorkspaceNeeds {
    /// Whether the launches use no workspace at all.
    pub(crate) fn is_none(&self) -> bool {
        *self == WorkspaceNeeds::default()
    }

    /// What both need: each buffer's larger need.
    pub(crate) fn max(self, other: Self) -> Self {
        WorkspaceNeeds {
            row_stats: self.row_stats.max(other.row_stats),
            partials: self.partials.max(other.partials),
            barrier_words: self.barrier_words.max(other.barrier_words),
            states: self.states.max(other.states),
        }
    }
}

/// What a plan's launches use of the workspace together (each buffer's largest need).
pub(crate) fn workspace_needs(launches: &[Launch]) -> WorkspaceNeeds {
    launches
        .iter()
        .map(Launch::needs)
        .fold(WorkspaceNeeds::default(), WorkspaceNeeds::max)
}

/// What planning needs to know about the device.
pub(crate) trait DeviceLimits {
    fn multiprocessors(&self) -> u32;
    /// Dynamic shared memory one block may use (the opt-in limit).
    fn max_shared_per_block(&self) -> u32;
    /// Blocks of `entry` resident on one multiprocessor at once with this block size and
    /// shared memory (0 when such a block cannot launch at all, e.g. too many registers).
    fn blocks_per_sm(&self, entry: Entry, threads: u32, shared_bytes: u32) -> u32;
    /// Whether cooperative launches (every block resident at once) are available.
    fn cooperative_launch(&self) -> bool;
    /// Whether thread-block clusters are available (compute capability 9.0 and later).
    fn thread_block_clusters(&self) -> bool;
    /// The memory's peak bandwidth the driver's clock and bus width give, in bytes per µs.
    fn memory_bytes_per_us(&self) -> u64;
    /// Clusters of `cluster` blocks of `entry` active at once with this block size and
    /// shared memory (0 when one cannot be scheduled at all).
    fn active_clusters(&self, entry: Entry, threads: u32, shared_bytes: u32, cluster: u32) -> u32;
}

/// The f32 variants' layout of an input and an output of contiguous rows: whole packs when
/// both start 16-byte aligned and `cols` is a multiple of 4; peeled (an unaligned head read
/// one element at a time, the rest in packs) wherever the two are misaligned alike; else one
/// element at a time.
pub(crate) fn pair_layout(input_address: u64, output_address: u64, cols: usize) -> Layout {
    let aligned = |address: u64| address.is_multiple_of(16);
    if aligned(input_address) && aligned(output_address) && cols.is_multiple_of(4) {
        Layout::Aligned
    } else if input_address.abs_diff(output_address).is_multiple_of(16) {
        Layout::Peeled
    } else {
        Layout::Elements
    }
}

/// The launches that compute `request` on a non-empty `shape` laid out as `layout` (for
/// operations, `operations::layout`'s answer; for the others, [`pair_layout`]'s).
pub(crate) fn plan(
    request: Request,
    shape: Shape,
    layout: Layout,
    device: &dyn DeviceLimits,
) -> Result<Vec<Launch>> {
    match request {
        Request::Variant(variant) => variants::plan(variant, shape, layout, device),
        Request::PlainSoftmax { dtype, peelable } => {
            let (forward, full) = (Direction::Forward, OperationMode::Full);
            // The operation kernels' plan without clusters in waves, or 16-bit row-slices
            // where that plan slices a large tensor and row-slices caches it, in one wave or
            // in waves of rows.
            let mut resident = operation_plan(forward, dtype, full, shape, layout, device)?;
            let sliced = resident.iter().any(|l| match l.params {
                Params::Operation { slicing, .. } => slicing.slices > 1,
                _ => false,
            });
            let bytes = shape.len() as u64 * u64::from(dtype.bytes());
            if sliced && bytes >= SIXTEEN_BIT_ROW_SLICES_FROM_BYTES {
                let (launch, cached) = variants::row_slices_launch(shape, dtype, peelable, device);
                let kept = if cached {
                    Some(launch)
                } else {
                    variants::row_slices_in_waves_launch(shape, dtype, peelable, device)
                };
                if let Some(launch) = kept {
                    resident = vec![launch];
                }
            }
            if resident
                .iter()
                .any(|l| keeps_whole_rows_in_few_waves(l, device))
            {
                return Ok(resident);
            }
            let clusters = operations::plan_in_waves(forward, dtype, shape, layout, device)
                .and_then(|waves| operations::launches(waves, full))
                .and_then(|launches| match launches.as_slice() {
                    // Clusters in waves are one launch (their rows are never split).
                    &[launch] => Some(launch),
                    _ => None,
                });
            let slices = clusters
                .and_then(|_| variants::row_slices_in_waves_launch(shape, dtype, peelable, device));
            Ok(waves_unless_read_once(resident, clusters, slices, device))
        }
        Request::Operation {
            direction,
            input,
            mode,
        } => {
            // Full calls take clusters in waves where the rule takes the rows; row states and
            // their application keep the plans that hold every block resident or split rows.
            let in_waves = (mode == OperationMode::Full)
                .then(|| operations::plan_in_waves(direction, input, shape, layout, device))
                .flatten()
                .and_then(|waves| operations::launches(waves, mode));
            in_waves.map_or_else(
                || operation_plan(direction, input, mode, shape, layout, device),
                Ok,
            )
        }
        Request::CrossEntropy {
            input,
            totals,
            reduce,
            block_entries,
        } => cross_entropy::plan(
            input,
            (totals, reduce),
            block_entries,
            shape,
            layout,
            device,
        ),
        Request::Sampling {
            input,
            advance,
            work,
        } => sampling::plan(input, advance, work, shape, layout, device),
    }
}

/// The operation kernels' launches for `direction` on `input` in `mode` without clusters in
/// waves ([`operations::plan`]).
fn operation_plan(
    direction: Direction,
    input: DType,
    mode: OperationMode,
    shape: Shape,
    layout: Layout,
    device: &dyn DeviceLimits,
) -> Result<Vec<Launch>> {
    let unsupported = |why: &str| Error::Unsupported {
        variant: "operation".into(),
        rows: shape.rows(),
        cols: shape.cols(),
        why: why.into(),
    };
    let launch = operations::plan(direction, input, shape, layout, device)
        .ok_or_else(|| unsupported("no operation kernel can launch on this device"))?;
    operations::launches(launch, mode).ok_or_else(|| {
        unsupported(
            "the slice is too wide to reduce in one launch here (too many rows to keep \
             resident at this width): split it into narrower slices and merge their states",
        )
    })
}

/// Every entry a plan of the softmax module can name (the module must hold them all);
/// `with_clusters` for the sm_90 build, which alone has the row-cluster entries.
pub(crate) fn softmax_module_entries(with_clusters: bool) -> Vec<Entry> {
    let clusters = [Entry::RowCluster { pack: 4 }, Entry::RowCluster { pack: 1 }];
    let fixed = [
        Entry::UnfusedRowMax,
        Entry::UnfusedSubtract,
        Entry::UnfusedExp,
        Entry::UnfusedRowSum,
        Entry::UnfusedDivide,
        Entry::ThreadPerRowNaive,
        Entry::ThreadPerRowOnline,
        Entry::BlockPerRowSmem,
        Entry::WarpPerRowOnline,
    ];
    let row_slices = RowSlicesKernelName::both(DType::F32).map(Entry::RowSlices);
    fixed
        .into_iter()
        .chain(clusters.into_iter().filter(|_| with_clusters))
        .chain(row_slices)
        .chain(variants::register_instances().map(Entry::RowsInRegisters))
        .chain(variants::block_register_instances().map(Entry::BlockRegisters))
        .collect()
}

/// The names of every entry of the softmax module (the tune cache's catalogue hashes them).
#[cfg(feature = "tune-cache")]
pub(crate) fn all_kernel_names() -> Vec<String> {
    softmax_module_entries(true)
        .iter()
        .map(Entry::to_string)
        .collect()
}

/// Every entry of the operation module of `input`: its operation kernels and, for 16-bit
/// types, that type's row-slices entries (f32's are in the softmax module).
pub(crate) fn operation_module_entries(input: DType) -> Vec<Entry> {
    let row_slices = match input {
        DType::F32 => Vec::new(),
        _ => RowSlicesKernelName::both(input)
            .map(Entry::RowSlices)
            .to_vec(),
    };
    OpInstance::all_for(input)
        .map(Entry::Operation)
        .chain(row_slices)
        .chain(CrossEntropyEntry::all(input).map(Entry::CrossEntropy))
        .chain(SamplingEntry::all(input).map(Entry::Sampling))
        .collect()
}

/// `Error::ShapeTooLarge` for `shape`, saying `why`.
pub(crate) fn too_large(shape: Shape, why: &'static str) -> Error {
    Error::ShapeTooLarge {
        rows: shape.rows(),
        cols: shape.cols(),
        why,
    }
}

/// The rows and columns of `shape` as a one-block-per-row kernel takes them (u32), or
/// `Error::ShapeTooLarge`.
pub(crate) fn rows_and_cols(shape: Shape) -> Result<(u32, u32)> {
    let rows =
        u32::try_from(shape.rows()).map_err(|_| too_large(shape, "more rows than a grid holds"))?;
    let cols = u32::try_from(shape.cols())
        .map_err(|_| too_large(shape, "a row of more than 2^32 columns"))?;
    Ok((rows, cols))
}

/// `Error::Unsupported` for a family whose block cannot be resident on the device.
pub(crate) fn not_resident(variant: &str, shape: Shape) -> Error {
    Error::Unsupported {
        variant: variant.into(),
        rows: shape.rows(),
        cols: shape.cols(),
        why: "its block cannot be resident on this device".into(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kernels_gpu::launch::cross_entropy::CrossEntropyKind;

    /// Checks that each of `entries` has the launch bounds ptx-builder gives it of
    /// `threads` and `blocks_per_sm` (what its planner launches).
    pub(crate) fn assert_launch_bounds(
        entries: impl IntoIterator<Item = Entry>,
        threads: u32,
        blocks_per_sm: u32,
    ) {
        for entry in entries {
            let name = entry.to_string();
            let bounds = ptx_builder::LAUNCH_BOUNDS
                .iter()
                .find(|bounds| bounds.entries.contains(&name.as_str()))
                .unwrap_or_else(|| panic!("{name} has no launch bounds"));
            assert_eq!(
                (bounds.threads, bounds.blocks_per_sm),
                (threads, blocks_per_sm),
                "{name}"
            );
        }
    }

    /// The H200's numbers, with occupancy estimated from threads and shared memory alone.
    pub(crate) struct FakeH200;

    impl DeviceLimits for FakeH200 {
        fn multiprocessors(&self) -> u32 {
            132
        }

        fn max_shared_per_block(&self) -> u32 {
            227 * 1024
        }

        fn blocks_per_sm(&self, entry: Entry, threads: u32, shared_bytes: u32) -> u32 {
            // Registers per thread: about 24, plus those holding a thread's packs (a
            // block-registers thread's floats; an operation thread's packs, a 16-byte pack
            // in four registers: ptxas gives op_block_fwd_bf16_p8_n8 56, p8_n4 40); the
            // cross-entropy row slices fill their cap of 64 (ptxas gives them 55 and 63).
            let held = match entry {
                Entry::BlockRegisters(name) => name.pack * name.packs,
                // A kept entry holds a float per element (ptxas: bf16 8 packs 96).
                Entry::Operation(k) if k.kept => k.packs * k.pack(),
                Entry::Operation(k) => k.packs * (k.pack() * k.input.bytes() / 4).max(1),
                Entry::CrossEntropy(CrossEntropyEntry {
                    kind: CrossEntropyKind::Slices,
                    ..
                }) => 40,
                _ => 8,
            };
            let by_registers = 65536 / (threads * (24 + held));
            (2048 / threads)
                .min(228 * 1024 / (shared_bytes + 1024))
                .min(by_registers)
                .min(32)
        }

        fn cooperative_launch(&self) -> bool {
            true
        }

        fn thread_block_clusters(&self) -> bool {
            true
        }

        fn memory_bytes_per_us(&self) -> u64 {
            4_915_000
        }

        fn active_clusters(
            &self,
            entry: Entry,
            threads: u32,
            shared_bytes: u32,
            cluster: u32,
        ) -> u32 {
            // Eight processing clusters of 16 multiprocessors; a cluster's blocks share one.
            8 * (16 * self.blocks_per_sm(entry, threads, shared_bytes) / cluster)
        }
    }

    /// The H200 where no thread-block cluster can run: with the sm_80 kernel build, which has
    /// none though the driver would schedule them (`sm90_build` false), or with the sm_90
    /// build but clusters the driver cannot schedule (`sm90_build` true).
    pub(crate) struct FakeH200WithoutClusters {
        pub sm90_build: bool,
    }

    impl DeviceLimits for FakeH200WithoutClusters {
        fn multiprocessors(&self) -> u32 {
            FakeH200.multiprocessors()
        }

        fn max_shared_per_block(&self) -> u32 {
            FakeH200.max_shared_per_block()
        }

        fn blocks_per_sm(&self, entry: Entry, threads: u32, shared_bytes: u32) -> u32 {
            FakeH200.blocks_per_sm(entry, threads, shared_bytes)
        }

        fn cooperative_launch(&self) -> bool {
            true
        }

        fn thread_block_clusters(&self) -> bool {
            self.sm90_build
        }

        fn memory_bytes_per_us(&self) -> u64 {
            FakeH200.memory_bytes_per_us()
        }

        fn active_clusters(
            &self,
            entry: Entry,
            threads: u32,
            shared_bytes: u32,
            cluster: u32,
        ) -> u32 {
            if self.sm90_build {
                0
            } else {
                FakeH200.active_clusters(entry, threads, shared_bytes, cluster)
            }
        }
    }

    pub(crate) fn shape(rows: usize, cols: usize) -> Shape {
        Shape::new(rows, cols).unwrap()
    }

    /// Whether `launch` runs in clusters in waves: in clusters, with more blocks than are
    /// resident at once.
    pub(crate) fn runs_in_waves(launch: &Launch, device: &dyn DeviceLimits) -> bool {
        matches!(launch.scheduling, Scheduling::Clusters(_))
            && u64::from(launch.grid) > launch.resident_blocks(device)
    }

    #[test]
    fn the_pair_layout_needs_both_pointers_aligned_and_whole_packs() {
        assert_eq!(pair_layout(256, 512, 8), Layout::Aligned);
        assert_eq!(pair_layout(260, 516, 7), Layout::Peeled);
        assert_eq!(pair_layout(256, 512, 6), Layout::Peeled);
        assert_eq!(pair_layout(260, 512, 8), Layout::Elements);
        assert_eq!(pair_layout(256, 516, 8), Layout::Elements);
    }

    #[test]
    fn every_entry_prints_as_its_ptx_name() {
        let sample = [
            (Entry::UnfusedDivide, "softmax_unfused_divide"),
            (Entry::RowCluster { pack: 4 }, "softmax_row_cluster_p4"),
            (
                Entry::RowSlices(RowSlicesKernelName {
                    dtype: DType::Bf16,
                    pack: 8,
                }),
                "softmax_row_slices_bf16_p8",
            ),
        ];
        for (entry, name) in sample {
            assert_eq!(entry.to_string(), name);
        }
    }

    /// 16-bit plain softmax takes row-slices on large tensors the operation kernels would
    /// slice across the GPU, and the operation kernels elsewhere, their clusters in waves
    /// included, unless row-slices in waves of rows takes fewer waves.
    #[test]
    fn sixteen_bit_plain_softmax_takes_row_slices_on_large_sliced_tensors_and_in_fewer_waves() {
        let launch = |rows, cols| {
            let request = Request::PlainSoftmax {
                dtype: DType::Bf16,
                peelable: true,
            };
            plan(request, shape(rows, cols), Layout::Aligned, &FakeH200).unwrap()[0]
        };
        let entry = |rows, cols| launch(rows, cols).entry;
        let forward = |rows, cols| {
            operations::plan_in_waves(
                Direction::Forward,
                DType::Bf16,
                shape(rows, cols),
                Layout::Aligned,
                &FakeH200,
            )
            .and_then(|waves| operations::launches(waves, OperationMode::Full))
            .unwrap()[0]
        };
        // 128256 columns in blocks of 256 threads of 8 packs: 8 a row, 1024 blocks, in two
        // waves of clusters, which row-slices in waves does not beat.
        let waves = launch(128, 128256);
        assert!(
            matches!(waves.entry, Entry::Operation(k) if k.threads_per_row() == 256 && k.packs == 8),
            "{waves:?}"
        );
        assert_eq!(waves.scheduling, Scheduling::Clusters(8));
        assert!(runs_in_waves(&waves, &FakeH200));
        // 151936 columns: 10 blocks a row in three waves of clusters, against two of row-slices
        // keeping every slice.
        let slices = launch(128, 151936);
        let clusters = forward(128, 151936);
        assert_eq!(clusters.scheduling, Scheduling::Clusters(10));
        assert!(matches!(slices.entry, Entry::RowSlices(_)), "{slices:?}");
        assert!(
            matches!(slices.params, Params::RowSlices { cached: true, .. }),
            "{slices:?}"
        );
        assert!(launch_waves(&slices, &FakeH200) < launch_waves(&clusters, &FakeH200));
        // Row-slices where it reads the tensor once in one wave, though clusters in waves
        // would take the rows: 128 cached rows of 100003.
        let peeled = Layout::Peeled;
        let in_waves = operations::plan_in_waves(
            Direction::Forward,
            DType::Bf16,
            shape(128, 100003),
            peeled,
            &FakeH200,
        );
        assert!(in_waves.is_some());
        let request = Request::PlainSoftmax {
            dtype: DType::Bf16,
            peelable: true,
        };
        let kept = plan(request, shape(128, 100003), peeled, &FakeH200).unwrap()[0];
        assert!(matches!(kept.entry, Entry::RowSlices(_)), "{kept:?}");
        assert!(reads_once_in_one_wave(&kept, &FakeH200));
        // Below a wave and a half of clusters' blocks, where the operation kernels would slice
        // rows across the GPU (in clusters of 7 for 128×50257): row-slices.
        assert!(matches!(entry(32, 151936), Entry::RowSlices(_)));
        assert!(matches!(entry(128, 50257), Entry::RowSlices(_)));
        assert!(matches!(entry(8, 128256), Entry::Operation(_)));
        assert!(matches!(entry(4096, 1000), Entry::Operation(_)));
    }

    /// 16-bit plain softmax keeps whole cached rows in a few waves over clusters in waves
    /// (bf16 256–1024×100003), and from more waves takes row-slices in waves of rows, which
    /// cuts them (2048×100003).
    #[test]
    fn sixteen_bit_whole_rows_in_few_waves_stay() {
        let slices = |rows| {
            let request = Request::PlainSoftmax {
                dtype: DType::Bf16,
                peelable: true,
            };
            let launch = plan(request, shape(rows, 100003), Layout::Aligned, &FakeH200).unwrap()[0];
            match (launch.entry, launch.params) {
                (Entry::RowSlices(_), Params::RowSlices { slicing, .. }) => slicing.slices,
                _ => panic!("{rows}: {launch:?}"),
            }
        };
        for rows in [256, 512, 1024] {
            assert_eq!(slices(rows), 1, "{rows}");
        }
        assert!(slices(2048) > 1);
    }

    /// The shapes the GPU tests of leaving blocks and of special values in 16-bit row-slices
    /// count on run sliced row-slices (which can leave); a row in one slice reserves no
    /// workspace, since its block meets no other.
    #[test]
    fn the_gpu_tests_row_slices_shapes_are_sliced_and_single_slices_need_no_workspace() {
        let sliced = |request, rows, cols| {
            let launches = plan(request, shape(rows, cols), Layout::Aligned, &FakeH200).unwrap();
            matches!(launches[0].entry, Entry::RowSlices(_))
                && launches[0].grid as usize > rows
                && !workspace_needs(&launches).is_none()
        };
        let bf16 = Request::PlainSoftmax {
            dtype: DType::Bf16,
            peelable: true,
        };
        for (rows, cols) in [
            (16, 262144),
            (32, 151936),
            (64, 151936),
            (12, 200003),
            (3, 1048576),
        ] {
            assert!(sliced(bf16, rows, cols), "bf16 {rows}x{cols}");
        }
        let auto = Request::Variant(Variant::Auto);
        for (rows, cols) in [(4, 1048576), (16, 262144), (2, 4194304), (32, 151936)] {
            assert!(sliced(auto, rows, cols), "f32 {rows}x{cols}");
        }
        // The row-slices variant keeps a block per row where rows fill the GPU (`auto` takes
        // row-slices in waves there: `wide_rows_in_waves_keep_every_slice`).
        let row_slices = Request::Variant(Variant::RowSlices);
        let whole = plan(row_slices, shape(5000, 300000), Layout::Aligned, &FakeH200).unwrap();
        assert!(matches!(whole[0].entry, Entry::RowSlices(_)));
        assert_eq!(whole[0].grid, 5000);
        assert!(workspace_needs(&whole).is_none(), "{whole:?}");
    }

    /// The stream tests' cases that name a family reach it: row-cluster, clusters in waves for
    /// f32 `auto` and the bf16 operation kernels, and the two launches of f32 log-softmax
    /// (whose row states grow the workspace).
    #[test]
    fn the_stream_tests_cases_reach_their_families() {
        let auto = |rows, cols| {
            let request = Request::Variant(Variant::Auto);
            plan(request, shape(rows, cols), Layout::Aligned, &FakeH200).unwrap()
        };
        let forward = |input, rows, cols| {
            let request = Request::Operation {
                direction: Direction::Forward,
                input,
                mode: OperationMode::Full,
            };
            plan(request, shape(rows, cols), Layout::Aligned, &FakeH200).unwrap()
        };
        assert!(matches!(
            auto(32, 524288)[0].entry,
            Entry::RowCluster { .. }
        ));
        let waves = auto(128, 128256)[0];
        assert!(matches!(waves.entry, Entry::BlockRegisters(_)), "{waves:?}");
        assert!(runs_in_waves(&waves, &FakeH200));
        assert!(runs_in_waves(
            &forward(DType::Bf16, 256, 128256)[0],
            &FakeH200
        ));
        for (rows, cols) in [(64, 140000), (300, 140000)] {
            assert_eq!(forward(DType::F32, rows, cols).len(), 2, "{rows}x{cols}");
        }
    }

    /// Only a cooperative launch's sliced rows exchange through the workspace: whole rows need
    /// none, and rows in clusters exchange through shared memory.
    #[test]
    fn block_registers_reserve_exchange_workspace_only_when_cooperative() {
        for (rows, cols, scheduling) in [
            (1, 32000, Scheduling::Cooperative),
            (1, 8000, Scheduling::Clusters(16)),
            (4096, 4096, Scheduling::Ordinary),
        ] {
            let launches = plan(
                Request::Variant(Variant::BlockRegisters),
                shape(rows, cols),
                Layout::Aligned,
                &FakeH200,
            )
            .unwrap();
            assert_eq!(launches[0].scheduling, scheduling, "{rows}x{cols}");
            let needs = workspace_needs(&launches);
            let exchanges = needs.partials > 0 && needs.barrier_words > 0;
            assert_eq!(
                exchanges,
                scheduling == Scheduling::Cooperative,
                "{rows}x{cols}: {needs:?}"
            );
        }
    }

    /// Plans are made in 64-bit arithmetic: row counts near the launch limit do not wrap.
    #[test]
    fn row_counts_near_the_limit_plan_without_overflow() {
        let rows = (1usize << 31) - 1;
        for variant in [Variant::Auto, Variant::RowSlices, Variant::BlockRegisters] {
            if let Ok(launches) = plan(
                Request::Variant(variant),
                shape(rows, 2),
                Layout::Aligned,
                &FakeH200,
            ) {
                for launch in launches {
                    assert!(launch.grid > 0, "{variant}: {launch:?}");
                }
            }
        }
    }
}
