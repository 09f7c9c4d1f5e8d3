//! The softmax variants, named as on the command line.

use kernels_gpu::launch::{
    MAX_BLOCK_THREADS, MIN_BLOCK_THREADS, softmax::BLOCK_SMEM_DEFAULT_THREADS,
};

use crate::error::{Error, Result};

/// Which kernel (or kernels) computes the softmax: the production kernels that `Auto` chooses
/// from, and the textbook variants of the two worklogs the project began from, kept as
/// baselines. New variants may be added, so matches need a wildcard arm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Variant {
    /// Chosen by shape and alignment among the production kernels (the default).
    #[default]
    Auto,
    /// The naive baseline: five kernels (row max, subtract, exp, row sum, divide).
    Unfused,
    /// One thread per row, three passes.
    ThreadPerRowNaive,
    /// One thread per row, online max and sum in one pass, then normalize.
    ThreadPerRowOnline,
    /// One block per row with a shared-memory tree reduction.
    BlockPerRowSmem { threads_per_block: u32 },
    /// [`Variant::BlockPerRowSmem`] with threads per block timed per shape and cached.
    BlockPerRowAutotuned,
    /// One warp per row with online statistics merged by warp shuffles.
    WarpPerRowOnline,
    /// Production: rows of up to 2048 columns held in registers by 1 to 32 lanes each.
    RowsInRegisters,
    /// Production: a block holds a row, or a slice of one, in registers.
    BlockRegisters,
    /// Production fallback for rows too wide for registers: each row cut into slices held
    /// in shared memory, one block per slice.
    RowSlices,
    /// For few wide rows on Hopper (compute capability 9.0+): a thread-block cluster per row,
    /// one slice per block, statistics exchanged through distributed shared memory.
    RowCluster,
}

impl Variant {
    /// Command-line names, in the order [`Variant::all`] lists the variants.
    pub const NAMES: [&str; 11] = [
        "auto",
        "unfused",
        "thread-naive",
        "thread-online",
        "block-smem",
        "block-smem-autotuned",
        "warp-online",
        "registers",
        "block-registers",
        "row-slices",
        "row-cluster",
    ];

    /// Every variant once, the block-per-row one with its default 128 threads.
    pub fn all() -> [Variant; 11] {
        [
            Variant::Auto,
            Variant::Unfused,
            Variant::ThreadPerRowNaive,
            Variant::ThreadPerRowOnline,
            Variant::BlockPerRowSmem {
                threads_per_block: BLOCK_SMEM_DEFAULT_THREADS,
            },
            Variant::BlockPerRowAutotuned,
            Variant::WarpPerRowOnline,
            Variant::RowsInRegisters,
            Variant::BlockRegisters,
            Variant::RowSlices,
            Variant::RowCluster,
        ]
    }

    /// The production variants, which `Auto` and [`crate::Softmax::tune`] choose from.
    pub const PRODUCTION: [Variant; 4] = [
        Variant::RowsInRegisters,
        Variant::BlockRegisters,
        Variant::RowSlices,
        Variant::RowCluster,
    ];

    /// The command-line name (`block-smem` carries its thread count when it is not 128).
    pub fn name(&self) -> String {
        match self {
            Variant::BlockPerRowSmem { threads_per_block }
                if *threads_per_block != BLOCK_SMEM_DEFAULT_THREADS =>
            {
                format!("block-smem:{threads_per_block}")
            }
            _ => Variant::all()
                .iter()
                .zip(Variant::NAMES)
                .find(|(v, _)| v.kind() == self.kind())
                .map_or("unknown", |(_, name)| name)
                .to_owned(),
        }
    }

    /// The variant with its parameters erased, to compare kinds.
    fn kind(&self) -> Variant {
        match self {
            Variant::BlockPerRowSmem { .. } => Variant::BlockPerRowSmem {
                threads_per_block: 0,
            },
            other => *other,
        }
    }

    /// Checks the variant's parameters.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Variant::BlockPerRowSmem {
                threads_per_block: t,
            } if !t.is_power_of_two() || !(MIN_BLOCK_THREADS..=MAX_BLOCK_THREADS).contains(&t) => {
                Err(Error::ThreadsPerBlock(t))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for Variant {
    type Err = Error;

    /// Parses a name from [`Variant::NAMES`]; `block-smem:N` sets the threads per block.
    fn from_str(text: &str) -> Result<Self> {
        let text = text.trim();
        if let Some(threads) = text.strip_prefix("block-smem:") {
            let threads_per_block = threads
                .parse()
                .map_err(|_| Error::UnknownVariant(text.to_owned(), &Variant::NAMES))?;
            let variant = Variant::BlockPerRowSmem { threads_per_block };
            variant.validate()?;
            return Ok(variant);
        }
        let index = Variant::NAMES.iter().position(|name| *name == text);
        index
            .map(|i| Variant::all()[i])
            .ok_or_else(|| Error::UnknownVariant(text.to_owned(), &Variant::NAMES))
    }
}
