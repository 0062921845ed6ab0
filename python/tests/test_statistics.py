"""rmm_rs.statistics, RAPIDS RMM's rmm.statistics: enabling statistics, counter scopes
(push/pop), the statistics() context manager, and the profiler as a decorator and as a
context manager with its report; the module stays callable (rmm_rs.device_statistics()[0])."""

import pickle
from typing import Iterator, List

import pytest

import rmm_rs
import rmm_rs.statistics
from rmm_rs import _rmm_rs
from rmm_rs.statistics import (
    ProfilerRecords,
    Statistics,
    default_profiler_records,
    disable_statistics,
    enable_statistics,
    get_descriptive_name_of_object,
    get_statistics,
    pop_statistics,
    profiler,
    push_statistics,
    statistics,
)


@pytest.fixture(autouse=True)
def statistics_off() -> Iterator[None]:
    """Every test starts and ends without the adaptor enable_statistics() puts on."""
    disable_statistics()
    yield
    disable_statistics()


def stack() -> str:
    return _rmm_rs.current_resource()[1]


def stats(current_bytes, current_count, peak_bytes, peak_count, total_bytes, total_count):
    return Statistics(
        current_bytes=current_bytes,
        current_count=current_count,
        peak_bytes=peak_bytes,
        peak_count=peak_count,
        total_bytes=total_bytes,
        total_count=total_count,
    )


def test_statistics_are_disabled_until_enabled():
    assert not stack().startswith("StatisticsResourceAdaptor")
    assert get_statistics() is None
    assert push_statistics() is None
    assert pop_statistics() is None  # nothing to pop, and no error: disabled
    records = ProfilerRecords()

    @profiler(records=records)
    def allocates():
        return rmm_rs.DeviceBuffer(64)

    allocates()
    with profiler(records=records, name="block"):
        rmm_rs.DeviceBuffer(64)
    assert records.records == {}
    assert "No data" in records.report()


def test_enable_counts_allocations_and_disable_takes_the_adaptor_off():
    before = stack()
    enable_statistics()
    assert stack() == "StatisticsResourceAdaptor > " + before
    enable_statistics()  # idempotent: one adaptor
    assert stack().count("StatisticsResourceAdaptor") == 1
    assert get_statistics() == stats(0, 0, 0, 0, 0, 0)
    a = rmm_rs.DeviceBuffer(100)
    b = rmm_rs.DeviceBuffer(28)
    assert get_statistics() == stats(128, 2, 128, 2, 128, 2)
    a.free()
    assert get_statistics() == stats(28, 1, 128, 2, 128, 2)
    del b
    assert get_statistics() == stats(0, 0, 128, 2, 128, 2)
    assert disable_statistics() is True
    assert stack() == before
    assert get_statistics() is None
    assert disable_statistics() is False


def test_a_buffer_freed_after_disable_goes_back_through_its_adaptor():
    enable_statistics()
    buf = rmm_rs.DeviceBuffer(4096)
    assert disable_statistics()
    del buf  # its resource (the adaptor) lives on with it; no error, nothing leaks
    enable_statistics()
    assert get_statistics() == stats(0, 0, 0, 0, 0, 0)


def test_push_and_pop_nest_counter_scopes():
    enable_statistics()
    outer = [rmm_rs.DeviceBuffer(10) for _ in range(10)]
    # push returns the counters of the scope before the push
    assert push_statistics() == stats(100, 10, 100, 10, 100, 10)
    b1 = rmm_rs.DeviceBuffer(16)
    assert push_statistics() == stats(16, 1, 16, 1, 16, 1)
    assert _rmm_rs.statistics_depth() == 3
    del b1
    # pop returns the popped scope; it may be negative (it freed what an outer scope made)
    assert pop_statistics() == stats(-16, -1, 0, 0, 0, 0)
    b1 = rmm_rs.DeviceBuffer(16)
    assert push_statistics() == stats(16, 1, 16, 1, 32, 2)
    b2 = rmm_rs.DeviceBuffer(16)
    assert pop_statistics() == stats(16, 1, 16, 1, 16, 1)
    # the enclosing scope keeps counting through the popped one
    assert pop_statistics() == stats(32, 2, 32, 2, 48, 3)
    assert _rmm_rs.statistics_depth() == 1
    del b1, b2
    assert get_statistics() == stats(100, 10, 132, 12, 148, 13)
    del outer
    assert get_statistics() == stats(0, 0, 132, 12, 148, 13)


