//! A two-level segregated-fit heap over device addresses (TLSF, Masmano et al. 2004).
//!
//! Free blocks sit in size classes (the power of two of the size, split into 32 linear classes);
//! two bitmaps find the smallest fitting non-empty class in O(1), the head of the request's own
//! class tried first. Blocks split on allocation and merge with free physical neighbours on free.
//! Regions merge with adjacent regions only within caller-given bounds
//! ([`Heap::add_region_within`]), so no block spans non-contiguous memory. Block descriptors live
//! in a slab indexed by `u32`; nothing here touches device memory.

/// "No block".
pub(crate) const NIL: u32 = u32::MAX;
/// `next_free` of a block that is not free (keeps descriptors at 32 bytes, two per line).
const USED: u32 = u32::MAX - 1;
/// Every size and address is a multiple of this (RMM's 256-byte alignment).
pub(crate) const GRANULE: u64 = 256;
const SL_BITS: u32 = 5;
const SL_COUNT: usize = 1 << SL_BITS;
/// Sizes are counted in granules; 2^48 bytes / 256 = 2^40 granules, so 41 first-level classes.
const FL_COUNT: usize = 41;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
}

impl Block {
    /// A block on no free list, between physical neighbours `prev_phys` and `next_phys`.
    #[inline]
    fn used(addr: u64, size: u64, prev_phys: u32, next_phys: u32) -> Block {
        Block {
            addr,
            size,
            prev_phys,
            next_phys,
            prev_free: NIL,
            next_free: USED,
        }
    }

    #[inline]
    pub(crate) fn is_free(&self) -> bool {
        self.next_free != USED
    }
}

#[derive(Debug)]
pub(crate) struct Heap {
    blocks: Vec<Block>,
    spare: Vec<u32>,
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    heads: [[u32; SL_COUNT]; FL_COUNT],
    pub(crate) free_bytes: u64,
    pub(crate) free_blocks: usize,
    pub(crate) regions: usize,
    /// Bytes of all regions, free or not.
    pub(crate) region_bytes: u64,
}

/// (first level, second level) of a size in granules.
#[inline]
fn class_of(granules: u64) -> (usize, usize) {
    if granules < SL_COUNT as u64 {
        (0, granules as usize)
    } else {
        let msb = 63 - granules.leading_zeros();
        let fl = (msb - SL_BITS + 1) as usize;
        let sl = ((granules >> (msb - SL_BITS)) as usize) ^ SL_COUNT;
        (fl, sl)
    }
}

/// The class whose every block fits `granules`: the size rounded up to the next class start.
#[inline]
fn class_fitting(granules: u64) -> (usize, usize) {
    if granules < SL_COUNT as u64 {
        (0, granules as usize)
    } else {
        let msb = 63 - granules.leading_zeros();
        let round = (1u64 << (msb - SL_BITS)) - 1;
        class_of(granules + round)
    }
}

/// Puts `item` in a spare slot of `slab` (else at its end); returns its index.
#[inline]
pub(crate) fn store<T>(slab: &mut Vec<T>, spare: &mut Vec<u32>, item: T) -> u32 {
    match spare.pop() {
        Some(i) => {
            slab[i as usize] = item;
            i
        }
        None => {
            slab.push(item);
            (slab.len() - 1) as u32
        }
    }
}

impl Heap {
    pub(crate) fn new() -> Heap {
        Heap {
            blocks: Vec::with_capacity(1024),
            spare: Vec::with_capacity(256),
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: [[NIL; SL_COUNT]; FL_COUNT],
            free_bytes: 0,
            free_blocks: 0,
            regions: 0,
            region_bytes: 0,
        }
    }

    pub(crate) fn block(&self, idx: u32) -> &Block {
        &self.blocks[idx as usize]
    }

    /// The block at `idx`, if there is one (for checks of indices kept elsewhere).
    pub(crate) fn get_block(&self, idx: u32) -> Option<&Block> {
        self.blocks.get(idx as usize)
    }

    fn new_block(&mut self, b: Block) -> u32 {
        store(&mut self.blocks, &mut self.spare, b)
    }

    /// Returns descriptor `idx` to the slab's spare slots; a size of 0 marks it unused.
    fn retire(&mut self, idx: u32) {
        self.blocks[idx as usize].size = 0;
        self.spare.push(idx);
    }

