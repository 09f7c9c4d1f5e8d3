//! The operation kernels (any element type, options, strides, backward, partial states):
//! which instance runs a shape, with what grid and slicing, and how the buffers of a call meet
//! 16-byte packs.

use kernels_gpu::launch::ops::{
    DType, Direction, OP_ROWS_BLOCK, OpInstance, OpKernelShape, PackLayout,
};

use super::{
    BLOCK_SHARED_BYTES, DeviceLimits, Entry, FEW_WHOLE_OPERATION_ROW_BYTES, FEW_WHOLE_ROW_PACKS,
    Launch, OperationMode, OperationPass, Params, Scheduling, Slicing, WAVE_CLUSTER_THREADS,
    WHOLE_SMALL_OPERATION_ROW_BYTES, cluster_shared_bytes, clusters_in_waves, slices_form_clusters,
};
use crate::shape::Shape;

/// Device address and row stride of one buffer a call touches, for the layout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub address: u64,
    pub stride_bytes: u64,
    pub element_bytes: u32,
}

/// How 16-byte packs of `input` fit the operands of a `direction` call: every row of every
/// operand aligned for its share of a pack and `cols` a multiple of it
/// ([`PackLayout::Aligned`]); or, where the direction has peeled entries (no masks), rows at
/// least a pack long and every operand 16-byte aligned with one row stride in elements, so
/// that rows are misaligned alike and each row's head ends on a 16-byte boundary
/// ([`PackLayout::Peeled`]); else one element at a time.
pub(crate) fn layout(
    input: DType,
    direction: Direction,
    cols: usize,
    operands: &[Operand],
) -> PackLayout {
    let pack = input.vector_pack();
    let aligned = cols.is_multiple_of(pack as usize)
        && operands.iter().all(|o| {
            let align = u64::from((pack * o.element_bytes).min(16));
            o.address.is_multiple_of(align) && o.stride_bytes.is_multiple_of(align)
        });
    let stride = |o: &Operand| o.stride_bytes / u64::from(o.element_bytes);
    // A row shorter than a pack may end before its first 16-byte boundary; the peeled
    // kernels' one-access ends rely on the head reaching it.
    let peelable = PackLayout::Peeled.serves(direction)
        && cols >= pack as usize
        && operands
            .iter()
            .all(|o| o.address.is_multiple_of(16) && stride(o) == stride(&operands[0]));
    if aligned {
        PackLayout::Aligned
    } else if peelable {
        PackLayout::Peeled
    } else {
        PackLayout::Elements
    }
}

/// How an operation runs: one launch over whole rows, or over slices of rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpLaunch {
    pub kernel: OpInstance,
    pub grid: u32,
    /// Blocks per row: with `slices > 1` and `split == false`, one launch whose blocks
    /// exchange their statistics (in clusters or cooperative, per `clustered`).
    pub slices: u32,
    pub slice_packs: u32,
    /// Two ordinary launches over the same grid: each block stores its slice's state, then
    /// every block merges its row's states and writes (the input is read twice, the second
    /// time mostly from L2). For rows too many or too wide to keep resident at once.
    pub split: bool,
    /// A sliced row's blocks form one thread-block cluster and exchange their statistics
    /// through distributed shared memory (sm_90); otherwise a cooperative launch whose blocks
    /// exchange them through global memory.
    pub clustered: bool,
}

impl OpLaunch {
    /// Threads per block: the group kernels' fixed block, or the block kernel's row block.
    pub fn block(&self) -> u32 {
        match self.kernel.shape {
            OpKernelShape::Rows { .. } => OP_ROWS_BLOCK,
            OpKernelShape::Block { threads } => threads,
        }
    }

    /// Dynamic shared memory: the block reduction's scratch, for block kernels only, and in
    /// clusters the slots the cluster's warps push their statistics into.
    pub fn shared_bytes(&self) -> u32 {
        match self.kernel.shape {
            OpKernelShape::Rows { .. } => 0,
            OpKernelShape::Block { threads } if self.clustered => {
                cluster_shared_bytes(Entry::Operation(self.kernel), threads, self.slices)
            }
            OpKernelShape::Block { .. } => BLOCK_SHARED_BYTES,
        }
    }
}

/// Packs per thread of the blocks that slice rows into clusters in waves
/// ([`clusters_in_waves`]): 32 KB of a 16-bit row, 16 KB of an f32 one.
const WAVE_CLUSTER_PACKS: u32 = 8;

/// Fewest threads of a block that holds a slice of a row (rather than a whole row).
const MIN_SLICE_THREADS: u32 = 128;

/// 16-byte packs per lane the group kernels aim for: the per-row work (addresses, reductions, the
/// row's constants) that every lane repeats is spread over more elements, and each lane has
/// that many loads in flight.
const LANE_PACKS: u32 = 2;

