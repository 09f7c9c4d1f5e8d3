//! The building blocks of every kernel, importing nothing but [`crate::launch`]: `device`
//! (special registers, barriers and instructions, each wrapped once), `entry` (the one macro
//! that makes a kernel entry), `memory` (loads and stores), `element` (element types and
//! their conversions), `reduce` (lane, group and block reductions), `online` (the
//! online-softmax statistics), `barrier_word` and `row_exchange` (the per-row barrier and the
//! exchange of statistics between the blocks of a row), `row_part` (where a share of a row
//! lies), `slice_share` (a block's share of a row kept in shared memory, and its two
//! passes), `philox` (the counter-based random numbers of sampling), `draw` (the order a
//! sampler ranks columns in and the exponential behind its noise). No entry points; nothing
//! here names a kernel family. `online`, `barrier_word`, `row_part`, `philox` and `draw` are pure
//! arithmetic that the host compiles too (its tests check them); the rest
//! exists only on the device.

pub mod barrier_word;
pub mod draw;
pub mod online;
pub mod philox;
pub mod row_part;

#[cfg(target_arch = "nvptx64")]
pub mod device;
#[cfg(target_arch = "nvptx64")]
pub mod element;
#[cfg(target_arch = "nvptx64")]
pub mod entry;
#[cfg(target_arch = "nvptx64")]
pub mod memory;
#[cfg(target_arch = "nvptx64")]
pub mod reduce;
#[cfg(target_arch = "nvptx64")]
pub mod row_exchange;
#[cfg(target_arch = "nvptx64")]
pub mod slice_share;
