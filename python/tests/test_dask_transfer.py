"""Values moving between the device stores of 4 Dask worker processes (the simulated device in
each): a spilled value a peer asks for is sent from the host tier or disk, never brought back
to the device to be sent (``unspilled_to_send_bytes`` stays 0 and the sender unspills
nothing), a received value lands on the device when it fits under the receiver's limit and in
its host tier otherwise, every byte checked. Between these workers of one host the bytes go
through device memory both processes map (the default), or through the connection
(``share_with_peers=False``); the old way (``send_from_tier=False``) counts what it brings
back."""

import random
import sys
from typing import Any, Dict, List

import cloudpickle
import pytest
from clusters import local_cluster
from distributed import Client, wait

import rmm_rs
from rmm_rs.dask import DeviceStore
from rmm_rs.dask.transfer import SHARED_MESSAGE_BYTES

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20
SIZE = 4 * MIB
N = 24  # 96 MiB made on one worker under a 16 MiB limit and a 32 MiB host tier: most on disk


def data(i):
    return random.Random(i).randbytes(SIZE)


def make(i):
    return rmm_rs.DeviceBuffer.from_bytes(data(i))


def check(x, i):
    return isinstance(x, rmm_rs.DeviceBuffer) and x.to_bytes() == data(i)


def keep(x, i):
    """Returns its input (the receiving worker keeps it under a new key) once checked."""
    if not check(x, i):
        raise ValueError(f"value {i} arrived changed")
    return x


def figures(dask_worker):
    store: Any = dask_worker.data
    spill = rmm_rs.spill_statistics()[store.device_id]
    tiers: Dict[str, int] = {}
    for k in list(store):
        t = store.tier(k)
        tiers[t] = tiers.get(t, 0) + 1
    metrics = dask_worker.metrics["rmm-rs-transfer"](dask_worker)
    return {"spill": spill, "tiers": tiers, "metrics": metrics}


def copies_made_off_the_loop(dask_worker):
    """Whether this worker's copy threads (for values shared through a peer's memory) ran."""
    from rmm_rs.dask import transfer

    return transfer._COPIERS is not None


def message_bytes_limit(dask_worker):
    return dask_worker.state.transfer_message_bytes_limit


def tier_of(key, dask_worker):
    return dask_worker.data.tier(key)


def start(disk, send_from_tier, share_with_peers=True):
    store = DeviceStore.factory(
        device_memory_limit="16MiB",
        config={"spill": {"enabled": True, "host_pool_size": "32MiB"}},
        disk_directory=str(disk),
        send_from_tier=send_from_tier,
        share_with_peers=share_with_peers,
    )
    return local_cluster(n_workers=4, threads_per_worker=2, data=store)


def made_on_one_worker(client):
    workers = sorted(client.scheduler_info()["workers"])
    source, peers = workers[0], workers[1:]
    futures = client.map(make, range(N), key=[f"v-{i}" for i in range(N)], workers=[source])
    wait(futures)
    tiers = [client.run(tier_of, f.key, workers=[source])[source] for f in futures]
    assert {"device", "host", "disk"} <= set(tiers), tiers
    return source, peers, futures


def kept_by_peers(client, peers, futures) -> List[Any]:
    out = [
        client.submit(
            keep, f, i, workers=[peers[i % len(peers)]], allow_other_workers=False, pure=False
        )
        for i, f in enumerate(futures)
    ]
    wait(out)
    return out


