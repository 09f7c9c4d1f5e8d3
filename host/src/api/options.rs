//! What a call computes besides its views, and where it runs: scales, masks, causality, the
//! result of fully masked rows, the f32 softmax variant, and the stream.

use cust::stream::Stream;
use cust::sys;

use super::views::{Mask, MaskedRows, Values};
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::variant::Variant;

/// The stream a call enqueues its work on: the instance's own (the default), a cust stream,
/// a cudarc stream (feature `cudarc`), or a raw `CUstream` ([`CallStream::raw`]). Every kind
/// of stream is of the instance's device and its primary context.
///
/// A call on a stream other than the instance's returns while its kernels still use the
/// buffers: synchronize that stream (or order later work after it with an event) before
/// reading the outputs, writing the inputs again or dropping either. Calls on any number of
/// streams through one instance are correct in any interleaving: each stream gets a
/// workspace of its own (docs/library.md, "One instance, many streams"). The first call on a
/// new element type loads a module, which waits for the device; [`Softmax::reserve`](crate::api::Softmax::reserve)
/// does that ahead of time.
#[derive(Clone, Copy)]
pub struct CallStream<'a>(pub(crate) StreamKind<'a>);

#[derive(Clone, Copy)]
pub(crate) enum StreamKind<'a> {
    Instance,
    Cust(&'a Stream),
    Raw(sys::CUstream),
    #[cfg(feature = "cudarc")]
    Cudarc(&'a cudarc::driver::CudaStream),
}

impl CallStream<'_> {
    /// A raw `CUstream` (null: the legacy default stream).
    ///
    /// # Safety
    /// `stream` is a stream of the call's device's primary context, valid for the duration of
    /// every call given it.
    pub unsafe fn raw(stream: sys::CUstream) -> CallStream<'static> {
        CallStream(StreamKind::Raw(stream))
    }

    /// The driver's handle, `instance` standing for the instance's own stream.
    pub(crate) fn handle(self, instance: sys::CUstream) -> sys::CUstream {
        match self.0 {
            StreamKind::Instance => instance,
            StreamKind::Cust(stream) => stream.as_inner(),
            StreamKind::Raw(stream) => stream,
            #[cfg(feature = "cudarc")]
            StreamKind::Cudarc(stream) => stream.cu_stream().cast(),
        }
    }
}

impl std::fmt::Debug for CallStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            StreamKind::Instance => f.write_str("CallStream(instance)"),
            StreamKind::Cust(stream) => write!(f, "CallStream(cust {:?})", stream.as_inner()),
            StreamKind::Raw(stream) => write!(f, "CallStream(raw {stream:?})"),
            #[cfg(feature = "cudarc")]
            StreamKind::Cudarc(stream) => write!(f, "CallStream(cudarc {:?})", stream.cu_stream()),
        }
    }
}

impl<'a> From<&'a Stream> for CallStream<'a> {
    fn from(stream: &'a Stream) -> Self {
        CallStream(StreamKind::Cust(stream))
    }
}

/// Options of a call: `softmax(x · scale · row_scale[r] + mask)`, with a causal mask and a
/// choice for fully masked rows, the f32 softmax variant, and the stream. The backward
/// operations use only the scales (their gradient is with respect to the unscaled scores).
#[derive(Clone, Copy, Debug)]
pub struct Options<'a> {
    pub(crate) scale: f32,
    pub(crate) row_scale: Option<Values<'a, f32>>,
    pub(crate) mask: Option<Mask<'a>>,
    pub(crate) causal: bool,
    pub(crate) masked_rows: MaskedRows,
    pub(crate) variant: Variant,
    pub(crate) stream: CallStream<'a>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            scale: 1.0,
            row_scale: None,
            mask: None,
            causal: false,
            masked_rows: MaskedRows::Nan,
            variant: Variant::Auto,
            stream: CallStream(StreamKind::Instance),
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
    pub fn row_scale(mut self, scales: impl Into<Values<'a, f32>>) -> Self {
        self.row_scale = Some(scales.into());
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

    /// Runs f32 softmax with this variant (a seed baseline or a production kernel) instead
    /// of [`Variant::Auto`]. A variant other than `Auto` runs only f32 softmax of contiguous
    /// rows without other options (anything else is [`Error::Unsupported`]).
    pub fn variant(mut self, variant: Variant) -> Self {
        self.variant = variant;
        self
    }

    /// Issues the call on `stream` (a cust or cudarc stream, or [`CallStream::raw`]) instead
    /// of the instance's own; see [`CallStream`].
    pub fn on(mut self, stream: impl Into<CallStream<'a>>) -> Self {
        self.stream = stream.into();
        self
    }

    /// Whether the options leave the scores as they are (no scale, mask or causality, NaN
    /// for fully masked rows).
    pub(crate) fn is_plain(&self) -> bool {
        self.row_scale.is_none()
            && self.mask.is_none()
            && !self.causal
            && self.scale == 1.0
            && self.masked_rows == MaskedRows::Nan
    }

    /// Checks the options against the data's shape.
    pub(crate) fn check(&self, shape: Shape) -> Result<()> {
        self.variant.validate()?;
        if !(self.scale > 0.0 && self.scale.is_finite()) {
            return Err(Error::Scale(self.scale));
        }
        if let Some(scales) = self.row_scale
            && scales.len != shape.rows()
        {
            return Err(Error::RowScaleLength {
                len: scales.len,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(rows: usize, cols: usize) -> Shape {
        Shape::new(rows, cols).unwrap()
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
