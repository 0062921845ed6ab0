//! [`SpillableBuffer`]: bytes the device's spill manager may move to host memory or disk, and
//! that survive `reinitialize`.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rmm_allocator::StreamView;
use rmm_allocator::spill::Tier;
use rmm_allocator::synchronize_stream;
use rmm_allocator::{thread_device, with_device};

use super::{Reduced, host_bytes};
use crate::{error, with_runtime};

/// Bytes that the device's spill manager keeps under `spill.device_memory_limit` by moving
/// them to pinned host memory (or disk) when not in use; they come back on use and survive
/// `rmm_rs.reinitialize`. Needs `spill.enabled`. Threads may share one: the spill manager
/// orders their calls.
#[pyclass(module = "rmm_rs", frozen)]
pub struct SpillableBuffer {
    inner: Arc<rmm_allocator::spill::SpillableBuffer>,
}

#[pymethods]
impl SpillableBuffer {
    /// A spillable copy of `data` (bytes or the buffer protocol) on `device`.
    #[new]
    #[pyo3(signature = (data, device=None))]
    fn new(data: &Bound<'_, PyAny>, device: Option<u32>) -> PyResult<Self> {
        let device = device.unwrap_or_else(thread_device);
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
    #[pyo3(signature = (ptr, nbytes, device=None))]
    fn copy_of_device(
        py: Python<'_>,
        ptr: u64,
        nbytes: usize,
        device: Option<u32>,
    ) -> PyResult<Self> {
        let device = device.unwrap_or_else(thread_device);
        let m = spill_manager(device)?;
        let inner = py
            .detach(|| {
                with_device(device, || {
                    let b = m.buffer(nbytes, StreamView::DEFAULT)?;
                    {
                        let view = b.device_view(StreamView::DEFAULT)?;
                        let d = b.device();
                        synchronize_stream(d, StreamView::DEFAULT)?;
                        if nbytes > 0 {
                            d.copy_device_to_device(
                                view.ptr(),
                                rmm_allocator::backend::DevicePtr(ptr),
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
        let this = slf.get();
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
