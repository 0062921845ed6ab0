"""Creating a large pool after a managed stack: rmm-rs's ``rmm_rs.reinitialize`` against RAPIDS
RMM's ``rmm.reinitialize``, each in a process of its own, alternating, on one GPU.

    python3 python/bench/reinitialize_pool.py [--gib 64] [--rounds 3] [--vmm auto|true|false]

Each child starts on managed memory (``reinitialize(managed_memory=True)``), allocates and
frees one 1 GiB buffer there (so the managed stack has been used), then times
``reinitialize(pool_allocator=True, initial_pool_size=GIB << 30)``: the wall time of the call
and, for rmm-rs, the report of each step (resolve, drain, spill, check, build, install,
unspill) and the pool's chunk source. ``--vmm`` sets ``pool.vmm`` for rmm-rs (``auto``: mapped
chunks where the device supports them; ``false``: one ``cuMemAlloc`` as RMM does), to tell the
virtual memory API's share of the time from the rest. Prints every round and the medians.

RMM's side needs its wheels (``rmm-cu13``, ``librmm-cu13``) and CuPy or nothing else; a side
whose package is missing is reported as skipped.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

GIB = 1 << 30


def rmm_rs_child(gib, vmm):
    import rmm_rs

    rmm_rs.reinitialize(managed_memory=True)
    buf = rmm_rs.DeviceBuffer(GIB)
    del buf
    start = time.perf_counter()
    report = rmm_rs.reinitialize(
        {"pool": {"enabled": True, "initial_size": gib * GIB, "vmm": vmm}}
    )
    wall = time.perf_counter() - start
    stats = rmm_rs.statistics()
    rmm_rs.finalize()
    return {"wall_ms": wall * 1e3, "report": report, "stack": stats[0]["stack"]}


def rmm_child(gib):
    import rmm

    rmm.reinitialize(managed_memory=True)
    buf = rmm.DeviceBuffer(size=GIB)
    del buf
    start = time.perf_counter()
    rmm.reinitialize(pool_allocator=True, initial_pool_size=gib * GIB)
    wall = time.perf_counter() - start
    return {"wall_ms": wall * 1e3}


def run_child(side, gib, vmm):
    out = subprocess.run(
        [sys.executable, __file__, "--child", side, "--gib", str(gib), "--vmm", vmm],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=int, default=64, help="initial pool size in GiB (64)")
    p.add_argument("--rounds", type=int, default=3, help="processes per side (3)")
    p.add_argument("--vmm", default="auto", choices=["auto", "true", "false"])
    p.add_argument("--child", choices=["rmm-rs", "rmm"], help=argparse.SUPPRESS)
    a = p.parse_args()
    vmm = {"auto": "auto", "true": True, "false": False}[a.vmm]
    if a.child == "rmm-rs":
        print(json.dumps(rmm_rs_child(a.gib, vmm)))
        return
    if a.child == "rmm":
        print(json.dumps(rmm_child(a.gib)))
        return
    walls = {"rmm-rs": [], "rmm": []}
    for r in range(a.rounds):
        for side in ("rmm-rs", "rmm"):
            res = run_child(side, a.gib, a.vmm)
            if "error" in res:
                print(f"round {r + 1} {side}: skipped ({res['error']})")
                continue
            walls[side].append(res["wall_ms"])
            line = f"round {r + 1} {side}: {res['wall_ms']:.1f} ms"
            if "report" in res:
                steps = ("resolve", "drain", "spill", "check", "build", "install", "unspill")
                rep = res["report"]
                parts = [
                    f"{s} {rep[s] * 1e3:.1f}" for s in steps if isinstance(rep.get(s), float)
                ]
                # What the call costs beyond the runtime's own steps (settings, the report).
                outside = res["wall_ms"] - rep["total"] * 1e3
                line += f"  [{', '.join(parts)} ms; outside the steps {outside:.2f} ms; {res['stack']}]"
            print(line)
    print(f"\n{a.gib} GiB pool after a managed stack, median of {a.rounds} (pool.vmm = {a.vmm}):")
    for side, v in walls.items():
        if v:
            print(f"  {side:7} {statistics.median(v):8.1f} ms")
        else:
            print(f"  {side:7} skipped")


if __name__ == "__main__":
    main()
