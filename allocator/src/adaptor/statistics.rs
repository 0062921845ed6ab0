//! [`StatisticsResourceAdaptor`]: current, peak and total bytes and allocation counts, with
//! RMM's counter scopes and a report in the shape PyTorch's `memory_stats` has.
//!
//! # Current and total figures
//! Every thread that uses an adaptor gets its own cache-line-sized *shard*, found through a
//! small thread-local cache. Only that thread writes the shard's counters (bytes and
//! allocations handed out and given back: plain loads and stores, no read-modify-write).
//! Current and total figures are the sums of the shards, read when asked for: they are exact.
//!
//! # The exact peak (the default, as in RMM)
//! A peak is the maximum of a sum that no shard sees alone. Rather than one shared counter
//! (one contended cache line written by every operation of every thread), the adaptor keeps
//! the *headroom* `peak − current`, split between the threads and a pool:
//!
//! * each shard holds a headroom word (bytes and allocations, packed in one `u64`). An
//!   allocation takes its bytes and one allocation from its thread's word, a free gives them
//!   back: one compare-and-swap on the thread's own cache line, nothing shared.
//! * the rest of the headroom sits in a pool behind a spin lock. A thread whose headroom is
//!   short (or that holds more than 4 times its last share, and over 16 MiB or 256
//!   allocations, after frees) takes the lock, puts its word into the pool and draws a new
//!   share: the pool divided by the number of threads (16 at most).
//! * when the pool is short as well, the thread *freezes* every shard's word: swapping a
//!   marker in collects the headroom into the pool and makes each owner's next operation wait
//!   for the lock. The pool then holds all of the headroom, so the current value is exactly
//!   `peak − pool`; if the allocation still does not fit, the peak is raised by the shortfall,
//!   to exactly the current value after the allocation. The words are thawed (empty) before
//!   the lock is released.
//!
//! Invariant, for bytes and for allocations alike: current + headroom held by the threads +
//! pool = peak, with every term non-negative.
//!
//! **Guarantee.** Every allocation and free takes effect at one instant inside the adaptor's
//! call (after the upstream returned): its compare-and-swap, or a point under the lock. These
//! instants order the operations consistently with real time (one that returned before another
//! was called takes effect first; an owner that meets a frozen word waits, so no operation
//! that takes effect after a freeze is counted before one that took effect before it). The
//! peak is the maximum of the live sum over that order: never lower than the sum at any
//! instant (a sum above the peak would need negative headroom), and never higher than a sum
//! that held at one instant (a raise sets the peak to the exact current value, with every
//! thread's headroom collected). This is RMM's exact peak, whose order is that of its mutex.
//! A peak read while other threads allocate is the peak at some instant during the read.
//!
//! **Cost.** One uncontended compare-and-swap per operation on the thread's own line (a few
//! ns) besides the counting; the lock only when a thread's share runs out. How often depends
//! on how close the live sum runs to its peak: on `benches/adaptors.rs`'s 8-thread random
//! workload, which hovers within a few percent of its peak, about 4% of operations take the
//! lock and 0.4% freeze. A freeze touches every shard (one cache line per thread that used the
//! adaptor) twice. Measured there (simulated device, on the H200 machine's host): 14 ns per
//! operation at 8 threads against 10 for the approximate peak and 57–72 for the shared counter
//! this replaced; single-threaded, 3–4 ns more than the approximate peak.
//!
//! # The approximate peak
//! [`StatisticsResourceAdaptor::with_peak_tolerance`] with a non-zero tolerance keeps no
//! headroom: each shard adds what changed since it last published (its *pending* delta) to one
//! shared figure, then raises the shared peak with `fetch_max` when the figure passed it:
//! * while a single thread uses the adaptor, only on an allocation that takes the figure past
//!   the current peak (exact);
//! * once several threads use it, when a shard's pending delta reaches the tolerance (or 64
//!   allocations) either way. The shared figure is then within `threads × tolerance` of the
//!   true sum, so the peak may read that much low or high (never above the sum of each
//!   thread's own peak).
//!
//! Threads beyond [`MAX_SHARDS`] share one overflow shard with atomic adds and trade with the
//! pool (or publish) at every operation: still exact, slower.

use std::any::Any;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::thread::ThreadId;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::failure_callback::FailureCallbackResourceAdaptor;
use super::{Upstream, chain, chain_names, find_in_chain, same_adaptor};
use crate::backend::{DevicePtr, MemInfo};
use crate::device::Device;
use crate::error::{Error, Result, fmt_bytes};
use crate::resource::{DeviceMemoryResource, PoolMemoryResource};
use crate::stream::StreamView;

/// Threads with a shard of their own; more share an overflow shard.
pub const MAX_SHARDS: usize = 128;
/// A peak tolerance for [`StatisticsResourceAdaptor::with_peak_tolerance`] when an
/// approximate peak is enough (it was the default before the exact peak was cheap).
pub const DEFAULT_PEAK_TOLERANCE: usize = 16 << 20;
/// Pending allocation-count delta that makes a shard publish, with a non-zero tolerance.
const COUNT_TOLERANCE: i64 = 64;
const OVERFLOW: u32 = u32::MAX;
const CACHE_SLOTS: usize = 4;

