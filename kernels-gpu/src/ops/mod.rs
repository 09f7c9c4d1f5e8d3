//! The operation kernels (softmax and log-softmax forward with scale and masks, their backward
//! passes, per-row log-sum-exp and partial statistics), for f32, bf16 and f16 input: one PTX
//! module per input type (`ops-<type>`). What a kernel does to a row is a [`RowKernel`]
//! (`row_kernel`, and per direction `forward` and `backward`); how threads share rows is a
//! family (`rows`: a group per row; `block`: a block per row or slice), each generating its
//! entries; `slots` places a thread's packs, `states` stores and merges per-row states.
//!
//! [`RowKernel`]: row_kernel::RowKernel

mod backward;
mod block;
mod forward;
mod row_kernel;
mod rows;
mod slots;
mod states;

/// One entry per (direction, packs per thread) of a family's template (`op_rows` or
/// `op_block`) for one input type and layout:
/// `op_<family>_<direction>_<input>_p<pack><layout>_n<packs>`, as
/// [`crate::launch::ops::OpInstance`] spells it, holding `packs + extra` slots per thread
/// (`extra`: the [`slots::PeeledApart`] ends' slot). The group or block widths listed with
/// each packs count are launch parameters of its one entry.
macro_rules! op_entries {
    (
        $input:tt, $template:ident, $family:literal, $layout:tt, $pack:literal,
        $suffix:literal, [$($direction:tt),+], $instances:tt
    ) => {$(
        op_entries!(
            @direction $input, $template, $family, $layout, $pack, $suffix, $direction,
            $instances
        );
    )+};
    (
        @direction ($feature:literal, $input:ty, $name:literal), $template:ident,
        $family:literal, ($layout:ident, $extra:literal), $pack:literal,
        $suffix:literal, ($direction:literal, $kernel:ident),
        [$($packs:literal: $widths:tt),+]
    ) => {$(
        $crate::primitives::entry::kernel_entry!(
            #[cfg(feature = $feature)]
            export concat!(
                "op_", $family, "_", $direction, "_", $name, "_p", $pack, $suffix, "_n", $packs
            ),
            (params: RowOpParams)
                => $template::<$kernel<$input>, $layout, $pack, { $packs + $extra }>(&params)
        );
    )+};
}

use op_entries;
