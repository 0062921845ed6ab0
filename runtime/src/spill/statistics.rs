//! Spill figures: moves per tier with their bytes and wall time, and what each tier holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rmm_allocator::fmt_bytes;
use serde::Serialize;

/// Moves into and out of one lower tier (host or disk).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TierStatistics {
    /// Moves into the tier (from the device, or host to disk); with `spilled_bytes`.
    pub spilled_count: u64,
    /// See `spilled_count`.
    pub spilled_bytes: u64,
    /// Wall time they ran (overlaps counted once).
    pub spill_seconds: f64,
    /// Moves out of the tier (to the device, or disk to host); with `unspilled_bytes`.
    pub unspilled_count: u64,
    /// See `unspilled_count`.
    pub unspilled_bytes: u64,
    /// Wall time they ran (overlaps counted once).
    pub unspill_seconds: f64,
    /// Bytes of spilled data the tier holds now.
    pub held_bytes: u64,
    /// Buffers whose data the tier holds now.
    pub held_count: u64,
}

impl TierStatistics {
    /// Bandwidth into the tier in GB/s (0 when nothing moved).
    pub fn spill_gbps(&self) -> f64 {
        rate(self.spilled_bytes, self.spill_seconds)
    }

    /// Bandwidth out of the tier in GB/s.
    pub fn unspill_gbps(&self) -> f64 {
        rate(self.unspilled_bytes, self.unspill_seconds)
    }
}

/// Spill figures of one device.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpillStatistics {
    /// The device.
    pub device: u32,
    /// Device bytes the manager keeps its data under.
    pub limit: u64,
    /// Device bytes tracked now; with `peak_tracked_bytes`, the most at once.
    pub tracked_bytes: u64,
    /// See `tracked_bytes`.
    pub peak_tracked_bytes: u64,
    /// Buffers and adopted values whose data is on the device now.
    pub tracked_count: u64,
    /// Buffers copied off the device (to host or disk); with `spilled_bytes`.
    pub spilled_count: u64,
    /// See `spilled_count`.
    pub spilled_bytes: u64,
    /// Wall time data moved off the device (overlaps counted once).
    pub spill_seconds: f64,
    /// Moves off the device that copied nothing, as the host tier kept the copy of data brought
    /// back (stored values do not change); not in `spilled_count` nor the host tier's moves.
    pub spilled_without_copy_count: u64,
    /// See `spilled_without_copy_count`.
    pub spilled_without_copy_bytes: u64,
    /// Buffers brought back to the device; with `unspilled_bytes`.
    pub unspilled_count: u64,
    /// See `unspilled_count`.
    pub unspilled_bytes: u64,
    /// Wall time data came back (overlaps counted once).
    pub unspill_seconds: f64,
    /// Host bytes holding spilled data; with `host_pool_bytes`, the pinned pool's size now.
    pub host_bytes: u64,
    /// The part of `host_bytes` in pageable memory: spills that found no pinned room while the
    /// pool was pinning ahead went there rather than wait (copied at the driver's pageable rate).
    pub host_pageable_bytes: u64,
    /// Bytes ever spilled into pageable memory (see `host_pageable_bytes`).
    pub host_pageable_total_bytes: u64,
    /// Pinned host bytes holding copies of data back on the device (spilling it again copies
    /// nothing); given back first when room is needed.
    pub host_kept_bytes: u64,
    /// See `host_bytes`.
    pub host_pool_bytes: u64,
    /// Time spent pinning the host pool (at start, or as it grew).
    pub host_pinning_seconds: f64,
    /// The part of `host_pinning_seconds` spent registering with the driver (vs. faulting pages).
    pub host_registering_seconds: f64,
    /// Bytes held in spill files.
    pub disk_bytes: u64,
    /// The host tier's moves.
    pub host: TierStatistics,
    /// The disk tier's moves (all zero without `spill.disk_directory`).
    pub disk: TierStatistics,
    /// Received bytes (from a peer worker) that did not fit under the limit: off the device.
    pub received_off_device_bytes: u64,
    /// Bytes of values received from elsewhere that were put on the device (they fit).
    pub received_on_device_bytes: u64,
    /// Bytes brought back to the device only to be sent elsewhere (rebuilt there to serialize
    /// for a peer); 0 while spilled values are sent from their tier.
    pub unspilled_to_send_bytes: u64,
}

impl SpillStatistics {
    /// Bandwidth off the device in GB/s (0 when nothing was spilled).
    pub fn spill_gbps(&self) -> f64 {
        rate(self.spilled_bytes, self.spill_seconds)
    }

    /// Bandwidth back to the device in GB/s.
    pub fn unspill_gbps(&self) -> f64 {
        rate(self.unspilled_bytes, self.unspill_seconds)
    }
}

