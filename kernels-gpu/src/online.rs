//! The online-softmax statistics: a running maximum and a running sum of exponentials taken
//! relative to that maximum. Every variant that combines partial results (per lane, per warp,
//! per block, per slice of a row) does it through [`OnlineStats::merge`].

/// `log2(e)`: the kernels evaluate `e^x` as `2^(x · log2 e)`.
pub const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// How `2^x` is evaluated: `ex2.approx` on the device, `f32::exp2` in the host's tests.
pub trait Exp2 {
    fn exp2(x: f32) -> f32;
}

/// Running maximum and the sum of `e^(x - max)` over the elements seen so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnlineStats {
    pub max: f32,
    pub sum: f32,
}

impl OnlineStats {
    /// The state before any element: it is the identity of [`OnlineStats::merge`].
    pub const EMPTY: Self = Self {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };

    /// `e^(x - max)`. A maximum of `-inf` (nothing seen yet, or only `-inf`) is taken as 0 so
    /// that `-inf` entries contribute 0 instead of `e^(-inf + inf) = NaN`; a row that is all
    /// `-inf` still ends up NaN when it is normalized, as in PyTorch.
    #[inline(always)]
    pub fn exp_relative<E: Exp2>(x: f32, max: f32) -> f32 {
        let max = if max == f32::NEG_INFINITY { 0.0 } else { max };
        E::exp2((x - max) * LOG2_E)
    }

    /// Adds one element. The exponential of the new maximum is computed as `e^(x - x)`, not
    /// taken as 1, so that a `+inf` element makes the sum NaN as it does in PyTorch.
    #[inline(always)]
    pub fn push<E: Exp2>(&mut self, x: f32) {
        if x > self.max {
            self.sum = self.sum * Self::exp_relative::<E>(self.max, x) + Self::exp_relative::<E>(x, x);
            self.max = x;
        } else {
            self.sum += Self::exp_relative::<E>(x, self.max);
        }
    }

    /// Combines the statistics of two disjoint parts of a row. Commutative and associative up
    /// to rounding; [`OnlineStats::EMPTY`] is its identity.
    #[inline(always)]
    pub fn merge<E: Exp2>(self, other: Self) -> Self {
        let max = self.max.max(other.max);
        Self {
            max,
            sum: self.sum * Self::exp_relative::<E>(self.max, max)
                + other.sum * Self::exp_relative::<E>(other.max, max),
        }
    }
}
