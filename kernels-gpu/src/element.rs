//! The element types the operation kernels read and write (f32, bf16, f16 and the one-byte
//! boolean mask), their conversions to and from f32, and loads and stores of `N` consecutive
//! elements as the widest aligned accesses their size allows (16, 8 or 4 bytes).
#![allow(clippy::needless_range_loop)]

use core::arch::asm;

use crate::row_ops::DType;

/// bf16 bits (the upper half of an f32).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Bf16(u16);

/// IEEE half-precision bits.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct F16(u16);

/// A floating-point element: math happens in f32.
pub trait Element: Copy {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    /// Rounds to nearest, ties to even (`cvt.rn`).
    fn from_f32(value: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        value
    }
}

impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }

    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        let bits: u16;
        // SAFETY: a pure conversion on registers.
        unsafe { asm!("cvt.rn.bf16.f32 {h}, {f};", h = out(reg16) bits, f = in(reg32) value) };
        Bf16(bits)
    }
}

impl Element for F16 {
    const DTYPE: DType = DType::F16;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        let value: f32;
        // SAFETY: a pure conversion on registers.
        unsafe { asm!("cvt.f32.f16 {f}, {h};", f = out(reg32) value, h = in(reg16) self.0) };
        value
    }

    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        let bits: u16;
        // SAFETY: a pure conversion on registers.
        unsafe { asm!("cvt.rn.f16.f32 {h}, {f};", h = out(reg16) bits, f = in(reg32) value) };
        F16(bits)
    }
}

#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Words16([u32; 4]);

#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Words8([u32; 2]);

/// Reads `N` elements starting at `src`: 16-byte accesses when they span a multiple of 16
/// bytes (at most 32), one 8- or 4-byte access when they span exactly that, else one access
/// per element.
///
/// # Safety
/// `src..src + N` is readable and aligned to `min(16, N · size_of::<T>())` bytes when that
/// is 4, 8 or a multiple of 16.
#[inline(always)]
pub unsafe fn load<T: Copy, const N: usize>(src: *const T) -> [T; N] {
    let bytes = N * size_of::<T>();
    let mut words = [0u32; 8];
    // SAFETY (all branches): the caller guarantees the span is readable and aligned.
    unsafe {
        if bytes % 16 == 0 && bytes <= 32 {
            for chunk in 0..bytes / 16 {
                let vector = src.cast::<Words16>().add(chunk).read();
                for i in 0..4 {
                    words[4 * chunk + i] = vector.0[i];
                }
            }
        } else if bytes == 8 {
            let vector = src.cast::<Words8>().read();
            words[0] = vector.0[0];
            words[1] = vector.0[1];
        } else if bytes == 4 {
            words[0] = src.cast::<u32>().read();
        } else {
            let mut values = [src.read(); N];
            for i in 1..N {
                values[i] = src.add(i).read();
            }
            return values;
        }
        core::mem::transmute_copy(&words)
    }
}

/// Writes `N` elements starting at `dst`, with the accesses [`load`] would use.
///
/// # Safety
/// `dst..dst + N` is writable, aligned as for [`load`].
#[inline(always)]
pub unsafe fn store<T: Copy, const N: usize>(dst: *mut T, values: [T; N]) {
    let bytes = N * size_of::<T>();
    let mut words = [0u32; 8];
    // SAFETY (all branches): `values` fills the first `bytes` bytes of `words` (≤ 32), and the
    // caller guarantees the destination span is writable and aligned.
    unsafe {
        if bytes % 16 == 0 && bytes <= 32 {
            core::ptr::copy_nonoverlapping(&values, words.as_mut_ptr().cast::<[T; N]>(), 1);
            for chunk in 0..bytes / 16 {
                let vector = Words16([
                    words[4 * chunk],
                    words[4 * chunk + 1],
                    words[4 * chunk + 2],
                    words[4 * chunk + 3],
                ]);
                dst.cast::<Words16>().add(chunk).write(vector);
            }
        } else if bytes == 8 {
            core::ptr::copy_nonoverlapping(&values, words.as_mut_ptr().cast::<[T; N]>(), 1);
            dst.cast::<Words8>().write(Words8([words[0], words[1]]));
        } else if bytes == 4 {
            core::ptr::copy_nonoverlapping(&values, words.as_mut_ptr().cast::<[T; N]>(), 1);
            dst.cast::<u32>().write(words[0]);
        } else {
            for i in 0..N {
                dst.add(i).write(values[i]);
            }
        }
    }
}

/// Reads `N` elements of type `T` at element offset `offset` of `base` as f32.
///
/// # Safety
/// As [`load`] for `base as *const T + offset`.
#[inline(always)]
pub unsafe fn load_f32<T: Element, const N: usize>(base: u64, offset: usize) -> [f32; N] {
    // SAFETY: forwarded.
    unsafe { load::<T, N>((base as *const T).add(offset)) }.map(T::to_f32)
}

/// Writes `N` values converted to `dtype` at element offset `offset` of `base`.
///
/// # Safety
/// As [`store`] for `base` taken as a pointer to `dtype` elements, plus `offset`.
#[inline(always)]
pub unsafe fn store_as<const N: usize>(dtype: u32, base: u64, offset: usize, values: [f32; N]) {
    // SAFETY (all arms): forwarded.
    unsafe {
        if dtype == DType::Bf16 as u32 {
            store::<Bf16, N>((base as *mut Bf16).add(offset), values.map(Bf16::from_f32));
        } else if dtype == DType::F16 as u32 {
            store::<F16, N>((base as *mut F16).add(offset), values.map(F16::from_f32));
        } else {
            store::<f32, N>((base as *mut f32).add(offset), values);
        }
    }
}
