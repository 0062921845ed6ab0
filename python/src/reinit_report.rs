//! The report of a `reinitialize` as a Python dict, made field by field.
//!
//! It is made inside the call being timed, right after the switch. A generic serializer
//! (pythonize) made a new string per key and hashed it, through several times the code; here
//! the keys are strings made (and hashed) once, when the module is imported, as a compiled
//! module's constants are, and the dict is filled directly. The keys and values are the
//! report's serde form, as `report()["last_reinitialize"]` shows it.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};
use rmm_runtime::ReinitReport;

/// The report's keys, in its serde order.
const NAMES: [&str; 16] = [
    "devices",
    "resolve",
    "drain",
    "spill",
    "spilled_bytes",
    "kept_in_place_bytes",
    "unspilled_bytes",
    "unspill",
    "check",
    "build",
    "install",
    "total",
    "released_bytes",
    "adopted_bytes",
    "respawned",
    "notes",
];

/// [`NAMES`] as Python strings, interned, made once per process.
static KEYS: PyOnceLock<[Py<PyString>; 16]> = PyOnceLock::new();

/// Makes the key strings; called when the module is imported, so that no report pays for it.
pub(crate) fn make_keys(py: Python<'_>) {
    keys(py);
}

fn keys(py: Python<'_>) -> &[Py<PyString>; 16] {
    KEYS.get_or_init(py, || NAMES.map(|n| PyString::intern(py, n).unbind()))
}

/// `report` as a dict keyed like its serde form: durations in seconds (float), byte counts
/// (int), `devices` and `notes` as lists.
pub(crate) fn to_dict(py: Python<'_>, report: &ReinitReport) -> PyResult<Py<PyAny>> {
    // Destructured without `..`: a field added to the report does not compile until it is
    // converted here too.
    let ReinitReport {
        devices,
        resolve,
        drain,
        spill,
        spilled_bytes,
        kept_in_place_bytes,
        unspilled_bytes,
        unspill,
        check,
        build,
        install,
        total,
        released_bytes,
        adopted_bytes,
        respawned,
        notes,
    } = report;
    let [
        k_devices,
        k_resolve,
        k_drain,
        k_spill,
        k_spilled,
        k_kept,
        k_unspilled,
        k_unspill,
        k_check,
        k_build,
        k_install,
        k_total,
        k_released,
        k_adopted,
        k_respawned,
        k_notes,
    ] = keys(py);
    let d = PyDict::new(py);
    d.set_item(k_devices.bind(py), PyList::new(py, devices)?)?;
    d.set_item(k_resolve.bind(py), resolve.as_secs_f64())?;
    d.set_item(k_drain.bind(py), drain.as_secs_f64())?;
    d.set_item(k_spill.bind(py), spill.as_secs_f64())?;
    d.set_item(k_spilled.bind(py), spilled_bytes)?;
    d.set_item(k_kept.bind(py), kept_in_place_bytes)?;
    d.set_item(k_unspilled.bind(py), unspilled_bytes)?;
    d.set_item(k_unspill.bind(py), unspill.as_secs_f64())?;
    d.set_item(k_check.bind(py), check.as_secs_f64())?;
    d.set_item(k_build.bind(py), build.as_secs_f64())?;
    d.set_item(k_install.bind(py), install.as_secs_f64())?;
    d.set_item(k_total.bind(py), total.as_secs_f64())?;
    d.set_item(k_released.bind(py), released_bytes)?;
    d.set_item(k_adopted.bind(py), adopted_bytes)?;
    d.set_item(k_respawned.bind(py), respawned)?;
    d.set_item(k_notes.bind(py), PyList::new(py, notes)?)?;
    Ok(d.into_any().unbind())
}
