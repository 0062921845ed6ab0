"""Dask worker data under a device limit: rmm-rs's DeviceStore against dask-cuda's
DeviceHostFile, in one run, one worker process each (LocalCUDACluster).

Workload (the same for both): ARRAYS CuPy arrays of SIZE bytes made by tasks under
``device_memory_limit`` (more than fits: the rest spills to host), then every array read back
by a task that checks every element. Times are wall times from the client. A second phase
measures spilling while 4 tasks run at once on the worker (threads_per_worker=4), with the
host pool pinned as needed and pinned up front, and reports the spill manager's spill and
unspill bandwidth beside the pinned copy bandwidth measured in this process, one way alone
and both ways at once (spills and unspills overlap there).

    python3 python/bench/device_store.py [--arrays 32] [--size 512MiB] [--limit 8GB] [--json F]

Needs a GPU, CuPy, dask-cuda and rmm_rs.
"""

import argparse
import json
import sys
import time

import cloudpickle
from dask.utils import format_bytes, parse_bytes
from distributed import Client, wait
from rmm_rs.dask import DeviceStore

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make(i, n):
    import cupy

    x = cupy.empty(n // 4, dtype=cupy.uint32)
    x.fill(i)
    return x


def check(x, i):
    return bool((x == i).all())


class TimedDeviceStore(DeviceStore):
    """DeviceStore that also counts the time spent storing values (on the worker's event
    loop, where Dask stores a task's result before it runs the next task)."""

    setitem_seconds = 0.0

    def __setitem__(self, key, value):
        t = time.perf_counter()
        super().__setitem__(key, value)
        self.setitem_seconds += time.perf_counter() - t

    def statistics(self):
        out = super().statistics()
        out["setitem_seconds"] = self.setitem_seconds
        return out


def worker_spill(dask_worker):
    """The device store's figures (rmm-rs), or nothing (dask-cuda)."""
    data = dask_worker.data
    return data.statistics() if hasattr(data, "statistics") else {}


def pinned_copy_gbps(n=1 << 30, rounds=5):
    """Device → pinned host and back, 1 GiB, best of `rounds` (this process, CuPy); and
    both ways at once on two streams ("each_way": the rate of each direction then)."""
    import cupy
    import numpy
    from cupy.cuda import runtime as rt

    d = cupy.ones(n, dtype=cupy.uint8)
    d2 = cupy.ones(n, dtype=cupy.uint8)
    mem = cupy.cuda.alloc_pinned_memory(n)
    mem2 = cupy.cuda.alloc_pinned_memory(n)
    h = numpy.frombuffer(mem, dtype=numpy.uint8, count=n)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    best = {"to_host": 0.0, "to_device": 0.0, "each_way": 0.0}
    for _ in range(rounds):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        d.get(out=h)
        cupy.cuda.Device().synchronize()
        best["to_host"] = max(best["to_host"], n / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        d.set(h)
        cupy.cuda.Device().synchronize()
        best["to_device"] = max(best["to_device"], n / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        rt.memcpyAsync(mem.ptr, d.data.ptr, n, rt.memcpyDeviceToHost, s1.ptr)
        rt.memcpyAsync(d2.data.ptr, mem2.ptr, n, rt.memcpyHostToDevice, s2.ptr)
        s1.synchronize()
        s2.synchronize()
        best["each_way"] = max(best["each_way"], n / (time.perf_counter() - t) / 1e9)
    del d, d2, h, mem, mem2
    return best


def run(kind, arrays, size, limit, threads):
    from dask_cuda import LocalCUDACluster

    kwargs = dict(n_workers=1, threads_per_worker=threads, dashboard_address=None)
    if kind == "dask-cuda":
        cluster = LocalCUDACluster(device_memory_limit=limit, **kwargs)
    else:
        from rmm_rs.dask import RMMRsPlugin

        host = kind.split("host=", 1)[1] if "host=" in kind else "none"
        cluster = LocalCUDACluster(
            data=TimedDeviceStore.factory(
                device_memory_limit=limit,
                config={"spill": {"enabled": True, "host_pool_size": host}},
            ),
            **kwargs,
        )
    with cluster, Client(cluster) as client:
        if kind != "dask-cuda":
            client.register_plugin(
                RMMRsPlugin(
                    {"spill": {"enabled": True, "host_pool_size": host}},
                    rmm_pool_size="16GiB",
                    rmm_allocator_external_lib_list=["cupy"],
                )
            )
            # As in a worker that has been up for a while and has spilled before: values
            # over the limit, stored then dropped, start the spilling, and with it the
            # pinning ahead of demand (nothing is pinned before the first spill), which then
            # runs in the background.
            over = int(parse_bytes(limit) // size) + 2
            warm = client.map(make, range(arrays, arrays + over), n=size, pure=False)
            wait(warm)
            del warm
            time.sleep(2)
        # The CUDA context and the kernels up (compiled once, cached on disk for every store).
        client.run(lambda: bool(check(make(1, 1 << 20), 1)))
        t = time.perf_counter()
        futures = client.map(make, range(arrays), n=size, pure=False)
        wait(futures)
        made = time.perf_counter() - t
        t = time.perf_counter()
        ok = client.gather(client.map(check, futures, range(arrays), pure=False))
        read = time.perf_counter() - t
        stats = list(client.run(worker_spill).values())[0]
        del futures
    if not all(ok):
        raise SystemExit(f"{kind}: {ok.count(False)} arrays read back wrong")
    return {"store": kind, "threads": threads, "make_s": made, "read_s": read, "spill": stats}


def report_tasks_at_once(r, copy):
    """Prints the spill and unspill bandwidth of a run with several tasks at once against the
    pinned copy, one way alone and both ways at once."""
    sp = r["spill"].get("spill", r["spill"])
    spill = sp["spilled_bytes"] / sp["spill_seconds"] / 1e9 if sp["spill_seconds"] else 0
    unspill = sp["unspilled_bytes"] / sp["unspill_seconds"] / 1e9 if sp["unspill_seconds"] else 0
    print(f"{r['store']}: make {r['make_s']:.2f} s, read back {r['read_s']:.2f} s; "
          f"spilled {format_bytes(sp['spilled_bytes'])} at {spill:.1f} GB/s "
          f"({spill / copy['to_host']:.0%} of the pinned copy, {spill / copy['each_way']:.0%} "
          f"of it both ways at once), unspilled {format_bytes(sp['unspilled_bytes'])} at "
          f"{unspill:.1f} GB/s ({unspill / copy['to_device']:.0%}, "
          f"{unspill / copy['each_way']:.0%})", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arrays", type=int, default=32)
    p.add_argument("--size", default="512MiB")
    p.add_argument("--limit", default="8GB")
    p.add_argument("--stores", default="dask-cuda,rmm-rs,rmm-rs host=20GiB")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    size = parse_bytes(args.size)
    stores = [s.strip() for s in args.stores.split(",")]
    results = []
    copy = pinned_copy_gbps()
    print(f"pinned copy (this process, 1 GiB): {copy['to_host']:.1f} GB/s to host, "
          f"{copy['to_device']:.1f} GB/s to device, {copy['each_way']:.1f} GB/s each way "
          "both ways at once", flush=True)
    for kind in stores:
        r = run(kind, args.arrays, size, args.limit, 1)
        results.append(r)
        sp = r["spill"].get("spill", {})
        pinning = (f"   host pool {format_bytes(sp['host_pool_bytes'])} pinned in "
                   f"{sp['host_pinning_seconds']:.2f} s "
                   f"({format_bytes(sp.get('host_pageable_total_bytes', 0))} to pageable memory); "
                   f"storing values took "
                   f"{r['spill'].get('setitem_seconds', 0):.2f} s, spilling "
                   f"{sp['spill_seconds']:.2f} s ({format_bytes(sp['spilled_bytes'])})"
                   if sp else "")
        print(f"{kind:22s} make {r['make_s']:6.2f} s   read back {r['read_s']:6.2f} s{pinning}",
              flush=True)
    # Spilling while 4 tasks run at once (rmm-rs): bandwidth against the pinned copy, with the
    # host pool pinned as needed (pinning then runs beside the copies) and pinned up front.
    print("4 tasks at once, 64 x 256 MiB under 4 GB:", flush=True)
    for host in ("rmm-rs", "rmm-rs host=20GiB"):
        r4 = run(host, 64, 256 << 20, "4GB", 4)
        r4["store"] = f"{host}, 4 tasks at once"
        results.append(r4)
        report_tasks_at_once(r4, copy)
    base = next((r for r in results if r["store"] == "dask-cuda"), None)
    if base:
        print("\n| store | make (s) | read back (s) | make speed-up | read speed-up |")
        print("|---|---|---|---|---|")
        for r in results:
            if r["threads"] != 1:
                continue
            print(f"| {r['store']} | {r['make_s']:.2f} | {r['read_s']:.2f} | "
                  f"{base['make_s'] / r['make_s']:.1f}x | {base['read_s'] / r['read_s']:.1f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pinned_copy_gbps": copy, "results": results}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