// A shard's headroom word (exact peak): bytes in bits 0..48, allocations in bits 48..63 and
// `FROZEN` in bit 63. A frozen word holds no headroom and fails both fast paths.
const HR_BYTES: u64 = (1 << 48) - 1;
const HR_ONE: u64 = 1 << 48;
const HR_COUNT_MAX: u64 = (1 << 15) - 1;
const FROZEN: u64 = 1 << 63;
/// A share drawn from the pool is at most the pool over this many threads...
const SHARES_MAX: i64 = 16;
/// ...and at most this large (so that `KEEP_FACTOR` times it fits its field).
const GRANT_BYTES_MAX: i64 = 1 << 44;
const GRANT_COUNT_MAX: i64 = 4095;
/// A thread returns headroom to the pool when frees take it past this many times its last
/// share, or past the floors below, whichever is more.
const KEEP_FACTOR: i64 = 4;
const KEEP_FLOOR_BYTES: i64 = 16 << 20;
const KEEP_FLOOR_COUNT: i64 = 256;
/// Busy-wait rounds on the pool's lock before yielding the processor between looks.
const SPINS: u32 = 64;

const fn hr_pack(bytes: i64, count: i64) -> u64 {
    ((count as u64) << 48) | bytes as u64
}

/// RMM's `counter`: a current value, its peak, and the sum of everything added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Counter {
    /// Current value (may be negative inside a scope that freed memory allocated before it).
    pub value: i64,
    /// Highest value seen.
    pub peak: i64,
    /// Sum of all increments.
    pub total: i64,
}

#[derive(Default)]
#[repr(align(128))]
struct Shard {
    /// Bytes and allocations handed out, and given back, through this thread. Each
    /// operation stores two of the four; current = handed out - given back.
    alloc_bytes: AtomicI64,
    alloc_count: AtomicI64,
    freed_bytes: AtomicI64,
    freed_count: AtomicI64,
    /// Approximate peak: the current figures as last added to the shared ones.
    published_bytes: AtomicI64,
    published_count: AtomicI64,
    /// Exact peak: this thread's headroom word. The owner changes it with compare-and-swap
    /// (never when frozen); the holder of the pool's lock swaps or stores it.
    headroom: AtomicU64,
    /// Exact peak: the headroom (same packing) past which a free trades with the pool.
    /// Written by the owner under the pool's lock, read by the owner.
    keep: AtomicU64,
}

impl Shard {
    /// (current bytes, current count, total bytes, total count), read by any thread.
    fn read(&self) -> Sums {
        // Given back first: both only grow, so current is never under-read.
        let freed_bytes = self.freed_bytes.load(Ordering::Acquire);
        let freed_count = self.freed_count.load(Ordering::Acquire);
        let alloc_bytes = self.alloc_bytes.load(Ordering::Acquire);
        let alloc_count = self.alloc_count.load(Ordering::Acquire);
        Sums {
            bytes: alloc_bytes - freed_bytes,
            count: alloc_count - freed_count,
            total_bytes: alloc_bytes,
            total_count: alloc_count,
        }
    }
}

/// Adds `d` to `a`, which only this thread writes, and returns the new value.
#[inline(always)]
fn bump(a: &AtomicI64, d: i64) -> i64 {
    let v = a.load(Ordering::Relaxed).wrapping_add(d);
    a.store(v, Ordering::Relaxed);
    v
}

#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    bytes: i64,
    count: i64,
    total_bytes: i64,
    total_count: i64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Frame {
    base: Sums,
    saved_peak_bytes: i64,
    saved_peak_count: i64,
}

/// Exact peak: the headroom no thread holds (a copy, taken under the pool's lock).
#[derive(Debug, Default)]
struct Pool {
    bytes: i64,
    count: i64,
}

/// The pool and the lock that guards it, on one cache line: a spin lock, as every critical
/// section is short and bounded (at most two stores per shard, no allocation, no system call),
/// so waiting threads must not be parked and woken (microseconds each, which piled up into
/// convoys under 8 threads with a parking mutex). A waiter yields the processor after a few
/// dozen rounds, should the holder have been descheduled.
#[derive(Debug, Default)]
struct PoolLock {
    locked: AtomicBool,
    bytes: AtomicI64,
    count: AtomicI64,
}

impl PoolLock {
    fn lock(&self) -> PoolGuard<'_> {
        let mut spins = 0;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        PoolGuard {
            pool: Pool {
                bytes: self.bytes.load(Ordering::Relaxed),
                count: self.count.load(Ordering::Relaxed),
            },
            lock: self,
        }
    }
}

/// Holds the pool's lock; the pool is written back when it is dropped.
struct PoolGuard<'a> {
    lock: &'a PoolLock,
    pool: Pool,
}

impl std::ops::Deref for PoolGuard<'_> {
    type Target = Pool;
    fn deref(&self) -> &Pool {
        &self.pool
    }
}

impl std::ops::DerefMut for PoolGuard<'_> {
    fn deref_mut(&mut self) -> &mut Pool {
        &mut self.pool
    }
}

impl Drop for PoolGuard<'_> {
    fn drop(&mut self) {
        self.lock.bytes.store(self.pool.bytes, Ordering::Relaxed);
        self.lock.count.store(self.pool.count, Ordering::Relaxed);
        self.lock.locked.store(false, Ordering::Release);
    }
}

