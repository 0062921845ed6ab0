//! [`StatisticsResourceAdaptor`]: current, peak and total bytes and allocation counts, with
//! RMM's counter scopes and a report in the shape PyTorch's `memory_stats` has.
//!
//! # How it stays cheap
//! Every thread that uses an adaptor gets its own cache-line-sized *shard* of counters, found
//! through a small thread-local cache; only that thread writes it (two plain loads and stores
//! per operation, no read-modify-write), so 16 workers never bounce a shared line. Current and
//! total figures are the sums of the shards, read when asked for: they are exact.
//!
//! The peak is a maximum of a sum, which no shard sees alone. Each shard adds what changed
//! since it last published (its *pending* delta) to one shared figure, then raises the shared
//! peak with `fetch_max` when the figure passed it:
//! * while a single thread uses the adaptor, only on an allocation that takes the figure past
//!   the current peak. The peak is exact and the shared line is written only while the peak
//!   climbs;
//! * once several threads use it, when a shard's pending delta reaches the *peak tolerance*
//!   (default [`DEFAULT_PEAK_TOLERANCE`] bytes, or 64 allocations) either way. The shared
//!   figure is then within `threads × tolerance` of the true sum, so the peak may read that
//!   much low or high (never above the sum of each thread's own peak); a tolerance of 0
//!   ([`StatisticsResourceAdaptor::with_peak_tolerance`]) makes it exact at the cost of one
//!   shared atomic add per operation (which 16 threads contend on).
//!
//! Cost (benches/adaptors.rs, simulated device, 2.5 GHz Xeon VM): about 10 ns per operation
//! of counting on top of the ≈ 4–11 ns that any adaptor layer costs (one more dynamic call and
//! result check; compare the failure-callback row).
//!
//! Threads beyond [`MAX_SHARDS`] share one overflow shard with atomic adds and publish every
//! change (still correct, slower).

