"""RAPIDS RMM, CuPy (through RMM's allocator), a C++ librmm client and PyTorch's MemPool on
rmm-rs, on a GPU (RMM_BACKEND=cuda). Skipped, saying so, where a GPU or RMM is absent (as in
CI); the C++ client's test needs ``LIBRMM_BRIDGE_CLIENT``, the path of the client library
that scripts/gpu_bridge.sh builds (python/librmm_bridge/librmm_client.cpp)."""

import ctypes
import os
import sys
from typing import Any, Dict, List

import pytest

if os.environ.get("RMM_BACKEND", "").lower() != "cuda":
    pytest.skip("needs a GPU: run with RMM_BACKEND=cuda", allow_module_level=True)
pytest.importorskip("rmm", reason="RAPIDS RMM is not installed")

import cloudpickle  # noqa: E402
import rmm  # noqa: E402
import rmm.mr  # noqa: E402

import rmm_rs  # noqa: E402
from rmm_rs.allocators import rmm as rr  # noqa: E402
from bridges import librmm_bridge  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20
POOL: Dict[str, Any] = {"pool": {"enabled": True, "initial_size": "1GiB"}}


@pytest.fixture(autouse=True)
def rmms_default_resource():
    yield
    rmm.mr.set_per_device_resource(0, rmm.mr.CudaMemoryResource())
    rr._installed.clear()


def in_use():
    return rmm_rs.device_statistics()[0]["bytes_in_use"]


def total_allocations():
    return rmm_rs.device_statistics()[0]["total_allocations"]


def test_the_installed_resource_is_the_bridge():
    RmmRsMemoryResource = librmm_bridge().RmmRsMemoryResource

    rmm_rs.initialize(POOL)
    rr.install()
    assert isinstance(rmm.mr.get_current_device_resource(), RmmRsMemoryResource)


def test_rmm_device_buffers_come_from_rmm_rs_and_keep_their_bytes():
    rmm_rs.initialize(POOL)
    rr.install()
    before = total_allocations()
    data = bytes(range(256)) * 4096
    buf = rmm.DeviceBuffer.to_device(data)
    assert in_use() >= len(data) and total_allocations() > before
    assert buf.copy_to_host().tobytes() == data
    del buf
    assert in_use() == 0


def test_out_of_memory_in_rmm_is_a_memory_error():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB", "maximum_size": "64MiB"}})
    rr.install()
    with pytest.raises(MemoryError):
        rmm.DeviceBuffer(size=128 * MIB)


def test_rmms_cupy_allocator_allocates_from_rmm_rs():
    cupy = pytest.importorskip("cupy")
    from rmm.allocators.cupy import rmm_cupy_allocator

    rmm_rs.initialize(POOL)
    rr.install()
    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        before = total_allocations()
        x = cupy.arange(4 * MIB, dtype=cupy.uint8)
        assert total_allocations() > before and in_use() >= 4 * MIB
        assert int(x[-1]) == (4 * MIB - 1) % 256
        del x
        assert in_use() == 0
    finally:
        cupy.cuda.set_allocator(previous)


def client():
    path = os.environ.get("LIBRMM_BRIDGE_CLIENT")
    if not path:
        pytest.skip("LIBRMM_BRIDGE_CLIENT is not set: scripts/gpu_bridge.sh builds the client")
    lib = ctypes.CDLL(path)
    lib.client_run.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_double),
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    return lib


def run_client(lib, threads, iterations):
    seconds = ctypes.c_double()
    error = ctypes.create_string_buffer(512)
    rc = lib.client_run(threads, iterations, ctypes.byref(seconds), error, len(error))
    assert rc == 0, error.value.decode()
    return seconds.value


def test_a_cpp_librmm_client_on_eight_threads_allocates_from_rmm_rs():
    lib = client()
    rmm_rs.initialize(POOL)
    rr.install()
    before = total_allocations()
    run_client(lib, 8, 2000)
    assert total_allocations() - before >= 8 * 2000
    assert in_use() == 0


def test_reinitialize_between_phases_with_every_allocator_installed():
    cupy = pytest.importorskip("cupy")
    from rmm.allocators.cupy import rmm_cupy_allocator

    from rmm_rs.allocators import cupy as rmm_cupy

    lib = client()
    rmm_rs.initialize(POOL)
    rr.install()
    previous = cupy.cuda.get_allocator()
    try:
        phases: List[Dict[str, Any]] = [
            POOL,
            {"pool": {"enabled": True, "initial_size": "512MiB"}, "spill": {"enabled": True}},
            {"pool": {"enabled": False}},
        ]
        for phase, config in enumerate(phases):
            if phase:
                rmm_rs.reinitialize(config)
            before = total_allocations()
            run_client(lib, 8, 500)
            cupy.cuda.set_allocator(rmm_cupy_allocator)
            x = cupy.ones(MIB, dtype=cupy.float32)
            assert float(x.sum()) == MIB
            del x
            rmm_cupy.install()
            y = cupy.zeros(MIB, dtype=cupy.uint8)
            del y
            buf = rmm.DeviceBuffer(size=MIB)
            del buf
            assert total_allocations() - before >= 8 * 500 + 3, phase
            assert in_use() == 0, phase
    finally:
        cupy.cuda.set_allocator(previous)


