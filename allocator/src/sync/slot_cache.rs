//! [`SlotCache`]: a thread's memory of the slots the objects it used last gave it (a statistics
//! shard, a stream's arena), found by a thread-local scan instead of a lock and a map. A miss goes
//! to the object's registration, which then [`insert`](SlotCache::insert)s the answer.

use std::cell::Cell;

/// What a [`SlotCache`] is keyed by: an object's id (with, for stream arenas, the stream).
pub(crate) trait SlotKey: Copy + PartialEq + 'static {
    /// A key no object has (ids start at 1).
    const EMPTY: Self;
}

impl SlotKey for u64 {
    const EMPTY: u64 = 0;
}

impl SlotKey for (u64, u64) {
    const EMPTY: (u64, u64) = (0, 0);
}

/// `N` (key, slot) pairs, for a `thread_local!` (see the module documentation).
pub(crate) struct SlotCache<K: SlotKey, const N: usize> {
    entries: [Cell<(K, u32)>; N],
    /// The entry the next insert replaces.
    victim: Cell<usize>,
}

impl<K: SlotKey, const N: usize> SlotCache<K, N> {
    pub(crate) const fn new() -> Self {
        SlotCache {
            entries: [const { Cell::new((K::EMPTY, 0)) }; N],
            victim: Cell::new(0),
        }
    }

    #[inline(always)]
    pub(crate) fn get(&self, key: K) -> Option<u32> {
        self.entries.iter().find_map(|e| {
            let (k, slot) = e.get();
            (k == key).then_some(slot)
        })
    }

    /// Caches `slot` for `key`, replacing the oldest entry.
    pub(crate) fn insert(&self, key: K, slot: u32) {
        let i = self.victim.get();
        self.victim.set((i + 1) % N);
        self.entries[i].set((key, slot));
    }

    pub(crate) fn clear(&self) {
        self.entries.iter().for_each(|e| e.set((K::EMPTY, 0)));
    }
}
