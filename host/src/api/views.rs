//! The views every call takes, whatever kind of buffer they come from: element types,
//! strided rows ([`Rows`], [`RowsMut`]), one-dimensional buffers ([`Values`],
//! [`ValuesMut`]) and masks.

use std::marker::PhantomData;

use cust::memory::{DeviceBuffer, DeviceCopy, DeviceSlice};
pub use kernels_gpu::launch::ops::{DType, RowState};

pub(crate) use super::place::{Place, PlaceMut};
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

/// Elements a view of `shape` at `stride` reaches: `(rows − 1) · stride + cols`, or 0 for an
/// empty shape.
fn reach(shape: Shape, stride: usize) -> Result<usize> {
    match (shape.rows(), shape.cols()) {
        (0, _) | (_, 0) => Ok(0),
        (rows, cols) => (rows - 1)
            .checked_mul(stride)
            .and_then(|n| n.checked_add(cols))
            .ok_or(Error::ShapeTooLarge {
                rows,
                cols,
                why: "(rows - 1) × stride + cols overflows usize",
            }),
    }
}

/// Checks a strided view: `stride ≥ cols` and the buffer reaches the last row's end.
pub(crate) fn check_view(
    len: usize,
    shape: Shape,
    stride: usize,
    what: &'static str,
) -> Result<()> {
    if stride < shape.cols() {
        return Err(Error::Stride {
            what,
            stride,
            cols: shape.cols(),
        });
    }
    let needed = reach(shape, stride)?;
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

/// Checks a raw view: its address aligned for `dtype`, `stride ≥ cols`, and a reach that
/// fits in memory.
fn check_raw(address: u64, element_bytes: u32, shape: Shape, stride: usize) -> Result<()> {
    check_aligned("view", address, element_bytes)?;
    check_view(reach(shape, stride)?, shape, stride, "view")
}

fn check_aligned(what: &'static str, address: u64, element_bytes: u32) -> Result<()> {
    let align = u64::from(element_bytes);
    if !address.is_multiple_of(align) {
        return Err(Error::Misaligned {
            what,
            address,
            align,
        });
    }
    Ok(())
}

/// `rows × cols` elements in device memory, row `r` starting at element `r · stride` (a
/// strided view: `stride ≥ cols`; a contiguous matrix has `stride == cols`), read by a call.
///
/// One view type for every kind of buffer: a cust slice ([`Rows::new`], [`Rows::strided`]),
/// a cudarc buffer (`Rows::cudarc`, feature `cudarc`), or a raw device address
/// ([`Rows::raw`]). The element type travels with the view.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub(crate) place: Place<'a>,
    pub(crate) dtype: DType,
    pub(crate) shape: Shape,
    pub(crate) stride: usize,
    borrowed: PhantomData<&'a ()>,
}

impl<'a> Rows<'a> {
    pub(crate) fn at(place: Place<'a>, dtype: DType, shape: Shape, stride: usize) -> Self {
        Rows {
            place,
            dtype,
            shape,
            stride,
            borrowed: PhantomData,
        }
    }

    /// A contiguous row-major matrix; `data` holds exactly `rows × cols` elements.
    pub fn new<T: Element>(data: &'a DeviceSlice<T>, shape: Shape) -> Result<Self> {
        shape.check_lengths(data.len(), shape.len())?;
        Ok(Self::at(
            Place::Address(address(data), PhantomData),
            T::DTYPE,
            shape,
            shape.cols(),
        ))
    }

    /// Rows `stride` elements apart (a pitch, or a column slice of a wider matrix).
    pub fn strided<T: Element>(
        data: &'a DeviceSlice<T>,
        shape: Shape,
        stride: usize,
    ) -> Result<Self> {
        check_view(data.len(), shape, stride, "input")?;
        Ok(Self::at(
            Place::Address(address(data), PhantomData),
            T::DTYPE,
            shape,
            stride,
        ))
    }

