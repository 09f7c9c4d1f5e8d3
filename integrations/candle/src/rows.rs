//! A candle layout as the rows the library takes: how many rows of the last dimension, how
//! wide, how many elements apart, from which element of the storage.

use candle_core::cuda_backend::cudarc::driver::CudaView;
use candle_core::{Layout, Result, bail};
use softmax::{CudarcElement, Shape};

/// The rows of a tensor's last dimension in its storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rows {
    pub shape: Shape,
    /// Elements between the starts of two rows (at least the row's width).
    pub stride: usize,
    /// The first element, in the storage.
    pub offset: usize,
}

impl Rows {
    /// The rows of `layout`: its last dimension contiguous, its leading dimensions collapsing
    /// into one row stride (dimensions of size 1 may have any stride). Anything else, and a
    /// tensor without dimensions, is an error naming the layout.
    pub fn of(layout: &Layout) -> Result<Self> {
        let (dims, strides) = (layout.dims(), layout.stride());
        let Some((&cols, leading)) = dims.split_last() else {
            bail!("softmax-candle: a scalar has no last dimension to normalize over");
        };
        if cols > 1 && strides[dims.len() - 1] != 1 {
            bail!(
                "softmax-candle: the last dimension must be contiguous (stride 1); this tensor's \
                 dims {dims:?} have strides {strides:?} (call .contiguous() first)"
            );
        }
        let rows: usize = leading.iter().product();
        // From the innermost leading dimension out, each of size > 1 must step by the
        // dimensions inside it.
        let mut stride = None::<usize>;
        let mut span = 0usize;
        for (&dim, &step) in leading.iter().zip(strides).rev() {
            if dim == 1 {
                continue;
            }
            match stride {
                None => {
                    stride = Some(step);
                    span = step * dim;
                }
                Some(_) if step == span => span *= dim,
                Some(_) => bail!(
                    "softmax-candle: the leading dimensions {leading:?} (strides {:?}) do not \
                     collapse into rows of one stride (call .contiguous() first)",
                    &strides[..leading.len()]
                ),
            }
        }
        let stride = stride.unwrap_or(cols);
        if rows > 1 && stride < cols {
            bail!(
                "softmax-candle: rows {stride} elements apart overlap their {cols} columns \
                 (dims {dims:?}, strides {strides:?})"
            );
        }
        let shape = Shape::new(rows, cols).map_err(candle_core::Error::wrap)?;
        Ok(Rows {
            shape,
            stride,
            offset: layout.start_offset(),
        })
    }

    /// Elements from the first row's start to the last row's end.
    pub fn span(&self) -> usize {
        match (self.shape.rows(), self.shape.cols()) {
            (0, _) | (_, 0) => 0,
            (rows, cols) => (rows - 1) * self.stride + cols,
        }
    }

    /// The library's view of these rows in `view`, the range of their storage that
    /// [`Rows::range`] gives.
    pub fn view_of<'a, T: CudarcElement>(
        &self,
        view: &'a CudaView<'_, T>,
    ) -> softmax::Result<softmax::Rows<'a>> {
        softmax::Rows::cudarc_strided(view, self.shape, self.stride)
    }

    /// The range of the storage from the first row's start to the last row's end.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.span()
    }

    /// Whether the rows are contiguous (one after another, no gaps).
    pub fn contiguous(&self) -> bool {
        self.shape.rows() <= 1 || self.stride == self.shape.cols()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(dims: &[usize], strides: &[usize], offset: usize) -> Result<Rows> {
        Rows::of(&Layout::new(dims.into(), strides.to_vec(), offset))
    }

    #[test]
    fn contiguous_and_narrowed_layouts_are_rows() {
        let r = rows(&[2, 3, 10], &[30, 10, 1], 0).unwrap();
        assert_eq!((r.shape.rows(), r.shape.cols(), r.stride), (6, 10, 10));
        // The last dimension narrowed from 10 to 7, starting at element 2.
        let r = rows(&[2, 3, 7], &[30, 10, 1], 2).unwrap();
        assert_eq!(
            (r.shape.rows(), r.stride, r.offset, r.span()),
            (6, 10, 2, 57)
        );
        // Dimensions of size 1 may have any stride.
        let r = rows(&[1, 4, 1, 5], &[999, 5, 77, 1], 0).unwrap();
        assert_eq!((r.shape.rows(), r.stride), (4, 5));
        let r = rows(&[7], &[1], 3).unwrap();
        assert_eq!((r.shape.rows(), r.shape.cols(), r.offset), (1, 7, 3));
    }

    #[test]
    fn other_layouts_are_refused_with_the_layout_named() {
        // Transposed: the last dimension is not contiguous.
        let e = rows(&[4, 3], &[1, 4], 0).unwrap_err().to_string();
        assert!(e.contains("last dimension must be contiguous"), "{e}");
        // Leading dimensions that do not collapse (a narrowed middle dimension).
        let e = rows(&[2, 3, 10], &[50, 10, 1], 0).unwrap_err().to_string();
        assert!(e.contains("do not collapse"), "{e}");
        // Broadcast rows (stride 0) overlap.
        let e = rows(&[3, 10], &[0, 1], 0).unwrap_err().to_string();
        assert!(e.contains("overlap"), "{e}");
        assert!(rows(&[], &[], 0).is_err());
    }
}
