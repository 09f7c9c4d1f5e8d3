//! The element types the operation kernels read and write (f32, bf16, f16 and the one-byte
//! boolean mask), their conversions to and from f32, and packs of `N` consecutive elements
//! loaded and stored as the widest aligned accesses their size allows (16, 8 or 4 bytes,
//! through [`crate::primitives::memory`]'s `ld.global`/`st.global`).
#![allow(clippy::needless_range_loop)]

use core::arch::asm;

use crate::launch::ops::DType;
use crate::primitives::device::Vector4;
use crate::primitives::memory::{
    load_element, load_span, load_words, spans, store_element, store_span,
};

/// bf16 bits (the upper half of an f32).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct Bf16(u16);

/// IEEE half-precision bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct F16(u16);

/// A floating-point element: math happens in f32. A pack of `N` elements is read as packed
/// 32-bit words (one f32, or two 16-bit elements, low half first, per word when the pack is a
/// single access; one element per word otherwise), which is how the kernels keep it in
/// registers: half the registers of widened f32 values for 16-bit data. Stores convert from
/// f32, two 16-bit elements per instruction.
pub trait Element: Copy {
    const DTYPE: DType;
    /// A word holding -inf in every element slot: the padding of a pack past a row's end.
    const NEG_INF_WORD: u32;

    /// # Safety
    /// As [`load_global`](crate::primitives::memory::load_global) for `src..src + N`.
    #[inline(always)]
    unsafe fn load_packed<const N: usize>(src: *const Self) -> [u32; N] {
        // SAFETY: forwarded from the contract.
        unsafe { load_packed_words::<Self, N, false>(src) }
    }

    /// As [`Element::load_packed`], for data the launch reads for the last time: streaming
    /// loads (see [`load_words`]).
    ///
    /// # Safety
    /// As [`load_global`](crate::primitives::memory::load_global) for `src..src + N`.
    #[inline(always)]
    unsafe fn load_packed_last_use<const N: usize>(src: *const Self) -> [u32; N] {
        // SAFETY: forwarded from the contract.
        unsafe { load_packed_words::<Self, N, true>(src) }
    }

    /// The first `count` (≤ `N`) elements at each address in `sources` (the same run of each
    /// of a kernel's input rows) into the slots of a pack laid out as [`Element::load_packed`]
    /// lays it out; the other slots of input `i`'s pack hold `pads[i]` (a word of padding
    /// elements). Half of a 16-byte pack is one 8-byte access per input (the words the pack's
    /// first half fills); any other run is read one element at a time. One decision for all
    /// inputs: with one per input, the second input's loads waited for the first's to land.
    ///
    /// # Safety
    /// `source..source + count` is readable global memory for each source; when it is half of
    /// a 16-byte pack, each source is 8-byte aligned (as such an end of a row at least a pack
    /// long is: see [`crate::primitives::row_part`]).
    #[inline(always)]
    unsafe fn load_packed_runs<const N: usize, const INPUTS: usize>(
        sources: [*const Self; INPUTS],
        count: usize,
        pads: [u32; INPUTS],
    ) -> [[u32; N]; INPUTS] {
        let mut packs = [[0u32; N]; INPUTS];
        for input in 0..INPUTS {
            packs[input] = [pads[input]; N];
        }
        if N * size_of::<Self>() == 16 && 2 * count == N {
            for input in 0..INPUTS {
                // SAFETY: 8 readable bytes at the source, 8-byte aligned (contract).
                let [low, high, _, _] = unsafe { load_words::<2, false>(sources[input].cast()) };
                packs[input][0] = low;
                packs[input][1] = high;
            }
            return packs;
        }
        for input in 0..INPUTS {
            for i in 0..N {
                if i < count {
                    // SAFETY: element `i < count` lies in the run.
                    let [bits] = unsafe { Self::load_packed::<1>(sources[input].add(i)) };
                    if size_of::<Self>() == 2 && spans(2 * N) {
                        let shift = 16 * (i % 2);
                        let word = &mut packs[input][i / 2];
                        *word = (*word & !(0xffff << shift)) | ((bits & 0xffff) << shift);
                    } else {
                        packs[input][i] = bits;
                    }
                }
            }
        }
        packs
    }

