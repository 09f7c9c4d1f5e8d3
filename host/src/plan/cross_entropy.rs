//! Planning a cross-entropy call: the block entries where the call can take them (rows
//! aligned for 16-byte packs, no label smoothing, the whole vocabulary), which hold their rows
//! in registers as the operation kernels plan them: whole rows, clusters in waves, or the
//! slices of one launch. Such calls take the row-slices entries instead, every slice kept in
//! shared memory, in waves of rows: 16-bit rows that clusters in waves would take, where row
//! slices run in fewer waves; rows the block entries do not take (f32 rows wider than their
//! clusters, rows only two launches could reduce), where row slices run in more than one
//! wave. Else each row one block of the row kernel, or a thread-block cluster
//! of blocks that each hold a slice of it, kept in shared memory where two blocks still fit a
//! multiprocessor (else one block that reads its row twice). The one-block prologue and
//! epilogue where the call needs them.

use kernels_gpu::launch::MAX_CLUSTER_BLOCKS;
use kernels_gpu::launch::REDUCTION_SCRATCH_FLOATS;
use kernels_gpu::launch::cross_entropy::{
    CROSS_ENTROPY_THREADS, CrossEntropyEntry, CrossEntropyKind,
};
use kernels_gpu::launch::ops::{DType, Direction};

use super::operations::{self, OpLaunch};
use super::{
    CLUSTER_SHARED_BYTES, DeviceLimits, Entry, Launch, Layout, OperationMode, Params, Scheduling,
    Stagger, launch_waves, not_resident, rows_and_cols, too_large, variants,
};
use crate::error::Result;
use crate::shape::Shape;

/// Threads of the one-block prologue and epilogue.
const ONE_BLOCK_THREADS: u32 = 1024;

/// Blocks of the row kernel a multiprocessor should hold at once: its launch bounds (one
/// block alone cannot hide the latency of its loads).
const BLOCKS_PER_SM: u32 = 2;

/// What a cross-entropy call launches: `totals` (the mean's divisor and the class weights'
/// sum) first where the call needs them, the rows, then `reduce` (the reduced loss) where the
/// loss is reduced. `block_entries`: the call can take the block entries (no label
/// smoothing, no softcap, the whole vocabulary, every row whole here).
pub(crate) fn plan(
    input: DType,
    (totals, reduce): (bool, bool),
    block_entries: bool,
    shape: Shape,
    layout: Layout,
    limits: &dyn DeviceLimits,
) -> Result<Vec<Launch>> {
    let (rows, cols) = rows_and_cols(shape)?;
    let workspace = totals || reduce;
    let params = |rows_launch: RowsLaunch| Params::CrossEntropy {
        rows,
        slices: rows_launch.slices,
        slice_packs: rows_launch.slice_packs,
        cached: rows_launch.cached,
        aligned: rows_launch.aligned,
        exchange: rows_launch.exchange,
        workspace,
        totals,
        stagger: rows_launch.stagger,
    };
    let in_blocks = block_entries
        .then(|| plan_in_blocks(input, shape, layout, limits))
        .flatten();
    let in_slices = block_entries
        .then(|| plan_in_slices(input, shape, layout, limits, &params))
        .flatten();
    let take_slices = |slices: &Launch| match &in_blocks {
        Some((blocks, _)) => slices_over_blocks(input, blocks, slices, limits),
        // In place of the row kernel only where row slices run in more than one wave: rows
        // few enough for one wave were not measured against the row kernel.
        None => launch_waves(slices, limits) > 1,
    };
    let rows_launch = match (in_blocks, in_slices) {
        (_, Some(slices)) if take_slices(&slices) => slices,
        // The operation kernels' launch, with the cross-entropy's parameters: the slices of
        // one cooperative launch exchange through global memory, clusters through shared
        // memory.
        (Some((launch, op)), _) => Launch {
            params: params(RowsLaunch {
                slices: op.slices,
                slice_packs: op.slice_packs,
                cached: false,
                aligned: true,
                exchange: launch.scheduling == Scheduling::Cooperative,
                stagger: Stagger::NONE,
            }),
            ..launch
        },
        (None, _) => rows_kernel_launch(input, (rows, cols), shape, layout, limits, params)?,
    };
    let scratch = REDUCTION_SCRATCH_FLOATS * 4;
    let one_block = |kind| Launch {
        entry: Entry::CrossEntropy(CrossEntropyEntry { dtype: input, kind }),
        grid: 1,
        block: ONE_BLOCK_THREADS,
        shared_bytes: scratch,
        scheduling: Scheduling::Ordinary,
        params: Params::CrossEntropy {
            rows,
            slices: 1,
            slice_packs: 0,
            cached: false,
            aligned: false,
            exchange: false,
            workspace: true,
            totals,
            stagger: Stagger::NONE,
        },
    };
    let mut launches = Vec::with_capacity(3);
    if totals {
        launches.push(one_block(CrossEntropyKind::Totals));
    }
    launches.push(rows_launch);
    if reduce {
        launches.push(one_block(CrossEntropyKind::Reduce));
    }
    Ok(launches)
}

