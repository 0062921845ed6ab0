//! The device seam: a real GPU through the CUDA driver API ([`CudaBackend`]) or a simulated device
//! ([`SimBackend`]) behind a `&'static dyn Backend`, picked on first use from `RMM_BACKEND`
//! ([`global`]). Device pointers are `u64` addresses; streams, events and stream-ordered pools are
//! opaque `u64` handles, `0` being the default stream as in CUDA.

pub(crate) mod clock;
mod cuda;
pub(crate) mod host;
pub mod host_memory;
pub(crate) mod pinned_copy;
mod sim;
mod stream_registry;

use std::fmt;
use std::sync::OnceLock;

pub use cuda::CudaBackend;
pub use sim::{SimBackend, SimConfig, SimCounts, SimFaults, SimMemoryMode, StreamGate};

use crate::error::{Error, Result};
use host_memory::HostMemory;

/// A device address. Null (`0`) is what a zero-byte allocation returns.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null device pointer.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// True for the null pointer.
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address as an integer.
    pub const fn addr(self) -> u64 {
        self.0
    }

    /// This pointer moved forward by `bytes`.
    pub const fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Opaque handle of a stream as the backend knows it. `0` is the default stream.
pub type RawStream = u64;
/// Opaque handle of an event as the backend knows it.
pub type RawEvent = u64;
/// Opaque handle of a stream-ordered memory pool (`cuMemPoolCreate`).
pub type RawMemPool = u64;
/// Opaque handle of physical device memory made by [`Backend::mem_create`] (`cuMemCreate`).
pub type RawPhysical = u64;

/// Names device memory another process of this host may map: CUDA's 64-byte `CUipcMemHandle`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandle(pub [u8; 64]);

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcHandle(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// Which kind of backend is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// A real NVIDIA GPU through the CUDA driver API.
    Cuda,
    /// The simulated device.
    Sim,
}

impl BackendKind {
    /// `"cuda"` or `"sim"`.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Sim => "sim",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Static facts about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProperties {
    /// Device ordinal.
    pub ordinal: u32,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// The device's UUID in the `GPU-xxxxxxxx-xxxx-…` form that `nvidia-smi -L` prints.
    pub uuid: String,
    /// Compute capability (major, minor); the simulated device reports (9, 0).
    pub compute_capability: (u32, u32),
    /// Whether the device supports stream-ordered allocation (`cuMemAllocAsync`).
    pub supports_memory_pools: bool,
    /// Whether the device supports managed memory.
    pub supports_managed_memory: bool,
    /// Whether the device supports CUDA's virtual memory management API ([`Backend::mem_create`]).
    pub supports_virtual_memory: bool,
}

/// Free and total memory of a device, as `cuMemGetInfo` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// Free bytes.
    pub free: usize,
    /// Total bytes.
    pub total: usize,
}

