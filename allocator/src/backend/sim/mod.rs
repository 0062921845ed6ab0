//! The simulated device for machines without a GPU (`docs/guide.md` describes it): backed (host
//! memory holds the bytes, at the device addresses) or unbacked (addresses only), with fault
//! injection. Stream-ordered pools do not cache: memory returns when the stream reaches the free.

mod calls;
mod config;
mod env;
mod ipc;
mod memory;
mod stream;
mod vmm;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

pub use self::config::{SimConfig, SimMemoryMode};
pub use self::env::SimFaults;
use self::memory::{AllocKind, AllocationTable, Backing, DEVICE_ALIGNMENT, Resolved};
pub use self::stream::StreamGate;
use self::stream::{SimEvent, SimStream};
use super::{DevicePtr, RawEvent, RawStream};
use crate::error::{Error, Result, fmt_bytes};

/// The legacy default stream's handle: the same stream as 0 here.
const LEGACY_STREAM: RawStream = 1;
/// The per-thread default stream's handle: each thread's own stream.
const PER_THREAD_STREAM: RawStream = 2;

thread_local! {
    /// This thread's per-thread default streams, by backend and device.
    static PER_THREAD_STREAMS: std::cell::RefCell<HashMap<(usize, u32), Arc<SimStream>>> =
        std::cell::RefCell::new(HashMap::new());
}

/// Fails the `at`-th operation of a kind, counting the `seen` ones (1-based; `at` 0: none).
#[derive(Debug, Default)]
struct NthFault {
    at: AtomicU64,
    seen: AtomicU64,
}

impl NthFault {
    /// Makes the `n`-th operation from now (1: the next) fail; 0 clears it.
    fn arm(&self, n: u64) {
        let base = self.seen.load(Ordering::SeqCst);
        let at = if n == 0 { 0 } else { base.saturating_add(n) };
        self.at.store(at, Ordering::SeqCst);
    }

    /// Counts one operation; true for the one to fail.
    fn hit(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        self.at.load(Ordering::SeqCst) == n
    }

    fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }
}

/// Faults to inject on one device.
#[derive(Debug, Default)]
struct Faults {
    alloc: NthFault,
    /// Fail device allocations larger than this (usize::MAX: none).
    fail_alloc_above: AtomicUsize,
    copy: NthFault,
    /// Spill-file writes.
    file_write: NthFault,
    /// Free-memory queries (`cuMemGetInfo`): counted only, never failed.
    memory_queries: AtomicU64,
}

/// Counts of the operations fault injection numbers, on one device (pins: the backend's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimCounts {
    /// Device allocations attempted.
    pub allocations: u64,
    /// Copies and memsets attempted.
    pub copies: u64,
    /// Host memory pins attempted (`cuMemHostAlloc`, `cuMemHostRegister`), all devices.
    pub pins: u64,
    /// Spill-file writes attempted.
    pub file_writes: u64,
    /// Free-memory queries (`cuMemGetInfo`).
    pub memory_queries: u64,
    /// Host registrations (`cuMemHostRegister`, all devices) of memory with pages not yet
    /// faulted in, which the driver would fault in while holding its lock.
    pub unbacked_registrations: u64,
}

impl SimCounts {
    /// The operations counted in `self` since `earlier`.
    pub fn since(&self, earlier: &SimCounts) -> SimCounts {
        SimCounts {
            allocations: self.allocations - earlier.allocations,
            copies: self.copies - earlier.copies,
            pins: self.pins - earlier.pins,
            file_writes: self.file_writes - earlier.file_writes,
            memory_queries: self.memory_queries - earlier.memory_queries,
            unbacked_registrations: self.unbacked_registrations - earlier.unbacked_registrations,
        }
    }
}

