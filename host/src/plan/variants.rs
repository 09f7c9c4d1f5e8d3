//! The f32 softmax variants: which launches each makes on a shape, with what grid, block,
//! shared memory and arguments.

use kernels_gpu::launch::ops::DType;
use kernels_gpu::launch::softmax::{
    BLOCK_REGISTER_SCALAR_PACKS, BLOCK_REGISTER_SCALAR_THREADS, BLOCK_REGISTER_VECTOR_PACKS,
    BLOCK_REGISTER_VECTOR_THREADS, BlockRegisterInstance, ELEMENTWISE_BLOCK, LOADS_IN_FLIGHT,
    REGISTER_ROWS_BLOCK, REGISTER_SCALAR_INSTANCES, REGISTER_VECTOR_INSTANCES, ROW_SLICE_THREADS,
    RegisterKernelName, RowSlicesKernelName, THREAD_PER_ROW_BLOCK, VECTOR_PACK,
    WARP_PER_ROW_WARPS_PER_BLOCK,
};
use kernels_gpu::launch::{
    MAX_BLOCK_THREADS, MAX_CLUSTER_BLOCKS, REDUCTION_SCRATCH_FLOATS, WARP_SIZE,
};
use kernels_gpu::primitives::barrier_word;

use super::{
    BLOCK_SHARED_BYTES, CLUSTER_SHARED_BYTES, DeviceLimits, Entry, Launch, Layout, Params,
    Scheduling, Slicing, Stagger, WAVE_CLUSTER_THREADS, WHOLE_SMALL_ROW_BYTES,
    cluster_shared_bytes, clusters_in_waves, cooperative_slices_form_clusters, waves_stagger,
    waves_unless_read_once,
};
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::variant::Variant;

/// Elements per access of the kernels that need whole packs from a row's start
/// (rows-in-registers).
fn aligned_pack(layout: Layout) -> u32 {
    if layout == Layout::Aligned {
        VECTOR_PACK
    } else {
        1
    }
}

/// Elements per access of the kernels that peel an unaligned row head (block registers, row
/// slices, row clusters): 16 bytes wherever input and output are misaligned alike.
fn peeled_pack(layout: Layout) -> u32 {
    if layout == Layout::Elements {
        1
    } else {
        VECTOR_PACK
    }
}

/// An ordinary launch of `entry`.
fn ordinary(entry: Entry, grid: u32, block: u32, shared_bytes: u32, params: Params) -> Launch {
    Launch {
        entry,
        grid,
        block,
        shared_bytes,
        scheduling: Scheduling::Ordinary,
        params,
    }
}

/// The launches that compute `variant` on a non-empty `shape`. `BlockPerRowAutotuned` must
/// be resolved to a thread count first.
pub(crate) fn plan(
    variant: Variant,
    shape: Shape,
    layout: Layout,
    device: &dyn DeviceLimits,
) -> Result<Vec<Launch>> {
    let rows = shape.rows() as u32;
    let cols = shape.cols() as u32;
    let unsupported = |why: String| Error::Unsupported {
        variant: variant.name(),
        rows: shape.rows(),
        cols: shape.cols(),
        why,
    };
    let per_row = |entry, rows_per_block: u32, block| {
        let grid = rows.div_ceil(rows_per_block);
        ordinary(entry, grid, block, 0, Params::Rows { rows, cols })
    };
    Ok(match variant {
        Variant::Auto => match register_instance(shape.cols(), layout) {
            Some(instance) => vec![register_launch(instance, rows, cols)],
            None => {
                let resident = match block_registers_launch(shape, layout, device) {
                    Some(launch)
                        if !(launch.scheduling != Scheduling::Ordinary
                            && shape.len() as u64 * 4 >= SLICED_ROW_SLICES_FROM_BYTES) =>
                    {
                        launch
                    }
                    _ => wide_rows_launch(shape, layout, device),
                };
                let clusters = block_registers_in_waves(shape, layout, device);
                let slices = clusters
                    .filter(|l| matches!(l.scheduling, Scheduling::Clusters(blocks) if blocks > F32_CLUSTERS_KEPT_UP_TO))
                    .and_then(|_| {
                        row_slices_in_waves_launch(shape, DType::F32, layout != Layout::Elements, device)
                    });
                waves_unless_read_once(vec![resident], clusters, slices, device)
            }
        },
        Variant::Unfused => unfused_launches(shape, device),
        Variant::ThreadPerRowNaive => vec![per_row(
            Entry::ThreadPerRowNaive,
            THREAD_PER_ROW_BLOCK,
            THREAD_PER_ROW_BLOCK,
        )],
        Variant::ThreadPerRowOnline => vec![per_row(
            Entry::ThreadPerRowOnline,
            THREAD_PER_ROW_BLOCK,
            THREAD_PER_ROW_BLOCK,
        )],
        Variant::WarpPerRowOnline => vec![per_row(
            Entry::WarpPerRowOnline,
            WARP_PER_ROW_WARPS_PER_BLOCK,
            WARP_PER_ROW_WARPS_PER_BLOCK * WARP_SIZE,
        )],
        Variant::BlockPerRowSmem { threads_per_block } => {
            variant.validate()?;
            vec![ordinary(
                Entry::BlockPerRowSmem,
                rows,
                threads_per_block,
                threads_per_block * 4,
                Params::BlockPerRow { cols },
            )]
        }
        Variant::BlockPerRowAutotuned => {
            return Err(unsupported(
                "the autotuned variant is resolved to a thread count before planning".into(),
            ));
        }
        Variant::RowsInRegisters => {
            let instance = register_instance(shape.cols(), layout).ok_or_else(|| {
                unsupported(format!(
                    "rows wider than {} columns do not fit in registers ({} with this alignment)",
                    register_capacity(Layout::Aligned),
                    register_capacity(layout)
                ))
            })?;
            vec![register_launch(instance, rows, cols)]
        }
        Variant::BlockRegisters => {
            vec![
                block_registers_in_waves(shape, layout, device)
                    .or_else(|| block_registers_launch(shape, layout, device))
                    .ok_or_else(|| {
                        unsupported(
                            "the row (or the slices the GPU has room for) is wider than a block's \
                     registers hold"
                                .into(),
                        )
                    })?,
            ]
        }
        Variant::RowSlices => {
            vec![row_slices_launch(shape, DType::F32, layout != Layout::Elements, device).0]
        }
        Variant::RowCluster => {
            if !device.thread_block_clusters() {
                return Err(unsupported(
                    "thread-block clusters need the sm_90 kernel build (compute capability \
                     9.0 or later)"
                        .into(),
                ));
            }
            vec![row_cluster_launch(shape, layout, device).0]
        }
    })
}

/// Every rows-in-registers entry.
pub(crate) fn register_instances() -> impl Iterator<Item = RegisterKernelName> {
    let vector = REGISTER_VECTOR_INSTANCES
        .iter()
        .map(|&(lanes, packs)| (VECTOR_PACK, lanes, packs));
    let scalar = REGISTER_SCALAR_INSTANCES
        .iter()
        .map(|&(lanes, packs)| (1, lanes, packs));
    vector
        .chain(scalar)
        .map(|(pack, lanes, packs)| RegisterKernelName { pack, lanes, packs })
}

/// Every block-registers entry.
pub(crate) fn block_register_instances() -> impl Iterator<Item = BlockRegisterInstance> {
    let family = |pack: u32, threads: &'static [u32], packs: &'static [u32]| {
        threads.iter().flat_map(move |&threads| {
            packs.iter().map(move |&packs| BlockRegisterInstance {
                pack,
                threads,
                packs,
            })
        })
    };
    family(
        VECTOR_PACK,
        BLOCK_REGISTER_VECTOR_THREADS,
        BLOCK_REGISTER_VECTOR_PACKS,
    )
    .chain(family(
        1,
        BLOCK_REGISTER_SCALAR_THREADS,
        BLOCK_REGISTER_SCALAR_PACKS,
    ))
}

/// The block-registers instance for whole rows of `row_packs` packs: the one that keeps the
/// most rows resident per multiprocessor, then wastes the fewest lanes, then holds the
/// fewest packs per thread. `None` when no instance holds the row.
fn block_register_whole_rows(
    row_packs: u32,
    pack: u32,
    device: &dyn DeviceLimits,
) -> Option<(BlockRegisterInstance, u32)> {
    let scratch = BLOCK_SHARED_BYTES;
    block_register_instances()
        .filter(|i| i.pack == pack && i.threads * i.packs >= row_packs)
        .map(|i| {
            let resident = device.blocks_per_sm(Entry::BlockRegisters(i), i.threads, scratch);
            (i, resident)
        })
        .filter(|&(_, resident)| resident > 0)
        .max_by_key(|&(i, resident)| {
            (
                resident,
                std::cmp::Reverse(i.threads * i.packs),
                std::cmp::Reverse(i.packs),
            )
        })
}

