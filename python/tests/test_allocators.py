"""The C functions behind the CuPy and PyTorch allocators, called through ctypes (CuPy and
PyTorch themselves are exercised on the GPU machine by python/bench/allocators.py)."""

import ctypes

import rmm_rs
from rmm_rs import _rmm_rs


def test_cupy_functions_allocate_from_the_stack_and_free_by_address():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    malloc_addr, free_addr = _rmm_rs.cupy_functions()
    malloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(
        malloc_addr
    )
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(free_addr)
    ptrs = [malloc(None, 1 << 20, 0) for _ in range(8)]
    assert all(ptrs) and len(set(ptrs)) == 8
    assert _rmm_rs.live_allocations() == 8
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 8 << 20
    for p in ptrs:
        free(None, p, 0)
    assert _rmm_rs.live_allocations() == 0
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 0
    # Too large for the device: null, as CuPy expects for out of memory.
    assert not malloc(None, 1 << 50, 0)


def test_torch_functions_are_exported_by_the_extension():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    lib = ctypes.CDLL(_rmm_rs.__file__)
    alloc_name, free_name = _rmm_rs.torch_functions()
    alloc = getattr(lib, alloc_name)
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free = getattr(lib, free_name)
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    p = alloc(3 << 20, 0, None)
    assert p
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 3 << 20
    free(p, 3 << 20, 0, None)
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 0


def test_a_late_free_goes_to_the_resource_that_allocated():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    malloc_addr, free_addr = _rmm_rs.cupy_functions()
    malloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(
        malloc_addr
    )
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(free_addr)
    old = malloc(None, 1 << 20, 0)
    rmm_rs.finalize()
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    new = malloc(None, 1 << 20, 0)
    free(None, old, 0)  # into the old pool, not the new one
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 1 << 20
    free(None, new, 0)
    assert _rmm_rs.live_allocations() == 0


def test_a_huge_request_is_null_not_a_crash():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    malloc_addr, _ = _rmm_rs.cupy_functions()
    malloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(
        malloc_addr
    )
    assert not malloc(None, 1 << 55, 0)


def test_the_installed_cupy_malloc_raises_cupys_out_of_memory_error_not_address_0(monkeypatch):
    """What ``rmm_rs.allocators.cupy.install()`` sets, on the simulated device: CuPy is not
    installed here, so a stand-in for ``cupy.cuda.memory`` gives the two names the wrapper
    uses, with a ``CFunctionAllocator`` that calls rmm-rs's real C ``malloc`` as CuPy's
    does (and, like CuPy's, does not look at what it returns). On the GPU,
    ``test_gpu_store.py`` runs the same path through CuPy itself."""
    import sys
    import types

    from rmm_rs.allocators import cupy as rmm_cupy

    class OutOfMemoryError(MemoryError):
        def __init__(self, size, total):
            super().__init__(size, total)
            self.size, self.total = size, total

    class Memory:
        def __init__(self, ptr):
            self.ptr = ptr or 0

    class CFunctionAllocator:
        def __init__(self, param, malloc, free, owner):
            sig = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            self._malloc = sig(malloc)
            self._free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(free)
            self.owner = owner

        def malloc(self, size):
            return Memory(self._malloc(None, size, 0))

        def free(self, mem):
            self._free(None, mem.ptr, 0)

    def module(name, **attributes):
        m = types.ModuleType(name)
        m.__dict__.update(attributes)
        return m

    memory = module(
        "cupy.cuda.memory", OutOfMemoryError=OutOfMemoryError, CFunctionAllocator=CFunctionAllocator
    )
    cuda = module("cupy.cuda", memory=memory)
    cupy = module("cupy", cuda=cuda)
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.memory", memory)):
        monkeypatch.setitem(sys.modules, name, module)

    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    malloc = rmm_cupy.checked(rmm_cupy.allocator())
    mem = malloc(1 << 20)
    assert mem.ptr, "a request that fits is served"
    assert rmm_rs.device_statistics()[0]["bytes_in_use"] == 1 << 20
    # The unchecked malloc hands CuPy address 0 for a request rmm-rs cannot serve: the
    # failure the wrapper exists for.
    assert not malloc.allocator.malloc(1 << 50).ptr
    try:
        malloc(1 << 50)
    except OutOfMemoryError as e:
        assert e.size == 1 << 50
        assert e.total == 1 << 20, "the error reports the bytes in use"
    else:
        raise AssertionError("a failed allocation came back as memory at address 0")
    malloc.allocator.free(mem)
    assert _rmm_rs.live_allocations() == 0
