//! [`HostBytes`]: host bytes that rmm-rs filled, read by Python through the buffer protocol
//! without a copy (a spilled value's data on its way into a message).

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// Read-only bytes in host memory, filled by rmm-rs: `memoryview(b)`, `bytes(b)` and a
/// socket's send read them in place. Made from memory that was never touched before rmm-rs
/// filled it (no zeroing first, and the filling ran on several threads without the
/// interpreter), which a `bytes` object cannot be.
#[pyclass(frozen, module = "rmm_rs._rmm_rs")]
pub(crate) struct HostBytes {
    data: Vec<u8>,
}

impl HostBytes {
    /// Bytes `data` (filled already), for Python.
    pub(crate) fn new(data: Vec<u8>) -> HostBytes {
        HostBytes { data }
    }
}

#[pymethods]
impl HostBytes {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __repr__(&self) -> String {
        format!("HostBytes({} bytes)", self.data.len())
    }

    /// The buffer protocol, read-only.
    ///
    /// # Safety
    /// Called by the interpreter with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(
                "HostBytes are read-only: copy them (bytearray(b)) to change them",
            ));
        }
        let data = &slf.get().data;
        // SAFETY: `view` is the interpreter's to fill; the memory is `data`'s, which lives as
        // long as `slf` (the view holds a reference to it: PyBuffer_FillInfo takes one) and
        // never changes (a frozen class, nothing hands out `&mut` to it); read-only (1).
        let filled = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut c_void,
                data.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if filled == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}