/// How the launch for the rows cuts them, whichever family takes them: the part of the
/// cross-entropy's parameters that depends on the launch (the rest is the call's).
#[derive(Clone, Copy)]
struct RowsLaunch {
    slices: u32,
    /// Packs of each slice (0 where the kernel derives them).
    slice_packs: u32,
    /// Whether each block keeps its slice in shared memory.
    cached: bool,
    /// Whether every row starts on a 16-byte pack.
    aligned: bool,
    /// Whether a row's blocks meet through global memory (the workspace's exchange).
    exchange: bool,
    stagger: Stagger,
}

/// Most blocks of an f32 row's cluster that the block entries take. f32 rows of
/// 128256–262144 columns in clusters of 10 and 16 blocks read 1 to 7 points less of the copy
/// than the row kernel's clusters keeping their slices in shared memory; 16-bit rows gained at
/// every cluster size measured, 8 to 16 blocks (performance log: "Cross-entropy in the block
/// family's registers").
const F32_CLUSTER_BLOCKS: u32 = 8;

/// The block entries' launch for the rows (with the operation plan it comes from), as the
/// operation kernels plan the cross-entropy direction (without the forward pass's rule on few
/// small rows): clusters in waves (for f32, of at most [`F32_CLUSTER_BLOCKS`]), whole rows, or the
/// slices of one launch whose blocks exchange their statistics. `None` where the rows are not
/// whole 16-byte packs aligned for them, or are too many and too wide for one launch to reduce
/// (the two launches over slices that such operation calls take would write the gradient over
/// logits the second launch still reads).
fn plan_in_blocks(
    input: DType,
    shape: Shape,
    layout: Layout,
    limits: &dyn DeviceLimits,
) -> Option<(Launch, OpLaunch)> {
    // Aligned rows of the row kernel may end in a partial pack, which it reads one element
    // at a time; the block entries hold whole packs only.
    if layout != Layout::Aligned || !shape.cols().is_multiple_of(input.vector_pack() as usize) {
        return None;
    }
    let direction = Direction::CrossEntropy;
    let most_clustered = match input {
        DType::F32 => F32_CLUSTER_BLOCKS,
        DType::Bf16 | DType::F16 => MAX_CLUSTER_BLOCKS,
    };
    let op = operations::plan_in_waves(direction, input, shape, layout, limits)
        .or_else(|| operations::plan(direction, input, shape, layout, limits))
        .filter(|launch| !launch.split && !(launch.clustered && launch.slices > most_clustered))?;
    match operations::launches(op, OperationMode::Full)?.as_slice() {
        &[launch] => Some((launch, op)),
        _ => None,
    }
}