impl Pool {
    /// Adds a headroom word taken from a shard (a frozen one holds nothing).
    fn take(&mut self, word: u64) {
        if word & FROZEN == 0 {
            self.bytes += (word & HR_BYTES) as i64;
            self.count += (word >> 48) as i64;
        }
    }
}

thread_local! {
    static SLOT_CACHE: [Cell<(u64, u32)>; CACHE_SLOTS] =
        const { [const { Cell::new((0, 0)) }; CACHE_SLOTS] };
    static NEXT_VICTIM: Cell<usize> = const { Cell::new(0) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Counts bytes and allocations through it (RMM's `statistics_resource_adaptor`). See the
/// module documentation for the counting scheme and the peak's guarantee.
///
/// The upstream is usually a [`SharedResource`](crate::per_device::SharedResource)
/// (`Arc<dyn DeviceMemoryResource>`, the default type parameter). Given an `Arc` of a concrete
/// resource, e.g. `Arc<PoolMemoryResource>`, the adaptor calls it without dynamic dispatch,
/// which saves the cost of one adaptor layer on the hot path.
#[repr(C, align(128))]
pub struct StatisticsResourceAdaptor<U: Upstream + ?Sized = dyn DeviceMemoryResource> {
    // Read by every operation: kept together, in the first 128 bytes.
    upstream: Arc<U>,
    shards: Box<[Shard]>,
    id: u64,
    /// Threads that have used the adaptor (changed under the pool's lock).
    threads: AtomicUsize,
    /// 0: exact peak.
    tolerance_bytes: i64,
    tolerance_count: i64,
    /// Peak since the innermost scope was pushed (absolute units). With the exact peak,
    /// written only under the pool's lock.
    run_peak_bytes: AtomicI64,
    run_peak_count: AtomicI64,
    // Written when shards publish or trade: a block of its own.
    shared: Shared,
    overflow: Shard,
    registry: Mutex<HashMap<ThreadId, u32>>,
    scopes: Mutex<Vec<Frame>>,
    ooms: AtomicU64,
    failures: AtomicU64,
}

/// The figures shards publish or trade with, apart from the read-mostly fields.
#[derive(Default)]
#[repr(align(128))]
struct Shared {
    /// Exact peak: the pool of headroom. Its lock also orders thread registration.
    pool: PoolLock,
    /// Approximate peak: sum of the figures the shards published.
    published_bytes: AtomicI64,
    published_count: AtomicI64,
    /// Peak since the adaptor was made.
    life_peak_bytes: AtomicI64,
    life_peak_count: AtomicI64,
}

impl<U: Upstream + ?Sized> fmt::Debug for StatisticsResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatisticsResourceAdaptor")
            .field("upstream", &self.upstream.name())
            .field("bytes", &self.bytes_counter())
            .field("allocations", &self.allocations_counter())
            .finish_non_exhaustive()
    }
}

impl<U: Upstream + ?Sized> StatisticsResourceAdaptor<U> {
    /// Counts what goes through to `upstream`, with an exact peak (see the module
    /// documentation).
    pub fn new(upstream: Arc<U>) -> Self {
        Self::with_peak_tolerance(upstream, 0)
    }

    /// As [`StatisticsResourceAdaptor::new`], with a peak that may be off by up to `bytes`
    /// per thread once several threads use the adaptor (0: the exact peak of
    /// [`StatisticsResourceAdaptor::new`]). See the module documentation.
    pub fn with_peak_tolerance(upstream: Arc<U>, bytes: usize) -> Self {
        let tolerance_bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        StatisticsResourceAdaptor {
            upstream,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            tolerance_bytes,
            tolerance_count: if tolerance_bytes == 0 {
                0
            } else {
                COUNT_TOLERANCE
            },
            shards: (0..MAX_SHARDS).map(|_| Shard::default()).collect(),
            overflow: Shard::default(),
            threads: AtomicUsize::new(0),
            registry: Mutex::new(HashMap::new()),
            run_peak_bytes: AtomicI64::new(0),
            run_peak_count: AtomicI64::new(0),
            shared: Shared::default(),
            scopes: Mutex::new(vec![Frame::default()]),
            ooms: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &Arc<U> {
        &self.upstream
    }

    /// The peak tolerance in bytes: 0 for the exact peak (see the module documentation).
    pub fn peak_tolerance(&self) -> usize {
        self.tolerance_bytes as usize
    }

    #[inline(always)]
    fn exact(&self) -> bool {
        self.tolerance_bytes == 0
    }

    /// This thread's shard (`None`: the overflow shard).
    #[inline(always)]
    fn shard(&self) -> Option<&Shard> {
        let id = self.id;
        let slot = SLOT_CACHE.with(|c| {
            c.iter().find_map(|e| {
                let (i, s) = e.get();
                (i == id).then_some(s)
            })
        });
        let slot = match slot {
            Some(s) => s,
            None => self.register_thread(),
        };
        self.shards.get(slot as usize)
    }

    /// Counts an allocation: with the exact peak, one compare-and-swap on this thread's
    /// headroom and two plain stores; else two plain stores and a shared write only when the
    /// figures must be published (see the module documentation).
    #[inline(always)]
    fn record_alloc(&self, bytes: i64) {
        let Some(s) = self.shard() else {
            return self.update_overflow(bytes, 1);
        };
        if self.exact() {
            // Headroom first: the shard's current figure never runs ahead of the peak.
            self.take_headroom(s, bytes);
            bump(&s.alloc_bytes, bytes);
            bump(&s.alloc_count, 1);
            return;
        }
        let cur_bytes = bump(&s.alloc_bytes, bytes) - s.freed_bytes.load(Ordering::Relaxed);
        let cur_count = bump(&s.alloc_count, 1) - s.freed_count.load(Ordering::Relaxed);
        let publish = if self.threads.load(Ordering::Relaxed) <= 1 {
            // The only shard: its figures are the adaptor's. Publish only a new peak.
            cur_bytes > self.run_peak_bytes.load(Ordering::Relaxed)
                || cur_count > self.run_peak_count.load(Ordering::Relaxed)
        } else {
            self.past_tolerance(s, cur_bytes, cur_count)
        };
        if publish {
            self.publish(s, cur_bytes, cur_count);
        }
    }

    /// Counts a free: two plain stores, and with the exact peak one compare-and-swap on this
    /// thread's headroom; nothing shared while one thread uses an approximate adaptor.
    #[inline(always)]
    fn record_free(&self, bytes: i64) {
        let Some(s) = self.shard() else {
            return self.update_overflow(-bytes, -1);
        };
        let freed_bytes = bump(&s.freed_bytes, bytes);
        let freed_count = bump(&s.freed_count, 1);
        if self.exact() {
            self.give_headroom(s, bytes);
        } else if self.threads.load(Ordering::Relaxed) > 1 {
            let cur_bytes = s.alloc_bytes.load(Ordering::Relaxed) - freed_bytes;
            let cur_count = s.alloc_count.load(Ordering::Relaxed) - freed_count;
            if self.past_tolerance(s, cur_bytes, cur_count) {
                self.publish(s, cur_bytes, cur_count);
            }
        }
    }

    /// Exact peak: takes `bytes` and one allocation from this thread's headroom, or trades
    /// with the pool when it holds too little (or is frozen).
    #[inline(always)]
    fn take_headroom(&self, s: &Shard, bytes: i64) {
        let b = bytes as u64;
        let mut w = s.headroom.load(Ordering::Relaxed);
        loop {
            // The count field must be in 1..=HR_COUNT_MAX: not empty, not frozen.
            if (w >> 48).wrapping_sub(1) >= HR_COUNT_MAX || (w & HR_BYTES) < b {
                return self.trade(Some(s), bytes, true);
            }
            match s.headroom.compare_exchange_weak(
                w,
                w - b - HR_ONE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => w = now,
            }
        }
    }

    /// Exact peak: gives `bytes` and one allocation back to this thread's headroom, or trades
    /// with the pool when that would take it past its keep limit (or it is frozen).
    #[inline(always)]
    fn give_headroom(&self, s: &Shard, bytes: i64) {
        let b = bytes as u64;
        let keep = s.keep.load(Ordering::Relaxed);
        let mut w = s.headroom.load(Ordering::Relaxed);
        loop {
            // A frozen word's count field is above any keep limit.
            if (w & HR_BYTES) + b > (keep & HR_BYTES) || (w >> 48) >= (keep >> 48) {
                return self.trade(Some(s), bytes, false);
            }
            match s.headroom.compare_exchange_weak(
                w,
                w + b + HR_ONE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => w = now,
            }
        }
    }

    /// Exact peak, under the pool's lock: puts this thread's headroom into the pool, applies
    /// the operation to the pool (freezing every shard and raising the peak when an
    /// allocation does not fit), and draws a new share. `shard` is `None` for the overflow
    /// shard, which holds no headroom.
    #[cold]
    #[inline(never)]
    fn trade(&self, shard: Option<&Shard>, bytes: i64, alloc: bool) {
        let mut pool = self.shared.pool.lock();
        if let Some(s) = shard {
            // Words are frozen only while the lock is held: this one is not.
            pool.take(s.headroom.swap(0, Ordering::Relaxed));
        }
        if alloc {
            if pool.bytes < bytes || pool.count < 1 {
                let frozen = self.freeze_all(&mut pool);
                self.raise_to_fit(&mut pool, bytes, 1);
                self.thaw(frozen);
            }
            pool.bytes -= bytes;
            pool.count -= 1;
        } else {
            pool.bytes = pool.bytes.saturating_add(bytes);
            pool.count += 1;
        }
        if let Some(s) = shard {
            self.draw_share(&mut pool, s);
        }
    }

    /// Freezes every shard's headroom word, moving what the words held into the pool, and
    /// returns how many shards it froze (the first ones). The pool then holds all the
    /// headroom: peak − pool is the exact current value. An owner that meets its frozen word
    /// waits for the lock; [`Self::thaw`] empties the words before the lock is released.
    fn freeze_all(&self, pool: &mut Pool) -> usize {
        // Registration takes the pool's lock too: no shard appears during the freeze.
        let n = self.threads.load(Ordering::Relaxed).min(MAX_SHARDS);
        for s in &self.shards[..n] {
            pool.take(s.headroom.swap(FROZEN, Ordering::Relaxed));
        }
        n
    }

    /// Thaws the first `n` shards' words, empty: their owners' frees go on without the lock,
    /// their allocations draw a new share.
    fn thaw(&self, n: usize) {
        for s in &self.shards[..n] {
            s.headroom.store(0, Ordering::Relaxed);
        }
    }

    /// With every shard frozen, raises the peak just enough for the pool to hold `bytes`
    /// and `count` more: to exactly the current value after the allocation.
    fn raise_to_fit(&self, pool: &mut Pool, bytes: i64, count: i64) {
        if pool.bytes < bytes {
            let peak = self.run_peak_bytes.load(Ordering::Relaxed) + (bytes - pool.bytes);
            self.run_peak_bytes.store(peak, Ordering::Relaxed);
            self.shared
                .life_peak_bytes
                .fetch_max(peak, Ordering::Relaxed);
            pool.bytes = bytes;
        }
        if pool.count < count {
            let peak = self.run_peak_count.load(Ordering::Relaxed) + (count - pool.count);
            self.run_peak_count.store(peak, Ordering::Relaxed);
            self.shared
                .life_peak_count
                .fetch_max(peak, Ordering::Relaxed);
            pool.count = count;
        }
    }

    /// Gives this thread's (emptied) word a share of the pool and sets its keep limit.
    fn draw_share(&self, pool: &mut Pool, s: &Shard) {
        let shares = (self.threads.load(Ordering::Relaxed) as i64).clamp(1, SHARES_MAX);
        let bytes = (pool.bytes / shares).clamp(0, GRANT_BYTES_MAX);
        let count = (pool.count / shares).clamp(0, GRANT_COUNT_MAX);
        pool.bytes -= bytes;
        pool.count -= count;
        s.keep.store(
            hr_pack(
                (bytes * KEEP_FACTOR).max(KEEP_FLOOR_BYTES),
                (count * KEEP_FACTOR).max(KEEP_FLOOR_COUNT),
            ),
            Ordering::Relaxed,
        );
        s.headroom.store(hr_pack(bytes, count), Ordering::Relaxed);
    }

    #[inline(always)]
    fn past_tolerance(&self, s: &Shard, cur_bytes: i64, cur_count: i64) -> bool {
        (cur_bytes - s.published_bytes.load(Ordering::Relaxed)).unsigned_abs()
            >= self.tolerance_bytes as u64
            || (cur_count - s.published_count.load(Ordering::Relaxed)).unsigned_abs()
                >= self.tolerance_count as u64
    }

    #[inline(never)]
    fn publish(&self, s: &Shard, cur_bytes: i64, cur_count: i64) {
        let db = cur_bytes - s.published_bytes.load(Ordering::Relaxed);
        let dc = cur_count - s.published_count.load(Ordering::Relaxed);
        s.published_bytes.store(cur_bytes, Ordering::Relaxed);
        s.published_count.store(cur_count, Ordering::Relaxed);
        self.publish_delta(db, dc);
    }

    fn publish_delta(&self, db: i64, dc: i64) {
        let b = self.shared.published_bytes.fetch_add(db, Ordering::Relaxed) + db;
        let c = self.shared.published_count.fetch_add(dc, Ordering::Relaxed) + dc;
        if b > self.run_peak_bytes.load(Ordering::Relaxed) {
            self.run_peak_bytes.fetch_max(b, Ordering::Relaxed);
            self.shared.life_peak_bytes.fetch_max(b, Ordering::Relaxed);
        }
        if c > self.run_peak_count.load(Ordering::Relaxed) {
            self.run_peak_count.fetch_max(c, Ordering::Relaxed);
            self.shared.life_peak_count.fetch_max(c, Ordering::Relaxed);
        }
    }

    /// Threads beyond [`MAX_SHARDS`] share one shard: atomic adds, and a trade with the pool
    /// (or a publication) at every operation. `count` is 1 for an allocation, -1 for a free.
    #[cold]
    #[inline(never)]
    fn update_overflow(&self, bytes: i64, count: i64) {
        let s = &self.overflow;
        let exact = self.exact();
        if count > 0 {
            if exact {
                self.trade(None, bytes, true);
            }
            s.alloc_bytes.fetch_add(bytes, Ordering::Relaxed);
            s.alloc_count.fetch_add(count, Ordering::Relaxed);
        } else {
            s.freed_bytes.fetch_add(-bytes, Ordering::Relaxed);
            s.freed_count.fetch_add(-count, Ordering::Relaxed);
            if exact {
                self.trade(None, -bytes, false);
            }
        }
        if !exact {
            self.publish_delta(bytes, count);
        }
    }

    #[cold]
    #[inline(never)]
    fn register_thread(&self) -> u32 {
        let me = std::thread::current().id();
        let slot = {
            // The pool's lock first: a freeze sees a fixed set of shards.
            let _pool = self.shared.pool.lock();
            let mut reg = self.registry.lock();
            let n = reg.len();
            *reg.entry(me).or_insert_with(|| {
                self.threads.fetch_add(1, Ordering::Relaxed);
                if n < MAX_SHARDS { n as u32 } else { OVERFLOW }
            })
        };
        let id = self.id;
        SLOT_CACHE.with(|c| {
            let victim = NEXT_VICTIM.with(|v| {
                let i = v.get();
                v.set((i + 1) % CACHE_SLOTS);
                i
            });
            c[victim].set((id, slot));
        });
        slot
    }

    fn sums(&self) -> Sums {
        let n = self.threads.load(Ordering::Acquire).min(MAX_SHARDS);
        let mut s = Sums::default();
        for shard in self.shards[..n]
            .iter()
            .chain(std::iter::once(&self.overflow))
        {
            let r = shard.read();
            s.bytes += r.bytes;
            s.count += r.count;
            s.total_bytes += r.total_bytes;
            s.total_count += r.total_count;
        }
        s
    }

    fn counters_of(&self, frame: &Frame, now: &Sums) -> (Counter, Counter) {
        let mut peak_bytes = self.run_peak_bytes.load(Ordering::Relaxed);
        let mut peak_count = self.run_peak_count.load(Ordering::Relaxed);
        if !self.exact() {
            // The published figure may lag the shards.
            peak_bytes = peak_bytes.max(now.bytes);
            peak_count = peak_count.max(now.count);
        }
        (
            Counter {
                value: now.bytes - frame.base.bytes,
                peak: (peak_bytes - frame.base.bytes).max(0),
                total: now.total_bytes - frame.base.total_bytes,
            },
            Counter {
                value: now.count - frame.base.count,
                peak: (peak_count - frame.base.count).max(0),
                total: now.total_count - frame.base.total_count,
            },
        )
    }

    fn top(&self) -> (Counter, Counter) {
        let scopes = self.scopes.lock();
        let frame = scopes.last().copied().unwrap_or_default();
        self.counters_of(&frame, &self.sums())
    }

    /// Bytes of the innermost counter scope: current, peak and total (RMM's
    /// `get_bytes_counter`). Sizes are the requested ones, not rounded.
    pub fn bytes_counter(&self) -> Counter {
        self.top().0
    }

    /// Allocations of the innermost counter scope (RMM's `get_allocations_counter`).
    pub fn allocations_counter(&self) -> Counter {
        self.top().1
    }

    /// The peak since the adaptor was made, from its two figures (`now`: the current value,
    /// which only the approximate peak may lag).
    fn life_peak(&self, life: &AtomicI64, run: &AtomicI64, now: i64) -> i64 {
        let peak = life
            .load(Ordering::Relaxed)
            .max(run.load(Ordering::Relaxed));
        if self.exact() { peak } else { peak.max(now) }
    }

    /// Bytes since the adaptor was made, whatever scopes were pushed.
    pub fn lifetime_bytes(&self) -> Counter {
        let s = self.sums();
        Counter {
            value: s.bytes,
            peak: self.life_peak(&self.shared.life_peak_bytes, &self.run_peak_bytes, s.bytes),
            total: s.total_bytes,
        }
    }

    /// Allocations since the adaptor was made, whatever scopes were pushed.
    pub fn lifetime_allocations(&self) -> Counter {
        let s = self.sums();
        Counter {
            value: s.count,
            peak: self.life_peak(&self.shared.life_peak_count, &self.run_peak_count, s.count),
            total: s.total_count,
        }
    }

    /// Starts a new innermost scope of zeroed counters; returns the (bytes, allocations)
    /// counters of the scope that was innermost before (RMM's `push_counters`).
    ///
    /// With the exact peak this freezes every thread's headroom (see the module
    /// documentation), so that the scope starts from the exact current value.
    pub fn push_counters(&self) -> (Counter, Counter) {
        let mut scopes = self.scopes.lock();
        let frame = scopes.last().copied().unwrap_or_default();
        let mut now = self.sums();
        let (before, saved_peak_bytes, saved_peak_count);
        if self.exact() {
            let mut pool = self.shared.pool.lock();
            let frozen = self.freeze_all(&mut pool);
            saved_peak_bytes = self.run_peak_bytes.load(Ordering::Relaxed);
            saved_peak_count = self.run_peak_count.load(Ordering::Relaxed);
            // All the headroom is in the pool: these are the current values at this instant.
            now.bytes = saved_peak_bytes - pool.bytes;
            now.count = saved_peak_count - pool.count;
            before = self.counters_of(&frame, &now);
            self.run_peak_bytes.store(now.bytes, Ordering::Relaxed);
            self.run_peak_count.store(now.count, Ordering::Relaxed);
            *pool = Pool::default();
            self.thaw(frozen);
        } else {
            before = self.counters_of(&frame, &now);
            saved_peak_bytes = self.run_peak_bytes.load(Ordering::Relaxed).max(now.bytes);
            saved_peak_count = self.run_peak_count.load(Ordering::Relaxed).max(now.count);
            self.shared
                .life_peak_bytes
                .fetch_max(now.bytes, Ordering::Relaxed);
            self.shared
                .life_peak_count
                .fetch_max(now.count, Ordering::Relaxed);
            self.run_peak_bytes.store(now.bytes, Ordering::Relaxed);
            self.run_peak_count.store(now.count, Ordering::Relaxed);
        }
        scopes.push(Frame {
            base: now,
            saved_peak_bytes,
            saved_peak_count,
        });
        before
    }

    /// Ends the innermost scope and returns its (bytes, allocations) counters; the enclosing
    /// scope takes its figures over (RMM's `pop_counters`). Fails when no scope was pushed.
    pub fn pop_counters(&self) -> Result<(Counter, Counter)> {
        let mut scopes = self.scopes.lock();
        if scopes.len() < 2 {
            return Err(Error::invalid_argument(
                "pop_counters",
                "the outermost counter scope",
                "a push_counters() before every pop_counters()",
            ));
        }
        let now = self.sums();
        let frame = scopes.pop().unwrap_or_default();
        let popped = self.counters_of(&frame, &now);
        if self.exact() {
            // The enclosing scope's peak is the higher of the two; the pool grows with it.
            let mut pool = self.shared.pool.lock();
            let bytes = self.run_peak_bytes.load(Ordering::Relaxed);
            let count = self.run_peak_count.load(Ordering::Relaxed);
            let (new_bytes, new_count) = (
                bytes.max(frame.saved_peak_bytes),
                count.max(frame.saved_peak_count),
            );
            pool.bytes += new_bytes - bytes;
            pool.count += new_count - count;
            self.run_peak_bytes.store(new_bytes, Ordering::Relaxed);
            self.run_peak_count.store(new_count, Ordering::Relaxed);
        } else {
            self.run_peak_bytes
                .fetch_max(frame.saved_peak_bytes.max(now.bytes), Ordering::Relaxed);
            self.run_peak_count
                .fetch_max(frame.saved_peak_count.max(now.count), Ordering::Relaxed);
        }
        Ok(popped)
    }

    /// Runs `f` in a scope of its own and returns its result with that scope's (bytes,
    /// allocations) counters.
    pub fn measure<R>(&self, f: impl FnOnce() -> R) -> (R, Counter, Counter) {
        self.push_counters();
        let r = f();
        let (bytes, allocations) = self.pop_counters().unwrap_or_default();
        (r, bytes, allocations)
    }

    /// Scopes pushed and not popped, plus one for the outermost.
    pub fn scope_depth(&self) -> usize {
        self.scopes.lock().len()
    }

    /// Allocations that failed with out-of-memory (PyTorch's `num_ooms`).
    pub fn out_of_memory_count(&self) -> u64 {
        self.ooms.load(Ordering::Relaxed)
    }

    /// Allocations that failed for another reason.
    pub fn failed_allocation_count(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// A report in the shape PyTorch users know: allocated vs reserved bytes (reserved from
    /// the first pool in the upstream chain), retries (by failure-callback adaptors in the
    /// chain) and out-of-memory errors.
    pub fn report(&self) -> MemoryReport {
        let pool =
            find_in_chain::<PoolMemoryResource>((*self.upstream).as_dyn()).map(|p| p.usage());
        let retries = chain((*self.upstream).as_dyn())
            .into_iter()
            .filter_map(|r| r.as_any().downcast_ref::<FailureCallbackResourceAdaptor>())
            .map(|f| f.retry_count())
            .sum();
        MemoryReport {
            device: self.upstream.device().ordinal(),
            resource: chain_names(self),
            allocated_bytes: self.lifetime_bytes(),
            allocations: self.lifetime_allocations(),
            reserved_bytes: pool.as_ref().map(|p| p.pool_size as u64),
            reserved_maximum_bytes: pool.as_ref().and_then(|p| p.maximum_size.map(|m| m as u64)),
            pool_in_use_bytes: pool.as_ref().map(|p| p.in_use as u64),
            cached_free_bytes: pool
                .as_ref()
                .map(|p| p.pool_size.saturating_sub(p.in_use) as u64),
            pool_free_bytes: pool.as_ref().map(|p| p.free as u64),
            largest_free_block: pool.as_ref().map(|p| p.largest_free as u64),
            fragmentation_permille: pool
                .as_ref()
                .map(|p| (p.fragmentation() * 1000.0).round() as u64),
            num_alloc_retries: retries,
            num_ooms: self.out_of_memory_count(),
            num_failed_allocations: self.failed_allocation_count(),
            peak_tolerance_bytes: self.tolerance_bytes as u64,
            threads: self.threads.load(Ordering::Relaxed) as u64,
        }
    }

    #[cold]
    #[inline(never)]
    fn count_failure(&self, e: &Error, bytes: usize) {
        if e.is_out_of_memory() || e.is_driver_out_of_memory() {
            self.ooms.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(
            device = self.upstream.device().ordinal(),
            requested = bytes,
            "statistics: allocation failed: {e}"
        );
    }
}

impl<U: Upstream + ?Sized> DeviceMemoryResource for StatisticsResourceAdaptor<U> {
    #[inline]
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        match self.upstream.allocate(bytes, stream) {
            Ok(p) => {
                if !p.is_null() {
                    self.record_alloc(bytes as i64);
                }
                Ok(p)
            }
            Err(e) => {
                self.count_failure(&e, bytes);
                Err(e)
            }
        }
    }

    #[inline]
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        let r = self.upstream.deallocate(ptr, bytes, stream);
        if r.is_ok() && !ptr.is_null() {
            self.record_free(bytes as i64);
        }
        r
    }

    fn device(&self) -> Device {
        self.upstream.device()
    }

    fn name(&self) -> &'static str {
        "StatisticsResourceAdaptor"
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        same_adaptor(self, other, |a: &Self| &a.upstream)
    }

    fn memory_info(&self) -> Result<MemInfo> {
        self.upstream.memory_info()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Memory figures of one statistics adaptor, in the shape of PyTorch's
/// `torch.cuda.memory_stats()` (see [`MemoryReport::memory_stats`] for its key names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Device ordinal.
    pub device: u32,
    /// The resource chain, e.g. `StatisticsResourceAdaptor > PoolMemoryResource > CudaMemoryResource`.
    pub resource: String,
    /// Bytes handed out through the adaptor (requested sizes): current, peak, total.
    pub allocated_bytes: Counter,
    /// Allocations through the adaptor: current, peak, total.
    pub allocations: Counter,
    /// Bytes the first pool in the chain holds from its upstream (PyTorch's reserved bytes).
    pub reserved_bytes: Option<u64>,
    /// That pool's maximum size.
    pub reserved_maximum_bytes: Option<u64>,
    /// Bytes in use in that pool, rounded as the pool hands them out (all its users).
    pub pool_in_use_bytes: Option<u64>,
    /// Reserved but not in use: cached by the pool.
    pub cached_free_bytes: Option<u64>,
    /// Bytes free in that pool, ready for requests (reserved − in use − blocks waiting for
    /// another stream's work).
    #[serde(default)]
    pub pool_free_bytes: Option<u64>,
    /// The largest free block of that pool: the largest request it can serve without growing.
    pub largest_free_block: Option<u64>,
    /// That pool's fragmentation in thousandths: 1000 × (1 − largest free block / free
    /// bytes); 0 when its free memory is one block ([`MemoryReport::fragmentation`]).
    #[serde(default)]
    pub fragmentation_permille: Option<u64>,
    /// Retries made by failure-callback adaptors in the chain (PyTorch's `num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory (PyTorch's `num_ooms`).
    pub num_ooms: u64,
    /// Allocations that failed otherwise.
    pub num_failed_allocations: u64,
    /// The peak tolerance in bytes (0: exact peaks).
    pub peak_tolerance_bytes: u64,
    /// Threads that used the adaptor.
    pub threads: u64,
}

impl MemoryReport {
    /// The pool's fragmentation, 1 − largest free block / free bytes, from 0 (all free
    /// memory in one block) toward 1 (many small pieces); `None` without a pool.
    pub fn fragmentation(&self) -> Option<f64> {
        self.fragmentation_permille.map(|f| f as f64 / 1000.0)
    }

    /// Pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"error\": \"serializing the report: {e}\"}}"))
    }

    /// The figures under PyTorch's `memory_stats()` key names (`allocated_bytes.all.current`,
    /// `reserved_bytes.all.current`, `num_ooms`, ...); pool figures only when there is a pool.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        let b = self.allocated_bytes;
        let a = self.allocations;
        m.insert("allocated_bytes.all.current".into(), b.value);
        m.insert("allocated_bytes.all.peak".into(), b.peak);
        m.insert("allocated_bytes.all.allocated".into(), b.total);
        m.insert("allocated_bytes.all.freed".into(), b.total - b.value);
        m.insert("allocation.all.current".into(), a.value);
        m.insert("allocation.all.peak".into(), a.peak);
        m.insert("allocation.all.allocated".into(), a.total);
        m.insert("allocation.all.freed".into(), a.total - a.value);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries as i64);
        m.insert("num_ooms".into(), self.num_ooms as i64);
        if let Some(r) = self.reserved_bytes {
            m.insert("reserved_bytes.all.current".into(), r as i64);
        }
        if let Some(c) = self.cached_free_bytes {
            m.insert("inactive_split_bytes.all.current".into(), c as i64);
        }
        if let Some(l) = self.largest_free_block {
            m.insert("largest_free_block".into(), l as i64);
        }
        if let Some(f) = self.pool_free_bytes {
            m.insert("pool_free_bytes".into(), f as i64);
        }
        if let Some(f) = self.fragmentation_permille {
            m.insert("fragmentation_permille".into(), f as i64);
        }
        m
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = |v: i64| {
            if v < 0 {
                format!("-{}", fmt_bytes(v.unsigned_abs() as usize))
            } else {
                fmt_bytes(v as usize)
            }
        };
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| fmt_bytes(v as usize));
        writeln!(
            f,
            "memory report, device {}: {}",
            self.device, self.resource
        )?;
        writeln!(
            f,
            "  allocated  {} current, {} peak, {} total",
            bytes(self.allocated_bytes.value),
            bytes(self.allocated_bytes.peak),
            bytes(self.allocated_bytes.total)
        )?;
        writeln!(
            f,
            "  allocations {} current, {} peak, {} total",
            self.allocations.value, self.allocations.peak, self.allocations.total
        )?;
        writeln!(
            f,
            "  reserved   {} (maximum {}), in use {}, cached {}, free {}, largest free block {}, \
             fragmentation {}",
            opt(self.reserved_bytes),
            opt(self.reserved_maximum_bytes),
            opt(self.pool_in_use_bytes),
            opt(self.cached_free_bytes),
            opt(self.pool_free_bytes),
            opt(self.largest_free_block),
            self.fragmentation()
                .map_or_else(|| "-".to_string(), |f| format!("{:.1}%", f * 100.0))
        )?;
        write!(
            f,
            "  retries {}, out-of-memory {}, other failures {}",
            self.num_alloc_retries, self.num_ooms, self.num_failed_allocations
        )
    }
}
