"""A spilled value sent to an rmm-rs worker of the same host through device memory both
processes map (rmm_rs.dask.transfer), in one process: its message carries descriptors, not
bytes; it is rebuilt where no store receives it and kept as it came where one does; the
sender's memory goes back once released; and a peer is sent descriptors only when it can map
this worker's memory (same host, same backend, this GPU visible), asked once per peer. A
value in its own memory is staged by a copy on the device and does not move."""

import asyncio
import random
from types import SimpleNamespace
from typing import Any, Dict

import pytest

import rmm_rs
from rmm_rs import _rmm_rs
from rmm_rs.dask import DeviceStore
from rmm_rs.dask import transfer
from rmm_rs.dask.transfer import HostFrames

MIB = 1 << 20
SIZE = 4 * MIB


def data(i):
    return random.Random(i).randbytes(SIZE)


def _spilled_and_sent(store, key, i):
    """Value ``i`` stored under ``key`` and spilled, serialized for a peer that maps this
    worker's memory: the message's header and frames, and the leases holding the memory."""
    store[key] = rmm_rs.DeviceBuffer.from_bytes(data(i))
    assert store.spill(key) == SIZE
    entry: Any = store._device[key]
    sent = HostFrames.sent_from(entry.header, entry.frames, entry.adopted)
    leases: list = []
    token = transfer._EXPORTS.set(leases)
    try:
        header, frames = transfer._serialize_host_frames(sent)
    finally:
        transfer._EXPORTS.reset(token)
    return sent, header, frames, leases


def test_a_spilled_value_travels_as_descriptors_and_its_memory_goes_back():
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="16MiB")
    sent, header, frames, leases = _spilled_and_sent(store, "x", 3)
    assert header["exported"] and len(leases) == 1
    assert sum(len(f) for f in frames) < 1024, "descriptors, not the value's bytes"
    assert _rmm_rs.exported_bytes(0) == SIZE
    assert transfer.figures()["sent_exported_bytes"] >= SIZE

    # Where no store receives it: the value itself, its bytes copied from the memory.
    back = transfer._deserialize_host_frames(header, frames)
    assert isinstance(back, rmm_rs.DeviceBuffer) and back.to_bytes() == data(3)
    # Where a store receives it: kept by the store as it came, then read back intact.
    token = transfer._RECEIVING.set(store)
    try:
        arrived = transfer._deserialize_host_frames(header, frames)
    finally:
        transfer._RECEIVING.reset(token)
    assert isinstance(arrived, HostFrames) and arrived.kept is not None
    store["y"] = arrived
    assert store["y"].to_bytes() == data(3)

    leases[0].release()
    assert _rmm_rs.exported_bytes(0) == 0
    assert "released" in repr(leases[0])
    # Without a peer that maps the memory, the same value goes as host frames.
    header, frames = transfer._serialize_host_frames(sent)
    assert not header.get("exported") and sum(memoryview(f).nbytes for f in frames) >= SIZE
    store.close()


def test_a_value_in_its_own_memory_is_staged_on_the_device_for_the_peer():
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="16MiB")
    store["x"] = rmm_rs.DeviceBuffer.from_bytes(data(5))
    assert store.tier("x") == "device"
    leases: list = []
    tokens = (transfer._SENDING.set(True), transfer._EXPORTS.set(leases))
    try:
        sent = store["x"]
        assert isinstance(sent, HostFrames) and sent.exported is not None
        header, frames = transfer._serialize_host_frames(sent)
    finally:
        transfer._EXPORTS.reset(tokens[1])
        transfer._SENDING.reset(tokens[0])
    assert store.tier("x") == "device", "the value itself does not move"
    assert header["exported"] and _rmm_rs.exported_bytes(0) == SIZE
    back = transfer._deserialize_host_frames(header, frames)
    assert back.to_bytes() == data(5)
    for lease in leases:
        lease.release()
    assert _rmm_rs.exported_bytes(0) == 0
    # Sending to a peer that does not map this worker's memory: the value as it is.
    token = transfer._SENDING.set(True)
    try:
        assert isinstance(store["x"], rmm_rs.DeviceBuffer)
    finally:
        transfer._SENDING.reset(token)
    # A small value goes as it is even to a peer that maps this worker's memory.
    store["small"] = rmm_rs.DeviceBuffer.from_bytes(b"x" * (transfer.SHARE_FROM - 256))
    tokens = (transfer._SENDING.set(True), transfer._EXPORTS.set(leases))
    try:
        assert isinstance(store["small"], rmm_rs.DeviceBuffer)
    finally:
        transfer._EXPORTS.reset(tokens[1])
        transfer._SENDING.reset(tokens[0])
    assert _rmm_rs.exported_bytes(0) == 0
    store.close()