    /// A heap block satisfying `at` (a slab scan, for the slow path adding regions).
    fn find_block(&self, at: impl Fn(&Block) -> bool) -> Option<u32> {
        self.blocks
            .iter()
            .position(|b| b.size != 0 && at(b))
            .map(|i| i as u32)
    }

    fn link(&mut self, idx: u32) {
        let (fl, sl) = class_of(self.blocks[idx as usize].size / GRANULE);
        let head = self.heads[fl][sl];
        {
            let b = &mut self.blocks[idx as usize];
            b.prev_free = NIL;
            b.next_free = head;
        }
        if head != NIL {
            self.blocks[head as usize].prev_free = idx;
        }
        self.heads[fl][sl] = idx;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmap[fl] |= 1 << sl;
        self.free_bytes += self.blocks[idx as usize].size;
        self.free_blocks += 1;
    }

    fn unlink(&mut self, idx: u32) {
        let b = self.blocks[idx as usize];
        let (fl, sl) = class_of(b.size / GRANULE);
        if b.prev_free != NIL {
            self.blocks[b.prev_free as usize].next_free = b.next_free;
        } else {
            self.heads[fl][sl] = b.next_free;
            if b.next_free == NIL {
                self.sl_bitmap[fl] &= !(1 << sl);
                if self.sl_bitmap[fl] == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if b.next_free != NIL {
            self.blocks[b.next_free as usize].prev_free = b.prev_free;
        }
        self.blocks[idx as usize].next_free = USED;
        self.free_bytes -= b.size;
        self.free_blocks -= 1;
    }

    /// Hands `[addr, addr + size)` to the heap as a new region of one free block.
    pub(crate) fn add_region(&mut self, addr: u64, size: u64) {
        let idx = self.add_live_region(addr, size);
        self.link(idx);
    }

    /// Hands `[addr, addr + size)` to the heap as free memory joining the adjacent regions within
    /// `[lo, hi)` (contiguous memory), so memory granted piecewise serves larger requests once free.
    pub(crate) fn add_region_within(&mut self, addr: u64, size: u64, lo: u64, hi: u64) {
        debug_assert!(addr.is_multiple_of(GRANULE) && size.is_multiple_of(GRANULE) && size > 0);
        debug_assert!(lo <= addr && addr + size <= hi);
        let end = addr + size;
        let before = (addr > lo)
            .then(|| self.find_block(|b| b.next_phys == NIL && b.addr + b.size == addr))
            .flatten();
        let after = (end < hi)
            .then(|| self.find_block(|b| b.prev_phys == NIL && b.addr == end))
            .flatten();
        let idx = self.new_block(Block::used(
            addr,
            size,
            before.unwrap_or(NIL),
            after.unwrap_or(NIL),
        ));
        if let Some(b) = before {
            self.blocks[b as usize].next_phys = idx;
        }
        if let Some(a) = after {
            self.blocks[a as usize].prev_phys = idx;
        }
        // One region more, less each one it joins (joining both makes two into one).
        self.regions =
            self.regions + 1 - usize::from(before.is_some()) - usize::from(after.is_some());
        self.region_bytes += size;
        // A block in use until freed here: freeing merges it with free neighbours.
        self.free(idx);
    }

    /// Adds `[addr, addr + size)`, adopted memory, as a one-live-block region; returns the block.
    pub(crate) fn add_live_region(&mut self, addr: u64, size: u64) -> u32 {
        debug_assert!(addr.is_multiple_of(GRANULE) && size.is_multiple_of(GRANULE) && size > 0);
        let idx = self.new_block(Block::used(addr, size, NIL, NIL));
        self.regions += 1;
        self.region_bytes += size;
        idx
    }

    /// Finds a free block of at least `size` bytes (a multiple of [`GRANULE`]).
    #[inline]
    fn find(&self, size: u64) -> u32 {
        let granules = size / GRANULE;
        // The head of the request's own class often fits: closer to best fit, same cost.
        let (fl0, sl0) = class_of(granules);
        // A request beyond every class (larger than any region could be) fits nowhere.
        if fl0 >= FL_COUNT {
            return NIL;
        }
        let head = self.heads[fl0][sl0];
        if head != NIL && self.blocks[head as usize].size >= size {
            return head;
        }
        let (fl, sl) = class_fitting(granules);
        if fl >= FL_COUNT {
            return NIL;
        }
        let sl_map = self.sl_bitmap[fl] & (!0u32 << sl);
        let (fl, sl) = if sl_map != 0 {
            (fl, sl_map.trailing_zeros() as usize)
        } else {
            let fl_map = self.fl_bitmap & (!0u64).checked_shl(fl as u32 + 1).unwrap_or(0);
            if fl_map == 0 {
                return NIL;
            }
            let fl = fl_map.trailing_zeros() as usize;
            (fl, self.sl_bitmap[fl].trailing_zeros() as usize)
        };
        self.heads[fl][sl]
    }

    /// Allocates `size` bytes (a non-zero multiple of [`GRANULE`]); returns the block.
    #[inline]
    pub(crate) fn alloc(&mut self, size: u64) -> Option<u32> {
        let idx = self.find(size);
        if idx == NIL {
            return None;
        }
        self.unlink(idx);
        let b = self.blocks[idx as usize];
        if b.size > size {
            // Split: the tail stays free.
            let rest = self.new_block(Block::used(b.addr + size, b.size - size, idx, b.next_phys));
            if b.next_phys != NIL {
                self.blocks[b.next_phys as usize].prev_phys = rest;
            }
            let blk = &mut self.blocks[idx as usize];
            blk.size = size;
            blk.next_phys = rest;
            self.link(rest);
        }
        Some(idx)
    }

    /// Frees block `idx`, merging it with free physical neighbours. Returns the merged block.
    #[inline]
    pub(crate) fn free(&mut self, idx: u32) -> u32 {
        let mut idx = idx;
        let b = self.blocks[idx as usize];
        debug_assert!(!b.is_free(), "double free of block {idx}");
        if b.next_phys != NIL && self.blocks[b.next_phys as usize].is_free() {
            self.unlink(b.next_phys);
            self.absorb_next(idx);
        }
        let p = self.blocks[idx as usize].prev_phys;
        if p != NIL && self.blocks[p as usize].is_free() {
            self.unlink(p);
            self.absorb_next(p);
            idx = p;
        }
        self.link(idx);
        idx
    }

    /// Merges the next physical neighbour of `left` (on no free list) into `left`.
    #[inline]
    fn absorb_next(&mut self, left: u32) {
        let right = self.blocks[left as usize].next_phys;
        let r = self.blocks[right as usize];
        let blk = &mut self.blocks[left as usize];
        blk.size += r.size;
        blk.next_phys = r.next_phys;
        if r.next_phys != NIL {
            self.blocks[r.next_phys as usize].prev_phys = left;
        }
        self.retire(right);
    }

    /// The free blocks of class `(fl, sl)`, in list order.
    fn class_list(&self, fl: usize, sl: usize) -> impl Iterator<Item = u32> + '_ {
        let next = |&i: &u32| Some(self.blocks[i as usize].next_free).filter(|&n| n != NIL);
        std::iter::successors(Some(self.heads[fl][sl]).filter(|&i| i != NIL), next)
    }

    fn free_list(&self) -> impl Iterator<Item = u32> + '_ {
        (0..FL_COUNT).flat_map(move |fl| (0..SL_COUNT).flat_map(move |sl| self.class_list(fl, sl)))
    }

