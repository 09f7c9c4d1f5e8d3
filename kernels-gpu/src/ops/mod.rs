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
mod cross_entropy;
mod cross_entropy_block;
mod cross_entropy_slices;
mod forward;
mod row_kernel;
mod rows;
mod sampling;
mod sampling_top_k;
mod slots;
mod states;

/// The entries of a family's template (`op_rows` or `op_block`) for one input type, layout and
/// set of directions, from an instance list of `packs: [widths]`:
/// - blocks: one entry per (direction, packs),
///   `op_block_<direction>_<input>_p<pack><layout>_n<packs>`; the block size is the launch's;
/// - groups (`@lanes`): one entry per (direction, lanes, packs),
///   `op_rows_<direction>_<input>_p<pack><layout>_l<lanes>_n<packs>`: the group width is a
///   compile-time constant, which the narrow rows' reductions and indexing need to keep up
///   with the copy (performance log: "Fewer, leaner kernel entries", change 2).
///
/// Names made by [`entry_name!`](crate::launch::entry_name) with the template's name for the
/// family, as [`crate::launch::ops::OpInstance`] writes them; each thread holds `packs + extra`
/// slots (`extra`: the [`slots::PeeledApart`] ends' slot).
macro_rules! op_entries {
    (
        @lanes $input:tt, $template:ident, $layout:tt, $pack:literal,
        $suffix:literal, [$($direction:tt),+], $instances:tt
    ) => {$(
        op_entries!(
            @direction lanes $input, $template, $layout, $pack, $suffix, $direction,
            $instances
        );
    )+};
    (
        $input:tt, $template:ident, $layout:tt, $pack:literal,
        $suffix:literal, [$($direction:tt),+], $instances:tt
    ) => {$(
        op_entries!(
            @direction $input, $template, $layout, $pack, $suffix, $direction,
            $instances
        );
    )+};
    (
        @direction ($module:literal, $input:ty, $name:literal), $template:ident,
        ($layout:ident, $extra:literal), $pack:literal,
        $suffix:literal, ($direction:literal, $kernel:ident),
        [$($packs:literal: $widths:tt),+]
    ) => {$(
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(
                $template $direction $name $pack $suffix $packs
            ),
            (params: RowOpParams)
                => $template::<$kernel<$input>, $layout, $pack, { $packs + $extra }>(&params)
        );
    )+};
    (
        @direction lanes ($module:literal, $input:ty, $name:literal), $template:ident,
        ($layout:ident, $extra:literal), $pack:literal,
        $suffix:literal, $direction:tt, [$($packs:literal: [$($lanes:literal),+]),+]
    ) => {$($(
        op_entries!(
            @group ($module, $input, $name), $template, ($layout, $extra), $pack,
            $suffix, $direction, $lanes, $packs
        );
    )+)+};
    (
        @group ($module:literal, $input:ty, $name:literal), $template:ident,
        ($layout:ident, $extra:literal), $pack:literal,
        $suffix:literal, ($direction:literal, $kernel:ident), $lanes:literal, $packs:literal
    ) => {
        $crate::primitives::entry::kernel_entry!(
            #[cfg(kernels_module = $module)]
            export $crate::launch::entry_name!(
                $template $direction $name $pack $suffix $lanes $packs
            ),
            (params: RowOpParams)
                => $template::<$kernel<$input>, $layout, $pack, $lanes, { $packs + $extra }>(
                    &params,
                )
        );
    };
}

use op_entries;

/// Calls `$callback!` once with every input type of the operation modules, as
/// `module: element, name, pack;` lines (`pack`: elements of a 16-byte pack); the list is
/// written once here for the families that make one entry set per type.
macro_rules! with_operation_types {
    ($callback:ident) => {
        $callback! {
            "ops-f32": f32, "f32", 4;
            "ops-bf16": crate::primitives::element::Bf16, "bf16", 8;
            "ops-f16": crate::primitives::element::F16, "f16", 8;
        }
    };
}

use with_operation_types;
