//! Where one group's or block's share of a row lies for the operation kernels, when rows need
//! not start on a 16-byte boundary: the row's first `head` elements (before its first aligned
//! address), then an aligned body of packs, then a tail shorter than a pack. A part holds body
//! packs `first..end`; the part that holds the row's ends (the first) also takes the head and
//! the tail, each as one more slot read one element at a time. Pure index arithmetic, shared
//! with the host so the CPU tests can check that the parts cover every column once.

use crate::launch::ops::END_SLOTS;

/// A group's or block's share of its row: slice `slice`, of `slice_packs` packs, of a row of
/// `cols` columns (a group's share is its whole row).
#[derive(Clone, Copy, Debug)]
pub struct Share {
    pub cols: usize,
    pub slice: usize,
    pub slice_packs: usize,
}

impl Share {
    /// The share's packs in a row that starts on a pack and whose `cols` is a multiple of
    /// `PACK` (or `PACK == 1`): `count` packs from pack `first`, so slot `j < count` of the
    /// share is pack `first + j`.
    #[inline(always)]
    pub fn aligned_packs<const PACK: usize>(&self) -> (usize, usize) {
        let first = self.slice * self.slice_packs;
        let end = (first + self.slice_packs).min(self.cols / PACK);
        (first, end.saturating_sub(first))
    }

    /// The share as a [`RowPart`] of a row whose first `head` elements precede its first
    /// aligned pack.
    #[inline(always)]
    pub fn peeled<const PACK: usize>(&self, head: usize) -> RowPart {
        RowPart::new::<PACK>(self.cols, head, self.slice, self.slice_packs)
    }
}

/// What slot `j` of a part holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// A whole aligned pack starting at this column.
    Pack(usize),
    /// `count` (< the pack) consecutive elements from column `start`, one at a time.
    Run { start: usize, count: usize },
    /// Nothing: padding.
    Nothing,
}

/// One part (a group's row, or a block's slice of a row).
#[derive(Clone, Copy, Debug)]
pub struct RowPart {
    head: usize,
    first: usize,
    end: usize,
    tail_start: usize,
    cols: usize,
    holds_ends: bool,
}

impl RowPart {
    /// Part `slice` of `slices`, each `slice_packs` body packs, of a row of `cols` elements
    /// whose first `head` elements precede its first aligned pack (0 for single-element
    /// packs and for aligned rows).
    #[inline(always)]
    pub fn new<const PACK: usize>(
        cols: usize,
        head: usize,
        slice: usize,
        slice_packs: usize,
    ) -> Self {
        let head = head.min(cols);
        let body = (cols - head) / PACK;
        let first = (slice * slice_packs).min(body);
        let tail_start = head + body * PACK;
        RowPart {
            head,
            first,
            end: (first + slice_packs).min(body),
            tail_start,
            cols,
            // Only a row with ends takes the two extra slots: an aligned row's parts (and
            // single-element packs, which never have ends) use exactly their body's slots,
            // which is all the planner gives them.
            holds_ends: slice == 0 && PACK > 1 && (head > 0 || tail_start < cols),
        }
    }

    /// Slot `j` of this part (slots are numbered from 0 within the part), for a group that
    /// holds the ends in its body's slots: in the part that holds the row's ends, slot 0 is the
    /// head and slot 1 the tail, so that they fall in the first pack of the first threads,
    /// where the kernels place the one-element code.
    #[inline(always)]
    pub fn piece<const PACK: usize>(&self, j: usize) -> Piece {
        if self.holds_ends && j < END_SLOTS as usize {
            self.end_piece(j)
        } else {
            self.body_piece::<PACK>(j)
        }
    }

    /// Slot `j` of [`RowPart::piece`] when it cannot be one of the row's ends: a body pack or
    /// nothing.
    #[inline(always)]
    pub fn body_piece<const PACK: usize>(&self, j: usize) -> Piece {
        let ends = if self.holds_ends {
            END_SLOTS as usize
        } else {
            0
        };
        if j >= ends {
            self.body_pack::<PACK>(j - ends)
        } else {
            Piece::Nothing
        }
    }

    /// The part's body pack `j` (numbered from its first), or nothing past its last: the
    /// slots of a block, which holds the row's ends apart ([`RowPart::end_piece`]).
    #[inline(always)]
    pub fn body_pack<const PACK: usize>(&self, j: usize) -> Piece {
        if j < self.end - self.first {
            Piece::Pack(self.head + (self.first + j) * PACK)
        } else {
            Piece::Nothing
        }
    }

    /// The part's body: its first pack's column and its number of packs.
    #[inline(always)]
    pub fn body<const PACK: usize>(&self) -> (usize, usize) {
        (self.head + self.first * PACK, self.end - self.first)
    }

    /// The row's head (`k == 0`) or tail (any other `k`) when this part holds the row's ends
    /// and that end is not empty; nothing otherwise.
    #[inline(always)]
    pub fn end_piece(&self, k: usize) -> Piece {
        let (start, count) = if k == 0 {
            (0, self.head)
        } else {
            (self.tail_start, self.cols - self.tail_start)
        };
        if self.holds_ends && count > 0 {
            Piece::Run { start, count }
        } else {
            Piece::Nothing
        }
    }
}

/// Elements before the first 16-byte boundary at or after `address`, for elements of `bytes`
/// bytes read in packs of `pack` (0 when `pack == 1`: single elements need no alignment).
#[inline(always)]
pub const fn unaligned_head(address: usize, bytes: usize, pack: usize) -> usize {
    if pack == 1 {
        0
    } else {
        (16 - address % 16) % 16 / bytes
    }
}
