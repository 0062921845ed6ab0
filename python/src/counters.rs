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
//!
//! A scope pushed here outlives the adaptor it was pushed on: `rmm_rs.reinitialize` (or
//! `finalize` and a later `initialize`) replaces the device's stack, and with it its
//! statistics adaptor. Each open scope is kept in [`OPEN`]; before the runtime switches
//! stacks the scopes are popped from their adaptor, keeping what they counted ([`park`]), and
//! after it they are pushed on the new one ([`follow`]): popping a scope then returns what it
//! counted on both. A scope counts nothing while its device has no statistics adaptor (after
//! `finalize`), and nothing of what the switch itself allocates and frees.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use rmm_allocator::adaptor::{Counter, StatisticsResourceAdaptor, chain_names, find_in_chain};
use rmm_allocator::per_device::{get_per_device_resource, set_per_device_resource};
use rmm_allocator::resource::SharedResource;
use rmm_allocator::thread_device;

use crate::error;

/// RMM's `Statistics` as a tuple: current, peak and total of bytes and of allocations,
/// interleaved as the dataclass's fields are.
type Counts = (i64, i64, i64, i64, i64, i64);

/// The adaptors `statistics_enable` put on top, by device. Its lock is also held across
/// each enable's and disable's look at the device's resource and the change that follows,
/// so that two threads cannot both wrap the same resource.
static ENABLED: Mutex<Option<HashMap<u32, SharedResource>>> = Mutex::new(None);

/// A counter scope pushed through `statistics_push` and not popped yet.
struct OpenScope {
    /// The statistics adaptor the scope is pushed on now; `None` while parked (see the module
    /// documentation).
    adaptor: Option<SharedResource>,
    /// What the scope counted on the adaptors it was pushed on before, if any.
    before: Option<(Counter, Counter)>,
}

/// The open scopes of each device, outermost first. Each push, pop and move of scopes holds
/// the lock for its whole change, so that a device's scopes and its adaptors' scope stacks
/// change together. It is only ever taken without the GIL, and no Python runs under it.
static OPEN: Mutex<BTreeMap<u32, Vec<OpenScope>>> = Mutex::new(BTreeMap::new());

/// The counters of a scope that counted `a` and then, from where `a` ended, `b`.
fn then(a: Counter, b: Counter) -> Counter {
    Counter {
        value: a.value + b.value,
        peak: a.peak.max(a.value + b.peak),
        total: a.total + b.total,
    }
}

/// `now` after what a scope counted `before`.
fn after(before: Option<(Counter, Counter)>, now: (Counter, Counter)) -> (Counter, Counter) {
    match before {
        Some((bytes, allocations)) => (then(bytes, now.0), then(allocations, now.1)),
        None => now,
    }
}

/// Pops `scope` from the adaptor it is pushed on, adding what it counted there to `before`.
fn lift(scope: &mut OpenScope) {
    let Some(adaptor) = scope.adaptor.take() else {
        return;
    };
    if let Some(counted) = as_statistics(&adaptor).and_then(|s| s.pop_counters().ok()) {
        scope.before = Some(after(scope.before, counted));
    }
}

/// Puts `scopes`, a device's open scopes, on `current`, the device's resource, when it is a
/// statistics adaptor: those from the first that is not on it are popped from where they are
/// (innermost first) and pushed on it (outermost first), keeping what they counted.
fn follow(scopes: &mut [OpenScope], current: &SharedResource) {
    let Some(now) = as_statistics(current) else {
        return;
    };
    let on_current = |s: &OpenScope| {
        s.adaptor
            .as_ref()
            .is_some_and(|a| address(a) == address(current))
    };
    let Some(first) = scopes.iter().position(|s| !on_current(s)) else {
        return;
    };
    for scope in scopes[first..].iter_mut().rev() {
        lift(scope);
    }
    for scope in &mut scopes[first..] {
        now.push_counters();
        scope.adaptor = Some(Arc::clone(current));
    }
}

/// Parks every open scope while the runtime switches stacks (see the module documentation);
/// they follow the devices' new resources when the returned guard is dropped. Taken by
/// `initialize`, `reinitialize` and `finalize` around their change.
pub(crate) fn park(py: Python<'_>) -> Parked {
    py.detach(|| {
        for scopes in OPEN.lock().values_mut() {
            scopes.iter_mut().rev().for_each(lift);
        }
    });
    Parked
}

/// Puts the parked scopes on their devices' resources when dropped (see [`park`]).
pub(crate) struct Parked;

impl Drop for Parked {
    fn drop(&mut self) {
        Python::attach(|py| {
            py.detach(|| {
                for (&device, scopes) in OPEN.lock().iter_mut() {
                    if let Ok(current) = get_per_device_resource(device) {
                        follow(scopes, &current);
                    }
                }
            });
        });
    }
}

