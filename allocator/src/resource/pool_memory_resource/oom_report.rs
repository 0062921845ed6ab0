//! The pool's figures for people: [`PoolUsage`] (attached to out-of-memory errors, read by the
//! statistics report) and the message explaining a failure and what to try. Figures are taken after
//! the pool's own attempts, so free memory left in arenas is what those could not move.

use std::fmt::Write as _;

use super::PoolMemoryResource;
use crate::error::fmt_bytes;
use crate::pool_usage::{LISTED_STREAMS, PoolUsage, StreamUsage};

impl PoolUsage {
    /// 1 − largest free block / free bytes: 0 for one free block (or none), near 1 for many pieces.
    pub fn fragmentation(&self) -> f64 {
        fragmentation(self.largest_free as u64, self.free as u64)
    }

    /// One line for people: reserved, in use, free, largest free block, fragmentation and
    /// arenas (what `rmm replay` and the runtime report print for a pool).
    pub fn summary(&self) -> String {
        format!(
            "reserved {}{}, in use {}, free {} (largest block {}, fragmentation {:.1}%), \
             {} arenas",
            fmt_bytes(self.pool_size),
            self.of_maximum(),
            fmt_bytes(self.in_use),
            fmt_bytes(self.free),
            fmt_bytes(self.largest_free),
            self.fragmentation() * 100.0,
            self.arenas
        )
    }

    /// " of maximum <size>" when the pool has a maximum.
    fn of_maximum(&self) -> String {
        let maximum = self.maximum_size.map(fmt_bytes);
        maximum.map_or_else(String::new, |m| format!(" of maximum {m}"))
    }

    /// An OOM error's pool figures and advice for `requested` bytes (after the device figures).
    pub fn explain(&self, requested: usize) -> String {
        let mut s = format!(
            "; pool holds {}{} with {} in use and {} free (largest free block {}, \
             fragmentation {:.0}%): {} unassigned, {} in {} arenas' heaps of which {} cached, \
             {} waiting for other streams",
            fmt_bytes(self.pool_size),
            self.of_maximum(),
            fmt_bytes(self.in_use),
            fmt_bytes(self.free),
            fmt_bytes(self.largest_free),
            self.fragmentation() * 100.0,
            fmt_bytes(self.unassigned),
            fmt_bytes(self.free.saturating_sub(self.unassigned)),
            self.arenas,
            fmt_bytes(self.cached),
            fmt_bytes(self.pending),
        );
        if !self.streams.is_empty() {
            s += "; free per stream:";
            for (i, st) in self.streams.iter().enumerate() {
                let _ = write!(
                    s,
                    "{} stream {:#x} {} ({} cached, {} in use, {} arena{})",
                    if i == 0 { "" } else { "," },
                    st.stream,
                    fmt_bytes(st.free),
                    fmt_bytes(st.cached),
                    fmt_bytes(st.in_use),
                    st.arenas,
                    if st.arenas == 1 { "" } else { "s" }
                );
            }
            if self.more_streams > 0 {
                let _ = write!(s, " and {} more streams", self.more_streams);
            }
        }
        s += ". To try: ";
        s += &self.advice(requested).join("; ");
        s
    }

    /// What to try, most useful first.
    fn advice(&self, requested: usize) -> Vec<String> {
        if let Some(m) = self.maximum_size.filter(|&m| requested > m) {
            return vec![format!(
                "the request is larger than the pool's maximum size {}: raise pool.maximum_size",
                fmt_bytes(m)
            )];
        }
        let mut tips = Vec::new();
        let grown = self.pool_size.saturating_add(requested);
        let at_maximum = self.maximum_size.is_some_and(|m| grown > m);
        if self.free >= requested {
            tips.push(format!(
                "{} is free but no block is large enough: use fewer streams (or threads per \
                 stream) so that free memory is not split over many arenas, or allocate \
                 large buffers first",
                fmt_bytes(self.free)
            ));
        }
        if at_maximum {
            tips.push(
                "the pool is at its maximum size: raise pool.maximum_size if the device \
                 has room"
                    .into(),
            );
        } else {
            tips.push(format!(
                "the device could not give the pool {} more: trim() idle pools and other \
                 users of the device, or set a pool.maximum_size that leaves them room",
                fmt_bytes(requested)
            ));
        }
        tips.push("free or spill live buffers".into());
        tips
    }
}

/// 1 − `largest` / `free` (0 when nothing is free).
pub(crate) fn fragmentation(largest: u64, free: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - largest.min(free) as f64 / free as f64
    }
}

