//! Fault injection on the simulated device from Python, for tests that fail one operation
//! at a chosen moment in one process (a worker process inherits `RMM_SIM_FAIL_*` from the
//! environment instead): `_sim_inject(kind, n, device=0)` and `_sim_counts(device=0)`.
//! Private (`rmm_rs._rmm_rs`), and only on the simulated device: on a GPU both raise
//! `RmmError`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use rmm_allocator::backend::{self, SimBackend};

use crate::error;

/// The kinds `_sim_inject` knows, as named in its errors.
const KINDS: &str = "\"allocation\", \"allocations_above\", \"copy\", \"pin\", \"file_write\" \
                     or \"host_memory\"";

/// The process's backend when it is the simulated device (choosing it from `RMM_BACKEND` if
/// no runtime has yet), else an error that says what runs instead.
fn simulated() -> PyResult<&'static SimBackend> {
    let b = backend::global().map_err(error)?;
    b.as_sim().ok_or_else(|| {
        error(format!(
            "fault injection needs the simulated device (RMM_BACKEND=sim); this process runs \
             on {}",
            b.describe()
        ))
    })
}

/// Makes the `n`-th operation of `kind` from now on fail on the simulated device `device`:
/// "allocation" (a device allocation, out of memory), "copy" (a copy or memset), "pin" (a
/// pin of host memory, on any device) or "file_write" (a write to a spill file); n = 0 clears
/// that fault. "allocations_above": every device allocation larger than `n` bytes fails (0
/// clears it). "host_memory": the host looks as if the process may use only `n` bytes (0:
/// the real host's). Each `n`-th fires once.
#[pyfunction]
#[pyo3(signature = (kind, n, device=0))]
fn _sim_inject(kind: &str, n: u64, device: u32) -> PyResult<()> {
    let sim = simulated()?;
    match kind {
        "allocation" => sim.fail_nth_allocation(device, n),
        "allocations_above" => {
            let bytes = match n {
                0 => usize::MAX,
                n => usize::try_from(n).unwrap_or(usize::MAX),
            };
            sim.fail_allocations_above(device, bytes)
        }
        "copy" => sim.fail_nth_copy(device, n),
        "file_write" => sim.fail_nth_file_write(device, n),
        "pin" => {
            sim.fail_nth_pin(n);
            Ok(())
        }
        "host_memory" => {
            sim.limit_host_memory((n > 0).then_some(n));
            Ok(())
        }
        _ => {
            return Err(error(format!(
                "_sim_inject: unknown fault kind {kind:?}: expected {KINDS}"
            )));
        }
    }
    .map_err(error)
}

/// The operations fault injection counts on the simulated device `device` so far, as a dict:
/// "allocations", "copies", "pins" (every device's), "file_writes", "memory_queries". Take it
/// before and after a step to learn how many of each the step does. Also what is held now:
/// "live_allocations" (the device's) and "pinned_host_bytes" (every device's), to check that
/// a failed step left nothing behind.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn _sim_counts(py: Python<'_>, device: u32) -> PyResult<Bound<'_, PyDict>> {
    let sim = simulated()?;
    let c = sim.counts(device).map_err(error)?;
    let d = PyDict::new(py);
    d.set_item("allocations", c.allocations)?;
    d.set_item("copies", c.copies)?;
    d.set_item("pins", c.pins)?;
    d.set_item("file_writes", c.file_writes)?;
    d.set_item("memory_queries", c.memory_queries)?;
    d.set_item("live_allocations", sim.live_allocations(device))?;
    d.set_item("pinned_host_bytes", sim.pinned_host_bytes())?;
    Ok(d)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_sim_inject, m)?)?;
    m.add_function(wrap_pyfunction!(_sim_counts, m)?)?;
    Ok(())
}