    /// Element `i` of a pack read by [`Element::load_packed`], widened to f32. 16-bit types
    /// widen in inline assembly that LLVM may not merge or hoist, so LLVM does not keep a
    /// row's widened floats live from its reduction to its writes. (ptxas still merges
    /// identical widenings; a different instruction for the writes' widening, tried to stop
    /// that, measured slower: performance log, "16-bit data kept packed in registers".)
    fn widen<const N: usize>(words: &[u32; N], i: usize) -> f32;

    /// The largest of the `N` elements of a pack laid out as [`Element::load_packed`] lays it
    /// out, NaN aside as `f32::max` folds them (a pack of NaN only gives NaN or `-inf`; either
    /// leaves a batch's maximum to its other packs).
    #[inline(always)]
    fn pack_max<const N: usize>(words: &[u32; N]) -> f32 {
        widened_max::<Self, N>(words)
    }

    /// # Safety
    /// As [`load_global`](crate::primitives::memory::load_global) for `src..src + N`.
    #[inline(always)]
    unsafe fn load_f32<const N: usize>(src: *const Self) -> [f32; N] {
        // SAFETY: forwarded from the contract.
        Self::widen_all(&unsafe { Self::load_packed::<N>(src) })
    }

    /// Every element of a pack read by [`Element::load_packed`], widened to f32.
    #[inline(always)]
    fn widen_all<const N: usize>(words: &[u32; N]) -> [f32; N] {
        let mut values = [0.0; N];
        for i in 0..N {
            values[i] = Self::widen(words, i);
        }
        values
    }

    /// Rounds to nearest, ties to even (`cvt.rn`).
    ///
    /// # Safety `dst..dst + N` is writable global memory, aligned as
    /// [`load_global`](crate::primitives::memory::load_global) asks.
    unsafe fn store_f32<const N: usize>(dst: *mut Self, values: [f32; N]);
}

/// The largest element of a pack, each widened to f32 (`Element::pack_max`'s general case).
#[inline(always)]
fn widened_max<T: Element, const N: usize>(words: &[u32; N]) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for i in 0..N {
        max = max.max(T::widen(words, i));
    }
    max
}

/// `N` elements of `size` bytes as packed words: one access when they span 4 to 32 bytes,
/// else one per element (in the low bits of its own word); streaming loads with `LAST_USE`.
///
/// # Safety
/// As [`load_global`](crate::primitives::memory::load_global).
#[inline(always)]
unsafe fn load_packed_words<T: Copy, const N: usize, const LAST_USE: bool>(
    src: *const T,
) -> [u32; N] {
    let bytes = N * size_of::<T>();
    let mut words = [0u32; N];
    // SAFETY (both branches): forwarded from the contract.
    unsafe {
        if spans(bytes) {
            let span = load_span::<LAST_USE>(src.cast(), bytes);
            for i in 0..bytes.div_ceil(4) {
                words[i] = span[i];
            }
        } else {
            for i in 0..N {
                let element = load_element::<T, LAST_USE>(src.add(i));
                words[i] = if size_of::<T>() == 4 {
                    core::mem::transmute_copy::<T, u32>(&element)
                } else {
                    core::mem::transmute_copy::<T, u16>(&element) as u32
                };
            }
        }
    }
    words
}

