"""rmm-rs from Python.

The memory runtime is Rust (the same code as the ``rmm`` command); this package wraps it:

* ``initialize(config)`` / ``reinitialize(config)`` / ``finalize()``: the device stacks of an
  rmm.toml path, a dict of settings, or the defaults (./rmm.toml and ``RMM_*`` variables).
  ``reinitialize`` keeps spillable data and refuses while device buffers are live.
* ``statistics()``, ``spill_statistics()``, ``report()``: counters per device.
* ``DeviceBuffer`` (with ``__cuda_array_interface__``) and ``SpillableBuffer``.
* ``rmm_rs.dask.RMMRsPlugin`` (a Dask ``WorkerPlugin``) and ``rmm_rs.dask.DeviceStore`` (a
  worker's data on rmm-rs, spilling task results).
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

import sys as _sys

# In a Dask process, the serializers of rmm-rs's buffers are registered as soon as rmm_rs is
# imported (a worker imports it when it unpickles the type of a value it receives).
if "distributed.protocol" in _sys.modules:
    from .dask import serialize as _serialize  # noqa: F401

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
