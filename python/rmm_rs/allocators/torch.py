"""PyTorch allocations from rmm-rs: ``install()`` makes rmm-rs PyTorch's CUDA allocator
(``torch.cuda.memory.CUDAPluggableAllocator`` over C functions of this package's extension).
It must run before PyTorch's first CUDA allocation, as ``change_current_allocator`` requires.
"""

from .. import _rmm_rs


def allocator():
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over rmm-rs."""
    from torch.cuda.memory import CUDAPluggableAllocator

    alloc, free = _rmm_rs.torch_functions()
    return CUDAPluggableAllocator(_rmm_rs.__file__, alloc, free)


def install():
    """Makes rmm-rs PyTorch's CUDA allocator in this process."""
    from torch.cuda.memory import change_current_allocator

    alloc = allocator()
    change_current_allocator(alloc)
    return alloc
