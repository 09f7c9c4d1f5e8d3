//! The per-row states an operation launch stores or merges ([`RowState`]s, slot-major): the
//! partial statistics of a row, or of one slice of it, that a later launch merges (see
//! [`crate::launch::ops::mode`]).

use crate::launch::ops::{RowOpParams, RowState};
use crate::primitives::device::{block_dim, thread_idx};
use crate::primitives::reduce::{Partial, block_reduce};

/// Stores `stats` as the row's state in slot `params.state_slot`: slots are consecutive runs
/// of `rows` states (slot-major, as states gathered from several slices or devices lie).
///
/// # Safety
/// `params.states` holds `rows · state_slots` [`RowState`]s and `row < rows`.
#[inline(always)]
pub unsafe fn store_state<S: Partial>(params: &RowOpParams, row: usize, stats: S) {
    // SAFETY: forwarded from the contract.
    unsafe { store_slice_state(params, row, params.state_slot as usize, stats) };
}

/// Stores `stats` as the row's state in slot `slot`.
///
/// # Safety
/// `params.states` holds `rows · (slot + 1)` [`RowState`]s at least, and `row < rows`.
#[inline(always)]
pub unsafe fn store_slice_state<S: Partial>(
    params: &RowOpParams,
    row: usize,
    slot: usize,
    stats: S,
) {
    let [max, sum] = stats.to_floats();
    let slot = slot * params.rows as usize + row;
    // SAFETY: forwarded from the contract.
    unsafe {
        (params.states as *mut RowState)
            .add(slot)
            .write(RowState { max, sum })
    };
}

/// The state of `row` stored in slot `slot`.
///
/// # Safety
/// `params.states` holds `rows · (slot + 1)` [`RowState`]s at least, and `row < rows`.
#[inline(always)]
unsafe fn stored_state<S: Partial>(params: &RowOpParams, row: usize, slot: usize) -> S {
    let slot = slot * params.rows as usize + row;
    // SAFETY: forwarded from the contract.
    let state = unsafe { (params.states as *const RowState).add(slot).read() };
    S::from_floats([state.max, state.sum])
}

/// Merges the `state_slots` stored states of `row`, one after another (a group's lanes each
/// merge all of a caller's few slots).
///
/// # Safety
/// As [`store_state`].
#[inline(always)]
pub unsafe fn merged_states<S: Partial>(params: &RowOpParams, row: usize) -> S {
    let mut merged = S::EMPTY;
    for slot in 0..params.state_slots as usize {
        // SAFETY: forwarded from the contract.
        merged = merged.merge(unsafe { stored_state(params, row, slot) });
    }
    merged
}

/// Merges the `state_slots` stored states of `row` with the whole block: each thread reads
/// every `block_dim`-th slot and a block reduction merges theirs. A split launch leaves one
/// slot per slice (dozens); merged one after another by every thread, their dependent reads
/// took longer than the slice's own work.
///
/// # Safety
/// As [`store_state`]; called by every thread of the block from uniform control flow, with
/// `scratch` as for [`block_reduce`].
#[inline(always)]
pub unsafe fn block_merged_states<S: Partial>(
    params: &RowOpParams,
    row: usize,
    scratch: *mut f32,
) -> S {
    let mut merged = S::EMPTY;
    let slots = params.state_slots as usize;
    for slot in (thread_idx() as usize..slots).step_by(block_dim() as usize) {
        // SAFETY: forwarded from the contract.
        merged = merged.merge(unsafe { stored_state(params, row, slot) });
    }
    // SAFETY: forwarded from the contract.
    unsafe { block_reduce(merged, scratch) }
}
