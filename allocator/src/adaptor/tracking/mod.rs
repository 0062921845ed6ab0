//! [`TrackingResourceAdaptor`]: every outstanding allocation with its size, stream, thread, time
//! and (optionally) a backtrace, and leak reports (RMM's `tracking_resource_adaptor`). Dropping it
//! with allocations outstanding logs a leak report with `tracing::warn!`.
//!
//! Records live in 64 maps, each behind its own spin lock, picked by a hash of the address: an
//! allocation and its free take one uncontended lock each, and no counter is shared. A record is
//! 24 bytes (size, stream, and a coarse timestamp packed with the thread's slot in the adaptor's
//! thread table); backtraces sit in a map of their own. Times come from a clock thread ticking
//! every millisecond ([`ticking_monotonic_ns`]). A free removes the record before calling the
//! upstream (putting it back if that fails): a thread handed the same address right after records
//! its own allocation, which the free can't remove. Exited threads owning no outstanding
//! allocation leave the thread table once they outnumber the others.

mod shards;
mod threads;

use std::backtrace::Backtrace;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

use shards::{Maps, Rec, Shard};
use threads::{REGISTRATIONS, SLOTS, ThreadTable};

use crate::backend::DevicePtr;
use crate::backend::clock::{Ticker, ticking_monotonic_ns};
use crate::error::{Result, fmt_bytes};
use crate::resource::{DeviceMemoryResource, LiveBlock, SharedResource};
use crate::stream_view::StreamView;
use crate::sync::SpinLock;

const SHARDS: usize = 64;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();

/// One outstanding allocation.
#[derive(Debug, Clone)]
pub struct AllocationRecord {
    /// The pointer handed out.
    pub ptr: DevicePtr,
    /// Bytes requested.
    pub size: usize,
    /// The stream it was allocated on.
    pub stream: StreamView,
    /// The allocating thread.
    pub thread: Thread,
    /// When it was allocated (to the coarse clock's tick: a few milliseconds).
    pub at: Instant,
    /// Where it was allocated, when backtraces are captured.
    pub backtrace: Option<Arc<Backtrace>>,
}

impl fmt::Display for AllocationRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} on stream {:#x} by thread {}, {:.3} s ago",
            self.ptr,
            fmt_bytes(self.size),
            self.stream.raw(),
            self.thread
                .name()
                .map_or_else(|| format!("{:?}", self.thread.id()), str::to_string),
            self.at.elapsed().as_secs_f64()
        )?;
        if let Some(bt) = &self.backtrace {
            write!(f, "\n    allocated at:\n{bt}")?;
        }
        Ok(())
    }
}

/// What is still allocated through a tracking adaptor.
#[derive(Debug, Clone)]
pub struct LeakReport {
    /// Device ordinal.
    pub device: u32,
    /// The upstream resource's name.
    pub resource: &'static str,
    /// The outstanding allocations, by address.
    pub allocations: Vec<AllocationRecord>,
    /// Their total size in bytes.
    pub bytes: usize,
}

impl LeakReport {
    /// True when nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allocations.is_empty() {
            return write!(
                f,
                "no allocations outstanding on device {} ({})",
                self.device, self.resource
            );
        }
        write!(
            f,
            "{} allocation(s) of {} outstanding on device {} ({}); free them (drop their \
             buffers) before the resource is dropped or reinitialized:",
            self.allocations.len(),
            fmt_bytes(self.bytes),
            self.device,
            self.resource
        )?;
        for a in &self.allocations {
            write!(f, "\n  {a}")?;
        }
        Ok(())
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Records every allocation until it is freed; see the module documentation.
pub struct TrackingResourceAdaptor {
    upstream: SharedResource,
    backtraces: AtomicBool,
    shards: Box<[Shard]>,
    threads: Arc<ThreadTable>,
    id: u64,
    /// [`ticking_monotonic_ns`] and [`Instant::now`] read together at creation: the time origin.
    base_ns: u64,
    base: Instant,
    _clock: Ticker,
}

impl fmt::Debug for TrackingResourceAdaptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackingResourceAdaptor")
            .field("upstream", &self.upstream.name())
            .field("outstanding_bytes", &self.outstanding_bytes())
            .field("outstanding", &self.outstanding_count())
            .finish()
    }
}

