//! The exact peak (the default, as in RMM): headroom split between the threads and a reserve.
//!
//! A peak is the maximum of a sum no shard sees alone. Instead of one shared counter written by
//! every operation, the adaptor keeps the *headroom* `peak − current`:
//!
//! * each shard holds a headroom word (bytes and allocations packed in a `u64`); an allocation
//!   takes from its thread's word and a free gives back, with one compare-and-swap on the thread's
//!   own cache line.
//! * the rest sits in a spin-locked reserve. A thread whose headroom runs short (or grows past its
//!   keep limit after frees) trades: its word goes into the reserve and it draws a new share.
//! * when the reserve is short too, the thread *freezes* every shard's word, collecting all the
//!   headroom into the reserve: the current value is then exactly `peak − reserve`, and the peak
//!   is raised by any shortfall. Owners meeting a frozen word wait for the lock; the words are
//!   thawed (empty) before it is released.
//!
//! Invariant (for bytes and allocations): current + threads' headroom + reserve = peak, all ≥ 0.
//!
//! **Guarantee.** Each operation takes effect at one instant inside the adaptor's call (its
//! compare-and-swap, or a point under the lock), in an order consistent with real time (a frozen
//! word makes its owner wait). The peak is the maximum of the live sum over that order: never below
//! the sum at any instant (headroom is never negative), never above a sum that held at one instant
//! (a raise sets it to the exact current value). This is RMM's exact peak, ordered by its mutex
//! instead.

use std::sync::atomic::Ordering;

use super::{MAX_SHARDS, Shard, StatisticsResourceAdaptor};
use crate::adaptor::Upstream;
#[cfg(doc)]
use crate::sync::SpinLock;

// Headroom word: bytes in bits 0..48, allocations in 48..63, `FROZEN` in bit 63. A frozen word
// holds no headroom and fails both fast paths.
pub(super) const HR_BYTES: u64 = (1 << 48) - 1;
pub(super) const HR_ONE: u64 = 1 << 48;
pub(super) const HR_COUNT_MAX: u64 = (1 << 15) - 1;
pub(super) const FROZEN: u64 = 1 << 63;
/// A share drawn from the reserve is at most the reserve over this many threads...
pub(super) const SHARES_MAX: i64 = 16;
/// ...and at most this large (so that `KEEP_FACTOR` times it fits its field).
pub(super) const GRANT_BYTES_MAX: i64 = 1 << 44;
pub(super) const GRANT_COUNT_MAX: i64 = 4095;
/// A thread returns headroom to the reserve when frees take it past this many times its last share
/// or the floors below, whichever is more.
pub(super) const KEEP_FACTOR: i64 = 4;
pub(super) const KEEP_FLOOR_BYTES: i64 = 16 << 20;
pub(super) const KEEP_FLOOR_COUNT: i64 = 256;

pub(super) const fn hr_pack(bytes: i64, count: i64) -> u64 {
    ((count as u64) << 48) | bytes as u64
}

/// Exact peak: the headroom no thread holds, behind a [`SpinLock`] (critical sections are short and
/// bounded: at most two stores per shard, no allocation or system call).
#[derive(Debug, Default)]
pub(super) struct Reserve {
    pub(super) bytes: i64,
    pub(super) count: i64,
}

impl Reserve {
    /// Adds a headroom word taken from a shard (a frozen one holds nothing).
    pub(super) fn take(&mut self, word: u64) {
        if word & FROZEN == 0 {
            self.bytes += (word & HR_BYTES) as i64;
            self.count += (word >> 48) as i64;
        }
    }
}

