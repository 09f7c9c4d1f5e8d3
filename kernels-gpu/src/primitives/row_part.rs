//! Where a share of a row lies when the row is read in 16-byte packs but need not start on a
//! 16-byte boundary: the row's first `head` elements (before its first aligned address), then
//! an aligned body of packs, then a tail shorter than a pack. The shares of a row split its
//! body: share `slice` holds body packs `first..end`. The two unaligned ends are read one
//! element at a time, except that the operation kernels take an end exactly half a pack long
//! in one 8-byte load and one store of half the outputs. Their callers peel only rows at least
//! a pack long, whose head is never cut short of its 16-byte boundary: such an end then lies at
//! an address aligned to its size (the head ends on a boundary, the tail starts on one). The
//! ends are placed in one of two ways, which the kernels' register use depends on:
//!
//! - [`RowPart`] (operation kernels): the first part holds both ends, each as a run of
//!   elements in one slot of its own, as these kernels keep every slot in registers;
//! - [`EdgePerThreadSlice`] (f32 softmax and row slices): the first slice's threads `0..head`
//!   hold one head element each and the last slice's threads `PACK..` one tail element each,
//!   beside their packs, as a single scalar per thread.
//!
//! Each computes the body in its own order of operations, which the generated code follows.
//! Pure index arithmetic, shared with the host so the CPU tests can check that the parts
//! cover every column once.

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
    /// `count` (< the pack) consecutive elements from column `start`: one element at a time,
    /// or one access for half a pack.
    Run { start: usize, count: usize },
    /// Nothing: padding.
    Nothing,
}

/// One part (a group's row, or a block's slice of a row) whose row ends are runs held in a
/// slot each: the operation kernels' placement (see the module's introduction).
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

/// One block's slice of a row whose unaligned ends go one element per thread (the head in
/// the first slice, the tail in the last): the f32 softmax kernels' and row slices'
/// placement (see the module's introduction), which reads a thread's edge element as one
/// scalar beside its packs.
#[derive(Clone, Copy, Debug)]
pub struct EdgePerThreadSlice {
    /// Elements before the row's first 16-byte aligned address (0 when `PACK == 1`).
    pub row_head: usize,
    /// Packs of the aligned body this block handles: `first..end`.
    pub first: usize,
    pub end: usize,
    /// Leading elements this block holds (the row's head, in the first slice only): threads
    /// `0..head` hold one each.
    head: usize,
    /// Trailing elements this block holds (the row's tail, in the last slice only) and where
    /// they start: threads `PACK..PACK + tail` hold one each.
    tail: usize,
    tail_start: usize,
}

impl EdgePerThreadSlice {
    /// The share of slice `slice` of `slices` of the row at `row`, `cols` elements of `T`
    /// (4 or 2 bytes, `PACK · size_of::<T>()` = 16 or `PACK` = 1).
    #[inline(always)]
    pub fn new<const PACK: usize, T>(
        row: *const T,
        cols: usize,
        slice: usize,
        slices: usize,
        slice_packs: usize,
    ) -> Self {
        const { assert!(PACK == 1 || PACK * size_of::<T>() == 16) };
        let row_head = if PACK == 1 {
            0
        } else {
            ((16 - row as usize % 16) % 16 / size_of::<T>()).min(cols)
        };
        let body_packs = (cols - row_head) / PACK;
        let first = (slice * slice_packs).min(body_packs);
        let end = (first + slice_packs).min(body_packs);
        let tail_start = row_head + body_packs * PACK;
        Self {
            row_head,
            first,
            end,
            head: if slice == 0 { row_head } else { 0 },
            tail: if slice + 1 == slices {
                cols - tail_start
            } else {
                0
            },
            tail_start,
        }
    }

    /// The element outside the aligned body that thread `tid` holds, if any (`PACK` as in
    /// [`EdgePerThreadSlice::new`]).
    #[inline(always)]
    pub fn edge_column<const PACK: usize>(&self, tid: usize) -> Option<usize> {
        if tid < self.head {
            Some(tid)
        } else if (PACK..PACK + self.tail).contains(&tid) {
            Some(self.tail_start + tid - PACK)
        } else {
            None
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