/// What every backend provides. Methods name the device; the backend makes it current as needed.
/// Methods taking raw host pointers are `unsafe`: the caller keeps the range valid (for `_async`
/// forms, until the stream reaches it); the driver (or simulator) checks device pointers.
///
/// # Errors
/// Unless a method says more: [`Error::Driver`] (`CUDA_ERROR_OUT_OF_MEMORY` for an allocation that
/// does not fit); the simulated device also [`Error::NoSuchDevice`] or [`Error::InvalidArgument`]
/// for an unknown device, handle or range, and [`Error::InjectedFault`] where told to.
#[allow(
    clippy::missing_errors_doc,
    reason = "the trait's `# Errors` covers the methods that add nothing to it"
)]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// A one-line description, e.g. `cuda (driver 13.0)` or `sim (2 devices × 24.00 GiB, backed)`.
    fn describe(&self) -> String;
    /// Whether device memory holds written bytes: false only for the unbacked simulated device.
    fn holds_data(&self) -> bool {
        true
    }
    /// Number of devices.
    fn device_count(&self) -> u32;
    /// Static properties of device `dev`.
    fn properties(&self, dev: u32) -> Result<DeviceProperties>;
    /// Free and total memory of device `dev`.
    fn mem_info(&self, dev: u32) -> Result<MemInfo>;

    /// Granularity of `mem_create` sizes and `mem_map` addresses (`cuMemGetAllocationGranularity`).
    fn mem_granularity(&self, dev: u32) -> Result<usize>;
    /// Reserves `bytes` (a granularity multiple) of address space on `dev` (`cuMemAddressReserve`).
    fn mem_address_reserve(&self, dev: u32, bytes: usize) -> Result<DevicePtr>;
    /// Frees a whole [`Backend::mem_address_reserve`] range, all unmapped (`cuMemAddressFree`).
    fn mem_address_free(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Allocates `bytes` (a granularity multiple) of unmapped physical memory (`cuMemCreate`).
    fn mem_create(&self, dev: u32, bytes: usize) -> Result<RawPhysical>;
    /// Releases a [`Backend::mem_create`] handle (`cuMemRelease`); freed once unmapped.
    fn mem_release(&self, dev: u32, handle: RawPhysical) -> Result<()>;
    /// Maps all `bytes` of `handle` at `ptr` in a reservation (`cuMemMap`), not yet accessible.
    fn mem_map(&self, dev: u32, ptr: DevicePtr, bytes: usize, handle: RawPhysical) -> Result<()>;
    /// Unmaps `[ptr, ptr + bytes)`, whole mappings (`cuMemUnmap`), once no queued work uses it.
    fn mem_unmap(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Makes mapped `[ptr, ptr + bytes)` readable and writable from `dev` (`cuMemSetAccess`).
    fn mem_set_access(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()>;

    /// Synchronous device allocation (`cuMemAlloc`). `bytes` > 0.
    fn malloc(&self, dev: u32, bytes: usize) -> Result<DevicePtr>;
    /// Frees what [`Backend::malloc`] or [`Backend::malloc_managed`] returned (`cuMemFree`).
    fn free(&self, dev: u32, ptr: DevicePtr) -> Result<()>;
    /// Allocates `bytes` on `dev` that other processes of this host may map (`cuMemAlloc`,
    /// `cuIpcGetMemHandle`); nothing kept if either call fails. Free with `ipc_free`.
    fn ipc_alloc(&self, dev: u32, bytes: usize) -> Result<(DevicePtr, IpcHandle)>;
    /// Frees memory from [`ipc_alloc`](Self::ipc_alloc); importers must have closed it first.
    ///
    /// # Errors
    /// [`Error::Driver`], or [`Error::InvalidPointer`] for memory `ipc_alloc` did not give.
    fn ipc_free(&self, dev: u32, ptr: DevicePtr) -> Result<()>;
    /// Maps memory another process exported as `handle` into `dev`'s context (`cuIpcOpenMemHandle`):
    /// address and size, until `ipc_close`. On a GPU a process cannot open its own handles.
    ///
    /// # Errors
    /// [`Error::Driver`] if it cannot be mapped (another host, an invisible GPU, freed memory);
    /// simulated: the shared file is gone.
    fn ipc_open(&self, dev: u32, handle: &IpcHandle) -> Result<(DevicePtr, usize)>;
    /// Unmaps memory [`ipc_open`](Self::ipc_open) mapped (`cuIpcCloseMemHandle`).
    ///
    /// # Errors
    /// [`Error::Driver`], or [`Error::InvalidPointer`] for an address `ipc_open` did not give.
    fn ipc_close(&self, dev: u32, ptr: DevicePtr) -> Result<()>;
    /// Managed (unified) allocation attached globally (`cuMemAllocManaged`). `bytes` > 0.
    fn malloc_managed(&self, dev: u32, bytes: usize) -> Result<DevicePtr>;

    /// Creates a stream-ordered pool (`cuMemPoolCreate`) caching up to `release_threshold` bytes.
    fn mem_pool_create(&self, dev: u32, release_threshold: u64) -> Result<RawMemPool>;
    /// Destroys a pool made by [`Backend::mem_pool_create`].
    fn mem_pool_destroy(&self, dev: u32, pool: RawMemPool) -> Result<()>;
    /// Releases cached memory of the pool down to `keep_bytes` (`cuMemPoolTrimTo`).
    fn mem_pool_trim(&self, dev: u32, pool: RawMemPool, keep_bytes: usize) -> Result<()>;
    /// Bytes the pool currently holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    fn mem_pool_reserved(&self, dev: u32, pool: RawMemPool) -> Result<u64>;
    /// Stream-ordered allocation from `pool` (`cuMemAllocFromPoolAsync`). `bytes` > 0.
    fn malloc_async(
        &self,
        dev: u32,
        pool: RawMemPool,
        bytes: usize,
        stream: RawStream,
    ) -> Result<DevicePtr>;
    /// Stream-ordered free (`cuMemFreeAsync`).
    fn free_async(&self, dev: u32, ptr: DevicePtr, stream: RawStream) -> Result<()>;

    /// Portable, not write-combined pinned host allocation (`cuMemHostAlloc`). `bytes` > 0.
    ///
    /// # Errors
    /// [`Error::Driver`]; the simulated device's [`Error::HostOutOfMemory`] when the host has none.
    fn malloc_host(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees what [`Backend::malloc_host`] returned.
    ///
    /// # Safety
    /// `ptr` came from `malloc_host` of this backend and is not used afterwards.
    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()>;
    /// Page-locks an existing host range (`cuMemHostRegister(PORTABLE)`).
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` is a live host allocation that outlives the registration.
    ///
    /// # Errors
    /// [`Error::Driver`] when the range cannot be page-locked (or a simulated pin is told to fail).
    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()>;
    /// Undoes [`Backend::host_register`].
    ///
    /// # Safety
    /// `ptr` was registered with `host_register` and no copy using it is in flight.
    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()>;

    /// Copies `src` to device memory at `dst` and waits for the copy.
    fn memcpy_htod(&self, dev: u32, dst: DevicePtr, src: &[u8]) -> Result<()>;
    /// Copies device memory at `src` into `dst` and waits for the copy.
    fn memcpy_dtoh(&self, dev: u32, dst: &mut [u8], src: DevicePtr) -> Result<()>;
    /// Copies `bytes` between device ranges (same or different devices) and waits.
    fn memcpy_dtod(&self, dev: u32, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    /// Sets `bytes` of device memory to `value` and waits.
    fn memset(&self, dev: u32, dst: DevicePtr, value: u8, bytes: usize) -> Result<()>;
    /// Enqueues a host → device copy on `stream`.
    ///
    /// # Safety
    /// `[src, src + bytes)` stays valid and unchanged until the stream has run the copy.
    unsafe fn memcpy_htod_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// Enqueues a device → host copy on `stream`.
    ///
    /// # Safety
    /// `[dst, dst + bytes)` stays valid and untouched by the host until the stream ran the copy.
    unsafe fn memcpy_dtoh_async(
        &self,
        dev: u32,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// Enqueues a device → device copy on `stream`.
    fn memcpy_dtod_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// Enqueues a memset on `stream`.
    fn memset_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;

    /// The device of the thread's current context (as `cudaSetDevice`, CuPy's `Device.use()` or
    /// `torch.cuda.set_device` set it); None without one, and on the simulated device.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot read the thread's context. None by default.
    fn context_device(&self) -> Result<Option<u32>> {
        Ok(None)
    }

    /// Creates a non-blocking stream on `dev`.
    fn stream_create(&self, dev: u32) -> Result<RawStream>;
    /// Destroys a stream made by [`Backend::stream_create`] (work already queued completes).
    fn stream_destroy(&self, dev: u32, stream: RawStream) -> Result<()>;
    /// Waits for all work queued on `stream`. For its owner: a stream this backend destroyed is an
    /// error, not a driver call on a dangling handle.
    fn stream_synchronize(&self, dev: u32, stream: RawStream) -> Result<()>;
    /// True when all work queued on `stream` has completed. For its owner.
    fn stream_query(&self, dev: u32, stream: RawStream) -> Result<bool>;
    /// As [`Backend::stream_query`], for a caller not owning `stream`: `None`, without touching the
    /// handle, unless the backend knows it alive (a default stream, or one it made and has not
    /// destroyed), held so during the query. A library's own stream (CuPy's) is `None`.
    fn stream_query_if_alive(&self, dev: u32, stream: RawStream) -> Result<Option<bool>>;
    /// As [`Backend::stream_synchronize`], for a caller not owning `stream`: false, without waiting,
    /// unless the backend knows it alive (as [`Backend::stream_query_if_alive`]).
    fn stream_synchronize_if_alive(&self, dev: u32, stream: RawStream) -> Result<bool>;
    /// Makes later work on `stream` wait until `event` has completed.
    fn stream_wait_event(&self, dev: u32, stream: RawStream, event: RawEvent) -> Result<()>;
    /// Creates an event without timing.
    fn event_create(&self, dev: u32) -> Result<RawEvent>;
    /// Destroys an event.
    fn event_destroy(&self, dev: u32, event: RawEvent) -> Result<()>;
    /// Records `event` at the current end of `stream`.
    fn event_record(&self, dev: u32, event: RawEvent, stream: RawStream) -> Result<()>;
    /// True when the work captured by the last record of `event` has completed.
    fn event_query(&self, dev: u32, event: RawEvent) -> Result<bool>;
    /// Waits until the work captured by the last record of `event` has completed.
    fn event_synchronize(&self, dev: u32, event: RawEvent) -> Result<()>;
    /// Waits until all work on `dev` has completed.
    fn device_synchronize(&self, dev: u32) -> Result<()>;
    /// Makes `dev`'s context current on a thread without one, as CUDA's runtime does on a thread's
    /// first call (else a runtime asking for the current device, e.g. librmm per buffer, takes a
    /// slow path each time). Checked once per thread; a no-op on the simulated device.
    ///
    /// # Errors
    /// [`Error::Driver`] if the thread's context cannot be read or set; [`Error::NoSuchDevice`].
    fn bind_thread(&self, dev: u32) -> Result<()> {
        let _ = dev;
        Ok(())
    }
    /// Host memory this process may use ([`HostMemory::read`] by default), checked before pinning.
    fn host_memory(&self) -> HostMemory {
        HostMemory::read()
    }
    /// Called before each spill-file write of device `dev`: a fault-injection point.
    ///
    /// # Errors
    /// None by default; the simulated device's [`Error::InjectedFault`] for the chosen write.
    fn before_file_write(&self, dev: u32) -> Result<()> {
        let _ = dev;
        Ok(())
    }
    /// The simulated device this backend is, for fault injection; else `None`.
    fn as_sim(&self) -> Option<&SimBackend> {
        None
    }
}

/// How the process-wide backend is chosen: `RMM_BACKEND`, and rmm.toml's `backend` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum BackendChoice {
    /// The CUDA driver; fails if there is none.
    Cuda,
    /// The simulated device, set up by [`SimConfig::from_env`] and [`SimFaults::from_env`].
    Sim,
    /// Nothing asked for: the GPU, or an error saying how to ask for the simulated device.
    #[default]
    Auto,
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for BackendChoice {
    type Error = String;
    fn try_from(text: String) -> std::result::Result<Self, String> {
        Self::from_name(&text)
            .ok_or_else(|| format!("{text:?} is not a backend (auto, cuda or sim)"))
    }
}

impl BackendChoice {
    /// The canonical name: `auto`, `cuda` or `sim`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cuda => "cuda",
            BackendChoice::Sim => "sim",
        }
    }

    /// The backend a name selects: `cuda` (or `gpu`), `sim` (or `simulated`), `auto` (or empty),
    /// case-insensitive, trimmed; else `None`.
    pub fn from_name(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "cuda" | "gpu" => Some(BackendChoice::Cuda),
            "sim" | "simulated" => Some(BackendChoice::Sim),
            "auto" | "" => Some(BackendChoice::Auto),
            _ => None,
        }
    }

    /// Parses a backend name ([`BackendChoice::from_name`]); `source_name` goes into the error.
    ///
    /// # Errors
    /// [`Error::UnknownBackend`] when `value` names no backend.
    pub fn parse(value: &str, source_name: &'static str) -> Result<Self> {
        Self::from_name(value).ok_or_else(|| Error::UnknownBackend {
            value: value.to_string(),
            source_name,
        })
    }

    /// Reads `RMM_BACKEND` (default `auto`).
    ///
    /// # Errors
    /// [`Error::UnknownBackend`] when `RMM_BACKEND` names no backend.
    pub fn from_env() -> Result<Self> {
        match std::env::var("RMM_BACKEND") {
            Ok(v) => Self::parse(&v, "RMM_BACKEND"),
            Err(_) => Ok(BackendChoice::Auto),
        }
    }
}

/// Builds a new backend for `choice`; most code wants [`global`].
///
/// # Errors
/// [`Error::NoDriver`] (or [`Error::Driver`]) if the driver cannot load; [`Error::NoDevice`] if
/// `Auto` finds no device; [`Error::InvalidArgument`] for bad `RMM_SIM_*` settings.
pub fn open(choice: BackendChoice) -> Result<&'static dyn Backend> {
    match choice {
        BackendChoice::Cuda => Ok(CudaBackend::load()?),
        BackendChoice::Sim => {
            let config = SimConfig::from_env()?;
            let faults = SimFaults::from_env(config.devices)?;
            let sim = SimBackend::leak(config)?;
            faults.apply(sim)?;
            tracing::info!(
                "the simulated device, as asked: {} (host memory standing in for device memory)",
                sim.describe()
            );
            if !faults.is_empty() {
                tracing::warn!(
                    "the simulated device injects faults, as RMM_SIM_FAIL_* or \
                     RMM_SIM_HOST_MEMORY ask: {faults:?}"
                );
            }
            Ok(sim)
        }
        BackendChoice::Auto => {
            let cuda = CudaBackend::load()?;
            if cuda.device_count() == 0 {
                return Err(Error::NoDevice {
                    visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
                });
            }
            Ok(cuda)
        }
    }
}

static GLOBAL: OnceLock<std::result::Result<&'static dyn Backend, Error>> = OnceLock::new();

/// The process-wide backend, chosen once, on first use, from `RMM_BACKEND`.
///
/// # Errors
/// As [`open`]: the first choice's error, returned to every caller.
pub fn global() -> Result<&'static dyn Backend> {
    GLOBAL
        .get_or_init(|| BackendChoice::from_env().and_then(open))
        .clone()
}

/// The process-wide backend if one was chosen ([`global`], [`install_global`]); never chooses.
pub fn installed() -> Option<&'static dyn Backend> {
    GLOBAL.get().and_then(|r| r.as_ref().ok().copied())
}

/// Installs `backend` as the process-wide backend.
///
/// # Errors
/// The backend already installed when one was chosen before (by [`global`] or an earlier call).
pub fn install_global(
    backend: &'static dyn Backend,
) -> std::result::Result<(), &'static dyn Backend> {
    // A failed choice (its error) is no backend: then `backend` comes back.
    GLOBAL
        .set(Ok(backend))
        .map_err(|_| installed().unwrap_or(backend))
}
