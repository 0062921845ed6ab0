// A librmm memory resource whose allocate and deallocate call rmm-rs's exported C functions
// (python/src/allocators.rs: rmm_rs_librmm_allocate, _deallocate, _synchronize): no Python
// and no GIL on the path. It meets the cuda::mr resource concept with the device_accessible
// property, so a device_async_resource_ref (and librmm's per-device resource) can hold it.
#pragma once

#include <rmm/aligned.hpp>
#include <rmm/error.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <cstddef>
#include <string>

namespace rmm_rs_librmm {

/// rmm-rs's `void* allocate(size_t size, int device, cudaStream_t stream)`: null when out of
/// memory (after rmm-rs's own spill and retry).
using allocate_fn = void* (*)(std::size_t, int, void*);
/// rmm-rs's `void deallocate(void* ptr, size_t size, int device, cudaStream_t stream)`.
using deallocate_fn = void (*)(void*, std::size_t, int, void*);
/// rmm-rs's `int synchronize(int device, cudaStream_t stream)`: 0 on success.
using synchronize_fn = int (*)(int, void*);

/// The alignment rmm-rs guarantees for every device allocation (RMM's too).
inline constexpr std::size_t max_alignment = 256;

class rmm_rs_memory_resource {
 public:
  rmm_rs_memory_resource(allocate_fn allocate,
                         deallocate_fn deallocate,
                         synchronize_fn synchronize,
                         int device) noexcept
    : allocate_{allocate}, deallocate_{deallocate}, synchronize_{synchronize}, device_{device}
  {
  }

  /// `bytes` on `stream`, from the device's current rmm-rs resource. Throws
  /// rmm::out_of_memory (RMM's Python: MemoryError) when rmm-rs has no memory for it, and
  /// rmm::bad_alloc for an alignment above 256 bytes.
  void* allocate(cuda::stream_ref stream,
                 std::size_t bytes,
                 std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    check_alignment(bytes, alignment);
    void* ptr = allocate_(bytes, device_, static_cast<void*>(stream.get()));
    if (ptr == nullptr && bytes != 0) {
      throw rmm::out_of_memory("rmm_rs: allocating " + std::to_string(bytes) +
                               " bytes on device " + std::to_string(device_) +
                               " failed: rmm-rs is out of memory (after spilling, where "
                               "spill.on_demand is on); free memory, or raise the pool's "
                               "maximum_size or the device_memory_limit");
    }
    return ptr;
  }

  /// Frees `ptr` on `stream` into the rmm-rs resource that allocated it.
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  [[maybe_unused]] std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  {
    deallocate_(ptr, bytes, device_, static_cast<void*>(stream.get()));
  }

  /// As allocate on the default stream, then waits for it (as RMM's pool does).
  void* allocate_sync(std::size_t bytes, std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    void* ptr = allocate(default_stream(), bytes, alignment);
    if (synchronize_(device_, nullptr) != 0) {
      deallocate_(ptr, bytes, device_, nullptr);
      throw rmm::bad_alloc("rmm_rs: synchronizing the default stream of device " +
                           std::to_string(device_) +
                           " after an allocation failed (see rmm-rs's log)");
    }
    return ptr;
  }

  /// As deallocate on the default stream (which orders the memory's reuse after the
  /// stream's work).
  void deallocate_sync(void* ptr,
                       std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  {
    deallocate(default_stream(), ptr, bytes, alignment);
  }

  /// Resources over the same functions and device are interchangeable.
  bool operator==(rmm_rs_memory_resource const& other) const noexcept
  {
    return allocate_ == other.allocate_ && deallocate_ == other.deallocate_ &&
           synchronize_ == other.synchronize_ && device_ == other.device_;
  }
  bool operator!=(rmm_rs_memory_resource const& other) const noexcept { return !(*this == other); }

  /// The device whose rmm-rs resource this one calls.
  [[nodiscard]] int device() const noexcept { return device_; }

  friend constexpr void get_property(rmm_rs_memory_resource const&,
                                     cuda::mr::device_accessible) noexcept
  {
  }

 private:
  static cuda::stream_ref default_stream() noexcept { return cuda::stream_ref{cudaStream_t{}}; }

  void check_alignment(std::size_t bytes, std::size_t alignment) const
  {
    if (alignment > max_alignment || (alignment & (alignment - 1)) != 0) {
      throw rmm::bad_alloc("rmm_rs: allocating " + std::to_string(bytes) + " bytes with alignment " +
                           std::to_string(alignment) +
                           ": rmm-rs aligns every allocation to 256 bytes; ask for a power of two "
                           "of at most 256");
    }
  }

  allocate_fn allocate_;
  deallocate_fn deallocate_;
  synchronize_fn synchronize_;
  int device_;
};

static_assert(cuda::mr::resource_with<rmm_rs_memory_resource, cuda::mr::device_accessible>,
              "rmm_rs_memory_resource must meet the cuda::mr resource concept");

}  // namespace rmm_rs_librmm
