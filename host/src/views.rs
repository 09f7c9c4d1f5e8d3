//! The typed views and options of the operation API ([`crate::Softmax::forward`] and its
//! siblings): element types, strided rows in device memory, masks and scales.

use cust::memory::{DeviceCopy, DeviceSlice};
pub use kernels_gpu::launch::ops::{DType, RowState};

use crate::error::{Error, Result};
use crate::shape::Shape;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type the operations read and write: `f32`, [`half::bf16`] or [`half::f16`]
/// (the `half` version cust implements `DeviceCopy` for; re-exported as `softmax::half`).
/// Math is always done in f32.
pub trait Element: DeviceCopy + sealed::Sealed + Copy {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    /// Rounds to nearest, ties to even, as the kernels do.
    fn from_f32(value: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(value: f32) -> Self {
        value
    }
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::Bf16;
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        half::bf16::from_f32(value)
    }
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        half::f16::from_f32(value)
    }
}

/// Softmax or log-softmax (forward), or the gradient of one of them (backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    Softmax,
    LogSoftmax,
}

impl Operation {
    pub(crate) fn code(self) -> u32 {
        match self {
            Operation::Softmax => kernels_gpu::launch::ops::op::SOFTMAX,
            Operation::LogSoftmax => kernels_gpu::launch::ops::op::LOG_SOFTMAX,
        }
    }
}

/// Checks a strided view: `stride ≥ cols` and the buffer reaches the last row's end.
fn check_view(len: usize, shape: Shape, stride: usize, what: &'static str) -> Result<()> {
    if stride < shape.cols() {
        return Err(Error::Stride {
            what,
            stride,
            cols: shape.cols(),
        });
    }
    let needed = match shape.rows() {
        0 => 0,
        rows => (rows - 1)
            .checked_mul(stride)
            .and_then(|n| n.checked_add(shape.cols()))
            .ok_or(Error::ShapeTooLarge {
                rows: shape.rows(),
                cols: shape.cols(),
                why: "(rows - 1) × stride + cols overflows usize",
            })?,
    };
    if shape.cols() > 0 && len < needed {
        return Err(Error::ViewLength {
            what,
            len,
            needed,
            rows: shape.rows(),
            cols: shape.cols(),
            stride,
        });
    }
    Ok(())
}

/// `rows × cols` elements in device memory, row `r` starting at element `r · stride` (a
/// strided view: `stride ≥ cols`; a contiguous matrix has `stride == cols`).
#[derive(Debug)]
pub struct Rows<'a, T: DeviceCopy> {
    pub(crate) data: &'a DeviceSlice<T>,
    pub(crate) shape: Shape,
    pub(crate) stride: usize,
}

impl<'a, T: DeviceCopy> Rows<'a, T> {
    /// A contiguous row-major matrix; `data` holds exactly `rows × cols` elements.
    pub fn new(data: &'a DeviceSlice<T>, shape: Shape) -> Result<Self> {
        shape.check_lengths(data.len(), shape.len())?;
        Ok(Rows {
            data,
            shape,
            stride: shape.cols(),
        })
    }

    /// Rows `stride` elements apart (a pitch, or a column slice of a wider matrix).
    pub fn strided(data: &'a DeviceSlice<T>, shape: Shape, stride: usize) -> Result<Self> {
        check_view(data.len(), shape, stride, "input")?;
        Ok(Rows {
            data,
            shape,
            stride,
        })
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }
}

/// The writable counterpart of [`Rows`].
#[derive(Debug)]
pub struct RowsMut<'a, T: DeviceCopy> {
    pub(crate) data: &'a mut DeviceSlice<T>,
    pub(crate) shape: Shape,
    pub(crate) stride: usize,
}

impl<'a, T: DeviceCopy> RowsMut<'a, T> {
    /// A contiguous row-major matrix; `data` holds exactly `rows × cols` elements.
    pub fn new(data: &'a mut DeviceSlice<T>, shape: Shape) -> Result<Self> {
        shape.check_lengths(shape.len(), data.len())?;
        Ok(RowsMut {
            data,
            shape,
            stride: shape.cols(),
        })
    }

    /// Rows `stride` elements apart; elements between rows are left untouched.
    pub fn strided(data: &'a mut DeviceSlice<T>, shape: Shape, stride: usize) -> Result<Self> {
        check_view(data.len(), shape, stride, "output")?;
        Ok(RowsMut {
            data,
            shape,
            stride,
        })
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }
}

/// A mask over the scores, `mask_rows × cols` contiguous elements with `mask_rows` dividing
/// the number of rows: row `r` of the data uses mask row `r % mask_rows` (one row for all,
/// one per query of stacked attention heads, or one per row).
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// Added to the scaled scores (`-inf` masks an element out).
    Additive(&'a DeviceSlice<f32>),
    /// One byte per element: 0 masks the element out, anything else keeps it.
    Allowed(&'a DeviceSlice<u8>),
}

impl Mask<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Mask::Additive(mask) => mask.len(),
            Mask::Allowed(mask) => mask.len(),
        }
    }
}

/// What a row masked everywhere (or entirely `-inf`) yields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MaskedRows {
    /// NaN everywhere, as `torch.softmax` gives.
    #[default]
    Nan,
    /// Probability 0 everywhere (log-softmax: `-inf`).
    Zero,
}