class _Peer:
    """A peer answering the identity call as this process would, with ``change`` applied."""

    def __init__(self, change=None, fail=None):
        self.change = change or {}
        self.fail = fail
        self.calls = 0

    async def rmm_rs_ipc_identity(self, probe=None):
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return {**transfer._identity(probe=probe), **self.change}


def _maps(peer: _Peer, known: Dict[str, Any]) -> bool:
    worker = SimpleNamespace(rpc=lambda who: peer, _rmm_rs_peers_map_exports=known)
    store = SimpleNamespace(device_id=0)
    return asyncio.run(transfer._peer_maps_exports(worker, store, "tcp://peer:1"))


@pytest.mark.parametrize(
    "change, maps",
    [
        ({}, True),
        ({"host": "another-host"}, False),
        ({"pid_namespace": "pid:[1]"}, False),
        ({"backend": "another-backend"}, False),
        ({"devices": ["GPU-not-this-one"]}, False),
        ({"probe": b"not what was staged"}, False),
    ],
    ids=["same-host", "other-host", "other-pid-namespace", "other-backend", "gpu-not-visible",
         "probe-not-read-back"],
)
def test_a_peer_is_sent_descriptors_only_when_it_can_map_this_workers_memory(change, maps):
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    mine = dict(_rmm_rs.ipc_identity())
    assert mine["host"] and mine["backend"] in ("sim", "cuda") and mine["devices"]
    peer = _Peer(change)
    known: Dict[str, Any] = {}
    assert _maps(peer, known) is maps
    # Asked once (a no for a minute): the answer is kept for the peer.
    assert _maps(peer, known) is maps and peer.calls == 1
    # The staged probe went back.
    assert _rmm_rs.exported_bytes(0) == 0
    if not maps:
        ok, since = known["tcp://peer:1"]
        known["tcp://peer:1"] = (ok, since - transfer._RETRY_AFTER_S)
        assert _maps(peer, known) is maps and peer.calls == 2, "asked again after a minute"


def test_a_peer_that_does_not_answer_is_sent_bytes():
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    assert _maps(_Peer(fail=KeyError("rmm_rs_ipc_identity")), {}) is False
    assert _rmm_rs.exported_bytes(0) == 0


def test_a_value_whose_shared_memory_cannot_be_read_fails_as_a_connection_error():
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="16MiB")
    _, header, frames, leases = _spilled_and_sent(store, "x", 9)
    for lease in leases:
        lease.release()
    # A garbled descriptor stands for memory this worker cannot map.
    n_host = sum(1 for f in header["layout"] if f is None)
    garbled = [*frames[:n_host], *(b"\0" * len(f) for f in frames[n_host:])]
    token = transfer._RECEIVING.set(store)
    try:
        with pytest.raises(OSError, match="shared device memory cannot be read"):
            transfer._deserialize_host_frames(header, garbled)
    finally:
        transfer._RECEIVING.reset(token)
    store.close()


