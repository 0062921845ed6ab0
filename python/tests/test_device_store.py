"""rmm_rs.dask.DeviceStore in one process, on the simulated device with DeviceBuffer values
(CuPy is absent here; the GPU run adds CuPy and PyTorch)."""

import gc
import os
import pickle
import random
import signal
import subprocess
import sys
import weakref
from types import SimpleNamespace
from typing import List, Tuple, Union

import pytest
from distributed.protocol import deserialize, serialize
from distributed.protocol.cuda import cuda_deserialize, cuda_serialize

import rmm_rs
from rmm_rs import _rmm_rs
from rmm_rs.dask import DeviceStore

MIB = 1 << 20


def data(n, seed):
    return random.Random(seed).randbytes(n)


def store_with(limit="8MiB", host="64MiB", disk=None, pool=None):
    spill = {"enabled": True, "host_pool_size": host}
    if disk is not None:
        spill["disk_directory"] = str(disk)
    config = {"spill": spill}
    if pool is not None:
        config["pool"] = pool
    return DeviceStore(device_memory_limit=limit, config=config)


def put(store, n, size=2 * MIB, seed=0):
    """Stores n DeviceBuffers that nothing else holds; returns their bytes by key."""
    expected = {}
    for i in range(n):
        b = data(size, seed + i)
        store[f"x{i}"] = rmm_rs.DeviceBuffer.from_bytes(b)
        expected[f"x{i}"] = b
    return expected


def test_values_over_the_limit_spill_and_come_back_byte_for_byte():
    store = store_with("8MiB")
    expected = put(store, 10)
    stats = store.statistics()
    assert stats["device_count"] == 4 and stats["host_count"] == 6
    assert stats["device_bytes"] == 8 * MIB and stats["host_bytes"] == 12 * MIB
    assert stats["spill"]["tracked_bytes"] <= 8 * MIB
    # The oldest went first.
    assert [store.tier(f"x{i}") for i in range(10)] == ["host"] * 6 + ["device"] * 4
    for k, b in expected.items():
        v = store[k]
        assert isinstance(v, rmm_rs.DeviceBuffer)
        assert v.to_bytes() == b
        del v
    assert store.statistics()["spill"]["tracked_bytes"] <= 8 * MIB
    assert len(store) == 10 and set(store) == set(expected)


def test_the_store_counts_what_adopting_and_rebuilding_values_cost():
    # statistics()["costs"]: each value stored is adopted once (serialized as it is); each
    # read of a spilled one rebuilds it; a read of one on the device rebuilds nothing.
    store = store_with("8MiB")
    put(store, 10)
    costs = store.statistics()["costs"]
    assert costs["adopted_count"] == 10 and costs["copied_on_adopt_count"] == 0
    assert costs["adopted_seconds"] > 0 and costs["rebuilt_count"] == 0
    assert costs["adopted_bytes"] == 10 * 2 * MIB
    assert store.tier("x9") == "device"
    on_device = store["x9"]  # on the device: nothing rebuilt
    assert store.statistics()["costs"]["rebuilt_count"] == 0
    del on_device
    assert store.tier("x0") == "host"
    v = store["x0"]
    costs = store.statistics()["costs"]
    assert costs["rebuilt_count"] == 1 and costs["rebuilt_seconds"] > 0
    assert costs["rebuilt_bytes"] == 2 * MIB
    del v


def test_a_value_read_back_spills_again_without_a_copy():
    store = store_with("8MiB")
    expected = put(store, 10)
    before = store.statistics()["spill"]
    assert before["spilled_bytes"] == 12 * MIB and before["spilled_without_copy_bytes"] == 0
    # Every value read twice around: each comes back and goes again to make room.
    for _ in range(2):
        for k, b in expected.items():
            assert store[k].to_bytes() == b
    gc.collect()
    after = store.statistics()["spill"]
    # Copied off the device: only the four values that had never left it; every other
    # trip off freed device memory over the host copy kept when the value came back.
    assert after["spilled_bytes"] - before["spilled_bytes"] == 4 * 2 * MIB, after
    assert after["spilled_without_copy_bytes"] >= 10 * 2 * MIB, after
    for k, b in expected.items():
        assert store[k].to_bytes() == b


