"""CuPy allocations from rmm-rs: ``install()`` makes every ``cupy`` allocation go through the
device's rmm-rs stack, through C function pointers (``cupy.cuda.memory.CFunctionAllocator``).
"""

from .. import _rmm_rs


def allocator():
    """A ``cupy.cuda.memory.CFunctionAllocator`` over rmm-rs (its ``malloc`` method is what
    ``cupy.cuda.set_allocator`` takes)."""
    from cupy.cuda.memory import CFunctionAllocator

    malloc, free = _rmm_rs.cupy_functions()
    return CFunctionAllocator(0, malloc, free, _rmm_rs)


def install():
    """Makes rmm-rs CuPy's allocator in this process (``cupy.cuda.set_allocator``)."""
    import cupy

    alloc = allocator()
    # Keep the allocator alive as long as CuPy uses its bound method.
    install.current = alloc
    cupy.cuda.set_allocator(alloc.malloc)
    return alloc