def test_popping_the_outermost_counters_is_an_index_error():
    enable_statistics()
    with pytest.raises(IndexError, match=r"pop_statistics\(\): no pushed counter scope .* 0"):
        pop_statistics()
    push_statistics()
    assert pop_statistics() == stats(0, 0, 0, 0, 0, 0)
    with pytest.raises(IndexError, match=r"Call push_statistics\(\) before every pop_statistics"):
        pop_statistics()


def test_the_context_manager_enables_statistics_for_its_duration():
    before = stack()
    assert get_statistics() is None
    with statistics():
        assert stack() == "StatisticsResourceAdaptor > " + before
        b1 = rmm_rs.DeviceBuffer(20)
        assert get_statistics() == stats(20, 1, 20, 1, 20, 1)
        with statistics():  # statistics are on: a scope of its own
            assert stack().count("StatisticsResourceAdaptor") == 1
            b2 = rmm_rs.DeviceBuffer(10)
            assert get_statistics() == stats(10, 1, 10, 1, 10, 1)
        assert get_statistics() == stats(30, 2, 30, 2, 30, 2)
        del b1, b2
    assert stack() == before
    assert get_statistics() is None


def test_the_context_manager_pops_its_scope_when_the_block_raises():
    enable_statistics()
    with pytest.raises(KeyError):
        with statistics():
            rmm_rs.DeviceBuffer(8)
            raise KeyError("inside")
    assert _rmm_rs.statistics_depth() == 1
    assert get_statistics() == stats(0, 0, 8, 1, 8, 1)


def test_a_runtime_has_statistics_enabled_and_its_adaptor_stays():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "16MiB"}})
    assert stack().startswith("StatisticsResourceAdaptor > PoolMemoryResource")
    assert get_statistics() == stats(0, 0, 0, 0, 0, 0)
    enable_statistics()  # already enabled: no second adaptor
    assert stack().count("StatisticsResourceAdaptor") == 1
    with statistics():
        buf = rmm_rs.DeviceBuffer(1 << 20)
        assert get_statistics() == stats(1 << 20, 1, 1 << 20, 1, 1 << 20, 1)
    buf.free()
    assert get_statistics() == stats(0, 0, 1 << 20, 1, 1 << 20, 1)
    assert disable_statistics() is False  # the runtime's adaptor is part of its stack
    assert stack().startswith("StatisticsResourceAdaptor > PoolMemoryResource")
    # scopes leave the runtime's lifetime counters alone
    assert rmm_rs.device_statistics()[0]["total_bytes"] == 1 << 20


def test_the_context_manager_refuses_a_resource_changed_inside_it():
    with pytest.raises(ValueError, match="memory resource changed inside"):
        with statistics():
            rmm_rs.initialize()
    rmm_rs.finalize()


def test_a_profiled_function_that_reinitializes_is_recorded_whole():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "16MiB"}})
    records = ProfilerRecords()

    @profiler(records=records, name="switch")
    def switch():
        rmm_rs.DeviceBuffer(1 << 20).free()
        rmm_rs.reinitialize({"pool": {"enabled": False}})
        return rmm_rs.DeviceBuffer(3 << 20)

    kept = switch()
    record = records.records["switch"]
    # 1 MiB on the pool, then 3 MiB on the new stack: counted as one call.
    assert (record.num_calls, record.memory_total, record.memory_peak) == (1, 4 << 20, 3 << 20)
    assert kept.size == 3 << 20
    assert _rmm_rs.statistics_depth() == 1


