//! `rmm_rs._rmm_rs`: the Python bindings of rmm-rs.
//!
//! Everything here calls the Rust crates; the Python package (`python/rmm_rs/`) only wraps it
//! for Dask, CuPy and PyTorch. One runtime per process (a Dask worker process drives one GPU):
//! `initialize` starts it from an rmm.toml path, a dict of settings or the defaults (./rmm.toml
//! and `RMM_*` variables), which makes each configured device's stack its current resource;
//! `reinitialize` switches every device to a new configuration keeping spillable data;
//! `finalize` gives everything back.

mod allocators;
mod buffers;
mod counters;
mod device;
mod ipc;
mod log;
mod settings;
mod sim_faults;
mod simulated;
mod store;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use rmm_runtime::Runtime;

// Module "rmm_rs", where the package re-exports it, so that it pickles (Dask sends errors
// from workers to the client).
pyo3::create_exception!(
    rmm_rs,
    RmmError,
    pyo3::exceptions::PyRuntimeError,
    "An rmm-rs operation failed; the message says what, with which value, and what to do."
);

/// The process's runtime, once initialized. The lock is only ever held for a moment (to clone
/// or swap the `Arc`), never across a call into the runtime: a thread that waits for it holds
/// the GIL, and a long call runs without the GIL.
static RUNTIME: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);

/// True while a thread starts a runtime (between its check that there is none and its
/// publishing of the new one). Set and cleared under [`RUNTIME`]'s lock, so that checking
/// and publishing are one step for every other thread: one runtime per process.
static STARTING: AtomicBool = AtomicBool::new(false);

/// Clears [`STARTING`] when the start it stands for ends, however it ends.
struct Starting;

impl Drop for Starting {
    fn drop(&mut self) {
        let _published = RUNTIME.lock();
        STARTING.store(false, Ordering::Release);
    }
}

/// Starts a runtime from `config` and publishes it, unless one runs or is being started by
/// another thread (then an error that says so, and nothing is started).
fn start(py: Python<'_>, config: &rmm_config::Config) -> PyResult<Arc<Runtime>> {
    let claim = {
        let rt = RUNTIME.lock();
        if rt.is_some() {
            return Err(error(
                "rmm_rs is already initialized: call rmm_rs.reinitialize(config) to change \
                 the configuration, or rmm_rs.finalize() first",
            ));
        }
        if STARTING.swap(true, Ordering::AcqRel) {
            return Err(error(
                "rmm_rs is being initialized by another thread right now (one runtime per \
                 process): wait for that call, then use rmm_rs.reinitialize(config) to change \
                 the configuration",
            ));
        }
        Starting
    };
    let rt = py.detach(|| Runtime::start(config)).map_err(error)?;
    // A warning made an error (`-W error`) fails the start: nothing is left running.
    if let Err(e) = simulated::backend_chosen(py) {
        py.detach(|| rt.shutdown()).map_err(error)?;
        return Err(e);
    }
    let rt = Arc::new(rt);
    *RUNTIME.lock() = Some(Arc::clone(&rt));
    drop(claim);
    Ok(rt)
}

/// The runtime, if any (a clone of the `Arc`; the lock is released at once).
fn current() -> Option<Arc<Runtime>> {
    RUNTIME.lock().clone()
}

/// `rmm_rs.OutOfMemoryError(RmmError, MemoryError)`, made once at import (`create_exception!`
/// takes a single base class).
static OUT_OF_MEMORY_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The `OutOfMemoryError` class: a subclass of both `RmmError` and `MemoryError`, in module
/// "rmm_rs" (where the package re-exports it) so that it pickles.
fn out_of_memory_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    OUT_OF_MEMORY_ERROR
        .get_or_try_init(py, || {
            let ns = PyDict::new(py);
            ns.set_item("__module__", "rmm_rs")?;
            ns.set_item(
                "__doc__",
                "An rmm-rs allocation failed for lack of device (or pinned host) memory, or \
                 over a configured limit; a MemoryError and an RmmError.",
            )?;
            let bases = (
                py.get_type::<RmmError>(),
                py.get_type::<pyo3::exceptions::PyMemoryError>(),
            );
            let ty = py
                .get_type::<PyType>()
                .call1(("OutOfMemoryError", bases, ns))?;
            Ok::<_, PyErr>(ty.cast_into::<PyType>()?.unbind())
        })
        .map(|t| t.bind(py))
}

