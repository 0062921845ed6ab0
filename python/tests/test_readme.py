"""The README's Python and Dask snippets, run as written (taken from the README itself).

The first two snippets run in a child process of their own, in a directory outside the
repository (they read no file), on a simulated device large enough for their 8 GiB pool
(unless ``RMM_BACKEND`` says otherwise). Every snippet, as one script, passes
``mypy --strict``. The Dask snippets need a client, CuPy (named in
``rmm_allocator_external_lib_list``) or dask-cuda: each runs where its packages are
installed and says why it is skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import readme_snippets

ROOT = Path(__file__).resolve().parents[2]


def python_snippets():
    """The README's ```python blocks, in order."""
    return readme_snippets.python_snippets(ROOT / "README.md")


def snippet(*words):
    """The one snippet that holds every one of `words`."""
    found = [b for b in python_snippets() if all(w in b for w in words)]
    assert len(found) == 1, f"{len(found)} README snippets hold {words}"
    return found[0]


def test_the_readme_has_the_snippets_these_tests_run():
    assert len(python_snippets()) >= 4


def test_the_quick_start_and_statistics_snippets_run_as_written(tmp_path):
    code = snippet("rmm_rs.initialize(") + snippet("profiler")
    env = dict(os.environ)
    if env.get("RMM_BACKEND", "sim") == "sim":
        # One process of its own: the simulated device's size is read once per process.
        env.update(RMM_BACKEND="sim", RMM_SIM_MEMORY="16GiB")
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,  # any directory: the snippets read no file
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # The profiler's report names the function the snippet decorated.
    assert "load" in out.stdout and "memory_peak" in out.stdout, out.stdout


def test_the_dask_plugin_snippet_runs_as_written(monkeypatch):
    # `cargo xtask test` installs CuPy, which imports and takes an allocator without a GPU.
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("the snippet names CuPy in rmm_allocator_external_lib_list; CuPy is not installed")
    from clusters import local_cluster

    import rmm_rs

    if os.environ.get("RMM_BACKEND", "sim") == "sim":
        # The workers' simulated device, sized like an H100 without backing memory: the
        # snippet's 24 GB pool takes no host memory.
        monkeypatch.setenv("RMM_SIM_MEMORY", "80GiB")
        monkeypatch.setenv("RMM_SIM_MODE", "unbacked")
    import dask

    with local_cluster() as cluster:
        # The snippet's `Client()` connects to the scheduler Dask's configuration names.
        with dask.config.set({"scheduler-address": cluster.scheduler_address}):
            scope: dict = {}
            exec(snippet("RMMRsPlugin("), scope)
        client = scope["client"]
        try:
            assert client.scheduler.address == cluster.scheduler_address
            stats = client.run(rmm_rs.device_statistics)
            allocators = client.run(lambda: cupy_allocator_module())
        finally:
            client.close()
    assert len(stats) == 2
    # The snippet's rmm_allocator_external_lib_list put CuPy on rmm-rs in every worker.
    assert set(allocators.values()) == {"rmm_rs.allocators.cupy"}, allocators


def cupy_allocator_module():
    import cupy

    return getattr(cupy.cuda.get_allocator(), "__module__", None)


def test_the_dask_cuda_snippet_runs_as_written():
    if importlib.util.find_spec("dask_cuda") is None:
        pytest.skip("the snippet is dask-cuda's LocalCUDACluster; dask-cuda is not installed")
    scope: dict = {}
    exec(snippet("LocalCUDACluster(data="), scope)
    cluster = scope["cluster"]
    try:
        from distributed import Client

        with Client(cluster) as client:
            assert client.submit(lambda: 1 + 1).result() == 2
            data = client.run(lambda dask_worker: type(dask_worker.data).__name__)
            assert set(data.values()) == {"DeviceStore"}, data
    finally:
        cluster.close()


def test_the_readme_snippets_type_check_under_mypy_strict(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed")
    # One script of every snippet in order (each goes on from the ones before it). Dask's
    # own functions are not annotated: calls into them are not this package's to type.
    path = tmp_path / "readme.py"
    path.write_text("\n".join(python_snippets()))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports",
         "--untyped-calls-exclude=distributed", "--untyped-calls-exclude=dask_cuda",
         "--no-incremental", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, path.read_text() + out.stdout + out.stderr
