//! Configurations from Python: an rmm.toml path, a dict of settings, or dask-cuda's option
//! names (`rmm_pool_size`, …) mapped onto rmm.toml keys.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use rmm_config::{Config, ConfigLoader, MAX_NESTING};

use crate::error;

/// The dicts and lists on the way from the settings dict to the value being converted:
/// bounds the depth ([`MAX_NESTING`], as for TOML files) and finds cycles
/// (`l = []; l.append(l)`), so that no input can overflow the stack.
#[derive(Default)]
struct Path {
    /// The addresses of the containers being converted, outermost first.
    open: Vec<usize>,
}

impl Path {
    /// Enters container `value` at `key`; fails on a cycle or past the depth limit.
    fn enter(&mut self, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = value.as_ptr() as usize;
        if self.open.contains(&id) {
            return Err(error(format!(
                "setting {key}: the {} contains itself (a cycle); configuration values are \
                 plain nested dicts and lists: pass a copy without the self-reference",
                value.get_type().name()?
            )));
        }
        if self.open.len() > MAX_NESTING {
            return Err(error(format!(
                "setting {key}: dicts and lists nested deeper than {MAX_NESTING} levels (the \
                 limit); a configuration needs at most a few, e.g. \
                 {{\"device\": {{\"1\": {{\"pool\": {{\"initial_size\": \"2GiB\"}}}}}}}}"
            )));
        }
        self.open.push(id);
        Ok(())
    }

    /// Leaves the container entered last.
    fn leave(&mut self) {
        self.open.pop();
    }
}

/// One Python value (`key`'s) as a TOML value, as in a dict of settings.
pub(crate) fn value_to_toml(key: &str, value: &Bound<'_, PyAny>) -> PyResult<toml::Value> {
    to_toml(key, value, &mut Path::default())
}

/// A Python string as Rust text; one that is not valid Unicode (lone surrogates, as
/// `os.fsdecode` makes of undecodable bytes) is refused by name rather than changed.
fn text(key: &str, s: &Bound<'_, PyString>) -> PyResult<String> {
    s.to_cow()
        .map(|t| t.into_owned())
        .map_err(|_| not_utf8(key, s.as_any()))
}

fn not_utf8(key: &str, value: &Bound<'_, PyAny>) -> PyErr {
    error(format!(
        "setting {key}: {} is not valid UTF-8 (a path with undecodable bytes, say); rmm-rs \
         settings are UTF-8 text: rename the directory or give another",
        value
            .repr()
            .map_or_else(|_| "the value".into(), |r| r.to_string())
    ))
}

/// An integer beyond TOML's (64-bit signed) as its decimal text, which a size reads as exact
/// bytes (2**63 and up; beyond 16 EiB it is refused as too large, by name). Never through a
/// float, which a size reads as a fraction of the device.
fn wide_int(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let index = value.py().import("operator")?.getattr("index")?;
    Ok(index.call1((value,))?.str()?.to_string())
}