class _Comm:
    """A connection whose read deserializes the messages it is given, as Dask's do."""

    def __init__(self, messages):
        self.messages = list(messages)

    async def read(self, deserializers=None):
        header, frames = self.messages.pop(0)
        return {"status": "OK", "data": {"x": transfer._deserialize_host_frames(header, frames)}}


def test_a_worker_reading_a_peers_answer_copies_shared_values_off_its_event_loop():
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="16MiB")
    _, header, frames, leases = _spilled_and_sent(store, "x", 11)
    n_host = sum(1 for f in header["layout"] if f is None)
    garbled = [*frames[:n_host], *(b"\0" * len(f) for f in frames[n_host:])]
    comm = transfer._reading_copies_off_the_loop(_Comm([(header, frames), (header, garbled)]))
    assert transfer._reading_copies_off_the_loop(comm) is comm, "wrapped once"

    async def receive():
        token = transfer._RECEIVING.set(store)
        try:
            msg = await comm.read()
            with pytest.raises(OSError, match="shared device memory cannot be read"):
                await comm.read()
            return msg
        finally:
            transfer._RECEIVING.reset(token)

    msg = asyncio.run(receive())
    arrived = msg["data"]["x"]
    # Filled once the copy ended, before the read returned: kept by the store's manager.
    assert isinstance(arrived, HostFrames) and arrived.kept is not None
    store["y"] = arrived
    assert store["y"].to_bytes() == data(11)
    assert transfer._COPIERS is not None, "copied on the copy threads"
    for lease in leases:
        lease.release()
    store.close()


class _FailingComm:
    """A connection whose read starts the copies of a shared value, then fails."""

    def __init__(self, message, error):
        self.message, self.error, self.aborted = message, error, False

    async def read(self, deserializers=None):
        transfer._deserialize_host_frames(*self.message)
        raise self.error

    def abort(self):
        self.aborted = True


@pytest.mark.parametrize("error", [RuntimeError("cut short"), OSError("closed")])
def test_a_failed_read_waits_for_its_copies_and_leaves_a_cut_connection_unusable(error):
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    store = DeviceStore(device_memory_limit="16MiB")
    _, header, frames, leases = _spilled_and_sent(store, "x", 12)
    comm = _FailingComm((header, frames), error)
    transfer._reading_copies_off_the_loop(comm)
    copied = []

    async def receive():
        before = transfer.figures()["received_exported_count"]
        token = transfer._RECEIVING.set(store)
        try:
            with pytest.raises(type(error)):
                await comm.read()
        finally:
            transfer._RECEIVING.reset(token)
        # The copy the read started had ended (and been counted) by the time it raised.
        copied.append(transfer.figures()["received_exported_count"] - before)

    asyncio.run(receive())
    assert copied == [1]
    # Dask closes a connection whose read raised an OSError; others are aborted here.
    assert comm.aborted is (not isinstance(error, OSError))
    for lease in leases:
        lease.release()
    store.close()


def test_a_peer_leaving_has_the_worker_unmap_gone_peers_soon(monkeypatch):
    removed, swept = [], []
    worker = SimpleNamespace(stream_handlers={"remove-worker": lambda **kw: removed.append(kw)})
    monkeypatch.setattr(transfer, "_FORGET_AFTER_S", (0.0, 0.01))
    monkeypatch.setattr(transfer, "_forget_gone_peers", lambda: swept.append(1))
    transfer._forget_peers_that_leave(worker)
    transfer._forget_peers_that_leave(worker)  # once per worker

    async def leave():
        worker.stream_handlers["remove-worker"](worker="tcp://peer:1", stimulus_id="s")
        await asyncio.sleep(0.05)

    asyncio.run(leave())
    assert removed == [{"worker": "tcp://peer:1", "stimulus_id": "s"}], "Dask's handler ran"
    assert swept == [1, 1], "a sweep after each delay"
    rmm_rs.initialize(None, {"spill": {"enabled": True}})
    assert _rmm_rs.forget_gone_peers() == 0, "nothing mapped here"
