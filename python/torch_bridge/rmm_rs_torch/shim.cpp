// The pluggable-allocator functions (see shim.h). They depend on c10 alone (libc10.so, which
// `import torch` loads), not on the Python extension around them.
#include "shim.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <string>

namespace {

std::atomic<rmm_rs_torch_alloc_fn> alloc_fn{nullptr};
std::atomic<rmm_rs_torch_free_fn> free_fn{nullptr};

std::string out_of_memory_message(std::size_t bytes, int device) {
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.2f", static_cast<double>(bytes) / (1ull << 30));
  return "rmm_rs: allocating " + std::to_string(bytes) + " bytes (" + gib +
         " GiB) on device " + std::to_string(device) +
         " failed: rmm-rs is out of memory (after spilling, where spill.on_demand is on); "
         "free memory (drop tensors you no longer need), or raise the pool's maximum_size or "
         "the device_memory_limit (rmm_rs.initialize / rmm_rs.reinitialize)";
}

}  // namespace

extern "C" {

void rmm_rs_torch_set_functions(rmm_rs_torch_alloc_fn alloc, rmm_rs_torch_free_fn free) {
  // free first: a malloc that sees the new allocation function finds its free function set.
  free_fn.store(free, std::memory_order_release);
  alloc_fn.store(alloc, std::memory_order_release);
}

void* rmm_rs_torch_malloc(ssize_t size, int device, void* stream) {
  rmm_rs_torch_alloc_fn alloc = alloc_fn.load(std::memory_order_acquire);
  if (alloc == nullptr) {
    C10_THROW_ERROR(Error,
                    "rmm_rs_torch: allocating " + std::to_string(static_cast<std::size_t>(size)) +
                        " bytes before the shim was connected to rmm-rs: import rmm_rs_torch "
                        "(rmm_rs.allocators.torch.install() does) before PyTorch allocates");
  }
  void* ptr = alloc(size, device, stream);
  // PyTorch passes a size_t: a "negative" size is one of 2**63 bytes or more, which rmm-rs
  // refuses like any other request it cannot meet.
  if (ptr == nullptr && size != 0) {
    C10_THROW_ERROR(OutOfMemoryError,
                    out_of_memory_message(static_cast<std::size_t>(size), device));
  }
  return ptr;
}

void rmm_rs_torch_free(void* ptr, ssize_t size, int device, void* stream) noexcept {
  rmm_rs_torch_free_fn free = free_fn.load(std::memory_order_acquire);
  if (free != nullptr) {
    free(ptr, size, device, stream);
  } else if (ptr != nullptr) {
    // Unreachable through PyTorch (no allocation succeeds before the functions are set).
    std::fprintf(stderr,
                 "rmm_rs_torch: freeing %p (%zd bytes, device %d) before the shim was "
                 "connected to rmm-rs: it is not freed\n",
                 ptr, size, device);
  }
}

}  // extern "C"
