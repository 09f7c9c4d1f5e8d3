//! The online-softmax statistics: a running maximum and a running sum of exponentials taken
//! relative to that maximum. Every variant that combines partial results (per lane, per warp,
//! per block, per slice of a row) does it through [`OnlineStats::merge`].

/// `log2(e)`: the kernels evaluate `e^x` as `2^(x · log2 e)`.
pub const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// How `2^x` is evaluated: `ex2.approx` on the device, `f32::exp2` in the host's tests.
pub trait Exp2 {
    fn exp2(x: f32) -> f32;
}

/// A sum with Kahan compensation: one thread that adds tens of thousands of terms in `f32`
/// (a thread-per-row kernel on a 64K-wide row) would otherwise drift past 1e-5.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompensatedSum {
    pub sum: f32,
    /// What the last additions lost to rounding, to subtract from the next term.
    pub compensation: f32,
}

impl CompensatedSum {
    pub const ZERO: Self = Self {
        sum: 0.0,
        compensation: 0.0,
    };

    #[inline(always)]
    pub fn add(&mut self, term: f32) {
        let corrected = term - self.compensation;
        let total = self.sum + corrected;
        self.compensation = (total - self.sum) - corrected;
        self.sum = total;
    }

    /// Multiplies the sum (a change of reference maximum).
    #[inline(always)]
    pub fn scale(&mut self, factor: f32) {
        self.sum *= factor;
        self.compensation *= factor;
    }

    /// The best estimate of the sum.
    #[inline(always)]
    pub fn value(self) -> f32 {
        self.sum - self.compensation
    }
}

/// Running maximum and the sum of `e^(x - max)` over the elements seen so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnlineStats {
    pub max: f32,
    pub sum: CompensatedSum,
}

impl OnlineStats {
    /// The state before any element: it is the identity of [`OnlineStats::merge`].
    pub const EMPTY: Self = Self {
        max: f32::NEG_INFINITY,
        sum: CompensatedSum::ZERO,
    };

    /// Statistics of a part of a row whose sum is already settled (e.g. read from another
    /// thread).
    #[inline(always)]
    pub fn new(max: f32, sum: f32) -> Self {
        Self {
            max,
            sum: CompensatedSum {
                sum,
                compensation: 0.0,
            },
        }
    }

    /// The row sum relative to `max`.
    #[inline(always)]
    pub fn sum(&self) -> f32 {
        self.sum.value()
    }

    /// `e^(x - max)`, as `2^((x − max)·log2 e)` with the subtraction first: exact at the
    /// maximum whatever its size (one FMA `x·log2 e − max·log2 e` keeps the rounding of
    /// `max·log2 e`, ~|max|·2^-24, and overflows once |max| passes 2.36e38). The maximum is
    /// taken from [`Self::exponent_origin`].
    #[inline(always)]
    pub fn exp_relative<E: Exp2>(x: f32, max: f32) -> f32 {
        E::exp2((x - Self::exponent_origin(max)) * LOG2_E)
    }

    /// What exponents are taken relative to: `max`, or 0 where it is `-inf` (nothing seen
    /// yet, or only `-inf`), so that `-inf` entries contribute 0 instead of
    /// `e^(-inf + inf) = NaN`; a row that is all `-inf` still ends up NaN when it is
    /// normalized, as in PyTorch.
    #[inline(always)]
    pub fn exponent_origin(max: f32) -> f32 {
        if max == f32::NEG_INFINITY { 0.0 } else { max }
    }

    /// Adds one element. The exponential of the new maximum is computed as `e^(x - x)`, not
    /// taken as 1, so that a `+inf` element makes the sum NaN as it does in PyTorch.
    #[inline(always)]
    pub fn push<E: Exp2>(&mut self, x: f32) {
        if x > self.max {
            self.sum.scale(Self::exp_relative::<E>(self.max, x));
            self.sum.add(Self::exp_relative::<E>(x, x));
            self.max = x;
        } else {
            self.sum.add(Self::exp_relative::<E>(x, self.max));
        }
    }

    /// Adds a batch of `len` elements, `element(0..len)`, whose maximum is `batch_max` (the
    /// largest element, NaN aside, as `f32::max` folds them; `-inf` for an empty batch): at
    /// most one rescale and one exponential per element, with no branch per element (what
    /// [`Self::push`] costs per element, this costs per batch). Taking the maximum from the
    /// caller lets 16-bit data find it on packed pairs, and `element` widen each value only
    /// for its exponential. `-inf` entries add nothing, so a partly filled batch is padded
    /// with them; `+inf` and NaN make the sum NaN as with `push`. The batch's exponentials
    /// are summed plainly, then added to the compensated sum.
    #[inline(always)]
    pub fn push_batch<E: Exp2>(
        &mut self,
        batch_max: f32,
        len: usize,
        element: impl Fn(usize) -> f32,
    ) {
        if batch_max > self.max {
            self.sum.scale(Self::exp_relative::<E>(self.max, batch_max));
            self.max = batch_max;
        }
        let mut batch_sum = 0.0;
        for i in 0..len {
            batch_sum += Self::exp_relative::<E>(element(i), self.max);
        }
        self.sum.add(batch_sum);
    }

    /// Adds a part of the row the caller has summed: its largest element `part_max` (`-inf`
    /// for a part of `-inf`s) and its sum of `e^(x − part_max)`. One rescale at most, and one
    /// exponential, whatever the part's size.
    #[inline(always)]
    pub fn push_part<E: Exp2>(&mut self, part_max: f32, part_sum: f32) {
        if part_max > self.max {
            self.sum.scale(Self::exp_relative::<E>(self.max, part_max));
            self.max = part_max;
        }
        self.sum
            .add(part_sum * Self::exp_relative::<E>(part_max, self.max));
    }

    /// Combines the statistics of two disjoint parts of a row. Commutative and associative up
    /// to rounding; [`OnlineStats::EMPTY`] is its identity. Merges happen in trees of small
    /// depth, so the result carries no compensation.
    #[inline(always)]
    pub fn merge<E: Exp2>(self, other: Self) -> Self {
        let max = self.max.max(other.max);
        Self::new(
            max,
            self.sum() * Self::exp_relative::<E>(self.max, max)
                + other.sum() * Self::exp_relative::<E>(other.max, max),
        )
    }
}
