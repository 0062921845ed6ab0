"""PyTorch allocations from rmm-rs, two ways.

* ``mem_pool()``: a ``torch.cuda.MemPool`` over rmm-rs. Inside
  ``with torch.cuda.use_mem_pool(pool):`` PyTorch's caching allocator takes its segments from
  rmm-rs, so ``torch.cuda.memory_stats``, memory snapshots and CUDA-graph capture keep
  working, and an allocation rmm-rs cannot make (after spilling, where spilling is on) is
  PyTorch's own ``torch.OutOfMemoryError``. PyTorch's pool holds for the thread that enters
  it only, and backward runs on PyTorch's autograd thread (PyTorch issue 167353): enter it
  through :func:`use_mem_pool`, which runs backward on the calling thread, so that backward's
  allocations come from rmm-rs too instead of a second cache. PyTorch keeps the segments it
  took: give rmm-rs's pool a ``"2MiB"`` ``initial_size`` and ``growth`` so that it follows
  them rather than caching a second time.
* ``install()`` (for training): rmm-rs as PyTorch's process-wide allocator
  (``torch.cuda.memory.CUDAPluggableAllocator``), before PyTorch's first CUDA allocation, as
  ``change_current_allocator`` requires. PyTorch then has no statistics or snapshots. It does
  not check the pointer an allocation function returns either, so ``install`` uses the
  functions of the optional ``rmm-rs-torch`` package (``rmm_rs_torch``, built against the
  installed PyTorch), which raise ``torch.OutOfMemoryError`` where rmm-rs is out of memory.
  Without that package it falls back to rmm-rs's own C functions, saying so once: a failed
  allocation then becomes a tensor at address 0.

With ``install()`` PyTorch's own ``torch.cuda.memory_stats()`` and its peaks see nothing:
this module's functions of the same names read rmm-rs's figures instead, keyed as PyTorch
keys them (``memory_stats``, ``memory_allocated``, ``max_memory_allocated``,
``memory_reserved``, ``max_memory_reserved``, ``reset_peak_memory_stats``), so a training
script logs them as it would PyTorch's. Allocated bytes are the sizes PyTorch asked for;
reserved bytes are what rmm-rs's pool holds from the device.
"""

import contextlib
import logging
import warnings
from typing import Any, Dict, Iterator, Optional

from .. import _rmm_rs

logger = logging.getLogger("rmm_rs.allocators")

# Set once the fallback's warning has been given (once per process).
_warned = False


