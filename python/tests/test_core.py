"""initialize / reinitialize / finalize, statistics, buffers and errors."""

import pytest

import rmm_rs

POOLED = {"pool": {"enabled": True, "initial_size": "64MiB"}, "spill": {"enabled": True}}


def test_initialize_from_a_dict_builds_the_stack_and_counts():
    rmm_rs.initialize(POOLED)
    assert rmm_rs.is_initialized()
    assert rmm_rs.devices() == [0]
    stats = rmm_rs.device_statistics()[0]
    assert "PoolMemoryResource" in stats["stack"]
    assert stats["reserved_bytes"] == 64 << 20
    buf = rmm_rs.DeviceBuffer(1 << 20)
    stats = rmm_rs.device_statistics()[0]
    assert stats["bytes_in_use"] == 1 << 20
    assert stats["allocations_in_use"] == 1
    buf.free()
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 0
    assert rmm_rs.device_statistics()[0]["total_allocations"] == 1


def test_initialize_from_an_rmm_toml_path(tmp_path):
    path = tmp_path / "rmm.toml"
    path.write_text('[pool]\nenabled = true\ninitial_size = "32MiB"\n')
    rmm_rs.initialize(str(path))
    assert rmm_rs.device_statistics()[0]["reserved_bytes"] == 32 << 20
    rmm_rs.finalize()
    rmm_rs.initialize(path)  # a pathlib.Path works too
    assert rmm_rs.is_initialized()


def test_nested_and_dotted_keys_are_the_same_settings():
    a = rmm_rs.describe({"pool": {"enabled": True, "initial_size": "16MiB"}})
    b = rmm_rs.describe({"pool.enabled": True, "pool.initial_size": "16MiB"})
    assert a == b and "PoolMemoryResource" in a


def test_device_buffer_round_trips_and_exposes_the_cuda_array_interface():
    rmm_rs.initialize(POOLED)
    data = bytes(range(256)) * 17
    buf = rmm_rs.DeviceBuffer.from_bytes(data)
    assert len(buf) == buf.size == len(data)
    assert buf.to_bytes() == data
    cai = buf.__cuda_array_interface__
    assert cai["shape"] == (len(data),)
    assert cai["typestr"] == "|u1"
    assert cai["data"] == (buf.ptr, False)
    assert cai["version"] == 3
    buf.copy_from_host(bytes(len(data)))
    assert buf.to_bytes() == bytes(len(data))
    buf.copy_from_host(b"short")  # fills the first bytes, as in RAPIDS RMM
    assert buf.to_bytes() == b"short" + bytes(len(data) - 5)
    with pytest.raises(rmm_rs.RmmError, match="give at most its size"):
        buf.copy_from_host(bytes(len(data) + 1))
    buf.free()
    with pytest.raises(rmm_rs.RmmError, match="was freed"):
        buf.to_bytes()


def test_reinitialize_keeps_spillable_bytes_and_refuses_live_buffers():
    rmm_rs.initialize(POOLED)
    data = b"spill me" * 100_000
    kept = rmm_rs.SpillableBuffer(data)
    live = rmm_rs.DeviceBuffer(4096)
    plain = {"pool": {"enabled": False}, "spill": {"enabled": True}}
    with pytest.raises(rmm_rs.RmmError, match="reinitialize refused, nothing changed"):
        rmm_rs.reinitialize(plain)
    # Refused before anything moved: the spillable data stays where it was.
    assert kept.tier == "device"
    assert kept.to_bytes() == data
    live.free()
    rmm_rs.reinitialize(plain)
    assert kept.tier == "host"
    assert "PoolMemoryResource" not in rmm_rs.device_statistics()[0]["stack"]
    kept.unspill()
    assert kept.tier == "device"
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == len(data)
    assert kept.to_bytes() == data
    spill = rmm_rs.spill_statistics()[0]
    assert spill["spilled_bytes"] >= len(data) and spill["unspilled_bytes"] == len(data)


def test_reinitialize_returns_the_report_the_runtime_keeps():
    # The returned dict is made field by field; the runtime's report (serde's form) is the
    # reference: same keys, same values, same types, notes and respawn included.
    rmm_rs.initialize(POOLED)
    kept = rmm_rs.SpillableBuffer(b"n" * 8192)
    # Spilling turns off with spillable data alive (a note), and the workers change (respawn).
    report = rmm_rs.reinitialize({"workers_per_device": 2, "spill": {"enabled": False}})
    assert report["notes"] and report["respawned"] and report["spilled_bytes"] >= 8192, report
    for call in (
        lambda: report,
        lambda: rmm_rs.reinitialize(pool_allocator=True, initial_pool_size=2 << 20),
    ):
        rep = call()
        reference = rmm_rs.report()["last_reinitialize"]
        assert list(rep) == list(reference)
        assert rep == reference
        assert {k: type(v) for k, v in rep.items()} == {k: type(v) for k, v in reference.items()}
        assert isinstance(rep["total"], float) and rep["devices"] == [0]
    assert kept.to_bytes() == b"n" * 8192


