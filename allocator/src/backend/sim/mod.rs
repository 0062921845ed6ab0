//! The simulated device: N devices of a configured capacity, for machines without a GPU.
//!
//! * *Backed* mode keeps every byte in host memory, so data round-trips exactly (containers,
//!   spilling). Device addresses are the host addresses of the backing blocks.
//! * *Unbacked* mode hands out addresses from a reserved range and touches nothing, so an
//!   80 GiB device can be simulated on a small machine (allocator benchmarks, "would this fit").
//!
//! Streams are worker threads that keep stream order; events capture stream progress. Fault
//! injection fails the N-th device allocation, allocations above a size, or the N-th copy.
//! Stream-ordered pools (`cuMemAllocAsync`) are modelled without the driver's caching: memory
//! is taken at allocation and given back when the stream reaches the free.

mod memory;
mod stream;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use self::memory::{
    AllocKind, Allocation, AllocationTable, Backing, DEVICE_ALIGNMENT, HOST_ALIGNMENT,
};
pub use self::stream::StreamGate;
use self::stream::{SimEvent, SimStream};
use super::{
    Backend, BackendKind, DeviceProperties, DevicePtr, MemInfo, RawEvent, RawMemPool, RawStream,
};
use crate::error::{Error, Result, fmt_bytes};

/// Whether simulated device memory holds data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimMemoryMode {
    /// Host memory backs every allocation; copies move real bytes.
    Backed,
    /// Addresses only; copies are checked but move nothing, reads see zeros.
    Unbacked,
}

/// How the simulated backend is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of devices.
    pub devices: u32,
    /// Memory of each device in bytes.
    pub capacity: usize,
    /// Backed or unbacked memory.
    pub mode: SimMemoryMode,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 2,
            capacity: 24 << 30,
            mode: SimMemoryMode::Backed,
        }
    }
}

impl SimConfig {
    /// The default configuration overridden by `RMM_SIM_DEVICES` (a count),
    /// `RMM_SIM_MEMORY` (bytes or e.g. `80GiB`) and `RMM_SIM_MODE` (`backed` or `unbacked`).
    pub fn from_env() -> Result<Self> {
        let mut cfg = SimConfig::default();
        if let Ok(v) = std::env::var("RMM_SIM_DEVICES") {
            cfg.devices = v
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| {
                    Error::invalid_argument("RMM_SIM_DEVICES", &v, "a device count from 1 to 64")
                })?;
        }
        if let Ok(v) = std::env::var("RMM_SIM_MEMORY") {
            cfg.capacity = parse_capacity(&v).ok_or_else(|| {
                Error::invalid_argument(
                    "RMM_SIM_MEMORY",
                    &v,
                    "a positive size in bytes or with a unit, e.g. 80GiB or 512MB",
                )
            })?;
        }
        if let Ok(v) = std::env::var("RMM_SIM_MODE") {
            cfg.mode = match v.trim().to_ascii_lowercase().as_str() {
                "backed" => SimMemoryMode::Backed,
                "unbacked" => SimMemoryMode::Unbacked,
                _ => {
                    return Err(Error::invalid_argument(
                        "RMM_SIM_MODE",
                        &v,
                        "\"backed\" or \"unbacked\"",
                    ));
                }
            };
        }
        Ok(cfg)
    }
}

/// Parses `123`, `80GiB`, `512 MB`, `1.5GB` into bytes.
fn parse_capacity(text: &str) -> Option<usize> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = value * scale;
    (1.0..1e18).contains(&bytes).then_some(bytes as usize)
}

/// Faults to inject on one device.
#[derive(Debug, Default)]
struct Faults {
    /// Fail the device allocation with this 1-based number (0: none).
    fail_alloc_at: AtomicU64,
    /// Fail device allocations larger than this (usize::MAX: none).
    fail_alloc_above: AtomicUsize,
    /// Fail the copy with this 1-based number (0: none).
    fail_copy_at: AtomicU64,
    allocs: AtomicU64,
    copies: AtomicU64,
}

#[derive(Debug)]
struct SimDevice {
    used: Arc<AtomicUsize>,
    default_stream: OnceLock<Arc<SimStream>>,
    faults: Faults,
}

#[derive(Debug)]
struct SimPool {
    device: u32,
    reserved: AtomicU64,
}

