//! The real GPU: CUDA driver API through cudarc's `sys` bindings, loaded at run time.
//!
//! Nothing links against `libcuda`; the library is opened on first use, every entry point
//! this backend calls is looked up before the first call (so a too-old driver is an error,
//! not a panic), and a device's primary context is retained on its first use (never for a
//! device the process does not use: a context holds device memory, and a Dask worker that
//! sees every GPU uses one) and kept for the life of the process.

mod context;
mod ipc;
mod result;
mod staged_copy;
mod vmm;

use std::cell::Cell;
use std::ffi::{CStr, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys;
use result::{
    REQUIRED_SYMBOLS, check, event_handle, format_uuid, pool_handle, query_stream, stream_handle,
};

use super::stream_registry::StreamRegistry;
use super::{
    Backend, BackendKind, DeviceProperties, DevicePtr, IpcHandle, MemInfo, RawEvent, RawMemPool,
    RawPhysical, RawStream,
};
use crate::error::{Error, Result};

#[derive(Debug)]
struct CudaDevice {
    dev: sys::CUdevice,
    /// The retained primary context (`CUcontext` as an address), 0 until first use.
    ctx: AtomicUsize,
    props: DeviceProperties,
}

/// Held while a primary context is retained, so that two threads using a device for the
/// first time retain it once.
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
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `dev` came from cuDeviceGet.
        check("cuDevicePrimaryCtxRetain", self.props.ordinal, unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, self.dev)
        })?;
        self.ctx.store(ctx as usize, Ordering::Release);
        Ok(ctx)
    }
}

/// The CUDA driver backend. There is one per process: [`CudaBackend::load`].
#[derive(Debug)]
pub struct CudaBackend {
    devices: Vec<CudaDevice>,
    driver_version: i32,
    /// Streams this backend made and destroyed: a destroyed handle dangles, and the pools ask
    /// about other threads' streams (see [`StreamRegistry`]).
    streams: StreamRegistry,
    /// Pinned staging for large synchronous copies into pageable memory.
    stagers: staged_copy::Stagers,
}

thread_local! {
    /// Non-zero once `bind_thread` made a context current on this thread for good.
    static BOUND_CONTEXT: Cell<usize> = const { Cell::new(0) };
    /// True once `bind_thread` has looked at this thread's context.
    static THREAD_CHECKED: Cell<bool> = const { Cell::new(false) };
}

/// Allocations of at least this many bytes take [`LARGE_ALLOCATIONS`] (see `malloc`).
const LARGE_ALLOCATION: usize = 1 << 30;
static LARGE_ALLOCATIONS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

static LOADED: OnceLock<std::result::Result<&'static CudaBackend, Error>> = OnceLock::new();