/// For rows too few to fill the GPU: the slicing with the fewest packs per thread (then the
/// fewest threads) whose blocks are all resident at once, with at most one slice per thread
/// (the statistics exchange reads one per thread). `(instance, slices)`.
fn block_register_slicing(
    rows: u32,
    row_packs: u32,
    pack: u32,
    device: &dyn DeviceLimits,
) -> Option<(BlockRegisterInstance, u32)> {
    let scratch = BLOCK_SHARED_BYTES;
    let mut instances: Vec<BlockRegisterInstance> = block_register_instances()
        .filter(|i| i.pack == pack)
        .collect();
    instances.sort_by_key(|i| (i.packs, i.threads));
    instances.into_iter().find_map(|i| {
        let slices = row_packs.div_ceil(i.threads * i.packs);
        let per_sm = device.blocks_per_sm(Entry::BlockRegisters(i), i.threads, scratch);
        let resident = u64::from(device.multiprocessors()) * u64::from(per_sm);
        let fits =
            slices > 1 && slices <= i.threads && u64::from(rows) * u64::from(slices) <= resident;
        fits.then_some((i, slices))
    })
}

/// Block registers with every block resident or whole rows (for clusters in waves, see
/// [`block_registers_in_waves`]): a block per row when rows fill the GPU, otherwise each row
/// cut into slices that keep every block resident (a cooperative launch; on sm_90 a
/// thread-block cluster per row where [`cooperative_slices_form_clusters`] takes it). `None`
/// when the row fits neither way.
fn block_registers_launch(
    shape: Shape,
    layout: Layout,
    device: &dyn DeviceLimits,
) -> Option<Launch> {
    let pack = peeled_pack(layout);
    let rows = shape.rows() as u32;
    let row_packs = (shape.cols() as u32).div_ceil(pack);
    let whole = block_register_whole_rows(row_packs, pack, device);
    let fills_gpu = whole.is_some_and(|(_, resident)| {
        u64::from(rows) >= u64::from(device.multiprocessors()) * u64::from(resident)
    });
    // Rows of at most `WHOLE_SMALL_ROW_BYTES` stay whole however few they are.
    let small = whole.is_some() && shape.cols() as u64 * 4 <= WHOLE_SMALL_ROW_BYTES;
    let sliced = (!fills_gpu && !small && device.cooperative_launch())
        .then(|| block_register_slicing(rows, row_packs, pack, device))
        .flatten();
    let (instance, slices) = sliced.or(whole.map(|(instance, _)| (instance, 1)))?;
    let entry = Entry::BlockRegisters(instance);
    // On sm_90, as one thread-block cluster per row where the slices are few enough.
    let clustered = cooperative_slices_form_clusters(device, entry, instance.threads, rows, slices);
    Some(block_registers_sliced(shape, instance, slices, clustered))
}

/// Blocks of f32 clusters in waves that stay clusters though row-slices in waves of rows would
/// take fewer waves: clusters of 2, 4 and 8 blocks read more of the copy than row-slices in
/// waves (512×32000, 2048×50257, 128×128256), clusters of 10 and 16 blocks less (64–2048 rows
/// of 151936, 64 and 512 of 262144). Clusters of 7 (100003 columns) stay too, though one shape
/// of them read more in row-slices (performance log: "Row-slices in waves over clusters in
/// waves").
const F32_CLUSTERS_KEPT_UP_TO: u32 = 8;

/// Block registers in clusters in waves ([`clusters_in_waves`]): rows that no whole-row
/// instance keeps two to a multiprocessor, cut into blocks of 256 threads of 16 packs (16-byte
/// packs only), one thread-block cluster per row. `None` where the rule does not take them.
fn block_registers_in_waves(
    shape: Shape,
    layout: Layout,
    device: &dyn DeviceLimits,
) -> Option<Launch> {
    if peeled_pack(layout) != VECTOR_PACK {
        return None;
    }
    let row_packs = (shape.cols() as u32).div_ceil(VECTOR_PACK);
    let whole_resident = block_register_whole_rows(row_packs, VECTOR_PACK, device)
        .map_or(0, |(_, resident)| resident);
    let instance = block_register_instances().find(|i| {
        i.pack == VECTOR_PACK && i.threads == WAVE_CLUSTER_THREADS && i.packs == WAVE_CLUSTER_PACKS
    })?;
    let slices = row_packs.div_ceil(instance.threads * instance.packs);
    let entry = Entry::BlockRegisters(instance);
    let rows = shape.rows() as u32;
    clusters_in_waves(
        device,
        entry,
        instance.threads,
        rows,
        slices,
        whole_resident,
    )
    .then(|| block_registers_sliced(shape, instance, slices, true))
}

/// The block-registers launch of `instance` over rows of `shape` cut into `slices` (one:
/// whole rows), in clusters of a row's slices or else cooperative.
fn block_registers_sliced(
    shape: Shape,
    instance: BlockRegisterInstance,
    slices: u32,
    clustered: bool,
) -> Launch {
    let row_packs = (shape.cols() as u32).div_ceil(instance.pack);
    let entry = Entry::BlockRegisters(instance);
    Launch {
        entry,
        grid: (shape.rows() as u32).saturating_mul(slices),
        block: instance.threads,
        shared_bytes: if clustered {
            cluster_shared_bytes(entry, instance.threads, slices)
        } else {
            BLOCK_SHARED_BYTES
        },
        scheduling: Scheduling::exchanging(slices, clustered),
        params: Params::BlockRegisters {
            cols: shape.cols() as u32,
            slicing: Slicing {
                slices,
                slice_packs: row_packs.div_ceil(slices),
            },
        },
    }
}

/// Packs per thread of the block-registers blocks that slice rows into clusters in waves
/// ([`clusters_in_waves`]): 64 KB of a row.
const WAVE_CLUSTER_PACKS: u32 = 16;

/// Widest row the rows-in-registers kernels hold with this layout.
fn register_capacity(layout: Layout) -> usize {
    register_instances()
        .filter(|i| i.pack == aligned_pack(layout))
        .map(|i| (i.pack * i.lanes * i.packs) as usize)
        .max()
        .unwrap_or(0)
}

/// The smallest rows-in-registers instance that holds `cols`: as few lanes per row as the
/// width allows (narrow rows share a warp), then as few packs per lane as possible.
fn register_instance(cols: usize, layout: Layout) -> Option<RegisterKernelName> {
    let pack = aligned_pack(layout);
    let units = cols.div_ceil(pack as usize);
    let lanes = units.next_power_of_two().min(WARP_SIZE as usize) as u32;
    register_instances()
        .filter(|i| i.pack == pack && i.lanes == lanes && (pack * lanes * i.packs) as usize >= cols)
        .min_by_key(|i| i.packs)
}

fn register_launch(instance: RegisterKernelName, rows: u32, cols: u32) -> Launch {
    let rows_per_block = REGISTER_ROWS_BLOCK / instance.lanes;
    ordinary(
        Entry::RowsInRegisters(instance),
        rows.div_ceil(rows_per_block),
        REGISTER_ROWS_BLOCK,
        0,
        Params::Rows { rows, cols },
    )
}

/// Smallest tensor for which `auto` passes few rows that block registers would slice to
/// [`wide_rows_launch`] (row-slices, or a cluster per row) instead: row-slices was faster or
/// even on the larger tensors measured, block-registers on the smaller, about even near the
/// cut (performance log: "8 loads in flight", and "Row-cluster where row-slices cannot
/// cache" for the 1.5 MiB cut).
const SLICED_ROW_SLICES_FROM_BYTES: u64 = 3 << 19;

