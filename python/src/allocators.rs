//! Allocators for CuPy, PyTorch and librmm, as C functions: no Python on the allocation path.
//!
//! * CuPy: `cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner)` calls
//!   `void* malloc(void* param, size_t size, int device)` and
//!   `void free(void* param, void* ptr, int device)`. CuPy does not pass the size to `free`
//!   (rmm-rs's `deallocate` needs it) nor a stream: each allocation's size and resource are
//!   remembered in a sharded table, and memory is ordered on the default stream (as RMM's
//!   CuPy allocator does without a current stream).
//! * PyTorch: `torch.cuda.memory.CUDAPluggableAllocator(path, "rmm_rs_torch_alloc",
//!   "rmm_rs_torch_free")` calls `void* alloc(ssize_t size, int device, cudaStream_t)` and
//!   `void free(void* ptr, ssize_t size, int device, cudaStream_t)` from this very library.
//! * librmm (RAPIDS RMM's C++ library, through the `rmm_rs_librmm` bridge package): a
//!   resource of librmm's calls `void* allocate(size_t size, int device, cudaStream_t)`,
//!   `void deallocate(void* ptr, size_t size, int device, cudaStream_t)` and, for librmm's
//!   synchronous variants, `int synchronize(int device, cudaStream_t)` (0 on success), with
//!   the stream librmm passes: memory stays ordered on that stream in rmm-rs's pool.
//!
//! Each call goes to the device's current resource: the rmm-rs stack once initialized (plain
//! `cuMemAlloc` before). An allocation that finds no memory runs the stack's out-of-memory
//! handler first (with `spill.enabled` and `spill.on_demand`, the spill manager spills least
//! recently used buffers, the Dask device store's values among them, and retries); only then
//! does it return null, which each library reports as its own out-of-memory error. Failures
//! are also logged through `tracing`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::per_device::with_per_device_resource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::synchronize_stream;
use rmm_allocator::{Device, StreamView};

/// Live allocations, in shards by address: each block's size and the resource that made it.
/// A block goes back to the resource that made it even after a reinitialize or `finalize`
/// changed the device's resource (the old resource lives until its last block is freed).
struct Live {
    shards: [Mutex<Shard>; 64],
}

/// One shard of [`Live`]. Its blocks name their resource by index into `resources`, which
/// holds one reference per resource and a count of its blocks: allocating and freeing touch
/// no reference count that other threads share.
#[derive(Default)]
struct Shard {
    /// Address → (size, index in `resources`).
    blocks: HashMap<u64, (usize, usize), BuildHasherDefault<AddressHasher>>,
    /// The resources with blocks in this shard, and how many; `None`: a free entry.
    resources: Vec<Option<(SharedResource, usize)>>,
}

impl Shard {
    /// Records `addr` (of `size` bytes) as made by `resource`; a block the table already had
    /// at that address (never freed through it) is returned.
    fn insert(&mut self, addr: u64, size: usize, resource: &SharedResource) -> Option<usize> {
        let found = self
            .resources
            .iter()
            .position(|e| e.as_ref().is_some_and(|(r, _)| Arc::ptr_eq(r, resource)));
        let index = found.unwrap_or_else(|| {
            let entry = Some((Arc::clone(resource), 0));
            match self.resources.iter().position(Option::is_none) {
                Some(i) => {
                    self.resources[i] = entry;
                    i
                }
                None => {
                    self.resources.push(entry);
                    self.resources.len() - 1
                }
            }
        });
        if let Some((_, n)) = &mut self.resources[index] {
            *n += 1;
        }
        let (old_size, old_index) = self.blocks.insert(addr, (size, index))?;
        // A bug elsewhere (the block was never freed through the table): its count goes.
        drop(self.forget(old_index));
        Some(old_size)
    }

    /// Counts one block of resource `index` gone; the resource when it was its last.
    fn forget(&mut self, index: usize) -> Option<SharedResource> {
        let entry = self.resources.get_mut(index)?;
        let last = entry.as_mut().is_some_and(|(_, n)| {
            *n -= 1;
            *n == 0
        });
        if last {
            entry.take().map(|(r, _)| r)
        } else {
            None
        }
    }
}

