//! Loads and stores, in two kinds that differ in the code they give:
//!
//! - `*_plain`: plain Rust accesses of `PACK` floats (one 16-byte access when `PACK` is 4).
//!   LLVM sees them, schedules them, and infers their global address space from a kernel's
//!   pointer arguments: the f32 softmax kernels, whose pointers are arguments, use these.
//! - `ld.global`/`st.global` in inline assembly ([`load_global`] and the word, span and element
//!   accesses the element types build on): the operation kernels' pointers arrive inside a
//!   parameter struct, so LLVM cannot tell they are global and would emit generic accesses;
//!   the streaming (`.cs`) loads exist only here.
//!
//! Plain index loops throughout, so that they unroll and stay in registers.
#![allow(clippy::needless_range_loop)]

use core::arch::asm;

use crate::primitives::device::Vector4;

/// Reads `PACK` floats starting at `src`.
///
/// # Safety
/// `src..src + PACK` must be readable; when `PACK == 4`, `src` must be 16-byte aligned.
#[inline(always)]
pub unsafe fn load_pack_plain<const PACK: usize>(src: *const f32) -> [f32; PACK] {
    let mut values = [0.0; PACK];
    if PACK == 4 {
        // SAFETY: the caller guarantees 16 readable, 16-byte aligned bytes.
        let vector = unsafe { src.cast::<Vector4<f32>>().read() };
        for i in 0..PACK {
            values[i] = vector.0[i];
        }
    } else {
        for i in 0..PACK {
            // SAFETY: the caller guarantees `PACK` readable floats.
            values[i] = unsafe { src.add(i).read() };
        }
    }
    values
}

/// Writes `PACK` floats starting at `dst`.
///
/// # Safety
/// `dst..dst + PACK` must be writable; when `PACK == 4`, `dst` must be 16-byte aligned.
#[inline(always)]
pub unsafe fn store_pack_plain<const PACK: usize>(dst: *mut f32, values: [f32; PACK]) {
    if PACK == 4 {
        let mut vector = Vector4([0.0f32; 4]);
        for i in 0..PACK {
            vector.0[i] = values[i];
        }
        // SAFETY: the caller guarantees 16 writable, 16-byte aligned bytes.
        unsafe { dst.cast::<Vector4<f32>>().write(vector) };
    } else {
        for i in 0..PACK {
            // SAFETY: the caller guarantees `PACK` writable floats.
            unsafe { dst.add(i).write(values[i]) };
        }
    }
}

/// Reads `N` elements starting at `src` in global memory: one access of 4, 8, 16 or 32
/// bytes (16-byte pieces) when they span exactly that, else one access per element.
///
/// # Safety
/// `src..src + N` is readable global memory, aligned to `min(16, N · size_of::<T>())` bytes
/// when that is a single access.
#[inline(always)]
pub unsafe fn load_global<T: Copy, const N: usize>(src: *const T) -> [T; N] {
    let bytes = N * size_of::<T>();
    // SAFETY (both branches): forwarded from the contract; `words` holds 32 bytes ≥ `bytes`.
    unsafe {
        if spans(bytes) {
            core::mem::transmute_copy(&load_span::<false>(src.cast(), bytes))
        } else {
            let mut values = [load_element::<T, false>(src); N];
            for i in 1..N {
                values[i] = load_element::<T, false>(src.add(i));
            }
            values
        }
    }
}

/// Whether `bytes` is one access of [`load_span`]: 4, 8, 16 or 32 bytes.
#[inline(always)]
pub const fn spans(bytes: usize) -> bool {
    matches!(bytes, 4 | 8 | 16 | 32)
}

