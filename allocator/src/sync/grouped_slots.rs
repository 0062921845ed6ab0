//! A table of slots made a group at a time, on first use, so a table sized for many threads or
//! streams costs nothing until they come.

use std::sync::OnceLock;

/// `GROUPS × GROUP` slots of `T`, a group made (as `T::default()`) by its first
/// [`make`](Self::make). [`first`](Self::first) relies on groups being made in order.
pub(crate) struct GroupedSlots<T, const GROUP: usize, const GROUPS: usize> {
    groups: [OnceLock<Box<[T; GROUP]>>; GROUPS],
}

impl<T: Default, const GROUP: usize, const GROUPS: usize> GroupedSlots<T, GROUP, GROUPS> {
    pub(crate) const fn new() -> Self {
        GroupedSlots {
            groups: [const { OnceLock::new() }; GROUPS],
        }
    }

    /// Slot `i` if its group is made (`None` past the end too).
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        let group = self.groups.get(i / GROUP)?.get()?;
        Some(&group[i % GROUP])
    }

    /// Slot `i`, its group made first where it is not; `None` past the end.
    pub(crate) fn make(&self, i: usize) -> Option<&T> {
        let group = self
            .groups
            .get(i / GROUP)?
            .get_or_init(|| Box::new(std::array::from_fn(|_| T::default())));
        Some(&group[i % GROUP])
    }

    /// The slots made among the first `n`, in order.
    pub(crate) fn first(&self, n: usize) -> impl Iterator<Item = &T> {
        self.groups
            .iter()
            .map_while(OnceLock::get)
            .flat_map(|group| group.iter())
            .take(n)
    }

    #[cfg(test)]
    pub(crate) fn made(&self) -> usize {
        self.groups.iter().filter(|g| g.get().is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    type Table = GroupedSlots<AtomicU64, 4, 3>;

    #[test]
    fn a_new_table_makes_no_group_and_reads_none() {
        let t = Table::new();
        assert_eq!(t.made(), 0);
        assert!(t.get(0).is_none());
        assert_eq!(t.first(12).count(), 0);
    }

    #[test]
    fn making_a_slot_makes_its_group_only() {
        let t = Table::new();
        t.make(1).unwrap().store(7, Ordering::Relaxed);
        assert_eq!(t.made(), 1);
        assert_eq!(t.get(1).unwrap().load(Ordering::Relaxed), 7);
        // Its neighbours in the group are there, as made.
        assert_eq!(t.get(3).unwrap().load(Ordering::Relaxed), 0);
        // The next group is not.
        assert!(t.get(4).is_none());
        t.make(5).unwrap();
        assert_eq!(t.made(), 2);
        // Making again gives the same slot.
        assert_eq!(t.make(1).unwrap().load(Ordering::Relaxed), 7);
    }

    #[test]
    fn slots_past_the_end_are_none() {
        let t = Table::new();
        assert!(t.make(12).is_none());
        assert!(t.get(12).is_none());
        assert!(t.get(usize::MAX).is_none());
        assert_eq!(t.made(), 0);
    }

    #[test]
    fn first_walks_the_made_slots_in_order_up_to_n() {
        let t = Table::new();
        for i in 0..6 {
            t.make(i).unwrap().store(i as u64, Ordering::Relaxed);
        }
        let seen: Vec<u64> = t.first(6).map(|s| s.load(Ordering::Relaxed)).collect();
        assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
        // Only made groups: 8 slots exist, 12 asked for.
        assert_eq!(t.first(12).count(), 8);
        assert_eq!(t.first(3).count(), 3);
    }

    #[test]
    fn threads_making_one_group_at_once_share_it() {
        let t = Table::new();
        std::thread::scope(|s| {
            for i in 0..4 {
                let t = &t;
                s.spawn(move || t.make(i).unwrap().fetch_add(1, Ordering::Relaxed));
            }
        });
        assert_eq!(t.made(), 1);
        assert_eq!(
            t.first(4).map(|s| s.load(Ordering::Relaxed)).sum::<u64>(),
            4
        );
    }
}