impl std::fmt::Display for SpillStatistics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = |x: u64| fmt_bytes(x as usize);
        writeln!(
            f,
            "spill: limit {}, tracked {} (peak {}); off the device {} buffers, {} at {:.1} GB/s (and {} without a copy); back {} buffers, {} at {:.1} GB/s",
            b(self.limit),
            b(self.tracked_bytes),
            b(self.peak_tracked_bytes),
            self.spilled_count,
            b(self.spilled_bytes),
            self.spill_gbps(),
            b(self.spilled_without_copy_bytes),
            self.unspilled_count,
            b(self.unspilled_bytes),
            self.unspill_gbps()
        )?;
        for (name, t, extra) in [
            (
                "host",
                &self.host,
                format!(
                    " (and {} of copies kept) of a {} pool, {} pageable",
                    b(self.host_kept_bytes),
                    b(self.host_pool_bytes),
                    b(self.host_pageable_bytes)
                ),
            ),
            ("disk", &self.disk, String::new()),
        ] {
            writeln!(
                f,
                "  {name}: holds {}{extra}; in {} ({}, {:.1} GB/s), out {} ({}, {:.1} GB/s)",
                b(t.held_bytes),
                t.spilled_count,
                b(t.spilled_bytes),
                t.spill_gbps(),
                t.unspilled_count,
                b(t.unspilled_bytes),
                t.unspill_gbps()
            )?;
        }
        Ok(())
    }
}

fn rate(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    }
}

/// Count, bytes and time of one kind of move. The time is wall time with at least one such
/// move copying (the union of their intervals): overlapping moves share the copy engines, so
/// adding their durations would count the same seconds several times.
#[derive(Default)]
pub(crate) struct Moves {
    count: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    /// The latest moves' intervals, merged: disjoint, in order.
    busy: Mutex<Busy>,
}

/// Disjoint intervals (start, end) in ns on [`clock_ns`]'s clock, oldest first: the latest
/// [`Busy::KEPT`] stretches during which moves ran.
#[derive(Default)]
struct Busy(std::collections::VecDeque<(u64, u64)>);

impl Busy {
    /// Intervals kept for merging: a move overlapping one already dropped counts in full.
    const KEPT: usize = 64;

    /// Adds `[start, end)`; the nanoseconds it adds to the union.
    fn add(&mut self, start: u64, end: u64) -> u64 {
        let (mut from, mut until) = (start, end);
        let mut covered = 0;
        // Merge every kept interval overlapping or touching the new one.
        let i = self.0.partition_point(|&(_, e)| e < start);
        while i < self.0.len() && self.0[i].0 <= end {
            let (s, e) = self.0[i];
            covered += e.min(end).saturating_sub(s.max(start));
            from = from.min(s);
            until = until.max(e);
            self.0.remove(i);
        }
        self.0.insert(i, (from, until));
        if self.0.len() > Self::KEPT {
            self.0.pop_front();
        }
        (end - start) - covered
    }
}

/// Nanoseconds since the first call (a monotonic clock for the intervals).
pub(crate) fn clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

impl Moves {
    /// A move of `bytes` that ended now after `nanos`.
    pub(crate) fn add(&self, bytes: usize, nanos: u64) {
        self.add_at(bytes, nanos, clock_ns());
    }

    /// A move of `bytes` that ended at `end` (on [`clock_ns`]'s clock) after `nanos`.
    pub(crate) fn add_at(&self, bytes: usize, nanos: u64, end: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let new = self.busy.lock().add(end.saturating_sub(nanos), end);
        self.nanos.fetch_add(new, Ordering::Relaxed);
    }

    /// (count, bytes, seconds) summed over `moves`.
    pub(crate) fn sum<'a>(moves: impl IntoIterator<Item = &'a Moves>) -> (u64, u64, f64) {
        moves.into_iter().fold((0, 0, 0.0), |(c, b, s), m| {
            (
                c + m.count.load(Ordering::Relaxed),
                b + m.bytes.load(Ordering::Relaxed),
                s + Duration::from_nanos(m.nanos.load(Ordering::Relaxed)).as_secs_f64(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seconds(m: &Moves) -> u64 {
        m.nanos.load(Ordering::Relaxed)
    }

    #[test]
    fn overlapping_moves_count_their_union_once() {
        let m = Moves::default();
        // [0,10) and [20,30): disjoint; [5,35) covers the gap between them and more.
        m.add_at(1, 10, 10);
        m.add_at(1, 10, 30);
        m.add_at(1, 30, 35);
        assert_eq!(seconds(&m), 35);
        // Inside what is covered: nothing new.
        m.add_at(1, 5, 25);
        assert_eq!(seconds(&m), 35);
        // Reported out of order: [90,100), then [40,50), then [35,95) over both.
        let m2 = Moves::default();
        m2.add_at(1, 10, 100);
        m2.add_at(1, 10, 50);
        m2.add_at(1, 60, 95);
        assert_eq!(seconds(&m2), 100 - 35);
        assert_eq!(Moves::sum([&m2]).0, 3);
    }

    #[test]
    fn disjoint_moves_add_up_and_old_stretches_are_dropped() {
        let m = Moves::default();
        for i in 0..(Busy::KEPT as u64 * 2) {
            m.add_at(1, 5, i * 10 + 5);
        }
        assert_eq!(seconds(&m), Busy::KEPT as u64 * 2 * 5);
        assert_eq!(m.busy.lock().0.len(), Busy::KEPT);
    }
}
