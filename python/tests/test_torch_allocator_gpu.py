"""``rmm_rs.allocators.torch.install()`` without the shim ``rmm_rs_torch``, on a GPU: it still
makes rmm-rs PyTorch's allocator, and says once why a failed allocation will not raise (the
shim's own path: test_gpu_store.py, test_torch_shim.py). Each case runs in a fresh process:
PyTorch's allocator is set once per process.

Skipped, saying so, where PyTorch or a GPU is absent (as in CI)."""

import os
import subprocess
import sys
import textwrap

import pytest

if os.environ.get("RMM_BACKEND", "").lower() != "cuda":
    pytest.skip("needs a GPU: run with RMM_BACKEND=cuda", allow_module_level=True)
pytest.importorskip("torch", reason="PyTorch is not installed")


def test_without_the_shim_install_warns_once_and_still_allocates_from_rmm_rs():
    code = textwrap.dedent(
        """
        import sys, warnings
        sys.modules["rmm_rs_torch"] = None  # as if the shim were not installed
        import torch, rmm_rs
        from rmm_rs.allocators import torch as rt
        rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "1GiB"}})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rt.install()
        shim = [str(w.message) for w in caught if "rmm_rs_torch" in str(w.message)]
        print("warnings", len(shim), "mem_pool()" in shim[0] if shim else None)
        x = torch.ones(1024, device="cuda")
        print("after", float(x.sum()), rmm_rs.device_statistics()[0]["bytes_in_use"] >= 4096)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    log = out.stdout + out.stderr[-2000:]
    assert out.returncode == 0, log
    assert "warnings 1 True" in out.stdout, log
    assert "after 1024.0 True" in out.stdout, log


def test_use_mem_pool_puts_backwards_allocations_on_rmm_rs_too():
    # PyTorch's use_mem_pool is active on the entering thread only; backward runs on the
    # autograd engine's thread unless its multithreading is off, as use_mem_pool() turns it.
    code = textwrap.dedent(
        """
        import threading
        import torch, rmm_rs
        from rmm_rs.allocators import torch as rt
        rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "1GiB"}})
        threads = set()
        class Note(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2
            @staticmethod
            def backward(ctx, g):
                threads.add(threading.get_ident())
                return g * 2
        for name, ctx in [("plain", lambda: torch.cuda.use_mem_pool(rt.mem_pool())),
                          ("rmm-rs", rt.use_mem_pool)]:
            threads.clear()
            with ctx():
                x = torch.ones(1 << 20, device="cuda", requires_grad=True)
                Note.apply(x).sum().backward()
            print(name, threading.get_ident() in threads)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    log = out.stdout + out.stderr[-2000:]
    assert out.returncode == 0, log
    assert "plain False" in out.stdout, log
    assert "rmm-rs True" in out.stdout, log