impl PoolMemoryResource {
    /// The pool's figures: what the out-of-memory error and the statistics report show.
    /// Takes the pool's lock and every arena's in turn (not for hot paths).
    pub fn usage(&self) -> PoolUsage {
        let g = self.global.lock();
        let mut u = PoolUsage {
            pool_size: g.pool_size as usize,
            peak_pool_size: g.peak_pool_size() as usize,
            largest_free: g.largest_free() as usize,
            maximum_size: Some(self.maximum as usize),
            free: g.free_bytes as usize,
            unassigned: g.free_bytes as usize,
            growth: self.growth as usize,
            device_allocations: g.device_allocations,
            device_frees: g.device_frees,
            ..PoolUsage::default()
        };
        let mut streams: Vec<StreamUsage> = Vec::new();
        for arena in self.arenas.all() {
            let f = arena.state.lock().figures();
            u.arenas += 1;
            u.in_use += f.in_use as usize;
            u.free += f.free_bytes as usize;
            u.cached += f.cached_bytes as usize;
            u.pending += f.pending_bytes as usize;
            u.largest_free = u.largest_free.max(f.largest_free as usize);
            let i = streams.iter().position(|s| s.stream == arena.stream);
            let i = i.unwrap_or_else(|| {
                streams.push(StreamUsage {
                    stream: arena.stream,
                    ..StreamUsage::default()
                });
                streams.len() - 1
            });
            let s = &mut streams[i];
            s.arenas += 1;
            s.in_use += f.in_use as usize;
            s.free += f.free_bytes as usize;
            s.cached += f.cached_bytes as usize;
            s.largest_free = s.largest_free.max(f.largest_free as usize);
        }
        streams.retain(|s| s.free > 0);
        streams.sort_by_key(|s| std::cmp::Reverse(s.free));
        u.more_streams = streams.len().saturating_sub(LISTED_STREAMS);
        streams.truncate(LISTED_STREAMS);
        u.streams = streams;
        drop(g);
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn usage() -> PoolUsage {
        PoolUsage {
            pool_size: 256 * MIB,
            peak_pool_size: 256 * MIB,
            in_use: 160 * MIB,
            largest_free: 48 * MIB,
            maximum_size: Some(256 * MIB),
            free: 96 * MIB,
            unassigned: 16 * MIB,
            cached: 8 * MIB,
            pending: 0,
            arenas: 3,
            streams: vec![StreamUsage {
                stream: 0x1234,
                arenas: 1,
                in_use: 64 * MIB,
                free: 48 * MIB,
                cached: 8 * MIB,
                largest_free: 48 * MIB,
            }],
            more_streams: 1,
            growth: 1024 * MIB,
            device_allocations: 1,
            device_frees: 0,
        }
    }

    #[test]
    fn fragmentation_is_one_minus_largest_over_free() {
        assert_eq!(usage().fragmentation(), 0.5);
        assert_eq!(fragmentation(0, 0), 0.0);
        assert_eq!(fragmentation(10, 10), 0.0);
    }

    #[test]
    fn the_explanation_names_every_figure_and_what_to_try() {
        let s = usage().explain(80 * MIB);
        for part in [
            "pool holds 256.00 MiB of maximum 256.00 MiB",
            "160.00 MiB in use",
            "96.00 MiB free",
            "largest free block 48.00 MiB",
            "fragmentation 50%",
            "16.00 MiB unassigned",
            "80.00 MiB in 3 arenas' heaps of which 8.00 MiB cached",
            "stream 0x1234 48.00 MiB (8.00 MiB cached, 64.00 MiB in use, 1 arena)",
            "and 1 more streams",
            "fewer streams",
            "raise pool.maximum_size",
        ] {
            assert!(s.contains(part), "{part:?} missing from {s}");
        }
    }

    #[test]
    fn the_summary_shows_reserved_against_in_use_and_the_fragmentation() {
        assert_eq!(
            usage().summary(),
            "reserved 256.00 MiB of maximum 256.00 MiB, in use 160.00 MiB, free 96.00 MiB \
             (largest block 48.00 MiB, fragmentation 50.0%), 3 arenas"
        );
    }

    #[test]
    fn a_request_above_the_maximum_says_so() {
        let s = usage().explain(300 * MIB);
        assert!(s.contains("larger than the pool's maximum size"), "{s}");
    }

    #[test]
    fn a_pool_below_its_maximum_points_at_the_device() {
        let mut u = usage();
        u.maximum_size = Some(1024 * MIB);
        u.free = 10 * MIB;
        let s = u.explain(80 * MIB);
        assert!(s.contains("trim() idle pools"), "{s}");
        assert!(!s.contains("no block is large enough"), "{s}");
    }
}
