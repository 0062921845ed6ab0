//! Allocators for CuPy and PyTorch, as C functions: no Python on the allocation path.
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
//!
//! Each call goes to the device's current resource: the rmm-rs stack once initialized (plain
//! `cuMemAlloc` before). A failed allocation returns null, which both libraries report as out
//! of memory; failures are also logged through `tracing`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use parking_lot::Mutex;
use pyo3::prelude::*;
use rmm_allocator::per_device::get_per_device_resource;
use rmm_allocator::resource::SharedResource;
use rmm_allocator::{DevicePtr, StreamView};

/// Live allocations: address → (size, the resource that made it), in shards by address. A
/// block goes back to the resource that made it even after a reinitialize or `finalize`
/// changed the device's resource (the old resource lives until its last block is freed).
struct Live {
    shards: [Mutex<HashMap<u64, (usize, SharedResource)>>; 64],
}

static LIVE: std::sync::LazyLock<Live> = std::sync::LazyLock::new(|| Live {
    shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
});

impl Live {
    fn shard(&self, addr: u64) -> &Mutex<HashMap<u64, (usize, SharedResource)>> {
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
    let made =
        get_per_device_resource(device).and_then(|r| r.allocate(size, stream).map(|p| (p, r)));
    match made {
        Ok((p, r)) if !p.is_null() => {
            LIVE.shard(p.addr()).lock().insert(p.addr(), (size, r));
            p.addr() as *mut c_void
        }
        Ok(_) => std::ptr::null_mut(),
        Err(e) => {
            tracing::debug!("rmm_rs allocator: allocating {size} bytes on device {device}: {e}");
            std::ptr::null_mut()
        }
    }
}

fn deallocate(ptr: *mut c_void, stream: StreamView) {
    if ptr.is_null() {
        return;
    }
    let p = DevicePtr(ptr as u64);
    let Some((size, resource)) = LIVE.shard(p.addr()).lock().remove(&p.addr()) else {
        tracing::error!("rmm_rs allocator: freeing {p}, which it did not allocate (ignored)");
        return;
    };
    if let Err(e) = resource.deallocate(p, size, stream) {
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

/// `(malloc, free)`: the addresses of CuPy's two functions, for `CFunctionAllocator`.
#[pyfunction]
fn cupy_functions() -> (usize, usize) {
    (
        rmm_rs_cupy_malloc as *const () as usize,
        rmm_rs_cupy_free as *const () as usize,
    )
}

/// `(alloc, free)`: the names of PyTorch's two functions in this library (whose path is the
/// module's `__file__`), for `CUDAPluggableAllocator`.
#[pyfunction]
fn torch_functions() -> (&'static str, &'static str) {
    ("rmm_rs_torch_alloc", "rmm_rs_torch_free")
}

/// Live allocations made through the CuPy and PyTorch functions.
#[pyfunction]
fn live_allocations() -> usize {
    LIVE.shards.iter().map(|s| s.lock().len()).sum()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cupy_functions, m)?)?;
    m.add_function(wrap_pyfunction!(torch_functions, m)?)?;
    m.add_function(wrap_pyfunction!(live_allocations, m)?)?;
    Ok(())
}