/// The launches of a call in `mode` that runs as `launch`; `None` for row states on rows
/// that need two launches (no launch reduces a whole row, so its state cannot be stored in
/// one pass).
pub(crate) fn launches(launch: OpLaunch, mode: OperationMode) -> Option<Vec<Launch>> {
    let slicing = Slicing {
        slices: launch.slices,
        slice_packs: launch.slice_packs,
    };
    // Two launches over slices are ordinary: their blocks do not wait for each other.
    let exchanging = if launch.split { 1 } else { launch.slices };
    let scheduling = Scheduling::exchanging(exchanging, launch.clustered);
    let pass = |pass| Launch {
        entry: Entry::Operation(launch.kernel),
        grid: launch.grid,
        block: launch.block(),
        shared_bytes: launch.shared_bytes(),
        scheduling,
        params: Params::Operation { pass, slicing },
    };
    match (launch.split, mode) {
        (true, OperationMode::States) => None,
        (true, OperationMode::Full) => Some(vec![
            pass(OperationPass::SliceStatesToWorkspace),
            pass(OperationPass::ApplyWorkspaceStates),
        ]),
        _ => Some(vec![pass(OperationPass::Call)]),
    }
}

/// The launch for `shape` laid out as `layout` (`None` only when no block instance can launch
/// on this device). `layout` must serve `direction` ([`PackLayout::serves`]).
pub(crate) fn plan(
    direction: Direction,
    input: DType,
    shape: Shape,
    layout: PackLayout,
    device: &dyn DeviceLimits,
) -> Option<OpLaunch> {
    plan_packed(direction, input, shape, layout, device)
        .map(|launch| kept_where_few(launch, device))
}

/// `launch` on its instance's kept twin ([`OpInstance::kept_twin`]) where it has one and every
/// block of the launch stays resident at once with it: a launch of few blocks a
/// multiprocessor is bound by issuing instructions, which keeping each element's exponential
/// spares, while a launch of many wants the packed entry's residency (performance log:
/// "Pushed clusters of up to 16 on many blocks; kept exponentials in the block family").
fn kept_where_few(launch: OpLaunch, device: &dyn DeviceLimits) -> OpLaunch {
    let Some(twin) = launch.kernel.kept_twin() else {
        return launch;
    };
    if launch.split {
        return launch;
    }
    let kept = OpLaunch {
        kernel: twin,
        ..launch
    };
    let entry = Entry::Operation(twin);
    let resident = device.blocks_per_sm(entry, kept.block(), kept.shared_bytes());
    let all_resident =
        u64::from(kept.grid) <= u64::from(device.multiprocessors()) * u64::from(resident);
    let clusters_fit = !kept.clustered
        || device.active_clusters(entry, kept.block(), kept.shared_bytes(), kept.slices) > 0;
    if resident > 0 && all_resident && clusters_fit {
        kept
    } else {
        launch
    }
}

