//! Pool memory not granted to any stream's arena: free ranges by address (to merge neighbours) and
//! by size (best fit in O(log n)). Ranges merge across chunk starts only over chunks mapped side by
//! side (`merge_across_chunks`). All slow path.

use std::collections::{BTreeMap, BTreeSet};

/// The range of `ranges` (start → length) that holds all of `[start, start + len)`.
fn holding(ranges: &BTreeMap<u64, u64>, start: u64, len: u64) -> Option<(u64, u64)> {
    let (&a, &s) = ranges.range(..=start).next_back()?;
    (start - a + len <= s).then_some((a, s))
}

#[derive(Debug, Default)]
pub(crate) struct FreeSpace {
    by_addr: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    /// Upstream chunks: start → size.
    chunks: BTreeMap<u64, u64>,
    /// The chunks' bytes (a footprint-limited pool has thousands of chunks).
    pub(crate) pool_size: u64,
    pub(crate) free_bytes: u64,
    /// Free ranges merge across chunk starts (chunks mapped into one address range).
    pub(crate) merge_across_chunks: bool,
    /// The most the chunks came to since the pool was made or the peak was reset.
    peak_pool_size: u64,
    /// Chunks taken from and returned to the upstream (PyTorch's `num_device_alloc`/`_free`).
    pub(crate) device_allocations: u64,
    pub(crate) device_frees: u64,
}

impl FreeSpace {
    /// The chunk that holds `addr`: (start, size).
    pub(crate) fn chunk_of(&self, addr: u64) -> Option<(u64, u64)> {
        holding(&self.chunks, addr, 1)
    }

    /// At most `n` free ranges shorter than `need`, largest first, each ending in a gap wide enough
    /// for the rest of `need`: mapping right after one serves `need` with just the difference.
    pub(crate) fn ranges_before_gaps(&self, need: u64, n: usize) -> Vec<(u64, u64)> {
        self.by_size
            .range(..(need, 0))
            .rev()
            .filter(|&&(size, addr)| {
                let end = addr + size;
                self.chunk_of(end).is_none()
                    && self
                        .chunks
                        .range(end..)
                        .next()
                        .is_none_or(|(next, _)| next - end >= need - size)
            })
            .take(n)
            .map(|&(size, addr)| (addr, size))
            .collect()
    }

    /// The free range that holds all of `[addr, addr + size)`: (start, size).
    fn free_range_holding(&self, addr: u64, size: u64) -> Option<(u64, u64)> {
        holding(&self.by_addr, addr, size)
    }

    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    pub(crate) fn fragments(&self) -> usize {
        self.by_addr.len()
    }

    pub(crate) fn largest_free(&self) -> u64 {
        self.by_size.last().map_or(0, |(s, _)| *s)
    }

