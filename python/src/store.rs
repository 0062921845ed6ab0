//! Python values adopted by a device's spill manager: what `rmm_rs.dask.DeviceStore` keeps
//! for each device value of a Dask worker (a CuPy array, a PyTorch tensor, …).
//!
//! `adopt(value, allocations)` hands the value to the spill manager as it is: its device
//! allocations count toward the limit (each once, however many values view it), in the
//! manager's least-recently-used order. The manager spills it when it must and nothing but
//! the store holds the value (its reference count says so): the allocations are copied to
//! pinned host memory (or disk), then the store's reference goes, which frees the memory in
//! the library that owns it. A spilled value's data comes back, on use, into the device's
//! current rmm-rs stack as [`DeviceView`]s: zero-copy `__cuda_array_interface__` objects that
//! hold their buffer on the device for as long as anything uses them.
//!
//! The policy (limit, order, tiers, statistics) is the runtime's; this file only says when a
//! Python value is in use and lets it go.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PySlice};
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::spill::{SharedDeviceGuard, SpillableBuffer, Tier};
use rmm_allocator::{Device, StreamView};
use rmm_runtime::{ForeignData, ForeignOwner, OwnerAccess, SpillManager};

use crate::error;

/// A Python value's reference, held by the spill manager while the value is on the device,
/// with what keeps the memory it was adopted at allocated (`keep`: see `adopt`).
struct PyOwner {
    value: Option<Py<PyAny>>,
    keep: Option<Py<PyAny>>,
}

impl ForeignOwner for PyOwner {
    fn is_in_use(&self) -> bool {
        // Anything besides this reference (a running task, a view of it) means in use. While
        // the interpreter shuts down nothing is spilled.
        Python::try_attach(|py| self.value.as_ref().is_some_and(|v| v.get_refcnt(py) > 1))
            .unwrap_or(true)
    }
}

impl Drop for PyOwner {
    fn drop(&mut self) {
        // The references go with the interpreter attached, so the memory is freed now (not
        // when some thread next attaches). During shutdown they are left to the interpreter.
        let mut refs = [self.value.take(), self.keep.take()];
        Python::try_attach(|_py| refs.iter_mut().for_each(|r| drop(r.take())));
        refs.into_iter().flatten().for_each(std::mem::forget);
    }
}

/// A device value adopted by the spill manager; see the module documentation. Made by
/// `adopt`.
#[pyclass(module = "rmm_rs", frozen, weakref)]
pub struct AdoptedValue {
    inner: Arc<ForeignData<PyOwner>>,
    device: u32,
}

/// Device memory of a spilled value, back on the device: `nbytes` bytes at an offset into one
/// of its buffers, as a one-dimensional byte array (`__cuda_array_interface__`). The buffer
/// stays on the device while this object lives.
#[pyclass(module = "rmm_rs", frozen)]
#[derive(Clone)]
pub struct DeviceView {
    guard: Arc<SharedDeviceGuard>,
    offset: usize,
    nbytes: usize,
}

#[pymethods]
impl AdoptedValue {
    /// The value itself while it is on the device in its own memory; None once it was
    /// spilled (rebuild it from `device_frames`). Marks it as used now.
    fn value(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.inner.touch();
        loop {
            match self
                .inner
                .owner(|o| o.value.as_ref().map(|v| v.clone_ref(py)))
            {
                OwnerAccess::Device(v) => return v,
                OwnerAccess::Spilled => return None,
                // Being spilled right now: wait without the GIL (the move needs it at its end).
                OwnerAccess::Busy => py.detach(|| self.inner.wait()),
            }
        }
    }

