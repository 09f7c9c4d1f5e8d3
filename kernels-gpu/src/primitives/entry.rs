//! How every kernel entry is made: one macro, so each family's entries differ only in name,
//! parameters and the kernel they call; and its form for the kernels that take a
//! `SoftmaxParams`, whose fields are the entry's parameters.

/// One `ptx-kernel` entry, exported as `$name` (a string literal from
/// [`entry_name!`](crate::launch::entry_name), the one place entry names are spelled), with
/// parameters `$param: $type` and body `$call`, an `unsafe` call of the kernel. The entry first
/// waits for the previous grid in its stream ([`await_previous_grid`]), before any branch or
/// memory access, as the host's overlapped launches require. Attributes (`cfg`) apply to the
/// entry. Families whose instances come from a list in [`crate::launch`] expand it once per
/// instance from there.
///
/// [`await_previous_grid`]: crate::primitives::device::await_previous_grid
macro_rules! kernel_entry {
    (
        $(#[$attribute:meta])*
        export $name:expr, ($($param:ident: $type:ty),* $(,)?) => $call:expr $(,)?
    ) => {
        $(#[$attribute])*
        const _: () = {
            /// # Safety
            #[doc = concat!(
                "The contract of the kernel this entry calls: `", stringify!($call), "`."
            )]
            #[unsafe(export_name = $name)]
            #[allow(clippy::too_many_arguments)]
            unsafe extern "ptx-kernel" fn entry($($param: $type),*) {
                $crate::primitives::device::await_previous_grid();
                // SAFETY: forwarded from this entry's contract.
                unsafe { $call }
            }
        };
    };
}

/// A [`kernel_entry!`] whose kernel takes a [`SoftmaxParams`]: the entry's parameters are the
/// struct's fields (from `launch::softmax::with_softmax_param_fields!`, the list the struct is
/// made from), so the compiler knows its buffer addresses are global memory; the entry
/// rebuilds the struct and binds it to `$params` for `$call`. Invoked as
/// `with_softmax_param_fields!(softmax_entry, [attributes], (name), (|params| call))`.
///
/// [`SoftmaxParams`]: crate::launch::softmax::SoftmaxParams
#[cfg(not(kernels_module = "ops-f32"))]
macro_rules! softmax_entry {
    (
        [$(#[$attribute:meta])*], ($name:expr), (|$params:ident| $call:expr),
        $($(#[$doc:meta])* $field:ident: $type:ty,)+
    ) => {
        $crate::primitives::entry::kernel_entry!(
            $(#[$attribute])*
            export $name, ($($field: $type),+) => {
                let $params = $crate::launch::softmax::SoftmaxParams { $($field),+ };
                $call
            }
        );
    };
}

pub(crate) use kernel_entry;
#[cfg(not(kernels_module = "ops-f32"))]
pub(crate) use softmax_entry;
