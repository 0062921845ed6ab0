//! The synchronisation the hot paths share: a spin-then-yield lock ([`SpinLock`]), a per-thread
//! cache of a thread's slots ([`SlotCache`]), a table of slots made a group at a time
//! ([`GroupedSlots`]); the clocks stamping records are [`crate::backend::clock`]. None allocates,
//! calls the driver, takes a global lock or logs on its fast path.

mod grouped_slots;
mod slot_cache;
mod spin_lock;

pub(crate) use grouped_slots::GroupedSlots;
pub(crate) use slot_cache::SlotCache;
pub(crate) use spin_lock::SpinLock;