    /// Zero-copy device views of a spilled value's data: one per `(allocation, offset,
    /// nbytes)` asked for, `allocation` indexing the value's allocations as adopted (after
    /// duplicates were merged: see `allocations`). Brings the data back into the device's
    /// current stack first.
    ///
    /// With `to_send`, the value is rebuilt to be sent elsewhere: the bytes this brings back to
    /// the device are counted as brought back only to be sent (`unspilled_to_send_bytes` of
    /// `spill_statistics()`; sending from the tier, `spilled_bytes`, avoids them).
    #[pyo3(signature = (frames, to_send=false))]
    fn device_frames(
        &self,
        py: Python<'_>,
        frames: Vec<(usize, usize, usize)>,
        to_send: bool,
    ) -> PyResult<Vec<DeviceView>> {
        let guards = py
            .detach(|| {
                if to_send {
                    self.inner.device_views_to_send(StreamView::DEFAULT)
                } else {
                    self.inner.device_views(StreamView::DEFAULT)
                }
            })
            .map_err(error)?
            .ok_or_else(|| {
                error("device_frames: the value is still in its own memory: use value()")
            })?;
        let guards: Vec<Arc<SharedDeviceGuard>> = guards.into_iter().map(Arc::new).collect();
        frames
            .into_iter()
            .map(|(i, offset, nbytes)| {
                let guard = guards.get(i).ok_or_else(|| {
                    error(format!(
                        "device_frames: allocation {i} is out of range: the value has {} \
                         allocation(s) (0 to {}); ask only for frames within the value's \
                         allocations (its `allocations`)",
                        guards.len(),
                        guards.len().saturating_sub(1)
                    ))
                })?;
                if offset
                    .checked_add(nbytes)
                    .is_none_or(|end| end > guard.len())
                {
                    return Err(error(format!(
                        "device_frames: {nbytes} bytes at offset {offset} run past the end of \
                         allocation {i} ({} bytes); ask only for frames within the value's \
                         allocations (its `allocations`)",
                        guard.len()
                    )));
                }
                Ok(DeviceView {
                    guard: Arc::clone(guard),
                    offset,
                    nbytes,
                })
            })
            .collect()
    }

