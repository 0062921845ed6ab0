"""What python/bench/multi_gpu.py and python/bench/dask_cuda_suite.py share: the clusters
they compare (dask-cuda's own ``LocalCUDACluster``, and the same cluster with rmm-rs's device
store and ``RMMRsPlugin``), the checks made before starting them, and the run of one of
dask-cuda's own benchmarks (``python -m dask_cuda.benchmarks.NAME``) against a running
cluster through its scheduler file, with the wall clocks it reports read back.

Nothing here imports distributed, dask-cuda, CuPy or rmm_rs before it is used: the parsing of
a benchmark's output runs anywhere (python/tests/test_dask_cuda_runs.py).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import json
import os
import re
import subprocess
import sys
from typing import Any, NamedTuple

from dask.utils import format_bytes, parse_bytes

# Distributions whose versions the report names (read from their metadata: nothing imported).
DISTRIBUTIONS = (
    "dask",
    "distributed",
    "dask-cuda",
    "rmm-rs",
    "cupy-cuda13x",
    "cupy-cuda12x",
    "numpy",
    "rmm-cu13",
    "ucxx-cu13",
    "distributed-ucxx-cu13",
    "libucx-cu13",
    "cuda-bindings",
)


class Side(NamedTuple):
    """One way of running the workload: dask-cuda's cluster, or rmm-rs's with the device
    store's send_from_tier left as it is (None) or off (False); either with cuDF's own
    spilling on when ``cudf_spill`` (on rmm-rs the store then leaves cuDF's frames to cuDF).
    dask-cuda under enable_cudf_spill leaves cuDF's objects to cuDF, which spills only when an
    allocation fails: ``limit_at_pool`` gives rmm-rs's store the same room."""

    name: str
    kind: str  # "dask-cuda" or "rmm-rs"
    send_from_tier: bool | None = None
    cudf_spill: bool = False  # LocalCUDACluster(enable_cudf_spill=True)
    # rmm-rs: the store's device limit at the pool's size rather than the run's limit, so that it
    # spills when the pool runs short (spill.on_demand), as cuDF's own spilling does.
    limit_at_pool: bool = False


class Settings(NamedTuple):
    """What every cluster of the run is made with."""

    limit: str
    pool: Any  # a size string, a fraction (float), or None: no pool
    host_limit: Any  # Dask's memory_limit: 0 for none, else a size string
    threads: int
    rmm_rs_config: dict[str, Any]
    rmm_rs_libs: list[str]
    timeout: float


def visible_devices():
    """The GPUs of the machine as CUDA_VISIBLE_DEVICES lists them, else one per ``GPU``
    line of ``nvidia-smi -L``."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return [d.strip() for d in env.split(",") if d.strip()]
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemExit(
            f"no GPUs found: `nvidia-smi -L` failed ({e}) and CUDA_VISIBLE_DEVICES is not set; "
            "pass --devices 0,1,..."
        ) from e
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    if count == 0:
        raise SystemExit("no GPUs found: `nvidia-smi -L` lists none; pass --devices 0,1,...")
    return [str(i) for i in range(count)]


def device_total_memory(device):
    """The device's memory in bytes (NVML, no CUDA context), or None where unknown."""
    try:
        from dask_cuda.utils import get_device_total_memory

        return get_device_total_memory(int(device) if device.isdigit() else device)
    except Exception:  # noqa: BLE001 - the check that needs it is skipped, saying so
        return None


def size_in_bytes(size, total):
    """Bytes of a size string, or of a fraction (up to 1) of `total`."""
    try:
        f = float(size)
    except (TypeError, ValueError):
        return parse_bytes(size)
    if f <= 1:
        if total is None:
            return None
        return int(f * total)
    return int(f)


def pool_setting(pool, limit, device):
    """The pool size both sides get: "auto" is 0.9 of the device, checked against the
    limit; "none" is no pool; a fraction (0.8) stays a fraction, a size stays a size."""
    if pool.lower() == "none":
        return None
    value: Any = 0.9 if pool.lower() == "auto" else pool
    with contextlib.suppress(ValueError):
        if float(value) <= 1:
            value = float(value)
    total = device_total_memory(device)
    pool_bytes = size_in_bytes(value, total)
    limit_bytes = size_in_bytes(limit, total)
    if total is None or pool_bytes is None or limit_bytes is None:
        print(f"note: device {device}'s memory is unknown (NVML): the pool is not checked "
              "against --limit", flush=True)
    elif limit_bytes > pool_bytes:
        raise SystemExit(
            f"--limit {limit} ({format_bytes(limit_bytes)}) does not fit in the pool "
            f"({format_bytes(pool_bytes)} of the device's {format_bytes(total)}): lower "
            "--limit or pass a larger --pool"
        )
    return value


def protocol_problem(protocol):
    """Why a protocol cannot run here, or None."""
    if protocol != "ucx":
        return None
    try:
        importlib.import_module("distributed_ucxx")
    except ImportError as e:
        return (
            f"distributed-ucxx is not installed ({e}): install distributed-ucxx-cu13 with its "
            "ucxx-cu13, libucxx-cu13, libucx-cu13 and rmm-cu13 (`bash scripts/gpu.sh "
            "ucx-wheels` here downloads them into .whl-ucx; `gpu.sh python` installs them)"
        )
    except Exception as e:  # noqa: BLE001 - e.g. libucx failing to load: reported, skipped
        return f"distributed-ucxx does not import: {type(e).__name__}: {e}"
    return None


def send_from_tier_supported():
    """True when this rmm_rs's DeviceStore takes ``send_from_tier``."""
    from rmm_rs.dask import DeviceStore

    params = inspect.signature(DeviceStore.__init__).parameters
    return "send_from_tier" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def versions(names=DISTRIBUTIONS):
    """The installed versions of the packages the run depends on."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def store_limit(side, s):
    """The device memory limit of `side`'s workers: the run's, or for a ``limit_at_pool``
    side of rmm-rs the pool's size (when there is a pool)."""
    return s.pool if side.limit_at_pool and s.pool is not None else s.limit


@contextlib.contextmanager
def cluster_for(side, devices, protocol, s):
    """A client of a running cluster of `side` on `devices` (one worker each), rmm-rs set
    up on every worker for an rmm-rs side; the cluster closed on the way out."""
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    kwargs: dict[str, Any] = {
        "CUDA_VISIBLE_DEVICES": list(devices),
        "protocol": protocol,
        "threads_per_worker": s.threads,
        "memory_limit": s.host_limit,
        "dashboard_address": None,
    }
    try:
        if side.cudf_spill:
            # LocalCUDACluster also sets cuDF's spill option in this process (the
            # scheduler's): put back when the cluster is closed.
            kwargs["enable_cudf_spill"] = True
        limit = store_limit(side, s)
        if side.kind == "dask-cuda":
            cluster = LocalCUDACluster(
                device_memory_limit=s.limit,
                rmm_pool_size=s.pool,
                rmm_allocator_external_lib_list=["cupy"] if s.pool is not None else None,
                **kwargs,
            )
        else:
            from rmm_rs.dask import DeviceStore

            store: dict[str, Any] = {}
            if side.send_from_tier is False:
                store["send_from_tier"] = False
            host = None if s.host_limit == 0 else s.host_limit
            # Each worker sees its GPU as device 0 (dask-cuda sets CUDA_VISIBLE_DEVICES per
            # worker): the store's default device.
            cluster = LocalCUDACluster(
                data=DeviceStore.factory(
                    device_memory_limit=limit, memory_limit=host, config=s.rmm_rs_config,
                    **store,
                ),
                rmm_pool_size=None,
                **kwargs,
            )
        with cluster, Client(cluster) as client:
            client.wait_for_workers(len(devices), timeout=s.timeout)
            watch_failed_tasks(client)
            if side.kind == "rmm-rs":
                from rmm_rs.dask import RMMRsPlugin

                client.register_plugin(
                    RMMRsPlugin(
                        s.rmm_rs_config,
                        rmm_pool_size=s.pool,
                        device_memory_limit=limit,
                        rmm_allocator_external_lib_list=s.rmm_rs_libs,
                    )
                )
            yield client
    finally:
        if side.cudf_spill:
            with contextlib.suppress(Exception):
                import cudf

                cudf.set_option("spill", False)


# The scheduler plugin that records the tasks that fail on a cluster (see failed_tasks).
_FAILED_TASKS_PLUGIN = "rmm-rs-bench-failed-tasks"


def watch_failed_tasks(client):
    """Has the scheduler of `client`'s cluster record every task that fails from now on: a
    benchmark that only waits for its futures reports a wall clock even when its tasks failed,
    so each run is checked with failed_tasks."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class FailedTasks(SchedulerPlugin):
        name = _FAILED_TASKS_PLUGIN

        def __init__(self):
            self.failed = []

        async def start(self, scheduler):
            self.scheduler = scheduler

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "erred":
                ts = self.scheduler.tasks.get(key)
                self.failed.append((str(key), str(getattr(ts, "exception_text", "") or "")))

    client.register_plugin(FailedTasks())


def failed_tasks(client):
    """(key, exception text) of every task that failed on `client`'s cluster since
    watch_failed_tasks, and forgets them."""

    def take(dask_scheduler):
        plugin = dask_scheduler.plugins.get(_FAILED_TASKS_PLUGIN)
        if plugin is None:
            return []
        failed, plugin.failed = plugin.failed, []
        return failed

    return [tuple(f) for f in client.run_on_scheduler(take)]


def failure_note(failed):
    """What a run whose tasks failed reports as its error."""
    key, text = failed[0]
    return (f"{len(failed)} task(s) failed on the cluster, so its figure is not of a finished "
            f"computation; the first: {key}: {text[:300]}")


# The device store's figures a run leaves: what the store spilled and brought back, summed over
# the workers (warm-up runs included), beside the data the benchmark says it processes.
STORE_FIGURES = ("spilled_bytes", "spilled_without_copy_bytes", "unspilled_bytes",
                 "unspilled_to_send_bytes", "disk_bytes", "peak_tracked_bytes")


def store_figures(client):
    """The device store's spill figures summed over `client`'s workers (STORE_FIGURES), with
    the values each tier holds now and what the store's own work cost (values adopted and
    rebuilt: counts and seconds); {} on a cluster whose workers have no device store."""

    def figures(dask_worker):
        stats = getattr(dask_worker.data, "statistics", None)
        if stats is None:
            return {}
        s = stats()
        spill = s.get("spill", {})
        out: dict[str, float] = {k: int(spill.get(k, 0)) for k in STORE_FIGURES}
        out.update({k: int(s.get(k, 0)) for k in ("device_count", "host_count", "disk_count")})
        out.update(s.get("costs", {}))
        return out

    total: dict[str, float] = {}
    for per_worker in client.run(figures).values():
        for k, v in per_worker.items():
            total[k] = total.get(k, 0) + v
    return total


def store_line(figures):
    """One line of store_figures' numbers."""
    def shown(k, v):
        if k.endswith("_bytes"):
            return format_bytes(v)
        if k.endswith("_seconds"):
            return f"{v:.2f} s"
        return str(v)

    return ", ".join(f"{k.removesuffix('_bytes').removesuffix('_seconds').replace('_', ' ')} "
                     f"{shown(k, v)}" for k, v in figures.items())


