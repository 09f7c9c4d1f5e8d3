//! Planning a sampling call: a block per row, its row kept in shared memory where it fits
//! beside the histogram and the candidates (with filters), or drawn in one pass by the draw
//! entry (greedy or temperature alone); for greedy and temperature alone on at most a row a
//! multiprocessor, a block per slice of a row and a merge of the slices' draws; for one small
//! top-k (rows of at most 262,144 columns), the candidate path (a block per slice of 8192
//! columns, then a block per row); then the one-thread launch that advances the random offset
//! where the call advances it (the merge of sliced draws advances it itself).

use kernels_gpu::launch::WARP_SIZE;
use kernels_gpu::launch::ops::DType;
use kernels_gpu::launch::sampling::{
    SAMPLING_THREADS, SLICE_TOP_WORDS, SamplingEntry, SamplingKind, TOP_K_MAX_SLICES,
    TOP_K_MERGE_SHARED_BYTES, TOP_K_SHARED_BYTES, TOP_K_SLICE_COLS, sampling_shared_bytes,
};

use super::{
    DeviceLimits, Entry, Launch, Layout, Params, SamplingWork, Scheduling, not_resident,
    rows_and_cols, too_large,
};
use crate::error::Result;
use crate::shape::Shape;

/// Threads per block of the merge launch, whose every warp merges a row.
const MERGE_THREADS: u32 = 256;

/// Rows a block of the merge launch merges.
const MERGE_ROWS: u32 = {
    assert!(MERGE_THREADS.is_multiple_of(WARP_SIZE));
    MERGE_THREADS / WARP_SIZE
};

/// Blocks of the draw entry a multiprocessor holds at once (its launch bounds): a sliced call
/// aims for one wave of them.
const BLOCKS_PER_SM: u32 = 2;

/// What a sampling call launches: the rows (or their slices, then the merge; or the
/// candidate path's slices, then its merge), then the advance where `advance`.
pub(crate) fn plan(
    input: DType,
    advance: bool,
    work: SamplingWork,
    shape: Shape,
    layout: Layout,
    limits: &dyn DeviceLimits,
) -> Result<Vec<Launch>> {
    let (rows, cols) = rows_and_cols(shape)?;
    // Columns are counted in f32 by the bisection, exactly up to 2^24.
    if cols > 1 << 24 {
        return Err(too_large(
            shape,
            "sampling takes rows of at most 2^24 columns",
        ));
    }
    let entry = |kind| Entry::Sampling(SamplingEntry { dtype: input, kind });
    let aligned = layout == Layout::Aligned;
    let candidate_slices = cols.div_ceil(TOP_K_SLICE_COLS);
    // The candidate path: since its slices compare only the keys at least a bound of their
    // `k`-th, it took less time than the row kernel on 256 rows too (performance log, "The
    // candidate path's slices compare few keys"). Its workspace, `SLICE_TOP_WORDS` words a
    // slice of every row, is kept to a quarter of the logits beyond a row a multiprocessor
    // (narrow rows in large batches take the row kernel).
    let workspace_bytes = u64::from(candidate_slices) * u64::from(SLICE_TOP_WORDS) * 4;
    let row_bytes = u64::from(cols) * u64::from(input.bytes());
    let candidates = work == SamplingWork::TopK
        && candidate_slices <= TOP_K_MAX_SLICES
        && (rows <= limits.multiprocessors() || 4 * workspace_bytes <= row_bytes);
    let mut launches = if candidates {
        let slices_entry = entry(SamplingKind::TopSlices);
        let merge_entry = entry(SamplingKind::TopMerge);
        if limits.blocks_per_sm(slices_entry, SAMPLING_THREADS, TOP_K_SHARED_BYTES) == 0
            || limits.blocks_per_sm(merge_entry, SAMPLING_THREADS, TOP_K_MERGE_SHARED_BYTES) == 0
        {
            return Err(not_resident("sampling", shape));
        }
        let params = Params::Sampling {
            cached: false,
            aligned,
            slices: candidate_slices,
            slice_cols: TOP_K_SLICE_COLS,
            rows,
            candidates: true,
            advances: false,
        };
        let grid = rows
            .checked_mul(candidate_slices)
            .ok_or_else(|| too_large(shape, "more blocks than a grid holds"))?;
        [
            (slices_entry, grid, TOP_K_SHARED_BYTES),
            (merge_entry, rows, TOP_K_MERGE_SHARED_BYTES),
        ]
        .map(|(entry, grid, shared_bytes)| Launch {
            entry,
            grid,
            block: SAMPLING_THREADS,
            shared_bytes,
            scheduling: Scheduling::Ordinary,
            params,
        })
        .to_vec()
    } else {
        rows_launches(input, advance, work, shape, (rows, cols), aligned, limits)?
    };
    let advanced = launches
        .iter()
        .any(|launch| matches!(launch.params, Params::Sampling { advances: true, .. }));
    if advance && !advanced {
        launches.push(Launch {
            entry: entry(SamplingKind::Advance),
            grid: 1,
            block: 1,
            shared_bytes: 0,
            scheduling: Scheduling::Ordinary,
            params: launches[0].params,
        });
    }
    Ok(launches)
}

