//! Every PTX special register, barrier and instruction the kernels use, each wrapped once.

use core::arch::{asm, nvptx};

#[inline(always)]
pub fn thread_idx() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() }
}

#[inline(always)]
pub fn block_idx() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_x() }
}

#[inline(always)]
pub fn block_dim() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_x() }
}

#[inline(always)]
pub fn grid_dim() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_x() }
}

/// `bar.sync 0`: every thread of the block must reach it.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: the kernels call this from block-uniform control flow only.
    unsafe { nvptx::_syncthreads() }
}

/// `bar.warp.sync` over the whole warp: every thread of the warp must reach it; it orders the
/// warp's shared memory accesses before it against those after it.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: the kernels call this from warp-uniform control flow only.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) }
}

/// A one-operand `f32` instruction of the special-function unit, as a function.
macro_rules! special_function {
    ($(#[$doc:meta])* $name:ident, $instruction:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(x: f32) -> f32 {
            let y: f32;
            // SAFETY: a pure arithmetic instruction on registers.
            unsafe {
                asm!(concat!($instruction, " {y}, {x};"), y = out(reg32) y, x = in(reg32) x,
                    options(pure, nomem, nostack))
            };
            y
        }
    };
}

special_function!(
    /// `2^x` (`ex2.approx.ftz`, about 2 ulp; `2^-inf = 0`).
    exp2_approx,
    "ex2.approx.ftz.f32"
);
special_function!(
    /// `log2(x)` (`lg2.approx.ftz`; `log2(0) = -inf`).
    log2_approx,
    "lg2.approx.ftz.f32"
);
special_function!(
    /// `1 / x` (`rcp.approx.ftz`, within 1 ulp; `1/0 = inf`): one instruction where IEEE
    /// division takes a dozen with a slow path.
    reciprocal_approx,
    "rcp.approx.ftz.f32"
);

/// `a · b + c`, rounded once (`fma.rn.f32`): the compiler fuses no multiply and add of its
/// own.
#[inline(always)]
pub fn fused_multiply_add(a: f32, b: f32, c: f32) -> f32 {
    let d: f32;
    // SAFETY: a pure arithmetic instruction on registers.
    unsafe {
        asm!("fma.rn.f32 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a,
            b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack))
    };
    d
}

/// Value of `value` held by lane `lane ^ mask`. Every lane of the warp must execute it.
#[inline(always)]
pub fn shfl_xor_f32(value: f32, mask: u32) -> f32 {
    let y: f32;
    // SAFETY: all 32 lanes take part (member mask 0xffffffff) and the kernels call it from
    // warp-uniform control flow.
    unsafe {
        asm!(
            "shfl.sync.bfly.b32 {y}, {v}, {m}, 0x1f, 0xffffffff;",
            y = out(reg32) y,
            v = in(reg32) value,
            m = in(reg32) mask,
        )
    };
    y
}

/// `atom.acq_rel.gpu.add.u32`: adds `value` to the word at `word` and returns what it held,
/// as one GPU-scope atomic that releases this thread's earlier writes (they are visible to
/// whoever acquires this addition) and acquires what others released before theirs.
///
/// # Safety
/// `word` is a valid, 4-byte aligned global word, only accessed atomically or by
/// [`load_acquire_gpu`] while the launch runs.
#[inline(always)]
pub unsafe fn fetch_add_acq_rel_gpu(word: *mut u32, value: u32) -> u32 {
    let before: u32;
    // SAFETY: forwarded from the contract.
    unsafe {
        asm!(
            "atom.acq_rel.gpu.add.u32 {b}, [{w}], {v};",
            b = out(reg32) before,
            w = in(reg64) word as u64,
            v = in(reg32) value,
            options(nostack)
        )
    };
    before
}