    /// Removes every region that is one whole free block; returns their ranges.
    pub(crate) fn take_free_regions(&mut self, out: &mut Vec<(u64, u64)>) {
        let whole = |&i: &u32| {
            let b = &self.blocks[i as usize];
            b.prev_phys == NIL && b.next_phys == NIL
        };
        let candidates: Vec<u32> = self.free_list().filter(whole).collect();
        out.extend(candidates.into_iter().map(|i| self.remove_free(i)));
    }

    /// Takes a free block of at least `size` bytes out, splitting its region; returns its range.
    pub(crate) fn steal(&mut self, size: u64) -> Option<(u64, u64)> {
        let idx = self.find(size);
        (idx != NIL).then(|| self.remove_free(idx))
    }

    /// Takes every free block out into `out`, splitting regions.
    pub(crate) fn take_free_blocks(&mut self, out: &mut Vec<(u64, u64)>) {
        let all: Vec<u32> = self.free_list().collect();
        out.extend(all.into_iter().map(|i| self.remove_free(i)));
    }

    /// Removes the free block `idx` from the heap (its region splits around it).
    fn remove_free(&mut self, idx: u32) -> (u64, u64) {
        self.unlink(idx);
        let b = self.blocks[idx as usize];
        match (b.prev_phys != NIL, b.next_phys != NIL) {
            (true, true) => self.regions += 1,
            (false, false) => self.regions -= 1,
            _ => {}
        }
        if b.prev_phys != NIL {
            self.blocks[b.prev_phys as usize].next_phys = NIL;
        }
        if b.next_phys != NIL {
            self.blocks[b.next_phys as usize].prev_phys = NIL;
        }
        self.region_bytes -= b.size;
        self.retire(idx);
        (b.addr, b.size)
    }

