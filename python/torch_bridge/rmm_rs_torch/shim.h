// PyTorch's pluggable-allocator functions over rmm-rs (torch.cuda.memory.CUDAPluggableAllocator
// loads this library and calls them): rmm_rs_torch_malloc forwards to rmm-rs's exported
// allocation function and throws c10::OutOfMemoryError when rmm-rs has no memory for the
// request, which PyTorch's Python binding raises as torch.OutOfMemoryError.
#pragma once

#include <sys/types.h>

#define RMM_RS_TORCH_EXPORT __attribute__((visibility("default")))

extern "C" {

/// rmm-rs's allocation and free functions (python/src/allocators.rs: rmm_rs_torch_alloc and
/// rmm_rs_torch_free, whose signatures are PyTorch's): the allocation returns null when rmm-rs
/// is out of memory, after its own spill and retry.
typedef void* (*rmm_rs_torch_alloc_fn)(ssize_t size, int device, void* stream);
typedef void (*rmm_rs_torch_free_fn)(void* ptr, ssize_t size, int device, void* stream);

/// Connects the shim to rmm-rs (the rmm_rs_torch package does so on import). Until then,
/// rmm_rs_torch_malloc throws c10::Error.
RMM_RS_TORCH_EXPORT void rmm_rs_torch_set_functions(rmm_rs_torch_alloc_fn alloc,
                                                    rmm_rs_torch_free_fn free);

/// PyTorch's allocation function: `size` bytes on `device`, ordered on `stream` (a
/// cudaStream_t). Throws c10::OutOfMemoryError, naming the size, the device and the remedy,
/// when rmm-rs returns null for a non-empty request.
RMM_RS_TORCH_EXPORT void* rmm_rs_torch_malloc(ssize_t size, int device, void* stream);

/// PyTorch's free function: `ptr` goes back to the rmm-rs resource that allocated it. Never
/// throws.
RMM_RS_TORCH_EXPORT void rmm_rs_torch_free(void* ptr, ssize_t size, int device, void* stream)
    noexcept;
}