/// The 16-bit element `i` of a pack of `N`, in the low bits of the result.
#[inline(always)]
fn half_bits<const N: usize>(words: &[u32; N], i: usize) -> u32 {
    if spans(2 * N) {
        words[i / 2] >> (16 * (i % 2))
    } else {
        words[i]
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    const NEG_INF_WORD: u32 = 0xff80_0000;

    #[inline(always)]
    fn widen<const N: usize>(words: &[u32; N], i: usize) -> f32 {
        f32::from_bits(words[i])
    }

    #[inline(always)]
    unsafe fn store_f32<const N: usize>(dst: *mut f32, values: [f32; N]) {
        // SAFETY (both branches): forwarded from the contract.
        unsafe {
            if spans(4 * N) {
                let mut words = [0u32; 8];
                for i in 0..N {
                    words[i] = values[i].to_bits();
                }
                store_span(dst.cast(), 4 * N, words);
            } else {
                for i in 0..N {
                    store_element(dst.add(i), values[i]);
                }
            }
        }
    }
}

/// Stores `N` values as 16-bit elements: `pair` narrows two values into one word (first in
/// the low half), `single` one value.
///
/// # Safety `dst..dst + N` is writable global memory, aligned as
/// [`load_global`](crate::primitives::memory::load_global) asks.
#[inline(always)]
unsafe fn store_halves<T: Copy, const N: usize>(
    dst: *mut T,
    values: [f32; N],
    pair: impl Fn(f32, f32) -> u32,
    single: impl Fn(f32) -> T,
) {
    // SAFETY (both branches): forwarded from the contract.
    unsafe {
        if spans(2 * N) {
            let mut words = [0u32; 8];
            for i in 0..N / 2 {
                words[i] = pair(values[2 * i], values[2 * i + 1]);
            }
            store_span(dst.cast(), 2 * N, words);
        } else {
            for i in 0..N {
                store_element(dst.add(i), single(values[i]));
            }
        }
    }
}

/// `Element::store_f32` of a 16-bit type: two elements per `cvt.rn.<type>x2.f32` into one
/// word when the pack is a single access, one `cvt.rn.<type>.f32` each otherwise.
macro_rules! narrowing_store {
    ($type:ident, $name:literal) => {
        #[inline(always)]
        unsafe fn store_f32<const N: usize>(dst: *mut $type, values: [f32; N]) {
            let pair = |low: f32, high: f32| {
                let word: u32;
                // SAFETY: a pure conversion on registers (`d.hi = cvt(a)`, `d.lo = cvt(b)`).
                unsafe {
                    asm!(concat!("cvt.rn.", $name, "x2.f32 {d}, {a}, {b};"), d = out(reg32) word,
                        a = in(reg32) high, b = in(reg32) low, options(pure, nomem, nostack))
                };
                word
            };
            let single = |value: f32| {
                let bits: u16;
                // SAFETY: a pure conversion on registers.
                unsafe {
                    asm!(concat!("cvt.rn.", $name, ".f32 {h}, {f};"), h = out(reg16) bits,
                        f = in(reg32) value, options(pure, nomem, nostack))
                };
                $type(bits)
            };
            // SAFETY: forwarded from the contract.
            unsafe { store_halves(dst, values, pair, single) }
        }
    };
}

/// `Element::pack_max` of a 16-bit type: a pack read as one access holds two elements per
/// word, so `max.<type>x2` folds the words into one word of two pairwise maxima (exact: a
/// maximum needs no rounding, and it skips NaN as `f32::max` does), and only that word's two
/// halves are widened.
macro_rules! packed_max {
    ($pair:literal) => {
        #[inline(always)]
        fn pack_max<const N: usize>(words: &[u32; N]) -> f32 {
            if !spans(2 * N) || N < 4 {
                return widened_max::<Self, N>(words);
            }
            let mut pair = words[0];
            for &word in &words[1..N / 2] {
                // SAFETY: a pure operation on registers.
                unsafe {
                    asm!(concat!("max.", $pair, " {d}, {a}, {b};"), d = lateout(reg32) pair,
                        a = in(reg32) pair, b = in(reg32) word, options(pure, nomem, nostack))
                };
            }
            Self::widen(&[pair, 0], 0).max(Self::widen(&[pair, 0], 1))
        }
    };
}

impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
    const NEG_INF_WORD: u32 = 0xff80_ff80;

    /// bf16 is the upper half of an f32: one mask or one shift.
    #[inline(always)]
    fn widen<const N: usize>(words: &[u32; N], i: usize) -> f32 {
        let value: f32;
        // SAFETY: register arithmetic. Deliberately not `pure` (see `Element::widen`).
        unsafe {
            if spans(2 * N) && i % 2 == 1 {
                asm!("and.b32 {f}, {w}, 0xffff0000;", f = out(reg32) value,
                    w = in(reg32) words[i / 2], options(nomem, nostack, preserves_flags))
            } else {
                asm!("shl.b32 {f}, {w}, 16;", f = out(reg32) value,
                    w = in(reg32) half_bits(words, i), options(nomem, nostack, preserves_flags))
            }
        };
        value
    }

    narrowing_store!(Bf16, "bf16");
    packed_max!("bf16x2");
}