/// [`plan`] among the packed instances.
fn plan_packed(
    direction: Direction,
    input: DType,
    shape: Shape,
    layout: PackLayout,
    device: &dyn DeviceLimits,
) -> Option<OpLaunch> {
    let (rows, cols) = (shape.rows() as u32, shape.cols() as u32);
    debug_assert!(
        layout.serves(direction),
        "{layout:?} has no {direction:?} entries"
    );
    let vector = layout != PackLayout::Elements;
    let pack = layout.pack(input);
    // Slots a group needs beyond its body packs: the row's head and tail (a block holds them
    // apart from its body's slots).
    let ends = layout.end_slots();
    // Whole packs of the row's body (at most; an unaligned row's body may have one less).
    let row_packs = cols / pack;
    let instances = OpInstance::instances(direction, input, layout);

    // Narrow rows: a group of lanes per row. With 16-byte packs, each lane takes about
    // `LANE_PACKS` of them (at least two lanes once the row has two packs: a warp's load
    // then covers whole 32-byte sectors of each row); single elements, one per lane. Where
    // the tables have no group that wide, the next wider one that holds the row.
    let slots = row_packs + ends;
    let lane_packs = if vector { LANE_PACKS } else { 1 };
    let wanted_lanes = slots
        .div_ceil(lane_packs)
        .next_power_of_two()
        .clamp(slots.min(2), 32);
    let group = instances
        .clone()
        .filter(|k| matches!(k.shape, OpKernelShape::Rows { lanes } if lanes >= wanted_lanes))
        .filter(|k| k.slots() >= slots)
        .min_by_key(|k| (k.threads_per_row(), k.packs));
    if let Some(kernel) = group {
        return Some(OpLaunch {
            kernel,
            grid: rows.div_ceil(OP_ROWS_BLOCK / kernel.threads_per_row()),
            slices: 1,
            slice_packs: row_packs,
            split: false,
            clustered: false,
        });
    }

    let blocks = block_instances(instances, device);
    let launch = |kernel: OpInstance, slices: u32| OpLaunch {
        kernel,
        grid: rows.saturating_mul(slices),
        slices,
        slice_packs: row_packs.div_ceil(slices),
        split: false,
        clustered: false,
    };
    let whole = whole_rows(&blocks, row_packs);
    let fills_gpu = whole.is_some_and(|(_, r)| {
        u64::from(rows) >= u64::from(device.multiprocessors()) * u64::from(r)
    });
    // Forward rows of at most `WHOLE_SMALL_OPERATION_ROW_BYTES` stay whole however few they are.
    let small = direction == Direction::Forward
        && u64::from(cols) * u64::from(input.bytes()) <= WHOLE_SMALL_OPERATION_ROW_BYTES;
    if let Some((k, _)) = whole.filter(|_| fills_gpu || small) {
        return Some(launch(k, 1));
    }
    // Forward rows of at most `FEW_WHOLE_OPERATION_ROW_BYTES`, at most a row a multiprocessor:
    // whole too, in the smallest block of `FEW_WHOLE_ROW_PACKS` packs a thread that holds one.
    let few_small = direction == Direction::Forward
        && rows <= device.multiprocessors()
        && u64::from(cols) * u64::from(input.bytes()) <= FEW_WHOLE_OPERATION_ROW_BYTES;
    let few_whole = blocks
        .iter()
        .filter(|(k, _)| k.packs == FEW_WHOLE_ROW_PACKS && k.slots() >= row_packs)
        .min_by_key(|(k, _)| k.threads_per_row());
    if let Some(&(k, _)) = few_whole.filter(|_| few_small) {
        return Some(launch(k, 1));
    }
    // Slices go to blocks of at least `MIN_SLICE_THREADS` (the small blocks of the masked and
    // single-element tables serve narrow whole rows; a row cut into 32-thread slices spends
    // more on its exchange than it saves).
    let sliceable: Vec<(OpInstance, u32)> = blocks
        .iter()
        .copied()
        .filter(|(k, _)| k.threads_per_row() >= MIN_SLICE_THREADS)
        .collect();
    let blocks = if sliceable.is_empty() {
        blocks
    } else {
        sliceable
    };
    // Few rows: slices of the row in as many blocks as can be resident at once, at most one
    // slice per thread (the statistics exchange reads one each). First the most packs per
    // thread (fewer slices, so less exchange; among equals the smallest block) whose blocks
    // still cover every multiprocessor; failing that (one or two rows), the fewest packs per
    // thread (the most blocks). It won on the multi-row shapes and changed nothing on single
    // rows (performance log: "Odd widths peeled, and the cooperative slicing rule").
    let sliced = |&(k, resident): &(OpInstance, u32)| {
        let slices = row_packs.div_ceil(k.slots());
        let fits = slices > 1
            && slices <= k.threads_per_row()
            && u64::from(rows) * u64::from(slices)
                <= u64::from(device.multiprocessors()) * u64::from(resident);
        fits.then(|| launch(k, slices))
    };
    let mut fewest_packs_first = blocks.clone();
    fewest_packs_first.sort_by_key(|&(k, _)| (k.packs, k.threads_per_row()));
    let mut most_packs_first = blocks.clone();
    most_packs_first.sort_by_key(|&(k, _)| (std::cmp::Reverse(k.packs), k.threads_per_row()));
    let cooperative = device.cooperative_launch().then(|| {
        most_packs_first
            .iter()
            .filter_map(sliced)
            .find(|launch| launch.grid >= device.multiprocessors())
            .or_else(|| fewest_packs_first.iter().find_map(sliced))
    });
    if let Some(Some(sliced)) = cooperative {
        // On sm_90, as one thread-block cluster per row where the slices are few enough.
        let entry = Entry::Operation(sliced.kernel);
        let clustered = slices_form_clusters(device, entry, sliced.block(), sliced.slices);
        return Some(OpLaunch {
            clustered,
            ..sliced
        });
    }
    // Otherwise two launches over slices from the instance that keeps the most data per
    // multiprocessor in registers.
    let (k, _) = blocks
        .iter()
        .max_by_key(|&&(k, resident)| {
            (
                resident * k.capacity(),
                std::cmp::Reverse(k.threads_per_row()),
            )
        })
        .copied()?;
    let slices = row_packs.div_ceil(k.slots()).max(1);
    if slices == 1 {
        return Some(launch(k, 1));
    }
    Some(OpLaunch {
        split: true,
        ..launch(k, slices)
    })
}

/// The block instances among `instances` that can launch on `device`, with the blocks of
/// each resident on a multiprocessor at once.
fn block_instances(
    instances: impl Iterator<Item = OpInstance>,
    device: &dyn DeviceLimits,
) -> Vec<(OpInstance, u32)> {
    let scratch = BLOCK_SHARED_BYTES;
    instances
        .filter(|k| matches!(k.shape, OpKernelShape::Block { .. }))
        .map(|k| {
            let threads = k.threads_per_row();
            (
                k,
                device.blocks_per_sm(Entry::Operation(k), threads, scratch),
            )
        })
        .filter(|&(_, resident)| resident > 0)
        .collect()
}

/// The instance for whole rows of `row_packs` packs: most rows resident per multiprocessor,
/// then the smallest instance; with its resident blocks.
fn whole_rows(blocks: &[(OpInstance, u32)], row_packs: u32) -> Option<(OpInstance, u32)> {
    blocks
        .iter()
        .filter(|(k, _)| k.slots() >= row_packs)
        .max_by_key(|&&(k, resident)| (resident, std::cmp::Reverse(k.capacity())))
        .copied()
}

