//! The shape of a row-major matrix, checked once.

use crate::error::{Error, Result};

/// `rows × cols`, row-major and contiguous. Zero rows or zero columns is a valid, empty shape:
/// running softmax on it launches nothing and succeeds. The fields are private, so every
/// `Shape` has been through [`Shape::new`]'s checks:
///
/// ```compile_fail,E0451
/// let unchecked = softmax::Shape { rows: 1 << 33, cols: 1 << 31 };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape {
    rows: usize,
    cols: usize,
}

/// Kernels index rows and columns with 32-bit integers and launch one block per row at most,
/// and CUDA grids hold up to 2³¹ − 1 blocks.
const MAX_DIMENSION: usize = i32::MAX as usize;

impl Shape {
    /// `0 × 0`.
    pub(crate) const EMPTY: Shape = Shape { rows: 0, cols: 0 };

    /// Checks that the shape can be addressed: `rows × cols × 4` bytes fit in `usize` and each
    /// dimension fits the kernels' 32-bit indices.
    pub fn new(rows: usize, cols: usize) -> Result<Self> {
        let too_large = |why| Error::ShapeTooLarge { rows, cols, why };
        let elements = rows
            .checked_mul(cols)
            .ok_or(too_large("rows × cols overflows usize"))?;
        elements
            .checked_mul(size_of::<f32>())
            .ok_or(too_large("the size in bytes overflows usize"))?;
        if rows > MAX_DIMENSION || cols > MAX_DIMENSION {
            return Err(too_large("rows and cols must each be below 2^31"));
        }
        Ok(Self { rows, cols })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Number of elements, `rows × cols` (cannot overflow: checked by [`Shape::new`]).
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether the shape has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes moved by one softmax at the minimum: the input read once and the output written
    /// once. Every variant's GB/s in the benchmark is computed from this.
    pub fn min_traffic_bytes(&self) -> u64 {
        2 * self.len() as u64 * size_of::<f32>() as u64
    }

    /// Checks the buffer lengths against the shape.
    pub(crate) fn check_lengths(&self, input: usize, output: usize) -> Result<()> {
        let expected = self.len();
        let (rows, cols) = (self.rows, self.cols);
        if input != expected {
            return Err(Error::InputLength {
                len: input,
                rows,
                cols,
                expected,
            });
        }
        if output != expected {
            return Err(Error::OutputLength {
                len: output,
                rows,
                cols,
                expected,
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.rows, self.cols)
    }
}

impl std::str::FromStr for Shape {
    type Err = String;

    /// Parses `ROWSxCOLS`, for example `4096x1000`.
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let bad =
            || format!("`{text}` is not a shape: expected ROWSxCOLS with both ≥ 1, e.g. 4096x1000");
        let (rows, cols) = text.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        let rows: usize = rows.parse().map_err(|_| bad())?;
        let cols: usize = cols.parse().map_err(|_| bad())?;
        if rows == 0 || cols == 0 {
            return Err(bad());
        }
        Shape::new(rows, cols).map_err(|e| e.to_string())
    }
}
