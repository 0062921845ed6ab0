//! Free stretches as a `BTreeMap` of `offset → length` (pinned host pool, export arenas).

use std::collections::BTreeMap;

/// Adds the free stretch `[start, start + len)` to `free`, merged with adjacent stretches.
pub(crate) fn give_back(free: &mut BTreeMap<usize, usize>, start: usize, len: usize) {
    let (mut start, mut size) = (start, len);
    if let Some((&o, &l)) = free.range(..start).next_back()
        && o + l == start
    {
        free.remove(&o);
        start = o;
        size += l;
    }
    if let Some(l) = free.remove(&(start + size)) {
        size += l;
    }
    free.insert(start, size);
}

/// Takes `len` bytes from the start of the lowest stretch of `free` that holds them; the offset.
pub(crate) fn take_first_fit(free: &mut BTreeMap<usize, usize>, len: usize) -> Option<usize> {
    let (&offset, &size) = free.iter().find(|&(_, &size)| size >= len)?;
    free.remove(&offset);
    if size > len {
        free.insert(offset + len, size - len);
    }
    Some(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stretch_merges_with_both_neighbours_and_only_those() {
        let mut free = BTreeMap::from([(0, 256), (512, 256), (1024, 256)]);
        give_back(&mut free, 256, 256);
        assert_eq!(free, BTreeMap::from([(0, 768), (1024, 256)]));
        give_back(&mut free, 2048, 256);
        assert_eq!(free, BTreeMap::from([(0, 768), (1024, 256), (2048, 256)]));
    }

    #[test]
    fn first_fit_takes_from_the_lowest_stretch_long_enough() {
        let mut free = BTreeMap::from([(0, 256), (512, 1024), (2048, 4096)]);
        assert_eq!(take_first_fit(&mut free, 512), Some(512));
        assert_eq!(take_first_fit(&mut free, 512), Some(1024));
        assert_eq!(free, BTreeMap::from([(0, 256), (2048, 4096)]));
        assert_eq!(take_first_fit(&mut free, 8192), None);
        assert_eq!(free, BTreeMap::from([(0, 256), (2048, 4096)]));
    }
}
