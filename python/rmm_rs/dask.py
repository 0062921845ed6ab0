"""rmm-rs on Dask workers: ``RMMRsPlugin``, a ``distributed.WorkerPlugin``.

At worker set-up the plugin builds the rmm-rs stack for the worker's GPU (device 0 of the
process: the first of ``CUDA_VISIBLE_DEVICES``, as dask-cuda sets it) from an rmm.toml path, a
dict of settings, or the defaults, with dask-cuda's option names accepted on top, so a
``LocalCUDACluster(rmm_pool_size="24GB")`` user switches with one line::

    client.register_plugin(RMMRsPlugin(rmm_pool_size="24GB"))

It installs the allocators of ``rmm_allocator_external_lib_list`` ("cupy", "torch"), and
reports device bytes in use and reserved into the worker's metrics (``rmm-used`` and
``rmm-total``, which Dask's dashboard shows, plus ``rmm_rs`` with every counter) from the
statistics adaptor's counters: no tracking adaptor needed. Teardown gives the memory back.
``client.run(rmm_rs.reinitialize, config)`` switches every worker, keeping spillable data.
"""

from distributed import WorkerPlugin

import rmm_rs

from . import _rmm_rs


def _metrics(worker):
    """The worker metric Dask's dashboard reads for RMM: bytes in use and reserved."""
    stats = rmm_rs.statistics() if rmm_rs.is_initialized() else {}
    return {
        "rmm-used": sum(s["bytes_in_use"] for s in stats.values()),
        "rmm-total": sum(s["reserved_bytes"] for s in stats.values()),
    }


def _all_metrics(worker):
    """Every counter, per device."""
    return rmm_rs.statistics() if rmm_rs.is_initialized() else {}


class RMMRsPlugin(WorkerPlugin):
    """Sets up rmm-rs on each Dask worker; see the module documentation.

    ``config``: a path to an rmm.toml, a dict of settings, or None (the worker's ./rmm.toml or
    ``RMM_CONFIG``, and its ``RMM_*`` environment). dask-cuda's ``rmm_*`` options, when given,
    are applied on top (``rmm_rs.config_from_dask_cuda`` maps them).
    """

    name = "rmm-rs"

    def __init__(
        self,
        config=None,
        *,
        rmm_pool_size=None,
        rmm_maximum_pool_size=None,
        rmm_managed_memory=False,
        rmm_async=False,
        rmm_release_threshold=None,
        rmm_log_directory=None,
        rmm_track_allocations=False,
        rmm_allocator_external_lib_list=None,
    ):
        self.config = config
        # Mapped now, so a bad combination fails in the client, not on every worker.
        self.overrides = _rmm_rs.config_from_dask_cuda(
            rmm_pool_size=rmm_pool_size,
            rmm_maximum_pool_size=rmm_maximum_pool_size,
            rmm_managed_memory=rmm_managed_memory,
            rmm_async=rmm_async,
            rmm_release_threshold=rmm_release_threshold,
            rmm_log_directory=rmm_log_directory,
            rmm_track_allocations=rmm_track_allocations,
        )
        libs = rmm_allocator_external_lib_list or []
        if isinstance(libs, str):
            libs = [s.strip() for s in libs.split(",") if s.strip()]
        unknown = sorted(set(libs) - {"cupy", "torch"})
        if unknown:
            raise rmm_rs.RmmError(
                f"rmm_allocator_external_lib_list: unknown libraries {unknown}; "
                "rmm-rs provides allocators for 'cupy' and 'torch'"
            )
        self.external_libs = list(libs)

    def settings(self):
        """The overrides applied over ``config`` on each worker: the dask-cuda options, the
        worker's one device, one rmm-rs worker thread (Dask runs the tasks)."""
        return {**self.overrides, "devices": [0], "workers_per_device": 1}

    def setup(self, worker):
        if rmm_rs.is_initialized():
            rmm_rs.reinitialize(self.config, self.settings())
        else:
            rmm_rs.initialize(self.config, self.settings())
        for lib in self.external_libs:
            if lib == "cupy":
                from .allocators import cupy

                cupy.install()
            elif lib == "torch":
                from .allocators import torch

                torch.install()
        worker.metrics["rmm"] = _metrics
        worker.metrics["rmm_rs"] = _all_metrics

    def teardown(self, worker):
        worker.metrics.pop("rmm", None)
        worker.metrics.pop("rmm_rs", None)
        rmm_rs.finalize()
