"""The device store spilling the values a worker's tasks read furthest ahead first
(rmm_rs.dask.next_use), on the simulated device: a task's place in Dask's order, the order the
store spills in once told, and a Dask shuffle under a limit smaller than its inputs."""

import random
import sys
from types import SimpleNamespace

import cloudpickle
import dask
from clusters import local_cluster
from distributed import Client, wait

import rmm_rs
from rmm_rs.dask import DeviceStore
from rmm_rs.dask.next_use import NextUse, position

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20


def data(i, size=2 * MIB):
    return random.Random(i).randbytes(size)


def test_a_tasks_position_follows_dasks_order():
    # (-user priority, generation, dask.order's position, ...), compared as Dask compares them.
    priorities = [
        (-1, 0, 5), (0, 1, 0, 0), (0, 1, 2, -4), (0, 1, 10, -9), (0, 2, 0, -10), (3, 0, 0)
    ]
    positions = [position(p) for p in priorities]
    known = [p for p in positions if p is not None]
    assert known == sorted(known) and len(set(known)) == len(positions)
    assert position(None) is None and position((1,)) is None


def _task(key, state="memory", dependents=(), dependencies=()):
    return SimpleNamespace(key=key, state=state, priority=None, dependents=list(dependents),
                           dependencies=list(dependencies))


def test_a_finished_task_ranks_its_value_and_its_inputs_by_their_next_reader():
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="8MiB", prefetch=0)
    for k in ("a", "b", "c", "d"):
        store[k] = rmm_rs.DeviceBuffer.from_bytes(data(ord(k)))
    soon, late = _task("r1", "waiting"), _task("r2", "ready")
    soon.priority, late.priority = (0, 1, 1), (0, 1, 9)
    done = _task("done", "memory")
    done.priority = (0, 1, 0)
    a = _task("a", dependents=[soon])  # read soon
    b = _task("b", dependents=[late, done])  # read later (done has run)
    c = _task("c", dependents=[done])  # nothing reads it again
    d = _task("d", dependents=[soon, late], dependencies=[a, b, c])
    plugin = NextUse(store)
    plugin.setup(SimpleNamespace(state=SimpleNamespace(tasks={t.key: t for t in (a, b, c, d)})))
    plugin.transition("d", "executing", "memory")  # ranks d and its inputs a, b, c
    plugin.transition("nothing", "executing", "memory")  # unknown to the worker: nothing
    # Least recently used, a would spill first; by next use: c (nothing reads it), then b.
    store["e"] = rmm_rs.DeviceBuffer.from_bytes(data(5))
    assert [store.tier(k) for k in "abcde"] == ["device", "device", "host", "device", "device"]
    store["f"] = rmm_rs.DeviceBuffer.from_bytes(data(6))
    assert [store.tier(k) for k in "abcdef"] == ["device", "host", "host", "device", "device",
                                                 "device"]
    assert store["b"].to_bytes() == data(ord("b"))
    store.close()


def test_a_value_stored_under_two_keys_is_placed_by_the_sooner_next_use():
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="9MiB", prefetch=0)
    store["b"] = rmm_rs.DeviceBuffer.from_bytes(data(1))
    assert store.spill("b") == 2 * MIB
    store["v"] = store["b"]  # a task returning its input: one value, two keys
    store["x"] = rmm_rs.DeviceBuffer.from_bytes(data(2))
    store["y"] = rmm_rs.DeviceBuffer.from_bytes(data(3))
    soon, mid, late = (_task(f"r{i}", "waiting") for i in range(3))
    soon.priority, mid.priority, late.priority = (0, 1, 1), (0, 1, 5), (0, 1, 9)
    b, v = _task("b", dependents=[soon]), _task("v")  # nothing reads v, b is read soon
    x, y = _task("x", dependents=[mid]), _task("y", dependents=[late])
    plugin = NextUse(store)
    plugin.setup(SimpleNamespace(state=SimpleNamespace(tasks={})))
    plugin.rank([b, v, x, y])
    # v's "no next use" does not make b's data spill first: y (read furthest ahead) goes.
    store["z"] = rmm_rs.DeviceBuffer.from_bytes(data(4))
    store["w"] = rmm_rs.DeviceBuffer.from_bytes(data(5))
    assert [store.tier(k) for k in ("b", "v", "x", "y")] == ["device", "device", "device", "host"]
    assert store["v"].to_bytes() == data(1)
    store.close()


def make(i):
    return rmm_rs.DeviceBuffer.from_bytes(data(i))


def piece(x, j, parts):
    n = x.size // parts
    ptr = x.__cuda_array_interface__["data"][0] + j * n
    return rmm_rs.DeviceBuffer.copy_of_device(ptr, n)


def join(*pieces):
    return rmm_rs.DeviceBuffer.from_bytes(b"".join(p.to_bytes() for p in pieces))


def unspilled(dask_worker):
    return dask_worker.data.statistics()["spill"]["unspilled_bytes"]


def test_a_shuffle_under_a_limit_below_its_inputs_reads_back_less_than_least_recently_used(
    tmp_path,
):
    # Dask runs the shuffle output by output, each reading a piece of every input in turn: 8
    # inputs of 2 MiB under a 10 MiB limit. Least recently used spills the input read next,
    # and every piece task brings its input back: 8 outputs x 8 inputs x 2 MiB = 128 MiB.
    parts = 8
    with local_cluster(
        n_workers=1,
        data=DeviceStore.factory(device_memory_limit="10MiB", prefetch=0),
        local_directory=str(tmp_path),
    ) as cluster, Client(cluster) as client:
        ins = client.persist([dask.delayed(make)(i, dask_key_name=f"in-{i}") for i in range(parts)])
        wait(ins)
        outs = [
            dask.delayed(join)(
                *[dask.delayed(piece)(ins[i], j, parts, dask_key_name=f"p-{i}-{j}")
                  for i in range(parts)],
                dask_key_name=f"out-{j}",
            )
            for j in range(parts)
        ]
        before = list(client.run(unspilled).values())[0]
        got = client.gather(client.compute(outs))
        read_back = list(client.run(unspilled).values())[0] - before
    n = 2 * MIB // parts
    for j, out in enumerate(got):
        assert out.to_bytes() == b"".join(data(i)[j * n:(j + 1) * n] for i in range(parts))
    # Least recently used read back 136 MiB here (2026-11-28); by next use, 88 MiB.
    assert read_back <= 100 * MIB, f"{read_back / MIB:.0f} MiB read back"