/// `bytes` (4, 8, 16 or 32) bytes at `src` as words, in as few accesses as their size allows.
///
/// # Safety
/// The span is readable global memory aligned to `min(16, bytes)`.
#[inline(always)]
pub unsafe fn load_span<const LAST_USE: bool>(src: *const u8, bytes: usize) -> [u32; 8] {
    let mut words = [0u32; 8];
    // SAFETY: forwarded from the contract.
    unsafe {
        if bytes >= 16 {
            for chunk in 0..bytes / 16 {
                let vector = load_words::<4, LAST_USE>(src.add(16 * chunk));
                for i in 0..4 {
                    words[4 * chunk + i] = vector[i];
                }
            }
        } else if bytes == 8 {
            let vector = load_words::<2, LAST_USE>(src);
            words[0] = vector[0];
            words[1] = vector[1];
        } else {
            words[0] = load_words::<1, LAST_USE>(src)[0];
        }
    }
    words
}

/// Writes the first `bytes` (4, 8, 16 or 32) bytes of `words` at `dst`.
///
/// # Safety
/// The span is writable global memory aligned to `min(16, bytes)`.
#[inline(always)]
pub unsafe fn store_span(dst: *mut u8, bytes: usize, words: [u32; 8]) {
    // SAFETY: forwarded from the contract.
    unsafe {
        if bytes >= 16 {
            for chunk in 0..bytes / 16 {
                let w = 4 * chunk;
                store_words::<4>(
                    dst.add(16 * chunk),
                    [words[w], words[w + 1], words[w + 2], words[w + 3]],
                );
            }
        } else if bytes == 8 {
            store_words::<2>(dst, [words[0], words[1], 0, 0]);
        } else {
            store_words::<1>(dst, [words[0], 0, 0, 0]);
        }
    }
}

/// `ld.global` of `WORDS` (1, 2 or 4) 32-bit words; with `LAST_USE` (data the launch reads
/// for the last time) `ld.global.cs`, cache streaming, which allocates the lines evict-first in
/// L1 and L2 so that they do not push out lines still to be used.
///
/// # Safety
/// `address` is readable global memory for `4 · WORDS` bytes, aligned to that size.
#[inline(always)]
pub unsafe fn load_words<const WORDS: usize, const LAST_USE: bool>(address: *const u8) -> [u32; 4] {
    let (mut a, mut b, mut c, mut d) = (0u32, 0u32, 0u32, 0u32);
    macro_rules! load_with {
        ($cache:literal) => {
            match WORDS {
                4 => asm!(concat!("ld.global", $cache, ".v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];"),
                    a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
                    p = in(reg64) address, options(pure, readonly, nostack, preserves_flags)),
                2 => asm!(concat!("ld.global", $cache, ".v2.b32 {{{a}, {b}}}, [{p}];"),
                    a = out(reg32) a, b = out(reg32) b,
                    p = in(reg64) address, options(pure, readonly, nostack, preserves_flags)),
                _ => asm!(concat!("ld.global", $cache, ".b32 {a}, [{p}];"),
                    a = out(reg32) a,
                    p = in(reg64) address, options(pure, readonly, nostack, preserves_flags)),
            }
        };
    }
    // SAFETY: the caller guarantees the words are readable and aligned to their total size.
    unsafe {
        if LAST_USE {
            load_with!(".cs")
        } else {
            load_with!("")
        }
    }
    [a, b, c, d]
}

