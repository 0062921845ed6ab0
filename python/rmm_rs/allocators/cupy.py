"""CuPy allocations from rmm-rs: ``install()`` makes every ``cupy`` allocation go through the
device's rmm-rs stack, through C function pointers (``cupy.cuda.memory.CFunctionAllocator``).

CuPy does not check what a C ``malloc`` returns: an allocation rmm-rs could not make (after
spilling, where spilling is on) would become an array at address 0. The allocator installed
here turns that into CuPy's own ``cupy.cuda.memory.OutOfMemoryError``.
"""

from typing import Any, Protocol, cast

from .. import _rmm_rs


class CheckedMalloc(Protocol):
    """What :func:`checked` returns: CuPy's ``malloc(size)``, with the allocator it wraps."""

    allocator: Any

    def __call__(self, size: int) -> Any: ...


def allocator() -> Any:
    """A ``cupy.cuda.memory.CFunctionAllocator`` over rmm-rs. Its ``malloc`` method returns
    a null pointer when rmm-rs is out of memory: use :func:`malloc` (what ``install`` sets),
    which raises instead."""
    from cupy.cuda.memory import CFunctionAllocator

    malloc, free = _rmm_rs.cupy_functions()
    return CFunctionAllocator(0, malloc, free, _rmm_rs)


def checked(alloc: Any) -> CheckedMalloc:
    """``alloc.malloc`` that raises ``cupy.cuda.memory.OutOfMemoryError`` for a failed
    allocation instead of returning memory at address 0."""
    from cupy.cuda.memory import OutOfMemoryError

    raw = alloc.malloc

    def malloc(size: int) -> Any:
        mem = raw(size)
        if size and not mem.ptr:
            stats = _rmm_rs.device_statistics() if _rmm_rs.is_initialized() else {}
            in_use = sum(s["bytes_in_use"] for s in stats.values())
            raise OutOfMemoryError(size, in_use)
        return mem

    malloc.allocator = alloc  # type: ignore[attr-defined]  # keeps the C functions' owner alive with the function
    return cast(CheckedMalloc, malloc)


def install() -> Any:
    """Makes rmm-rs CuPy's allocator in this process (``cupy.cuda.set_allocator``); returns
    the ``CFunctionAllocator`` it wraps."""
    import cupy

    malloc = checked(allocator())
    install.current = malloc  # type: ignore[attr-defined]
    cupy.cuda.set_allocator(malloc)
    return malloc.allocator