def test_a_rebuilt_value_is_a_view_of_the_unspilled_data_not_a_copy():
    store = store_with("64MiB")
    expected = put(store, 1)
    assert store.spill("x0") == 2 * MIB
    v = store["x0"]
    spill = store.statistics()["spill"]
    # One allocation came back (the unspill); making the value copied nothing on the device.
    assert spill["unspilled_count"] == 1 and spill["tracked_bytes"] == 2 * MIB
    assert "DeviceBuffer(size=2097152" in repr(v)
    assert v.to_bytes() == expected["x0"]


def test_a_value_held_by_a_task_is_never_spilled():
    store = store_with("4MiB")
    held = rmm_rs.DeviceBuffer.from_bytes(data(3 * MIB, 1))
    store["held"] = held  # `held` stays referenced here, as by a running task
    put(store, 4, seed=10)
    assert store.tier("held") == "device"
    del held
    put(store, 4, seed=20)
    assert store.tier("held") == "host"
    # A rebuilt value in use holds its data on the device too.
    again = store["held"]
    put(store, 4, seed=30)
    assert store.tier("held") == "device"
    assert again.to_bytes() == data(3 * MIB, 1)
    del again
    put(store, 4, seed=40)
    assert store.tier("held") == "host"


def test_one_object_under_two_keys_is_counted_and_spilled_once():
    store = store_with("64MiB")
    b = rmm_rs.DeviceBuffer.from_bytes(data(4 * MIB, 2))
    store["a"] = b
    store["b"] = b
    del b
    assert store.statistics()["spill"]["tracked_bytes"] == 4 * MIB
    assert store.statistics()["device_count"] == 1
    assert store.spill("a") == 4 * MIB
    assert store.tier("b") == "host" and store.spill("b") == 0
    assert store.statistics()["spill"]["tracked_bytes"] == 0
    assert store["a"].to_bytes() == store["b"].to_bytes() == data(4 * MIB, 2)
    del store["a"]
    assert store["b"].to_bytes() == data(4 * MIB, 2)


def test_a_rebuilt_value_stored_again_shares_its_data_and_still_spills():
    store = store_with("64MiB")
    store["b"] = rmm_rs.DeviceBuffer.from_bytes(data(4 * MIB, 3))
    assert store.spill("b") == 4 * MIB
    # A task returning its input: the rebuilt object stored under new keys.
    store["v1"] = store["b"]
    store["v2"] = store["b"]
    stats = store.statistics()
    assert stats["spill"]["tracked_bytes"] == 4 * MIB and stats["device_count"] == 1
    # Nothing holds the rebuilt objects now: the shared data spills once, for every key.
    assert rmm_rs.spill_statistics()[0]["tracked_bytes"] == 4 * MIB
    assert store.spill("v1") == 4 * MIB
    assert [store.tier(k) for k in ("b", "v1", "v2")] == ["host"] * 3
    assert store["v2"].to_bytes() == store["b"].to_bytes() == data(4 * MIB, 3)


