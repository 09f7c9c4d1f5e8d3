//! The backward row kernel: the gradients of softmax and log-softmax, for rows aligned or
//! not.

use core::marker::PhantomData;

use crate::launch::ops::{RowOpParams, op};
use crate::primitives::device::exp2_approx;
use crate::primitives::element::Element;
use crate::primitives::online::LOG2_E;
use crate::primitives::reduce::Sum;
use crate::primitives::row_part::unaligned_head;

use super::row_kernel::{
    PeelableRow, RowKernel, output_dtype, row_scale, row_start, store_outputs,
};

/// Gradients: softmax `dx = y ⊙ (dy − Σ dy⊙y)`, log-softmax `dx = dy − e^y ⊙ Σ dy`, each
/// times `scale · row_scale` (the gradient with respect to the unscaled scores).
pub struct Backward<In> {
    y: *const In,
    dy: *const In,
    dx: u64,
    output_dtype: u32,
    log: bool,
    scale: f32,
    _input: PhantomData<In>,
}

impl<In: Element, const PACK: usize> RowKernel<PACK> for Backward<In> {
    type Params = RowOpParams;
    /// `y` and `dy` as loaded (see [`Element::load_packed`]), widened when used.
    type Values = ([u32; PACK], [u32; PACK]);
    type Stats = Sum;
    type Finished = f32;
    const PAD: Self::Values = ([0; PACK], [0; PACK]);

    #[inline(always)]
    unsafe fn for_row(p: &RowOpParams, row: usize) -> Self {
        // SAFETY: forwarded.
        let scale = unsafe { row_scale(p, row) };
        Backward {
            y: row_start(p.input, row, p.input_stride, In::DTYPE) as *const In,
            dy: row_start(p.grad, row, p.grad_stride, In::DTYPE) as *const In,
            dx: row_start(p.output, row, p.output_stride, output_dtype(p)),
            output_dtype: p.output_dtype,
            log: p.op == op::LOG_SOFTMAX,
            scale,
            _input: PhantomData,
        }
    }

    #[inline(always)]
    unsafe fn load(&self, col: usize) -> Self::Values {
        // SAFETY: the caller guarantees the pack lies in both rows, aligned.
        unsafe {
            (
                In::load_packed::<PACK>(self.y.add(col)),
                In::load_packed::<PACK>(self.dy.add(col)),
            )
        }
    }

    #[inline(always)]
    fn partial<const PACKS: usize>(&self, packs: &mut [Self::Values; PACKS]) -> Sum {
        // Log-softmax needs Σ dy; softmax Σ dy·y. The branch is uniform, taken once.
        let mut sum = 0.0;
        if self.log {
            for (_, dy) in packs.iter() {
                for k in 0..PACK {
                    sum += In::widen(dy, k);
                }
            }
        } else {
            for (y, dy) in packs.iter() {
                for k in 0..PACK {
                    sum += In::widen(dy, k) * In::widen(y, k);
                }
            }
        }
        Sum(sum)
    }

    #[inline(always)]
    fn finish<const PACKS: usize>(&self, row: Sum, _mine: Sum) -> f32 {
        row.0
    }

    #[inline(always)]
    unsafe fn write(&self, col: usize, run: Option<usize>, (y, dy): Self::Values, sum: f32) {
        let (y, dy) = (|k| In::widen(&y, k), |k| In::widen(&dy, k));
        // Uniform branch, once per pack (see `forward::ForwardRow::store`).
        let mut dx = [0.0; PACK];
        if self.log {
            for (k, dx) in dx.iter_mut().enumerate() {
                *dx = self.scale * (dy(k) - exp2_approx(y(k) * LOG2_E) * sum);
            }
        } else {
            for (k, dx) in dx.iter_mut().enumerate() {
                *dx = self.scale * (y(k) * (dy(k) - sum));
            }
        }
        // SAFETY: the caller guarantees the pack lies in the row, aligned.
        unsafe { store_outputs::<PACK>(self.output_dtype, self.dx, col, run, dx) };
    }

    #[inline(always)]
    unsafe fn write_row(&self, _row: Sum) {}
}

impl<In: Element, const PACK: usize> PeelableRow<PACK> for Backward<In> {
    #[inline(always)]
    fn head(&self) -> usize {
        unaligned_head(self.y as usize, size_of::<In>(), PACK)
    }

    #[inline(always)]
    unsafe fn load_run(&self, start: usize, count: usize) -> Self::Values {
        // SAFETY: the caller guarantees the run lies in both rows, aligned alike.
        let [y, dy] = unsafe {
            In::load_packed_runs::<PACK, 2>([self.y.add(start), self.dy.add(start)], count, [0, 0])
        };
        (y, dy)
    }
}
