//! Allocators for CuPy and PyTorch, as C functions: no Python on the allocation path.
//!
//! * CuPy: `cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner)` calls
//!   `void* malloc(void* param, size_t size, int device)` and
//!   `void free(void* param, void* ptr, int device)`. CuPy does not pass the size to `free`
//!   (rmm-rs's `deallocate` needs it) nor a stream: sizes are remembered in a sharded table,
//!   and memory is ordered on the default stream (as RMM's CuPy allocator does without a
//!   current stream).
//! * PyTorch: `torch.cuda.memory.CUDAPluggableAllocator(path, "rmm_rs_torch_alloc",
//!   "rmm_rs_torch_free")` calls `void* alloc(ssize_t size, int device, cudaStream_t)` and
//!   `void free(void* ptr, ssize_t size, int device, cudaStream_t)` from this very library.
//!
//! Each call goes to the device's current resource: the rmm-rs stack once initialized (plain
//! `cuMemAlloc` before). A failed allocation returns null, which both libraries report as out
//! of memory; failures are also logged through `tracing`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use parking_lot::Mutex;
use pyo3::prelude::*;
use rmm_allocator::per_device::get_per_device_resource;
use rmm_allocator::{DevicePtr, StreamView};

/// Live CuPy allocations: address → (size, device), in shards by address.
struct Sizes {
    shards: [Mutex<HashMap<u64, usize>>; 64],
}

static SIZES: std::sync::LazyLock<Sizes> = std::sync::LazyLock::new(|| Sizes {
    shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
});

impl Sizes {
    fn shard(&self, addr: u64) -> &Mutex<HashMap<u64, usize>> {
        // Allocations are 256-byte aligned: mix the bits above that.
        &self.shards[((addr >> 8) ^ (addr >> 20)) as usize % 64]
    }
}

fn allocate(size: usize, device: c_int, stream: StreamView) -> *mut c_void {
    let Ok(device) = u32::try_from(device) else {
        tracing::error!(device, "rmm_rs allocator: a negative device ordinal");
        return std::ptr::null_mut();
    };
    match get_per_device_resource(device).and_then(|r| r.allocate(size, stream)) {
        Ok(p) => p.addr() as *mut c_void,
        Err(e) => {
            tracing::debug!("rmm_rs allocator: allocating {size} bytes on device {device}: {e}");
            std::ptr::null_mut()
        }
    }
}

fn deallocate(ptr: *mut c_void, size: usize, device: c_int, stream: StreamView) {
    let Ok(device) = u32::try_from(device) else {
        tracing::error!(device, "rmm_rs allocator: a negative device ordinal");
        return;
    };
    let p = DevicePtr(ptr as u64);
    if let Err(e) = get_per_device_resource(device).and_then(|r| r.deallocate(p, size, stream)) {
        tracing::error!("rmm_rs allocator: freeing {size} bytes at {p} on device {device}: {e}");
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
    let p = allocate(size, device, StreamView::DEFAULT);
    if !p.is_null() {
        SIZES.shard(p as u64).lock().insert(p as u64, size);
    }
    p
}

/// CuPy's `free`.
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_cupy_free(_param: *mut c_void, ptr: *mut c_void, device: c_int) {
    if ptr.is_null() {
        return;
    }
    match SIZES.shard(ptr as u64).lock().remove(&(ptr as u64)) {
        Some(size) => deallocate(ptr, size, device, StreamView::DEFAULT),
        None => tracing::error!(
            "rmm_rs CuPy allocator: freeing {ptr:?}, which it did not allocate (ignored)"
        ),
    }
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
    allocate(size, device, StreamView::from_raw(stream as u64))
}

/// PyTorch's `free`.
// SAFETY: as above.
#[unsafe(no_mangle)]
pub extern "C" fn rmm_rs_torch_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    if ptr.is_null() {
        return;
    }
    let size = usize::try_from(size).unwrap_or(0);
    deallocate(ptr, size, device, StreamView::from_raw(stream as u64));
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

/// Live allocations made through the CuPy functions.
#[pyfunction]
fn cupy_live_allocations() -> usize {
    SIZES.shards.iter().map(|s| s.lock().len()).sum()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cupy_functions, m)?)?;
    m.add_function(wrap_pyfunction!(torch_functions, m)?)?;
    m.add_function(wrap_pyfunction!(cupy_live_allocations, m)?)?;
    Ok(())
}
