//! [`StatisticsResourceAdaptor`]: current, peak and total bytes and allocation counts, with RMM's
//! counter scopes and a report shaped like PyTorch's `memory_stats`.
//!
//! Each thread using an adaptor gets its own cache-line-sized *shard* (made 32 at a time as threads
//! arrive), which only it writes. Current and total figures are the shards' sums, read on demand:
//! exact. Threads beyond [`MAX_SHARDS`] share an overflow shard with atomic adds: exact, slower.
//!
//! * **The exact peak** (the default, as in RMM): the adaptor keeps the headroom `peak − current`,
//!   split between the shards and a spin-locked reserve (see `headroom.rs`).
//! * **The approximate peak** ([`StatisticsResourceAdaptor::with_peak_tolerance`], non-zero): a
//!   shard adds its change since it last published to one shared figure, raising the shared peak
//!   if it passed it; with one thread on each new peak (exact), with several when the change
//!   reaches the tolerance (or 64 allocations). The peak may then be off by `threads × tolerance`
//!   (never above the sum of each thread's own peak).

mod headroom;
mod report;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::thread::ThreadId;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use headroom::Reserve;
pub use report::MemoryReport;

use super::{Upstream, find_in_chain};
use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::resource::{DeviceMemoryResource, LiveBlock, PoolMemoryResource};
use crate::stream_view::StreamView;
use crate::sync::{GroupedSlots, SlotCache, SpinLock};

/// Threads with a shard of their own; more share an overflow shard.
pub const MAX_SHARDS: usize = SHARD_GROUP * SHARD_GROUPS;
/// Shards are made this many at a time: an adaptor used by one thread holds one group (4 KiB).
const SHARD_GROUP: usize = 32;
const SHARD_GROUPS: usize = 4;
type Shards = GroupedSlots<Shard, SHARD_GROUP, SHARD_GROUPS>;
/// A tolerance for [`StatisticsResourceAdaptor::with_peak_tolerance`] when approximate peaks do.
pub const DEFAULT_PEAK_TOLERANCE: usize = 16 << 20;
/// Pending allocation-count delta that makes a shard publish, with a non-zero tolerance.
const COUNT_TOLERANCE: i64 = 64;
const OVERFLOW: u32 = u32::MAX;

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
    /// Bytes and allocations handed out and given back through this thread; current = out − back.
    alloc_bytes: AtomicI64,
    alloc_count: AtomicI64,
    freed_bytes: AtomicI64,
    freed_count: AtomicI64,
    /// Approximate peak: the current figures as last added to the shared ones.
    published_bytes: AtomicI64,
    published_count: AtomicI64,
    /// Exact peak: this thread's headroom word; the owner CASes it (never when frozen), the
    /// reserve's lock holder swaps or stores it.
    headroom: AtomicU64,
    /// Exact peak: the headroom (same packing) past which a free trades with the reserve; the owner
    /// writes it under the reserve's lock.
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

