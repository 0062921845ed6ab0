"""rmm-rs under RAPIDS RMM and PyTorch, on a GPU: the benchmarks of the librmm bridge.

    python3 python/bench/librmm_bridge.py --client PATH [--rounds R] [--json OUT]

1. C++, 8 threads (a librmm client as libcudf is: librmm_client.cpp, rmm::device_buffers of
   mixed sizes through librmm's current device resource, each thread on its own stream):
   the bridge (RmmRsMemoryResource) against RMM's CallbackMemoryResource over the same C
   functions, against rmm-rs's pool called directly from the same threads (no librmm), and
   RMM's own PoolMemoryResource for reference. Nanoseconds per allocation + free, aggregate
   (wall time / operations).
2. Python: ``rmm.DeviceBuffer(size=1 MiB)`` + free through the bridge, against RMM's
   ``PoolMemoryResource`` (and the callback resource for reference), per call.
3. PyTorch: ``torch.empty(1 MiB)`` + free inside ``torch.cuda.use_mem_pool(mem_pool())``
   against PyTorch's caching allocator, per call, with what ``torch.cuda.memory_stats()``
   counted.

Sides alternate round by round in one process; medians are reported with the goals' ratios.
"""

import argparse
import ctypes
import json
import statistics
import sys
import time
import warnings

MIB = 1 << 20
CONFIG = {"pool": {"enabled": True, "initial_size": "4GiB"}}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def load_client(path):
    lib = ctypes.CDLL(path)
    lib.client_run.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_double),
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.client_held_run.argtypes = lib.client_run.argtypes
    lib.ref_run.argtypes = lib.client_run.argtypes
    lib.direct_run.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_double),
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    return lib


def ns_per_op(seconds, threads, iterations):
    return seconds / (threads * iterations) * 1e9