/// `ld.acquire.gpu.u32`: reads the word at `word`; this thread's later reads see what the
/// writer released before the value read.
///
/// # Safety
/// As for [`fetch_add_acq_rel_gpu`].
#[inline(always)]
pub unsafe fn load_acquire_gpu(word: *const u32) -> u32 {
    let value: u32;
    // SAFETY: forwarded from the contract.
    unsafe {
        asm!(
            "ld.acquire.gpu.u32 {v}, [{w}];",
            v = out(reg32) value,
            w = in(reg64) word as u64,
            options(nostack)
        )
    };
    value
}

/// `atom.acq_rel.gpu.cas.b32`: replaces the word at `word` with `new` if it holds `expected`,
/// and returns what it held (equal to `expected` exactly when the swap happened); ordered as
/// [`fetch_add_acq_rel_gpu`].
///
/// # Safety
/// As for [`fetch_add_acq_rel_gpu`].
#[inline(always)]
pub unsafe fn compare_exchange_acq_rel_gpu(word: *mut u32, expected: u32, new: u32) -> u32 {
    let found: u32;
    // SAFETY: forwarded from the contract.
    unsafe {
        asm!(
            "atom.acq_rel.gpu.cas.b32 {f}, [{w}], {e}, {n};",
            f = out(reg32) found,
            w = in(reg64) word as u64,
            e = in(reg32) expected,
            n = in(reg32) new,
            options(nostack)
        )
    };
    found
}

/// `red.release.gpu.add.u32`: adds `value` to the word at `word` without waiting for the
/// result, releasing this thread's earlier writes to whoever acquires a later value.
///
/// # Safety
/// As for [`fetch_add_acq_rel_gpu`].
#[inline(always)]
pub unsafe fn reduce_add_release_gpu(word: *mut u32, value: u32) {
    // SAFETY: forwarded from the contract.
    unsafe {
        asm!(
            "red.release.gpu.global.add.u32 [{w}], {v};",
            w = in(reg64) word as u64,
            v = in(reg32) value,
            options(nostack)
        )
    };
}

/// `x`, as a value the compiler cannot relate to `x`: what is computed from it is computed
/// again rather than kept from before. The block kernels take their write addresses from it,
/// so the addresses of their loads (one 64-bit register per pack, when the block size is a
/// launch parameter) are not held across the block reduction.
#[inline(always)]
pub fn recomputed(mut x: u32) -> u32 {
    // SAFETY: a register move. Not `pure`: LLVM would hoist it to where `x` is computed.
    unsafe { asm!("mov.u32 {x}, {x};", x = inout(reg32) x, options(nomem, nostack)) };
    x
}

/// `%globaltimer`: the GPU's nanosecond clock (the same on every multiprocessor).
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let now: u64;
    // SAFETY: reads a special register. Not `pure`: each read is a new time.
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) now, options(nomem, nostack)) };
    now
}

/// Four 4-byte values with the alignment of one 16-byte vector access (`ld.v4`/`st.v4`), in
/// global or shared memory.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct Vector4<T>(pub [T; 4]);

/// The block's dynamic shared memory, as floats, starting 16-byte aligned (it is declared as
/// [`Vector4`]s, so the PTX promises the alignment of the 16-byte accesses made into it). Its
/// size is the launch's `sharedMemBytes`.
#[inline(always)]
pub fn dynamic_shared_f32() -> *mut f32 {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<Vector4<f32>>().cast()
}

/// `2^x` on the device, for [`crate::primitives::online::OnlineStats`].
#[derive(Debug)]
pub enum DeviceExp2 {}

impl crate::primitives::online::Exp2 for DeviceExp2 {
    #[inline(always)]
    fn exp2(x: f32) -> f32 {
        exp2_approx(x)
    }
}

/// `nanosleep`: backs off a spinning thread so it does not flood the memory system.
#[inline(always)]
pub fn sleep_briefly() {
    // SAFETY: a scheduling hint with no memory effects.
    unsafe { asm!("nanosleep.u32 64;") };
}

