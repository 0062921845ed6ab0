//! A small cache of freed heap blocks in front of an arena's heaps (deferred coalescing).
//!
//! A block freed on an arena's stream may go at once to the stream's next request of that size, so
//! the arena keeps its latest freed blocks whole rather than merging them, as tcmalloc's thread
//! caches do: an allocate + free pair of one size costs a lookup, not a split and a merge. The
//! cache lives under the arena's lock, so every free is still checked against live blocks. The
//! arena flushes it when its heaps cannot serve a request, the pool on its slow paths.

/// Blocks one cache holds.
pub(crate) const SLOTS: usize = 4;
/// The largest block cached; larger ones go back to the heap at once to merge with neighbours.
pub(crate) const MAX_BLOCK: u64 = 16 << 20;

/// A freed heap block: where, how large, and its heap tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Cached {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) tag: u32,
}

/// Up to [`SLOTS`] cached blocks, oldest first.
#[derive(Debug, Default)]
pub(crate) struct BlockCache {
    blocks: [Cached; SLOTS],
    len: usize,
    pub(crate) bytes: u64,
}

impl BlockCache {
    /// Keeps `block`; returns the block to give back to the heap instead: the oldest when full, or
    /// `block` itself when larger than [`MAX_BLOCK`].
    #[inline]
    pub(crate) fn put(&mut self, block: Cached) -> Option<Cached> {
        if block.size > MAX_BLOCK {
            return Some(block);
        }
        let evicted = (self.len == SLOTS).then(|| {
            let oldest = self.blocks[0];
            self.blocks.copy_within(1.., 0);
            self.len -= 1;
            self.bytes -= oldest.size;
            oldest
        });
        self.blocks[self.len] = block;
        self.len += 1;
        self.bytes += block.size;
        evicted
    }

    /// The most recently cached block of exactly `size` bytes, taken out.
    #[inline]
    pub(crate) fn take(&mut self, size: u64) -> Option<Cached> {
        let i = self.blocks[..self.len]
            .iter()
            .rposition(|b| b.size == size)?;
        let block = self.blocks[i];
        self.blocks.copy_within(i + 1..self.len, i);
        self.len -= 1;
        self.bytes -= size;
        Some(block)
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = Cached> + '_ {
        self.blocks[..self.len].iter().copied()
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Cached> + use<> {
        let (blocks, len) = (self.blocks, self.len);
        self.len = 0;
        self.bytes = 0;
        blocks.into_iter().take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(addr: u64, size: u64) -> Cached {
        Cached {
            addr,
            size,
            tag: addr as u32,
        }
    }

    #[test]
    fn a_block_comes_back_for_its_own_size_only_newest_first() {
        let mut c = BlockCache::default();
        assert_eq!(c.put(block(0x100, 1 << 20)), None);
        assert_eq!(c.put(block(0x200, 2 << 20)), None);
        assert_eq!(c.put(block(0x300, 1 << 20)), None);
        assert_eq!(c.bytes, 4 << 20);
        assert_eq!(c.take(3 << 20), None);
        assert_eq!(c.take(1 << 20).map(|b| b.addr), Some(0x300));
        assert_eq!(c.take(1 << 20).map(|b| b.addr), Some(0x100));
        assert_eq!(c.take(1 << 20), None);
        assert_eq!(c.iter().map(|b| b.addr).collect::<Vec<_>>(), vec![0x200]);
        assert_eq!(c.bytes, 2 << 20);
    }

    #[test]
    fn a_full_cache_evicts_its_oldest_block_and_large_blocks_pass_through() {
        let mut c = BlockCache::default();
        for i in 0..SLOTS as u64 {
            assert_eq!(c.put(block(0x1000 * (i + 1), 4096)), None);
        }
        assert_eq!(c.put(block(0x9000, 512)).map(|b| b.addr), Some(0x1000));
        assert_eq!(c.bytes, (SLOTS as u64 - 1) * 4096 + 512);
        let big = block(0xA000, MAX_BLOCK + 256);
        assert_eq!(c.put(big), Some(big));
        assert!(c.put(block(0xB000, MAX_BLOCK)).is_some(), "full: evicts");
    }

    #[test]
    fn drain_empties_the_cache() {
        let mut c = BlockCache::default();
        c.put(block(0x100, 256));
        c.put(block(0x200, 512));
        let got: Vec<_> = c.drain().map(|b| (b.addr, b.size)).collect();
        assert_eq!(got, vec![(0x100, 256), (0x200, 512)]);
        assert!(c.is_empty());
        assert_eq!(c.bytes, 0);
        assert_eq!(c.drain().count(), 0);
    }
}
