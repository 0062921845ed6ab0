//! Saying so when a pointer rmm-rs publishes is not device memory: on the simulated device
//! (asked for with `RMM_BACKEND=sim`), "device" memory is host memory, and a CUDA kernel
//! handed one of its pointers fails. Every entry point that hands a pointer to another
//! library (`__cuda_array_interface__`, `ptr`, the allocator functions of CuPy, PyTorch and
//! librmm) calls [`note_published`]: the first one in the process raises
//! `rmm_rs.SimulatedDeviceWarning` (a `UserWarning`), naming what published the pointer.

use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;
use rmm_allocator::backend::{self, BackendKind};

pyo3::create_exception!(
    rmm_rs,
    SimulatedDeviceWarning,
    pyo3::exceptions::PyUserWarning,
    "rmm-rs runs on the simulated device (RMM_BACKEND=sim): the device pointers it publishes \
     are host memory, which no CUDA kernel can use."
);

/// 0: not known yet (no backend chosen); 1: nothing to say (a GPU, or said already);
/// 2: the simulated device, not said yet.
static STATE: AtomicU8 = AtomicU8::new(0);

/// What published a pointer before the backend was chosen (an allocator installed before
/// `initialize`): said once the backend turns out to be the simulated device.
static PENDING: Mutex<Option<&'static str>> = Mutex::new(None);

/// Warns, once per process, that `what` published a pointer of the simulated device (or will
/// hand out its pointers, for an allocator installed before the backend is chosen: said when
/// [`backend_chosen`] runs). Costs one atomic load once the backend is known and is a GPU, or
/// once said.
pub(crate) fn note_published(py: Python<'_>, what: &'static str) -> PyResult<()> {
    let mut state = STATE.load(Ordering::Relaxed);
    if state == 1 {
        return Ok(());
    }
    if state == 0 {
        state = match backend::installed() {
            None => {
                PENDING.lock().get_or_insert(what);
                return Ok(());
            }
            Some(b) if b.kind() == BackendKind::Sim => 2,
            Some(_) => 1,
        };
        STATE.store(state, Ordering::Relaxed);
    }
    if state == 2 && STATE.swap(1, Ordering::Relaxed) == 2 {
        let message = format!(
            "{what} published a pointer of the simulated device (RMM_BACKEND=sim): it is host \
             memory standing in for device memory, which no CUDA kernel can use. Unset \
             RMM_BACKEND (or set RMM_BACKEND=cuda) to run on the GPU"
        );
        let category = py.get_type::<SimulatedDeviceWarning>();
        let message = std::ffi::CString::new(message).unwrap_or_default();
        PyErr::warn(py, &category, &message, 1)?;
    }
    Ok(())
}

/// Says what [`note_published`] could not say yet, now that a runtime has chosen its backend.
pub(crate) fn backend_chosen(py: Python<'_>) -> PyResult<()> {
    let pending = PENDING.lock().take();
    match pending {
        Some(what) => note_published(py, what),
        None => Ok(()),
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add(
        "SimulatedDeviceWarning",
        m.py().get_type::<SimulatedDeviceWarning>(),
    )
}