# dask-cuda's own benchmarks against a running cluster.

_TIME = re.compile(r"^\s*([\d.]+)\s*(us|ms|s|m|hr|d)\b")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "hr": 3600.0, "d": 86400.0}

# What dask-cuda 26.10's benchmarks need to start with the packages of today, set up before
# one runs (COMPAT_LAUNCHER) or is imported: argparse resolves an option declared twice (the
# later declaration wins) instead of failing (read_parquet adds its own --runs to the shared
# parser, which has one); and where CuPy has no ``cupyx.scipy.ndimage.filters`` any more (CuPy
# 14), that name is CuPy's ``cupyx.scipy.ndimage`` (local_cupy_map_overlap imports
# ``convolve`` from it).
COMPAT_PRELUDE = r"""
import sys
def _dask_cuda_26_10_compat():
    import argparse, importlib.util
    init = argparse.ArgumentParser.__init__
    def resolving(self, *args, **kwargs):
        kwargs.setdefault("conflict_handler", "resolve")
        init(self, *args, **kwargs)
    argparse.ArgumentParser.__init__ = resolving
    try:
        if importlib.util.find_spec("cupyx.scipy.ndimage.filters") is None:
            import cupyx.scipy.ndimage
            sys.modules["cupyx.scipy.ndimage.filters"] = cupyx.scipy.ndimage
    except ImportError:
        pass
_dask_cuda_26_10_compat()
"""

