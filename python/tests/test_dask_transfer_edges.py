"""Values between workers (rmm_rs.dask.transfer) at the edges:

- A spilled value a client gathers from an in-process cluster (``processes=False``: Dask's
  inproc comm passes objects without serializing them) reaches the client as the value.
- A received value's host frames (cuDF-like values: metadata on the host beside device
  columns) are its own: they do not keep the whole received message alive.
- Sending a spilled value as device copies (UCX) evicts nothing from the device: they are
  made where the device has room (a store at its limit included), else it goes as host frames.
- A failed device copy of a frame at an offset into its allocation sends host frames instead
  (a failed serialization would leave the peer's gather_dep waiting: dask/distributed#6705).
- Only the bytes a value's frames cover travel, not the whole allocations they lie in.
"""

import os
import random
import subprocess
import sys
import textwrap
from typing import Any

import cloudpickle
import pytest
from clusters import local_cluster
from distributed import Client, LocalCluster, wait

import rmm_rs
from rmm_rs.dask import DeviceStore

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20
SIZE = 4 * MIB


def data(i, n=SIZE):
    return random.Random(i).randbytes(n)


def make(i):
    return rmm_rs.DeviceBuffer.from_bytes(data(i))


def test_a_client_of_an_in_process_cluster_gathers_values_not_host_frames():
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore.factory(device_memory_limit="16MiB")
    with LocalCluster(
        n_workers=1,
        processes=False,
        threads_per_worker=1,
        dashboard_address=None,
        data=store,
    ) as c, Client(c) as client:
        futures = client.map(make, range(8))  # 32 MiB under a 16 MiB limit: half spilled
        wait(futures)
        got = client.gather(futures)
        assert [type(x).__name__ for x in got] == ["DeviceBuffer"] * 8
        assert [x.to_bytes() for x in got] == [data(i) for i in range(8)]


def make_mixed(i):
    from mixed_values import Mixed

    return Mixed(b"meta-%d" % i, make(i))


def passed_on(x):
    return x


def host_frame_buffers(keys, dask_worker):
    """For each key's entry in the store: (bytes of its host frame, bytes of the buffer that
    frame keeps alive)."""
    out = {}
    for k in keys:
        entry: Any = dask_worker.data._device[k]
        for f in entry.frames:
            if isinstance(f, tuple):
                continue
            view = memoryview(f)
            base = view.obj if view.obj is not None else f
            out[k] = (view.nbytes, memoryview(base).nbytes)
    return out


def test_a_received_values_host_frames_do_not_keep_the_message_alive(tmp_path):
    # The worker processes import mixed_values (this directory is on their path).
    store = DeviceStore.factory(
        device_memory_limit="16MiB",
        config={"spill": {"enabled": True, "host_pool_size": "256MiB"}},
        disk_directory=str(tmp_path),
    )
    with local_cluster(n_workers=2, data=store) as c, Client(c) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        made = client.map(make_mixed, range(8), workers=[a])  # half spilled on a
        wait(made)
        # b fetches all eight (the spilled ones travel as host frames) and keeps them.
        got = client.submit(lambda *xs: len(xs), *made, workers=[b], pure=False)
        assert got.result() == 8
        keys = [f.key for f in made]
        frames = client.run(host_frame_buffers, keys, workers=[b])[b]
        kept_alive = {k: n for k, (_, n) in frames.items()}
        # Each host frame is a few bytes, not a view of the whole message b received
        # (several MiB of allocations it copied into pinned memory already).
        assert max(kept_alive.values()) < MIB, kept_alive


@pytest.mark.parametrize(
    "device_memory, sent_as",
    # 40 MiB: 8 MiB free beside the 32 resident, no room for the 16 MiB copy: host frames.
    # 96 MiB: the store is at its limit, but the device has room: device copies.
    [("40MiB", "host frames"), ("96MiB", "device copies")],
)
def test_device_copies_for_a_peer_evict_nothing_from_the_device(device_memory, sent_as):
    code = """
        import random
        import rmm_rs
        from distributed.protocol import serialize
        from rmm_rs.dask import DeviceStore
        from rmm_rs.dask.transfer import HostFrames

        MIB = 1 << 20

        def make(i, n=4 * MIB):
            return rmm_rs.DeviceBuffer.from_bytes(random.Random(i).randbytes(n))

        rmm_rs.initialize(None, {"spill": {"enabled": True}})
        store = DeviceStore(device_memory_limit="32MiB")
        store["spilled"] = make(99, 16 * MIB)
        store.spill("spilled")
        for i in range(8):  # 32 MiB on the device: at the limit
            store[f"r{i}"] = make(i)
        assert {store.tier(f"r{i}") for i in range(8)} == {"device"}
        entry = store._device["spilled"]
        sent = HostFrames.sent_from(entry.header, entry.frames, entry.adopted)
        # Over UCX: device copies made from the host tier where the device has room.
        header, frames = serialize(sent, serializers=("cuda",), on_error="raise")
        print("device copies" if header["sub-header"].get("device") else "host frames")
        tiers = {f"r{i}": store.tier(f"r{i}") for i in range(8)}
        assert set(tiers.values()) == {"device"}, tiers
        assert store.tier("spilled") == "host"
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RMM_BACKEND": "sim", "RMM_SIM_MEMORY": device_memory},
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == sent_as, out.stdout


def spilled_view(store, blob):
    """A spilled value of ``store`` whose device frame is 500 bytes at offset 1000 of a 4 MiB
    allocation holding ``blob`` (as a view into a larger array is), received from a peer;
    and what a peer would be sent of it."""
    from distributed.protocol import serialize
    from mixed_values import Mixed

    from rmm_rs.dask.transfer import HostFrames

    header, _ = serialize(Mixed(b"m", make(6)), serializers=("cuda",), on_error="raise")
    store["k"] = HostFrames(header, [b"meta", (0, 1000, 500)], [blob])
    assert store.spill("k") == SIZE
    entry: Any = store._device["k"]
    return HostFrames.sent_from(entry.header, entry.frames, entry.adopted)


@pytest.mark.skipif(
    os.environ.get("RMM_BACKEND", "sim") != "sim", reason="fault injection needs the simulator"
)
def test_a_failed_copy_of_a_frame_at_an_offset_sends_host_frames_instead():
    from distributed.protocol import deserialize, serialize

    from rmm_rs import _rmm_rs

    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="64MiB")
    blob = data(5)
    sent = spilled_view(store, blob)
    # Copy 1: the allocation's device copy; copy 2: the frame's own copy, which fails.
    _rmm_rs._sim_inject("copy", 2)
    try:
        header, frames = serialize(sent, serializers=("cuda",), on_error="raise")
    finally:
        _rmm_rs._sim_inject("copy", 0)
    got = deserialize(header, frames, deserializers=("cuda",))
    assert got.meta == b"meta" and got.buf.to_bytes() == blob[1000:1500]
    store.close()


def test_only_the_bytes_a_values_frames_cover_travel():
    from distributed.protocol import deserialize, serialize

    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="64MiB")
    blob = data(7)
    sent = spilled_view(store, blob)
    assert sent.nbytes == 500 and sent.frames == [b"meta", (0, 0, 500)]
    for family in ("dask", "cuda"):
        header, frames = serialize(sent, serializers=(family,), on_error="raise")
        assert sum(len(memoryview(f)) if not hasattr(f, "size") else f.size for f in frames) == 504
        got = deserialize(header, frames, deserializers=(family,))
        assert got.meta == b"meta" and got.buf.to_bytes() == blob[1000:1500]
    store.close()