    pub(crate) fn chunks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.chunks.iter().map(|(a, s)| (*a, *s))
    }

    /// Adds a new upstream chunk, all free.
    pub(crate) fn add_chunk(&mut self, addr: u64, size: u64) {
        if let Some(old) = self.chunks.insert(addr, size) {
            self.pool_size -= old;
        }
        self.pool_size += size;
        self.insert(addr, size);
        self.peak_pool_size = self.peak_pool_size.max(self.pool_size);
    }

    /// The most the chunks came to since the pool was made or [`Self::reset_peak`].
    pub(crate) fn peak_pool_size(&self) -> u64 {
        self.peak_pool_size.max(self.pool_size)
    }

    /// Makes the peak the chunks' size now.
    pub(crate) fn reset_peak(&mut self) {
        self.peak_pool_size = self.pool_size;
    }

    /// Whether free ranges must not merge across `addr`.
    fn is_chunk_start(&self, addr: u64) -> bool {
        !self.merge_across_chunks && self.chunks.contains_key(&addr)
    }

    fn put(&mut self, addr: u64, size: u64) {
        self.by_addr.insert(addr, size);
        self.by_size.insert((size, addr));
        self.free_bytes += size;
    }

    fn remove(&mut self, addr: u64, size: u64) {
        self.by_addr.remove(&addr);
        self.by_size.remove(&(size, addr));
        self.free_bytes -= size;
    }

    /// Gives `[addr, addr + size)` back, merging with free neighbours in the same chunk.
    pub(crate) fn insert(&mut self, mut addr: u64, mut size: u64) {
        if !self.is_chunk_start(addr)
            && let Some((&pa, &ps)) = self.by_addr.range(..addr).next_back()
            && pa + ps == addr
        {
            self.remove(pa, ps);
            addr = pa;
            size += ps;
        }
        let end = addr + size;
        if !self.is_chunk_start(end)
            && let Some(&ns) = self.by_addr.get(&end)
        {
            self.remove(end, ns);
            size += ns;
        }
        self.put(addr, size);
    }

    /// Takes exactly free `[addr, addr + size)` (the rest stays free); false if not all free.
    pub(crate) fn take_exact(&mut self, addr: u64, size: u64) -> bool {
        let Some((fa, fs)) = self.free_range_holding(addr, size) else {
            return false;
        };
        self.carve((fa, fs), addr, size);
        true
    }

    /// Takes `[addr, addr + size)` out of the free range `(fa, fs)`; the rest of it stays free.
    fn carve(&mut self, (fa, fs): (u64, u64), addr: u64, size: u64) {
        self.remove(fa, fs);
        if addr > fa {
            self.put(fa, addr - fa);
        }
        if fa + fs > addr + size {
            self.put(addr + size, fa + fs - (addr + size));
        }
    }

    /// The chunks `[addr, addr + size)` overlaps, in address order.
    pub(crate) fn chunks_under(&self, addr: u64, size: u64) -> Vec<(u64, u64)> {
        let rest = self.chunks.range(addr + 1..addr + size);
        let rest = rest.map(|(a, s)| (*a, *s));
        self.chunk_of(addr).into_iter().chain(rest).collect()
    }

    /// Takes `want` bytes if a range fits, else at least `need` (the whole best-fitting range, up
    /// to `want`). Returns (address, size).
    pub(crate) fn take(&mut self, need: u64, want: u64) -> Option<(u64, u64)> {
        let (size, addr) = self
            .by_size
            .range((want, 0)..)
            .next()
            .or_else(|| self.by_size.range((need, 0)..).next())
            .copied()?;
        let take = size.min(want.max(need));
        self.remove(addr, size);
        if size > take {
            self.put(addr + take, size - take);
        }
        Some((addr, take))
    }

    /// The chunks that are entirely free, largest first.
    pub(crate) fn free_chunks(&self) -> Vec<(u64, u64)> {
        // The chunks inside each free range: the free ranges are fewer than the chunks.
        let inside = |(&start, &len): (&u64, &u64)| {
            let chunks = self.chunks.range(start..start + len);
            chunks
                .filter(move |(a, s)| **a + **s <= start + len)
                .map(|(&a, &s)| (a, s))
        };
        let mut free: Vec<(u64, u64)> = self.by_addr.iter().flat_map(inside).collect();
        free.sort_by_key(|(_, s)| std::cmp::Reverse(*s));
        free
    }

    /// Free chunks another pool would adopt within `budget`: largest first, each that fits.
    pub(crate) fn adoptable_chunks(&self, budget: u64) -> Vec<(u64, u64)> {
        let mut left = budget;
        self.free_chunks()
            .into_iter()
            .filter(|&(_, s)| {
                let fits = s <= left;
                left -= if fits { s } else { 0 };
                fits
            })
            .collect()
    }

    /// Forgets the chunk at `addr` with whatever part of it is free (it may hold live blocks).
    pub(crate) fn forget_chunk(&mut self, addr: u64, size: u64) {
        // The free ranges overlapping it: maybe one starting before it, and those inside it.
        let before = self.by_addr.range(..addr).next_back();
        let before = before.filter(|&(a, s)| a + s > addr);
        let inside = self.by_addr.range(addr..addr + size);
        let free: Vec<(u64, u64)> = before
            .into_iter()
            .chain(inside)
            .map(|(&a, &s)| (a, s))
            .collect();
        for range in free {
            self.carve(range, addr, size);
        }
        self.drop_chunk(addr);
    }

    /// Drops the chunk at `addr` from the list (its bytes from the pool's size).
    fn drop_chunk(&mut self, addr: u64) {
        if let Some(size) = self.chunks.remove(&addr) {
            self.pool_size -= size;
        }
    }

    /// Removes and returns `chunks` (entirely free); the free space around each stays free.
    pub(crate) fn take_chunks(&mut self, chunks: &[(u64, u64)]) -> Vec<(u64, u64)> {
        for &(a, s) in chunks {
            if let Some(range) = self.free_range_holding(a, s) {
                self.carve(range, a, s);
            }
            self.drop_chunk(a);
        }
        chunks.to_vec()
    }

    /// Removes and returns the entirely free chunks not in `keep`.
    pub(crate) fn take_free_chunks_except(&mut self, keep: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let keep: std::collections::HashSet<&(u64, u64)> = keep.iter().collect();
        let mut others = self.free_chunks();
        others.retain(|c| !keep.contains(c));
        self.take_chunks(&others)
    }

    /// Removes and returns entirely free chunks, largest first, until the pool is at most `target`,
    /// leaving those inside `keep` (a range).
    pub(crate) fn take_free_chunks(
        &mut self,
        target: u64,
        keep: Option<(u64, u64)>,
    ) -> Vec<(u64, u64)> {
        let inside = |&(a, s): &(u64, u64)| keep.is_some_and(|(k, l)| a >= k && a + s <= k + l);
        let mut pool = self.pool_size;
        let taken: Vec<(u64, u64)> = self
            .free_chunks()
            .into_iter()
            .filter(|c| !inside(c))
            .take_while(|&(_, s)| {
                let over = pool > target;
                pool -= if over { s } else { 0 };
                over
            })
            .collect();
        self.take_chunks(&taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_inside_a_chunk_but_not_across_chunks() {
        let mut f = FreeSpace::default();
        f.add_chunk(0, 1000);
        f.add_chunk(1000, 1000);
        assert_eq!(f.fragments(), 2);
        let (a, s) = f.take(300, 300).unwrap();
        assert_eq!((a, s), (0, 300));
        f.insert(a, s);
        assert_eq!(f.fragments(), 2, "merged back within chunk 0 only");
        assert_eq!(f.take(1500, 1500), None);
        assert_eq!(f.take_free_chunks(0, None).len(), 2);
        assert_eq!(f.pool_size, 0);
    }

    #[test]
    fn contiguous_chunks_merge_and_go_back_one_by_one() {
        let mut f = FreeSpace {
            merge_across_chunks: true,
            ..FreeSpace::default()
        };
        f.add_chunk(0, 1000);
        f.add_chunk(1000, 1000);
        f.add_chunk(2000, 1000);
        assert_eq!(f.fragments(), 1, "side by side chunks are one free range");
        assert_eq!(f.largest_free(), 3000);
        assert_eq!(
            f.ranges_before_gaps(4000, 4),
            vec![(0, 3000)],
            "the top is a gap"
        );
        // A range across the first two chunks: only the third is entirely free.
        assert_eq!(f.take(1500, 1500), Some((0, 1500)));
        assert_eq!(f.adoptable_chunks(u64::MAX), vec![(2000, 1000)]);
        f.insert(0, 1500);
        // Give the middle chunk back: the free space either side stays.
        assert_eq!(f.take_chunks(&[(1000, 1000)]), vec![(1000, 1000)]);
        assert_eq!(f.pool_size, 2000);
        assert_eq!(f.free_bytes, 2000);
        assert_eq!(f.fragments(), 2);
        assert_eq!(f.chunk_of(2500), Some((2000, 1000)));
        assert_eq!(f.chunk_of(1500), None);
        // Below the returned chunk a range ends at a 1000-byte gap; above, at the top.
        assert_eq!(f.ranges_before_gaps(2000, 4), vec![(2000, 1000), (0, 1000)]);
        assert_eq!(f.ranges_before_gaps(2000, 1), vec![(2000, 1000)]);
        assert_eq!(
            f.ranges_before_gaps(4000, 4),
            vec![(2000, 1000)],
            "the gap above the first range holds 1000 bytes, not 3000"
        );
        assert_eq!(
            f.ranges_before_gaps(1000, 4),
            vec![],
            "only ranges shorter than the need"
        );
        assert_eq!(f.take_free_chunks(0, None).len(), 2);
        assert_eq!((f.pool_size, f.free_bytes, f.fragments()), (0, 0, 0));
    }

    #[test]
    fn take_prefers_want_then_falls_back_to_need() {
        let mut f = FreeSpace::default();
        f.add_chunk(0, 100);
        f.add_chunk(1000, 50);
        assert_eq!(f.take(40, 80), Some((0, 80)));
        assert_eq!(f.take(40, 80), Some((1000, 50)));
        assert_eq!(f.take(40, 80), None);
        assert_eq!(f.take(20, 80), Some((80, 20)));
    }
}