/// The launches of a call that the candidate path does not take: a block per row (the row
/// kernel with filters, else the draw kernel), or for greedy and temperature alone on few
/// rows, a block per slice and the merge, which reads no random state and so advances the
/// offset itself where `advance`. `(rows, cols)`: `shape`'s, as [`plan`] checked them.
fn rows_launches(
    input: DType,
    advance: bool,
    work: SamplingWork,
    shape: Shape,
    (rows, cols): (u32, u32),
    aligned: bool,
    limits: &dyn DeviceLimits,
) -> Result<Vec<Launch>> {
    let entry = |kind| Entry::Sampling(SamplingEntry { dtype: input, kind });
    let filtered = matches!(work, SamplingWork::Filtered | SamplingWork::TopK);
    let rows_entry = entry(if filtered {
        SamplingKind::Rows
    } else {
        SamplingKind::Draws
    });
    let row_bytes = u64::from(cols) * u64::from(input.bytes());
    // The draw entry reads its row once: nothing to keep.
    let cached_bytes = u32::try_from(row_bytes).ok().filter(|&bytes| {
        filtered
            && u64::from(sampling_shared_bytes(0)) + u64::from(bytes)
                <= u64::from(limits.max_shared_per_block())
    });
    let fits = |bytes: u32| {
        limits.blocks_per_sm(rows_entry, SAMPLING_THREADS, sampling_shared_bytes(bytes)) > 0
    };
    let cached = cached_bytes.filter(|&bytes| fits(bytes));
    if cached.is_none() && !fits(0) {
        return Err(not_resident("sampling", shape));
    }
    let (slices, slice_cols) = if work == SamplingWork::Sliceable {
        slicing(input, rows, cols, limits)
    } else {
        (1, cols)
    };
    let params = |cached, advances| Params::Sampling {
        cached,
        aligned,
        slices,
        slice_cols,
        rows,
        candidates: false,
        advances,
    };
    let grid = rows
        .checked_mul(slices)
        .ok_or_else(|| too_large(shape, "more blocks than a grid holds"))?;
    let sliced = slices > 1;
    let mut launches = vec![Launch {
        entry: rows_entry,
        grid,
        block: SAMPLING_THREADS,
        shared_bytes: sampling_shared_bytes(if sliced { 0 } else { cached.unwrap_or(0) }),
        scheduling: Scheduling::Ordinary,
        params: params(!sliced && cached.is_some(), false),
    }];
    if sliced {
        launches.push(Launch {
            entry: entry(SamplingKind::Merge),
            grid: rows.div_ceil(MERGE_ROWS),
            block: MERGE_THREADS,
            shared_bytes: 0,
            scheduling: Scheduling::Ordinary,
            params: params(false, advance),
        });
    }
    Ok(launches)
}

