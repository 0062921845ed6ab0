//! A spilled value's bytes handed to a peer worker on the same host through device memory
//! both processes map (`rmm_allocator::ipc`), rather than through the connection: the sender
//! stages them in its export arena and sends descriptors of a few dozen bytes; the receiver
//! copies them where its store keeps them. What Dask's messages carry and when the slots go
//! back is `rmm_rs.dask.transfer`'s.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rmm_allocator::Device;
use rmm_allocator::backend::DevicePtr;
use rmm_allocator::ipc::{ExportSlot, Imports, IpcDescriptor, export_arena};
use rmm_allocator::spill::SpillableBuffer;

use crate::error;

/// Slots of this process's exportable device memory that hold the bytes of one send: given
/// back by `release()` (once the peer has copied them) or when the object goes.
#[pyclass(module = "rmm_rs", frozen)]
pub struct ExportLease {
    slots: Mutex<Vec<ExportSlot>>,
    nbytes: usize,
}

#[pymethods]
impl ExportLease {
    /// Gives the slots back now (idempotent).
    fn release(&self) {
        self.slots.lock().clear();
    }

    /// Bytes staged for the send.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    fn __repr__(&self) -> String {
        let held = !self.slots.lock().is_empty();
        format!(
            "<ExportLease: {} bytes, {}>",
            self.nbytes,
            if held { "held" } else { "released" }
        )
    }
}

/// What [`stage`] made: the slot and a descriptor per range.
pub(crate) type Staged = (ExportSlot, Vec<IpcDescriptor>);

/// `ranges` (`(allocation, offset, nbytes)`) of a value staged in `device`'s export arena by
/// `copy` (called with a range and where it goes); None when the arena has no room for them
/// now (the caller sends another way). Called without the interpreter.
pub(crate) fn stage(
    device: u32,
    ranges: &[(usize, usize, usize)],
    copy: impl Fn((usize, usize, usize), DevicePtr) -> rmm_allocator::Result<()>,
) -> rmm_allocator::Result<Option<Staged>> {
    let nbytes: usize = ranges.iter().map(|r| r.2).sum();
    let Some(slot) = export_arena(device)?.reserve(nbytes) else {
        return Ok(None);
    };
    let mut at = 0;
    let mut descriptors = Vec::with_capacity(ranges.len());
    for &range in ranges {
        if range.2 > 0 {
            copy(range, slot.ptr().offset(at))?;
        }
        descriptors.push(slot.descriptor(at, range.2)?);
        at += range.2;
    }
    Ok(Some((slot, descriptors)))
}

/// What [`stage`] made, for Python: one descriptor (bytes) per range, and the lease that
/// holds the slot.
pub(crate) fn for_python(
    py: Python<'_>,
    staged: Option<Staged>,
) -> Option<(Vec<Py<PyBytes>>, ExportLease)> {
    staged.map(|(slot, descriptors)| {
        let bytes = descriptors
            .iter()
            .map(|d| PyBytes::new(py, &d.to_bytes()).unbind())
            .collect();
        let nbytes = descriptors.iter().map(|d| d.len as usize).sum();
        let lease = ExportLease {
            slots: Mutex::new(vec![slot]),
            nbytes,
        };
        (bytes, lease)
    })
}

/// [`stage`] of a spilled value's `buffers`, read from the tier each is in.
pub(crate) fn export_spilled(
    py: Python<'_>,
    device: u32,
    buffers: &[Arc<SpillableBuffer>],
    ranges: &[(usize, usize, usize)],
) -> PyResult<Option<(Vec<Py<PyBytes>>, ExportLease)>> {
    let staged = py
        .detach(|| {
            stage(device, ranges, |(i, offset, n), dst| {
                buffers[i].copy_range_for_peer(offset, n, dst)
            })
        })
        .map_err(error)?;
    Ok(for_python(py, staged))
}

/// Reads descriptors as a peer sent them.
pub(crate) fn descriptors(parts: &[Vec<u8>]) -> PyResult<Vec<IpcDescriptor>> {
    parts
        .iter()
        .map(|p| IpcDescriptor::from_bytes(p).map_err(error))
        .collect()
}