#[derive(Debug)]
struct SimDevice {
    used: Arc<AtomicUsize>,
    default_stream: OnceLock<Arc<SimStream>>,
    /// Threads' per-thread default streams, for a device-wide synchronize (kept until idle).
    per_thread_streams: Mutex<Vec<Arc<SimStream>>>,
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
    /// Reserved address ranges and physical memory of the virtual memory API.
    vmm: Mutex<vmm::VmmState>,
    /// Whether the devices report virtual memory management support.
    vmm_supported: AtomicBool,
    next_handle: AtomicU64,
    /// Host pins, on any device.
    pin_fault: NthFault,
    /// See [`SimCounts::unbacked_registrations`].
    unbacked_registrations: AtomicU64,
    /// Host memory the process may use ([`Backend::host_memory`]; `u64::MAX`: the real host's).
    host_limit: AtomicU64,
}

#[derive(Debug)]
enum HostBlock {
    Pinned(Backing),
    Registered { bytes: usize },
}

impl SimBackend {
    /// Builds a simulated backend.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `config` has no device, more than 64, or zero capacity.
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
                per_thread_streams: Mutex::new(Vec::new()),
                faults: Faults {
                    fail_alloc_above: AtomicUsize::new(usize::MAX),
                    ..Faults::default()
                },
            })
            .collect();
        Ok(SimBackend {
            table: Arc::new(Mutex::new(AllocationTable::new(config.devices))),
            vmm: Mutex::default(),
            config,
            devices,
            host: Mutex::new(HashMap::new()),
            streams: RwLock::new(HashMap::new()),
            events: RwLock::new(HashMap::new()),
            pools: RwLock::new(HashMap::new()),
            vmm_supported: AtomicBool::new(true),
            next_handle: AtomicU64::new(0x1000),
            pin_fault: NthFault::default(),
            unbacked_registrations: AtomicU64::new(0),
            host_limit: AtomicU64::new(u64::MAX),
        })
    }

    /// Builds a simulated backend that lives for the rest of the process, as backends do.
    ///
    /// # Errors
    /// As [`SimBackend::new`].
    pub fn leak(config: SimConfig) -> Result<&'static SimBackend> {
        Ok(Box::leak(Box::new(SimBackend::new(config)?)))
    }

    /// The configuration this backend was built with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Limits the host memory the process may use to `bytes` (`None`: the real host's), as a cgroup
    /// would, counting what the simulated device pinned; also `RMM_SIM_HOST_MEMORY`.
    pub fn limit_host_memory(&self, bytes: Option<u64>) {
        self.host_limit
            .store(bytes.unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// The host memory limit set by [`limit_host_memory`](Self::limit_host_memory), if any.
    pub(crate) fn host_limit(&self) -> Option<u64> {
        Some(self.host_limit.load(Ordering::SeqCst)).filter(|&l| l != u64::MAX)
    }

    /// Makes the `n`-th allocation on `dev` from now (1: the next) fail out of memory; 0 clears it.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an unknown `dev`.
    pub fn fail_nth_allocation(&self, dev: u32, n: u64) -> Result<()> {
        self.device(dev)?.faults.alloc.arm(n);
        Ok(())
    }

    /// Makes every device allocation on `dev` larger than `bytes` fail with out-of-memory.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an unknown `dev`.
    pub fn fail_allocations_above(&self, dev: u32, bytes: usize) -> Result<()> {
        self.device(dev)?
            .faults
            .fail_alloc_above
            .store(bytes, Ordering::SeqCst);
        Ok(())
    }

    /// Makes the `n`-th copy or memset from now on `dev` fail (`n` = 0 clears it).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an unknown `dev`.
    pub fn fail_nth_copy(&self, dev: u32, n: u64) -> Result<()> {
        self.device(dev)?.faults.copy.arm(n);
        Ok(())
    }

    /// Makes the `n`-th host pin from now (any device) fail with out-of-memory; 0 clears it.
    pub fn fail_nth_pin(&self, n: u64) {
        self.pin_fault.arm(n);
    }

    /// Makes the `n`-th spill-file write of `dev` from now fail; 0 clears it.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an unknown `dev`.
    pub fn fail_nth_file_write(&self, dev: u32, n: u64) -> Result<()> {
        self.device(dev)?.faults.file_write.arm(n);
        Ok(())
    }

    /// The operations counted on `dev` (pins: all devices'); compare before and after a step.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an unknown `dev`.
    pub fn counts(&self, dev: u32) -> Result<SimCounts> {
        let f = &self.device(dev)?.faults;
        Ok(SimCounts {
            allocations: f.alloc.seen(),
            copies: f.copy.seen(),
            pins: self.pin_fault.seen(),
            file_writes: f.file_write.seen(),
            memory_queries: f.memory_queries.load(Ordering::SeqCst),
            unbacked_registrations: self.unbacked_registrations.load(Ordering::SeqCst),
        })
    }

    /// Removes every injected fault on `dev` (and the pin fault).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an unknown `dev`.
    pub fn clear_faults(&self, dev: u32) -> Result<()> {
        let f = &self.device(dev)?.faults;
        f.alloc.arm(0);
        f.copy.arm(0);
        f.file_write.arm(0);
        f.fail_alloc_above.store(usize::MAX, Ordering::SeqCst);
        self.pin_fault.arm(0);
        Ok(())
    }

    /// Holds `stream` back: work queued on it from now waits until the gate opens.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an unknown `dev`; [`Error::InvalidArgument`] for a stream not
    /// live on it; [`Error::Driver`] when the default stream's worker cannot start.
    pub fn hold_stream(&self, dev: u32, stream: RawStream) -> Result<StreamGate> {
        let s = self.stream(dev, stream)?;
        let (gate, job) = StreamGate::new();
        s.submit(job);
        Ok(gate)
    }

    /// Queues a delay of `duration` on `stream`, standing in for a long-running kernel.
    ///
    /// # Errors
    /// As [`hold_stream`](Self::hold_stream).
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

    /// Live device, managed, pool and unreleased physical (VMM) allocations on `dev`.
    pub fn live_allocations(&self, dev: u32) -> usize {
        self.table.lock().count_on(dev) + self.vmm.lock().physical_on(dev)
    }

    /// Makes devices report virtual memory management (un)supported, to test fallbacks.
    pub fn set_virtual_memory_supported(&self, supported: bool) {
        self.vmm_supported.store(supported, Ordering::SeqCst);
    }

    fn device(&self, dev: u32) -> Result<&SimDevice> {
        let missing = Error::no_such_device(dev, self.config.devices, "sim");
        self.devices.get(dev as usize).ok_or(missing)
    }

    fn stream(&self, dev: u32, stream: RawStream) -> Result<Arc<SimStream>> {
        let d = self.device(dev)?;
        if stream == PER_THREAD_STREAM {
            return self.per_thread_stream(dev);
        }
        if stream == 0 || stream == LEGACY_STREAM {
            if let Some(s) = d.default_stream.get() {
                return Ok(Arc::clone(s));
            }
            let s = spawn_stream(dev, format!("sim-dev{dev}-default"))?;
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

    /// The calling thread's own stream on `dev`, which [`PER_THREAD_STREAM`] names there.
    fn per_thread_stream(&self, dev: u32) -> Result<Arc<SimStream>> {
        let key = (std::ptr::from_ref(self) as usize, dev);
        let known = PER_THREAD_STREAMS.try_with(|m| m.borrow().get(&key).cloned());
        if let Ok(Some(s)) = known {
            return Ok(s);
        }
        let s = spawn_stream(dev, format!("sim-dev{dev}-per-thread"))?;
        let mut all = self.device(dev)?.per_thread_streams.lock();
        all.retain(|t| Arc::strong_count(t) > 1 || !t.is_idle());
        all.push(Arc::clone(&s));
        drop(all);
        // A thread that is exiting gets a stream of its own for this call only.
        let _ = PER_THREAD_STREAMS.try_with(|m| m.borrow_mut().insert(key, Arc::clone(&s)));
        Ok(s)
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

    /// `len` bytes at `ptr` checked against the allocation table ([`AllocationTable::resolve`]).
    fn resolve(&self, ptr: DevicePtr, len: usize, what: &'static str) -> Result<Resolved> {
        self.table.lock().resolve(ptr, len, what)
    }

    fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    fn allocate(
        &self,
        dev: u32,
        bytes: usize,
        kind: AllocKind,
        call: &'static str,
    ) -> Result<DevicePtr> {
        let d = self.device(dev)?;
        at_least_one_byte(bytes)?;
        let len = self.charge(dev, bytes, call)?;
        let backing = self.back(dev, len, bytes, call)?;
        let mut table = self.table.lock();
        let addr = backing.as_ref().map(|b| b.addr());
        let addr = addr.or_else(|| table.reserve_unbacked(dev, len));
        let Some(addr) = addr else {
            d.used.fetch_sub(len, Ordering::SeqCst);
            return Err(oom(dev, call, bytes, "no unbacked address range left"));
        };
        table.add(addr, dev, len, kind, backing);
        Ok(DevicePtr(addr))
    }

    /// Host memory for `len` charged bytes (`None` unbacked); refunds them if the host has none.
    fn back(
        &self,
        dev: u32,
        len: usize,
        bytes: usize,
        call: &'static str,
    ) -> Result<Option<Arc<Backing>>> {
        if self.config.mode == SimMemoryMode::Unbacked {
            return Ok(None);
        }
        match Backing::new(len, DEVICE_ALIGNMENT) {
            Some(b) => Ok(Some(Arc::new(b))),
            None => {
                self.device(dev)?.used.fetch_sub(len, Ordering::SeqCst);
                Err(oom(dev, call, bytes, "the host could not back it"))
            }
        }
    }

    /// Counts an allocation of `bytes` on `dev` (faults, then capacity); charges its rounded length.
    fn charge(&self, dev: u32, bytes: usize, call: &'static str) -> Result<usize> {
        let d = self.device(dev)?;
        if d.faults.alloc.hit() {
            return Err(oom(dev, call, bytes, "injected failure of this allocation"));
        }
        if bytes > d.faults.fail_alloc_above.load(Ordering::SeqCst) {
            return Err(oom(dev, call, bytes, "injected failure above a size"));
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
            return Err(oom(dev, call, bytes, &format!("{} free", fmt_bytes(free))));
        }
        Ok(len)
    }

    /// Counts a host pin by `call`; fails the one chosen to fail.
    fn count_pin(&self, call: &'static str, bytes: usize) -> Result<()> {
        if self.pin_fault.hit() {
            return Err(oom(0, call, bytes, "injected failure of this pin"));
        }
        Ok(())
    }

    /// Counts a copy or a spill-file write (`what`, `fault`) on `dev`; fails the one chosen to fail.
    fn count(&self, dev: u32, what: &'static str, fault: fn(&Faults) -> &NthFault) -> Result<()> {
        if fault(&self.device(dev)?.faults).hit() {
            return Err(Error::InjectedFault { what, device: dev });
        }
        Ok(())
    }

    fn count_copy(&self, dev: u32) -> Result<()> {
        self.count(dev, "copy", |f| &f.copy)
    }
}

/// The driver's out-of-memory error for `bytes` asked of `call` on `dev`, failed for `reason`.
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

/// [`Error::InvalidArgument`] for a zero `bytes`: allocations take at least one byte.
fn at_least_one_byte(bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Err(Error::invalid_argument(
            "bytes",
            0,
            "a size of at least one byte",
        ));
    }
    Ok(())
}

/// A new stream on `dev` named `label`; a worker thread that cannot start is a driver error.
fn spawn_stream(dev: u32, label: String) -> Result<Arc<SimStream>> {
    SimStream::spawn(dev, label).map_err(|e| Error::Driver {
        call: "cuStreamCreate",
        device: dev,
        name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        code: 2,
        description: format!("the simulated stream's worker thread could not start: {e}"),
    })
}
