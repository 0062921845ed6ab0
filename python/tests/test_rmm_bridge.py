"""RAPIDS RMM on rmm-rs without a device: ``rmm_rs.allocators.rmm`` with the compiled bridge
(``rmm_rs_librmm``) and with its fallback (``CallbackMemoryResource`` over the C functions).
A resource's ``allocate`` calls no CUDA function, so these run on the simulated device.

Skipped, saying so, where RMM's wheels are not installed. Where the bridge is expected (the
test task built it: ``LIBRMM_BRIDGE_REQUIRED=1``), a bridge that does not import fails."""

import ctypes
import sys
import threading

import pytest

import rmm_rs
from rmm_rs import _rmm_rs

pytest.importorskip("rmm", reason="RAPIDS RMM is not installed (pip install rmm-cu13 to run these)")
import rmm  # noqa: E402
import rmm.mr  # noqa: E402

from rmm_rs.allocators import rmm as rr  # noqa: E402
from bridges import librmm_bridge  # noqa: E402

MIB = 1 << 20
POOL = {"pool": {"enabled": True, "initial_size": "64MiB"}}


@pytest.fixture(autouse=True)
def rmms_default_resource():
    """Every test leaves RMM's resource of device 0 as it found it (plain cudaMalloc)."""
    yield
    rmm.mr.set_per_device_resource(0, rmm.mr.CudaMemoryResource())
    rr._installed.clear()


@pytest.fixture
def no_bridge(monkeypatch):
    """As if rmm_rs_librmm were not installed, with the fallback's warning not yet given."""
    monkeypatch.setitem(sys.modules, "rmm_rs_librmm", None)
    monkeypatch.setattr(rr, "_warned", False)


def in_use():
    return rmm_rs.device_statistics()[0]["bytes_in_use"]


# The bridge


def test_the_bridge_is_an_rmm_device_memory_resource_over_the_exported_functions():
    b = librmm_bridge()
    assert issubclass(b.RmmRsMemoryResource, rmm.mr.DeviceMemoryResource)
    mr = b.RmmRsMemoryResource()
    assert mr.device == 0
    assert mr.functions == _rmm_rs.librmm_functions()
    lib = ctypes.CDLL(_rmm_rs.__file__)
    assert mr.functions[0] == ctypes.cast(lib.rmm_rs_librmm_allocate, ctypes.c_void_p).value
    assert repr(mr) == "RmmRsMemoryResource(device=0)"


def test_instances_come_and_go_without_losing_their_types_reference():
    # RMM's types are heap types (limited API): a subclass that is not would lose one
    # reference to its type at every instance's deallocation, and crash once it hit zero.
    cls = librmm_bridge().RmmRsMemoryResource
    cls()  # the first instance may leave a reference in a cache
    before = sys.getrefcount(cls)
    for _ in range(1000):
        cls()
    assert sys.getrefcount(cls) == before


def test_the_bridge_refuses_bad_arguments():
    b = librmm_bridge()
    with pytest.raises(ValueError, match="device=-1"):
        b.RmmRsMemoryResource(-1)
    with pytest.raises(ValueError, match="three function addresses"):
        b.RmmRsMemoryResource(0, (1, 2))
    with pytest.raises(ValueError, match="three function addresses"):
        b.RmmRsMemoryResource(0, (0, 0, 0))


def test_the_bridge_allocates_from_the_rmm_rs_stack():
    b = librmm_bridge()
    rmm_rs.initialize(POOL)
    mr = rr.resource(0)
    assert isinstance(mr, b.RmmRsMemoryResource)
    ptrs = [mr.allocate(MIB) for _ in range(4)]
    assert in_use() == 4 * MIB
    assert all(p % 256 == 0 for p in ptrs)
    for p in ptrs:
        mr.deallocate(p, MIB)
    assert in_use() == 0
    assert _rmm_rs.live_allocations() == 0


def test_install_makes_the_bridge_rmms_resource_across_reinitialize_and_finalize():
    b = librmm_bridge()
    rmm_rs.initialize(POOL)
    installed = rr.install()
    assert list(installed) == [0]
    mr = rmm.mr.get_per_device_resource(0)
    assert isinstance(mr, b.RmmRsMemoryResource) and mr is installed[0]
    assert rr.is_installed(0)
    mr.deallocate(mr.allocate(MIB), MIB)
    # A reinitialize between phases: the installed bridge allocates from the new stack.
    rmm_rs.reinitialize({"pool": {"enabled": True, "initial_size": "32MiB"}})
    assert rmm.mr.get_per_device_resource(0) is mr
    p = mr.allocate(2 * MIB)
    assert in_use() == 2 * MIB and rmm_rs.device_statistics()[0]["reserved_bytes"] == 32 * MIB
    mr.deallocate(p, 2 * MIB)
    # Memory still live when the stack goes (finalize, then a new initialize) goes back to
    # the resource that allocated it.
    old = mr.allocate(MIB)
    rmm_rs.finalize()
    rmm_rs.initialize(POOL)
    new = mr.allocate(2 * MIB)
    mr.deallocate(old, MIB)
    assert in_use() == 2 * MIB
    mr.deallocate(new, 2 * MIB)
    assert in_use() == 0 and _rmm_rs.live_allocations() == 0


