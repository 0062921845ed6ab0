//! [`DeviceBuffer`]: device bytes from the device's current stack, with
//! `__cuda_array_interface__` so CuPy, Numba and PyTorch wrap it without a copy.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::synchronize_stream;
use rmm_allocator::{Device, StreamView};
use rmm_allocator::{thread_device, with_device};

use super::{Reduced, cuda_array, freed, host_bytes, settle, stream_of};
use crate::error;

/// A `DeviceBuffer`'s memory: its own allocation, or a view of spilled data back on the
/// device (a value of a Dask device store rebuilt without a copy).
enum Memory {
    Owned(rmm_allocator::DeviceBuffer),
    View(crate::store::DeviceView),
}

impl Memory {
    fn data(&self) -> DevicePtr {
        match self {
            Memory::Owned(b) => b.data(),
            Memory::View(v) => DevicePtr(v.address()),
        }
    }

    fn size(&self) -> usize {
        match self {
            Memory::Owned(b) => b.size(),
            Memory::View(v) => v.len(),
        }
    }

    /// Bytes allocated (at least [`size`](Self::size)).
    fn capacity(&self) -> usize {
        match self {
            Memory::Owned(b) => b.capacity(),
            Memory::View(v) => v.len(),
        }
    }

    /// A copy of the bytes, after the work queued so far on `stream` and the default stream.
    fn to_vec(&self, device: u32, stream: StreamView) -> rmm_allocator::Result<Vec<u8>> {
        let d = Device::new(device)?;
        settle(d, stream)?;
        let mut out = vec![0u8; self.size()];
        if !out.is_empty() {
            d.copy_to_host(&mut out, self.data())?;
        }
        Ok(out)
    }

    /// A new allocation of `size` bytes (at least `capacity`) on `device` holding the first
    /// bytes of this memory, on `stream`.
    fn copied(
        &self,
        device: u32,
        size: usize,
        capacity: usize,
        stream: StreamView,
    ) -> rmm_allocator::Result<rmm_allocator::DeviceBuffer> {
        with_device(device, || {
            let d = Device::new(device)?;
            let mut b = rmm_allocator::DeviceBuffer::new(size, stream)?;
            b.reserve(capacity, stream)?;
            settle(d, stream)?;
            let n = size.min(self.size());
            if n > 0 {
                d.copy_device_to_device(b.data(), self.data(), n)?;
            }
            Ok(b)
        })?
    }
}

/// Device bytes from the device's current resource (the rmm-rs stack once initialized).
/// Contents start uninitialized. Freed when the object is collected, on the default stream.
///
/// Threads may share a buffer: each call has the memory to itself while it runs (a `free()`
/// waits for a `to_bytes()` under way, then frees), and a call that finds the buffer freed
/// raises `RmmError` saying so.
#[pyclass(module = "rmm_rs", frozen)]
pub struct DeviceBuffer {
    /// The memory (`None` once freed); a call holds the lock while it uses the memory.
    inner: Mutex<Option<Memory>>,
    device: u32,
}

/// The error of a call on a buffer that was freed, made where the GIL is held.
struct Freed;

impl From<Freed> for PyErr {
    fn from(_: Freed) -> PyErr {
        freed()
    }
}