/// Blocks in this block's thread-block cluster (`%cluster_nctarank`; 1 outside clusters).
#[cfg(not(kernels_sm80))]
#[inline(always)]
pub fn cluster_blocks() -> u32 {
    let blocks: u32;
    // SAFETY: reading a special register has no preconditions.
    unsafe {
        asm!("mov.u32 {b}, %cluster_nctarank;", b = out(reg32) blocks, options(pure, nomem, nostack))
    };
    blocks
}

/// This block's rank in its thread-block cluster (`%cluster_ctarank`; 0 outside clusters).
#[cfg(not(kernels_sm80))]
#[inline(always)]
pub fn cluster_block_rank() -> u32 {
    let rank: u32;
    // SAFETY: reading a special register has no preconditions.
    unsafe {
        asm!("mov.u32 {r}, %cluster_ctarank;", r = out(reg32) rank, options(pure, nomem, nostack))
    };
    rank
}

/// `barrier.cluster.arrive`: this thread has arrived at the cluster's barrier, with release
/// semantics (its earlier writes, shared memory included, are visible to the cluster's
/// threads once they pass [`cluster_wait`]). Every thread of every block of the cluster
/// arrives once per phase, from warp-uniform control flow.
#[cfg(not(kernels_sm80))]
#[inline(always)]
pub fn cluster_arrive() {
    // SAFETY: the callers' contracts make every thread of the cluster arrive once per phase.
    unsafe { asm!("barrier.cluster.arrive.aligned;") };
}

/// `barrier.cluster.wait`: waits until every thread of the cluster has arrived in this
/// phase, with acquire semantics. Warp-uniform, after this thread's [`cluster_arrive`].
#[cfg(not(kernels_sm80))]
#[inline(always)]
pub fn cluster_wait() {
    // SAFETY: as for `cluster_arrive`.
    unsafe { asm!("barrier.cluster.wait.aligned;") };
}

/// The address of the same shared-memory location as `local` in block `rank` of this
/// block's cluster (`mapa` on a generic address), read and written with ordinary accesses.
#[cfg(not(kernels_sm80))]
#[inline(always)]
pub fn cluster_shared_of(local: *const f32, rank: u32) -> *const f32 {
    let remote: u64;
    // SAFETY: address arithmetic only; the result is dereferenced under the callers' rules.
    unsafe {
        asm!(
            "mapa.u64 {d}, {a}, {r};",
            d = out(reg64) remote,
            a = in(reg64) local as u64,
            r = in(reg32) rank,
            options(pure, nomem, nostack)
        )
    };
    remote as *const f32
}

/// Programmatic dependent launch (sm_90, PTX 7.8): waits until the grids this launch depends on
/// have completed and their writes are visible (`griddepcontrol.wait`; it returns at once when
/// the launch did not allow overlap). Every entry calls it first, before any branch or memory
/// access, so the host may launch with overlap allowed: the grid may then start once every block
/// of the previous kernel in the stream has exited, before that kernel's completion is
/// signalled. No entry lets its dependents start earlier (`griddepcontrol.launch_dependents`):
/// that cost up to 20 points on grids of many small blocks (docs/performance-log.md,
/// 2026-11-30). The sm_80 build has no such instruction and the host never allows overlap
/// with it, so there the wait is nothing.
#[inline(always)]
pub fn await_previous_grid() {
    // SAFETY: no operands; it only orders this grid after its predecessor in the stream. Not
    // `nomem`: no memory access may move above the wait.
    #[cfg(not(kernels_sm80))]
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack))
    };
}