    /// Copies of a spilled value's data as bytes, wherever it is (it does not move): each of
    /// its allocations whole, or with `ranges`, each `(allocation, offset, nbytes)` asked for
    /// (the part of an allocation that a value's frames cover). None while the value is in its
    /// own memory.
    #[pyo3(signature = (ranges=None))]
    fn spilled_bytes<'py>(
        &self,
        py: Python<'py>,
        ranges: Option<Vec<(usize, usize, usize)>>,
    ) -> PyResult<Option<Vec<Bound<'py, PyBytes>>>> {
        let Some((buffers, ranges)) = self.spilled_ranges(py, ranges)? else {
            return Ok(None);
        };
        // Read straight into each bytes object: one copy, into memory touched once.
        ranges
            .iter()
            .map(|&(i, offset, nbytes)| {
                PyBytes::new_with(py, nbytes, |out| {
                    py.detach(|| buffers[i].read_range_into(offset, out))
                        .map_err(error)
                })
            })
            .collect::<PyResult<Vec<_>>>()
            .map(Some)
    }

    /// The value's data staged in this process's exportable device memory for a peer worker
    /// on the same host, which copies it from there (`receive_exported`), wherever the data
    /// is (the value's own memory: a copy on the device; spilled: read from its tier): one
    /// descriptor (bytes) per range (each allocation whole, or the `(allocation, offset,
    /// nbytes)` ranges asked for), and the `ExportLease` that holds the memory until the peer
    /// has copied. The value does not move. None when the exportable memory has no room now
    /// (send it another way then).
    #[pyo3(signature = (ranges=None))]
    fn export(
        &self,
        py: Python<'_>,
        ranges: Option<Vec<(usize, usize, usize)>>,
    ) -> PyResult<Option<(Vec<Py<PyBytes>>, crate::ipc::ExportLease)>> {
        if let Some((buffers, ranges)) = self.spilled_ranges(py, ranges.clone())? {
            return crate::ipc::export_spilled(py, self.device, &buffers, &ranges);
        }
        let device = Device::new(self.device).map_err(error)?;
        let ranges = checked_ranges(self.inner.allocations(), ranges)?;
        // In its own memory: staged while the value is held there (no spill of it starts).
        // The value's lock is taken without the interpreter (see `spilled_ranges`).
        // The copies go on the default stream, after the work that made the value (its
        // library's, on that stream), and only that stream is waited for: not the device's
        // other work (spills in flight, say), as a whole-device copy would.
        let staged = py.detach(|| {
            self.inner.with_own_memory(|own| {
                crate::ipc::stage(self.device, &ranges, |(i, offset, n), dst| {
                    device.copy_device_to_device_async(
                        dst,
                        own[i].0.offset(offset),
                        n,
                        StreamView::DEFAULT,
                    )
                })
                .and_then(|staged| {
                    rmm_allocator::synchronize_stream(device, StreamView::DEFAULT)?;
                    Ok(staged)
                })
            })
        });
        match staged {
            Some(result) => Ok(crate::ipc::for_python(py, result.map_err(error)?)),
            // Spilled meanwhile: from its tier.
            None => self.export(py, Some(ranges)),
        }
    }

    /// Device copies of a spilled value's data (new `DeviceBuffer`s from the device's current
    /// stack), wherever it is: it does not move. Each allocation whole, or with `ranges`, each
    /// `(allocation, offset, nbytes)` asked for. None while the value is in its own memory,
    /// and when the device has no room for the copies now: they are made where memory is
    /// free already, never by spilling the device's values for them (the copies are
    /// transient, as a message's buffers are, and the spill limit is for values). A value a
    /// peer asks for over a connection that carries device memory (UCX) is sent this way.
    #[pyo3(signature = (ranges=None))]
    fn device_copies(
        &self,
        py: Python<'_>,
        ranges: Option<Vec<(usize, usize, usize)>>,
    ) -> PyResult<Option<Vec<crate::buffers::DeviceBuffer>>> {
        let Some((buffers, ranges)) = self.spilled_ranges(py, ranges)? else {
            return Ok(None);
        };
        let device = self.device;
        let copies = py
            .detach(|| {
                rmm_allocator::with_device(device, || {
                    SpillManager::without_spilling(|| {
                        ranges
                            .iter()
                            .map(|&(i, offset, nbytes)| {
                                let copy =
                                    rmm_allocator::DeviceBuffer::new(nbytes, StreamView::DEFAULT)?;
                                if nbytes > 0 {
                                    buffers[i].copy_range_to_device(offset, nbytes, copy.data())?;
                                }
                                Ok(copy)
                            })
                            .collect::<rmm_allocator::Result<Vec<_>>>()
                    })
                })
            })
            .map_err(error)?;
        match copies {
            Ok(copies) => Ok(Some(
                copies
                    .into_iter()
                    .map(|b| crate::buffers::DeviceBuffer::owned(b, device))
                    .collect(),
            )),
            Err(rmm_allocator::Error::OutOfMemory { .. }) => Ok(None),
            Err(e) => Err(error(e)),
        }
    }

    /// Spills the value now if nothing else holds it; returns the device bytes freed (0 when
    /// it is in use, already spilled, or its allocations are also held by other values).
    fn spill(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.inner.spill()).map_err(error)
    }

    /// Marks the value as used now.
    fn touch(&self) {
        self.inner.touch();
    }

    /// When the value is next read (a position: smaller is sooner), or None when nothing is
    /// known to read it again: those spill first, then values read furthest ahead, then values
    /// never told (each group least recently used first).
    #[pyo3(signature = (next))]
    fn set_next_use(&self, next: Option<u64>) {
        self.inner.set_next_use(next);
    }

    /// Where the data is: "device", "host" or "disk" (once the spilling under way in the
    /// background is done).
    #[getter]
    fn tier(&self, py: Python<'_>) -> &'static str {
        // The spilling thread needs the interpreter to let values go: wait without it.
        py.detach(|| self.inner.settle());
        tier_name(self.inner.tier())
    }

    /// True once the value was spilled (it is rebuilt from `device_frames` from then on).
    #[getter]
    fn is_spilled(&self) -> bool {
        self.inner.is_spilled()
    }

    /// Device bytes of the value's distinct allocations.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// The value's distinct allocations, `(address, bytes)`, in the order `device_frames`
    /// indexes them.
    #[getter]
    fn allocations(&self) -> Vec<(u64, usize)> {
        self.inner
            .allocations()
            .iter()
            .map(|(p, n)| (p.addr(), *n))
            .collect()
    }

    /// Where each allocation's data is on the device now, `(address, bytes)`, or None when
    /// it is off the device (or moving); nothing is pinned.
    fn device_allocations(&self) -> Vec<Option<(u64, usize)>> {
        self.inner
            .device_allocations()
            .into_iter()
            .map(|a| a.map(|(p, n)| (p.addr(), n)))
            .collect()
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    fn __repr__(&self) -> String {
        format!(
            "AdoptedValue(size={}, tier={}, device={})",
            self.inner.size(),
            tier_name(self.inner.tier()),
            self.device
        )
    }
}

/// A spilled value's buffers, and the ranges of them asked for.
type SpilledRanges = (Vec<Arc<SpillableBuffer>>, Vec<(usize, usize, usize)>);

impl AdoptedValue {
    /// The buffers of a spilled value (None while it is in its own memory), and `ranges`
    /// checked against them (each buffer whole when None).
    fn spilled_ranges(
        &self,
        py: Python<'_>,
        ranges: Option<Vec<(usize, usize, usize)>>,
    ) -> PyResult<Option<SpilledRanges>> {
        // The value's lock is taken without the interpreter: a spill of it in the background
        // holds that lock and asks for the interpreter.
        let Some(buffers) = py.detach(|| self.inner.spilled_buffers()) else {
            return Ok(None);
        };
        let ranges = ranges.unwrap_or_else(|| {
            (0..buffers.len())
                .map(|i| (i, 0, buffers[i].size()))
                .collect()
        });
        for &(i, offset, nbytes) in &ranges {
            let Some(b) = buffers.get(i) else {
                return Err(error(format!(
                    "allocation {i} is out of range: the value has {} allocation(s); ask only \
                     for ranges within its allocations (its `allocations`)",
                    buffers.len()
                )));
            };
            if offset.checked_add(nbytes).is_none_or(|end| end > b.size()) {
                return Err(error(format!(
                    "{nbytes} bytes at offset {offset} run past the end of allocation {i} ({} \
                     bytes); ask only for ranges within the value's allocations",
                    b.size()
                )));
            }
        }
        Ok(Some((buffers, ranges)))
    }
}

/// `ranges` (each allocation whole when None) checked against `allocations`' sizes.
fn checked_ranges(
    allocations: &[(DevicePtr, usize)],
    ranges: Option<Vec<(usize, usize, usize)>>,
) -> PyResult<Vec<(usize, usize, usize)>> {
    let ranges = ranges.unwrap_or_else(|| {
        (0..allocations.len())
            .map(|i| (i, 0, allocations[i].1))
            .collect()
    });
    for &(i, offset, nbytes) in &ranges {
        let Some(&(_, size)) = allocations.get(i) else {
            return Err(error(format!(
                "allocation {i} is out of range: the value has {} allocation(s); ask only for \
                 ranges within its allocations (its `allocations`)",
                allocations.len()
            )));
        };
        if offset.checked_add(nbytes).is_none_or(|end| end > size) {
            return Err(error(format!(
                "{nbytes} bytes at offset {offset} run past the end of allocation {i} ({size} \
                 bytes); ask only for ranges within the value's allocations"
            )));
        }
    }
    Ok(ranges)
}

impl DeviceView {
    /// `nbytes` bytes at `offset` into the buffer `guard` holds on the device.
    pub(crate) fn new(guard: Arc<SharedDeviceGuard>, offset: usize, nbytes: usize) -> Self {
        DeviceView {
            guard,
            offset,
            nbytes,
        }
    }

    /// The device address of the first byte.
    pub(crate) fn address(&self) -> u64 {
        self.guard.ptr().addr() + self.offset as u64
    }

    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.nbytes
    }
}

