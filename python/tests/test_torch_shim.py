"""The shim ``rmm_rs_torch`` (python/torch_bridge): PyTorch's pluggable-allocator functions over
rmm-rs, called as PyTorch calls them, with no GPU needed (on the simulated device unless
RMM_BACKEND says otherwise), and its C++ driver (python/torch_bridge/tests/shim_driver.cpp).

Skipped, saying so, where PyTorch or the shim is not installed (as in CI). Where the shim is
expected (scripts/gpu_bridge.sh built it: ``TORCH_SHIM_REQUIRED=1``), a shim that does not
import fails."""

import ctypes
import os
import pathlib
import shutil
import subprocess

import pytest

import rmm_rs
from rmm_rs import _rmm_rs
from rmm_rs.allocators import torch as rt

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the rmm-rs-torch shim needs it"
)

DRIVER = pathlib.Path(__file__).parents[1] / "torch_bridge" / "tests" / "shim_driver.cpp"
POOL = {"pool": {"enabled": True, "initial_size": "64MiB"}}


@pytest.fixture
def shim():
    """The shim module, or a visible skip (a failure where it is required)."""
    error = rt.shim_error()
    if error is None:
        import rmm_rs_torch

        return rmm_rs_torch
    if os.environ.get("TORCH_SHIM_REQUIRED") == "1":
        pytest.fail(f"TORCH_SHIM_REQUIRED=1 but rmm_rs_torch does not import: {error}")
    pytest.skip(
        f"the shim rmm_rs_torch is not built here ({error}): pip install "
        "--no-build-isolation python/torch_bridge"
    )


def in_use():
    return rmm_rs.device_statistics()[0]["bytes_in_use"]


def test_the_library_exports_pytorchs_functions(shim):
    library = ctypes.CDLL(shim.LIBRARY)
    for name in (*shim.functions(), "rmm_rs_torch_set_functions"):
        assert getattr(library, name)
    assert shim.functions() == ("rmm_rs_torch_malloc", "rmm_rs_torch_free")


def test_the_shim_allocates_from_rmm_rs_and_frees_into_it(shim):
    rmm_rs.initialize(POOL)
    ptrs = [shim.allocate(3 << 20, 0, 0) for _ in range(4)]
    assert all(ptrs) and len(set(ptrs)) == 4
    assert in_use() == 12 << 20
    assert _rmm_rs.live_allocations() == 4
    for p in ptrs:
        shim.deallocate(p, 3 << 20, 0, 0)
    assert in_use() == 0 and _rmm_rs.live_allocations() == 0
    # An empty request: null, which is no failure.
    assert shim.allocate(0) == 0


def test_an_allocation_rmm_rs_cannot_make_raises_torchs_out_of_memory_error(shim):
    rmm_rs.initialize(POOL)
    with pytest.raises(torch.OutOfMemoryError) as e:
        shim.allocate(1 << 48, 0)
    message = str(e.value)
    for part in ("281474976710656 bytes", "device 0", "maximum_size", "device_memory_limit"):
        assert part in message, (part, message)
    # Nothing was left allocated, and the next allocation works.
    assert in_use() == 0
    p = shim.allocate(1 << 20)
    assert p and in_use() == 1 << 20
    shim.deallocate(p, 1 << 20)


def test_the_cpp_driver_catches_c10s_out_of_memory_error(tmp_path):
    # The functions alone (shim.cpp), against fake rmm-rs functions: what PyTorch's C++ sees.
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed: the shim's C++ driver cannot be built")
    from torch.utils.cpp_extension import include_paths, library_paths

    exe = tmp_path / "shim_driver"
    lib = library_paths()[0]
    sources = [str(DRIVER.parents[1] / "rmm_rs_torch" / "shim.cpp"), str(DRIVER)]
    # The C++ ABI PyTorch was built with (its older wheels used the pre-C++11 one).
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    includes = [abi, *(f"-I{p}" for p in include_paths())]
    link = [f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}", "-o", str(exe)]
    build = subprocess.run(
        [gxx, "-std=c++17", "-O1", *includes, *sources, *link], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "checks passed" in run.stdout, run.stdout + run.stderr