/// True when `e` is an rmm-rs error saying an allocation found no memory
/// ([`rmm_allocator::Error::is_out_of_memory`]) or a driver call did
/// ([`rmm_allocator::Error::is_driver_out_of_memory`]: pinning host memory, say), directly or
/// inside a runtime error.
fn is_out_of_memory(e: &dyn Any) -> bool {
    let no_memory = |a: &rmm_allocator::Error| a.is_out_of_memory() || a.is_driver_out_of_memory();
    if let Some(a) = e.downcast_ref::<rmm_allocator::Error>() {
        return no_memory(a);
    }
    match e.downcast_ref::<rmm_runtime::Error>() {
        Some(
            rmm_runtime::Error::Allocator(a)
            | rmm_runtime::Error::DeviceSetup { source: a, .. }
            | rmm_runtime::Error::SpillTiers { source: a, .. }
            | rmm_runtime::Error::SpillBeforeSwitch { source: a, .. },
        ) => no_memory(a),
        _ => false,
    }
}

/// A Python exception carrying `e`'s message (the CLI prints the same text):
/// `rmm_rs.OutOfMemoryError` when `e` is an allocation that found no memory, `RmmError`
/// otherwise.
pub(crate) fn error<E: std::fmt::Display + 'static>(e: E) -> PyErr {
    let message = e.to_string();
    if is_out_of_memory(&e) {
        return Python::attach(|py| match out_of_memory_error(py) {
            Ok(ty) => PyErr::from_type(ty.clone(), message),
            Err(err) => err,
        });
    }
    RmmError::new_err(message)
}

/// Runs `f` with the runtime, or fails when there is none.
pub(crate) fn with_runtime<T>(f: impl FnOnce(&Runtime) -> PyResult<T>) -> PyResult<T> {
    match current() {
        Some(rt) => f(&rt),
        None => Err(error(
            "rmm_rs is not initialized: call rmm_rs.initialize(config) first",
        )),
    }
}

/// Parses JSON made by the runtime into Python objects (dicts, lists, numbers).
fn json_to_py(py: Python<'_>, text: &str) -> PyResult<Py<PyAny>> {
    static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let loads = LOADS.get_or_try_init(py, || {
        py.import("json")?.getattr("loads").map(Bound::unbind)
    })?;
    Ok(loads.bind(py).call1((text,))?.unbind())
}

/// Starts rmm-rs on the configured devices: `config` is a path to an rmm.toml, a dict of
/// settings (`{"pool": {"enabled": True}}` or `{"pool.enabled": True}`), or None for
/// ./rmm.toml (or `RMM_CONFIG`) and the `RMM_*` environment; `overrides`, a dict of settings
/// applied on top. Or RAPIDS RMM's keywords instead (`pool_allocator`, `managed_memory`,
/// `initial_pool_size`, `maximum_pool_size`, `devices`, `logging`, `log_file_name`), mapped
/// onto rmm.toml keys over the defaults; mixing both forms is an error. Fails if already
/// initialized.
#[pyfunction]
#[pyo3(signature = (config=None, overrides=None, **rmm_keywords))]
fn initialize(
    py: Python<'_>,
    config: Option<&Bound<'_, PyAny>>,
    overrides: Option<&Bound<'_, PyDict>>,
    rmm_keywords: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let config = settings::load_call(config, overrides, rmm_keywords)?;
    // Open statistics scopes move on to the new stacks.
    let _scopes = counters::park(py);
    start(py, &config).map(drop)
}