impl Element for F16 {
    const DTYPE: DType = DType::F16;
    const NEG_INF_WORD: u32 = 0xfc00_fc00;

    #[inline(always)]
    fn widen<const N: usize>(words: &[u32; N], i: usize) -> f32 {
        let half = half_bits(words, i) as u16;
        let value: f32;
        // SAFETY: a conversion on registers. Deliberately not `pure` (see `Element::widen`).
        unsafe {
            asm!("cvt.f32.f16 {f}, {h};", f = out(reg32) value, h = in(reg16) half,
                options(nomem, nostack, preserves_flags))
        };
        value
    }

    narrowing_store!(F16, "f16");
    packed_max!("f16x2");
}

/// Writes `N` values converted to `dtype` at element offset `offset` of `base`.
///
/// # Safety
/// `base` taken as a pointer to `dtype` elements, plus `offset`, is writable for `N`
/// elements, aligned as for [`load_global`](crate::primitives::memory::load_global).
#[inline(always)]
pub unsafe fn store_as<const N: usize>(dtype: u32, base: u64, offset: usize, values: [f32; N]) {
    // SAFETY (all arms): forwarded.
    unsafe {
        if dtype == DType::Bf16 as u32 {
            Bf16::store_f32((base as *mut Bf16).add(offset), values);
        } else if dtype == DType::F16 as u32 {
            F16::store_f32((base as *mut F16).add(offset), values);
        } else {
            f32::store_f32((base as *mut f32).add(offset), values);
        }
    }
}

/// A pack kept by [`copy_words`] (or copied there as it lay in global memory, by
/// [`copy_async_16`](crate::primitives::memory::copy_async_16)), as `load_packed` returns it.
///
/// # Safety
/// `at` holds `N` elements of `E` in shared memory that [`copy_words`] wrote, or that a
/// landed asynchronous copy of a 16-byte pack filled, aligned for `N` of them.
#[inline(always)]
pub unsafe fn cached_words<E: Element, const N: usize>(at: *const E) -> [u32; N] {
    let mut words = [0u32; N];
    // SAFETY: forwarded; the same widths `copy_words` stored.
    unsafe {
        match N * size_of::<E>() {
            16 => {
                let Vector4(vector) = at.cast::<Vector4<u32>>().read();
                for i in 0..N.min(4) {
                    words[i] = vector[i];
                }
            }
            4 => words[0] = at.cast::<u32>().read(),
            2 => words[0] = u32::from(at.cast::<u16>().read()),
            _ => {}
        }
    }
    words
}

/// Stores a pack as it was read, in shared memory.
///
/// # Safety
/// `at` holds `N` elements of `E` in shared memory, aligned for `N` of them.
#[inline(always)]
pub unsafe fn copy_words<E: Element, const N: usize>(at: *mut E, words: &[u32; N]) {
    let bytes = N * size_of::<E>();
    // SAFETY: forwarded; a pack of `N` elements read as `N` words holds them in its first
    // `bytes / 4` words (or the low half of one word for a single 16-bit element).
    unsafe {
        match bytes {
            16 => at
                .cast::<[u32; 4]>()
                .write([words[0], words[1], words[2], words[3]]),
            4 => at.cast::<u32>().write(words[0]),
            2 => at.cast::<u16>().write(words[0] as u16),
            _ => {}
        }
    }
}
