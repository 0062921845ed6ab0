//! The calling thread's current device and a device's free memory: what RAPIDS RMM's Python
//! API reads where it takes no device (`rmm.mr.available_device_memory()`,
//! `rmm.DeviceBuffer(size)`).

use pyo3::prelude::*;
use rmm_allocator::{Device, thread_device};

use crate::error;

/// The calling thread's current device: its current CUDA context's (as `cudaSetDevice`,
/// CuPy's `Device.use()` or `torch.cuda.set_device` leave it), else 0.
#[pyfunction]
fn current_device() -> u32 {
    thread_device()
}

/// `(free, total)` bytes of `device` (the thread's current device when None), as the driver
/// reports them.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn available_device_memory(py: Python<'_>, device: Option<u32>) -> PyResult<(usize, usize)> {
    let device = device.unwrap_or_else(thread_device);
    let m = py
        .detach(|| Device::new(device).and_then(Device::mem_info))
        .map_err(error)?;
    Ok((m.free, m.total))
}

/// Adds this file's functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(current_device, m)?)?;
    m.add_function(wrap_pyfunction!(available_device_memory, m)?)?;
    Ok(())
}
