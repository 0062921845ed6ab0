//! The real GPU: the CUDA driver API through cudarc's `sys` bindings, every entry point looked up
//! at load (a too-old driver is an error). A device's primary context is retained on its first use
//! only: a context holds device memory, and a Dask worker sees every GPU but uses one.

mod context;
mod current;
mod device;
mod ipc;
mod mem_pool;
mod memory;
mod result;
mod staged_copy;
mod stream;
mod vmm;

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys;
use result::{REQUIRED_SYMBOLS, format_uuid};

use super::stream_registry::StreamRegistry;
use super::{
    Backend, BackendKind, DeviceProperties, DevicePtr, IpcHandle, MemInfo, RawEvent, RawMemPool,
    RawPhysical, RawStream,
};
use crate::error::{Error, Result};

#[derive(Debug)]
struct CudaDevice {
    handle: sys::CUdevice,
    /// The retained primary context (`CUcontext` as an address), 0 until first use.
    ctx: AtomicUsize,
    props: DeviceProperties,
}

/// Held while a primary context is retained, so two threads first using a device retain it once.
static RETAINING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

impl CudaDevice {
    /// The device's primary context, retained on the first call.
    fn context(&self) -> Result<sys::CUcontext> {
        let ctx = self.ctx.load(Ordering::Acquire);
        if ctx != 0 {
            return Ok(ctx as sys::CUcontext);
        }
        let _one = RETAINING.lock();
        let ctx = self.ctx.load(Ordering::Acquire);
        if ctx != 0 {
            return Ok(ctx as sys::CUcontext);
        }
        let ctx = context::retain_primary(self.props.ordinal, self.handle)?;
        self.ctx.store(ctx as usize, Ordering::Release);
        Ok(ctx)
    }

    /// Opens device `ordinal` (driver initialized): its handle and properties.
    fn open(ordinal: u32) -> Result<CudaDevice> {
        use sys::CUdevice_attribute::*;
        let handle = device::get(ordinal)?;
        let attr = |a| device::attribute(ordinal, handle, a);
        Ok(CudaDevice {
            handle,
            ctx: AtomicUsize::new(0),
            props: DeviceProperties {
                ordinal,
                name: device::name(ordinal, handle)?,
                total_memory: device::total_memory(ordinal, handle)?,
                uuid: format_uuid(&device::uuid(ordinal, handle)?),
                compute_capability: (
                    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                    attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
                ),
                supports_memory_pools: attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0,
                supports_managed_memory: attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)? != 0,
                supports_virtual_memory: attr(
                    CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
                )? != 0,
            },
        })
    }
}

/// The CUDA driver backend. There is one per process: [`CudaBackend::load`].
#[derive(Debug)]
pub struct CudaBackend {
    devices: Vec<CudaDevice>,
    driver_version: i32,
    /// Streams made and destroyed: pools ask about others' streams, whose handles may dangle.
    streams: StreamRegistry,
    /// Pinned staging for large synchronous copies into pageable memory.
    stagers: staged_copy::Stagers,
}

thread_local! {
    /// True once `bind_thread` has looked at this thread's context.
    static THREAD_CHECKED: Cell<bool> = const { Cell::new(false) };
}

/// Allocations of at least this many bytes take [`LARGE_ALLOCATIONS`] (see `allocate`).
const LARGE_ALLOCATION: usize = 1 << 30;
static LARGE_ALLOCATIONS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

static LOADED: OnceLock<std::result::Result<&'static CudaBackend, Error>> = OnceLock::new();