/// The simulated backend. Make one with [`SimBackend::new`] or [`SimBackend::leak`].
#[derive(Debug)]
pub struct SimBackend {
    config: SimConfig,
    devices: Vec<SimDevice>,
    table: Arc<Mutex<AllocationTable>>,
    host: Mutex<HashMap<u64, HostBlock>>,
    streams: RwLock<HashMap<u64, Arc<SimStream>>>,
    events: RwLock<HashMap<u64, Arc<SimEvent>>>,
    pools: RwLock<HashMap<u64, Arc<SimPool>>>,
    next_handle: AtomicU64,
}

#[derive(Debug)]
enum HostBlock {
    Pinned(Backing),
    Registered { bytes: usize },
}

impl SimBackend {
    /// Builds a simulated backend.
    pub fn new(config: SimConfig) -> Result<SimBackend> {
        if config.devices == 0 || config.devices > 64 {
            return Err(Error::invalid_argument(
                "SimConfig::devices",
                config.devices,
                "a device count from 1 to 64",
            ));
        }
        if config.capacity == 0 {
            return Err(Error::invalid_argument(
                "SimConfig::capacity",
                0,
                "a capacity of at least one byte",
            ));
        }
        let devices = (0..config.devices)
            .map(|_| SimDevice {
                used: Arc::new(AtomicUsize::new(0)),
                default_stream: OnceLock::new(),
                faults: Faults {
                    fail_alloc_above: AtomicUsize::new(usize::MAX),
                    ..Faults::default()
                },
            })
            .collect();
        Ok(SimBackend {
            table: Arc::new(Mutex::new(AllocationTable::new(config.devices))),
            config,
            devices,
            host: Mutex::new(HashMap::new()),
            streams: RwLock::new(HashMap::new()),
            events: RwLock::new(HashMap::new()),
            pools: RwLock::new(HashMap::new()),
            next_handle: AtomicU64::new(0x1000),
        })
    }

