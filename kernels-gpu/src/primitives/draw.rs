//! The arithmetic of a draw, pure and compiled for the host too: the order in which the
//! sampler ranks a row's columns, and the exponential variate behind each column's Gumbel
//! noise, computed so that it keeps its relative precision near 0.

use super::philox::uniform_open;

/// An order-preserving integer of a float: `order_key(a) < order_key(b)` exactly when
/// `a < b`, for every float but NaN (−0 and +0, which compare equal, are one key: callers
/// add `+0.0` first, which turns −0 into +0).
#[inline(always)]
pub fn order_key(value: f32) -> u32 {
    let bits = value.to_bits();
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The float whose [`order_key`] is `key`.
#[inline(always)]
pub fn from_order_key(key: u32) -> f32 {
    f32::from_bits(if key & 0x8000_0000 != 0 {
        key & 0x7FFF_FFFF
    } else {
        !key
    })
}

/// A column's place in the sampler's order, as one integer: larger logits first, the lower
/// column first among equal logits. A filter that keeps the first `n` columns in that order
/// keeps exactly those whose rank is at least the `n`-th's.
#[inline(always)]
pub fn rank(value: f32, col: u32) -> u64 {
    (u64::from(order_key(value + 0.0)) << 32) | u64::from(!col)
}

/// The logit a [`rank`] was made from (+0 for either zero).
#[inline(always)]
pub fn value_of_rank(rank: u64) -> f32 {
    from_order_key((rank >> 32) as u32)
}

/// `ln(x)` for a positive normal `x`, to within a few ulp of the result, relative: near
/// `x = 1` too, where `ln(x)` is small (an approximate `log2` there has an absolute error
/// that is large beside its result). `x = 2^e · m` with `m` in `[√½, √2)`, and
/// `ln(m) = 2·atanh(s)` with `s = (m − 1)/(m + 1)` (`|s| ≤ 0.172`), a series in `s²` to the
/// ninth power; `m − 1` is exact.
#[inline(always)]
pub fn ln_precise(x: f32) -> f32 {
    let bits = x.to_bits();
    // The exponent moved so that the mantissa lands in [√½, √2): 0x3F35_04F3 is √½.
    let shifted = bits.wrapping_sub(0x3F35_04F3);
    let exponent = (shifted as i32) >> 23;
    let m = f32::from_bits(bits.wrapping_sub((exponent as u32) << 23));
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let series = 1.0 + z * (1.0 / 3.0 + z * (1.0 / 5.0 + z * (1.0 / 7.0 + z * (1.0 / 9.0))));
    const LN_2_HIGH: f32 = 0.693_145_75;
    const LN_2_LOW: f32 = 1.428_606_8e-6;
    let e = exponent as f32;
    e * LN_2_HIGH + (2.0 * s * series + e * LN_2_LOW)
}

/// An exponential variate of mean 1 from 32 random bits: `−ln(u)` for the uniform `u` of
/// [`uniform_open`], in `[5.96e-8, 16.6]`, with its relative precision kept when `u` is near
/// 1. A column's Gumbel noise is `−ln` of it.
#[inline(always)]
pub fn exponential_of(bits: u32) -> f32 {
    -ln_precise(uniform_open(bits))
}

/// An upper bound on any column's Gumbel noise (`−ln` of the smallest [`exponential_of`],
/// 16.64): a column whose logit is this far below a score already drawn cannot win.
pub const GUMBEL_NOISE_BOUND: f32 = 16.7;