# Runs the benchmark module argv[1] as ``python -m`` does, after COMPAT_PRELUDE.
COMPAT_LAUNCHER = COMPAT_PRELUDE + r"""
import runpy
module = sys.argv.pop(1)
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def parse_time(text):
    """Seconds of a time as dask.utils.format_time prints it ("1.23 s", "450.00 ms",
    "20m 34s", "3hr 25m", "2d 4hr"), or None."""
    total = 0.0
    rest = text.strip()
    found = False
    while rest:
        m = _TIME.match(rest)
        if not m:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        rest = rest[m.end():]
        found = True
    return total if found and not rest.strip() else None


def parse_wallclocks(output):
    """The per-run wall clocks a dask-cuda benchmark printed (under its "Wall clock |
    Throughput" header, dask_cuda.benchmarks.utils.print_throughput_bandwidth) and its closing
    mean ("Wall clock | MEAN +/- STD")."""
    durations: list[float] = []
    mean = None
    in_runs = False
    for line in output.splitlines():
        if "|" not in line:
            if in_runs and line.startswith("="):
                in_runs = False
            continue
        key, _, value = (part.strip() for part in line.partition("|"))
        if key == "Wall clock" and value == "Throughput":
            in_runs = True
            continue
        if key == "Wall clock":
            mean = parse_time(value.split("+/-")[0])
            continue
        if in_runs:
            seconds = parse_time(key)
            if seconds is not None:
                durations.append(seconds)
    return durations, mean


def saved_wallclocks(basename):
    """The wall clocks of each run from a benchmark's --output-basename JSON (pandas'
    to_json of its results table), or None where it wrote none."""
    path = basename + ".json"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        table = json.load(f)
    column = table.get("wallclock")
    if isinstance(column, dict):
        return [float(column[k]) for k in sorted(column, key=int)]
    if isinstance(column, list):
        return [float(v) for v in column]
    return None


# The names multi_gpu.py has always used.
parse_local_cupy = parse_wallclocks
local_cupy_wallclocks = saved_wallclocks


def median(values):
    """The median of a non-empty list."""
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def benchmark_command(module, bench_args, scheduler_file, protocol, devices, runs, basename,
                      disable_rmm, warmup_runs=None, compat=False):
    """The command line of dask-cuda's benchmark `module` against the cluster of
    `scheduler_file`; ``--disable-rmm`` for a cluster whose memory is rmm-rs's (the benchmark
    must not set RAPIDS RMM up on its workers); through COMPAT_LAUNCHER when `compat`."""
    if compat:
        cmd = [sys.executable, "-c", COMPAT_LAUNCHER, module]
    else:
        cmd = [sys.executable, "-m", module]
    cmd += ["--scheduler-file", scheduler_file, *bench_args,
            "--protocol", protocol,
            "--devs", ",".join(devices),
            "--runs", str(runs)]
    if warmup_runs is not None:
        cmd += ["--warmup-runs", str(warmup_runs)]
    cmd += ["--output-basename", basename]
    if disable_rmm:
        cmd.append("--disable-rmm")
    return cmd


def run_benchmark(cmd, basename, timeout, env=None, timeout_reason=""):
    """Runs one benchmark command line and reads its wall clocks back (from its
    --output-basename JSON, else from what it printed): its command, error (None when it ran
    and reported), exit status, output, wall clocks and where they came from, its own mean and
    their median."""
    short = cmd[cmd.index("--scheduler-file") - 1].rsplit(".", 1)[-1]
    r: dict[str, Any] = {"command": cmd, "error": None}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout,
                           env=env)
        r["returncode"] = p.returncode
        r["output"] = p.stdout + p.stderr
        if p.returncode != 0:
            last = (p.stderr or p.stdout).strip().splitlines()[-1:]
            r["error"] = f"exit status {p.returncode}: {''.join(last)}"
    except subprocess.TimeoutExpired as e:
        text = [t.decode() if isinstance(t, bytes) else (t or "") for t in (e.stdout, e.stderr)]
        r["output"] = "".join(text)
        r["error"] = f"timed out after {timeout} s{timeout_reason}"
    printed, mean = parse_wallclocks(r["output"])
    saved = saved_wallclocks(basename)
    r["wallclocks"] = saved if saved else printed
    r["wallclocks_from"] = "output-basename json" if saved else "printed output"
    r["mean_s"] = mean
    r["median_s"] = median(r["wallclocks"]) if r["wallclocks"] else None
    if r["median_s"] is None and not r["error"]:
        r["error"] = f"no wall clock found in {short}'s output"
    return r