#[pymethods]
impl DeviceView {
    /// Bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The device address of the first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        self.address()
    }

    /// The whole buffer this view is part of: `(address, bytes)` (the allocation that stays
    /// on the device while the view lives).
    #[getter]
    fn allocation(&self) -> (u64, usize) {
        (self.guard.ptr().addr(), self.guard.len())
    }

    fn __len__(&self) -> usize {
        self.nbytes
    }

    /// CUDA Array Interface version 3: a one-dimensional array of bytes (the data is ready:
    /// it came back on a copy stream that was waited for).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::simulated::note_published(py, "DeviceView.__cuda_array_interface__")?;
        let d = PyDict::new(py);
        d.set_item("shape", (self.nbytes,))?;
        d.set_item("strides", py.None())?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("version", 3)?;
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("DeviceView(nbytes={}, ptr={:#x})", self.nbytes, self.ptr())
    }
}

fn tier_name(t: Tier) -> &'static str {
    match t {
        Tier::Device => "device",
        Tier::Host => "host",
        Tier::Disk => "disk",
    }
}

/// Hands `value`, whose device memory is `allocations` (`(address, bytes)` of each
/// allocation it holds), to `device`'s spill manager; returns the `AdoptedValue` to keep in
/// its place. `keep`, held with the value and dropped with it, keeps those allocations
/// allocated should the value's own objects move elsewhere (a copy-on-write buffer written
/// through moves to a copy of its own). If the device now holds more than the limit, least
/// recently used data is spilled on the manager's background thread (this returns at once;
/// `tier`, the store's statistics and `spill_statistics` wait for it).
#[pyfunction]
#[pyo3(signature = (value, allocations, device=0, keep=None))]
fn adopt(
    value: Py<PyAny>,
    allocations: Vec<(u64, usize)>,
    device: u32,
    keep: Option<Py<PyAny>>,
) -> PyResult<AdoptedValue> {
    let m = crate::buffers::spill_manager(device)?;
    let allocations: Vec<(DevicePtr, usize)> = allocations
        .into_iter()
        .map(|(p, n)| (DevicePtr(p), n))
        .collect();
    let owner = PyOwner {
        value: Some(value),
        keep,
    };
    // A store's limit is a target: values read back go ahead and the spills they cause run
    // beside their copies, on the manager's thread.
    m.make_room_in_background(true);
    // Nothing here waits for a copy (the spilling runs on the manager's thread), so the
    // interpreter stays attached: letting it go would cost a wait to take it back from the
    // threads running tasks.
    let inner = m.adopt_in_background(&allocations, StreamView::DEFAULT, owner);
    Ok(AdoptedValue { inner, device })
}

