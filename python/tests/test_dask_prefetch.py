"""The device store bringing the spilled inputs of a worker's next tasks back to the device
ahead of them (rmm_rs.dask.prefetch), on the simulated device: what a task start queues, what
it leaves alone, the setting's checks, and a Dask worker process doing it as its tasks run."""

import random
import sys
from types import SimpleNamespace
from typing import Any, List, Tuple

import cloudpickle
import pytest
from clusters import local_cluster
from distributed import Client

import rmm_rs
from rmm_rs.dask import DeviceStore
from rmm_rs.dask.prefetch import Prefetcher

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20
SIZE = 4 * MIB


def data(i):
    return random.Random(i).randbytes(SIZE)


class _Ready:
    """The part of distributed's ready heap the prefetcher reads: the next tasks in order."""

    def __init__(self, tasks: List[Any]):
        self.tasks = tasks

    def peekn(self, n):
        return iter(self.tasks[:n])


def _task(*deps):
    return SimpleNamespace(dependencies=[SimpleNamespace(key=k) for k in deps])


def _store_with_spilled(n):
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="64MiB", prefetch=0)
    for i in range(n):
        store[f"x{i}"] = rmm_rs.DeviceBuffer.from_bytes(data(i))
        assert store.spill(f"x{i}") == SIZE
    return store


def test_a_starting_task_brings_back_the_spilled_inputs_of_the_next_ready_ones():
    store = _store_with_spilled(4)
    store["own"] = rmm_rs.DeviceBuffer.from_bytes(data(9))  # on the device: left alone
    p = Prefetcher(store, depth=2)
    ready = _Ready([_task("x0", "x1", "own"), _task("x2", "absent"), _task("x3")])
    p.setup(SimpleNamespace(state=SimpleNamespace(ready=ready)))

    p.transition("other", "ready", "memory")  # not a task starting: nothing
    p.wait()
    assert [store.tier(f"x{i}") for i in range(4)] == ["host"] * 4

    p.transition("t0", "ready", "executing")
    p.wait()
    # The first two ready tasks' spilled inputs are back; the third task's is not.
    assert [store.tier(f"x{i}") for i in range(4)] == ["device", "device", "device", "host"]
    assert p.brought_back == 3 and store.tier("own") == "device"
    # Read from the device, as they were.
    assert all(store[f"x{i}"].to_bytes() == data(i) for i in range(4))
    # Values on the device already are not queued again.
    assert p.prefetch(["x0", "x1", "own", "absent"]) == 0
    p.close()
    store.close()


def test_depth_zero_brings_back_nothing_and_a_bad_setting_is_refused():
    store = _store_with_spilled(1)
    p = Prefetcher(store, depth=0)
    p.setup(SimpleNamespace(state=SimpleNamespace(ready=_Ready([_task("x0")]))))
    p.transition("t", "ready", "executing")
    p.wait()
    assert store.tier("x0") == "host" and p.brought_back == 0
    with pytest.raises(ValueError, match="negative"):
        Prefetcher(store, depth=-1)
    bads: Tuple[Any, ...] = (-1, 1.5, True, "2")
    for bad in bads:
        with pytest.raises(ValueError, match="prefetch="):
            DeviceStore(prefetch=bad)
    store.close()


def test_a_worker_without_a_ready_heap_is_left_alone():
    store = _store_with_spilled(1)
    p = Prefetcher(store)
    p.setup(SimpleNamespace(state=SimpleNamespace(ready=None)))
    p.transition("t", "ready", "executing")
    p.setup(SimpleNamespace(state=SimpleNamespace(ready=SimpleNamespace())))  # no peekn
    p.transition("t", "ready", "executing")
    assert p.depth == 0, "an unknown ready heap turns prefetching off"
    assert store.tier("x0") == "host"
    store.close()


def make(i):
    return rmm_rs.DeviceBuffer.from_bytes(data(i))


def total(x, i):
    if x.to_bytes() != data(i):
        raise ValueError(f"value {i} changed")
    return len(x)


def prefetched(dask_worker):
    p = dask_worker.plugins.get(Prefetcher.name)
    return -1 if p is None else p.brought_back


def test_a_dask_worker_brings_inputs_back_ahead_of_its_tasks(tmp_path):
    # One worker, one thread: 16 values of 4 MiB under an 8 MiB limit are mostly spilled;
    # the tasks reading them in order find the next ones brought back ahead of them.
    n = 16
    with local_cluster(
        n_workers=1,
        data=DeviceStore.factory(device_memory_limit="8MiB"),
        local_directory=str(tmp_path),
    ) as cluster, Client(cluster) as client:
        xs = [client.submit(make, i, pure=False) for i in range(n)]
        client.gather(xs)
        sizes = client.gather([client.submit(total, x, i) for i, x in enumerate(xs)])
        assert sizes == [SIZE] * n
        counts = list(client.run(prefetched).values())
        assert counts[0] > 0, f"nothing was brought back ahead of a task: {counts}"


def test_a_closed_prefetcher_queues_nothing_and_forgets_what_was_queued():
    store = _store_with_spilled(2)
    p = Prefetcher(store, depth=2)
    p.setup(SimpleNamespace(state=SimpleNamespace(ready=_Ready([_task("x0", "x1")]))))
    p.close()
    assert p.prefetch(["x0", "x1"]) == 0 and p._pool is None, "closed for good"
    assert not p._pending
    p.transition("t", "ready", "executing")
    assert p._pool is None and store.tier("x0") == "host"
    store.close()
