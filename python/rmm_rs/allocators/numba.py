"""Numba-CUDA allocations from rmm-rs: Numba's External Memory Management plugin (RAPIDS RMM's
``rmm.allocators.numba``).

``install()`` (or ``numba.cuda.set_memory_manager(RmmRsNumbaManager)``, or the variable
``NUMBA_CUDA_MEMORY_MANAGER=rmm_rs.allocators.numba`` set before Numba starts) makes every
device array Numba allocates an ``rmm_rs.DeviceBuffer`` of the context's device: from its
rmm-rs stack, counted by its statistics, under its limits. Importing this module imports
Numba.
"""

import ctypes
from typing import Any, Callable, Dict, Tuple

from numba import cuda
from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer

from .. import _rmm_rs

__all__ = ["RMMNumbaManager", "RmmRsNumbaManager", "install"]


def _device_pointer(address: int) -> Any:
    """``address`` as the Numba in use takes device pointers: a ``CUdeviceptr`` of NVIDIA's
    bindings, or a ``ctypes.c_uint64`` for a Numba on its own ctypes binding."""
    from numba.cuda.cudadrv import driver

    # Numba's own binding module (whichever cuda-python it found), when it uses one.
    binding = getattr(driver, "binding", None)
    if binding is not None and getattr(driver, "USE_NV_BINDING", True):
        return binding.CUdeviceptr(address)
    return ctypes.c_uint64(address)


def _forget(address: int, allocations: Dict[int, Any]) -> Callable[[], None]:
    """The finalizer of the allocation at ``address``: the buffer goes back to rmm-rs. After a
    context reset Numba has emptied ``allocations`` already, and nothing is left to do."""

    def finalizer() -> None:
        if allocations:
            allocations.pop(address, None)

    return finalizer


class RmmRsNumbaManager(HostOnlyCUDAMemoryManager):
    """Numba's memory manager over rmm-rs: device memory from the context's device's rmm-rs
    stack; host and pinned memory stay Numba's own."""

    def initialize(self) -> None:
        """Nothing to set up: rmm-rs serves any device."""

    def memalloc(self, size: int) -> MemoryPointer:
        """``size`` bytes on the context's device, as an ``rmm_rs.DeviceBuffer`` kept until
        Numba lets the pointer go. Raises ``rmm_rs.OutOfMemoryError`` (a ``MemoryError``)
        when rmm-rs finds no memory, after spilling where spilling is on."""
        device = int(self.context.device.id)
        # At least a byte: Numba keys its allocations by address, and every empty buffer's
        # address is 0.
        buf = _rmm_rs.DeviceBuffer(max(size, 1), device)
        address = int(buf.ptr)
        self.allocations[address] = buf
        return MemoryPointer(
            self.context,
            _device_pointer(address),
            size,
            finalizer=_forget(address, self.allocations),
        )

    def get_ipc_handle(self, memory: MemoryPointer) -> Any:
        """Refused: rmm-rs's pools are not exported through CUDA IPC handles of their
        allocations."""
        raise NotImplementedError(
            "rmm_rs.allocators.numba: rmm-rs memory has no CUDA IPC handle per allocation; "
            "copy the array into memory Numba allocates itself (without this manager) to "
            "share it, or move values between Dask workers with rmm_rs.dask.DeviceStore"
        )

    def get_memory_info(self) -> Tuple[int, int]:
        """``(free, total)`` bytes of the context's device, as the driver reports them."""
        return _rmm_rs.available_device_memory(int(self.context.device.id))

    @property
    def interface_version(self) -> int:
        """Numba's EMM interface version this manager implements."""
        return 1


#: RAPIDS RMM's name for the manager.
RMMNumbaManager = RmmRsNumbaManager

# What NUMBA_CUDA_MEMORY_MANAGER=rmm_rs.allocators.numba loads.
_numba_memory_manager = RmmRsNumbaManager


def install() -> None:
    """Makes Numba allocate device arrays from rmm-rs (Numba's ``set_memory_manager``); call
    it before the first allocation in each context."""
    cuda.set_memory_manager(RmmRsNumbaManager)
