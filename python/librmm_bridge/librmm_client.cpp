// A librmm client, as libcudf is one: threads that allocate and free rmm::device_buffers of
// mixed sizes through librmm's current device resource, each on a stream of its own. Built
// on the GPU machine into a shared library (see scripts/gpu_bridge.sh) that
// python/bench/librmm_bridge.py and python/tests/test_rmm_bridge_gpu.py load
// with ctypes after setting RMM's current resource from Python.
//
//   int client_run(int threads, int iterations, double* seconds, char* error, size_t len)
//     device_buffers through rmm::mr::get_current_device_resource_ref(), looked up for each
//     buffer (librmm's lookup takes a process-wide mutex: 8 threads queue on it).
//   int client_held_run(int threads, int iterations, double* seconds, char* error, size_t len)
//     the same with the resource looked up once per thread, as libcudf does per operation
//     (its public functions take `mr = get_current_device_resource_ref()` and hand it to
//     every allocation inside).
//   int ref_run(int threads, int iterations, double* seconds, char* error, size_t len)
//     the same pattern through the resource itself (held once per thread), without
//     device_buffer: what the resource costs apart from the container.
//   int direct_run(int threads, int iterations, void* allocate, void* deallocate,
//                  double* seconds, char* error, size_t len)
//     the same pattern calling rmm-rs's C functions directly (no librmm in between).
//
// Each thread keeps a window of live allocations (WINDOW), freeing the oldest as it allocates
// a new one, over sizes from 256 B to 4 MiB. Returns 0, or -1 with a message in `error`.

#include <rmm/cuda_stream.hpp>
#include <rmm/device_buffer.hpp>
#include <rmm/mr/per_device_resource.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t WINDOW = 16;
constexpr std::size_t SIZES[] = {256, 4096, 65536, 1 << 20, 4096, 256, 1 << 22, 65536, 1024};
constexpr std::size_t NSIZES  = sizeof(SIZES) / sizeof(SIZES[0]);

using allocate_fn   = void* (*)(std::size_t, int, void*);
using deallocate_fn = void (*)(void*, std::size_t, int, void*);

void set_error(char* error, std::size_t len, std::string const& what)
{
  if (error != nullptr && len > 0) { std::snprintf(error, len, "%s", what.c_str()); }
}

// Runs `body(thread index)` on `threads` threads started together; the wall time of the whole.
template <typename Body>
int run_threads(int threads, Body body, double* seconds, char* error, std::size_t len)
{
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::mutex failed_lock;
  std::string failed;
  std::vector<std::thread> pool;
  auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) { std::this_thread::yield(); }
      try {
        body(t);
      } catch (std::exception const& e) {
        std::lock_guard<std::mutex> g{failed_lock};
        if (failed.empty()) { failed = e.what(); }
      }
    });
  }
  while (ready.load() < threads) { std::this_thread::yield(); }
  start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& th : pool) { th.join(); }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!failed.empty()) {
    set_error(error, len, failed);
    return -1;
  }
  return 0;
}

// Runs `body(thread index, its stream)` on `threads` threads, each with a stream of its own
// (synchronized at the end); 0, or -1 with the first failure's message in `error`.
template <typename Body>
int on_streams(int threads, Body body, double* seconds, char* error, std::size_t len)
{
  try {
    std::vector<rmm::cuda_stream> streams(static_cast<std::size_t>(threads));
    int rc = run_threads(
      threads,
      [&](int t) { body(t, cuda::stream_ref{streams[static_cast<std::size_t>(t)]}); },
      seconds,
      error,
      len);
    for (auto& s : streams) { s.synchronize(); }
    return rc;
  } catch (std::exception const& e) {
    set_error(error, len, e.what());
    return -1;
  }
}

// The allocation pattern: a window of WINDOW live allocations per thread over SIZES, made
// by `make(size)` (an owning value), or by `alloc(size)` returning a pointer that
// `release(pointer, size)` frees.
template <typename Make>
void window_of_buffers(int t, int iterations, Make make)
{
  std::deque<decltype(make(std::size_t{}))> live;
  for (int i = 0; i < iterations; ++i) {
    live.emplace_back(make(SIZES[(static_cast<std::size_t>(i) + t) % NSIZES]));
    if (live.size() > WINDOW) { live.pop_front(); }
  }
}

template <typename Alloc, typename Free>
void window_of_pointers(int t, int iterations, Alloc alloc, Free release)
{
  std::deque<std::pair<void*, std::size_t>> live;
  for (int i = 0; i < iterations; ++i) {
    std::size_t n = SIZES[(static_cast<std::size_t>(i) + t) % NSIZES];
    live.emplace_back(alloc(n), n);
    if (live.size() > WINDOW) {
      release(live.front().first, live.front().second);
      live.pop_front();
    }
  }
  for (auto& [p, n] : live) { release(p, n); }
}

}  // namespace

extern "C" int client_run(int threads, int iterations, double* seconds, char* error, std::size_t len)
{
  return on_streams(
    threads,
    [&](int t, cuda::stream_ref stream) {
      window_of_buffers(t, iterations, [&](std::size_t n) { return rmm::device_buffer(n, stream); });
    },
    seconds,
    error,
    len);
}

extern "C" int client_held_run(int threads,
                               int iterations,
                               double* seconds,
                               char* error,
                               std::size_t len)
{
  return on_streams(
    threads,
    [&](int t, cuda::stream_ref stream) {
      rmm::device_async_resource_ref mr = rmm::mr::get_current_device_resource_ref();
      window_of_buffers(
        t, iterations, [&](std::size_t n) { return rmm::device_buffer(n, stream, mr); });
    },
    seconds,
    error,
    len);
}

extern "C" int ref_run(int threads, int iterations, double* seconds, char* error, std::size_t len)
{
  return on_streams(
    threads,
    [&](int t, cuda::stream_ref stream) {
      rmm::device_async_resource_ref mr = rmm::mr::get_current_device_resource_ref();
      window_of_pointers(
        t,
        iterations,
        [&](std::size_t n) { return mr.allocate(stream, n, 256); },
        [&](void* p, std::size_t n) { mr.deallocate(stream, p, n, 256); });
    },
    seconds,
    error,
    len);
}

extern "C" int direct_run(int threads,
                          int iterations,
                          void* allocate,
                          void* deallocate,
                          double* seconds,
                          char* error,
                          std::size_t len)
{
  auto alloc   = reinterpret_cast<allocate_fn>(allocate);
  auto dealloc = reinterpret_cast<deallocate_fn>(deallocate);
  return on_streams(
    threads,
    [&](int t, cuda::stream_ref s) {
      void* stream = static_cast<void*>(s.get());
      window_of_pointers(
        t,
        iterations,
        [&](std::size_t n) {
          void* p = alloc(n, 0, stream);
          if (p == nullptr) { throw std::runtime_error("rmm-rs allocate returned null"); }
          return p;
        },
        [&](void* p, std::size_t n) { dealloc(p, n, 0, stream); });
    },
    seconds,
    error,
    len);
}
