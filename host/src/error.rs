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
        source: CudaDriverError,
    },

    /// A driver call that cust does not wrap failed (`name` is the driver's, e.g.
    /// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`).
    #[error("CUDA error while {during}: {name} ({code})")]
    CudaStatus {
        during: &'static str,
        code: u32,
        name: String,
    },

    /// A plan named an entry of a kernel module that is not loaded: a bug in the library (each
    /// call loads the modules its plans need before planning), reported rather than launched.
    #[error("the kernel module of {entry} is not loaded")]
    ModuleNotLoaded { entry: String },

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

    /// Two views that must have one shape do not (shapes as `(rows, cols)`).
    #[error(
        "{what} has shape {}×{} but the input has shape {}×{}",
        .actual.0, .actual.1, .expected.0, .expected.1
    )]
    ShapeMismatch {
        what: &'static str,
        expected: (usize, usize),
        actual: (usize, usize),
    },

    /// Two buffers that must hold one element type do not.
    #[error("{what} holds {actual:?} elements but the input holds {expected:?}")]
    ElementTypeMismatch {
        what: &'static str,
        expected: kernels_gpu::launch::ops::DType,
        actual: kernels_gpu::launch::ops::DType,
    },

    /// A raw view's address is not aligned for its element type.
    #[error("{what} (address {address:#x}) is not aligned to its elements' {align} bytes")]
    Misaligned {
        what: &'static str,
        address: u64,
        align: u64,
    },

    /// A strided view's stride is below its width.
    #[error("{what} stride {stride} is smaller than the row width {cols}")]
    Stride {
        what: &'static str,
        stride: usize,
        cols: usize,
    },

    /// A strided view's buffer ends before its last row does.
    #[error("{what} holds {len} elements but {rows}×{cols} rows at stride {stride} need {needed}")]
    ViewLength {
        what: &'static str,
        len: usize,
        needed: usize,
        rows: usize,
        cols: usize,
        stride: usize,
    },

    /// The scale is not a finite positive number (a temperature ≤ 0, NaN or infinite).
    #[error("scale must be finite and > 0 (scale = 1 / temperature), got {0}")]
    Scale(f32),

    /// The per-row scale buffer does not hold one float per row.
    #[error("per-row scale holds {len} floats but there are {rows} rows")]
    RowScaleLength { len: usize, rows: usize },

    /// The mask is not `k × cols` elements with `k` dividing the number of rows.
    #[error("mask holds {len} elements: it must be k × {cols} with k dividing the {rows} rows")]
    MaskLength {
        len: usize,
        rows: usize,
        cols: usize,
    },

    /// The causal mask needs square score blocks stacked along the rows.
    #[error("causal masking needs rows ({rows}) to be a multiple of cols ({cols})")]
    Causal { rows: usize, cols: usize },

    /// A per-row buffer (log-sum-exp, row states) does not hold what the shape needs.
    #[error("{what} holds {len} elements but {rows} rows need {expected}")]
    PerRowLength {
        what: &'static str,
        len: usize,
        rows: usize,
        expected: usize,
    },

    /// Reading or writing a file failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// An output overlaps a buffer the same call reads, other than exactly (where the
    /// operation can run in place).
    #[error(
        "{output} overlaps {input}: outputs must be distinct from every input (or, where the call runs in place, exactly the input)"
    )]
    Overlap {
        output: &'static str,
        input: &'static str,
    },

    /// A buffer lives on another device than the [`crate::Softmax`] instance.
    #[error("{what} lives on device {device}, but this instance runs on device {expected}")]
    WrongDevice {
        what: &'static str,
        device: u32,
        expected: u32,
    },

    /// An address the driver does not know as device memory.
    #[error("{what} (address {address:#x}) is not CUDA device memory")]
    NotDeviceMemory { what: &'static str, address: u64 },

    /// A call needed work that cannot happen while its stream is captured into a graph
    /// (allocating, loading kernels, planning, waiting): [`crate::Softmax::reserve`] it first.
    #[error(
        "cannot {what} while the stream is being captured into a graph: reserve the call first (Softmax::reserve)"
    )]
    NotReserved { what: &'static str },

    /// A device the kernels do not run on: below compute capability 8.0, or a kernel build
    /// the device cannot run (the sm_90 build below 9.0).
    #[error("{device} (compute capability {major}.{minor}) is not supported: {why}")]
    UnsupportedDevice {
        device: String,
        major: u32,
        minor: u32,
        why: String,
    },

    /// `SOFTMAX_KERNEL_BUILD` names no kernel build.
    #[error("{variable}={value:?} names no kernel build (known: sm_80, sm_90)")]
    UnknownKernelBuild {
        variable: &'static str,
        value: String,
    },

    /// A cudarc buffer in a call whose stream is not a cudarc stream: cudarc orders its
    /// buffers' uses on its own streams, so the call must name one ([`crate::Options::on`]).
    #[error("{what} is a cudarc buffer: issue the call on a cudarc stream (Options::on)")]
    CudarcStreamNeeded { what: &'static str },

    /// A cross-entropy option out of its range (label smoothing, z-loss, softcap, upstream
    /// gradient), or a shard that does not fit its vocabulary.
    #[error("cross-entropy: {why}")]
    CrossEntropyOption { why: String },

    /// A sampling parameter out of its range (temperature, top-k, top-p, min-p), or a
    /// buffer of the wrong size or type for the call.
    #[error("sampling: {why}")]
    SamplingOption { why: String },

    /// A variant name that the command line or `Variant::from_str` does not know.
    #[error("unknown variant `{0}` (known: {known})", known = .1.join(", "))]
    UnknownVariant(String, &'static [&'static str]),
}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// A failed CUDA driver call's error (cust's [`CudaError`], the field `0`), displayed by the
/// driver's description, or where the driver gives none (a driver library that does not
/// work, whose `cuGetErrorString` fails too) by its name: formatting it, or an [`Error`] and
/// its chain of sources, never fails (cust's own `Display` fails there, and a failing
/// `Display` makes `format!` panic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaDriverError(pub CudaError);

impl std::fmt::Display for CudaDriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&cuda_message(&self.0))
    }
}

impl std::error::Error for CudaDriverError {}

impl From<CudaError> for CudaDriverError {
    fn from(error: CudaError) -> Self {
        CudaDriverError(error)
    }
}

/// What a CUDA error says (see [`CudaDriverError`]).
pub(crate) fn cuda_message(error: &CudaError) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    match write!(text, "{error}") {
        Ok(()) => text,
        Err(_) => format!("{error:?} (the driver gave no description)"),
    }
}

/// Attaches what the library was doing to a CUDA error.
pub(crate) trait CudaContext<T> {
    fn during(self, during: &'static str) -> Result<T>;
}

impl<T> CudaContext<T> for std::result::Result<T, CudaError> {
    fn during(self, during: &'static str) -> Result<T> {
        self.map_err(|source| Error::Cuda {
            during,
            source: source.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cuda_error_formats_with_what_the_library_was_doing() {
        let error = Error::Cuda {
            during: "allocating the workspace",
            source: CudaError::InvalidMemoryAllocation.into(),
        };
        assert_eq!(
            error.to_string(),
            "CUDA error while allocating the workspace: Invalid memory allocation"
        );
        let source = std::error::Error::source(&error).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("Invalid memory allocation"));
    }
}
