//! Loads and stores of `PACK` consecutive floats: one 16-byte access when `PACK` is 4, single
//! 4-byte accesses otherwise. Plain index loops, so that they unroll and stay in registers.
#![allow(clippy::needless_range_loop)]

use crate::primitives::device::Vector4;

/// Reads `PACK` floats starting at `src`.
///
/// # Safety
/// `src..src + PACK` must be readable; when `PACK == 4`, `src` must be 16-byte aligned.
#[inline(always)]
pub unsafe fn load_pack<const PACK: usize>(src: *const f32) -> [f32; PACK] {
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
pub unsafe fn store_pack<const PACK: usize>(dst: *mut f32, values: [f32; PACK]) {
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