@pytest.mark.parametrize(
    "send_from_tier, share_with_peers",
    [(True, True), (True, False), (False, True)],
    ids=["shared-device-memory", "through-the-connection", "unspill-first"],
)
def test_spilled_values_travel_between_four_workers(tmp_path, send_from_tier, share_with_peers):
    with start(tmp_path, send_from_tier, share_with_peers) as c, Client(c) as client:
        source, peers, futures = made_on_one_worker(client)
        before = client.run(figures, workers=[source])[source]["spill"]
        kept = kept_by_peers(client, peers, futures)
        assert [f.status for f in kept] == ["finished"] * N
        after = client.run(figures)
        sent = after[source]["spill"]
        # Every value crossed to a peer; three quarters of them were off the device.
        off_device = N * SIZE - 16 * MIB
        if send_from_tier:
            assert sent["unspilled_to_send_bytes"] == 0
            assert sent["unspilled_bytes"] == before["unspilled_bytes"], (before, sent)
            assert after[source]["metrics"]["unspilled_to_send_bytes"] == 0
        else:
            assert sent["unspilled_to_send_bytes"] >= off_device, sent
            assert sent["unspilled_bytes"] - before["unspilled_bytes"] >= off_device
        # Workers sharing memory ask a peer for every value it has ready in one message.
        limits = set(client.run(message_bytes_limit).values())
        assert limits == ({SHARED_MESSAGE_BYTES} if share_with_peers else {50_000_000})
        received = 0
        for w in peers:
            s = after[w]["spill"]
            received += s["received_on_device_bytes"] + s["received_off_device_bytes"]
        transfer = after[source]["metrics"]
        way = "exported" if share_with_peers else "host_frames"
        other = "host_frames" if share_with_peers else "exported"
        kept_bytes = sum(after[w]["metrics"][f"received_{way}_bytes"] for w in peers)
        if send_from_tier:
            # The spilled ones arrived (through shared device memory, or as host frames) and
            # were kept as they came; over the peers' limits some went straight to their
            # host tiers.
            assert received >= off_device, after
            assert sum(after[w]["spill"]["received_off_device_bytes"] for w in peers) > 0
            # The sender read them from its tier, the peers kept them; nothing the other way.
            assert transfer[f"sent_{way}_bytes"] >= off_device, transfer
            assert transfer[f"sent_{way}_seconds"] > 0
            assert transfer[f"sent_{other}_count"] == 0, transfer
            assert kept_bytes == received
            # Every peer answered: the sender holds none of the memory it shared.
            assert transfer["exported_held_bytes"] == 0, transfer
            if share_with_peers:
                assert transfer["export_arena_bytes"] > 0, "the arena, made at the first send"
            if share_with_peers:
                # The peers copied what was shared on their copy threads, off the loop.
                off_loop = client.run(copies_made_off_the_loop, workers=peers)
                assert all(off_loop.values()), off_loop
        else:
            assert received == 0 and kept_bytes == 0
            assert transfer["sent_host_frames_count"] == transfer["sent_exported_count"] == 0
        # Every value each peer kept reads back intact, on the peer and at the client.
        checks = [
            client.submit(check, f, i, workers=[peers[i % len(peers)]], pure=False)
            for i, f in enumerate(kept)
        ]
        assert client.gather(checks) == [True] * N
        got = client.gather(futures[:4] + kept[-4:])
        assert [x.to_bytes() for x in got] == [data(i) for i in [0, 1, 2, 3, 20, 21, 22, 23]]


def spilled(store, key, i):
    """Value ``i`` stored under ``key`` in ``store`` and spilled to its host tier; its entry,
    and what a peer would be sent of it."""
    from rmm_rs.dask.transfer import HostFrames

    store[key] = make(i)
    assert store.spill(key) == SIZE
    entry: Any = store._device[key]
    return entry, HostFrames.sent_from(entry.header, entry.frames, entry.adopted)


def test_a_value_sent_from_host_memory_is_rebuilt_where_no_store_receives_it():
    import pickle

    from rmm_rs.dask.transfer import HostFrames

    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="16MiB")
    entry, sent = spilled(store, "x", 7)
    assert sent.nbytes == SIZE
    # Pickled (Dask's last resort), it arrives where no store receives it: the value itself.
    back = pickle.loads(pickle.dumps(sent))
    assert check(back, 7)
    # A store takes it as it is, off the device when it does not fit.
    store["y"] = HostFrames(entry.header, entry.frames, sent.data())
    assert check(store["y"], 7)
    store.close()


def test_a_received_value_that_fits_nowhere_goes_on_the_device(caplog):
    from rmm_rs.dask.transfer import HostFrames

    rmm_rs.initialize(None, {"spill": {"enabled": True, "host_pool_size": "4MiB"}})
    store = DeviceStore(device_memory_limit="4MiB")
    store["a"] = make(1)
    store["b"] = make(2)  # over the limit: "a" goes to the host tier, which is full then
    assert (store.tier("a"), store.tier("b")) == ("host", "device")
    entry: Any = store._device["a"]
    parts = HostFrames.sent_from(entry.header, entry.frames, entry.adopted).data()
    # Over the limit and no host room: on the device all the same, said in the log.
    with caplog.at_level("WARNING", logger="rmm_rs.dask.transfer"):
        store["c"] = HostFrames(entry.header, entry.frames, parts)
    assert "kept on the device" in caplog.text
    assert store.tier("c") == "device"
    assert check(store["c"], 1)
    store.close()


