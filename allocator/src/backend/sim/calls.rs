//! The simulated device's [`Backend`] calls: memory, copies, stream-ordered pools, streams, events.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::memory::{AllocKind, Backing, DEVICE_ALIGNMENT, HOST_ALIGNMENT, Resolved};
use super::stream::{SimEvent, SimStream};
use super::{HostBlock, SimBackend, SimMemoryMode, SimPool, at_least_one_byte, spawn_stream};
use crate::backend::host_memory::HostMemory;
use crate::backend::{
    Backend, BackendKind, DeviceProperties, DevicePtr, IpcHandle, MemInfo, RawEvent, RawMemPool,
    RawPhysical, RawStream,
};
use crate::error::{Error, Result, fmt_bytes};

/// Copies between ranges of (host address, `None` if unbacked; length) pieces of equal total
/// length; an unbacked source reads as zeros. `src` is only read.
///
/// # Safety
/// Host addresses, when given, are valid for their pieces' lengths.
unsafe fn move_bytes(dst: &[(Option<*mut u8>, usize)], src: &[(Option<*mut u8>, usize)]) {
    let (mut i, mut j, mut di, mut sj) = (0, 0, 0, 0);
    while i < dst.len() && j < src.len() {
        let (d, dl) = dst[i];
        let (s, sl) = src[j];
        let n = (dl - di).min(sl - sj);
        // SAFETY: `di + n <= dl` and `sj + n <= sl`: inside both pieces.
        let (d, s) = unsafe { (d.map(|p| p.add(di)), s.map(|p| p.add(sj))) };
        match (d, s) {
            // SAFETY: the caller guarantees both pieces are valid; `copy` allows overlap.
            (Some(d), Some(s)) => unsafe { std::ptr::copy(s, d, n) },
            // SAFETY: the caller guarantees `d` is valid for its piece.
            (Some(d), None) => unsafe { std::ptr::write_bytes(d, 0, n) },
            _ => {}
        }
        di += n;
        sj += n;
        if di == dl {
            (i, di) = (i + 1, 0);
        }
        if sj == sl {
            (j, sj) = (j + 1, 0);
        }
    }
}

/// Sets every byte of a resolved range to `value` (nothing where unbacked).
///
/// # Safety
/// The range's backings are alive (`r` keeps them).
unsafe fn fill(r: &Resolved, value: u8) {
    for (p, n) in r.pieces() {
        if let Some(p) = p {
            // SAFETY: validated for `n` bytes; `r` keeps the backing alive.
            unsafe { std::ptr::write_bytes(p, value, n) };
        }
    }
}

/// `pool` from `pools` if it is a live pool of `dev`.
fn live_pool(
    pools: &HashMap<u64, Arc<SimPool>>,
    dev: u32,
    pool: RawMemPool,
) -> Result<&Arc<SimPool>> {
    match pools.get(&pool) {
        Some(p) if p.device == dev => Ok(p),
        _ => Err(Error::invalid_argument(
            "memory pool",
            format!("{pool:#x}"),
            "a live pool of this device",
        )),
    }
}

impl SimBackend {
    /// Forgets the host block at `ptr`: pinned by `malloc_host` if `pinned`, else registered.
    fn forget_host(&self, ptr: *mut u8, pinned: bool, call: &'static str) -> Result<()> {
        let mut host = self.host.lock();
        match host.get(&(ptr as u64)) {
            Some(b) if matches!(b, HostBlock::Pinned(_)) == pinned => {
                host.remove(&(ptr as u64));
                Ok(())
            }
            _ => Err(Error::invalid_pointer(ptr as u64, 0, call)),
        }
    }

    /// Counts a synchronous copy, ordered after the default stream's work as in CUDA.
    fn start_sync_copy(&self, dev: u32) -> Result<()> {
        self.stream(dev, 0)?.synchronize();
        self.count_copy(dev)
    }

