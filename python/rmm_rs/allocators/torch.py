"""PyTorch allocations from rmm-rs, two ways.

* ``mem_pool()`` (recommended): a ``torch.cuda.MemPool`` over rmm-rs. Inside
  ``with torch.cuda.use_mem_pool(pool):`` PyTorch's caching allocator takes its segments from
  rmm-rs, so ``torch.cuda.memory_stats``, memory snapshots and CUDA-graph capture keep
  working, and an allocation rmm-rs cannot make (after spilling, where spilling is on) is
  PyTorch's own ``torch.OutOfMemoryError``.
* ``install()``: rmm-rs as PyTorch's process-wide allocator
  (``torch.cuda.memory.CUDAPluggableAllocator``), before PyTorch's first CUDA allocation, as
  ``change_current_allocator`` requires. PyTorch then has no statistics or snapshots, and it
  does not check the pointer an allocation function returns: a failed allocation becomes a
  tensor at address 0. Prefer ``mem_pool()``.
"""

from .. import _rmm_rs


def allocator():
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over rmm-rs's C functions."""
    from torch.cuda.memory import CUDAPluggableAllocator

    alloc, free = _rmm_rs.torch_functions()
    return CUDAPluggableAllocator(_rmm_rs.__file__, alloc, free)


def mem_pool():
    """A ``torch.cuda.MemPool`` whose segments come from rmm-rs; use it with
    ``torch.cuda.use_mem_pool(pool)``."""
    import torch

    pool = torch.cuda.MemPool(allocator()._allocator)
    return pool


def install():
    """Makes rmm-rs PyTorch's CUDA allocator in this process (see the module documentation
    for what PyTorch then lacks)."""
    from torch.cuda.memory import change_current_allocator

    alloc = allocator()
    change_current_allocator(alloc)
    return alloc