/// A forward or cross-entropy call in clusters in waves ([`clusters_in_waves`]): rows that no
/// whole-row block keeps two to a multiprocessor, cut into blocks of 256 threads of 8 packs
/// (16-byte packs only), one thread-block cluster per row. `None` where the rule does not take them.
pub(crate) fn plan_in_waves(
    direction: Direction,
    input: DType,
    shape: Shape,
    layout: PackLayout,
    device: &dyn DeviceLimits,
) -> Option<OpLaunch> {
    let served = matches!(direction, Direction::Forward | Direction::CrossEntropy);
    if !served || layout == PackLayout::Elements {
        return None;
    }
    let (rows, row_packs) = (
        shape.rows() as u32,
        shape.cols() as u32 / layout.pack(input),
    );
    let blocks = block_instances(OpInstance::instances(direction, input, layout), device);
    let whole_resident = whole_rows(&blocks, row_packs).map_or(0, |(_, resident)| resident);
    let (kernel, _) = blocks.into_iter().find(|(k, _)| {
        k.threads_per_row() == WAVE_CLUSTER_THREADS && k.packs == WAVE_CLUSTER_PACKS
    })?;
    let slices = row_packs.div_ceil(kernel.slots());
    let entry = Entry::Operation(kernel);
    let threads = kernel.threads_per_row();
    clusters_in_waves(device, entry, threads, rows, slices, whole_resident).then(|| OpLaunch {
        kernel,
        grid: rows.saturating_mul(slices),
        slices,
        slice_packs: row_packs.div_ceil(slices),
        split: false,
        clustered: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PORTABLE_CLUSTER_BLOCKS;
    use crate::plan::tests::{FakeH200, FakeH200WithoutClusters, shape};
    use kernels_gpu::launch::MAX_CLUSTER_BLOCKS;
    use kernels_gpu::launch::REDUCTION_SCRATCH_FLOATS;

    fn plan_op(
        direction: Direction,
        input: DType,
        rows: u32,
        cols: u32,
        layout: PackLayout,
        device: &dyn DeviceLimits,
    ) -> Option<OpLaunch> {
        // As a full call plans: clusters in waves first.
        let shape = shape(rows as usize, cols as usize);
        plan_in_waves(direction, input, shape, layout, device)
            .or_else(|| plan(direction, input, shape, layout, device))
    }

    const LAYOUTS: [PackLayout; 3] = [
        PackLayout::Elements,
        PackLayout::Aligned,
        PackLayout::Peeled,
    ];

    fn planned(direction: Direction, input: DType, rows: u32, cols: u32) -> Option<OpLaunch> {
        plan_op(direction, input, rows, cols, PackLayout::Aligned, &FakeH200)
    }

    /// What every plan must satisfy for the kernels' contract: its instance's pack, slices
    /// covering the row's body, every slice's packs (and the ends, when peeled) within the
    /// instance's slots, and every block of a cooperative launch resident.
    fn check(launch: &OpLaunch, input: DType, cols: u32, layout: PackLayout) -> Result<(), String> {
        let k = launch.kernel;
        let pack = layout.pack(input);
        let ends = k.end_slots();
        if k.layout != layout || k.input != input {
            return Err(format!("{k} for {input:?} laid out as {layout:?}"));
        }
        if launch.slices * launch.slice_packs < cols / pack {
            return Err(format!("{cols} columns, {k}: slices do not cover the row"));
        }
        if k.slots() < launch.slice_packs + ends {
            return Err(format!(
                "{cols} columns, {k}: {} packs + {ends} ends do not fit",
                launch.slice_packs
            ));
        }
        if launch.slices > 1 && !launch.split && launch.slices > k.threads_per_row() {
            return Err(format!("{cols} columns, {k}: more slices than threads"));
        }
        // Clusters may run in waves: only a cooperative launch needs every block resident.
        if launch.slices > 1 && !launch.split && !launch.clustered {
            let resident = 132
                * FakeH200.blocks_per_sm(
                    Entry::Operation(k),
                    launch.block(),
                    launch.shared_bytes(),
                );
            if launch.grid > resident {
                return Err(format!("{cols} columns, {k}: not all resident"));
            }
        }
        // Pushed cluster slots: the scratch, then two floats per warp per block of the row.
        let pushed =
            (REDUCTION_SCRATCH_FLOATS + 2 * launch.block().div_ceil(32) * launch.slices) * 4;
        if launch.clustered
            && k.direction != Direction::CrossEntropy
            && launch.shared_bytes() != pushed
        {
            return Err(format!(
                "{cols} columns, {k}: not the pushed cluster's shared memory"
            ));
        }
        if launch.clustered
            && FakeH200.active_clusters(
                Entry::Operation(k),
                launch.block(),
                launch.shared_bytes(),
                launch.slices,
            ) == 0
        {
            return Err(format!(
                "{cols} columns, {k}: its clusters cannot be scheduled"
            ));
        }
        if launch.clustered
            && (launch.split
                || !(2..=MAX_CLUSTER_BLOCKS).contains(&launch.slices)
                || !matches!(k.shape, OpKernelShape::Block { .. }))
        {
            return Err(format!(
                "{cols} columns, {k}: {} slices cannot form a cluster",
                launch.slices
            ));
        }
        Ok(())
    }

    #[test]
    fn rows_misaligned_alike_are_peeled_only_when_at_least_a_pack_long() {
        // bf16 rows of a pitch of 6 elements (12 bytes): misaligned alike, equal strides.
        let bf16 = |address: u64| Operand {
            address,
            stride_bytes: 12,
            element_bytes: 2,
        };
        let operands = [bf16(0), bf16(1 << 20)];
        for direction in [Direction::Forward, Direction::Backward] {
            // Four columns, half a pack: row 3 starts at byte 36 and ends at 44, short of the
            // boundary at 48, so its head would not end on one.
            assert_eq!(
                layout(DType::Bf16, direction, 4, &operands),
                PackLayout::Elements
            );
            assert_eq!(
                layout(DType::Bf16, direction, 5, &operands),
                PackLayout::Elements
            );
        }
        // A pitch of 12 elements (24 bytes) with rows of a pack or more: peeled.
        let wide = |address: u64| Operand {
            address,
            stride_bytes: 24,
            element_bytes: 2,
        };
        let operands = [wide(0), wide(1 << 20)];
        for cols in [8, 9, 12] {
            assert_eq!(
                layout(DType::Bf16, Direction::Forward, cols, &operands),
                PackLayout::Peeled
            );
        }
        // f32: two columns at a pitch of 3 elements, and eight at a pitch of 9.
        let f32 = |stride_bytes: u64, address: u64| Operand {
            address,
            stride_bytes,
            element_bytes: 4,
        };
        let narrow = [f32(12, 0), f32(12, 1 << 20)];
        assert_eq!(
            layout(DType::F32, Direction::Backward, 2, &narrow),
            PackLayout::Elements
        );
        let long = [f32(36, 0), f32(36, 1 << 20)];
        assert_eq!(
            layout(DType::F32, Direction::Backward, 8, &long),
            PackLayout::Peeled
        );
    }

    #[test]
    fn every_planned_instance_holds_its_row_and_stays_resident() {
        for input in DType::ALL {
            for direction in Direction::ALL {
                for (rows, cols) in [
                    (4096, 32),
                    (1000, 1000),
                    (65536, 100),
                    (256, 16384),
                    (8, 128256),
                    (32, 151936),
                    (1, 1_048_576),
                    (3, 100_003),
                    (128, 50257),
                    (6400, 16383),
                    (7, 5),
                    (16, 8192),
                    (16, 6001),
                    (16, 32000),
                    (16, 50257),
                ] {
                    for layout in LAYOUTS {
                        let unaligned =
                            layout == PackLayout::Aligned && cols % input.vector_pack() != 0;
                        if unaligned || !layout.serves(direction) {
                            continue;
                        }
                        let launch = plan_op(direction, input, rows, cols, layout, &FakeH200)
                            .expect("every shape plans");
                        check(&launch, input, cols, layout).unwrap();
                    }
                }
            }
        }
    }

    /// Columns of a row of `cols` starting `row_start` elements past a 16-byte boundary
    /// that the launch's shares cover, each walked over its instance's slots as the kernels'
    /// `Slots` layouts walk them: how many times each column is covered.
    fn coverage<const PACK: usize>(launch: &OpLaunch, cols: u32, row_start: usize) -> Vec<u8> {
        use kernels_gpu::primitives::row_part::{Piece, Share, unaligned_head};

        let bytes = 16 / PACK;
        let head = unaligned_head(row_start * bytes, bytes, PACK);
        let mut covered = vec![0u8; cols as usize];
        for slice in 0..launch.slices as usize {
            let share = Share {
                cols: cols as usize,
                slice,
                slice_packs: launch.slice_packs as usize,
            };
            let k = launch.kernel;
            let part = share.peeled::<PACK>(head);
            // A peeled block's ends: one more slot of its first two threads.
            let apart_ends = match (k.layout, k.shape) {
                (PackLayout::Peeled, OpKernelShape::Block { .. }) => vec![0, 1],
                _ => vec![],
            };
            let body = (0..k.slots() as usize).map(|j| match (k.layout, k.shape) {
                (PackLayout::Peeled, OpKernelShape::Rows { .. }) => part.piece::<PACK>(j),
                (PackLayout::Peeled, OpKernelShape::Block { .. }) => part.body_pack::<PACK>(j),
                _ => {
                    let (first, count) = share.aligned_packs::<PACK>();
                    if j < count {
                        Piece::Pack((first + j) * PACK)
                    } else {
                        Piece::Nothing
                    }
                }
            });
            let ends = apart_ends.into_iter().map(|end| part.end_piece(end));
            for (j, piece) in body.chain(ends).enumerate() {
                let (start, count) = match piece {
                    Piece::Pack(col) => (col, PACK),
                    Piece::Run { start, count } => (start, count),
                    Piece::Nothing => continue,
                };
                assert!(
                    start + count <= cols as usize,
                    "slot {j} of slice {slice} leaves the row"
                );
                // The kernels read and write a run of half a pack in one access: it must be
                // aligned to its length, which the planner ensures by peeling only rows at
                // least a pack long.
                if 2 * count == PACK && cols as usize >= PACK {
                    assert!(
                        (row_start + start).is_multiple_of(count),
                        "slot {j} of slice {slice}: a half pack at column {start} is misaligned"
                    );
                }
                for times in &mut covered[start..start + count] {
                    *times += 1;
                }
            }
        }
        covered
    }

    #[test]
    fn planned_parts_cover_every_column_once() {
        for input in DType::ALL {
            for (rows, cols) in [
                (4096u32, 32u32),
                (65536, 100),
                (256, 16384),
                (3, 100_003),
                (128, 50257),
                (6400, 16383),
                (7, 5),
                (1, 1_048_576),
                (16, 8192),
                (16, 6001),
                (16, 32000),
                (16, 50257),
            ] {
                for layout in LAYOUTS {
                    let pack = input.vector_pack();
                    let (cols, starts) = match layout {
                        PackLayout::Elements => (cols, 0..1),
                        PackLayout::Aligned => (cols.next_multiple_of(pack), 0..1),
                        PackLayout::Peeled => (cols, 0..pack as usize),
                    };
                    let launch =
                        plan_op(Direction::Forward, input, rows, cols, layout, &FakeH200).unwrap();
                    for row_start in starts {
                        let covered = match launch.kernel.pack() {
                            1 => coverage::<1>(&launch, cols, row_start),
                            4 => coverage::<4>(&launch, cols, row_start),
                            _ => coverage::<8>(&launch, cols, row_start),
                        };
                        assert!(
                            covered.iter().all(|&n| n == 1),
                            "{input:?} {rows}x{cols} {layout:?} start {row_start}: {launch:?}"
                        );
                    }
                }
            }
        }
    }

    /// A block holds a peeled row's ends apart from its body's slots, so a row one element
    /// short of an aligned width runs on the aligned width's instance (with the ends among
    /// the slots, bf16 16383 columns took an instance twice as large, at a third of the speed).
    /// Under the model's occupancy, which does not see the extra slot's registers: on a card
    /// the driver's count may still pick another instance.
    #[test]
    fn peeled_block_rows_plan_as_their_aligned_neighbour() {
        for input in [DType::Bf16, DType::F32] {
            for (rows, cols) in [(6400, 16384), (2048, 4096), (1024, 8192), (32, 151_936)] {
                let aligned = planned(Direction::Forward, input, rows, cols).unwrap();
                let peeled = plan_op(
                    Direction::Forward,
                    input,
                    rows,
                    cols - 1,
                    PackLayout::Peeled,
                    &FakeH200,
                )
                .unwrap();
                assert!(matches!(peeled.kernel.shape, OpKernelShape::Block { .. }));
                assert_eq!(
                    (peeled.kernel.shape, peeled.kernel.packs, peeled.slices),
                    (aligned.kernel.shape, aligned.kernel.packs, aligned.slices),
                    "{input:?} {rows}x{}",
                    cols - 1
                );
            }
        }
    }

    /// Row states need a whole row in one launch where the rows cannot all stay resident:
    /// single elements hold up to 8192 columns in one block, as before the tables shrank.
    #[test]
    fn single_element_rows_up_to_8192_columns_reduce_in_one_block() {
        for cols in [4097, 8192] {
            let launch = plan_op(
                Direction::Forward,
                DType::F32,
                100_000,
                cols,
                PackLayout::Elements,
                &FakeH200,
            )
            .unwrap();
            assert_eq!(launch.slices, 1, "{cols}");
            assert!(launches(launch, OperationMode::States).is_some(), "{cols}");
        }
    }

    /// The small blocks of the masked and single-element tables never take slices of a wide
    /// row; a narrow one stays whole in one block.
    #[test]
    fn slices_go_to_blocks_of_at_least_128_threads() {
        for (direction, layout) in [
            (Direction::MaskedForward, PackLayout::Aligned),
            (Direction::Forward, PackLayout::Elements),
        ] {
            for (rows, cols) in [(1, 32000), (128, 50256), (3, 100_000)] {
                let launch =
                    plan_op(direction, DType::Bf16, rows, cols, layout, &FakeH200).unwrap();
                assert!(launch.slices > 1, "{direction:?} {rows}x{cols}");
                assert!(
                    launch.kernel.threads_per_row() >= MIN_SLICE_THREADS,
                    "{direction:?} {rows}x{cols}: {:?}",
                    launch.kernel
                );
            }
        }
        let narrow = plan_op(
            Direction::MaskedForward,
            DType::Bf16,
            10,
            1024,
            PackLayout::Aligned,
            &FakeH200,
        )
        .unwrap();
        assert_eq!(narrow.slices, 1);
    }

    #[test]
    fn few_small_forward_rows_stay_whole_and_wider_or_backward_ones_are_sliced() {
        // 8 KB rows (4096 bf16, 2048 f32): a block each, however few.
        for (input, cols) in [(DType::Bf16, 4096), (DType::F32, 2048)] {
            for rows in [1, 16, 256, 1024] {
                let launch = planned(Direction::Forward, input, rows, cols).unwrap();
                assert_eq!(
                    (launch.slices, launch.clustered, launch.grid),
                    (1, false, rows),
                    "{input:?} {rows}×{cols}"
                );
            }
        }
        // Up to 16 KB, at most a row a multiprocessor: whole, in the smallest block of four
        // packs a thread that holds the row (8192 bf16: 256 threads).
        for (input, cols) in [(DType::Bf16, 4104), (DType::Bf16, 8192), (DType::F32, 4096)] {
            for rows in [1, 16, 132] {
                let launch = planned(Direction::Forward, input, rows, cols).unwrap();
                assert_eq!(
                    (launch.slices, launch.clustered, launch.grid),
                    (1, false, rows),
                    "{input:?} {rows}×{cols}"
                );
                assert_eq!(launch.kernel.packs, FEW_WHOLE_ROW_PACKS);
                let body = cols / launch.kernel.pack();
                assert!(launch.kernel.slots() / 2 < body, "{launch:?}");
            }
        }
        // More rows than multiprocessors, wider rows, or the backward pass: sliced as before.
        for (direction, rows, cols) in [
            (Direction::Forward, 133, 8192),
            (Direction::Forward, 16, 8200),
            (Direction::Backward, 16, 4096),
        ] {
            let launch = planned(direction, DType::Bf16, rows, cols).unwrap();
            assert!(launch.slices > 1, "{direction:?} {rows}×{cols}: {launch:?}");
        }
    }

    #[test]
    fn forward_launches_of_few_blocks_take_the_kept_twin() {
        // Few rows of 8-pack threads, sliced in clusters or whole: every block resident at once.
        for (rows, cols) in [(16, 128256), (64, 32000), (9, 128256)] {
            let launch = planned(Direction::Forward, DType::Bf16, rows, cols).unwrap();
            assert_eq!(launch.kernel.packs, 8, "{rows}×{cols}: {launch:?}");
            assert!(launch.kernel.kept, "{rows}×{cols}: {launch:?}");
        }
        // Many rows keep the packed entry's residency; fewer packs have no twin.
        for (rows, cols) in [(4096, 32000), (1024, 8192), (16, 8192), (32, 32000)] {
            let launch = planned(Direction::Forward, DType::Bf16, rows, cols).unwrap();
            assert!(!launch.kernel.kept, "{rows}×{cols}: {launch:?}");
        }
        // The backward pass has none.
        let backward = planned(Direction::Backward, DType::Bf16, 16, 128256).unwrap();
        assert!(!backward.kernel.kept, "{backward:?}");
    }

    #[test]
    fn sliced_rows_form_clusters_of_up_to_16_blocks_in_every_direction() {
        // bf16 32000 columns: 16 slices of 128 threads a row, in clusters however many blocks
        // the launch has (16 rows: 256 blocks).
        for rows in [1, 8, 9, 16] {
            let launch = planned(Direction::Forward, DType::Bf16, rows, 32000).unwrap();
            assert_eq!(
                (launch.slices, launch.clustered),
                (16, true),
                "{rows} rows: {launch:?}"
            );
        }
        // The backward pass, the masked forward and cross-entropy too.
        for (direction, cols) in [
            (Direction::Backward, 32000),
            (Direction::MaskedForward, 65536),
            (Direction::CrossEntropy, 32000),
        ] {
            let launch = planned(direction, DType::Bf16, 16, cols).unwrap();
            assert!(
                launch.clustered && launch.slices > PORTABLE_CLUSTER_BLOCKS,
                "{direction:?}: {launch:?}"
            );
        }
        // Peeled rows and f16 as well.
        let peeled = plan_op(
            Direction::Forward,
            DType::F16,
            16,
            32001,
            PackLayout::Peeled,
            &FakeH200,
        )
        .unwrap();
        assert!(
            peeled.slices > PORTABLE_CLUSTER_BLOCKS && peeled.clustered,
            "{peeled:?}"
        );
    }

    #[test]
    fn narrow_rows_share_warps_and_wide_few_rows_are_sliced() {
        let narrow = planned(Direction::Forward, DType::Bf16, 4096, 32).unwrap();
        assert_eq!(narrow.kernel.shape, OpKernelShape::Rows { lanes: 2 });
        assert_eq!(narrow.kernel.packs, 2);
        // One element at a time: a group of 32 lanes, then a block of 4 slots a thread.
        for (cols, shape) in [
            (3, OpKernelShape::Rows { lanes: 32 }),
            (32, OpKernelShape::Rows { lanes: 32 }),
            (100, OpKernelShape::Block { threads: 32 }),
        ] {
            let odd = plan_op(
                Direction::Forward,
                DType::Bf16,
                65536,
                cols,
                PackLayout::Elements,
                &FakeH200,
            );
            assert_eq!(odd.unwrap().kernel.shape, shape, "{cols}");
        }
        // Peeled, 100 bf16 columns are 12 body packs and the two ends: 8 lanes of 2 slots.
        let peeled = plan_op(
            Direction::Forward,
            DType::Bf16,
            65536,
            100,
            PackLayout::Peeled,
            &FakeH200,
        )
        .unwrap();
        assert_eq!(peeled.kernel.layout, PackLayout::Peeled);
        assert_eq!(peeled.kernel.pack(), 8);
        assert_eq!(peeled.kernel.shape, OpKernelShape::Rows { lanes: 8 });
        let medium = planned(Direction::Forward, DType::Bf16, 4096, 256).unwrap();
        assert_eq!(medium.kernel.shape, OpKernelShape::Rows { lanes: 16 });
        assert_eq!(medium.kernel.packs, 2);
        let llm = planned(Direction::Forward, DType::F32, 8, 128256).unwrap();
        assert!(llm.slices > 1, "{llm:?}");
        let backward = planned(Direction::Backward, DType::F32, 1, 1 << 20).unwrap();
        assert!(backward.slices > 1 && !backward.split);
        // A few wide rows: the fewest slices (most packs per thread) that still give every
        // multiprocessor a block; a single row, as many blocks as can be resident.
        let few = planned(Direction::Forward, DType::Bf16, 16, 262_144).unwrap();
        assert!(few.grid >= 132 && few.kernel.packs == 8, "{few:?}");
        let one = planned(Direction::Forward, DType::Bf16, 1, 128_256).unwrap();
        assert_eq!(one.kernel.packs, 2, "{one:?}");
        assert!(!one.clustered && one.slices > MAX_CLUSTER_BLOCKS, "{one:?}");
        let launch = launches(one, OperationMode::Full).unwrap()[0];
        assert_eq!(launch.scheduling, Scheduling::Cooperative);
        // Slices few enough for a cluster form one (sm_90); the same slices otherwise run
        // in a cooperative launch.
        let small = planned(Direction::Forward, DType::Bf16, 1, 32000).unwrap();
        assert!(small.clustered && small.slices == 16, "{small:?}");
        for (input, rows, cols, layout) in [
            (DType::F32, 1, 16000, PackLayout::Aligned),
            (DType::Bf16, 4, 32000, PackLayout::Aligned),
            (DType::F16, 3, 30001, PackLayout::Peeled),
        ] {
            for direction in [Direction::Forward, Direction::Backward] {
                let launch = plan_op(direction, input, rows, cols, layout, &FakeH200).unwrap();
                assert!(launch.clustered, "{direction:?} {rows}x{cols}: {launch:?}");
            }
        }
        let launch = launches(small, OperationMode::Full).unwrap()[0];
        assert_eq!(launch.scheduling, Scheduling::Clusters(16));
        // The scratch, then two floats for every warp of every block of the cluster: 128
        // threads, 16 blocks.
        assert_eq!(
            launch.shared_bytes,
            (REDUCTION_SCRATCH_FLOATS + 2 * 4 * 16) * 4
        );
        let shape = shape(1, 32000);
        let without = plan(
            Direction::Forward,
            DType::Bf16,
            shape,
            PackLayout::Aligned,
            &FakeH200WithoutClusters { sm90_build: false },
        )
        .unwrap();
        assert_eq!(
            without,
            OpLaunch {
                clustered: false,
                ..small
            }
        );
        let launch = launches(without, OperationMode::Full).unwrap()[0];
        assert_eq!(launch.scheduling, Scheduling::Cooperative);
    }

    proptest::proptest! {
        /// Any shape plans, in any layout, and the plan satisfies the kernels' contract.
        #[test]
        fn every_shape_plans_and_covers_its_rows(
            rows in 1u32..20_000,
            cols in 1u32..2_000_000,
            input in proptest::sample::select(DType::ALL.to_vec()),
            direction in proptest::sample::select(Direction::ALL.to_vec()),
            layout in proptest::sample::select(LAYOUTS.to_vec()),
            row_start in 0usize..8,
        ) {
            proptest::prop_assume!(layout.serves(direction));
            let cols = if layout == PackLayout::Aligned { cols.next_multiple_of(input.vector_pack()) } else { cols };
            // Both plans a call may take: clusters in waves, and the plan without them (row
            // states, and 16-bit plain softmax's comparison with row-slices).
            let s = shape(rows as usize, cols as usize);
            let in_waves = plan_in_waves(direction, input, s, layout, &FakeH200);
            let without = plan(direction, input, s, layout, &FakeH200).unwrap();
            for launch in in_waves.into_iter().chain([without]) {
                proptest::prop_assert!(check(&launch, input, cols, layout).is_ok(), "{:?}", check(&launch, input, cols, layout));
                // Rows start anywhere only when peeled.
                let row_start = if layout == PackLayout::Peeled { row_start } else { 0 };
                let covered = match launch.kernel.pack() {
                    1 => coverage::<1>(&launch, cols, row_start),
                    4 => coverage::<4>(&launch, cols, row_start),
                    _ => coverage::<8>(&launch, cols, row_start),
                };
                proptest::prop_assert!(covered.iter().all(|&n| n == 1), "{launch:?} from {row_start}");
            }
        }
    }

    /// Clusters in waves serve the forward and cross-entropy directions with 16-byte packs
    /// only, and only where their blocks make a wave and a half.
    #[test]
    fn clusters_in_waves_serve_only_forward_and_cross_entropy_rows_in_packs() {
        let waves = |direction, input, rows, cols, layout, device: &dyn DeviceLimits| {
            plan_in_waves(direction, input, shape(rows, cols), layout, device)
        };
        let aligned = PackLayout::Aligned;
        for input in DType::ALL {
            for direction in [Direction::Forward, Direction::CrossEntropy] {
                let taken = waves(direction, input, 512, 128256, aligned, &FakeH200);
                assert!(taken.is_some_and(|l| l.clustered && !l.split), "{input:?}");
            }
            for (direction, layout) in [
                (Direction::Backward, aligned),
                (Direction::MaskedForward, PackLayout::Elements),
                (Direction::Forward, PackLayout::Elements),
            ] {
                let none = waves(direction, input, 512, 128256, layout, &FakeH200);
                assert!(none.is_none(), "{direction:?} {layout:?}");
            }
            for sm90_build in [false, true] {
                let device = FakeH200WithoutClusters { sm90_build };
                let none = waves(Direction::Forward, input, 512, 128256, aligned, &device);
                assert!(none.is_none(), "{input:?} without clusters");
            }
        }
        // 64 bf16 rows of 151936: 10 blocks each, 640 against 528 resident, under a wave and
        // a half.
        assert!(
            waves(
                Direction::Forward,
                DType::Bf16,
                64,
                151936,
                aligned,
                &FakeH200
            )
            .is_none()
        );
    }

    #[test]
    fn rows_too_many_to_keep_resident_are_split_in_two_launches() {
        let split = planned(Direction::Forward, DType::F32, 600, 200_000).unwrap();
        assert!(split.split && split.slices > 1, "{split:?}");
        for layout in [PackLayout::Elements, PackLayout::Peeled] {
            let odd = plan_op(
                Direction::Forward,
                DType::Bf16,
                128,
                50257,
                layout,
                &FakeH200,
            )
            .unwrap();
            assert!(odd.slices > 1, "{odd:?}");
        }
    }
}
