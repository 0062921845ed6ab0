"""Allocators for other libraries, backed by rmm-rs's C functions (no Python per allocation).

``rmm_rs.allocators.cupy.install()``, ``rmm_rs.allocators.torch.mem_pool()`` (or
``install()``), ``rmm_rs.allocators.numba.install()`` (Numba's memory manager) and
``rmm_rs.allocators.rmm.install()`` (RAPIDS RMM and librmm's clients: cuDF, cuML, XGBoost).
The modules load on first use; ``cupy``, ``torch`` and ``rmm`` import their library only when
their functions run, ``numba`` as it loads.
"""

import importlib as _importlib
from typing import Any

__all__ = ["cupy", "numba", "rmm", "torch"]


def __getattr__(name: str) -> Any:
    """``cupy``, ``numba``, ``rmm`` and ``torch`` on first use."""
    if name in __all__:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'rmm_rs.allocators' has no attribute {name!r}")