class Half:
    """The first half of another object's memory, serialized as a view of it (no copy)."""

    def __init__(self, buf):
        self.buf = buf

    @property
    def __cuda_array_interface__(self):
        whole = self.buf.__cuda_array_interface__
        return dict(whole, shape=(whole["shape"][0] // 2,))


cuda_serialize.register(Half)(lambda x: ({}, [x]))
cuda_deserialize.register(Half)(lambda header, frames: frames[0])  # the half itself


def test_a_piece_of_a_spilled_value_counts_its_own_bytes_when_rebuilt():
    # A task's piece of a rebuilt value shares its data: reading the piece back rebuilds (and
    # counts) the piece's bytes, not the whole value's.
    store = store_with("64MiB")
    store["b"] = rmm_rs.DeviceBuffer.from_bytes(data(4 * MIB, 5))
    assert store.spill("b") == 4 * MIB
    store["h"] = Half(store["b"])
    assert store.statistics()["device_count"] == 1
    assert store.spill("h") == 4 * MIB
    before = store.statistics()["costs"]
    half = store["h"]
    costs = store.statistics()["costs"]
    assert costs["rebuilt_count"] == before["rebuilt_count"] + 1
    assert costs["rebuilt_bytes"] - before["rebuilt_bytes"] == 2 * MIB
    assert half.__cuda_array_interface__["shape"] == (2 * MIB,)


class Whole:
    """Another object over a DeviceBuffer's memory (as two CuPy views of one array are)."""

    def __init__(self, buf):
        self.buf = buf

    @property
    def __cuda_array_interface__(self):
        return self.buf.__cuda_array_interface__


cuda_serialize.register(Whole)(lambda x: ({}, [x]))
cuda_deserialize.register(Whole)(
    lambda header, frames: Whole(rmm_rs.DeviceBuffer.over_view(frames[0]))
)


def test_two_objects_viewing_one_allocation_are_counted_once_and_freed_with_the_last():
    store = store_with("64MiB")
    b = rmm_rs.DeviceBuffer.from_bytes(data(4 * MIB, 4))
    store["v1"] = Whole(b)
    store["v2"] = Whole(b)
    del b
    assert store.statistics()["spill"]["tracked_bytes"] == 4 * MIB
    assert store.statistics()["device_count"] == 2
    assert store.spill("v1") == 0  # v2 still holds the allocation
    assert store.spill("v2") == 4 * MIB
    assert store.statistics()["spill"]["tracked_bytes"] == 0
    for k in ("v1", "v2"):
        v = store[k]
        assert isinstance(v, Whole) and v.buf.to_bytes() == data(4 * MIB, 4)


class Piece:
    """A stretch of a larger DeviceBuffer whose serializer copies it out, as cuDF serializes a
    sliced column (a shuffle's pieces) as a compact copy: the frames are temporaries."""

    def __init__(self, base, offset, nbytes):
        self.base, self.offset, self.nbytes = base, offset, nbytes

    @property
    def __cuda_array_interface__(self):
        ptr = self.base.__cuda_array_interface__["data"][0] + self.offset
        return {"data": (ptr, False), "shape": (self.nbytes,), "typestr": "|u1",
                "strides": None, "version": 3}

    def to_bytes(self):
        return self.base.to_bytes()[self.offset : self.offset + self.nbytes]


def _serialize_piece(x):
    ptr = x.base.__cuda_array_interface__["data"][0] + x.offset
    return {"nbytes": x.nbytes}, [rmm_rs.DeviceBuffer.copy_of_device(ptr, x.nbytes)]


def _deserialize_piece(header, frames):
    (f,) = frames
    buf = f if isinstance(f, rmm_rs.DeviceBuffer) else rmm_rs.DeviceBuffer.over_view(f)
    return Piece(buf, 0, header["nbytes"])


cuda_serialize.register(Piece)(_serialize_piece)
cuda_deserialize.register(Piece)(_deserialize_piece)


def test_a_value_whose_serializer_copies_spills_its_own_data():
    # The store once counted and spilled the serializer's temporary copy: freed at once, its
    # memory reused, and the spill copied the new contents (a cuDF merge's keys came back as
    # garbage). It now keeps the value rebuilt over that copy.
    store = store_with("64MiB", pool={"enabled": True, "initial_size": "128MiB"})
    want = data(4 * MIB, 5)
    base = rmm_rs.DeviceBuffer.from_bytes(want + data(4 * MIB, 6))
    store["piece"] = Piece(base, 0, 4 * MIB)
    assert store.statistics()["spill"]["tracked_bytes"] == 4 * MIB
    del base
    # Work after it reuses whatever memory is free, as the merge's allocations did.
    junk = [rmm_rs.DeviceBuffer.from_bytes(bytes([7]) * (4 * MIB)) for _ in range(4)]
    assert store.spill("piece") == 4 * MIB
    assert store.tier("piece") == "host"
    assert store["piece"].to_bytes() == want
    del junk
    # The value kept is the one rebuilt over the copy (the original's memory is not the store's).
    base = rmm_rs.DeviceBuffer.from_bytes(want)
    piece = Piece(base, 0, 4 * MIB)
    store["again"] = piece
    assert store["again"] is not piece and store["again"].to_bytes() == want


def test_a_value_serialized_as_its_own_memory_is_kept_as_it_is():
    store = store_with("64MiB")
    b = rmm_rs.DeviceBuffer.from_bytes(data(4 * MIB, 7))
    w = Whole(b)
    store["w"] = w
    assert store["w"] is w


def test_collections_of_device_values_are_counted_spilled_and_rebuilt():
    # A shuffle's groups are a dict of frames; a task may return a tuple or list of arrays.
    store = store_with("64MiB", pool={"enabled": True, "initial_size": "128MiB"})
    groups = {i: rmm_rs.DeviceBuffer.from_bytes(data(2 * MIB, 10 + i)) for i in range(3)}
    base = rmm_rs.DeviceBuffer.from_bytes(data(4 * MIB, 20))
    pieces = (Piece(base, 0, MIB), Piece(base, MIB, 2 * MIB))
    store["groups"] = groups
    store["pieces"] = pieces
    # Copying serializers: kept rebuilt over the copies, and read again from the same header.
    assert [p.to_bytes() for p in store["pieces"]] == [p.to_bytes() for p in pieces]
    store["list"] = [rmm_rs.DeviceBuffer.from_bytes(data(MIB, 30))]
    del groups, pieces, base
    assert store.statistics()["device_count"] == 3
    assert store.statistics()["spill"]["tracked_bytes"] == (6 + 3 + 1) * MIB
    for key in ("groups", "pieces", "list"):
        assert store.spill(key) > 0 and store.tier(key) == "host", key
    for _ in range(2):  # each read rebuilds it from the same header
        groups = store["groups"]
        assert sorted(groups) == [0, 1, 2]
        assert all(groups[i].to_bytes() == data(2 * MIB, 10 + i) for i in range(3))
        del groups
    whole = data(4 * MIB, 20)
    for _ in range(2):
        pieces = store["pieces"]
        assert type(pieces) is tuple
        assert [p.to_bytes() for p in pieces] == [whole[:MIB], whole[MIB : 3 * MIB]]
        del pieces
    assert [b.to_bytes() for b in store["list"]] == [data(MIB, 30)]


def test_a_collection_with_a_host_item_stays_in_the_host_store():
    store = store_with("64MiB")
    store["mixed"] = {"a": rmm_rs.DeviceBuffer.from_bytes(data(MIB, 40)), "n": 5}
    store["empty"] = {}
    assert store.tier("mixed") == store.tier("empty") == "host-store"
    assert store.statistics()["device_count"] == 0


def test_cudf_frames_are_left_to_cudfs_own_spilling_when_it_is_on(monkeypatch):
    # A stand-in for cuDF (absent here): its frames' module, and its "spill" option.
    store = store_with("64MiB")
    options = {"spill": True}
    monkeypatch.setitem(sys.modules, "cudf", SimpleNamespace(get_option=options.__getitem__))
    frame = type("DataFrame", (Whole,), {"__module__": "cudf.core.dataframe"})
    cuda_serialize.register(frame)(lambda x: ({}, [x]))
    cuda_deserialize.register(frame)(
        lambda header, frames: frame(rmm_rs.DeviceBuffer.over_view(frames[0]))
    )
    store["df"] = frame(rmm_rs.DeviceBuffer.from_bytes(data(MIB, 50)))
    store["groups"] = {0: frame(rmm_rs.DeviceBuffer.from_bytes(data(MIB, 51)))}
    store["buffer"] = rmm_rs.DeviceBuffer.from_bytes(data(MIB, 52))
    assert [store.tier(k) for k in ("df", "groups", "buffer")] == [
        "host-store", "host-store", "device"
    ]
    assert "cuDF's own spilling is on" in store.unspillable["df"]
    assert store.statistics()["spill"]["tracked_bytes"] == MIB, "cuDF's frames counted once, by cuDF"
    options["spill"] = False
    store["df2"] = frame(rmm_rs.DeviceBuffer.from_bytes(data(MIB, 53)))
    assert store.tier("df2") == "device"
    assert store["df2"].buf.to_bytes() == data(MIB, 53)


class CowOwner:
    """Stands for cuDF's ``BufferOwner``: device memory, and the slices (buffers) viewing it."""

    def __init__(self, mem):
        self.mem = mem
        self.slices: "weakref.WeakSet[CowBuffer]" = weakref.WeakSet()

    @property
    def ptr(self):
        if isinstance(self.mem, rmm_rs.DeviceBuffer):
            return self.mem.ptr
        return self.mem.__cuda_array_interface__["data"][0]


class CowBuffer:
    """Stands for cuDF 26's ``Buffer``, copy-on-write as cuDF makes it: a slice of its owner's
    memory; reading ``__cuda_array_interface__`` is a write access, which first moves a buffer
    whose owner other slices share to a copy of its own; ``ptr`` is a read access."""

    def __init__(self, owner, offset=0, size=None):
        self.owner, self.offset = owner, offset
        self.size = owner.mem.nbytes - offset if size is None else size
        owner.slices.add(self)

    @property
    def ptr(self):
        return self.owner.ptr + self.offset

    @property
    def nbytes(self):
        return self.size

    def copy(self, deep=True):
        if deep:
            return CowBuffer(CowOwner(rmm_rs.DeviceBuffer.copy_of_device(self.ptr, self.size)))
        return CowBuffer(self.owner, self.offset, self.size)

    @property
    def __cuda_array_interface__(self):
        if len(self.owner.slices) > 1:
            moved = CowOwner(rmm_rs.DeviceBuffer.copy_of_device(self.ptr, self.size))
            self.owner.slices.discard(self)
            self.owner, self.offset = moved, 0
            moved.slices.add(self)
        return {"data": (self.ptr, False), "shape": (self.size,), "typestr": "|u1",
                "strides": None, "version": 3}

    def to_bytes(self):
        return rmm_rs.DeviceBuffer.copy_of_device(self.ptr, self.size).to_bytes()


class CowFrame:
    """Stands for a cuDF frame: one column's copy-on-write buffer. Serialized as cuDF 26 does:
    the buffer itself, and ``hasattr(f, "__cuda_array_interface__")`` on it (a write access,
    which moves a shared buffer); rebuilt over a shallow copy of each frame, as cuDF's
    ``ColumnBase.create`` wraps them."""

    __module__ = "cudf.core.dataframe"

    def __init__(self, buf):
        self.buf = buf


class SlicedCowFrame(CowFrame):
    """Stands for a sliced cuDF column: serialized as a compact copy each time."""

    __module__ = "cudf.core.column"


def _cow_frames(frames):
    return {"is-cuda": [hasattr(f, "__cuda_array_interface__") for f in frames]}, frames


@cuda_serialize.register(CowFrame)
def _serialize_cow_frame(x):
    return _cow_frames([x.buf])


@cuda_serialize.register(SlicedCowFrame)
def _serialize_sliced_cow_frame(x):
    return _cow_frames([x.buf.copy(deep=True)])


def _deserialize_cow(kind):
    def rebuild(header, frames):
        (f,) = frames
        buf = f if isinstance(f, CowBuffer) else CowBuffer(CowOwner(f))
        return kind(buf.copy(deep=False))

    return rebuild


cuda_deserialize.register(CowFrame)(_deserialize_cow(CowFrame))
cuda_deserialize.register(SlicedCowFrame)(_deserialize_cow(SlicedCowFrame))


@pytest.fixture
def copy_on_write(monkeypatch):
    """cuDF's buffer type, as the store finds it (cuDF itself is absent here)."""
    monkeypatch.setitem(sys.modules, "cudf.core.buffer", SimpleNamespace(Buffer=CowBuffer))


def cow_frame(n, seed, kind=CowFrame):
    return kind(CowBuffer(CowOwner(rmm_rs.DeviceBuffer.from_bytes(data(n, seed)))))


def test_a_sliced_cudf_column_kept_over_its_compact_copy_spills_its_own_bytes(copy_on_write):
    # The value is kept rebuilt over its serializer's compact copy, whose buffers then share
    # their memory with the rebuilt value's slices: reading their __cuda_array_interface__
    # moved them to temporaries, whose addresses the store adopted and which were freed at
    # once (the likely cause of a cuDF merge's garbage keys).
    store = store_with("64MiB", pool={"enabled": True, "initial_size": "128MiB"})
    store["s"] = cow_frame(4 * MIB, 62, SlicedCowFrame)
    gc.collect()
    junk = [rmm_rs.DeviceBuffer.from_bytes(bytes([7]) * (4 * MIB)) for _ in range(4)]
    assert store.spill("s") == 4 * MIB
    assert store["s"].buf.to_bytes() == data(4 * MIB, 62)
    del junk


def test_a_stored_cudf_value_sent_or_stored_again_is_not_copied(copy_on_write):
    # What holds the adopted memory must not make cuDF's serializer move the value's buffers
    # (a send serializes the value; a shuffle stores a stored dict's item again).
    store = store_with("64MiB")
    store["f"] = cow_frame(4 * MIB, 63)
    store["g"] = {i: cow_frame(4 * MIB, 64 + i) for i in range(2)}
    gc.collect()
    before = rmm_rs.device_statistics()[0]["bytes_in_use"]
    value = store["f"]
    serialize(value, serializers=("cuda",))
    store["g0"] = store["g"][0]
    del value
    gc.collect()
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == before, "a buffer was copied"
    assert store.spill("f") == 4 * MIB and store["f"].buf.to_bytes() == data(4 * MIB, 63)


def test_a_stored_buffer_moved_by_copy_on_write_spills_its_stored_bytes(copy_on_write):
    # A task wrote through a stored frame's buffer while a shallow slice of it lived: cuDF moved
    # the buffer to a copy, and the memory the store adopted went free with the slice. A spill
    # then copied whatever reused it (a cuDF merge's keys came back as garbage).
    store = store_with("64MiB", pool={"enabled": True, "initial_size": "128MiB"})
    want = data(4 * MIB, 61)
    frame = cow_frame(4 * MIB, 61)
    store["f"] = frame
    at = frame.buf.ptr
    shallow = frame.buf.copy(deep=False)
    frame.buf.__cuda_array_interface__  # the task's write access
    assert frame.buf.ptr != at, "copy-on-write moved the frame's buffer"
    del shallow, frame
    gc.collect()
    junk = [rmm_rs.DeviceBuffer.from_bytes(bytes([7]) * (4 * MIB)) for _ in range(4)]
    assert store.spill("f") == 4 * MIB and store.tier("f") == "host"
    assert store["f"].buf.to_bytes() == want
    del junk


def test_host_values_go_to_the_host_store():
    store = store_with()
    store["h"] = b"on the host"
    store["n"] = [1, 2, 3]
    assert store.tier("h") == "host-store" and store["n"] == [1, 2, 3]
    assert store.statistics()["host_store_count"] == 2
    del store["h"]
    assert "h" not in store and len(store) == 1


def open_files_in(directory, pid=None):
    """How many files process ``pid`` (this one) holds open in ``directory``: spill files,
    which have no name there."""
    fds = f"/proc/{os.getpid() if pid is None else pid}/fd"
    directory = os.path.realpath(directory)
    count = 0
    for fd in os.listdir(fds):
        try:
            target = os.readlink(os.path.join(fds, fd))
        except OSError:
            continue
        count += os.path.dirname(target) == directory
    return count


def test_past_the_host_pool_values_go_to_disk_and_nothing_stays_there(tmp_path):
    store = store_with("4MiB", host="8MiB", disk=tmp_path)
    expected = put(store, 12)
    tiers = [store.tier(k) for k in expected]
    assert tiers.count("disk") >= 4 and tiers.count("host") >= 1, tiers
    # On disk in files without a name: none that the process could leave behind.
    assert open_files_in(tmp_path) == tiers.count("disk")
    assert os.listdir(tmp_path) == []
    for k, b in expected.items():
        assert store[k].to_bytes() == b
    store.clear()
    gc.collect()
    assert open_files_in(tmp_path) == 0
    assert os.listdir(tmp_path) == []


SPILLING_CHILD = """
import os, sys, time
import rmm_rs
rmm_rs.initialize(
    {"spill": {"enabled": True, "host_pool_size": "1MiB", "disk_directory": sys.argv[1]}}
)
buffers = [rmm_rs.SpillableBuffer(os.urandom(2 << 20)) for _ in range(4)]
for b in buffers:
    b.spill()
print(",".join(b.tier for b in buffers), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_process_killed_with_data_on_disk_leaves_no_spill_file(tmp_path, sig):
    child = subprocess.Popen(
        [sys.executable, "-c", SPILLING_CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RMM_BACKEND": "sim"},
    )
    try:
        assert child.stdout is not None
        tiers = child.stdout.readline().strip().split(",")
        assert "disk" in tiers, tiers
        # One file per buffer on disk (without a name: only open in the process).
        files = open_files_in(tmp_path, child.pid) + len(os.listdir(tmp_path))
        assert files == tiers.count("disk"), tiers
        child.send_signal(sig)
        assert child.wait(60) == -sig
    finally:
        child.kill()
        child.wait()
    assert os.listdir(tmp_path) == []


def test_a_full_host_pool_without_disk_keeps_values_on_the_device_and_says_so():
    store = store_with("2MiB", host="4MiB")
    expected = put(store, 4)
    tiers = [store.tier(k) for k in expected]
    assert tiers.count("host") == 2 and tiers.count("device") == 2
    with pytest.raises(rmm_rs.RmmError, match="host"):
        store.spill("x3")
    assert store.tier("x3") == "device"
    for k, b in expected.items():
        assert store[k].to_bytes() == b


def test_values_survive_reinitialize_into_a_pool():
    store = store_with("64MiB")
    expected = put(store, 5)
    report = rmm_rs.reinitialize(
        {"spill": {"enabled": True}, "pool": {"enabled": True, "initial_size": "64MiB"}}
    )
    assert report["spilled_bytes"] == 10 * MIB
    assert "PoolMemoryResource" in rmm_rs.device_statistics()[0]["stack"]
    # The store's limit stays in force across the reinitialize.
    assert rmm_rs.spill_statistics()[0]["limit"] == 64 * MIB
    for k, b in expected.items():
        assert store[k].to_bytes() == b


def test_an_out_of_memory_allocation_spills_store_values_first():
    # A pool that cannot grow past 32 MiB, a store limit above it: only running out spills.
    store = store_with("1GiB", pool={"enabled": True, "initial_size": "32MiB",
                                     "maximum_size": "32MiB"})
    expected = put(store, 12)  # 24 MiB of values
    assert all(store.tier(k) == "device" for k in expected)
    big = rmm_rs.DeviceBuffer(16 * MIB)
    assert big.size == 16 * MIB
    assert any(store.tier(k) == "host" for k in expected)
    for k, b in expected.items():
        assert store[k].to_bytes() == b


def test_the_store_needs_spilling_and_a_valid_limit():
    rmm_rs.initialize({"spill": {"enabled": False}})
    with pytest.raises(rmm_rs.RmmError, match="spill.enabled"):
        DeviceStore()
    rmm_rs.finalize()
    with pytest.raises(rmm_rs.RmmError, match='"80%"'):
        DeviceStore(device_memory_limit="lots", config={"spill": {"enabled": True}})


def test_factory_is_daskcudas_data_form():
    cls, kwargs = DeviceStore.factory(device_memory_limit="1GB", memory_limit="2GB")
    assert cls is DeviceStore and kwargs["device_memory_limit"] == "1GB"
    assert pickle.loads(pickle.dumps((cls, kwargs))) == (cls, kwargs)


def test_buffers_pickle_and_serialize_with_every_family():
    rmm_rs.initialize({"spill": {"enabled": True}})
    b = rmm_rs.DeviceBuffer.from_bytes(b"device bytes")
    assert pickle.loads(pickle.dumps(b)).to_bytes() == b"device bytes"
    s = rmm_rs.SpillableBuffer(b"spillable bytes")
    s2 = pickle.loads(pickle.dumps(s))
    assert isinstance(s2, rmm_rs.SpillableBuffer) and s2.to_bytes() == b"spillable bytes"
    for family in ("cuda", "dask", "pickle"):
        for x, raw in ((b, b"device bytes"), (s, b"spillable bytes")):
            header, frames = serialize(x, serializers=(family,), on_error="raise")
            y = deserialize(header, frames, deserializers=(family,))
            assert type(y) is type(x) and y.to_bytes() == raw, family


class Opaque:
    """A device object Dask has no serializer for."""

    def __init__(self, buf):
        self.buf = buf

    @property
    def __cuda_array_interface__(self):
        return self.buf.__cuda_array_interface__


def test_a_value_that_cannot_be_serialized_stays_as_it_is_and_is_named():
    store = store_with("1MiB")
    value = Opaque(rmm_rs.DeviceBuffer.from_bytes(data(2 * MIB, 5)))
    store["opaque"] = value
    assert store["opaque"] is value
    assert store.tier("opaque") == "host-store"
    assert "Opaque" in store.unspillable["opaque"]
    put(store, 2)  # pressure spills the others, never it
    assert store["opaque"].buf.to_bytes() == data(2 * MIB, 5)
    del store["opaque"]
    assert store.unspillable == {}


def test_a_new_store_registers_dasks_cupy_serializer_before_the_first_value():
    # Dask registers it lazily, on the first CuPy value it serializes: importing it then
    # (about a second) would hold up the worker's event loop under the first value stored.
    pytest.importorskip("cupy", reason="CuPy is not installed")
    # distributed.protocol.cupy imports Numba: without it Dask has no CuPy serializer at all.
    pytest.importorskip("numba", reason="Numba is not installed (Dask's CuPy serializer needs it)")
    import subprocess
    import sys

    code = """
from distributed.protocol.cuda import cuda_serialize
assert "cupy" in cuda_serialize._lazy, "Dask no longer registers CuPy lazily"
from rmm_rs.dask import DeviceStore
DeviceStore(device_memory_limit="8MiB", config={"spill": {"enabled": True, "host_pool_size": "64MiB"}})
assert "cupy" not in cuda_serialize._lazy, cuda_serialize._lazy
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def device_memory():
    """The total memory of device 0 (a store with limit 0 spills nothing: its limit is the whole
    device); leaves rmm_rs finalized."""
    rmm_rs.finalize()
    total = DeviceStore(device_memory_limit=0, config={"spill": {"enabled": True}}).limit
    rmm_rs.finalize()
    return total


def test_a_limit_larger_than_the_device_is_refused_with_the_device_size_and_remedy():
    total = device_memory()
    config = {"spill": {"enabled": True}}
    cases: List[Tuple[Union[int, str], str]] = [
        ("1PB", "device_memory_limit = 1PB"),
        # 2**63 bytes and more are bytes, not "a fraction of device memory".
        (2**63, "device_memory_limit = 8192PiB"),
        # Just above the device: refused however it is written out.
        (total + (512 << 20), "device_memory_limit = "),
    ]
    for limit, named in cases:
        with pytest.raises(rmm_rs.RmmError) as raised:
            DeviceStore(device_memory_limit=limit, config=config)
        text = str(raised.value)
        assert named in text and "larger than device 0's " in text, text
        assert '"90%"' in text and "fraction of device memory" not in text, text
        # The limit in force is untouched.
        with pytest.raises(rmm_rs.RmmError, match="larger than device 0's "):
            _rmm_rs.set_device_memory_limit(limit)
        assert rmm_rs.spill_statistics()[0]["limit"] == int(0.8 * total) // 256 * 256
    with pytest.raises(rmm_rs.RmmError, match="cannot exceed 16 EiB"):
        _rmm_rs.set_device_memory_limit(2**64)
    with pytest.raises(rmm_rs.RmmError, match="whole number above 1"):
        _rmm_rs.set_device_memory_limit(8e9)


def test_a_limit_of_zero_means_no_spilling_as_in_dask_cuda():
    total = device_memory()
    for zero in (0, "0", 0.0, "0GB"):
        rmm_rs.finalize()
        store = DeviceStore(device_memory_limit=zero, config={"spill": {"enabled": True}})
        # The whole device: nothing spills before it is full.
        assert store.limit == rmm_rs.spill_statistics()[0]["limit"] == total
        expected = put(store, 8, size=4 * MIB)
        assert [store.tier(k) for k in expected] == ["device"] * 8
        store.clear()
