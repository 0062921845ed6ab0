//! `DeviceBuffer` (device bytes from the device's current stack, with
//! `__cuda_array_interface__` so CuPy, Numba and PyTorch wrap it without a copy) and
//! `SpillableBuffer` (bytes the device's spill manager may move to host memory or disk, and
//! that survive `reinitialize`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rmm_allocator::device::with_device;
use rmm_allocator::spill::Tier;
use rmm_allocator::stream::synchronize;
use rmm_allocator::{Device, DevicePtr, StreamView};

use crate::{error, with_runtime};

/// What `__reduce__` returns: a callable and its arguments (the bytes and the device).
type Reduced<'py> = (Bound<'py, PyAny>, (Bound<'py, PyBytes>, u32));

/// The bytes of `data`: `bytes` without a copy, anything else with the buffer protocol
/// (bytearray, memoryview, a contiguous NumPy array) copied once.
fn host_bytes<'a>(data: &'a Bound<'_, PyAny>) -> PyResult<std::borrow::Cow<'a, [u8]>> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(std::borrow::Cow::Borrowed(b.as_bytes()));
    }
    // The limited API (abi3 for 3.9) has no buffer protocol: memoryview(x).tobytes() copies.
    let copied = data
        .py()
        .import("builtins")?
        .getattr("memoryview")?
        .call1((data,))
        .and_then(|view| view.call_method0("tobytes"))
        .map_err(|_| {
            error(format!(
                "expected bytes or an object with the buffer protocol (bytearray, memoryview, \
                 a NumPy array of bytes); got {}",
                data.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
    let copied = copied.cast::<PyBytes>().map_err(|e| error(e.to_string()))?;
    Ok(std::borrow::Cow::Owned(copied.as_bytes().to_vec()))
}

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

    /// A copy of the bytes, after the default stream's work.
    fn to_vec(&self, device: u32) -> rmm_allocator::Result<Vec<u8>> {
        match self {
            Memory::Owned(b) => b.to_vec(StreamView::DEFAULT),
            Memory::View(v) => {
                let d = Device::new(device)?;
                synchronize(d, StreamView::DEFAULT)?;
                let mut out = vec![0u8; v.len()];
                d.copy_to_host(&mut out, DevicePtr(v.address()))?;
                Ok(out)
            }
        }
    }
}

/// Device bytes from the device's current resource (the rmm-rs stack once initialized).
/// Contents start uninitialized. Freed when the object is collected, on the default stream.
#[pyclass(module = "rmm_rs")]
pub struct DeviceBuffer {
    inner: Option<Memory>,
    device: u32,
}

impl DeviceBuffer {
    fn buffer(&self) -> PyResult<&Memory> {
        self.inner
            .as_ref()
            .ok_or_else(|| error("this DeviceBuffer was freed (free() was called)"))
    }

    fn owned(b: rmm_allocator::DeviceBuffer, device: u32) -> Self {
        DeviceBuffer {
            inner: Some(Memory::Owned(b)),
            device,
        }
    }
}

#[pymethods]
impl DeviceBuffer {
    /// `size` bytes on `device` (default 0: in a Dask worker, the one GPU it sees).
    #[new]
    #[pyo3(signature = (size, device=0))]
    fn new(py: Python<'_>, size: usize, device: u32) -> PyResult<Self> {
        let b = py
            .detach(|| {
                with_device(device, || {
                    rmm_allocator::DeviceBuffer::new(size, StreamView::DEFAULT)
                })
            })
            .map_err(error)?
            .map_err(error)?;
        Ok(DeviceBuffer::owned(b, device))
    }

    /// A buffer holding a copy of `data` (any object with the buffer protocol: bytes,
    /// bytearray, memoryview, a NumPy array).
    #[staticmethod]
    #[pyo3(signature = (data, device=0))]
    fn from_bytes(data: &Bound<'_, PyAny>, device: u32) -> PyResult<Self> {
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
    #[pyo3(signature = (ptr, nbytes, device=0))]
    fn copy_of_device(py: Python<'_>, ptr: u64, nbytes: usize, device: u32) -> PyResult<Self> {
        let b = py
            .detach(|| {
                with_device(device, || {
                    let b = rmm_allocator::DeviceBuffer::new(nbytes, StreamView::DEFAULT)?;
                    let d = Device::new(device)?;
                    synchronize(d, StreamView::DEFAULT)?;
                    if nbytes > 0 {
                        d.copy_device_to_device(b.data(), rmm_allocator::DevicePtr(ptr), nbytes)?;
                    }
                    Ok::<_, rmm_allocator::Error>(b)
                })
            })
            .map_err(error)?
            .map_err(error)?;
        Ok(DeviceBuffer::owned(b, device))
    }

    /// A buffer over a `DeviceView` (spilled data back on the device), without a copy: the
    /// data stays on the device while the buffer lives.
    #[staticmethod]
    #[pyo3(signature = (view, device=0))]
    fn over_view(view: &crate::store::DeviceView, device: u32) -> Self {
        DeviceBuffer {
            inner: Some(Memory::View(view.clone())),
            device,
        }
    }

    /// Pickles through host bytes (as RAPIDS RMM's `DeviceBuffer` does): unpickling makes a
    /// new buffer on the same device ordinal of the receiving process.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let py = slf.py();
        let this = slf.borrow();
        let bytes = this.to_bytes(py)?;
        let from_bytes = py.get_type::<DeviceBuffer>().getattr("from_bytes")?;
        Ok((from_bytes, (bytes, this.device)))
    }

    /// Bytes.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        Ok(self.buffer()?.size())
    }

    /// The device address of the first byte.
    #[getter]
    fn ptr(&self) -> PyResult<u64> {
        Ok(self.buffer()?.data().addr())
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    fn __len__(&self) -> PyResult<usize> {
        self.size()
    }

    /// A copy of the bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.buffer()?;
        let device = self.device;
        let bytes = py.detach(|| b.to_vec(device)).map_err(error)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Copies `data` (exactly `size` bytes; bytes or the buffer protocol) into the buffer.
    fn copy_from_host(&self, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = data.py();
        let data = host_bytes(data)?;
        let b = self.buffer()?;
        if data.len() != b.size() {
            return Err(error(format!(
                "copy_from_host: {} bytes into a DeviceBuffer of {}: give exactly its size",
                data.len(),
                b.size()
            )));
        }
        let device = Device::new(self.device).map_err(error)?;
        let ptr = b.data();
        py.detach(|| {
            synchronize(device, StreamView::DEFAULT)
                .and_then(|()| device.copy_to_device(ptr, &data))
        })
        .map_err(error)
    }

    /// Frees the device memory now (instead of when the object is collected).
    fn free(&mut self) {
        self.inner = None;
    }

    /// CUDA Array Interface version 3: a one-dimensional array of bytes.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = self.buffer()?;
        let d = PyDict::new(py);
        d.set_item("shape", (b.size(),))?;
        d.set_item("strides", py.None())?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (b.data().addr(), false))?;
        d.set_item("version", 3)?;
        // Work on the buffer was on the default stream and has completed (it is synchronous
        // from Python's side): no stream to synchronize with.
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            Some(b) => format!(
                "DeviceBuffer(size={}, ptr={:#x}, device={})",
                b.size(),
                b.data().addr(),
                self.device
            ),
            None => "DeviceBuffer(freed)".into(),
        }
    }
}