/// Switches every device to `config` (as for `initialize`, RAPIDS RMM's keywords included:
/// `reinitialize(pool_allocator=True, initial_pool_size=2**30)`; starts rmm-rs if it is not
/// running). With `overrides` alone (no `config`, no RMM keyword), the running configuration
/// with those settings changed: `reinitialize(overrides={"pool.enabled": False})` keeps the
/// devices, workers and spilling as they run. Spillable buffers are spilled first and keep
/// their bytes; live device buffers make it refuse, naming them. Returns the report of each
/// step as a dict.
#[pyfunction]
#[pyo3(signature = (config=None, overrides=None, **rmm_keywords))]
fn reinitialize(
    py: Python<'_>,
    config: Option<&Bound<'_, PyAny>>,
    overrides: Option<&Bound<'_, PyDict>>,
    rmm_keywords: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    // Open statistics scopes move on to the new stacks.
    let _scopes = counters::park(py);
    let running = current();
    if let (Some(rt), Some(changes)) = (
        &running,
        settings::running_overrides(config, overrides, rmm_keywords)?,
    ) {
        let report = py
            .detach(|| {
                rt.reconfigure(|loader| changes.into_iter().fold(loader, |l, (k, v)| l.set(k, v)))
            })
            .map_err(error)?;
        return to_py(py, &report);
    }
    let config = settings::load_call(config, overrides, rmm_keywords)?;
    match running {
        Some(rt) => {
            let report = py.detach(|| rt.reinitialize(&config)).map_err(error)?;
            to_py(py, &report)
        }
        None => {
            let rt = start(py, &config)?;
            to_py(py, &rt.report().start)
        }
    }
}

/// A report as Python objects (dicts, lists, numbers, strings), built directly rather than
/// through JSON text: the report comes back in the call's time.
fn to_py(py: Python<'_>, report: &impl serde::Serialize) -> PyResult<Py<PyAny>> {
    Ok(pythonize::pythonize(py, report)
        .map_err(|e| error(format!("converting the report to Python objects: {e}")))?
        .unbind())
}

/// Gives every pool back and puts each device back on plain `cuMemAlloc`, once the calls
/// other threads are making into rmm-rs returned (waiting up to 10 s). Live buffers are
/// reported as leaks (through logging); using them afterwards is an error.
#[pyfunction]
fn finalize(py: Python<'_>) -> PyResult<()> {
    // Open statistics scopes let go of the stacks (they count again under a later runtime).
    let _scopes = counters::park(py);
    let Some(mut rt) = RUNTIME.lock().take() else {
        return Ok(());
    };
    // Another thread's call holds it: wait for that call to return, so that the runtime
    // shuts down here and now (not on that thread, after this returns and perhaps after a
    // new runtime started).
    let deadline = std::time::Instant::now() + FINALIZE_WAIT;
    loop {
        match Arc::try_unwrap(rt) {
            Ok(rt) => return py.detach(|| rt.shutdown()).map(drop).map_err(error),
            Err(shared) if std::time::Instant::now() < deadline => {
                rt = shared;
                py.detach(|| std::thread::sleep(std::time::Duration::from_millis(1)));
            }
            Err(shared) => {
                tracing::warn!(
                    "finalize: another thread's call still uses rmm-rs after {:?}; the \
                     runtime shuts down when that call returns",
                    FINALIZE_WAIT
                );
                py.detach(move || drop(shared));
                return Ok(());
            }
        }
    }
}

/// How long `finalize` waits for other threads' calls into the runtime to return.
const FINALIZE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// True while rmm-rs is initialized in this process.
#[pyfunction]
fn is_initialized() -> bool {
    current().is_some()
}

/// The runtime's report: backend, workers, and per device its stack, live and reserved bytes
/// and statistics (the statistics adaptor's counters; no tracking adaptor needed).
#[pyfunction]
fn report(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let text = with_runtime(|rt| Ok(rt.report().to_json()))?;
    json_to_py(py, &text)
}

/// The running configuration, resolved against the devices (every size in bytes): backend,
/// workers per device, and per device its pool, limit, spilling and log file.
#[pyfunction]
fn resolved_config(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let text = with_runtime(|rt| serde_json::to_string(&rt.config()).map_err(error))?;
    json_to_py(py, &text)
}

/// A dict keyed by device number (int) of the JSON values in `per_device`.
fn by_device(py: Python<'_>, per_device: Vec<(u32, serde_json::Value)>) -> PyResult<Py<PyAny>> {
    let out = PyDict::new(py);
    for (d, v) in per_device {
        let text = serde_json::to_string(&v).map_err(error)?;
        out.set_item(d, json_to_py(py, &text)?)?;
    }
    Ok(out.into_any().unbind())
}

/// Per running device, the file its allocation log is written to, or None without one
/// (RAPIDS RMM's `get_log_filenames`).
#[pyfunction]
fn log_file_names(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let names = with_runtime(|rt| {
        Ok(rt
            .devices()
            .into_iter()
            .filter_map(|d| {
                let stack = rt.stack(d)?;
                Some((d, stack.plan().log_file.clone()))
            })
            .collect::<Vec<_>>())
    })?;
    let out = PyDict::new(py);
    for (d, file) in names {
        out.set_item(d, file.map(|f| f.display().to_string()))?;
    }
    Ok(out.into_any().unbind())
}

