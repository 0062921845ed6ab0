//! Spillable containers and the tiers their data moves through: device memory, a pinned
//! host pool, and files on disk.
//!
//! * [`SpillableBuffer`]: untyped bytes; [`SpillableVector`]: typed plain-old-data elements.
//!   Device access through a [`DeviceGuard`], host access through a [`HostGuard`]; either
//!   brings the data to its tier and holds it there while the guard lives.
//! * [`SpillStore`]: one device's lower tiers and the copy streams that move data.
//! * [`SpillObserver`]: the policy hook (the runtime's spill manager): least-recently-used
//!   order, the device limit, making room, statistics.
//!
//! The policy (when to spill what) lives in the runtime; this module only moves data,
//! correctly: a buffer in use is never moved, and a failed move leaves it where it was.

mod buffer;
mod copy;
mod disk;
mod store;
mod vector;

/// The most bytes one spill or unspill copy keeps enqueued ahead of the copy engine: a larger
/// one is enqueued in pieces as earlier pieces end, so that other work's copies (a task
/// reading a scalar back, say) wait for at most this much rather than the whole spill.
pub const COPY_WINDOW: usize = crate::backend::pinned_copy::WINDOW;

pub use buffer::{
    DeviceGuard, HeldInPlace, HostGuard, PendingSpill, SharedDeviceGuard, SpillObserver, SpillStep,
    SpillableBuffer, Tier,
};
pub use disk::remove_files_for_exit;
pub use store::{SpillStore, SpillTiers};
pub use vector::SpillableVector;
