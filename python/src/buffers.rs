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
use rmm_allocator::{Device, StreamView};

use crate::{error, with_runtime};

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

/// Device bytes from the device's current resource (the rmm-rs stack once initialized).
/// Contents start uninitialized. Freed when the object is collected, on the default stream.
#[pyclass(module = "rmm_rs")]
pub struct DeviceBuffer {
    inner: Option<rmm_allocator::DeviceBuffer>,
    device: u32,
}

impl DeviceBuffer {
    fn buffer(&self) -> PyResult<&rmm_allocator::DeviceBuffer> {
        self.inner
            .as_ref()
            .ok_or_else(|| error("this DeviceBuffer was freed (free() was called)"))
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
        Ok(DeviceBuffer {
            inner: Some(b),
            device,
        })
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
        Ok(DeviceBuffer {
            inner: Some(b),
            device,
        })
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
        let bytes = py.detach(|| b.to_vec(StreamView::DEFAULT)).map_err(error)?;
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
        let m = with_runtime(|rt| {
            rt.spill_manager(device).ok_or_else(|| {
                error(format!(
                    "device {device} does not spill: set spill.enabled = true (or \
                     {{\"spill\": {{\"enabled\": True}}}}) in the configuration"
                ))
            })
        })?;
        // Making room may spill other buffers (to disk, even): without the GIL.
        let inner = data
            .py()
            .detach(|| with_device(device, || m.from_host(&bytes, StreamView::DEFAULT)))
            .map_err(error)?
            .map_err(error)?;
        Ok(SpillableBuffer { inner })
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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceBuffer>()?;
    m.add_class::<SpillableBuffer>()?;
    Ok(())
}