/// Hashes a block's address (256-byte aligned): a multiply and a fold, so that the bucket
/// (low bits) and tag (high bits) both depend on every address bit above the alignment.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, addr: u64) {
        let h = (addr >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

static LIVE: std::sync::LazyLock<Live> = std::sync::LazyLock::new(|| Live {
    shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
});

impl Live {
    fn shard(&self, addr: u64) -> &Mutex<Shard> {
        // Allocations are 256-byte aligned: mix the bits above that.
        &self.shards[((addr >> 8) ^ (addr >> 20)) as usize % 64]
    }
}

/// Runs `f`, turning a panic into `fallback`: a panic must not unwind into C (CuPy, PyTorch).
fn guarded<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        tracing::error!("rmm_rs allocator: a panic in {what} (reported as a failure)");
        fallback
    })
}

fn allocate(size: usize, device: c_int, stream: StreamView) -> *mut c_void {
    let Ok(device) = u32::try_from(device) else {
        tracing::error!(device, "rmm_rs allocator: a negative device ordinal");
        return std::ptr::null_mut();
    };
    let made = with_per_device_resource(device, |r| {
        // A thread of another library (a librmm client's) may hold no CUDA context: bind the
        // device's, once per thread, as the CUDA runtime would, or librmm's device_buffer
        // asks the runtime for the current device the slow way on every buffer.
        if let Err(e) = r.device().bind_thread() {
            tracing::debug!("rmm_rs allocator: binding device {device}'s context: {e}");
        }
        let p = r.allocate(size, stream)?;
        if !p.is_null()
            && let Some(old) = LIVE.shard(p.addr()).lock().insert(p.addr(), size, r)
        {
            tracing::error!(
                "rmm_rs allocator: {p} was handed out again while the table still held it \
                 ({old} bytes, never freed through rmm_rs); the old entry is dropped"
            );
        }
        Ok(p)
    })
    .and_then(|r| r);
    match made {
        Ok(p) if !p.is_null() => p.addr() as *mut c_void,
        Ok(_) => std::ptr::null_mut(),
        Err(e) => {
            tracing::debug!("rmm_rs allocator: allocating {size} bytes on device {device}: {e}");
            std::ptr::null_mut()
        }
    }
}

fn deallocate(ptr: *mut c_void, stream: StreamView) {
    deallocate_sized(ptr, None, stream);
}

/// Frees `ptr` into the resource that allocated it; `expected`, the size the caller says it
/// allocated (a mismatch is logged; the size allocated is what is freed).
fn deallocate_sized(ptr: *mut c_void, expected: Option<usize>, stream: StreamView) {
    if ptr.is_null() {
        return;
    }
    let p = DevicePtr(ptr as u64);
    let mut shard = LIVE.shard(p.addr()).lock();
    let Some((size, index)) = shard.blocks.remove(&p.addr()) else {
        drop(shard);
        tracing::error!("rmm_rs allocator: freeing {p}, which it did not allocate (ignored)");
        return;
    };
    // Freed under the shard's lock (a pool's free is short, and the lock is one of 64), so
    // that the resource needs no reference of its own here.
    let freed = match &shard.resources[index] {
        Some((resource, _)) => resource.deallocate(p, size, stream),
        None => Ok(()),
    };
    // The resource goes after the lock: dropping it may free a whole stack.
    let last = shard.forget(index);
    drop(shard);
    drop(last);
    if let Some(expected) = expected.filter(|&e| e != size) {
        tracing::error!(
            "rmm_rs allocator: freeing {p} as {expected} bytes, but it was allocated as {size} \
             bytes (freed as {size})"
        );
    }
    if let Err(e) = freed {
        tracing::error!("rmm_rs allocator: freeing {size} bytes at {p}: {e}");
    }
}

/// CuPy's `malloc`.
// SAFETY: an exported C function with a unique rmm_rs_ prefix; no other symbol has the name.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_cupy_malloc(
    _param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    guarded("malloc", std::ptr::null_mut(), || {
        allocate(size, device, StreamView::DEFAULT)
    })
}

/// CuPy's `free`.
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_cupy_free(_param: *mut c_void, ptr: *mut c_void, _device: c_int) {
    guarded("free", (), || deallocate(ptr, StreamView::DEFAULT));
}

