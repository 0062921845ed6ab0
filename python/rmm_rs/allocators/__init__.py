"""Allocators for other libraries, backed by rmm-rs's C functions (no Python per allocation).

``rmm_rs.allocators.cupy.install()`` and ``rmm_rs.allocators.torch.install()``. The ``cupy``
and ``torch`` modules load on first use, and import CuPy or PyTorch only when their functions
run.
"""

import importlib as _importlib
from typing import Any

__all__ = ["cupy", "torch"]


def __getattr__(name: str) -> Any:
    """``cupy`` and ``torch`` on first use."""
    if name in __all__:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'rmm_rs.allocators' has no attribute {name!r}")
