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

// Global-memory accesses, written out: the operation kernels' pointers arrive inside a
// parameter struct, so LLVM cannot tell they are global and would emit generic accesses.

/// `ld.global` of `WORDS` (1, 2 or 4) 32-bit words.
#[inline(always)]
unsafe fn load_words<const WORDS: usize>(address: *const u8) -> [u32; 4] {
    let (mut a, mut b, mut c, mut d) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the caller guarantees the words are readable and aligned to their total size.
    unsafe {
        match WORDS {
            4 => asm!("ld.global.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];",
                a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
                p = in(reg64) address, options(pure, readonly, nostack, preserves_flags)),
            2 => asm!("ld.global.v2.b32 {{{a}, {b}}}, [{p}];",
                a = out(reg32) a, b = out(reg32) b,
                p = in(reg64) address, options(pure, readonly, nostack, preserves_flags)),
            _ => asm!("ld.global.b32 {a}, [{p}];",
                a = out(reg32) a,
                p = in(reg64) address, options(pure, readonly, nostack, preserves_flags)),
        }
    }
    [a, b, c, d]
}

/// `st.global` of the first `WORDS` (1, 2 or 4) of `words`.
#[inline(always)]
unsafe fn store_words<const WORDS: usize>(address: *mut u8, [a, b, c, d]: [u32; 4]) {
    // SAFETY: the caller guarantees the words are writable and aligned to their total size.
    unsafe {
        match WORDS {
            4 => asm!("st.global.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};",
                a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, d = in(reg32) d,
                p = in(reg64) address, options(nostack, preserves_flags)),
            2 => asm!("st.global.v2.b32 [{p}], {{{a}, {b}}};",
                a = in(reg32) a, b = in(reg32) b,
                p = in(reg64) address, options(nostack, preserves_flags)),
            _ => asm!("st.global.b32 [{p}], {a};",
                a = in(reg32) a,
                p = in(reg64) address, options(nostack, preserves_flags)),
        }
    }
}

/// `ld.global` of one element of 1, 2 or 4 bytes, as the low bits of a word.
#[inline(always)]
unsafe fn load_element<T: Copy>(address: *const T) -> T {
    let word: u32;
    // SAFETY: the caller guarantees the element is readable and aligned.
    unsafe {
        match size_of::<T>() {
            4 => word = load_words::<1>(address.cast())[0],
            2 => {
                let half: u16;
                asm!("ld.global.b16 {h}, [{p}];", h = out(reg16) half,
                    p = in(reg64) address, options(pure, readonly, nostack, preserves_flags));
                word = half as u32;
            }
            _ => {
                let byte: u16;
                asm!("ld.global.u8 {h}, [{p}];", h = out(reg16) byte,
                    p = in(reg64) address, options(pure, readonly, nostack, preserves_flags));
                word = byte as u32;
            }
        }
        core::mem::transmute_copy(&word)
    }
}

/// `st.global` of one element of 2 or 4 bytes.
#[inline(always)]
unsafe fn store_element<T: Copy>(address: *mut T, value: T) {
    // SAFETY: the caller guarantees the element is writable and aligned; `value` is 2 or 4
    // bytes.
    unsafe {
        if size_of::<T>() == 4 {
            store_words::<1>(address.cast(), [core::mem::transmute_copy(&value), 0, 0, 0]);
        } else {
            let half: u16 = core::mem::transmute_copy(&value);
            asm!("st.global.b16 [{p}], {h};", h = in(reg16) half,
                p = in(reg64) address, options(nostack, preserves_flags));
        }
    }
}

/// Reads `N` elements starting at `src` in global memory: 16-byte accesses when they span a
/// multiple of 16 bytes (at most 32), one 8- or 4-byte access when they span exactly that,
/// else one access per element.
///
/// # Safety
/// `src..src + N` is readable global memory, aligned to `min(16, N · size_of::<T>())` bytes
/// when that is 4, 8 or a multiple of 16.
#[inline(always)]
pub unsafe fn load<T: Copy, const N: usize>(src: *const T) -> [T; N] {
    let bytes = N * size_of::<T>();
    let base = src.cast::<u8>();
    let mut words = [0u32; 8];
    // SAFETY (all branches): the caller guarantees the span is readable and aligned.
    unsafe {
        if bytes % 16 == 0 && bytes <= 32 {
            for chunk in 0..bytes / 16 {
                let vector = load_words::<4>(base.add(16 * chunk));
                for i in 0..4 {
                    words[4 * chunk + i] = vector[i];
                }
            }
        } else if bytes == 8 {
            let vector = load_words::<2>(base);
            words[0] = vector[0];
            words[1] = vector[1];
        } else if bytes == 4 {
            words[0] = load_words::<1>(base)[0];
        } else {
            let mut values = [load_element(src); N];
            for i in 1..N {
                values[i] = load_element(src.add(i));
            }
            return values;
        }
        core::mem::transmute_copy(&words)
    }
}

/// Writes `N` elements starting at `dst` in global memory, with the accesses [`load`] would
/// use.
///
/// # Safety
/// `dst..dst + N` is writable global memory, aligned as for [`load`]; elements are 2 or 4
/// bytes.
#[inline(always)]
pub unsafe fn store<T: Copy, const N: usize>(dst: *mut T, values: [T; N]) {
    let bytes = N * size_of::<T>();
    let base = dst.cast::<u8>();
    let mut words = [0u32; 8];
    // SAFETY (all branches): `values` fills the first `bytes` bytes of `words` (≤ 32), and the
    // caller guarantees the destination span is writable and aligned.
    unsafe {
        if bytes % 4 == 0 && (bytes <= 8 || (bytes % 16 == 0 && bytes <= 32)) {
            core::ptr::copy_nonoverlapping(&values, words.as_mut_ptr().cast::<[T; N]>(), 1);
        }
        if bytes % 16 == 0 && bytes <= 32 {
            for chunk in 0..bytes / 16 {
                let vector = [
                    words[4 * chunk],
                    words[4 * chunk + 1],
                    words[4 * chunk + 2],
                    words[4 * chunk + 3],
                ];
                store_words::<4>(base.add(16 * chunk), vector);
            }
        } else if bytes == 8 {
            store_words::<2>(base, [words[0], words[1], 0, 0]);
        } else if bytes == 4 {
            store_words::<1>(base, [words[0], 0, 0, 0]);
        } else {
            for i in 0..N {
                store_element(dst.add(i), values[i]);
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