/// `device`, or the calling thread's current device when None (as `DeviceBuffer` takes it).
fn device_or_current(device: Option<u32>) -> u32 {
    device.unwrap_or_else(thread_device)
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

/// Runs `f` with the interpreter let go on `device`'s open scopes (the calling thread's
/// device when None), once they follow its current resource (which `f` gets too).
///
/// # Errors
/// As [`resource_of`]: the device's resource cannot be read.
fn with_scopes<R: Send>(
    py: Python<'_>,
    device: Option<u32>,
    f: impl FnOnce(&mut Vec<OpenScope>, &SharedResource) -> R + Send,
) -> PyResult<R> {
    let device = device_or_current(device);
    let current = resource_of(device)?;
    Ok(py.detach(|| {
        let mut open = OPEN.lock();
        let scopes = open.entry(device).or_default();
        follow(scopes, &current);
        f(scopes, &current)
    }))
}

/// The counters of the innermost scope of `device`'s statistics adaptor (RMM's
/// `get_statistics`), or None when its current resource is not a statistics adaptor.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_counters(py: Python<'_>, device: Option<u32>) -> PyResult<Option<Counts>> {
    with_scopes(py, device, |scopes, current| {
        let s = as_statistics(current)?;
        let now = (s.bytes_counter(), s.allocations_counter());
        // The innermost scope is the last one pushed here, with what it counted before.
        Some(counts(after(scopes.last().and_then(|o| o.before), now)))
    })
}

/// Starts a scope of zeroed counters on `device`'s statistics adaptor and returns the counters
/// of the scope that was innermost before (RMM's `push_statistics`); None when the device's
/// current resource is not a statistics adaptor.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_push(py: Python<'_>, device: Option<u32>) -> PyResult<Option<Counts>> {
    with_scopes(py, device, |scopes, current| {
        let s = as_statistics(current)?;
        let prior = after(scopes.last().and_then(|o| o.before), s.push_counters());
        scopes.push(OpenScope {
            adaptor: Some(Arc::clone(current)),
            before: None,
        });
        Some(counts(prior))
    })
}

/// Ends the innermost scope of `device`'s statistics adaptor and returns its counters (RMM's
/// `pop_statistics`): everything it counted, on the stacks a reinitialize replaced too. None
/// when no scope is open and the device's current resource is not a statistics adaptor.
/// Raises IndexError when no scope was pushed, as RMM does.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_pop(py: Python<'_>, device: Option<u32>) -> PyResult<Option<Counts>> {
    let popped = with_scopes(py, device, |scopes, current| match scopes.pop() {
        Some(mut scope) => {
            lift(&mut scope);
            Ok(Some(scope.before.unwrap_or_default()))
        }
        None => match as_statistics(current) {
            Some(adaptor) => adaptor.pop_counters().map(Some),
            None => Ok(None),
        }
        .map_err(|_| chain_names(&**current)),
    })?;
    popped.map(|p| p.map(counts)).map_err(|chain| {
        PyIndexError::new_err(format!(
            "pop_statistics(): no pushed counter scope to pop on device {} ({chain}); the \
             outermost counters cannot be popped. Call push_statistics() before every \
             pop_statistics() (or use the statistics() context manager or the profiler, \
             which pair them)",
            device_or_current(device)
        ))
    })
}

/// The number of counter scopes on `device`'s statistics adaptor (pushed and not popped, plus
/// one for the outermost); None when its current resource is not a statistics adaptor.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn statistics_depth(py: Python<'_>, device: Option<u32>) -> PyResult<Option<usize>> {
    with_scopes(py, device, |_, current| {
        as_statistics(current).map(StatisticsResourceAdaptor::scope_depth)
    })
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

/// `device`'s figures under the key names of PyTorch's `torch.cuda.memory_stats()`
/// (`allocated_bytes.all.current` and `.peak`, `reserved_bytes.all.current` and `.peak`,
/// `allocation.all.*`, `num_alloc_retries`, `num_ooms`; reserved figures where its stack has a
/// pool), from the statistics adaptor of its current resource's chain; None without one.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn memory_stats(py: Python<'_>, device: Option<u32>) -> PyResult<Option<BTreeMap<String, i64>>> {
    let current = resource_of(device_or_current(device))?;
    Ok(py.detach(|| {
        find_in_chain::<StatisticsResourceAdaptor>(&*current).map(|s| s.report().memory_stats())
    }))
}

/// Makes every peak of `device`'s figures the current value (PyTorch's
/// `torch.cuda.reset_peak_memory_stats`): allocated bytes and allocations (the lifetime
/// peaks and the innermost counter scope's) and the pool's reserved bytes. False when the
/// device's current resource has no statistics adaptor in its chain.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn reset_peak_memory_stats(py: Python<'_>, device: Option<u32>) -> PyResult<bool> {
    let current = resource_of(device_or_current(device))?;
    Ok(py.detach(|| {
        find_in_chain::<StatisticsResourceAdaptor>(&*current)
            .map(|s| s.reset_peaks())
            .is_some()
    }))
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
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak_memory_stats, m)?)?;
    Ok(())
}