/// Bytes that the device's spill manager keeps under `spill.device_memory_limit` by moving
/// them to pinned host memory (or disk) when not in use; they come back on use and survive
/// `rmm_rs.reinitialize`. Needs `spill.enabled`.
#[pyclass(module = "rmm_rs")]
pub struct SpillableBuffer {
    inner: Arc<rmm_allocator::spill::SpillableBuffer>,
}

#[pymethods]
impl SpillableBuffer {
    /// A spillable copy of `data` (bytes or the buffer protocol) on `device`.
    #[new]
    #[pyo3(signature = (data, device=0))]
    fn new(data: &Bound<'_, PyAny>, device: u32) -> PyResult<Self> {
        let bytes = host_bytes(data)?;
        let m = spill_manager(device)?;
        // Making room may spill other buffers (to disk, even): without the GIL.
        let inner = data
            .py()
            .detach(|| with_device(device, || m.from_host(&bytes, StreamView::DEFAULT)))
            .map_err(error)?
            .map_err(error)?;
        Ok(SpillableBuffer { inner })
    }

    /// A spillable copy of `nbytes` device bytes at address `ptr` on `device` (memory of
    /// another library), copied on the device after the default stream's work.
    #[staticmethod]
    #[pyo3(signature = (ptr, nbytes, device=0))]
    fn copy_of_device(py: Python<'_>, ptr: u64, nbytes: usize, device: u32) -> PyResult<Self> {
        let m = spill_manager(device)?;
        let inner = py
            .detach(|| {
                with_device(device, || {
                    let b = m.buffer(nbytes, StreamView::DEFAULT)?;
                    {
                        let view = b.device_view(StreamView::DEFAULT)?;
                        let d = b.device();
                        synchronize(d, StreamView::DEFAULT)?;
                        if nbytes > 0 {
                            d.copy_device_to_device(
                                view.ptr(),
                                rmm_allocator::DevicePtr(ptr),
                                nbytes,
                            )?;
                        }
                    }
                    Ok::<_, rmm_allocator::Error>(b)
                })
            })
            .map_err(error)?
            .map_err(error)?;
        Ok(SpillableBuffer { inner })
    }