/// Options of the forward operations: `softmax(x · scale · row_scale[r] + mask)`, with a
/// causal mask and a choice for fully masked rows. The backward operations use only the
/// scales (their gradient is with respect to the unscaled scores).
#[derive(Clone, Copy, Debug)]
pub struct Options<'a> {
    pub(crate) scale: f32,
    pub(crate) row_scale: Option<&'a DeviceSlice<f32>>,
    pub(crate) mask: Option<Mask<'a>>,
    pub(crate) causal: bool,
    pub(crate) masked_rows: MaskedRows,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            scale: 1.0,
            row_scale: None,
            mask: None,
            causal: false,
            masked_rows: MaskedRows::Nan,
        }
    }
}

impl<'a> Options<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Multiplies every score by `scale` (finite and > 0, checked when the options are used).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = scale;
        self
    }

    /// Divides every score by `temperature` (finite and > 0: anything else makes the scale
    /// `1 / temperature` infinite, NaN, zero or negative, which the scale check refuses).
    pub fn temperature(self, temperature: f32) -> Self {
        self.scale(1.0 / temperature)
    }

    /// Multiplies row `r`'s scores by `scales[r]` (one positive float per row, read on the
    /// device as given).
    pub fn row_scale(mut self, scales: &'a DeviceSlice<f32>) -> Self {
        self.row_scale = Some(scales);
        self
    }

    pub fn mask(mut self, mask: Mask<'a>) -> Self {
        self.mask = Some(mask);
        self
    }

    /// Masks column `c` of row `r` when `c > r % cols`: causal attention over square score
    /// blocks stacked along the rows (`rows` must be a multiple of `cols`).
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    pub fn masked_rows(mut self, masked_rows: MaskedRows) -> Self {
        self.masked_rows = masked_rows;
        self
    }

    /// Checks the options against the data's shape.
    pub(crate) fn check(&self, shape: Shape) -> Result<()> {
        if !(self.scale > 0.0 && self.scale.is_finite()) {
            return Err(Error::Scale(self.scale));
        }
        if let Some(scales) = self.row_scale
            && scales.len() != shape.rows()
        {
            return Err(Error::RowScaleLength {
                len: scales.len(),
                rows: shape.rows(),
            });
        }
        if shape.is_empty() {
            return Ok(());
        }
        if let Some(mask) = self.mask {
            let len = mask.len();
            let fits = len > 0
                && len.is_multiple_of(shape.cols())
                && shape.rows().is_multiple_of(len / shape.cols());
            if !fits {
                return Err(Error::MaskLength {
                    len,
                    rows: shape.rows(),
                    cols: shape.cols(),
                });
            }
        }
        if self.causal && !shape.rows().is_multiple_of(shape.cols()) {
            return Err(Error::Causal {
                rows: shape.rows(),
                cols: shape.cols(),
            });
        }
        Ok(())
    }
}

/// `2^x` on the host, for merging states as the kernels do.
enum HostExp2 {}

impl kernels_gpu::primitives::online::Exp2 for HostExp2 {
    fn exp2(x: f32) -> f32 {
        x.exp2()
    }
}

/// Merges the states of two disjoint column slices of a row (as the kernels do): the state
/// of their union. Commutative and associative up to rounding; a state with `max = -inf`
/// and `sum = 0` is its identity.
pub fn merge_row_states(a: RowState, b: RowState) -> RowState {
    use kernels_gpu::primitives::online::OnlineStats;
    let merged = OnlineStats::new(a.max, a.sum).merge::<HostExp2>(OnlineStats::new(b.max, b.sum));
    RowState {
        max: merged.max,
        sum: merged.sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(rows: usize, cols: usize) -> Shape {
        Shape::new(rows, cols).unwrap()
    }

    #[test]
    fn views_need_a_stride_of_at_least_cols_and_a_buffer_reaching_the_last_row() {
        assert!(check_view(3 * 10 + 4, shape(4, 4), 10, "input").is_ok());
        assert!(matches!(
            check_view(100, shape(4, 4), 3, "input"),
            Err(Error::Stride { stride: 3, .. })
        ));
        assert!(matches!(
            check_view(3 * 10 + 3, shape(4, 4), 10, "output"),
            Err(Error::ViewLength { needed: 34, .. })
        ));
        assert!(check_view(0, shape(0, 4), 4, "input").is_ok());
        assert!(matches!(
            check_view(10, shape(1 << 30, 4), usize::MAX >> 20, "input"),
            Err(Error::ShapeTooLarge { .. })
        ));
    }

    proptest::proptest! {
        /// A view is accepted exactly when its stride covers a row and its buffer reaches the
        /// end of the last row.
        #[test]
        fn views_are_accepted_exactly_when_they_fit(
            rows in 0usize..1000,
            cols in 0usize..1000,
            stride in 0usize..1200,
            len in 0usize..1_200_000,
        ) {
            let fits = stride >= cols
                && (rows == 0 || cols == 0 || len >= (rows - 1) * stride + cols);
            proptest::prop_assert_eq!(check_view(len, shape(rows, cols), stride, "input").is_ok(), fits);
        }
    }

    #[test]
    fn scales_must_be_finite_and_positive() {
        for bad in [0.0, -2.0, f32::NAN, f32::INFINITY] {
            assert!(matches!(
                Options::new().temperature(bad).check(shape(2, 2)),
                Err(Error::Scale(_))
            ));
            assert!(matches!(
                Options::new().scale(bad).check(shape(2, 2)),
                Err(Error::Scale(_))
            ));
        }
        assert!(Options::new().temperature(0.5).check(shape(2, 2)).is_ok());
        assert!(matches!(
            Options::new().causal().check(shape(6, 4)),
            Err(Error::Causal { .. })
        ));
        assert!(Options::new().causal().check(shape(8, 4)).is_ok());
    }
}
