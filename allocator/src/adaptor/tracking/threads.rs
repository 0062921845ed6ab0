//! The threads that allocated through an adaptor: a table of slots records point into.

use std::cell::RefCell;
use std::sync::Weak;
use std::thread::Thread;

use parking_lot::Mutex;

use super::shards::{SLOT_UNKNOWN, SLOTS_MAX, Shard};
use crate::sync::SlotCache;

/// Exited threads in the table before it is pruned (and at least as many as the others).
const PRUNE_MIN: usize = 64;

/// The threads that allocated through one adaptor.
#[derive(Default)]
pub(super) struct ThreadTable {
    pub(super) slots: Mutex<Slots>,
}

#[derive(Default)]
pub(super) struct Slots {
    pub(super) entries: Vec<Option<SlotEntry>>,
    pub(super) free: Vec<u32>,
    pub(super) exited: usize,
    pub(super) prune_at: usize,
}

pub(super) struct SlotEntry {
    pub(super) thread: Thread,
    pub(super) exited: bool,
}

impl ThreadTable {
    /// A slot for `thread`, pruning the table first when exited threads fill it.
    pub(super) fn register(&self, thread: Thread, shards: &[Shard]) -> u32 {
        let mut slots = self.slots.lock();
        let full = slots.free.is_empty() && slots.entries.len() >= SLOTS_MAX - 1;
        let live = slots.entries.len() - slots.free.len();
        if full || slots.exited >= slots.prune_at.max(PRUNE_MIN) && 2 * slots.exited >= live {
            Self::prune(&mut slots, shards);
            if slots.free.is_empty() && slots.entries.len() >= SLOTS_MAX - 1 {
                return SLOT_UNKNOWN;
            }
        }
        let entry = Some(SlotEntry {
            thread,
            exited: false,
        });
        match slots.free.pop() {
            Some(i) => {
                slots.entries[i as usize] = entry;
                i
            }
            None => {
                slots.entries.push(entry);
                (slots.entries.len() - 1) as u32
            }
        }
    }

    /// Drops handles of exited threads no record refers to. A slot is marked exited only after the
    /// last record naming it went in, so one found unreferenced stays so.
    pub(super) fn prune(slots: &mut Slots, shards: &[Shard]) {
        let mut referenced = vec![false; slots.entries.len()];
        for shard in shards {
            for rec in shard.map.lock().records.values() {
                if let Some(r) = referenced.get_mut(rec.slot() as usize) {
                    *r = true;
                }
            }
        }
        for (i, referenced) in referenced.into_iter().enumerate() {
            let slot = &mut slots.entries[i];
            if !referenced && slot.as_ref().is_some_and(|e| e.exited) {
                *slot = None;
                slots.free.push(i as u32);
                slots.exited -= 1;
            }
        }
        // Exited threads still owning allocations stay: prune again once as many more have exited.
        slots.prune_at = 2 * slots.exited;
    }

    /// The thread of `slot` has exited.
    pub(super) fn exited(&self, slot: u32) {
        let mut slots = self.slots.lock();
        if let Some(Some(e)) = slots.entries.get_mut(slot as usize)
            && !e.exited
        {
            e.exited = true;
            slots.exited += 1;
        }
    }
}

/// This thread's tracking-adaptor registrations; dropping them at thread exit marks its slots
/// exited. Allocations later in teardown register a slot each, marked exited once recorded.
pub(super) struct Registrations(pub(super) Vec<(u64, u32, Weak<ThreadTable>)>);

impl Drop for Registrations {
    fn drop(&mut self) {
        let _ = SLOTS.try_with(SlotCache::clear);
        for (_, slot, table) in self.0.drain(..) {
            if let Some(table) = table.upgrade() {
                table.exited(slot);
            }
        }
    }
}

thread_local! {
    /// (adaptor id, slot) of the adaptors this thread used last.
    pub(super) static SLOTS: SlotCache<u64, 4> = const { SlotCache::new() };
    pub(super) static REGISTRATIONS: RefCell<Registrations> = const { RefCell::new(Registrations(Vec::new())) };
}
