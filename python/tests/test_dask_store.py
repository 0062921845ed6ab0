"""DeviceStore on a real distributed.LocalCluster of 2 worker processes on loopback (the
simulated device in each, DeviceBuffer values): results 3× the device limit through host and
disk, every byte checked; reinitialize through client.run; a task's input is not spilled
under pressure; statistics; nothing left on disk after the cluster closes; the preload
module."""

import os
import random
import sys
from typing import Any

import cloudpickle
import pytest
from clusters import local_cluster
from distributed import Client, get_worker, wait

import rmm_rs
from rmm_rs.dask import DeviceStore

# Functions of this module run on the workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20
SIZE = 4 * MIB
N = 24  # 96 MiB of results on two workers with 16 MiB device limits each: 3×


def data(n, seed):
    return random.Random(seed).randbytes(n)


def make(i):
    return rmm_rs.DeviceBuffer.from_bytes(data(SIZE, i))


def check(x, i):
    return x.to_bytes() == data(SIZE, i)


def statistics(dask_worker):
    stats = dask_worker.data.statistics()
    stats["keys"] = [k for k in dask_worker.data if dask_worker.data.tier(k) != "host-store"]
    return stats


def hold(x, i, key):
    """Holds its input while it puts 32 MiB of new values straight into the store."""
    store: Any = get_worker().data
    for j in range(8):
        store[f"pressure-{key}-{j}"] = rmm_rs.DeviceBuffer.from_bytes(data(SIZE, 1000 + j))
    tier = store.tier(key)
    ok = check(x, i)
    for j in range(8):
        del store[f"pressure-{key}-{j}"]
    return tier, ok


def cluster(**kwargs):
    return local_cluster(threads_per_worker=2, **kwargs)


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    return tmp_path_factory.mktemp("rmm-rs-spill")


@pytest.fixture(scope="module")
def client(disk):
    store = DeviceStore.factory(
        device_memory_limit="16MiB",
        config={"spill": {"enabled": True, "host_pool_size": "16MiB"}},
        disk_directory=str(disk),
    )
    with cluster(data=store) as c, Client(c) as client:
        yield client
    # The cluster closed: its spill files went with the workers.
    assert os.listdir(disk) == []


@pytest.fixture(scope="module")
def results(client):
    futures = client.map(make, range(N), key=[f"v-{i}" for i in range(N)])
    wait(futures)
    assert all(f.status == "finished" for f in futures)
    return futures


def test_results_three_times_the_limit_spill_to_host_and_disk_and_read_back(client, results):
    assert all(client.gather(client.map(check, results, range(N))))
    stats = list(client.run(statistics).values())
    # Every result is held (a worker may also hold a replica of another's, fetched for a task).
    assert {k for s in stats for k in s["keys"]} == {f.key for f in results}
    for s in stats:
        assert s["device_count"] + s["host_count"] + s["disk_count"] == len(s["keys"])
        assert s["device_bytes"] + s["host_bytes"] + s["disk_bytes"] == len(s["keys"]) * SIZE
    # Reading everything back brought data to the device; released, it went off again.
    assert all(s["spill"]["tracked_bytes"] <= 16 * MIB for s in stats), stats
    assert sum(s["host_count"] for s in stats) > 0
    assert sum(s["disk_count"] for s in stats) > 0
    for s in stats:
        spill = s["spill"]
        assert spill["tracked_bytes"] <= 16 * MIB
        assert spill["spilled_bytes"] >= s["host_bytes"] + s["disk_bytes"]
    # Results also travel to the client (the "dask" serializer: host bytes).
    first = client.gather(results[0])
    assert isinstance(first, rmm_rs.DeviceBuffer) and first.to_bytes() == data(SIZE, 0)


def test_a_tasks_input_is_not_spilled_while_it_runs(client, results):
    who_has = client.who_has(results[:4])
    futures = [
        client.submit(hold, f, i, f.key, workers=list(who_has[f.key]), pure=False)
        for i, f in enumerate(results[:4])
    ]
    assert client.gather(futures) == [("device", True)] * 4


def test_a_task_reads_a_buffer_made_on_another_worker(client, results):
    # Each check runs on the worker that does not hold its input: the buffer travels.
    workers = sorted(client.scheduler_info()["workers"])
    who_has = client.who_has(results[:6])
    futures = []
    for i, f in enumerate(results[:6]):
        other = [w for w in workers if w not in who_has[f.key]]
        futures.append(
            client.submit(check, f, i, workers=other, allow_other_workers=False, pure=False)
        )
    assert client.gather(futures, errors="raise") == [True] * 6


def test_values_survive_reinitialize_through_client_run(client, results):
    reports = client.run(
        rmm_rs.reinitialize,
        {
            "spill": {"enabled": True, "host_pool_size": "16MiB"},
            "pool": {"enabled": True, "initial_size": "64MiB"},
        },
    )
    assert len(reports) == 2
    for s in client.run(lambda dask_worker: rmm_rs.device_statistics()[0]["stack"]).values():
        assert "PoolMemoryResource" in s
    assert all(client.gather(client.map(check, results, range(N), pure=False)))


def test_the_preload_module_puts_worker_data_on_rmm_rs():
    with cluster(
        preload=["rmm_rs.dask"], preload_argv=["--rmm-rs-device-memory-limit", "8MiB"]
    ) as c, Client(c) as client:
        kinds = client.run(lambda dask_worker: type(dask_worker.data).__name__)
        assert list(kinds.values()) == ["DeviceStore", "DeviceStore"]
        limits = client.run(lambda dask_worker: rmm_rs.spill_statistics()[0]["limit"])
        assert list(limits.values()) == [8 * MIB, 8 * MIB]
        futures = client.map(make, range(8))
        assert all(client.gather(client.map(check, futures, range(8))))


def preload_setup(dask_worker):
    plugin = dask_worker.plugins["rmm-rs"]
    return plugin.external_libs, rmm_rs.device_statistics()[0]["stack"]


def test_the_preload_puts_the_allocator_libraries_and_the_pool_on_rmm_rs():
    argv = ["--rmm-rs-pool-size", "64MiB", "--rmm-rs-allocator-external-lib-list", "cupy"]
    with cluster(preload=["rmm_rs.dask"], preload_argv=argv) as c, Client(c) as client:
        for libs, stack in client.run(preload_setup).values():
            assert libs == ["cupy"]
            assert "PoolMemoryResource" in stack, stack
