//! The building blocks of every kernel: the device's special registers, barriers and
//! instructions, memory accesses, element types, reductions, the online-softmax statistics,
//! and the exchange of statistics between the blocks of a row. No entry points; nothing here
//! names a kernel family. `online`, `barrier_word` and `row_part` are pure arithmetic that the
//! host compiles too (its tests check them); the rest exists only on the device.

pub mod barrier_word;
pub mod online;
pub mod row_part;

#[cfg(target_arch = "nvptx64")]
pub(crate) mod device;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod element;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod entry;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod memory;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod reduce;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod row_exchange;
