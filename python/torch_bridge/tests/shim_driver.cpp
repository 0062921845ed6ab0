// Checks the pluggable-allocator functions (rmm_rs_torch/shim.cpp) from C++, as PyTorch's
// CUDAPluggableAllocator calls them, against fake rmm-rs functions: no GPU, no Python.
//
//   g++ -std=c++17 -I<torch>/include rmm_rs_torch/shim.cpp tests/shim_driver.cpp
//       -L<torch>/lib -lc10 -Wl,-rpath,<torch>/lib -o shim_driver && ./shim_driver
//
// python/tests/test_torch_shim.py builds and runs it where PyTorch and g++ are installed.
// Prints "shim_driver: N checks passed" and exits 0, or names each failed check and exits 1.
#include <c10/util/Exception.h>

#include <cstdio>
#include <string>

#include "../rmm_rs_torch/shim.h"

namespace {

int checks = 0;
int failures = 0;

void check(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A fake rmm-rs: 1 MiB of "device memory" at a fixed address; larger requests fail (null).
constexpr ssize_t capacity = 1 << 20;
char* const base = reinterpret_cast<char*>(0x7f0000000000);
struct Call {
  void* ptr;
  ssize_t size;
  int device;
  void* stream;
};
Call last_alloc{};
Call last_free{};
int allocs = 0;
int frees = 0;

void* fake_alloc(ssize_t size, int device, void* stream) {
  ++allocs;
  last_alloc = {nullptr, size, device, stream};
  return size == 0 || size > capacity ? nullptr : base;
}

void fake_free(void* ptr, ssize_t size, int device, void* stream) {
  ++frees;
  last_free = {ptr, size, device, stream};
}

// What rmm_rs_torch_malloc throws: "OutOfMemoryError", "Error" (another c10::Error), "other"
// or "" (nothing); the message in `message`.
std::string thrown_by_malloc(ssize_t size, int device, void* stream, std::string& message,
                             void** result = nullptr) {
  message.clear();
  try {
    void* p = rmm_rs_torch_malloc(size, device, stream);
    if (result != nullptr) {
      *result = p;
    }
    return "";
  } catch (const c10::OutOfMemoryError& e) {
    message = e.what_without_backtrace();
    return "OutOfMemoryError";
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
    return "Error";
  } catch (...) {
    return "other";
  }
}

}  // namespace

static_assert(noexcept(rmm_rs_torch_free(nullptr, 0, 0, nullptr)),
              "rmm_rs_torch_free must not throw into PyTorch");

int main() {
  void* stream = reinterpret_cast<void*>(0x5000);
  std::string message;

  // Not connected yet: a c10::Error that says what to do, not an out-of-memory error.
  std::string kind = thrown_by_malloc(1024, 0, stream, message);
  check(kind == "Error", "malloc before set_functions throws c10::Error (threw '" + kind + "')");
  check(contains(message, "import rmm_rs_torch"), "that message names the remedy: " + message);
  rmm_rs_torch_free(nullptr, 0, 0, nullptr);  // nothing to free, nothing thrown

  rmm_rs_torch_set_functions(fake_alloc, fake_free);

  // Out of memory: c10::OutOfMemoryError naming the bytes, the device and the remedy.
  const ssize_t huge = ssize_t{1} << 48;
  kind = thrown_by_malloc(huge, 3, stream, message);
  check(kind == "OutOfMemoryError",
        "a null allocation throws c10::OutOfMemoryError (threw '" + kind + "')");
  for (const char* part : {"281474976710656 bytes", "262144.00 GiB", "device 3",
                           "free memory", "maximum_size", "device_memory_limit"}) {
    check(contains(message, part), std::string("the message names '") + part + "': " + message);
  }
  check(allocs == 1 && last_alloc.size == huge && last_alloc.device == 3 &&
            last_alloc.stream == stream,
        "the request reached rmm-rs unchanged");

  // A request of 0 bytes: null is an answer, not a failure.
  void* p = base;
  kind = thrown_by_malloc(0, 0, stream, message, &p);
  check(kind.empty() && p == nullptr, "malloc(0) returns null without throwing");

  // A request that fits: rmm-rs's pointer, then freed with PyTorch's arguments.
  p = nullptr;
  kind = thrown_by_malloc(4096, 1, stream, message, &p);
  check(kind.empty() && p == base, "malloc(4096) returns rmm-rs's pointer");
  rmm_rs_torch_free(p, 4096, 1, stream);
  check(frees == 1 && last_free.ptr == base && last_free.size == 4096 && last_free.device == 1 &&
            last_free.stream == stream,
        "free reaches rmm-rs with the pointer, size, device and stream");

  if (failures != 0) {
    std::fprintf(stderr, "shim_driver: %d of %d checks failed\n", failures, checks);
    return 1;
  }
  std::printf("shim_driver: %d checks passed\n", checks);
  return 0;
}
