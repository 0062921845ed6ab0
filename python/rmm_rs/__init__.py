"""rmm-rs from Python.

The memory runtime is Rust (the same code as the ``rmm`` command); this package wraps it:

* ``initialize(config)`` / ``reinitialize(config)`` / ``finalize()``: the device stacks of an
  rmm.toml path, a dict of settings, or the defaults (./rmm.toml and ``RMM_*`` variables).
  ``reinitialize`` keeps spillable data and refuses while device buffers are live.
* ``statistics()``, ``spill_statistics()``, ``report()``: counters per device.
* ``DeviceBuffer`` (with ``__cuda_array_interface__``) and ``SpillableBuffer``.
* ``rmm_rs.dask.RMMRsPlugin``: a Dask ``WorkerPlugin``.
* ``rmm_rs.allocators.cupy.install()`` / ``rmm_rs.allocators.torch.install()``.

Errors are raised as ``RmmError`` with the same messages as the CLI.
"""

from ._rmm_rs import (
    DeviceBuffer,
    RmmError,
    SpillableBuffer,
    config_from_dask_cuda,
    describe,
    devices,
    finalize,
    initialize,
    is_initialized,
    reinitialize,
    report,
    spill_statistics,
    statistics,
)

__all__ = [
    "DeviceBuffer",
    "RmmError",
    "SpillableBuffer",
    "config_from_dask_cuda",
    "describe",
    "devices",
    "finalize",
    "initialize",
    "is_initialized",
    "reinitialize",
    "report",
    "spill_statistics",
    "statistics",
]
