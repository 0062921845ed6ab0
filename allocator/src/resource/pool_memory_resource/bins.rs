//! Size-class bins for requests up to 64 KiB: the pool's small-object path.
//!
//! Each class (every 256 B up to 4 KiB, then four per power of two: at most 25 % rounding) keeps a
//! LIFO stack of free blocks cut from *slabs* of the arena's small heap, so the latest freed block
//! is reused first and small objects never fragment the heaps. A per-slab bitmap validates every
//! free; a wholly free slab goes back to the heap on the pool's slow paths.

use super::tlsf::{GRANULE, Heap, store};

/// Largest request served by the bins.
pub(crate) const BIN_LIMIT: u64 = 64 << 10;
const CLASSES: usize = 32;
const MIN_SLAB: u64 = 64 << 10;
const MAX_SLAB: u64 = 1 << 20;

/// Class index and block size (bytes) of a request of `size` bytes (1 ..= BIN_LIMIT).
#[inline]
pub(crate) fn class_of(size: u64) -> (usize, u64) {
    let g = size.div_ceil(GRANULE);
    if g <= 16 {
        return ((g - 1) as usize, g * GRANULE);
    }
    let e = 63 - (g - 1).leading_zeros() as u64;
    let step = 1u64 << (e - 2);
    let k = g.div_ceil(step);
    (
        16 + (e as usize - 4) * 4 + (k as usize - 5),
        (k * step) * GRANULE,
    )
}

#[derive(Debug)]
struct Slab {
    base: u64,
    block: u64,
    count: u32,
    class: u8,
    live: u32,
    /// The slab's block in the small heap.
    heap_block: u32,
    /// One bit per block: set while handed out.
    bits: Vec<u64>,
    active: bool,
}

/// The bins of one arena.
#[derive(Debug, Default)]
pub(crate) struct Bins {
    free: [Vec<(u64, u32)>; CLASSES],
    slabs: Vec<Slab>,
    spare_ids: Vec<u32>,
    /// (base, slab id) of active slabs, sorted by base, to find a pointer's slab.
    order: Vec<(u64, u32)>,
    pub(crate) live_bytes: u64,
    pub(crate) free_bytes: u64,
    pub(crate) live_count: usize,
}

impl Bins {
    /// A block for `size` ≤ [`BIN_LIMIT`] (new slab from `heap` if needed): (address, block size).
    #[inline]
    pub(crate) fn alloc(&mut self, size: u64, heap: &mut Heap) -> Option<(u64, u64)> {
        let (class, block) = class_of(size);
        let (addr, sid) = match self.free[class].pop() {
            Some(entry) => entry,
            None => {
                self.refill(class, block, heap)?;
                self.free[class].pop()?
            }
        };
        let slab = &mut self.slabs[sid as usize];
        let i = ((addr - slab.base) / block) as usize;
        slab.bits[i / 64] |= 1 << (i % 64);
        slab.live += 1;
        self.live_bytes += block;
        self.free_bytes -= block;
        self.live_count += 1;
        Some((addr, block))
    }

    #[cold]
    fn refill(&mut self, class: usize, block: u64, heap: &mut Heap) -> Option<()> {
        // A full slab if the heap has one, else as many blocks as fit (at least one).
        let mut slab_bytes = (block * 64).clamp(MIN_SLAB, MAX_SLAB) / block * block;
        let heap_block = loop {
            if let Some(b) = heap.alloc(slab_bytes) {
                break b;
            }
            if slab_bytes == block {
                return None;
            }
            slab_bytes = (slab_bytes / 2 / block * block).max(block);
        };
        let base = heap.block(heap_block).addr;
        let count = (slab_bytes / block) as u32;
        let slab = Slab {
            base,
            block,
            count,
            class: class as u8,
            live: 0,
            heap_block,
            bits: vec![0; (count as usize).div_ceil(64)],
            active: true,
        };
        let sid = store(&mut self.slabs, &mut self.spare_ids, slab);
        let at = self.order.partition_point(|(b, _)| *b < base);
        self.order.insert(at, (base, sid));
        // Lowest address on top of the stack.
        self.free[class].extend((0..count as u64).rev().map(|i| (base + i * block, sid)));
        self.free_bytes += slab_bytes;
        Some(())
    }

    /// The slab holding the handed-out block at `addr`, with the block's index.
    #[inline]
    fn locate(&self, addr: u64) -> Option<(u32, usize)> {
        let at = self.order.partition_point(|(b, _)| *b <= addr);
        let (base, sid) = *self.order.get(at.checked_sub(1)?)?;
        let slab = &self.slabs[sid as usize];
        let offset = addr - base;
        if offset >= slab.block * slab.count as u64 || !offset.is_multiple_of(slab.block) {
            return None;
        }
        let i = (offset / slab.block) as usize;
        (slab.bits[i / 64] & (1 << (i % 64)) != 0).then_some((sid, i))
    }