impl TrackingResourceAdaptor {
    /// Tracks what goes through to `upstream`, without backtraces.
    pub fn new(upstream: SharedResource) -> Self {
        TrackingResourceAdaptor {
            upstream,
            backtraces: AtomicBool::new(false),
            shards: (0..SHARDS)
                .map(|_| Shard {
                    map: SpinLock::new(Maps::default()),
                    bytes: AtomicUsize::new(0),
                })
                .collect(),
            threads: Arc::new(ThreadTable::default()),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            _clock: Ticker::start(),
            base_ns: ticking_monotonic_ns(),
            base: Instant::now(),
        }
    }

    /// Tracks with a backtrace captured at every allocation (slow: for debugging).
    pub fn with_backtraces(upstream: SharedResource) -> Self {
        let t = Self::new(upstream);
        t.set_capture_backtraces(true);
        t
    }

    /// Turns backtrace capture on or off for later allocations.
    pub fn set_capture_backtraces(&self, on: bool) {
        self.backtraces.store(on, Ordering::Relaxed);
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    #[inline(always)]
    fn shard(&self, ptr: DevicePtr) -> &Shard {
        // Multiplicative hash, top bits: every address bit counts (the maps hash differently).
        let h = ptr.addr().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARD_BITS);
        &self.shards[h as usize]
    }

    /// The calling thread's slot in the thread table, and whether the thread is being torn down
    /// (then the slot is its own: mark it exited once the record is in).
    #[inline(always)]
    fn who(&self) -> (u32, bool) {
        let slot = SLOTS.with(|c| c.get(self.id));
        slot.map_or_else(|| self.register_thread(), |slot| (slot, false))
    }

    #[cold]
    #[inline(never)]
    fn register_thread(&self) -> (u32, bool) {
        let id = self.id;
        let slot = REGISTRATIONS.try_with(|r| {
            let mut r = r.borrow_mut();
            if let Some(&(_, slot, _)) = r.0.iter().find(|e| e.0 == id) {
                return slot;
            }
            let slot = self.threads.register(std::thread::current(), &self.shards);
            r.0.retain(|e| e.2.strong_count() > 0);
            r.0.push((id, slot, Arc::downgrade(&self.threads)));
            slot
        });
        let Ok(slot) = slot else {
            // This thread's thread-locals are being torn down: a slot for this record alone.
            let slot = self.threads.register(std::thread::current(), &self.shards);
            return (slot, true);
        };
        SLOTS.with(|c| c.insert(id, slot));
        (slot, false)
    }

