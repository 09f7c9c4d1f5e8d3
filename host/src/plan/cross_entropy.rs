//! Planning a cross-entropy call: each row one block, or a thread-block cluster of blocks
//! that each hold a slice of it, kept in shared memory where two blocks still fit a
//! multiprocessor (else one block that reads its row twice); the one-block prologue and
//! epilogue where the call needs them.

use kernels_gpu::launch::MAX_CLUSTER_BLOCKS;
use kernels_gpu::launch::REDUCTION_SCRATCH_FLOATS;
use kernels_gpu::launch::cross_entropy::{
    CROSS_ENTROPY_THREADS, CrossEntropyEntry, CrossEntropyKind,
};
use kernels_gpu::launch::ops::DType;

use super::{
    CLUSTER_SHARED_BYTES, DeviceLimits, Entry, Launch, Layout, Params, Scheduling, not_resident,
    rows_and_cols, too_large,
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
/// loss is reduced.
pub(crate) fn plan(
    input: DType,
    totals: bool,
    reduce: bool,
    shape: Shape,
    layout: Layout,
    limits: &dyn DeviceLimits,
) -> Result<Vec<Launch>> {
    let (rows, cols) = rows_and_cols(shape)?;
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
            cached: false,
            aligned: false,
            workspace: true,
            totals,
        },
    };
    let mut launches = Vec::with_capacity(3);
    if totals {
        launches.push(one_block(CrossEntropyKind::Totals));
    }
    launches.push(Launch {
        entry,
        grid,
        block: CROSS_ENTROPY_THREADS,
        shared_bytes: slicing.shared_bytes,
        scheduling: if slicing.slices > 1 {
            Scheduling::Clusters(slicing.slices)
        } else {
            Scheduling::Ordinary
        },
        params: Params::CrossEntropy {
            rows,
            slices: slicing.slices,
            cached: slicing.cached,
            aligned,
            workspace: totals || reduce,
            totals,
        },
    });
    if reduce {
        launches.push(one_block(CrossEntropyKind::Reduce));
    }
    Ok(launches)
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

    fn rows_launch(input: DType, rows: usize, cols: usize, limits: &dyn DeviceLimits) -> Launch {
        let launches = plan(
            input,
            false,
            false,
            shape(rows, cols),
            Layout::Aligned,
            limits,
        )
        .unwrap();
        assert_eq!(launches.len(), 1);
        launches[0]
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
            true,
            true,
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
            false,
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
            false,
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
}