def test_live_librmm_memory_makes_a_reinitialize_refuse_and_name_it():
    librmm_bridge()
    rmm_rs.initialize(POOL)
    mr = rr.resource(0)
    p = mr.allocate(MIB)
    with pytest.raises(rmm_rs.RmmError, match="still live"):
        rmm_rs.reinitialize({"pool": {"enabled": True, "initial_size": "32MiB"}})
    mr.deallocate(p, MIB)
    rmm_rs.reinitialize({"pool": {"enabled": True, "initial_size": "32MiB"}})


def test_out_of_memory_through_the_bridge_is_a_memory_error():
    librmm_bridge()
    rmm_rs.initialize(POOL)
    mr = rr.resource(0)
    with pytest.raises(MemoryError, match="rmm-rs is out of memory"):
        mr.allocate(1 << 50)


def test_an_odd_size_is_served_with_rmms_default_alignment():
    # rmm.mr's Python allocate always asks for 256-byte alignment (only C++ can ask for more,
    # which the bridge refuses above 256).
    librmm_bridge()
    rmm_rs.initialize(POOL)
    mr = rr.resource(0)
    p = mr.allocate(1000)
    assert p % 256 == 0 and in_use() == 1000
    mr.deallocate(p, 1000)
    assert in_use() == 0


def test_the_bridge_spills_before_failing_from_threads_without_the_gil():
    librmm_bridge()
    rmm_rs.initialize(
        {
            "pool": {"enabled": True, "initial_size": "32MiB", "maximum_size": "32MiB"},
            "spill": {"enabled": True, "host_pool_size": "64MiB"},
        }
    )
    kept = [rmm_rs.SpillableBuffer(bytes([i]) * (2 * MIB)) for i in range(12)]
    mr = rr.resource(0)
    got = []
    # RMM's allocate releases the GIL around the C++ call: the spill runs without it.
    t = threading.Thread(target=lambda: got.append(mr.allocate(16 * MIB)))
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the allocation did not return (a deadlock while spilling?)"
    assert got and got[0]
    assert rmm_rs.spill_statistics()[0]["spilled_bytes"] >= 8 * MIB
    mr.deallocate(got[0], 16 * MIB)
    for i, k in enumerate(kept):
        assert k.to_bytes() == bytes([i]) * (2 * MIB)


def test_the_bridge_serves_many_threads_at_once():
    librmm_bridge()
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "256MiB"}})
    mr = rr.resource(0)
    failures = []

    def work(seed):
        live = []
        for i in range(300):
            n = (seed * 7919 + i * 104729) % (2 * MIB) + 1
            try:
                live.append((mr.allocate(n), n))
            except MemoryError as e:
                failures.append(str(e))
            if len(live) > 8:
                p, m = live.pop(0)
                mr.deallocate(p, m)
        for p, m in live:
            mr.deallocate(p, m)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert in_use() == 0 and _rmm_rs.live_allocations() == 0


# The fallback


def test_without_the_bridge_install_falls_back_to_callbacks_and_says_so_once(no_bridge):
    rmm_rs.initialize(POOL)
    assert rr.bridge_error() is not None
    with pytest.warns(RuntimeWarning, match="CallbackMemoryResource"):
        installed = rr.install(0)
    mr = installed[0]
    assert isinstance(mr, rmm.mr.CallbackMemoryResource)
    assert rmm.mr.get_per_device_resource(0) is mr and rr.is_installed(0)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(rr.resource(0), rmm.mr.CallbackMemoryResource)  # no second warning
    p = mr.allocate(3 * MIB)
    assert in_use() == 3 * MIB
    mr.deallocate(p, 3 * MIB)
    assert in_use() == 0 and _rmm_rs.live_allocations() == 0


def test_the_fallback_reports_out_of_memory_as_a_memory_error(no_bridge):
    rmm_rs.initialize(POOL)
    with pytest.warns(RuntimeWarning):
        mr = rr.resource(0)
    with pytest.raises(MemoryError, match="rmm-rs is out of memory"):
        mr.allocate(1 << 50)


def test_install_before_initialize_is_device_0_and_a_bad_device_is_refused(no_bridge):
    with pytest.warns(RuntimeWarning):
        assert list(rr.install()) == [0]
    with pytest.raises(ValueError, match="device=-2"):
        rr.install(-2)
    assert not rr.is_installed(1)


# The Dask plugin


def librmm_resource_on_worker(dask_worker=None):
    import rmm.mr as mr_

    import rmm_rs as r

    mr = mr_.get_per_device_resource(0)
    before = r.device_statistics()[0]["total_allocations"]
    mr.deallocate(mr.allocate(MIB), MIB)
    return type(mr).__name__, r.device_statistics()[0]["total_allocations"] - before


def test_the_plugin_installs_rmms_resource_on_every_worker_and_keeps_it_across_a_new_plugin():
    import cloudpickle
    from clusters import local_cluster
    from distributed import Client

    from rmm_rs.dask import RMMRsPlugin

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    expected = "CallbackMemoryResource" if rr.bridge_error() else "RmmRsMemoryResource"
    with local_cluster() as cluster, Client(cluster) as client:
        client.register_plugin(
            RMMRsPlugin(rmm_pool_size="64MiB", rmm_allocator_external_lib_list=["rmm"])
        )
        assert list(client.run(librmm_resource_on_worker).values()) == [(expected, 1)] * 2
        # A new plugin reinitializes each worker: the installed resource follows it.
        client.register_plugin(
            RMMRsPlugin(rmm_pool_size="32MiB", rmm_allocator_external_lib_list="rmm")
        )
        assert list(client.run(librmm_resource_on_worker).values()) == [(expected, 1)] * 2