    /// Rows of `dtype` at a raw device address (a `CUdeviceptr`), `stride` elements apart:
    /// the floor any other CUDA library can call. The library checks the alignment of
    /// `address` for `dtype`, the stride, and (on a machine with several devices) that the
    /// address is device memory of the instance's device.
    ///
    /// # Safety
    /// Until the work of every call given this view has completed, `address` points to
    /// `(rows − 1) · stride + cols` elements of `dtype` in device memory of the call's device,
    /// and nothing writes them unless ordered before or after that work (on the call's
    /// stream, or with events).
    pub unsafe fn raw(
        address: u64,
        dtype: DType,
        shape: Shape,
        stride: usize,
    ) -> Result<Rows<'static>> {
        check_raw(address, dtype.bytes(), shape, stride)?;
        Ok(Rows::at(
            Place::Address(address, PhantomData),
            dtype,
            shape,
            stride,
        ))
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn stride(&self) -> usize {
        self.stride
    }
}

/// The writable counterpart of [`Rows`]: rows a call writes (elements between rows are left
/// untouched).
#[derive(Debug)]
pub struct RowsMut<'a> {
    pub(crate) place: PlaceMut<'a>,
    pub(crate) dtype: DType,
    pub(crate) shape: Shape,
    pub(crate) stride: usize,
    borrowed: PhantomData<&'a mut ()>,
}

impl<'a> RowsMut<'a> {
    pub(crate) fn at(place: PlaceMut<'a>, dtype: DType, shape: Shape, stride: usize) -> Self {
        RowsMut {
            place,
            dtype,
            shape,
            stride,
            borrowed: PhantomData,
        }
    }

    /// A contiguous row-major matrix; `data` holds exactly `rows × cols` elements.
    pub fn new<T: Element>(data: &'a mut DeviceSlice<T>, shape: Shape) -> Result<Self> {
        shape.check_lengths(shape.len(), data.len())?;
        let place = PlaceMut::Address(address(data), PhantomData);
        Ok(Self::at(place, T::DTYPE, shape, shape.cols()))
    }

    /// Rows `stride` elements apart; elements between rows are left untouched.
    pub fn strided<T: Element>(
        data: &'a mut DeviceSlice<T>,
        shape: Shape,
        stride: usize,
    ) -> Result<Self> {
        check_view(data.len(), shape, stride, "output")?;
        Ok(Self::at(
            PlaceMut::Address(address(data), PhantomData),
            T::DTYPE,
            shape,
            stride,
        ))
    }

    /// Writable rows at a raw device address; see [`Rows::raw`]. A raw output that is exactly
    /// a raw input of the same call (same address, stride and type) is computed in place.
    ///
    /// # Safety
    /// As for [`Rows::raw`]; besides, nothing else reads or writes the elements while the
    /// work of a call given this view runs, unless ordered before or after it.
    pub unsafe fn raw(
        address: u64,
        dtype: DType,
        shape: Shape,
        stride: usize,
    ) -> Result<RowsMut<'static>> {
        check_raw(address, dtype.bytes(), shape, stride)?;
        Ok(RowsMut::at(
            PlaceMut::Address(address, PhantomData),
            dtype,
            shape,
            stride,
        ))
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn stride(&self) -> usize {
        self.stride
    }
}

/// A type of the one-dimensional buffers calls take besides rows: `f32` (per-row scales,
/// additive masks, log-sum-exps, losses), `u8` (allowed masks), `i32` and `i64` (targets),
/// [`RowState`] and `CrossEntropyState`, `u32` (sampled tokens), `u64` (the random state)
/// and `ShardDraw`.
pub trait Value: DeviceCopy + value_sealed::Sealed {}

mod value_sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u8 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for super::RowState {}
    impl Sealed for kernels_gpu::launch::cross_entropy::CrossEntropyState {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for kernels_gpu::launch::sampling::ShardDraw {}
}

impl Value for f32 {}
impl Value for u8 {}
impl Value for i32 {}
impl Value for i64 {}
impl Value for RowState {}
impl Value for kernels_gpu::launch::cross_entropy::CrossEntropyState {}
impl Value for u32 {}
impl Value for u64 {}
impl Value for kernels_gpu::launch::sampling::ShardDraw {}

