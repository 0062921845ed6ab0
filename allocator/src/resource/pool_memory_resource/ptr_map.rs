//! Open-addressing map from a live block's address to its descriptor, for `deallocate`.
//!
//! Linear probing with backward-shift deletion (no tombstones), kept at most half full.
//! Address 0 marks an empty slot: the pool never hands out the null address.

const EMPTY: u64 = 0;

/// Key and value side by side: a probe touches one cache line.
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u64,
    value: u32,
}

const EMPTY_SLOT: Slot = Slot {
    key: EMPTY,
    value: 0,
};

#[derive(Debug)]
pub(crate) struct PtrMap {
    slots: Vec<Slot>,
    pub(crate) len: usize,
    mask: usize,
}

#[inline]
fn hash(key: u64) -> usize {
    // Addresses are 256-byte aligned: drop the zero bits, then mix (Fibonacci hashing).
    ((key >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize
}

impl PtrMap {
    pub(crate) fn with_capacity(capacity: usize) -> PtrMap {
        let slots = (capacity * 2).next_power_of_two().max(16);
        PtrMap {
            slots: vec![EMPTY_SLOT; slots],
            len: 0,
            mask: slots - 1,
        }
    }

    #[inline]
    pub(crate) fn insert(&mut self, key: u64, value: u32) {
        debug_assert_ne!(key, EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mut i = hash(key) & self.mask;
        loop {
            let k = self.slots[i].key;
            if k == EMPTY || k == key {
                self.len += usize::from(k == EMPTY);
                self.slots[i] = Slot { key, value };
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        let mut i = hash(key) & self.mask;
        loop {
            let slot = self.slots[i];
            let k = slot.key;
            if k == key {
                return Some(slot.value);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub(crate) fn remove(&mut self, key: u64) -> Option<u32> {
        if key == EMPTY {
            return None;
        }
        let mut i = hash(key) & self.mask;
        loop {
            let k = self.slots[i].key;
            if k == EMPTY {
                return None;
            }
            if k == key {
                break;
            }
            i = (i + 1) & self.mask;
        }
        let value = self.slots[i].value;
        // Backward shift: pull later entries of the probe run into the hole.
        let mut hole = i;
        let mut j = (i + 1) & self.mask;
        loop {
            let k = self.slots[j].key;
            if k == EMPTY {
                break;
            }
            let home = hash(k) & self.mask;
            // Move k into the hole if its home is not in (hole, j] (cyclically).
            let dist_hole = hole.wrapping_sub(home) & self.mask;
            let dist_j = j.wrapping_sub(home) & self.mask;
            if dist_hole <= dist_j {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.slots[hole] = EMPTY_SLOT;
        self.len -= 1;
        Some(value)
    }

    /// Every entry (for validation and leak reports).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.key != EMPTY)
            .map(|s| (s.key, s.value))
    }

    #[cold]
    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        let slots = old.len() * 2;
        self.slots = vec![EMPTY_SLOT; slots];
        self.mask = slots - 1;
        self.len = 0;
        for s in old.into_iter().filter(|s| s.key != EMPTY) {
            self.insert(s.key, s.value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn behaves_like_a_hash_map() {
        let mut m = PtrMap::with_capacity(4);
        let mut reference = HashMap::new();
        let mut x = 12345u64;
        for step in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = ((x % 5000) + 1) << 8;
            if x.is_multiple_of(3) {
                assert_eq!(m.remove(key), reference.remove(&key), "step {step}");
            } else {
                m.insert(key, step);
                reference.insert(key, step);
            }
            if step % 997 == 0 {
                for (k, v) in &reference {
                    assert_eq!(m.get(*k), Some(*v));
                }
                assert_eq!(m.len, reference.len());
            }
        }
        assert_eq!(m.iter().count(), reference.len());
    }
}
