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
    assert rmm_rs.statistics()[0]["bytes_in_use"] == 8 << 20
    for p in ptrs:
        free(None, p, 0)
    assert _rmm_rs.live_allocations() == 0
    assert rmm_rs.statistics()[0]["bytes_in_use"] == 0
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
    assert rmm_rs.statistics()[0]["bytes_in_use"] == 3 << 20
    free(p, 3 << 20, 0, None)
    assert rmm_rs.statistics()[0]["bytes_in_use"] == 0


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
    assert rmm_rs.statistics()[0]["bytes_in_use"] == 1 << 20
    free(None, new, 0)
    assert _rmm_rs.live_allocations() == 0


def test_a_huge_request_is_null_not_a_crash():
    rmm_rs.initialize({"pool": {"enabled": True, "initial_size": "64MiB"}})
    malloc_addr, _ = _rmm_rs.cupy_functions()
    malloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(
        malloc_addr
    )
    assert not malloc(None, 1 << 55, 0)