impl DeviceBuffer {
    /// Runs `f` on the memory, holding the buffer's lock; waits for the lock (another
    /// thread's call on this buffer) without the GIL. For quick looks: `f` runs with the GIL
    /// when the lock is free.
    fn peek<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Memory) -> R + Send,
    ) -> Result<R, Freed> {
        match self.inner.try_lock() {
            Some(memory) => memory.as_ref().map(f).ok_or(Freed),
            None => py.detach(|| self.inner.lock().as_ref().map(f).ok_or(Freed)),
        }
    }

    /// Runs `f` on the memory without the GIL, holding the buffer's lock: for calls that copy
    /// or allocate.
    fn work<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Memory, u32) -> rmm_allocator::Result<R> + Send,
    ) -> PyResult<R> {
        let device = self.device;
        py.detach(|| self.inner.lock().as_ref().map(|m| f(m, device)))
            .ok_or_else(freed)?
            .map_err(error)
    }

    /// Runs `change` on the memory without the GIL, holding the buffer's lock; a buffer it
    /// returns replaces the memory (a view that had to be copied to grow).
    fn change_memory(
        &self,
        py: Python<'_>,
        change: impl FnOnce(
            &mut Memory,
            u32,
        ) -> rmm_allocator::Result<Option<rmm_allocator::DeviceBuffer>>
        + Send,
    ) -> PyResult<()> {
        let device = self.device;
        // The memory replaced, if any, is let go with the GIL, as `free()` lets it go.
        let replaced = py
            .detach(|| {
                let mut inner = self.inner.lock();
                let memory = inner.as_mut()?;
                Some(
                    change(memory, device)
                        .map(|new| new.and_then(|b| inner.replace(Memory::Owned(b)))),
                )
            })
            .ok_or_else(freed)?
            .map_err(error)?;
        drop(replaced);
        Ok(())
    }

    pub(crate) fn owned(b: rmm_allocator::DeviceBuffer, device: u32) -> Self {
        DeviceBuffer {
            inner: Mutex::new(Some(Memory::Owned(b))),
            device,
        }
    }

    /// A new buffer holding a copy of the `nbytes` device bytes at `ptr` on `device`, copied
    /// after the default stream's work.
    fn copied_from(
        py: Python<'_>,
        ptr: u64,
        nbytes: usize,
        device: u32,
    ) -> rmm_allocator::Result<Self> {
        let b = py.detach(|| {
            with_device(device, || {
                let b = rmm_allocator::DeviceBuffer::new(nbytes, StreamView::DEFAULT)?;
                let d = Device::new(device)?;
                synchronize_stream(d, StreamView::DEFAULT)?;
                if nbytes > 0 {
                    d.copy_device_to_device(
                        b.data(),
                        rmm_allocator::backend::DevicePtr(ptr),
                        nbytes,
                    )?;
                }
                Ok::<_, rmm_allocator::Error>(b)
            })
        })??;
        Ok(DeviceBuffer::owned(b, device))
    }
}