/// The row-slices entries' launch for the rows, with `params` its parameters, where it
/// applies: rows of whole 16-byte packs aligned for them, cut into slices kept in shared
/// memory, in waves of rows as the softmax's row-slices in waves plans them
/// ([`variants::row_slices_in_waves_launch`]).
fn plan_in_slices(
    input: DType,
    shape: Shape,
    layout: Layout,
    limits: &dyn DeviceLimits,
    params: &impl Fn(RowsLaunch) -> Params,
) -> Option<Launch> {
    if layout != Layout::Aligned || !shape.cols().is_multiple_of(input.vector_pack() as usize) {
        return None;
    }
    let entry = Entry::CrossEntropy(CrossEntropyEntry {
        dtype: input,
        kind: CrossEntropyKind::Slices,
    });
    let launch = variants::row_slices_in_waves_launch_of(entry, shape, input, limits)?;
    match launch.params {
        Params::RowSlices {
            slicing,
            cached: true,
            stagger,
            ..
        } => Some(Launch {
            params: params(RowsLaunch {
                slices: slicing.slices,
                slice_packs: slicing.slice_packs,
                cached: true,
                aligned: true,
                // A row's slices meet through global memory.
                exchange: slicing.slices > 1,
                stagger,
            }),
            ..launch
        }),
        _ => None,
    }
}

/// Whether the row-slices entries take rows the block entries would take in `blocks`: 16-bit
/// rows in clusters in waves where row slices run in fewer waves, as the softmax's 16-bit
/// forward chooses. f32 rows keep the block entries' clusters (of at most 8 blocks: the
/// softmax's f32 clusters of 2 to 8 blocks read more of the copy than row slices in waves;
/// performance log: "Row-slices in waves over clusters in waves"); wider f32 rows, which the
/// block entries do not take, take row slices where those run in waves.
fn slices_over_blocks(
    input: DType,
    blocks: &Launch,
    slices: &Launch,
    limits: &dyn DeviceLimits,
) -> bool {
    input.bytes() == 2
        && matches!(blocks.scheduling, Scheduling::Clusters(size) if size > 1)
        && launch_waves(slices, limits) < launch_waves(blocks, limits)
}

/// The row kernel's launch: each row one block, or a cluster of blocks, its packs kept in
/// shared memory where they fit ([`slicing`]); `params` its parameters from how it cuts the
/// rows.
fn rows_kernel_launch(
    input: DType,
    (rows, cols): (u32, u32),
    shape: Shape,
    layout: Layout,
    limits: &dyn DeviceLimits,
    params: impl Fn(RowsLaunch) -> Params,
) -> Result<Launch> {
    let aligned = layout == Layout::Aligned;
    let entry = Entry::CrossEntropy(CrossEntropyEntry {
        dtype: input,
        kind: CrossEntropyKind::Rows,
    });
    let slicing = slicing(input, rows, cols, aligned, entry, limits);
    let grid = rows
        .checked_mul(slicing.slices)
        .ok_or_else(|| too_large(shape, "more blocks than a grid holds"))?;
    if limits.blocks_per_sm(entry, CROSS_ENTROPY_THREADS, slicing.shared_bytes) == 0 {
        return Err(not_resident("cross-entropy", shape));
    }
    Ok(Launch {
        entry,
        grid,
        block: CROSS_ENTROPY_THREADS,
        shared_bytes: slicing.shared_bytes,
        // A row of several blocks is one cluster of them.
        scheduling: Scheduling::exchanging(slicing.slices, true),
        // A row of several blocks is one cluster, which exchanges through shared memory.
        params: params(RowsLaunch {
            slices: slicing.slices,
            slice_packs: 0,
            cached: slicing.cached,
            aligned,
            exchange: false,
            stagger: Stagger::NONE,
        }),
    })
}

/// How the row kernel cuts and keeps its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowSlicing {
    slices: u32,
    cached: bool,
    shared_bytes: u32,
}

