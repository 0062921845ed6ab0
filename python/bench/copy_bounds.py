"""The copy rates that bound moving spilled data between GPUs, for python/bench/multi_gpu.py:
pinned host to device and back per GPU, and peer copies between two GPUs (NVLink where they
have it), measured with CuPy in a process of its own (no CUDA context lingers in the caller),
and a side's transpose phase as a share of the bound that applies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

BOUNDS_SCRIPT = r"""
import json, sys, time
import cupy
devices = [int(d) for d in sys.argv[1].split(",")]
nbytes = 1 << 30
reps = 5

def rate(copy, n):
    copy()  # first touch and driver set-up, not timed
    cupy.cuda.runtime.deviceSynchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        copy()
        cupy.cuda.runtime.deviceSynchronize()
        best = min(best, time.perf_counter() - t)
    return n / best / 1e9

out = {"h2d": {}, "d2h": {}, "peer": {}}
for d in devices:
    with cupy.cuda.Device(d):
        host = cupy.cuda.alloc_pinned_memory(nbytes)
        dev = cupy.empty(nbytes, dtype=cupy.uint8)
        out["h2d"][d] = rate(lambda: cupy.cuda.runtime.memcpy(dev.data.ptr, host.ptr, nbytes, 1), nbytes)
        out["d2h"][d] = rate(lambda: cupy.cuda.runtime.memcpy(host.ptr, dev.data.ptr, nbytes, 2), nbytes)
        del dev, host
if len(devices) > 1:
    a, b = devices[0], devices[1]
    with cupy.cuda.Device(a):
        src = cupy.empty(nbytes, dtype=cupy.uint8)
    with cupy.cuda.Device(b):
        dst = cupy.empty(nbytes, dtype=cupy.uint8)
    out["peer"][f"{a}->{b}"] = rate(
        lambda: cupy.cuda.runtime.memcpyPeer(dst.data.ptr, b, src.data.ptr, a, nbytes), nbytes)
print(json.dumps(out))
"""


def measure_bounds(devices, timeout):
    """The copy rates that bound the transpose phase, measured in a process of its own
    (no CUDA context lingers here): pinned host to device and back per GPU, and peer copies
    between the first two GPUs (NVLink where they have it), in GB/s, best of 5 copies of
    1 GiB. None, saying why on stderr, when the measurement fails."""
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        done = subprocess.run([sys.executable, "-c", BOUNDS_SCRIPT, ",".join(devices)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"copy bounds: not measured (over {timeout:g} s)", file=sys.stderr, flush=True)
        return None
    if done.returncode != 0:
        print(f"copy bounds: not measured: {done.stderr.strip()[-500:]}", file=sys.stderr,
              flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_bounds(bounds, best, sides, protocols, multi):
    """The measured copy rates, and each side's transpose phase against the bound that
    applies: the blocks a peer asks for are mostly spilled (the data is several times the
    limit), so every GPU's pinned host-to-device rate, summed over the GPUs, bounds how fast
    they can reach the devices that need them; peer copies (NVLink) are faster still."""
    h2d = {int(k): v for k, v in bounds["h2d"].items()}
    d2h = {int(k): v for k, v in bounds["d2h"].items()}
    print("\nCopy rates measured in this run (GB/s, best of 5 copies of 1 GiB):")
    print("| GPU | pinned host → device | device → pinned host |")
    print("|---|---|---|")
    for d in sorted(h2d):
        print(f"| {d} | {h2d[d]:.1f} | {d2h[d]:.1f} |")
    for pair, r in bounds["peer"].items():
        print(f"peer copy {pair}: {r:.1f} GB/s")
    bound = sum(h2d.values())
    print(f"bound for the transpose phase: pinned host → device summed over the "
          f"{len(h2d)} GPUs, {bound:.1f} GB/s (peer copies are "
          f"{'faster' if all(r > max(h2d.values()) for r in bounds['peer'].values()) else 'not faster'})")
    for protocol in protocols:
        for side in sides:
            r = best.get((protocol, multi, side.name))
            if r is None or not r["transpose_sum_s"]:
                continue
            rate = r["crossing_bytes"] / r["transpose_sum_s"] / 1e9
            print(f"{protocol} {side.name}: transpose phase {rate:.2f} GB/s, "
                  f"{100 * rate / bound:.1f} % of the bound")