/// `len` contiguous values in device memory that a call reads: a cust slice
/// ([`Values::new`], or `From` a slice or buffer), a cudarc buffer (`Values::cudarc`, feature `cudarc`), or
/// a raw address ([`Values::raw`]).
#[derive(Clone, Copy, Debug)]
pub struct Values<'a, T> {
    pub(crate) place: Place<'a>,
    pub(crate) len: usize,
    values: PhantomData<&'a [T]>,
}

impl<'a, T: Value> Values<'a, T> {
    pub(crate) fn at(place: Place<'a>, len: usize) -> Self {
        Values {
            place,
            len,
            values: PhantomData,
        }
    }

    pub fn new(data: &'a DeviceSlice<T>) -> Self {
        Self::at(Place::Address(address(data), PhantomData), data.len())
    }

    /// `len` values at a raw device address (checked to be aligned for `T`).
    ///
    /// # Safety
    /// As for [`Rows::raw`], for `len` values of `T`.
    pub unsafe fn raw(address: u64, len: usize) -> Result<Values<'static, T>> {
        check_aligned("values", address, size_of::<T>() as u32)?;
        Ok(Values::at(Place::Address(address, PhantomData), len))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<'a, T: Value> From<&'a DeviceSlice<T>> for Values<'a, T> {
    fn from(data: &'a DeviceSlice<T>) -> Self {
        Values::new(data)
    }
}

impl<'a, T: Value> From<&'a DeviceBuffer<T>> for Values<'a, T> {
    fn from(data: &'a DeviceBuffer<T>) -> Self {
        Values::new(data)
    }
}

/// The writable counterpart of [`Values`]: per-row outputs (log-sum-exps, row states).
#[derive(Debug)]
pub struct ValuesMut<'a, T> {
    pub(crate) place: PlaceMut<'a>,
    pub(crate) len: usize,
    values: PhantomData<&'a mut [T]>,
}

impl<'a, T: Value> ValuesMut<'a, T> {
    pub(crate) fn at(place: PlaceMut<'a>, len: usize) -> Self {
        ValuesMut {
            place,
            len,
            values: PhantomData,
        }
    }

    pub fn new(data: &'a mut DeviceSlice<T>) -> Self {
        let len = data.len();
        Self::at(PlaceMut::Address(address(data), PhantomData), len)
    }

    /// `len` writable values at a raw device address (checked to be aligned for `T`).
    ///
    /// # Safety
    /// As for [`RowsMut::raw`], for `len` values of `T`.
    pub unsafe fn raw(address: u64, len: usize) -> Result<ValuesMut<'static, T>> {
        check_aligned("values", address, size_of::<T>() as u32)?;
        Ok(ValuesMut::at(PlaceMut::Address(address, PhantomData), len))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<'a, T: Value> From<&'a mut DeviceSlice<T>> for ValuesMut<'a, T> {
    fn from(data: &'a mut DeviceSlice<T>) -> Self {
        ValuesMut::new(data)
    }
}

impl<'a, T: Value> From<&'a mut DeviceBuffer<T>> for ValuesMut<'a, T> {
    fn from(data: &'a mut DeviceBuffer<T>) -> Self {
        ValuesMut::new(data)
    }
}

/// The device address of a slice.
pub(crate) fn address<T: DeviceCopy>(slice: &DeviceSlice<T>) -> u64 {
    slice.as_device_ptr().as_raw()
}

/// A mask over the scores, `mask_rows × cols` contiguous elements with `mask_rows` dividing
/// the number of rows: row `r` of the data uses mask row `r % mask_rows` (one row for all,
/// one per query of stacked attention heads, or one per row).
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// Added to the scaled scores (`-inf` masks an element out).
    Additive(Values<'a, f32>),
    /// One byte per element: 0 masks the element out, anything else keeps it.
    Allowed(Values<'a, u8>),
}

impl<'a> Mask<'a> {
    /// An additive mask from a cust slice or buffer (or any [`Values`]).
    pub fn additive(values: impl Into<Values<'a, f32>>) -> Self {
        Mask::Additive(values.into())
    }

    /// An allowed-elements mask from a cust slice or buffer (or any [`Values`]).
    pub fn allowed(values: impl Into<Values<'a, u8>>) -> Self {
        Mask::Allowed(values.into())
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Mask::Additive(mask) => mask.len,
            Mask::Allowed(mask) => mask.len,
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
}