/// Bytes of shared memory that cache `slice_packs` packs of `pack` elements of `element_bytes`
/// each, saturating: a slice past 4 GiB cannot be cached, and must not look small.
fn cache_bytes(slice_packs: u32, pack: u32, element_bytes: u32) -> u32 {
    let bytes = u64::from(slice_packs) * u64::from(pack) * u64::from(element_bytes);
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// Threads for a block that walks `packs` packs: enough for about two rounds of
/// [`LOADS_IN_FLIGHT`] loads each, within `128..=max`.
fn slice_threads(packs: usize, max: u32) -> u32 {
    let wanted = packs
        .div_ceil(2 * LOADS_IN_FLIGHT as usize)
        .next_power_of_two() as u32;
    wanted.clamp(128, max)
}

/// The threads (whole warps, at most [`MAX_BLOCK_THREADS`]) with which each thread of
/// `config`'s blocks walks its slice in one round of [`LOADS_IN_FLIGHT`] loads fewer: a block
/// waits for its slowest thread's last round, however few loads that round holds. `None`
/// where the slice takes one round, or the fewer rounds would need more threads than a block
/// has.
fn fewer_rounds_threads(config: RowSlicesConfig) -> Option<u32> {
    let rounds = config
        .slice_packs
        .div_ceil(config.threads * LOADS_IN_FLIGHT);
    if rounds <= 1 {
        return None;
    }
    let threads = config
        .slice_packs
        .div_ceil((rounds - 1) * LOADS_IN_FLIGHT)
        .next_multiple_of(32);
    (threads <= MAX_BLOCK_THREADS).then_some(threads)
}

/// Most threads per block with which 16-bit row-slices aims at two blocks per multiprocessor
/// rather than four (see [`row_slices_launch`]).
const SIXTEEN_BIT_HALF_SLICING_MAX_THREADS: u32 = 384;

/// Row slices: one block per row when rows alone fill the GPU; otherwise as many slices per
/// row as keep every block resident (one wave). An ordinary launch, with programmatic overlap:
/// a block whose row stays incomplete too long (blocks of another stream's kernels holding the
/// places the row's other blocks need) leaves its slice to the row's last block, so no
/// co-residency guarantee is needed. Each slice is cached in shared memory when it fits, so
/// the input is read once; the flag says whether it is. Elements of `dtype` go 16 bytes at a
/// time when input and output are misaligned alike (`peelable`).
pub(crate) fn row_slices_launch(
    shape: Shape,
    dtype: DType,
    peelable: bool,
    device: &dyn DeviceLimits,
) -> (Launch, bool) {
    let geometry = RowSlicesGeometry::new(shape, dtype, peelable);
    let (rows, entry) = (geometry.rows, geometry.entry);
    let sms = device.multiprocessors();
    let configure = |slices: u32, max_threads: u32| geometry.configure(slices, max_threads, device);

    // Blocks of this many threads and shared bytes resident on the whole GPU at once.
    let resident = |threads, shared_bytes| {
        u64::from(sms) * u64::from(device.blocks_per_sm(entry, threads, shared_bytes))
    };

    // Slices per row and their configuration for rows that aim at `per_sm` blocks per
    // multiprocessor: as many slices as that makes, fewer until every block is resident (one
    // wave). A sliced block's threads walk their packs in rounds of `LOADS_IN_FLIGHT` loads,
    // and the row waits for its slowest block's slowest thread: with 256 threads, 32×151936's
    // 2374 packs per slice are 9.3 per thread, three rounds of which the last is a third
    // full. Take one round fewer with the threads that needs (whole warps), if every block
    // stays resident (there 320 threads, two rounds; performance log: "Threads that save a
    // round of loads").
    let sliced = |per_sm: u32| {
        let wanted = u64::from(per_sm) * u64::from(sms) / u64::from(rows);
        let mut candidate = wanted.clamp(1, u64::from(ROW_SLICE_THREADS)) as u32;
        while candidate > 1 {
            let mut config = configure(candidate, ROW_SLICE_THREADS);
            let resident_blocks = resident(config.threads, config.shared_bytes);
            let blocks = u64::from(rows) * u64::from(candidate);
            if blocks <= resident_blocks {
                if let Some(threads) = fewer_rounds_threads(config)
                    && blocks <= resident(threads, config.shared_bytes)
                {
                    config.threads = threads;
                }
                return Some(config);
            }
            candidate = (resident_blocks / u64::from(rows)).min(u64::from(candidate - 1)) as u32;
        }
        None
    };

    let mut config = configure(1, MAX_BLOCK_THREADS);
    // Rows that fill one wave by themselves (at least 90% of the multiprocessors, at most one
    // each) keep a whole cached row per block: no barrier at all.
    let one_wave = 10 * u64::from(rows) >= 9 * u64::from(sms) && rows <= sms && config.cached;
    // Otherwise, with fewer rows than two blocks per multiprocessor, a block per row leaves
    // most of the GPU idle: cut rows into slices until the resident blocks are used, aiming
    // at four blocks per multiprocessor. 16-bit rows aim at two where those blocks need at
    // most `SIXTEEN_BIT_HALF_SLICING_MAX_THREADS` threads: two per multiprocessor gained
    // where its blocks were small, about nothing at 384 threads, and lost with more (the f32
    // kernel lost at two everywhere; performance log: "16-bit row-slices at two blocks per
    // multiprocessor where blocks stay small").
    if rows < 2 * sms && !one_wave {
        let half = (dtype.bytes() == 2)
            .then(|| sliced(2))
            .flatten()
            .filter(|config| config.threads <= SIXTEEN_BIT_HALF_SLICING_MAX_THREADS);
        if let Some(chosen) = half.or_else(|| sliced(4)) {
            config = chosen;
        }
    }
    (geometry.launch(config, Stagger::NONE), config.cached)
}

/// What row-slices plans a shape with: its entry, rows, packs per row.
struct RowSlicesGeometry {
    entry: Entry,
    dtype: DType,
    pack: u32,
    rows: u32,
    cols: u32,
    row_packs: u32,
}

/// How row-slices cuts a row and sizes its blocks.
#[derive(Clone, Copy)]
struct RowSlicesConfig {
    slices: u32,
    slice_packs: u32,
    threads: u32,
    /// Whether each block keeps its slice in shared memory.
    cached: bool,
    shared_bytes: u32,
}

impl RowSlicesGeometry {
    /// Elements of `dtype` go 16 bytes at a time when input and output are misaligned alike
    /// (`peelable`).
    fn new(shape: Shape, dtype: DType, peelable: bool) -> Self {
        let pack = if peelable { dtype.vector_pack() } else { 1 };
        let cols = shape.cols() as u32;
        RowSlicesGeometry {
            entry: Entry::RowSlices(RowSlicesKernelName { dtype, pack }),
            dtype,
            pack,
            rows: shape.rows() as u32,
            cols,
            row_packs: cols.div_ceil(pack),
        }
    }

    /// The configuration of `slices` slices a row with at most `max_threads` threads a block:
    /// each slice kept in shared memory where it fits one block's.
    fn configure(
        &self,
        slices: u32,
        max_threads: u32,
        device: &dyn DeviceLimits,
    ) -> RowSlicesConfig {
        let scratch_bytes = REDUCTION_SCRATCH_FLOATS * 4;
        let slice_packs = self.row_packs.div_ceil(slices);
        let threads = slice_threads(slice_packs as usize, max_threads);
        let cache_bytes = cache_bytes(slice_packs, self.pack, self.dtype.bytes());
        let cached = scratch_bytes.saturating_add(cache_bytes) <= device.max_shared_per_block();
        RowSlicesConfig {
            slices,
            slice_packs,
            threads,
            cached,
            shared_bytes: scratch_bytes + if cached { cache_bytes } else { 0 },
        }
    }

    fn launch(&self, config: RowSlicesConfig, stagger: Stagger) -> Launch {
        let RowSlicesConfig {
            slices,
            slice_packs,
            threads,
            cached,
            shared_bytes,
        } = config;
        let params = Params::RowSlices {
            cols: self.cols,
            slicing: Slicing {
                slices,
                slice_packs,
            },
            cached,
            stagger,
        };
        ordinary(
            self.entry,
            self.rows.saturating_mul(slices),
            threads,
            shared_bytes,
            params,
        )
    }
}

/// Blocks per multiprocessor that row-slices in waves tries, in turn (1024 threads a
/// multiprocessor between them before a round of loads is saved: 256 threads a block at
/// four): four, then two, then one (the largest slices). Four measured better than two by
/// 2.4 to 8 points of the copy on seven of ten shapes, level on two and 1.2 points below on
/// one (performance log: "Row-slices in waves of rows").
const IN_WAVES_BLOCKS_PER_SM: [u32; 3] = [4, 2, 1];

/// Row-slices with every slice kept in shared memory, for rows whose slices the resident
/// blocks cannot all keep at once ([`row_slices_launch`] would read them twice), or that it
/// runs in fewer waves than clusters in waves would ([`waves_unless_read_once`]): rows in
/// waves of whole rows. A wave holds as many rows as the fewest slices that fit `per_sm`
/// blocks per multiprocessor allow; the rows are spread evenly over the fewest waves, and each
/// row is cut into as many slices as fill a wave (smaller slices may fit more blocks a
/// multiprocessor than `per_sm`, so the launch may run in fewer, fuller waves than planned).
/// The softmax's blocks then take the threads that walk their slices in one round of loads
/// fewer ([`fewer_rounds_threads`]) where the multiprocessors hold as many of them.
/// Blocks start in index order and a row's slices are at most the blocks resident at once, so
/// a row waits only for blocks that start as earlier rows finish (were the places held
/// elsewhere, its blocks would leave after their patience, as any row-slices block may).
/// Only with 16-byte packs on devices with thread-block clusters (Hopper), where it was
/// measured; `None` elsewhere, and where no row fits the blocks of a wave.
pub(crate) fn row_slices_in_waves_launch(
    shape: Shape,
    dtype: DType,
    peelable: bool,
    device: &dyn DeviceLimits,
) -> Option<Launch> {
    if !peelable {
        return None;
    }
    let geometry = RowSlicesGeometry::new(shape, dtype, peelable);
    row_slices_in_waves_of(geometry, device)
}

/// [`row_slices_in_waves_launch`] for `entry`, another kernel over the row-slices layout
/// with 16-byte packs (the cross-entropy's): its launch as row-slices' would be, with the
/// blocks a multiprocessor holds counted for `entry`.
pub(crate) fn row_slices_in_waves_launch_of(
    entry: Entry,
    shape: Shape,
    dtype: DType,
    device: &dyn DeviceLimits,
) -> Option<Launch> {
    let geometry = RowSlicesGeometry {
        entry,
        ..RowSlicesGeometry::new(shape, dtype, true)
    };
    row_slices_in_waves_of(geometry, device)
}

fn row_slices_in_waves_of(
    geometry: RowSlicesGeometry,
    device: &dyn DeviceLimits,
) -> Option<Launch> {
    if !device.thread_block_clusters() || geometry.rows == 0 {
        return None;
    }
    // The configuration of `slices` if it is cached with `per_sm` blocks a multiprocessor.
    // `per_sm` blocks need at least `per_sm` times their shared memory of a multiprocessor,
    // which holds about one block's most and the 1 KB the system reserves: checked first,
    // without a device query.
    let keeps = |slices: u32, per_sm: u32| {
        let config = geometry.configure(slices, MAX_BLOCK_THREADS / per_sm, device);
        let room = u64::from(device.max_shared_per_block()) + 1024;
        let fits = config.cached && u64::from(per_sm) * u64::from(config.shared_bytes) <= room;
        (fits
            && device.blocks_per_sm(geometry.entry, config.threads, config.shared_bytes) >= per_sm)
            .then_some(config)
    };
    IN_WAVES_BLOCKS_PER_SM.into_iter().find_map(|per_sm| {
        let wave = per_sm * device.multiprocessors();
        let most = wave
            .min(geometry.row_packs)
            .min(barrier_word::MAX_PARTICIPANTS);
        let fewest = (2..=most).find(|&slices| keeps(slices, per_sm).is_some())?;
        let waves = geometry.rows.div_ceil(wave / fewest);
        let slices = (wave / geometry.rows.div_ceil(waves)).min(most);
        let mut config = keeps(slices, per_sm)?;
        let per_sm_at =
            |threads| device.blocks_per_sm(geometry.entry, threads, config.shared_bytes);
        // The softmax's blocks take one round of loads fewer, where the multiprocessors hold
        // as many of the larger blocks (performance log: "Row slices in waves: blocks a
        // multiprocessor, and the last round of loads"). Other kernels over this layout (the
        // cross-entropy's) keep their threads: they were not measured with the rule.
        if matches!(geometry.entry, Entry::RowSlices(_))
            && let Some(threads) = fewer_rounds_threads(config)
            && per_sm_at(threads) >= per_sm_at(config.threads)
        {
            config.threads = threads;
        }
        let resident = u64::from(device.multiprocessors()) * u64::from(per_sm_at(config.threads));
        let row_bytes = u64::from(geometry.cols) * geometry.dtype.bytes() as u64;
        let stagger = waves_stagger(geometry.rows, slices, resident, row_bytes, device);
        Some(geometry.launch(config, stagger))
    })
}

/// Wide rows that block registers do not take: row-slices where it caches its slices.
/// Otherwise (the input would be read twice) a cluster per row, if one can cache its slices
/// (clusters run in waves, so they need not all be resident at once), unless whole rows fill
/// the GPU, one full block per row on at least 90% of the multiprocessors; then row-slices in
/// waves of rows whose slices are cached, where it applies; else row-slices reading twice.
/// Clusters won where row-slices' slices were uncached, and lost where a full uncached block
/// per row fills the GPU (performance log: "Row-cluster where row-slices cannot cache");
/// row-slices in waves is measured in "Row-slices in waves of rows".
fn wide_rows_launch(shape: Shape, layout: Layout, device: &dyn DeviceLimits) -> Launch {
    let peelable = layout != Layout::Elements;
    let (slices, slices_read_once) = row_slices_launch(shape, DType::F32, peelable, device);
    if slices_read_once {
        return slices;
    }
    let rows = shape.rows() as u64;
    let rows_fill_gpu =
        u64::from(slices.grid) == rows && 10 * rows >= 9 * u64::from(device.multiprocessors());
    if !rows_fill_gpu
        && device.thread_block_clusters()
        && let (cluster, true) = row_cluster_launch(shape, layout, device)
    {
        return cluster;
    }
    row_slices_in_waves_launch(shape, DType::F32, peelable, device).unwrap_or(slices)
}

/// One cluster size row-cluster may take.
#[derive(Clone, Copy)]
struct ClusterCandidate {
    slices: u32,
    slice_packs: u32,
    threads: u32,
    /// Whether each block caches its slice in shared memory.
    cached: bool,
    shared_bytes: u32,
    /// Whether a whole cluster can be scheduled, cached or not.
    schedulable: bool,
    /// Waves of clusters the rows take when the slices are cached.
    cached_waves: u32,
}

/// Row cluster: a cluster of blocks per row. The preferred size is about four blocks per
/// multiprocessor's worth (at most [`MAX_CLUSTER_BLOCKS`]). Among the sizes whose slice can be
/// cached with a whole cluster schedulable, the one that runs the rows in the fewest waves of
/// clusters (the driver's cluster occupancy), and among equals the first from the preferred
/// size up, then down; else the first schedulable one uncached (the second pass re-reads);
/// else one block per row, which needs no cluster. The flag says whether the slices are
/// cached. Waves first: shapes moved to the size with fewer waves gained, and shapes already
/// in their fewest waves kept their size (performance log: "Row-cluster's cluster size by
/// waves").
fn row_cluster_launch(shape: Shape, layout: Layout, device: &dyn DeviceLimits) -> (Launch, bool) {
    let pack = peeled_pack(layout);
    let rows = shape.rows() as u32;
    let row_packs = (shape.cols() as u32).div_ceil(pack);
    let entry = Entry::RowCluster { pack };
    let configure = |slices: u32| {
        let slice_packs = row_packs.div_ceil(slices);
        let max_threads = if slices > 1 {
            ROW_SLICE_THREADS
        } else {
            MAX_BLOCK_THREADS
        };
        let threads = slice_threads(slice_packs as usize, max_threads);
        let active = |bytes| {
            if bytes <= device.max_shared_per_block() {
                device.active_clusters(entry, threads, bytes, slices)
            } else {
                0
            }
        };
        let cached_bytes = CLUSTER_SHARED_BYTES.saturating_add(cache_bytes(slice_packs, pack, 4));
        let cached_clusters = active(cached_bytes);
        let cached = cached_clusters > 0;
        ClusterCandidate {
            slices,
            slice_packs,
            threads,
            cached,
            shared_bytes: if cached {
                cached_bytes
            } else {
                CLUSTER_SHARED_BYTES
            },
            schedulable: cached || active(CLUSTER_SHARED_BYTES) > 0,
            cached_waves: rows.div_ceil(cached_clusters.max(1)),
        }
    };
    let preferred = (4 * u64::from(device.multiprocessors()) / u64::from(rows))
        .clamp(1, u64::from(MAX_CLUSTER_BLOCKS)) as u32;
    let candidates: Vec<_> = (preferred..=MAX_CLUSTER_BLOCKS)
        .chain((1..preferred).rev())
        .map(configure)
        .collect();
    let ClusterCandidate {
        slices,
        slice_packs,
        threads,
        cached,
        shared_bytes,
        ..
    } = candidates
        .iter()
        .filter(|c| c.cached)
        .min_by_key(|c| c.cached_waves)
        .or_else(|| candidates.iter().find(|c| c.schedulable))
        .copied()
        .unwrap_or_else(|| configure(1));
    let launch = Launch {
        entry,
        grid: rows.saturating_mul(slices),
        block: threads,
        shared_bytes,
        scheduling: Scheduling::Clusters(slices),
        params: Params::RowCluster {
            cols: shape.cols() as u32,
            slicing: Slicing {
                slices,
                slice_packs,
            },
            cached,
        },
    };
    (launch, cached)
}

/// The five kernels of the unfused baseline.
fn unfused_launches(shape: Shape, device: &dyn DeviceLimits) -> Vec<Launch> {
    let (rows, cols) = (shape.rows() as u32, shape.cols() as u32);
    let warp_rows_block = WARP_PER_ROW_WARPS_PER_BLOCK * WARP_SIZE;
    let warp_rows_grid = rows.div_ceil(WARP_PER_ROW_WARPS_PER_BLOCK);
    let len = shape.len() as u64;
    // Grid-stride element-wise kernels: enough blocks to fill the GPU several times over.
    let elementwise_grid = len
        .div_ceil(ELEMENTWISE_BLOCK as u64)
        .min(u64::from(device.multiprocessors()) * 32) as u32;
    let params = Params::Unfused { rows, cols, len };
    let by_rows = |entry| ordinary(entry, warp_rows_grid, warp_rows_block, 0, params);
    let elementwise = |entry| ordinary(entry, elementwise_grid, ELEMENTWISE_BLOCK, 0, params);
    vec![
        by_rows(Entry::UnfusedRowMax),
        elementwise(Entry::UnfusedSubtract),
        elementwise(Entry::UnfusedExp),
        by_rows(Entry::UnfusedRowSum),
        elementwise(Entry::UnfusedDivide),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::{FakeH200, FakeH200WithoutClusters, shape};
    use kernels_gpu::launch::cross_entropy::{CrossEntropyEntry, CrossEntropyKind};
    use kernels_gpu::primitives::barrier_word;

    /// Few wide rows (LLM vocabularies, odd widths): where slicing matters.
    const FEW_WIDE_ROWS: [(usize, usize); 7] = [
        (1, 1_048_576),
        (1, 32000),
        (8, 128256),
        (32, 151936),
        (16, 262144),
        (128, 50257),
        (3, 100003),
    ];

    /// A sliced launch's blocks all fit on the GPU at once (one wave).
    fn assert_all_resident(launch: &Launch, rows: usize, cols: usize) {
        let resident =
            132 * FakeH200.blocks_per_sm(launch.entry, launch.block, launch.shared_bytes);
        assert!(
            launch.grid <= resident,
            "{rows}x{cols}: {} blocks cannot all be resident",
            launch.grid
        );
    }

    const ALIGNED: Layout = Layout::Aligned;
    const UNALIGNED: Layout = Layout::Elements;

    #[test]
    fn register_instances_cover_every_width_they_claim() {
        for layout in [ALIGNED, UNALIGNED] {
            for cols in 1..=register_capacity(layout) {
                if layout == Layout::Aligned && cols % 4 != 0 {
                    continue;
                }
                let instance = register_instance(cols, layout)
                    .unwrap_or_else(|| panic!("no instance for {cols}"));
                let capacity = (instance.pack * instance.lanes * instance.packs) as usize;
                assert!(capacity >= cols, "{instance} holds {capacity} < {cols}");
                assert!(
                    capacity < 2 * cols + 4 * 32,
                    "{instance} wastes too much for {cols}"
                );
            }
            assert!(register_instance(register_capacity(layout) + 4, layout).is_none());
        }
        assert_eq!(register_capacity(ALIGNED), 2048);
        assert_eq!(register_capacity(UNALIGNED), 1024);
    }

    /// Checks that `slices` slices of `slice_packs` packs of `pack` elements cover a row of
    /// `cols` (the last up to `pack - 1` elements are the tail's); returns the columns of a
    /// slice.
    fn assert_slices_cover(
        rows: usize,
        cols: usize,
        pack: u32,
        slices: u32,
        slice_packs: u32,
    ) -> u32 {
        let slice_cols = slice_packs * pack;
        assert!(
            (slices * slice_cols + pack - 1) as usize >= cols,
            "{rows}x{cols}: slices miss columns"
        );
        slice_cols
    }

    /// A row-slices launch of `dtype` on `rows`×`cols`: its entry, slices that cover the row,
    /// a block per slice, an ordinary launch (blocks that cannot start leave nobody waiting
    /// forever), shared memory within the limit and, where cached, room for the slice. Returns
    /// the slices and whether they are cached.
    fn assert_row_slices_launch(
        launch: &Launch,
        (rows, cols): (usize, usize),
        dtype: DType,
        peelable: bool,
    ) -> (u32, bool) {
        let Params::RowSlices {
            slicing: Slicing {
                slices,
                slice_packs,
            },
            cached,
            ..
        } = launch.params
        else {
            panic!("unexpected arguments {:?}", launch.params)
        };
        let pack = if peelable { dtype.vector_pack() } else { 1 };
        assert_eq!(
            launch.entry,
            Entry::RowSlices(RowSlicesKernelName { dtype, pack })
        );
        let slice_cols = assert_slices_cover(rows, cols, pack, slices, slice_packs);
        assert_eq!(launch.grid, rows as u32 * slices);
        assert!(launch.shared_bytes <= FakeH200.max_shared_per_block());
        assert_eq!(launch.scheduling, Scheduling::Ordinary);
        assert!(slices <= barrier_word::MAX_PARTICIPANTS);
        if cached {
            assert!(
                launch.shared_bytes >= REDUCTION_SCRATCH_FLOATS * 4 + slice_cols * dtype.bytes()
            );
        }
        (slices, cached)
    }

    /// Row-slices in waves holds its first wave's rows back in turn, each half a row's memory
    /// time after the one before: the rows the resident blocks hold, at the H200's peak
    /// bandwidth; rows in one wave start at once, as every other plan's.
    #[test]
    fn rows_in_waves_start_in_turn() {
        let launch =
            row_slices_in_waves_launch(shape(4096, 128256), DType::Bf16, true, &FakeH200).unwrap();
        let Params::RowSlices {
            slicing, stagger, ..
        } = launch.params
        else {
            panic!("{launch:?}");
        };
        let first_wave = launch.resident_blocks(&FakeH200) / u64::from(slicing.slices);
        // 128256 bf16 elements read and written: 513 KB at 4915 bytes a ns, halved.
        assert_eq!(
            stagger,
            Stagger {
                rows: first_wave as u32,
                ns: 52
            }
        );
        assert!(first_wave > 100 && first_wave < 4096);
        let one_wave = row_slices_launch(shape(32, 151936), DType::F32, true, &FakeH200).0;
        assert!(matches!(
            one_wave.params,
            Params::RowSlices {
                stagger: Stagger::NONE,
                ..
            }
        ));
    }

    /// The H200 with the row-slices entries, the softmax's and the cross-entropy's, at 40
    /// registers a thread (ptxas's count for the bf16 softmax entry), so that larger blocks
    /// can cost a multiprocessor its fifth.
    struct FortyRegisterSlices;

    impl DeviceLimits for FortyRegisterSlices {
        fn multiprocessors(&self) -> u32 {
            FakeH200.multiprocessors()
        }

        fn max_shared_per_block(&self) -> u32 {
            FakeH200.max_shared_per_block()
        }

        fn blocks_per_sm(&self, _entry: Entry, threads: u32, shared_bytes: u32) -> u32 {
            (2048 / threads)
                .min(228 * 1024 / (shared_bytes + 1024))
                .min(65536 / (threads * 40))
                .min(32)
        }

        fn cooperative_launch(&self) -> bool {
            FakeH200.cooperative_launch()
        }

        fn thread_block_clusters(&self) -> bool {
            FakeH200.thread_block_clusters()
        }

        fn memory_bytes_per_us(&self) -> u64 {
            FakeH200.memory_bytes_per_us()
        }

        fn active_clusters(&self, entry: Entry, threads: u32, shared: u32, cluster: u32) -> u32 {
            FakeH200.active_clusters(entry, threads, shared, cluster)
        }
    }

    /// Where the larger blocks would cost a multiprocessor a block, and for the
    /// cross-entropy's row slices (not measured with the rule), row-slices in waves keep their
    /// threads.
    #[test]
    fn rows_in_waves_keep_their_threads_where_a_round_fewer_would_cost_blocks() {
        let block = |entry: Option<Entry>, rows, cols| {
            let launch = match entry {
                None => row_slices_in_waves_launch(
                    shape(rows, cols),
                    DType::Bf16,
                    true,
                    &FortyRegisterSlices,
                ),
                Some(entry) => row_slices_in_waves_launch_of(
                    entry,
                    shape(rows, cols),
                    DType::Bf16,
                    &FortyRegisterSlices,
                ),
            }
            .unwrap();
            (launch.block, launch.params)
        };
        // Six slices of 2672 packs: three rounds at 256 threads, five blocks a
        // multiprocessor by shared memory; 352 threads would be two rounds at four blocks.
        let (threads, params) = block(None, 256, 128256);
        assert!(
            matches!(
                params,
                Params::RowSlices {
                    slicing: Slicing {
                        slices: 6,
                        slice_packs: 2672
                    },
                    ..
                }
            ),
            "{params:?}"
        );
        assert_eq!(threads, 256);
        assert_eq!(
            FortyRegisterSlices.blocks_per_sm(
                Entry::RowSlices(RowSlicesKernelName {
                    dtype: DType::Bf16,
                    pack: 8
                }),
                352,
                43008
            ),
            4
        );
        // Four blocks by shared memory at 256 and at 288 threads: the softmax takes 288.
        assert_eq!(block(None, 4096, 128256).0, 288);
        let cross_entropy = Entry::CrossEntropy(CrossEntropyEntry {
            dtype: DType::Bf16,
            kind: CrossEntropyKind::Slices,
        });
        assert_eq!(block(Some(cross_entropy), 4096, 128256).0, 256);
    }

    /// Row-slices in waves take one round of loads fewer with more threads where the
    /// multiprocessors hold as many of the larger blocks: bf16 4096×128256's five slices of
    /// 3207 packs are four rounds at 256 threads, three at 288.
    #[test]
    fn rows_in_waves_take_a_round_fewer_where_the_blocks_stay() {
        let launch =
            row_slices_in_waves_launch(shape(4096, 128256), DType::Bf16, true, &FakeH200).unwrap();
        let Params::RowSlices { slicing, .. } = launch.params else {
            panic!("{launch:?}");
        };
        assert_eq!(
            (slicing.slices, slicing.slice_packs, launch.block),
            (5, 3207, 288)
        );
        assert_eq!(
            slicing.slice_packs.div_ceil(launch.block * LOADS_IN_FLIGHT),
            3
        );
        let per_sm = |threads| FakeH200.blocks_per_sm(launch.entry, threads, launch.shared_bytes);
        assert_eq!(per_sm(288), per_sm(256));
        // A slice of one round keeps its threads.
        let one_round = RowSlicesConfig {
            slices: 8,
            slice_packs: 1000,
            threads: 256,
            cached: true,
            shared_bytes: 0,
        };
        assert_eq!(fewer_rounds_threads(one_round), None);
        assert_eq!(
            fewer_rounds_threads(RowSlicesConfig {
                slice_packs: 1025,
                ..one_round
            }),
            Some(1025usize.div_ceil(4).next_multiple_of(32) as u32)
        );
    }

    /// Row-slices in waves: every slice kept, the slices covering the row, a row's blocks
    /// resident together; none where a row outgrows a wave. `auto` (f32) and
    /// 16-bit plain softmax take it where row-slices alone would read the rows twice and no
    /// cluster keeps them.
    #[test]
    fn wide_rows_in_waves_keep_every_slice() {
        let shapes = [
            (8, 1 << 20),
            (16, 1 << 20),
            (300, 1 << 20),
            (512, 1 << 20),
            (5000, 300000),
            (2, 1 << 22),
        ];
        for (rows, cols) in shapes {
            for dtype in DType::ALL {
                let launch = row_slices_in_waves_launch(shape(rows, cols), dtype, true, &FakeH200)
                    .unwrap_or_else(|| panic!("{dtype:?} {rows}x{cols}: no waves"));
                let (slices, cached) = assert_row_slices_launch(&launch, (rows, cols), dtype, true);
                assert!(cached && slices > 1);
                // A wave holds whole rows.
                assert!(
                    launch.resident_blocks(&FakeH200) >= u64::from(slices),
                    "{dtype:?} {rows}x{cols}"
                );
            }
        }
        // A row wider than a wave's shared memory, rows read one element at a time, a device
        // without clusters (where it was not measured): no waves.
        let none = |rows, cols, peelable, device: &dyn DeviceLimits| {
            row_slices_in_waves_launch(shape(rows, cols), DType::F32, peelable, device).is_none()
        };
        assert!(none(2, 1 << 24, true, &FakeH200));
        assert!(none(8, 1 << 20, false, &FakeH200));
        let sm80 = FakeH200WithoutClusters { sm90_build: false };
        assert!(none(8, 1 << 20, true, &sm80));
        // There `auto` keeps reading twice, as before: a block per row where rows fill the GPU
        // (unaligned 128×151936), uncached slices otherwise.
        let uncached = |launch: Launch| {
            matches!(launch.entry, Entry::RowSlices(_))
                && matches!(launch.params, Params::RowSlices { cached: false, .. })
        };
        let unaligned = plan(Variant::Auto, shape(128, 151936), UNALIGNED, &FakeH200).unwrap();
        assert!(
            uncached(unaligned[0]) && unaligned[0].grid == 128,
            "{unaligned:?}"
        );
        let without_clusters = plan(Variant::Auto, shape(64, 128256), ALIGNED, &sm80).unwrap();
        assert!(uncached(without_clusters[0]), "{without_clusters:?}");
        // 16-bit plain softmax where the operation kernels would make two launches.
        for (rows, cols) in [(16, 1 << 20), (64, 300000)] {
            let request = crate::plan::Request::PlainSoftmax {
                dtype: DType::Bf16,
                peelable: true,
            };
            let launches =
                super::super::plan(request, shape(rows, cols), ALIGNED, &FakeH200).unwrap();
            assert_eq!(launches.len(), 1);
            assert!(
                matches!(launches[0].entry, Entry::RowSlices(_)),
                "{launches:?}"
            );
            assert!(matches!(
                launches[0].params,
                Params::RowSlices { cached: true, .. }
            ));
        }
        let auto = |rows, cols| plan(Variant::Auto, shape(rows, cols), ALIGNED, &FakeH200).unwrap();
        for rows in [8, 16, 512] {
            let launch = auto(rows, 1 << 20)[0];
            assert!(matches!(launch.entry, Entry::RowSlices(_)), "{launch:?}");
            assert!(matches!(
                launch.params,
                Params::RowSlices { cached: true, .. }
            ));
            assert!(u64::from(launch.grid) > launch.resident_blocks(&FakeH200));
        }
        // Where a cluster keeps the row, row-cluster as before.
        assert!(matches!(
            auto(32, 524288)[0].entry,
            Entry::RowCluster { .. }
        ));
    }

    /// Every element type's row-slices plan: slices that cover the row, every block of a
    /// sliced launch resident, the cache sized for the type.
    #[test]
    fn row_slices_cover_the_row_and_stay_resident() {
        let extra = [(300, 1 << 20), (1000, 65537), (1, 5000), (100_000, 4096)];
        for (rows, cols) in FEW_WIDE_ROWS.into_iter().chain(extra) {
            for (dtype, peelable) in DType::ALL.into_iter().flat_map(|d| [(d, true), (d, false)]) {
                let (launch, _) = row_slices_launch(shape(rows, cols), dtype, peelable, &FakeH200);
                let (slices, _) = assert_row_slices_launch(&launch, (rows, cols), dtype, peelable);
                if slices > 1 {
                    assert_all_resident(&launch, rows, cols);
                    assert!(
                        launch.grid >= 132,
                        "{rows}x{cols}: a sliced launch should fill the GPU"
                    );
                }
            }
        }
    }

    /// 16-bit rows hold twice the elements per byte of cache: bf16 16×262144 takes the same
    /// 33 slices as f32 with half the shared memory, and 600 rows of 70001 (140 KB each in
    /// bf16, 280 KB in f32) are cached only in bf16.
    #[test]
    fn sixteen_bit_row_slices_cache_twice_the_elements() {
        let sliced = |dtype| row_slices_launch(shape(16, 262144), dtype, true, &FakeH200);
        let ((f32_launch, true), (bf16_launch, true)) = (sliced(DType::F32), sliced(DType::Bf16))
        else {
            panic!("16x262144 should be cached")
        };
        assert_eq!(bf16_launch.grid, f32_launch.grid);
        assert_eq!(bf16_launch.grid, 16 * 33);
        assert_eq!(
            bf16_launch.shared_bytes - REDUCTION_SCRATCH_FLOATS * 4,
            (f32_launch.shared_bytes - REDUCTION_SCRATCH_FLOATS * 4) / 2
        );
        assert!(!row_slices_launch(shape(600, 70001), DType::F32, true, &FakeH200).1);
        assert!(row_slices_launch(shape(600, 70001), DType::Bf16, true, &FakeH200).1);
    }

    /// 16-bit rows aim at two blocks per multiprocessor where those blocks need at most 384
    /// threads, else at four, as f32 always does (slices per row, threads per block).
    #[test]
    fn sixteen_bit_rows_take_half_the_slices_where_the_blocks_stay_small() {
        for (rows, cols, f32_plan, bf16_plan) in [
            (32, 151936, (16, 320), (8, 320)),
            (8, 262144, (66, 256), (33, 256)),
            (64, 100000, (8, 288), (4, 288)),
            (16, 262144, (33, 512), (33, 256)),
            (48, 65536, (11, 384), (11, 192)),
        ] {
            for (dtype, (slices, threads)) in [(DType::F32, f32_plan), (DType::Bf16, bf16_plan)] {
                let (launch, _) = row_slices_launch(shape(rows, cols), dtype, true, &FakeH200);
                assert_eq!(
                    (launch.grid / rows as u32, launch.block),
                    (slices, threads),
                    "{dtype:?} {rows}x{cols}"
                );
            }
        }
    }

    #[test]
    fn sliced_blocks_take_the_threads_that_save_a_round_of_loads() {
        // 32×151936: 16 slices of 2374 packs, three rounds of loads with 256 threads
        // (9.3 packs each), two with 320; 16×262144's 33 slices of 1986 packs, two rounds,
        // one with 512 threads (resident at the fake's 32 registers per thread; at the 39
        // ptxas gives the H200 kernel, the driver's occupancy keeps it at 256 threads).
        for (rows, cols, threads, rounds) in [(32, 151936, 320, 2), (16, 262144, 512, 1)] {
            let (launch, _) = row_slices_launch(shape(rows, cols), DType::F32, true, &FakeH200);
            let Params::RowSlices { slicing, .. } = launch.params else {
                panic!("unexpected arguments {:?}", launch.params)
            };
            let slice_packs = slicing.slice_packs;
            assert!(launch.grid > rows as u32, "{rows}x{cols}: sliced");
            assert_eq!(launch.block, threads, "{rows}x{cols}");
            assert_eq!(
                slice_packs.div_ceil(threads * LOADS_IN_FLIGHT),
                rounds,
                "{rows}x{cols}"
            );
        }
    }

    #[test]
    fn row_clusters_cover_the_row_and_can_be_scheduled() {
        let extra = [
            (300, 1 << 20),
            (1000, 65537),
            (1, 5000),
            (100_000, 4096),
            (7, 9),
        ];
        for (rows, cols) in FEW_WIDE_ROWS.into_iter().chain(extra) {
            for layout in [ALIGNED, UNALIGNED] {
                let (launch, _) = row_cluster_launch(shape(rows, cols), layout, &FakeH200);
                let Params::RowCluster {
                    slicing:
                        Slicing {
                            slices,
                            slice_packs,
                        },
                    cached,
                    ..
                } = launch.params
                else {
                    panic!("unexpected arguments {:?}", launch.params)
                };
                let slice_cols =
                    assert_slices_cover(rows, cols, peeled_pack(layout), slices, slice_packs);
                assert_eq!(launch.scheduling, Scheduling::Clusters(slices));
                assert!((1..=MAX_CLUSTER_BLOCKS).contains(&slices));
                assert_eq!(launch.grid, rows as u32 * slices);
                assert!(launch.shared_bytes <= FakeH200.max_shared_per_block());
                let fixed = CLUSTER_SHARED_BYTES;
                assert_eq!(
                    launch.shared_bytes,
                    fixed + cached as u32 * slice_cols * 4,
                    "{rows}x{cols}"
                );
            }
        }
        // The shapes it is meant for are cached, in clusters that fill the GPU.
        for (rows, cols, slices) in [(32, 151936, 16), (128, 50257, 4)] {
            assert_cached_in_clusters_of(rows, cols, slices);
        }
    }

    /// Row-cluster plans aligned `rows × cols` in cached clusters of `slices` on the fake H200.
    fn assert_cached_in_clusters_of(rows: usize, cols: usize, slices: u32) {
        let (launch, cached) = row_cluster_launch(shape(rows, cols), ALIGNED, &FakeH200);
        assert_eq!(
            launch.scheduling,
            Scheduling::Clusters(slices),
            "{rows}x{cols}"
        );
        assert!(cached, "{rows}x{cols}");
    }

    #[test]
    fn row_clusters_take_the_size_that_needs_the_fewest_waves() {
        // On the fake H200 (processing clusters of 16 multiprocessors), 48 rows of 262144
        // columns in clusters of 11–13 slices of 80–96 KB fit two blocks per multiprocessor,
        // 16 clusters at once: three waves. Slices of 14 fit three: 24 clusters, two waves.
        // 64 rows of 151936 need two waves at any size; the preferred 8 stays. (The H200's
        // driver counts clusters of 11 in as few waves as 14 and keeps 11 for 48×262144: the
        // fake's count is a model, the rule is what this pins.)
        for (rows, cols, slices) in [(48, 262144, 14), (40, 262144, 14), (64, 151936, 8)] {
            assert_cached_in_clusters_of(rows, cols, slices);
        }
    }

    #[test]
    fn row_clusters_fall_back_to_a_block_per_row_when_no_cluster_fits() {
        let no_clusters = FakeH200WithoutClusters { sm90_build: true };
        let (launch, _) = row_cluster_launch(shape(32, 151936), ALIGNED, &no_clusters);
        assert_eq!(
            (launch.scheduling, launch.grid),
            (Scheduling::Clusters(1), 32)
        );
        let Params::RowCluster { slicing, .. } = launch.params else {
            panic!("unexpected arguments {:?}", launch.params)
        };
        assert_eq!(slicing.slices, 1, "one slice per row");
    }

    #[test]
    fn auto_uses_registers_for_narrow_rows_and_slices_for_wide_ones() {
        let kernel = |rows, cols, address| {
            let layout = super::super::pair_layout(address, address, cols);
            plan(Variant::Auto, shape(rows, cols), layout, &FakeH200).unwrap()[0].label(&[])
        };
        assert_eq!(kernel(4096, 1000, 0), "softmax_rows_in_registers_p4_l32_n8");
        assert_eq!(kernel(65536, 100, 0), "softmax_rows_in_registers_p4_l32_n1");
        assert_eq!(kernel(65536, 100, 4), "softmax_rows_in_registers_p1_l32_n4");
        assert_eq!(kernel(1000, 33, 0), "softmax_rows_in_registers_p1_l32_n2");
        assert_eq!(kernel(10, 2, 0), "softmax_rows_in_registers_p1_l2_n1");
        assert_eq!(
            kernel(100_000, 4097, 0),
            "softmax_block_registers_p4_n10 (128 threads)"
        );
        assert_eq!(
            kernel(100_000, 4096, 4),
            "softmax_block_registers_p4_n8 (128 threads)"
        );
        assert_eq!(
            kernel(3200, 16384, 0),
            "softmax_block_registers_p4_n8 (512 threads)"
        );
        // Few rows of at most 16 KB stay whole, a block each.
        assert_eq!(
            kernel(10, 4096, 0),
            "softmax_block_registers_p4_n8 (128 threads)"
        );
        assert_eq!(kernel(2000, 1 << 20, 0), "softmax_row_slices_p4");
        // Few rows: sliced block-registers below 1.5 MiB, sliced row-slices from there.
        assert_eq!(
            kernel(1, 128256, 0),
            "softmax_block_registers_p4_n1 (256 threads)"
        );
        assert_eq!(
            kernel(1, 380_000, 0),
            "softmax_block_registers_p4_n1 (512 threads)"
        );
        assert_eq!(kernel(1, 400_000, 0), "softmax_row_slices_p4");
        // Slices few enough for one thread-block cluster form one.
        let small = plan(Variant::Auto, shape(1, 8000), ALIGNED, &FakeH200).unwrap()[0];
        assert_eq!(small.scheduling, Scheduling::Clusters(16), "{small:?}");
        // Above 8 blocks, only while the launch has at most a block a multiprocessor: 8 rows
        // of 16 slices (128 blocks) stay clusters, 16 rows (256) go cooperative.
        let eight = plan(Variant::Auto, shape(8, 8000), ALIGNED, &FakeH200).unwrap()[0];
        assert_eq!(
            (eight.grid, eight.scheduling),
            (128, Scheduling::Clusters(16))
        );
        let many = plan(Variant::Auto, shape(16, 8000), ALIGNED, &FakeH200).unwrap()[0];
        assert_eq!((many.grid, many.scheduling), (256, Scheduling::Cooperative));
        for sm90_build in [false, true] {
            let device = FakeH200WithoutClusters { sm90_build };
            let small = plan(Variant::Auto, shape(1, 8000), ALIGNED, &device).unwrap()[0];
            assert_eq!(small.scheduling, Scheduling::Cooperative, "{small:?}");
        }
        let one = plan(Variant::Auto, shape(1, 128256), ALIGNED, &FakeH200).unwrap()[0];
        assert_eq!(one.scheduling, Scheduling::Cooperative, "{one:?}");
        assert_eq!(kernel(8, 128256, 0), "softmax_row_slices_p4");
        assert_eq!(kernel(1, 1 << 20, 0), "softmax_row_slices_p4");
        // A row per multiprocessor, cached whole: one block per row, no barrier.
        let (one_wave, cached) = row_slices_launch(shape(128, 50257), DType::F32, true, &FakeH200);
        assert_eq!(
            (one_wave.grid, one_wave.scheduling, cached),
            (128, Scheduling::Ordinary, true)
        );
        // Rows of at most 16 blocks of 256 threads and 16 packs, more of those blocks than
        // are resident at once: block registers, a cluster per row, clusters in waves...
        let waves = "softmax_block_registers_p4_n16 (256 threads)";
        for (rows, cols) in [(512, 65536), (128, 128256), (128, 100003), (512, 32000)] {
            assert_eq!(kernel(rows, cols, 0), waves, "{rows}x{cols}");
            let launch = plan(Variant::Auto, shape(rows, cols), ALIGNED, &FakeH200).unwrap()[0];
            let slices = (cols as u32).div_ceil(4 * 256 * 16);
            assert_eq!(
                launch.scheduling,
                Scheduling::Clusters(slices),
                "{rows}x{cols}"
            );
            assert!(
                crate::plan::tests::runs_in_waves(&launch, &FakeH200),
                "{rows}x{cols}"
            );
        }
        // ...unless clusters of more than 8 blocks take more waves than row-slices keeping
        // every slice in waves of rows...
        for (rows, cols) in [(64, 151936), (48, 262144), (2048, 151936)] {
            let launch = plan(Variant::Auto, shape(rows, cols), ALIGNED, &FakeH200).unwrap()[0];
            assert!(
                matches!(launch.params, Params::RowSlices { cached: true, .. }),
                "{rows}x{cols}: {launch:?}"
            );
            let clusters = block_registers_in_waves(shape(rows, cols), ALIGNED, &FakeH200).unwrap();
            assert!(
                crate::plan::launch_waves(&launch, &FakeH200)
                    < crate::plan::launch_waves(&clusters, &FakeH200),
                "{rows}x{cols}"
            );
        }
        // ...or the plan without them is row-slices reading the tensor once in one wave:
        // a cached row per block for 128 rows of 50257.
        let (rows, cols) = (128, 50257);
        let peeled = super::super::pair_layout(0, 0, cols);
        assert_eq!(peeled, Layout::Peeled);
        assert!(block_registers_in_waves(shape(rows, cols), peeled, &FakeH200).is_some());
        let launch = plan(Variant::Auto, shape(rows, cols), peeled, &FakeH200).unwrap()[0];
        let (slices, cached) = row_slices_launch(shape(rows, cols), DType::F32, true, &FakeH200);
        assert!(cached, "{slices:?}");
        assert_eq!(launch, slices);
        assert!(super::super::reads_once_in_one_wave(&launch, &FakeH200));
        // Blocks of less than a wave and a half (320 for 32 rows of 151936): no clusters in
        // waves; row-slices caches their slices.
        assert!(block_registers_in_waves(shape(32, 151936), ALIGNED, &FakeH200).is_none());
        assert_eq!(kernel(32, 151936, 0), "softmax_row_slices_p4");
        // Rows of more than 16 such blocks, too few for row-slices to cache their slices:
        // row-cluster.
        assert_eq!(kernel(32, 524288, 0), "softmax_row_cluster_p4");
        // Fewer rows (their blocks all resident): slices across the GPU.
        assert_eq!(kernel(16, 262144, 0), "softmax_row_slices_p4");
        // Rows wider than 16 such blocks: row-slices, reading twice.
        assert_eq!(kernel(16, 1 << 20, 0), "softmax_row_slices_p4");
        assert_eq!(kernel(2000, 1 << 22, 0), "softmax_row_slices_p4");
    }

    #[test]
    fn block_register_slices_cover_the_row_and_stay_resident() {
        let extra = [(200, 16384), (12800, 4096), (1, 4_000_001), (1000, 65537)];
        for (rows, cols) in FEW_WIDE_ROWS.into_iter().chain(extra) {
            for layout in [ALIGNED, UNALIGNED] {
                let Some(launch) = block_registers_launch(shape(rows, cols), layout, &FakeH200)
                else {
                    // More data than registers hold at once: those go to the row-slices kernel.
                    assert!(
                        layout == UNALIGNED || rows * cols > 4 << 20,
                        "{rows}x{cols} does not fit"
                    );
                    continue;
                };
                let Params::BlockRegisters {
                    slicing:
                        Slicing {
                            slices,
                            slice_packs,
                        },
                    ..
                } = launch.params
                else {
                    panic!("unexpected arguments {:?}", launch.params)
                };
                let Entry::BlockRegisters(instance) = launch.entry else {
                    panic!("unexpected entry {}", launch.entry)
                };
                let pack = peeled_pack(layout);
                let packs = instance.packs;
                assert_eq!(
                    instance.threads, launch.block,
                    "{}: block size differs from its instance",
                    launch.entry
                );
                assert!(
                    slices * slice_packs * pack + 3 >= cols as u32,
                    "{rows}x{cols}: slices miss columns"
                );
                assert!(
                    launch.block * packs >= slice_packs,
                    "{rows}x{cols}: a block cannot hold its slice"
                );
                assert_eq!(launch.grid, rows as u32 * slices);
                assert!(
                    FakeH200.blocks_per_sm(launch.entry, launch.block, launch.shared_bytes) > 0
                );
                match launch.scheduling {
                    Scheduling::Ordinary => assert_eq!(slices, 1),
                    Scheduling::Cooperative => assert!(slices > MAX_CLUSTER_BLOCKS),
                    Scheduling::Clusters(cluster) => {
                        assert_eq!(cluster, slices);
                        assert!((2..=MAX_CLUSTER_BLOCKS).contains(&slices));
                        assert_eq!(launch.shared_bytes, CLUSTER_SHARED_BYTES);
                    }
                }
                if slices > 1 {
                    // Clusters may run in waves: only a cooperative launch needs every block
                    // resident.
                    if launch.scheduling == Scheduling::Cooperative {
                        assert_all_resident(&launch, rows, cols);
                    }
                    assert!(
                        slices <= launch.block,
                        "{rows}x{cols}: more slices than threads to read them"
                    );
                }
            }
        }
        assert!(block_registers_launch(shape(2000, 1 << 20), ALIGNED, &FakeH200).is_none());
    }

    /// A row of 2^30 + 1000 floats: its one-slice cache would be 4 GiB plus 4000 bytes, which
    /// in 32 bits wraps to a few kilobytes and looked cacheable.
    #[test]
    fn rows_past_four_gigabytes_are_never_cached() {
        let cols = (1 << 30) + 1000;
        let (slices, cached) = row_slices_launch(shape(1, cols), DType::F32, true, &FakeH200);
        assert!(!cached || slices.shared_bytes <= FakeH200.max_shared_per_block());
        for layout in [ALIGNED, UNALIGNED] {
            let (launch, cached) = row_cluster_launch(shape(1, cols), layout, &FakeH200);
            let Params::RowCluster { slicing, .. } = launch.params else {
                panic!("unexpected arguments {:?}", launch.params)
            };
            let pack = peeled_pack(layout) as u64;
            let cache = u64::from(slicing.slice_packs) * pack * 4;
            assert!(
                !cached || cache < u64::from(FakeH200.max_shared_per_block()),
                "{cols} columns: {cache} bytes per slice claimed cached"
            );
        }
    }

    #[test]
    fn registers_variant_refuses_rows_it_cannot_hold() {
        let result = plan(
            Variant::RowsInRegisters,
            shape(2, 4097),
            UNALIGNED,
            &FakeH200,
        );
        assert!(matches!(result, Err(Error::Unsupported { .. })));
    }
}
