"""DeviceBuffer with RAPIDS RMM's API: nbytes, capacity, tobytes, copy_to_host,
copy_from_device, copy, to_device, resize, reserve, prefetch, stream=."""

import pickle
import threading

import pytest

import rmm_rs


def test_device_buffer_has_rmms_properties_and_copies():
    rmm_rs.initialize({})
    data = bytes(range(256)) * 4
    buf = rmm_rs.DeviceBuffer.to_device(data)
    assert buf.nbytes == buf.size == len(data) == buf.capacity()
    assert isinstance(buf.ptr, int) and buf.ptr
    assert buf.tobytes() == data == buf.tobytes(stream=0)
    host = buf.copy_to_host()
    assert isinstance(host, bytearray) and host == data
    target = bytearray(len(data) + 10)
    assert buf.copy_to_host(target) is target
    assert target[: len(data)] == data and target[len(data) :] == bytes(10)
    mv = memoryview(bytearray(len(data)))
    buf.copy_to_host(mv, stream=None)
    assert mv.tobytes() == data
    other = buf.copy()
    assert other.ptr != buf.ptr and other.tobytes() == data
    buf.copy_from_host(bytes(len(data)))
    assert other.tobytes() == data and buf.tobytes() == bytes(len(data))
    buf.copy_from_device(other)
    assert buf.tobytes() == data
    buf.prefetch()
    assert rmm_rs.DeviceBuffer().size == 0
    assert rmm_rs.DeviceBuffer(size=16, stream=0).nbytes == 16


def test_device_buffer_copy_errors_are_clear():
    rmm_rs.initialize({})
    buf = rmm_rs.DeviceBuffer(64)
    with pytest.raises(rmm_rs.RmmError, match="read-only"):
        buf.copy_to_host(b"x" * 64)
    with pytest.raises(rmm_rs.RmmError, match="holds 8 bytes but the DeviceBuffer has 64"):
        buf.copy_to_host(bytearray(8))
    with pytest.raises(rmm_rs.RmmError, match="__cuda_array_interface__"):
        buf.copy_from_device(b"not on a device")
    with pytest.raises(rmm_rs.RmmError, match="give at most its size"):
        buf.copy_from_device(rmm_rs.DeviceBuffer(65))
    buf.copy_from_host(bytes(64))
    buf.copy_from_device(rmm_rs.DeviceBuffer.to_device(b"abc"))
    assert buf.tobytes() == b"abc" + bytes(61)
    with pytest.raises(rmm_rs.RmmError, match="stream='s': expected None or an int"):
        buf.tobytes(stream="s")  # type: ignore[arg-type]

    class NoData:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "|u1", "version": 3}

    with pytest.raises(
        rmm_rs.RmmError,
        match=r"no data; the object does not follow the CUDA Array Interface \(version 3\)",
    ):
        buf.copy_from_device(NoData())
    buf.free()
    with pytest.raises(rmm_rs.RmmError, match=r"was freed \(free\(\) was called\): make a new"):
        _ = buf.size


def test_resize_keeps_the_first_bytes_and_reserve_the_contents():
    rmm_rs.initialize({})
    data = bytes(range(100))
    buf = rmm_rs.DeviceBuffer.to_device(data)
    buf.reserve(1000)
    assert buf.capacity() >= 1000 and buf.size == 100 and buf.tobytes() == data
    ptr = buf.ptr
    buf.resize(500)
    assert buf.ptr == ptr, "within the capacity nothing moves"
    assert buf.size == 500 and buf.tobytes()[:100] == data
    buf.resize(40)
    assert buf.tobytes() == data[:40]
    buf.resize(5000, stream=0)
    assert buf.size == 5000 and buf.tobytes()[:40] == data[:40]


def test_resize_of_a_buffer_over_a_view_copies_it():
    rmm_rs.initialize({"spill": {"enabled": True}})
    sb = rmm_rs.SpillableBuffer(bytes(range(64)))
    buf = rmm_rs.DeviceBuffer.over_view(sb.device_view())
    buf.resize(128)
    assert buf.size == 128 and buf.tobytes()[:64] == bytes(range(64))
    buf2 = rmm_rs.DeviceBuffer.over_view(sb.device_view())
    buf2.reserve(256)
    assert buf2.capacity() >= 256 and buf2.tobytes() == bytes(range(64))


