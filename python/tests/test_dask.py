"""RMMRsPlugin on a real distributed.LocalCluster of 2 worker processes on loopback (the
simulated device in each)."""

import importlib.util
import os
import subprocess
import sys
import time

import cloudpickle
import pytest
from clusters import local_cluster
from distributed import Client

import rmm_rs
from rmm_rs.dask import RMMRsPlugin

# Functions of this module run on the workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

DATA = bytes(range(251)) * 4001


@pytest.fixture(scope="module")
def client():
    with local_cluster() as cluster, Client(cluster) as c:
        yield c


def keep(dask_worker):
    dask_worker.rmm_rs_kept = rmm_rs.SpillableBuffer(DATA)
    return dask_worker.rmm_rs_kept.tier


def kept(dask_worker):
    b = dask_worker.rmm_rs_kept
    return b.tier, b.to_bytes() == DATA


def stack(dask_worker):
    return rmm_rs.device_statistics()[0]["stack"]


def rmm_metric(dask_worker):
    return dask_worker.metrics["rmm"](dask_worker)


def test_the_plugin_sets_up_every_worker_with_dask_cuda_options(client):
    client.register_plugin(RMMRsPlugin({"spill": {"enabled": True}}, rmm_pool_size="64MiB"))
    assert list(client.run(rmm_rs.is_initialized).values()) == [True, True]
    for s in client.run(stack).values():
        assert "PoolMemoryResource" in s
    stats = client.run(rmm_rs.device_statistics)
    assert len(stats) == 2
    assert all(s[0]["reserved_bytes"] == 64 << 20 for s in stats.values())


def test_reinitialize_through_client_run_keeps_spillable_data(client):
    client.register_plugin(RMMRsPlugin({"spill": {"enabled": True}}, rmm_pool_size="64MiB"))
    assert set(client.run(keep).values()) == {"device"}
    reports = client.run(rmm_rs.reinitialize, {"spill": {"enabled": True}})
    assert all(r["spilled_bytes"] == len(DATA) for r in reports.values())
    for s in client.run(stack).values():
        assert "PoolMemoryResource" not in s
    assert list(client.run(kept).values()) == [("host", True), ("host", True)]


def test_statistics_reach_the_dashboards_rmm_metric(client):
    client.register_plugin(RMMRsPlugin(rmm_pool_size="32MiB"))
    for m in client.run(rmm_metric).values():
        assert m == {"rmm-used": 0, "rmm-total": 32 << 20}

    # The scheduler sees it with the next heartbeat.
    def scheduler_metrics(dask_scheduler):
        return [ws.metrics.get("rmm") for ws in dask_scheduler.workers.values()]

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = client.run_on_scheduler(scheduler_metrics)
        if all(m and m["rmm-total"] == 32 << 20 for m in seen):
            break
        time.sleep(0.2)
    assert all(m and m["rmm-total"] == 32 << 20 for m in seen), seen


def test_a_bad_configuration_raises_in_the_client_with_its_message(client):
    client.register_plugin(RMMRsPlugin(rmm_pool_size="32MiB"))
    with pytest.raises(rmm_rs.RmmError, match='pool.initial_size = "lots"'):
        client.register_plugin(RMMRsPlugin({"pool": {"initial_size": "lots"}}))
    # Raised before anything reached the workers: they keep their set-up.
    assert list(client.run(rmm_rs.is_initialized).values()) == [True, True]
    for s in client.run(stack).values():
        assert "PoolMemoryResource" in s
    with pytest.raises(rmm_rs.RmmError, match="unknown libraries.*'cupy', 'torch', 'numba'"):
        RMMRsPlugin(rmm_allocator_external_lib_list=["tensorflow"])
    assert RMMRsPlugin(rmm_allocator_external_lib_list="cupy,numba").external_libs == [
        "cupy",
        "numba",
    ]


def reserved(dask_worker):
    return rmm_rs.device_statistics()[0]["reserved_bytes"] if rmm_rs.is_initialized() else None


def plugin_libraries(dask_worker):
    return dask_worker.plugins["rmm-rs"].external_libs


