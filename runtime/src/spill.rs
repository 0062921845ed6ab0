//! Spilling policy: one [`SpillManager`] per device keeps the device bytes of its
//! [`SpillableBuffer`]s under `spill.device_memory_limit`, spilling the least recently used
//! buffers not in use to its pinned host pool, and spills everything before a reinitialize so
//! that live data survives the switch (it comes back, into the new stack, on next use).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rmm_allocator::container::{SpillObserver, SpillableBuffer};
use rmm_allocator::resource::PinnedHostPool;
use rmm_allocator::{Device, StreamView};
use rmm_config::ResolvedSpill;
use serde::Serialize;

/// The pinned host pool when `spill.host_pool_size` is `"none"`.
pub const DEFAULT_HOST_POOL: u64 = 2 << 30;

/// Spill figures of one device.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpillStatistics {
    /// The device.
    pub device: u32,
    /// Device bytes the manager keeps its buffers under.
    pub limit: u64,
    /// Device bytes of tracked buffers now, and the most at once.
    pub tracked_bytes: u64,
    /// See `tracked_bytes`.
    pub peak_tracked_bytes: u64,
    /// Buffers moved to host memory, and their bytes.
    pub spilled_count: u64,
    /// See `spilled_count`.
    pub spilled_bytes: u64,
    /// Time spent spilling.
    pub spill_seconds: f64,
    /// Buffers brought back, and their bytes.
    pub unspilled_count: u64,
    /// See `unspilled_count`.
    pub unspilled_bytes: u64,
    /// Time spent bringing data back.
    pub unspill_seconds: f64,
    /// Pinned host bytes holding spilled data, and the pool's size.
    pub host_bytes: u64,
    /// See `host_bytes`.
    pub host_pool_bytes: u64,
}

impl SpillStatistics {
    /// Spill bandwidth in GB/s (0 when nothing was spilled).
    pub fn spill_gbps(&self) -> f64 {
        rate(self.spilled_bytes, self.spill_seconds)
    }

    /// Unspill bandwidth in GB/s.
    pub fn unspill_gbps(&self) -> f64 {
        rate(self.unspilled_bytes, self.unspill_seconds)
    }
}

fn rate(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    }
}

#[derive(Default)]
struct Lru {
    next: u64,
    /// Tick → buffer id, oldest first.
    order: BTreeMap<u64, u64>,
    /// Buffer id → (tick, buffer).
    entries: HashMap<u64, (u64, Weak<SpillableBuffer>)>,
}

/// The bookkeeping buffers report to.
#[derive(Default)]
struct Tracker {
    lru: Mutex<Lru>,
    limit: AtomicU64,
    tracked: AtomicI64,
    peak: AtomicI64,
    spilled: AtomicU64,
    spilled_bytes: AtomicU64,
    spill_ns: AtomicU64,
    unspilled: AtomicU64,
    unspilled_bytes: AtomicU64,
    unspill_ns: AtomicU64,
}

