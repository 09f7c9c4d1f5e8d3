//! Where a view's elements are, and (feature `cudarc`) cudarc's buffers with their element
//! types erased, which the views hold until a call resolves them on its stream.

use std::marker::PhantomData;

#[cfg(feature = "cudarc")]
pub use self::cudarc_buffers::*;

/// Where a view's elements are: device memory at a known address (a cust slice, or an
/// address the caller vouches for), or a cudarc buffer, whose address is taken on the call's
/// stream (with the waits and records cudarc's bookkeeping asks for).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Place<'a> {
    Address(u64, PhantomData<&'a ()>),
    #[cfg(feature = "cudarc")]
    Cudarc(Read<'a>),
}

/// The writable counterpart of [`Place`].
#[derive(Debug)]
pub(crate) enum PlaceMut<'a> {
    Address(u64, PhantomData<&'a mut ()>),
    #[cfg(feature = "cudarc")]
    Cudarc(Write<'a>),
}

#[cfg(feature = "cudarc")]
mod cudarc_buffers {
    use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr};
    use kernels_gpu::launch::ops::DType;

    mod sealed {
        pub trait Sealed {}
        impl Sealed for f32 {}
        impl Sealed for half2::bf16 {}
        impl Sealed for half2::f16 {}
        impl Sealed for u8 {}
        impl Sealed for i32 {}
        impl Sealed for i64 {}
        impl Sealed for u32 {}
        impl Sealed for u64 {}
    }

    /// A cudarc buffer a call reads, its element type erased.
    #[derive(Clone, Copy)]
    pub enum Read<'a> {
        F32(&'a dyn DevicePtr<f32>),
        Bf16(&'a dyn DevicePtr<half2::bf16>),
        F16(&'a dyn DevicePtr<half2::f16>),
        U8(&'a dyn DevicePtr<u8>),
        I32(&'a dyn DevicePtr<i32>),
        I64(&'a dyn DevicePtr<i64>),
        U32(&'a dyn DevicePtr<u32>),
        U64(&'a dyn DevicePtr<u64>),
    }

    /// A cudarc buffer a call writes, its element type erased.
    pub enum Write<'a> {
        F32(&'a mut dyn DevicePtrMut<f32>),
        Bf16(&'a mut dyn DevicePtrMut<half2::bf16>),
        F16(&'a mut dyn DevicePtrMut<half2::f16>),
        U8(&'a mut dyn DevicePtrMut<u8>),
        I32(&'a mut dyn DevicePtrMut<i32>),
        I64(&'a mut dyn DevicePtrMut<i64>),
        U32(&'a mut dyn DevicePtrMut<u32>),
        U64(&'a mut dyn DevicePtrMut<u64>),
    }

    impl std::fmt::Debug for Read<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("cudarc buffer")
        }
    }

    impl std::fmt::Debug for Write<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("cudarc buffer")
        }
    }

    /// A type of cudarc buffers the views take: `f32`, half 2's `bf16` and `f16` (the types
    /// cudarc's `f16` feature implements), `u8` for masks, `i32` and `i64` for targets, `u32`
    /// for sampled tokens and `u64` for the random state.
    pub trait CudarcType: DeviceRepr + sealed::Sealed + 'static {
        #[doc(hidden)]
        fn read(data: &dyn DevicePtr<Self>) -> Read<'_>;
        #[doc(hidden)]
        fn write(data: &mut dyn DevicePtrMut<Self>) -> Write<'_>;
    }

    /// An element type of cudarc buffers that rows hold: `f32`, `bf16` and `f16`.
    pub trait CudarcElement: CudarcType {
        const DTYPE: DType;
    }

    macro_rules! cudarc_buffer_types {
        ($($ty:ty => $variant:ident;)+) => {$(
            impl CudarcType for $ty {
                fn read(data: &dyn DevicePtr<Self>) -> Read<'_> {
                    Read::$variant(data)
                }
                fn write(data: &mut dyn DevicePtrMut<Self>) -> Write<'_> {
                    Write::$variant(data)
                }
            }
        )+};
    }

    cudarc_buffer_types! {
        f32 => F32;
        half2::bf16 => Bf16;
        half2::f16 => F16;
        u8 => U8;
        i32 => I32;
        i64 => I64;
        u32 => U32;
        u64 => U64;
    }

    impl CudarcElement for f32 {
        const DTYPE: DType = DType::F32;
    }

    impl CudarcElement for half2::bf16 {
        const DTYPE: DType = DType::Bf16;
    }

    impl CudarcElement for half2::f16 {
        const DTYPE: DType = DType::F16;
    }
}