/// The bytes that `descriptors` (from a peer's `AdoptedValue.export`) name, copied to host memory
/// through `device`: a received value's parts where no store keeps it.
#[pyfunction]
#[pyo3(signature = (descriptors, device=0))]
fn read_exported(
    py: Python<'_>,
    descriptors: Vec<Vec<u8>>,
    device: u32,
) -> PyResult<Vec<Py<PyBytes>>> {
    let descs = self::descriptors(&descriptors)?;
    let dev = Device::new(device).map_err(error)?;
    descs
        .iter()
        .map(|d| {
            let bytes = PyBytes::new_with(py, d.len as usize, |out| {
                py.detach(|| Imports::global().copy_to_host(dev, d, 0, out))
                    .map_err(error)
            })?;
            Ok(bytes.unbind())
        })
        .collect()
}

/// `data` staged in `device`'s exportable memory: its descriptor (bytes) and the lease that
/// holds it; None when that memory has no room now. What a worker sends a peer to check that
/// the peer can map its memory before it sends it values that way.
#[pyfunction]
#[pyo3(signature = (data, device=0))]
fn export_bytes(
    py: Python<'_>,
    data: Vec<u8>,
    device: u32,
) -> PyResult<Option<(Py<PyBytes>, ExportLease)>> {
    let dev = Device::new(device).map_err(error)?;
    let staged = py
        .detach(|| {
            stage(device, &[(0, 0, data.len())], |_, dst| {
                dev.copy_to_device(dst, &data)
            })
        })
        .map_err(error)?;
    Ok(for_python(py, staged).map(|(mut descriptors, lease)| (descriptors.remove(0), lease)))
}

/// Bytes of `device`'s exportable memory held for sends now (0 before any): what peers have
/// not finished copying.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn exported_bytes(py: Python<'_>, device: u32) -> PyResult<usize> {
    py.detach(|| rmm_allocator::ipc::exported_bytes(device))
        .map_err(error)
}

/// Unmaps the exported memory of peer processes that are gone (and that no copy reads now);
/// returns how many arenas were unmapped. A worker calls it after a peer leaves.
#[pyfunction]
fn forget_gone_peers(py: Python<'_>) -> usize {
    py.detach(|| Imports::global().forget_gone_peers())
}

/// Bytes of `device`'s exportable memory (device memory outside every pool and limit, made
/// at the first send to a peer of this host); 0 before that, or while the device has no room.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn export_arena_bytes(py: Python<'_>, device: u32) -> PyResult<usize> {
    py.detach(|| rmm_allocator::ipc::arena_bytes(device))
        .map_err(error)
}

/// What a peer checks before it sends this worker descriptors rather than bytes: the host
/// (its boot ID), the PID namespace, the backend, and the devices this process sees (their
/// UUIDs).
#[pyfunction]
fn ipc_identity(py: Python<'_>) -> PyResult<Py<PyDict>> {
    let backend = rmm_allocator::backend::global().map_err(error)?;
    let devices = (0..backend.device_count())
        .map(|d| backend.properties(d).map(|p| p.uuid))
        .collect::<rmm_allocator::Result<Vec<_>>>()
        .map_err(error)?;
    let host = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    // Processes of one host in different PID namespaces (containers) cannot reach each
    // other's memory files.
    let pids = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let d = PyDict::new(py);
    d.set_item("host", host)?;
    d.set_item("pid_namespace", pids)?;
    d.set_item("backend", backend.kind().name())?;
    d.set_item("devices", devices)?;
    Ok(d.unbind())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ExportLease>()?;
    m.add_function(wrap_pyfunction!(read_exported, m)?)?;
    m.add_function(wrap_pyfunction!(ipc_identity, m)?)?;
    m.add_function(wrap_pyfunction!(exported_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(export_arena_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(forget_gone_peers, m)?)?;
    m.add_function(wrap_pyfunction!(export_bytes, m)?)?;
    Ok(())
}
