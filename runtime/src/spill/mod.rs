//! Spilling policy: one [`SpillManager`] per device keeps the device bytes of its
//! [`SpillableBuffer`](rmm_allocator::spill::SpillableBuffer)s and adopted values
//! ([`ForeignData`]) under `spill.device_memory_limit`, spilling the least recently used data
//! not in use to its pinned host pool (and, when full, the oldest host data to
//! `spill.disk_directory`). Before a reinitialize it spills everything, so live data survives
//! the switch and comes back into the new stack on next use.

mod background;
mod foreign;
mod manager;
mod statistics;
mod tracker;

pub use foreign::{ForeignData, ForeignOwner, OwnerAccess};
pub use manager::{PartFill, SpillManager, TierUndo};
pub use statistics::{SpillStatistics, TierStatistics};
pub(crate) use tracker::SpillBatch;