impl CudaBackend {
    /// Loads the driver (once per process) and opens every visible device.
    ///
    /// # Errors
    /// Fails with [`Error::NoDriver`] when `libcuda` cannot be loaded, lacks an entry point,
    /// or does not initialize.
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
            .iter()
            .copied()
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
        // SAFETY: plain driver calls with valid out-pointers; every entry point exists.
        unsafe {
            if let Err(e) = check("cuInit", 0, sys::cuInit(0)) {
                if matches!(&e, Error::Driver { name, .. } if name == "CUDA_ERROR_NO_DEVICE") {
                    return Ok(CudaBackend {
                        devices: Vec::new(),
                        driver_version: 0,
                        streams: StreamRegistry::default(),
                        stagers: Default::default(),
                    });
                }
                return Err(Error::NoDriver {
                    detail: format!("the driver did not initialize: {e}"),
                });
            }
            let mut version = 0;
            check(
                "cuDriverGetVersion",
                0,
                sys::cuDriverGetVersion(&mut version),
            )?;
            let mut count = 0;
            check("cuDeviceGetCount", 0, sys::cuDeviceGetCount(&mut count))?;
            let mut devices = Vec::with_capacity(count.max(0) as usize);
            for ordinal in 0..count.max(0) as u32 {
                devices.push(Self::open_device(ordinal)?);
            }
            tracing::debug!(
                driver_version = version,
                devices = devices.len(),
                "CUDA driver loaded"
            );
            Ok(CudaBackend {
                devices,
                driver_version: version,
                streams: StreamRegistry::default(),
                stagers: Default::default(),
            })
        }
    }

    /// # Safety
    /// The driver is initialized and `ordinal` is below the device count.
    unsafe fn open_device(ordinal: u32) -> Result<CudaDevice> {
        let mut dev: sys::CUdevice = 0;
        let mut name = [0 as std::ffi::c_char; 256];
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        let mut total = 0usize;
        let attr = |a: sys::CUdevice_attribute, dev: sys::CUdevice| -> Result<i32> {
            let mut v = 0;
            // SAFETY: valid out-pointer; `dev` came from cuDeviceGet.
            check("cuDeviceGetAttribute", ordinal, unsafe {
                sys::cuDeviceGetAttribute(&mut v, a, dev)
            })?;
            Ok(v)
        };
        // SAFETY: valid out-pointers and lengths; the ordinal is in range.
        unsafe {
            check(
                "cuDeviceGet",
                ordinal,
                sys::cuDeviceGet(&mut dev, ordinal as i32),
            )?;
            check(
                "cuDeviceGetName",
                ordinal,
                sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev),
            )?;
            check(
                "cuDeviceGetUuid",
                ordinal,
                sys::cuDeviceGetUuid(&mut uuid, dev),
            )?;
            check(
                "cuDeviceTotalMem_v2",
                ordinal,
                sys::cuDeviceTotalMem_v2(&mut total, dev),
            )?;
        }
        use sys::CUdevice_attribute::*;
        let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)?;
        let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)?;
        let pools = attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev)?;
        let managed = attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, dev)?;
        let vmm = attr(
            CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            dev,
        )?;
        // SAFETY: the driver wrote a NUL-terminated name into the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(CudaDevice {
            dev,
            ctx: AtomicUsize::new(0),
            props: DeviceProperties {
                ordinal,
                name,
                total_memory: total,
                uuid: format_uuid(&uuid.bytes),
                compute_capability: (major as u32, minor as u32),
                supports_memory_pools: pools != 0,
                supports_managed_memory: managed != 0,
                supports_virtual_memory: vmm != 0,
            },
        })
    }

    /// True once `ordinal`'s primary context has been retained (the device was used).
    pub fn uses_device(&self, ordinal: u32) -> bool {
        self.devices
            .get(ordinal as usize)
            .is_some_and(|d| d.ctx.load(Ordering::Acquire) != 0)
    }

    /// Makes `dev`'s primary context current on this thread for as long as the returned
    /// guard lives (retaining it on the device's first use); the thread's own context is
    /// current again after. Checked on every call: another library (CuPy's
    /// `Device(n).use()`, say) may have switched the thread's device since.
    fn bind(&self, dev: u32) -> Result<context::Bound> {
        let d = self.devices.get(dev as usize).ok_or(Error::NoSuchDevice {
            requested: dev,
            count: self.devices.len() as u32,
            backend: "cuda",
        })?;
        context::Bound::to(d.context()?, dev)
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
        self.devices
            .get(dev as usize)
            .map(|d| d.props.clone())
            .ok_or(Error::NoSuchDevice {
                requested: dev,
                count: self.devices.len() as u32,
                backend: "cuda",
            })
    }

    fn mem_info(&self, dev: u32) -> Result<MemInfo> {
        let _bound = self.bind(dev)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the device's context is current.
        check("cuMemGetInfo_v2", dev, unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo { free, total })
    }

    fn mem_granularity(&self, dev: u32) -> Result<usize> {
        let _bound = self.bind(dev)?;
        vmm::granularity(dev)
    }

    fn mem_address_reserve(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        let _bound = self.bind(dev)?;
        vmm::address_reserve(dev, bytes)
    }

    fn mem_address_free(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let _bound = self.bind(dev)?;
        vmm::address_free(dev, ptr, bytes)
    }

    fn mem_create(&self, dev: u32, bytes: usize) -> Result<RawPhysical> {
        let _bound = self.bind(dev)?;
        // As for cuMemAlloc: large physical allocations go to the driver one at a time.
        let _one_at_a_time = (bytes >= LARGE_ALLOCATION).then(|| LARGE_ALLOCATIONS.lock());
        vmm::create(dev, bytes)
    }

    fn mem_release(&self, dev: u32, handle: RawPhysical) -> Result<()> {
        let _bound = self.bind(dev)?;
        vmm::release(dev, handle)
    }

    fn mem_map(&self, dev: u32, ptr: DevicePtr, bytes: usize, handle: RawPhysical) -> Result<()> {
        let _bound = self.bind(dev)?;
        vmm::map(dev, ptr, bytes, handle)
    }

    fn mem_unmap(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let _bound = self.bind(dev)?;
        vmm::unmap(dev, ptr, bytes)
    }

    fn mem_set_access(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let _bound = self.bind(dev)?;
        vmm::set_access(dev, ptr, bytes)
    }

    fn malloc(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        let _bound = self.bind(dev)?;
        // Large allocations on several devices at once contend inside the driver: two
        // concurrent large cuMemAlloc calls take longer than one after the other. Every
        // allocation of 1 GiB or more (pool chunks, large plain allocations: slow paths, slow
        // in the driver anyway) therefore goes to the driver one at a time; smaller ones
        // never wait here.
        let _one_at_a_time = (bytes >= LARGE_ALLOCATION).then(|| LARGE_ALLOCATIONS.lock());
        let mut p = 0;
        // SAFETY: valid out-pointer; context current.
        check("cuMemAlloc_v2", dev, unsafe {
            sys::cuMemAlloc_v2(&mut p, bytes)
        })?;
        Ok(DevicePtr(p))
    }

    fn free(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates the pointer and reports an error for a foreign one.
        check("cuMemFree_v2", dev, unsafe { sys::cuMemFree_v2(ptr.0) })
    }

    fn ipc_alloc(&self, dev: u32, bytes: usize) -> Result<(DevicePtr, IpcHandle)> {
        let ptr = self.malloc(dev, bytes)?;
        match ipc::export(dev, ptr) {
            Ok(handle) => Ok((ptr, handle)),
            Err(e) => {
                // Not exportable: nothing is kept.
                let _ = self.free(dev, ptr);
                Err(e)
            }
        }
    }

    fn ipc_free(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        self.free(dev, ptr)
    }

    fn ipc_open(&self, dev: u32, handle: &IpcHandle) -> Result<(DevicePtr, usize)> {
        let _bound = self.bind(dev)?;
        ipc::open(dev, handle)
    }

    fn ipc_close(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        let _bound = self.bind(dev)?;
        ipc::close(dev, ptr)
    }

    fn malloc_managed(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        let _bound = self.bind(dev)?;
        let mut p = 0;
        let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
        // SAFETY: valid out-pointer; context current.
        check("cuMemAllocManaged", dev, unsafe {
            sys::cuMemAllocManaged(&mut p, bytes, flags)
        })?;
        Ok(DevicePtr(p))
    }

    fn mem_pool_create(&self, dev: u32, release_threshold: u64) -> Result<RawMemPool> {
        let _bound = self.bind(dev)?;
        // SAFETY: an all-zero CUmemPoolProps is the documented default; fields set below.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev as i32;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut threshold = release_threshold;
        // SAFETY: valid pointers to initialized locals.
        unsafe {
            check(
                "cuMemPoolCreate",
                dev,
                sys::cuMemPoolCreate(&mut pool, &props),
            )?;
            check(
                "cuMemPoolSetAttribute",
                dev,
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                ),
            )?;
        }
        Ok(pool as usize as RawMemPool)
    }

    fn mem_pool_destroy(&self, dev: u32, pool: RawMemPool) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates the handle.
        check("cuMemPoolDestroy", dev, unsafe {
            sys::cuMemPoolDestroy(pool_handle(pool))
        })
    }

    fn mem_pool_trim(&self, dev: u32, pool: RawMemPool, keep_bytes: usize) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates the handle.
        check("cuMemPoolTrimTo", dev, unsafe {
            sys::cuMemPoolTrimTo(pool_handle(pool), keep_bytes)
        })
    }

    fn mem_pool_reserved(&self, dev: u32, pool: RawMemPool) -> Result<u64> {
        let _bound = self.bind(dev)?;
        let mut v = 0u64;
        // SAFETY: the attribute is a cuuint64_t written into `v`.
        check("cuMemPoolGetAttribute", dev, unsafe {
            sys::cuMemPoolGetAttribute(
                pool_handle(pool),
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut v as *mut u64).cast(),
            )
        })?;
        Ok(v)
    }

    fn malloc_async(
        &self,
        dev: u32,
        pool: RawMemPool,
        bytes: usize,
        stream: RawStream,
    ) -> Result<DevicePtr> {
        let _bound = self.bind(dev)?;
        let mut p = 0;
        // SAFETY: valid out-pointer; the driver validates pool and stream.
        check("cuMemAllocFromPoolAsync", dev, unsafe {
            sys::cuMemAllocFromPoolAsync(&mut p, bytes, pool_handle(pool), stream_handle(stream))
        })?;
        Ok(DevicePtr(p))
    }

    fn free_async(&self, dev: u32, ptr: DevicePtr, stream: RawStream) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates pointer and stream.
        check("cuMemFreeAsync", dev, unsafe {
            sys::cuMemFreeAsync(ptr.0, stream_handle(stream))
        })
    }

    fn malloc_host(&self, bytes: usize) -> Result<*mut u8> {
        let _bound = self.bind(0)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer. PORTABLE: usable from every context; no write-combining,
        // which would make host reads very slow.
        check("cuMemHostAlloc", 0, unsafe {
            sys::cuMemHostAlloc(&mut p, bytes, sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(p.cast())
    }

    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()> {
        let _bound = self.bind(0)?;
        // SAFETY: the caller passes a pointer from `malloc_host`.
        check("cuMemFreeHost", 0, unsafe {
            sys::cuMemFreeHost(ptr.cast())
        })
    }

    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        let _bound = self.bind(0)?;
        // SAFETY: the caller guarantees the range is a live host allocation.
        check("cuMemHostRegister_v2", 0, unsafe {
            sys::cuMemHostRegister_v2(ptr.cast(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE)
        })
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        let _bound = self.bind(0)?;
        // SAFETY: the caller guarantees `ptr` was registered and no copy uses it.
        check("cuMemHostUnregister", 0, unsafe {
            sys::cuMemHostUnregister(ptr.cast())
        })
    }

    fn memcpy_htod(&self, dev: u32, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: `src` is a live slice for the duration of this synchronous copy.
        check("cuMemcpyHtoD_v2", dev, unsafe {
            sys::cuMemcpyHtoD_v2(dst.0, src.as_ptr().cast(), src.len())
        })?;
        // From pageable memory the call returns once the bytes are staged, before the DMA to
        // the device has finished on the legacy stream, which non-blocking streams do not wait
        // for: wait for it, so that a synchronous copy means the bytes are on the device.
        // SAFETY: synchronizes the legacy default stream of the current context.
        check("cuStreamSynchronize", dev, unsafe {
            sys::cuStreamSynchronize(std::ptr::null_mut())
        })
    }

    fn memcpy_dtoh(&self, dev: u32, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let _bound = self.bind(dev)?;
        if dst.len() >= staged_copy::STAGED_FROM {
            // Large copies: through pinned staging, not holding the driver's lock throughout.
            return self
                .stagers
                .copy_dtoh(dev, dst, src, |call, r| check(call, dev, r));
        }
        // SAFETY: `dst` is an exclusive live slice for the duration of this synchronous copy.
        check("cuMemcpyDtoH_v2", dev, unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src.0, dst.len())
        })
    }

    fn memcpy_dtod(&self, dev: u32, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: device pointers are validated by the driver; unified addressing lets the
        // ranges live on different devices.
        check("cuMemcpyDtoD_v2", dev, unsafe {
            sys::cuMemcpyDtoD_v2(dst.0, src.0, bytes)
        })?;
        // SAFETY: plain synchronization of the current context.
        check("cuCtxSynchronize", dev, unsafe { sys::cuCtxSynchronize() })
    }

    fn memset(&self, dev: u32, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates the device range.
        check("cuMemsetD8_v2", dev, unsafe {
            sys::cuMemsetD8_v2(dst.0, value, bytes)
        })?;
        // SAFETY: plain synchronization of the current context.
        check("cuCtxSynchronize", dev, unsafe { sys::cuCtxSynchronize() })
    }

    unsafe fn memcpy_htod_async(
        &self,
        dev: u32,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the caller keeps the host range valid until the stream runs the copy.
        check("cuMemcpyHtoDAsync_v2", dev, unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst.0, src.cast(), bytes, stream_handle(stream))
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
        let _bound = self.bind(dev)?;
        // SAFETY: the caller keeps the host range valid and untouched until the copy runs.
        check("cuMemcpyDtoHAsync_v2", dev, unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast(), src.0, bytes, stream_handle(stream))
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
        let _bound = self.bind(dev)?;
        // SAFETY: device pointers and stream are validated by the driver.
        check("cuMemcpyDtoDAsync_v2", dev, unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, stream_handle(stream))
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
        let _bound = self.bind(dev)?;
        // SAFETY: device pointer and stream are validated by the driver.
        check("cuMemsetD8Async", dev, unsafe {
            sys::cuMemsetD8Async(dst.0, value, bytes, stream_handle(stream))
        })
    }

    fn stream_create(&self, dev: u32) -> Result<RawStream> {
        let _bound = self.bind(dev)?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer; context current.
        check("cuStreamCreate", dev, unsafe {
            sys::cuStreamCreate(&mut s, flags)
        })?;
        let raw = s as usize as RawStream;
        self.streams.created(raw);
        Ok(raw)
    }

    fn stream_destroy(&self, dev: u32, stream: RawStream) -> Result<()> {
        let _bound = self.bind(dev)?;
        self.streams.destroy(stream, || {
            // SAFETY: the driver validates the handle; queued work still completes. No other
            // call through the registry is using the handle (it holds them off).
            check("cuStreamDestroy_v2", dev, unsafe {
                sys::cuStreamDestroy_v2(stream_handle(stream))
            })
        })
    }

    fn stream_synchronize(&self, dev: u32, stream: RawStream) -> Result<()> {
        let _bound = self.bind(dev)?;
        self.streams.unless_destroyed(stream, || {
            // SAFETY: the handle is a default stream, a live stream of this backend, or the
            // caller's own stream (not one this backend destroyed: the registry checked, and
            // holds destruction off until the call returns).
            check("cuStreamSynchronize", dev, unsafe {
                sys::cuStreamSynchronize(stream_handle(stream))
            })
        })
    }

    fn stream_query(&self, dev: u32, stream: RawStream) -> Result<bool> {
        let _bound = self.bind(dev)?;
        self.streams
            .unless_destroyed(stream, || query_stream(dev, stream))
    }

    fn stream_query_if_alive(&self, dev: u32, stream: RawStream) -> Result<Option<bool>> {
        let _bound = self.bind(dev)?;
        self.streams.if_alive(stream, || query_stream(dev, stream))
    }

    fn stream_synchronize_if_alive(&self, dev: u32, stream: RawStream) -> Result<bool> {
        let _bound = self.bind(dev)?;
        // Record an event of our own while the registry vouches for the stream, then wait on
        // the event with the registry released: a long wait never holds a destroy off.
        let event = self.event_create(dev)?;
        let recorded = self
            .streams
            .if_alive(stream, || self.event_record(dev, event, stream));
        let waited = match recorded {
            Ok(Some(())) => self.event_synchronize(dev, event).map(|()| true),
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        };
        let destroyed = self.event_destroy(dev, event);
        let waited = waited?;
        destroyed?;
        Ok(waited)
    }

    fn stream_wait_event(&self, dev: u32, stream: RawStream, event: RawEvent) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates both handles.
        check("cuStreamWaitEvent", dev, unsafe {
            sys::cuStreamWaitEvent(stream_handle(stream), event_handle(event), 0)
        })
    }

    fn event_create(&self, dev: u32) -> Result<RawEvent> {
        let _bound = self.bind(dev)?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: valid out-pointer; context current.
        check("cuEventCreate", dev, unsafe {
            sys::cuEventCreate(&mut e, flags)
        })?;
        Ok(e as usize as RawEvent)
    }

    fn event_destroy(&self, dev: u32, event: RawEvent) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates the handle.
        check("cuEventDestroy_v2", dev, unsafe {
            sys::cuEventDestroy_v2(event_handle(event))
        })
    }

    fn event_record(&self, dev: u32, event: RawEvent, stream: RawStream) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates both handles.
        check("cuEventRecord", dev, unsafe {
            sys::cuEventRecord(event_handle(event), stream_handle(stream))
        })
    }

    fn event_query(&self, dev: u32, event: RawEvent) -> Result<bool> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates the handle.
        let r = unsafe { sys::cuEventQuery(event_handle(event)) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", dev, r).map(|_| true)
    }

    fn event_synchronize(&self, dev: u32, event: RawEvent) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: the driver validates the handle.
        check("cuEventSynchronize", dev, unsafe {
            sys::cuEventSynchronize(event_handle(event))
        })
    }

    fn device_synchronize(&self, dev: u32) -> Result<()> {
        let _bound = self.bind(dev)?;
        // SAFETY: plain synchronization of the current context.
        check("cuCtxSynchronize", dev, unsafe { sys::cuCtxSynchronize() })
    }

    fn context_device(&self) -> Result<Option<u32>> {
        context::current_device(&self.devices)
    }

    fn bind_thread(&self, dev: u32) -> Result<()> {
        if THREAD_CHECKED.with(Cell::get) || BOUND_CONTEXT.with(Cell::get) != 0 {
            return Ok(());
        }
        // Once per thread, whatever the outcome: a failure is not retried on every call.
        THREAD_CHECKED.with(|c| c.set(true));
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the driver writes the calling thread's current context (or null) into
        // `current`, a local that outlives the call.
        check("cuCtxGetCurrent", dev, unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current.is_null() {
            self.bind(dev)?.keep();
            BOUND_CONTEXT.with(|c| c.set(1));
        }
        Ok(())
    }
}