    /// The size of the largest free block (scans the largest non-empty class).
    pub(crate) fn largest_free(&self) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let sizes = self
            .class_list(fl, sl)
            .map(|i| self.blocks[i as usize].size);
        sizes.max().unwrap_or(0)
    }

    /// Checks the heap's structure; returns a description of the first fault found.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut free_bytes = 0;
        let mut free_blocks = 0;
        for fl in 0..FL_COUNT {
            for sl in 0..SL_COUNT {
                let nonempty = self.heads[fl][sl] != NIL;
                if nonempty != (self.sl_bitmap[fl] & (1 << sl) != 0) {
                    return Err(format!("bitmap disagrees with class ({fl}, {sl})"));
                }
                for i in self.class_list(fl, sl) {
                    let b = &self.blocks[i as usize];
                    if !b.is_free() {
                        return Err(format!("block {i} on a free list is not free"));
                    }
                    if class_of(b.size / GRANULE) != (fl, sl) {
                        return Err(format!(
                            "block {i} of {} bytes in class ({fl}, {sl})",
                            b.size
                        ));
                    }
                    if b.next_phys != NIL && self.blocks[b.next_phys as usize].is_free() {
                        return Err(format!("free block {i} has a free next neighbour"));
                    }
                    if b.next_phys != NIL
                        && self.blocks[b.next_phys as usize].addr != b.addr + b.size
                    {
                        return Err(format!("block {i} and its next neighbour are not adjacent"));
                    }
                    free_bytes += b.size;
                    free_blocks += 1;
                }
            }
        }
        if free_bytes != self.free_bytes || free_blocks != self.free_blocks {
            return Err(format!(
                "free counters {} B / {} blocks, lists hold {free_bytes} B / {free_blocks} blocks",
                self.free_bytes, self.free_blocks
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_fitting_rounds_up() {
        let mut last = (0, 0);
        for g in 1..100_000u64 {
            let c = class_of(g);
            assert!(c >= last, "class of {g} went backwards");
            last = c;
            let f = class_fitting(g);
            assert!(f >= c);
            // Every size in the fitting class is at least g.
            let mut probe = g;
            while class_of(probe) < f {
                probe += 1;
            }
            assert!(probe >= g);
        }
    }

    #[test]
    fn split_and_merge_restore_one_block() {
        let mut h = Heap::new();
        h.add_region(1 << 20, 64 << 20);
        let a = h.alloc(256).unwrap();
        let b = h.alloc(1 << 20).unwrap();
        let c = h.alloc(768).unwrap();
        assert_eq!(h.block(a).addr, 1 << 20);
        assert_eq!(h.block(b).addr, (1 << 20) + 256);
        assert_eq!(h.free_bytes, (64 << 20) - 256 - (1 << 20) - 768);
        h.free(b);
        h.free(a);
        h.check().unwrap();
        h.free(c);
        h.check().unwrap();
        assert_eq!(h.free_blocks, 1);
        assert_eq!(h.free_bytes, 64 << 20);
        let mut out = Vec::new();
        h.take_free_regions(&mut out);
        assert_eq!(out, vec![(1 << 20, 64 << 20)]);
        assert_eq!(h.regions, 0);
    }

    #[test]
    fn regions_join_their_neighbours_within_the_bounds_given() {
        const R: u64 = 4096;
        let base = 0x10000;
        let mut h = Heap::new();
        // Three grants side by side, the middle one last: it joins both neighbours.
        h.add_region_within(base, R, base, base + 3 * R);
        h.add_region_within(base + 2 * R, R, base, base + 3 * R);
        assert_eq!(h.regions, 2, "not adjacent yet");
        h.add_region_within(base + R, R, base, base + 3 * R);
        h.check().unwrap();
        assert_eq!((h.regions, h.free_blocks), (1, 1));
        let a = h.alloc(3 * R).expect("a block spanning the three grants");
        assert_eq!(h.block(a).addr, base);
        h.free(a);
        // A grant beside a region in use joins it, and is served on its own.
        let a = h.alloc(3 * R).unwrap();
        h.add_region_within(base + 3 * R, R, base, base + 5 * R);
        assert_eq!(h.regions, 1);
        let b = h.alloc(R).unwrap();
        assert_eq!(h.block(b).addr, base + 3 * R);
        h.free(a);
        h.free(b);
        h.check().unwrap();
        let mut out = Vec::new();
        h.take_free_regions(&mut out);
        assert_eq!(out, vec![(base, 4 * R)], "one region, returned whole");
        assert_eq!((h.regions, h.region_bytes), (0, 0));
        // Outside the bounds (another upstream allocation begins at the boundary): apart.
        h.add_region_within(base, R, base, base + R);
        h.add_region_within(base + R, R, base + R, base + 2 * R);
        assert_eq!(h.regions, 2);
        assert!(h.alloc(2 * R).is_none(), "a block across the boundary");
        h.check().unwrap();
    }

    #[test]
    fn regions_do_not_merge() {
        let mut h = Heap::new();
        h.add_region(0x10000, 4096);
        h.add_region(0x10000 + 4096, 4096);
        assert!(h.alloc(8192).is_none(), "a block spanning two regions");
        let a = h.alloc(4096).unwrap();
        let b = h.alloc(4096).unwrap();
        h.free(a);
        h.free(b);
        assert_eq!(h.free_blocks, 2);
        h.check().unwrap();
    }

    #[test]
    fn exhaustion_and_largest_free() {
        let mut h = Heap::new();
        h.add_region(0, 10 * 256);
        let blocks: Vec<u32> = (0..10).map(|_| h.alloc(256).unwrap()).collect();
        assert!(h.alloc(256).is_none());
        assert_eq!(h.largest_free(), 0);
        h.free(blocks[3]);
        h.free(blocks[4]);
        assert_eq!(h.largest_free(), 512);
        assert!(h.alloc(768).is_none());
        assert!(h.alloc(512).is_some());
    }

    #[test]
    fn stealing_a_free_block_splits_its_region() {
        let mut h = Heap::new();
        h.add_region(0, 30 * 256);
        let a = h.alloc(10 * 256).unwrap();
        let b = h.alloc(10 * 256).unwrap();
        let c = h.alloc(10 * 256).unwrap();
        h.free(b);
        assert_eq!(h.steal(5 * 256), Some((10 * 256, 10 * 256)));
        assert_eq!(h.regions, 2);
        assert_eq!(h.region_bytes, 20 * 256);
        h.free(a);
        h.free(c);
        h.check().unwrap();
        assert_eq!(h.free_blocks, 2, "the two halves no longer merge");
        let mut out = Vec::new();
        h.take_free_regions(&mut out);
        out.sort();
        assert_eq!(out, vec![(0, 10 * 256), (20 * 256, 10 * 256)]);
    }

    #[test]
    fn taking_every_free_block_leaves_only_live_blocks() {
        let mut h = Heap::new();
        h.add_region(0, 40 * 256);
        let a = h.alloc(10 * 256).unwrap();
        let b = h.alloc(10 * 256).unwrap();
        let c = h.alloc(10 * 256).unwrap();
        h.free(a);
        h.free(c);
        let mut out = Vec::new();
        h.take_free_blocks(&mut out);
        out.sort();
        assert_eq!(out, vec![(0, 10 * 256), (20 * 256, 20 * 256)]);
        assert_eq!(h.free_bytes, 0);
        assert_eq!(h.free_blocks, 0);
        assert_eq!(
            h.region_bytes,
            10 * 256,
            "only the live block's region is left"
        );
        h.check().unwrap();
        h.free(b);
        h.check().unwrap();
        assert_eq!(h.free_blocks, 1);
    }
}
