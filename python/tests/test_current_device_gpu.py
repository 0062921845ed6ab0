"""On a machine with two GPUs or more (RMM_BACKEND=cuda, CuPy installed): buffers made without
a device go to the device current on the calling thread, as RMM's do, including the device
that CuPy made current. Skipped, saying so, elsewhere (as in CI)."""

import os

import pytest

if os.environ.get("RMM_BACKEND", "").lower() != "cuda":
    pytest.skip("needs GPUs: run with RMM_BACKEND=cuda", allow_module_level=True)
cupy = pytest.importorskip("cupy")
if cupy.cuda.runtime.getDeviceCount() < 2:
    pytest.skip("needs two GPUs or more", allow_module_level=True)

import rmm_rs  # noqa: E402


def test_a_buffer_goes_to_the_device_cupy_made_current():
    rmm_rs.initialize(None, {"devices": [0, 1]})
    with cupy.cuda.Device(1):
        assert rmm_rs._rmm_rs.current_device() == 1
        one = rmm_rs.DeviceBuffer(1 << 20)
        copied = rmm_rs.DeviceBuffer.from_bytes(b"on the current device")
        assert (one.device, copied.device) == (1, 1)
        assert copied.to_bytes() == b"on the current device"
        # An explicit device still wins.
        assert rmm_rs.DeviceBuffer(16, 0).device == 0
    with cupy.cuda.Device(0):
        assert rmm_rs.DeviceBuffer(16).device == 0
    stats = rmm_rs.device_statistics()
    assert stats[1]["bytes_in_use"] >= 1 << 20


def test_the_numba_plugin_serves_each_device_from_its_own_stack():
    numba_cuda = pytest.importorskip("numba.cuda", reason="Numba-CUDA is not installed")
    import numpy as np

    from rmm_rs.allocators import numba as rmm_rs_numba

    rmm_rs.initialize(None, {"devices": [0, 1]})
    rmm_rs_numba.install()
    host = np.arange(1 << 18, dtype=np.float64)
    before = rmm_rs.device_statistics()[1]["bytes_in_use"]
    with numba_cuda.gpus[1]:
        arr = numba_cuda.to_device(host)
        assert rmm_rs.device_statistics()[1]["bytes_in_use"] >= before + host.nbytes
        assert (arr.copy_to_host() == host).all()
        del arr
        numba_cuda.current_context().deallocations.clear()
    assert rmm_rs.device_statistics()[1]["bytes_in_use"] == before