impl Tracker {
    /// Spills least recently used buffers (not `except`) until `need` device bytes are freed
    /// or nothing more can go; returns the bytes freed.
    fn spill_oldest(&self, need: u64, except: Option<u64>) -> rmm_allocator::Result<u64> {
        let candidates: Vec<Arc<SpillableBuffer>> = {
            let lru = self.lru.lock();
            lru.order
                .values()
                .filter(|id| Some(**id) != except)
                .filter_map(|id| lru.entries.get(id).and_then(|(_, w)| w.upgrade()))
                .collect()
        };
        let mut freed = 0;
        for b in candidates {
            if freed >= need {
                break;
            }
            // No blocking look at the buffer here: its owner may be moving it while making
            // room (holding its lock), and `spill` skips busy and spilled buffers itself.
            if b.is_in_use() {
                continue;
            }
            let start = Instant::now();
            let n = b.spill()? as u64;
            if n > 0 {
                freed += n;
                self.spilled.fetch_add(1, Ordering::Relaxed);
                self.spilled_bytes.fetch_add(n, Ordering::Relaxed);
                self.spill_ns
                    .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
        Ok(freed)
    }
}

impl SpillObserver for Tracker {
    fn touched(&self, id: u64) {
        let mut lru = self.lru.lock();
        let tick = lru.next;
        lru.next += 1;
        if let Some((old, _)) = lru.entries.get(&id).map(|e| (e.0, ())) {
            lru.order.remove(&old);
            lru.order.insert(tick, id);
            if let Some(e) = lru.entries.get_mut(&id) {
                e.0 = tick;
            }
        }
    }

    fn make_room(&self, id: u64, bytes: usize) {
        let limit = self.limit.load(Ordering::Relaxed) as i64;
        let over = self.tracked.load(Ordering::Relaxed) + bytes as i64 - limit;
        if over > 0
            && let Err(e) = self.spill_oldest(over as u64, Some(id))
        {
            // The allocation goes ahead; if the device is really full it fails on its own.
            tracing::warn!("spilling to make room for {bytes} bytes: {e}");
        }
    }

    fn resident(&self, _id: u64, delta: i64) {
        let now = self.tracked.fetch_add(delta, Ordering::Relaxed) + delta;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn unspilled(&self, _id: u64, bytes: usize, nanos: u64) {
        self.unspilled.fetch_add(1, Ordering::Relaxed);
        self.unspilled_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.unspill_ns.fetch_add(nanos, Ordering::Relaxed);
    }

    fn dropped(&self, id: u64) {
        let mut lru = self.lru.lock();
        if let Some((tick, _)) = lru.entries.remove(&id) {
            lru.order.remove(&tick);
        }
    }
}

/// Spilling for one device: see the module documentation.
pub struct SpillManager {
    device: Device,
    host: PinnedHostPool,
    tracker: Arc<Tracker>,
    eager_unspill: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for SpillManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillManager")
            .field("device", &self.device)
            .field("statistics", &self.statistics())
            .finish()
    }
}

impl SpillManager {
    /// A manager for `device` as `spill` configures it; pins its host pool now
    /// (`spill.host_pool_size`, or [`DEFAULT_HOST_POOL`]).
    pub fn new(device: Device, spill: &ResolvedSpill) -> rmm_allocator::Result<SpillManager> {
        let host = PinnedHostPool::on(
            device.backend(),
            spill.host_pool_size.unwrap_or(DEFAULT_HOST_POOL) as usize,
        )?;
        let tracker = Arc::new(Tracker::default());
        tracker.limit.store(spill.threshold, Ordering::Relaxed);
        Ok(SpillManager {
            device,
            host,
            tracker,
            eager_unspill: spill.eager_unspill.into(),
        })
    }

    /// Takes the settings of a new configuration (limit, eager unspilling); the host pool
    /// and the buffers stay.
    pub fn reconfigure(&self, spill: &ResolvedSpill) {
        self.tracker.limit.store(spill.threshold, Ordering::Relaxed);
        self.eager_unspill
            .store(spill.eager_unspill, Ordering::Relaxed);
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// `size` uninitialized bytes on the device, spillable, used on `stream`; older buffers
    /// are spilled first if the limit requires.
    pub fn buffer(
        &self,
        size: usize,
        stream: StreamView,
    ) -> rmm_allocator::Result<Arc<SpillableBuffer>> {
        let b = SpillableBuffer::new(
            self.device,
            size,
            stream,
            self.host.clone(),
            Some(Arc::clone(&self.tracker) as Arc<dyn SpillObserver>),
        )?;
        self.register(&b);
        Ok(b)
    }

    /// A spillable copy of `bytes`.
    pub fn from_host(
        &self,
        bytes: &[u8],
        stream: StreamView,
    ) -> rmm_allocator::Result<Arc<SpillableBuffer>> {
        let b = SpillableBuffer::from_host(
            self.device,
            bytes,
            stream,
            self.host.clone(),
            Some(Arc::clone(&self.tracker) as Arc<dyn SpillObserver>),
        )?;
        self.register(&b);
        Ok(b)
    }

    fn register(&self, b: &Arc<SpillableBuffer>) {
        let mut lru = self.tracker.lru.lock();
        let tick = lru.next;
        lru.next += 1;
        lru.order.insert(tick, b.id());
        lru.entries.insert(b.id(), (tick, Arc::downgrade(b)));
    }

    /// The out-of-memory handler for the device's stack (`spill.on_demand`): spills least
    /// recently used buffers not in use for the request, and asks for a retry if it freed
    /// anything.
    pub fn oom_handler(&self) -> crate::stack::OomHandler {
        let tracker = Arc::clone(&self.tracker);
        Arc::new(
            move |bytes| match tracker.spill_oldest(bytes as u64, None) {
                Ok(freed) => freed > 0,
                Err(e) => {
                    tracing::warn!("spilling after an out-of-memory error for {bytes} bytes: {e}");
                    false
                }
            },
        )
    }

    /// Spills every buffer not in use; returns the device bytes freed.
    pub fn spill_all(&self) -> rmm_allocator::Result<u64> {
        self.tracker.spill_oldest(u64::MAX, None)
    }

    /// Brings every spilled buffer back (up to the limit, oldest first) on `stream`.
    pub fn unspill_all(&self, stream: StreamView) -> rmm_allocator::Result<u64> {
        let buffers: Vec<Arc<SpillableBuffer>> = {
            let lru = self.tracker.lru.lock();
            lru.entries
                .values()
                .filter_map(|(_, w)| w.upgrade())
                .collect()
        };
        let mut back = 0;
        for b in buffers {
            let room = self.tracker.limit.load(Ordering::Relaxed) as i64
                - self.tracker.tracked.load(Ordering::Relaxed);
            if b.is_spilled() && (b.size() as i64) <= room {
                drop(b.device_view(stream)?);
                back += b.size() as u64;
            }
        }
        Ok(back)
    }

    /// True when a reinitialize should bring spilled data back at once.
    pub fn eager_unspill(&self) -> bool {
        self.eager_unspill.load(Ordering::Relaxed)
    }

    /// The figures so far.
    pub fn statistics(&self) -> SpillStatistics {
        let t = &self.tracker;
        let secs = |ns: &AtomicU64| Duration::from_nanos(ns.load(Ordering::Relaxed)).as_secs_f64();
        SpillStatistics {
            device: self.device.ordinal(),
            limit: t.limit.load(Ordering::Relaxed),
            tracked_bytes: t.tracked.load(Ordering::Relaxed).max(0) as u64,
            peak_tracked_bytes: t.peak.load(Ordering::Relaxed).max(0) as u64,
            spilled_count: t.spilled.load(Ordering::Relaxed),
            spilled_bytes: t.spilled_bytes.load(Ordering::Relaxed),
            spill_seconds: secs(&t.spill_ns),
            unspilled_count: t.unspilled.load(Ordering::Relaxed),
            unspilled_bytes: t.unspilled_bytes.load(Ordering::Relaxed),
            unspill_seconds: secs(&t.unspill_ns),
            host_bytes: self.host.used() as u64,
            host_pool_bytes: self.host.capacity() as u64,
        }
    }
}
