//! Spillable containers and their data's tiers: device memory, a pinned host pool, disk files.
//!
//! * [`SpillableBuffer`]: untyped bytes; [`SpillableVector`]: typed plain-old-data elements. A
//!   [`DeviceGuard`] or [`HostGuard`] brings the data to its tier and holds it there meanwhile.
//! * [`SpillStore`]: one device's lower tiers and the copy streams moving data.
//! * [`SpillObserver`]: the policy hook (the runtime's spill manager: LRU, device limit, making
//!   room, statistics).
//!
//! The policy (when to spill what) lives in the runtime; this module only moves data, correctly: a
//! buffer in use never moves, and a failed move leaves it where it was.

mod buffer;
mod copy;
mod disk;
mod store;
mod vector;

/// The most bytes a spill or unspill copy keeps enqueued ahead of the copy engine; larger copies
/// are enqueued in pieces, so other copies (reading a scalar back) wait behind at most this much.
pub const COPY_WINDOW: usize = crate::backend::pinned_copy::WINDOW;

pub use buffer::{
    DeviceAccess, DeviceGuard, HeldInPlace, HostGuard, PendingSpill, SharedDeviceGuard,
    SpillObserver, SpillStep, SpillableBuffer, Tier,
};
pub use disk::remove_files_for_exit;
pub use store::{SpillStore, SpillTiers};
pub use vector::SpillableVector;
