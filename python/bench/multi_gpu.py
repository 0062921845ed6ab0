"""Multi-GPU Dask workload, dask-cuda's own cluster against an rmm-rs cluster, in one run.

One worker per GPU (LocalCUDACluster), a CuPy-backed dask.array of float64 in 4096 x 4096
blocks (128 MiB), square, of --per-worker bytes per worker, under --limit device memory per
worker (more than fits: the rest spills to host). Three phases, each timed from the client:
persist (``x.persist(); wait(x)``), ``(x + x.T).sum()`` (every block meets its transpose
partner, most of them held by another worker) and ``x.std(axis=0).sum()``. Both sides make
the same array (same seed) and must give the same sums. Each repeat runs every side, the
order alternating (repeat 0: dask-cuda first; repeat 1: rmm-rs first), with one cluster up at
a time (GPU memory): each is closed before the next starts.

* dask-cuda: ``LocalCUDACluster(device_memory_limit=LIMIT, rmm_pool_size=POOL,
  rmm_allocator_external_lib_list=["cupy"])``: its DeviceHostFile, CuPy on RMM's pool.
* rmm-rs: ``LocalCUDACluster(data=DeviceStore.factory(device_memory_limit=LIMIT))`` and
  ``RMMRsPlugin(rmm_pool_size=POOL, device_memory_limit=LIMIT,
  rmm_allocator_external_lib_list=["cupy"])`` (over UCX the store has device frames received
  into rmm-rs buffers).

Both clusters run without Dask's host memory limit unless --host-limit is given (a machine
whose MemTotal grows as memory is used would otherwise size it far too small, and the nanny
would restart workers holding spilled data). After each rmm-rs run the script prints, per
worker, the bytes spilled, unspilled, and unspilled to be sent to a peer.

    python3 python/bench/multi_gpu.py [--devices 0,1,2,3] [--per-worker 32GiB] [--limit 10GB]
        [--protocol tcp,ucx] [--repeats 2] [--weak-scaling] [--suite]
        [--no-rmm-rs-send-from-tier] [--deadline S] [--json F]

Before the runs it measures the copy rates that bound the transpose phase (pinned host to
device per GPU, peer copies between the first two GPUs) and prints each side's transpose phase
as a share of that bound.

--weak-scaling also runs each side on one GPU with --per-worker bytes (the multi-GPU time
over the one-GPU time: 1.0 is perfect weak scaling). --suite also runs dask-cuda's own
benchmark (``python -m dask_cuda.benchmarks.local_cupy``, transpose_sum and dot) against each
cluster through a scheduler file (python/bench/dask_cuda_suite.py runs the whole suite).

Needs several GPUs, CuPy, dask-cuda and rmm_rs; RAPIDS RMM for --pool (dask-cuda's pool,
"none" runs without); distributed-ucxx for --protocol ucx (scripts/gpu.sh ucx-wheels carries
both); nvtx and pandas for --suite. The defaults on 4 GPUs make 128 GiB per run, 2 repeats of
each side per protocol, each on a fresh cluster: --per-worker, --repeats and --sides shorten
it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
import time
from typing import Any

import cloudpickle
from dask.utils import format_bytes, parse_bytes, parse_timedelta
from distributed import wait

# The clusters, their checks and the runs of dask-cuda's benchmarks, shared with
# dask_cuda_suite.py (this directory is the script's, first on sys.path).
from dask_cuda_runs import (
    Settings,
    Side,
    benchmark_command,
    cluster_for,
    failed_tasks,
    failure_note,
    pool_setting,
    protocol_problem,
    run_benchmark,
    send_from_tier_supported,
    versions,
    visible_devices,
)
from copy_bounds import measure_bounds, print_bounds
import phase_metrics
from phase_metrics import (
    busy_lines,
    difference,
    loop_hotspots,
    steal_lines,
    summary_lines,
    worker_phase_figures,
)

# Functions run on the workers travel by value: the workers need not see this directory.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(phase_metrics)

GiB = 1 << 30
ITEMSIZE = 8  # float64

# On the workers.


def as_float(a):
    """A 0-d device (or host) array as a Python float, so that only the number reaches the
    client."""
    return float(a)


def worker_spill(dask_worker):
    """The device store's figures (rmm-rs), or nothing (dask-cuda's DeviceHostFile)."""
    data = dask_worker.data
    return data.statistics() if hasattr(data, "statistics") else {}


def worker_sent(dask_worker):
    """Bytes this worker has sent to others since it started (distributed's counter)."""
    return int(getattr(dask_worker, "transfer_outgoing_bytes_total", 0))


# In the client.


def square_side(total_bytes, chunk):
    """The side n of the square float64 array closest to `total_bytes`, a multiple of
    `chunk` (at least one block)."""
    blocks = round(math.sqrt(total_bytes / ITEMSIZE) / chunk)
    return chunk * max(1, blocks)


def make_array(n, chunk, seed):
    """The workload's array: n x n float64 from CuPy's generator, `chunk`-square blocks,
    the same numbers for the same seed."""
    import cupy
    import dask.array as da

    rs = da.random.RandomState(seed, RandomState=cupy.random.RandomState)
    return rs.random((n, n), chunks=(chunk, chunk))


def scalar(client, expr, timeout):
    """Computes a 0-d dask array on the cluster and returns it as a float (converted on
    the worker that holds it)."""
    fut = client.compute(expr)
    number = client.submit(as_float, fut, pure=False)
    try:
        return number.result(timeout=timeout)
    finally:
        del fut, number


def warm_up(client, timeout):
    """The same operations on a small array, untimed: CuPy's kernels loaded (compiled
    once, cached on disk) and the curand generators up in every worker before the clock
    starts."""
    w = client.persist(make_array(8 * 256, 256, 1))
    wait(w, timeout=timeout)
    scalar(client, (w + w.T).sum(), timeout)
    scalar(client, w.std(axis=0).sum(), timeout)
    del w


def sent_bytes(client):
    """Per worker, the bytes it has sent to peers so far."""
    return client.run(worker_sent)


def crossing_bytes(client, x):
    """Bytes of the blocks whose transpose partner lives on another worker, from where the
    persisted blocks are: block (i, j) of x.T is x's (j, i), so every (i, j) held by a
    worker that does not hold (j, i) needs it sent. Returns (bytes, blocks counted,
    blocks whose place was unknown)."""
    who = client.who_has(x)

    def norm(k):
        return tuple(k) if isinstance(k, (list, tuple)) else k

    owners = {norm(k): frozenset(v) for k, v in who.items()}
    keys = x.__dask_keys__()
    rows, cols = x.chunks
    total = crossing = unknown = 0
    for i in range(len(rows)):
        for j in range(len(cols)):
            if i == j:
                continue
            a = owners.get(norm(keys[i][j]), owners.get(str(keys[i][j])))
            b = owners.get(norm(keys[j][i]), owners.get(str(keys[j][i])))
            if not a or not b:
                unknown += 1
                continue
            if not (a & b):
                crossing += 1
                total += rows[j] * cols[i] * ITEMSIZE
    return total, crossing, unknown


def run_once(side, devices, protocol, n, args, s, repeat):
    """One timed run of the workload on a fresh cluster; its figures, or the error and the
    stage it happened in."""
    r: dict[str, Any] = {
        "protocol": protocol,
        "side": side.name,
        "workers": len(devices),
        "devices": list(devices),
        "n": n,
        "bytes": n * n * ITEMSIZE,
        "repeat": repeat,
        "error": None,
    }
    stage = "start"
    try:
        with cluster_for(side, devices, protocol, s) as client:
            stage = "warm-up"
            warm_up(client, s.timeout)
            client.get_task_stream()  # has the scheduler record tasks from now on
            stage = "persist"
            x = make_array(n, args.chunk, args.seed)
            t = time.perf_counter()
            wall = time.time()
            x = client.persist(x)
            wait(x, timeout=s.timeout)
            r["persist_s"] = time.perf_counter() - t
            r["persist_busy"] = busy_lines(client.get_task_stream(start=wall), wall, time.time())
            stage = "placement"
            r["crossing_bytes"], r["crossing_blocks"], r["unplaced_blocks"] = crossing_bytes(
                client, x
            )
            before = sent_bytes(client)
            figures = client.run(worker_phase_figures)
            stage = "transpose-sum"
            t = time.perf_counter()
            wall = time.time()
            r["transpose_sum"] = scalar(client, (x + x.T).sum(), s.timeout)
            r["transpose_sum_s"] = time.perf_counter() - t
            r["transpose_loop"] = loop_profile(client, wall, time.time())
            r["transpose_busy"] = busy_lines(client.get_task_stream(start=wall), wall, time.time())
            r["transpose_busy"] += steal_lines(client.get_events("stealing"), wall, time.time())
            mid = sent_bytes(client)
            figures_mid = client.run(worker_phase_figures)
            r["transpose_metrics"] = difference(figures_mid, figures)
            stage = "std"
            t = time.perf_counter()
            wall = time.time()
            r["std_sum"] = scalar(client, x.std(axis=0).sum(), s.timeout)
            r["std_s"] = time.perf_counter() - t
            r["std_loop"] = loop_profile(client, wall, time.time())
            r["std_busy"] = busy_lines(client.get_task_stream(start=wall), wall, time.time())
            r["std_busy"] += steal_lines(client.get_events("stealing"), wall, time.time())
            r["std_metrics"] = difference(client.run(worker_phase_figures), figures_mid)
            after = sent_bytes(client)
            r["total_s"] = r["persist_s"] + r["transpose_sum_s"] + r["std_s"]
            r["sent_bytes"] = {
                "transpose_sum": sum(mid[w] - before.get(w, 0) for w in mid),
                "std": sum(after[w] - mid.get(w, 0) for w in after),
            }
            stage = "statistics"
            r["spill"] = client.run(worker_spill)
            del x
            stage = "close"
    except Exception as e:  # noqa: BLE001 - recorded, reported, and the run goes on
        if stage == "close":
            # Every figure was taken: a cluster slow to shut down is reported, not a failure.
            r["close_error"] = f"{type(e).__name__}: {e}"
        else:
            r["error"] = f"{stage}: {type(e).__name__}: {e}"
            r["stage"] = stage
    return r


def loop_profile(client, start, stop):
    """Where the workers' event loops spent ``start``..``stop`` (wall-clock seconds), from
    the profile Dask keeps of them: lines of text (empty when profiling is off or failed)."""
    try:
        import dask

        profile = client.profile(start=start, stop=stop, server=True)
        interval = parse_timedelta(dask.config.get("distributed.worker.profile.interval"))
        return loop_hotspots(profile, interval, top=8)
    except Exception as e:  # noqa: BLE001 - a diagnostic; the run's figures stand without it
        return [f"(no event-loop profile: {type(e).__name__}: {e})"]


def print_run(r):
    """One line for a finished run (and the spill figures of an rmm-rs run)."""
    head = f"[{r['protocol']}, {r['workers']} GPU] repeat {r['repeat']} {r['side']}:"
    if r["error"]:
        print(f"{head} FAILED at {r['error']}", flush=True)
        return
    print(
        f"{head} persist {r['persist_s']:.2f} s, transpose-sum {r['transpose_sum_s']:.2f} s, "
        f"std {r['std_s']:.2f} s, total {r['total_s']:.2f} s; sums {r['transpose_sum']!r}, "
        f"{r['std_sum']!r}; partners on another worker ≈ {r['crossing_bytes'] / GiB:.1f} GiB, "
        f"workers sent {r['sent_bytes']['transpose_sum'] / GiB:.1f} GiB in the transpose "
        f"phase",
        flush=True,
    )
    if r.get("close_error"):
        print(f"    (the cluster did not close cleanly: {r['close_error']})", flush=True)
    for line in summary_lines(r.get("transpose_metrics", {})):
        print(f"    transpose phase, {line}", flush=True)
    for line in summary_lines(r.get("std_metrics", {}), top=5):
        print(f"    std phase, {line}", flush=True)
    for phase in ("persist", "transpose", "std"):
        for line in r.get(f"{phase}_busy", []):
            print(f"    {phase} phase, {line}", flush=True)
        for line in r.get(f"{phase}_loop", []):
            print(f"    {phase} phase, {line}", flush=True)
    if any(r["spill"].values()):
        print_spill(r["spill"])


def print_spill(per_worker):
    """Per worker: bytes spilled (copied off the device, and freed without a copy where the
    host copy was kept), unspilled, unspilled to be sent to a peer, and received from peers
    onto the device and off it (n/a where this rmm_rs does not count them), and the sum;
    then the seconds spent pinning host memory."""
    names = ("spilled_bytes", "spilled_without_copy_bytes", "unspilled_bytes",
             "unspilled_to_send_bytes", "received_on_device_bytes", "received_off_device_bytes")
    titles = ("spilled", "spilled w/o copy", "unspilled", "unspilled to send",
              "received on device", "received off device")
    print(f"    {'worker':28s}" + "".join(f" {t:>19s}" for t in titles))
    sums = [0] * len(names)
    missing = [False] * len(names)
    for worker, stats in sorted(per_worker.items()):
        sp = stats.get("spill", {})
        row = [sp.get(k) for k in names]
        for i, v in enumerate(row):
            if v is None:
                missing[i] = True
            else:
                sums[i] += v
        cells = ["n/a" if v is None else format_bytes(v) for v in row]
        print(f"    {worker:28s}" + "".join(f" {c:>19s}" for c in cells))
    cells = ["n/a" if m else format_bytes(v) for v, m in zip(sums, missing)]
    print(f"    {'all':28s}" + "".join(f" {c:>19s}" for c in cells), flush=True)
    pinning = [
        f"{sp.get('host_pinning_seconds', 0.0):.2f} s "
        f"({sp.get('host_registering_seconds', 0.0):.2f} s registering) for "
        f"{format_bytes(int(sp.get('host_pool_bytes', 0)))}, "
        f"{format_bytes(int(sp.get('host_pageable_total_bytes', 0)))} spilled to pageable memory"
        for sp in (stats.get("spill", {}) for _, stats in sorted(per_worker.items()))
    ]
    print(f"    host memory pinned per worker: {', '.join(pinning)}", flush=True)
    print_transfer(per_worker)


def print_transfer(per_worker):
    """Per worker, what rmm-rs's part of the transfers cost (``statistics()["transfer"]``):
    values staged in shared device memory for a peer of the same host, spilled values read
    from their tier for host frames, device copies made for UCX, and received values kept;
    bytes and seconds of each (nothing where this rmm_rs does not count them)."""
    kinds = ("sent_exported", "sent_host_frames", "sent_device_copies", "received_exported",
             "received_host_frames")
    if not any("transfer" in stats for stats in per_worker.values()):
        return
    print(f"    {'worker':28s}" + "".join(f" {k.replace('_', ' '):>30s}" for k in kinds))
    for worker, stats in sorted(per_worker.items()):
        t = stats.get("transfer", {})
        cells = [
            f"{format_bytes(int(t.get(k + '_bytes', 0)))} in {t.get(k + '_seconds', 0.0):.2f} s"
            for k in kinds
        ]
        print(f"    {worker:28s}" + "".join(f" {c:>30s}" for c in cells), flush=True)


def check_sums(runs, rtol):
    """The runs' sums against the first good run of the same array: a list of mismatches
    (empty when every run agrees to `rtol`)."""
    reference: dict[int, dict[str, Any]] = {}
    bad = []
    for r in runs:
        if r["error"]:
            continue
        ref = reference.setdefault(r["n"], r)
        for k in ("transpose_sum", "std_sum"):
            a, b = ref[k], r[k]
            if not math.isclose(a, b, rel_tol=rtol, abs_tol=0.0):
                bad.append(
                    f"{k} of {r['protocol']} {r['side']} repeat {r['repeat']} "
                    f"({r['workers']} GPU) is {b!r}, {ref['side']}'s {a!r} "
                    f"(relative difference {abs(a - b) / max(abs(a), abs(b)):.2e} > {rtol})"
                )
    return bad


def best_runs(runs):
    """The fastest good run of each (protocol, GPUs, side)."""
    best: dict[Any, dict[str, Any]] = {}
    for r in runs:
        if r["error"]:
            continue
        key = (r["protocol"], r["workers"], r["side"])
        if key not in best or r["total_s"] < best[key]["total_s"]:
            best[key] = r
    return best


def print_summary(runs, best, sides, protocols, multi):
    """Every run, then the best of each side with the ratio to dask-cuda, and what the
    transpose phase moved."""
    print("\nEvery run:")
    print("| protocol | GPUs | repeat | side | persist (s) | transpose-sum (s) | std (s) | "
          "total (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        if r["error"]:
            print(f"| {r['protocol']} | {r['workers']} | {r['repeat']} | {r['side']} | "
                  f"failed: {r['error']} | | | |")
            continue
        print(f"| {r['protocol']} | {r['workers']} | {r['repeat']} | {r['side']} | "
              f"{r['persist_s']:.2f} | {r['transpose_sum_s']:.2f} | {r['std_s']:.2f} | "
              f"{r['total_s']:.2f} |")
    print("\nBest of each side:")
    print("| protocol | GPUs | side | persist (s) | transpose-sum (s) | std (s) | total (s) | "
          "dask-cuda ÷ this | (x + x.T).sum() | x.std(axis=0).sum() |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for protocol in protocols:
        for workers in sorted({r["workers"] for r in runs}, reverse=True):
            base = best.get((protocol, workers, "dask-cuda"))
            for side in sides:
                r = best.get((protocol, workers, side.name))
                if r is None:
                    continue
                ratio = f"{base['total_s'] / r['total_s']:.2f}x" if base else "n/a"
                print(f"| {protocol} | {workers} | {side.name} | {r['persist_s']:.2f} | "
                      f"{r['transpose_sum_s']:.2f} | {r['std_s']:.2f} | {r['total_s']:.2f} | "
                      f"{ratio} | {r['transpose_sum']:.15g} | {r['std_sum']:.15g} |")
    print()
    for protocol in protocols:
        for side in sides:
            r = best.get((protocol, multi, side.name))
            if r is None:
                continue
            moved = r["crossing_bytes"]
            secs = r["transpose_sum_s"]
            unplaced = (f"; {r['unplaced_blocks']} blocks of unknown place left out"
                        if r["unplaced_blocks"] else "")
            print(f"{protocol} {side.name}: transpose phase moved ≈ {moved / GiB:.1f} GiB "
                  f"between workers in {secs:.2f} s ({moved / secs / 1e9:.2f} GB/s) "
                  f"({r['crossing_blocks']} blocks whose partner is on another worker; the "
                  f"workers counted {r['sent_bytes']['transpose_sum'] / GiB:.1f} GiB sent"
                  f"{unplaced})")


def print_weak_scaling(best, sides, protocols, multi):
    """Per side, the multi-GPU time over the one-GPU time with the same data per GPU."""
    print(f"\nWeak scaling ({multi} GPUs against 1, the same bytes per GPU; 1.00 is perfect):")
    print(f"| protocol | side | {multi} GPUs total (s) | 1 GPU total (s) | {multi} GPUs ÷ 1 GPU |")
    print("|---|---|---|---|---|")
    for protocol in protocols:
        for side in sides:
            m = best.get((protocol, multi, side.name))
            one = best.get((protocol, 1, side.name))
            if m is None or one is None:
                continue
            print(f"| {protocol} | {side.name} | {m['total_s']:.2f} | {one['total_s']:.2f} | "
                  f"{m['total_s'] / one['total_s']:.2f} |")


# dask-cuda's own benchmark against each cluster.

def suite_problem():
    """Why dask-cuda's local_cupy cannot run here, or None."""
    missing = [m for m in ("nvtx", "pandas") if importlib.util.find_spec(m) is None]
    if importlib.util.find_spec("dask_cuda.benchmarks.local_cupy") is None:
        missing.append("dask_cuda.benchmarks.local_cupy")
    if missing:
        return (f"dask-cuda's local_cupy needs {', '.join(missing)}, which python3 cannot "
                "import: install them (nvtx travels in .whl-ucx, `bash scripts/gpu.sh "
                "ucx-wheels`)")
    return None


def run_suite(side, devices, protocol, args, s, tmp):
    """dask-cuda's local_cupy benchmark, transpose_sum then dot, against a fresh cluster of
    `side` (through its scheduler file): one result per operation."""
    out = []
    key = re.sub(r"[^A-Za-z0-9]+", "-", f"{protocol}-{side.name}").strip("-")
    try:
        with cluster_for(side, devices, protocol, s) as client:
            path = os.path.join(tmp, f"scheduler-{key}.json")
            client.write_scheduler_file(path)
            for op in ("transpose_sum", "dot"):
                base = os.path.join(tmp, f"local-cupy-{key}-{op}")
                cmd = benchmark_command(
                    "dask_cuda.benchmarks.local_cupy",
                    ["--operation", op,
                     "--size", str(args.suite_size),
                     "--chunk-size", str(args.suite_chunk_size)],
                    path, protocol, devices, args.suite_runs, base,
                    # The workers' memory is rmm-rs's: local_cupy must not set RMM up there.
                    disable_rmm=side.kind == "rmm-rs",
                )
                r: dict[str, Any] = {"protocol": protocol, "side": side.name, "operation": op,
                                     **run_benchmark(cmd, base, args.suite_timeout)}
                failed = failed_tasks(client)
                if failed and not r["error"]:
                    r["error"] = failure_note(failed)
                status = (f"median {r['median_s']:.3f} s of {len(r['wallclocks'])} runs"
                          if r["median_s"] is not None else "")
                print(f"[{protocol}] local_cupy {op} on {side.name}: "
                      f"{'FAILED: ' + r['error'] if r['error'] else status}", flush=True)
                out.append(r)
    except Exception as e:  # noqa: BLE001 - the cluster did not start or broke: recorded
        out.append({"protocol": protocol, "side": side.name, "operation": "(cluster)",
                    "error": f"{type(e).__name__}: {e}"})
        print(f"[{protocol}] local_cupy on {side.name}: FAILED: {type(e).__name__}: {e}",
              flush=True)
    return out


def print_suite(results, sides, protocols):
    """Operation, dask-cuda's median wall clock, each rmm-rs side's, and the ratio."""
    print("\ndask-cuda's local_cupy (median wall clock of its runs):")
    print("| protocol | operation | side | dask-cuda (s) | this side (s) | dask-cuda ÷ this |")
    print("|---|---|---|---|---|---|")
    got = {(r["protocol"], r["side"], r["operation"]): r for r in results}
    for protocol in protocols:
        for op in ("transpose_sum", "dot"):
            base = got.get((protocol, "dask-cuda", op))
            b = base.get("median_s") if base else None
            for side in sides:
                if side.kind == "dask-cuda":
                    continue
                r = got.get((protocol, side.name, op))
                if r is None:
                    continue
                m = r.get("median_s")
                cells = [f"{v:.3f}" if v is not None else "failed" for v in (b, m)]
                ratio = f"{b / m:.2f}x" if b is not None and m else "n/a"
                print(f"| {protocol} | {op} | {side.name} | {cells[0]} | {cells[1]} | "
                      f"{ratio} |")


def make_sides(args):
    """The sides to run, in the order of repeat 0."""
    sides = []
    for name in (x.strip() for x in args.sides.split(",") if x.strip()):
        if name not in ("dask-cuda", "rmm-rs"):
            raise SystemExit(f"--sides: unknown side {name!r}; the sides are dask-cuda, rmm-rs")
        sides.append(Side(name, name))
        if name == "rmm-rs" and args.rmm_rs_send_from_tier is False:
            if not send_from_tier_supported():
                raise SystemExit(
                    "--no-rmm-rs-send-from-tier: this rmm_rs's DeviceStore takes no "
                    "send_from_tier; rebuild the rmm_rs wheel from a tree that has it, or "
                    "leave the option out"
                )
            sides.append(Side("rmm-rs, unspill to send", "rmm-rs", send_from_tier=False))
    if not sides:
        raise SystemExit("--sides names no side")
    return sides


def parse_args(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--devices", default=None,
                   help="GPUs, one worker each (default: CUDA_VISIBLE_DEVICES, else every GPU "
                   "`nvidia-smi -L` lists)")
    p.add_argument("--per-worker", default="32GiB",
                   help="data per worker (default %(default)s); the array is square, a "
                   "multiple of --chunk")
    p.add_argument("--limit", default="10GB",
                   help="device memory limit per worker (default %(default)s)")
    p.add_argument("--pool", default="auto",
                   help='pool per worker, both sides: "auto" (default: 0.9 of the device), '
                   '"none", a size or a fraction')
    p.add_argument("--host-limit", default="0",
                   help="Dask's host memory_limit per worker (default 0: none; spilled data "
                   "stays in host memory)")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per worker (default %(default)s)")
    p.add_argument("--chunk", type=int, default=4096,
                   help="block side (default %(default)s: 128 MiB blocks)")
    p.add_argument("--seed", type=int, default=42,
                   help="the array's seed, the same for every run (default %(default)s)")
    p.add_argument("--protocol", default="tcp", help="tcp (default), ucx, or both: tcp,ucx")
    p.add_argument("--sides", default="dask-cuda,rmm-rs",
                   help="which sides to run (default %(default)s)")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of each side (default %(default)s); the order of the sides "
                   "alternates from one repeat to the next")
    p.add_argument("--rmm-rs-send-from-tier", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="--no-rmm-rs-send-from-tier also runs the rmm-rs side with "
                   "DeviceStore.factory(send_from_tier=False) (a spilled value a peer asks "
                   "for is brought back to the device before it is sent), beside the default")
    p.add_argument("--rmm-rs-host-pool", default=None,
                   help="rmm-rs's spill.host_pool_size (default: the runtime's)")
    p.add_argument("--rmm-rs-vmm", choices=("auto", "true", "false"), default=None,
                   help="rmm-rs's pool.vmm (default: the runtime's)")
    p.add_argument("--weak-scaling", action="store_true",
                   help="also run each side on one GPU (the first of --devices) with "
                   "--per-worker bytes")
    p.add_argument("--work-stealing", action=argparse.BooleanOptionalAction, default=None,
                   help="Dask's work stealing on or off for every cluster (default: Dask's "
                   "setting, on)")
    p.add_argument("--suite", action="store_true",
                   help="also run dask-cuda's local_cupy (transpose_sum, dot) against each "
                   "cluster")
    p.add_argument("--suite-size", type=int, default=40000,
                   help="local_cupy --size (default %(default)s)")
    p.add_argument("--suite-chunk-size", type=int, default=4000,
                   help="local_cupy --chunk-size (default %(default)s)")
    p.add_argument("--suite-runs", type=int, default=3,
                   help="local_cupy --runs (default %(default)s)")
    p.add_argument("--suite-timeout", type=float, default=900,
                   help="seconds for one local_cupy run (default %(default)s)")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds for a cluster to start and for each phase (default "
                   "%(default)s)")
    p.add_argument("--rtol", type=float, default=1e-9,
                   help="relative tolerance of the sums across runs (default %(default)s)")
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds from the start after which no new run begins (the ones left "
                   "are listed as not run, and the tables and --json are written): for a "
                   "machine that allows each command a fixed time")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.threads < 1:
        p.error("--threads must be at least 1")
    if args.chunk < 1:
        p.error("--chunk must be at least 1")
    return args


def main(argv=None):
    """Runs every protocol's repeats (and the weak scaling and the suite when asked),
    prints the tables, writes the JSON; exit status 1 when a run failed or the sums
    differ."""
    args = parse_args(argv)
    protocols = list(dict.fromkeys(p.strip() for p in args.protocol.split(",") if p.strip()))
    for proto in protocols:
        if proto not in ("tcp", "ucx"):
            raise SystemExit(f"--protocol: unknown protocol {proto!r}; use tcp, ucx or tcp,ucx")
    sides = make_sides(args)
    needed = {"dask_cuda": "dask-cuda (`bash scripts/gpu.sh wheels` puts it in .whl)",
              "cupy": "CuPy (cupy-cuda13x)"}
    if any(x.kind == "rmm-rs" for x in sides):
        needed["rmm_rs"] = "the rmm_rs wheel (`bash scripts/gpu.sh wheels`)"
    for module, what in needed.items():
        if importlib.util.find_spec(module) is None:
            raise SystemExit(f"{module} is not importable: install {what}")
    devices = ([d.strip() for d in args.devices.split(",") if d.strip()]
               if args.devices else visible_devices())
    if not devices:
        raise SystemExit("--devices names no GPU")
    pool = pool_setting(args.pool, args.limit, devices[0])
    has_rmm = importlib.util.find_spec("rmm") is not None
    if pool is not None and not has_rmm and any(s.kind == "dask-cuda" for s in sides):
        raise SystemExit(
            "dask-cuda's rmm_pool_size needs RAPIDS RMM (rmm-cu13), which python3 cannot "
            "import: install it (`bash scripts/gpu.sh ucx-wheels` here puts it in .whl-ucx), "
            "or pass --pool none"
        )
    host_limit: Any = 0 if args.host_limit.strip().lower() in ("0", "none") else args.host_limit
    if args.work_stealing is not None:
        # Each cluster's scheduler runs in this process and reads it as it starts.
        import dask

        dask.config.set({"distributed.scheduler.work-stealing": args.work_stealing})
    config: dict[str, Any] = {"spill": {"enabled": True}}
    if args.rmm_rs_host_pool:
        config["spill"]["host_pool_size"] = args.rmm_rs_host_pool
    if args.rmm_rs_vmm is not None:
        config["pool"] = {"vmm": {"true": True, "false": False}.get(args.rmm_rs_vmm, "auto")}
    s = Settings(
        limit=args.limit,
        pool=pool,
        host_limit=host_limit,
        threads=args.threads,
        rmm_rs_config=config,
        rmm_rs_libs=["cupy"],
        timeout=args.timeout,
    )
    per_worker = parse_bytes(args.per_worker)
    n = square_side(per_worker * len(devices), args.chunk)
    configs = [(devices, n)]
    weak_note = None
    if args.weak_scaling:
        if len(devices) > 1:
            configs.append(([devices[0]], square_side(per_worker, args.chunk)))
        else:
            weak_note = "--weak-scaling: one GPU only, nothing to compare"
            print(weak_note, flush=True)
    blocks = math.ceil(n / args.chunk) ** 2
    print(f"devices {','.join(devices)}: {len(devices)} workers, {n} x {n} float64 "
          f"({format_bytes(n * n * ITEMSIZE)}, {blocks} blocks of "
          f"{format_bytes(args.chunk ** 2 * ITEMSIZE)}), limit {args.limit} per worker, "
          f"pool {pool if pool is not None else 'none'}, host limit "
          f"{host_limit or 'none'}, {args.threads} thread(s) per worker", flush=True)
    host_pool = (f"{args.rmm_rs_host_pool} per worker, pinned at start" if args.rmm_rs_host_pool
                 else "pinned as spills need it")
    stealing = {None: "Dask's default", True: "on", False: "off"}[args.work_stealing]
    print(f"sides: {', '.join(x.name for x in sides)}; rmm-rs allocators for "
          f"{', '.join(s.rmm_rs_libs)}, rmm-rs host pool {host_pool}; protocols: "
          f"{', '.join(protocols)}; work stealing {stealing}", flush=True)
    installed = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in installed.items()), flush=True)

    results: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items()},
        "devices": devices,
        "n": n,
        "pool": pool,
        "rmm_rs_libs": s.rmm_rs_libs,
        "versions": installed,
        "runs": [],
        "suite": [],
        "skipped": [],
    }
    if weak_note:
        results["skipped"].append(weak_note)
    failed = False
    started = time.monotonic()
    bounds = measure_bounds(devices, args.timeout)
    results["bounds"] = bounds

    def out_of_time(what: str) -> bool:
        """True (and noted) when --deadline has passed: ``what`` is not run."""
        if args.deadline is None or time.monotonic() - started < args.deadline:
            return False
        line = f"{what}: past --deadline {args.deadline:g} s"
        print(f"NOT RUN: {line}", flush=True)
        results["skipped"].append(line)
        return True

    try:
        for pi, protocol in enumerate(protocols):
            why = protocol_problem(protocol)
            if why:
                line = f"protocol {protocol}: SKIPPED: {why}"
                print(line, flush=True)
                results["skipped"].append(line)
                continue
            # Sides whose cluster did not start: every later one would fail the same way.
            broken: dict[str, str] = {}
            for devs, size in configs:
                for repeat in range(args.repeats):
                    order = sides if repeat % 2 == 0 else sides[::-1]
                    for side in order:
                        if side.name in broken:
                            continue
                        what = f"{protocol}, {len(devs)} GPU, repeat {repeat}, {side.name}"
                        if out_of_time(what):
                            continue
                        r = run_once(side, devs, protocol, size, args, s, repeat)
                        r["order"] = [x.name for x in order]
                        results["runs"].append(r)
                        print_run(r)
                        if r["error"]:
                            failed = True
                            if r.get("stage") == "start":
                                broken[side.name] = r["error"]
                                line = (f"protocol {protocol}, {side.name}: the remaining runs "
                                        f"SKIPPED, its cluster did not start: {r['error']}")
                                print(line, flush=True)
                                results["skipped"].append(line)
            if args.suite:
                why = suite_problem()
                if why:
                    print(f"--suite: SKIPPED: {why}", flush=True)
                    results["skipped"].append(f"suite: {why}")
                else:
                    order = sides if pi % 2 == 0 else sides[::-1]
                    with tempfile.TemporaryDirectory(prefix="multi-gpu-suite-") as tmp:
                        for side in order:
                            what = f"suite, {protocol}, {side.name}"
                            if side.name in broken or out_of_time(what):
                                continue
                            for r in run_suite(side, devices, protocol, args, s, tmp):
                                results["suite"].append(r)
                                failed = failed or bool(r["error"])

        runs = results["runs"]
        best = best_runs(runs)
        results["best"] = [best[k] for k in sorted(best)]
        print_summary(runs, best, sides, protocols, len(devices))
        if bounds is not None:
            print_bounds(bounds, best, sides, protocols, len(devices))
        if len(configs) > 1:
            print_weak_scaling(best, sides, protocols, len(devices))
            results["weak_scaling"] = [
                {"protocol": p, "side": x.name,
                 "ratio": best[(p, len(devices), x.name)]["total_s"]
                 / best[(p, 1, x.name)]["total_s"]}
                for p in protocols for x in sides
                if (p, len(devices), x.name) in best and (p, 1, x.name) in best
            ]
        if results["suite"]:
            print_suite(results["suite"], sides, protocols)
        bad = check_sums(runs, args.rtol)
        results["sum_mismatches"] = bad
        good = [r for r in runs if not r["error"]]
        if bad:
            failed = True
            print("\nSUMS DIFFER:")
            for line in bad:
                print(f"  {line}")
        elif good:
            print(f"\nsums: all {len(good)} good runs agree to a relative {args.rtol:g}")
        for line in results["skipped"]:
            print(f"NOT RUN: {line}")
        errors = [r for r in runs if r["error"]] + [r for r in results["suite"] if r["error"]]
        if errors:
            print(f"FAILED: {len(errors)} run(s); see above")
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
