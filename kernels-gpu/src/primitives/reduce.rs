//! Reductions across lanes (butterfly shuffles: every lane ends with the result, so no
//! broadcast step is needed) and across the warps of a block (through shared memory), for any
//! [`Partial`] result: the online-softmax statistics, or a plain sum.

use crate::launch::WARP_SIZE;
use crate::primitives::device::{DeviceExp2, block_dim, shfl_xor_f32, sync_threads, thread_idx};
use crate::primitives::online::OnlineStats;

/// A partial result over part of a row that two disjoint parts combine into one, carried as
/// at most two floats (what a shuffle or a shared-memory slot moves).
pub trait Partial: Copy {
    /// The result over no element: the identity of [`Partial::merge`].
    const EMPTY: Self;
    /// Floats of [`Partial::to_floats`] that carry information (1 or 2).
    const FLOATS: usize;
    fn merge(self, other: Self) -> Self;
    fn to_floats(self) -> [f32; 2];
    fn from_floats(floats: [f32; 2]) -> Self;
}

impl Partial for OnlineStats {
    const EMPTY: Self = OnlineStats::EMPTY;
    const FLOATS: usize = 2;

    #[inline(always)]
    fn merge(self, other: Self) -> Self {
        OnlineStats::merge::<DeviceExp2>(self, other)
    }

    #[inline(always)]
    fn to_floats(self) -> [f32; 2] {
        [self.max, self.sum()]
    }

    #[inline(always)]
    fn from_floats([max, sum]: [f32; 2]) -> Self {
        OnlineStats::new(max, sum)
    }
}

/// A sum over part of a row (the backward pass's `Σ dy·y` or `Σ dy`).
#[derive(Clone, Copy, Debug)]
pub struct Sum(pub f32);

impl Partial for Sum {
    const EMPTY: Self = Sum(0.0);
    const FLOATS: usize = 1;

    #[inline(always)]
    fn merge(self, other: Self) -> Self {
        Sum(self.0 + other.0)
    }

    #[inline(always)]
    fn to_floats(self) -> [f32; 2] {
        [self.0, 0.0]
    }

    #[inline(always)]
    fn from_floats([sum, _]: [f32; 2]) -> Self {
        Sum(sum)
    }
}

/// Defines a struct of two `f32` fields that a reduction adds field by field, with its
/// [`Partial`] implementation: two plain sums carried through one reduction. (Used by the
/// operation modules only: unused in the softmax module's build.)
#[allow(unused_macros)]
macro_rules! two_sums {
    ($(#[$doc:meta])* $vis:vis struct $name:ident { $first:ident, $second:ident }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        $vis struct $name {
            $first: f32,
            $second: f32,
        }

        impl $crate::primitives::reduce::Partial for $name {
            const EMPTY: Self = $name {
                $first: 0.0,
                $second: 0.0,
            };
            const FLOATS: usize = 2;

            #[inline(always)]
            fn merge(self, other: Self) -> Self {
                $name {
                    $first: self.$first + other.$first,
                    $second: self.$second + other.$second,
                }
            }

            #[inline(always)]
            fn to_floats(self) -> [f32; 2] {
                [self.$first, self.$second]
            }

            #[inline(always)]
            fn from_floats([$first, $second]: [f32; 2]) -> Self {
                $name { $first, $second }
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use two_sums;

/// A maximum over part of a row (the first of the forward pass's two block reductions).
#[derive(Clone, Copy, Debug)]
pub struct Max(pub f32);

impl Partial for Max {
    const EMPTY: Self = Max(f32::NEG_INFINITY);
    const FLOATS: usize = 1;

    #[inline(always)]
    fn merge(self, other: Self) -> Self {
        Max(self.0.max(other.0))
    }

    #[inline(always)]
    fn to_floats(self) -> [f32; 2] {
        [self.0, 0.0]
    }

    #[inline(always)]
    fn from_floats([max, _]: [f32; 2]) -> Self {
        Max(max)
    }
}

/// Maximum over each aligned group of `LANES` lanes (a power of two up to 32); every lane of a
/// group gets its group's result. All 32 lanes must call it.
#[inline(always)]
pub fn group_max<const LANES: u32>(mut value: f32) -> f32 {
    let mut offset = LANES / 2;
    while offset > 0 {
        value = value.max(shfl_xor_f32(value, offset));
        offset /= 2;
    }
    value
}

/// Sum over each aligned group of `LANES` lanes, like [`group_max`].
#[inline(always)]
pub fn group_sum<const LANES: u32>(mut value: f32) -> f32 {
    let mut offset = LANES / 2;
    while offset > 0 {
        value += shfl_xor_f32(value, offset);
        offset /= 2;
    }
    value
}

/// Merges the partial results of each aligned group of `LANES` lanes (a power of two up to
/// 32); every lane of a group gets its group's result. All 32 lanes must call it.
#[inline(always)]
pub fn group_reduce<S: Partial, const LANES: u32>(mut partial: S) -> S {
    let mut offset = LANES / 2;
    while offset > 0 {
        let [first, second] = partial.to_floats();
        let theirs = [
            shfl_xor_f32(first, offset),
            // A constant condition: a one-float partial shuffles once.
            if S::FLOATS > 1 {
                shfl_xor_f32(second, offset)
            } else {
                second
            },
        ];
        partial = partial.merge(S::from_floats(theirs));
        offset /= 2;
    }
    partial
}

/// Merges the partial results of every thread of the block; every thread gets the result.
///
/// # Safety
/// Called by all threads of the block from uniform control flow, with a block of whole warps
/// (at most 1024 threads). `scratch` points to [`crate::launch::REDUCTION_SCRATCH_FLOATS`]
/// floats of shared memory that nothing else uses during the call.
#[inline(always)]
pub unsafe fn block_reduce<S: Partial>(partial: S, scratch: *mut f32) -> S {
    let warps = block_dim() / WARP_SIZE;
    let warp = thread_idx() / WARP_SIZE;
    let lane = thread_idx() % WARP_SIZE;
    let [first, second] = group_reduce::<S, WARP_SIZE>(partial).to_floats();
    if lane == 0 {
        // SAFETY: `warp < 32`, and the scratch holds 32 first floats then 32 second ones.
        unsafe {
            scratch.add(warp as usize).write(first);
            if S::FLOATS > 1 {
                scratch.add((WARP_SIZE + warp) as usize).write(second);
            }
        }
    }
    sync_threads();
    let mine = if lane < warps {
        // SAFETY: as above; slot `lane` was written before the barrier.
        unsafe {
            S::from_floats([
                scratch.add(lane as usize).read(),
                if S::FLOATS > 1 {
                    scratch.add((WARP_SIZE + lane) as usize).read()
                } else {
                    0.0
                },
            ])
        }
    } else {
        S::EMPTY
    };
    let block = group_reduce::<S, WARP_SIZE>(mine);
    // Nobody may overwrite the scratch (a later reduction) before every warp has read it.
    sync_threads();
    block
}
