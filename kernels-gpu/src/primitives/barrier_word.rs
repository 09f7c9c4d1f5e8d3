//! The arithmetic of the per-row barrier words that the sliced kernels wait on (the waiting
//! itself is in `row_exchange`), kept here so the host tests can check it. Two protocols share
//! the words; between launches a word's low 31 bits are zero under both, whatever its top
//! bit, so a word may serve either in its next launch.
//!
//! **Cooperative launches** (every block resident): each block of a row adds [`arrival`] to
//! the row's word with one atomic. The word's low 31 bits start at zero, so they stay below
//! the number of participants until the last block arrives; its addition brings the launch's
//! total to exactly [`GENERATION_BIT`]: the top bit flips and the low bits are zero again. So
//! the word needs no reset between launches (the next one may have another number of
//! participants), and the last block to arrive releases the others with its one atomic.
//!
//! **Launches whose blocks may leave** (not necessarily resident together): the low 12 bits
//! count the blocks that arrived, the next 12 the blocks that arrived and then left without
//! writing. Each block adds [`ARRIVAL`]; the one whose addition completes the count is the
//! row's last. A waiter is released when it sees the full count, or the top bit flipped by
//! the last block's reset ([`reset_after_last`], which also zeroes both counts). A waiter
//! that leaves swaps the word it saw for that word plus [`LEAVER`], which fails once the
//! count is full, so the last block's own addition tells it exactly how many left.

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

/// Bits of each count of the protocol with leavers.
const COUNT_BITS: u32 = 12;
const COUNT_MASK: u32 = (1 << COUNT_BITS) - 1;
/// What a block adds when it arrives (protocol with leavers).
pub const ARRIVAL: u32 = 1;
/// What a block adds when it leaves after arriving.
pub const LEAVER: u32 = 1 << COUNT_BITS;
/// The most blocks one row's barrier can count with leavers.
pub const MAX_PARTICIPANTS: u32 = COUNT_MASK;

/// Blocks that arrived in this launch.
#[inline(always)]
pub fn arrivals(word: u32) -> u32 {
    word & COUNT_MASK
}

/// Blocks that left after arriving.
#[inline(always)]
pub fn leavers(word: u32) -> u32 {
    (word >> COUNT_BITS) & COUNT_MASK
}

/// Whether the block whose arrival found `before` completed the row's count of
/// `participants` (1 to [`MAX_PARTICIPANTS`]).
#[inline(always)]
pub fn is_last_arrival(before: u32, participants: u32) -> bool {
    arrivals(before) + 1 == participants
}

/// Whether every block of the row has arrived, for a block whose arrival found `before` and
/// that reads `now`: the count is full, or the last block already reset the word.
#[inline(always)]
pub fn has_released(before: u32, now: u32, participants: u32) -> bool {
    arrivals(now) == participants || has_flipped(before, now)
}

/// What the row's last block adds after its arrival (which found `before`) to make the word
/// ready for the next launch: both counts back to zero, the top bit flipped.
#[inline(always)]
pub fn reset_after_last(before: u32, participants: u32) -> u32 {
    GENERATION_BIT
        .wrapping_sub(participants * ARRIVAL)
        .wrapping_sub(leavers(before) * LEAVER)
}