#[pymethods]
impl DeviceBuffer {
    /// `size` bytes on `device` (default 0: in a Dask worker, the one GPU it sees), allocated
    /// on `stream` (None for the default stream, or an int stream handle; the buffer is freed
    /// on it). With `ptr`, RAPIDS RMM's `DeviceBuffer(ptr=, size=)`: a copy of the `size`
    /// device bytes at that address (device memory on `device`; `to_device` copies host
    /// bytes). `mr`: RMM's resource argument; rmm-rs allocates from the device's current
    /// stack, so only None is accepted.
    #[new]
    #[pyo3(signature = (size=0, device=None, *, ptr=None, stream=None, mr=None))]
    fn new(
        py: Python<'_>,
        size: usize,
        device: Option<u32>,
        ptr: Option<u64>,
        stream: Option<&Bound<'_, PyAny>>,
        mr: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let device = device.unwrap_or_else(thread_device);
        if let Some(mr) = mr {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "DeviceBuffer(mr={}): rmm-rs allocates from each device's current stack, which \
                 rmm_rs.initialize / rmm_rs.reinitialize build from rmm.toml or RMM's keywords \
                 (reinitialize(pool_allocator=True, initial_pool_size=...)); leave mr out",
                mr.repr()
                    .map(|r| r.to_string())
                    .unwrap_or_else(|_| "...".into())
            )));
        }
        if let Some(ptr) = ptr.filter(|&p| p != 0) {
            return Self::copied_from(py, ptr, size, device).map_err(|e| {
                error(format!(
                    "DeviceBuffer(ptr={ptr:#x}, size={size}): copying the bytes at ptr on device \
                     {device} failed ({e}); ptr must be device memory there (for host bytes use \
                     DeviceBuffer.to_device(data))"
                ))
            });
        }
        let stream = stream_of(stream)?;
        let b = py
            .detach(|| with_device(device, || rmm_allocator::DeviceBuffer::new(size, stream)))
            .map_err(error)?
            .map_err(error)?;
        Ok(DeviceBuffer::owned(b, device))
    }

    /// A buffer holding a copy of `data` (any object with the buffer protocol: bytes,
    /// bytearray, memoryview, a NumPy array).
    #[staticmethod]
    #[pyo3(signature = (data, device=None))]
    fn from_bytes(data: &Bound<'_, PyAny>, device: Option<u32>) -> PyResult<Self> {
        let device = device.unwrap_or_else(thread_device);
        let bytes = host_bytes(data)?;
        let b = data
            .py()
            .detach(|| {
                with_device(device, || {
                    rmm_allocator::DeviceBuffer::from_host(&bytes, StreamView::DEFAULT)
                })
            })
            .map_err(error)?
            .map_err(error)?;
        Ok(DeviceBuffer::owned(b, device))
    }

    /// A buffer holding a copy of `nbytes` device bytes at address `ptr` on `device` (memory
    /// of another library: a received CuPy or RMM buffer, say), copied on the device after
    /// the default stream's work.
    #[staticmethod]
    #[pyo3(signature = (ptr, nbytes, device=None))]
    fn copy_of_device(
        py: Python<'_>,
        ptr: u64,
        nbytes: usize,
        device: Option<u32>,
    ) -> PyResult<Self> {
        let device = device.unwrap_or_else(thread_device);
        Self::copied_from(py, ptr, nbytes, device).map_err(error)
    }

    /// RAPIDS RMM's `DeviceBuffer.to_device`: a new buffer holding a copy of `data` (bytes or
    /// any object with the buffer protocol) on `device`, after the work queued on `stream`.
    #[staticmethod]
    #[pyo3(signature = (data, stream=None, device=None))]
    fn to_device(
        data: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
        device: Option<u32>,
    ) -> PyResult<Self> {
        let device = device.unwrap_or_else(thread_device);
        let stream = stream_of(stream)?;
        let bytes = host_bytes(data)?;
        let b = data
            .py()
            .detach(|| {
                with_device(device, || {
                    let d = Device::new(device)?;
                    settle(d, stream)?;
                    rmm_allocator::DeviceBuffer::from_host(&bytes, stream)
                })
            })
            .map_err(error)?
            .map_err(error)?;
        Ok(DeviceBuffer::owned(b, device))
    }

    /// A buffer over a `DeviceView` (spilled data back on the device), without a copy: the
    /// data stays on the device while the buffer lives.
    #[staticmethod]
    #[pyo3(signature = (view, device=None))]
    fn over_view(view: &crate::store::DeviceView, device: Option<u32>) -> Self {
        let device = device.unwrap_or_else(thread_device);
        DeviceBuffer {
            inner: Mutex::new(Some(Memory::View(view.clone()))),
            device,
        }
    }

    /// Pickles through host bytes (as RAPIDS RMM's `DeviceBuffer` does): unpickling makes a
    /// new buffer on the same device ordinal of the receiving process.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let py = slf.py();
        let this = slf.get();
        let bytes = this.to_bytes(py, None)?;
        let from_bytes = py.get_type::<DeviceBuffer>().getattr("from_bytes")?;
        Ok((from_bytes, (bytes, this.device)))
    }

    /// Bytes.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.peek(py, Memory::size)?)
    }

    /// Bytes (the same as `size`, as RMM's `DeviceBuffer.nbytes`).
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.size(py)
    }

    /// Bytes allocated: at least `size` (more after `reserve`, or a `resize` that shrank). A
    /// method, as in RAPIDS RMM (`buf.capacity()`).
    fn capacity(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.peek(py, Memory::capacity)?)
    }

    /// The device address of the first byte.
    #[getter]
    fn ptr(&self, py: Python<'_>) -> PyResult<u64> {
        crate::simulated::note_published(py, "DeviceBuffer.ptr")?;
        Ok(self.peek(py, |m| m.data().addr())?)
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.size(py)
    }

    /// A copy of the bytes (after the work queued on `stream`: None for the default stream,
    /// or an int stream handle).
    #[pyo3(signature = (stream=None))]
    fn to_bytes<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let stream = stream_of(stream)?;
        let bytes = self.work(py, |b, device| b.to_vec(device, stream))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// A copy of the bytes, as RMM's `DeviceBuffer.tobytes` (the same as `to_bytes`).
    #[pyo3(signature = (stream=None))]
    fn tobytes<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.to_bytes(py, stream)
    }

    /// Copies the bytes to host memory, after the work queued on `stream`: into `ary` (a
    /// writable, C-contiguous object with the buffer protocol of at least `size` bytes:
    /// bytearray, memoryview, a NumPy array), which is returned; with no `ary`, into a new
    /// `bytearray` (no NumPy needed).
    #[pyo3(signature = (ary=None, stream=None))]
    fn copy_to_host<'py>(
        &self,
        py: Python<'py>,
        ary: Option<Bound<'py, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let bytes = self.to_bytes(py, stream)?;
        let builtins = py.import("builtins")?;
        let Some(ary) = ary.filter(|a| !a.is_none()) else {
            return builtins.getattr("bytearray")?.call1((bytes,));
        };
        let view = builtins
            .getattr("memoryview")?
            .call1((&ary,))
            .map_err(|_| {
                error(format!(
                    "copy_to_host: ary must have the buffer protocol (bytearray, memoryview, a \
                     NumPy array); got {}",
                    ary.get_type()
                        .name()
                        .map_or_else(|_| "?".into(), |n| n.to_string())
                ))
            })?;
        if view.getattr("readonly")?.is_truthy()? {
            return Err(error(
                "copy_to_host: ary is read-only: pass a writable buffer (a bytearray, a \
                 writable NumPy array) or no ary",
            ));
        }
        let view = view.call_method1("cast", ("B",)).map_err(|_| {
            error("copy_to_host: ary is not C-contiguous: pass a contiguous buffer or no ary")
        })?;
        let room: usize = view.len()?;
        let n = bytes.as_bytes().len();
        if room < n {
            return Err(error(format!(
                "copy_to_host: ary holds {room} bytes but the DeviceBuffer has {n}: pass one \
                 of at least {n} bytes"
            )));
        }
        view.set_item(pyo3::types::PySlice::new(py, 0, n as isize, 1), bytes)?;
        Ok(ary)
    }

    /// Copies `data` (bytes or the buffer protocol; at most `size` bytes, as in RAPIDS RMM:
    /// they fill the first bytes) into the buffer, after the work queued on `stream`.
    #[pyo3(signature = (data, stream=None))]
    fn copy_from_host(
        &self,
        data: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = stream_of(stream)?;
        let py = data.py();
        let data = host_bytes(data)?;
        let device = Device::new(self.device).map_err(error)?;
        // The size is checked under the lock, with the copy: a resize cannot come between.
        let copied = self.work(py, |b, _| {
            if data.len() > b.size() {
                return Ok(Err(b.size()));
            }
            settle(device, stream)?;
            device.copy_to_device(b.data(), &data).map(Ok)
        })?;
        copied.map_err(|size| {
            error(format!(
                "copy_from_host: {} bytes into a DeviceBuffer of {size}: give at most its \
                 size (resize() it first to hold more)",
                data.len()
            ))
        })
    }

    /// Copies the bytes of `cai_obj` (any contiguous array with `__cuda_array_interface__`:
    /// CuPy, PyTorch, Numba, a DeviceBuffer; at most `size` bytes, filling the first ones, as
    /// in RAPIDS RMM) into the buffer, device to device, after the work queued on `stream` and
    /// on the array's own stream.
    #[pyo3(signature = (cai_obj, stream=None))]
    fn copy_from_device(
        &self,
        py: Python<'_>,
        cai_obj: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = stream_of(stream)?;
        let (src, nbytes, src_stream) = cuda_array(cai_obj)?;
        let device = Device::new(self.device).map_err(error)?;
        // The size is checked under the lock, with the copy: a resize cannot come between.
        let copied = self.work(py, |b, _| {
            if nbytes > b.size() {
                return Ok(Err(b.size()));
            }
            if let Some(s) = src_stream.filter(|s| *s != 0) {
                synchronize_stream(device, StreamView::from_raw(s))?;
            }
            settle(device, stream)?;
            if nbytes > 0 {
                device.copy_device_to_device(b.data(), DevicePtr(src), nbytes)?;
            }
            Ok(Ok(()))
        })?;
        copied.map_err(|size| {
            error(format!(
                "copy_from_device: {nbytes} bytes into a DeviceBuffer of {size}: give at most \
                 its size (resize() it first to hold more)"
            ))
        })
    }

    /// A new buffer with a copy of the bytes (device to device), on the same device.
    #[pyo3(signature = (stream=None))]
    fn copy(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let stream = stream_of(stream)?;
        let copy = self.work(py, |b, device| b.copied(device, b.size(), b.size(), stream))?;
        Ok(DeviceBuffer::owned(copy, self.device))
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<Self> {
        self.copy(py, None)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.copy(py, None)
    }

    /// Sets the size to `new_size` bytes keeping the first bytes (those past the old size are
    /// uninitialized). Within the capacity nothing moves; beyond it the data moves to a new
    /// allocation made on `stream` (so `ptr` changes).
    #[pyo3(signature = (new_size, stream=None))]
    fn resize(
        &self,
        py: Python<'_>,
        new_size: usize,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = stream_of(stream)?;
        self.change_memory(py, |memory, device| match memory {
            Memory::Owned(b) => with_device(device, || b.resize(new_size, stream))
                .and_then(|r| r)
                .map(|()| None),
            Memory::View(_) => memory.copied(device, new_size, new_size, stream).map(Some),
        })
    }

    /// Makes the capacity at least `new_capacity` bytes, keeping the size and contents (a
    /// larger capacity moves the data to a new allocation made on `stream`).
    #[pyo3(signature = (new_capacity, stream=None))]
    fn reserve(
        &self,
        py: Python<'_>,
        new_capacity: usize,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = stream_of(stream)?;
        self.change_memory(py, |memory, device| match memory {
            Memory::Owned(b) => with_device(device, || b.reserve(new_capacity, stream))
                .and_then(|r| r)
                .map(|()| None),
            Memory::View(v) if new_capacity > v.len() => {
                let size = v.len();
                memory.copied(device, size, new_capacity, stream).map(Some)
            }
            Memory::View(_) => Ok(None),
        })
    }

    /// RMM's `prefetch(device=None, stream=None)`: moves managed (unified) memory to the
    /// device ahead of use. A no-op here: rmm-rs does not prefetch (managed memory migrates
    /// on first touch instead), and on non-managed memory there is nothing to move.
    #[pyo3(signature = (device=None, stream=None))]
    fn prefetch(
        &self,
        py: Python<'_>,
        device: Option<u32>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let _ = (device, stream_of(stream)?);
        Ok(self.peek(py, |_| ())?)
    }

    /// Frees the device memory now (instead of when the object is collected), once calls
    /// under way on the buffer in other threads are done.
    fn free(&self, py: Python<'_>) {
        let memory = match self.inner.try_lock() {
            Some(mut inner) => inner.take(),
            None => py.detach(|| self.inner.lock().take()),
        };
        // Let go with the GIL, outside the lock.
        drop(memory);
    }

    /// CUDA Array Interface version 3: a one-dimensional array of bytes.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::simulated::note_published(py, "DeviceBuffer.__cuda_array_interface__")?;
        let (size, addr) = self.peek(py, |b| (b.size(), b.data().addr()))?;
        let d = PyDict::new(py);
        d.set_item("shape", (size,))?;
        d.set_item("strides", py.None())?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (addr, false))?;
        d.set_item("version", 3)?;
        // Work on the buffer was on the default stream and has completed (it is synchronous
        // from Python's side): no stream to synchronize with.
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.peek(py, |b| (b.size(), b.data().addr())) {
            Ok((size, addr)) => format!(
                "DeviceBuffer(size={size}, ptr={addr:#x}, device={})",
                self.device
            ),
            Err(Freed) => "DeviceBuffer(freed)".into(),
        }
    }
}
