//! How every kernel entry is made: one macro, so each family's entries differ only in name,
//! parameters and the kernel they call.

/// One `ptx-kernel` entry, exported as `$name` (a string expression, e.g. a `concat!`), with
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

pub(crate) use kernel_entry;
