//! How a row, or one block's slice of it, is laid out for 16-byte access: up to three
//! leading floats before the row's first 16-byte aligned address, an aligned body of packs,
//! and up to three trailing floats. The slices of a row split its body; the first slice also
//! holds the leading floats and the last the trailing ones, one float each for a few threads.
//! So any width and any 4-byte aligned row (input and output misaligned alike) is read and
//! written 16 bytes at a time.

/// Threads that hold the trailing floats of a row: `TAIL_THREAD..TAIL_THREAD + 3`.
const TAIL_THREAD: usize = 4;

/// Where one block's share of a row lies.
pub struct RowSlice {
    /// Floats before the row's first 16-byte aligned address (0 when `PACK == 1`).
    pub row_head: usize,
    /// Packs of the aligned body this block handles: `first..end`.
    pub first: usize,
    pub end: usize,
    /// Leading floats this block holds (the row's head, in the first slice only).
    head: usize,
    /// Trailing floats this block holds (the row's tail, in the last slice only) and where
    /// they start.
    tail: usize,
    tail_start: usize,
}

impl RowSlice {
    #[inline(always)]
    pub fn new<const PACK: usize>(
        row: *const f32,
        cols: usize,
        slice: usize,
        slices: usize,
        slice_packs: usize,
    ) -> Self {
        let row_head = if PACK == 1 {
            0
        } else {
            ((16 - row as usize % 16) % 16 / 4).min(cols)
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

    /// The float outside the aligned body that this thread holds, if any.
    #[inline(always)]
    pub fn edge_column(&self, tid: usize) -> Option<usize> {
        if tid < self.head {
            Some(tid)
        } else if (TAIL_THREAD..TAIL_THREAD + self.tail).contains(&tid) {
            Some(self.tail_start + tid - TAIL_THREAD)
        } else {
            None
        }
    }
}