/// A Python value as a TOML value: bool, int, float, str, a list or tuple of those, a dict of
/// them (a table), or None (the string `"none"`, which every size key accepts).
fn to_toml(key: &str, value: &Bound<'_, PyAny>, path: &mut Path) -> PyResult<toml::Value> {
    if value.is_none() {
        return Ok(toml::Value::String("none".into()));
    }
    // The common types by their type alone (a failed `extract` builds a Python error); then
    // anything that converts (NumPy scalars, `__index__`, `__float__`). bool before int:
    // Python's bool is an int.
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(toml::Value::Boolean(b.is_true()));
    }
    if let Ok(s) = value.cast::<PyString>() {
        return text(key, s).map(toml::Value::String);
    }
    if value.is_instance_of::<PyInt>() {
        if let Ok(i) = value.extract::<i64>() {
            return Ok(toml::Value::Integer(i));
        }
        return Ok(toml::Value::String(wide_int(value)?));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(toml::Value::Float(f.value()));
    }
    if let Ok(b) = value.extract::<bool>() {
        return Ok(toml::Value::Boolean(b));
    }
    if let Ok(i) = value.extract::<i64>() {
        return Ok(toml::Value::Integer(i));
    }
    if value.extract::<u64>().is_ok() {
        return Ok(toml::Value::String(wide_int(value)?));
    }
    if let Ok(f) = value.extract::<f64>() {
        return Ok(toml::Value::Float(f));
    }
    // os.PathLike (pathlib.Path) for directories, through os.fspath as Python opens them.
    if let Ok(fspath) = value
        .py()
        .import("os")
        .and_then(|os| os.getattr("fspath"))
        .and_then(|fspath| fspath.call1((value,)))
    {
        if let Ok(s) = fspath.cast::<PyString>() {
            return text(key, s).map(toml::Value::String);
        }
        if let Ok(b) = fspath.cast::<PyBytes>() {
            return match std::str::from_utf8(b.as_bytes()) {
                Ok(s) => Ok(toml::Value::String(s.to_owned())),
                Err(_) => Err(not_utf8(key, value)),
            };
        }
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        path.enter(key, value)?;
        let mut table = toml::Table::new();
        for (k, v) in items(dict)? {
            let inner = to_toml(&format!("{key}.{k}"), &v, path)?;
            table.insert(k, inner);
        }
        path.leave();
        return Ok(toml::Value::Table(table));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        path.enter(key, value)?;
        let items: Vec<Bound<'_, PyAny>> = value.extract()?;
        let array = items
            .iter()
            .enumerate()
            .map(|(i, v)| to_toml(&format!("{key}[{i}]"), v, path))
            .collect::<PyResult<Vec<_>>>()
            .map(toml::Value::Array);
        path.leave();
        return array;
    }
    Err(error(format!(
        "setting {key}: a value of type {} cannot be a configuration value; use a bool, an \
         int, a float, a string (sizes such as \"2GiB\" or \"50%\"), a list, or None",
        value.get_type().name()?
    )))
}

/// The settings of a dict: its keys, each with its value as TOML (a nested dict as a table,
/// which the loader walks as it walks a file's tables: `{"pool": {"enabled": True}}` and
/// `{"pool.enabled": True}` are the same setting).
pub(crate) fn settings_of(dict: &Bound<'_, PyDict>) -> PyResult<Vec<(String, toml::Value)>> {
    let mut path = Path::default();
    path.enter("(the dict)", dict.as_any())?;
    let settings = items(dict)?
        .into_iter()
        .map(|(k, v)| {
            let value = to_toml(&k, &v, &mut path)?;
            Ok((k, value))
        })
        .collect::<PyResult<Vec<_>>>()?;
    path.leave();
    Ok(settings)
}

/// A dict's items with string keys, as a snapshot: converting a value may run Python code
/// (`__index__`, `__fspath__`) that changes the dict, which must not break (or panic) the
/// walk.
fn items<'py>(dict: &Bound<'py, PyDict>) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
    dict.iter()
        .collect::<Vec<_>>()
        .into_iter()
        .map(|(k, v)| {
            let k: String = k.extract().map_err(|_| {
                error(format!(
                    "configuration keys are strings; got {}",
                    k.repr().map_or_else(|_| "?".into(), |r| r.to_string())
                ))
            })?;
            Ok((k, v))
        })
        .collect()
}

/// The configuration `config` names, with `overrides` (a dict of settings) on top: None for
/// ./rmm.toml (or `RMM_CONFIG`) and the `RMM_*` environment; a path for that file and the
/// environment; a dict for exactly those settings over the defaults (no file, no
/// environment).
pub(crate) fn load(
    config: Option<&Bound<'_, PyAny>>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<Config> {
    let loader =
        match config {
            None => ConfigLoader::new(),
            Some(c) if c.is_none() => ConfigLoader::new(),
            Some(c) => match c.cast::<PyDict>() {
                Ok(dict) => settings_of(dict)?
                    .into_iter()
                    .fold(ConfigLoader::new().no_file().no_env(), |l, (k, v)| {
                        l.set(k, v)
                    }),
                Err(_) if c.is_instance_of::<pyo3::types::PyBool>() => {
                    return Err(error(format!(
                        "config must be a path to an rmm.toml, a dict of settings, or None; got \
                         {c}: RAPIDS RMM's reinitialize(pool_allocator, …) is taken by keyword \
                         here: reinitialize(pool_allocator={c}, …)"
                    )));
                }
                Err(_) => {
                    let path: PathBuf = c.extract().map_err(|_| {
                    error(format!(
                        "config must be a path to an rmm.toml, a dict of settings, or None; got {}",
                        c.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string())
                    ))
                })?;
                    ConfigLoader::new().file(path)
                }
            },
        };
    let loader = match overrides {
        Some(o) => settings_of(o)?
            .into_iter()
            .fold(loader, |l, (k, v)| l.set(k, v)),
        None => loader,
    };
    loader.load().map_err(error)
}