/// A warp shuffle of one 32-bit register (`$clamp`: the instruction's clamp operand), as a
/// function `(value, lane operand) -> value`.
macro_rules! warp_shuffle {
    ($(#[$doc:meta])* $name:ident, $instruction:literal, $clamp:literal) => {
        $(#[$doc])*
        /// Every lane of the warp must execute it.
        #[inline(always)]
        pub fn $name(value: u32, lane: u32) -> u32 {
            let result: u32;
            // SAFETY: a warp-wide register exchange; the contract asks every lane to be there.
            unsafe {
                asm!(
                    concat!($instruction, " {r}, {v}, {l}, ", $clamp, ", 0xffffffff;"),
                    r = out(reg32) result,
                    v = in(reg32) value,
                    l = in(reg32) lane,
                    options(nomem, nostack)
                )
            };
            result
        }
    };
}

warp_shuffle!(
    /// `shfl.sync.up`: the value of lane `lane − delta` (a lane below `delta` keeps its own).
    shfl_up_u32,
    "shfl.sync.up.b32",
    "0"
);
warp_shuffle!(
    /// `shfl.sync.idx`: the value of lane `lane` (below 32).
    shfl_idx_u32,
    "shfl.sync.idx.b32",
    "0x1f"
);

/// `redux.sync.max.u32`: the largest `value` of the warp's lanes. Every lane of the warp must
/// execute it (sm_80 and later).
#[inline(always)]
pub fn warp_max_u32(value: u32) -> u32 {
    let result: u32;
    // SAFETY: a warp-wide reduction of registers; the contract asks every lane to be there.
    unsafe {
        asm!(
            "redux.sync.max.u32 {r}, {v}, 0xffffffff;",
            r = out(reg32) result,
            v = in(reg32) value,
            options(nomem, nostack)
        )
    };
    result
}

/// `vote.sync.ballot.b32`: bit `i` set where lane `i`'s `predicate` holds. Every lane of the
/// warp must execute it.
#[inline(always)]
pub fn warp_ballot(predicate: bool) -> u32 {
    let result: u32;
    // SAFETY: a warp-wide vote over registers; the contract asks every lane to be there.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {r}, p, 0xffffffff; }}",
            r = out(reg32) result,
            x = in(reg32) u32::from(predicate),
            options(nomem, nostack)
        )
    };
    result
}

/// The shared-memory window address of `local` (`cvta.to.shared`), as the `.shared` atomics
/// below take it.
#[inline(always)]
pub(crate) fn shared_window<T>(local: *const T) -> u64 {
    let window: u64;
    // SAFETY: address arithmetic only.
    unsafe {
        asm!(
            "cvta.to.shared.u64 {w}, {a};",
            w = out(reg64) window,
            a = in(reg64) local as u64,
            options(pure, nomem, nostack)
        )
    };
    window
}

/// Adds `value` to the shared word at `word` (`atom.shared.add.u32`) and returns what it
/// held.
///
/// # Safety
/// `word` is a 4-byte aligned word of this block's shared memory, accessed only atomically
/// until the next barrier.
#[inline(always)]
pub unsafe fn shared_fetch_add_u32(word: *mut u32, value: u32) -> u32 {
    let before: u32;
    // SAFETY: forwarded from the contract.
    unsafe {
        asm!(
            "atom.shared.add.u32 {b}, [{w}], {v};",
            b = out(reg32) before,
            w = in(reg64) shared_window(word),
            v = in(reg32) value,
            options(nostack)
        )
    };
    before
}

macro_rules! shared_reduction {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $reg:ident, $instruction:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `word` is a 4-byte aligned word of this block's shared memory, accessed only
        /// atomically until the next barrier.
        #[inline(always)]
        pub unsafe fn $name(word: *mut $ty, value: $ty) {
            // SAFETY: forwarded from the contract.
            unsafe {
                asm!(
                    concat!($instruction, " [{w}], {v};"),
                    w = in(reg64) shared_window(word),
                    v = in($reg) value,
                    options(nostack)
                )
            };
        }
    };
}

shared_reduction!(
    /// Adds `value` to the shared float at `word` (`red.shared.add.f32`).
    shared_add_f32,
    f32,
    reg32,
    "red.shared.add.f32"
);
shared_reduction!(
    /// Lowers the shared word at `word` to `value` where that is smaller (`red.shared.min`).
    shared_min_u32,
    u32,
    reg32,
    "red.shared.min.u32"
);
shared_reduction!(
    /// Raises the shared word at `word` to `value` where that is larger (`red.shared.max`).
    shared_max_u32,
    u32,
    reg32,
    "red.shared.max.u32"
);
