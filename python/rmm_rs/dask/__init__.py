"""rmm-rs for Dask workers.

* :class:`RMMRsPlugin`: rmm-rs set up on every worker (``client.register_plugin``), with
  dask-cuda's option names.
* :class:`DeviceStore`: a worker's ``data`` that keeps task results on the device under
  rmm-rs's spill manager (``LocalCUDACluster(data=DeviceStore.factory(...))``).
* A preload module: ``dask worker ADDRESS --preload rmm_rs.dask`` (or ``dask cuda worker``)
  sets rmm-rs up at worker start from ``--rmm-rs-config PATH`` (or the worker's rmm.toml and
  ``RMM_*`` environment), and with ``--rmm-rs-device-memory-limit SIZE`` puts the worker's
  data in a :class:`DeviceStore`.
* Dask serializers for ``rmm_rs.DeviceBuffer`` and ``rmm_rs.SpillableBuffer`` (registered on
  import).
"""

import click

from . import serialize  # noqa: F401 - registers the serializers
from .plugin import RMMRsPlugin
from .store import DeviceStore, is_device_object

__all__ = ["DeviceStore", "RMMRsPlugin", "dask_setup", "dask_teardown", "is_device_object"]

_preloaded = None


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
    '(bytes, "8GB", or a fraction of the device such as 0.8)',
)
def dask_setup(worker, rmm_rs_config, rmm_rs_device_memory_limit):
    """Preload entry point: sets rmm-rs up on the worker as ``RMMRsPlugin`` does."""
    global _preloaded
    plugin = RMMRsPlugin(rmm_rs_config, device_memory_limit=rmm_rs_device_memory_limit)
    plugin.setup(worker)
    _preloaded = plugin


def dask_teardown(worker):
    """Preload exit point: gives the memory back."""
    if _preloaded is not None:
        _preloaded.teardown(worker)