/// Per device: bytes in use and reserved, allocations, peaks and totals, and the pool's
/// figures (`pool`: reserved, in use, free, largest free block, fragmentation; `None` without
/// a pool), as dicts keyed by device number (an int: `device_statistics()[0]`).
#[pyfunction]
fn device_statistics(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let per_device = with_runtime(|rt| {
        let out: Vec<(u32, serde_json::Value)> = rt
            .devices()
            .into_iter()
            .filter_map(|d| {
                let stack = rt.stack(d)?;
                let s = stack.statistics();
                let bytes = s.lifetime_bytes();
                let count = s.lifetime_allocations();
                Some((
                    d,
                    serde_json::json!({
                        "device": d,
                        "bytes_in_use": bytes.value.max(0),
                        "peak_bytes_in_use": bytes.peak.max(0),
                        "total_bytes": bytes.total.max(0),
                        "allocations_in_use": count.value.max(0),
                        "peak_allocations": count.peak.max(0),
                        "total_allocations": count.total.max(0),
                        "reserved_bytes": stack.reserved_bytes(),
                        "pool": stack.pool_figures().map(|p| serde_json::json!({
                            "reserved_bytes": p.reserved_bytes,
                            "peak_reserved_bytes": p.peak_reserved_bytes,
                            "in_use_bytes": p.in_use_bytes,
                            "free_bytes": p.free_bytes,
                            "largest_free_block": p.largest_free_block,
                            "fragmentation": p.fragmentation,
                            "arenas": p.arenas,
                            "max_overhead": p.max_overhead,
                        })),
                        "out_of_memory_errors": s.out_of_memory_count(),
                        "stack": stack.describe(),
                    }),
                ))
            })
            .collect();
        Ok(out)
    })?;
    by_device(py, per_device)
}

/// Per device with spilling on: bytes and counts spilled and unspilled per tier, time,
/// bandwidth, host and disk bytes held, tracked device bytes; keyed by device number (an
/// int: `spill_statistics()[0]`). By default the spilling under way in the background ends
/// first; `wait=False` reads the figures as they are now (for a worker's heartbeat).
#[pyfunction]
#[pyo3(signature = (wait=true))]
fn spill_statistics(py: Python<'_>, wait: bool) -> PyResult<Py<PyAny>> {
    let per_device = with_runtime(|rt| {
        let out: Vec<(u32, serde_json::Value)> = rt
            .devices()
            .into_iter()
            .filter_map(|d| {
                let m = rt.spill_manager(d)?;
                // Spilling under way in the background ends first; it needs the interpreter
                // to let values go.
                if wait {
                    py.detach(|| m.settle());
                }
                let s = m.statistics();
                Some((d, serde_json::to_value(s).ok()?))
            })
            .collect();
        Ok(out)
    })?;
    by_device(py, per_device)
}

/// The devices rmm-rs runs on.
#[pyfunction]
fn devices() -> PyResult<Vec<u32>> {
    with_runtime(|rt| Ok(rt.devices()))
}

/// The Python module.
#[pymodule]
fn _rmm_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log::init_from_env();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("RmmError", m.py().get_type::<RmmError>())?;
    m.add("OutOfMemoryError", out_of_memory_error(m.py())?)?;
    m.add_function(wrap_pyfunction!(initialize, m)?)?;
    m.add_function(wrap_pyfunction!(reinitialize, m)?)?;
    m.add_function(wrap_pyfunction!(finalize, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(report, m)?)?;
    m.add_function(wrap_pyfunction!(device_statistics, m)?)?;
    m.add_function(wrap_pyfunction!(log_file_names, m)?)?;
    m.add_function(wrap_pyfunction!(spill_statistics, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(resolved_config, m)?)?;
    settings::register(m)?;
    buffers::register(m)?;
    counters::register(m)?;
    allocators::register(m)?;
    store::register(m)?;
    ipc::register(m)?;
    device::register(m)?;
    simulated::register(m)?;
    sim_faults::register(m)?;
    Ok(())
}
