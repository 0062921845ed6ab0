"""``RMMRsPlugin``: rmm-rs on every Dask worker, as a ``distributed.WorkerPlugin``.

At worker set-up the plugin builds the rmm-rs stack for the worker's GPU (device 0 of the
process: the first of ``CUDA_VISIBLE_DEVICES``, as dask-cuda sets it) from an rmm.toml path, a
dict of settings, or the defaults, with dask-cuda's option names accepted on top, so a
``LocalCUDACluster(rmm_pool_size="24GB")`` user switches with one line::

    client.register_plugin(RMMRsPlugin(rmm_pool_size="24GB"))

It installs the allocators of ``rmm_allocator_external_lib_list`` ("cupy", "torch", "numba",
and "rmm": RAPIDS RMM's current device resource, so cuDF, cuML, XGBoost and
``rmm.DeviceBuffer`` allocate from rmm-rs; see :mod:`rmm_rs.allocators.rmm`), puts the
worker's data on rmm-rs with ``device_memory_limit`` (a :class:`DeviceStore`, when the
worker's store is empty), and reports into the worker's metrics: ``rmm-used`` and
``rmm-total`` (which Dask's dashboard shows), ``rmm_rs`` with every counter, and
``rmm-rs-spill`` with the device store's values and bytes per tier.

Replacing a plugin is safe: a new plugin's options are checked in the client, and on each
worker the new set-up is applied before the old one is let go; if it fails, the worker keeps
the old set-up (and the old plugin) and the error reaches the client. Unregistering the plugin
gives the memory back.

A worker whose set-up fails with no rmm-rs set-up to fall back on takes no tasks: it would
run them on plain allocations, without the configured pool or spilling. A worker that is
starting (a preload, ``Worker(plugins=...)``) fails its start; a running one (the plugin
registered by a client, or sent to a worker joining the cluster) stops taking tasks at once
and closes, with its nanny (which would only start it again into the same failure). The error
is in the worker's log and, for ``client.register_plugin``, raised in the client.
"""

import asyncio
import importlib.util
import logging
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from distributed import WorkerPlugin
from distributed.core import Status

import rmm_rs

from .. import _rmm_rs
from . import transfer
from .store import DeviceStore

if TYPE_CHECKING:
    from .._rmm_rs import _Config, _Size

logger = logging.getLogger("rmm_rs.dask")

_LIBRARIES = {"cupy": "CuPy", "torch": "PyTorch", "numba": "Numba-CUDA", "rmm": "RAPIDS RMM"}

# The plugin whose set-up is in force in this process, if any; and one torn down just now
# whose set-up is still in force until the event loop runs (a replacement may take over).
_owner = None
_retiring = None


def _metrics(worker: Any) -> Dict[str, int]:
    """The worker metric Dask's dashboard reads for RMM: bytes in use and reserved."""
    stats = rmm_rs.device_statistics() if rmm_rs.is_initialized() else {}
    return {
        "rmm-used": sum(s["bytes_in_use"] for s in stats.values()),
        "rmm-total": sum(s["reserved_bytes"] for s in stats.values()),
    }


def _all_metrics(worker: Any) -> Dict[int, Dict[str, Any]]:
    """Every counter, per device."""
    return rmm_rs.device_statistics() if rmm_rs.is_initialized() else {}


def _spill_metrics(worker: Any) -> Dict[str, Any]:
    """The device store's values and bytes per tier, and the device's spill figures."""
    data = worker.data
    if isinstance(data, DeviceStore) and rmm_rs.is_initialized():
        return data.statistics()
    return {}


def _libraries(libs: "Union[str, Sequence[str], None]") -> List[str]:
    if libs is None:
        return []
    if isinstance(libs, str):
        libs = [s.strip() for s in libs.split(",") if s.strip()]
    unknown = sorted(set(libs) - set(_LIBRARIES))
    if unknown:
        raise rmm_rs.RmmError(
            f"rmm_allocator_external_lib_list: unknown libraries {unknown}; "
            "rmm-rs provides allocators for 'cupy', 'torch', 'numba' and 'rmm'"
        )
    return list(dict.fromkeys(libs))


