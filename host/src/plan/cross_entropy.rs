//! Planning a cross-entropy call: a block per row, its packs chosen by the layout, its row
//! kept in shared memory where that leaves the multiprocessor room for more than one block,
//! and the one-block prologue and epilogue where the call needs them.

use kernels_gpu::launch::REDUCTION_SCRATCH_FLOATS;
use kernels_gpu::launch::cross_entropy::{
    CROSS_ENTROPY_THREADS, CrossEntropyEntry, CrossEntropyKind,
};
use kernels_gpu::launch::ops::DType;

use super::{DeviceLimits, Entry, Launch, Layout, Params, Scheduling};
use crate::error::{Error, Result};
use crate::shape::Shape;

/// Threads of the one-block prologue and epilogue.
const ONE_BLOCK_THREADS: u32 = 1024;

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
    let rows = u32::try_from(shape.rows()).map_err(|_| Error::ShapeTooLarge {
        rows: shape.rows(),
        cols: shape.cols(),
        why: "more rows than a grid holds",
    })?;
    let cols = u32::try_from(shape.cols()).map_err(|_| Error::ShapeTooLarge {
        rows: shape.rows(),
        cols: shape.cols(),
        why: "a row of more than 2^32 columns",
    })?;
    let aligned = layout == Layout::Aligned;
    let entry = Entry::CrossEntropy(CrossEntropyEntry {
        dtype: input,
        kind: CrossEntropyKind::Rows,
    });
    let scratch = REDUCTION_SCRATCH_FLOATS * 4;
    let cache = u64::from(cols) * u64::from(input.bytes());
    let cached_bytes = u64::from(scratch) + cache;
    // Keeping the row saves reading it again, but not at the price of the multiprocessor's
    // other blocks: only where two blocks still fit.
    let cached = cached_bytes <= u64::from(limits.max_shared_per_block())
        && limits.blocks_per_sm(entry, CROSS_ENTROPY_THREADS, cached_bytes as u32) >= 2;
    let shared_bytes = if cached { cached_bytes as u32 } else { scratch };
    if limits.blocks_per_sm(entry, CROSS_ENTROPY_THREADS, shared_bytes) == 0 {
        return Err(Error::Unsupported {
            variant: "cross-entropy".into(),
            rows: shape.rows(),
            cols: shape.cols(),
            why: "its block cannot be resident on this device".into(),
        });
    }
    let one_block = |kind| Launch {
        entry: Entry::CrossEntropy(CrossEntropyEntry { dtype: input, kind }),
        grid: 1,
        block: ONE_BLOCK_THREADS,
        shared_bytes: scratch,
        scheduling: Scheduling::Ordinary,
        params: Params::CrossEntropy {
            rows,
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
        grid: rows,
        block: CROSS_ENTROPY_THREADS,
        shared_bytes,
        scheduling: Scheduling::Ordinary,
        params: Params::CrossEntropy {
            rows,
            cached,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::{FakeH200, shape};

    #[test]
    fn rows_that_fit_twice_in_shared_memory_are_kept_there() {
        let h200 = FakeH200;
        let narrow = plan(
            DType::Bf16,
            false,
            false,
            shape(4096, 32000),
            Layout::Aligned,
            &h200,
        )
        .unwrap();
        assert_eq!(narrow.len(), 1);
        assert!(matches!(
            narrow[0].params,
            Params::CrossEntropy { cached: true, .. }
        ));
        let wide = plan(
            DType::F32,
            true,
            true,
            shape(4096, 128256),
            Layout::Aligned,
            &h200,
        )
        .unwrap();
        assert_eq!(wide.len(), 3);
        assert!(matches!(
            wide[1].params,
            Params::CrossEntropy { cached: false, .. }
        ));
        assert_eq!(wide[1].grid, 4096);
        assert!(matches!(
            wide[0].entry,
            Entry::CrossEntropy(CrossEntropyEntry {
                kind: CrossEntropyKind::Totals,
                ..
            })
        ));
    }

    #[test]
    fn unaligned_rows_read_one_element_at_a_time() {
        let h200 = FakeH200;
        let launches = plan(
            DType::F32,
            false,
            false,
            shape(8, 1001),
            Layout::Elements,
            &h200,
        )
        .unwrap();
        assert!(matches!(
            launches[0].params,
            Params::CrossEntropy { aligned: false, .. }
        ));
    }
}