/// RAPIDS RMM's `rmm.reinitialize` keywords, in the order RMM documents them.
const RMM_KEYWORDS: &[&str] = &[
    "pool_allocator",
    "managed_memory",
    "initial_pool_size",
    "maximum_pool_size",
    "devices",
    "logging",
    "log_file_name",
];

/// RAPIDS RMM's `rmm.reinitialize(pool_allocator=…, …)` keywords as rmm.toml settings over
/// the defaults (no file, no environment, as for a dict):
///
/// | RMM keyword | rmm.toml |
/// |---|---|
/// | `pool_allocator` | `pool.enabled` |
/// | `managed_memory` | `pool.managed` |
/// | `initial_pool_size` | `pool.initial_size` (None: `"auto"`) |
/// | `maximum_pool_size` | `pool.maximum_size` (None: `"none"`) |
/// | `devices` | `devices` (an ordinal or a list of them) |
/// | `logging` | `logging.enabled` |
/// | `log_file_name` | `logging.directory` = its directory, `logging.file_name` = its name (device N writes `<name>.dev<N><ext>`, as RMM) |
///
/// Unknown keywords, and pool sizes without `pool_allocator=True` or a log file without
/// `logging=True` (which RMM would silently ignore), are errors naming the keyword.
pub(crate) fn rmm_keywords(kwargs: &Bound<'_, PyDict>) -> PyResult<Vec<(String, toml::Value)>> {
    let mut given: Vec<(String, Bound<'_, PyAny>)> = Vec::new();
    for (k, v) in kwargs.iter() {
        let k: String = k.extract()?;
        if !RMM_KEYWORDS.contains(&k.as_str()) {
            return Err(error(format!(
                "unknown keyword argument {k}={}: the keywords are RAPIDS RMM's ({}); pass \
                 other settings as a dict or an rmm.toml instead",
                v.repr().map_or_else(|_| "?".into(), |r| r.to_string()),
                RMM_KEYWORDS.join(", ")
            )));
        }
        given.push((k, v));
    }
    let get = |name: &str| given.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let flag = |name: &str| -> PyResult<bool> {
        match get(name) {
            None => Ok(false),
            Some(v) if v.is_none() => Ok(false),
            Some(v) => v.extract::<bool>().map_err(|_| {
                error(format!(
                    "{name}={}: expected True or False",
                    v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
                ))
            }),
        }
    };
    let pool = flag("pool_allocator")?;
    let logging = flag("logging")?;
    let mut out = vec![("pool.enabled".to_string(), toml::Value::Boolean(pool))];
    if flag("managed_memory")? {
        out.push(("pool.managed".into(), toml::Value::Boolean(true)));
    }
    for (name, key) in [
        ("initial_pool_size", "pool.initial_size"),
        ("maximum_pool_size", "pool.maximum_size"),
    ] {
        match get(name) {
            Some(v) if !v.is_none() => {
                if !pool {
                    return Err(error(format!(
                        "{name}={} needs pool_allocator=True (without a pool there is no \
                         pool size): add pool_allocator=True or drop {name}",
                        v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
                    )));
                }
                out.push((key.into(), value_to_toml(name, v)?));
            }
            _ => {}
        }
    }
    if let Some(v) = get("devices")
        && !v.is_none()
    {
        out.push(("devices".into(), value_to_toml("devices", v)?));
    }
    if logging {
        out.push(("logging.enabled".into(), toml::Value::Boolean(true)));
    }
    if let Some(v) = get("log_file_name")
        && !v.is_none()
    {
        let file: PathBuf = v.extract().map_err(|_| {
            error(format!(
                "log_file_name={}: expected a path (str or os.PathLike)",
                v.repr().map_or_else(|_| "?".into(), |r| r.to_string())
            ))
        })?;
        if !logging {
            return Err(error(format!(
                "log_file_name={} needs logging=True: add logging=True or drop log_file_name",
                file.display()
            )));
        }
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.display().to_string(),
            _ => ".".into(),
        };
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                error(format!(
                    "log_file_name={}: expected a file's path, with a file name (mylog.csv)",
                    file.display()
                ))
            })?;
        out.push(("logging.directory".into(), toml::Value::String(dir)));
        out.push(("logging.file_name".into(), toml::Value::String(name)));
    }
    Ok(out)
}