/// PyTorch's `alloc`.
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_torch_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let Ok(size) = usize::try_from(size) else {
        return std::ptr::null_mut();
    };
    guarded("alloc", std::ptr::null_mut(), || {
        allocate(size, device, StreamView::from_raw(stream as u64))
    })
}

/// PyTorch's `free` (the size comes from the table: it is the size allocated).
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_torch_free(
    ptr: *mut c_void,
    _size: isize,
    _device: c_int,
    stream: *mut c_void,
) {
    guarded("free", (), || {
        deallocate(ptr, StreamView::from_raw(stream as u64))
    });
}

/// librmm's `allocate`: `size` bytes on `device`, ordered on `stream` (a `cudaStream_t`;
/// null is the default stream). Null when rmm-rs has no memory for it (after spilling).
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_librmm_allocate(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    guarded("allocate", std::ptr::null_mut(), || {
        allocate(size, device, StreamView::from_raw(stream as u64))
    })
}

/// librmm's `deallocate`: frees `ptr` (of `size` bytes) on `stream` into the resource that
/// allocated it.
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_librmm_deallocate(
    ptr: *mut c_void,
    size: usize,
    _device: c_int,
    stream: *mut c_void,
) {
    guarded("deallocate", (), || {
        deallocate_sized(ptr, Some(size), StreamView::from_raw(stream as u64))
    });
}

/// Waits for the work queued on `stream` of `device` (librmm's `allocate_sync` and
/// `deallocate_sync` run on the default stream, then wait for it). 0 on success, -1 on a
/// failure (logged).
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_librmm_synchronize(device: c_int, stream: *mut c_void) -> c_int {
    guarded("synchronize", -1, || {
        let synced = u32::try_from(device)
            .map_err(|_| {
                rmm_allocator::Error::invalid_argument("device", device, "a device ordinal")
            })
            .and_then(Device::new)
            .and_then(|d| synchronize_stream(d, StreamView::from_raw(stream as u64)));
        match synced {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(
                    "rmm_rs allocator: synchronizing stream {stream:?} of device {device}: {e}"
                );
                -1
            }
        }
    })
}

/// `(allocate, deallocate, synchronize)`: the addresses of librmm's three functions, for the
/// `rmm_rs_librmm` bridge (and, through ctypes, RMM's `CallbackMemoryResource`).
#[pyfunction]
fn librmm_functions(py: Python<'_>) -> PyResult<(usize, usize, usize)> {
    crate::simulated::note_published(py, "the librmm bridge")?;
    Ok((
        rmm_rs_librmm_allocate as *const () as usize,
        rmm_rs_librmm_deallocate as *const () as usize,
        rmm_rs_librmm_synchronize as *const () as usize,
    ))
}

/// `(malloc, free)`: the addresses of CuPy's two functions, for `CFunctionAllocator`.
#[pyfunction]
fn cupy_functions(py: Python<'_>) -> PyResult<(usize, usize)> {
    crate::simulated::note_published(py, "the CuPy allocator")?;
    Ok((
        rmm_rs_cupy_malloc as *const () as usize,
        rmm_rs_cupy_free as *const () as usize,
    ))
}

/// `(alloc, free)`: the names of PyTorch's two functions in this library (whose path is the
/// module's `__file__`), for `CUDAPluggableAllocator`.
#[pyfunction]
fn torch_functions(py: Python<'_>) -> PyResult<(&'static str, &'static str)> {
    crate::simulated::note_published(py, "the PyTorch allocator")?;
    Ok(("rmm_rs_torch_alloc", "rmm_rs_torch_free"))
}

/// Live allocations made through the CuPy, PyTorch and librmm functions.
#[pyfunction]
fn live_allocations() -> usize {
    LIVE.shards.iter().map(|s| s.lock().blocks.len()).sum()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cupy_functions, m)?)?;
    m.add_function(wrap_pyfunction!(torch_functions, m)?)?;
    m.add_function(wrap_pyfunction!(librmm_functions, m)?)?;
    m.add_function(wrap_pyfunction!(live_allocations, m)?)?;
    Ok(())
}