def test_over_a_connection_carrying_device_memory_a_spilled_value_goes_as_device_copies():
    from distributed.protocol import deserialize, serialize

    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="16MiB")
    _, sent = spilled(store, "x", 3)
    header, frames = serialize(sent, serializers=("cuda",), on_error="raise")
    # Device frames (what UCX moves device to device); the value itself stayed spilled.
    assert [type(f).__name__ for f in frames] == ["DeviceBuffer"]
    assert store.tier("x") == "host"
    assert check(deserialize(header, frames, deserializers=("cuda",)), 3)
    # Over a host-only connection: host frames, read from the host tier.
    header, frames = serialize(sent, serializers=("dask",), on_error="raise")
    assert [len(memoryview(f)) for f in frames] == [SIZE]
    assert check(deserialize(header, frames, deserializers=("dask",)), 3)
    store.close()


def test_ucx_receives_device_frames_into_rmm_rs_buffers(monkeypatch):
    """distributed-ucxx picks its device receive buffers as it initializes (RAPIDS RMM's
    DeviceBuffer); the store has it use rmm-rs's instead, whether it is initialized yet or
    not. A stand-in module plays distributed_ucxx.ucxx here (CI has no UCX)."""
    import types

    from rmm_rs.dask.transfer import receive_device_frames_into_rmm_rs

    if "distributed_ucxx.ucxx" not in sys.modules:
        assert receive_device_frames_into_rmm_rs(0) is False  # not loaded: nothing to do

    def init_once():
        comm.ucxx = object()
        comm.device_array = lambda n: bytearray(n)  # what it would choose

    comm: Any = types.ModuleType("distributed_ucxx.ucxx")
    comm.ucxx, comm.device_array, comm.init_once = None, None, init_once
    monkeypatch.setitem(sys.modules, "distributed_ucxx.ucxx", comm)
    # Not initialized yet: its initialization is wrapped, and picks rmm-rs's buffers after.
    assert receive_device_frames_into_rmm_rs(0) is True
    chosen = comm.device_array
    assert chosen is None
    comm.init_once()
    b = comm.device_array(1024)
    assert isinstance(b, rmm_rs.DeviceBuffer) and b.size == 1024
    # Once set, asking again changes nothing; initialized already, it is set at once.
    assert receive_device_frames_into_rmm_rs(0) is True
    comm.device_array = lambda n: bytearray(n)
    assert receive_device_frames_into_rmm_rs(0) is True
    assert isinstance(comm.device_array(8), rmm_rs.DeviceBuffer)


def test_replicate_moves_spilled_values_into_the_peers_stores(tmp_path):
    with start(tmp_path, True) as c, Client(c) as client:
        source, peers, futures = made_on_one_worker(client)
        # A client's replicate runs the peers' gather handler: the same way in.
        client.replicate(futures[:8], n=2, workers=[source, peers[0]])
        holders = client.who_has(futures[:8])
        assert all(set(holders[f.key]) == {source, peers[0]} for f in futures[:8]), holders
        kept = client.run(figures, workers=[peers[0]])[peers[0]]
        # Spilled ones came through device memory both workers map (same host).
        assert kept["metrics"]["received_exported_bytes"] > 0, kept
        checks = [
            client.submit(check, f, i, workers=[peers[0]], allow_other_workers=False, pure=False)
            for i, f in enumerate(futures[:8])
        ]
        assert client.gather(checks) == [True] * 8


def test_a_message_bytes_limit_the_user_set_is_left_as_it_is():
    from types import SimpleNamespace

    import dask

    from rmm_rs.dask.transfer import _batch_transfers

    def limit_after(share_with_peers, setting=None):
        worker = SimpleNamespace(state=SimpleNamespace(transfer_message_bytes_limit=50_000_000))
        store = SimpleNamespace(share_with_peers=share_with_peers)
        with dask.config.set(
            {"distributed.worker.transfer.message-bytes-limit": setting or "50MB"}
        ):
            _batch_transfers(worker, store)
        return worker.state.transfer_message_bytes_limit

    assert limit_after(True) == SHARED_MESSAGE_BYTES
    assert limit_after(False) == 50_000_000
    assert limit_after(True, "200MB") == 50_000_000, "a setting the user chose stays"