/// The configuration of an `initialize`/`reinitialize` call: `config` and `overrides`
/// (see [`load`]) or RAPIDS RMM's keywords ([`rmm_keywords`]); both forms at once is an
/// error.
pub(crate) fn load_call(
    config: Option<&Bound<'_, PyAny>>,
    overrides: Option<&Bound<'_, PyDict>>,
    rmm: Option<&Bound<'_, PyDict>>,
) -> PyResult<Config> {
    let Some(rmm) = rmm.filter(|k| !k.is_empty()) else {
        return load(config, overrides);
    };
    if config.is_some_and(|c| !c.is_none()) || overrides.is_some() {
        let names: Vec<String> = rmm.keys().iter().map(|k| k.to_string()).collect::<Vec<_>>();
        return Err(error(format!(
            "RAPIDS RMM keywords ({}) cannot be combined with config or overrides: pass either \
             an rmm.toml path or dict of settings, or only RMM's keywords",
            names.join(", ")
        )));
    }
    rmm_keywords(rmm)?
        .into_iter()
        .fold(ConfigLoader::new().no_file().no_env(), |l, (k, v)| {
            l.set(k, v)
        })
        .load()
        .map_err(error)
}

/// The changes of a `reinitialize(overrides=…)` call that names no configuration (`config`
/// None) and none of RAPIDS RMM's keywords: the overrides as settings, applied by the caller
/// on top of the running configuration. `None` for every other form of call (a config, RMM's
/// keywords, or no overrides at all), which [`load_call`] loads in full.
pub(crate) fn running_overrides(
    config: Option<&Bound<'_, PyAny>>,
    overrides: Option<&Bound<'_, PyDict>>,
    rmm: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<Vec<(String, toml::Value)>>> {
    let no_config = config.is_none_or(|c| c.is_none());
    let no_rmm = rmm.is_none_or(|k| k.is_empty());
    match overrides {
        Some(o) if no_config && no_rmm => settings_of(o).map(Some),
        _ => Ok(None),
    }
}

/// dask-cuda's `LocalCUDACluster` / `dask cuda worker` RMM options as rmm.toml settings (a
/// dict of dotted keys), so a dask-cuda user switches by changing one line:
///
/// | dask-cuda | rmm.toml |
/// |---|---|
/// | `rmm_pool_size` | `pool.enabled = true`, `pool.initial_size` (with `rmm_async`: the async pool's initial reservation) |
/// | `rmm_maximum_pool_size` | `pool.maximum_size` |
/// | `rmm_managed_memory` | `pool.managed` |
/// | `rmm_async` | `pool.async = true` (no pool on top, as dask-cuda) |
/// | `rmm_release_threshold` | `pool.release_threshold` |
/// | `rmm_log_directory` | `logging.enabled = true`, `logging.directory` |
/// | `rmm_track_allocations` | `tracking.enabled` |
///
/// Sizes may be bytes, strings such as `"24GB"`, or fractions of the device such as `0.9`,
/// as dask-cuda takes them. `rmm_allocator_external_lib_list` is not a setting: the plugin
/// installs those allocators.
#[pyfunction]
#[pyo3(signature = (
    rmm_pool_size=None,
    rmm_maximum_pool_size=None,
    rmm_managed_memory=false,
    rmm_async=false,
    rmm_release_threshold=None,
    rmm_log_directory=None,
    rmm_track_allocations=false,
))]
#[allow(clippy::too_many_arguments)]
fn config_from_dask_cuda<'py>(
    py: Python<'py>,
    rmm_pool_size: Option<Bound<'py, PyAny>>,
    rmm_maximum_pool_size: Option<Bound<'py, PyAny>>,
    rmm_managed_memory: bool,
    rmm_async: bool,
    rmm_release_threshold: Option<Bound<'py, PyAny>>,
    rmm_log_directory: Option<PathBuf>,
    rmm_track_allocations: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    if rmm_async && rmm_managed_memory {
        return Err(error(
            "rmm_async and rmm_managed_memory cannot be combined (as in dask-cuda): choose one",
        ));
    }
    let size = |v: &Bound<'py, PyAny>| -> PyResult<Bound<'py, PyAny>> {
        // dask-cuda takes fractions of the device as floats up to 1.
        match v.extract::<f64>() {
            Ok(f) if v.extract::<i64>().is_err() && f > 0.0 && f <= 1.0 => {
                Ok(format!("{}%", f * 100.0).into_pyobject(py)?.into_any())
            }
            _ => Ok(v.clone()),
        }
    };
    if let Some(p) = &rmm_pool_size {
        if !rmm_async {
            out.set_item("pool.enabled", true)?;
        }
        out.set_item("pool.initial_size", size(p)?)?;
    }
    if let Some(m) = &rmm_maximum_pool_size {
        out.set_item("pool.maximum_size", size(m)?)?;
    }
    if rmm_managed_memory {
        out.set_item("pool.managed", true)?;
    }
    if rmm_async {
        out.set_item("pool.async", true)?;
        out.set_item("pool.enabled", false)?;
    }
    if let Some(t) = &rmm_release_threshold {
        out.set_item("pool.release_threshold", size(t)?)?;
    }
    if let Some(dir) = rmm_log_directory {
        out.set_item("logging.enabled", true)?;
        out.set_item("logging.directory", dir.display().to_string())?;
    }
    if rmm_track_allocations {
        out.set_item("tracking.enabled", true)?;
    }
    Ok(out)
}