def test_scopes_and_the_context_manager_survive_reinitialize_and_finalize():
    rmm_rs.initialize({})
    push_statistics()
    with statistics():
        rmm_rs.DeviceBuffer(100).free()
        rmm_rs.reinitialize({"pool": {"enabled": True, "initial_size": "16MiB"}})
        assert "PoolMemoryResource" in stack()
        b = rmm_rs.DeviceBuffer(300)
        # The innermost scope counts across the switch, and so does the one around it.
        assert get_statistics() == stats(300, 1, 300, 1, 400, 2)
        assert _rmm_rs.statistics_depth() == 3
        del b
    assert pop_statistics() == stats(0, 0, 300, 1, 400, 2)
    assert _rmm_rs.statistics_depth() == 1
    # A scope open at finalize counted until then, and lets the stack go.
    push_statistics()
    rmm_rs.DeviceBuffer(50).free()
    rmm_rs.finalize()
    assert not rmm_rs.is_initialized()
    assert pop_statistics() == stats(0, 0, 50, 1, 50, 1)
    # One open across a finalize and the next initialize counts on both stacks.
    rmm_rs.initialize({})
    push_statistics()
    rmm_rs.DeviceBuffer(20).free()
    rmm_rs.finalize()
    rmm_rs.initialize({})
    keep = rmm_rs.DeviceBuffer(30)
    assert pop_statistics() == stats(30, 1, 30, 1, 50, 2)
    del keep
    with pytest.raises(IndexError, match="no pushed counter scope"):
        pop_statistics()


def test_the_profiler_records_each_decorated_function():
    records = ProfilerRecords()

    @profiler(records=records)
    def f1():
        b1 = rmm_rs.DeviceBuffer(10)
        b2 = rmm_rs.DeviceBuffer(10)
        del b1
        return b2

    @profiler(records=records)
    def f2():
        b1 = rmm_rs.DeviceBuffer(10)

        @profiler(records=records, name="g2")
        def g2(b1):
            b2 = rmm_rs.DeviceBuffer(10)
            del b1
            return b2

        return g2(b1)

    @profiler(records=records)
    def f3():
        return [rmm_rs.DeviceBuffer(100) for _ in range(100)]

    enable_statistics()
    kept = [f1(), f1(), f2(), f2()]
    del kept
    f2()
    f3()
    got = records.records
    Record = ProfilerRecords.MemoryRecord
    assert got[get_descriptive_name_of_object(f1)] == Record(
        num_calls=2, memory_total=40, memory_peak=20
    )
    assert got[get_descriptive_name_of_object(f2)] == Record(
        num_calls=3, memory_total=60, memory_peak=20
    )
    assert got["g2"] == Record(num_calls=3, memory_total=30, memory_peak=10)
    assert got[get_descriptive_name_of_object(f3)] == Record(
        num_calls=1, memory_total=10_000, memory_peak=10_000
    )
    assert ProfilerRecords.Data is Record  # older RMM's name

    name = get_descriptive_name_of_object(f1)
    assert name.endswith("(test_the_profiler_records_each_decorated_function.<locals>.f1)")
    assert "test_statistics.py:" in name

    report = records.report()
    assert report == str(records) == records.pretty_print()
    lines = report.splitlines()
    assert lines[:2] == ["Memory Profiling", "================"]
    assert "Ordered by: memory_peak" in lines
    header = lines.index("ncalls     memory_peak    memory_total  filename:lineno(function)")
    rows = lines[header + 1 :]
    # largest peak first: f3, then f1 and f2 (20), then g2
    assert rows[0].split() == ["1", "10,000", "10,000", get_descriptive_name_of_object(f3)]
    assert rows[-1].split() == ["3", "10", "30", "g2"]
    assert len(rows) == 4
    by_calls = records.report(ordered_by="num_calls").splitlines()
    assert by_calls[by_calls.index("Ordered by: num_calls") + 3].split()[0] == "3"
    assert by_calls[-1].split()[0] == "1"


