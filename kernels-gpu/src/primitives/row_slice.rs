//! How a row, or one block's slice of it, is laid out for 16-byte access: up to `PACK - 1`
//! leading elements before the row's first 16-byte aligned address, an aligned body of packs
//! of `PACK` elements (16 bytes), and up to `PACK - 1` trailing elements. The slices of a row
//! split its body; the first slice also holds the leading elements and the last the trailing
//! ones, one element each for a few threads. So any width and any element-aligned row (input
//! and output misaligned alike) is read and written 16 bytes at a time.

/// Where one block's share of a row lies.
pub struct RowSlice {
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

impl RowSlice {
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
    /// [`RowSlice::new`]).
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
