"""CuPy values moving between the device stores of one Dask worker per GPU, over TCP and UCX
(``LocalCUDACluster``, distributed-ucxx), on a machine with at least two GPUs and
RMM_BACKEND=cuda: spilled values are sent from the host tier (nothing brought back to the
device to be sent), received ones land in the receiver's store (over UCX, device frames in
rmm-rs buffers), every element checked. Skipped, saying why, elsewhere (as in CI)."""

import os
import sys
from typing import Any, Dict

import pytest

if os.environ.get("RMM_BACKEND", "").lower() != "cuda":
    pytest.skip("needs GPUs: run with RMM_BACKEND=cuda", allow_module_level=True)
cupy = pytest.importorskip("cupy")
dask_cuda = pytest.importorskip("dask_cuda")
if cupy.cuda.runtime.getDeviceCount() < 2:
    pytest.skip("needs two GPUs or more", allow_module_level=True)

import cloudpickle  # noqa: E402
from distributed import Client, wait  # noqa: E402

import rmm_rs  # noqa: E402
from rmm_rs.dask import DeviceStore, RMMRsPlugin  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20
SIZE = 64 * MIB
N = 16  # 1 GiB made on one worker under a 256 MiB limit


def make(i):
    return cupy.arange(SIZE // 4, dtype=cupy.uint32) * cupy.uint32(7) + cupy.uint32(i)


def check(x, i):
    expected = cupy.arange(SIZE // 4, dtype=cupy.uint32) * cupy.uint32(7) + cupy.uint32(i)
    return isinstance(x, cupy.ndarray) and bool((x == expected).all())


def keep(x, i):
    if not check(x, i):
        raise ValueError(f"value {i} arrived changed")
    return x


def figures(dask_worker) -> Dict[str, Any]:
    store: Any = dask_worker.data
    return {
        "spill": rmm_rs.spill_statistics()[store.device_id],
        "tiers": [store.tier(k) for k in list(store)],
        "stats": rmm_rs.device_statistics()[store.device_id],
    }


def protocols():
    out = [pytest.param("tcp")]
    try:
        import distributed_ucxx  # noqa: F401

        out.append(pytest.param("ucx"))
    except ImportError:
        out.append(
            pytest.param("ucx", marks=pytest.mark.skip(reason="distributed-ucxx not installed"))
        )
    return out


@pytest.mark.parametrize("protocol", protocols())
def test_values_cross_gpus_from_their_tier(protocol):
    n = min(cupy.cuda.runtime.getDeviceCount(), 4)
    with dask_cuda.LocalCUDACluster(
        CUDA_VISIBLE_DEVICES=list(range(n)),
        protocol=protocol,
        data=DeviceStore.factory(device_memory_limit="256MiB"),
        rmm_pool_size=None,
        dashboard_address=None,
    ) as cluster, Client(cluster) as client:
        client.register_plugin(
            RMMRsPlugin(device_memory_limit="256MiB", rmm_allocator_external_lib_list=["cupy"])
        )
        workers = sorted(client.scheduler_info()["workers"])
        source, peers = workers[0], workers[1:]
        made = client.map(make, range(N), workers=[source], pure=False)
        wait(made)
        before = client.run(figures, workers=[source])[source]
        assert "host" in before["tiers"], before["tiers"]
        kept = [
            client.submit(keep, f, i, workers=[peers[i % len(peers)]], pure=False)
            for i, f in enumerate(made)
        ]
        wait(kept)
        assert [f.status for f in kept] == ["finished"] * N
        after = client.run(figures)
        sent = after[source]["spill"]
        assert sent["unspilled_to_send_bytes"] == 0, sent
        assert sent["unspilled_bytes"] == before["spill"]["unspilled_bytes"]
        received = sum(
            after[w]["spill"]["received_on_device_bytes"]
            + after[w]["spill"]["received_off_device_bytes"]
            for w in peers
        )
        assert received > 0, after
        for w in peers:
            assert after[w]["spill"]["tracked_bytes"] <= 256 * MIB + SIZE, after[w]
            # Every value a peer holds went through its rmm-rs stack (over UCX the device
            # frames were received into rmm-rs buffers).
            assert after[w]["stats"]["total_bytes"] >= SIZE, after[w]["stats"]
        checks = [
            client.submit(check, f, i, workers=[peers[i % len(peers)]], pure=False)
            for i, f in enumerate(kept)
        ]
        assert client.gather(checks) == [True] * N
        total = client.submit(lambda *xs: int(sum(int(x.sum()) for x in xs)), *kept).result()
        assert total == sum(int(make(i).sum()) for i in range(N))
