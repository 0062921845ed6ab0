"""The compiled librmm bridge (rmm_rs_librmm) for the tests that need it."""

import os
from types import ModuleType

import pytest


def librmm_bridge() -> ModuleType:
    """The compiled bridge module, or a visible skip where it is not built; a failure where
    it was built but does not import (``LIBRMM_BRIDGE_REQUIRED=1``, as scripts/gpu_bridge.sh
    sets)."""
    from rmm_rs.allocators import rmm as rr

    error = rr.bridge_error()
    if error is None:
        import rmm_rs_librmm

        return rmm_rs_librmm
    if os.environ.get("LIBRMM_BRIDGE_REQUIRED") == "1":
        pytest.fail(f"LIBRMM_BRIDGE_REQUIRED=1 but rmm_rs_librmm does not import: {error}")
    pytest.skip(f"the bridge rmm_rs_librmm is not built here ({error}): scripts/gpu_bridge.sh")
