"""Tests of the rmm_rs package: on the simulated device unless RMM_BACKEND says otherwise
(the GPU machine sets RMM_BACKEND=cuda)."""

import os

os.environ.setdefault("RMM_BACKEND", "sim")
os.environ.setdefault("RMM_SIM_MEMORY", "2GiB")

import pytest  # noqa: E402

import rmm_rs  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_runtime():
    """Every test starts and ends without a runtime."""
    rmm_rs.finalize()
    yield
    rmm_rs.finalize()
