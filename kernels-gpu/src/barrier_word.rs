//! The arithmetic of the per-row barrier word that the cooperative sliced kernels wait on
//! (the waiting itself is in `row_exchange`), kept here so the host tests can check it.
//!
//! Each block of a row adds [`arrival`] to the row's word with one atomic. The word's low 31
//! bits start at zero, so they stay below the number of participants until the last block
//! arrives; its addition brings the launch's total to exactly [`GENERATION_BIT`]: the top bit
//! flips and the low bits are zero again. So the word needs no reset between launches (the
//! next one may have another number of participants), and the last block to arrive releases
//! the others with its one atomic.

/// The top bit of a row's barrier word: it flips each time all of the row's blocks arrived.
pub const GENERATION_BIT: u32 = 1 << 31;

/// What one block adds to the word: one, except the row's leader (exactly one block of the
/// row), which adds `GENERATION_BIT - (participants - 1)`. `participants` is at least one.
#[inline(always)]
pub fn arrival(participants: u32, leader: bool) -> u32 {
    if leader {
        GENERATION_BIT - (participants - 1)
    } else {
        1
    }
}

/// Whether the row's blocks have all arrived, from the word as this block found it before its
/// own arrival (`before`) and as it reads now.
#[inline(always)]
pub fn has_flipped(before: u32, now: u32) -> bool {
    (now ^ before) & GENERATION_BIT != 0
}
