"""rmm-rs for Dask workers.

* :class:`RMMRsPlugin`: rmm-rs set up on every worker (``client.register_plugin``), with
  dask-cuda's option names.
* :class:`DeviceStore`: a worker's ``data`` that keeps task results on the device under
  rmm-rs's spill manager (``LocalCUDACluster(data=DeviceStore.factory(...))``).
* A preload module: ``dask worker ADDRESS --preload rmm_rs.dask`` (or ``dask cuda worker``)
  sets rmm-rs up at worker start from ``--rmm-rs-config PATH`` (or the worker's rmm.toml and
  ``RMM_*`` environment), and with ``--rmm-rs-device-memory-limit SIZE`` puts the worker's
  data in a :class:`DeviceStore`; ``--rmm-rs-pool-size SIZE`` and
  ``--rmm-rs-allocator-external-lib-list cupy,torch,rmm`` as dask-cuda's options.
* Dask serializers for ``rmm_rs.DeviceBuffer`` and ``rmm_rs.SpillableBuffer`` (registered on
  import).
"""

import logging
from typing import Any, Optional

import click
from distributed import WorkerPlugin

import rmm_rs

from . import serialize  # noqa: F401 - registers the serializers
from .plugin import RMMRsPlugin
from .store import DeviceStore, is_device_object

__all__ = ["DeviceStore", "RMMRsPlugin", "dask_setup", "dask_teardown", "is_device_object"]

logger = logging.getLogger("rmm_rs.dask")


@click.command()
@click.option(
    "--rmm-rs-config",
    default=None,
    help="rmm.toml of the worker's rmm-rs (default: ./rmm.toml or RMM_CONFIG, and RMM_*)",
)
@click.option(
    "--rmm-rs-device-memory-limit",
    default=None,
    help="put the worker's data on rmm-rs, spilling device values over this size "
    '(bytes, "8GB", or a fraction of the device such as 0.8; 0 for no spilling)',
)
@click.option(
    "--rmm-rs-pool-size",
    default=None,
    help='the worker\'s pool: its initial size (bytes, "8GB", or a fraction of the device '
    "such as 0.5), as dask-cuda's --rmm-pool-size",
)
@click.option(
    "--rmm-rs-allocator-external-lib-list",
    default=None,
    help="libraries that allocate from rmm-rs on the worker, comma-separated: cupy, torch, "
    "numba, rmm (RAPIDS RMM and what allocates through it: cuDF, cuML, XGBoost), as dask-cuda's "
    "--rmm-allocator-external-lib-list",
)
def dask_setup(
    worker: Any,
    rmm_rs_config: Optional[str],
    rmm_rs_device_memory_limit: Optional[str],
    rmm_rs_pool_size: Optional[str],
    rmm_rs_allocator_external_lib_list: Optional[str],
) -> None:
    """Preload entry point: sets rmm-rs up on the worker as ``RMMRsPlugin`` does, as one of
    the plugins the worker sets up when it starts, before it joins the cluster. A set-up that
    fails (a bad ``--rmm-rs-config``, say) fails the worker's start, with the error in its log:
    distributed only logs an error raised by a preload itself, and the worker would join the
    cluster on plain allocations."""
    plugin: WorkerPlugin
    try:
        plugin = RMMRsPlugin(
            rmm_rs_config,
            device_memory_limit=rmm_rs_device_memory_limit,
            rmm_pool_size=rmm_rs_pool_size,
            rmm_allocator_external_lib_list=rmm_rs_allocator_external_lib_list,
        )
    except Exception as e:  # noqa: BLE001 - raised by the worker's start instead
        plugin = _Failed(e)
    pending = getattr(worker, "_pending_plugins", None)
    if not isinstance(pending, tuple):
        raise rmm_rs.RmmError(
            "the rmm_rs.dask preload needs a distributed whose Worker sets up the plugins "
            "given at its start (Worker(plugins=...)), so that a failed set-up fails the "
            f"start; this {type(worker).__name__} has none: upgrade distributed, or register "
            "rmm_rs.dask.RMMRsPlugin from a client instead"
        )
    # The worker's start sets these up after the preloads and before it registers with the
    # scheduler; an error there fails the start. The worker's plugins own it from then on
    # (torn down as the worker closes).
    worker._pending_plugins = (*pending, plugin)


class _Failed(WorkerPlugin):
    """Stands for a plugin the preload's options could not make: its set-up raises the
    error, so that the worker's start fails with it."""

    name = RMMRsPlugin.name

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def setup(self, worker: Any) -> None:
        logger.error("rmm-rs: the preload's options are refused: %s", self.error)
        raise self.error


def dask_teardown(worker: Any) -> None:
    """Preload exit point: nothing left to do (the worker tears its plugins down, rmm-rs's
    among them, as it closes)."""
