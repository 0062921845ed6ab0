//! Configurations from Python: an rmm.toml path, a dict of settings, or dask-cuda's option
//! names (`rmm_pool_size`, …) mapped onto rmm.toml keys.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
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

/// A Python value as a TOML value: bool, int, float, str, a list or tuple of those, or None
/// (the string `"none"`, which every size key accepts).
fn to_toml(key: &str, value: &Bound<'_, PyAny>, path: &mut Path) -> PyResult<toml::Value> {
    if value.is_none() {
        return Ok(toml::Value::String("none".into()));
    }
    // bool before int: Python's bool is an int.
    if let Ok(b) = value.extract::<bool>() {
        return Ok(toml::Value::Boolean(b));
    }
    if let Ok(i) = value.extract::<i64>() {
        return Ok(toml::Value::Integer(i));
    }
    if let Ok(f) = value.extract::<f64>() {
        return Ok(toml::Value::Float(f));
    }
    if let Ok(s) = value.extract::<String>() {
        return Ok(toml::Value::String(s));
    }
    // os.PathLike (pathlib.Path) for directories.
    if let Ok(p) = value.extract::<PathBuf>() {
        return Ok(toml::Value::String(p.display().to_string()));
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

/// Flattens `dict` (nested dicts become dotted keys) into `out`.
fn flatten(
    prefix: &str,
    dict: &Bound<'_, PyDict>,
    path: &mut Path,
    out: &mut Vec<(String, toml::Value)>,
) -> PyResult<()> {
    path.enter(
        if prefix.is_empty() {
            "(the dict)"
        } else {
            prefix
        },
        dict.as_any(),
    )?;
    for (k, v) in dict.iter() {
        let k: String = k.extract().map_err(|_| {
            error(format!(
                "configuration keys are strings; got {}",
                k.repr().map_or_else(|_| "?".into(), |r| r.to_string())
            ))
        })?;
        let key = if prefix.is_empty() {
            k
        } else {
            format!("{prefix}.{k}")
        };
        match v.cast::<PyDict>() {
            Ok(inner) => flatten(&key, inner, path, out)?,
            Err(_) => out.push((key.clone(), to_toml(&key, &v, path)?)),
        }
    }
    path.leave();
    Ok(())
}

/// The settings of a dict, as dotted keys and TOML values.
pub(crate) fn settings_of(dict: &Bound<'_, PyDict>) -> PyResult<Vec<(String, toml::Value)>> {
    let mut out = Vec::new();
    flatten("", dict, &mut Path::default(), &mut out)?;
    Ok(out)
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

/// The resolved configuration, per device, as `rmm info` shows it (for checks and logs).
#[pyfunction]
#[pyo3(signature = (config=None))]
fn describe(config: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let config = load(config, None)?;
    let b = rmm_runtime::open_backend(config.backend).map_err(error)?;
    let facts = rmm_runtime::device_facts(b).map_err(error)?;
    let resolved = config.resolve(&facts).map_err(error)?;
    Ok(resolved
        .devices
        .iter()
        .map(|d| {
            format!(
                "device {}: {}",
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