/// The fewest slices per row (1, or a cluster of up to [`MAX_CLUSTER_BLOCKS`] where the
/// device has clusters and the rows are read in packs) whose share fits in shared memory with
/// [`BLOCKS_PER_SM`] blocks per multiprocessor; more, while the rows leave most
/// multiprocessors idle and every thread still has a pack. Rows too wide for that take one
/// block that reads its row twice.
fn slicing(
    input: DType,
    rows: u32,
    cols: u32,
    aligned: bool,
    entry: Entry,
    limits: &dyn DeviceLimits,
) -> RowSlicing {
    let uncached = RowSlicing {
        slices: 1,
        cached: false,
        shared_bytes: CLUSTER_SHARED_BYTES,
    };
    let pack = u64::from(16 / input.bytes());
    // Rows read one element at a time are one slice of no packs, every column a tail column.
    let packs = if aligned { u64::from(cols) / pack } else { 0 };
    let tail = u64::from(cols) - packs * pack;
    let most = if limits.thread_block_clusters() && aligned {
        MAX_CLUSTER_BLOCKS
    } else {
        1
    };
    let fits = |slices: u32| {
        let kept = (packs.div_ceil(u64::from(slices)) * pack + tail) * u64::from(input.bytes());
        let bytes = u64::from(CLUSTER_SHARED_BYTES) + kept.next_multiple_of(16);
        let bytes = u32::try_from(bytes)
            .ok()
            .filter(|&b| b <= limits.max_shared_per_block())?;
        let resident = limits.blocks_per_sm(entry, CROSS_ENTROPY_THREADS, bytes) >= BLOCKS_PER_SM
            && (slices == 1
                || limits.active_clusters(entry, CROSS_ENTROPY_THREADS, bytes, slices) > 0);
        resident.then_some(RowSlicing {
            slices,
            cached: true,
            shared_bytes: bytes,
        })
    };
    let Some(mut chosen) = (1..=most).find_map(fits) else {
        return uncached;
    };
    let busy = 2 * limits.multiprocessors();
    while u64::from(rows) * u64::from(chosen.slices) < u64::from(busy)
        && chosen.slices < most
        && packs / u64::from(chosen.slices + 1) >= u64::from(CROSS_ENTROPY_THREADS)
    {
        match fits(chosen.slices + 1) {
            Some(more) => chosen = more,
            None => break,
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::{FakeH200, FakeH200WithoutClusters, shape};

    /// The one launch of a call without prologue or epilogue: the rows'.
    fn only_launch(
        input: DType,
        block_entries: bool,
        layout: Layout,
        (rows, cols): (usize, usize),
        limits: &dyn DeviceLimits,
    ) -> Launch {
        let launches = plan(
            input,
            (false, false),
            block_entries,
            shape(rows, cols),
            layout,
            limits,
        )
        .unwrap();
        assert_eq!(launches.len(), 1);
        launches[0]
    }

    fn rows_launch(input: DType, rows: usize, cols: usize, limits: &dyn DeviceLimits) -> Launch {
        only_launch(input, false, Layout::Aligned, (rows, cols), limits)
    }

    fn slicing_of(launch: &Launch) -> (u32, bool) {
        match launch.params {
            Params::CrossEntropy { slices, cached, .. } => (slices, cached),
            _ => panic!("not a cross-entropy launch: {launch:?}"),
        }
    }

    #[test]
    fn rows_that_fit_twice_in_shared_memory_are_kept_there_whole() {
        let launch = rows_launch(DType::Bf16, 4096, 32000, &FakeH200);
        assert_eq!(slicing_of(&launch), (1, true));
        assert_eq!(
            (launch.grid, launch.scheduling),
            (4096, Scheduling::Ordinary)
        );
        assert_eq!(launch.shared_bytes, CLUSTER_SHARED_BYTES + 64000);
    }

    #[test]
    fn wider_rows_are_cut_into_the_fewest_slices_of_a_cluster_that_keep_them() {
        // 513 KB rows: five slices of about 103 KB, two to a multiprocessor.
        let launches = plan(
            DType::F32,
            (true, true),
            false,
            shape(4096, 128256),
            Layout::Aligned,
            &FakeH200,
        )
        .unwrap();
        assert_eq!(launches.len(), 3);
        assert!(matches!(
            launches[0].entry,
            Entry::CrossEntropy(CrossEntropyEntry {
                kind: CrossEntropyKind::Totals,
                ..
            })
        ));
        let rows = launches[1];
        assert_eq!(slicing_of(&rows), (5, true));
        assert_eq!(
            (rows.grid, rows.scheduling),
            (5 * 4096, Scheduling::Clusters(5))
        );
        assert_eq!(
            rows.shared_bytes,
            CLUSTER_SHARED_BYTES + 128256 / 4 / 5 * 16 + 16
        );
    }

    #[test]
    fn few_rows_take_more_slices_to_fill_the_multiprocessors() {
        let launch = rows_launch(DType::Bf16, 4, 128256, &FakeH200);
        assert_eq!(slicing_of(&launch), (MAX_CLUSTER_BLOCKS, true));
        // Every thread still has a pack: 1000 columns do not take a slice each.
        assert_eq!(
            slicing_of(&rows_launch(DType::F32, 1, 1000, &FakeH200)),
            (1, true)
        );
    }

    #[test]
    fn without_clusters_or_room_a_row_is_one_block_that_reads_it_twice() {
        let sm80 = FakeH200WithoutClusters { sm90_build: false };
        let launch = rows_launch(DType::F32, 4096, 128256, &sm80);
        assert_eq!(slicing_of(&launch), (1, false));
        assert_eq!(launch.shared_bytes, CLUSTER_SHARED_BYTES);
        // 32 MB rows do not fit sixteen blocks' shared memory.
        let launch = rows_launch(DType::F32, 2, 8 << 20, &FakeH200);
        assert_eq!(slicing_of(&launch), (1, false));
    }

    #[test]
    fn unaligned_rows_read_one_element_at_a_time() {
        let launches = plan(
            DType::F32,
            (false, false),
            false,
            shape(8, 1001),
            Layout::Elements,
            &FakeH200,
        )
        .unwrap();
        assert!(matches!(
            launches[0].params,
            Params::CrossEntropy {
                aligned: false,
                cached: true,
                slices: 1,
                ..
            }
        ));
        // Kept one element after another: 1001 f32, rounded up to 16 bytes.
        assert_eq!(launches[0].shared_bytes, CLUSTER_SHARED_BYTES + 4016);
        // Not in clusters, however few the rows.
        let launches = plan(
            DType::Bf16,
            (false, false),
            false,
            shape(2, 50257),
            Layout::Elements,
            &FakeH200,
        )
        .unwrap();
        assert_eq!(slicing_of(&launches[0]), (1, true));
    }

    /// The launch bounds ptx-builder gives the row kernels are the planner's block size and
    /// blocks per multiprocessor.
    #[test]
    fn the_row_kernels_launch_bounds_are_the_plans() {
        let rows = [DType::F32, DType::Bf16, DType::F16].map(|dtype| {
            Entry::CrossEntropy(CrossEntropyEntry {
                dtype,
                kind: CrossEntropyKind::Rows,
            })
        });
        crate::plan::tests::assert_launch_bounds(rows, CROSS_ENTROPY_THREADS, BLOCKS_PER_SM);
    }

    #[test]
    fn clusters_the_driver_cannot_schedule_leave_one_block_a_row() {
        let unschedulable = FakeH200WithoutClusters { sm90_build: true };
        let launch = rows_launch(DType::F16, 4096, 128256, &unschedulable);
        assert_eq!(slicing_of(&launch), (1, false));
        // A row that fits one block is still kept whole.
        let launch = rows_launch(DType::F16, 4096, 32000, &unschedulable);
        assert_eq!(slicing_of(&launch), (1, true));
    }

    /// The rows launch of a call that can take the block entries.
    fn block_entries_launch(input: DType, rows: usize, cols: usize) -> Launch {
        only_launch(input, true, Layout::Aligned, (rows, cols), &FakeH200)
    }

    /// `(threads, packs per thread, slices, slice_packs, scheduling)` of a block-entries launch.
    fn block_slicing(launch: &Launch) -> (u32, u32, u32, u32, Scheduling) {
        match (launch.entry, launch.params) {
            (
                Entry::Operation(k),
                Params::CrossEntropy {
                    slices,
                    slice_packs,
                    ..
                },
            ) if k.direction == Direction::CrossEntropy => (
                launch.block,
                k.packs,
                slices,
                slice_packs,
                launch.scheduling,
            ),
            _ => panic!("not a block-entries launch: {launch:?}"),
        }
    }

    #[test]
    fn training_shapes_take_the_block_entries_as_the_forward_is_planned() {
        // bf16 rows of 32000 columns: whole rows, 512 threads of 8 packs.
        let whole = block_entries_launch(DType::Bf16, 8192, 32000);
        assert_eq!(
            block_slicing(&whole),
            (512, 8, 1, 4000, Scheduling::Ordinary)
        );
        // Clusters in waves of 256-thread blocks, where row slices would not run in fewer
        // waves.
        let waves = block_entries_launch(DType::Bf16, 64, 262144);
        assert_eq!(
            block_slicing(&waves),
            (256, 8, 16, 2048, Scheduling::Clusters(16))
        );
        // f32 in clusters of at most 8 blocks: 8192×32000 in 4; wider rows take another
        // cross-entropy entry (row slices in waves).
        let f32_waves = block_entries_launch(DType::F32, 8192, 32000);
        assert_eq!(
            block_slicing(&f32_waves),
            (256, 8, 4, 2000, Scheduling::Clusters(4))
        );
        for (rows, cols) in [(4096, 128256), (2048, 262144), (16384, 151936)] {
            let wide = block_entries_launch(DType::F32, rows, cols);
            assert!(
                matches!(wide.entry, Entry::CrossEntropy(_)),
                "{rows}×{cols}"
            );
        }
        // A few rows: the slices of one cooperative launch, which exchange through the
        // workspace.
        let few = block_entries_launch(DType::F32, 1, 128256);
        let (_, _, slices, _, scheduling) = block_slicing(&few);
        assert!(
            slices > 16 && scheduling == Scheduling::Cooperative,
            "{few:?}"
        );
        let needs = crate::plan::workspace_needs(&[few]);
        assert!(needs.partials >= 2 * few.grid as usize && needs.barrier_words > 0);
    }

    /// The row-slices entries start their first wave as the softmax's row slices in waves
    /// of the same shape do; the block entries and the row kernel start every row at once.
    #[test]
    fn row_slices_in_waves_take_the_softmax_stagger_and_no_other_launch_does() {
        let stagger = |launch: &Launch| match launch.params {
            Params::CrossEntropy { stagger, .. } => stagger,
            _ => panic!("not a cross-entropy launch: {launch:?}"),
        };
        for (input, rows, cols) in [(DType::Bf16, 4096, 128256), (DType::F32, 2048, 262144)] {
            let sliced = block_entries_launch(input, rows, cols);
            let entry = Entry::CrossEntropy(CrossEntropyEntry {
                dtype: input,
                kind: CrossEntropyKind::Slices,
            });
            assert_eq!(sliced.entry, entry, "{input:?} {rows}×{cols}");
            let softmax =
                variants::row_slices_in_waves_launch_of(entry, shape(rows, cols), input, &FakeH200)
                    .unwrap();
            let Params::RowSlices {
                stagger: planned, ..
            } = softmax.params
            else {
                panic!("{softmax:?}");
            };
            assert!(planned.rows > 0 && planned.ns > 0, "{planned:?}");
            assert_eq!(stagger(&sliced), planned, "{input:?} {rows}×{cols}");
        }
        let whole = block_entries_launch(DType::Bf16, 8192, 32000);
        assert_eq!(stagger(&whole), Stagger::NONE);
        let row_kernel = rows_launch(DType::Bf16, 4096, 128256, &FakeH200);
        assert_eq!(stagger(&row_kernel), Stagger::NONE);
    }

    #[test]
    fn calls_the_block_entries_cannot_take_keep_the_row_kernel() {
        // Not asked (label smoothing, a softcap, a shard), rows not aligned for packs, or rows
        // only two launches over slices could reduce.
        let row_kernel = |block_entries, layout, rows, cols| {
            let launch = only_launch(DType::F32, block_entries, layout, (rows, cols), &FakeH200);
            matches!(launch.entry, Entry::CrossEntropy(_))
        };
        assert!(row_kernel(false, Layout::Aligned, 4096, 32000));
        assert!(row_kernel(true, Layout::Elements, 4096, 32001));
        // Aligned rows that end in part of a pack (a padded vocabulary's pitch).
        assert!(row_kernel(true, Layout::Aligned, 4096, 32001));
        assert!(row_kernel(true, Layout::Aligned, 32, 1 << 20));
    }

    proptest::proptest! {
        /// Every block-entries plan keeps the kernels' contract: its slices cover the row,
        /// each within its block's slots, a cluster of at most 16 blocks the driver can
        /// schedule, or a cooperative launch whose blocks are all resident.
        #[test]
        fn block_entries_plans_keep_the_contract(
            rows in 1usize..20_000,
            cols in 1usize..2_400_000,
            input in proptest::sample::select(vec![DType::F32, DType::Bf16]),
            sm80 in proptest::bool::ANY,
        ) {
            let pack = 16 / input.bytes() as usize;
            let packs = cols / pack;
            // The sm_80 build has no clusters: its sliced rows are cooperative.
            let without_clusters = FakeH200WithoutClusters { sm90_build: false };
            let device: &dyn DeviceLimits = if sm80 { &without_clusters } else { &FakeH200 };
            let launch = only_launch(input, true, Layout::Aligned, (rows, cols), device);
            if let Entry::Operation(k) = launch.entry {
                proptest::prop_assert_eq!(cols % pack, 0);
                let (threads, per_thread, slices, slice_packs, scheduling) = block_slicing(&launch);
                proptest::prop_assert!(slices as usize * slice_packs as usize >= packs);
                proptest::prop_assert!(threads * per_thread >= slice_packs);
                proptest::prop_assert_eq!(launch.grid as usize, rows * slices as usize);
                match scheduling {
                    Scheduling::Clusters(blocks) => {
                        proptest::prop_assert!(!sm80);
                        proptest::prop_assert!(blocks == slices && slices <= MAX_CLUSTER_BLOCKS);
                        proptest::prop_assert!(FakeH200.active_clusters(launch.entry, threads, launch.shared_bytes, slices) > 0);
                    }
                    Scheduling::Cooperative => {
                        let resident = u64::from(FakeH200.blocks_per_sm(Entry::Operation(k), threads, launch.shared_bytes)) * 132;
                        proptest::prop_assert!(u64::from(launch.grid) <= resident);
                    }
                    Scheduling::Ordinary => proptest::prop_assert_eq!(slices, 1),
                }
            }
        }
    }

    #[test]
    fn more_slices_for_few_rows_never_leave_a_thread_without_a_pack() {
        for cols in [4096, 10000, 32000, 50257, 128256, 262144] {
            for rows in [1, 2, 3, 8, 33] {
                let launch = rows_launch(DType::F32, rows, cols, &FakeH200);
                let (slices, _) = slicing_of(&launch);
                assert!(
                    slices == 1 || cols / 4 / slices as usize >= CROSS_ENTROPY_THREADS as usize,
                    "{rows}×{cols}: {slices} slices"
                );
            }
        }
    }

    #[test]
    fn launches_exchange_through_the_workspace_exactly_where_a_rows_blocks_meet_in_memory() {
        let sm80 = FakeH200WithoutClusters { sm90_build: false };
        for device in [&FakeH200 as &dyn DeviceLimits, &sm80] {
            for input in [DType::F32, DType::Bf16, DType::F16] {
                for rows in [1, 2, 16, 200, 4096] {
                    for cols in [1000, 32000, 128256, 262144, 1 << 20] {
                        for block_entries in [false, true] {
                            let shape = shape(rows, cols);
                            let Ok(launches) = plan(
                                input,
                                (true, true),
                                block_entries,
                                shape,
                                Layout::Aligned,
                                device,
                            ) else {
                                continue;
                            };
                            for launch in launches {
                                let Params::CrossEntropy {
                                    exchange, slices, ..
                                } = launch.params
                                else {
                                    panic!("not a cross-entropy launch: {launch:?}");
                                };
                                let row_slices = matches!(
                                    launch.entry,
                                    Entry::CrossEntropy(CrossEntropyEntry {
                                        kind: CrossEntropyKind::Slices,
                                        ..
                                    })
                                );
                                let meets_in_memory = (row_slices && slices > 1)
                                    || launch.scheduling == Scheduling::Cooperative;
                                assert_eq!(exchange, meets_in_memory, "{launch:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rows_in_waves_take_the_row_slices_entries_where_they_run_in_fewer_waves() {
        let entry = |input, rows, cols, device: &dyn DeviceLimits| {
            let launch = only_launch(input, true, Layout::Aligned, (rows, cols), device);
            match launch.entry {
                Entry::CrossEntropy(CrossEntropyEntry {
                    kind: CrossEntropyKind::Slices,
                    ..
                }) => {
                    assert_eq!(launch.scheduling, Scheduling::Ordinary, "{launch:?}");
                    assert!(matches!(
                        launch.params,
                        Params::CrossEntropy { cached: true, .. }
                    ));
                    let needs = crate::plan::workspace_needs(&[launch]);
                    assert!(needs.partials >= 2 * launch.grid as usize, "{launch:?}");
                    assert!(
                        needs.barrier_words >= 3 * launch.grid as usize,
                        "{launch:?}"
                    );
                    Some(CrossEntropyKind::Slices)
                }
                Entry::CrossEntropy(CrossEntropyEntry { kind, .. }) => Some(kind),
                _ => None,
            }
        };
        let (slices, blocks, row_kernel) = (
            Some(CrossEntropyKind::Slices),
            None,
            Some(CrossEntropyKind::Rows),
        );
        for (input, rows, cols, expected) in [
            // The training shapes of the performance log, and the GPU tests' (the leaving
            // test's among them: bf16 200×128256, f32 160×262144, f16 200×128256).
            (DType::Bf16, 4096, 128256, slices),
            (DType::Bf16, 16384, 151936, slices),
            (DType::Bf16, 2048, 262144, slices),
            (DType::F32, 4096, 128256, slices),
            (DType::F32, 2048, 262144, slices),
            (DType::F32, 16384, 151936, slices),
            (DType::Bf16, 200, 128256, slices),
            (DType::Bf16, 300, 128256, slices),
            (DType::F32, 160, 262144, slices),
            (DType::F16, 200, 128256, slices),
            // Whole rows, clusters in waves where row slices take no fewer waves (bf16
            // 64×262144), f32 clusters in waves and one cooperative launch keep the block
            // entries;
            (DType::Bf16, 8192, 32000, blocks),
            (DType::Bf16, 64, 262144, blocks),
            (DType::F32, 8192, 32000, blocks),
            (DType::F32, 2, 128256, blocks),
            // rows they do not take that row slices would run in one wave keep the row
            // kernel.
            (DType::F32, 16, 32000, row_kernel),
            (DType::Bf16, 64, 151936, row_kernel),
        ] {
            assert_eq!(
                entry(input, rows, cols, &FakeH200),
                expected,
                "{input:?} {rows}×{cols}"
            );
        }
        // Without clusters (the sm_80 build), where row slices in waves were not measured:
        // the row kernel.
        let sm80 = FakeH200WithoutClusters { sm90_build: false };
        assert_eq!(
            entry(DType::Bf16, 2048, 262144, &sm80),
            Some(CrossEntropyKind::Rows)
        );
        // Rows that end in part of a pack: the row kernel.
        assert_eq!(
            entry(DType::Bf16, 2048, 262143, &FakeH200),
            Some(CrossEntropyKind::Rows)
        );
    }
}
