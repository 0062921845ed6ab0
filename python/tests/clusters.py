"""The Dask cluster the tests start: two worker processes on this host, no dashboards."""

from typing import Any

from distributed import LocalCluster


def local_cluster(threads_per_worker: int = 1, **kwargs: Any) -> LocalCluster:
    """A ``distributed.LocalCluster`` of 2 worker processes on 127.0.0.1 without dashboards;
    ``kwargs`` go to it (``data=`` for a worker store, say)."""
    return LocalCluster(
        n_workers=2,
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        worker_dashboard_address=None,
        **kwargs,
    )