impl<U: Upstream + ?Sized> StatisticsResourceAdaptor<U> {
    /// Takes `bytes` and one allocation from the thread's headroom, or trades with the reserve.
    #[inline(always)]
    pub(super) fn take_headroom(&self, s: &Shard, bytes: i64) {
        let b = bytes as u64;
        let taken = s
            .headroom
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                // The count field must be in 1..=HR_COUNT_MAX: not empty, not frozen.
                let fits = (w >> 48).wrapping_sub(1) < HR_COUNT_MAX && (w & HR_BYTES) >= b;
                fits.then(|| w - b - HR_ONE)
            });
        if taken.is_err() {
            self.trade(Some(s), bytes, true);
        }
    }

    /// Returns `bytes` and an allocation to the headroom; trades past the keep limit or if frozen.
    #[inline(always)]
    pub(super) fn give_headroom(&self, s: &Shard, bytes: i64) {
        let b = bytes as u64;
        let keep = s.keep.load(Ordering::Relaxed);
        let given = s
            .headroom
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                // A frozen word's count field is above any keep limit.
                let fits = (w & HR_BYTES) + b <= (keep & HR_BYTES) && (w >> 48) < (keep >> 48);
                fits.then(|| w + b + HR_ONE)
            });
        if given.is_err() {
            self.trade(Some(s), bytes, false);
        }
    }

    /// Under the reserve's lock: puts the thread's headroom into the reserve, applies the operation
    /// there (freezing all shards and raising the peak when an allocation does not fit) and draws a
    /// new share. `shard` is `None` for the overflow shard (no headroom).
    #[cold]
    #[inline(never)]
    pub(super) fn trade(&self, shard: Option<&Shard>, bytes: i64, alloc: bool) {
        let mut reserve = self.figures.reserve.lock();
        if let Some(s) = shard {
            // Words are frozen only while the lock is held: this one is not.
            reserve.take(s.headroom.swap(0, Ordering::Relaxed));
        }
        if alloc {
            if reserve.bytes < bytes || reserve.count < 1 {
                let frozen = self.freeze_all(&mut reserve);
                self.raise_to_fit(&mut reserve, bytes, 1);
                self.thaw(frozen);
            }
            reserve.bytes -= bytes;
            reserve.count -= 1;
        } else {
            reserve.bytes = reserve.bytes.saturating_add(bytes);
            reserve.count += 1;
        }
        if let Some(s) = shard {
            self.draw_share(&mut reserve, s);
        }
    }

    /// Freezes every shard's word, moving its headroom into the reserve; returns how many (first)
    /// shards it froze. Then peak − reserve is the exact current value. An owner meeting its frozen
    /// word waits for the lock; [`Self::thaw`] empties the words before it is released.
    pub(super) fn freeze_all(&self, reserve: &mut Reserve) -> usize {
        // Registration takes the reserve's lock too: no shard appears during the freeze.
        let n = self.threads.load(Ordering::Relaxed).min(MAX_SHARDS);
        for s in self.shards.first(n) {
            reserve.take(s.headroom.swap(FROZEN, Ordering::Relaxed));
        }
        n
    }

    /// Thaws the first `n` shards' words, empty: frees go on lock-free, allocations draw a share.
    pub(super) fn thaw(&self, n: usize) {
        for s in self.shards.first(n) {
            s.headroom.store(0, Ordering::Relaxed);
        }
    }

    /// With all shards frozen, raises the peak just enough for the reserve to hold `bytes` and
    /// `count` more: to exactly the current value after the allocation.
    pub(super) fn raise_to_fit(&self, reserve: &mut Reserve, bytes: i64, count: i64) {
        let f = &self.figures;
        if reserve.bytes < bytes {
            let peak = self.run_peak_bytes.load(Ordering::Relaxed) + (bytes - reserve.bytes);
            self.run_peak_bytes.store(peak, Ordering::Relaxed);
            f.life_peak_bytes.fetch_max(peak, Ordering::Relaxed);
            reserve.bytes = bytes;
        }
        if reserve.count < count {
            let peak = self.run_peak_count.load(Ordering::Relaxed) + (count - reserve.count);
            self.run_peak_count.store(peak, Ordering::Relaxed);
            f.life_peak_count.fetch_max(peak, Ordering::Relaxed);
            reserve.count = count;
        }
    }

    /// Gives this thread's (emptied) word a share of the reserve and sets its keep limit.
    pub(super) fn draw_share(&self, reserve: &mut Reserve, s: &Shard) {
        let shares = (self.threads.load(Ordering::Relaxed) as i64).clamp(1, SHARES_MAX);
        let bytes = (reserve.bytes / shares).clamp(0, GRANT_BYTES_MAX);
        let count = (reserve.count / shares).clamp(0, GRANT_COUNT_MAX);
        reserve.bytes -= bytes;
        reserve.count -= count;
        s.keep.store(
            hr_pack(
                (bytes * KEEP_FACTOR).max(KEEP_FLOOR_BYTES),
                (count * KEEP_FACTOR).max(KEEP_FLOOR_COUNT),
            ),
            Ordering::Relaxed,
        );
        s.headroom.store(hr_pack(bytes, count), Ordering::Relaxed);
    }
}