/// `st.global` of the first `WORDS` (1, 2 or 4) of `words`.
///
/// # Safety
/// `address` is writable global memory for `4 · WORDS` bytes, aligned to that size.
#[inline(always)]
pub unsafe fn store_words<const WORDS: usize>(address: *mut u8, [a, b, c, d]: [u32; 4]) {
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

/// `ld.global` of one element of 1, 2 or 4 bytes, as the low bits of a word; streaming
/// loads of 2 or 4 bytes with `LAST_USE`.
///
/// # Safety
/// `address` is a readable element of global memory, aligned to its size.
#[inline(always)]
pub unsafe fn load_element<T: Copy, const LAST_USE: bool>(address: *const T) -> T {
    let word: u32;
    // SAFETY: the caller guarantees the element is readable and aligned.
    unsafe {
        match size_of::<T>() {
            4 => word = load_words::<1, LAST_USE>(address.cast())[0],
            2 => {
                let half: u16;
                macro_rules! load_half_with {
                    ($cache:literal) => {
                        asm!(concat!("ld.global", $cache, ".b16 {h}, [{p}];"), h = out(reg16) half,
                            p = in(reg64) address, options(pure, readonly, nostack, preserves_flags))
                    };
                }
                if LAST_USE {
                    load_half_with!(".cs")
                } else {
                    load_half_with!("")
                }
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
///
/// # Safety
/// `address` is a writable element of global memory, aligned to its size.
#[inline(always)]
pub unsafe fn store_element<T: Copy>(address: *mut T, value: T) {
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

/// Starts copying the 16 bytes at `src` in global memory to `dst` in this block's shared
/// memory without passing through registers (`cp.async.cg`, which bypasses L1), its L2 lines
/// kept as `policy` says: the copy lands
/// once a [`wait_async_copies`] that covers its group has returned, in this thread; other
/// threads see it only after a barrier as well. It joins the group the next
/// [`commit_async_copies`] closes.
///
/// # Safety
/// `src` is 16 readable, 16-byte aligned bytes of global memory that nothing writes until the
/// copy has landed; `dst` is 16 bytes of this block's shared memory, 16-byte aligned, that
/// nothing reads or writes until then.
#[inline(always)]
pub unsafe fn copy_async_16(dst: *mut u8, src: *const u8, policy: ReadOncePolicy) {
    let shared = crate::primitives::device::shared_window(dst);
    #[cfg(not(kernels_sm80))]
    // SAFETY: forwarded from the contract.
    unsafe {
        asm!(
            "cp.async.cg.shared.global.L2::cache_hint [{s}], [{g}], 16, {p};",
            s = in(reg64) shared,
            g = in(reg64) src as u64,
            p = in(reg64) policy.0,
            options(nostack, preserves_flags)
        )
    };
    // The sm_80 build's PTX (ISA 7.0) has no cache hints.
    #[cfg(kernels_sm80)]
    // SAFETY: forwarded from the contract.
    unsafe {
        let _ = policy;
        asm!(
            "cp.async.cg.shared.global [{s}], [{g}], 16;",
            s = in(reg64) shared,
            g = in(reg64) src as u64,
            options(nostack, preserves_flags)
        )
    };
}

/// An L2 policy for data read once (`createpolicy … evict_first`): the lines go first when
/// the L2 needs room, as the streaming loads' (`.cs`) do. None in the sm_80 build.
#[derive(Clone, Copy, Debug)]
pub struct ReadOncePolicy(#[cfg_attr(kernels_sm80, allow(dead_code))] u64);

impl ReadOncePolicy {
    #[inline(always)]
    pub fn evict_first() -> Self {
        #[cfg(kernels_sm80)]
        return Self(0);
        #[cfg(not(kernels_sm80))]
        let policy: u64;
        // SAFETY: makes a policy value; no memory is touched.
        #[cfg(not(kernels_sm80))]
        unsafe {
            asm!(
                "createpolicy.fractional.L2::evict_first.b64 {p}, 1.0;",
                p = out(reg64) policy,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
        #[cfg(not(kernels_sm80))]
        Self(policy)
    }
}

/// Closes this thread's group of the [`copy_async_16`] copies started since the last call.
#[inline(always)]
pub fn commit_async_copies() {
    // SAFETY: bookkeeping of this thread's copies; no memory is touched.
    unsafe { asm!("cp.async.commit_group;", options(nostack, preserves_flags)) };
}

/// Waits until at most `PENDING` of this thread's committed groups of copies are still in
/// flight (the older ones have landed). A memory clobber: no shared-memory access is moved
/// above it.
#[inline(always)]
pub fn wait_async_copies<const PENDING: u32>() {
    // SAFETY: waits on this thread's own copies.
    unsafe {
        asm!("cp.async.wait_group {n};", n = const PENDING, options(nostack, preserves_flags))
    };
}
