//! cudarc's buffers and streams as views and call streams (feature `cudarc`): the path of a
//! program whose device memory is cudarc's, as candle's CUDA storage is. cudarc and cust
//! share the device's primary context, so an instance and a cudarc `CudaContext` on one
//! device see the same memory.
//!
//! A view of a cudarc buffer keeps the buffer, not its address: the call takes the address on
//! its own stream, which makes that stream wait for the buffer's earlier uses as cudarc's
//! bookkeeping asks, and records this use on the buffer's events after the launches. cudarc
//! keeps the failures of that bookkeeping in one error slot per context rather than returning
//! them; a call sets aside what the slot held before it (another operation's failure, which
//! stays there for its owner) and reports only what its own bookkeeping put there.

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, DriverError, SyncOnDrop};

use super::options::{CallStream, StreamKind};
pub use super::place::{CudarcElement, CudarcType};
use super::place::{Read, Write};
use super::views::{Place, PlaceMut, Rows, RowsMut, Value, Values, ValuesMut, check_view};
use crate::error::{Error, Result};
use crate::shape::Shape;

impl<'a> Rows<'a> {
    /// Contiguous rows in a cudarc buffer (a `CudaSlice` or `CudaView`) of exactly `shape`'s
    /// elements. The call that takes the view must run on a cudarc stream
    /// ([`Options::on`](crate::api::Options::on)).
    pub fn cudarc<T: CudarcElement>(data: &'a impl DevicePtr<T>, shape: Shape) -> Result<Self> {
        shape.check_lengths(data.len(), shape.len())?;
        Ok(Rows::at(
            Place::Cudarc(T::read(data)),
            T::DTYPE,
            shape,
            shape.cols(),
        ))
    }

    /// Rows `stride` elements apart in a cudarc buffer that reaches the last row's end.
    pub fn cudarc_strided<T: CudarcElement>(
        data: &'a impl DevicePtr<T>,
        shape: Shape,
        stride: usize,
    ) -> Result<Self> {
        check_view(data.len(), shape, stride, "input")?;
        Ok(Rows::at(
            Place::Cudarc(T::read(data)),
            T::DTYPE,
            shape,
            stride,
        ))
    }
}

impl<'a> RowsMut<'a> {
    /// Contiguous writable rows in a cudarc buffer (a `CudaSlice` or `CudaViewMut`) of
    /// exactly `shape`'s elements.
    pub fn cudarc<T: CudarcElement>(
        data: &'a mut impl DevicePtrMut<T>,
        shape: Shape,
    ) -> Result<Self> {
        shape.check_lengths(shape.len(), data.len())?;
        Ok(RowsMut::at(
            PlaceMut::Cudarc(T::write(data)),
            T::DTYPE,
            shape,
            shape.cols(),
        ))
    }

    /// Writable rows `stride` elements apart in a cudarc buffer.
    pub fn cudarc_strided<T: CudarcElement>(
        data: &'a mut impl DevicePtrMut<T>,
        shape: Shape,
        stride: usize,
    ) -> Result<Self> {
        check_view(data.len(), shape, stride, "output")?;
        Ok(RowsMut::at(
            PlaceMut::Cudarc(T::write(data)),
            T::DTYPE,
            shape,
            stride,
        ))
    }
}

impl<'a, T: Value + CudarcType> Values<'a, T> {
    /// The values of a cudarc buffer.
    pub fn cudarc(data: &'a impl DevicePtr<T>) -> Self {
        Values::at(Place::Cudarc(T::read(data)), data.len())
    }
}

impl<'a, T: Value + CudarcType> ValuesMut<'a, T> {
    /// The writable values of a cudarc buffer (losses, log-sum-exps, sampled tokens, the
    /// random state).
    pub fn cudarc(data: &'a mut impl DevicePtrMut<T>) -> Self {
        let len = data.len();
        ValuesMut::at(PlaceMut::Cudarc(T::write(data)), len)
    }
}

impl<'a> From<&'a CudaStream> for CallStream<'a> {
    fn from(stream: &'a CudaStream) -> Self {
        CallStream(StreamKind::Cudarc(stream))
    }
}