def test_existing_buffer_api_still_works():
    rmm_rs.initialize({})
    buf = rmm_rs.DeviceBuffer.from_bytes(b"abc")
    assert pickle.loads(pickle.dumps(buf)).to_bytes() == b"abc"
    assert rmm_rs.DeviceBuffer.copy_of_device(buf.ptr, 3).to_bytes() == b"abc"




class Blocking:
    """A device array whose ``__cuda_array_interface__`` holds the reader until released: a
    ``copy_from_device`` reading it is under way on its buffer, for certain, while another
    thread uses the same buffer."""

    def __init__(self, source):
        self.source = source
        self.entered = threading.Event()
        self.release = threading.Event()

    @property
    def __cuda_array_interface__(self):
        self.entered.set()
        assert self.release.wait(60), "never released"
        return self.source.__cuda_array_interface__


def during_a_copy_into(buf, source, call):
    """Runs ``call(buf)`` in this thread while another thread's
    ``buf.copy_from_device(source)`` is under way; returns what each raised (or None)."""
    blocking = Blocking(source)
    raised = {}

    def copy():
        try:
            buf.copy_from_device(blocking)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            raised["copy"] = e

    t = threading.Thread(target=copy)
    t.start()
    try:
        assert blocking.entered.wait(60)
        try:
            call(buf)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            raised["call"] = e
    finally:
        blocking.release.set()
        t.join(60)
    assert not t.is_alive()
    return raised.get("call"), raised.get("copy")


def test_two_threads_on_one_buffer_take_turns_or_hear_it_was_freed():
    rmm_rs.initialize({})
    source = rmm_rs.DeviceBuffer.from_bytes(bytes(range(64)))
    # free() while another thread's call is under way: no "Already borrowed"; the other call
    # then finds the buffer freed and says so.
    buf = rmm_rs.DeviceBuffer(64)
    call, copy = during_a_copy_into(buf, source, lambda b: b.free())
    assert call is None, repr(call)
    assert isinstance(copy, rmm_rs.RmmError) and "was freed" in str(copy), repr(copy)
    # Changing calls take turns with it: the copy lands in the resized buffer.
    buf = rmm_rs.DeviceBuffer.from_bytes(bytes(32))
    call, copy = during_a_copy_into(buf, source, lambda b: b.resize(128))
    assert (call, copy) == (None, None), (call, copy)
    assert buf.size == 128 and buf.to_bytes()[:64] == bytes(range(64))
    # And every other method too.
    calls = [
        lambda b: b.reserve(256),
        lambda b: b.to_bytes(),
        lambda b: b.copy_from_host(bytes(8)),
        lambda b: b.copy(),
        lambda b: (b.size, b.ptr, b.capacity(), repr(b), b.__cuda_array_interface__),
    ]
    for f in calls:
        buf = rmm_rs.DeviceBuffer(64)
        assert during_a_copy_into(buf, source, f) == (None, None)
        assert buf.to_bytes() == bytes(range(64))



def test_rmms_constructor_copies_device_bytes_from_ptr_and_refuses_a_resource():
    rmm_rs.initialize({})
    data = bytes(range(200)) * 5
    src = rmm_rs.DeviceBuffer.to_device(data)
    # RMM's form: keywords only, ptr and size.
    copy = rmm_rs.DeviceBuffer(ptr=src.ptr, size=len(data))
    assert copy.ptr != src.ptr and copy.tobytes() == data
    src.copy_from_host(bytes(len(data)))
    assert copy.tobytes() == data, "a copy, not a view of ptr"
    assert rmm_rs.DeviceBuffer(ptr=src.ptr, size=0).size == 0
    assert rmm_rs.DeviceBuffer(ptr=0, size=8).size == 8  # RMM's ptr=0: uninitialized bytes
    with pytest.raises(rmm_rs.RmmError, match=r"DeviceBuffer\(ptr=0x[0-9a-f]+, size=64\).*to_device"):
        rmm_rs.DeviceBuffer(ptr=12345, size=64)  # not device memory
    with pytest.raises(TypeError, match="mr=.*leave mr out"):
        rmm_rs.DeviceBuffer(size=8, mr=object())  # type: ignore[arg-type]
    assert rmm_rs.DeviceBuffer(size=8, mr=None).size == 8
