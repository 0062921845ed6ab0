"""Allocators for other libraries, backed by rmm-rs's C functions (no Python per allocation).

``rmm_rs.allocators.cupy.install()``, ``rmm_rs.allocators.torch.mem_pool()`` (or
``install()``) and ``rmm_rs.allocators.rmm.install()`` (RAPIDS RMM and librmm's clients: cuDF,
cuML, XGBoost). The ``cupy``, ``torch`` and ``rmm`` modules load on first use, and import
CuPy, PyTorch or RMM only when their functions run.
"""

import importlib as _importlib
from typing import Any

__all__ = ["cupy", "rmm", "torch"]


def __getattr__(name: str) -> Any:
    """``cupy``, ``rmm`` and ``torch`` on first use."""
    if name in __all__:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'rmm_rs.allocators' has no attribute {name!r}")
