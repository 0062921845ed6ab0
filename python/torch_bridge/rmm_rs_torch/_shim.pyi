# The extension module rmm_rs_torch._shim (module.cpp, around shim.cpp).

#: The names of the pluggable allocator's functions in this module's shared library.
MALLOC: str
FREE: str

def set_functions(alloc: int, free: int) -> None:
    """Connects the shim to rmm-rs: the addresses of its C functions ``rmm_rs_torch_alloc``
    and ``rmm_rs_torch_free`` (importing ``rmm_rs_torch`` passes them)."""

def allocate(size: int, device: int = 0, stream: int = 0) -> int:
    """Calls ``rmm_rs_torch_malloc`` as PyTorch does: the address (0 for size 0), or
    ``torch.OutOfMemoryError`` when rmm-rs has no memory for the request."""

def deallocate(ptr: int, size: int, device: int = 0, stream: int = 0) -> None:
    """Calls ``rmm_rs_torch_free`` as PyTorch does."""
