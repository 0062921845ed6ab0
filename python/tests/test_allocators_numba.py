"""Numba's device arrays from rmm-rs (rmm_rs.allocators.numba): on a GPU with Numba-CUDA,
arrays are rmm-rs buffers of the context's device, counted by its statistics, freed when
Numba lets them go, and the manager reports the device's memory. Skipped (saying why) where
Numba or a GPU is missing: it needs a CUDA context."""

import os

import pytest

import rmm_rs

numba_cuda = pytest.importorskip("numba.cuda", reason="Numba-CUDA is not installed")

pytestmark = pytest.mark.skipif(
    os.environ.get("RMM_BACKEND", "sim") == "sim" or not numba_cuda.is_available(),
    reason="Numba's memory manager needs a GPU (RMM_BACKEND=cuda and a CUDA device)",
)


def test_numba_device_arrays_are_rmm_rs_buffers():
    import numpy as np

    from rmm_rs.allocators import numba as rmm_rs_numba

    rmm_rs.initialize(None, {"pool.enabled": True, "pool.initial_size": "256MiB"})
    rmm_rs_numba.install()
    before = rmm_rs.device_statistics()[0]["bytes_in_use"]
    host = np.arange(1 << 20, dtype=np.float64)
    arr = numba_cuda.to_device(host)
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] >= before + host.nbytes
    assert (arr.copy_to_host() == host).all()
    ctx = numba_cuda.current_context()
    assert isinstance(ctx.memory_manager, rmm_rs_numba.RmmRsNumbaManager)
    free, total = ctx.get_memory_info()
    assert 0 < free <= total
    del arr
    ctx.deallocations.clear()
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == before
    assert rmm_rs_numba.RMMNumbaManager is rmm_rs_numba.RmmRsNumbaManager
