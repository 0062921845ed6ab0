# cython: language_level=3, embedsignature=True
# distutils: language = c++
"""The librmm resource over rmm-rs's exported C functions, as a subclass of RMM's
``rmm.mr.DeviceMemoryResource`` (see ``rmm_rs_resource.hpp`` for the C++ class)."""

from cython.operator cimport dereference as deref
from libc.stdint cimport uintptr_t
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional

from rmm.librmm.memory_resource cimport device_async_resource_ref
from rmm.pylibrmm.memory_resource cimport DeviceMemoryResource

from rmm_rs import _rmm_rs


cdef extern from "rmm_rs_resource.hpp" namespace "rmm_rs_librmm" nogil:
    ctypedef void* (*allocate_fn)(size_t, int, void*)
    ctypedef void (*deallocate_fn)(void*, size_t, int, void*)
    ctypedef int (*synchronize_fn)(int, void*)

    cdef cppclass rmm_rs_memory_resource:
        rmm_rs_memory_resource(
            allocate_fn, deallocate_fn, synchronize_fn, int
        ) noexcept


# The template defined by RMM's memory_resource.pxd (emitted with its cimport), for this type.
cdef extern from *:
    optional[device_async_resource_ref] make_device_async_resource_ref(
        rmm_rs_memory_resource&
    ) except +


cdef class RmmRsMemoryResource(DeviceMemoryResource):
    """A librmm memory resource that allocates from rmm-rs: ``device``'s current rmm-rs
    resource (its pool, once ``rmm_rs.initialize`` ran), through rmm-rs's exported C
    functions, with no Python and no GIL on the allocation path.

    Install it with ``rmm.mr.set_per_device_resource(device, mr)`` (or
    ``rmm_rs.allocators.rmm.install``): then RMM's Python (``rmm.DeviceBuffer``) and every
    librmm client in the process (libcudf, cuML, XGBoost: ``get_current_device_resource_ref()``)
    allocate from rmm-rs. Allocations keep librmm's stream order; a block freed after an
    ``rmm_rs.reinitialize`` goes back to the rmm-rs resource that allocated it. An allocation
    rmm-rs cannot make (after spilling, where ``spill.on_demand`` is on) raises
    ``MemoryError`` in Python (``rmm::out_of_memory`` in C++).

    ``functions``: the ``(allocate, deallocate, synchronize)`` addresses, by default
    ``rmm_rs._rmm_rs.librmm_functions()``.
    """

    cdef unique_ptr[rmm_rs_memory_resource] c_obj
    cdef readonly int device
    cdef readonly tuple functions

    def __init__(self, int device=0, functions=None):
        if device < 0:
            raise ValueError(
                f"RmmRsMemoryResource(device={device}): a device ordinal is 0 or more"
            )
        if functions is None:
            functions = _rmm_rs.librmm_functions()
        functions = tuple(functions)
        if len(functions) != 3 or not all(isinstance(f, int) and f > 0 for f in functions):
            raise ValueError(
                f"RmmRsMemoryResource(functions={functions!r}): expected the three "
                "function addresses of rmm_rs._rmm_rs.librmm_functions()"
            )
        cdef uintptr_t a = functions[0]
        cdef uintptr_t d = functions[1]
        cdef uintptr_t s = functions[2]
        self.device = device
        self.functions = functions
        self.c_obj.reset(new rmm_rs_memory_resource(
            <allocate_fn>a, <deallocate_fn>d, <synchronize_fn>s, device
        ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def __repr__(self):
        return f"RmmRsMemoryResource(device={self.device})"