def test_errors_are_python_exceptions_with_the_cli_messages():
    with pytest.raises(rmm_rs.RmmError, match="not initialized"):
        rmm_rs.device_statistics()
    with pytest.raises(rmm_rs.RmmError, match='pool.initial_size = "lots"'):
        rmm_rs.initialize({"pool": {"initial_size": "lots"}})
    with pytest.raises(rmm_rs.RmmError, match="unknown key pool.intial_size"):
        rmm_rs.initialize({"pool": {"intial_size": "1GiB"}})
    with pytest.raises(rmm_rs.RmmError, match="path to an rmm.toml, a dict"):
        rmm_rs.initialize(42)  # type: ignore[arg-type]
    rmm_rs.initialize({})
    with pytest.raises(rmm_rs.RmmError, match="already initialized"):
        rmm_rs.initialize({})
    with pytest.raises(rmm_rs.RmmError, match="does not spill"):
        rmm_rs.SpillableBuffer(b"x")
    assert issubclass(rmm_rs.RmmError, RuntimeError)


def test_reinitialize_starts_rmm_rs_when_it_is_not_running():
    rmm_rs.reinitialize(POOLED)
    assert rmm_rs.is_initialized()
    assert rmm_rs.report()["devices"][0]["device"] == 0


def test_buffers_take_bytes_bytearray_and_memoryview():
    rmm_rs.initialize(POOLED)
    data = bytes(range(200))
    for source in (data, bytearray(data), memoryview(data)):
        assert rmm_rs.DeviceBuffer.from_bytes(source).to_bytes() == data
        assert rmm_rs.SpillableBuffer(source).to_bytes() == data
    with pytest.raises(rmm_rs.RmmError, match="buffer protocol"):
        rmm_rs.DeviceBuffer.from_bytes(12)


def test_other_threads_may_call_in_while_a_reinitialize_runs():
    import threading

    rmm_rs.initialize(POOLED)
    stop = threading.Event()
    reinitializing = threading.Event()
    calls = []  # (answer, whether a reinitialize ran before and after the call)

    def poll():
        while not stop.is_set():
            before = reinitializing.is_set()
            answer = rmm_rs.is_initialized()
            calls.append((answer, before and reinitializing.is_set()))

    t = threading.Thread(target=poll)
    t.start()
    try:
        # Until the poller has called in while a reinitialize ran (at most 200 of them).
        for _ in range(200):
            reinitializing.set()
            rmm_rs.reinitialize(POOLED)
            reinitializing.clear()
            if sum(during for _, during in calls) >= 3:
                break
    finally:
        reinitializing.clear()
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    during = [answer for answer, d in calls if d]
    assert len(during) >= 3, f"the poller never called in during a reinitialize: {len(calls)} calls"
    assert all(answer for answer, _ in calls)


def test_finalize_spills_live_spillable_data_so_the_old_pool_goes():
    # Two pools of 1200 MiB do not fit on the 2 GiB simulated device at once.
    big = {"pool": {"enabled": True, "initial_size": "1200MiB"}, "spill": {"enabled": True}}
    rmm_rs.initialize(big)
    kept = rmm_rs.SpillableBuffer(b"k" * 4096)
    rmm_rs.finalize()
    assert kept.tier == "host"
    # The first pool is gone although a buffer made from it lives: another fits.
    rmm_rs.initialize(big)
    assert kept.to_bytes() == b"k" * 4096


def test_finalize_shuts_down_before_it_returns_while_other_threads_call_in():
    import threading

    # Two pools of 1200 MiB do not fit on the 2 GiB simulated device at once: a runtime
    # started right after finalize fits only once the old one has given its pool back.
    big = {"pool": {"enabled": True, "initial_size": "1200MiB"}}
    stop = threading.Event()
    errors = []

    def poll():
        while not stop.is_set():
            try:
                rmm_rs.device_statistics()
            except rmm_rs.RmmError:
                pass  # between a finalize and the next initialize
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)

    t = threading.Thread(target=poll)
    t.start()
    try:
        for _ in range(20):
            rmm_rs.initialize(big)
            rmm_rs.finalize()
            assert not rmm_rs.is_initialized()
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive() and errors == []
