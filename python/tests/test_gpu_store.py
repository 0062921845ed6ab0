"""The device store and the allocators with CuPy and PyTorch on a GPU (RMM_BACKEND=cuda).
Skipped, saying so, where CuPy, PyTorch or a GPU is absent (as in CI)."""

import os
import subprocess
import sys
import textwrap

import pytest

if os.environ.get("RMM_BACKEND", "").lower() != "cuda":
    pytest.skip("needs a GPU: run with RMM_BACKEND=cuda", allow_module_level=True)
cupy = pytest.importorskip("cupy")

import cloudpickle  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import rmm_rs  # noqa: E402
from rmm_rs.dask import DeviceStore, RMMRsPlugin  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20


def make_cupy(i, n=16 * MIB):
    return cupy.arange(n // 4, dtype=cupy.uint32) + cupy.uint32(i)


def check_cupy(x, i, n=16 * MIB):
    return x.shape == (n // 4,) and bool((x == cupy.arange(n // 4, dtype=cupy.uint32) + i).all())


@pytest.fixture
def cupy_on_rmm_rs():
    from rmm_rs.allocators import cupy as rmm_cupy

    yield rmm_cupy
    cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)


def test_cupy_values_spill_and_come_back_as_cupy_arrays(cupy_on_rmm_rs):
    store = DeviceStore(device_memory_limit="64MiB", config={"spill": {"enabled": True}})
    cupy_on_rmm_rs.install()
    for i in range(12):
        store[i] = make_cupy(i)
    stats = store.statistics()
    assert stats["device_bytes"] <= 64 * MIB and stats["host_count"] >= 8, stats
    for i in range(12):
        x = store[i]
        assert isinstance(x, cupy.ndarray) and check_cupy(x, i)
        del x
    # A view of a stored array shares its memory: counted once.
    base = make_cupy(99)
    store["base"], store["view"] = base, base[: base.size // 2]
    del base
    assert store.statistics()["spill"]["tracked_bytes"] <= 64 * MIB


def test_torch_tensors_spill_and_come_back_as_tensors():
    torch = pytest.importorskip("torch")
    store = DeviceStore(device_memory_limit="64MiB", config={"spill": {"enabled": True}})
    for i in range(8):
        store[i] = torch.full((4 * MIB,), float(i), device="cuda")
    assert store.statistics()["host_count"] >= 4
    for i in range(8):
        t = store[i]
        assert isinstance(t, torch.Tensor) and t.is_cuda and t.dtype == torch.float32
        assert bool((t == float(i)).all()) and t.shape == (4 * MIB,)


def test_a_cupy_allocation_out_of_memory_spills_store_values_first(cupy_on_rmm_rs):
    # A pool that cannot grow past 1 GiB, a store limit far above it: only running out spills.
    rmm_rs.initialize(
        {
            "spill": {"enabled": True},
            "pool": {"enabled": True, "initial_size": "1GiB", "maximum_size": "1GiB"},
        }
    )
    store = DeviceStore(device_memory_limit="100GiB")
    cupy_on_rmm_rs.install()
    for i in range(12):
        store[i] = make_cupy(i, 64 * MIB)  # 768 MiB
    assert all(store.tier(i) == "device" for i in range(12))
    big = cupy.empty(512 * MIB, dtype=cupy.uint8)
    big.fill(1)
    assert any(store.tier(i) == "host" for i in range(12))
    del big
    assert all(check_cupy(store[i], i, 64 * MIB) for i in range(12))


def test_a_failed_cupy_allocation_raises_cupys_out_of_memory_error(cupy_on_rmm_rs):
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "1GiB"}})
    cupy_on_rmm_rs.install()
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
        cupy.empty(1 << 48, dtype=cupy.uint8)
    # The context is fine: the next allocation and kernel work.
    x = cupy.ones(1024, dtype=cupy.float32)
    assert float(x.sum()) == 1024.0


