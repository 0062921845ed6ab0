//! The workload traces of the anchors document, and [`replay`], which times one against a
//! resource.
//!
//! A trace is a list of [`Op`]s: allocate this many bytes, or free the live block at this
//! index. Traces are generated ahead of time (the generator's cost is not measured) and are
//! deterministic: the same arguments give the same trace on every machine.

use std::time::Instant;

use rmm::allocator::backend::DevicePtr;
use rmm::allocator::resource::DeviceMemoryResource;
use rmm::allocator::{Result, StreamView};

/// 1 MiB.
pub const MIB: usize = 1 << 20;
/// 1 GiB.
pub const GIB: usize = 1 << 30;

/// One step of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Allocate this many bytes; the block joins the end of the live list.
    Alloc(usize),
    /// Free the live block at this index (swap-remove: the last live block takes its place).
    Free(usize),
}

/// A small, fast, deterministic pseudo-random generator (xorshift64*).
///
/// The state must not be zero (a zero state stays zero); the trace generators seed it with an
/// odd number.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number uniformly distributed in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `churn`: allocate 1 MiB and free it, `iterations` times (`2 × iterations` operations).
pub fn churn_trace(iterations: usize) -> Vec<Op> {
    (0..iterations)
        .flat_map(|_| [Op::Alloc(MIB), Op::Free(0)])
        .collect()
}

/// `random`: `steps` steps, each allocating a size drawn log-uniformly from `lo..hi` bytes
/// with probability 0.55 while the live bytes stay at or under `cap` (else, and always when
/// nothing is live, freeing a random live block); then every block still live is freed, so
/// the trace ends with nothing live.
///
/// `seed` picks the trace; the same arguments always give the same trace. `lo` and `hi` should
/// be positive with `lo <= hi`, and `cap` at least `hi` for allocations to happen at all.
pub fn random_trace(steps: usize, lo: usize, hi: usize, cap: usize, seed: u64) -> Vec<Op> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (llo, lhi) = ((lo.max(1) as f64).ln(), (hi.max(1) as f64).ln());
    let mut live: Vec<usize> = Vec::new();
    let mut live_bytes = 0usize;
    let mut ops = Vec::with_capacity(steps + steps / 2);
    for _ in 0..steps {
        let size = (llo + rng.unit() * (lhi - llo)).exp() as usize;
        if live.is_empty() || (rng.unit() < 0.55 && live_bytes + size <= cap) {
            // With nothing live the block is allocated even above `cap` (a trace that frees
            // with nothing live is impossible); keep it within the cap all the same.
            let size = if live.is_empty() {
                size.min(cap.max(1))
            } else {
                size
            };
            ops.push(Op::Alloc(size));
            live.push(size);
            live_bytes += size;
        } else {
            let i = (rng.next() % live.len() as u64) as usize;
            live_bytes -= live.swap_remove(i);
            ops.push(Op::Free(i));
        }
    }
    while !live.is_empty() {
        let i = live.len() - 1;
        live.pop();
        ops.push(Op::Free(i));
    }
    ops
}

/// The most bytes live at once over `ops` (what a resource must be able to hold).
///
/// Frees whose index is not live are ignored.
pub fn peak_bytes(ops: &[Op]) -> usize {
    let mut live: Vec<usize> = Vec::new();
    let (mut now, mut peak) = (0usize, 0usize);
    for op in ops {
        match *op {
            Op::Alloc(size) => {
                live.push(size);
                now += size;
                peak = peak.max(now);
            }
            Op::Free(i) if i < live.len() => now -= live.swap_remove(i),
            Op::Free(_) => {}
        }
    }
    peak
}

/// Replays `ops` against `mr` on `stream` and returns the wall time per operation in
/// nanoseconds.
///
/// Blocks still live at the end (a partial trace, as a warm-up pass uses) are freed after the
/// clock stops. On an allocation or free error the blocks allocated so far are freed (as far
/// as possible) and the first error is returned. A `Free` of an index that is not live is
/// skipped. The stream is not synchronized.
///
/// # Errors
/// The first allocation or free error of `mr` (e.g.
/// [`Error::OutOfMemory`](rmm::allocator::Error::OutOfMemory)).
pub fn replay(mr: &dyn DeviceMemoryResource, ops: &[Op], stream: StreamView) -> Result<f64> {
    let mut live: Vec<(DevicePtr, usize)> = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    let mut failed = None;
    for op in ops {
        match *op {
            Op::Alloc(size) => match mr.allocate(size, stream) {
                Ok(p) => live.push((p, size)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            },
            Op::Free(i) if i < live.len() => {
                let (p, size) = live.swap_remove(i);
                if let Err(e) = mr.deallocate(p, size, stream) {
                    failed = Some(e);
                    break;
                }
            }
            Op::Free(_) => {}
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / ops.len().max(1) as f64;
    // Give back what is live, untimed; the first error wins.
    for (p, size) in live {
        if let Err(e) = mr.deallocate(p, size, stream) {
            failed.get_or_insert(e);
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(ns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn churn_alternates_one_mib_allocations_and_frees() {
        let ops = churn_trace(3);
        assert_eq!(ops.len(), 6);
        for pair in ops.chunks(2) {
            assert_eq!(pair, [Op::Alloc(MIB), Op::Free(0)]);
        }
        assert_eq!(peak_bytes(&ops), MIB);
        assert!(churn_trace(0).is_empty());
    }

    #[test]
    fn random_trace_is_deterministic_and_seed_dependent() {
        let a = random_trace(5_000, 256, 16 * MIB, GIB, 7);
        assert_eq!(a, random_trace(5_000, 256, 16 * MIB, GIB, 7));
        assert_ne!(a, random_trace(5_000, 256, 16 * MIB, GIB, 8));
    }

    /// Every free names a live block, sizes stay in range, the peak stays within the cap and
    /// the trace ends with nothing live.
    #[test]
    fn random_trace_is_valid_and_stays_within_its_cap() {
        for (lo, hi, cap, seed) in [
            (256, 16 * MIB, 64 * MIB, 1),
            (8, 64 * 1024, MIB, 2),
            (256, 16 * MIB, 4 * GIB, 3),
        ] {
            let ops = random_trace(20_000, lo, hi, cap, seed);
            assert!(ops.len() >= 20_000);
            let mut live: Vec<usize> = Vec::new();
            let mut now = 0usize;
            let mut allocs = 0;
            for op in &ops {
                match *op {
                    Op::Alloc(size) => {
                        assert!((lo..=hi).contains(&size), "size {size} outside {lo}..={hi}");
                        live.push(size);
                        now += size;
                        allocs += 1;
                    }
                    Op::Free(i) => {
                        assert!(i < live.len(), "free of index {i} with {} live", live.len());
                        now -= live.swap_remove(i);
                    }
                }
            }
            assert!(live.is_empty() && now == 0);
            assert!(allocs > 5_000, "{allocs} allocations");
            let peak = peak_bytes(&ops);
            assert!(peak <= cap, "peak {peak} above cap {cap}");
            // A small cap is reached: the trace does press against it.
            if cap <= 64 * MIB {
                assert!(peak > cap / 2, "peak {peak}, cap {cap}");
            }
        }
    }

    #[test]
    fn rng_is_deterministic_and_unit_is_in_range() {
        let (mut a, mut b) = (Rng(12345), Rng(12345));
        for _ in 0..1_000 {
            assert_eq!(a.next(), b.next());
            let u = a.unit();
            assert!((0.0..1.0).contains(&u));
            b.unit();
        }
    }
}
