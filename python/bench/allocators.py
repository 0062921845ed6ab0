"""CuPy and PyTorch allocating through rmm-rs, beside their own pools, on a GPU.

    python3 python/bench/allocators.py [--calls N] [--rounds R]

CuPy: ``cupy.empty`` of 1 MiB then free, per call, with CuPy's MemoryPool and with rmm-rs's
CFunctionAllocator, alternating the two sides round by round in one process.
PyTorch: ``torch.empty`` of 1 MiB then free, per call, with PyTorch's caching allocator and
with rmm-rs's pluggable allocator; PyTorch cannot switch allocators once it has allocated, so
each side runs in its own child process, alternating. Prints a table of medians and ratios.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

MIB = 1 << 20
CONFIG = {"pool": {"enabled": True, "initial_size": "2GiB"}}


def per_call_us(fn, calls):
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def cupy_rounds(calls, rounds):
    import cupy

    import rmm_rs
    from rmm_rs.allocators import cupy as rmm_cupy

    rmm_rs.initialize(CONFIG)
    pool = cupy.cuda.MemoryPool()
    # What install() sets: the C functions with CuPy's out-of-memory error on failure.
    ours = rmm_cupy.checked(rmm_cupy.allocator())

    def one():
        x = cupy.empty(MIB, dtype=cupy.uint8)
        del x

    unchecked = ours.allocator.malloc
    results = {"cupy MemoryPool": [], "rmm-rs": [], "rmm-rs (C functions alone)": []}
    for _ in range(rounds):
        cupy.cuda.set_allocator(pool.malloc)
        results["cupy MemoryPool"].append(per_call_us(one, calls))
        cupy.cuda.set_allocator(ours)
        results["rmm-rs"].append(per_call_us(one, calls))
        cupy.cuda.set_allocator(unchecked)
        results["rmm-rs (C functions alone)"].append(per_call_us(one, calls))
    cupy.cuda.set_allocator(pool.malloc)
    return {k: statistics.median(v) for k, v in results.items()}


def torch_child(side, calls, rounds):
    import torch

    if side == "rmm-rs":
        import rmm_rs
        from rmm_rs.allocators import torch as rmm_torch

        rmm_rs.initialize(CONFIG)
        rmm_torch.install()

    def one():
        x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        del x

    print(json.dumps([per_call_us(one, calls) for _ in range(rounds)]))


def torch_rounds(calls, rounds):
    results = {"torch caching allocator": [], "rmm-rs": []}
    for _ in range(rounds):
        for side, key in [("native", "torch caching allocator"), ("rmm-rs", "rmm-rs")]:
            out = subprocess.run(
                [sys.executable, __file__, "--torch-child", side, "--calls", str(calls)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[key].extend(json.loads(out.strip().splitlines()[-1]))
    return {k: statistics.median(v) for k, v in results.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--torch-child")
    args = ap.parse_args()
    if args.torch_child:
        torch_child(args.torch_child, args.calls, 3)
        return
    import torch

    print(f"GPU: {torch.cuda.get_device_name(0)}; {args.calls} calls per round, medians of {args.rounds} rounds")
    print()
    print("| library | allocator | µs per 1 MiB empty + free | ratio to the library's own |")
    print("|---|---|---|---|")
    c = cupy_rounds(args.calls, args.rounds)
    base = c["cupy MemoryPool"]
    for k, v in c.items():
        print(f"| CuPy | {k} | {v:.2f} | {v / base:.2f}× |")
    t = torch_rounds(args.calls, args.rounds)
    base = t["torch caching allocator"]
    for k, v in t.items():
        print(f"| PyTorch | {k} | {v:.2f} | {v / base:.2f}× |")


if __name__ == "__main__":
    main()