def test_a_failed_torch_allocation_through_rmm_rs():
    # PyTorch's CUDAPluggableAllocator does not check the pointer its allocation function
    # returns: install() takes the shim rmm_rs_torch, whose function throws
    # c10::OutOfMemoryError instead (without it, the tensor would be at address 0).
    pytest.importorskip("torch")
    from rmm_rs.allocators import torch as rt

    error = rt.shim_error()
    if error is not None:
        if os.environ.get("TORCH_SHIM_REQUIRED") == "1":
            pytest.fail(f"TORCH_SHIM_REQUIRED=1 but rmm_rs_torch does not import: {error}")
        pytest.skip(f"the shim rmm_rs_torch is not built here ({error}): scripts/gpu_bridge.sh")
    code = textwrap.dedent(
        """
        import warnings
        # The fallback's warning (no shim) fails the run.
        warnings.filterwarnings("error", message=".*rmm_rs_torch", category=RuntimeWarning)
        import torch, rmm_rs
        from rmm_rs.allocators import torch as rt
        rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "1GiB"}})
        rt.install()
        try:
            t = torch.empty(1 << 48, dtype=torch.uint8, device="cuda")
            print("NO ERROR", t.data_ptr())
        except torch.OutOfMemoryError as e:
            print("OOM", str(e).splitlines()[0])
        x = torch.ones(1024, device="cuda")
        print("after", float(x.sum()), rmm_rs.device_statistics()[0]["bytes_in_use"] >= 4096)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    print(out.stdout, out.stderr[-2000:])
    log = out.stdout + out.stderr[-2000:]
    assert out.returncode == 0, log
    assert "OOM rmm_rs: allocating 281474976710656 bytes" in out.stdout, log
    assert "maximum_size" in out.stdout, log
    # The context is fine, and the tensor after it comes from rmm-rs.
    assert "after 1024.0 True" in out.stdout, log


def test_the_torch_mem_pool_path_keeps_statistics_and_raises_torchs_out_of_memory():
    torch = pytest.importorskip("torch")
    from rmm_rs.allocators import torch as rmm_torch

    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "2GiB", "maximum_size": "2GiB"}})
    pool = rmm_torch.mem_pool()
    before = rmm_rs.device_statistics()[0]["total_bytes"]
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
        assert torch.cuda.memory_stats()["allocated_bytes.all.current"] >= 64 << 20
        assert rmm_rs.device_statistics()[0]["total_bytes"] >= before + (64 << 20)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
        assert int(t.sum()) == 64 << 20
    del t


def make_tensor(i):
    import torch

    return torch.full((4 << 20,), float(i), device="cuda")


def check_tensor(t, i):
    return t.is_cuda and t.shape == (4 << 20,) and bool((t == float(i)).all())


def cupy_cluster_run(client):
    futures = client.map(make_cupy, range(16), pure=False)
    assert all(client.gather(client.map(check_cupy, futures, range(16))))
    try:
        import torch  # noqa: F401
    except ImportError:
        tensors = None
    else:
        tensors = client.map(make_tensor, range(8), pure=False)
        assert all(client.gather(client.map(check_tensor, tensors, range(8))))
    stats = list(client.run(lambda dask_worker: dask_worker.data.statistics()).values())
    assert sum(s["host_count"] + s["disk_count"] for s in stats) > 0, stats
    client.run(
        rmm_rs.reinitialize,
        {"spill": {"enabled": True}, "pool": {"enabled": True, "initial_size": "2GiB"}},
    )
    assert all(client.gather(client.map(check_cupy, futures, range(16), pure=False)))
    if tensors is not None:
        assert all(client.gather(client.map(check_tensor, tensors, range(8), pure=False)))


def test_a_local_cuda_cluster_with_the_store_and_the_cupy_allocator():
    dask_cuda = pytest.importorskip("dask_cuda")
    with dask_cuda.LocalCUDACluster(
        n_workers=1,
        dashboard_address=None,
        data=DeviceStore.factory(device_memory_limit="96MiB"),
    ) as cluster, Client(cluster) as client:
        client.register_plugin(
            RMMRsPlugin(rmm_pool_size="4GiB", rmm_allocator_external_lib_list=["cupy"])
        )
        cupy_cluster_run(client)


def test_a_local_cluster_with_the_store():
    with LocalCluster(
        n_workers=2,
        threads_per_worker=2,
        processes=True,
        dashboard_address=None,
        data=DeviceStore.factory(device_memory_limit="96MiB"),
    ) as cluster, Client(cluster) as client:
        cupy_cluster_run(client)