thread_local! {
    /// (adaptor id, shard) of the adaptors this thread used last.
    static SLOTS: SlotCache<u64, 4> = const { SlotCache::new() };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Counts bytes and allocations through it (RMM's `statistics_resource_adaptor`); see module docs.
/// An `Arc` of a concrete upstream (`Arc<PoolMemoryResource>`) skips dynamic dispatch.
#[repr(C, align(128))]
pub struct StatisticsResourceAdaptor<U: Upstream + ?Sized = dyn DeviceMemoryResource> {
    // Read by every operation: kept together, in the first 128 bytes.
    upstream: Arc<U>,
    shards: Shards,
    id: u64,
    /// Threads that have used the adaptor (changed under the reserve's lock).
    threads: AtomicUsize,
    /// 0: exact peak.
    tolerance_bytes: i64,
    tolerance_count: i64,
    /// Peak since the innermost scope was pushed (absolute units); with the exact peak, written
    /// only under the reserve's lock.
    run_peak_bytes: AtomicI64,
    run_peak_count: AtomicI64,
    // Written when shards publish or trade: a block of its own.
    figures: TradedFigures,
    overflow: Shard,
    registry: Mutex<HashMap<ThreadId, u32>>,
    scopes: Mutex<Vec<Frame>>,
    ooms: AtomicU64,
    failures: AtomicU64,
}

/// The figures shards publish or trade with, apart from the read-mostly fields.
#[derive(Default)]
#[repr(align(128))]
struct TradedFigures {
    /// Exact peak: the reserve of headroom. Its lock also orders thread registration.
    reserve: SpinLock<Reserve>,
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
    /// Counts what goes through to `upstream`, with an exact peak.
    pub fn new(upstream: Arc<U>) -> Self {
        Self::with_peak_tolerance(upstream, 0)
    }

    /// As [`new`](Self::new), with peaks off by up to `bytes` per thread under multithreaded use.
    pub fn with_peak_tolerance(upstream: Arc<U>, bytes: usize) -> Self {
        let tolerance_bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        StatisticsResourceAdaptor {
            upstream,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            tolerance_bytes,
            tolerance_count: COUNT_TOLERANCE * i64::from(tolerance_bytes != 0),
            shards: Shards::new(),
            overflow: Shard::default(),
            threads: AtomicUsize::new(0),
            registry: Mutex::new(HashMap::new()),
            run_peak_bytes: AtomicI64::new(0),
            run_peak_count: AtomicI64::new(0),
            figures: TradedFigures::default(),
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
        let slot = SLOTS
            .with(|c| c.get(self.id))
            .unwrap_or_else(|| self.register_thread());
        self.shards.get(slot as usize)
    }

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
        let f = &self.figures;
        let b = f.published_bytes.fetch_add(db, Ordering::Relaxed) + db;
        let c = f.published_count.fetch_add(dc, Ordering::Relaxed) + dc;
        if b > self.run_peak_bytes.load(Ordering::Relaxed) {
            self.run_peak_bytes.fetch_max(b, Ordering::Relaxed);
            f.life_peak_bytes.fetch_max(b, Ordering::Relaxed);
        }
        if c > self.run_peak_count.load(Ordering::Relaxed) {
            self.run_peak_count.fetch_max(c, Ordering::Relaxed);
            f.life_peak_count.fetch_max(c, Ordering::Relaxed);
        }
    }

    /// The overflow shard of threads beyond [`MAX_SHARDS`]. `count`: 1 to allocate, -1 to free.
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
            // The reserve's lock first: a freeze sees a fixed set of shards.
            let _pool = self.figures.reserve.lock();
            let mut reg = self.registry.lock();
            let n = reg.len();
            *reg.entry(me).or_insert_with(|| {
                // Shard before count: readers walk the first `threads` shards.
                let slot = self.shards.make(n).map_or(OVERFLOW, |_| n as u32);
                self.threads.fetch_add(1, Ordering::Release);
                slot
            })
        };
        SLOTS.with(|c| c.insert(self.id, slot));
        slot
    }

    fn sums(&self) -> Sums {
        let n = self.threads.load(Ordering::Acquire).min(MAX_SHARDS);
        let mut s = Sums::default();
        for shard in self.shards.first(n).chain(std::iter::once(&self.overflow)) {
            let r = shard.read();
            s.bytes += r.bytes;
            s.count += r.count;
            s.total_bytes += r.total_bytes;
            s.total_count += r.total_count;
        }
        s
    }

    /// The innermost scope's peak from `run` and `now` (current value; only approximate peaks,
    /// published by the shards, lag it).
    fn run_peak(&self, run: &AtomicI64, now: i64) -> i64 {
        let peak = run.load(Ordering::Relaxed);
        if self.exact() { peak } else { peak.max(now) }
    }

    fn counters_of(&self, frame: &Frame, now: &Sums) -> (Counter, Counter) {
        let peak_bytes = self.run_peak(&self.run_peak_bytes, now.bytes);
        let peak_count = self.run_peak(&self.run_peak_count, now.count);
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

    /// Innermost scope's bytes, as requested (not rounded): RMM's `get_bytes_counter`.
    pub fn bytes_counter(&self) -> Counter {
        self.top().0
    }

    /// Allocations of the innermost counter scope (RMM's `get_allocations_counter`).
    pub fn allocations_counter(&self) -> Counter {
        self.top().1
    }

    /// Bytes since the adaptor was made, whatever scopes were pushed.
    pub fn lifetime_bytes(&self) -> Counter {
        let s = self.sums();
        let life = self.figures.life_peak_bytes.load(Ordering::Relaxed);
        Counter {
            value: s.bytes,
            peak: life.max(self.run_peak(&self.run_peak_bytes, s.bytes)),
            total: s.total_bytes,
        }
    }

    /// Allocations since the adaptor was made, whatever scopes were pushed.
    pub fn lifetime_allocations(&self) -> Counter {
        let s = self.sums();
        let life = self.figures.life_peak_count.load(Ordering::Relaxed);
        Counter {
            value: s.count,
            peak: life.max(self.run_peak(&self.run_peak_count, s.count)),
            total: s.total_count,
        }
    }

    /// Starts a new innermost scope of zeroed counters; returns the previous innermost (bytes,
    /// allocations) counters (RMM's `push_counters`). The exact peak freezes all headroom so the
    /// scope starts from the exact current value.
    pub fn push_counters(&self) -> (Counter, Counter) {
        let mut scopes = self.scopes.lock();
        let frame = scopes.last().copied().unwrap_or_default();
        let mut now = self.sums();
        let (before, saved_peak_bytes, saved_peak_count);
        if self.exact() {
            let mut reserve = self.figures.reserve.lock();
            let frozen = self.freeze_all(&mut reserve);
            saved_peak_bytes = self.run_peak_bytes.load(Ordering::Relaxed);
            saved_peak_count = self.run_peak_count.load(Ordering::Relaxed);
            // All the headroom is in the reserve: these are the current values at this instant.
            now.bytes = saved_peak_bytes - reserve.bytes;
            now.count = saved_peak_count - reserve.count;
            before = self.counters_of(&frame, &now);
            self.run_peak_bytes.store(now.bytes, Ordering::Relaxed);
            self.run_peak_count.store(now.count, Ordering::Relaxed);
            *reserve = Reserve::default();
            self.thaw(frozen);
        } else {
            before = self.counters_of(&frame, &now);
            saved_peak_bytes = self.run_peak_bytes.load(Ordering::Relaxed).max(now.bytes);
            saved_peak_count = self.run_peak_count.load(Ordering::Relaxed).max(now.count);
            let f = &self.figures;
            f.life_peak_bytes.fetch_max(now.bytes, Ordering::Relaxed);
            f.life_peak_count.fetch_max(now.count, Ordering::Relaxed);
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

    /// Makes the peaks current values (PyTorch's `reset_peak_memory_stats`): the lifetime and
    /// innermost scope's peaks and the first pool below's reserved peak. Enclosing scopes keep
    /// theirs for when it is popped.
    pub fn reset_peaks(&self) {
        let _scopes = self.scopes.lock();
        if self.exact() {
            let mut reserve = self.figures.reserve.lock();
            let frozen = self.freeze_all(&mut reserve);
            // All the headroom is in the reserve: peak − reserve is the current value.
            let bytes = self.run_peak_bytes.load(Ordering::Relaxed) - reserve.bytes;
            let count = self.run_peak_count.load(Ordering::Relaxed) - reserve.count;
            self.set_peaks(bytes, count);
            *reserve = Reserve::default();
            self.thaw(frozen);
        } else {
            let now = self.sums();
            self.set_peaks(now.bytes, now.count);
        }
        if let Some(pool) = find_in_chain::<PoolMemoryResource>((*self.upstream).as_dyn()) {
            pool.reset_peak_pool_size();
        }
    }

    /// Sets the innermost scope's peaks and the lifetime ones.
    fn set_peaks(&self, bytes: i64, count: i64) {
        self.run_peak_bytes.store(bytes, Ordering::Relaxed);
        self.run_peak_count.store(count, Ordering::Relaxed);
        self.figures.life_peak_bytes.store(bytes, Ordering::Relaxed);
        self.figures.life_peak_count.store(count, Ordering::Relaxed);
    }

    /// Ends the innermost scope, returning its (bytes, allocations) counters; the enclosing scope
    /// takes its figures over (RMM's `pop_counters`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when only the outermost scope is left.
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
            // The enclosing scope's peak is the higher of the two; the reserve grows with it.
            let mut reserve = self.figures.reserve.lock();
            let bytes = self.run_peak_bytes.load(Ordering::Relaxed);
            let count = self.run_peak_count.load(Ordering::Relaxed);
            let new_bytes = bytes.max(frame.saved_peak_bytes);
            let new_count = count.max(frame.saved_peak_count);
            reserve.bytes += new_bytes - bytes;
            reserve.count += new_count - count;
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

    /// Runs `f` in its own scope; returns its result and the scope's (bytes, allocations) counters.
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

    /// Counts `blocks`, live allocations of another stack now owned by this stack's resource (a
    /// reinitialize keeping data in place), as allocated here; later frees count as usual.
    pub fn take_over_live(&self, blocks: &[LiveBlock]) {
        for b in blocks.iter().filter(|b| !b.ptr.is_null()) {
            self.record_alloc(b.bytes as i64);
        }
    }

    /// Counts `blocks`, live allocations of this adaptor taken over by another stack
    /// ([`take_over_live`](Self::take_over_live)), as freed: their frees won't come here.
    pub fn hand_over_live(&self, blocks: &[LiveBlock]) {
        for b in blocks.iter().filter(|b| !b.ptr.is_null()) {
            self.record_free(b.bytes as i64);
        }
    }

    /// Allocations that failed with out-of-memory (PyTorch's `num_ooms`).
    pub fn out_of_memory_count(&self) -> u64 {
        self.ooms.load(Ordering::Relaxed)
    }

    /// Allocations that failed for another reason.
    pub fn failed_allocation_count(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
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
        let r = self.upstream.allocate(bytes, stream);
        match &r {
            Ok(p) if !p.is_null() => self.record_alloc(bytes as i64),
            Ok(_) => {}
            Err(e) => self.count_failure(e, bytes),
        }
        r
    }

    #[inline]
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        let r = self.upstream.deallocate(ptr, bytes, stream);
        if r.is_ok() && !ptr.is_null() {
            self.record_free(bytes as i64);
        }
        r
    }

    crate::adaptor::upstream_tail!("StatisticsResourceAdaptor");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;
    use crate::resource::CudaMemoryResource;

    #[test]
    fn shards_are_made_a_group_at_a_time_as_threads_come() {
        let device = Device::new(0).expect("device 0 of the process-wide backend");
        let stats = StatisticsResourceAdaptor::new(Arc::new(CudaMemoryResource::new(device)));
        // A new adaptor writes no shard: building a stack touches no fresh pages for them.
        assert_eq!(stats.shards.made(), 0);
        let p = stats.allocate(256, StreamView::DEFAULT).unwrap();
        assert_eq!(stats.shards.made(), 1);
        // One more thread than a group holds: the first thread's group, then the next.
        std::thread::scope(|s| {
            for _ in 0..SHARD_GROUP {
                s.spawn(|| {
                    let q = stats.allocate(512, StreamView::DEFAULT).unwrap();
                    stats.deallocate(q, 512, StreamView::DEFAULT).unwrap();
                });
            }
        });
        assert_eq!(stats.shards.made(), 2);
        assert_eq!(stats.allocations_counter().total, 1 + SHARD_GROUP as i64);
        assert_eq!(stats.bytes_counter().value, 256);
        stats.deallocate(p, 256, StreamView::DEFAULT).unwrap();
    }
}
