//! The synchronisation the hot paths share, written once: a spin-then-yield lock
//! ([`SpinLock`]), a per-thread cache of the slots a thread was given ([`SlotCache`]), a
//! table of slots made a group at a time ([`GroupedSlots`]) and the clocks that
//! stamp records ([`clock`]). None of them allocates, calls the driver, takes a
//! global lock or emits a log event on its fast path.

pub(crate) mod clock;
mod grouped_slots;
mod slot_cache;
mod spin_lock;

pub(crate) use grouped_slots::GroupedSlots;
pub(crate) use slot_cache::SlotCache;
pub(crate) use spin_lock::SpinLock;