/// Keeps a value that arrives from elsewhere (a peer worker sent it from its host tier) as an
/// `AdoptedValue` already off its owner: `parts` are the bytes of its allocations (bytes, or
/// anything with the buffer protocol: read in place), in the order its frames index them.
/// They are copied once, into pinned host memory; from there the value moves on to the
/// device when all of it fits under the limit now, else it stays in the host tier (or goes
/// on to disk) without touching the device. Either way `device_frames` rebuilds it.
#[pyfunction]
#[pyo3(signature = (parts, device=0))]
fn receive(py: Python<'_>, parts: Vec<Bound<'_, PyAny>>, device: u32) -> PyResult<AdoptedValue> {
    let m = crate::buffers::spill_manager(device)?;
    let memoryview = py.import("builtins")?.getattr("memoryview")?;
    let views = parts
        .iter()
        .map(|p| memoryview.call1((p,)))
        .collect::<PyResult<Vec<_>>>()?;
    let buffers = views
        .iter()
        .map(|v| {
            let b = PyBuffer::<u8>::get(v)?;
            if !b.is_c_contiguous() {
                return Err(error(format!(
                    "receive: a part of {} bytes is not contiguous: pass bytes, a bytearray \
                     or a contiguous memoryview",
                    b.len_bytes()
                )));
            }
            Ok(b)
        })
        .collect::<PyResult<Vec<_>>>()?;
    let sizes: Vec<usize> = buffers.iter().map(|b| b.len_bytes()).collect();
    let views: Vec<Py<PyAny>> = views.into_iter().map(Bound::unbind).collect();
    // Pinned memory is found (and pinned, as the host tier grows) without the interpreter;
    // each piece is then filled from the part's range (a memoryview of it: no copy) with the
    // interpreter held, a copy into resident memory.
    let mut failed = None;
    let mut fill = |i: usize, offset: usize, chunk: &mut [u8]| {
        Python::attach(|py| {
            let copied = if offset == 0 && chunk.len() == sizes[i] {
                buffers[i].copy_to_slice(py, chunk)
            } else {
                let range = PySlice::new(py, offset as isize, (offset + chunk.len()) as isize, 1);
                views[i]
                    .bind(py)
                    .get_item(range)
                    .and_then(|piece| PyBuffer::<u8>::get(&piece))
                    .and_then(|piece| piece.copy_to_slice(py, chunk))
            };
            copied.map_err(|e| {
                let message = e.to_string();
                failed = Some(e);
                rmm_allocator::Error::invalid_argument("part", i, message)
            })
        })
    };
    let inner = py
        .detach(|| m.receive(&sizes, StreamView::DEFAULT, &mut fill))
        .map_err(|e| failed.take().unwrap_or_else(|| error(e)))?;
    Ok(AdoptedValue { inner, device })
}

