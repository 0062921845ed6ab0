"""The C functions behind the librmm resource (``rmm_rs.allocators.rmm``), through ctypes:
no RAPIDS RMM needed. The bridge and the fallback over them are tested in test_rmm_bridge.py."""

import ctypes
import threading

import rmm_rs
from rmm_rs import _rmm_rs

MIB = 1 << 20


def functions():
    a, d, s = _rmm_rs.librmm_functions()
    allocate = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(a)
    deallocate = ctypes.CFUNCTYPE(
        None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
    )(d)
    synchronize = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(s)
    return allocate, deallocate, synchronize


def test_the_functions_are_the_extensions_exported_symbols():
    lib = ctypes.CDLL(_rmm_rs.__file__)
    names = ("rmm_rs_librmm_allocate", "rmm_rs_librmm_deallocate", "rmm_rs_librmm_synchronize")
    addresses = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names]
    assert tuple(addresses) == _rmm_rs.librmm_functions()


def test_allocate_and_deallocate_go_through_the_stack():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    allocate, deallocate, synchronize = functions()
    ptrs = [allocate(MIB, 0, None) for _ in range(8)]
    assert all(ptrs) and len(set(ptrs)) == 8
    assert all(p % 256 == 0 for p in ptrs)
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 8 * MIB
    assert _rmm_rs.live_allocations() == 8
    assert synchronize(0, None) == 0
    for p in ptrs:
        deallocate(p, MIB, 0, None)
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 0
    assert _rmm_rs.live_allocations() == 0


def test_a_free_with_the_wrong_size_frees_what_was_allocated():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    allocate, deallocate, _ = functions()
    p = allocate(3 * MIB, 0, None)
    deallocate(p, MIB, 0, None)
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 0


def test_out_of_memory_is_null_and_a_bad_device_is_null_or_an_error():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    allocate, deallocate, synchronize = functions()
    assert not allocate(1 << 50, 0, None)
    assert not allocate(MIB, -1, None)
    assert synchronize(-1, None) == -1
    deallocate(None, 0, 0, None)  # freeing null does nothing
    assert rmm_rs.device_statistics()[0]["out_of_memory_errors"] >= 1


def test_a_late_free_goes_to_the_resource_that_allocated():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    allocate, deallocate, _ = functions()
    old = allocate(MIB, 0, None)
    rmm_rs.finalize()
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "32MiB"}})
    new = allocate(2 * MIB, 0, None)
    deallocate(old, MIB, 0, None)  # into the old pool, not the new one
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 2 * MIB
    deallocate(new, 2 * MIB, 0, None)
    assert _rmm_rs.live_allocations() == 0


def test_out_of_memory_spills_before_failing():
    # A pool that cannot grow past 32 MiB: 24 MiB of spillable buffers leave too little for
    # 16 MiB, until the spill manager moves some to the host.
    rmm_rs.initialize(
        {
            "pool": {"enabled": True, "initial_size": "32MiB", "maximum_size": "32MiB"},
            "spill": {"enabled": True, "host_pool_size": "64MiB"},
        }
    )
    kept = [rmm_rs.SpillableBuffer(bytes([i]) * (2 * MIB)) for i in range(12)]
    allocate, deallocate, _ = functions()
    p = allocate(16 * MIB, 0, None)
    assert p
    assert rmm_rs.spill_statistics()[0]["spilled_bytes"] >= 8 * MIB
    assert any(b.tier != "device" for b in kept)
    deallocate(p, 16 * MIB, 0, None)
    for i, b in enumerate(kept):
        assert b.to_bytes() == bytes([i]) * (2 * MIB)


def test_out_of_memory_spills_from_a_thread_without_the_gil():
    # As a librmm client's C++ thread does: the allocation runs in a thread that never holds
    # the GIL while the main thread waits for it (ctypes releases the GIL for the call).
    rmm_rs.initialize(
        {
            "pool": {"enabled": True, "initial_size": "32MiB", "maximum_size": "32MiB"},
            "spill": {"enabled": True, "host_pool_size": "64MiB"},
        }
    )
    kept = [rmm_rs.SpillableBuffer(bytes([i]) * (2 * MIB)) for i in range(12)]
    allocate, deallocate, _ = functions()
    got = []
    t = threading.Thread(target=lambda: got.append(allocate(16 * MIB, 0, None)))
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the allocation did not return (a deadlock while spilling?)"
    assert got and got[0]
    deallocate(got[0], 16 * MIB, 0, None)
    assert any(b.tier != "device" for b in kept)


def test_allocations_from_many_threads_all_come_back():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "256MiB"}})
    allocate, deallocate, _ = functions()
    errors = []

    def work(seed):
        sizes = [(seed * 7919 + i * 104729) % (4 * MIB) + 1 for i in range(200)]
        live = []
        for n in sizes:
            p = allocate(n, 0, None)
            if not p:
                errors.append(n)
                continue
            live.append((p, n))
            if len(live) > 8:
                q, m = live.pop(0)
                deallocate(q, m, 0, None)
        for q, m in live:
            deallocate(q, m, 0, None)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 0
    assert _rmm_rs.live_allocations() == 0


def test_the_rmm_module_is_reachable_without_importing_rmm():
    import subprocess
    import sys

    code = (
        "import sys, rmm_rs\n"
        "assert rmm_rs.allocators.rmm.install and rmm_rs.allocators.rmm.resource\n"
        "assert 'rmm' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_allocation_binds_the_devices_context_on_a_thread_that_has_none():
    """A librmm client's thread may reach rmm-rs before any CUDA call of its own; librmm's
    ``device_buffer`` then asks CUDA's runtime for the current device on every buffer, which
    is slow while no context is current. The first allocation on such a thread binds the
    device's primary context, as the runtime would."""
    import os

    import pytest

    if os.environ.get("RMM_BACKEND", "").lower() != "cuda":
        pytest.skip("needs a GPU (RMM_BACKEND=cuda): the simulated device has no contexts")
    driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    allocate, deallocate, _ = functions()
    seen: dict = {}

    def context():
        err, ctx = driver.cuCtxGetCurrent()
        assert err == driver.CUresult.CUDA_SUCCESS, err
        return int(ctx)

    def on_a_new_thread():
        seen["before"] = context()
        p = allocate(MIB, 0, None)
        seen["after"] = context()
        deallocate(p, MIB, 0, None)
        seen["ptr"] = p

    t = threading.Thread(target=on_a_new_thread)
    t.start()
    t.join()
    err, primary = driver.cuDevicePrimaryCtxRetain(driver.cuDeviceGet(0)[1])
    assert err == driver.CUresult.CUDA_SUCCESS, err
    driver.cuDevicePrimaryCtxRelease(driver.cuDeviceGet(0)[1])
    assert seen["ptr"]
    assert seen["before"] == 0, "a new thread already had a context: nothing to check"
    assert seen["after"] == int(primary)
