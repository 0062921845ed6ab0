//! Spilling policy: one [`SpillManager`] per device keeps the device bytes of its
//! [`SpillableBuffer`](rmm_allocator::spill::SpillableBuffer)s, and of the values it adopted
//! from other libraries ([`ForeignData`]), under `spill.device_memory_limit`, spilling the
//! least recently used data not in use to its pinned host pool (and, when that is full, the
//! least recently used host data on to `spill.disk_directory`), and spills everything before
//! a reinitialize so that live data survives the switch (it comes back, into the new stack,
//! on next use).
//!
//! * `manager`: the [`SpillManager`] (making buffers, adopting values, the out-of-memory
//!   handler, spilling and unspilling everything, statistics);
//! * `tracker`: the least-recently-used order and the device bytes against the limit;
//! * `background`: the limit enforced on a thread of its own after adoptions;
//! * `foreign`: adopted values ([`ForeignData`], [`ForeignOwner`]);
//! * `statistics`: the figures ([`SpillStatistics`], [`TierStatistics`]).

mod background;
mod foreign;
mod manager;
mod statistics;
mod tracker;

pub use foreign::{ForeignData, ForeignOwner, OwnerAccess};
pub use manager::{PartFill, SpillManager, TierUndo};
pub use statistics::{SpillStatistics, TierStatistics};
pub(crate) use tracker::SpillBatch;
