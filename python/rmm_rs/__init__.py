"""rmm-rs from Python.

The memory runtime is Rust (the same code as the ``rmm`` command); this package wraps it:

* ``initialize(config)`` / ``reinitialize(config)`` / ``finalize()``: the device stacks of an
  rmm.toml path, a dict of settings, or the defaults (./rmm.toml and ``RMM_*`` variables);
  or RAPIDS RMM's keywords: ``reinitialize(pool_allocator=True, initial_pool_size=2**30)``.
  ``reinitialize`` keeps spillable data and refuses while device buffers are live;
  ``register_reinitialize_hook(func, *args)`` / ``unregister_reinitialize_hook(func)``: RMM's
  hooks that run before each reinitialize, last registered first; ``enable_logging(name)``,
  ``disable_logging()``, ``get_log_filenames()``: RMM's allocation-log functions.
* ``device_statistics()``, ``spill_statistics()``, ``report()``: counters per device, keyed
  by device number (``device_statistics()[0]``). ``describe()``: the running stack per device.
* ``rmm_rs.statistics`` is RAPIDS RMM's ``rmm.statistics`` module: ``enable_statistics()``,
  ``get_statistics()``, ``push_statistics()`` /
  ``pop_statistics()``, the ``statistics()`` context manager, and ``profiler`` (a decorator
  and context manager) with ``ProfilerRecords.report()``, over the statistics adaptor.
  ``validate_config(config)``: checks a configuration as ``initialize`` would load it.
* ``DeviceBuffer`` (with ``__cuda_array_interface__``) and ``SpillableBuffer``.
* ``rmm_rs.dask.RMMRsPlugin`` (a Dask ``WorkerPlugin``) and ``rmm_rs.dask.DeviceStore`` (a
  worker's data on rmm-rs, spilling task results).
* ``rmm_rs.allocators.cupy.install()`` / ``rmm_rs.allocators.torch.install()``.

Errors are raised as ``RmmError`` with the same messages as the CLI; an allocation that
finds no memory raises ``OutOfMemoryError``, which is also a ``MemoryError``.

rmm-rs runs on the GPU; without a driver or a visible GPU, ``initialize`` raises an
``RmmError`` that says so. The simulated device (host memory standing in for a GPU, for tests
and machines without one) is used only when asked for (``RMM_BACKEND=sim``); then
``describe()`` and ``report()`` say so, and the first pointer published to another library
raises a ``SimulatedDeviceWarning``.

``rmm_rs.allocators`` is imported with ``rmm_rs`` (its ``cupy`` and ``torch`` modules on first
use, and CuPy or PyTorch only when their functions run); ``rmm_rs.dask`` on first use (it
imports distributed).
"""

from ._rmm_rs import (
    DeviceBuffer,
    OutOfMemoryError,
    RmmError,
    SimulatedDeviceWarning,
    SpillableBuffer,
    config_from_dask_cuda,
    describe,
    device_statistics,
    devices,
    finalize,
    initialize,
    is_initialized,
    report,
    spill_statistics,
    validate_config,
)
from ._rmm_rs import __version__ as __version__

#: RAPIDS RMM's name for :class:`RmmError` (``rmm.RMMError``): the same class.
RMMError = RmmError

import importlib as _importlib
import sys as _sys
import types as _types

from . import allocators
from .logs import disable_logging, enable_logging, get_log_filenames
from .reinitialize_hooks import (
    register_reinitialize_hook,
    reinitialize,
    unregister_reinitialize_hook,
)
from . import mr, statistics

# In a Dask process, the serializers of rmm-rs's buffers are registered as soon as rmm_rs is
# imported (a worker imports it when it unpickles the type of a value it receives).
if "distributed.protocol" in _sys.modules:
    from .dask import serialize as _serialize  # noqa: F401



def __getattr__(name: str) -> _types.ModuleType:
    """``rmm_rs.dask`` on first use (it imports distributed and click)."""
    if name == "dask":
        return _importlib.import_module(".dask", __name__)
    raise AttributeError(f"module 'rmm_rs' has no attribute {name!r}")


__all__ = [
    "__version__",
    "DeviceBuffer",
    "OutOfMemoryError",
    "RmmError",
    "RMMError",
    "SimulatedDeviceWarning",
    "allocators",
    "mr",
    "SpillableBuffer",
    "config_from_dask_cuda",
    "describe",
    "device_statistics",
    "devices",
    "disable_logging",
    "enable_logging",
    "finalize",
    "get_log_filenames",
    "initialize",
    "is_initialized",
    "register_reinitialize_hook",
    "reinitialize",
    "report",
    "spill_statistics",
    "statistics",
    "unregister_reinitialize_hook",
    "validate_config",
]