    /// Both ranges of a device → device copy, resolved under one lock.
    fn resolve_pair(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        call: &'static str,
    ) -> Result<(Resolved, Resolved)> {
        let t = self.table.lock();
        Ok((t.resolve(dst, bytes, call)?, t.resolve(src, bytes, call)?))
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
            supports_virtual_memory: self.vmm_supported.load(Ordering::SeqCst),
        })
    }

    fn mem_info(&self, dev: u32) -> Result<MemInfo> {
        let device = self.device(dev)?;
        device.faults.memory_queries.fetch_add(1, Ordering::SeqCst);
        let used = device.used.load(Ordering::SeqCst);
        Ok(MemInfo {
            free: self.config.capacity.saturating_sub(used),
            total: self.config.capacity,
        })
    }

    fn mem_granularity(&self, dev: u32) -> Result<usize> {
        self.device(dev)?;
        Ok(super::vmm::GRANULARITY)
    }

    fn mem_address_reserve(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        self.vmm_reserve(dev, bytes)
    }

    fn mem_address_free(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.vmm_address_free(dev, ptr, bytes)
    }

    fn mem_create(&self, dev: u32, bytes: usize) -> Result<RawPhysical> {
        self.vmm_create(dev, bytes)
    }

    fn mem_release(&self, dev: u32, handle: RawPhysical) -> Result<()> {
        self.vmm_release(dev, handle)
    }

    fn mem_map(&self, dev: u32, ptr: DevicePtr, bytes: usize, handle: RawPhysical) -> Result<()> {
        self.vmm_map(dev, ptr, bytes, handle)
    }

    fn mem_unmap(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.vmm_unmap(dev, ptr, bytes)
    }

    fn mem_set_access(&self, dev: u32, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.vmm_set_access(dev, ptr, bytes)
    }

    fn malloc(&self, dev: u32, bytes: usize) -> Result<DevicePtr> {
        self.allocate(dev, bytes, AllocKind::Device, "cuMemAlloc_v2")
    }

    fn free(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        let d = self.device(dev)?;
        let mut table = self.table.lock();
        let device_memory = |kind| matches!(kind, AllocKind::Device | AllocKind::Managed);
        let a = table.take(ptr, dev, device_memory, "the simulated device")?;
        d.used.fetch_sub(a.len, Ordering::SeqCst);
        Ok(())
    }

    fn ipc_alloc(&self, dev: u32, bytes: usize) -> Result<(DevicePtr, IpcHandle)> {
        self.sim_ipc_alloc(dev, bytes)
    }

    fn ipc_free(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        self.sim_ipc_free(dev, ptr)
    }

    fn ipc_open(&self, dev: u32, handle: &IpcHandle) -> Result<(DevicePtr, usize)> {
        self.sim_ipc_open(dev, handle)
    }

    fn ipc_close(&self, dev: u32, ptr: DevicePtr) -> Result<()> {
        self.sim_ipc_close(dev, ptr)
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
        live_pool(&pools, dev, pool)?;
        pools.remove(&pool);
        Ok(())
    }

    fn mem_pool_trim(&self, dev: u32, pool: RawMemPool, _keep_bytes: usize) -> Result<()> {
        // Nothing is cached: freed blocks go back to the device when the stream reaches them.
        self.mem_pool_reserved(dev, pool).map(|_| ())
    }

    fn mem_pool_reserved(&self, dev: u32, pool: RawMemPool) -> Result<u64> {
        let pools = self.pools.read();
        let p = live_pool(&pools, dev, pool)?;
        Ok(p.reserved.load(Ordering::SeqCst))
    }

    fn malloc_async(
        &self,
        dev: u32,
        pool: RawMemPool,
        bytes: usize,
        stream: RawStream,
    ) -> Result<DevicePtr> {
        self.stream(dev, stream)?;
        let p = Arc::clone(live_pool(&self.pools.read(), dev, pool)?);
        let ptr = self.allocate(dev, bytes, AllocKind::Pool(pool), "cuMemAllocFromPoolAsync")?;
        p.reserved.fetch_add(
            bytes.next_multiple_of(DEVICE_ALIGNMENT) as u64,
            Ordering::SeqCst,
        );
        Ok(ptr)
    }

    fn free_async(&self, dev: u32, ptr: DevicePtr, stream: RawStream) -> Result<()> {
        let s = self.stream(dev, stream)?;
        let addr = ptr.addr();
        let pool = self
            .table
            .lock()
            .live
            .get(&addr)
            .and_then(|a| match a.kind {
                AllocKind::Pool(p) if a.device == dev => self.pools.read().get(&p).cloned(),
                _ => None,
            });
        let pool = pool.ok_or(Error::invalid_pointer(addr, 0, "simulated cuMemFreeAsync"))?;
        let table = Arc::clone(&self.table);
        let used = Arc::clone(&self.device(dev)?.used);
        let release = move || {
            if let Some(a) = table.lock().live.remove(&addr) {
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

    fn host_memory(&self) -> HostMemory {
        let Some(limit) = self.host_limit() else {
            return HostMemory::read();
        };
        HostMemory {
            physical: limit,
            available_now: limit.saturating_sub(self.pinned_host_bytes() as u64),
            cgroup: None,
        }
    }

    fn malloc_host(&self, bytes: usize) -> Result<*mut u8> {
        at_least_one_byte(bytes)?;
        self.count_pin("cuMemHostAlloc", bytes)?;
        let b = Backing::new(bytes, HOST_ALIGNMENT)
            .ok_or(Error::host_out_of_memory(bytes, "simulated cuMemHostAlloc"))?;
        let ptr = b.ptr();
        self.host.lock().insert(ptr as u64, HostBlock::Pinned(b));
        Ok(ptr)
    }

    unsafe fn free_host(&self, ptr: *mut u8) -> Result<()> {
        self.forget_host(ptr, true, "simulated cuMemFreeHost")
    }

    unsafe fn host_register(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        if ptr.is_null() || bytes == 0 {
            return Err(Error::invalid_argument(
                "host range",
                format!("{ptr:p} + {bytes}"),
                "a non-null pointer and a non-zero length",
            ));
        }
        self.count_pin("cuMemHostRegister", bytes)?;
        if !resident(ptr, bytes) {
            self.unbacked_registrations.fetch_add(1, Ordering::SeqCst);
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
        self.forget_host(ptr, false, "simulated cuMemHostUnregister")
    }

    fn memcpy_htod(&self, dev: u32, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.start_sync_copy(dev)?;
        let d = self.resolve(dst, src.len(), "simulated cuMemcpyHtoD")?;
        // SAFETY: `d` was validated for `src.len()` bytes and its backing is kept alive by `d`.
        unsafe { move_bytes(&d.pieces(), &[(Some(src.as_ptr().cast_mut()), src.len())]) };
        Ok(())
    }

    fn memcpy_dtoh(&self, dev: u32, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.start_sync_copy(dev)?;
        let s = self.resolve(src, dst.len(), "simulated cuMemcpyDtoH")?;
        // SAFETY: `s` was validated for `dst.len()` bytes; `dst` is an exclusive slice.
        unsafe { move_bytes(&[(Some(dst.as_mut_ptr()), dst.len())], &s.pieces()) };
        Ok(())
    }

    fn memcpy_dtod(&self, dev: u32, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.start_sync_copy(dev)?;
        let (d, s) = self.resolve_pair(dst, src, bytes, "simulated cuMemcpyDtoD")?;
        // SAFETY: both ranges were validated for `bytes` and their backings are alive.
        unsafe { move_bytes(&d.pieces(), &s.pieces()) };
        Ok(())
    }

    fn memset(&self, dev: u32, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.count_copy(dev)?;
        let d = self.resolve(dst, bytes, "simulated cuMemsetD8")?;
        // SAFETY: validated for `bytes`; `d` keeps the backings alive.
        unsafe { fill(&d, value) };
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
        let d = self.resolve(dst, bytes, "simulated cuMemcpyHtoDAsync")?;
        let src = src as usize;
        s.submit(move || {
            // SAFETY: the caller keeps `src` valid until this job runs; `d` keeps its backing.
            unsafe { move_bytes(&d.pieces(), &[(Some(src as *mut u8), bytes)]) }
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
        let r = self.resolve(src, bytes, "simulated cuMemcpyDtoHAsync")?;
        let dst = dst as usize;
        s.submit(move || {
            // SAFETY: the caller keeps `dst` valid, untouched, until this job runs; `r` the source.
            unsafe { move_bytes(&[(Some(dst as *mut u8), bytes)], &r.pieces()) }
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
        let (d, r) = self.resolve_pair(dst, src, bytes, "simulated cuMemcpyDtoDAsync")?;
        s.submit(move || {
            // SAFETY: both ranges were validated and their backings are kept alive by `d`, `r`.
            unsafe { move_bytes(&d.pieces(), &r.pieces()) }
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
        let d = self.resolve(dst, bytes, "simulated cuMemsetD8Async")?;
        s.submit(move || {
            // SAFETY: validated for `bytes`; `d` keeps the backings alive.
            unsafe { fill(&d, value) }
        });
        Ok(())
    }

    fn stream_create(&self, dev: u32) -> Result<RawStream> {
        self.device(dev)?;
        let h = self.handle();
        let s = spawn_stream(dev, format!("sim-dev{dev}-stream{h:x}"))?;
        self.streams.write().insert(h, s);
        Ok(h)
    }

    fn stream_destroy(&self, dev: u32, stream: RawStream) -> Result<()> {
        if stream < 3 {
            return Err(Error::invalid_argument(
                "stream",
                stream,
                "a stream made by stream_create (the default, legacy and per-thread default \
                 streams cannot be destroyed)",
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
        Ok(self.stream(dev, stream).map(|s| s.synchronize()).is_ok())
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
        all.extend(self.device(dev)?.per_thread_streams.lock().clone());
        for s in all {
            s.synchronize();
        }
        Ok(())
    }

    fn before_file_write(&self, dev: u32) -> Result<()> {
        self.count(dev, "spill file write", |f| &f.file_write)
    }

    fn as_sim(&self) -> Option<&SimBackend> {
        Some(self)
    }
}

/// Whether every page of `[ptr, ptr + bytes)` is backed by memory (`mincore`, from the start's
/// page on); false when that cannot be told (an unmapped range).
fn resident(ptr: *mut u8, bytes: usize) -> bool {
    // SAFETY: takes no pointer.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let start = (ptr as usize) & !(page - 1);
    let len = ptr as usize + bytes - start;
    let mut pages = vec![0u8; len.div_ceil(page)];
    // SAFETY: a page-aligned start and one status byte per page; on an unmapped range mincore
    // fails with ENOMEM, reading and writing nothing else.
    let r = unsafe { libc::mincore(start as *mut libc::c_void, len, pages.as_mut_ptr()) };
    r == 0 && pages.iter().all(|p| p & 1 == 1)
}