    /// Bytes outstanding (requested sizes).
    pub fn outstanding_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.bytes.load(Ordering::Relaxed))
            .sum()
    }

    /// Number of outstanding allocations.
    pub fn outstanding_count(&self) -> usize {
        self.shards.iter().map(|s| s.map.lock().records.len()).sum()
    }

    /// Every outstanding allocation, by address.
    pub fn outstanding(&self) -> Vec<AllocationRecord> {
        // Copy the records shard by shard (each lock briefly), then name threads.
        let mut raw = Vec::new();
        for shard in self.shards.iter() {
            let maps = shard.map.lock();
            let bt = |ptr: &u64| maps.backtraces.get(ptr).cloned();
            raw.extend(maps.records.iter().map(|(&ptr, &r)| (ptr, r, bt(&ptr))));
        }
        raw.sort_unstable_by_key(|r| r.0);
        let now = Instant::now();
        let slots = self.threads.slots.lock();
        raw.into_iter()
            .map(|(ptr, r, backtrace)| AllocationRecord {
                ptr: DevicePtr(ptr),
                size: r.size,
                stream: r.stream,
                // A slot named by a record is never pruned: only SLOT_UNKNOWN falls back.
                thread: slots
                    .entries
                    .get(r.slot() as usize)
                    .and_then(Option::as_ref)
                    .map_or_else(std::thread::current, |e| e.thread.clone()),
                at: self
                    .base
                    .checked_add(Duration::from_nanos(r.at_ns().saturating_sub(self.base_ns)))
                    .map_or(now, |at| at.min(now)),
                backtrace,
            })
            .collect()
    }

    /// What is outstanding now.
    pub fn leak_report(&self) -> LeakReport {
        let allocations = self.outstanding();
        LeakReport {
            device: self.upstream.device().ordinal(),
            resource: self.upstream.name(),
            bytes: allocations.iter().map(|a| a.size).sum(),
            allocations,
        }
    }

    /// Logs the outstanding allocations with `tracing::warn!` (nothing when there are none).
    pub fn log_outstanding(&self) {
        let report = self.leak_report();
        if !report.is_empty() {
            tracing::warn!("{report}");
        }
    }

    /// Records `blocks`, live allocations of another stack now owned by this stack's resource (a
    /// reinitialize keeping data in place), as outstanding here, allocated now by this thread.
    pub fn take_over_live(&self, blocks: &[LiveBlock]) {
        let (slot, teardown) = self.who();
        for b in blocks.iter().filter(|b| !b.ptr.is_null()) {
            let rec = Rec::new(b.bytes, b.stream, ticking_monotonic_ns(), slot);
            self.shard(b.ptr).insert(b.ptr.addr(), rec, None);
        }
        if teardown {
            self.threads.exited(slot);
        }
    }

    /// Forgets `blocks`, live allocations of this adaptor taken over by another stack.
    pub fn hand_over_live(&self, blocks: &[LiveBlock]) {
        for b in blocks.iter().filter(|b| !b.ptr.is_null()) {
            self.shard(b.ptr).remove(b.ptr.addr());
        }
    }

    #[cold]
    #[inline(never)]
    fn warn_reallocated(&self, ptr: DevicePtr, old: &Rec) {
        tracing::warn!(
            "TrackingResourceAdaptor: {} was allocated again without being freed \
             (previous allocation of {} bytes); the upstream {} may be broken",
            ptr,
            old.size,
            self.upstream.name()
        );
    }

    #[cold]
    #[inline(never)]
    fn warn_free(&self, ptr: DevicePtr, bytes: usize, allocated: Option<usize>) {
        match allocated {
            Some(size) => tracing::warn!(
                "TrackingResourceAdaptor: {ptr} freed with size {bytes} but allocated with {size}"
            ),
            None => tracing::warn!(
                "TrackingResourceAdaptor: {ptr} ({bytes} bytes) freed but not allocated through \
                 this adaptor"
            ),
        }
    }
}

impl DeviceMemoryResource for TrackingResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: StreamView) -> Result<DevicePtr> {
        let ptr = self.upstream.allocate(bytes, stream)?;
        if ptr.is_null() {
            return Ok(ptr);
        }
        let backtrace = self
            .backtraces
            .load(Ordering::Relaxed)
            .then(|| Arc::new(Backtrace::force_capture()));
        let (slot, teardown) = self.who();
        let rec = Rec::new(bytes, stream, ticking_monotonic_ns(), slot);
        // A replaced record (the upstream handed out a pointer we think is live) leaves the count.
        let (old, old_bt) = self.shard(ptr).insert(ptr.addr(), rec, backtrace);
        drop(old_bt);
        if teardown {
            self.threads.exited(slot);
        }
        if let Some(old) = old {
            self.warn_reallocated(ptr, &old);
        }
        Ok(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: StreamView) -> Result<()> {
        if ptr.is_null() {
            return self.upstream.deallocate(ptr, bytes, stream);
        }
        // Record first: once the upstream has the memory back, another thread may record it.
        let shard = self.shard(ptr);
        let (removed, bt) = shard.remove(ptr.addr());
        if let Err(e) = self.upstream.deallocate(ptr, bytes, stream) {
            // Still allocated: put the record back.
            if let Some(rec) = removed {
                shard.insert(ptr.addr(), rec, bt);
            }
            return Err(e);
        }
        // The backtrace, if any, is dropped outside the lock.
        drop(bt);
        let allocated = removed.map(|rec| rec.size);
        if allocated != Some(bytes) {
            self.warn_free(ptr, bytes, allocated);
        }
        Ok(())
    }

    crate::adaptor::upstream_tail!("TrackingResourceAdaptor");
}

impl Drop for TrackingResourceAdaptor {
    fn drop(&mut self) {
        self.log_outstanding();
    }
}
