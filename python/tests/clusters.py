"""The Dask cluster the tests start: worker processes on this host (two), no dashboards."""

from typing import Any

from distributed import LocalCluster


def local_cluster(threads_per_worker: int = 1, n_workers: int = 2, **kwargs: Any) -> LocalCluster:
    """A ``distributed.LocalCluster`` of ``n_workers`` worker processes (2) on 127.0.0.1
    without dashboards; ``kwargs`` go to it (``data=`` for a worker store, say)."""
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        worker_dashboard_address=None,
        **kwargs,
    )