use std::any::Any;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
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
/// Default peak tolerance in bytes once several threads use one adaptor.
pub const DEFAULT_PEAK_TOLERANCE: usize = 16 << 20;
/// Pending allocation-count delta that makes a shard publish, with a non-zero tolerance.
const COUNT_TOLERANCE: i64 = 64;
const OVERFLOW: u32 = u32::MAX;
const CACHE_SLOTS: usize = 4;

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
    /// The current figures as last added to the shared ones.
    published_bytes: AtomicI64,
    published_count: AtomicI64,
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
    static SLOT_CACHE: [Cell<(u64, u32)>; CACHE_SLOTS] =
        const { [const { Cell::new((0, 0)) }; CACHE_SLOTS] };
    static NEXT_VICTIM: Cell<usize> = const { Cell::new(0) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Counts bytes and allocations through it (RMM's `statistics_resource_adaptor`). See the
/// module documentation for the counting scheme and the peak's accuracy.
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
    /// Threads that have used the adaptor.
    threads: AtomicUsize,
    tolerance_bytes: i64,
    tolerance_count: i64,
    /// Peak since the innermost scope was pushed (absolute units).
    run_peak_bytes: AtomicI64,
    run_peak_count: AtomicI64,
    // Written when shards publish: a block of its own.
    shared: Shared,
    overflow: Shard,
    registry: Mutex<HashMap<ThreadId, u32>>,
    scopes: Mutex<Vec<Frame>>,
    ooms: AtomicU64,
    failures: AtomicU64,
}

/// The figures shards publish to, apart from the read-mostly fields.
#[derive(Default)]
#[repr(align(128))]
struct Shared {
    /// Sum of the figures the shards published.
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
    /// Counts what goes through to `upstream`, with the default peak tolerance.
    pub fn new(upstream: Arc<U>) -> Self {
        Self::with_peak_tolerance(upstream, DEFAULT_PEAK_TOLERANCE)
    }

    /// As [`StatisticsResourceAdaptor::new`], with a peak tolerance of `bytes` once several
    /// threads use the adaptor (0: exact peak, one shared atomic add per operation).
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

    /// The peak tolerance in bytes (see the module documentation).
    pub fn peak_tolerance(&self) -> usize {
        self.tolerance_bytes as usize
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

    /// Counts an allocation: two plain stores to this thread's shard, and a shared write only
    /// when the figures must be published (see the module documentation).
    #[inline(always)]
    fn record_alloc(&self, bytes: i64) {
        let Some(s) = self.shard() else {
            return self.update_overflow(bytes, 1);
        };
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

    /// Counts a free: two plain stores; nothing shared while one thread uses the adaptor.
    #[inline(always)]
    fn record_free(&self, bytes: i64) {
        let Some(s) = self.shard() else {
            return self.update_overflow(-bytes, -1);
        };
        let freed_bytes = bump(&s.freed_bytes, bytes);
        let freed_count = bump(&s.freed_count, 1);
        if self.threads.load(Ordering::Relaxed) > 1 {
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

    /// Threads beyond [`MAX_SHARDS`] share one shard: atomic adds, published at once.
    #[cold]
    #[inline(never)]
    fn update_overflow(&self, bytes: i64, count: i64) {
        let s = &self.overflow;
        if bytes > 0 {
            s.alloc_bytes.fetch_add(bytes, Ordering::Relaxed);
            s.alloc_count.fetch_add(count, Ordering::Relaxed);
        } else {
            s.freed_bytes.fetch_add(-bytes, Ordering::Relaxed);
            s.freed_count.fetch_add(-count, Ordering::Relaxed);
        }
        self.publish_delta(bytes, count);
    }

    #[cold]
    #[inline(never)]
    fn register_thread(&self) -> u32 {
        let me = std::thread::current().id();
        let slot = {
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
        let peak_bytes = self.run_peak_bytes.load(Ordering::Relaxed).max(now.bytes);
        let peak_count = self.run_peak_count.load(Ordering::Relaxed).max(now.count);
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

    /// Bytes since the adaptor was made, whatever scopes were pushed.
    pub fn lifetime_bytes(&self) -> Counter {
        let s = self.sums();
        Counter {
            value: s.bytes,
            peak: self
                .shared
                .life_peak_bytes
                .load(Ordering::Relaxed)
                .max(s.bytes),
            total: s.total_bytes,
        }
    }

    /// Allocations since the adaptor was made, whatever scopes were pushed.
    pub fn lifetime_allocations(&self) -> Counter {
        let s = self.sums();
        Counter {
            value: s.count,
            peak: self
                .shared
                .life_peak_count
                .load(Ordering::Relaxed)
                .max(s.count),
            total: s.total_count,
        }
    }

    /// Starts a new innermost scope of zeroed counters; returns the (bytes, allocations)
    /// counters of the scope that was innermost before (RMM's `push_counters`).
    pub fn push_counters(&self) -> (Counter, Counter) {
        let mut scopes = self.scopes.lock();
        let now = self.sums();
        let frame = scopes.last().copied().unwrap_or_default();
        let before = self.counters_of(&frame, &now);
        scopes.push(Frame {
            base: now,
            saved_peak_bytes: self.run_peak_bytes.load(Ordering::Relaxed).max(now.bytes),
            saved_peak_count: self.run_peak_count.load(Ordering::Relaxed).max(now.count),
        });
        self.shared
            .life_peak_bytes
            .fetch_max(now.bytes, Ordering::Relaxed);
        self.shared
            .life_peak_count
            .fetch_max(now.count, Ordering::Relaxed);
        self.run_peak_bytes.store(now.bytes, Ordering::Relaxed);
        self.run_peak_count.store(now.count, Ordering::Relaxed);
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
        self.run_peak_bytes
            .fetch_max(frame.saved_peak_bytes.max(now.bytes), Ordering::Relaxed);
        self.run_peak_count
            .fetch_max(frame.saved_peak_count.max(now.count), Ordering::Relaxed);
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
            reserved_bytes: pool.map(|p| p.pool_size as u64),
            reserved_maximum_bytes: pool.and_then(|p| p.maximum_size.map(|m| m as u64)),
            pool_in_use_bytes: pool.map(|p| p.in_use as u64),
            cached_free_bytes: pool.map(|p| p.pool_size.saturating_sub(p.in_use) as u64),
            largest_free_block: pool.map(|p| p.largest_free as u64),
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
    /// The largest free block of that pool: the largest request it can serve without growing.
    pub largest_free_block: Option<u64>,
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
            "  reserved   {} (maximum {}), in use {}, cached {}, largest free block {}",
            opt(self.reserved_bytes),
            opt(self.reserved_maximum_bytes),
            opt(self.pool_in_use_bytes),
            opt(self.cached_free_bytes),
            opt(self.largest_free_block)
        )?;
        write!(
            f,
            "  retries {}, out-of-memory {}, other failures {}",
            self.num_alloc_retries, self.num_ooms, self.num_failed_allocations
        )
    }
}