def torch_check(code):
    """Runs `code` in a fresh process (PyTorch's allocator set-up is process-wide)."""
    import subprocess
    import textwrap

    pytest.importorskip("torch")
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_torch_mem_pool_keeps_memory_stats_and_allocates_from_rmm_rs():
    out = torch_check(
        """
        import torch, rmm_rs
        from rmm_rs.allocators import torch as rmm_torch
        rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "1GiB"}})
        pool = rmm_torch.mem_pool()
        before = rmm_rs.device_statistics()[0]["total_allocations"]
        with torch.cuda.use_mem_pool(pool):
            x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] >= 64 << 20, stats
        assert rmm_rs.device_statistics()[0]["total_allocations"] > before
        assert rmm_rs.device_statistics()[0]["bytes_in_use"] >= 64 << 20
        snapshot = torch.cuda.memory_snapshot()
        assert any(s["total_size"] >= 64 << 20 for s in snapshot)
        del x
        print("ok")
        """
    )
    assert "ok" in out


def test_torch_mem_pool_serves_cuda_graph_capture():
    out = torch_check(
        """
        import torch, rmm_rs
        from rmm_rs.allocators import torch as rmm_torch
        rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "1GiB"}})
        pool = rmm_torch.mem_pool()
        x = torch.ones(1 << 20, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):  # warm-up, as capture requires
                y = x * 2
        torch.cuda.current_stream().wait_stream(s)
        before = rmm_rs.device_statistics()[0]["total_allocations"]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool.id):
            y = x * 2
        g.replay()
        torch.cuda.synchronize()
        assert float(y.sum()) == 2 * (1 << 20)
        assert rmm_rs.device_statistics()[0]["total_allocations"] > before
        print("ok")
        """
    )
    assert "ok" in out


def test_torch_mem_pool_out_of_memory_is_torchs_own_error():
    out = torch_check(
        """
        import torch, rmm_rs
        from rmm_rs.allocators import torch as rmm_torch
        rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "256MiB",
                                    "maximum_size": "256MiB"}})
        pool = rmm_torch.mem_pool()
        try:
            with torch.cuda.use_mem_pool(pool):
                torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            print("ok")
        """
    )
    assert "ok" in out


def worker_allocates_through_all_three(dask_worker=None):
    import cupy
    import rmm as rmm_
    import torch

    import rmm_rs as r

    before = r.device_statistics()[0]["total_allocations"]
    buf = rmm_.DeviceBuffer(size=MIB)
    x = cupy.ones(MIB, dtype=cupy.uint8)
    t = torch.ones(MIB, dtype=torch.uint8, device="cuda")
    ok = int(x.sum()) == MIB and int(t.sum()) == MIB and buf.size == MIB
    grew = r.device_statistics()[0]["total_allocations"] - before
    del buf, x, t
    return ok, grew, type(rmm_.mr.get_current_device_resource()).__name__


def test_a_local_cuda_cluster_allocates_through_rmm_cupy_and_torch():
    librmm_bridge()
    dask_cuda = pytest.importorskip("dask_cuda")
    pytest.importorskip("cupy")
    pytest.importorskip("torch")
    from distributed import Client

    from rmm_rs.dask import RMMRsPlugin

    with dask_cuda.LocalCUDACluster(n_workers=1, dashboard_address=None) as cluster, Client(
        cluster
    ) as c:
        c.register_plugin(
            RMMRsPlugin(
                rmm_pool_size="2GiB", rmm_allocator_external_lib_list=["rmm", "cupy", "torch"]
            )
        )
        for ok, grew, resource in c.run(worker_allocates_through_all_three).values():
            assert ok and grew >= 3 and resource == "RmmRsMemoryResource", (ok, grew, resource)
        # A new plugin (a reinitialize on each worker) keeps all three working. (PyTorch's
        # process-wide allocator cannot be swapped once used: the new plugin leaves "torch"
        # out, and PyTorch keeps allocating from rmm-rs.)
        c.register_plugin(
            RMMRsPlugin(rmm_pool_size="1GiB", rmm_allocator_external_lib_list=["rmm", "cupy"])
        )
        for ok, grew, resource in c.run(worker_allocates_through_all_three).values():
            assert ok and grew >= 3 and resource == "RmmRsMemoryResource", (ok, grew, resource)