    /// Size of the handed-out block at `addr`, if it is one of these bins'.
    pub(crate) fn block_size(&self, addr: u64) -> Option<u64> {
        self.locate(addr)
            .map(|(sid, _)| self.slabs[sid as usize].block)
    }

    /// Takes back the block at `addr`; false if it is not a handed-out block of these bins.
    #[inline]
    pub(crate) fn free(&mut self, addr: u64) -> bool {
        let Some((sid, i)) = self.locate(addr) else {
            return false;
        };
        let slab = &mut self.slabs[sid as usize];
        slab.bits[i / 64] &= !(1 << (i % 64));
        slab.live -= 1;
        let (block, class) = (slab.block, slab.class as usize);
        self.live_bytes -= block;
        self.free_bytes += block;
        self.live_count -= 1;
        self.free[class].push((addr, sid));
        true
    }

    /// Gives every slab with no live block back to `heap`.
    pub(crate) fn release_empty(&mut self, heap: &mut Heap) {
        let sids = self.order.iter().map(|(_, sid)| *sid);
        let empty: Vec<u32> = sids
            .filter(|&sid| self.slabs[sid as usize].live == 0)
            .collect();
        if empty.is_empty() {
            return;
        }
        for &sid in &empty {
            let slab = &mut self.slabs[sid as usize];
            slab.active = false;
            self.free_bytes -= slab.block * slab.count as u64;
            heap.free(slab.heap_block);
            self.free[slab.class as usize].retain(|(_, s)| *s != sid);
            self.spare_ids.push(sid);
        }
        let slabs = &self.slabs;
        self.order.retain(|(_, sid)| slabs[*sid as usize].active);
    }

    /// Handed-out blocks as (address, size).
    pub(crate) fn live_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.order.iter().flat_map(move |(_, sid)| {
            let s = &self.slabs[*sid as usize];
            (0..s.count as usize)
                .filter(move |i| s.bits[i / 64] & (1 << (i % 64)) != 0)
                .map(move |i| (s.base + i as u64 * s.block, s.block))
        })
    }

    /// Checks counters against bitmaps and free stacks.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut live = 0usize;
        let mut live_bytes = 0u64;
        let mut total = 0u64;
        for (_, sid) in &self.order {
            let s = &self.slabs[*sid as usize];
            let n: u32 = s.bits.iter().map(|w| w.count_ones()).sum();
            if n != s.live {
                return Err(format!(
                    "slab at {:#x}: {n} bits set, {} counted live",
                    s.base, s.live
                ));
            }
            live += n as usize;
            live_bytes += n as u64 * s.block;
            total += s.block * s.count as u64;
        }
        let stacked: u64 = self
            .free
            .iter()
            .flatten()
            .map(|(_, sid)| self.slabs[*sid as usize].block)
            .sum();
        if live != self.live_count || live_bytes != self.live_bytes || stacked != self.free_bytes {
            return Err(format!(
                "bins count {} live / {} B live / {} B free; slabs hold {live} / {live_bytes} B / stacks {stacked} B",
                self.live_count, self.live_bytes, self.free_bytes
            ));
        }
        if total != self.live_bytes + self.free_bytes {
            return Err(format!(
                "slabs hold {total} B, live + free = {}",
                self.live_bytes + self.free_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_with_at_most_a_quarter_wasted() {
        let mut last = (0, 0);
        for size in 1..=BIN_LIMIT {
            let (c, block) = class_of(size);
            assert!(block >= size && block % GRANULE == 0);
            assert!(c < CLASSES);
            assert!((c, block) >= last);
            last = (c, block);
            if size > 4096 {
                assert!(block * 4 <= size * 5, "{size} → {block}");
            }
        }
        assert_eq!(class_of(BIN_LIMIT), (31, BIN_LIMIT));
    }

    #[test]
    fn blocks_come_and_go_and_empty_slabs_return() {
        let mut heap = Heap::new();
        heap.add_region(1 << 20, 16 << 20);
        let mut bins = Bins::default();
        let a = bins.alloc(100, &mut heap).unwrap();
        let b = bins.alloc(100, &mut heap).unwrap();
        assert_eq!(b.0, a.0 + 256);
        assert!(bins.free(a.0));
        assert!(!bins.free(a.0), "double free refused");
        assert!(!bins.free(a.0 + 8), "interior pointer refused");
        assert_eq!(bins.alloc(200, &mut heap).unwrap().0, a.0, "LIFO reuse");
        let c = bins.alloc(5000, &mut heap).unwrap();
        assert_eq!(c.1, 5120);
        bins.check().unwrap();
        for p in [a.0, b.0, c.0] {
            assert!(bins.free(p));
        }
        bins.release_empty(&mut heap);
        bins.check().unwrap();
        assert_eq!(bins.free_bytes, 0);
        assert_eq!(heap.free_bytes, 16 << 20);
    }
}