/// Per device, its stack top first with each layer's settings (as `rmm info` shows it): with
/// no argument, the stack running now when rmm_rs is initialized (else the one the default
/// configuration, ./rmm.toml and `RMM_*`, would build); with `config` (a path or a dict of
/// settings), the one that configuration would build.
#[pyfunction]
#[pyo3(signature = (config=None))]
fn describe(config: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let running = match config {
        Some(c) if !c.is_none() => None,
        _ => crate::current().map(|rt| (rt.config(), rt.backend())),
    };
    let (resolved, backend) = match running {
        Some(running) => running,
        None => {
            let config = load(config, None)?;
            let b = rmm_runtime::open_backend(config.backend).map_err(error)?;
            let facts = rmm_runtime::device_facts(b, &config).map_err(error)?;
            (config.resolve(&facts).map_err(error)?, b)
        }
    };
    // The resources keep their CUDA names on the simulated device: say what the device is.
    let device = if backend.kind() == rmm_allocator::backend::BackendKind::Sim {
        " (simulated device: host memory standing in for a GPU, RMM_BACKEND=sim)"
    } else {
        ""
    };
    Ok(resolved
        .devices
        .iter()
        .map(|d| {
            format!(
                "device {}{device}: {}",
                d.ordinal,
                rmm_runtime::StackPlan::new(&resolved, d)
                    .layers()
                    .join(" > ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Checks that `config` with `overrides` on top loads (every key known, every value valid),
/// as `initialize` would load it; raises `RmmError` with the same message otherwise.
#[pyfunction]
#[pyo3(signature = (config=None, overrides=None))]
fn validate_config(
    config: Option<&Bound<'_, PyAny>>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    load(config, overrides).map(drop)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(validate_config, m)?)?;
    m.add_function(wrap_pyfunction!(config_from_dask_cuda, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    Ok(())
}
