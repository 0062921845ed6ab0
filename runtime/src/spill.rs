//! Spilling policy: one [`SpillManager`] per device keeps the device bytes of its
//! [`SpillableBuffer`]s under `spill.device_memory_limit`, spilling the least recently used
//! buffers not in use to its pinned host pool (and, when that is full, the least recently used
//! host data on to `spill.disk_directory`), and spills everything before a reinitialize so
//! that live data survives the switch (it comes back, into the new stack, on next use).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytemuck::Pod;
use parking_lot::Mutex;
use rmm_allocator::error::fmt_bytes;
use rmm_allocator::resource::PinnedHostPool;
use rmm_allocator::spill::{SpillObserver, SpillStore, SpillableBuffer, SpillableVector, Tier};
use rmm_allocator::{Device, StreamView};
use rmm_config::ResolvedSpill;
use serde::Serialize;

/// Moves into and out of one lower tier (host or disk).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TierStatistics {
    /// Moves into the tier (from the device, or from the host into disk), and their bytes.
    pub spilled_count: u64,
    /// See `spilled_count`.
    pub spilled_bytes: u64,
    /// Wall time during which they ran (overlapping moves counted once).
    pub spill_seconds: f64,
    /// Moves out of the tier (back to the device, or from disk to the host), and their bytes.
    pub unspilled_count: u64,
    /// See `unspilled_count`.
    pub unspilled_bytes: u64,
    /// Wall time during which they ran (overlapping moves counted once).
    pub unspill_seconds: f64,
    /// Bytes of spilled data the tier holds now.
    pub held_bytes: u64,
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
    /// Device bytes the manager keeps its buffers under.
    pub limit: u64,
    /// Device bytes of tracked buffers now, and the most at once.
    pub tracked_bytes: u64,
    /// See `tracked_bytes`.
    pub peak_tracked_bytes: u64,
    /// Buffers moved off the device (to host or disk), and their bytes.
    pub spilled_count: u64,
    /// See `spilled_count`.
    pub spilled_bytes: u64,
    /// Wall time during which data moved off the device (overlapping moves counted once).
    pub spill_seconds: f64,
    /// Buffers brought back to the device, and their bytes.
    pub unspilled_count: u64,
    /// See `unspilled_count`.
    pub unspilled_bytes: u64,
    /// Wall time during which data came back (overlapping moves counted once).
    pub unspill_seconds: f64,
    /// Pinned host bytes holding spilled data, and the pool's size now.
    pub host_bytes: u64,
    /// See `host_bytes`.
    pub host_pool_bytes: u64,
    /// Time spent pinning the host pool (at start, or as it grew).
    pub host_pinning_seconds: f64,
    /// Bytes held in spill files.
    pub disk_bytes: u64,
    /// The host tier's moves.
    pub host: TierStatistics,
    /// The disk tier's moves (all zero without `spill.disk_directory`).
    pub disk: TierStatistics,
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
            "spill: limit {}, tracked {} (peak {}); off the device {} buffers, {} at {:.1} GB/s; back {} buffers, {} at {:.1} GB/s",
            b(self.limit),
            b(self.tracked_bytes),
            b(self.peak_tracked_bytes),
            self.spilled_count,
            b(self.spilled_bytes),
            self.spill_gbps(),
            self.unspilled_count,
            b(self.unspilled_bytes),
            self.unspill_gbps()
        )?;
        for (name, t, extra) in [
            (
                "host",
                &self.host,
                format!(" of a {} pool", b(self.host_pool_bytes)),
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

/// Count, bytes and time of one kind of move.
///
/// The time is wall time during which at least one such move was copying (the union of the
/// moves' intervals): moves that overlap share one copy engine and wait for one another, so
/// adding their own durations would count the same seconds several times.
#[derive(Default)]
struct Moves {
    count: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    /// The merged interval of the latest moves, (start, end) in ns since the process's epoch.
    busy: Mutex<(u64, u64)>,
}

/// Nanoseconds since the first call (a monotonic clock for the intervals above).
fn clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

impl Moves {
    /// A move of `bytes` that ended now after `nanos`.
    fn add(&self, bytes: usize, nanos: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let end = clock_ns();
        let start = end.saturating_sub(nanos);
        let mut busy = self.busy.lock();
        let (from, until) = *busy;
        let new = if start >= until {
            // Disjoint from what came before: a new interval.
            *busy = (start, end);
            nanos
        } else {
            // Overlapping: only the parts outside the merged interval are new.
            *busy = (from.min(start), until.max(end));
            end.saturating_sub(until) + from.saturating_sub(start)
        };
        drop(busy);
        self.nanos.fetch_add(new, Ordering::Relaxed);
    }

    /// (count, bytes, seconds) summed over `moves`.
    fn sum<'a>(moves: impl IntoIterator<Item = &'a Moves>) -> (u64, u64, f64) {
        moves.into_iter().fold((0, 0, 0.0), |(c, b, s), m| {
            (
                c + m.count.load(Ordering::Relaxed),
                b + m.bytes.load(Ordering::Relaxed),
                s + Duration::from_nanos(m.nanos.load(Ordering::Relaxed)).as_secs_f64(),
            )
        })
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
    /// Moves by (from, to) tier: `moves[from as usize][to as usize]`.
    moves: [[Moves; 3]; 3],
    /// The host tier, when a disk tier is behind it (else nothing is ever moved off it).
    host_over_disk: Option<PinnedHostPool>,
}

impl Tracker {
    /// Live buffers in least-recently-used order (not `except`), taken under the lock and
    /// looked at after it (a buffer may be moving: its owner holds its lock while it asks
    /// for room).
    fn oldest_first(&self, except: Option<u64>) -> Vec<Arc<SpillableBuffer>> {
        let lru = self.lru.lock();
        lru.order
            .values()
            .filter(|id| Some(**id) != except)
            .filter_map(|id| lru.entries.get(id).and_then(|(_, w)| w.upgrade()))
            .collect()
    }

    /// Spills least recently used buffers (not `except`) until `need` device bytes are freed
    /// or nothing more can go; returns the bytes freed.
    fn spill_oldest(&self, need: u64, except: Option<u64>) -> rmm_allocator::Result<u64> {
        let mut freed = 0;
        let mut first_error = None;
        for b in self.oldest_first(except) {
            if freed >= need {
                break;
            }
            // `spill` skips buffers in use, busy or already spilled, without waiting. One that
            // cannot move (e.g. larger than a full host pool) does not stop the others.
            if b.tier() == Tier::Device && !b.is_in_use() {
                match b.spill() {
                    Ok(n) => freed += n as u64,
                    Err(e) => {
                        tracing::debug!(id = b.id(), "a buffer could not be spilled: {e}");
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) if freed < need => Err(e),
            _ => Ok(freed),
        }
    }

    /// Moves least recently used host data (not `except`'s) to disk until `host` can hand
    /// out `need` bytes (in slices of at most its largest); returns the bytes moved.
    fn demote_oldest(
        &self,
        host: &PinnedHostPool,
        need: usize,
        except: u64,
    ) -> rmm_allocator::Result<u64> {
        let contiguous = need.min(host.max_slice());
        let fits = || {
            host.capacity().saturating_sub(host.used()) >= need && host.largest_free() >= contiguous
        };
        let mut moved = 0;
        for b in self.oldest_first(Some(except)) {
            if fits() {
                break;
            }
            if b.tier() == Tier::Host {
                moved += b.spill_to_disk()? as u64;
            }
        }
        Ok(moved)
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

    fn make_host_room(&self, id: u64, bytes: usize) {
        let Some(host) = &self.host_over_disk else {
            return;
        };
        // Data larger than a fixed pool goes straight to disk: moving others would not help.
        if !host.is_growable() && bytes > host.capacity() {
            return;
        }
        if let Err(e) = self.demote_oldest(host, bytes, id) {
            tracing::warn!("moving host data to disk to make room for {bytes} bytes: {e}");
        }
    }

    fn resident(&self, _id: u64, delta: i64) {
        let now = self.tracked.fetch_add(delta, Ordering::Relaxed) + delta;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn moved(&self, _id: u64, from: Tier, to: Tier, bytes: usize, nanos: u64) {
        self.moves[from as usize][to as usize].add(bytes, nanos);
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
    store: Arc<SpillStore>,
    /// `spill.host_pool_size` and `spill.disk_directory` as made (they cannot change later).
    made_with: (Option<u64>, Option<std::path::PathBuf>),
    tracker: Arc<Tracker>,
    eager_unspill: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for SpillManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillManager")
            .field("device", &self.device())
            .field("statistics", &self.statistics())
            .finish()
    }
}

impl SpillManager {
    /// A manager for `device` as `spill` configures it: a pinned host pool of
    /// `spill.host_pool_size`, pinned now (or, with `"none"`, pinned as needed), and a disk
    /// tier under `spill.disk_directory`.
    pub fn new(device: Device, spill: &ResolvedSpill) -> rmm_allocator::Result<SpillManager> {
        let host = match spill.host_pool_size {
            Some(bytes) => PinnedHostPool::on(device.backend(), bytes as usize)?,
            None => PinnedHostPool::growable(device.backend(), None),
        };
        let store = SpillStore::new(device, host, spill.disk_directory.as_deref())?;
        let tracker = Arc::new(Tracker {
            host_over_disk: store.has_disk().then(|| store.host().clone()),
            ..Tracker::default()
        });
        tracker.limit.store(spill.threshold, Ordering::Relaxed);
        Ok(SpillManager {
            made_with: (spill.host_pool_size, spill.disk_directory.clone()),
            store,
            tracker,
            eager_unspill: spill.eager_unspill.into(),
        })
    }

    /// Takes the settings of a new configuration (limit, eager unspilling); the host pool,
    /// the disk tier and the buffers stay (a change of `spill.host_pool_size` or
    /// `spill.disk_directory` is logged and takes effect in a new runtime).
    pub fn reconfigure(&self, spill: &ResolvedSpill) {
        if (spill.host_pool_size, spill.disk_directory.clone()) != self.made_with {
            tracing::warn!(
                device = self.device().ordinal(),
                "spill.host_pool_size and spill.disk_directory keep the values the runtime \
                 started with ({:?}, {:?}); a new runtime takes the new ones",
                self.made_with.0,
                self.made_with.1
            );
        }
        self.tracker.limit.store(spill.threshold, Ordering::Relaxed);
        self.eager_unspill
            .store(spill.eager_unspill, Ordering::Relaxed);
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.store.device()
    }

    /// Where spilled data goes.
    pub fn store(&self) -> &Arc<SpillStore> {
        &self.store
    }

    fn observer(&self) -> Option<Arc<dyn SpillObserver>> {
        Some(Arc::clone(&self.tracker) as Arc<dyn SpillObserver>)
    }

    /// `size` uninitialized bytes on the device, spillable, used on `stream`; older buffers
    /// are spilled first if the limit requires.
    pub fn buffer(
        &self,
        size: usize,
        stream: StreamView,
    ) -> rmm_allocator::Result<Arc<SpillableBuffer>> {
        let b = SpillableBuffer::new(&self.store, size, stream, self.observer())?;
        self.register(&b);
        Ok(b)
    }

    /// A spillable copy of `bytes`.
    pub fn from_host(
        &self,
        bytes: &[u8],
        stream: StreamView,
    ) -> rmm_allocator::Result<Arc<SpillableBuffer>> {
        let b = SpillableBuffer::from_host(&self.store, bytes, stream, self.observer())?;
        self.register(&b);
        Ok(b)
    }

    /// `len` uninitialized elements on the device, spillable, used on `stream`.
    pub fn vector<T: Pod>(
        &self,
        len: usize,
        stream: StreamView,
    ) -> rmm_allocator::Result<SpillableVector<T>> {
        let v = SpillableVector::new(&self.store, len, stream, self.observer())?;
        self.register(v.buffer());
        Ok(v)
    }

    /// A spillable copy of `data`.
    pub fn vector_from_slice<T: Pod>(
        &self,
        data: &[T],
        stream: StreamView,
    ) -> rmm_allocator::Result<SpillableVector<T>> {
        let v = SpillableVector::from_slice(&self.store, data, stream, self.observer())?;
        self.register(v.buffer());
        Ok(v)
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

    /// Brings spilled buffers back (up to the limit, most recently used first) on `stream`;
    /// returns the bytes brought back.
    pub fn unspill_all(&self, stream: StreamView) -> rmm_allocator::Result<u64> {
        let mut buffers = self.tracker.oldest_first(None);
        buffers.reverse();
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
        let m = |from: Tier, to: Tier| &t.moves[from as usize][to as usize];
        let (d, h, k) = (Tier::Device, Tier::Host, Tier::Disk);
        let (spilled_count, spilled_bytes, spill_seconds) = Moves::sum([m(d, h), m(d, k)]);
        let (unspilled_count, unspilled_bytes, unspill_seconds) = Moves::sum([m(h, d), m(k, d)]);
        let tier = |into: [&Moves; 2], out: [&Moves; 2], held: u64| {
            let (spilled_count, spilled_bytes, spill_seconds) = Moves::sum(into);
            let (unspilled_count, unspilled_bytes, unspill_seconds) = Moves::sum(out);
            TierStatistics {
                spilled_count,
                spilled_bytes,
                spill_seconds,
                unspilled_count,
                unspilled_bytes,
                unspill_seconds,
                held_bytes: held,
            }
        };
        let host_bytes = self.store.host().used() as u64;
        let disk_bytes = self.store.disk_bytes();
        SpillStatistics {
            device: self.device().ordinal(),
            limit: t.limit.load(Ordering::Relaxed),
            tracked_bytes: t.tracked.load(Ordering::Relaxed).max(0) as u64,
            peak_tracked_bytes: t.peak.load(Ordering::Relaxed).max(0) as u64,
            spilled_count,
            spilled_bytes,
            spill_seconds,
            unspilled_count,
            unspilled_bytes,
            unspill_seconds,
            host_bytes,
            host_pool_bytes: self.store.host().capacity() as u64,
            host_pinning_seconds: self.store.host().pinning_time().as_secs_f64(),
            disk_bytes,
            host: tier([m(d, h), m(k, h)], [m(h, d), m(h, k)], host_bytes),
            disk: tier([m(d, k), m(h, k)], [m(k, d), m(k, h)], disk_bytes),
        }
    }
}
