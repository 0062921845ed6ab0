//! The Rust half of `rmm_rs.statistics` (RAPIDS RMM's `rmm.statistics`): a statistics adaptor
//! on a device's current resource, and its counter scopes.
//!
//! RMM's Python module works on `rmm.mr.get_current_device_resource()`: statistics are
//! "enabled" while that resource is a `StatisticsResourceAdaptor`. The same holds here. The
//! runtime's stacks always have one on top, so statistics are enabled on every device
//! `rmm_rs.initialize` set up; without a runtime, `statistics_enable` wraps the device's
//! resource in one (and remembers it, so that `statistics_disable` can take exactly that
//! adaptor off again, never the runtime's).
//!
//! Counters come back as six ints in the order of RMM's `Statistics` dataclass:
//! `(current_bytes, current_count, peak_bytes, peak_count, total_bytes, total_count)`.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use rmm_allocator::adaptor::{Counter, StatisticsResourceAdaptor, chain_names};
use rmm_allocator::current_device;
use rmm_allocator::per_device::{get_per_device_resource, set_per_device_resource};
use rmm_allocator::resource::SharedResource;

use crate::error;

/// RMM's `Statistics` as a tuple: current, peak and total of bytes and of allocations,
/// interleaved as the dataclass's fields are.
type Counts = (i64, i64, i64, i64, i64, i64);

/// The adaptors `statistics_enable` put on top, by device. Its lock is also held across
/// each enable's and disable's look at the device's resource and the change that follows,
/// so that two threads cannot both wrap the same resource.
static ENABLED: Mutex<Option<HashMap<u32, SharedResource>>> = Mutex::new(None);

/// `device`, or the calling thread's current device (0 unless set) when None.
fn device_or_current(device: Option<u32>) -> u32 {
    device.unwrap_or_else(current_device)
}

/// The address of a resource's allocation: the same for every `Arc` of one resource.
fn address(resource: &SharedResource) -> usize {
    Arc::as_ptr(resource).cast::<()>() as usize
}

/// The statistics adaptor that is `resource` itself, if it is one.
fn as_statistics(resource: &SharedResource) -> Option<&StatisticsResourceAdaptor> {
    resource
        .as_any()
        .downcast_ref::<StatisticsResourceAdaptor>()
}

/// The bytes and allocations counters as RMM's `Statistics` fields.
fn counts((bytes, allocations): (Counter, Counter)) -> Counts {
    (
        bytes.value,
        allocations.value,
        bytes.peak,
        allocations.peak,
        bytes.total,
        allocations.total,
    )
}

/// The device's current resource, with the device number in the error when there is none.
fn resource_of(device: u32) -> PyResult<SharedResource> {
    get_per_device_resource(device).map_err(|e| {
        error(format!(
            "the memory resource of device {device}: {e} (pass device=None for the calling \
             thread's current device, or the number of a device rmm-rs sees)"
        ))
    })
}

/// Makes a statistics adaptor the current resource of `device` (default: the calling thread's
/// current device) unless it already is one (RMM's `enable_statistics`); returns True when it
/// put one on.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_enable(device: Option<u32>) -> PyResult<bool> {
    let device = device_or_current(device);
    let mut enabled = ENABLED.lock();
    let current = resource_of(device)?;
    if as_statistics(&current).is_some() {
        return Ok(false);
    }
    let adaptor: SharedResource = Arc::new(StatisticsResourceAdaptor::new(current));
    set_per_device_resource(device, Arc::clone(&adaptor)).map_err(error)?;
    enabled
        .get_or_insert_with(HashMap::new)
        .insert(device, adaptor);
    Ok(true)
}

/// Takes off the statistics adaptor `statistics_enable` put on `device`, making its upstream
/// the current resource again; returns True when it did. False when that adaptor is no longer
/// the current resource (the runtime's stack replaced it, say) or none was put on: the
/// runtime's own statistics adaptor always stays.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_disable(device: Option<u32>) -> PyResult<bool> {
    let device = device_or_current(device);
    let mut enabled = ENABLED.lock();
    let Some(ours) = enabled.as_mut().and_then(|m| m.remove(&device)) else {
        return Ok(false);
    };
    let current = resource_of(device)?;
    if address(&current) != address(&ours) {
        return Ok(false);
    }
    let Some(adaptor) = as_statistics(&ours) else {
        return Ok(false);
    };
    set_per_device_resource(device, Arc::clone(adaptor.upstream())).map_err(error)?;
    Ok(true)
}

/// The counters of the innermost scope of `device`'s statistics adaptor (RMM's
/// `get_statistics`), or None when its current resource is not a statistics adaptor.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_counters(device: Option<u32>) -> PyResult<Option<Counts>> {
    let current = resource_of(device_or_current(device))?;
    Ok(as_statistics(&current).map(|s| counts((s.bytes_counter(), s.allocations_counter()))))
}

/// Starts a scope of zeroed counters on `device`'s statistics adaptor and returns the counters
/// of the scope that was innermost before (RMM's `push_statistics`); None when the device's
/// current resource is not a statistics adaptor.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_push(py: Python<'_>, device: Option<u32>) -> PyResult<Option<Counts>> {
    let current = resource_of(device_or_current(device))?;
    Ok(py.detach(|| as_statistics(&current).map(|s| counts(s.push_counters()))))
}

/// Ends the innermost scope of `device`'s statistics adaptor and returns its counters (RMM's
/// `pop_statistics`); None when the device's current resource is not a statistics adaptor.
/// Raises IndexError when no scope was pushed, as RMM does.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_pop(py: Python<'_>, device: Option<u32>) -> PyResult<Option<Counts>> {
    let device = device_or_current(device);
    let current = resource_of(device)?;
    let Some(adaptor) = as_statistics(&current) else {
        return Ok(None);
    };
    match py.detach(|| adaptor.pop_counters()) {
        Ok(popped) => Ok(Some(counts(popped))),
        Err(_) => Err(PyIndexError::new_err(format!(
            "pop_statistics(): no pushed counter scope to pop on device {device} ({}); the \
             outermost counters cannot be popped. Call push_statistics() before every \
             pop_statistics() (or use the statistics() context manager or the profiler, \
             which pair them)",
            chain_names(&*current)
        ))),
    }
}

/// The number of counter scopes on `device`'s statistics adaptor (pushed and not popped, plus
/// one for the outermost); None when its current resource is not a statistics adaptor.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_depth(device: Option<u32>) -> PyResult<Option<usize>> {
    let current = resource_of(device_or_current(device))?;
    Ok(as_statistics(&current).map(StatisticsResourceAdaptor::scope_depth))
}

/// The current resource of `device`: an identity (equal for the same resource, as long as it
/// lives) and its chain of names, top first (e.g. `StatisticsResourceAdaptor >
/// CudaMemoryResource`).
#[pyfunction]
#[pyo3(signature = (device=None))]
fn current_resource(device: Option<u32>) -> PyResult<(usize, String)> {
    let current = resource_of(device_or_current(device))?;
    Ok((address(&current), chain_names(&*current)))
}

/// Adds this file's functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(statistics_enable, m)?)?;
    m.add_function(wrap_pyfunction!(statistics_disable, m)?)?;
    m.add_function(wrap_pyfunction!(statistics_counters, m)?)?;
    m.add_function(wrap_pyfunction!(statistics_push, m)?)?;
    m.add_function(wrap_pyfunction!(statistics_pop, m)?)?;
    m.add_function(wrap_pyfunction!(statistics_depth, m)?)?;
    m.add_function(wrap_pyfunction!(current_resource, m)?)?;
    Ok(())
}