class RMMRsPlugin(WorkerPlugin):
    """Sets up rmm-rs on each Dask worker; see the module documentation.

    ``config``: a path to an rmm.toml, a dict of settings, or None (the worker's ./rmm.toml or
    ``RMM_CONFIG``, and its ``RMM_*`` environment). dask-cuda's ``rmm_*`` options, when given,
    are applied on top (``rmm_rs.config_from_dask_cuda`` maps them). ``device_memory_limit``
    (bytes, a size or a fraction of the device, at most the device's memory; 0 for no
    spilling, as in dask-cuda) turns spilling on and puts the worker's data in a
    :class:`DeviceStore` under that limit.
    """

    name = "rmm-rs"

    def __init__(
        self,
        config: "_Config" = None,
        *,
        rmm_pool_size: "Optional[_Size]" = None,
        rmm_maximum_pool_size: "Optional[_Size]" = None,
        rmm_managed_memory: bool = False,
        rmm_async: bool = False,
        rmm_release_threshold: "Optional[_Size]" = None,
        rmm_log_directory: "Union[str, os.PathLike[str], None]" = None,
        rmm_track_allocations: bool = False,
        rmm_allocator_external_lib_list: "Union[str, Sequence[str], None]" = None,
        device_memory_limit: "Optional[_Size]" = None,
    ) -> None:
        self.config = config
        # Mapped and checked now, so a bad option fails in the client, not on every worker.
        self.overrides = _rmm_rs.config_from_dask_cuda(
            rmm_pool_size=rmm_pool_size,
            rmm_maximum_pool_size=rmm_maximum_pool_size,
            rmm_managed_memory=rmm_managed_memory,
            rmm_async=rmm_async,
            rmm_release_threshold=rmm_release_threshold,
            rmm_log_directory=rmm_log_directory,
            rmm_track_allocations=rmm_track_allocations,
        )
        self.external_libs = _libraries(rmm_allocator_external_lib_list)
        self.device_memory_limit = device_memory_limit
        if device_memory_limit is not None:
            self.overrides["spill.enabled"] = True
        # A dict configuration is complete here: check it as the workers will read it. (A
        # path or the environment is the workers' own.)
        if config is None or isinstance(config, dict):
            _rmm_rs.validate_config(config if isinstance(config, dict) else {}, self.overrides)

    def settings(self, worker: Any = None) -> Dict[str, Any]:
        """The overrides applied over ``config`` on each worker: the dask-cuda options, the
        worker's one device, one rmm-rs worker thread (Dask runs the tasks), and what the
        worker's device store needs."""
        s = {**self.overrides, "devices": [0], "workers_per_device": 1}
        data = getattr(worker, "data", None)
        if isinstance(data, DeviceStore):
            s.update(data.settings())
        return s

    def setup(self, worker: Any) -> None:
        global _owner, _retiring
        previous = _owner if _owner is not None else _retiring
        changed = False
        try:
            # Nothing changes unless everything needed is there.
            for lib in self.external_libs:
                if importlib.util.find_spec(lib) is None:
                    raise rmm_rs.RmmError(
                        f"rmm_allocator_external_lib_list names {lib!r}, which this worker "
                        f"cannot import: install {_LIBRARIES[lib]} on the workers, or leave "
                        f"{lib!r} out (the worker keeps its set-up)"
                    )
            changed = True
            if rmm_rs.is_initialized():
                rmm_rs.reinitialize(self.config, self.settings(worker))
            else:
                rmm_rs.initialize(self.config, self.settings(worker))
            self._install_allocators()
            self._install_store(worker)
        except Exception as e:
            if not self._roll_back(worker, previous, changed):
                _take_no_tasks(worker, e)
            raise
        _owner, _retiring = self, None
        worker.metrics["rmm"] = _metrics
        worker.metrics["rmm_rs"] = _all_metrics
        worker.metrics["rmm-rs-spill"] = _spill_metrics

    def _install_allocators(self) -> None:
        for lib in self.external_libs:
            if lib == "cupy":
                from ..allocators import cupy

                cupy.install()
            elif lib == "torch":
                from ..allocators import torch

                torch.install()
            elif lib == "numba":
                from ..allocators import numba

                numba.install()
            elif lib == "rmm":
                from ..allocators import rmm

                # The worker's one device (0 of the process). The resource looks up rmm-rs's
                # current resource per allocation: it survives this plugin's reinitialize.
                if not rmm.is_installed(0):
                    rmm.install(0)

    def _install_store(self, worker: Any) -> None:
        if self.device_memory_limit is None:
            return
        data = worker.data
        if isinstance(data, DeviceStore):
            data.limit = _rmm_rs.set_device_memory_limit(self.device_memory_limit, data.device_id)
            transfer.attach(worker, data)
        elif len(data) == 0:
            store = DeviceStore(
                self.device_memory_limit,
                worker_local_directory=getattr(worker, "local_directory", None),
            )
            worker.memory_manager.data = store
            worker.state.data = store
            transfer.attach(worker, store)
        else:
            logger.warning(
                "rmm-rs: the worker already holds %d values in a %s; its data stays there "
                "(device_memory_limit applies to a new worker)",
                len(data),
                type(data).__name__,
            )

    def _roll_back(self, worker: Any, previous: Any, changed: bool) -> bool:
        """Puts back the set-up in force before (the previous plugin's), or none; `changed`
        when this plugin's set-up had begun to apply. True when an rmm-rs set-up from before
        is in force again."""
        global _owner, _retiring
        try:
            if previous is not None:
                if changed:
                    rmm_rs.reinitialize(previous.config, previous.settings(worker))
                worker.plugins[self.name] = previous
                worker.metrics["rmm"] = _metrics
                worker.metrics["rmm_rs"] = _all_metrics
                worker.metrics["rmm-rs-spill"] = _spill_metrics
                _owner, _retiring = previous, None
            elif not changed:
                pass
            elif isinstance(worker.data, DeviceStore):
                store = worker.data
                rmm_rs.reinitialize(store.config, store.settings())
            elif rmm_rs.is_initialized():
                rmm_rs.finalize()
        except Exception as e:  # noqa: BLE001 - the set-up error is the one to report
            logger.error("rmm-rs: restoring the previous set-up failed: %s", e)
            return False
        return rmm_rs.is_initialized()

    def teardown(self, worker: Any) -> None:
        global _owner, _retiring
        for m in ("rmm", "rmm_rs", "rmm-rs-spill"):
            worker.metrics.pop(m, None)
        if _owner is not self:
            return
        # A plugin of the same name replacing this one is set up right after this returns,
        # before the event loop runs again: let it take over the running runtime (or put
        # this one back if it fails). Only when none did is the memory given back.
        _owner, _retiring = None, self
        try:
            asyncio.get_running_loop().call_soon(_finalize_if_unowned, worker)
        except RuntimeError:
            _finalize_if_unowned(worker)


def _take_no_tasks(worker: Any, error: BaseException) -> None:
    """Keeps a worker left without rmm-rs after a failed set-up from taking tasks (on plain
    allocations): a starting worker fails its start with the error being raised; a running
    one is paused now (it starts no task from here on) and closed with its nanny, which would
    only restart it into the same failure."""
    status = getattr(worker, "status", None)
    reason = f"rmm-rs set-up failed: {error}"
    if status in (None, Status.init, Status.closing, Status.closed, Status.failed):
        if status is Status.init:
            logger.error("rmm-rs: %s; the worker does not start", reason)
        return
    logger.error(
        "rmm-rs: %s; the worker is left without rmm-rs and would run tasks on plain "
        "allocations: it closes (fix the configuration and start it again)",
        reason,
    )
    if status == Status.running:
        worker.status = Status.paused
    asyncio.get_running_loop().create_task(worker.close(nanny=True, reason=reason))


def _finalize_if_unowned(worker: Any) -> None:
    global _retiring
    if _owner is None:
        _retiring = None
        if not isinstance(getattr(worker, "data", None), DeviceStore):
            rmm_rs.finalize()
