//! The library's one error type.

use cust::error::CudaError;

/// Everything the library can refuse or fail with. Shape and argument errors are detected
/// before anything is launched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No usable CUDA device: no driver, no GPU, or the ordinal is out of range.
    #[error("no CUDA device: {reason}")]
    NoDevice { reason: String },

    /// A CUDA driver call failed; `during` says what the library was doing.
    #[error("CUDA error while {during}: {source}")]
    Cuda {
        during: &'static str,
        #[source]
        source: CudaError,
    },

    /// A driver call that cust does not wrap failed (`name` is the driver's, e.g.
    /// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`).
    #[error("CUDA error while {during}: {name} ({code})")]
    CudaStatus {
        during: &'static str,
        code: u32,
        name: String,
    },

    /// The input buffer does not hold `rows × cols` elements.
    #[error("input holds {len} elements but the shape {rows}×{cols} needs {expected}")]
    InputLength {
        len: usize,
        rows: usize,
        cols: usize,
        expected: usize,
    },

    /// The output buffer does not hold `rows × cols` elements.
    #[error("output holds {len} elements but the shape {rows}×{cols} needs {expected}")]
    OutputLength {
        len: usize,
        rows: usize,
        cols: usize,
        expected: usize,
    },

    /// `rows × cols` elements, or their size in bytes, do not fit in `usize`, or a dimension
    /// is past what a launch can index.
    #[error("shape {rows}×{cols} is too large: {why}")]
    ShapeTooLarge {
        rows: usize,
        cols: usize,
        why: &'static str,
    },

    /// Threads per block must be a power of two in 32..=1024.
    #[error("threads per block must be a power of two in 32..=1024, got {0}")]
    ThreadsPerBlock(u32),

    /// The variant cannot run this shape (for example rows too wide to keep in registers).
    #[error("variant `{variant}` cannot run shape {rows}×{cols}: {why}")]
    Unsupported {
        variant: String,
        rows: usize,
        cols: usize,
        why: String,
    },

    /// Reading or writing a file failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// A variant name that the command line or `Variant::from_str` does not know.
    #[error("unknown variant `{0}` (known: {known})", known = crate::Variant::NAMES.join(", "))]
    UnknownVariant(String),
}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Attaches what the library was doing to a CUDA error.
pub(crate) trait CudaContext<T> {
    fn during(self, during: &'static str) -> Result<T>;
}

impl<T> CudaContext<T> for std::result::Result<T, CudaError> {
    fn during(self, during: &'static str) -> Result<T> {
        self.map_err(|source| Error::Cuda { during, source })
    }
}