def cpp_rounds(lib, threads, iterations, rounds):
    import rmm.mr

    from rmm_rs import _rmm_rs
    from rmm_rs.allocators import rmm as rr

    allocate, deallocate, _ = _rmm_rs.librmm_functions()
    bridge = rr.resource(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        callback = rr.callback_resource(0)
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=2 << 30)
    # cudaMallocAsync's pool, as RMM wraps it.
    cuda_async = rmm.mr.CudaAsyncMemoryResource()
    # The callback side takes the GIL per call: fewer iterations keep its rounds short.
    callback_iterations = max(iterations // 20, 100)
    out = {
        "direct": [],
        "bridge": [],
        "callback": [],
        "rmm_pool": [],
        "bridge_held": [],
        "callback_held": [],
        "rmm_pool_held": [],
        "bridge_ref": [],
        "rmm_pool_ref": [],
        "cuda_async_ref": [],
    }
    error = ctypes.create_string_buffer(512)
    seconds = ctypes.c_double()

    def client(mr, n, held=False, ref=False):
        rmm.mr.set_per_device_resource(0, mr)
        run = lib.ref_run if ref else lib.client_held_run if held else lib.client_run
        rc = run(threads, n, ctypes.byref(seconds), error, len(error))
        if rc != 0:
            raise RuntimeError(f"librmm client: {error.value.decode()}")
        return ns_per_op(seconds.value, threads, n)

    for _ in range(rounds + 1):  # the first round warms up and is dropped
        rc = lib.direct_run(
            threads, iterations, allocate, deallocate, ctypes.byref(seconds), error, len(error)
        )
        if rc != 0:
            raise RuntimeError(f"direct: {error.value.decode()}")
        out["direct"].append(ns_per_op(seconds.value, threads, iterations))
        out["bridge"].append(client(bridge, iterations))
        out["callback"].append(client(callback, callback_iterations))
        out["rmm_pool"].append(client(pool, iterations))
        out["bridge_held"].append(client(bridge, iterations, held=True))
        out["callback_held"].append(client(callback, callback_iterations, held=True))
        out["rmm_pool_held"].append(client(pool, iterations, held=True))
        out["bridge_ref"].append(client(bridge, iterations, ref=True))
        out["rmm_pool_ref"].append(client(pool, iterations, ref=True))
        out["cuda_async_ref"].append(client(cuda_async, iterations, ref=True))
    rmm.mr.set_per_device_resource(0, bridge)
    return {k: v[1:] for k, v in out.items()}


def per_call_us(fn, calls):
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def python_rounds(calls, rounds):
    import rmm
    import rmm.mr

    from rmm_rs.allocators import rmm as rr

    bridge = rr.resource(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        callback = rr.callback_resource(0)
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=2 << 30)
    out = {"bridge": [], "rmm_pool": [], "callback": []}

    def one():
        b = rmm.DeviceBuffer(size=MIB)
        del b

    for _ in range(rounds):
        for name, mr in (("bridge", bridge), ("rmm_pool", pool), ("callback", callback)):
            rmm.mr.set_current_device_resource(mr)
            out[name].append(per_call_us(one, calls))
    rmm.mr.set_current_device_resource(bridge)
    return out


def torch_rounds(calls, rounds):
    import torch

    from rmm_rs.allocators import torch as rmm_torch

    pool = rmm_torch.mem_pool()
    out = {"mem_pool": [], "caching": []}

    def one():
        t = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        del t

    counted = {}
    for _ in range(rounds):
        with torch.cuda.use_mem_pool(pool):
            before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
            out["mem_pool"].append(per_call_us(one, calls))
            counted["mem_pool_allocations"] = (
                torch.cuda.memory_stats().get("allocation.all.allocated", 0) - before
            )
        out["caching"].append(per_call_us(one, calls))
    torch.cuda.synchronize()
    return out, counted


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", required=True, help="path of the built librmm_client.so")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=20000, help="per thread, C++")
    parser.add_argument("--calls", type=int, default=20000, help="per round, Python")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write every round's figures here")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args()

    import rmm_rs
    from rmm_rs.allocators import rmm as rr

    rmm_rs.initialize(CONFIG)
    rr.install(0)
    report = {"config": CONFIG, "bridge": rr.bridge_error() or "RmmRsMemoryResource"}

    lib = load_client(args.client)
    cpp = cpp_rounds(lib, args.threads, args.iterations, args.rounds)
    report["cpp_ns_per_op"] = cpp
    m = {k: median(v) for k, v in cpp.items()}
    print(f"C++ librmm client, {args.threads} threads, ns per allocation + free (aggregate):")
    print("  (looked up: librmm's current resource fetched for every buffer, under librmm's")
    print("   process-wide mutex; held: fetched once per thread, as libcudf does per call)")
    for k in ("direct", "bridge", "callback", "rmm_pool"):
        held = m.get(f"{k}_held")
        cell = f"{held:10.1f}" if held is not None else f"{'':10s}"
        print(f"  {k:10s} looked up {m[k]:10.1f}   held {cell}")
    print(
        f"  resource alone (no device_buffer): bridge {m['bridge_ref']:.1f}, "
        f"rmm_pool {m['rmm_pool_ref']:.1f}, cudaMallocAsync {m['cuda_async_ref']:.1f}"
    )
    print(
        f"  looked up: callback / bridge = {m['callback'] / m['bridge']:.1f}x, "
        f"bridge / direct = {m['bridge'] / m['direct']:.2f}x"
    )
    print(
        f"  held:      callback / bridge = {m['callback_held'] / m['bridge_held']:.1f}x "
        f"(goal >= 20x); bridge / direct = {m['bridge_held'] / m['direct']:.2f}x (goal <= 1.5x)"
    )

    py = python_rounds(args.calls, args.rounds)
    report["python_us_per_call"] = py
    p = {k: median(v) for k, v in py.items()}
    print("Python rmm.DeviceBuffer(size=1 MiB) + free, us per call:")
    for k in ("bridge", "rmm_pool", "callback"):
        print(f"  {k:10s} {p[k]:8.2f}")
    print(f"  bridge / rmm_pool = {p['bridge'] / p['rmm_pool']:.2f}x (goal <= 1.0x)")

    if not args.no_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("PyTorch: not installed, skipped")
        else:
            tr, counted = torch_rounds(args.calls, args.rounds)
            report["torch_us_per_call"] = tr
            report["torch_memory_stats"] = counted
            t = {k: median(v) for k, v in tr.items()}
            print("PyTorch torch.empty(1 MiB) + free, us per call:")
            for k in ("mem_pool", "caching"):
                print(f"  {k:10s} {t[k]:8.2f}")
            print(
                f"  mem_pool / caching = {t['mem_pool'] / t['caching']:.2f}x (goal <= 1.1x); "
                f"memory_stats counted {counted.get('mem_pool_allocations', 0)} allocations "
                "in the last MemPool round"
            )
    report["rmm_rs_statistics"] = rmm_rs.device_statistics()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
