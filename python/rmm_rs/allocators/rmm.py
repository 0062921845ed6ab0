"""RAPIDS RMM allocations from rmm-rs: ``install()`` makes librmm's current device resource
an rmm-rs resource, so RMM's Python (``rmm.DeviceBuffer``, ``rmm.allocators.cupy``) and every
librmm client in the process (cuDF, cuML, XGBoost) allocate from rmm-rs's pool.

Two resources, one interface (``rmm.mr.DeviceMemoryResource``):

* the bridge, ``rmm_rs_librmm.RmmRsMemoryResource`` (the optional ``rmm-rs-librmm`` package,
  built against RMM's wheels): a C++ librmm resource over rmm-rs's exported C functions, with
  no Python and no GIL on the allocation path. ``install`` uses it when it is installed.
* the fallback, ``rmm.mr.CallbackMemoryResource`` whose Python callbacks call the same C
  functions through ctypes: it works everywhere RMM does, but each allocation and free takes
  the GIL (librmm clients allocating from C++ threads serialize on it). ``install`` says so
  once when it has to use it.

Either way the stream librmm passes goes to rmm-rs (allocations stay ordered on it), a block
freed after an ``rmm_rs.reinitialize`` goes back to the rmm-rs resource that allocated it, and
an allocation rmm-rs cannot make (after spilling, where ``spill.on_demand`` is on) raises
``MemoryError`` in Python (``rmm::out_of_memory`` in C++), as RMM's own resources do.
"""

import ctypes
import logging
import warnings
from typing import Any, Dict, Optional, Tuple

from .. import _rmm_rs

logger = logging.getLogger("rmm_rs.allocators")

_ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_DEALLOCATE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
)

# Set once the fallback's warning has been given (once per process).
_warned = False
# The resource install() last set, by device.
_installed: Dict[int, Any] = {}


def bridge_error() -> Optional[str]:
    """None when the compiled bridge (``rmm_rs_librmm``) imports; else why it does not."""
    try:
        import rmm_rs_librmm  # noqa: F401
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    return None


def _stream_handle(stream: Any) -> int:
    """The ``cudaStream_t`` of an ``rmm.pylibrmm.stream.Stream`` (0: the default stream)."""
    return int(stream.__cuda_stream__()[1]) if stream is not None else 0


def callback_resource(device: int = 0) -> Any:
    """``rmm.mr.CallbackMemoryResource`` over rmm-rs's C functions (through ctypes) for
    ``device``: the fallback when the bridge is not installed. Each allocation and free runs
    a Python callback (and so takes the GIL)."""
    import rmm.mr

    allocate_addr, deallocate_addr, _ = _rmm_rs.librmm_functions()
    c_allocate = _ALLOCATE(allocate_addr)
    c_deallocate = _DEALLOCATE(deallocate_addr)

    def allocate(size: int, stream: Any) -> int:
        ptr = c_allocate(size, device, _stream_handle(stream))
        if not ptr and size:
            raise MemoryError(
                f"rmm_rs: allocating {size} bytes on device {device} failed: rmm-rs is out "
                "of memory (after spilling, where spill.on_demand is on); free memory, or "
                "raise the pool's maximum_size or the device_memory_limit"
            )
        return ptr or 0

    def deallocate(ptr: int, size: int, stream: Any) -> None:
        c_deallocate(ptr, size, device, _stream_handle(stream))

    return rmm.mr.CallbackMemoryResource(allocate, deallocate)


def resource(device: int = 0) -> Any:
    """An ``rmm.mr.DeviceMemoryResource`` that allocates from ``device``'s current rmm-rs
    resource: the bridge when ``rmm_rs_librmm`` is installed, else (with a warning, once
    per process) :func:`callback_resource`. Nothing is installed."""
    global _warned
    try:
        from rmm_rs_librmm import RmmRsMemoryResource
    except ImportError as e:
        if not _warned:
            _warned = True
            message = (
                f"rmm_rs.allocators.rmm: the compiled bridge rmm_rs_librmm is not available "
                f"({e}); RMM allocations go through rmm.mr.CallbackMemoryResource instead, "
                "which takes the GIL on every allocation and free. Install rmm-rs-librmm "
                "(pip install --no-build-isolation python/librmm_bridge, next to RMM's wheels) "
                "for allocations without Python."
            )
            logger.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return callback_resource(device)
    return RmmRsMemoryResource(device)


def _devices(device: Optional[int]) -> Tuple[int, ...]:
    if device is not None:
        if device < 0:
            raise ValueError(f"install(device={device}): a device ordinal is 0 or more")
        return (device,)
    if _rmm_rs.is_initialized():
        return tuple(_rmm_rs.devices())
    return (0,)


def install(device: Optional[int] = None) -> Dict[int, Any]:
    """Makes rmm-rs librmm's resource for ``device`` (``rmm.mr.set_per_device_resource``),
    or, with ``device=None``, for every device rmm-rs runs on (device 0 before
    ``rmm_rs.initialize``). Returns the installed resources by device.

    The resource looks up the device's current rmm-rs resource on every allocation, so it
    stays valid across ``rmm_rs.reinitialize`` and ``rmm_rs.finalize`` (after which it
    allocates with plain ``cuMemAlloc``): install it once per process."""
    import rmm.mr

    installed = {}
    for d in _devices(device):
        mr = resource(d)
        rmm.mr.set_per_device_resource(d, mr)
        installed[d] = mr
    _installed.update(installed)
    return installed


def is_installed(device: int = 0) -> bool:
    """True when librmm's resource for ``device`` is the one :func:`install` set."""
    import rmm.mr

    mine = _installed.get(device)
    return mine is not None and rmm.mr.get_per_device_resource(device) is mine