impl<'a> From<&'a std::sync::Arc<CudaStream>> for CallStream<'a> {
    fn from(stream: &'a std::sync::Arc<CudaStream>) -> Self {
        CallStream(StreamKind::Cudarc(stream))
    }
}

/// What the guards' waits and records are checked as.
const WAITS: &str = "ordering the stream after cudarc's earlier uses of the buffers";
const RECORDS: &str = "recording the buffers' use on cudarc's events";

/// A call's dealings with cudarc: its stream, the guards of the buffers it took addresses of
/// (which record the use when dropped, after the launches), and cudarc's error slot, whose
/// earlier content is set aside for the call and put back after it.
pub(crate) struct CudarcCall<'r> {
    stream: &'r CudaStream,
    context: &'r CudaContext,
    earlier: Option<DriverError>,
    guards: Vec<SyncOnDrop<'r>>,
}

impl<'r> CudarcCall<'r> {
    /// Sets cudarc's error slot aside for a call on `stream`, of device `ordinal`.
    pub fn begin(stream: &'r CudaStream, ordinal: u32) -> Result<Self> {
        let device = stream.context().ordinal() as u32;
        if device != ordinal {
            return Err(Error::WrongDevice {
                what: "the cudarc stream",
                device,
                expected: ordinal,
            });
        }
        let context = stream.context();
        Ok(CudarcCall {
            stream,
            context,
            earlier: context.check_err().err(),
            guards: Vec::new(),
        })
    }

    /// The address of a buffer the call reads, its stream made to wait for the buffer's
    /// earlier writes.
    pub fn read(&mut self, data: Read<'r>) -> u64 {
        let (address, guard) = match data {
            Read::F32(d) => d.device_ptr(self.stream),
            Read::Bf16(d) => d.device_ptr(self.stream),
            Read::F16(d) => d.device_ptr(self.stream),
            Read::U8(d) => d.device_ptr(self.stream),
            Read::I32(d) => d.device_ptr(self.stream),
            Read::I64(d) => d.device_ptr(self.stream),
            Read::U32(d) => d.device_ptr(self.stream),
            Read::U64(d) => d.device_ptr(self.stream),
        };
        self.guards.push(guard);
        address
    }

    /// The address of a buffer the call writes, its stream made to wait for the buffer's
    /// earlier uses.
    pub fn write(&mut self, data: &'r mut Write<'_>) -> u64 {
        let (address, guard) = match data {
            Write::F32(d) => d.device_ptr_mut(self.stream),
            Write::Bf16(d) => d.device_ptr_mut(self.stream),
            Write::F16(d) => d.device_ptr_mut(self.stream),
            Write::U8(d) => d.device_ptr_mut(self.stream),
            Write::I32(d) => d.device_ptr_mut(self.stream),
            Write::I64(d) => d.device_ptr_mut(self.stream),
            Write::U32(d) => d.device_ptr_mut(self.stream),
            Write::U64(d) => d.device_ptr_mut(self.stream),
        };
        self.guards.push(guard);
        address
    }

    /// A failure of the waits the addresses asked for, as the call's error.
    pub fn check_waits(&self) -> Result<()> {
        self.check(WAITS)
    }

    /// Records the buffers' use (after the launches enqueued so far) and reports a failure of
    /// those records.
    pub fn finish(mut self) -> Result<()> {
        self.guards.clear();
        self.check(RECORDS)
    }

    fn check(&self, during: &'static str) -> Result<()> {
        self.context.check_err().map_err(|error| Error::CudaStatus {
            during,
            code: error.0 as u32,
            name: format!("{error:?}"),
        })
    }
}

impl Drop for CudarcCall<'_> {
    fn drop(&mut self) {
        // A call that failed before `finish` reports its own error; what its records put in
        // the slot goes with it.
        if !self.guards.is_empty() {
            self.guards.clear();
            let _ = self.context.check_err();
        }
        if let Some(earlier) = self.earlier.take() {
            self.context.record_err::<()>(Err(earlier));
        }
    }
}
