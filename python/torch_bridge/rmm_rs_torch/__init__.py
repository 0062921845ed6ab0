"""rmm-rs as PyTorch's process-wide allocator, with out-of-memory errors: the allocation
function of :data:`LIBRARY` (``rmm_rs_torch_malloc``) calls rmm-rs's and, when rmm-rs has no
memory for a request (after spilling, where ``spill.on_demand`` is on), throws
``c10::OutOfMemoryError``, which PyTorch raises as ``torch.OutOfMemoryError``. rmm-rs's own C
functions return null there, which ``CUDAPluggableAllocator`` does not check.

``rmm_rs.allocators.torch.install()`` uses this package when it is installed. Importing it
imports PyTorch (whose ``libc10.so`` the shim links) and connects the shim to rmm-rs.
"""

import ctypes
from typing import Tuple

import torch  # noqa: F401  (loads libc10.so before the shim)

from rmm_rs import _rmm_rs

from . import _shim
from ._shim import allocate, deallocate

__all__ = ["LIBRARY", "allocate", "deallocate", "functions"]

#: The shared library that holds the allocation and free functions: the path to pass to
#: ``torch.cuda.memory.CUDAPluggableAllocator``.
LIBRARY: str = _shim.__file__


def functions() -> Tuple[str, str]:
    """``(malloc, free)``: the names of the functions in :data:`LIBRARY`, for
    ``CUDAPluggableAllocator(LIBRARY, malloc, free)``."""
    return (_shim.MALLOC, _shim.FREE)


def _connect() -> None:
    """Gives the shim the addresses of rmm-rs's C functions (``rmm_rs_torch_alloc`` and
    ``rmm_rs_torch_free``, exported by the ``rmm_rs`` extension)."""
    library = ctypes.CDLL(_rmm_rs.__file__)
    alloc, free = (
        ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0
        for name in _rmm_rs.torch_functions()
    )
    _shim.set_functions(alloc, free)


_connect()
