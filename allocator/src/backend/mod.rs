//! The device seam: a real NVIDIA GPU through the CUDA driver API ([`CudaBackend`]) or a
//! simulated device ([`SimBackend`]).
//!
//! Everything above this module talks to a `&'static dyn Backend` and never learns which one
//! it is. The process-wide backend is picked on first use from `RMM_BACKEND`
//! (`cuda`, `sim` or `auto`, the default: the GPU, or an error; the simulated device only
//! when asked for); see [`global`].
//!
//! Device pointers are plain `u64` addresses ([`DevicePtr`]); streams, events and
//! stream-ordered memory pools are opaque `u64` handles whose meaning belongs to the backend.
//! Handle `0` is the device's default stream, as in CUDA.

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

/// Names device memory that another process of this host may map
/// ([`Backend::ipc_alloc`], [`Backend::ipc_open`]): CUDA's 64-byte `CUipcMemHandle`, or the
/// name of the shared file that backs the simulated device's exported memory.
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
    /// Whether the device supports CUDA's virtual memory management API
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`: [`Backend::mem_create`],
    /// [`Backend::mem_map`] and the calls beside them).
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

/// What every backend provides. All methods name the device explicitly; the backend makes it
/// current where the driver needs that.
///
/// Methods that read or write host memory through raw pointers are `unsafe`: the caller
/// guarantees the host range is valid for the whole operation (for the `_async` forms, until
/// the stream reaches the copy). Device pointers are checked by the driver (or the simulator).
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// A one-line description, e.g. `cuda (driver 13.0)` or `sim (2 devices × 24.00 GiB, backed)`.
    fn describe(&self) -> String;
    /// Whether device memory holds the bytes written to it: true for a GPU and the backed
    /// simulated device; false for the unbacked simulated device, whose memory is addresses
    /// only (for "would it fit" questions), so that work that reads its data back can say so
    /// up front instead of reporting wrong bytes.
    fn holds_data(&self) -> bool {
        true
    }
    /// Number of devices.
    fn device_count(&self) -> u32;
    /// Static properties of device `dev`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn properties(&self, dev: u32) -> Result<DeviceProperties>;
    /// Free and total memory of device `dev`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_info(&self, dev: u32) -> Result<MemInfo>;

    /// The granularity of [`Backend::mem_create`] and [`Backend::mem_map`] on `dev`: sizes
    /// and mapping addresses are multiples of it (`cuMemGetAllocationGranularity`, minimum
    /// granularity, pinned device memory).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_granularity(&self, dev: u32) -> Result<usize>;
    /// Reserves `bytes` (a multiple of the granularity) of virtual address space for `dev`,
    /// backed by nothing until [`Backend::mem_map`] (`cuMemAddressReserve`).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_address_reserve(&self, dev: u32, bytes: usize) -> Result<DevicePtr>;
    /// Gives back a range [`Backend::mem_address_reserve`] returned, whole, once nothing in
    /// it is mapped (`cuMemAddressFree`).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_address_free(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Allocates `bytes` (a multiple of the granularity) of physical memory on `dev`, not yet
    /// addressable (`cuMemCreate`, pinned device memory). Counts as device memory in use.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails (`CUDA_ERROR_OUT_OF_MEMORY` when the memory is
    /// not there; the simulated device reports the same, and [`Error::NoSuchDevice`] for an unknown
    /// device).
    fn mem_create(&self, dev: u32, bytes: usize) -> Result<RawPhysical>;
    /// Releases a handle from [`Backend::mem_create`] (`cuMemRelease`); the memory goes
    /// back to the device once no mapping of it is left.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_release(&self, dev: u32, handle: RawPhysical) -> Result<()>;
    /// Maps all of `handle`'s `bytes` at `ptr`, inside a reserved range (`cuMemMap`). The
    /// range is not accessible until [`Backend::mem_set_access`].
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_map(&self, dev: u32, ptr: DevicePtr, bytes: usize, handle: RawPhysical) -> Result<()>;
    /// Unmaps `[ptr, ptr + bytes)`, which covers whole mappings (`cuMemUnmap`). The caller
    /// makes sure no queued work still uses the range.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_unmap(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Makes the mapped range `[ptr, ptr + bytes)` readable and writable from `dev`
    /// (`cuMemSetAccess`); the range may span several mappings.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_set_access(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()>;

    /// Synchronous device allocation (`cuMemAlloc`). `bytes` > 0.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails (`CUDA_ERROR_OUT_OF_MEMORY` when the memory is
    /// not there; the simulated device reports the same, and [`Error::NoSuchDevice`] for an unknown
    /// device).
    fn malloc(&self, dev: u32, bytes: usize) -> Result<DevicePtr>;
    /// Frees what [`Backend::malloc`] or [`Backend::malloc_managed`] returned (`cuMemFree`).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn free(&self, dev: u32, ptr: DevicePtr) -> Result<()>;
    /// Allocates `bytes` of device memory on `dev` that other processes of this host may map
    /// (`cuMemAlloc` and `cuIpcGetMemHandle`): its address here and the handle that names it.
    /// Freed with [`ipc_free`](Self::ipc_free) only.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses either call (nothing is kept then); the
    /// simulated device fails as its allocations do, or when it cannot make the shared file.
    fn ipc_alloc(&self, dev: u32, bytes: usize) -> Result<(DevicePtr, IpcHandle)>;
    /// Frees memory from [`ipc_alloc`](Self::ipc_alloc). Processes that mapped it must have
    /// closed it (their copies from it done) first.
    ///
    /// # Errors
    /// [`Error::Driver`], or [`Error::InvalidPointer`] for memory `ipc_alloc` did not give.
    fn ipc_free(&self, dev: u32, ptr: DevicePtr) -> Result<()>;
    /// Maps memory that another process exported as `handle` into device `dev`'s context
    /// (`cuIpcOpenMemHandle`, peer access enabled as needed): its address here and its bytes
    /// (what the exporter allocated), valid for copies until [`ipc_close`](Self::ipc_close). A
    /// process cannot open its own handles on a GPU.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot map it (another host, a GPU this process does
    /// not see, memory already freed); the simulated device when the shared file is gone.
    fn ipc_open(&self, dev: u32, handle: &IpcHandle) -> Result<(DevicePtr, usize)>;
    /// Unmaps memory [`ipc_open`](Self::ipc_open) mapped (`cuIpcCloseMemHandle`).
    ///
    /// # Errors
    /// [`Error::Driver`], or [`Error::InvalidPointer`] for an address `ipc_open` did not give.
    fn ipc_close(&self, dev: u32, ptr: DevicePtr) -> Result<()>;
    /// Managed (unified) allocation attached globally (`cuMemAllocManaged`). `bytes` > 0.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails (`CUDA_ERROR_OUT_OF_MEMORY` when the memory is
    /// not there; the simulated device reports the same, and [`Error::NoSuchDevice`] for an unknown
    /// device).
    fn malloc_managed(&self, dev: u32, bytes: usize) -> Result<DevicePtr>;

    /// Creates a stream-ordered memory pool on `dev` (`cuMemPoolCreate`), keeping up to
    /// `release_threshold` bytes cached across synchronizations.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails (`CUDA_ERROR_OUT_OF_MEMORY` when the memory is
    /// not there; the simulated device reports the same, and [`Error::NoSuchDevice`] for an unknown
    /// device).
    fn mem_pool_create(&self, dev: u32, release_threshold: u64) -> Result<RawMemPool>;
    /// Destroys a pool made by [`Backend::mem_pool_create`].
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_pool_destroy(&self, dev: u32, pool: RawMemPool) -> Result<()>;
    /// Releases cached memory of the pool down to `keep_bytes` (`cuMemPoolTrimTo`).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_pool_trim(&self, dev: u32, pool: RawMemPool, keep_bytes: usize) -> Result<()>;
    /// Bytes the pool currently holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn mem_pool_reserved(&self, dev: u32, pool: RawMemPool) -> Result<u64>;
    /// Stream-ordered allocation from `pool` (`cuMemAllocFromPoolAsync`). `bytes` > 0.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails (`CUDA_ERROR_OUT_OF_MEMORY` when the memory is
    /// not there; the simulated device reports the same, and [`Error::NoSuchDevice`] for an unknown
    /// device).
    fn malloc_async(
        &self,
        dev: u32,
        pool: RawMemPool,
        bytes: usize,
        stream: RawStream,
    ) -> Result<DevicePtr>;
    /// Stream-ordered free (`cuMemFreeAsync`).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn free_async(&self, dev: u32, ptr: DevicePtr, stream: RawStream) -> Result<()>;

    /// Page-locked host allocation, portable across devices, not write-combined
    /// (`cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE)`). `bytes` > 0.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot pin the memory; the simulated device returns
    /// [`Error::HostOutOfMemory`] when the host has none.
    fn malloc_host(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees what [`Backend::malloc_host`] returned.
    ///
    /// # Safety
    /// `ptr` came from `malloc_host` of this backend and is not used afterwards.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails.
    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()>;
    /// Page-locks an existing host range (`cuMemHostRegister(PORTABLE)`).
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` is a live host allocation that outlives the registration.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot page-lock the range (the simulated device fails the
    /// same way when a pin is told to fail).
    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()>;
    /// Undoes [`Backend::host_register`].
    ///
    /// # Safety
    /// `ptr` was registered with `host_register` and no copy using it is in flight.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()>;

    /// Copies `src` to device memory at `dst` and waits for the copy.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; on the simulated device, also
    /// [`Error::InjectedFault`] when a copy is told to fail, and [`Error::InvalidArgument`] for a
    /// bad range.
    fn memcpy_htod(&self, dev: u32, dst: DevicePtr, src: &[u8]) -> Result<()>;
    /// Copies device memory at `src` into `dst` and waits for the copy.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; on the simulated device, also
    /// [`Error::InjectedFault`] when a copy is told to fail, and [`Error::InvalidArgument`] for a
    /// bad range.
    fn memcpy_dtoh(&self, dev: u32, dst: &mut [u8], src: DevicePtr) -> Result<()>;
    /// Copies `bytes` between device ranges (same or different devices) and waits.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; on the simulated device, also
    /// [`Error::InjectedFault`] when a copy is told to fail, and [`Error::InvalidArgument`] for a
    /// bad range.
    fn memcpy_dtod(&self, dev: u32, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    /// Sets `bytes` of device memory to `value` and waits.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; on the simulated device, also
    /// [`Error::InjectedFault`] when a copy is told to fail, and [`Error::InvalidArgument`] for a
    /// bad range.
    fn memset(&self, dev: u32, dst: DevicePtr, value: u8, bytes: usize) -> Result<()>;
    /// Enqueues a host → device copy on `stream`.
    ///
    /// # Safety
    /// `[src, src + bytes)` stays valid and unchanged until the stream has run the copy.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; on the simulated device, also
    /// [`Error::InjectedFault`] when a copy is told to fail, and [`Error::InvalidArgument`] for a
    /// bad range.
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
    /// `[dst, dst + bytes)` stays valid, and is neither read nor written by the host, until
    /// the stream has run the copy.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; on the simulated device, also
    /// [`Error::InjectedFault`] when a copy is told to fail, and [`Error::InvalidArgument`] for a
    /// bad range.
    unsafe fn memcpy_dtoh_async(
        &self,
        dev: u32,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// Enqueues a device → device copy on `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; on the simulated device, also
    /// [`Error::InjectedFault`] when a copy is told to fail, and [`Error::InvalidArgument`] for a
    /// bad range.
    fn memcpy_dtod_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// Enqueues a memset on `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; on the simulated device, also
    /// [`Error::InjectedFault`] when a copy is told to fail, and [`Error::InvalidArgument`] for a
    /// bad range.
    fn memset_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;

    /// The device of the calling thread's current context, where one is current: what
    /// `cudaGetDevice` reports after `cudaSetDevice` (CuPy's `Device.use()`,
    /// `torch.cuda.set_device`, Numba's `select_device`). None where no context is current,
    /// and on the simulated device, which has no contexts.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot read the thread's context. None by default.
    fn context_device(&self) -> Result<Option<u32>> {
        Ok(None)
    }

    /// Creates a non-blocking stream on `dev`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn stream_create(&self, dev: u32) -> Result<RawStream>;
    /// Destroys a stream made by [`Backend::stream_create`] (work already queued completes).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn stream_destroy(&self, dev: u32, stream: RawStream) -> Result<()>;
    /// Waits until all work queued on `stream` has completed. For the stream's owner: a
    /// stream this backend already destroyed is an error, never a driver call on its
    /// dangling handle.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn stream_synchronize(&self, dev: u32, stream: RawStream) -> Result<()>;
    /// True when all work queued on `stream` has completed. For the stream's owner; a
    /// destroyed stream is an error, as for [`Backend::stream_synchronize`].
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn stream_query(&self, dev: u32, stream: RawStream) -> Result<bool>;
    /// As [`Backend::stream_query`], for a caller that does not own `stream` (a pool asking
    /// about another thread's arena): `None`, without touching the handle, unless the
    /// backend knows the stream is alive (a default stream, or one it made and has not
    /// destroyed), and no destroy runs while the query does. A library's own stream (CuPy's,
    /// PyTorch's) is `None`: it may be gone without the backend knowing.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn stream_query_if_alive(&self, dev: u32, stream: RawStream) -> Result<Option<bool>>;
    /// As [`Backend::stream_synchronize`], for a caller that does not own `stream`: false,
    /// without waiting or touching the handle, unless the backend knows the stream is alive
    /// (see [`Backend::stream_query_if_alive`]); the caller then waits for the whole device.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn stream_synchronize_if_alive(&self, dev: u32, stream: RawStream) -> Result<bool>;
    /// Makes later work on `stream` wait until `event` has completed.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn stream_wait_event(&self, dev: u32, stream: RawStream, event: RawEvent) -> Result<()>;
    /// Creates an event without timing.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn event_create(&self, dev: u32) -> Result<RawEvent>;
    /// Destroys an event.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn event_destroy(&self, dev: u32, event: RawEvent) -> Result<()>;
    /// Records `event` at the current end of `stream`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn event_record(&self, dev: u32, event: RawEvent, stream: RawStream) -> Result<()>;
    /// True when the work captured by the last record of `event` has completed.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn event_query(&self, dev: u32, event: RawEvent) -> Result<bool>;
    /// Waits until the work captured by the last record of `event` has completed.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn event_synchronize(&self, dev: u32, event: RawEvent) -> Result<()>;
    /// Waits until all work on `dev` has completed.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver call fails; the simulated device fails the same way, and
    /// with [`Error::NoSuchDevice`] or [`Error::InvalidArgument`] for an unknown device or handle.
    fn device_synchronize(&self, dev: u32) -> Result<()>;
    /// Makes device `dev`'s context current on the calling thread when the thread has none,
    /// as CUDA's runtime does on a thread's first call. For threads that reach rmm-rs from
    /// another library without having made a CUDA call: there, a runtime that asks for the
    /// current device (librmm's `device_buffer` does, for every buffer) takes a slow path on
    /// each call while no context is current. A thread that has a context keeps it. Checked
    /// once per thread; nothing on the simulated device.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot read or set the thread's context;
    /// [`Error::NoSuchDevice`] for an unknown device. None by default.
    fn bind_thread(&self, dev: u32) -> Result<()> {
        let _ = dev;
        Ok(())
    }
    /// Host memory this process may use ([`HostMemory::read`] by default): what pinning is
    /// checked against before it starts. The simulated device can be given a smaller host
    /// ([`SimBackend::limit_host_memory`], `RMM_SIM_HOST_MEMORY`).
    fn host_memory(&self) -> HostMemory {
        HostMemory::read()
    }
    /// Called before each write to a spill file of device `dev`: a fault-injection point
    /// (the simulated device fails the N-th write when told to,
    /// `SimBackend::fail_nth_file_write`); every other backend lets it through.
    ///
    /// # Errors
    /// None by default; the simulated device returns [`Error::InjectedFault`] for the write it was
    /// told to fail.
    fn before_file_write(&self, dev: u32) -> Result<()> {
        let _ = dev;
        Ok(())
    }
    /// The simulated device this backend is, for fault injection at a chosen moment
    /// ([`SimBackend::fail_nth_allocation`] and the calls beside it); `None` for every other
    /// backend.
    fn as_sim(&self) -> Option<&SimBackend> {
        None
    }
}

/// How the process-wide backend is chosen: `RMM_BACKEND`, and rmm.toml's `backend` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The CUDA driver; fails if there is none.
    Cuda,
    /// The simulated device, configured from the environment ([`SimConfig::from_env`]), with
    /// the faults the environment asks for ([`SimFaults::from_env`]).
    Sim,
    /// Nothing asked for: the GPU, or an error naming what is missing and how to ask for the
    /// simulated device. A library never serves host memory as device memory unless asked.
    #[default]
    Auto,
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for BackendChoice {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for BackendChoice {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::from_name(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is not a backend (auto, cuda or sim)"))
        })
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

    /// The backend a name selects: `cuda` (or `gpu`), `sim` (or `simulated`), `auto` (or
    /// empty), case-insensitive, surrounding white space ignored; `None` for anything else.
    /// The one parser of backend names: `RMM_BACKEND` and rmm-config's `backend` key use it.
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

/// Builds a backend for `choice`. Each call makes a new one; most code wants [`global`].
/// `Cuda` and `Auto` both give the GPU; without a driver or a visible device, `Auto` fails
/// with an error that says how to ask for the simulated device ([`Error::NoDriver`],
/// [`Error::NoDevice`]): the simulated device is never chosen silently.
///
/// # Errors
/// [`Error::NoDriver`] (or [`Error::Driver`]) when the driver cannot be loaded;
/// [`Error::NoDevice`] when `Auto` finds a driver but no device; [`Error::InvalidArgument`]
/// when the simulated device's `RMM_SIM_*` settings are invalid (its fault injection
/// included: [`SimFaults::from_env`]).
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

/// The process-wide backend, chosen on first use from `RMM_BACKEND`.
///
/// The choice is made once; a failure (e.g. `RMM_BACKEND=cuda` with no driver) is returned
/// to every caller.
///
/// # Errors
/// As [`open`]: the error of the first choice, returned to every caller.
pub fn global() -> Result<&'static dyn Backend> {
    GLOBAL
        .get_or_init(|| BackendChoice::from_env().and_then(open))
        .clone()
}

/// The process-wide backend if one has been chosen (by [`global`] or [`install_global`]);
/// unlike [`global`], never chooses one.
pub fn installed() -> Option<&'static dyn Backend> {
    GLOBAL.get().and_then(|r| r.as_ref().ok().copied())
}

/// Installs `backend` as the process-wide backend. Returns the backend already installed
/// (as an error) if one was chosen before.
///
/// # Errors
/// The backend already installed when one was chosen before (by [`global`] or an earlier call).
pub fn install_global(
    backend: &'static dyn Backend,
) -> std::result::Result<(), &'static dyn Backend> {
    let mut installed = false;
    let current = GLOBAL.get_or_init(|| {
        installed = true;
        Ok(backend)
    });
    match (installed, current) {
        (true, _) => Ok(()),
        (false, Ok(existing)) => Err(*existing),
        (false, Err(_)) => Err(backend),
    }
}