/// A value a peer on the same host sent as descriptors of its exportable device memory
/// (`AdoptedValue.export`), kept by `device`'s spill manager as `receive` keeps one
/// sent as bytes (on the device when it fits under the limit now, else in the host tier or
/// on disk, without touching the device), its parts copied straight from the peer's memory.
#[pyfunction]
#[pyo3(signature = (descriptors, device=0))]
fn receive_exported(
    py: Python<'_>,
    descriptors: Vec<Vec<u8>>,
    device: u32,
) -> PyResult<AdoptedValue> {
    let m = crate::buffers::spill_manager(device)?;
    let descs = crate::ipc::descriptors(&descriptors)?;
    let dev = Device::new(device).map_err(error)?;
    let inner = py
        .detach(|| {
            // The peers' mappings stay while `located` lives: through the copies.
            let located = descs
                .iter()
                .map(|d| rmm_allocator::ipc::Imports::global().locate(dev, d))
                .collect::<rmm_allocator::Result<Vec<_>>>()?;
            let parts: Vec<_> = located
                .iter()
                .zip(&descs)
                .map(|(l, d)| (l.ptr(), d.len as usize))
                .collect();
            m.receive_from_device(&parts, StreamView::DEFAULT)
        })
        .map_err(error)?;
    Ok(AdoptedValue { inner, device })
}

/// Sets `device`'s spill limit to `limit` (bytes, a size such as "8GB", or a fraction of the
/// device's memory such as 0.5 or "50%") and keeps it across reinitializations; spills at
/// once if the device holds more. Returns the limit in bytes. A limit larger than the device
/// is refused as in rmm.toml (`spill.device_memory_limit`), by the same rule. 0 (or any size
/// of zero bytes, such as "0GB") means no spilling, as dask-cuda's `device_memory_limit=0`:
/// the limit is the device's whole memory.
#[pyfunction]
#[pyo3(signature = (limit, device=0))]
fn set_device_memory_limit(py: Python<'_>, limit: &Bound<'_, PyAny>, device: u32) -> PyResult<u64> {
    let m = crate::buffers::spill_manager(device)?;
    let value = crate::settings::value_to_toml("device_memory_limit", limit)?;
    let total = Device::new(device)
        .and_then(|d| d.mem_info())
        .map_err(error)?
        .total as u64;
    let bytes = match rmm_config::Size::from_toml(&value) {
        Ok(size) => size
            .resolve_on_device(device, total, true, || rmm_config::Setting {
                key: "device_memory_limit".into(),
                value: size.to_string(),
                origin: rmm_config::Source::Code,
            })
            .map_err(error)?,
        // dask-cuda's "no spilling": nothing is spilled before the device is full.
        Err(rmm_config::ParseSizeError::Zero) => rmm_config::align_down(total),
        Err(e) => {
            return Err(error(format!(
                "device_memory_limit = {value}: {e}; give bytes, a size such as \"8GB\", a \
                 fraction of the device such as 0.8 or \"80%\", or 0 for no spilling"
            )));
        }
    };
    py.detach(|| m.fix_limit(bytes)).map_err(error)?;
    Ok(bytes)
}

/// Makes `directory` device `device`'s disk tier (created if missing) and keeps it across
/// reinitializations, as a Dask worker's device store does with its worker's directory.
#[pyfunction]
#[pyo3(signature = (directory, device=0))]
fn set_disk_directory(py: Python<'_>, directory: PathBuf, device: u32) -> PyResult<()> {
    let m = crate::buffers::spill_manager(device)?;
    py.detach(|| m.fix_disk_directory(&directory))
        .map_err(error)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<AdoptedValue>()?;
    m.add_class::<DeviceView>()?;
    m.add_function(wrap_pyfunction!(adopt, m)?)?;
    m.add_function(wrap_pyfunction!(receive, m)?)?;
    m.add_function(wrap_pyfunction!(receive_exported, m)?)?;
    m.add_function(wrap_pyfunction!(set_device_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(set_disk_directory, m)?)?;
    Ok(())
}