/// Slices per row and columns per slice: as many slices as the blocks of one wave hold
/// ([`BLOCKS_PER_SM`] per multiprocessor; a second, nearly empty wave took longer than fewer,
/// larger slices), while every thread of a slice still has a pack; the columns per slice a
/// multiple of 8 (so every slice starts on a 16-byte boundary when its row does), the slices
/// trimmed so that none is empty.
fn slicing(input: DType, rows: u32, cols: u32, limits: &dyn DeviceLimits) -> (u32, u32) {
    let target = BLOCKS_PER_SM * limits.multiprocessors();
    let pack = 16 / input.bytes();
    let most = (cols / (SAMPLING_THREADS * pack)).max(1);
    let slices = (target / rows.max(1)).clamp(1, most);
    if slices == 1 {
        return (1, cols);
    }
    let slice_cols = cols.div_ceil(slices).next_multiple_of(8);
    (cols.div_ceil(slice_cols), slice_cols)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::FakeH200;
    use kernels_gpu::launch::sampling::SLICE_TOP_WORDS;

    #[test]
    fn rows_that_fit_beside_the_histogram_are_kept_in_shared_memory() {
        let plan = |cols: usize, dtype| {
            plan(
                dtype,
                true,
                SamplingWork::Filtered,
                Shape::new(4, cols).unwrap(),
                Layout::Aligned,
                &FakeH200,
            )
            .unwrap()
        };
        let narrow = plan(32_000, DType::Bf16);
        assert_eq!(narrow.len(), 2);
        assert!(matches!(
            narrow[0].params,
            Params::Sampling { cached: true, .. }
        ));
        assert_eq!(narrow[0].grid, 4);
        assert_eq!(narrow[0].block, SAMPLING_THREADS);
        let wide = plan(262_144, DType::F32);
        assert!(matches!(
            wide[0].params,
            Params::Sampling { cached: false, .. }
        ));
        assert_eq!(wide[0].shared_bytes, sampling_shared_bytes(0));
    }

    #[test]
    fn the_row_kernels_launch_bounds_are_the_plans() {
        let of = |kind| {
            [DType::F32, DType::Bf16, DType::F16]
                .map(|dtype| Entry::Sampling(SamplingEntry { dtype, kind }))
        };
        crate::plan::tests::assert_launch_bounds(of(SamplingKind::Rows), SAMPLING_THREADS, 1);
        for kind in [
            SamplingKind::Draws,
            SamplingKind::TopSlices,
            SamplingKind::TopMerge,
        ] {
            crate::plan::tests::assert_launch_bounds(of(kind), SAMPLING_THREADS, BLOCKS_PER_SM);
        }
    }

    #[test]
    fn a_small_top_k_takes_the_candidate_path_where_its_slices_fit() {
        let plan = |cols: usize| {
            plan(
                DType::Bf16,
                true,
                SamplingWork::TopK,
                Shape::new(3, cols).unwrap(),
                Layout::Aligned,
                &FakeH200,
            )
            .unwrap()
        };
        let kind = |launch: &Launch| match launch.entry {
            Entry::Sampling(SamplingEntry { kind, .. }) => kind,
            other => panic!("{other:?}"),
        };
        let launches = plan(50_257);
        let kinds: Vec<_> = launches.iter().map(kind).collect();
        assert_eq!(
            kinds,
            [
                SamplingKind::TopSlices,
                SamplingKind::TopMerge,
                SamplingKind::Advance
            ]
        );
        assert_eq!((launches[0].grid, launches[1].grid), (3 * 7, 3));
        assert_eq!(
            (launches[0].shared_bytes, launches[1].shared_bytes),
            (TOP_K_SHARED_BYTES, TOP_K_MERGE_SHARED_BYTES)
        );
        assert_eq!(
            launches[0].needs().row_stats,
            3 * 7 * SLICE_TOP_WORDS as usize
        );
        // 32 slices at most; wider rows take the row kernel with its filters. Batches larger
        // than the device take the candidate path too.
        assert_eq!(plan(262_144)[0].grid, 3 * 32);
        let wide = plan(262_145);
        assert_eq!(kind(&wide[0]), SamplingKind::Rows);
        assert_eq!(wide.len(), 2);
        let many = f32_plan(SamplingWork::TopK, false, 1000, 32_000);
        assert_eq!(kind(&many[0]), SamplingKind::TopSlices);
        assert_eq!((many[0].grid, many[1].grid), (1000 * 4, 1000));
        // Narrow rows in a large batch: the workspace would pass a quarter of the logits.
        let narrow = |rows| f32_plan(SamplingWork::TopK, false, rows, 1000);
        assert_eq!(kind(&narrow(1000)[0]), SamplingKind::Rows);
        assert_eq!(kind(&narrow(132)[0]), SamplingKind::TopSlices);
    }

    #[test]
    fn greedy_and_temperature_alone_take_the_draw_entry_without_a_cache() {
        for work in [SamplingWork::Drawn, SamplingWork::Sliceable] {
            let launches = plan(
                DType::Bf16,
                false,
                work,
                Shape::new(512, 32_000).unwrap(),
                Layout::Aligned,
                &FakeH200,
            )
            .unwrap();
            assert_eq!(launches.len(), 1);
            assert_eq!(
                launches[0].entry,
                Entry::Sampling(SamplingEntry {
                    dtype: DType::Bf16,
                    kind: SamplingKind::Draws
                })
            );
            assert!(matches!(
                launches[0].params,
                Params::Sampling {
                    cached: false,
                    slices: 1,
                    ..
                }
            ));
            assert_eq!(launches[0].shared_bytes, sampling_shared_bytes(0));
        }
    }

    /// The plan of an f32 call on aligned rows on the stand-in H200.
    fn f32_plan(work: SamplingWork, advance: bool, rows: usize, cols: usize) -> Vec<Launch> {
        plan(
            DType::F32,
            advance,
            work,
            Shape::new(rows, cols).unwrap(),
            Layout::Aligned,
            &FakeH200,
        )
        .unwrap()
    }

    #[test]
    fn the_advance_follows_only_where_the_call_advances() {
        let launches = plan(
            DType::F32,
            false,
            SamplingWork::Filtered,
            Shape::new(2, 100).unwrap(),
            Layout::Elements,
            &FakeH200,
        )
        .unwrap();
        assert_eq!(launches.len(), 1);
    }

    #[test]
    fn few_rows_of_temperature_alone_are_sliced_and_merged() {
        let launches = plan(
            DType::Bf16,
            true,
            SamplingWork::Sliceable,
            Shape::new(1, 262_144).unwrap(),
            Layout::Aligned,
            &FakeH200,
        )
        .unwrap();
        // The slices, then the merge, which advances the offset: no launch of its own.
        assert_eq!(launches.len(), 2);
        assert!(matches!(
            launches[1].params,
            Params::Sampling { advances: true, .. }
        ));
        let Params::Sampling {
            slices, slice_cols, ..
        } = launches[0].params
        else {
            panic!("{:?}", launches[0].params)
        };
        assert_eq!((slices, launches[0].grid), (64, 64));
        assert_eq!(slice_cols % 8, 0);
        // A warp merges a row: 8 rows a block of the merge.
        assert_eq!((launches[1].grid, launches[1].block % WARP_SIZE), (1, 0));
        let merges = f32_plan(SamplingWork::Sliceable, false, 17, 32_000);
        assert_eq!(merges[1].grid, 3);
        assert!(slice_cols * (slices - 1) < 262_144 && slice_cols * slices >= 262_144);
        // Enough rows fill the device: no slices.
        let launches = f32_plan(SamplingWork::Sliceable, true, 512, 32_000);
        assert_eq!(launches.len(), 2);
        assert_eq!(launches[0].grid, 512);
        // Blocks of one wave at most (two a multiprocessor): 64 rows take 4 slices, not 5.
        let launches = f32_plan(SamplingWork::Sliceable, false, 64, 32_000);
        assert_eq!(launches[0].grid, 64 * 4);
        assert!(matches!(
            launches[1].params,
            Params::Sampling {
                advances: false,
                ..
            }
        ));
    }
}