def shim_error() -> Optional[str]:
    """None when the shim (``rmm_rs_torch``) imports; else why it does not."""
    try:
        import rmm_rs_torch  # noqa: F401
    except (ImportError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def allocator() -> Any:
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over rmm-rs's own C functions, which
    return null when rmm-rs is out of memory (``mem_pool()``'s caching allocator checks for
    that; a process-wide allocator does not: see :func:`checked_allocator`)."""
    from torch.cuda.memory import CUDAPluggableAllocator

    alloc, free = _rmm_rs.torch_functions()
    return CUDAPluggableAllocator(_rmm_rs.__file__, alloc, free)


def checked_allocator() -> Any:
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over the shim's functions (the optional
    ``rmm-rs-torch`` package): an allocation rmm-rs cannot make raises
    ``torch.OutOfMemoryError``. ``ImportError`` (or ``OSError``) when the shim is not
    installed or does not load."""
    from torch.cuda.memory import CUDAPluggableAllocator

    import rmm_rs_torch

    alloc, free = rmm_rs_torch.functions()
    return CUDAPluggableAllocator(rmm_rs_torch.LIBRARY, alloc, free)


def mem_pool() -> Any:
    """A ``torch.cuda.MemPool`` whose segments come from rmm-rs; use it with
    ``torch.cuda.use_mem_pool(pool)``."""
    import torch

    pool = torch.cuda.MemPool(allocator()._allocator)
    return pool


@contextlib.contextmanager
def use_mem_pool(pool: Optional[Any] = None, device: Any = None) -> Iterator[Any]:
    """``torch.cuda.use_mem_pool`` over rmm-rs (``pool``, by default a new :func:`mem_pool`),
    with autograd's worker threads turned off inside
    (``torch.autograd.set_multithreading_enabled(False)``): backward then runs on this
    thread, where the pool is active, and its allocations come from rmm-rs as the forward
    pass's do. Yields the pool.

    PyTorch's ``use_mem_pool`` alone is active on the thread that enters it only, and backward
    runs on the autograd engine's thread, which would allocate from PyTorch's default pool."""
    import torch

    pool = mem_pool() if pool is None else pool
    with torch.autograd.set_multithreading_enabled(False):
        with torch.cuda.use_mem_pool(pool, device=device):
            yield pool


def install() -> Any:
    """Makes rmm-rs PyTorch's CUDA allocator in this process and returns the
    ``CUDAPluggableAllocator``: :func:`checked_allocator` when the shim ``rmm_rs_torch`` is
    installed, else (with a warning, once per process) :func:`allocator`, whose failed
    allocations PyTorch does not notice. See the module documentation for what PyTorch lacks
    either way."""
    global _warned
    from torch.cuda.memory import change_current_allocator

    try:
        alloc = checked_allocator()
    except (ImportError, OSError) as e:
        if not _warned:
            _warned = True
            message = (
                f"rmm_rs.allocators.torch.install: the shim rmm_rs_torch is not available "
                f"({type(e).__name__}: {e}); PyTorch's CUDAPluggableAllocator does not check "
                "the pointer an allocation returns, so without the shim an allocation rmm-rs "
                "cannot make becomes a tensor at address 0 instead of torch.OutOfMemoryError. "
                "Install rmm-rs-torch (pip install --no-build-isolation python/torch_bridge, "
                "next to PyTorch), or allocate through rmm_rs.allocators.torch.mem_pool(), "
                "which raises torch.OutOfMemoryError already."
            )
            logger.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        alloc = allocator()
    change_current_allocator(alloc)
    return alloc


def _device_index(device: Any) -> Optional[int]:
    """An int for rmm-rs from PyTorch's ways of naming a device (None, an int, a
    ``torch.device``, ``"cuda:1"``); None is the calling thread's current device."""
    if device is None or isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, number = device.partition(":")
        if kind == "cuda" and (not number or number.isdigit()):
            return int(number) if number else None
    elif hasattr(device, "type") and hasattr(device, "index"):
        return None if device.index is None else int(device.index)
    raise TypeError(f"device {device!r}: pass None, an int, a torch.device or 'cuda:N'")


def memory_stats(device: Any = None) -> Dict[str, int]:
    """rmm-rs's figures for ``device`` under ``torch.cuda.memory_stats()``'s key names
    (``allocated_bytes.all.current`` and ``.peak``, ``reserved_bytes.all.current`` and
    ``.peak``, ``allocation.all.*``, ``num_alloc_retries``, ``num_ooms``); empty where the
    device's resource keeps no statistics (as PyTorch's is before its first allocation)."""
    return dict(_rmm_rs.memory_stats(_device_index(device)) or {})


def memory_allocated(device: Any = None) -> int:
    """Bytes allocated through rmm-rs on ``device`` now (``torch.cuda.memory_allocated``)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    """The most bytes allocated at once since the start or the last
    :func:`reset_peak_memory_stats` (``torch.cuda.max_memory_allocated``)."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    """Bytes rmm-rs's pool holds from the device now (``torch.cuda.memory_reserved``); 0
    without a pool."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    """The most bytes the pool held since the start or the last
    :func:`reset_peak_memory_stats` (``torch.cuda.max_memory_reserved``)."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Makes every peak the current value (``torch.cuda.reset_peak_memory_stats``):
    allocated bytes and allocations, and the pool's reserved bytes."""
    _rmm_rs.reset_peak_memory_stats(_device_index(device))