    /// The data on the device (brought back first if it was spilled) as a zero-copy
    /// `__cuda_array_interface__` object; the buffer is not spilled while it lives.
    fn device_view(&self, py: Python<'_>) -> PyResult<crate::store::DeviceView> {
        let guard = py
            .detach(|| self.inner.shared_device_view(StreamView::DEFAULT))
            .map_err(error)?;
        Ok(crate::store::DeviceView::new(
            Arc::new(guard),
            0,
            self.inner.size(),
        ))
    }

    /// Pickles through host bytes: unpickling makes a new spillable buffer on the same
    /// device ordinal of the receiving process (whose rmm_rs must spill).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Reduced<'py>> {
        let py = slf.py();
        let this = slf.borrow();
        let bytes = this.to_bytes(py)?;
        let device = this.inner.device().ordinal();
        Ok((py.get_type::<SpillableBuffer>().into_any(), (bytes, device)))
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> u32 {
        self.inner.device().ordinal()
    }

    /// Bytes.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// Where the data is now: "device", "host" or "disk".
    #[getter]
    fn tier(&self) -> &'static str {
        match self.inner.tier() {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
        }
    }

    /// A copy of the bytes, wherever they are (they do not move).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = py.detach(|| self.inner.to_vec()).map_err(error)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Moves the data off the device now; returns the device bytes freed (0 when already
    /// spilled).
    fn spill(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.inner.spill()).map_err(error)
    }

    /// Brings the data back to the device (into its current stack) now.
    fn unspill(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.device_view(StreamView::DEFAULT).map(drop))
            .map_err(error)
    }

    fn __len__(&self) -> usize {
        self.inner.size()
    }

    fn __repr__(&self) -> String {
        format!(
            "SpillableBuffer(size={}, tier={})",
            self.inner.size(),
            self.tier()
        )
    }
}

/// The spill manager of `device`, or an error saying how to turn spilling on.
pub(crate) fn spill_manager(device: u32) -> PyResult<Arc<rmm_runtime::SpillManager>> {
    with_runtime(|rt| {
        rt.spill_manager(device).ok_or_else(|| {
            error(format!(
                "device {device} does not spill: set spill.enabled = true (or \
                 {{\"spill\": {{\"enabled\": True}}}}) in the configuration"
            ))
        })
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceBuffer>()?;
    m.add_class::<SpillableBuffer>()?;
    Ok(())
}
