//! The buffers Python makes: [`DeviceBuffer`] (device bytes from the device's current stack,
//! with `__cuda_array_interface__` so CuPy, Numba and PyTorch wrap it without a copy) and
//! [`SpillableBuffer`] (bytes the device's spill manager may move to host memory or disk, and
//! that survive `reinitialize`), and what both take from Python: host bytes, streams, arrays.

mod device_buffer;
mod spillable_buffer;

pub(crate) use device_buffer::DeviceBuffer;
pub(crate) use spillable_buffer::{SpillableBuffer, spill_manager};

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rmm_allocator::synchronize_stream;
use rmm_allocator::{Device, StreamView};

use crate::error;

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

/// The stream of a `stream=` argument: None (the default stream) or an int handle (a
/// `cudaStream_t`, e.g. CuPy's `stream.ptr`).
fn stream_of(stream: Option<&Bound<'_, PyAny>>) -> PyResult<StreamView> {
    match stream {
        None => Ok(StreamView::DEFAULT),
        Some(s) if s.is_none() => Ok(StreamView::DEFAULT),
        Some(s) => s.extract::<u64>().map(StreamView::from_raw).map_err(|_| {
            error(format!(
                "stream={}: expected None or an int stream handle (a cudaStream_t such as \
                 CuPy's stream.ptr)",
                s.repr().map_or_else(|_| "?".into(), |r| r.to_string())
            ))
        }),
    }
}

/// Waits for the work queued so far on `stream` (when it is not the default stream) and on
/// the default stream of `device`: what a `stream=` argument orders the operation after.
fn settle(device: Device, stream: StreamView) -> rmm_allocator::Result<()> {
    if !stream.is_default() {
        synchronize_stream(device, stream)?;
    }
    synchronize_stream(device, StreamView::DEFAULT)
}

/// The error of a DeviceBuffer used after `free()`.
fn freed() -> PyErr {
    error("this DeviceBuffer was freed (free() was called): make a new DeviceBuffer")
}

/// A short description of `v` for error messages.
fn repr_of(v: &Bound<'_, PyAny>) -> String {
    v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
}

/// `(address, bytes, stream)` of the contiguous device array `obj` describes through
/// `__cuda_array_interface__` (its `stream` is None when it has none).
fn cuda_array(obj: &Bound<'_, PyAny>) -> PyResult<(u64, usize, Option<u64>)> {
    let cai = obj.getattr("__cuda_array_interface__").map_err(|_| {
        error(format!(
            "expected an object with __cuda_array_interface__ (a CuPy array, a PyTorch CUDA \
             tensor, a DeviceBuffer); got {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    let field = |name: &str| cai.get_item(name).ok().filter(|v| !v.is_none());
    let bad = |what: String| {
        error(format!(
            "__cuda_array_interface__ {}: {what}",
            repr_of(&cai)
        ))
    };
    // A field missing or of the wrong type: the exporter does not follow the interface.
    let malformed = |what: &str| {
        bad(format!(
            "{what}; the object does not follow the CUDA Array Interface (version 3): pass a \
             CuPy array, a PyTorch CUDA tensor or a DeviceBuffer"
        ))
    };
    let (ptr, _readonly): (u64, bool) = field("data")
        .ok_or_else(|| malformed("no data"))?
        .extract()
        .map_err(|_| malformed("data is not (address, read-only)"))?;
    let shape: Vec<usize> = field("shape")
        .ok_or_else(|| malformed("no shape"))?
        .extract()
        .map_err(|_| malformed("shape is not a tuple of ints"))?;
    let typestr: String = field("typestr")
        .ok_or_else(|| malformed("no typestr"))?
        .extract()
        .map_err(|_| malformed("typestr is not a string"))?;
    let itemsize: usize = typestr
        .get(2..)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| malformed(&format!("typestr {typestr:?} has no item size")))?;
    if field("mask").is_some() {
        return Err(bad(
            "masked arrays cannot be copied: pass the data alone".into()
        ));
    }
    if let Some(strides) = field("strides") {
        let strides: Vec<isize> = strides
            .extract()
            .map_err(|_| malformed("strides is not a tuple of ints"))?;
        let mut expected = itemsize as isize;
        for (dim, stride) in shape.iter().zip(&strides).rev() {
            if *dim > 1 && *stride != expected {
                return Err(bad(
                    "the array is not C-contiguous: copy it into a contiguous array first \
                     (e.g. cupy.ascontiguousarray)"
                        .into(),
                ));
            }
            expected *= *dim as isize;
        }
    }
    let nbytes = shape
        .iter()
        .try_fold(itemsize, |n, d| n.checked_mul(*d))
        .ok_or_else(|| malformed("the size overflows"))?;
    let stream = field("stream").and_then(|s| s.extract::<u64>().ok());
    Ok((ptr, nbytes, stream))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceBuffer>()?;
    m.add_class::<SpillableBuffer>()?;
    Ok(())
}