impl CudaBackend {
    /// Loads the driver (once per process) and opens every visible device.
    ///
    /// # Errors
    /// [`Error::NoDriver`] if `libcuda` cannot load, lacks an entry point, or does not initialize.
    pub fn load() -> Result<&'static CudaBackend> {
        LOADED
            .get_or_init(|| CudaBackend::open().map(|b| &*Box::leak(Box::new(b))))
            .clone()
    }

    /// The driver's CUDA version as `major * 1000 + minor * 10` (e.g. 13000).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    fn open() -> Result<CudaBackend> {
        // SAFETY: only tries to dlopen the candidate library names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoDriver {
                detail: "the CUDA driver library (libcuda.so / libcuda.so.1) is not on the \
                         dynamic loader's path"
                    .into(),
            });
        }
        // SAFETY: the library is present (checked above), so `culib` does not panic.
        let lib = unsafe { sys::culib() };
        let missing: Vec<&str> = REQUIRED_SYMBOLS
            .split_whitespace()
            // SAFETY: looking a symbol up does not call it.
            .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
            .collect();
        if !missing.is_empty() {
            return Err(Error::NoDriver {
                detail: format!(
                    "the CUDA driver library lacks {} (driver too old: rmm-rs needs a driver \
                     for CUDA 12.8 or newer)",
                    missing.join(", ")
                ),
            });
        }
        let mut backend = CudaBackend {
            devices: Vec::new(),
            driver_version: 0,
            streams: StreamRegistry::default(),
            stagers: Default::default(),
        };
        if let Err(e) = device::init() {
            if matches!(&e, Error::Driver { name, .. } if name == "CUDA_ERROR_NO_DEVICE") {
                return Ok(backend);
            }
            return Err(Error::NoDriver {
                detail: format!("the driver did not initialize: {e}"),
            });
        }
        backend.driver_version = device::driver_version()?;
        backend.devices = (0..device::count()?)
            .map(CudaDevice::open)
            .collect::<Result<_>>()?;
        tracing::debug!(
            driver_version = backend.driver_version,
            devices = backend.devices.len(),
            "CUDA driver loaded"
        );
        Ok(backend)
    }

    /// True once `ordinal`'s primary context has been retained (the device was used).
    pub fn uses_device(&self, ordinal: u32) -> bool {
        self.devices
            .get(ordinal as usize)
            .is_some_and(|d| d.ctx.load(Ordering::Acquire) != 0)
    }

    /// Runs `f` with `dev`'s primary context current ([`bind`](Self::bind)).
    fn on<T>(&self, dev: u32, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _bound = self.bind(dev)?;
        f()
    }

    /// Makes `dev`'s primary context current while the guard lives (checked every call: another
    /// library may have switched it), restoring the thread's own after.
    fn bind(&self, dev: u32) -> Result<current::Bound> {
        current::Bound::to(self.device(dev)?.context()?, dev)
    }

    /// Runs the allocation `f` of `bytes` on `dev`: concurrent large allocations contend inside the
    /// driver, slower than serial ones, so from 1 GiB (slow paths anyway) they go one at a time.
    fn allocate<T>(&self, dev: u32, bytes: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _bound = self.bind(dev)?;
        let _one_at_a_time = (bytes >= LARGE_ALLOCATION).then(|| LARGE_ALLOCATIONS.lock());
        f()
    }

    fn device(&self, dev: u32) -> Result<&CudaDevice> {
        let missing = || Error::no_such_device(dev, self.devices.len() as u32, "cuda");
        self.devices.get(dev as usize).ok_or_else(missing)
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn describe(&self) -> String {
        format!(
            "cuda (driver API {}.{}, {} device{})",
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10,
            self.devices.len(),
            if self.devices.len() == 1 { "" } else { "s" }
        )
    }

    fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    fn properties(&self, dev: u32) -> Result<DeviceProperties> {
        Ok(self.device(dev)?.props.clone())
    }

    fn mem_info(&self, dev: u32) -> Result<MemInfo> {
        self.on(dev, || memory::info(dev))
    }

    fn mem_granularity(&self, dev: u32) -> Result<usize> {
        self.on(dev, || vmm::granularity(dev))
    }

    fn mem_address_reserve(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        self.on(dev, || vmm::address_reserve(dev, bytes))
    }

    fn mem_address_free(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.on(dev, || vmm::address_free(dev, ptr, bytes))
    }

    fn mem_create(&self, dev: u32, bytes: usize) -> Result<RawPhysical> {
        self.allocate(dev, bytes, || vmm::create(dev, bytes))
    }

    fn mem_release(&self, dev: u32, handle: RawPhysical) -> Result<()> {
        self.on(dev, || vmm::release(dev, handle))
    }

    fn mem_map(&self, dev: u32, ptr: DevicePtr, bytes: usize, handle: RawPhysical) -> Result<()> {
        self.on(dev, || vmm::map(dev, ptr, bytes, handle))
    }

    fn mem_unmap(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.on(dev, || vmm::unmap(dev, ptr, bytes))
    }

    fn mem_set_access(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.on(dev, || vmm::set_access(dev, ptr, bytes))
    }

    fn malloc(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        self.allocate(dev, bytes, || memory::alloc(dev, bytes))
    }

    fn free(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        self.on(dev, || memory::free(dev, ptr))
    }

    fn ipc_alloc(&self, dev: u32, bytes: usize) -> Result<(DevicePtr, IpcHandle)> {
        // The export, too, needs the device's context current.
        let _bound = self.bind(dev)?;
        let ptr = self.malloc(dev, bytes)?;
        match ipc::export(dev, ptr) {
            Ok(handle) => Ok((ptr, handle)),
            Err(e) => {
                let _ = self.free(dev, ptr);
                Err(e)
            }
        }
    }

    fn ipc_free(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        self.free(dev, ptr)
    }

    fn ipc_open(&self, dev: u32, handle: &IpcHandle) -> Result<(DevicePtr, usize)> {
        self.on(dev, || ipc::open(dev, handle))
    }

    fn ipc_close(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        self.on(dev, || ipc::close(dev, ptr))
    }

    fn malloc_managed(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        self.on(dev, || memory::alloc_managed(dev, bytes))
    }

    fn mem_pool_create(&self, dev: u32, release_threshold: u64) -> Result<RawMemPool> {
        self.on(dev, || mem_pool::create(dev, release_threshold))
    }

    fn mem_pool_destroy(&self, dev: u32, pool: RawMemPool) -> Result<()> {
        self.on(dev, || mem_pool::destroy(dev, pool))
    }

    fn mem_pool_trim(&self, dev: u32, pool: RawMemPool, keep_bytes: usize) -> Result<()> {
        self.on(dev, || mem_pool::trim(dev, pool, keep_bytes))
    }

    fn mem_pool_reserved(&self, dev: u32, pool: RawMemPool) -> Result<u64> {
        self.on(dev, || mem_pool::reserved(dev, pool))
    }

    fn malloc_async(
        &self,
        dev: u32,
        pool: RawMemPool,
        bytes: usize,
        stream: RawStream,
    ) -> Result<DevicePtr> {
        self.on(dev, || mem_pool::alloc_async(dev, pool, bytes, stream))
    }

    fn free_async(&self, dev: u32, ptr: DevicePtr, stream: RawStream) -> Result<()> {
        self.on(dev, || mem_pool::free_async(dev, ptr, stream))
    }

    fn malloc_host(&self, bytes: usize) -> Result<*mut u8> {
        self.on(0, || memory::alloc_host(0, bytes, true))
    }

    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: the caller passes a pointer from `malloc_host` that no copy uses.
        self.on(0, || unsafe { memory::free_host(0, ptr) })
    }

    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller guarantees the range is a live host allocation.
        self.on(0, || unsafe { memory::host_register(0, ptr, bytes) })
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` was registered and no copy uses it.
        self.on(0, || unsafe { memory::host_unregister(0, ptr) })
    }

    fn memcpy_htod(&self, dev: u32, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let _bound = self.bind(dev)?;
        memory::copy_htod(dev, dst, src)?;
        // From pageable memory the call returns once the bytes are staged, before the DMA on the
        // legacy stream (which non-blocking streams do not wait for) finishes: wait for it.
        // SAFETY: 0 is the legacy default stream, always valid.
        unsafe { stream::synchronize(dev, 0) }
    }

    fn memcpy_dtoh(&self, dev: u32, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let _bound = self.bind(dev)?;
        if dst.len() >= staged_copy::STAGED_FROM {
            return self.stagers.copy_dtoh(dev, dst, src);
        }
        memory::copy_dtoh(dev, dst, src)
    }

    fn memcpy_dtod(&self, dev: u32, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let _bound = self.bind(dev)?;
        memory::copy_dtod(dev, dst, src, bytes)?;
        context::synchronize(dev)
    }

    fn memset(&self, dev: u32, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        let _bound = self.bind(dev)?;
        memory::set(dev, dst, value, bytes)?;
        context::synchronize(dev)
    }

    unsafe fn memcpy_htod_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller keeps the host range valid until the stream runs the copy.
        self.on(dev, || unsafe {
            memory::copy_htod_async(dev, dst, src, bytes, stream)
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dev: u32,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller keeps the host range valid and untouched until the copy runs.
        self.on(dev, || unsafe {
            memory::copy_dtoh_async(dev, dst, src, bytes, stream)
        })
    }

    fn memcpy_dtod_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.on(dev, || {
            memory::copy_dtod_async(dev, dst, src, bytes, stream)
        })
    }

    fn memset_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.on(dev, || memory::set_async(dev, dst, value, bytes, stream))
    }

    fn stream_create(&self, dev: u32) -> Result<RawStream> {
        let _bound = self.bind(dev)?;
        let raw = stream::create(dev)?;
        self.streams.created(raw);
        Ok(raw)
    }

    fn stream_destroy(&self, dev: u32, stream: RawStream) -> Result<()> {
        let _bound = self.bind(dev)?;
        self.streams
            // SAFETY: the registry runs this once, for a live stream of this backend, with every
            // other call on the handle held off.
            .destroy(stream, || unsafe { stream::destroy(dev, stream) })
    }

    fn stream_synchronize(&self, dev: u32, stream: RawStream) -> Result<()> {
        let _bound = self.bind(dev)?;
        self.streams
            // SAFETY: the registry refuses a stream it destroyed and holds destruction off
            // until the call returns.
            .unless_destroyed(stream, || unsafe { stream::synchronize(dev, stream) })
    }

    fn stream_query(&self, dev: u32, stream: RawStream) -> Result<bool> {
        let _bound = self.bind(dev)?;
        self.streams
            // SAFETY: as in `stream_synchronize`.
            .unless_destroyed(stream, || unsafe { stream::query(dev, stream) })
    }

    fn stream_query_if_alive(&self, dev: u32, stream: RawStream) -> Result<Option<bool>> {
        let _bound = self.bind(dev)?;
        // SAFETY: `if_alive` runs the call only for a stream it vouches for, destruction held off.
        self.streams
            .if_alive(stream, || unsafe { stream::query(dev, stream) })
    }

    fn stream_synchronize_if_alive(&self, dev: u32, stream: RawStream) -> Result<bool> {
        let _bound = self.bind(dev)?;
        // Record our own event while the registry vouches for the stream, then wait on it with the
        // registry released, so a long wait never holds a destroy off.
        let event = stream::event_create(dev)?;
        let recorded = self
            .streams
            .if_alive(stream, || stream::event_record(dev, event, stream));
        let waited = recorded.and_then(|r| match r {
            Some(()) => stream::event_synchronize(dev, event).map(|()| true),
            None => Ok(false),
        });
        let destroyed = stream::event_destroy(dev, event);
        let waited = waited?;
        destroyed?;
        Ok(waited)
    }

    fn stream_wait_event(&self, dev: u32, stream: RawStream, event: RawEvent) -> Result<()> {
        self.on(dev, || stream::wait_event(dev, stream, event))
    }

    fn event_create(&self, dev: u32) -> Result<RawEvent> {
        self.on(dev, || stream::event_create(dev))
    }

    fn event_destroy(&self, dev: u32, event: RawEvent) -> Result<()> {
        self.on(dev, || stream::event_destroy(dev, event))
    }

    fn event_record(&self, dev: u32, event: RawEvent, stream: RawStream) -> Result<()> {
        self.on(dev, || stream::event_record(dev, event, stream))
    }

    fn event_query(&self, dev: u32, event: RawEvent) -> Result<bool> {
        self.on(dev, || stream::event_query(dev, event))
    }

    fn event_synchronize(&self, dev: u32, event: RawEvent) -> Result<()> {
        self.on(dev, || stream::event_synchronize(dev, event))
    }

    fn device_synchronize(&self, dev: u32) -> Result<()> {
        self.on(dev, || context::synchronize(dev))
    }

    fn context_device(&self) -> Result<Option<u32>> {
        current::current_device(&self.devices)
    }

    fn bind_thread(&self, dev: u32) -> Result<()> {
        if THREAD_CHECKED.with(Cell::get) {
            return Ok(());
        }
        // Once per thread, whatever the outcome: a failure is not retried on every call.
        THREAD_CHECKED.with(|c| c.set(true));
        if context::current(dev)?.is_null() {
            self.bind(dev)?.keep();
        }
        Ok(())
    }
}
