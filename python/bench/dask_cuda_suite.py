"""dask-cuda's own benchmark suite against dask-cuda's clusters and an rmm-rs cluster.

Every benchmark that the dask-cuda wheel ships (``python -m dask_cuda.benchmarks.NAME``:
local_cudf_merge, local_cudf_shuffle, local_cudf_groupby, local_cupy (each of its ten
operations), local_cupy_map_overlap, read_parquet) runs with the same arguments against these clusters of
one worker per GPU under the same device memory limit and pool, each reached through its
scheduler file (``--scheduler-file``), each started fresh for every benchmark run:

* dask-cuda: ``LocalCUDACluster(device_memory_limit=LIMIT, rmm_pool_size=POOL,
  rmm_allocator_external_lib_list=["cupy"])``;
* dask-cuda + enable_cudf_spill: the same with ``enable_cudf_spill=True`` (cuDF's own
  spilling, which dask-cuda recommends for dataframes);
* rmm-rs: ``LocalCUDACluster(data=DeviceStore.factory(device_memory_limit=LIMIT),
  rmm_pool_size=None)`` and ``RMMRsPlugin(config, rmm_pool_size=POOL,
  device_memory_limit=LIMIT, rmm_allocator_external_lib_list=["cupy", "rmm"])`` (cuDF
  allocates from rmm-rs through the librmm bridge); the benchmark gets ``--disable-rmm``;
* with ``--rmm-rs-cudf-spill``, also rmm-rs + enable_cudf_spill: the same with
  ``enable_cudf_spill=True``, where the store leaves cuDF's frames to cuDF's own spilling.
* with ``--rmm-rs-limit-at-pool``, also rmm-rs with the store's device limit at the pool size:
  it then spills when an allocation would fail, the room cuDF's own spilling has under
  ``enable_cudf_spill`` (dask-cuda then leaves cuDF's objects out of its limit).

Each benchmark is sized from --limit, the number of GPUs and --scale: at --scale 1 the data it
reports processing is at least twice the limit per worker (``--dry-run`` prints the arguments
without running anything). The table gives, per benchmark and cluster, the median of the wall
clocks the benchmark itself reported (its --output-basename JSON, else its printed output)
over every repeat, and dask-cuda's best configuration over rmm-rs. The clusters' order
alternates from one repeat to the next. Two of dask-cuda 26.10's benchmarks do not start as
they are: read_parquet declares --runs twice (argparse fails) and local_cupy_map_overlap
imports ``cupyx.scipy.ndimage.filters``, which CuPy 14 no longer has; they run through
``dask_cuda_runs.COMPAT_LAUNCHER`` (argparse resolving the twice-declared option, the old CuPy
name pointing at ``cupyx.scipy.ndimage``), their code otherwise as it is.

    python3 python/bench/dask_cuda_suite.py [--devices 0,1,2,3] [--limit 6GB] [--pool 12GB]
        [--scale 1] [--benchmarks local_cupy,local_cudf_merge] [--protocol tcp|ucx]
        [--repeats 2] [--runs 3] [--deadline S] [--json F] [--dry-run]

Needs dask-cuda, CuPy, RAPIDS RMM, rmm_rs, nvtx and pandas; cudf and dask_cudf for the
dataframe benchmarks and the enable_cudf_spill cluster; scipy for local_cupy_map_overlap;
pyarrow for read_parquet's data set (written once under --parquet-dir and reused); what is
missing is listed as SKIPPED with the reason. distributed-ucxx for --protocol ucx.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, NamedTuple

from dask.utils import format_bytes, parse_bytes

from dask_cuda_runs import (
    COMPAT_PRELUDE,
    DISTRIBUTIONS,
    Settings,
    Side,
    benchmark_command,
    cluster_for,
    device_total_memory,
    failed_tasks,
    failure_note,
    median,
    pool_setting,
    protocol_problem,
    run_benchmark,
    size_in_bytes,
    store_figures,
    store_line,
    versions,
    visible_devices,
)

MiB = 1 << 20
SIDES = (
    Side("dask-cuda", "dask-cuda"),
    Side("dask-cuda + enable_cudf_spill", "dask-cuda", cudf_spill=True),
    Side("rmm-rs", "rmm-rs"),
)
# With --rmm-rs-cudf-spill: rmm-rs's cluster with cuDF's own spilling on, beside the store.
RMM_RS_CUDF_SPILL = Side("rmm-rs + enable_cudf_spill", "rmm-rs", cudf_spill=True)
# With --rmm-rs-limit-at-pool: rmm-rs's store limited by the pool alone (it spills when an
# allocation would fail), the room cuDF's own spilling has under enable_cudf_spill.
RMM_RS_AT_POOL = Side("rmm-rs, store limit = pool", "rmm-rs", limit_at_pool=True)
CUDF = ("cudf", "dask_cudf", "cupy")
EXTRA_DISTRIBUTIONS = ("rmm-rs-librmm", "cudf-cu13", "dask-cudf-cu13", "libcudf-cu13",
                       "pylibcudf-cu13", "cudf-cu12", "dask-cudf-cu12", "pandas", "pyarrow",
                       "scipy", "nvtx")


class Bench(NamedTuple):
    """One row of the table: a dask-cuda benchmark module with its arguments."""

    name: str  # the module's name, with ":operation" for local_cupy
    module: str
    args: list[str]
    data: int  # bytes the benchmark reports processing (its "Data processed"), all workers
    needs: tuple[str, ...]  # modules the benchmark imports
    env: dict[str, str] | None = None  # set for the benchmark's process
    compat: bool = False  # run through dask_cuda_runs.COMPAT_LAUNCHER
    dataset: tuple[int, int] | None = None  # read_parquet: files, rows per file


def plan(limit, devices, scale, parquet_dir):
    """Every benchmark's arguments, sized so that at --scale 1 each holds (or, for
    read_parquet, reads) at least twice the limit per worker: `limit` bytes, `devices`
    workers."""
    target = 2 * limit * devices * scale
    part_mib = max(1, min(256, limit // 16 // MiB))  # partitions of at most 1/16 the limit
    part = part_mib * MiB

    def rows_of(row_bytes):
        rows = part // row_bytes
        return rows // 100_000 * 100_000 if rows >= 100_000 else max(1, rows)

    def parts(each):
        return max(devices, math.ceil(target / each))

    out = []
    # Merge: a "build" frame (key, payload; its shuffle column becomes the index) and an
    # "other" frame (key, payload) of k chunks each, 16 B a row each as the benchmark counts.
    rows = rows_of(24)
    k = parts(rows * 32)
    out.append(Bench("local_cudf_merge", "local_cudf_merge",
                     ["--chunk-size", str(rows), "--base-chunks", str(k),
                      "--other-chunks", str(k)], k * rows * 32, CUDF))
    # Shuffle: k partitions of one float64 column, shuffled on it (tasks).
    k = parts(part)
    out.append(Bench("local_cudf_shuffle", "local_cudf_shuffle",
                     ["--partition-size", f"{part_mib}MiB", "--in-parts", str(k)],
                     k * part, CUDF))
    # Group-by: key, int64, float64 (24 B a row), about one row per group, reduced by a
    # shuffle into as many partitions as it has (split_out > 1). This dask's agg() takes no
    # `shuffle=` (the benchmark's --shuffle): the method is set through Dask's config.
    rows = rows_of(24)
    k = parts(rows * 24)
    out.append(Bench("local_cudf_groupby", "local_cudf_groupby",
                     ["--chunk-size", str(rows), "--in-parts", str(k), "--split_out", str(k),
                      "--unique-ratio", "1.0"], k * rows * 24, CUDF,
                     env={"DASK_DATAFRAME__SHUFFLE__METHOD": "tasks"}))
    # CuPy: square float64 arrays in square blocks of at most `part` bytes (4000: 128 MB).
    chunk = min(4000, max(100, math.isqrt(part // 8) // 100 * 100))
    n = chunk * math.ceil(math.sqrt(target / 8) / chunk)
    out.append(Bench("local_cupy:transpose_sum", "local_cupy",
                     ["--operation", "transpose_sum", "--size", str(n),
                      "--chunk-size", str(chunk)], n * n * 8, ("cupy", "nvtx")))
    n2 = chunk * math.ceil(math.sqrt(target / 16) / chunk)  # two arrays
    out.append(Bench("local_cupy:dot", "local_cupy",
                     ["--operation", "dot", "--size", str(n2), "--chunk-size", str(chunk)],
                     2 * n2 * n2 * 8, ("cupy", "nvtx")))
    # The other operations of local_cupy. On the square array: reductions and a strided slice;
    # fft along whole columns, in blocks of as many columns as `part` holds.
    for op in ("sum", "mean", "slice"):
        out.append(Bench(f"local_cupy:{op}", "local_cupy",
                         ["--operation", op, "--size", str(n), "--chunk-size", str(chunk)],
                         n * n * 8, ("cupy", "nvtx")))
    cols = max(1, part // (8 * n))
    out.append(Bench("local_cupy:fft", "local_cupy",
                     ["--operation", "fft", "--size", str(n), "--chunk-size", str(cols)],
                     n * n * 8, ("cupy", "nvtx")))
    # svd: a tall array of the benchmark's 1000 columns, in blocks of whole rows.
    width = 1000
    block_rows = max(100, part // (8 * width) // 100 * 100)
    tall = block_rows * math.ceil(target / (8 * width) / block_rows)
    out.append(Bench("local_cupy:svd", "local_cupy",
                     ["--operation", "svd", "--size", str(tall), "--second-size", str(width),
                      "--chunk-size", str(block_rows)], tall * width * 8, ("cupy", "nvtx")))
    # Columns: two 1-D arrays (x and y; x and as many gather indices for col_gather).
    per_block = max(100, part // 8 // 100 * 100)
    length = per_block * math.ceil(target / 16 / per_block)
    for op in ("col_sum", "col_mask", "col_gather"):
        extra = ["--second-size", str(length)] if op == "col_gather" else []
        out.append(Bench(f"local_cupy:{op}", "local_cupy",
                         ["--operation", op, "--size", str(length), *extra,
                          "--chunk-size", str(per_block)], 2 * length * 8, ("cupy", "nvtx")))
    out.append(Bench("local_cupy_map_overlap", "local_cupy_map_overlap",
                     ["--size", str(n), "--chunk-size", f"{min(128, part_mib)}MiB"],
                     n * n * 8, ("cupy", "cupyx.scipy.ndimage", "scipy.ndimage"), compat=True))
    # Parquet: files of `part` bytes (key, int64, float64, float64; uncompressed), read in
    # blocks of that size; nothing of it stays on the device (the benchmark takes len()).
    files, rows = parts(part), part // 32
    out.append(Bench("read_parquet", "read_parquet",
                     [parquet_dir, "--blocksize", f"{part_mib}MiB"], files * rows * 32,
                     ("cudf", "dask_cudf", "pyarrow", "fsspec"), compat=True,
                     dataset=(files, rows)))
    return out


def select(benches, spec):
    """The benchmarks --benchmarks names (a module takes all its rows), in the suite's
    order."""
    if not spec:
        return benches
    names = [x.strip() for x in spec.split(",") if x.strip()]
    known = {b.name for b in benches} | {b.module for b in benches}
    unknown = [x for x in names if x not in known]
    if unknown:
        raise SystemExit(f"--benchmarks: unknown {', '.join(unknown)}; choose from "
                         f"{', '.join(sorted(known))}")
    return [b for b in benches if b.name in names or b.module in names]


IMPORT_CHECK = COMPAT_PRELUDE + r"""
import importlib, json
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = None
    except BaseException as e:
        out[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def import_problems(modules, timeout):
    """Per module, why python3 cannot import it (None when it can), found in a process of
    its own (RAPIDS_NO_INITIALIZE: no CUDA context)."""
    env = {**os.environ, "RAPIDS_NO_INITIALIZE": "1"}
    try:
        p = subprocess.run([sys.executable, "-c", IMPORT_CHECK, *modules], capture_output=True,
                           text=True, timeout=timeout, env=env)
        return json.loads(p.stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001 - every module counted missing, saying why
        return {m: f"the import check failed: {type(e).__name__}: {e}" for m in modules}


DATASET_SCRIPT = r"""
import json, multiprocessing, os, sys
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
path, files, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def write(i):
    rng = np.random.default_rng(i)
    pq.write_table(pa.table({
        "key": rng.integers(0, files * rows, rows, dtype=np.int64),
        "int64": rng.integers(0, 1 << 62, rows, dtype=np.int64),
        "float64": rng.random(rows),
        "float64_2": rng.random(rows),
    }), os.path.join(path, f"part.{i:05d}.parquet"), compression="NONE")

with multiprocessing.get_context("fork").Pool(min(8, os.cpu_count() or 1)) as pool:
    pool.map(write, range(files))
with open(os.path.join(path, "_suite_dataset.json"), "w") as f:
    json.dump({"files": files, "rows_per_file": rows}, f)
"""


def ensure_dataset(path, files, rows, timeout):
    """read_parquet's data set under `path`, written unless the one there is it; None, or
    why it could not be written."""
    marker = os.path.join(path, "_suite_dataset.json")
    want = {"files": files, "rows_per_file": rows}
    try:
        with open(marker) as f:
            if json.load(f) == want:
                print(f"read_parquet: reusing the data set in {path}", flush=True)
                return None
    except (OSError, ValueError):
        pass
    if os.path.isdir(path):
        for name in os.listdir(path):
            if re.fullmatch(r"part\.\d{5}\.parquet|_suite_dataset\.json", name):
                os.remove(os.path.join(path, name))
        if any(n.endswith(".parquet") for n in os.listdir(path)):
            return f"{path} holds other parquet files: pass another --parquet-dir"
    os.makedirs(path, exist_ok=True)
    print(f"read_parquet: writing {files} files of {format_bytes(rows * 32)} into {path}",
          flush=True)
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", DATASET_SCRIPT, path, str(files), str(rows)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"writing the data set took over {timeout:.0f} s"
    if p.returncode != 0:
        return f"writing the data set failed: {(p.stderr or p.stdout).strip()[-300:]}"
    print(f"read_parquet: data set written in {time.perf_counter() - t:.1f} s", flush=True)
    return None


def gpu_lines(devices):
    """nvidia-smi's index, name and memory of each GPU of the run."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return [f"unknown (nvidia-smi: {e})"]
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if all(d.isdigit() for d in devices):
        lines = [x for x in lines if x.split(",")[0].strip() in devices]
    return lines


def run_one(bench, side, devices, protocol, args, s, tmp, ends_at):
    """One run of `bench` against a fresh cluster of `side`, stopped at `ends_at`
    (time.monotonic(), or None) if --timeout has not stopped it before: its result, with the
    stage an error happened in ("start": the cluster did not start)."""
    key = re.sub(r"[^A-Za-z0-9]+", "-", f"{bench.name}-{side.name}").strip("-")
    base = tempfile.mkdtemp(prefix=key + "-", dir=tmp)
    r: dict[str, Any] = {"benchmark": bench.name, "side": side.name, "error": None}
    stage = "start"
    try:
        with cluster_for(side, devices, protocol, s) as client:
            path = os.path.join(base, "scheduler.json")
            client.write_scheduler_file(path)
            cmd = benchmark_command(
                f"dask_cuda.benchmarks.{bench.module}", bench.args, path, protocol, devices,
                args.runs, os.path.join(base, "out"), disable_rmm=side.kind == "rmm-rs",
                warmup_runs=args.warmup_runs, compat=bench.compat)
            stage = "run"
            timeout, reason = args.timeout, ""
            if ends_at is not None and ends_at - time.monotonic() < timeout:
                timeout = round(max(ends_at - time.monotonic(), 0.1), 1)
                reason = " (--deadline)"
            env = {**os.environ, **bench.env} if bench.env else None
            r.update(run_benchmark(cmd, os.path.join(base, "out"), timeout, env, reason))
            failed = failed_tasks(client)
            if failed and not r["error"]:
                r["error"] = failure_note(failed)
            if side.kind == "rmm-rs":
                # What the store moved for it and what its own work cost: where an rmm-rs
                # run's time goes beyond the benchmark's own.
                r["store"] = store_figures(client)
                print(f"    {side.name} store after {bench.name}: {store_line(r['store'])}",
                      flush=True)
            stage = "close"
    except Exception as e:  # noqa: BLE001 - recorded, reported, and the suite goes on
        if stage == "close" and not r["error"]:
            # The benchmark ran and reported: its figures stand, the cluster's end is noted.
            r["close_error"] = f"{type(e).__name__}: {e}"
            print(f"note: closing the {side.name} cluster after {bench.name}: "
                  f"{r['close_error']}", flush=True)
        else:
            r["error"] = f"{stage}: {type(e).__name__}: {e}"
    r["stage"] = stage if r["error"] else None
    r["output"] = r.get("output", "")[-6000:]
    shutil.rmtree(base, ignore_errors=True)
    return r


def cell(runs, skipped, notes):
    """A table cell: the median of every wall clock of the good runs, or why there is none
    (a numbered note)."""
    def note(text):
        if text not in notes:
            notes.append(text)
        return f"[{notes.index(text) + 1}]"

    good = [x for r in runs if not r["error"] for x in r["wallclocks"]]
    bad = [r for r in runs if r["error"]]
    if good:
        m = median(good)
        extra = (f" ({len(bad)} of {len(runs)} failed {note(bad[0]['error'])})" if bad else "")
        return f"{m:.3f}{extra}", m
    if bad:
        word = "timed out" if "timed out" in bad[0]["error"] else "failed"
        return f"{word} {note(bad[0]['error'])}", None
    return f"SKIPPED {note(skipped or 'not run')}", None


def print_table(benches, results, skipped, header, limit_all, sides=SIDES):
    """The Markdown table, with its notes; returns both as data. `limit_all`: the limit per
    worker times the workers; `sides`: SIDES, then any more."""
    notes: list[str] = []
    rows = []
    print("\n" + "\n".join(header) + "\n")
    print("| benchmark | arguments | " + " | ".join(f"{x.name} (s)" for x in sides)
          + " | dask-cuda's best ÷ rmm-rs |")
    print("|---" * (len(sides) + 3) + "|")
    for b in benches:
        cells, medians = [], []
        for side in sides:
            runs = [r for r in results if r["benchmark"] == b.name and r["side"] == side.name]
            text, m = cell(runs, skipped.get((b.name, side.name)), notes)
            cells.append(text)
            medians.append(m)
        dc = [m for m in medians[:2] if m is not None]
        ratio = f"{min(dc) / medians[2]:.2f}×" if dc and medians[2] else "n/a"
        if not dc and medians[2] and any(r["benchmark"] == b.name and r["side"] != "rmm-rs"
                                         for r in results):
            ratio = "n/a: dask-cuda failed"
        argv = " ".join(b.args)
        print(f"| {b.name} | `{argv}` ({format_bytes(b.data)}, {b.data / limit_all:.1f}× the "
              f"limit per worker) | {' | '.join(cells)} | {ratio} |")
        rows.append({"benchmark": b.name, "arguments": b.args, "data_bytes": b.data,
                     "median_s": dict(zip((x.name for x in sides), medians)), "cells": cells,
                     "ratio": ratio})
    for i, text in enumerate(notes, 1):
        print(f"\n[{i}] {text}")
    return {"rows": rows, "notes": notes}


def parse_args(argv=None):
    """The command line."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--devices", default=None,
                   help="GPUs, one worker each (default: CUDA_VISIBLE_DEVICES, else every GPU "
                   "`nvidia-smi -L` lists)")
    p.add_argument("--limit", default="6GB",
                   help="device memory limit per worker, every cluster (default %(default)s)")
    p.add_argument("--pool", default="12GB",
                   help='pool per worker, every cluster: a size, a fraction, "auto" (0.9 of '
                   'the device) or "none" (default %(default)s)')
    p.add_argument("--host-limit", default="0",
                   help="Dask's host memory_limit per worker (default 0: none)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiplies every benchmark's data (default 1: at least twice the "
                   "limit per worker)")
    p.add_argument("--benchmarks", default=None,
                   help="a subset, by module (local_cupy) or row (local_cupy:dot), "
                   "comma-separated (default: all)")
    p.add_argument("--protocol", default="tcp", choices=("tcp", "ucx"))
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of each benchmark on each cluster (default %(default)s), the "
                   "clusters' order alternating")
    p.add_argument("--runs", type=int, default=3,
                   help="the benchmark's --runs (default %(default)s)")
    p.add_argument("--warmup-runs", type=int, default=1,
                   help="the benchmark's --warmup-runs (default %(default)s)")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds for one benchmark run (default %(default)s)")
    p.add_argument("--cluster-timeout", type=float, default=300,
                   help="seconds for a cluster's workers to start (default %(default)s)")
    p.add_argument("--parquet-dir", default=os.path.join(tempfile.gettempdir(),
                                                         "dask-cuda-suite-parquet"),
                   help="read_parquet's data set, written there once and reused "
                   "(default %(default)s)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds from the start after which no run begins (a run still going "
                   "then is stopped); the table and --json are still written")
    p.add_argument("--rmm-rs-host-pool", default=None,
                   help="rmm-rs's spill.host_pool_size: a size pins that much at each "
                        "worker's start (default: the runtime's, pinned as spills need it)")
    p.add_argument("--rmm-rs-cudf-spill", action="store_true",
                   help="also run rmm-rs's cluster with cuDF's own spilling on "
                        "(enable_cudf_spill=True; the store leaves cuDF's frames to cuDF)")
    p.add_argument("--rmm-rs-limit-at-pool", action="store_true",
                   help="also run rmm-rs's cluster with the store's device limit at the pool "
                        "size: it spills when the pool runs short, as cuDF's own spilling "
                        "does under enable_cudf_spill (which leaves cuDF's objects out of the "
                        "limit)")
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--dry-run", action="store_true",
                   help="print the benchmarks' arguments and command lines; run nothing")
    args = p.parse_args(argv)
    for name in ("repeats", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.scale <= 0:
        p.error("--scale must be positive")
    return args


def main(argv=None):
    """Runs the suite, prints the table, writes the JSON; exit status 1 when a run failed."""
    args = parse_args(argv)
    started = time.monotonic()
    devices = ([d.strip() for d in args.devices.split(",") if d.strip()]
               if args.devices else visible_devices())
    if not devices:
        raise SystemExit("--devices names no GPU")
    limit = size_in_bytes(args.limit, device_total_memory(devices[0]))
    if limit is None:
        raise SystemExit(f"--limit {args.limit}: the device's memory is unknown (NVML); give "
                         "a size")
    benches = select(plan(limit, len(devices), args.scale, args.parquet_dir), args.benchmarks)
    if args.dry_run:
        for b in benches:
            cmd = benchmark_command(f"dask_cuda.benchmarks.{b.module}", b.args, "SCHED.json",
                                    args.protocol, devices, args.runs, "OUT", False,
                                    args.warmup_runs, b.compat)
            env = "".join(f"{k}={v} " for k, v in (b.env or {}).items())
            # From the module on: python -m MODULE, or the launcher's -c SCRIPT MODULE.
            tail = " ".join(cmd[3:] if b.compat else cmd[2:])
            how = "python -c COMPAT_LAUNCHER " if b.compat else "python -m "
            print(f"{b.name}: {format_bytes(b.data)}, {b.data / limit / len(devices):.2f}× "
                  f"the limit per worker\n    {env}{how}{tail}")
        return 0
    pool = pool_setting(args.pool, args.limit, devices[0])
    host_limit: Any = 0 if args.host_limit.strip().lower() in ("0", "none") else args.host_limit
    needs = sorted({m for b in benches for m in b.needs}
                   | {"dask_cuda", "rmm", "rmm_rs", "rmm_rs_librmm", "cudf", "pandas", "nvtx"}
                   | {f"dask_cuda.benchmarks.{b.module}" for b in benches})
    missing = {m: e for m, e in import_problems(needs, args.cluster_timeout).items() if e}
    if "dask_cuda" in missing:
        raise SystemExit(f"dask_cuda is not importable: {missing['dask_cuda']}")
    libs = ["cupy", "rmm"] if "rmm" not in missing else ["cupy"]
    # cuDF reaches rmm-rs through the compiled librmm bridge, else through ctypes callbacks
    # that take the GIL on every allocation (rmm_rs.allocators.rmm): the table says which.
    bridge = ("" if "rmm" not in libs else
              " (RMM through the compiled bridge, rmm_rs_librmm)"
              if "rmm_rs_librmm" not in missing else
              " (RMM through ctypes callbacks that take the GIL: rmm_rs_librmm is not "
              f"importable, {missing['rmm_rs_librmm']})")
    spill: dict[str, Any] = {"enabled": True}
    if args.rmm_rs_host_pool:
        spill["host_pool_size"] = args.rmm_rs_host_pool
    s = Settings(limit=args.limit, pool=pool, host_limit=host_limit, threads=1,
                 rmm_rs_config={"spill": spill}, rmm_rs_libs=libs,
                 timeout=args.cluster_timeout)
    sides = SIDES + ((RMM_RS_CUDF_SPILL,) if args.rmm_rs_cudf_spill else ())
    if args.rmm_rs_limit_at_pool:
        if pool is None:
            raise SystemExit("--rmm-rs-limit-at-pool needs a pool: pass --pool SIZE, not none")
        sides += (RMM_RS_AT_POOL,)
    side_problem: dict[str, str] = {}
    if "rmm" in missing and pool is not None:
        for x in SIDES[:2]:
            side_problem[x.name] = (f"dask-cuda's rmm_pool_size needs RAPIDS RMM: rmm is not "
                                    f"importable ({missing['rmm']})")
    if "rmm_rs" in missing:
        for x in sides[2:]:
            side_problem[x.name] = f"rmm_rs is not importable ({missing['rmm_rs']})"
    if "cudf" in missing:
        for x in sides:
            if x.cudf_spill:
                side_problem.setdefault(x.name, f"enable_cudf_spill needs cudf, which is not "
                                        f"importable ({missing['cudf']})")
    why_proto = protocol_problem(args.protocol)
    skipped: dict[tuple[str, str], str] = {}
    for b in benches:
        lacking = [m for m in (*b.needs, f"dask_cuda.benchmarks.{b.module}") if m in missing]
        for side in sides:
            if why_proto:
                skipped[(b.name, side.name)] = f"protocol {args.protocol}: {why_proto}"
            elif lacking:
                skipped[(b.name, side.name)] = "needs " + "; ".join(
                    f"{m}, which is not importable ({missing[m]})" for m in lacking)
            elif side.name in side_problem:
                skipped[(b.name, side.name)] = side_problem[side.name]
    installed = versions(DISTRIBUTIONS + EXTRA_DISTRIBUTIONS)
    gpus = gpu_lines(devices)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        f"dask-cuda's benchmark suite, {date}: {len(devices)} GPU ({'; '.join(gpus)}), "
        f"protocol {args.protocol}, device memory limit {args.limit} and pool "
        f"{pool if pool is not None else 'none'} per worker, host limit {host_limit or 'none'}, "
        f"scale {args.scale:g}, {args.repeats} repeat(s) of --runs {args.runs} "
        f"(--warmup-runs {args.warmup_runs}); rmm-rs allocators for {', '.join(libs)}{bridge}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in installed.items()),
        "Medians of the wall clocks each benchmark reported, in seconds. Arguments: the "
        "benchmark's own beside --scheduler-file, --protocol, --devs, --runs, --warmup-runs, "
        "--output-basename (and --disable-rmm on rmm-rs), with the data it reports processing.",
    ]
    print(f"{len(benches)} benchmark(s) x {len(sides)} clusters x {args.repeats} repeat(s) on "
          f"{len(devices)} GPU, {args.protocol}; {header[1]}", flush=True)
    results: list[dict[str, Any]] = []
    broken: dict[str, str] = {}
    datasets: dict[str, str | None] = {}

    def left():
        return None if args.deadline is None else args.deadline - (time.monotonic() - started)

    table: dict[str, Any] = {}
    failed: list[dict[str, Any]] = []
    tmp = tempfile.mkdtemp(prefix="dask-cuda-suite-")
    try:
        for b in benches:
            for repeat in range(args.repeats):
                order = sides if repeat % 2 == 0 else sides[::-1]
                for side in order:
                    what = (b.name, side.name)
                    if what in skipped:
                        continue
                    if side.name in broken:
                        skipped[what] = f"its cluster did not start: {broken[side.name]}"
                        continue
                    remaining = left()
                    if remaining is not None and remaining < 1:
                        skipped[what] = f"past --deadline {args.deadline:g} s"
                        continue
                    if b.dataset is not None and b.name not in datasets:
                        files, rows = b.dataset
                        datasets[b.name] = ensure_dataset(b.args[0], files, rows,
                                                          remaining or args.timeout)
                    if datasets.get(b.name):
                        skipped[what] = f"read_parquet's data set: {datasets[b.name]}"
                        continue
                    r = run_one(b, side, devices, args.protocol, args, s, tmp,
                                None if args.deadline is None else started + args.deadline)
                    r.update(repeat=repeat, order=[x.name for x in order])
                    results.append(r)
                    status = (f"FAILED: {r['error']}" if r["error"] else
                              f"median {r['median_s']:.3f} s of {len(r['wallclocks'])} runs")
                    print(f"[{args.protocol}] {b.name} on {side.name} (repeat {repeat}): "
                          f"{status}", flush=True)
                    if r["stage"] == "start":
                        broken[side.name] = r["error"]
        table = print_table(benches, results, skipped, header, limit * len(devices), sides)
        # Repeats not run where others did (the table's notes give the rest).
        ran = {(r["benchmark"], r["side"]) for r in results}
        for (name, side_name), why in skipped.items():
            if (name, side_name) in ran:
                print(f"NOT RUN: a repeat of {name} on {side_name}: {why}")
        failed = [r for r in results if r["error"]]
        if failed:
            print(f"FAILED: {len(failed)} run(s); see above")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"settings": vars(args), "date": date, "gpus": gpus,
                           "devices": devices, "limit_bytes": limit, "pool": pool,
                           "rmm_rs_libs": libs, "versions": installed,
                           "benchmarks": [b._asdict() for b in benches],
                           "runs": results,
                           "skipped": [{"benchmark": k[0], "side": k[1], "why": v}
                                       for k, v in skipped.items()],
                           "table": table}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
