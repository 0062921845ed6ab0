//! The synchronisation the hot paths share: a spin-then-yield lock, a per-thread slot cache and a
//! table of slots made a group at a time. None allocates, calls the driver or logs when fast.

mod grouped_slots;
mod slot_cache;
mod spin_lock;

pub(crate) use grouped_slots::GroupedSlots;
pub(crate) use slot_cache::SlotCache;
pub(crate) use spin_lock::SpinLock;