    /// Builds a simulated backend that lives for the rest of the process, as backends do.
    pub fn leak(config: SimConfig) -> Result<&'static SimBackend> {
        Ok(Box::leak(Box::new(SimBackend::new(config)?)))
    }

    /// The configuration this backend was built with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Makes the `n`-th device allocation from now on `dev` fail with out-of-memory
    /// (`n` = 1: the next one). `n` = 0 clears it.
    pub fn fail_nth_allocation(&self, dev: u32, n: u64) -> Result<()> {
        let f = &self.device(dev)?.faults;
        let base = f.allocs.load(Ordering::SeqCst);
        f.fail_alloc_at
            .store(if n == 0 { 0 } else { base + n }, Ordering::SeqCst);
        Ok(())
    }

    /// Makes every device allocation on `dev` larger than `bytes` fail with out-of-memory.
    pub fn fail_allocations_above(&self, dev: u32, bytes: usize) -> Result<()> {
        self.device(dev)?
            .faults
            .fail_alloc_above
            .store(bytes, Ordering::SeqCst);
        Ok(())
    }

    /// Makes the `n`-th copy or memset from now on `dev` fail (`n` = 0 clears it).
    pub fn fail_nth_copy(&self, dev: u32, n: u64) -> Result<()> {
        let f = &self.device(dev)?.faults;
        let base = f.copies.load(Ordering::SeqCst);
        f.fail_copy_at
            .store(if n == 0 { 0 } else { base + n }, Ordering::SeqCst);
        Ok(())
    }

    /// Removes every injected fault on `dev`.
    pub fn clear_faults(&self, dev: u32) -> Result<()> {
        let f = &self.device(dev)?.faults;
        f.fail_alloc_at.store(0, Ordering::SeqCst);
        f.fail_copy_at.store(0, Ordering::SeqCst);
        f.fail_alloc_above.store(usize::MAX, Ordering::SeqCst);
        Ok(())
    }

    /// Holds `stream` back: work queued on it from now on waits until the gate is opened.
    pub fn hold_stream(&self, dev: u32, stream: RawStream) -> Result<StreamGate> {
        let s = self.stream(dev, stream)?;
        let (gate, job) = StreamGate::new();
        s.submit(job);
        Ok(gate)
    }

    /// Queues a delay of `duration` on `stream`, standing in for a long-running kernel.
    pub fn delay_stream(&self, dev: u32, stream: RawStream, duration: Duration) -> Result<()> {
        let s = self.stream(dev, stream)?;
        s.submit(move || std::thread::sleep(duration));
        Ok(())
    }

    /// Bytes of page-locked host memory allocated or registered through this backend.
    pub fn pinned_host_bytes(&self) -> usize {
        self.host
            .lock()
            .values()
            .map(|b| match b {
                HostBlock::Pinned(backing) => backing.len(),
                HostBlock::Registered { bytes } => *bytes,
            })
            .sum()
    }

    /// Number of live device, managed and pool allocations on `dev`.
    pub fn live_allocations(&self, dev: u32) -> usize {
        self.table.lock().count_on(dev)
    }

    fn device(&self, dev: u32) -> Result<&SimDevice> {
        self.devices.get(dev as usize).ok_or(Error::NoSuchDevice {
            requested: dev,
            count: self.config.devices,
            backend: "sim",
        })
    }

    fn stream(&self, dev: u32, stream: RawStream) -> Result<Arc<SimStream>> {
        let d = self.device(dev)?;
        if stream == 0 {
            if let Some(s) = d.default_stream.get() {
                return Ok(Arc::clone(s));
            }
            let s = SimStream::spawn(dev, format!("sim-dev{dev}-default"))
                .map_err(|e| spawn_error(dev, e))?;
            return Ok(Arc::clone(d.default_stream.get_or_init(|| s)));
        }
        match self.streams.read().get(&stream) {
            Some(s) if s.device == dev => Ok(Arc::clone(s)),
            _ => Err(Error::invalid_argument(
                "stream",
                format!("{stream:#x} on device {dev}"),
                "a stream created on this device and not yet destroyed",
            )),
        }
    }

    fn event(&self, dev: u32, event: RawEvent) -> Result<Arc<SimEvent>> {
        match self.events.read().get(&event) {
            Some(e) if e.device == dev => Ok(Arc::clone(e)),
            _ => Err(Error::invalid_argument(
                "event",
                format!("{event:#x} on device {dev}"),
                "an event created on this device and not yet destroyed",
            )),
        }
    }

    fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    fn oom(dev: u32, call: &'static str, bytes: usize, reason: &str) -> Error {
        Error::Driver {
            call,
            device: dev,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            code: 2,
            description: format!(
                "out of memory (simulated: {} requested, {reason})",
                fmt_bytes(bytes)
            ),
        }
    }

    fn allocate(
        &self,
        dev: u32,
        bytes: usize,
        kind: AllocKind,
        call: &'static str,
    ) -> Result<DevicePtr> {
        let d = self.device(dev)?;
        if bytes == 0 {
            return Err(Error::invalid_argument(
                "bytes",
                0,
                "a size of at least one byte",
            ));
        }
        let n = d.faults.allocs.fetch_add(1, Ordering::SeqCst) + 1;
        if d.faults.fail_alloc_at.load(Ordering::SeqCst) == n {
            return Err(Self::oom(
                dev,
                call,
                bytes,
                "injected failure of this allocation",
            ));
        }
        if bytes > d.faults.fail_alloc_above.load(Ordering::SeqCst) {
            return Err(Self::oom(dev, call, bytes, "injected failure above a size"));
        }
        let len = bytes.next_multiple_of(DEVICE_ALIGNMENT);
        // Reserve capacity first so concurrent allocations cannot overshoot it.
        let reserved = d
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(len).filter(|&u| u <= self.config.capacity)
            });
        if reserved.is_err() {
            let free =
                self.config.capacity - d.used.load(Ordering::SeqCst).min(self.config.capacity);
            return Err(Self::oom(
                dev,
                call,
                bytes,
                &format!("{} free", fmt_bytes(free)),
            ));
        }
        let result = match self.config.mode {
            SimMemoryMode::Backed => match Backing::new(len, DEVICE_ALIGNMENT) {
                Some(b) => {
                    let addr = b.addr();
                    self.table.lock().insert(
                        addr,
                        Allocation {
                            device: dev,
                            len,
                            kind,
                            backing: Some(Arc::new(b)),
                        },
                    );
                    Some(addr)
                }
                None => None,
            },
            SimMemoryMode::Unbacked => {
                let mut table = self.table.lock();
                table.reserve_unbacked(dev, len).inspect(|&addr| {
                    table.insert(
                        addr,
                        Allocation {
                            device: dev,
                            len,
                            kind,
                            backing: None,
                        },
                    );
                })
            }
        };
        match result {
            Some(addr) => Ok(DevicePtr(addr)),
            None => {
                d.used.fetch_sub(len, Ordering::SeqCst);
                Err(Self::oom(dev, call, bytes, "the host could not back it"))
            }
        }
    }

    fn release(&self, dev: u32, ptr: DevicePtr, expect_pool: bool) -> Result<()> {
        let d = self.device(dev)?;
        let mut table = self.table.lock();
        let ok = table.get(ptr.addr()).is_some_and(|a| {
            a.device == dev && matches!(a.kind, AllocKind::Pool(_)) == expect_pool
        });
        if !ok {
            return Err(Error::InvalidPointer {
                ptr: ptr.addr(),
                bytes: 0,
                resource: "the simulated device",
            });
        }
        if let Some(a) = table.remove(ptr.addr()) {
            d.used.fetch_sub(a.len, Ordering::SeqCst);
            if let AllocKind::Pool(p) = a.kind
                && let Some(pool) = self.pools.read().get(&p)
            {
                pool.reserved.fetch_sub(a.len as u64, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    fn count_copy(&self, dev: u32) -> Result<()> {
        let f = &self.device(dev)?.faults;
        let n = f.copies.fetch_add(1, Ordering::SeqCst) + 1;
        if f.fail_copy_at.load(Ordering::SeqCst) == n {
            return Err(Error::InjectedFault {
                what: "copy",
                device: dev,
            });
        }
        Ok(())
    }
}

fn spawn_error(dev: u32, e: std::io::Error) -> Error {
    Error::Driver {
        call: "cuStreamCreate",
        device: dev,
        name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        code: 2,
        description: format!("the simulated stream's worker thread could not start: {e}"),
    }
}

/// Copies `bytes` between two resolved ranges (either may be unbacked).
///
/// # Safety
/// Host pointers, when given, are valid for `bytes`.
unsafe fn move_bytes(dst: Option<*mut u8>, src: Option<*const u8>, bytes: usize) {
    match (dst, src) {
        // SAFETY: the caller guarantees both ranges are valid; `copy` allows overlap.
        (Some(d), Some(s)) => unsafe { std::ptr::copy(s, d, bytes) },
        // Unbacked source: the destination reads as zeros.
        // SAFETY: the caller guarantees `d` is valid for `bytes`.
        (Some(d), None) => unsafe { std::ptr::write_bytes(d, 0, bytes) },
        _ => {}
    }
}

impl Backend for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Sim
    }

    fn holds_data(&self) -> bool {
        self.config.mode == SimMemoryMode::Backed
    }

    fn describe(&self) -> String {
        format!(
            "sim ({} device{} × {}, {})",
            self.config.devices,
            if self.config.devices == 1 { "" } else { "s" },
            fmt_bytes(self.config.capacity),
            match self.config.mode {
                SimMemoryMode::Backed => "backed",
                SimMemoryMode::Unbacked => "unbacked",
            }
        )
    }

    fn device_count(&self) -> u32 {
        self.config.devices
    }

    fn properties(&self, dev: u32) -> Result<DeviceProperties> {
        self.device(dev)?;
        Ok(DeviceProperties {
            ordinal: dev,
            name: "rmm-rs simulated GPU".into(),
            total_memory: self.config.capacity,
            uuid: format!("GPU-5111a7ed-0000-4000-8000-{:012x}", dev),
            compute_capability: (9, 0),
            supports_memory_pools: true,
            supports_managed_memory: true,
        })
    }

    fn mem_info(&self, dev: u32) -> Result<MemInfo> {
        let used = self.device(dev)?.used.load(Ordering::SeqCst);
        Ok(MemInfo {
            free: self.config.capacity.saturating_sub(used),
            total: self.config.capacity,
        })
    }

    fn malloc(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        self.allocate(dev, bytes, AllocKind::Device, "cuMemAlloc_v2")
    }

    fn free(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        self.release(dev, ptr, false)
    }

    fn malloc_managed(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        self.allocate(dev, bytes, AllocKind::Managed, "cuMemAllocManaged")
    }

    fn mem_pool_create(&self, dev: u32, _release_threshold: u64) -> Result<RawMemPool> {
        self.device(dev)?;
        let h = self.handle();
        self.pools.write().insert(
            h,
            Arc::new(SimPool {
                device: dev,
                reserved: AtomicU64::new(0),
            }),
        );
        Ok(h)
    }

    fn mem_pool_destroy(&self, dev: u32, pool: RawMemPool) -> Result<()> {
        let mut pools = self.pools.write();
        match pools.get(&pool) {
            Some(p) if p.device == dev => {
                pools.remove(&pool);
                Ok(())
            }
            _ => Err(Error::invalid_argument(
                "memory pool",
                format!("{pool:#x}"),
                "a live pool of this device",
            )),
        }
    }

    fn mem_pool_trim(&self, dev: u32, pool: RawMemPool, _keep_bytes: usize) -> Result<()> {
        // Nothing is cached: freed blocks go back to the device when the stream reaches them.
        self.mem_pool_reserved(dev, pool).map(|_| ())
    }

    fn mem_pool_reserved(&self, dev: u32, pool: RawMemPool) -> Result<u64> {
        match self.pools.read().get(&pool) {
            Some(p) if p.device == dev => Ok(p.reserved.load(Ordering::SeqCst)),
            _ => Err(Error::invalid_argument(
                "memory pool",
                format!("{pool:#x}"),
                "a live pool of this device",
            )),
        }
    }

    fn malloc_async(
        &self,
        dev: u32,
        pool: RawMemPool,
        bytes: usize,
        stream: RawStream,
    ) -> Result<DevicePtr> {
        self.stream(dev, stream)?;
        let p = match self.pools.read().get(&pool) {
            Some(p) if p.device == dev => Arc::clone(p),
            _ => {
                return Err(Error::invalid_argument(
                    "memory pool",
                    format!("{pool:#x}"),
                    "a live pool of this device",
                ));
            }
        };
        let ptr = self.allocate(dev, bytes, AllocKind::Pool(pool), "cuMemAllocFromPoolAsync")?;
        p.reserved.fetch_add(
            bytes.next_multiple_of(DEVICE_ALIGNMENT) as u64,
            Ordering::SeqCst,
        );
        Ok(ptr)
    }

    fn free_async(&self, dev: u32, ptr: DevicePtr, stream: RawStream) -> Result<()> {
        let s = self.stream(dev, stream)?;
        let pool = match self.table.lock().get(ptr.addr()) {
            Some(a) if a.device == dev => match a.kind {
                AllocKind::Pool(p) => self.pools.read().get(&p).cloned(),
                _ => None,
            },
            _ => None,
        };
        let Some(pool) = pool else {
            return Err(Error::InvalidPointer {
                ptr: ptr.addr(),
                bytes: 0,
                resource: "simulated cuMemFreeAsync",
            });
        };
        let table = Arc::clone(&self.table);
        let used = Arc::clone(&self.device(dev)?.used);
        let release = move || {
            if let Some(a) = table.lock().remove(ptr.addr()) {
                used.fetch_sub(a.len, Ordering::SeqCst);
                pool.reserved.fetch_sub(a.len as u64, Ordering::SeqCst);
            }
        };
        // With nothing queued, the stream has already reached the free.
        if s.is_idle() {
            release();
        } else {
            s.submit(release);
        }
        Ok(())
    }

    fn malloc_host(&self, bytes: usize) -> Result<*mut u8> {
        if bytes == 0 {
            return Err(Error::invalid_argument(
                "bytes",
                0,
                "a size of at least one byte",
            ));
        }
        let b = Backing::new(bytes, HOST_ALIGNMENT).ok_or(Error::HostOutOfMemory {
            requested: bytes,
            resource: "simulated cuMemHostAlloc",
        })?;
        let ptr = b.ptr();
        self.host.lock().insert(ptr as u64, HostBlock::Pinned(b));
        Ok(ptr)
    }

    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()> {
        let mut host = self.host.lock();
        match host.get(&(ptr as u64)) {
            Some(HostBlock::Pinned(_)) => {
                host.remove(&(ptr as u64));
                Ok(())
            }
            _ => Err(Error::InvalidPointer {
                ptr: ptr as u64,
                bytes: 0,
                resource: "simulated cuMemFreeHost",
            }),
        }
    }

    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        if ptr.is_null() || bytes == 0 {
            return Err(Error::invalid_argument(
                "host range",
                format!("{ptr:p} + {bytes}"),
                "a non-null pointer and a non-zero length",
            ));
        }
        let mut host = self.host.lock();
        if host.contains_key(&(ptr as u64)) {
            return Err(Error::invalid_argument(
                "host range",
                format!("{ptr:p}"),
                "a range not already registered (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)",
            ));
        }
        host.insert(ptr as u64, HostBlock::Registered { bytes });
        Ok(())
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        let mut host = self.host.lock();
        match host.get(&(ptr as u64)) {
            Some(HostBlock::Registered { .. }) => {
                host.remove(&(ptr as u64));
                Ok(())
            }
            _ => Err(Error::InvalidPointer {
                ptr: ptr as u64,
                bytes: 0,
                resource: "simulated cuMemHostUnregister",
            }),
        }
    }

    fn memcpy_htod(&self, dev: u32, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // As in CUDA: ordered after the work queued on the (legacy) default stream.
        self.stream(dev, 0)?.synchronize();
        self.count_copy(dev)?;
        let d = self
            .table
            .lock()
            .resolve(dst, src.len(), "simulated cuMemcpyHtoD")?;
        // SAFETY: `d` was validated for `src.len()` bytes and its backing is kept alive by `d`.
        unsafe { move_bytes(d.host_ptr(), Some(src.as_ptr()), src.len()) };
        Ok(())
    }

    fn memcpy_dtoh(&self, dev: u32, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // As in CUDA: ordered after the work queued on the (legacy) default stream.
        self.stream(dev, 0)?.synchronize();
        self.count_copy(dev)?;
        let s = self
            .table
            .lock()
            .resolve(src, dst.len(), "simulated cuMemcpyDtoH")?;
        let src_ptr = s.host_ptr().map(|p| p as *const u8);
        // SAFETY: `s` was validated for `dst.len()` bytes; `dst` is an exclusive slice.
        unsafe { move_bytes(Some(dst.as_mut_ptr()), src_ptr, dst.len()) };
        Ok(())
    }

    fn memcpy_dtod(&self, dev: u32, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // As in CUDA: ordered after the work queued on the (legacy) default stream.
        self.stream(dev, 0)?.synchronize();
        self.count_copy(dev)?;
        let (d, s) = {
            let t = self.table.lock();
            (
                t.resolve(dst, bytes, "simulated cuMemcpyDtoD")?,
                t.resolve(src, bytes, "simulated cuMemcpyDtoD")?,
            )
        };
        // SAFETY: both ranges were validated for `bytes` and their backings are alive.
        unsafe { move_bytes(d.host_ptr(), s.host_ptr().map(|p| p as *const u8), bytes) };
        Ok(())
    }

    fn memset(&self, dev: u32, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.count_copy(dev)?;
        let d = self
            .table
            .lock()
            .resolve(dst, bytes, "simulated cuMemsetD8")?;
        if let Some(p) = d.host_ptr() {
            // SAFETY: validated for `bytes`.
            unsafe { std::ptr::write_bytes(p, value, bytes) };
        }
        Ok(())
    }

    unsafe fn memcpy_htod_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        let s = self.stream(dev, stream)?;
        self.count_copy(dev)?;
        let d = self
            .table
            .lock()
            .resolve(dst, bytes, "simulated cuMemcpyHtoDAsync")?;
        let src = src as usize;
        s.submit(move || {
            // SAFETY: the caller keeps `src` valid until the stream runs this job; `d` keeps
            // the destination's backing alive.
            unsafe { move_bytes(d.host_ptr(), Some(src as *const u8), bytes) }
        });
        Ok(())
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dev: u32,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        let s = self.stream(dev, stream)?;
        self.count_copy(dev)?;
        let r = self
            .table
            .lock()
            .resolve(src, bytes, "simulated cuMemcpyDtoHAsync")?;
        let dst = dst as usize;
        s.submit(move || {
            // SAFETY: the caller keeps `dst` valid and untouched until the stream runs this
            // job; `r` keeps the source's backing alive.
            unsafe {
                move_bytes(
                    Some(dst as *mut u8),
                    r.host_ptr().map(|p| p as *const u8),
                    bytes,
                )
            }
        });
        Ok(())
    }

    fn memcpy_dtod_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        let s = self.stream(dev, stream)?;
        self.count_copy(dev)?;
        let (d, r) = {
            let t = self.table.lock();
            (
                t.resolve(dst, bytes, "simulated cuMemcpyDtoDAsync")?,
                t.resolve(src, bytes, "simulated cuMemcpyDtoDAsync")?,
            )
        };
        s.submit(move || {
            // SAFETY: both ranges were validated and their backings are kept alive by `d`, `r`.
            unsafe { move_bytes(d.host_ptr(), r.host_ptr().map(|p| p as *const u8), bytes) }
        });
        Ok(())
    }

    fn memset_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        let s = self.stream(dev, stream)?;
        self.count_copy(dev)?;
        let d = self
            .table
            .lock()
            .resolve(dst, bytes, "simulated cuMemsetD8Async")?;
        s.submit(move || {
            if let Some(p) = d.host_ptr() {
                // SAFETY: validated for `bytes`; `d` keeps the backing alive.
                unsafe { std::ptr::write_bytes(p, value, bytes) }
            }
        });
        Ok(())
    }

    fn stream_create(&self, dev: u32) -> Result<RawStream> {
        self.device(dev)?;
        let h = self.handle();
        let s = SimStream::spawn(dev, format!("sim-dev{dev}-stream{h:x}"))
            .map_err(|e| spawn_error(dev, e))?;
        self.streams.write().insert(h, s);
        Ok(h)
    }

    fn stream_destroy(&self, dev: u32, stream: RawStream) -> Result<()> {
        if stream == 0 {
            return Err(Error::invalid_argument(
                "stream",
                0,
                "a stream made by stream_create (the default stream cannot be destroyed)",
            ));
        }
        let s = self.stream(dev, stream)?;
        self.streams.write().remove(&stream);
        s.close();
        Ok(())
    }

    fn stream_synchronize(&self, dev: u32, stream: RawStream) -> Result<()> {
        self.stream(dev, stream)?.synchronize();
        Ok(())
    }

    fn stream_query(&self, dev: u32, stream: RawStream) -> Result<bool> {
        Ok(self.stream(dev, stream)?.is_idle())
    }

    fn stream_query_if_alive(&self, dev: u32, stream: RawStream) -> Result<Option<bool>> {
        // Simulated streams are reference-counted: one found is alive for the whole query.
        Ok(self.stream(dev, stream).ok().map(|s| s.is_idle()))
    }

    fn stream_synchronize_if_alive(&self, dev: u32, stream: RawStream) -> Result<bool> {
        match self.stream(dev, stream) {
            Ok(s) => {
                s.synchronize();
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    fn stream_wait_event(&self, dev: u32, stream: RawStream, event: RawEvent) -> Result<()> {
        let s = self.stream(dev, stream)?;
        let e = self.event(dev, event)?;
        if let Some((progress, target)) = e.target() {
            s.submit(move || progress.wait_for(target));
        }
        Ok(())
    }

    fn event_create(&self, dev: u32) -> Result<RawEvent> {
        self.device(dev)?;
        let h = self.handle();
        self.events.write().insert(h, Arc::new(SimEvent::new(dev)));
        Ok(h)
    }

    fn event_destroy(&self, dev: u32, event: RawEvent) -> Result<()> {
        self.event(dev, event)?;
        self.events.write().remove(&event);
        Ok(())
    }

    fn event_record(&self, dev: u32, event: RawEvent, stream: RawStream) -> Result<()> {
        let s = self.stream(dev, stream)?;
        self.event(dev, event)?.record(&s);
        Ok(())
    }

    fn event_query(&self, dev: u32, event: RawEvent) -> Result<bool> {
        Ok(self.event(dev, event)?.is_complete())
    }

    fn event_synchronize(&self, dev: u32, event: RawEvent) -> Result<()> {
        self.event(dev, event)?.synchronize();
        Ok(())
    }

    fn device_synchronize(&self, dev: u32) -> Result<()> {
        let mut all: Vec<Arc<SimStream>> = self
            .streams
            .read()
            .values()
            .filter(|s| s.device == dev)
            .cloned()
            .collect();
        all.push(self.stream(dev, 0)?);
        for s in all {
            s.synchronize();
        }
        Ok(())
    }
}