def test_a_decorated_function_that_raises_is_recorded_and_its_scope_popped():
    records = ProfilerRecords()

    @profiler(records=records, name="fails")
    def fails():
        rmm_rs.DeviceBuffer(64)
        raise RuntimeError("boom")

    enable_statistics()
    with pytest.raises(RuntimeError, match="boom"):
        fails()
    assert _rmm_rs.statistics_depth() == 1
    assert records.records["fails"] == ProfilerRecords.MemoryRecord(1, 64, 64)


def test_the_profiler_as_a_context_manager_and_the_default_records():
    @profiler()
    def f4():
        return [rmm_rs.DeviceBuffer(10) for _ in range(10)]

    enable_statistics()
    f4()
    with profiler(name="test_statistics b1 and b2"):
        b1 = rmm_rs.DeviceBuffer(100)
        b2 = rmm_rs.DeviceBuffer(100)
        with profiler(name="test_statistics del b1 and b2"):
            del b1
            del b2
    one = profiler(name="test_statistics reused")
    with one:
        keep = rmm_rs.DeviceBuffer(7)
        with one:  # the same object, nested
            keep2 = rmm_rs.DeviceBuffer(3)
    del keep, keep2

    got = default_profiler_records.records
    Record = ProfilerRecords.MemoryRecord
    assert got[get_descriptive_name_of_object(f4)] == Record(1, 100, 100)
    assert got["test_statistics b1 and b2"] == Record(1, 200, 200)
    assert got["test_statistics del b1 and b2"] == Record(1, 0, 0)
    assert got["test_statistics reused"] == Record(2, 13, 10)
    assert "test_statistics b1 and b2" in default_profiler_records.report()


def test_the_profiler_under_a_runtime():
    rmm_rs.initialize()
    records = ProfilerRecords()
    with profiler(records=records, name="under the runtime"):
        bufs: List[rmm_rs.DeviceBuffer] = [rmm_rs.DeviceBuffer(1 << 20) for _ in range(3)]
        bufs.pop().free()
        bufs.append(rmm_rs.DeviceBuffer(1 << 20))
    assert records.records["under the runtime"] == ProfilerRecords.MemoryRecord(
        1, 4 << 20, 3 << 20
    )


def test_bad_arguments_say_which_value_and_what_to_pass():
    with pytest.raises(ValueError, match=r"profiler\(name=''\): a name is needed"):
        with profiler():
            pass
    with pytest.raises(TypeError, match=r"profiler\(records=\{\}\): expected .*ProfilerRecords"):
        profiler(records={})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"profiler\(name=3\): expected a str"):
        profiler(name=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"profiler\(\.\.\.\)\(42\): expected a function"):
        profiler(name="x")(42)  # type: ignore[type-var]
    with pytest.raises(ValueError, match=r"report\(ordered_by='size'\): expected one of"):
        ProfilerRecords().report(ordered_by="size")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"add\(data=7\): expected .*Statistics"):
        ProfilerRecords().add("x", 7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"enable_statistics\(device=-1\): expected None"):
        enable_statistics(device=-1)
    with pytest.raises(ValueError, match=r"get_statistics\(device='0'\)"):
        get_statistics(device="0")  # type: ignore[arg-type]
    with pytest.raises(rmm_rs.RmmError, match="device 99"):
        push_statistics(device=99)
    assert get_statistics() is None  # nothing was enabled on the way


def test_the_module_is_a_module_and_the_per_device_counters_are_a_function():
    import types

    import rmm_rs.statistics as module

    assert module is rmm_rs.statistics and type(module) is types.ModuleType
    assert not callable(rmm_rs.statistics)
    with pytest.raises(rmm_rs.RmmError, match="not initialized"):
        rmm_rs.device_statistics()
    rmm_rs.initialize()
    buf = rmm_rs.DeviceBuffer(1 << 10)
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 1 << 10
    assert rmm_rs.statistics.get_statistics() == stats(1 << 10, 1, 1 << 10, 1, 1 << 10, 1)
    buf.free()
    # Dask sends `client.run(rmm_rs.device_statistics)` to its workers: it pickles by name.
    assert pickle.loads(pickle.dumps(rmm_rs.device_statistics)) is rmm_rs.device_statistics