def eventually(client, f, expected, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        seen = list(client.run(f).values())
        if seen == expected or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def test_a_rejected_plugin_leaves_the_working_set_up(client):
    client.register_plugin(RMMRsPlugin(rmm_pool_size="64MiB"))
    with pytest.raises(rmm_rs.RmmError, match='"lots"'):
        client.register_plugin(RMMRsPlugin(rmm_pool_size="lots"))
    assert list(client.run(reserved).values()) == [64 << 20, 64 << 20]
    for s in client.run(stack).values():
        assert "PoolMemoryResource" in s
    # The scheduler kept the working plugin, not the rejected one: a worker that restarts
    # comes back with it.
    workers = list(client.scheduler_info()["workers"])
    client.restart_workers(workers[:1])
    client.wait_for_workers(2)
    assert list(client.run(reserved).values()) == [64 << 20, 64 << 20]
    for s in client.run(stack).values():
        assert "PoolMemoryResource" in s


def test_a_plugin_naming_a_missing_library_changes_nothing(client):
    missing = [lib for lib in ("cupy", "torch") if importlib.util.find_spec(lib) is None]
    if not missing:
        pytest.skip("CuPy and PyTorch are both installed: no missing library to name")
    name = {"cupy": "CuPy", "torch": "PyTorch"}[missing[0]]
    client.register_plugin(RMMRsPlugin(rmm_pool_size="64MiB"))
    bad = RMMRsPlugin(rmm_pool_size="32MiB", rmm_allocator_external_lib_list=missing)
    with pytest.raises(rmm_rs.RmmError, match=f"install {name}"):
        client.register_plugin(bad)
    # Every worker keeps the old set-up, and the old plugin to tear it down later.
    assert list(client.run(reserved).values()) == [64 << 20, 64 << 20]
    assert list(client.run(plugin_libraries).values()) == [[], []]
    client.unregister_worker_plugin("rmm-rs")
    assert eventually(client, reserved, [None, None]) == [None, None]


def worker_count(client):
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.workers))


def closes_its_workers(client, timeout=60):
    """True once the scheduler has no worker left (the failed ones closed themselves)."""
    deadline = time.monotonic() + timeout
    while worker_count(client) and time.monotonic() < deadline:
        time.sleep(0.1)
    return worker_count(client) == 0


def test_a_worker_whose_set_up_fails_takes_no_tasks_and_closes(tmp_path):
    missing = tmp_path / "missing-rmm.toml"
    with local_cluster() as cluster, Client(cluster) as client:
        # A path is the workers' own: only they find it missing.
        with pytest.raises(rmm_rs.RmmError, match="missing-rmm.toml"):
            client.register_plugin(RMMRsPlugin(str(missing)))
        # Left without rmm-rs, they would run tasks on plain allocations: they close.
        assert closes_its_workers(client), client.scheduler_info()["workers"]
        # With their nannies, which would start them again into the same failure.
        closing = ("closing_gracefully", "closing", "closed")
        assert all(n.status.name in closing for n in cluster.workers.values())


def test_a_device_memory_limit_larger_than_the_device_fails_the_set_up():
    with local_cluster() as cluster, Client(cluster) as client:
        with pytest.raises(rmm_rs.RmmError, match=r"device_memory_limit = 1PB .*larger than"):
            client.register_plugin(RMMRsPlugin(device_memory_limit="1PB"))
        assert closes_its_workers(client)


def test_a_worker_whose_preload_fails_never_joins_and_exits_with_the_error(tmp_path):
    missing = tmp_path / "missing-rmm.toml"
    with local_cluster(n_workers=0) as cluster, Client(cluster) as client:
        worker = subprocess.run(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                cluster.scheduler_address,
                "--nworkers",
                "1",
                "--nthreads",
                "1",
                "--no-dashboard",
                "--local-directory",
                str(tmp_path),
                "--preload",
                "rmm_rs.dask",
                "--rmm-rs-config",
                str(missing),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "RMM_BACKEND": "sim"},
        )
        assert worker.returncode != 0, worker.stderr
        assert str(missing) in worker.stderr
        assert "Registered to" not in worker.stderr
        assert worker_count(client) == 0
